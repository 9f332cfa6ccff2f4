"""Call stacks of captured calls, de-duplicated: records hold an id, the step file the texts."""
from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Dict, List, Optional, Tuple

try:                     # the walk in C (optional: without a C compiler, the same walk in Python)
    from . import _frames
except ImportError:      # pragma: no cover - depends on the build
    _frames = None

__all__ = ["StackTable"]

_DEPTH = 6          # user frames kept per stack


class StackTable:
    """Interns the user-code part of the current call stack (frames outside `skip`)."""

    def __init__(self, skip: Tuple[str, ...]) -> None:
        self.skip = skip
        self._ids: Dict[Tuple[int, ...], int] = {}    # (code id, instruction) per frame -> id
        self._by_text: Dict[str, int] = {}
        # per code object id: inside `skip`? The code object is kept, so its id stays its own.
        self._internal: Dict[int, Tuple[CodeType, bool]] = {}
        self.texts: List[str] = []

    def current(self, depth: int = 2) -> int:
        """The id of the caller's stack, `depth` frames above this call. Runs once per captured
        call: frames are keyed by (code object id, instruction offset), which needs neither a
        line-table lookup nor a code object's hash (it hashes the code's contents); lines are
        read, and the text made, once per distinct key. The walk runs in C (`_frames.key`)
        once every code object on it is classified, in Python until then."""
        key: Optional[Tuple[int, ...]] = None
        if _frames is not None:
            key = _frames.key(depth, self._internal, _DEPTH)
            if key is not None:
                sid = self._ids.get(key)
                if sid is not None:
                    return sid
        frames, walked = self._walk(sys._getframe(depth))
        if key is None:
            key = walked
        sid = self._ids.get(key)
        if sid is None:
            text = "\n".join(f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
                             for f in frames)
            sid = self._by_text.get(text)
            if sid is None:
                sid = self._by_text[text] = len(self.texts)
                self.texts.append(text)
            self._ids[key] = sid
        return sid

    def _walk(self, frame: Optional[FrameType]) -> Tuple[List[FrameType], Tuple[int, ...]]:
        """The first `_DEPTH` user frames from `frame` outwards and their key, classifying each
        code object met (internal or not) for the C walk."""
        internal = self._internal
        key: List[int] = []
        frames: List[FrameType] = []
        while frame is not None and len(frames) < _DEPTH:
            code = frame.f_code
            known = internal.get(id(code))
            if known is None:
                known = internal[id(code)] = (code, code.co_filename.startswith(self.skip))
            if not known[1]:
                key.append(id(code))
                key.append(frame.f_lasti)
                frames.append(frame)
            frame = frame.f_back
        return frames, tuple(key)
