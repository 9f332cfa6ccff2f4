"""Which arguments of a call are recorded, and under which keys: one rule for every framework.

Tensors are found in positional and keyword arguments and in lists, tuples and dicts nested up to
two levels (`torch.cat([a, b])` -> keys "0.0", "0.1"); each gets an ordinal among the call's
tensors. Non-tensor arguments worth comparing across runs (numbers, strings, dtypes, short integer
tuples such as shapes) are recorded as values.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["tensor_arguments", "tensor_results", "value_arguments"]

_MAX_DEPTH = 2


def _flatten(value: Any, key: str, out: List[Tuple[str, Any]], is_tensor: Callable[[Any], bool],
             depth: int = 0) -> None:
    if is_tensor(value):
        out.append((key, value))
    elif isinstance(value, (list, tuple)) and depth < _MAX_DEPTH:
        for i, item in enumerate(value):
            _flatten(item, f"{key}.{i}" if key else str(i), out, is_tensor, depth + 1)
    elif isinstance(value, dict) and depth < _MAX_DEPTH:
        for k, item in value.items():
            _flatten(item, f"{key}.{k}" if key else str(k), out, is_tensor, depth + 1)


def tensor_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                     is_tensor: Callable[[Any], bool]) -> List[Tuple[int, str, Any]]:
    """[(ordinal, key, tensor)] of the tensors among a call's arguments."""
    found: List[Tuple[str, Any]] = []
    for i, arg in enumerate(args):
        if is_tensor(arg):              # the common case, without a call of _flatten
            found.append((str(i), arg))
        elif isinstance(arg, (list, tuple, dict)):
            _flatten(arg, str(i), found, is_tensor)
    for name, arg in kwargs.items():
        if is_tensor(arg):
            found.append((name, arg))
        elif isinstance(arg, (list, tuple, dict)):
            _flatten(arg, name, found, is_tensor)
    return [(i, key, t) for i, (key, t) in enumerate(found)]


def tensor_results(result: Any, is_tensor: Callable[[Any], bool]) -> List[Tuple[int, str, Any]]:
    """[(ordinal, key, tensor)] of the tensors a call returned."""
    if is_tensor(result):
        return [(0, "0", result)]
    found: List[Tuple[str, Any]] = []
    _flatten(result, "", found, is_tensor)
    return [(i, key or "0", t) for i, (key, t) in enumerate(found)]


def value_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                    dtype_name: Callable[[Any], Optional[str]]) -> List[Tuple[str, Any]]:
    """[(key, value)] of the non-tensor arguments worth recording; `dtype_name` names a
    framework dtype object (or returns None for anything else)."""
    out: List[Tuple[str, Any]] = []
    items = [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items())
    for key, value in items:
        if isinstance(value, (bool, int, float, str)):
            out.append((key, value))
        elif isinstance(value, (tuple, list)):
            if value and len(value) <= 8 and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value):
                out.append((key, tuple(value)))
        else:
            name = dtype_name(value)
            if name is not None:
                out.append((key, name))
    return out
