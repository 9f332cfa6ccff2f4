"""`align` pairs records with integer codes and numpy sorts (issue 50); it must give what the
straightforward pairing gave, array by array and in the same order (the order of pairs is the
order of the report's rows): a tuple key per record, a dict of rows per key in seq order, the
k-th of a key with the k-th, backward records through the call their forward paired with.
`_reference` below is that pairing (the alignment before issue 50), run against `align` on
random tables with repeated keys, micro-batches, backward records, casts, scalars, calls only
one run makes, a mapping, and two frameworks."""
from __future__ import annotations

import bisect
from typing import Dict, List, Tuple

import numpy as np
import pytest

from precdbg.compare.align import grouping
from precdbg.compare.align.alignment import _leaf_modules, _leaves_of_either, align, \
    rename_module
from precdbg.compare.align.casts import CAST, casts_by_shape
from precdbg.records.schema import scalar_mask
from precdbg.storage.reader import RecordTable

_VALUE_PRESERVING = frozenset({"copy", "contiguous"})


# ---- the reference: the alignment before issue 50, with a tuple key per record ------------

def _ref_module_call_of(table, module):
    kind, forward = table["kind"], table["direction"] == "forward"
    seq = table["seq"].tolist()
    begun: Dict[str, Dict[str, List[int]]] = {}
    for i in np.nonzero(forward & (kind == "module"))[0].tolist():
        span = begun.setdefault(module[i], {}).setdefault(table["entry"][i], [seq[i], seq[i]])
        span[0], span[1] = min(span[0], seq[i]), max(span[1], seq[i])
    spans = {path: sorted(calls.values()) for path, calls in begun.items()}
    out = [-1] * len(module)
    for i in np.nonzero(forward & (kind == "api"))[0].tolist():
        found = spans.get(module[i])
        if not found:
            continue
        at = bisect.bisect_right([lo for lo, _ in found], seq[i]) - 1
        out[i] = -2 if at >= 0 and seq[i] > found[at][1] else at
    return out


def _ref_keys(table, by_name, mapping, leaves, module_calls, across):
    module, kind = table["module"].tolist(), table["kind"].tolist()
    if by_name:
        op = [f"{p}.{a}" for p, a in zip(table["prefix"].tolist(), table["api"].tolist())]
    else:
        op = table["op"].tolist()
        module = [m.rpartition(".")[0] if kind[i] == "api" and leaves.get(m) == op[i] else m
                  for i, m in enumerate(module)]
        if across:
            op = ["" if k == "module" else o for k, o in zip(kind, op)]
    within = _ref_module_call_of(table, module) if module_calls else [-1] * len(table)
    if mapping:
        module = [rename_module(m, mapping.get("modules", {})) for m in module]
        op = [mapping.get("ops", {}).get(o, o) for o in op]
    return list(zip(kind, table["direction"].tolist(), module, within, op,
                    table["role"].tolist(), table["arg_index"].tolist()))


def _ref_occurrences(keys, seq, rows):
    groups: Dict[Tuple, List[int]] = {}
    wanted = set(rows)
    for i in np.argsort(seq, kind="stable").tolist():
        if i in wanted:
            groups.setdefault(keys[i], []).append(i)
    return groups


def _ref_pair_groups(ga, gb, tensor_a, tensor_b, by_name, shapes):
    pa, pb, oa, ob = [], [], [], []
    for key, rows_a in ga.items():
        rows_b = gb.get(key, [])
        if not by_name:
            rows_a = [r for r in rows_a if tensor_a[r]]
            rows_b = [r for r in rows_b if tensor_b[r]]
            if key[4] == CAST:
                for out, part in zip((pa, pb, oa, ob), casts_by_shape(rows_a, rows_b, *shapes)):
                    out.extend(part)
                continue
        k = min(len(rows_a), len(rows_b))
        pa += rows_a[:k]
        pb += rows_b[:k]
        oa += rows_a[k:]
        ob += rows_b[k:]
    for key, rows_b in gb.items():
        if key not in ga:
            ob.extend(r for r in rows_b if by_name or tensor_b[r])
    return pa, pb, oa, ob


