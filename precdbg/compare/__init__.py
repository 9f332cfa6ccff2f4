"""Compare two dumps: align their records, measure each pair, name the first divergence.

`compare_dumps(baseline, candidate)` returns the JSON-ready result of the compare contract:
`{"verdict", "first_divergence", "consequences", "unmatched", "notes", "rows", "setup"}`, where
"setup" lists the set-up differences `precdbg check` finds (run first, see precdbg/check.py).
`first_divergence["chain"]` is the producer chain the verdict was found through (see
localize.py): from the first differing entry seen in execution order to the culprit, each link
with `name_a`, `name_b`, `step`, `rank`, `text`. Each row (`rows.Row`) names the entries that
produced the tensor it reads (`producer_a`, `producer_b`; "" when nothing captured did).
At steps k >= 1 a `multistep.NoisePolicy` judges parameters by how much the runs' last updates
differ (`update_share`, `dw_agreed` on their rows) and the step's other records above a floor
from the parameters' difference, when `check` finds the optimizers configured alike.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DumpError
from ..reader import Dump, RecordTable, open_dump
from ..schema import NO_PRODUCER, READ_ROLES, WRITE_ROLES, RecordKind, Role, is_scalar_dtype
from .align import Alignment, align, load_mapping, rename_module
from .localize import Entry, StepEntries, contains, locate
from .structure import StructuralDiff, structural_differences
from .floors import apply_floors
from .metrics import stat_errors, tensor_metrics
from .multistep import NoisePolicy, optimizer_setup
from .progress import CompareProgress
from .rows import ArgDiff, Evidence, Producer, Row, Source, finite_or_none

__all__ = ["compare_dumps", "load_mapping", "CompareProgress"]

Progress = Optional[Callable[[CompareProgress], None]]

_MAX_CONSEQUENCES = 20
_PARAM = RecordKind.PARAM.value
_MODULE = RecordKind.MODULE.value
_PARAM_GRAD = RecordKind.PARAM_GRAD.value
_FORWARD_ROLES = frozenset({Role.INPUT.value, Role.OUTPUT.value})


def _framework(dump: Dump) -> str:
    return str(dump.run.get("framework", ""))


def _row(ta: RecordTable, tb: RecordTable, i: int, j: int, st: Dict[str, np.ndarray], p: int,
         tm: Optional[Dict[str, Any]]) -> Row:
    ra, rb = ta.row(i), tb.row(j)
    row = Row(ra["step"], ra["rank"], ra["entry"], rb["entry"], ra["kind"], ra["direction"],
              ra["module"], ra["op"], ra["role"], ra["arg_index"], ra["dtype"], rb["dtype"],
              list(ra["shape"]), list(rb["shape"]), ra["order"], ra["seq"],
              "diverged" if st["diverged"][p] else
              "precision" if st["precision_explained"][p] else "match")
    row.module_b = rb["module"]
    for stat in ("min", "max", "mean", "norm"):
        setattr(row, f"{stat}_a", finite_or_none(ra[stat]))
        setattr(row, f"{stat}_b", finite_or_none(rb[stat]))
    for key in ("d_min", "d_max", "d_mean", "d_norm", "err", "tol"):
        setattr(row, key, finite_or_none(st[key][p]))
    row.nan_a, row.nan_b = ra["nan_count"], rb["nan_count"]
    row.inf_a, row.inf_b = ra["inf_count"], rb["inf_count"]
    row.checksum_equal = bool(st["checksum_equal"][p])
    if st["floor_decided"][p]:
        row.floor = float(st["floor"][p])
    if tm is not None:
        row.tensor = {k: finite_or_none(v) for k, v in tm.items()}
    if np.isfinite(st["update_share"][p]):
        row.update_share = finite_or_none(st["update_share"][p])
    if st["dw_agreed"][p] >= 0:
        row.dw_agreed = bool(st["dw_agreed"][p])
    return row


class _StepCompare:
    """One step and rank of both dumps: rows, entries, and where each read tensor came from."""

    def __init__(self, ta: RecordTable, tb: RecordTable, al: Alignment) -> None:
        self.ta, self.tb, self.al = ta, tb, al
        self.entries: Dict[Tuple[str, str], Entry] = {}
        self.entry_of_a: Dict[int, Entry] = {}
        self.entry_of_b: Dict[int, Entry] = {}
        self.row_of_seq = ({s: i for i, s in enumerate(ta["seq"].tolist())},
                           {s: i for i, s in enumerate(tb["seq"].tolist())})
        self.unpaired = (set(al.only_a.tolist()), set(al.only_b.tolist()))
        self.reads: List[Tuple[Evidence, int, int]] = []

    def add(self, row: Row, i: int, j: int) -> None:
        ta, tb = self.ta, self.tb
        key = (row.direction, row.name_a)
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = Entry(row.step, row.rank, row.direction, row.kind,
                                          row.name_a, row.name_b, row.module, row.op,
                                          row.order, row.seq)
        self.entry_of_a[i], self.entry_of_b[j] = e, e
        e.seq = min(e.seq, row.seq)
        if row.diverged:
            e.first_bad = min(e.first_bad, row.seq)
        if row.kind == _PARAM and bool(ta["trainable"][i]) != bool(tb["trainable"][j]):
            e.trainable_differs = True
        is_read = row.role in READ_ROLES
        if is_scalar_dtype(row.dtype_b):        # a non-tensor argument: a cause, not data
            if row.diverged:
                e.args_bad.append(ArgDiff(row.role, row.arg_index, str(ta["arg_key"][i]),
                                          str(ta["text"][i]), str(tb["text"][j])))
            return
        if row.diverged:
            ev = Evidence.of(row)
            (e.inputs_bad if is_read else e.outputs_bad).append(ev)
            if is_read or row.kind == _PARAM_GRAD:     # a dw may pass a dx on unchanged
                self.reads.append((ev, i, j))
        elif is_read:
            e.inputs_ok += 1
            if row.err is not None and row.err > e.inputs_ok_err:
                e.inputs_ok_err = row.err
        else:
            e.outputs_ok += 1

    def one_run_param(self, side: str, r: Dict[str, Any], step: int, rank: int) -> None:
        """A parameter present in one run only is an inventory difference (buffers are
        framework plumbing: MindSpore has none where PyTorch has some)."""
        key = ("none", r["entry"])
        e = self.entries.setdefault(key, Entry(step, rank, "none", _PARAM,
                                               r["entry"] if side == "a" else "",
                                               r["entry"] if side == "b" else "",
                                               r["module"], r["op"], 0, int(r["seq"])))
        e.first_bad = min(e.first_bad, int(r["seq"]))
        e.outputs_bad.append(Evidence(r["role"], 0, "", True, {},
                                      only_in="baseline" if side == "a" else "candidate"))

    # ------------------------------------------------------------------ provenance
    def _producer_row(self, side: int, i: int) -> Optional[int]:
        table = self.ta if side == 0 else self.tb
        seq = int(table["producer"][i])
        return None if seq == NO_PRODUCER else self.row_of_seq[side].get(seq)

    def producer_names(self, rows: List[Row]) -> None:
        for side, table, pairs in ((0, self.ta, self.al.pairs_a), (1, self.tb, self.al.pairs_b)):
            entry = table["entry"]
            for row, i in zip(rows, pairs.tolist()):
                k = self._producer_row(side, i)
                if k is not None:
                    setattr(row, "producer_a" if side == 0 else "producer_b", str(entry[k]))

    def _writers(self) -> Dict[int, List[Tuple[int, int]]]:
        """Per storage of the baseline: (seq, row) of the paired records that wrote into it."""
        ta = self.ta
        out: Dict[int, List[Tuple[int, int]]] = {}
        storage, seq, role = ta["storage"], ta["seq"], ta["role"]
        for i in self.entry_of_a:
            if storage[i] >= 0 and role[i] in WRITE_ROLES:
                out.setdefault(int(storage[i]), []).append((int(seq[i]), i))
        for rows in out.values():
            rows.sort(reverse=True)
        return out

    def resolve_reads(self) -> None:
        """Each differing read learns its producer: an entry of both runs, a record of one run
        only, or nothing captured; and what else wrote into the same memory before it."""
        writers = self._writers() if self.reads else {}
        for ev, i, j in self.reads:
            seq, store = int(self.ta["seq"][i]), int(self.ta["storage"][i])
            seen = set()
            for s, k in writers.get(store, ()):
                e = self.entry_of_a[k]
                if s < seq and e.diverged and id(e) not in seen:
                    seen.add(id(e))
                    ev.same_memory.append(e)
            ka, kb = self._producer_row(0, i), self._producer_row(1, j)
            entry = (self.entry_of_a.get(ka) if ka is not None else None) or \
                (self.entry_of_b.get(kb) if kb is not None else None)
            if entry is not None:
                ev.producer = Producer(Source.ENTRY, entry)
            elif (ka is not None and ka in self.unpaired[0]) or \
                    (kb is not None and kb in self.unpaired[1]):
                ev.producer = self._one_run(ka if ka in self.unpaired[0] else None,
                                            kb if kb in self.unpaired[1] else None)
            else:
                ev.producer = Producer(Source.NONE)

    def _one_run(self, ka: Optional[int], kb: Optional[int]) -> Producer:
        """Producers without counterpart: named by the innermost module holding both, through
        that module's own entries when it has some in either run."""
        paths = [str(t["module"][k]) for t, k in ((self.ta, ka), (self.tb, kb)) if k is not None]
        module = paths[0]
        for other in paths[1:]:
            parts = []
            for x, y in zip(module.split("."), other.split(".")):
                if x != y:
                    break
                parts.append(x)
            module = ".".join(parts)
        names, kind, op = ["", ""], "", ""
        for side, table, k in ((0, self.ta, ka), (1, self.tb, kb)):
            if k is None:
                continue
            rows = np.nonzero((table["kind"] == _MODULE) & (table["module"] == module)
                              & (table["direction"] == table["direction"][k]))[0]
            pick = int(rows[0]) if len(rows) else k
            names[side] = str(table["entry"][pick])
            kind, op = kind or str(table["kind"][pick]), op or str(table["op"][pick])
        return Producer(Source.ONE_RUN, None, names[0], names[1], module, kind, op)


