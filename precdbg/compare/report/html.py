"""The HTML report of a compare: one self-contained page (inline CSS and JS, no network) showing
the baseline's module tree coloured by where the runs part (the clipping calls after the backward
folded into one node, the optimizer's into another), a per-module overview of error over tolerance (assets/overview.js), a timeline of
each record's error per step and direction with the model's layers as bands, and the set-up
findings.

The page is rendered in the browser from data embedded as JSON (element `#precdbg-data`): the
compare result (the JSON report's contract) with its rows stored as columns over one table of
strings, and the module trees of both dumps. The script and style live beside this module in
`assets/` and are inlined (the scripts, in the order of _SCRIPTS, in one function scope:
no libraries, no globals), so the file opens from a `file://` URL offline. The tree's nodes are
built per (step, rank) when chosen and put in the DOM only when opened.

Data format (`page_data`), version 1:
  {"format": "precdbg-report", "version": 1, "verdict", "first_divergence", "consequences",
   "setup", "notes", "baseline", "candidate", "unmatched_count", "summary_text",
   "strings": [...],                                  every string column indexes this table
   "rows": {"count": N, "<column>": [...], ...},      ROW_STRING_COLUMNS index "strings"; a
                                                      column of one value throughout is that value
   "unmatched": {"count": M, "side": [...], ...},     same encoding
   "trees": [{"path": [...], "cls": [...], "parent": [...]}, ...],   distinct module trees
   "tree_of": {"a": {"<step>/<rank>": k}, "b": {...}}}              which tree each file holds
"""
from __future__ import annotations

import html
import json
import math
from importlib import resources
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["page_data", "render_html", "write_html", "module_trees", "DATA_ELEMENT_ID",
           "ROW_STRING_COLUMNS", "ROW_NUMBER_COLUMNS"]

DATA_ELEMENT_ID = "precdbg-data"
ROW_STRING_COLUMNS = ("name_a", "name_b", "kind", "direction", "module", "module_b", "op", "role",
                      "phase", "dtype_a", "dtype_b", "shape_a", "shape_b", "status")
ROW_NUMBER_COLUMNS = ("step", "rank", "arg_index", "seq", "order", "err", "tol", "min_a", "min_b",
                      "max_a", "max_b", "mean_a", "mean_b", "norm_a", "norm_b", "nan_a", "nan_b",
                      "inf_a", "inf_b", "cosine", "max_abs", "max_rel", "rel_rmse")
_UNMATCHED_STRING_COLUMNS = ("side", "name", "kind", "module", "op", "role")
_UNMATCHED_NUMBER_COLUMNS = ("step", "rank", "arg_index")
_SCRIPTS = ("model.js", "view.js", "timeline.js", "overview.js", "page.js")
_DIGITS = 6           # significant digits kept for floats in the page (the JSON report keeps all)
Tree = List[Tuple[str, str, str]]


class _Strings:
    """One table of distinct strings; columns hold indices into it."""

    def __init__(self) -> None:
        self.table: List[str] = []
        self._index: Dict[str, int] = {}

    def __call__(self, value: Any) -> int:
        text = "" if value is None else str(value)
        k = self._index.get(text)
        if k is None:
            k = self._index[text] = len(self.table)
            self.table.append(text)
        return k


