"""Failures inside precdbg (a hook, statistics, start/stop/step): counted, each distinct one
reported once in one line; training goes on."""
from __future__ import annotations

import logging
from typing import Set, Tuple

__all__ = ["FailureLog", "one_line"]

log = logging.getLogger("precdbg")

_MAX_REPORTED_FAILURES = 20     # distinct failures reported; the rest are only counted


def one_line(exc: BaseException, limit: int = 240) -> str:
    """An exception's message on one line, shortened."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class FailureLog:
    """The failures of one session: how many in all (`count`) and in the current capture
    window (`window`, written into the step file), and which kinds were reported."""

    def __init__(self) -> None:
        self.count = 0
        self.window = 0
        self._reported: Set[Tuple[str, str]] = set()

    def new_window(self) -> None:
        self.window = 0

    def add(self, exc: BaseException, where: str, step: int) -> None:
        """Count a failure; each distinct one (type and message) is reported once, in one line
        naming the step and the stage; its traceback goes to the `precdbg` logger at DEBUG."""
        self.count += 1
        self.window += 1
        text = one_line(exc)
        key = (type(exc).__name__, text)
        if key in self._reported:
            return
        self._reported.add(key)
        if len(self._reported) <= _MAX_REPORTED_FAILURES:
            log.warning("precdbg: step %d: %s failed (%s: %s); training continues (counted in "
                        "debugger.failures)", step, where, type(exc).__name__, text)
            log.debug("precdbg: traceback of that failure", exc_info=exc)
        elif len(self._reported) == _MAX_REPORTED_FAILURES + 1:
            log.warning("precdbg: further kinds of failure are counted, not reported")
