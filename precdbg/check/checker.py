"""The checks themselves: one method per kind of set-up difference."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from .values import (_HIGH_HYPER, _LOW_HYPER, _Run, _display,
                     _first_inputs, _fmt, _is_int, _names, _nonzero, _optimizer_family,
                     _per_parameter, _same, _stat_difference, _summary, stat_gap)
from ..records.layers import setting_differences
from .setup_checks import SetupChecks
from ..records.schema import RecordKind, Role, is_scalar_dtype


class Checker:
    """Every check of two runs at one step and rank: the findings, ranked later, the notes and
    what could not be checked. The data checks (first batch, saved items, parameters,
    optimizers) are its own methods; the set-up checks are its `SetupChecks` helper's."""

    def __init__(self, a: _Run, b: _Run) -> None:
        self.a, self.b = a, b
        self.cross = a.framework != b.framework
        self.findings: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.unchecked: List[str] = []     # checks that could not run (also in `notes`)
        self.values_differ = False
        self.setting_diffs = setting_differences(a.module_settings, b.module_settings)
        self.settings_explained: Set[Tuple[str, str]] = set()
        # what optimizers() found where both runs' step files hold the settings of the step
        # (run_check.step_optimizer_findings of that step); None where it did not run so
        self.step_optimizer_findings: Optional[List[Dict[str, Any]]] = None

    def add(self, severity: str, kind: str, message: str, a: Any = None, b: Any = None,
            **extra: Any) -> None:
        finding = {"severity": severity, "kind": kind, "message": message, "a": a, "b": b}
        finding.update(extra)
        self.findings.append(finding)

    def cannot_check(self, note: str) -> None:
        """A check that could not run for want of what a dump should hold (its manifest, its
        parameter inventory), and why: a compare of these dumps says it too."""
        self.notes.append(note)
        self.unchecked.append(note)

    def run(self) -> None:
        setup = SetupChecks(self)
        self.first_batch()
        self.saved_items()
        self.parameters()
        setup.compute_dtypes()
        if self.a.manifest is None or self.b.manifest is None:
            missing = [r.label for r in (self.a, self.b) if r.manifest is None]
            why = "msprobe writes none" if all(
                r.dump.source == "msprobe" for r in (self.a, self.b) if r.manifest is None) \
                else "run.json missing or written by an older precdbg"
            self.cannot_check(f"no run manifest in {' and '.join(missing)} ({why}): optimizer, "
                              "seed, determinism, environment, device and version checks "
                              "skipped")
        else:
            first = len(self.findings)
            self.optimizers()
            if self.a.step_optimizers is not None and self.b.step_optimizers is not None:
                self.step_optimizer_findings = self.findings[first:]
            setup.seeds()
            setup.determinism()
            setup.platform()
            setup.environment()
            setup.versions()
        setup.semantic_notes()
        setup.layer_settings()

    # ------------------------------------------------------------------ data
    def _compare_rows(self, ra: Dict[str, Any], rb: Dict[str, Any]) -> Tuple[Optional[str], str]:
        """(difference, severity) of two records of the same data."""
        if ra["dtype"] != rb["dtype"] and not (is_scalar_dtype(ra["dtype"])
                                               or is_scalar_dtype(rb["dtype"])):
            if not (_is_int(ra["dtype"]) and _is_int(rb["dtype"])):
                return f"dtype {ra['dtype']} vs {rb['dtype']}", "high"
            why = _stat_difference({**ra, "checksum": ""}, {**rb, "checksum": ""})
            if why:
                return why, "high"
            if not self.cross:
                return f"dtype {ra['dtype']} vs {rb['dtype']} (same values)", "low"
            return None, "low"
        why = _stat_difference(ra, rb)
        return (why, "high") if why else (None, "low")

    def first_batch(self) -> None:
        rows_a, where_a = _first_inputs(self.a.table)
        rows_b, where_b = _first_inputs(self.b.table)
        if not rows_a or not rows_b:
            missing = [r.label for r, rows in ((self.a, rows_a), (self.b, rows_b)) if not rows]
            self.notes.append(f"first batch not checked: no module inputs recorded in "
                              f"{' and '.join(missing)} (level without modules, or start() "
                              "without the model)")
            return
        by_a = {r["arg_index"]: r for r in rows_a}
        by_b = {r["arg_index"]: r for r in rows_b}
        la, lb = self.a.label, self.b.label
        what = f"first batch (inputs of {where_a or 'the root module'}, step {self.a.step})"
        tensors_a = sorted(k for k, r in by_a.items() if not is_scalar_dtype(r["dtype"]))
        tensors_b = sorted(k for k, r in by_b.items() if not is_scalar_dtype(r["dtype"]))
        if len(tensors_a) != len(tensors_b):
            self.add("high", "batch", f"{what}: {la} passes {len(tensors_a)} tensor input(s), "
                     f"{lb} {len(tensors_b)}", len(tensors_a), len(tensors_b))
        for index in sorted(set(by_a) & set(by_b)):
            ra, rb = by_a[index], by_b[index]
            if self.cross and (is_scalar_dtype(ra["dtype"]) or is_scalar_dtype(rb["dtype"])):
                continue
            why, severity = self._compare_rows(ra, rb)
            if why:
                key = ra["arg_key"] if ra["arg_key"] and not ra["arg_key"].isdigit() else index
                self.add(severity, "batch", f"{what}: input {key} differs: {why}",
                         _summary(ra), _summary(rb))

    def saved_items(self) -> None:
        def saved(run: _Run) -> Dict[Tuple[str, int, int], Dict[str, Any]]:
            t = run.table
            if not len(t):
                return {}
            out = {}
            for row in t.rows_of(np.nonzero(t["kind"] == RecordKind.SAVED)[0]):
                out.setdefault((row["api"], row["call_index"], row["arg_index"]), row)
            return out
        sa, sb = saved(self.a), saved(self.b)
        if not sa and not sb:
            return
        la, lb = self.a.label, self.b.label
        step = self.a.step
        for label, mine, other in ((la, sa, sb), (lb, sb, sa)):
            names = sorted({k[0] for k in mine} - {k[0] for k in other})
            if names:
                self.add("medium", "saved", f"save() item(s) of step {step} only in {label}: "
                         f"{_names(names)}", names if mine is sa else None,
                         names if mine is sb else None)
        differing: Dict[str, List[str]] = {}
        for key in sorted(set(sa) & set(sb)):
            why, severity = self._compare_rows(sa[key], sb[key])
            if why and severity == "high":
                name, call, _ = key
                arg = sa[key]["arg_key"] or str(key[2])
                differing.setdefault(name, []).append(
                    f"{arg}{'' if call == 0 else f' (call {call})'}: {why}")
        for name, whys in differing.items():
            self.add("high", "saved", f"save('{name}') differs at step {step}: "
                     + "; ".join(whys[:3]) + (f"; +{len(whys) - 3} more" if len(whys) > 3 else ""),
                     name=name)
        # a differing count of tensors under one name
        for name in sorted({k[0] for k in sa} & {k[0] for k in sb}):
            na = sum(1 for k in sa if k[0] == name)
            nb = sum(1 for k in sb if k[0] == name)
            if na != nb:
                self.add("high", "saved", f"save('{name}') holds {na} value(s) in {la}, {nb} in "
                         f"{lb} at step {step}", na, nb, name=name)

    # ------------------------------------------------------------------ parameters
    def parameters(self) -> None:
        inv_a, inv_b = self.a.inventory, self.b.inventory
        la, lb = self.a.label, self.b.label
        if not inv_a or not inv_b:
            missing = [r.label for r, inv in ((self.a, inv_a), (self.b, inv_b)) if not inv]
            self.cannot_check(f"parameter inventory not checked: none recorded in "
                              f"{' and '.join(missing)} (start() without the model?)")
            return
        pa = {n: r for n, r in inv_a.items() if r["role"] == Role.PARAM}
        pb = {n: r for n, r in inv_b.items() if r["role"] == Role.PARAM}
        ea, eb = sum(int(r["numel"]) for r in pa.values()), sum(int(r["numel"]) for r in pb.values())
        if len(pa) != len(pb) or ea != eb:
            self.add("high", "inventory", f"parameter count differs: {la} {len(pa)} tensors "
                     f"({ea:,} elements), {lb} {len(pb)} tensors ({eb:,} elements)",
                     {"tensors": len(pa), "elements": ea}, {"tensors": len(pb), "elements": eb})
        for label, mine, other_all in ((la, pa, inv_b), (lb, pb, inv_a)):
            only = [n for n in mine if n not in other_all]
            if only:
                shown = [_display(n, mine[n]) for n in only]
                self.add("high", "inventory", f"{len(only)} parameter(s) only in {label}"
                         f"{' (names mapped to PyTorch convention)' if self.cross else ''}: "
                         f"{_names(shown)}", only if mine is pa else None,
                         only if mine is pb else None)
        if not self.cross:        # buffers: the same framework registers the same ones
            for label, mine, other in ((la, inv_a, inv_b), (lb, inv_b, inv_a)):
                only = [n for n, r in mine.items() if r["role"] == Role.BUFFER and n not in other]
                if only:
                    self.add("medium", "inventory", f"{len(only)} buffer(s) only in {label}: "
                             f"{_names(only)}")
        common = [n for n in inv_a if n in inv_b]     # buffers by mapped name too
        shapes, dtypes, frozen_a, frozen_b, values = [], [], [], [], []
        for n in common:
            ra, rb = inv_a[n], inv_b[n]
            if tuple(ra["shape"]) != tuple(rb["shape"]):
                shapes.append(f"{n} {list(ra['shape'])} vs {list(rb['shape'])}")
                continue
            if ra["dtype"] != rb["dtype"]:
                dtypes.append(f"{n} {ra['dtype']} vs {rb['dtype']}")
            if ra["role"] == Role.PARAM and rb["role"] == Role.PARAM and \
                    bool(ra["trainable"]) != bool(rb["trainable"]):
                (frozen_b if ra["trainable"] else frozen_a).append(n)
            why = _stat_difference(ra, rb) if ra["dtype"] == rb["dtype"] else None
            if why:
                values.append((-stat_gap(ra, rb), len(values), f"{n} ({why})"))
        if shapes:
            self.add("high", "inventory", f"parameter shapes differ: {_names(shapes)}")
        if dtypes:
            self.add("high", "inventory", f"parameter dtypes differ: {_names(dtypes)}")
        for label, other, names in ((la, lb, frozen_b), (lb, la, frozen_a)):
            if names:
                self.add("high", "trainable", f"{len(names)} parameter(s) trainable in {label}, "
                         f"frozen in {other}: {_names(names)}", names=names)
        if values:
            self.values_differ = True
            # the farthest apart first: a weight changed before training, among the ones a
            # training step moved apart from it since
            self.add("high", "initial_values", f"{len(values)} parameter(s) differ at the start "
                     f"of step {self.a.step}, the most first: "
                     f"{_names([text for _, _, text in sorted(values)])}")

    # ------------------------------------------------------------------ optimizer
    def optimizers(self) -> None:
        oa, ob = self.a.optimizers, self.b.optimizers
        la, lb = self.a.label, self.b.label
        if not oa and not ob:
            self.notes.append("no optimizer recorded in either run (no optimizer step ran "
                              "while dumping)")
            return
        from_run = [r.label for r in (self.a, self.b) if r.step_optimizers is None]
        if from_run and (oa or ob):
            self.notes.append(f"optimizer settings of {' and '.join(from_run)} from run.json "
                              f"(its last captured window), not from step {self.a.step}'s "
                              "file: dumped by an older precdbg, or no optimizer step ran "
                              "inside that step's capture")
        if len(oa) != len(ob):
            self.add("medium", "optimizer", f"{la} records {len(oa)} optimizer(s) "
                     f"({', '.join(o.get('class', '?') for o in oa) or 'none'}), {lb} {len(ob)} "
                     f"({', '.join(o.get('class', '?') for o in ob) or 'none'})",
                     [o.get("class") for o in oa], [o.get("class") for o in ob])
        for k, (opt_a, opt_b) in enumerate(zip(oa, ob)):
            self._optimizer_pair(k, opt_a, opt_b, len(oa) > 1 or len(ob) > 1)

    def _optimizer_pair(self, k: int, opt_a: Dict[str, Any], opt_b: Dict[str, Any],
                        several: bool) -> None:
        la, lb = self.a.label, self.b.label
        ca, cb = str(opt_a.get("class", "?")), str(opt_b.get("class", "?"))
        which = f"optimizer {k}" if several else "optimizer"
        fam = _optimizer_family()
        fa = fam.get((self.a.framework, ca), ca.lower())
        fb = fam.get((self.b.framework, cb), cb.lower())
        if fa != fb:
            self.add("high", "optimizer", f"{which} class differs: {la} {ca}, {lb} {cb}", ca, cb)
        per_a, groups_a = _per_parameter(opt_a)
        per_b, groups_b = _per_parameter(opt_b)
        named_a = [n for n in per_a if not n.startswith("<unnamed")]
        named_b = [n for n in per_b if not n.startswith("<unnamed")]
        common = [n for n in named_a if n in per_b]
        for label, mine, other in ((la, named_a, per_b), (lb, named_b, per_a)):
            only = [n for n in mine if n not in other]
            if only and common:
                self.add("high", "optimizer_groups", f"{which} updates {len(only)} parameter(s) "
                         f"only in {label}: {_names(only)}", names=only)
        if not common:
            self._group_level(which, groups_a, groups_b)
            return
        keys = sorted({key for n in common for key in per_a[n]} &
                      {key for n in common for key in per_b[n]})
        # the parameters of one group share their values (the same objects): each pair of
        # values is judged once, by identity, while `per_a` and `per_b` hold them
        judged: Dict[Tuple[int, int], Tuple[bool, bool, bool]] = {}
        for key in keys:
            diffs: Dict[Tuple[str, str], List[str]] = {}
            decay_only: Dict[str, List[Tuple[str, Any, Any]]] = {la: [], lb: []}
            decay = key == "weight_decay"
            for n in common:
                pa, pb = per_a[n], per_b[n]
                if key not in pa or key not in pb:
                    continue
                va, vb = pa[key], pb[key]
                found = judged.get((id(va), id(vb)))
                if found is None:
                    found = judged[(id(va), id(vb))] = (_nonzero(va), _nonzero(vb),
                                                        _same(va, vb))
                if decay and found[0] != found[1]:
                    decay_only[la if found[0] else lb].append((n, va, vb))
                    continue
                if not found[2]:
                    diffs.setdefault((_fmt(va), _fmt(vb)), []).append(n)
            for label, items in decay_only.items():
                if items:
                    names = [n for n, _, _ in items]
                    n0, va, vb = items[0]
                    self.add("high", "optimizer_groups",
                             f"{which + ': ' if several else ''}weight decay applies to {len(names)} parameter(s) in "
                             f"{label} only ({la} {_fmt(va)}, {lb} {_fmt(vb)}): {_names(names)}",
                             _fmt(va), _fmt(vb), names=names)
            for (va, vb), names in diffs.items():
                severity = "high" if key in _HIGH_HYPER else (
                    "low" if key in _LOW_HYPER else "medium")
                scope = f"all {len(common)} parameters" if len(names) == len(common) else \
                    f"{len(names)} of {len(common)} parameters: {_names(names)}"
                self.add(severity, "optimizer", f"{which} {key} differs: {la} {va}, {lb} {vb} "
                         f"({scope})", va, vb, hyperparameter=key)

    def _group_level(self, which: str, groups_a: List[Dict[str, Any]],
                     groups_b: List[Dict[str, Any]]) -> None:
        la, lb = self.a.label, self.b.label
        if len(groups_a) != len(groups_b):
            self.add("high", "optimizer_groups", f"{which} has {len(groups_a)} param group(s) in "
                     f"{la}, {len(groups_b)} in {lb}", len(groups_a), len(groups_b))
        for g, (ha, hb) in enumerate(zip(groups_a, groups_b)):
            for key in sorted(set(ha) & set(hb)):
                if not _same(ha[key], hb[key]):
                    severity = "high" if key in _HIGH_HYPER else (
                        "low" if key in _LOW_HYPER else "medium")
                    self.add(severity, "optimizer", f"{which} group {g} {key} differs: {la} "
                             f"{_fmt(ha[key])}, {lb} {_fmt(hb[key])}", _fmt(ha[key]),
                             _fmt(hb[key]), hyperparameter=key)
