"""Call stacks of captured calls, de-duplicated: records hold an id, the step file the texts."""
from __future__ import annotations

import sys
from types import CodeType
from typing import Dict, List, Tuple

__all__ = ["StackTable"]

_DEPTH = 6          # user frames kept per stack


class StackTable:
    """Interns the user-code part of the current call stack (frames outside `skip`)."""

    def __init__(self, skip: Tuple[str, ...]) -> None:
        self.skip = skip
        self._ids: Dict[Tuple, int] = {}
        self._internal: Dict[CodeType, bool] = {}     # per code object: inside `skip`?
        self.texts: List[str] = []

    def current(self, depth: int = 2) -> int:
        """The id of the caller's stack, `depth` frames above this call. Runs once per captured
        call: frames are keyed by (code object, line), the text is made once per distinct stack."""
        frame = sys._getframe(depth)
        internal = self._internal
        key = []
        while frame is not None and len(key) < _DEPTH:
            code = frame.f_code
            skip = internal.get(code)
            if skip is None:
                skip = internal[code] = code.co_filename.startswith(self.skip)
            if not skip:
                key.append((code, frame.f_lineno))
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._ids.get(tkey)
        if sid is None:
            sid = len(self.texts)
            self._ids[tkey] = sid
            self.texts.append("\n".join(f"{code.co_filename}:{line} in {code.co_name}"
                                         for code, line in key))
        return sid
