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

Keys and calls are integer codes shared by both tables (`grouping`: a code per distinct string
of a column, one per distinct tuple of codes), and occurrences, pairs and order come from numpy
sorts of them, with no Python object per record: the pairs are those, in the order, of a tuple
key per record and a dict of its rows per key.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ...records.schema import Direction, RecordKind, Role, scalar_mask
from .casts import CAST, casts, casts_by_shape, pair_casts_by_input
from .grouping import (argsort, codes, first_at, group, in_seq_order, occurrences, pair_by_key,
                       split)

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


def _key_codes(a: RecordTable, b: RecordTable, col: Dict[str, List[np.ndarray]], by_name: bool,
               mapping: Optional[Mapping[str, Mapping[str, str]]],
               leaves: Tuple[Dict[str, str], Dict[str, str]], module_calls: bool = True,
               across: bool = False, kinds: Optional[List[Tuple[np.ndarray, ...]]] = None
               ) -> Tuple[np.ndarray, np.ndarray, int, Optional[np.ndarray]]:
    """Per record of a and of b its pairing key as one integer code shared by both tables,
    the number of keys, and (not by name) which keys are of casts. A key is (kind, direction,
    module, which call of the module, op, role, argument position); the mapping renames b's
    modules and ops. `module_calls=False` (the other dump has no module records: level api)
    counts occurrences in the whole module, not per module call; `across`: the dumps are of
    two frameworks; `kinds`: each table's `_kinds`."""
    cast = None
    kinds = kinds or [_kinds(a), _kinds(b)]
    if by_name:                  # the op is `prefix.api`: codes of the strings, pair by pair
        module = final = col["module"]
        pair = group(np.concatenate(col["prefix"]), np.concatenate(col["api"]))
        nprefix = int(max(c.max(initial=-1) for c in col["prefix"])) + 1
        prefixes = [t["prefix"][at[at >= 0]].tolist()
                    for t, at in zip((a, b), (first_at(c, nprefix) for c in col["prefix"]))]
        if any("." in p for side in prefixes for p in side):  # two pairs may name one op
            first = np.unique(pair, return_index=True)[1]
            prefix = np.concatenate([a["prefix"], b["prefix"]])[first].tolist()
            api = np.concatenate([a["api"], b["api"]])[first].tolist()
            pair = codes([f"{p}.{x}" for p, x in zip(prefix, api)])[0][pair]
        op = split(pair, [len(a), len(b)])
    else:
        paths, ops = [], []
        for table, leaf in zip((a, b), leaves):
            kind, op_of = table["kind"].tolist(), table["op"].tolist()
            # a leaf module's functional op belongs to the module that called the leaf: it
            # pairs with the same op called directly by that module in the other run (F.gelu
            # in MLP.forward against a GELU cell mlp.act)
            paths.append([m.rpartition(".")[0] if k == _API and leaf.get(m) == o else m
                          for k, m, o in zip(kind, table["module"].tolist(), op_of)])
            # a module is one object at one path: across frameworks its records pair by the
            # path, whatever its class (nn.GELU against a user's GeluWithBprop cell); within
            # one, a mapping may put a wrapper and the model it holds at one path, told apart
            # by class
            ops.append(["" if k == _MODULE else o for k, o in zip(kind, op_of)] if across
                       else op_of)
        module = codes(*paths)        # before the mapping renames module paths
        if mapping:
            modules, renames = mapping.get("modules", {}), mapping.get("ops", {})
            renamed: Dict[str, str] = {}
            paths[1] = [renamed.get(m) or renamed.setdefault(m, rename_module(m, modules))
                        for m in paths[1]]
            ops[1] = [renames.get(o, o) for o in ops[1]]
        final, op = codes(*paths), codes(*ops)
        is_cast = np.asarray([o == CAST for side in ops for o in side], dtype=bool)
    within = [_module_call_of(t, m, k) if module_calls else np.full(len(t), -1, np.int64)
              for t, m, k in zip((a, b), module, kinds)]
    columns = (col["kind"], col["direction"], final, within, op, col["role"],
               [a["arg_index"], b["arg_index"]])
    key = group(*(np.concatenate(c) for c in columns))
    nkeys = int(key.max()) + 1 if len(key) else 0
    if not by_name:
        cast = np.zeros(nkeys, bool)
        cast[key[is_cast]] = True
    key_a, key_b = split(key, [len(a), len(b)])
    return key_a, key_b, nkeys, cast


