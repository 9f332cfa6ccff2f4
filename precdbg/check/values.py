"""Shared pieces of the set-up check: constants, the semantics data file, one run's
manifest and records, and value helpers."""
from __future__ import annotations

import functools
import os
import math
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..records.naming import canonical_op, read_table
from ..storage.reader import Dump, RecordTable
from ..records.schema import Direction, RecordKind, Role, is_scalar_dtype, scalar_mask


SEVERITIES = ("high", "medium", "low")
# within a severity: data first, then weights, the optimizer, known semantics, the rest
_KIND_ORDER = ("incomplete", "batch", "saved", "initial_values", "inventory", "trainable",
               "compute_dtype", "optimizer", "optimizer_groups", "layer_settings", "semantics",
               "loss_scale", "seed", "determinism", "world_size", "device", "execution_mode",
               "environment", "version")
_RTOL = 1e-6                     # statistics of equal tensors agree far better than this
_SHOWN = 5                       # names listed in one finding line
_HIGH_HYPER = {"lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening",
               "nesterov", "amsgrad", "maximize", "lr_decay", "alpha", "centered", "rho",
               "initial_accumulator_value", "decoupled_weight_decay"}
_LOW_HYPER = {"foreach", "fused", "capturable", "differentiable"}
# allow-listed variables that only change logging, visibility or memory, not the numbers
_ENV_LOW = {"CUDA_LAUNCH_BLOCKING", "ASCEND_LAUNCH_BLOCKING", "ASCEND_GLOBAL_LOG_LEVEL",
            "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
            "PYTORCH_NPU_ALLOC_CONF", "MS_ALLOC_CONF", "ACLNN_CACHE_LIMIT", "TORCH_USE_CUDA_DSA",
            "MS_ENABLE_NUMA", "MS_DEV_JIT_SYNTAX_LEVEL", "PYTHONHASHSEED"}
