"""Reports of a compare result: terminal summary, CSV of all rows, JSON, self-contained HTML."""
from __future__ import annotations

import csv
from typing import Any, Dict

from ...records.schema import Role

__all__ = ["summary_text", "write_csv", "write_json", "write_html"]

_CSV_FIELDS = ["step", "rank", "direction", "kind", "name_a", "name_b", "module", "op", "role",
               "arg_index", "status", "dtype_a", "dtype_b", "shape_a", "shape_b", "err", "tol",
               "d_min", "d_max", "d_mean", "d_norm", "d_pos_mean", "min_a", "min_b", "max_a",
               "max_b", "mean_a", "mean_b", "norm_a", "norm_b", "pos_mean_a", "pos_mean_b",
               "nan_a", "nan_b", "inf_a", "inf_b", "checksum_equal", "cosine", "max_abs",
               "max_rel", "rmse", "rel_rmse", "beyond_0.1%", "beyond_0.5%", "floor",
               "update_share", "dw_agreed", "order", "seq"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 1e308:          # JSON's stand-in for an infinite value (rows.py)
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    return str(value)


def _err(err: Any, tol: Any, inside: bool = False) -> str:
    """An error with the tolerance it was judged by: `err 1.38e-05 (tol 1e-06)`, or
    `err 1.38e-05, tol 1e-06` `inside` parentheses."""
    if not isinstance(tol, float):
        return f"err {_fmt(err)}"
    return f"err {_fmt(err)}, tol {tol:.3g}" if inside else f"err {_fmt(err)} (tol {tol:.3g})"


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _csv_value(value: Any) -> Any:
    """A CSV cell: ±Inf as text, and a text a spreadsheet would run as a formula (a name
    starting with `=`, `+`, `-`, `@`) prefixed with `'`, so it stays text."""
    if isinstance(value, float) and abs(value) >= 1e308:
        return _fmt(value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


_INCOMPLETE_WHY = {"only_here": "only in the {side} (the other dump has no such file)",
                   "unreadable": "not compared, a file cannot be read: {error}",
                   "interrupted": "the {side}'s step is not whole (the process ended inside it)",
                   "failures": "the {side}'s step lost records to failures inside precdbg",
                   "partial": "the {side} has an incomplete file, skipped: {file}"}


def _incomplete_text(part: Dict[str, Any]) -> str:
    where = f"step {part['step']} rank {part['rank']}: " if part.get("step") is not None else ""
    return where + _INCOMPLETE_WHY[part["why"]].format(**part)


def summary_text(result: Dict[str, Any]) -> str:
    lines = []
    base, cand = result["baseline"], result["candidate"]
    lines.append(f"baseline  {base['path']} ({base['framework'] or '?'})")
    lines.append(f"candidate {cand['path']} ({cand['framework'] or '?'})")
    for setup in result.get("setup", []) or []:
        lines.append(f"setup: [{setup['severity']}] {setup['message']}")
    from .row_store import row_counts      # a list of dicts, or the CLI's RowStore
    count, bad = row_counts(result["rows"])
    lines.append(f"{count} record pairs compared, {bad} beyond tolerance, "
                 f"{result['unmatched_count']} records without counterpart")
    first = result["first_divergence"]
    if first is None and result.get("verdict") == "incomplete":
        lines.append("verdict: INCOMPLETE — no divergence in what both dumps hold, but they do "
                     "not cover both runs (--allow-missing: a match)")
        lines.extend(f"  {_incomplete_text(part)}" for part in result["incomplete"][:10])
        if len(result["incomplete"]) > 10:
            lines.append(f"  ... and {len(result['incomplete']) - 10} more")
    elif first is None:
        lines.append("verdict: MATCH — no divergence beyond tolerance")
    else:
        lines.append("verdict: DIVERGED")
        lines.append(f"first divergence: step {first['step']} rank {first['rank']} "
                     f"{first['direction']} {first['kind']}"
                     + (f", {first['when']}" if first.get("when") else ""))
        lines.append(f"  {first['name_a'] or '-'}  <->  {first['name_b'] or '-'}")
        lines.append(f"  module '{first['module']}'"
                     + (f"  op '{first['op']}'" if first.get("op") else "")
                     + (f"  role {first['role']}" if first.get("role") else ""))
        sites = first.get("call_site") or {}
        if len(set(sites.values())) == 1:
            lines.append(f"  called at {next(iter(sites.values()))}")
        for label, site in sites.items() if len(set(sites.values())) > 1 else ():
            lines.append(f"  called at {site} ({label})")
        lines.append(f"  why: {first['reason']}")
        chain = first.get("chain") or []
        if chain:
            lines.append("  producer chain (first difference seen -> culprit):")
            for link in chain:
                lines.append(f"    step {link['step']} rank {link['rank']}: {link['text']}")
        ev = first.get("evidence", {})
        for label, items in (("inputs that differ", ev.get("inputs_bad", [])),
                             ("outputs that differ", ev.get("outputs_bad", []))):
            for item in items[:3]:
                m = item.get("metrics", {})
                shown = ", ".join(_err(m[k], m.get("tol")) if k == "err" else f"{k} {_fmt(m[k])}"
                                  for k in ("norm_a", "norm_b", "mean_a", "mean_b", "err",
                                            "cosine")
                                  if k in m and m[k] is not None)
                if shown:       # no statistics to show (a record of one run only)
                    lines.append(f"  {label}: {item['role']} {item['arg_index']}: {shown}")
        if ev.get("inputs_agreeing"):
            lines.append(f"  inputs that agree: {ev['inputs_agreeing']}")
        cons = result["consequences"]
        if cons:
            lines.append(f"consequences (first {min(len(cons), 5)} of {len(cons)}+):")
            for c in cons[:5]:
                arg = c.get("argument")
                what = f"argument '{arg['key']}': {arg['a']!r} vs {arg['b']!r}" if arg else \
                    f"{c['role']}, only in the {c['only_in']}" if c.get("only_in") else \
                    f"{c['role']}, {_err(c['err'], c.get('tol'), inside=True)}"
                name = c["name_a"] or c.get("name_b") or "-"
                lines.append(f"  step {c['step']} rank {c.get('rank', 0)} {c['direction']:<8} "
                             f"{name}  ({what})")
    if result["unmatched_count"]:
        sides = {"a": "baseline", "b": "candidate"}
        shown = {}
        # forward records first (where one run calls something the other does not); the
        # backward ones when there are no others (a cast that has a backward in one run only)
        forward = [u for u in result["unmatched"] if u["role"] in (Role.INPUT, Role.OUTPUT, Role.PARAM)]
        for u in forward or result["unmatched"]:
            if len(shown) < 6:
                shown.setdefault((u["side"], u["name"]), u)
        lines.append(f"without counterpart: {result['unmatched_count']} records"
                     + (", e.g." if shown else ""))
        for (side, name), u in shown.items():
            lines.append(f"  only in the {sides[side]}: {name} ({u['role']} {u['arg_index']}, "
                         f"module '{u['module']}')")
    for note in result["notes"]:
        lines.append(f"note: {note['text']}")
    for note in result.get("setup_unchecked", []):
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def write_json(result: Dict[str, Any], path: str) -> None:
    from .json_out import write_indent1
    with open(path, "w", encoding="utf-8") as handle:
        write_indent1(result, handle)     # json.dump(result, handle, indent=1, default=str)


def write_csv(result: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in result["rows"]:
            writer.writerow({k: _csv_value(row.get(k, "")) for k in _CSV_FIELDS})


def write_html(result: Dict[str, Any], path: str) -> None:
    """The self-contained HTML report (model tree, timeline, set-up findings): see html_report."""
    from .html import write_html as write_page
    write_page(result, path)
