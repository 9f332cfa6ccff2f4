"""How a model walk is named through the wrappers that hand a call to the module they hold
(shared by the adapters through `precdbg.capture.instrumentor`)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Tuple

__all__ = ["named_through"]


def named_through(named: Iterable[Tuple[str, Any]],
                  held_as: Callable[[Any], Optional[str]]) -> List[Tuple[str, Any]]:
    """A model walk's (path, module) pairs named through its hand-over wrappers: a wrapper is
    left out and the module it holds takes its path (`held_as(module)`: the attribute a wrapper
    holds its module under, None for any other module), so a wrapped model's paths and
    parameter names are those of the model unwrapped. What else a wrapper holds (MindSpore's
    WithLossCell its loss, TrainOneStepCell its optimizer) is no part of the model: left out
    with its subtree, as a PyTorch loss or optimizer outside the model is."""
    named = list(named)
    at = dict(named)
    outside = [f"{path}.{child}" if path else child
               for path, module in named if held_as(module) is not None
               for child in _children(named, path) if child != held_as(module)]
    out: List[Tuple[str, Any]] = []
    for path, module in named:
        if held_as(module) is not None or any(path == o or path.startswith(o + ".")
                                              for o in outside):
            continue
        kept: List[str] = []
        prefix = ""
        for part in path.split(".") if path else ():
            parent = at.get(prefix)
            if parent is None or held_as(parent) != part:
                kept.append(part)
            prefix = f"{prefix}.{part}" if prefix else part
        out.append((".".join(kept), module))
    return out


def _children(named: List[Tuple[str, Any]], path: str) -> List[str]:
    """The names of the direct children of `path` in a model walk."""
    depth = path.count(".") + 1 if path else 0
    return [p.split(".")[depth] for p, _ in named
            if p and (not path or p.startswith(path + ".")) and p.count(".") == depth]