# read by one framework only: not a difference between a PyTorch and a MindSpore run
_ENV_PYTORCH_ONLY = ("TORCH_", "PYTORCH_", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")
_ENV_MINDSPORE_ONLY = ("MS_",)
_DEVICE_KIND = {"gpu": "cuda", "ascend": "npu"}
_CONDITIONS = {"frameworks", "op", "module_class", "optimizer", "other_optimizer", "nonzero",
               "torch_arg", "initial_values_differ", "setting"}



# --------------------------------------------------------------------------- the data file
@functools.lru_cache(maxsize=1)
def semantics() -> Dict[str, Any]:
    """precdbg/check/semantics.yaml: optimizer families, hyperparameter names, entries."""
    data = dict(read_table(os.path.join(os.path.dirname(__file__), "semantics.yaml")))
    data.setdefault("optimizer_classes", {})
    data.setdefault("hyperparameters", {})
    data.setdefault("entries", [])
    return data


@functools.lru_cache(maxsize=1)
def _optimizer_family() -> Dict[Tuple[str, str], str]:
    out = {}
    for family, by_framework in semantics()["optimizer_classes"].items():
        for framework, classes in (by_framework or {}).items():
            for cls in classes or ():
                out[(framework, str(cls))] = family
    return out


# --------------------------------------------------------------------------- small helpers
def _fmt(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


_EXACT = (str, int, float)       # types whose equal values _same finds the same at once


def _number(value: Any) -> Optional[float]:
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


def _same(va: Any, vb: Any) -> bool:
    kind = type(va)
    if kind is type(vb) and kind in _EXACT and va == vb and (kind is not float or va - va == 0.0):
        return True          # equal text, integers or finite floats: what follows finds so too
    na, nb = _number(va), _number(vb)
    if na is not None and nb is not None:
        if math.isnan(na) or math.isnan(nb):
            return math.isnan(na) and math.isnan(nb)
        return abs(na - nb) <= _RTOL * max(abs(na), abs(nb))
    if isinstance(va, (list, tuple)) and isinstance(vb, (list, tuple)):
        return len(va) == len(vb) and all(_same(x, y) for x, y in zip(va, vb))
    return va == vb


def _nonzero(value: Any) -> bool:
    n = _number(value)
    if n is not None:
        return n != 0.0
    if isinstance(value, (list, tuple)):
        return any(_nonzero(v) for v in value)
    return False


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", ... (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _rms(row: Dict[str, Any]) -> float:
    numel, norm = int(row.get("numel", 0) or 0), float(row.get("norm", float("nan")))
    return norm / math.sqrt(numel) if numel > 0 and math.isfinite(norm) else 0.0


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _stat_difference(ra: Dict[str, Any], rb: Dict[str, Any]) -> Optional[str]:
    """Why two records of supposedly equal tensors differ (None: they agree)."""
    if tuple(ra["shape"]) != tuple(rb["shape"]):
        return f"shape {list(ra['shape'])} vs {list(rb['shape'])}"
    if is_scalar_dtype(ra["dtype"]) or is_scalar_dtype(rb["dtype"]):
        return None if str(ra.get("text")) == str(rb.get("text")) else \
            f"value {ra.get('text')!r} vs {rb.get('text')!r}"
    # a count known only as "some" (UNKNOWN_COUNT: msprobe's dumps) compares as whether there are
    counts_a, counts_b = (ra["nan_count"], ra["inf_count"]), (rb["nan_count"], rb["inf_count"])
    if min(counts_a + counts_b) < 0:
        counts_a, counts_b = tuple(c != 0 for c in counts_a), tuple(c != 0 for c in counts_b)
    if counts_a != counts_b:
        return (f"NaN/Inf counts {ra['nan_count']}/{ra['inf_count']} vs "
                f"{rb['nan_count']}/{rb['inf_count']}")
    checksums = ra.get("checksum") and rb.get("checksum") and ra["dtype"] == rb["dtype"]
    if checksums and ra["checksum"] == rb["checksum"]:
        return None
    scale_floor = max(_rms(ra), _rms(rb))
    for stat in _STATS:
        va, vb = float(ra.get(stat, math.nan)), float(rb.get(stat, math.nan))
        # NaN on a side without NaN values: a statistic that dump does not take (msprobe's mean
        # and norm of integer and float64 tensors)
        if (math.isnan(va) and (math.isnan(vb) or not ra["nan_count"])) or \
                (math.isnan(vb) and not rb["nan_count"]):
            continue
        if stat == "pos_mean" and (math.isnan(va) or math.isnan(vb)):
            continue                  # a side without it (an older dump): not compared
        if math.isnan(va) != math.isnan(vb) or \
                abs(va - vb) > _RTOL * max(abs(va), abs(vb), scale_floor):
            return f"{stat} {va:.7g} vs {vb:.7g}"
    return "checksum differs" if checksums else None


# the statistics compared, pos_mean (order-sensitive) only where both records have it
_STATS = ("mean", "norm", "min", "max", "pos_mean")


def stat_gap(ra: Dict[str, Any], rb: Dict[str, Any]) -> float:
    """How far apart two records' statistics are, relative to their scale (as
    `_stat_difference` measures them): what orders a list of differing parameters."""
    if is_scalar_dtype(ra["dtype"]) or is_scalar_dtype(rb["dtype"]):
        return math.inf
    scale_floor = max(_rms(ra), _rms(rb))
    gap = 0.0
    for stat in _STATS:
        va, vb = float(ra.get(stat, math.nan)), float(rb.get(stat, math.nan))
        if stat == "pos_mean" and (math.isnan(va) or math.isnan(vb)):
            continue
        if math.isnan(va) or math.isnan(vb):
            gap = math.inf if math.isnan(va) != math.isnan(vb) else gap
            continue
        scale = max(abs(va), abs(vb), scale_floor)
        gap = max(gap, abs(va - vb) / scale if scale > 0 else 0.0)
    return gap


class _Run:
    """One side of the check: its manifest, the records of the checked step, derived views."""

    def __init__(self, dump: Dump, label: str, step: int, rank: int,
                 table: Optional[RecordTable] = None) -> None:
        self.dump, self.label, self.step, self.rank = dump, label, step, rank
        if table is not None:       # read already by the caller (a compare, which reads on)
            self.__dict__["table"] = table
        self.run = dump.run or {}
        self.framework = dump.setting("framework")     # the step files say it without run.json
        # a job's ranks each keep their own manifest (`manifests`); older dumps hold one
        manifests = self.run.get("manifests")
        manifest = manifests.get(str(rank)) if isinstance(manifests, dict) else None
        if not isinstance(manifest, dict):
            manifest = self.run.get("manifest")
        self.manifest: Optional[Dict[str, Any]] = manifest if isinstance(manifest, dict) else None

    @functools.cached_property
    def table(self) -> RecordTable:
        """The checked step's records (read when a check first asks; kept by the files for
        a compare, which reads them next)."""
        return self.dump.records(self.step, self.rank, keep=True)

    @functools.cached_property
    def inventory(self) -> Dict[str, Dict[str, Any]]:
        """Parameters and buffers at the start of the step, by PyTorch-style full name."""
        t = self.table
        out: Dict[str, Dict[str, Any]] = {}
        if not len(t):
            return out
        mask = (t["kind"] == RecordKind.PARAM) & (t["direction"] == Direction.NONE)
        for row in t.rows_of(np.nonzero(mask)[0][np.argsort(t["seq"][mask], kind="stable")]):
            name = row["alias"] if self.framework == "mindspore" and row["alias"] else row["api"]
            out.setdefault(str(name), row)
        return out

    @functools.cached_property
    def ops(self) -> Set[str]:
        t = self.table
        if not len(t):
            return set()
        mask = np.isin(t["kind"], [RecordKind.API, RecordKind.MODULE]) & \
            (t["direction"] == Direction.FORWARD)
        return set(t["op"][mask].tolist())

    @functools.cached_property
    def module_classes(self) -> Set[str]:
        classes = {cls for _, cls, _ in self.dump.modules(self.step, self.rank)}
        t = self.table
        if len(t):
            classes |= set(t["api"][t["kind"] == RecordKind.MODULE].tolist())
        return classes

    @functools.cached_property
    def module_settings(self) -> Dict[str, Tuple[str, Dict[str, Any]]]:
        """path -> (class, numeric layer settings) of the step's module tree."""
        return self.dump.module_settings(self.step, self.rank)

    def setting_values(self, op: str, key: str) -> Dict[str, Any]:
        """path -> recorded value of setting `key` of every module of canonical `op`."""
        return {path: settings[key] for path, (cls, settings) in self.module_settings.items()
                if key in settings and canonical_op(cls) == op}

    @functools.cached_property
    def step_optimizers(self) -> Optional[List[Dict[str, Any]]]:
        """The optimizers as the checked step used them (its step files), or None."""
        return self.dump.optimizers(self.step, self.rank)

    @property
    def optimizers(self) -> List[Dict[str, Any]]:
        """The checked step's optimizer settings where its files hold them; otherwise the run
        manifest's (run.json: as the last captured window saw them, maybe another step's)."""
        if self.step_optimizers is not None:
            return list(self.step_optimizers)
        return list((self.manifest or {}).get("optimizers") or [])

    def torch_arg_values(self, op: str, key: str, default: Optional[str]) -> Set[str]:
        """Text of argument `key` in every forward API call of canonical `op` (the default for
        calls that did not pass it)."""
        t = self.table
        if not len(t):
            return set()
        mask = (t["kind"] == RecordKind.API) & (t["op"] == op) & \
            (t["direction"] == Direction.FORWARD)
        values: Set[str] = set()
        entries = set(t["entry"][mask].tolist())
        passed = mask & (t["arg_key"] == key) & scalar_mask(t["dtype"])
        with_key = set()
        for i in np.nonzero(passed)[0]:
            values.add(str(t["text"][i]))
            with_key.add(str(t["entry"][i]))
        if default is not None and entries - with_key:
            values.add(str(default))
        return values


# --------------------------------------------------------------------------- the checker

def _first_inputs(t: RecordTable) -> Tuple[List[Dict[str, Any]], str]:
    """The inputs of the first forward module call (the root module's when recorded)."""
    if not len(t):
        return [], ""
    mask = (t["kind"] == RecordKind.MODULE) & (t["direction"] == Direction.FORWARD) & \
        (t["role"] == Role.INPUT)
    if not mask.any():
        return [], ""
    root = mask & (t["module"] == "")
    use = np.nonzero(root if root.any() else mask)[0]
    first = t["order"][use].min()
    rows = t.rows_of(use[t["order"][use] == first])
    rows.sort(key=lambda r: r["arg_index"])
    module = rows[0]["module"]
    return rows, (f"module '{module}'" if module else f"the root module {rows[0]['api']}")


def _summary(row: Dict[str, Any]) -> Dict[str, Any]:
    out = {"dtype": row["dtype"], "shape": list(row["shape"])}
    if is_scalar_dtype(row["dtype"]):
        out["value"] = row.get("text")
        return out
    for stat in ("min", "max", "mean", "norm"):
        value = float(row[stat])
        out[stat] = value if math.isfinite(value) else str(value)
    if row.get("checksum"):
        out["checksum"] = row["checksum"]
    return out


def _display(name: str, row: Dict[str, Any]) -> str:
    own = str(row.get("api", name))
    return name if own == name else f"{name} ({own})"


class _PerParam(list):
    """A hyperparameter given per parameter (MindSpore group params)."""


def _per_parameter(opt: Dict[str, Any]) -> Tuple[Dict[str, Dict[str, Any]], List[Dict[str, Any]]]:
    """Hyperparameters by parameter name (PyTorch names) and by group, canonical keys."""
    aliases = semantics()["hyperparameters"]
    per: Dict[str, Dict[str, Any]] = {}
    groups: List[Dict[str, Any]] = []
    for group in opt.get("param_groups") or []:
        params = [str(p) for p in group.get("params") or []]
        canon: Dict[str, Any] = {}
        for key, value in (group.get("hyper") or {}).items():
            key = aliases.get(key, key)
            if key == "betas" and isinstance(value, list) and len(value) == 2:
                canon["beta1"], canon["beta2"] = value
                continue
            if isinstance(value, list) and len(value) == 1:
                value = value[0]
            elif isinstance(value, list) and len(params) > 1 and len(value) == len(params):
                value = _PerParam(value)
            canon[key] = value
        groups.append({k: v for k, v in canon.items() if not isinstance(v, _PerParam)})
        per_param = any(isinstance(v, _PerParam) for v in canon.values())
        for i, name in enumerate(params):
            if name in per:             # a parameter listed twice: its first group's
                continue
            per[name] = {k: (v[i] if isinstance(v, _PerParam) else v)
                         for k, v in canon.items()} if per_param else dict(canon)
    return per, groups


def _deterministic(framework: str, det: Dict[str, Any]) -> Optional[bool]:
    if framework == "pytorch" and "deterministic_algorithms" in det:
        return bool(det["deterministic_algorithms"])
    if framework == "mindspore" and "deterministic" in det:
        return str(det["deterministic"]).upper() == "ON"
    return None


