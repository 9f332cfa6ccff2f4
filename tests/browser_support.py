"""Drive headless Chromium from a test: open a page, run JavaScript in it, read values back.

Talks the DevTools protocol over `--remote-debugging-pipe` (JSON messages ending in NUL on file
descriptors 3 and 4 of the browser), so it needs nothing but the `chromium` binary. Used by
tests/test_html_report.py to click the report's tree, switch ranks and hover its timeline, and by
tests/test_html_layout.py to measure the page at a given width and take screenshots.

    with Browser(profile_dir) as browser:
        browser.open("file:///.../report.html", ready="document.body.dataset.culprit")
        browser.js("document.title")
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from typing import Any, Dict, Optional

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    """The browser did not answer, or a script in the page threw."""


class Browser:
    def __init__(self, profile: str, width: int = 1400, height: int = 1100,
                 timeout: float = 60.0) -> None:
        if CHROMIUM is None:
            raise BrowserError("chromium is not on PATH")
        self.timeout = timeout
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        command = (f'exec "{CHROMIUM}" --headless --no-sandbox --disable-gpu '
                   "--disable-dev-shm-usage --no-first-run --hide-scrollbars "
                   "--disable-background-networking --disable-component-update "
                   "--disable-sync --disable-quic "
                   f"--user-data-dir='{profile}' --window-size={width},{height} "
                   f"--remote-debugging-pipe about:blank "
                   f"3<&{to_browser_r} 4>&{from_browser_w}")
        self.proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     pass_fds=(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.session: Optional[str] = None

    # ------------------------------------------------------------------ protocol
    def _send(self, method: str, params: Optional[Dict[str, Any]] = None,
              session: Optional[str] = None) -> Dict[str, Any]:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise BrowserError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(f"{method}: no answer in {self.timeout} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"{method}: the browser closed its pipe")
            self._buffer += chunk

    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        """Open `url` in a new tab and wait until the expression `ready` is truthy."""
        target = self._send("Target.createTarget", {"url": url})["targetId"]
        self.session = self._send("Target.attachToTarget",
                                  {"targetId": target, "flatten": True})["sessionId"]
        deadline = time.monotonic() + self.timeout
        while not self.js(f"document.readyState === 'complete' && !!({ready})"):
            if time.monotonic() > deadline:
                raise BrowserError(f"{url}: not ready ({ready}) in {self.timeout} s")
            time.sleep(0.05)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the open page (JSON-able values)."""
        result = self._send("Runtime.evaluate", {"expression": expression,
                                                 "returnByValue": True}, self.session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise BrowserError(f"script error: {text}")
        return result.get("result", {}).get("value")

    def viewport(self, width: int, height: int) -> None:
        """Draw the open page as in a window `width` x `height` CSS pixels (scale 1)."""
        self._send("Emulation.setDeviceMetricsOverride",
                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                   self.session)

    def screenshot(self, path: str, full_page: bool = True) -> None:
        """A PNG of the open page (all of it with `full_page`, else the viewport) at `path`."""
        params: Dict[str, Any] = {"format": "png"}
        if full_page:
            width, height = self.js("[document.documentElement.scrollWidth, "
                                    "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        data = self._send("Page.captureScreenshot", params, self.session)["data"]
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(data))

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        try:
            self._send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
