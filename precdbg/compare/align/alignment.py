"""Pair the records of two dumps (one step, one rank each).

Records pair by (kind, direction, module path, which forward call of that module a forward API
call ran in, API, role, argument position) and the k-th occurrence of that key in execution
order, where API is the framework API (`Tensor.add`) within one framework and the canonical op
(`add`) across frameworks. Counting occurrences per module call and API, not per run, means an
extra cast, copy or view on one side shifts nothing but its own key within one call of its
module (entry names, whose call index counts the whole run, would shift every later pair; with
gradient accumulation, per-module counts would pair one micro-batch with the next). The dy
and dx of an API or module call then pair with those of the call its forward records paired
with (a backward pass has no module call to count within: an extra call on one side would
shift every later backward pair of its op in the module). A user mapping renames module paths
or ops of the candidate before pairing.
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ...records.schema import Direction, RecordKind, Role, scalar_mask
from .casts import CAST, casts, casts_by_shape, pair_casts_by_input

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
    mods = {(m, o) for m, o in zip(module[kind == _MODULE].tolist(),
                                   op[kind == _MODULE].tolist())}
    calls = {(m, o) for m, o in zip(module[kind == _API].tolist(), op[kind == _API].tolist())}
    return dict(mods & calls)


def _leaves_of_either(table: RecordTable, other: RecordTable) -> Dict[str, str]:
    """The leaf modules of `table`, and those of `other` at the same path where `table`'s
    module there calls the same functional op: a user's cell of its own class (a custom bprop
    around ops.gelu) in place of the other framework's nn.GELU is a leaf as that one is."""
    leaves = _leaf_modules(table)
    kind, module, op = table["kind"], table["module"], table["op"]
    calls = {(m, o) for m, o in zip(module[kind == _API].tolist(), op[kind == _API].tolist())}
    for path, leaf_op in _leaf_modules(other).items():
        if path not in leaves and (path, leaf_op) in calls:
            leaves[path] = leaf_op
    return leaves


def _keys(table: RecordTable, by_name: bool, mapping: Optional[Mapping[str, Mapping[str, str]]],
          leaves: Optional[Dict[str, str]] = None, module_calls: bool = True,
          across: bool = False) -> List[Tuple]:
    """Per record its pairing key. `module_calls=False` (the other dump has no module records:
    level api) counts occurrences in the whole module, not per module call; `across`: the
    dumps are of two frameworks."""
    n = len(table)
    module = table["module"].tolist()
    kind = table["kind"].tolist()
    if by_name:
        op = [f"{p}.{a}" for p, a in zip(table["prefix"].tolist(), table["api"].tolist())]
    else:
        op = table["op"].tolist()
        # a leaf module's functional op belongs to the module that called the leaf: it pairs
        # with the same op called directly by that module in the other run (F.gelu in
        # MLP.forward against a GELU cell mlp.act)
        leaves = _leaf_modules(table) if leaves is None else leaves
        module = [m.rpartition(".")[0] if kind[i] == _API and leaves.get(m) == op[i] else m
                  for i, m in enumerate(module)]
        # a module is one object at one path: across frameworks its records pair by the path,
        # whatever its class (nn.GELU against a user's GeluWithBprop cell); within one, a
        # mapping may put a wrapper and the model it holds at one path, told apart by class
        if across:
            op = ["" if k == _MODULE else o for k, o in zip(kind, op)]
    # before the mapping renames module paths
    within = _module_call_of(table, module) if module_calls else [-1] * n
    if mapping:
        modules, ops = mapping.get("modules", {}), mapping.get("ops", {})
        module = [rename_module(m, modules) for m in module]
        op = [ops.get(o, o) for o in op]
    direction = table["direction"].tolist()
    role, arg = table["role"].tolist(), table["arg_index"].tolist()
    return list(zip(kind, direction, module, within, op, role, arg))


_OUTSIDE = -2        # _module_call_of: an API call of a module's path outside its calls