def _rel_rmse(tm: Dict[str, Any], floor: float, numel: int) -> float:
    """The RMSE relative to the baseline's RMS, or to the pair's rounding floor where it has
    one above that (floors.py)."""
    if floor <= 0.0:
        return float(tm["rel_rmse"])
    rms_b = tm["rmse"] / tm["rel_rmse"] if tm["rel_rmse"] > 0 else 0.0
    return float(tm["rmse"] / max(rms_b, floor / max(numel, 1) ** 0.5, 1e-300))


def _compare_step(a: Dump, b: Dump, step: int, rank: int, same: bool, mapping: Any,
                  rows: List[Row], unmatched: List[Dict[str, Any]],
                  progress: Progress, files: Tuple[int, int], noise: NoisePolicy,
                  structural: List[StructuralDiff]) -> List[Entry]:
    def report(done: int, total: int, phase: str) -> None:
        if progress is not None:
            progress(CompareProgress(files[0], files[1], step, rank, done, total, phase))
    ta, tb = a.records(step, rank), b.records(step, rank)
    report(0, 0, "aligning")
    al = align(ta, tb, same, mapping)
    structural.extend(structural_differences(ta, tb, step, rank, same, mapping,
                                             _setting_differences(a, b, step, rank, mapping)))
    st = stat_errors(ta, tb, al.pairs_a, al.pairs_b)
    apply_floors(ta, tb, al.pairs_a, al.pairs_b, st)
    stored = (ta["data_offset"][al.pairs_a] >= 0) & (tb["data_offset"][al.pairs_b] >= 0)
    sc = _StepCompare(ta, tb, al)
    step_rows: List[Row] = []
    total = len(al.pairs_a)
    pairs = list(zip(al.pairs_a.tolist(), al.pairs_b.tolist()))
    tms: List[Optional[Dict[str, Any]]] = [None] * total
    for p, (i, j) in enumerate(pairs):
        if stored[p]:
            tms[p] = tensor_metrics(a.tensor_at(ta, i), b.tensor_at(tb, j))
        if p % 200 == 0:
            report(p, total, "comparing")
    noise.adjust(step, rank, ta, tb, al.pairs_a, al.pairs_b, st, tms)
    for p, (i, j) in enumerate(pairs):
        tm = tms[p]
        if tm is not None and not st["checksum_equal"][p] and not st["by_update"][p]:
            st["diverged"][p] = (_rel_rmse(tm, st["floor"][p], int(tb["numel"][j]))
                                 > max(st["tol"][p], 1e-12)) or not st["counts_ok"][p]
        row = _row(ta, tb, i, j, st, p, tm)
        step_rows.append(row)
        sc.add(row, i, j)
    noise.remember(step, rank, ta, tb, al.pairs_a, al.pairs_b, st["diverged"])
    for side, table, idx in (("a", ta, al.only_a), ("b", tb, al.only_b)):
        for i in idx.tolist():
            r = table.row(i)
            unmatched.append({"side": side, "step": step, "rank": rank, "name": r["entry"],
                              "kind": r["kind"], "module": r["module"], "op": r["op"],
                              "role": r["role"], "arg_index": r["arg_index"]})
            if r["kind"] == _PARAM and r["role"] == "param":
                sc.one_run_param(side, r, step, rank)
    sc.producer_names(step_rows)
    sc.resolve_reads()
    rows.extend(step_rows)
    return list(sc.entries.values())