def _ref_casts_by_input(a, b, casts_a, casts_b, calls_a, calls_b, pa, pb):
    seq_a, seq_b = a["seq"], b["seq"]
    counterpart = {int(seq_a[i]): int(seq_b[j]) for i, j in zip(pa, pb)}
    role_a, role_b = a["role"].tolist(), b["role"].tolist()
    arg_a, arg_b = a["arg_index"].tolist(), b["arg_index"].tolist()
    producer_a, producer_b = a["producer"], b["producer"]
    rows_of_b: Dict[Tuple, List[int]] = {}
    by_input_b: Dict[int, List[Tuple]] = {}
    for j in sorted(casts_b, key=lambda r: seq_b[r]):
        rows_of_b.setdefault(calls_b[j], []).append(j)
        if role_b[j] == "input" and arg_b[j] == 0 and int(producer_b[j]) >= 0:
            by_input_b.setdefault(int(producer_b[j]), []).append(calls_b[j])
    rows_of_a: Dict[Tuple, List[int]] = {}
    for i in sorted(casts_a, key=lambda r: seq_a[r]):
        rows_of_a.setdefault(calls_a[i], []).append(i)
    out_a, out_b, taken = [], [], set()
    for call, rows in rows_of_a.items():
        source = next((int(producer_a[i]) for i in rows if role_a[i] == "input"
                       and arg_a[i] == 0 and int(producer_a[i]) >= 0), None)
        target = counterpart.get(source) if source is not None else None
        other = next((c for c in by_input_b.get(target, []) if c not in taken), None) \
            if target is not None else None
        if other is None:
            continue
        slots = {(role_b[j], arg_b[j]): j for j in rows_of_b[other]}
        matched = [(i, slots.get((role_a[i], arg_a[i]))) for i in rows]
        if any(j is None for _, j in matched):
            continue
        taken.add(other)
        for i, j in matched:
            out_a.append(i)
            out_b.append(j)
            counterpart[int(seq_a[i])] = int(seq_b[j])
    return (out_a, out_b, [i for i in casts_a if i not in set(out_a)],
            [j for j in casts_b if j not in set(out_b)])


def _ref_needs_none(table, rows, leaves):
    keep, skip = [], []
    for i in rows:
        k, m, o = table["kind"][i], table["module"][i], table["op"][i]
        redundant = (k == "module" and m in leaves) or \
            (k == "api" and (o in _VALUE_PRESERVING or (m in leaves and leaves[m] != o))) or \
            (k == "param" and table["role"][i] == "buffer")
        (skip if redundant else keep).append(i)
    return keep, skip