def _module_call_of(table: RecordTable, module: List[str]) -> List[int]:
    """Per record, which forward call of its module it ran in (the last one begun before it;
    -1 before the first, for backward records, and where no module call was recorded): an
    extra call inside one call of a module (a gradient accumulation's micro-batch) shifts the
    pairs of that call only."""
    kind, forward = table["kind"], table["direction"] == _FORWARD
    seq = table["seq"].tolist()
    begun: Dict[str, Dict[str, List[int]]] = {}      # path -> entry -> [first, last] seq
    entries = table["entry"]
    module_rows = np.nonzero(forward & (kind == _MODULE))[0]
    for i, entry in zip(module_rows.tolist(), entries[module_rows].tolist()):
        span = begun.setdefault(module[i], {}).setdefault(entry, [seq[i], seq[i]])
        span[0], span[1] = min(span[0], seq[i]), max(span[1], seq[i])
    spans = {path: sorted(calls.values()) for path, calls in begun.items()}
    starts = {path: [lo for lo, _ in found] for path, found in spans.items()}
    out = [-1] * len(module)          # backward records and others: in no call
    for i in np.nonzero(forward & (kind == _API))[0].tolist():
        path = module[i]
        found = starts.get(path)
        if not found:
            continue
        at = bisect.bisect_right(found, seq[i]) - 1
        # after its module's call returned: the root's path also owns what runs outside the
        # model (the loss, clipping), which pairs by its occurrence outside every call
        out[i] = _OUTSIDE if at >= 0 and seq[i] > spans[path][at][1] else at
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


def _shape_of(table: RecordTable) -> Any:
    """row -> the record's shape (its dimensions only)."""
    shape, ndim = table["shape"], table["ndim"]
    return lambda i: shape[i][:int(ndim[i])]


def _occurrences(keys: List[Tuple], order: np.ndarray, rows: Optional[List[int]] = None
                 ) -> Dict[Tuple, List[int]]:
    groups: Dict[Tuple, List[int]] = {}
    ordered = np.argsort(order, kind="stable").tolist()
    if rows is not None:
        wanted = set(rows)
        ordered = [i for i in ordered if i in wanted]
    for i in ordered:
        groups.setdefault(keys[i], []).append(i)
    return groups


_BACKWARD = Direction.BACKWARD
_FORWARD = Direction.FORWARD
_API, _MODULE, _PARAM = RecordKind.API, RecordKind.MODULE, RecordKind.PARAM
_BUFFER = Role.BUFFER
_CALL_KINDS = frozenset({RecordKind.API, RecordKind.MODULE})


def _calls(table: RecordTable) -> Tuple[List[Tuple], List[bool]]:
    """Per record, the call it belongs to (kind, prefix, API or class, module, call index: what
    every record of one captured call shares), and whether it is the backward of an API or
    module call (its dy and dx)."""
    kind, prefix, api = table["kind"].tolist(), table["prefix"].tolist(), table["api"].tolist()
    module, index = table["module"].tolist(), table["call_index"].tolist()
    direction = table["direction"].tolist()
    calls = list(zip(kind, prefix, api, module, index))
    backward = [d == _BACKWARD and k in _CALL_KINDS for k, d in zip(kind, direction)]
    return calls, backward


_KEY_OP = 4          # where a key (_keys) holds the op


def _pair_groups(ga: Dict[Tuple, List[int]], gb: Dict[Tuple, List[int]],
                 tensor_a: np.ndarray, tensor_b: np.ndarray, by_name: bool,
                 shapes: Optional[Tuple[Any, Any]] = None
                 ) -> Tuple[List[int], List[int], List[int], List[int]]:
    """The k-th row of a key in a with the k-th of the same key in b: (pairs a, pairs b,
    only a, only b); across frameworks only tensor records pair, and casts by shape
    (`shapes`: each side's row -> its shape)."""
    pa, pb, oa, ob = [], [], [], []
    for key, rows_a in ga.items():
        rows_b = gb.get(key, [])
        if by_name and len(rows_a) == 1 and len(rows_b) == 1:    # nearly every key: one pair
            pa.append(rows_a[0])
            pb.append(rows_b[0])
            continue
        if not by_name:
            rows_a = [r for r in rows_a if tensor_a[r]]
            rows_b = [r for r in rows_b if tensor_b[r]]
        if shapes is not None and not by_name and key[_KEY_OP] == CAST:
            found = casts_by_shape(rows_a, rows_b, *shapes)
            for out, part in zip((pa, pb, oa, ob), found):
                out.extend(part)
            continue
        k = min(len(rows_a), len(rows_b))
        pa.extend(rows_a[:k])
        pb.extend(rows_b[:k])
        oa.extend(rows_a[k:])
        ob.extend(rows_b[k:])
    for key, rows_b in gb.items():
        if key not in ga:
            ob.extend(r for r in rows_b if by_name or tensor_b[r])
    return pa, pb, oa, ob


