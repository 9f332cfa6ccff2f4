"""The command line's output streams, made safe for a terminal: whatever a command prints (names
from a dump, values, error lines) goes out with control characters and text-reordering marks
shown escaped (`precdbg.records.controls`); newlines and tabs stay. The progress line, which
draws with a carriage return, writes to the stream underneath (`raw`)."""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, TextIO

from ..records.controls import escape_controls

__all__ = ["escaped_output"]


class _EscapingStream:
    """A text stream whose writes escape control characters (newline and tab kept)."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        return self.raw.write(escape_controls(text, lines=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """sys.stdout and sys.stderr escaped while a command runs, restored after."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _EscapingStream(out), _EscapingStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
