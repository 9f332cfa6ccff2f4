"""The checks themselves: one method per kind of set-up difference."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np

from .values import (_CONDITIONS, _DEVICE_KIND, _ENV_LOW, _ENV_MINDSPORE_ONLY,
                     _ENV_PYTORCH_ONLY, _HIGH_HYPER, _LOW_HYPER, _Run, _deterministic, _display,
                     _first_inputs, _fmt, _is_int, _names, _nonzero, _optimizer_family,
                     _per_parameter, _same, _stat_difference, _summary, semantics)


class _Checker:
    def __init__(self, a: _Run, b: _Run) -> None:
        self.a, self.b = a, b
        self.cross = a.framework != b.framework
        self.findings: List[Dict[str, Any]] = []
        self.notes: List[str] = []
        self.values_differ = False

    def add(self, severity: str, kind: str, message: str, a: Any = None, b: Any = None,
            **extra: Any) -> None:
        finding = {"severity": severity, "kind": kind, "message": message, "a": a, "b": b}
        finding.update(extra)
        self.findings.append(finding)

    def run(self) -> None:
        self.first_batch()
        self.saved_items()
        self.parameters()
        if self.a.manifest is None or self.b.manifest is None:
            missing = [r.label for r in (self.a, self.b) if r.manifest is None]
            self.notes.append(f"no run manifest in {' and '.join(missing)} (run.json missing or "
                              "written by an older precdbg): optimizer, seed, determinism, "
                              "environment, device and version checks skipped")
        else:
            self.optimizers()
            self.seeds()
            self.determinism()
            self.platform()
            self.environment()
            self.versions()
        self.semantic_notes()

    # ------------------------------------------------------------------ data
    def _compare_rows(self, ra: Dict[str, Any], rb: Dict[str, Any]) -> Tuple[Optional[str], str]:
        """(difference, severity) of two records of the same data."""
        if ra["dtype"] != rb["dtype"] and not (ra["dtype"].startswith("py.")
                                               or rb["dtype"].startswith("py.")):
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
        tensors_a = sorted(k for k, r in by_a.items() if not r["dtype"].startswith("py."))
        tensors_b = sorted(k for k, r in by_b.items() if not r["dtype"].startswith("py."))
        if len(tensors_a) != len(tensors_b):
            self.add("high", "batch", f"{what}: {la} passes {len(tensors_a)} tensor input(s), "
                     f"{lb} {len(tensors_b)}", len(tensors_a), len(tensors_b))
        for index in sorted(set(by_a) & set(by_b)):
            ra, rb = by_a[index], by_b[index]
            if self.cross and (ra["dtype"].startswith("py.") or rb["dtype"].startswith("py.")):
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
            for i in np.nonzero(t["kind"] == "saved")[0]:
                row = t.row(int(i))
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
            self.notes.append(f"parameter inventory not checked: none recorded in "
                              f"{' and '.join(missing)} (start() without the model?)")
            return
        pa = {n: r for n, r in inv_a.items() if r["role"] == "param"}
        pb = {n: r for n, r in inv_b.items() if r["role"] == "param"}
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
                only = [n for n, r in mine.items() if r["role"] == "buffer" and n not in other]
                if only:
                    self.add("medium", "inventory", f"{len(only)} buffer(s) only in {label}: "
                             f"{_names(only)}")
        common = [n for n in inv_a if n in inv_b
                  and (inv_a[n]["role"] == "param" or inv_b[n]["role"] == "param"
                       or not self.cross)]
        shapes, dtypes, frozen_a, frozen_b, values = [], [], [], [], []
        for n in common:
            ra, rb = inv_a[n], inv_b[n]
            if tuple(ra["shape"]) != tuple(rb["shape"]):
                shapes.append(f"{n} {list(ra['shape'])} vs {list(rb['shape'])}")
                continue
            if ra["dtype"] != rb["dtype"]:
                dtypes.append(f"{n} {ra['dtype']} vs {rb['dtype']}")
            if ra["role"] == "param" and rb["role"] == "param" and \
                    bool(ra["trainable"]) != bool(rb["trainable"]):
                (frozen_b if ra["trainable"] else frozen_a).append(n)
            why = _stat_difference(ra, rb) if ra["dtype"] == rb["dtype"] else None
            if why:
                values.append(f"{n} ({why})")
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
            self.add("high", "initial_values", f"{len(values)} parameter(s) differ at the start "
                     f"of step {self.a.step}: {_names(values)}")

    # ------------------------------------------------------------------ optimizer
    def optimizers(self) -> None:
        oa, ob = self.a.optimizers, self.b.optimizers
        la, lb = self.a.label, self.b.label
        if not oa and not ob:
            self.notes.append("no optimizer recorded in either run (no optimizer step ran "
                              "while dumping)")
            return
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
        for key in keys:
            diffs: Dict[Tuple[str, str], List[str]] = {}
            decay_only: Dict[str, List[Tuple[str, Any, Any]]] = {la: [], lb: []}
            for n in common:
                if key not in per_a[n] or key not in per_b[n]:
                    continue
                va, vb = per_a[n][key], per_b[n][key]
                if key == "weight_decay" and _nonzero(va) != _nonzero(vb):
                    decay_only[la if _nonzero(va) else lb].append((n, va, vb))
                    continue
                if not _same(va, vb):
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

    # ------------------------------------------------------------------ seeds and determinism
    def seeds(self) -> None:
        sa, sb = self.a.manifest.get("seed_all"), self.b.manifest.get("seed_all")
        la, lb = self.a.label, self.b.label
        if sa is None and sb is None:
            self.notes.append("seed_all() was called in neither run: initial weights, dropout "
                              "masks and data order depend on whatever seeding the scripts do")
            return
        if (sa is None) != (sb is None):
            has, lacks, rec = (la, lb, sa) if sa is not None else (lb, la, sb)
            self.add("medium", "seed", f"seed_all() was called only in {has} (seed "
                     f"{rec.get('seed')}); {lacks} did not call it", sa, sb)
            return
        if not self.cross and sa.get("seed") != sb.get("seed"):
            self.add("medium", "seed", f"seed_all() seeds differ: {la} {sa.get('seed')}, {lb} "
                     f"{sb.get('seed')}", sa.get("seed"), sb.get("seed"))
        if bool(sa.get("deterministic")) != bool(sb.get("deterministic")):
            self.add("medium", "determinism", f"seed_all(deterministic=...) differs: {la} "
                     f"{bool(sa.get('deterministic'))}, {lb} {bool(sb.get('deterministic'))}",
                     sa.get("deterministic"), sb.get("deterministic"))

    def determinism(self) -> None:
        da = self.a.manifest.get("determinism") or {}
        db = self.b.manifest.get("determinism") or {}
        la, lb = self.a.label, self.b.label
        if self.cross:
            ka, kb = _deterministic(self.a.framework, da), _deterministic(self.b.framework, db)
            if ka is not None and kb is not None and ka != kb:
                self.add("medium", "determinism", f"deterministic kernels: {la} "
                         f"{'on' if ka else 'off'}, {lb} {'on' if kb else 'off'}", ka, kb)
            return
        fw = {"pytorch": "torch", "mindspore": "MindSpore"}.get(self.a.framework, "framework")
        for key in sorted(set(da) & set(db)):
            if _same(da[key], db[key]):
                continue
            if key in ("initial_seed", "seed"):
                self.add("medium", "seed", f"{fw} seed differs: {la} {_fmt(da[key])}, {lb} "
                         f"{_fmt(db[key])} (initial weights, dropout masks)", da[key], db[key])
            else:
                self.add("low" if key == "num_threads" else "medium", "determinism",
                         f"{fw} {key} differs: {la} {_fmt(da[key])}, {lb} {_fmt(db[key])}",
                         da[key], db[key])

    # ------------------------------------------------------------------ platform
    def platform(self) -> None:
        ma, mb = self.a.manifest, self.b.manifest
        la, lb = self.a.label, self.b.label
        wa = ma.get("world_size", self.a.run.get("world_size"))
        wb = mb.get("world_size", self.b.run.get("world_size"))
        if wa is not None and wb is not None and wa != wb:
            self.add("medium", "world_size", f"world size differs: {la} {wa}, {lb} {wb} (global "
                     "batch, gradient reduction order)", wa, wb)
        dva, dvb = ma.get("device") or {}, mb.get("device") or {}
        kind_a = _DEVICE_KIND.get(str(dva.get("kind", "")).lower(), str(dva.get("kind", "")).lower())
        kind_b = _DEVICE_KIND.get(str(dvb.get("kind", "")).lower(), str(dvb.get("kind", "")).lower())
        if kind_a and kind_b and kind_a != kind_b:
            self.add("medium", "device", f"device kind differs: {la} {dva.get('kind')}, {lb} "
                     f"{dvb.get('kind')}", dva.get("kind"), dvb.get("kind"))
        if dva.get("count") is not None and dvb.get("count") is not None and \
                dva.get("count") != dvb.get("count"):
            self.add("medium", "device", f"device count differs: {la} {dva.get('count')}, {lb} "
                     f"{dvb.get('count')}", dva.get("count"), dvb.get("count"))
        mode_a, mode_b = self.a.run.get("mode"), self.b.run.get("mode")
        if mode_a and mode_b and mode_a != mode_b:
            self.add("medium", "execution_mode", f"execution mode differs: {la} {mode_a}, {lb} "
                     f"{mode_b}", mode_a, mode_b)
        lsa, lsb = ma.get("loss_scale"), mb.get("loss_scale")
        if (lsa is not None or lsb is not None) and not _same(lsa, lsb):
            self.add("medium", "loss_scale", f"loss scale differs: {la} {_fmt(lsa)}, {lb} "
                     f"{_fmt(lsb)}", lsa, lsb)

    def environment(self) -> None:
        from ..manifest import looks_secret
        ea = self.a.manifest.get("environment") or {}
        eb = self.b.manifest.get("environment") or {}
        la, lb = self.a.label, self.b.label

        def shown(name: str, value: Any) -> str:
            if value is None:
                return "unset"
            return "<redacted>" if looks_secret(name, str(value)) else repr(str(value))
        for name in sorted(set(ea) | set(eb)):
            if self.cross and (name.startswith(_ENV_PYTORCH_ONLY)
                               or name.startswith(_ENV_MINDSPORE_ONLY)):
                continue
            va, vb = ea.get(name), eb.get(name)
            if va == vb:
                continue
            sa, sb = shown(name, va), shown(name, vb)
            self.add("low" if name in _ENV_LOW else "medium", "environment",
                     f"environment {name}: {la} {sa}, {lb} {sb}",
                     None if va is None else sa.strip("'"), None if vb is None else sb.strip("'"),
                     variable=name)

    def versions(self) -> None:
        va = self.a.manifest.get("versions") or {}
        vb = self.b.manifest.get("versions") or {}
        la, lb = self.a.label, self.b.label
        for key in sorted(set(va) & set(vb)):
            if va[key] != vb[key]:
                self.add("low", "version", f"{key} version differs: {la} {_fmt(va[key])}, {lb} "
                         f"{_fmt(vb[key])}", va[key], vb[key])

    # ------------------------------------------------------------------ known semantics
    def semantic_notes(self) -> None:
        for entry in semantics()["entries"]:
            cond = entry.get("applies_when") or {}
            detail = self._applies(cond)
            if detail is None:
                continue
            message = str(entry.get("explanation", "")).strip()
            if detail:
                message += f" [{detail}]"
            self.add(str(entry.get("severity", "medium")), "semantics", message,
                     self.a.framework, self.b.framework, id=entry.get("id"))

    def _applies(self, cond: Dict[str, Any]) -> Optional[str]:
        """None when an entry does not apply; else the evidence seen ('' when none to show)."""
        if set(cond) - _CONDITIONS:
            return None                      # an unknown condition never holds
        runs = (self.a, self.b)
        detail: List[str] = []
        if "frameworks" in cond:
            want = sorted(str(f) for f in cond["frameworks"])
            have = sorted(r.framework for r in runs)
            if (len(want) == 2 and want != have) or (len(want) == 1 and want[0] not in have):
                return None
        if "op" in cond and not all(str(cond["op"]) in r.ops for r in runs):
            return None
        if "module_class" in cond:
            mc = cond["module_class"]
            wanted = {fw: set(classes) for fw, classes in mc.items()} if isinstance(mc, dict) \
                else {r.framework: set(mc) for r in runs}
            hits = sorted({c for r in runs for c in r.module_classes & wanted.get(r.framework,
                                                                                   set())})
            if not hits:
                return None
        if "optimizer" in cond:
            seen = self._optimizer_condition(cond)
            if seen is None:
                return None
            detail.append(seen)
        if "torch_arg" in cond:
            spec = cond["torch_arg"] or {}
            torch_runs = [r for r in runs if r.framework == "pytorch"]
            found: Set[str] = set()
            for r in torch_runs:
                found |= r.torch_arg_values(str(spec.get("op")), str(spec.get("key")),
                                            None if spec.get("default") is None
                                            else str(spec.get("default")))
            inside = {str(v) for v in spec.get("in", [])}
            outside = {str(v) for v in spec.get("not_in", [])}
            matching = sorted(v for v in found if (not inside or v in inside)
                              and v not in outside)
            if not matching:
                return None
            detail.append(f"PyTorch {spec.get('key')}={', '.join(sorted(found))}")
        if cond.get("initial_values_differ") and not self.values_differ:
            return None
        return "; ".join(detail)

    def _optimizer_condition(self, cond: Dict[str, Any]) -> Optional[str]:
        def matches(run: _Run, classes: Iterable[str], nonzero: Optional[str]
                    ) -> Optional[str]:
            for opt in run.optimizers:
                cls = str(opt.get("class", ""))
                for spec in classes:
                    fw, _, name = str(spec).rpartition(":")
                    if name == cls and (not fw or fw == run.framework):
                        if nonzero and not any(_nonzero(g.get("hyper", {}).get(nonzero))
                                               for g in opt.get("param_groups", [])):
                            continue
                        return f"{run.label} {run.framework} {cls}"
            return None
        runs = (self.a, self.b)
        for i, run in enumerate(runs):
            seen = matches(run, cond["optimizer"], cond.get("nonzero"))
            if seen is None:
                continue
            if "other_optimizer" not in cond:
                return seen
            other = matches(runs[1 - i], cond["other_optimizer"], None)
            if other is not None:
                return f"{seen} vs {other}" if i == 0 else f"{other} vs {seen}"
        return None


# --------------------------------------------------------------------------- helpers of the checks