def align(a: RecordTable, b: RecordTable, same_framework: bool,
          mapping: Optional[Mapping[str, Mapping[str, str]]] = None) -> Alignment:
    """Pair records of a and b; scalar (non-tensor) records are paired only by name. The
    backward records (dy, dx) of an API or module call pair with those of the call its forward
    paired with: an extra call on one side (a KV cache's `cat` next to rotary embedding's) then
    shifts nothing in backward either, where the backward pass has no module call to count
    occurrences within. Backward records of calls whose forward did not pair fall back to the
    keys."""
    by_name = same_framework and not mapping
    tensor_a = ~scalar_mask(a["dtype"])
    tensor_b = ~scalar_mask(b["dtype"])
    # a dump of level api has no module calls to count occurrences within
    calls = bool((a["kind"] == RecordKind.MODULE).any()) and \
        bool((b["kind"] == RecordKind.MODULE).any())
    if by_name:
        keys_a = _keys(a, by_name, None, module_calls=calls)
        keys_b = _keys(b, by_name, mapping, module_calls=calls)
    else:
        leaves_a, leaves_b = _leaves_of_either(a, b), _leaves_of_either(b, a)
        keys_a = _keys(a, by_name, None, leaves_a, calls, not same_framework)
        keys_b = _keys(b, by_name, mapping, leaves_b, calls, not same_framework)
    calls_a, backward_a = _calls(a)
    calls_b, backward_b = _calls(b)
    rest_a = [i for i, bw in enumerate(backward_a) if not bw]
    rest_b = [i for i, bw in enumerate(backward_b) if not bw]
    shapes = (_shape_of(a), _shape_of(b))
    casts_a, casts_b = (casts(a, rest_a), casts(b, rest_b)) if same_framework else ([], [])
    if casts_a and casts_b:         # paired after the rest, by what they convert
        skip_a, skip_b = set(casts_a), set(casts_b)
        rest_a = [i for i in rest_a if i not in skip_a]
        rest_b = [i for i in rest_b if i not in skip_b]
    else:
        casts_a = casts_b = []
    pa, pb, oa, ob = _pair_groups(_occurrences(keys_a, a["seq"], rest_a),
                                  _occurrences(keys_b, b["seq"], rest_b),
                                  tensor_a, tensor_b, by_name, shapes)
    if casts_a:
        ca, cb, left_ca, left_cb = pair_casts_by_input(a, b, casts_a, casts_b, calls_a,
                                                        calls_b, pa, pb)
        pa += ca
        pb += cb
        fa, fb, foa, fob = _pair_groups(_occurrences(keys_a, a["seq"], left_ca),
                                        _occurrences(keys_b, b["seq"], left_cb),
                                        tensor_a, tensor_b, by_name, shapes)
        pa, pb, oa, ob = pa + fa, pb + fb, oa + foa, ob + fob
    # the calls whose forward records paired (the first pair of a call, in a's order, decides)
    seq_a = a["seq"]
    seqs_a = seq_a.tolist()
    call_of: Dict[Tuple, Tuple] = {}
    for i, j in sorted(zip(pa, pb), key=lambda pair: seqs_a[pair[0]]):
        call_of.setdefault(calls_a[i], calls_b[j])
    role_a, arg_a = a["role"].tolist(), a["arg_index"].tolist()
    role_b, arg_b = b["role"].tolist(), b["arg_index"].tolist()
    backward_rows_b = [i for i, bw in enumerate(backward_b) if bw]
    within_b = _occurrences([(calls_b[i], role_b[i], arg_b[i]) if backward_b[i] else ()
                             for i in range(len(b))], b["seq"], backward_rows_b)
    left_a: List[int] = []
    for i in np.argsort(seq_a, kind="stable").tolist():
        if not backward_a[i]:
            continue
        target = call_of.get(calls_a[i])
        rows = within_b.get((target, role_a[i], arg_a[i])) if target is not None else None
        if rows and (by_name or (tensor_a[i] and tensor_b[rows[0]])):
            pa.append(i)
            pb.append(rows.pop(0))
        else:
            left_a.append(i)
    left_b = [i for rows in within_b.values() for i in rows]
    fa, fb, foa, fob = _pair_groups(_occurrences(keys_a, a["seq"], left_a),
                                    _occurrences(keys_b, b["seq"], left_b),
                                    tensor_a, tensor_b, by_name, shapes)
    pa += fa
    pb += fb
    oa += foa
    ob += fob
    if same_framework and not by_name:   # a mapping renames modules: names do not pair
        _pair_arguments(a, b, tensor_a, tensor_b, calls_a, calls_b, backward_a, backward_b,
                        call_of, pa, pb)
    as_array = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    sa: List[int] = []
    sb: List[int] = []
    if not by_name:
        oa, sa = _needs_none(a, oa, leaves_a)
        ob, sb = _needs_none(b, ob, leaves_b)
    return Alignment(as_array(pa), as_array(pb), as_array(sorted(oa)), as_array(sorted(ob)),
                     by_name, as_array(sorted(sa)), as_array(sorted(sb)))