def _setting_differences(a: Dump, b: Dump, step: int, rank: int, mapping: Any
                         ) -> List[Any]:
    """Modules whose recorded numeric settings (eps, approximate, momentum, ...) differ."""
    from ..layers import dump_setting_differences
    modules = (mapping or {}).get("modules") or {}
    paths = {p: rename_module(p, modules) for p in b.module_settings(step, rank)} \
        if modules else None
    return dump_setting_differences(a, b, step, rank, paths)


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
        from ..check import check_dumps, incomplete_findings
        pairs = _pairs_of(a, b, step, rank)
        setup = check_dumps(a, b, step=step, rank=rank, labels=("baseline", "candidate"))
        fa, fb = _framework(a), _framework(b)
        same = bool(fa) and fa == fb
        rows: List[Row] = []
        unmatched: List[Dict[str, Any]] = []
        per_step: Dict[int, List[Entry]] = {}
        structural: List[StructuralDiff] = []
        optimizer_differs = optimizer_setup(setup["findings"])
        noise = NoisePolicy(alike=not optimizer_differs)
        for s, r in _previous_steps(a, b, pairs):     # what --step S is judged against
            noise.settle(r, _compare_step(a, b, s, r, same, mapping, [], [], None, (0, 0),
                                          noise, []))
        for k, (s, r) in enumerate(pairs):
            found = _compare_step(a, b, s, r, same, mapping, rows, unmatched, progress,
                                  (k, len(pairs)), noise, structural)
            noise.settle(r, found)
            per_step.setdefault(s, []).extend(found)
        if progress is not None:
            progress(CompareProgress(len(pairs), len(pairs), s, r, 0, 0, "localizing"))
        stats_only = not any(row.tensor is not None or row.checksum_equal for row in rows)
        steps = [StepEntries(s, per_step[s]) for s in sorted(per_step)]
        first, involved = locate(steps, optimizer_differs, structural)
        notes = []
        if fa != fb:
            notes.append(f"frameworks differ ({fa or '?'} vs {fb or '?'}): records aligned by "
                         "module path, canonical op and order")
        notes.extend(noise.notes())
        explained = [row for row in rows if row.status == "precision"]
        if explained:
            notes.append(f"{len(explained)} dtype argument(s) name another float dtype where "
                         f"the runs' values already carry other precisions (first: "
                         f"{explained[0].name_a}): counted as that "
                         "precision difference (status 'precision'), not as divergences")
        floored = [row for row in rows if row.floor is not None]
        if floored:
            # name where a floor starts (a gradient reduced from dy), not a value it reached
            origin = next((row for row in floored if row.role == Role.GRAD_INPUT.value),
                          floored[0])
            notes.append(f"{len(floored)} record(s) far smaller than the gradient they were "
                         f"reduced from (first: {origin.name_a} {origin.role} "
                         f"{origin.arg_index}: a sum whose terms cancel, like an attention key "
                         "bias's gradient, and what is computed from it) judged against that "
                         "gradient's rounding, not their own scale (column 'floor')")
        if stats_only:
            notes.append("statistics only: a permutation or a compensating change keeps min, "
                         "max, mean and norm; dump with task 'tensor' or summary_mode 'checksum' "
                         "to confirm a match bit for bit")
        consequences = _consequences(steps, first, involved)
        if first is not None and "structure" not in first:
            _note_extra_calls(first, unmatched)
        return {"verdict": "diverged" if first else "match", "first_divergence": first,
                "consequences": consequences, "unmatched": unmatched[:1000],
                "unmatched_count": len(unmatched), "notes": notes,
                # every compared step that is not whole (check looks at one step)
                "setup": incomplete_findings((("baseline", a, set(pairs)),
                                              ("candidate", b, set(pairs))))
                + [f for f in setup["findings"] if f["kind"] != "incomplete"],
                "setup_notes": setup["notes"],
                "baseline": {"path": baseline, "framework": fa},
                "candidate": {"path": candidate, "framework": fb},
                "rows": [row.as_json() for row in rows]}
    finally:
        a.close()
        b.close()


