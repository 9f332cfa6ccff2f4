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
        self._ids: Dict[Tuple, int] = {}              # (code, instruction) per frame -> id
        self._by_text: Dict[str, int] = {}
        self._internal: Dict[CodeType, bool] = {}     # per code object: inside `skip`?
        self.texts: List[str] = []

    def current(self, depth: int = 2) -> int:
        """The id of the caller's stack, `depth` frames above this call. Runs once per captured
        call: frames are keyed by (code object, instruction offset), which needs no line-table
        lookup; lines are read, and the text made, once per distinct key."""
        frame = sys._getframe(depth)
        internal = self._internal
        key = []
        frames = []
        while frame is not None and len(frames) < _DEPTH:
            code = frame.f_code
            skip = internal.get(code)
            if skip is None:
                skip = internal[code] = code.co_filename.startswith(self.skip)
            if not skip:
                key.append(code)
                key.append(frame.f_lasti)
                frames.append(frame)
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._ids.get(tkey)
        if sid is None:
            text = "\n".join(f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
                             for f in frames)
            sid = self._by_text.get(text)
            if sid is None:
                sid = self._by_text[text] = len(self.texts)
                self.texts.append(text)
            self._ids[tkey] = sid
        return sid
