"""Call stacks of captured calls, de-duplicated: records hold an id, the step file the texts."""
from __future__ import annotations

import sys
from typing import Dict, List, Tuple

__all__ = ["StackTable"]

_DEPTH = 6          # user frames kept per stack


class StackTable:
    """Interns the user-code part of the current call stack (frames outside `skip`)."""

    def __init__(self, skip: Tuple[str, ...]) -> None:
        self.skip = skip
        self._ids: Dict[Tuple, int] = {}
        self.texts: List[str] = []

    def current(self, depth: int = 2) -> int:
        """The id of the caller's stack, `depth` frames above this call."""
        frame = sys._getframe(depth)
        key = []
        while frame is not None and len(key) < _DEPTH:
            code = frame.f_code
            if not code.co_filename.startswith(self.skip):
                key.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._ids.get(tkey)
        if sid is None:
            sid = len(self.texts)
            self._ids[tkey] = sid
            self.texts.append("\n".join(f"{f}:{line} in {name}" for f, line, name in key))
        return sid