_OUTSIDE = -2        # _module_call_of: an API call of a module's path outside its calls


def _module_call_of(table: RecordTable, module: np.ndarray,
                    kinds: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None
                    ) -> np.ndarray:
    """Per record, which forward call of its module (`module`: a code per path) it ran in (the
    last one begun before it; -1 before the first, for backward records, and where no module
    call was recorded): an extra call inside one call of a module (a gradient accumulation's
    micro-batch) shifts the pairs of that call only. `kinds`: the masks of forward, API and
    module records."""
    forward, api, modules = kinds or _kinds(table)
    seq = table["seq"].astype(np.int64)
    out = np.full(len(table), -1, np.int64)   # backward records and others: in no call
    rows = np.nonzero(forward & modules)[0]
    asked = np.nonzero(forward & api)[0]
    if not len(rows) or not len(asked):
        return out
    call = group(module[rows], codes(table["entry"][rows])[0])   # a call: path and entry
    lo = np.full(int(call.max()) + 1, np.iinfo(np.int64).max)
    hi = np.full(len(lo), np.iinfo(np.int64).min)
    np.minimum.at(lo, call, seq[rows])
    np.maximum.at(hi, call, seq[rows])
    path = np.zeros(len(lo), np.int64)
    path[call] = module[rows]
    order = np.lexsort((hi, lo, path))        # each path's calls in the order they began
    lo, hi, path = lo[order], hi[order], path[order]
    base = int(seq.min())
    width = int(seq.max()) - base + 1
    at = np.searchsorted(path * width + (lo - base), module[asked] * width + (seq[asked] - base),
                         side="right") - 1
    nth = at - np.searchsorted(path, module[asked], side="left")
    # after its module's call returned: the root's path also owns what runs outside the
    # model (the loss, clipping), which pairs by its occurrence outside every call
    outside = seq[asked] > hi[np.maximum(at, 0)]
    out[asked] = np.where(nth < 0, -1, np.where(outside, _OUTSIDE, nth))
    return out


