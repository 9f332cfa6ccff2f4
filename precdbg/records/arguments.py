"""Which arguments of a call are recorded, and under which keys: one rule for every framework.

Tensors are found in positional and keyword arguments and in lists, tuples and dicts nested up to
two levels (`torch.cat([a, b])` -> keys "0.0", "0.1"), and in what a call returns also in dataclass
instances (a model's output, keys by field name); each gets an ordinal among the call's tensors. Non-tensor arguments worth comparing across runs (numbers, strings, dtypes, short integer
tuples such as shapes) are recorded as values.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from .schema import DtypeName

__all__ = ["call_arguments", "tensor_arguments", "tensor_results", "value_arguments"]

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
    elif depth < _MAX_DEPTH and dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):       # a model's output as a plain dataclass
            _flatten(getattr(value, field.name, None),
                     f"{key}.{field.name}" if key else field.name, out, is_tensor, depth + 1)


def tensor_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                     is_tensor: Callable[[Any], bool]) -> List[Tuple[int, str, Any]]:
    """[(ordinal, key, tensor)] of the tensors among a call's arguments."""
    return call_arguments(args, kwargs, is_tensor, _no_dtype)[0]


def tensor_results(result: Any, is_tensor: Callable[[Any], bool]) -> List[Tuple[int, str, Any]]:
    """[(ordinal, key, tensor)] of the tensors a call returned."""
    if is_tensor(result):
        return [(0, "0", result)]
    found: List[Tuple[str, Any]] = []
    _flatten(result, "", found, is_tensor)
    return [(i, key or "0", t) for i, (key, t) in enumerate(found)]


_SKIP = object()        # an argument not worth recording as a value


def _no_dtype(value: Any) -> None:
    return None


def _value_of(value: Any, dtype_name: Callable[[Any], Optional[str]]) -> Any:
    """What a non-tensor argument is recorded as, or _SKIP."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        if value and len(value) <= 8 and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        return _SKIP
    name = dtype_name(value)
    return _SKIP if name is None else DtypeName(name)


def value_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                    dtype_name: Callable[[Any], Optional[str]]) -> List[Tuple[str, Any]]:
    """[(key, value)] of the non-tensor arguments worth recording; `dtype_name` names a
    framework dtype object (or returns None for anything else)."""
    out: List[Tuple[str, Any]] = []
    for key, value in [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items()):
        recorded = _value_of(value, dtype_name)
        if recorded is not _SKIP:
            out.append((key, recorded))
    return out


def call_arguments(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                   is_tensor: Callable[[Any], bool],
                   dtype_name: Callable[[Any], Optional[str]]
                   ) -> Tuple[List[Tuple[int, str, Any]], List[Tuple[str, Any]]]:
    """`tensor_arguments` and `value_arguments` of one call in one pass over its arguments
    (asked for every captured API call)."""
    found: List[Tuple[str, Any]] = []
    values: List[Tuple[str, Any]] = []
    for i, arg in enumerate(args):
        if is_tensor(arg):
            found.append((str(i), arg))
            continue
        if isinstance(arg, (list, tuple, dict)):
            _flatten(arg, str(i), found, is_tensor)
        recorded = _value_of(arg, dtype_name)
        if recorded is not _SKIP:
            values.append((str(i), recorded))
    for name, arg in kwargs.items():
        if is_tensor(arg):
            found.append((name, arg))
            continue
        if isinstance(arg, (list, tuple, dict)):
            _flatten(arg, name, found, is_tensor)
        recorded = _value_of(arg, dtype_name)
        if recorded is not _SKIP:
            values.append((name, recorded))
    return [(i, key, t) for i, (key, t) in enumerate(found)], values
