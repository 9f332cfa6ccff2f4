"""The run set-up checks (seeds, determinism, platform, environment, versions, compute dtypes,
layer settings) and the notes of known framework semantics: a helper object of the checker,
adding its findings and notes to the checker's."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

from ..records.layers import SettingDifference, format_value, same_setting
from ..records.schema import Level
from .ops import RANDOM_OPS, compute_dtypes, dtype_counts, dtype_mix, first_apart
from .values import (_CONDITIONS, _DEVICE_KIND, _ENV_LOW, _ENV_MINDSPORE_ONLY,
                     _ENV_PYTORCH_ONLY, _Run, _deterministic, _fmt, _names, _nonzero, _same,
                     semantics)


if TYPE_CHECKING:
    from .checker import Checker


class SetupChecks:
    """The set-up checks of one checker's two runs (`a`, `b`), made by the checker."""

    def __init__(self, checker: "Checker") -> None:
        self.checker = checker
        self.a, self.b, self.cross = checker.a, checker.b, checker.cross
        self.add = checker.add
        self.notes = checker.notes
        self.setting_diffs = checker.setting_diffs
        self.settings_explained = checker.settings_explained

    @property
    def values_differ(self) -> bool:
        """Whether the parameters' values differ at the checked step (the checker's finding)."""
        return self.checker.values_differ

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
                said = f"{fw} seed differs: {la} {_fmt(da[key])}, {lb} {_fmt(db[key])}"
                if self._seed_unused():
                    self.notes.append(f"{said}; it changes nothing checked here: the "
                                      f"parameters agree at the start of step {self.a.step} "
                                      "and neither run called a random op in it")
                else:
                    self.add("medium", "seed", f"{said} (initial weights, dropout masks)",
                             da[key], db[key])
            else:
                self.add("low" if key == "num_threads" else "medium", "determinism",
                         f"{fw} {key} differs: {la} {_fmt(da[key])}, {lb} {_fmt(db[key])}",
                         da[key], db[key])

    def _seed_unused(self) -> bool:
        """Whether a different seed cannot have changed the checked step: the parameters agree
        at its start (an inventory on both sides) and every API call of both runs is recorded
        (level mix or api, no call filter), none of them a random op."""
        if self.values_differ or not self.a.inventory or not self.b.inventory:
            return False
        for run in (self.a, self.b):
            config = run.run.get("config") if isinstance(run.run.get("config"), dict) else {}
            if run.dump.setting("level") not in (Level.MIX, Level.API) or any(
                    config.get(key) for key in ("scope", "scope_range", "list")):
                return False
        return not (self.a.ops | self.b.ops) & RANDOM_OPS

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
        # the scale decides the numbers, not the class holding it (GradScaler, MindSpore's
        # DynamicLossScaler)
        scale_a, scale_b = (v.get("scale") if isinstance(v, dict) else v for v in (lsa, lsb))
        if (lsa is not None or lsb is not None) and not _same(scale_a, scale_b):
            self.add("medium", "loss_scale", f"loss scale differs: {la} {_fmt(lsa)}, {lb} "
                     f"{_fmt(lsb)}", lsa, lsb)

    def environment(self) -> None:
        from ..records.environment import looks_secret
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
        decided = self._setting_condition(cond) if "setting" in cond else None
        if decided is None and "setting" in cond and \
                not set(cond) & {"op", "torch_arg", "module_class"}:
            return None                      # only the recorded settings could tell
        if decided is not None:
            applies, shown = decided
            if not applies:
                return None
            detail.append(shown)
        elif "torch_arg" in cond:
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

    # ------------------------------------------------------------------ layer settings
    def _setting_values(self, run: _Run, op: str, key: str, cond: Dict[str, Any]
                        ) -> Dict[str, Any]:
        """Where a run's value of a layer setting is known: its modules' recorded settings,
        else (PyTorch) the argument its functional calls passed (`torch_arg`'s default when
        none did), keyed by '' (no module instance)."""
        values: Dict[str, Any] = run.setting_values(op, key)
        spec = cond.get("torch_arg") or {}
        if not values and run.framework == "pytorch" and spec.get("key") == key:
            texts = run.torch_arg_values(op, key, None if spec.get("default") is None
                                         else str(spec.get("default")))
            values = {"": _parsed(t) for t in sorted(texts)} if len(texts) == 1 else {}
        return values

    def _setting_condition(self, cond: Dict[str, Any]) -> Optional[Tuple[bool, str]]:
        """(applies, evidence) from the recorded layer settings, or None when a run recorded
        none for this op and setting (then the entry's other conditions decide)."""
        spec = cond["setting"] or {}
        op, key = str(spec.get("op")), str(spec.get("key"))
        paired = [d for d in self.setting_diffs if d.op == op and d.setting == key]
        if paired:
            self.settings_explained.add((op, key))
            more = f" (+{len(paired) - 1} more module(s))" if len(paired) > 1 else ""
            return True, paired[0].text + more
        va = self._setting_values(self.a, op, key, cond)
        vb = self._setting_values(self.b, op, key, cond)
        if not va or not vb:
            return None
        for mine, other in ((va, vb), (vb, va)):
            for path, value in mine.items():
                if any(same_setting(value, v) for v in other.values()):
                    continue
                where, theirs = path, other.get(path, next(iter(other.values())))
                if not where:            # a functional call: name the other run's module
                    where = next((p for p, v in other.items() if p), "")
                first, second = (value, theirs) if mine is va else (theirs, value)
                self.settings_explained.add((op, key))
                return True, (f"{where or op}: {key} {format_value(first)} vs "
                              f"{format_value(second)}")
        return False, ""

    def compute_dtypes(self) -> None:
        """Ops whose forward outputs are computed in other float dtypes in the two runs:
        autocast on one side only, another AMP level (O1 / O2 lists), a model cast to half."""
        da, db = compute_dtypes(self.a), compute_dtypes(self.b)
        differ = []
        for op, calls_a in da.items():
            calls_b = db.get(op)
            if calls_b and set(dtype_counts(calls_a)) != set(dtype_counts(calls_b)):
                seq, module = first_apart(calls_a, calls_b)
                differ.append((seq, op, dtype_counts(calls_a), dtype_counts(calls_b), module))
        if not differ:
            return
        differ.sort()
        la, lb = self.a.label, self.b.label
        shown = [f"{op} {dtype_mix(ca)} vs {dtype_mix(cb)}" for _, op, ca, cb, _ in differ]
        _, op, _, _, module = differ[0]
        where = f"module '{module}'" if module else "the root module"
        self.add("high", "compute_dtype",
                 f"{len(differ)} op(s) compute in other dtypes ({la} vs {lb}; autocast, the "
                 f"AMP level or a model cast to another dtype differs): {_names(shown)}; "
                 f"first: {op} in {where}",
                 {op: ca for _, op, ca, _, _ in differ}, {op: cb for _, op, _, cb, _ in differ},
                 ops=[op for _, op, _, _, _ in differ])

    def layer_settings(self) -> None:
        """Settings that differ and that no known-semantics note explained, one finding per
        op and setting, naming the modules."""
        groups: Dict[Tuple[str, str], List[SettingDifference]] = {}
        for d in self.setting_diffs:
            if (d.op, d.setting) not in self.settings_explained:
                groups.setdefault((d.op, d.setting), []).append(d)
        for (op, key), diffs in groups.items():
            shown = "; ".join(d.text for d in diffs[:3])
            more = f"; +{len(diffs) - 3} more" if len(diffs) > 3 else ""
            self.add("medium", "layer_settings", f"{op} {key} differs in {len(diffs)} "
                     f"module(s): {shown}{more}", diffs[0].a, diffs[0].b, op=op, setting=key,
                     modules=[d.as_dict() for d in diffs])

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
def _parsed(text: str) -> Any:
    """A recorded argument's text as the value a setting holds ('1e-05' -> 1e-05)."""
    try:
        return float(text)
    except ValueError:
        return text.strip("'\"")

