"""Compare two dumps: align their records, measure each pair, name the first divergence.

`compare_dumps(baseline, candidate)` returns the JSON-ready result of the compare contract:
`{"verdict", "first_divergence", "consequences", "unmatched", "notes", "rows", "setup"}`, where
"setup" lists the set-up differences `precdbg check` finds (run first, see precdbg/check.py).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DumpError
from ..reader import Dump, RecordTable, open_dump
from .align import align, load_mapping
from .localize import INPUT_ROLES, Entry, locate
from .metrics import stat_errors, tensor_metrics
from .progress import CompareProgress

__all__ = ["compare_dumps", "load_mapping", "CompareProgress"]

Progress = Optional[Callable[[CompareProgress], None]]

_PHASE_OF = {"none": "setup", "forward": "forward", "backward": "backward"}
_MAX_CONSEQUENCES = 20


def _framework(dump: Dump) -> str:
    return str(dump.run.get("framework", ""))


def _round(value: float) -> Optional[float]:
    value = float(value)
    return None if np.isnan(value) else (value if np.isfinite(value) else
                                          (1e308 if value > 0 else -1e308))


def _row(ta: RecordTable, tb: RecordTable, i: int, j: int, st: Dict[str, np.ndarray], p: int,
         tm: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    ra, rb = ta.row(i), tb.row(j)
    row = {"step": ra["step"], "rank": ra["rank"], "name_a": ra["entry"], "name_b": rb["entry"],
           "kind": ra["kind"], "direction": ra["direction"], "module": ra["module"],
           "module_b": rb["module"],
           "op": ra["op"], "role": ra["role"], "arg_index": ra["arg_index"],
           "dtype_a": ra["dtype"], "dtype_b": rb["dtype"], "shape_a": list(ra["shape"]),
           "shape_b": list(rb["shape"]), "order": ra["order"], "seq": ra["seq"],
           "status": "diverged" if st["diverged"][p] else "match"}
    for stat in ("min", "max", "mean", "norm"):
        row[f"{stat}_a"], row[f"{stat}_b"] = _round(ra[stat]), _round(rb[stat])
    for key in ("d_min", "d_max", "d_mean", "d_norm", "err", "tol"):
        row[key] = _round(st[key][p])
    row["nan_a"], row["nan_b"] = ra["nan_count"], rb["nan_count"]
    row["inf_a"], row["inf_b"] = ra["inf_count"], rb["inf_count"]
    row["checksum_equal"] = bool(st["checksum_equal"][p])
    if tm is not None:
        row.update({k: _round(v) for k, v in tm.items()})
    return row


def _why(row: Dict[str, Any]) -> str:
    if row["shape_a"] != row["shape_b"]:
        return f" (shape {row['shape_a']} vs {row['shape_b']})"
    if (row["nan_a"], row["inf_a"]) != (row["nan_b"], row["inf_b"]):
        return (f" (NaN/Inf counts {row['nan_a']}/{row['inf_a']} vs "
                f"{row['nan_b']}/{row['inf_b']})")
    if "rel_rmse" in row and row.get("rel_rmse") is not None:
        return f" (relative RMSE {row['rel_rmse']:.3g}, cosine {row['cosine']:.6f})"
    return f" (relative error {row['err']:.3g} > tolerance {row['tol']:.1g})"


def _evidence(row: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("min_a", "min_b", "max_a", "max_b", "mean_a", "mean_b", "norm_a", "norm_b", "err",
            "tol", "cosine", "max_abs", "max_rel", "rmse", "rel_rmse")
    return {"role": row["role"], "arg_index": row["arg_index"], "why": _why(row),
            "shape_ok": row["shape_a"] == row["shape_b"],
            "metrics": {k: row[k] for k in keys if k in row}}


def _compare_step(a: Dump, b: Dump, step: int, rank: int, same: bool, mapping: Any,
                  rows: List[Dict[str, Any]], unmatched: List[Dict[str, Any]],
                  progress: Progress, files: Tuple[int, int]) -> Dict[str, List[Entry]]:
    def report(done: int, total: int, phase: str) -> None:
        if progress is not None:
            progress(CompareProgress(files[0], files[1], step, rank, done, total, phase))
    ta, tb = a.records(step, rank), b.records(step, rank)
    report(0, 0, "aligning")
    al = align(ta, tb, same, mapping)
    st = stat_errors(ta, tb, al.pairs_a, al.pairs_b)
    stored = (ta["data_offset"][al.pairs_a] >= 0) & (tb["data_offset"][al.pairs_b] >= 0)
    entries: Dict[Tuple[str, str], Entry] = {}
    total = len(al.pairs_a)
    for p, (i, j) in enumerate(zip(al.pairs_a.tolist(), al.pairs_b.tolist())):
        tm = None
        if stored[p]:
            tm = tensor_metrics(a.tensor_at(ta, i), b.tensor_at(tb, j))
            if tm is not None and not st["checksum_equal"][p]:
                st["diverged"][p] = (tm["rel_rmse"] > max(st["tol"][p], 1e-12)) or \
                    not st["counts_ok"][p]
        row = _row(ta, tb, i, j, st, p, tm)
        rows.append(row)
        _add_to_entry(entries, row, ta, tb, i, j, bool(st["diverged"][p]))
        if p % 200 == 0:
            report(p, total, "comparing")
    for side, table, idx in (("a", ta, al.only_a), ("b", tb, al.only_b)):
        for i in idx.tolist():
            r = table.row(i)
            unmatched.append({"side": side, "step": step, "rank": rank, "name": r["entry"],
                              "kind": r["kind"], "module": r["module"], "op": r["op"],
                              "role": r["role"], "arg_index": r["arg_index"]})
            if r["kind"] == "param" and r["role"] == "param":
                # a parameter present in one run only is an inventory difference (buffers are
                # framework plumbing: MindSpore has none where PyTorch has some)
                key = ("none", r["entry"])
                e = entries.setdefault(key, Entry(step, rank, "none", "param",
                                                  r["entry"] if side == "a" else "",
                                                  r["entry"] if side == "b" else "",
                                                  r["module"], r["op"], 0, int(r["seq"])))
                e.outputs_bad.append({"role": r["role"], "arg_index": 0, "metrics": {},
                                      "why": f" (only in the {'baseline' if side == 'a' else 'candidate'})",
                                      "shape_ok": True})
    phases: Dict[str, List[Entry]] = {"setup": [], "forward": [], "backward": [],
                                      "param_grad": []}
    for e in entries.values():
        phase = "param_grad" if e.kind == "param_grad" else _PHASE_OF.get(e.direction, "forward")
        phases[phase].append(e)
    return phases


def _add_to_entry(entries: Dict[Tuple[str, str], Entry], row: Dict[str, Any], ta: RecordTable,
                  tb: RecordTable, i: int, j: int, diverged: bool) -> None:
    key = (row["direction"], row["name_a"])
    e = entries.get(key)
    if e is None:
        e = entries[key] = Entry(row["step"], row["rank"], row["direction"], row["kind"],
                                 row["name_a"], row["name_b"], row["module"], row["op"],
                                 row["order"], row["seq"])
    e.seq = min(e.seq, row["seq"])
    if row["kind"] == "param" and bool(ta["trainable"][i]) != bool(tb["trainable"][j]):
        e.trainable_differs = True
    is_input = row["role"] in INPUT_ROLES
    if row["dtype_b"].startswith("py."):        # a non-tensor argument: a cause, not data
        if diverged:
            e.args_bad.append({"role": row["role"], "arg_index": row["arg_index"],
                               "key": str(ta["arg_key"][i]), "a": str(ta["text"][i]),
                               "b": str(tb["text"][j]), "metrics": {}})
        return
    if diverged:
        (e.inputs_bad if is_input else e.outputs_bad).append(_evidence(row))
    elif is_input:
        e.inputs_ok += 1
    else:
        e.outputs_ok += 1


def _pairs_of(a: Dump, b: Dump, step: Optional[int], rank: Optional[int]
              ) -> List[Tuple[int, int]]:
    common = [(s, r) for s in a.steps for r in a.ranks
              if a.files(s, r) and b.files(s, r)
              and (step is None or s == step) and (rank is None or r == rank)]
    if not common:
        raise DumpError(f"no step/rank present in both dumps (baseline steps {a.steps} ranks "
                        f"{a.ranks}; candidate steps {b.steps} ranks {b.ranks}"
                        + (f"; asked step {step}" if step is not None else "")
                        + (f" rank {rank}" if rank is not None else "") + ")")
    return common


def compare_dumps(baseline: str, candidate: str, step: Optional[int] = None,
                  rank: Optional[int] = None, mapping_file: Optional[str] = None,
                  progress: Progress = None) -> Dict[str, Any]:
    """Compare two dumps (roots, step folders or step files). Baseline is `a`. `progress`, when
    given, is called with a CompareProgress as the compare goes (see compare/progress.py)."""
    mapping = load_mapping(mapping_file) if mapping_file else None
    a, b = open_dump(baseline), open_dump(candidate)
    try:
        from ..check import check_dumps
        pairs = _pairs_of(a, b, step, rank)
        setup = check_dumps(a, b, step=step, rank=rank, labels=("baseline", "candidate"))
        fa, fb = _framework(a), _framework(b)
        same = bool(fa) and fa == fb
        rows: List[Dict[str, Any]] = []
        unmatched: List[Dict[str, Any]] = []
        per_step: Dict[int, Dict[str, List[Entry]]] = {}
        for k, (s, r) in enumerate(pairs):
            phases = _compare_step(a, b, s, r, same, mapping, rows, unmatched, progress,
                                   (k, len(pairs)))
            merged = per_step.setdefault(s, {})
            for phase, items in phases.items():
                merged.setdefault(phase, []).extend(items)
        if progress is not None:
            progress(CompareProgress(len(pairs), len(pairs), s, r, 0, 0, "localizing"))
        stats_only = not any(("rel_rmse" in row) or row["checksum_equal"] for row in rows)
        first = locate([per_step[s] for s in sorted(per_step)], stats_only)
        notes = []
        if fa != fb:
            notes.append(f"frameworks differ ({fa or '?'} vs {fb or '?'}): records aligned by "
                         "module path, canonical op and order")
        if stats_only:
            notes.append("statistics only: a permutation or a compensating change keeps min, "
                         "max, mean and norm; dump with task 'tensor' or summary_mode 'checksum' "
                         "to confirm a match bit for bit")
        consequences = _consequences(per_step, first)
        if first is not None:
            _note_extra_calls(first, unmatched)
        return {"verdict": "diverged" if first else "match", "first_divergence": first,
                "consequences": consequences, "unmatched": unmatched[:1000],
                "unmatched_count": len(unmatched), "notes": notes,
                "setup": setup["findings"], "setup_notes": setup["notes"],
                "baseline": {"path": baseline, "framework": fa},
                "candidate": {"path": candidate, "framework": fb}, "rows": rows}
    finally:
        a.close()
        b.close()


def _note_extra_calls(first: Dict[str, Any], unmatched: List[Dict[str, Any]]) -> None:
    """Calls inside the culprit's module that only one run made are part of the evidence."""
    if first["kind"] not in ("module", "api"):
        return
    inside = lambda m: first["module"] == "" or m == first["module"] or \
        m.startswith(first["module"] + ".")  # noqa: E731
    extra = {}
    for u in unmatched:
        if u["step"] == first["step"] and u["kind"] == "api" and inside(u["module"]):
            extra.setdefault(u["side"], []).append(u["name"])
    if extra:
        first["evidence"]["calls_in_one_run_only"] = {
            ("baseline" if side == "a" else "candidate"): sorted(set(names))[:10]
            for side, names in extra.items()}
        for side, names in extra.items():
            who = "baseline" if side == "a" else "candidate"
            first["reason"] += (f"; only the {who} calls {', '.join(sorted(set(names))[:4])} "
                                "inside it")


def _contains(e: Entry, first: Dict[str, Any]) -> bool:
    """A module that encloses the culprit diverges because of it, not after it."""
    if e.kind != "module" or e.step != first["step"] or e.direction != first["direction"]:
        return False
    return e.module == "" or first["module"] == e.module or \
        first["module"].startswith(e.module + ".")


def _consequences(per_step: Dict[int, Dict[str, List[Entry]]],
                  first: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    if first is None:
        return []
    out = []
    for s in sorted(per_step):
        for phase in ("setup", "forward", "backward", "param_grad"):
            key = (lambda e: e.order) if phase == "forward" else (lambda e: e.seq)
            for e in sorted(per_step[s].get(phase, []), key=key):
                if e.diverged and not (e.name_a == first["name_a"] and s == first["step"]) \
                        and not _contains(e, first):
                    ev = (e.outputs_bad or e.inputs_bad)[0]
                    out.append({"step": s, "direction": e.direction, "kind": e.kind,
                                "name_a": e.name_a, "module": e.module, "op": e.op,
                                "role": ev["role"], "err": ev["metrics"].get("err")})
                    if len(out) >= _MAX_CONSEQUENCES:
                        return out
    return out