def _kinds(table: RecordTable) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The masks of forward records, of API records and of module records."""
    kind = table["kind"]
    return table["direction"] == _FORWARD, kind == _API, kind == _MODULE


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


_BACKWARD = Direction.BACKWARD
_FORWARD = Direction.FORWARD
_API, _MODULE, _PARAM = RecordKind.API, RecordKind.MODULE, RecordKind.PARAM
_BUFFER = Role.BUFFER


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
    kinds = [_kinds(a), _kinds(b)]         # forward, API, module records
    # a dump of level api has no module calls to count occurrences within
    calls = bool(kinds[0][2].any()) and bool(kinds[1][2].any())
    col = {name: codes(a[name], b[name], few=name not in ("api", "module"))
           for name in ("kind", "direction", "prefix", "api", "module", "role")}
    leaves_a: Dict[str, str] = {}
    leaves_b: Dict[str, str] = {}
    if not by_name:
        leaves_a, leaves_b = _leaves_of_either(a, b), _leaves_of_either(b, a)
    key_a, key_b, nkeys, cast = _key_codes(a, b, col, by_name, mapping, (leaves_a, leaves_b),
                                           calls, not same_framework, kinds)
    # per record the call it belongs to (kind, prefix, API or class, module, call index: what
    # every record of one captured call shares), and whether it is the backward of an API or
    # module call (its dy and dx)
    call_a, call_b = split(group(*(np.concatenate(col[c]) for c in ("kind", "prefix", "api",
                                                                     "module")),
                                 np.concatenate([a["call_index"], b["call_index"]])),
                           [len(a), len(b)])
    backward_a, backward_b = ((t["direction"] == _BACKWARD) & (api | modules)
                              for t, (_, api, modules) in zip((a, b), kinds))
    seq_a, seq_b = a["seq"], b["seq"]
    shapes = (_shape_of(a), _shape_of(b))

    def by_key(rows_a: Any, rows_b: Any) -> Tuple[np.ndarray, ...]:
        if by_name:
            return pair_by_key(key_a, key_b, rows_a, rows_b, seq_a, seq_b, nkeys)
        return pair_by_key(key_a, key_b, rows_a, rows_b, seq_a, seq_b, nkeys,
                           (tensor_a, tensor_b), cast,
                           lambda ra, rb: casts_by_shape(ra, rb, *shapes))

    rest_a, rest_b = np.nonzero(~backward_a)[0], np.nonzero(~backward_b)[0]
    casts_a, casts_b = (casts(a, rest_a), casts(b, rest_b)) if same_framework else ([], [])
    if casts_a and casts_b:         # paired after the rest, by what they convert
        for rest, found in ((rest_a, casts_a), (rest_b, casts_b)):
            rest[np.searchsorted(rest, found)] = -1
        rest_a, rest_b = rest_a[rest_a >= 0], rest_b[rest_b >= 0]
    else:
        casts_a = casts_b = []
    pa, pb, oa, ob = ([part] for part in by_key(rest_a, rest_b))
    if casts_a:
        found = pair_casts_by_input(a, b, casts_a, casts_b, call_a, call_b, pa[0], pb[0])
        pa.append(np.asarray(found[0], dtype=np.int64))
        pb.append(np.asarray(found[1], dtype=np.int64))
        for out, part in zip((pa, pb, oa, ob), by_key(found[2], found[3])):
            out.append(part)
    # the calls whose forward records paired (the first pair of a call, in a's order, decides)
    forward_a, forward_b = np.concatenate(pa), np.concatenate(pb)
    ncalls = int(max(call_a.max(initial=-1), call_b.max(initial=-1))) + 1
    order = _by_seq(seq_a, forward_a)
    first = first_at(call_a[forward_a[order]], ncalls)
    call_of = np.where(first >= 0, call_b[forward_b[order][np.maximum(first, 0)]], -1) \
        if len(forward_a) else np.full(ncalls, -1, np.int64)
    found = _pair_backward(a, b, call_a, call_b, col["role"], backward_a, backward_b, call_of,
                           None if by_name else (tensor_a, tensor_b))
    pa.append(found[0])
    pb.append(found[1])
    for out, part in zip((pa, pb, oa, ob), by_key(found[2], found[3])):
        out.append(part)
    if same_framework and not by_name:   # a mapping renames modules: names do not pair
        found = _pair_arguments(a, b, tensor_a, tensor_b, call_a, call_b, col["role"],
                                backward_a, backward_b, call_of)
        pa.append(found[0])
        pb.append(found[1])
    only_a, only_b = np.sort(np.concatenate(oa)), np.sort(np.concatenate(ob))
    skipped_a = skipped_b = np.zeros(0, np.int64)
    if not by_name:
        only_a, skipped_a = _needs_none(a, only_a, leaves_a)
        only_b, skipped_b = _needs_none(b, only_b, leaves_b)
    return Alignment(np.concatenate(pa), np.concatenate(pb), only_a, only_b, by_name,
                     skipped_a, skipped_b)


def _by_seq(seq: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A stable argsort of the rows' seq: by their place in the table's seq order (no two
    records of a table share a seq), else by seq."""
    ranks = np.empty(len(seq), np.int64)
    ordered = np.argsort(seq, kind="stable")
    ranks[ordered] = np.arange(len(seq))
    if len(seq) and (seq[ordered][1:] == seq[ordered][:-1]).any():
        return np.argsort(seq[rows], kind="stable")
    return argsort(ranks[rows], len(seq))