def _reference(a, b, same_framework, mapping=None):
    by_name = same_framework and not mapping
    tensor_a, tensor_b = ~scalar_mask(a["dtype"]), ~scalar_mask(b["dtype"])
    calls = bool((a["kind"] == "module").any()) and bool((b["kind"] == "module").any())
    leaves_a = leaves_b = {}
    if not by_name:
        leaves_a, leaves_b = _leaves_of_either(a, b), _leaves_of_either(b, a)
    keys_a = _ref_keys(a, by_name, None, leaves_a, calls, not same_framework)
    keys_b = _ref_keys(b, by_name, None if by_name else mapping, leaves_b, calls,
                       not same_framework)
    call_cols = ("kind", "prefix", "api", "module", "call_index")
    calls_a = list(zip(*(a[c].tolist() for c in call_cols)))
    calls_b = list(zip(*(b[c].tolist() for c in call_cols)))
    backward_a = [d == "backward" and k in ("api", "module")
                  for k, d in zip(a["kind"].tolist(), a["direction"].tolist())]
    backward_b = [d == "backward" and k in ("api", "module")
                  for k, d in zip(b["kind"].tolist(), b["direction"].tolist())]
    rest_a = [i for i, bw in enumerate(backward_a) if not bw]
    rest_b = [i for i, bw in enumerate(backward_b) if not bw]
    shapes = tuple((lambda t: (lambda i: t["shape"][i][:int(t["ndim"][i])]))(t) for t in (a, b))
    seq_a, seq_b = a["seq"], b["seq"]

    def groups(rows_a, rows_b):
        return _ref_pair_groups(_ref_occurrences(keys_a, seq_a, rows_a),
                                _ref_occurrences(keys_b, seq_b, rows_b), tensor_a, tensor_b,
                                by_name, shapes)

    casts_a = casts_b = []
    if same_framework and "producer" in a and "producer" in b:
        casts_a = [i for i in rest_a if a["op"][i] == CAST]
        casts_b = [i for i in rest_b if b["op"][i] == CAST]
    if casts_a and casts_b:
        rest_a = [i for i in rest_a if i not in set(casts_a)]
        rest_b = [i for i in rest_b if i not in set(casts_b)]
    else:
        casts_a = casts_b = []
    pa, pb, oa, ob = groups(rest_a, rest_b)
    if casts_a:
        ca, cb, left_a, left_b = _ref_casts_by_input(a, b, casts_a, casts_b, calls_a, calls_b,
                                                     pa, pb)
        fa, fb, foa, fob = groups(left_a, left_b)
        pa, pb, oa, ob = pa + ca + fa, pb + cb + fb, oa + foa, ob + fob
    call_of: Dict[Tuple, Tuple] = {}
    for i, j in sorted(zip(pa, pb), key=lambda pair: seq_a[pair[0]]):
        call_of.setdefault(calls_a[i], calls_b[j])
    role_a, arg_a = a["role"].tolist(), a["arg_index"].tolist()
    role_b, arg_b = b["role"].tolist(), b["arg_index"].tolist()
    within_b = _ref_occurrences([(calls_b[i], role_b[i], arg_b[i]) for i in range(len(b))],
                                seq_b, [i for i, bw in enumerate(backward_b) if bw])
    left_a = []
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
    fa, fb, foa, fob = groups(left_a, [i for rows in within_b.values() for i in rows])
    pa, pb, oa, ob = pa + fa, pb + fb, oa + foa, ob + fob
    if same_framework and not by_name:
        key_b = b["arg_key"].tolist()
        scalars_b: Dict[Tuple, int] = {}
        for j in np.nonzero(~tensor_b)[0].tolist():
            if not backward_b[j]:
                scalars_b.setdefault((calls_b[j], role_b[j], arg_b[j], key_b[j]), j)
        for i in np.nonzero(~tensor_a)[0].tolist():
            target = call_of.get(calls_a[i]) if not backward_a[i] else None
            j = scalars_b.pop((target, role_a[i], arg_a[i], a["arg_key"][i]), None) \
                if target is not None else None
            if j is not None:
                pa.append(i)
                pb.append(j)
    sa: List[int] = []
    sb: List[int] = []
    if not by_name:
        oa, sa = _ref_needs_none(a, sorted(oa), leaves_a)
        ob, sb = _ref_needs_none(b, sorted(ob), leaves_b)
    return [np.asarray(v, dtype=np.int64) for v in (pa, pb, sorted(oa), sorted(ob), sorted(sa),
                                                    sorted(sb))]


# ---- random runs -----------------------------------------------------------------------------

_OPS = [("Torch", "matmul", "matmul"), ("Tensor", "add", "add"), ("Tensor", "to", CAST),
        ("Tensor", "float", CAST), ("Tensor", "detach", "copy"), ("Functional", "dropout",
                                                                   "dropout")]
_SHAPES = [(4, 8), (4, 4), (8,), (2, 4, 8)]


def _program(rng):
    """What a run does: per micro-batch the calls of each module, each an op and a shape."""
    blocks = ["enc.l0", "enc.l1", "enc.l1"]       # enc.l1 called twice per micro-batch
    return [[(path, [(_OPS[rng.integers(len(_OPS))], _SHAPES[rng.integers(len(_SHAPES))])
                     for _ in range(rng.integers(1, 6))]) for path in blocks]
            for _ in range(int(rng.integers(1, 3)))]


