"""Progress of a compare: what `compare_dumps` reports as it goes, and the terminal line
`precdbg compare` draws from it.

The line appears only when the stream is a terminal and the compare has run for a while
(`PRECDBG_PROGRESS_AFTER` seconds, default 2): a quick compare, or output into a file or a pipe,
gets nothing extra.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Optional, TextIO

__all__ = ["CompareProgress", "TerminalProgress", "progress_delay"]

_DEFAULT_DELAY_S = 2.0
_INTERVAL_S = 0.1


@dataclasses.dataclass(frozen=True)
class CompareProgress:
    """Where a compare stands: step/rank files done of all, and record pairs of the current one."""
    files_done: int
    files_total: int
    step: int
    rank: int
    pairs_done: int
    pairs_total: int
    phase: str          # "aligning", "comparing", "localizing"


def progress_delay() -> float:
    """Seconds before the progress line appears (PRECDBG_PROGRESS_AFTER, default 2)."""
    text = os.environ.get("PRECDBG_PROGRESS_AFTER", "")
    try:
        return max(0.0, float(text)) if text.strip() else _DEFAULT_DELAY_S
    except ValueError:
        return _DEFAULT_DELAY_S


class TerminalProgress:
    """A callable for compare_dumps(progress=...) drawing one line that rewrites itself."""

    def __init__(self, stream: TextIO, delay: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.active = bool(getattr(stream, "isatty", lambda: False)())
        self.delay = progress_delay() if delay is None else delay
        self._clock = clock
        self._start = clock()
        self._last = -1.0
        self._width = 0
        self._stage: Optional[tuple] = None

    def __call__(self, p: CompareProgress) -> None:
        if not self.active:
            return
        now = self._clock()
        stage = (p.phase, p.files_done)
        if now - self._start < self.delay or (stage == self._stage
                                              and now - self._last < _INTERVAL_S):
            return
        self._last, self._stage = now, stage
        if p.phase == "localizing":
            text = f"compared {p.files_total} step/rank file(s); naming the first divergence"
        else:
            what = "aligning" if p.phase == "aligning" else \
                f"{p.pairs_done}/{p.pairs_total} records aligned and compared"
            text = (f"step {p.step} rank {p.rank}: {what}  "
                    f"({p.files_done}/{p.files_total} step/rank files done)")
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        """Erase the line, if one was drawn."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