def _pair_arguments(a: RecordTable, b: RecordTable, tensor_a: np.ndarray, tensor_b: np.ndarray,
                    calls_a: List[Tuple], calls_b: List[Tuple], backward_a: List[bool],
                    backward_b: List[bool], call_of: Dict[Tuple, Tuple], pa: List[int],
                    pb: List[int]) -> None:
    """Within one framework, the non-tensor arguments (an eps, `approximate`) of two calls that
    paired: by position and keyword, which one framework keeps (across frameworks argument
    lists differ, and they pair by name only)."""
    role_b, arg_b, key_b = b["role"].tolist(), b["arg_index"].tolist(), b["arg_key"].tolist()
    scalars_b: Dict[Tuple, int] = {}
    for j in np.nonzero(~tensor_b)[0].tolist():
        if not backward_b[j]:
            scalars_b.setdefault((calls_b[j], role_b[j], arg_b[j], key_b[j]), j)
    role_a, arg_a, key_a = a["role"].tolist(), a["arg_index"].tolist(), a["arg_key"].tolist()
    for i in np.nonzero(~tensor_a)[0].tolist():
        target = call_of.get(calls_a[i]) if not backward_a[i] else None
        if target is None:
            continue
        j = scalars_b.pop((target, role_a[i], arg_a[i], key_a[i]), None)
        if j is not None:
            pa.append(i)
            pb.append(j)


def _needs_none(table: RecordTable, rows: List[int], leaves: Dict[str, str]
                ) -> Tuple[List[int], List[int]]:
    """Split rows without counterpart into (unmatched, needing none) across frameworks."""
    if not rows:
        return rows, []
    kind, module, op = table["kind"], table["module"], table["op"]
    role = table["role"]
    keep, skip = [], []
    for i in rows:
        k, m, o = kind[i], module[i], op[i]
        redundant = (k == _MODULE and m in leaves) or \
            (k == _API and (o in _VALUE_PRESERVING or (m in leaves and leaves[m] != o))) or \
            (k == _PARAM and role[i] == _BUFFER)
        (skip if redundant else keep).append(i)
    return keep, skip


def load_mapping(path: str) -> Dict[str, Dict[str, str]]:
    """A YAML mapping file: `modules: {candidate path: baseline path}`, `ops: {cand: base}`."""
    import yaml

    from ...errors import ConfigError
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
        from ...config.dump_config import unknown_key_message
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
