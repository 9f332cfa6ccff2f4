"""MindSpore copies what crosses a cell that has a backward hook: `Cell._run_construct` passes
the inputs and the output through the cell's `CellBackwardHook` primitive, which returns new
tensors (new memory, same values). Nothing captured produces those copies, so each is linked to
the tensor it copies: a consumer of the copy reads what the original's producer wrote.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

import mindspore as ms

__all__ = ["AliasingHandle", "AliasingHook", "wrap_cell_backward_hook"]


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