def _pair_backward(a: RecordTable, b: RecordTable, call_a: np.ndarray, call_b: np.ndarray,
                   role: List[np.ndarray], backward_a: np.ndarray, backward_b: np.ndarray,
                   call_of: np.ndarray, tensors: Optional[Tuple[np.ndarray, np.ndarray]]
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The backward records of a's calls, in a's order, each with the next one of the same
    role and position of the call its forward paired with: (pairs a, pairs b, rest a, rest b).
    `tensors` (not by name): only tensor records pair, and a call's records in b pair up to
    its first non-tensor one."""
    rows_a = in_seq_order(np.nonzero(backward_a)[0], a["seq"])
    rows_b = in_seq_order(np.nonzero(backward_b)[0], b["seq"])
    target = call_of[call_a[rows_a]]
    asking = target >= 0
    if tensors is not None:
        asking &= tensors[0][rows_a]
    slot = group(np.concatenate([target, call_b[rows_b]]),
                 np.concatenate([role[0][rows_a], role[1][rows_b]]),
                 np.concatenate([a["arg_index"][rows_a], b["arg_index"][rows_b]]))
    slot_a, slot_b = slot[:len(rows_a)], slot[len(rows_a):]
    nslots = int(slot.max()) + 1 if len(slot) else 0
    nth_b, order_b, start_b, open_b = occurrences(slot_b, nslots)
    if tensors is not None:         # the first non-tensor record of a slot blocks it
        scalar = ~tensors[1][rows_b]
        np.minimum.at(open_b, slot_b[scalar], nth_b[scalar])
    ask = np.nonzero(asking)[0]
    nth_a = occurrences(slot_a[ask], nslots)[0]
    hit = nth_a < open_b[slot_a[ask]]
    found_a = ask[hit]                      # in a's order
    found_b = order_b[start_b[slot_a[found_a]] + nth_a[hit]]
    return (rows_a[found_a], rows_b[found_b], np.delete(rows_a, found_a),
            np.delete(rows_b, found_b))


def _pair_arguments(a: RecordTable, b: RecordTable, tensor_a: np.ndarray, tensor_b: np.ndarray,
                    call_a: np.ndarray, call_b: np.ndarray, role: List[np.ndarray],
                    backward_a: np.ndarray, backward_b: np.ndarray, call_of: np.ndarray
                    ) -> Tuple[np.ndarray, np.ndarray]:
    """Within one framework, the non-tensor arguments (an eps, `approximate`) of two calls that
    paired: by position and keyword, which one framework keeps (across frameworks argument
    lists differ, and they pair by name only)."""
    scalars_b: Dict[Tuple, int] = {}
    rows = np.nonzero(~tensor_b & ~backward_b)[0]
    for j, found in zip(rows.tolist(), zip(call_b[rows].tolist(), role[1][rows].tolist(),
                                           b["arg_index"][rows].tolist(),
                                           b["arg_key"][rows].tolist())):
        scalars_b.setdefault(found, j)
    pa, pb = [], []
    rows = np.nonzero(~tensor_a & ~backward_a)[0]
    rows = rows[call_of[call_a[rows]] >= 0]
    for i, found in zip(rows.tolist(), zip(call_of[call_a[rows]].tolist(), role[0][rows].tolist(),
                                           a["arg_index"][rows].tolist(),
                                           a["arg_key"][rows].tolist())):
        j = scalars_b.pop(found, None)
        if j is not None:
            pa.append(i)
            pb.append(j)
    return np.asarray(pa, dtype=np.int64), np.asarray(pb, dtype=np.int64)


def _needs_none(table: RecordTable, rows: np.ndarray, leaves: Dict[str, str]
                ) -> Tuple[np.ndarray, np.ndarray]:
    """Split rows without counterpart into (unmatched, needing none) across frameworks."""
    kind, module, op = table["kind"], table["module"], table["op"]
    role = table["role"]
    keep, skip = [], []
    for i in rows.tolist():
        k, m, o = kind[i], module[i], op[i]
        redundant = (k == _MODULE and m in leaves) or \
            (k == _API and (o in _VALUE_PRESERVING or (m in leaves and leaves[m] != o))) or \
            (k == _PARAM and role[i] == _BUFFER)
        (skip if redundant else keep).append(i)
    return np.asarray(keep, dtype=np.int64), np.asarray(skip, dtype=np.int64)


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
