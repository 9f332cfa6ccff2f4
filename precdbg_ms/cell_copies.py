"""MindSpore copies what crosses a cell that has a backward hook (the user's: precdbg's own pass
through HookBackward, precdbg_ms.cell_hooks): `Cell._run_construct` passes the inputs and the output
through the cell's `CellBackwardHook` primitive, which returns new tensors (new memory, same
values). Nothing captured produces those copies, so each is linked to the tensor it copies: a
consumer of the copy reads what the original's producer wrote.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import mindspore as ms

__all__ = ["AliasingHandle", "AliasingHook", "CopyOrigins", "wrap_cell_backward_hook"]


def _tensors(value: Any) -> List[Any]:
    if isinstance(value, ms.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v if isinstance(v, ms.Tensor) else None for v in value]
    return []


class AliasingHook:
    """Stands in for a cell's `CellBackwardHook` primitive: calls it, then reports each
    (original, copy) pair. Everything else is the primitive's."""

    def __init__(self, prim: Any, alias: Callable[[Any, Any], None]) -> None:
        self.__dict__["_prim"] = prim
        self.__dict__["_alias"] = alias

    def __call__(self, *args: Any) -> Any:
        out = self._prim(*args)
        try:
            before = _tensors(args[0] if len(args) == 1 else args)
            for src, dst in zip(before, _tensors(out)):
                if src is not None and dst is not None and src is not dst:
                    self._alias(src, dst)
        except Exception:  # noqa: BLE001 - provenance is best effort; never into training
            pass
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prim, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._prim, name, value)


class AliasingHandle:
    """The AliasingHook of one cell as a handle: removing it puts the primitive back."""
    __slots__ = ("cell", "prim")

    def __init__(self, cell: Any, prim: Any) -> None:
        self.cell, self.prim = cell, prim

    def remove(self) -> None:
        if isinstance(self.cell.__dict__.get("_cell_backward_hook"), AliasingHook):
            object.__setattr__(self.cell, "_cell_backward_hook", self.prim)


def wrap_cell_backward_hook(cell: Any, alias: Callable[[Any, Any], None]
                            ) -> Optional[AliasingHandle]:
    """Put an AliasingHook in place of the cell's primitive; None when there is none to wrap."""
    prim = cell.__dict__.get("_cell_backward_hook")
    if prim is None or isinstance(prim, AliasingHook):
        return None
    object.__setattr__(cell, "_cell_backward_hook", AliasingHook(prim, alias))
    return AliasingHandle(cell, prim)


class CopyOrigins:
    """Which tensor each cell hook copy copies (through any number of copies), for one capture
    window, without reading memory: copies are known by weak references, never kept alive."""
    __slots__ = ("_copy_of",)

    def __init__(self) -> None:
        # id(copy) -> (weak reference to the copy, id of the tensor it copies through any
        # number of copies, weak reference to that tensor)
        self._copy_of: Dict[int, Tuple[Any, int, Any]] = {}

    def clear(self) -> None:
        self._copy_of.clear()

    def link(self, original: Any, copy: Any) -> None:
        entry = self._entry(original)
        if entry is not None:                         # a copy of a copy
            self._copy_of[id(copy)] = (weakref.ref(copy), entry[1], entry[2])
        else:
            self._copy_of[id(copy)] = (weakref.ref(copy), id(original), weakref.ref(original))

    def _entry(self, t: Any) -> Optional[Tuple[Any, int, Any]]:
        entry = self._copy_of.get(id(t))
        return entry if entry is not None and entry[0]() is t else None

    def root(self, t: Any) -> Any:
        """The tensor `t` is a copy of (through any number of copies), or `t`."""
        entry = self._entry(t)
        root = entry[2]() if entry is not None else None
        return t if root is None else root

    def origin(self, t: Any) -> Hashable:
        """What a tensor and its copies share: the id of the tensor they copy while it lives.
        Once it is gone its id may be another tensor's, so its copies then share (its id,
        "gone"), which no tensor's id equals."""
        entry = self._entry(t)
        if entry is None:
            return id(t)
        return entry[1] if entry[2]() is not None else (entry[1], "gone")
