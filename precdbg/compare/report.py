"""Reports of a compare result: terminal summary, CSV of all rows, JSON, self-contained HTML."""
from __future__ import annotations

import csv
import html
import json
import math
from typing import Any, Dict, List

__all__ = ["summary_text", "write_csv", "write_json", "write_html"]

_CSV_FIELDS = ["step", "rank", "direction", "kind", "name_a", "name_b", "module", "op", "role",
               "arg_index", "status", "dtype_a", "dtype_b", "shape_a", "shape_b", "err", "tol",
               "d_min", "d_max", "d_mean", "d_norm", "min_a", "min_b", "max_a", "max_b",
               "mean_a", "mean_b", "norm_a", "norm_b", "nan_a", "nan_b", "inf_a", "inf_b",
               "checksum_equal", "cosine", "max_abs", "max_rel", "rmse", "rel_rmse",
               "beyond_0.1%", "beyond_0.5%", "order", "seq"]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def summary_text(result: Dict[str, Any]) -> str:
    lines = []
    base, cand = result["baseline"], result["candidate"]
    lines.append(f"baseline  {base['path']} ({base['framework'] or '?'})")
    lines.append(f"candidate {cand['path']} ({cand['framework'] or '?'})")
    for setup in result.get("setup", []) or []:
        lines.append(f"setup: [{setup['severity']}] {setup['message']}")
    rows = result["rows"]
    bad = sum(1 for r in rows if r["status"] == "diverged")
    lines.append(f"{len(rows)} record pairs compared, {bad} beyond tolerance, "
                 f"{result['unmatched_count']} records without counterpart")
    first = result["first_divergence"]
    if first is None:
        lines.append("verdict: MATCH — no divergence beyond tolerance")
    else:
        lines.append("verdict: DIVERGED")
        lines.append(f"first divergence: step {first['step']} rank {first['rank']} "
                     f"{first['direction']} {first['kind']}")
        lines.append(f"  {first['name_a'] or '-'}  <->  {first['name_b'] or '-'}")
        lines.append(f"  module '{first['module']}'  op '{first['op']}'  role {first['role']}")
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
                shown = ", ".join(f"{k} {_fmt(m[k])}" for k in
                                  ("norm_a", "norm_b", "mean_a", "mean_b", "err", "cosine")
                                  if k in m and m[k] is not None)
                lines.append(f"  {label}: {item['role']} {item['arg_index']}: {shown}")
        if ev.get("inputs_agreeing"):
            lines.append(f"  inputs that agree: {ev['inputs_agreeing']}")
        cons = result["consequences"]
        if cons:
            lines.append(f"consequences (first {min(len(cons), 5)} of {len(cons)}+):")
            for c in cons[:5]:
                lines.append(f"  step {c['step']} rank {c.get('rank', 0)} {c['direction']:<8} "
                             f"{c['name_a']}  "
                             f"({c['role']}, err {_fmt(c['err'])})")
    if result["unmatched_count"]:
        sides = {"a": "baseline", "b": "candidate"}
        shown = {}
        for u in result["unmatched"]:
            if u["role"] in ("input", "output", "param") and len(shown) < 6:
                shown.setdefault((u["side"], u["name"]), u)
        lines.append(f"without counterpart: {result['unmatched_count']} records"
                     + (", e.g." if shown else ""))
        for (side, name), u in shown.items():
            lines.append(f"  only in the {sides[side]}: {name} ({u['role']} {u['arg_index']}, "
                         f"module '{u['module']}')")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def write_json(result: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1, default=str)


def write_csv(result: Dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for row in result["rows"]:
            writer.writerow({k: row.get(k, "") for k in _CSV_FIELDS})


def _plot(rows: List[Dict[str, Any]], direction: str, width: int = 900, height: int = 220) -> str:
    """An inline SVG: log10 of each record's error along execution order, tolerance dashed."""
    pts = [r for r in rows if r["direction"] == direction and r.get("err") is not None]
    if not pts:
        return f"<p>No {direction} records.</p>"
    pts.sort(key=lambda r: r["seq"])
    xs = range(len(pts))
    ys = [math.log10(max(r["err"], 1e-12)) if r["err"] < 1e300 else 3.0 for r in pts]
    lo, hi = -12.0, max(3.0, max(ys))
    sx = (width - 60) / max(len(pts) - 1, 1)
    sy = (height - 30) / (hi - lo)
    dots = []
    for x, y, r in zip(xs, ys, pts):
        colour = "#c0392b" if r["status"] == "diverged" else "#2e86c1"
        title = html.escape(f"{r['name_a']} {r['role']} {r['arg_index']}: err {r['err']:.3g}")
        dots.append(f'<circle cx="{50 + x * sx:.1f}" cy="{10 + (hi - y) * sy:.1f}" r="2.2" '
                    f'fill="{colour}"><title>{title}</title></circle>')
    tol = math.log10(max(pts[0].get("tol") or 1e-12, 1e-12))
    ty = 10 + (hi - tol) * sy
    axis = "".join(f'<text x="2" y="{10 + (hi - v) * sy + 4:.1f}" font-size="10">1e{int(v)}</text>'
                   for v in range(int(lo), int(hi) + 1, 3))
    return (f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect x="45" y="5" width="{width - 50}" height="{height - 20}" fill="none" '
            f'stroke="#999"/>{axis}<line x1="45" x2="{width - 5}" y1="{ty:.1f}" y2="{ty:.1f}" '
            f'stroke="#888" stroke-dasharray="4"/>{"".join(dots)}</svg>')


def write_html(result: Dict[str, Any], path: str) -> None:
    first = result["first_divergence"]
    summary = html.escape(summary_text({**result, "rows": result["rows"]}))
    rows = result["rows"]
    table_rows = []
    for r in sorted(rows, key=lambda r: -(r["err"] or 0))[:200]:
        cls = ' class="bad"' if r["status"] == "diverged" else ""
        table_rows.append(
            f"<tr{cls}><td>{r['step']}</td><td>{r['direction']}</td>"
            f"<td>{html.escape(r['name_a'])}</td><td>{html.escape(r['name_b'])}</td>"
            f"<td>{html.escape(r['module'])}</td><td>{r['op']}</td><td>{r['role']} "
            f"{r['arg_index']}</td><td>{_fmt(r['err'])}</td><td>{_fmt(r['tol'])}</td>"
            f"<td>{_fmt(r['norm_a'])}</td><td>{_fmt(r['norm_b'])}</td></tr>")
    title = "MATCH" if first is None else f"DIVERGED at {first['name_a'] or first['name_b']}"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>precdbg compare: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:20px}}pre{{background:#f6f6f6;padding:10px}}
table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ddd;padding:2px 6px}}
tr.bad{{background:#fdecea}}</style></head><body>
<h1>precdbg compare: {html.escape(title)}</h1>
<pre>{summary}</pre>
<h2>Error along execution order — forward</h2>{_plot(rows, "forward")}
<h2>Error along execution order — backward</h2>{_plot(rows, "backward")}
<p>Each dot is one tensor pair (log10 of its relative error; red beyond tolerance, dashed line:
float32 tolerance). Hover for names.</p>
<h2>Largest differences (top 200 of {len(rows)})</h2>
<table><tr><th>step</th><th>dir</th><th>baseline</th><th>candidate</th><th>module</th><th>op</th>
<th>role</th><th>err</th><th>tol</th><th>norm a</th><th>norm b</th></tr>{''.join(table_rows)}</table>
</body></html>"""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
