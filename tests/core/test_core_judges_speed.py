"""The judges and entries made faster (issue 50) decide exactly as the plain algorithms they
replaced: `rounding_floors` (which visits only the calls a floor can reach), `stat_errors` and
`integer_plumbing` (which map precisions and dtypes per distinct value), and
`StepCompare.add_pairs` (which groups pairs by `call_codes`) against the old code kept here as
references, on randomized record tables (signed zeros, NaN and Inf norms, half precision
dtypes, non-tensor arguments, shared tensors, repeated seqs, entries named alike in two
directions), corner cases (no pair, one, only arguments) and synthetic dumps: the same floats
bit for bit, the same flags, the same entries."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import synthetic as S
from precdbg.compare.align.alignment import align
from precdbg.compare.judge import entries as E
from precdbg.compare.judge import floors as F
from precdbg.compare.judge import metrics as M
from precdbg.compare.judge.pairs import PairTable, StepContext
from precdbg.compare.judge.judges import judge_pairs
from precdbg.compare.judge.multistep import NoisePolicy
from precdbg.compare.judge.row_columns import pair_rows
from precdbg.compare.judge.rows import ArgDiff, Evidence
from precdbg.records.precision import MANTISSA_BITS, is_floating
from precdbg.records.schema import (DTYPE_VALUE, NO_PRODUCER, READ_ROLES, RecordKind, Role,
                                    scalar_mask)
from precdbg.storage.reader import RecordTable, open_dump


# ---------------------------------------------------------------- the old algorithms
def floors_reference(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray
                     ) -> np.ndarray:
    """rounding_floors as it was: every call from the first with a dy and a dx, in order."""
    n = len(ia)
    floor = np.zeros(n, dtype=np.float64)
    if n == 0:
        return floor
    own_column = np.fmax(F._norms(a, ia), F._norms(b, ib))
    own = own_column.tolist()
    roles, seqs = a["role"][ia].tolist(), a["seq"][ia].tolist()
    producers = a["producer"][ia].tolist() if "producer" in a else [NO_PRODUCER] * n
    tensors, ops = a["tensor_id"][ia].tolist(), a["op"][ia].tolist()
    shapes = [tuple(d[:k]) for d, k in zip(a["shape"][ia].tolist(), a["ndim"][ia].tolist())]
    scalar = scalar_mask(b["dtype"][ib]).tolist()
    calls: Dict[Tuple[str, str], List[int]] = {}
    first: Dict[Tuple[str, str], int] = {}
    dy_calls, dx_calls = set(), set()
    for p, key in enumerate(zip(a["direction"][ia].tolist(), a["entry"][ia].tolist())):
        if scalar[p]:
            continue
        if key not in calls:
            calls[key], first[key] = [], seqs[p]
        calls[key].append(p)
        first[key] = min(first[key], seqs[p])
        if roles[p] == Role.GRAD_OUTPUT:
            dy_calls.add(key)
        elif roles[p] == Role.GRAD_INPUT:
            dx_calls.add(key)
    begins = [first[key] for key in dy_calls & dx_calls]
    if not begins:
        return floor
    by_seq: Dict[int, float] = {}
    by_tensor: Dict[int, float] = {}
    floors = [0.0] * n
    for key in sorted(calls, key=first.__getitem__):
        if first[key] < min(begins):
            continue
        carried, dys, writes = [], [], []
        for p in calls[key]:
            if roles[p] not in READ_ROLES:
                writes.append(p)
                continue
            f = max(by_seq.get(producers[p], 0.0), by_tensor.get(tensors[p], 0.0))
            floors[p] = f
            if f > 0.0:
                carried.append((f, own[p]))
            if roles[p] == Role.GRAD_OUTPUT:
                dys.append(p)
        sums = F._carried_sums(carried, [own[p] for p in writes]) if carried and writes \
            else None
        for w, p in enumerate(writes):
            f = sums[w] if sums is not None else 0.0
            if dys and roles[p] == Role.GRAD_INPUT:
                for q in dys:
                    if own[q] > f and F._summed_from(ops[p], shapes[p], shapes[q]):
                        f = own[q]
            t = tensors[p]
            f = max(f, by_tensor.get(t, 0.0))
            floors[p] = f
            if f > 0.0:
                by_seq[seqs[p]] = f
                by_tensor[t] = max(f, by_tensor.get(t, 0.0))
    floor[:] = floors
    return np.where(floor > own_column, floor, 0.0)


def _values(column: np.ndarray, fn: Any, dtype: Any) -> np.ndarray:
    return np.array([fn(v) for v in column.tolist()], dtype=dtype).reshape(-1)


def stat_errors_reference(t: PairTable) -> None:
    """stat_errors as it was: precisions, texts and checksums read pair by pair."""
    a, b, ia, ib = t.a, t.b, t.ia, t.ib
    rms_a = np.abs(a["norm"][ia]) / np.sqrt(np.maximum(a["numel"][ia], 1).astype(np.float64))
    rms_b = np.abs(b["norm"][ib]) / np.sqrt(np.maximum(b["numel"][ib], 1).astype(np.float64))
    scale = np.nan_to_num(np.fmax(rms_a, rms_b), nan=0.0, posinf=0.0)
    t.d_min = M._rel(a["min"][ia], b["min"][ib], np.fmax(np.abs(np.nan_to_num(b["min"][ib])),
                                                         scale))
    t.d_max = M._rel(a["max"][ia], b["max"][ib], np.fmax(np.abs(np.nan_to_num(b["max"][ib])),
                                                         scale))
    t.d_mean = M._rel(a["mean"][ia], b["mean"][ib], scale)
    t.d_pos_mean = M.pos_mean_errors(a, b, ia, ib, scale)
    t.d_norm = M._rel(a["norm"][ia], b["norm"][ib],
                      np.fmax(np.abs(np.nan_to_num(a["norm"][ia])),
                              np.abs(np.nan_to_num(b["norm"][ib]))))

    def carried(table: RecordTable, idx: np.ndarray) -> np.ndarray:
        if "precision" not in table:
            return table["dtype"][idx]
        return np.where(table["precision"][idx] == "", table["dtype"][idx],
                        table["precision"][idx])
    pa, pb = carried(a, ia), carried(b, ib)
    precision = np.where(_values(pa, M._bits, np.int64) < _values(pb, M._bits, np.int64), pa, pb)
    coarse = _values(precision, lambda p: M._bits(p) < MANTISSA_BITS["float32"], bool)
    t.extremes = np.where(coarse, 4.0, 1.0)
    err = M.worst_error(t)
    tol = _values(precision, M.tolerance_of, np.float64)
    t.tol = np.where(b["kind"][ib] == RecordKind.PARAM, np.minimum(tol, M.PARAM_TOLERANCE), tol)
    t.shape_ok = np.all(a["shape"][ia] == b["shape"][ib], axis=1) & (a["ndim"][ia] == b["ndim"][ib])
    t.counts_ok = (a["nan_count"][ia] == b["nan_count"][ib]) & (
        a["inf_count"][ia] == b["inf_count"][ib])
    scalar = scalar_mask(b["dtype"][ib])
    text_ok = a["text"][ia] == b["text"][ib]
    ck_a, ck_b = a["checksum"][ia], b["checksum"][ib]
    t.checksum_equal = (ck_a != "") & (ck_a == ck_b)
    dtype_arg = (a["dtype"][ia] == DTYPE_VALUE) & (b["dtype"][ib] == DTYPE_VALUE) & ~text_ok
    explained = dtype_arg
    if dtype_arg.any():
        floats = np.array([is_floating(x) and is_floating(y) for x, y in
                           zip(a["text"][ia].tolist(), b["text"][ib].tolist())], dtype=bool)
        apart = (pa != pb) & ~scalar
        seq = b["seq"][ib]
        explained = dtype_arg & floats & (seq > seq[apart].min()) if apart.any() \
            else np.zeros_like(dtype_arg)
    t.precision_explained = explained
    text_ok = text_ok | explained
    no_stats = np.isnan(a["min"][ia]) & np.isnan(b["min"][ib]) & np.isnan(a["max"][ia]) & \
        np.isnan(b["max"][ib])
    checksum_only = ~scalar & no_stats & (ck_a != "") & (ck_b != "")
    err = np.where(checksum_only, np.where(t.checksum_equal, 0.0, np.inf), err)
    t.err = np.where(scalar, np.where(text_ok, 0.0, np.inf), err)
    t.diverged = np.where(scalar, ~text_ok, t.differs()) & ~t.checksum_equal
    t.judged_by = np.where(t.checksum_equal | checksum_only, M.CHECKSUM, M.STATISTICS
                           ).astype(object)


def integer_plumbing_reference(t: PairTable) -> None:
    integer = _values(t.a["dtype"][t.ia], M._is_integer, bool) & \
        _values(t.b["dtype"][t.ib], M._is_integer, bool)
    plumbing = t.diverged & integer
    if not plumbing.any() or (t.diverged & ~integer).any():
        return
    t.integer_plumbing = plumbing
    t.decide(plumbing, False, M.INTEGER_PLUMBING)


def entries_reference(ta: RecordTable, tb: RecordTable, t: PairTable, bad_rows: List[Any]
                      ) -> Tuple[Dict[Tuple[str, str], E.Entry], List[Any], Dict[int, Any]]:
    """add_pairs as it was: pair by pair into entries keyed by (direction, baseline name)."""
    ia, ib = t.ia, t.ib
    entries: Dict[Tuple[str, str], E.Entry] = {}
    of_pair: List[E.Entry] = []
    scalar = scalar_mask(tb["dtype"][ib])
    read = np.isin(ta["role"][ia], sorted(r.value for r in READ_ROLES))
    for p, (i, j) in enumerate(zip(ia.tolist(), ib.tolist())):
        key = (str(ta["direction"][i]), str(ta["entry"][i]))
        e = entries.get(key)
        if e is None:
            e = entries[key] = E.Entry(*(ta[c][i].item() for c in (
                "step", "rank", "direction", "kind", "entry")), str(tb["entry"][j]),
                *(ta[c][i].item() for c in ("module", "op", "order", "seq")))
        of_pair.append(e)
        e.seq = min(e.seq, int(ta["seq"][i]))
        if t.diverged[p]:
            e.first_bad = min(e.first_bad, int(ta["seq"][i]))
        if ta["kind"][i] == RecordKind.PARAM and bool(ta["trainable"][i]) != bool(
                tb["trainable"][j]):
            e.trainable_differs = True
        if scalar[p] or t.diverged[p]:
            continue
        if read[p]:
            e.inputs_ok += 1
            same = bool(t.checksum_equal[p]) if ta["checksum"][i] != "" and \
                tb["checksum"][j] != "" else None
            e.reads_agreeing.append((str(ta["role"][i]), int(ta["arg_index"][i]), same,
                                     t.tensors[p] is None))
            err = float(t.err[p])
            err = 0.0 if err != err else min(max(err, -1e308), 1e308)
            if err > e.inputs_ok_err:
                e.inputs_ok_err = err
        else:
            e.outputs_ok += 1
    reads = []
    for p, row in zip(np.nonzero(t.diverged)[0].tolist(), bad_rows):
        e, i, j = of_pair[p], int(ia[p]), int(ib[p])
        if scalar[p]:
            e.args_bad.append(ArgDiff(row.role, row.arg_index, str(ta["arg_key"][i]),
                                      str(ta["text"][i]), str(tb["text"][j])))
            continue
        ev = Evidence.of(row)
        (e.inputs_bad if read[p] else e.outputs_bad).append(ev)
        if read[p] or row.kind == RecordKind.PARAM_GRAD:
            reads.append((ev, i, j))
    return entries, reads, dict(zip(ia.tolist(), of_pair))


# ---------------------------------------------------------------- tables
ROLES = ["input", "output", "grad_input", "grad_output", "param_grad", "param"]
DTYPES = ["float32", "float32", "float16", "bfloat16", "int64", "bool", "py.int", "py.dtype",
          "float8_e4m3fn", "float64", "complex64"]
OPS = ["linear", "addmm", "conv2d", "batch_norm", "add", "mul", "matmul", "cat",
       "layer_norm", "getitem", "sum", "bias_add"]
TEXTS = ["1", "2", "torch.float32", "torch.float16", "torch.bfloat16", "torch.int64"]


@pytest.fixture(scope="module")
def template(tmp_path_factory: Any) -> RecordTable:
    """A real step's table: every column a dump has, with its dtype."""
    root = S.write_dump(tmp_path_factory.mktemp("template"))
    return open_dump(root).records(0, 0)


