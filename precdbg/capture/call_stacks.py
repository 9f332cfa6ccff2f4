"""Call stacks of captured calls, de-duplicated: records hold an id, the step file the texts."""
from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Dict, List, Optional, Tuple

try:                     # the walk in C (optional: without a C compiler, the same walk in Python)
    from . import _frames
except ImportError:      # pragma: no cover - depends on the build
    _frames = None

__all__ = ["StackCache", "StackTable"]

_DEPTH = 6          # user frames kept per stack


_TEXTS_KEPT = 100_000   # stack texts remembered across windows (then forgotten, and made again)


class StackCache:
    """What walking call stacks learns, kept for a debugger's lifetime: which code objects are
    internal (inside `skip`), and the text of each stack key seen. A dumped step that runs the
    same code as the last one walks in C only and makes no text."""
    __slots__ = ("skip", "internal", "text_of")

    def __init__(self, skip: Tuple[str, ...]) -> None:
        self.skip = skip
        # per code object id: inside `skip`? The code object is kept, so its id stays its own.
        self.internal: Dict[int, Tuple[CodeType, bool]] = {}
        self.text_of: Dict[Tuple[int, ...], str] = {}    # a key's text, across windows

    def window(self) -> "StackTable":
        """The stack table of a new capture window."""
        if len(self.text_of) > _TEXTS_KEPT or len(self.internal) > _TEXTS_KEPT:
            self.text_of.clear()         # code made at run time (exec, compilers) grows these
            self.internal.clear()
        return StackTable(self)


class StackTable:
    """Interns the user-code part of the current call stack (frames outside the cache's `skip`)
    for one capture window: ids from 0, and `texts`, which go into the window's step file."""

    def __init__(self, cache: StackCache) -> None:
        self._cache = cache
        self._internal = cache.internal
        self._text_of = cache.text_of
        self._ids: Dict[Tuple[int, ...], int] = {}    # (code id, instruction) per frame -> id
        self._by_text: Dict[str, int] = {}
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
                text = self._text_of.get(key)
                if text is not None:      # a stack an earlier window met: no walk, no text
                    return self._intern(key, text)
        frames, walked = self._walk(sys._getframe(depth))
        if key is None:
            key = walked
        sid = self._ids.get(key)
        if sid is None:
            text = self._text_of.get(key)
            if text is None:
                text = self._text_of[key] = "\n".join(
                    f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in frames)
            sid = self._intern(key, text)
        return sid

    def _intern(self, key: Tuple[int, ...], text: str) -> int:
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
                known = internal[id(code)] = (code, code.co_filename.startswith(self._cache.skip))
            if not known[1]:
                key.append(id(code))
                key.append(frame.f_lasti)
                frames.append(frame)
            frame = frame.f_back
        return frames, tuple(key)