def _previous_steps(a: Dump, b: Dump, pairs: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """(step - 1, rank) of each compared step whose previous step both dumps hold but the
    compare does not cover (`--step S`): the noise policy needs its parameters."""
    chosen = set(pairs)
    return sorted({(s - 1, r) for s, r in pairs if (s - 1, r) not in chosen
                   and a.files(s - 1, r) and b.files(s - 1, r)})


def _note_extra_calls(first: Dict[str, Any], unmatched: List[Dict[str, Any]]) -> None:
    """Calls inside the culprit's module that only one run made are part of the evidence."""
    if first["kind"] not in ("module", "api"):
        return
    inside = lambda m: first["module"] == "" or m == first["module"] or \
        m.startswith(first["module"] + ".")  # noqa: E731
    # a forward verdict: the calls made in one run only (their forward records); a backward
    # only in one run (a cast that is an identity in the other) is no other call
    roles = READ_ROLES | WRITE_ROLES if first["direction"] == "backward" else _FORWARD_ROLES
    extra = {}
    for u in unmatched:
        if u["step"] == first["step"] and u["kind"] == "api" and inside(u["module"]) \
                and u["role"] in roles:
            extra.setdefault(u["side"], []).append(u["name"])
    if extra:
        first["evidence"]["calls_in_one_run_only"] = {
            ("baseline" if side == "a" else "candidate"): sorted(set(names))[:10]
            for side, names in extra.items()}
        for side, names in extra.items():
            who = "baseline" if side == "a" else "candidate"
            first["reason"] += (f"; only the {who} calls {', '.join(sorted(set(names))[:4])} "
                                "inside it")


def _consequences(steps: List[StepEntries], first: Optional[Dict[str, Any]],
                  involved: List[Entry]) -> List[Dict[str, Any]]:
    """What differs besides the verdict's chain and the modules holding the culprit, in the
    order it ran (step, rank, timeline)."""
    if first is None:
        return []
    skip = {id(e) for e in involved}
    out = []
    for step in steps:
        for e in sorted(step.entries, key=lambda x: (x.rank, x.seq)):
            if not e.diverged or id(e) in skip or contains(e, first) or \
                    (e.name_a == first["name_a"] and e.step == first["step"]
                     and e.rank == first["rank"]):
                continue
            ev = (e.outputs_bad or e.inputs_bad or [None])[0]
            out.append({"step": e.step, "rank": e.rank, "direction": e.direction,
                        "kind": e.kind, "name_a": e.name_a, "module": e.module, "op": e.op,
                        "role": ev.role if ev else "", "err": ev.metrics.get("err") if ev
                        else None})
            if len(out) >= _MAX_CONSEQUENCES:
                return out
    return out