def _special(rng: np.random.Generator, x: np.ndarray, share: float) -> np.ndarray:
    """`x` with a share of its values 0, -0, NaN, +-Inf."""
    hit = rng.random(len(x)) < share
    x[hit] = rng.choice([0.0, -0.0, np.nan, np.inf, -np.inf], int(hit.sum()))
    return x


def random_tables(template: RecordTable, seed: int, n: int, drop: Tuple[str, ...] = ()
                  ) -> Tuple[RecordTable, RecordTable, np.ndarray, np.ndarray]:
    """A baseline table of `n` random records (calls of a few records, mostly together, some
    named alike in two directions; shapes that a bias, a norm's weight or a broadcast sum
    from dy), a candidate that differs a little or a lot, and pairs of them."""
    rng = np.random.default_rng(seed)
    c = {k: v[rng.integers(0, len(template), n)].copy() for k, v in template.columns.items()}
    ncalls = max(1, n // 3)
    call = np.sort(rng.integers(0, ncalls, n))
    moved = rng.integers(0, n, n // 8)
    call[moved] = rng.integers(0, ncalls, len(moved))
    c["entry"] = np.array([f"Functional.f{k // 2}.0" for k in call.tolist()])
    c["direction"] = np.array(["forward", "backward", "none"])[call % 3]
    c["op"] = np.array(OPS)[rng.integers(0, len(OPS), ncalls)][call]
    c["role"] = rng.choice(ROLES, n)
    c["kind"] = rng.choice(["api", "module", "param", "param_grad"], n)
    c["seq"] = (rng.permutation(2 * n)[:n] if seed % 3 else rng.integers(0, n, n)).astype(np.int64)
    c["tensor_id"] = rng.integers(-1, max(2, n // 2), n)
    c["producer"] = np.where(rng.random(n) < 0.6, c["seq"][rng.integers(0, n, n)], NO_PRODUCER)
    ndim = rng.integers(0, 5, n)
    width = c["shape"].shape[1]
    dims = rng.choice([1, 2, 3, 4, 6], (n, width))
    c["shape"] = np.where(np.arange(width) < ndim[:, None], dims, -1).astype(c["shape"].dtype)
    c["ndim"] = ndim.astype(c["ndim"].dtype)
    c["numel"] = np.where(np.arange(width) < ndim[:, None], dims, 1).prod(axis=1)
    c["dtype"] = rng.choice(DTYPES, n)
    c["precision"] = rng.choice(["", "", "float32", "bfloat16", "float16"], n)
    c["norm"] = _special(rng, rng.lognormal(0, 2, n) * rng.choice([1, 1e-7, 1e-13], n), 0.05)
    for stat in ("min", "max", "mean", "pos_mean"):
        c[stat] = _special(rng, rng.normal(0, 1, n), 0.05)
    c["nan_count"], c["inf_count"] = (rng.random(n) < 0.05).astype(np.int64), np.zeros(n, np.int64)
    c["checksum"] = rng.choice(["", "", "ab12", "ab13"], n)
    scalar = np.char.startswith(c["dtype"], "py.")
    c["text"] = np.where(scalar, rng.choice(TEXTS, n), "")
    c["trainable"] = rng.random(n) < 0.5
    a = {k: v for k, v in c.items() if k not in drop}
    b = {k: v.copy() for k, v in a.items()}
    b["norm"] = b["norm"] * np.where(rng.random(n) < 0.2, rng.normal(1, 0.1, n),
                                     1 + rng.normal(0, 1e-6, n))
    for stat in ("min", "max", "mean"):
        b[stat] = b[stat] * (1 + rng.normal(0, 1e-5, n))
    changed = rng.random(n) < 0.1
    b["text"] = np.where(changed & scalar, rng.choice(TEXTS, n), b["text"])
    b["checksum"] = np.where(changed, rng.choice(["", "ab12", "ab14"], n), b["checksum"])
    b["trainable"] = np.where(changed, ~b["trainable"], b["trainable"])
    if "precision" in b:
        b["precision"] = np.where(rng.random(n) < 0.1, rng.choice(["", "float16"], n),
                                  b["precision"])
    b["nan_count"] = np.where(rng.random(n) < 0.03, 1, b["nan_count"])
    ia = np.sort(rng.permutation(n)[:max(0, n - n // 10)]) if seed % 2 else rng.permutation(n)
    ib = ia.copy() if seed % 4 < 2 else rng.permutation(n)[:len(ia)]
    return RecordTable(a), RecordTable(b), ia.astype(np.int64), ib.astype(np.int64)


# ---------------------------------------------------------------- comparisons
def assert_same_table(x: PairTable, y: PairTable) -> None:
    """Every column equal, floats bit for bit, judged_by by value."""
    for f in dataclasses.fields(PairTable):
        u, v = getattr(x, f.name), getattr(y, f.name)
        if f.name in ("a", "b"):
            continue
        if isinstance(u, np.ndarray):
            assert u.dtype == v.dtype and u.shape == v.shape, f.name
            if u.dtype == object:
                assert u.tolist() == v.tolist(), f.name
            else:
                assert u.tobytes() == v.tobytes(), f.name
        else:
            assert u == v, f.name


def judged_both_ways(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray,
                     monkeypatch: Any) -> Tuple[PairTable, PairTable]:
    new, old = PairTable(a, b, ia, ib), PairTable(a, b, ia, ib)
    M.stat_errors(new)
    F.apply_floors(new)
    M.integer_plumbing(new)
    stat_errors_reference(old)
    with monkeypatch.context() as m:
        m.setattr(F, "rounding_floors", floors_reference)
        F.apply_floors(old)
    integer_plumbing_reference(old)
    return new, old


def entry_state(e: E.Entry) -> Dict[str, Any]:
    return {k: (v.hex() if isinstance(v, float) else v) for k, v in vars(e).items()}


def assert_same_entries(a: RecordTable, b: RecordTable, t: PairTable) -> None:
    al = align(a, b, True, None)
    sc = E.StepCompare(a, b, al)
    bad = np.nonzero(t.diverged)[0]
    sc.add_pairs(t, pair_rows(t, bad))
    entries, reads, entry_of_a = entries_reference(a, b, t, pair_rows(t, bad))
    assert list(sc.entries) == list(entries)
    assert [entry_state(e) for e in sc.entries.values()] == \
        [entry_state(e) for e in entries.values()]
    assert [(vars(ev), i, j) for ev, i, j in sc.reads] == [(vars(ev), i, j) for ev, i, j in reads]
    assert {i: (e.direction, e.name_a) for i, e in sc.entry_of_a.items()} == \
        {i: (e.direction, e.name_a) for i, e in entry_of_a.items()}


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", range(24))
def test_random_tables_judged_and_entered_as_before(template: RecordTable, seed: int,
                                                    monkeypatch: Any) -> None:
    n = [1, 2, 5, 40, 300][seed % 5]
    drop = [(), ("producer",), ("precision",), ("pos_mean",)][seed % 4]
    a, b, ia, ib = random_tables(template, seed, n, drop)
    assert F.rounding_floors(a, b, ia, ib).tobytes() == floors_reference(a, b, ia, ib).tobytes()
    new, old = judged_both_ways(a, b, ia, ib, monkeypatch)
    assert_same_table(new, old)
    if "producer" in a and len(set(a["seq"].tolist())) == len(a):   # pair_rows' producers
        assert_same_entries(a, b, new)


def test_floors_begin_and_travel_as_before(template: RecordTable) -> None:
    """Tables where floors begin often (small dx of dy-sized calls, many shared tensors)."""
    found = 0
    for seed in range(40):
        a, b, ia, ib = random_tables(template, 1000 + seed, 120)
        c = dict(a.columns)
        c["role"] = np.where(np.arange(len(a)) % 2, "grad_output", "grad_input")
        c["tensor_id"] = c["tensor_id"] % 7
        a = RecordTable(c)
        expected = floors_reference(a, b, ia, ib)
        assert F.rounding_floors(a, b, ia, ib).tobytes() == expected.tobytes()
        found += int((expected > 0).sum())
    assert found > 0


@pytest.mark.parametrize("n", [0, 1])
def test_no_pair_and_one_pair(template: RecordTable, n: int, monkeypatch: Any) -> None:
    a, b, _, _ = random_tables(template, 7, 3)
    ia = ib = np.arange(n, dtype=np.int64)
    assert F.rounding_floors(a, b, ia, ib).tobytes() == floors_reference(a, b, ia, ib).tobytes()
    new, old = judged_both_ways(a, b, ia, ib, monkeypatch)
    assert_same_table(new, old)
    assert_same_entries(a, b, new)


def test_only_arguments(template: RecordTable, monkeypatch: Any) -> None:
    a, b, ia, ib = random_tables(template, 11, 30)
    for table in (a, b):
        table.columns["dtype"] = np.array(["py.int", "py.dtype"] * 15)
    new, old = judged_both_ways(a, b, ia, ib, monkeypatch)
    assert_same_table(new, old)
    assert not new.floor.any()


def test_codes_where_hashes_collide(template: RecordTable, monkeypatch: Any) -> None:
    """Keys that share a hash are told apart all the same (the names are read then)."""
    a, b, ia, ib = random_tables(template, 5, 200)
    walk: Dict[Tuple[str, str], int] = {}
    expected = [walk.setdefault(k, len(walk)) for k in
                zip(a["direction"][ia].tolist(), a["entry"][ia].tolist())]
    assert E.call_codes(a, ia).tolist() == expected
    monkeypatch.setattr(E, "string_hashes", lambda column, shift=0: np.zeros(len(column)))
    monkeypatch.setattr(M, "string_hashes", lambda column, shift=0: np.zeros(len(column)))
    monkeypatch.setattr(F, "string_hashes", lambda column, shift=0: np.zeros(len(column)))
    fresh = RecordTable(dict(a.columns, entry=a["entry"].copy()))
    assert E.call_codes(fresh, ia).tolist() == expected
    codes, values = M.distinct(a["dtype"])
    assert [values[k] for k in codes.tolist()] == a["dtype"].tolist()
    assert len(set(values)) == len(values)
    assert F.rounding_floors(fresh, b, ia, ib).tobytes() == \
        floors_reference(fresh, b, ia, ib).tobytes()


@pytest.mark.parametrize("changes", [dict(gelu_scale=1.01), dict(nan_in_gelu=True),
                                     dict(dtype="bfloat16", gelu_ulps=2),
                                     dict(dtype="float16", gelu_grad_scale=1.001),
                                     dict(checksum=True, gelu_swap=True),
                                     dict(steps=(0, 1), dw_scale=1.01)])
def test_synthetic_dumps(tmp_path: Any, changes: Dict[str, Any], monkeypatch: Any) -> None:
    base = {k: v for k, v in changes.items() if k in ("checksum", "dtype", "steps")}
    a_dump = open_dump(S.write_dump(tmp_path / "a", **base))
    b_dump = open_dump(S.write_dump(tmp_path / "b", **changes))
    for step in a_dump.steps:
        a, b = a_dump.records(step, 0), b_dump.records(step, 0)
        al = align(a, b, True, None)
        new, old = judged_both_ways(a, b, al.pairs_a, al.pairs_b, monkeypatch)
        assert_same_table(new, old)
        judged = PairTable(a, b, al.pairs_a, al.pairs_b)
        judge_pairs(judged, StepContext(step, 0, NoisePolicy(alike=True)))
        assert_same_entries(a, b, judged)