def _number(value: Any) -> Any:
    """A float cut to _DIGITS significant digits (ints as they are); NaN -> None."""
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, int):
        return value
    value = float(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        return 1e308 if value > 0 else -1e308
    return float(f"{value:.{_DIGITS}g}")


def _jsonable(value: Any) -> Any:
    """Nested data with NaN/Inf replaced (JSON.parse accepts neither) and tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return _number(value) if not math.isfinite(value) else value
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _shape_text(shape: Any) -> str:
    if isinstance(shape, (list, tuple)):
        return "x".join(str(d) for d in shape) if shape else "scalar"
    return "" if shape is None else str(shape)


def _string_value(item: Dict[str, Any], column: str) -> str:
    if column.startswith("shape_"):
        return _shape_text(item.get(column))
    if column == "module_b":    # the candidate's module path, where compare recorded it
        return str(item.get("module_b", item.get("module")))
    value = item.get(column)
    return "" if value is None else str(value)


def _columns(items: Sequence[Dict[str, Any]], strings: _Strings, string_columns: Sequence[str],
             number_columns: Sequence[str]) -> Dict[str, Any]:
    """Columns of `items`; a column holding one value throughout is stored as that value."""
    if not isinstance(items, list):     # a compare's RowStore: read from its file once
        items = list(items)
    out: Dict[str, Any] = {"count": len(items)}
    texts = {column: [_string_value(item, column) for item in items] for column in string_columns}
    # columns of few distinct values first: their strings get the short (small) indices
    for column in sorted(string_columns, key=lambda c: len(set(texts[c]))):
        out[column] = [strings(text) for text in texts[column]]
    for column in number_columns:
        out[column] = [_number(item.get(column)) for item in items]
    for column in (*string_columns, *number_columns):
        values = out[column]
        if values and all(v == values[0] and type(v) is type(values[0]) for v in values):
            out[column] = values[0]
    return {"count": out["count"], **{c: out[c] for c in (*string_columns, *number_columns)}}


def module_trees(result: Dict[str, Any]) -> Dict[str, Dict[Tuple[int, int], Tree]]:
    """The module trees of both dumps, per (step, rank) compared, read with precdbg.storage.reader.
    A dump that cannot be opened any more (a result loaded from JSON elsewhere) gives none: the
    page then builds the tree from the records' module paths."""
    from ...errors import PrecdbgError
    from ...storage.reader import open_dump
    pairs = sorted({(int(r["step"]), int(r["rank"])) for r in result.get("rows", [])})
    trees: Dict[str, Dict[Tuple[int, int], Tree]] = {"a": {}, "b": {}}
    for side, key in (("a", "baseline"), ("b", "candidate")):
        path = (result.get(key) or {}).get("path")
        if not path:
            continue
        try:
            dump = open_dump(path)
        except (PrecdbgError, OSError):
            continue
        try:
            for step, rank in pairs:
                try:
                    tree = dump.modules(step=step, rank=rank)
                except PrecdbgError:     # a named file compared under another step's number
                    continue
                if tree:
                    trees[side][(step, rank)] = [tuple(map(str, node)) for node in tree]
        finally:
            dump.close()
    return trees


def page_data(result: Dict[str, Any],
              trees: Optional[Dict[str, Dict[Tuple[int, int], Tree]]] = None) -> Dict[str, Any]:
    """The JSON-able data the page renders: the compare result, compacted (see module doc)."""
    from .formats import summary_text
    strings = _Strings()
    distinct: Dict[Tuple[Tuple[str, str, str], ...], int] = {}
    tree_list: List[Dict[str, List[str]]] = []
    tree_of: Dict[str, Dict[str, int]] = {"a": {}, "b": {}}
    for side, per_file in (trees or {}).items():
        for (step, rank), tree in sorted(per_file.items()):
            key = tuple(tuple(node) for node in tree)
            if key not in distinct:
                distinct[key] = len(tree_list)
                tree_list.append({"path": [n[0] for n in tree], "cls": [n[1] for n in tree],
                                  "parent": [n[2] for n in tree]})
            tree_of.setdefault(side, {})[f"{step}/{rank}"] = distinct[key]
    rows = result.get("rows", [])
    return {
        "format": "precdbg-report", "version": 1,
        "verdict": result.get("verdict"),
        "first_divergence": _jsonable(result.get("first_divergence")),
        "consequences": _jsonable(result.get("consequences", [])),
        "setup": _jsonable(result.get("setup", [])),
        "setup_notes": _jsonable(result.get("setup_notes", [])),
        "notes": _jsonable(result.get("notes", [])),
        "baseline": _jsonable(result.get("baseline", {})),
        "candidate": _jsonable(result.get("candidate", {})),
        "unmatched_count": result.get("unmatched_count", len(result.get("unmatched", []))),
        "summary_text": summary_text(result),
        "rows": _columns(rows, strings, ROW_STRING_COLUMNS, ROW_NUMBER_COLUMNS),
        "unmatched": _columns(result.get("unmatched", []), strings, _UNMATCHED_STRING_COLUMNS,
                              _UNMATCHED_NUMBER_COLUMNS),
        "trees": tree_list, "tree_of": tree_of,
        "strings": strings.table,
    }


def _asset(name: str) -> str:
    return resources.files("precdbg.compare.report").joinpath("assets", name).read_text("utf-8")


def _embed(data: Dict[str, Any]) -> str:
    """JSON safe inside <script>: every '<' escaped (it can only occur inside strings)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_html(result: Dict[str, Any],
                trees: Optional[Dict[str, Dict[Tuple[int, int], Tree]]] = None) -> str:
    """The whole page as a string."""
    first = result.get("first_divergence")
    title = f"DIVERGED at {first.get('name_a') or first.get('name_b')}" if first else \
        ("INCOMPLETE" if result.get("verdict") == "incomplete" else "MATCH")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>precdbg compare: {html.escape(title)}</title>\n"
        f"<style>\n{_asset('report.css')}</style></head>\n<body>\n"
        '<noscript><p>This report is drawn by JavaScript; enable it, or read the JSON report '
        "(precdbg compare --json).</p></noscript>\n"
        '<div id="app"></div>\n'
        f'<script type="application/json" id="{DATA_ELEMENT_ID}">{_embed(page_data(result, trees))}'
        "</script>\n"
        "<script>\n(function () {\n'use strict';\n"
        + "".join(_asset(name) for name in _SCRIPTS) + "})();\n</script>\n</body></html>\n")


def write_html(result: Dict[str, Any], path: str,
               trees: Optional[Dict[str, Dict[Tuple[int, int], Tree]]] = None) -> None:
    """Write the page; the module trees are read from the result's dumps when not given."""
    page = render_html(result, module_trees(result) if trees is None else trees)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
