"""Failures inside precdbg (a hook, statistics, start/stop/step): counted, each distinct one
said once in one line (through the debugger's notices); training goes on."""
from __future__ import annotations

import logging

from ..errors import one_line
from .notices import Notices

__all__ = ["FailureLog"]

log = logging.getLogger("precdbg")

_MAX_REPORTED_FAILURES = 20     # distinct failures reported; the rest are only counted


class FailureLog:
    """The failures of one debugger: how many in all (`count`), which kinds were said (in its
    notices), and how many in the capture window being written (`window`, in the step file)."""

    def __init__(self, notices: Notices) -> None:
        self.count = 0
        self.window = 0
        self._notices = notices
        self._kinds = 0

    def new_window(self) -> None:
        self.window = 0

    def add(self, exc: BaseException, where: str, step: int) -> None:
        """Count a failure; each distinct one (type and message) is said once, in one line
        naming the step and the stage; its traceback goes to the `precdbg` logger at DEBUG."""
        self.count += 1
        self.window += 1
        text = one_line(exc)
        key = ("failure", type(exc).__name__, text)
        if self._notices.said(key):
            return
        self._kinds += 1
        if self._kinds <= _MAX_REPORTED_FAILURES:
            self._notices.once(key, "precdbg: step %d: %s failed (%s: %s); training continues "
                               "(counted in debugger.failures)", step, where,
                               type(exc).__name__, text)
            log.debug("precdbg: traceback of that failure", exc_info=exc)
        else:
            self._notices.mark(key)
            self._notices.once("failures not said", "precdbg: further kinds of failure are "
                               "counted, not reported")
