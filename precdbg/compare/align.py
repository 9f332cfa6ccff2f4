"""Pair the records of two dumps (one step, one rank each).

Records pair by (kind, direction, module path, which forward call of that module a forward API
call ran in, API, role, argument position) and the k-th occurrence of that key in execution
order, where API is the framework API (`Tensor.add`) within one framework and the canonical op
(`add`) across frameworks. Counting occurrences per module call and API, not per run, means an
extra cast, copy or view on one side shifts nothing but its own key within one call of its
module (entry names, whose call index counts the whole run, would shift every later pair; with
gradient accumulation, per-module counts would pair one micro-batch with the next). A user
mapping renames module paths or ops of the candidate before pairing.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..reader import RecordTable
from ..schema import scalar_mask

__all__ = ["Alignment", "align", "load_mapping", "rename_module"]


@dataclasses.dataclass
class Alignment:
    pairs_a: np.ndarray            # row indices into table a
    pairs_b: np.ndarray            # row indices into table b, same length
    only_a: np.ndarray             # rows of a without counterpart
    only_b: np.ndarray
    by_name: bool                  # aligned by framework API names (same framework)
    # rows without counterpart that need none (across frameworks): a leaf module's own records
    # where the other run called its functional op directly, calls inside a leaf module other
    # than its functional op (BatchNorm's step counter), value-preserving calls (detach), and
    # buffers (framework plumbing: MindSpore keeps plain tensors where PyTorch has buffers)
    skipped_a: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    skipped_b: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))


# canonical ops that return their input's values unchanged: one run may make such a call alone
_VALUE_PRESERVING = frozenset({"copy", "contiguous"})     # detach, clone, contiguous, ...


def _leaf_modules(table: RecordTable) -> Dict[str, str]:
    """path -> op of every leaf module: one whose own calls include its functional op (an
    nn.Linear calling F.linear, a MindSpore Dense cell recorded as Functional.dense)."""
    kind, module, op = table["kind"], table["module"], table["op"]
    mods = {(m, o) for m, o in zip(module[kind == "module"].tolist(),
                                   op[kind == "module"].tolist())}
    calls = {(m, o) for m, o in zip(module[kind == "api"].tolist(), op[kind == "api"].tolist())}
    return dict(mods & calls)


def _keys(table: RecordTable, by_name: bool, mapping: Optional[Mapping[str, Mapping[str, str]]]
          ) -> List[Tuple]:
    n = len(table)
    module = table["module"].tolist()
    if by_name:
        op = np.char.add(np.char.add(table["prefix"], "."), table["api"]).tolist()
    else:
        op = table["op"].tolist()
        # a leaf module's functional op belongs to the module that called the leaf: it pairs
        # with the same op called directly by that module in the other run (F.gelu in
        # MLP.forward against a GELU cell mlp.act)
        leaves, kind = _leaf_modules(table), table["kind"].tolist()
        module = [m.rpartition(".")[0] if kind[i] == "api" and leaves.get(m) == op[i] else m
                  for i, m in enumerate(module)]
    within = _module_call_of(table, module)       # before the mapping renames module paths
    if mapping:
        modules, ops = mapping.get("modules", {}), mapping.get("ops", {})
        module = [rename_module(m, modules) for m in module]
        op = [ops.get(o, o) for o in op]
    kind, direction = table["kind"].tolist(), table["direction"].tolist()
    role, arg = table["role"].tolist(), table["arg_index"].tolist()
    return [(kind[i], direction[i], module[i], within[i], op[i], role[i], arg[i])
            for i in range(n)]


def _module_call_of(table: RecordTable, module: List[str]) -> List[int]:
    """Per record, which forward call of its module it ran in (the last one begun before it;
    -1 before the first, for backward records, and where no module call was recorded): an
    extra call inside one call of a module (a gradient accumulation's micro-batch) shifts the
    pairs of that call only."""
    kind, direction, seq = table["kind"].tolist(), table["direction"].tolist(), \
        table["seq"].tolist()
    begun: Dict[str, Dict[str, int]] = {}
    entries = table["entry"].tolist()
    for i, k in enumerate(kind):
        if k == "module" and direction[i] == "forward":
            calls = begun.setdefault(module[i], {})
            first = calls.get(entries[i])
            if first is None or seq[i] < first:
                calls[entries[i]] = seq[i]
    starts = {path: sorted(calls.values()) for path, calls in begun.items()}
    out = []
    for i, path in enumerate(module):
        found = starts.get(path)
        out.append(bisect.bisect_right(found, seq[i]) - 1
                   if found and direction[i] == "forward" and kind[i] == "api" else -1)
    return out


def rename_module(path: str, modules: Mapping[str, str]) -> str:
    """Longest matching prefix of a module path renamed by the user's mapping."""
    best = ""
    for src in modules:
        if (path == src or path.startswith(src + ".")) and len(src) > len(best):
            best = src
    if not best and "" not in modules:
        return path
    if not best and path and "" in modules:      # the root itself mapped somewhere
        best = ""
        rest = "." + path
    else:
        rest = path[len(best):]
    target = modules[best]
    if not target:                               # mapped to the root: drop the separator
        return rest.lstrip(".")
    return target + rest if rest else target


def _occurrences(keys: List[Tuple], order: np.ndarray) -> Dict[Tuple, List[int]]:
    groups: Dict[Tuple, List[int]] = {}
    for i in np.argsort(order, kind="stable").tolist():
        groups.setdefault(keys[i], []).append(i)
    return groups


def align(a: RecordTable, b: RecordTable, same_framework: bool,
          mapping: Optional[Mapping[str, Mapping[str, str]]] = None) -> Alignment:
    """Pair records of a and b; scalar (non-tensor) records are paired only by name."""
    by_name = same_framework and not mapping
    tensor_a = ~scalar_mask(a["dtype"])
    tensor_b = ~scalar_mask(b["dtype"])
    ga = _occurrences(_keys(a, by_name, None), a["seq"])
    gb = _occurrences(_keys(b, by_name, mapping), b["seq"])
    pa, pb, oa, ob = [], [], [], []
    for key, rows_a in ga.items():
        rows_b = gb.get(key, [])
        if not by_name:
            rows_a = [r for r in rows_a if tensor_a[r]]
            rows_b = [r for r in rows_b if tensor_b[r]]
        k = min(len(rows_a), len(rows_b))
        pa.extend(rows_a[:k])
        pb.extend(rows_b[:k])
        oa.extend(rows_a[k:])
        ob.extend(rows_b[k:])
    for key, rows_b in gb.items():
        if key not in ga:
            ob.extend(r for r in rows_b if by_name or tensor_b[r])
    as_array = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    sa: List[int] = []
    sb: List[int] = []
    if not by_name:
        oa, sa = _needs_none(a, oa)
        ob, sb = _needs_none(b, ob)
    return Alignment(as_array(pa), as_array(pb), as_array(sorted(oa)), as_array(sorted(ob)),
                     by_name, as_array(sorted(sa)), as_array(sorted(sb)))


def _needs_none(table: RecordTable, rows: List[int]) -> Tuple[List[int], List[int]]:
    """Split rows without counterpart into (unmatched, needing none) across frameworks."""
    if not rows:
        return rows, []
    leaves = _leaf_modules(table)
    kind, module, op = table["kind"], table["module"], table["op"]
    role = table["role"]
    keep, skip = [], []
    for i in rows:
        k, m, o = kind[i], module[i], op[i]
        redundant = (k == "module" and m in leaves) or \
            (k == "api" and (o in _VALUE_PRESERVING or (m in leaves and leaves[m] != o))) or \
            (k == "param" and role[i] == "buffer")
        (skip if redundant else keep).append(i)
    return keep, skip


def load_mapping(path: str) -> Dict[str, Dict[str, str]]:
    """A YAML mapping file: `modules: {candidate path: baseline path}`, `ops: {cand: base}`."""
    import yaml

    from ..errors import ConfigError
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read mapping file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a mapping file holds only 'modules' and 'ops' mappings")
    extra = sorted(set(map(str, data)) - {"modules", "ops"})
    if extra:
        from ..config import unknown_key_message
        raise ConfigError(f"{path}: {extra[0]}: "
                          + unknown_key_message(extra[0], {"modules", "ops"})
                          + " (a mapping file holds only 'modules' and 'ops' mappings)")
    out: Dict[str, Dict[str, str]] = {}
    for section in ("modules", "ops"):
        value = data.get(section) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {section}: expected a mapping of names")
        # the file maps candidate -> baseline; alignment renames the candidate side
        out[section] = {str(k): str(v) for k, v in value.items()}
    return out
