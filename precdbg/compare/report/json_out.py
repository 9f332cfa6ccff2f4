"""The compare's JSON file, written quicker (issue 50): the same bytes as
`json.dump(result, handle, indent=1, default=str)`, whose pure-Python encoder (the C one serves
no indent) took 2.8 s of a 14 s compare of 37,000 rows writing them.
Strings go through the C escaper, numbers through `repr` as the standard encoder does, and
the pieces of each row are joined once; tests/core/test_core_compare_columns.py holds the
bytes equal. About twice as quick.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:                                    # the C escaper json.dump uses
    from _json import encode_basestring_ascii as _escape
except ImportError:                     # pragma: no cover - CPython always has it
    from json.encoder import py_encode_basestring_ascii as _escape

__all__ = ["dumps_indent1", "write_indent1", "encode_rows", "encode_row_columns"]

_INF = float("inf")


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == _INF:
        return "Infinity"
    if value == -_INF:
        return "-Infinity"
    return float.__repr__(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return _escape(key)
    if isinstance(key, float):
        return _escape(_float(key))
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return _escape(int.__repr__(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _encode(value: Any, level: int, out: List[str]) -> None:
    """Append the indent=1 text of `value` (at nesting `level`) to `out`."""
    kind = type(value)
    if kind is str:
        out.append(_escape(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is float:
        out.append(_float(value))
    elif kind is dict:
        _dict(value, level, out)
    elif kind is list or kind is tuple:
        _list(value, level, out)
    else:
        _other(value, level, out)


def _other(value: Any, level: int, out: List[str]) -> None:
    """Subclasses (str enums, numpy floats) as the standard encoder takes them; anything else
    as its str() (`default=str`)."""
    if isinstance(value, str):
        out.append(_escape(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, (list, tuple)):
        _list(value, level, out)
    elif isinstance(value, dict):
        _dict(value, level, out)
    else:
        _encode(str(value), level, out)


def _list(value: Any, level: int, out: List[str]) -> None:
    if not value:
        out.append("[]")
        return
    inner = "\n" + " " * (level + 1)
    out.append("[" + inner)
    first = True
    for item in value:
        if not first:
            out.append("," + inner)
        first = False
        _encode(item, level + 1, out)
    out.append("\n" + " " * level + "]")


_KEYS: Dict[Any, str] = {}        # a key's text with its separator, of keys seen (rows repeat them)


def _dict(value: Dict[Any, Any], level: int, out: List[str]) -> None:
    if not value:
        out.append("{}")
        return
    inner = "\n" + " " * (level + 1)
    parts: List[str] = []
    for key, item in value.items():
        head = _KEYS.get(key) if type(key) is str else None
        if head is None:
            head = _key(key) + ": "
            if type(key) is str and len(_KEYS) < 4096:
                _KEYS[key] = head
        kind = type(item)          # scalars inline: a row is some fifty of them
        if kind is str:
            parts.append(head + _escape(item))
        elif kind is float:
            parts.append(head + (float.__repr__(item) if item - item == 0.0 else _float(item)))
        elif item is None:
            parts.append(head + "null")
        elif kind is int:
            parts.append(head + int.__repr__(item))
        elif item is True:
            parts.append(head + "true")
        elif item is False:
            parts.append(head + "false")
        else:
            nested: List[str] = [head]
            _encode(item, level + 1, nested)
            parts.append("".join(nested))
    out.append("{" + inner + ("," + inner).join(parts) + "\n" + " " * level + "}")


def dumps_indent1(value: Any) -> str:
    """`json.dumps(value, indent=1, default=str)`, quicker."""
    out: List[str] = []
    _encode(value, 0, out)
    return "".join(out)


def write_indent1(value: Any, handle: Any, chunk: int = 256) -> None:
    """`json.dump(value, handle, indent=1, default=str)`: a top-level dict is written key by
    key, so a long list of rows is never one string."""
    if type(value) is not dict or not value:
        handle.write(dumps_indent1(value))
        return
    handle.write("{\n ")
    first = True
    for key, item in value.items():
        if not first:
            handle.write(",\n ")
        first = False
        handle.write(_key(key) + ": ")
        texts = getattr(item, "texts", None)      # a compare's RowStore: its rows' text
        if texts is not None:
            _write_texts(texts(), handle)
        elif type(item) is list and item:
            handle.write("[\n  ")
            out: List[str] = []
            for n, element in enumerate(item):
                if n:
                    out.append(",\n  ")
                _encode(element, 2, out)
                if len(out) >= chunk:
                    handle.write("".join(out))
                    out = []
            handle.write("".join(out) + "\n ]")
        else:
            handle.write(dumps_indent1_at(item, 1))
    handle.write("\n}")


def encode_rows(rows: Any, level: int) -> str:
    """The elements of a list at nesting `level` - 1 (a top-level key's list: 2) as
    write_indent1 writes them between its brackets."""
    out: List[str] = []
    separator = ",\n" + " " * level
    for n, row in enumerate(rows):
        if n:
            out.append(separator)
        _encode(row, level, out)
    return "".join(out)


_WORDS = {True: "true", False: "false", None: "null"}
_NONE = type(None)


def _item_text(item: Any, level: int) -> str:
    """The text of one value of a dict at nesting `level`, as _dict writes it."""
    kind = type(item)
    if kind is str:
        return _escape(item)
    if kind is float:
        return float.__repr__(item) if item - item == 0.0 else _float(item)
    if item is None:
        return "null"
    if kind is int:
        return int.__repr__(item)
    if item is True:
        return "true"
    if item is False:
        return "false"
    nested: List[str] = []
    _encode(item, level + 1, nested)
    return "".join(nested)


def _column_texts(values: List[Any], level: int) -> List[str]:
    """The texts of one key's values in the dicts of a list at nesting `level` - 1: a column
    of one type at once, anything else value by value."""
    kinds = set(map(type, values))
    if kinds == {_NONE}:
        return ["null"] * len(values)
    if kinds <= {str}:
        return list(map(_escape, values))
    if kinds <= {int}:
        return list(map(int.__repr__, values))
    if kinds <= {float, _NONE}:
        if _NONE not in kinds:
            total = sum(values)                # finite: every value is (NaN and Inf spread)
            if total - total == 0.0:
                return list(map(float.__repr__, values))
        return ["null" if v is None else float.__repr__(v) if v - v == 0.0 else _float(v)
                for v in values]
    if kinds <= {bool, _NONE}:
        return list(map(_WORDS.__getitem__, values))
    if kinds <= {list}:            # shapes: few distinct ones
        seen: Dict[Tuple[Any, ...], str] = {}
        out = []
        for v in values:
            key = tuple(v)
            try:
                text = seen.get(key)
            except TypeError:      # a list inside: not kept
                text = _item_text(v, level)
            if text is None:
                text = seen[key] = _item_text(v, level)
            out.append(text)
        return out
    return [_item_text(v, level) for v in values]


def encode_row_columns(keys: Sequence[str], columns: Sequence[List[Any]],
                       extra: Sequence[Optional[Dict[str, Any]]], level: int) -> str:
    """encode_rows of the dicts `dict(zip(keys, values))` (each updated with its `extra`
    dict where it has one) whose values are held column by column: each key's values are
    written at once, and the rows joined; the same text."""
    n = len(extra)
    if not n:
        return ""
    inner = "\n" + " " * (level + 1)
    pieces: List[Any] = []         # each key's text and separator, then its values' texts
    for k, (key, values) in enumerate(zip(keys, columns)):
        pieces.append(itertools.repeat(("{" if k == 0 else ",") + inner + _key(key) + ": "))
        pieces.append(_column_texts(values, level))
    pieces.append(itertools.repeat("\n" + " " * level + "}"))
    rows = list(map("".join, zip(*pieces)))
    for p, more in enumerate(extra):
        if more is not None:       # element-wise metrics: this row as a dict
            row = dict(zip(keys, (values[p] for values in columns)))
            row.update(more)
            out: List[str] = []
            _dict(row, level, out)
            rows[p] = "".join(out)
    return ("," + "\n" + " " * level).join(rows)


def _write_texts(texts: Any, handle: Any) -> None:
    """A list given as pieces of encode_rows(.., 2) text."""
    first = True
    for text in texts:
        handle.write(("[\n  " if first else ",\n  ") + text)
        first = False
    handle.write("[]" if first else "\n ]")


def dumps_indent1_at(value: Any, level: int) -> str:
    out: List[str] = []
    _encode(value, level, out)
    return "".join(out)