def _table(program, rng, noise, rename=None, inline_leaf=False):
    """The records of one run of the program, with one run's differences (`noise`: how
    often a call is left out, made twice or an extra cast made)."""
    rows: List[Dict] = []
    counts: Dict[str, int] = {}
    outputs: List[int] = []
    done: List[Tuple] = []
    path_of = (lambda p: rename(p)) if rename else (lambda p: p)

    def record(kind, prefix, api, op, module, direction, role, arg, call, shape, scalar=False,
               producer=-1):
        rows.append(dict(entry=f"{prefix}.{api}.{call}.{direction}", kind=kind, prefix=prefix,
                         api=api, op=op, module=module, direction=direction, role=role,
                         arg_index=arg, arg_key="alpha" if scalar else "", call_index=call,
                         seq=len(rows) + 1, dtype="py.float" if scalar else "float32",
                         shape=shape, producer=producer))
        return len(rows)

    def call(kind, prefix, api, op, module, shape, scalar_arg=False):
        index = counts[f"{prefix}.{api}"] = counts.get(f"{prefix}.{api}", -1) + 1
        producer = outputs[-1 - int(rng.random() < 0.2)] if len(outputs) > 1 else -1
        record(kind, prefix, api, op, module, "forward", "input", 0, index, shape,
               producer=producer)
        if scalar_arg:
            record(kind, prefix, api, op, module, "forward", "input", 1, index, (), True)
        outputs.append(record(kind, prefix, api, op, module, "forward", "output", 0, index,
                              shape))
        done.append((kind, prefix, api, op, module, index, shape))

    for path in ("enc.l0", "enc.l1"):
        record("param", "Param", f"{path}.weight", "weight", path_of(path), "none", "param", 0,
               0, (8, 8))
    record("param", "Param", "enc.l0.mask", "mask", path_of("enc.l0"), "none", "buffer", 0, 0,
           (8,))
    for micro in program:
        call("module", "Module", "Model", "Model", "", (4, 8))
        for path, ops in micro:
            call("module", "Module", "Block", "Block", path_of(path), (4, 8))
            for (prefix, api, op), shape in ops:
                if rng.random() < noise:
                    continue
                for _ in range(2 if rng.random() < noise else 1):
                    call("api", prefix, api, op, path_of(path), shape, rng.random() < 0.2)
                if rng.random() < noise:
                    call("api", "Tensor", "to", CAST, path_of(path), shape)
            if inline_leaf:
                call("api", "Functional", "gelu", "gelu", path_of(path), (4, 8))
            else:
                call("module", "Module", "GELU", "gelu", path_of(path) + ".act", (4, 8))
                call("api", "Functional", "gelu", "gelu", path_of(path) + ".act", (4, 8))
        call("api", "Functional", "cross_entropy", "cross_entropy", "", (4,))
        call("api", "Tensor", "to", CAST, "", (4,))
        for kind, prefix, api, op, module, index, shape in reversed(done):
            if rng.random() < 0.7:
                record(kind, prefix, api, op, module, "backward", "grad_output", 0, index,
                       shape, scalar=rng.random() < 0.05)
                for arg in range(int(rng.integers(1, 3))):
                    record(kind, prefix, api, op, module, "backward", "grad_input", arg,
                           index, shape)
        done.clear()
    for path in ("enc.l0", "enc.l1"):
        record("param_grad", "Param", f"{path}.weight", "weight", path_of(path), "backward",
               "param_grad", 0, 0, (8, 8))
    order = rng.permutation(len(rows)) if rng.random() < 0.3 else np.arange(len(rows))
    rows = [rows[i] for i in order]             # rows stored out of seq order
    columns = {name: np.asarray([r[name] for r in rows])
               for name in rows[0] if name != "shape"}
    columns["arg_index"] = columns["arg_index"].astype(np.int32)
    columns["call_index"] = columns["call_index"].astype(np.int32)
    columns["seq"] = columns["seq"].astype(np.int64)
    columns["producer"] = columns["producer"].astype(np.int64)
    columns["ndim"] = np.asarray([len(r["shape"]) for r in rows], dtype=np.int8)
    shape = np.zeros((len(rows), 8), np.int64)
    for i, r in enumerate(rows):
        shape[i, :len(r["shape"])] = r["shape"]
    columns["shape"] = shape
    return RecordTable(columns)


_MAPPING = {"modules": {"encoder": "enc"}, "ops": {"float": "float"}}


@pytest.mark.parametrize("seed", range(40))
def test_align_gives_what_the_tuple_key_pairing_gave(seed):
    rng = np.random.default_rng(seed)
    program = _program(rng)
    noise = (0.0, 0.1, 0.3)[seed % 3]
    a = _table(program, rng, noise)
    renamed = seed % 4 == 1
    b = _table(program, rng, noise, rename=(lambda p: p.replace("enc", "encoder", 1))
               if renamed else None, inline_leaf=seed % 5 == 2)
    cases = [(True, _MAPPING if renamed else None), (False, _MAPPING if renamed else None),
             (True, {"modules": {"enc.l1": "enc.l1"}, "ops": {}})]
    for same_framework, mapping in cases:
        for x, y in ((a, b), (b, a)):
            got = align(x, y, same_framework, mapping)
            want = _reference(x, y, same_framework, mapping)
            names = ("pairs_a", "pairs_b", "only_a", "only_b", "skipped_a", "skipped_b")
            for name, expected in zip(names, want):
                found = getattr(got, name)
                assert found.dtype == np.int64, name
                assert np.array_equal(found, expected), (same_framework, mapping, name)
            assert len(got.pairs_a) > 0


def test_no_records_pair_nothing():
    rng = np.random.default_rng(0)
    table = _table(_program(rng), rng, 0.0)
    empty = table.select(np.zeros(len(table), bool))
    for x, y in ((table, empty), (empty, table), (empty, empty)):
        for same_framework in (True, False):
            got = align(x, y, same_framework)
            want = _reference(x, y, same_framework)
            for name, expected in zip(("pairs_a", "pairs_b", "only_a", "only_b"), want):
                assert np.array_equal(getattr(got, name), expected), name


def test_codes_are_exact_when_strings_share_a_hash(monkeypatch):
    """Codes of strings come from a hash of each; two strings that share one still get two
    codes (the codes are checked against the strings)."""
    a = np.array(["x.y", "x", "x.y", "", "zz", "x"])
    b = np.array(["zz", "q", "x.y", "x"])
    def equal_codes(found):
        values = a.tolist() + b.tolist()
        joint = np.concatenate(found).tolist()
        return all((values[i] == values[j]) == (joint[i] == joint[j])
                   for i in range(len(values)) for j in range(len(values)))
    assert equal_codes(grouping.codes(a, b))
    assert equal_codes(grouping.codes(a, b, few=True))
    monkeypatch.setattr(grouping, "_hashes", lambda c: np.zeros(len(c), np.uint32))
    assert equal_codes(grouping.codes(a, b))
    found = grouping.codes(a, b)
    assert sorted(set(np.concatenate(found).tolist())) == list(range(5))


def test_group_is_one_code_per_tuple_whatever_the_spans():
    rng = np.random.default_rng(1)
    columns = [rng.integers(-3, 3, 500), rng.integers(0, 1 << 40, 500) // (1 << 36),
               rng.integers(0, 1 << 30, 500) % 7, rng.integers(-(1 << 20), 1 << 20, 500) % 5,
               rng.integers(-(1 << 62), 1 << 62, 500) // (1 << 60)]
    columns.append(np.where(rng.random(500) < 0.5, -(1 << 61), 1 << 61))
    code = grouping.group(*columns)
    tuples = list(zip(*(c.tolist() for c in columns)))
    assert sorted(set(code.tolist())) == list(range(len(set(tuples))))
    for i in range(0, 500, 7):
        for j in range(0, 500, 11):
            assert (tuples[i] == tuples[j]) == (code[i] == code[j])


def test_radix_argsort_is_numpys_stable_argsort():
    rng = np.random.default_rng(2)
    for top in (3, 1 << 16, 1 << 33, 1 << 50):
        values = rng.integers(0, top, 3000) // rng.integers(1, 4, 3000)
        assert np.array_equal(grouping.argsort(values), np.argsort(values, kind="stable"))


def test_leaves_are_the_modules_that_call_their_own_op():
    rng = np.random.default_rng(3)
    table = _table(_program(rng), rng, 0.0)
    assert _leaf_modules(table) == {"enc.l0.act": "gelu", "enc.l1.act": "gelu"}
