"""judge.structure's `structural_differences` (with `_side`, `_call_arguments`), judge.inert's
`calls_changing_no_number` and judge.unfinished's `unfinished_step`, computed column by column,
give exactly what the record-by-record algorithms they replaced gave (kept below as plain
references), on randomized record tables and synthetic dumps: recursion, interrupted steps,
unfinished calls, orders shared by two entries, ties in seq, rows out of seq order, NaN and Inf
settings, level api, renamed modules, empty and one-record tables."""
from __future__ import annotations

import itertools
from typing import Dict, List

import numpy as np
import pytest

from precdbg.compare.align.alignment import align, rename_module
from precdbg.compare.judge import structure as S
from precdbg.compare.judge import unfinished as U
from precdbg.compare.judge.inert import calls_changing_no_number
from precdbg.compare.judge.unfinished import unfinished_step
from precdbg.records.layers import SettingDifference, same_setting
from precdbg.records.naming import is_known_op
from precdbg.records.schema import scalar_mask
from precdbg.storage.common_records import common_records
from precdbg.storage.reader import RecordTable, open_dump

import synthetic as SYN


# ------------------------------------------------------------------ the references (old code)
def ref_inert(table):
    if "producer" not in table:
        return set()
    kind, direction, role, order, dtype = (table[n] for n in ("kind", "direction", "role",
                                                               "order", "dtype"))
    forward_api = (kind == "api") & (direction == "forward")
    outputs = forward_api & (role == "output") & ~scalar_mask(dtype)
    out_orders = order[outputs]
    read = np.isin(table["seq"][outputs], table["producer"])
    live = set(out_orders[read].tolist()) | set(order[(kind == "api")
                                                      & (direction != "forward")].tolist())
    knows = "tensor_id" not in table or bool((table["tensor_id"] >= 0).any())
    skip = set(out_orders.tolist()) - live if knows else set()
    integer = {"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"}
    skip |= set(out_orders.tolist()) - {o for o, d in zip(out_orders.tolist(),
                                                          dtype[outputs].tolist())
                                        if str(d) not in integer}
    casts = outputs & (table["op"] == "cast")
    if casts.any():
        first = forward_api & (role == "input") & (table["arg_index"] == 0)
        had = dict(zip(order[first].tolist(), dtype[first].tolist()))
        skip |= {o for o, d in zip(order[casts].tolist(), dtype[casts].tolist())
                 if had.get(o) == d}
    joins = outputs & np.isin(table["op"], ["cat", "concat", "concatenate", "stack"])
    if joins.any():
        inputs = forward_api & (role == "input") & ~scalar_mask(dtype)
        nonempty = [o for o, n in zip(order[inputs].tolist(), table["numel"][inputs].tolist())
                    if n > 0]
        skip |= {o for o in order[joins].tolist() if nonempty.count(o) == 1}
    return skip


def ref_side(table, by_name, modules, apis=True, interrupted=False, api_level=False):
    forward, kind = table["direction"] == "forward", table["kind"]
    idx = np.nonzero(forward & (((kind == "api") & apis) | (kind == "module")))[0]
    idx = idx[np.argsort(table["seq"][idx], kind="stable")]
    path_of = (lambda p: rename_module(p, modules)) if modules else (lambda p: p)
    inert = ref_inert(table)
    found: Dict[str, Dict[str, S._Module]] = {}
    spans: Dict[str, Dict[str, List[int]]] = {}
    kinds, entries, mods, ops, api, prefixes, seqs, orders = (
        table[n][idx].tolist() for n in ("kind", "entry", "module", "op", "api", "prefix",
                                         "seq", "order"))
    for k, kind_k in enumerate(kinds):
        if kind_k != "module":
            continue
        path, entry, seq = path_of(mods[k]), entries[k], seqs[k]
        span = spans.setdefault(path, {}).setdefault(entry, [seq, seq])
        span[0], span[1] = min(span[0], seq), max(span[1], seq)
        if entry not in found.setdefault(path, {}):
            found[path][entry] = S._Module(entry, api[k], ops[k], seq, orders[k])
    if api_level:
        named = set()
        for k in range(len(idx)):
            path, seq = path_of(mods[k]), seqs[k]
            if not path:
                continue
            span = spans.setdefault(path, {}).setdefault(path, [seq, seq])
            span[0], span[1] = min(span[0], seq), max(span[1], seq)
            if path not in found:
                found[path] = {path: S._Module(entries[k], "", "", seq, orders[k])}
            if path not in named and ops[k] not in S._NOT_STRUCTURE:
                named.add(path)
                found[path][path].entry = entries[k]
    if interrupted and len(idx):
        returned = {e for e, k, r in zip(entries, kinds, table["role"][idx].tolist())
                    if k == "module" and r == "output"}
        for path, calls in found.items():
            for entry, call in calls.items():
                if entry not in returned:
                    call.finished = False
                    spans[path][entry][1] = max(seqs)

    def running(path, seq):
        best = None
        for entry, (lo, hi) in spans.get(path, {}).items():
            if lo <= seq <= hi and (best is None or lo > spans[path][best][0]):
                best = entry
        return found[path][best] if best is not None else None

    seen = set()
    for k, entry in enumerate(entries):
        if entry in seen:
            continue
        seen.add(entry)
        path, seq = path_of(mods[k]), seqs[k]
        if kinds[k] == "module":
            caller = running(path.rpartition(".")[0], seq) if path else None
            if caller is not None:
                caller.calls.append((seq, f"{path.rpartition('.')[2]}:{api[k]}"))
        elif ops[k] not in S._NOT_STRUCTURE and (orders[k] not in inert or ops[k] == "cast"):
            caller = running(path, seq)
            if caller is not None:
                caller.calls.append((seq, f"{prefixes[k]}.{api[k]}" if by_name else ops[k]))
                if orders[k] in inert:
                    caller.no_op_casts.add(seq)
    return {path: sorted(calls.values(), key=lambda m: m.seq) for path, calls in found.items()}


def ref_arguments(table, path_of):
    kind, role, dtype = table["kind"], table["role"], table["dtype"]
    idx = np.nonzero((kind == "api") & (table["direction"] == "forward") & (role == "input")
                     & np.isin(dtype, list(S._SETTING_TYPES)))[0]
    out = {}
    for i in idx.tolist():
        key, op = str(table["arg_key"][i]), str(table["op"][i])
        if not key or key.isdigit() or key in S._NOT_SETTINGS or op in S._NOT_STRUCTURE \
                or op == "cast":
            continue
        try:
            value = S._SETTING_TYPES[str(dtype[i])](str(table["text"][i]))
        except ValueError:
            continue
        out[(path_of(str(table["module"][i])), str(table["entry"][i]), key)] = (
            str(table["api"][i]), op, value)
    return out


def ref_argument_differences(ta, tb, modules=None):
    if not len(ta) or not len(tb):
        return []
    args_b = ref_arguments(tb, (lambda p: rename_module(p, modules)) if modules else str)
    out, seen = [], set()
    for (path, entry, key), (api, op, va) in ref_arguments(ta, str).items():
        other = args_b.get((path, entry, key))
        if other is None or same_setting(va, other[2]):
            continue
        setting = f"{api}({key}=)"
        if (path, setting, va, other[2]) in seen:
            continue
        seen.add((path, setting, va, other[2]))
        out.append(SettingDifference(path, path, api, other[0], op, setting, va, other[2],
                                     call=True))
    return out


def ref_calls_compared(calls_a, calls_b):
    if len(calls_a) == len(calls_b):
        for ma, mb in zip(calls_a, calls_b):
            if S._apart(ma.labels_and_no_ops(), mb.labels_and_no_ops()):
                return ma, mb, ma.labels, mb.labels
        return calls_a[0], calls_b[0], calls_a[0].labels, calls_a[0].labels
    la = [c for m in calls_a for c in m.labels_and_no_ops()]
    lb = [c for m in calls_b for c in m.labels_and_no_ops()]
    if not S._apart(la, lb):
        la = lb = []
    return calls_a[0], calls_b[0], [x for x, no in la if not no], [x for x, no in lb if not no]


def ref_structural(ta, tb, step, rank, same_framework, mapping=None, settings=(),
                   unobserved=(), interrupted=(False, False)):
    if not len(ta) or not len(tb):
        return []
    modules = (mapping or {}).get("modules") or None
    calls = ref_argument_differences(ta, tb, modules) if same_framework else []
    calls = [c for c in calls if not any(s.path_a == c.path_a and same_setting(s.a, c.a)
                                         and same_setting(s.b, c.b) for s in settings)]
    by_module: Dict[str, list] = {}
    for difference in list(settings) + calls:
        by_module.setdefault(difference.path_a, []).append(difference)
    apis = bool((ta["kind"] == "api").any()) and bool((tb["kind"] == "api").any())
    api_level = apis and not (ta["kind"] == "module").any() \
        and not (tb["kind"] == "module").any()
    mods_a = ref_side(ta, same_framework, None, apis, interrupted[0], api_level)
    mods_b = ref_side(tb, same_framework, modules, apis, interrupted[1], api_level)
    out = []
    for path, calls_a in mods_a.items():
        calls_b = mods_b.get(path)
        if not calls_b:
            continue
        if interrupted[1] and len(calls_b) < len(calls_a):
            calls_a = calls_a[:len(calls_b)]
        if interrupted[0] and len(calls_a) < len(calls_b):
            calls_b = calls_b[:len(calls_a)]
        ma, mb, seq_a, seq_b = ref_calls_compared(calls_a, calls_b)
        hidden = any(path == u or path.startswith(u + ".") or u == "" for u in unobserved)
        if not all(m.finished for m in calls_a + calls_b):
            seq_a = seq_a[:len(seq_b)] if not calls_b[-1].finished else seq_a
            seq_b = seq_b[:len(seq_a)] if not calls_a[-1].finished else seq_b
        calls_differ = same_framework and seq_a != seq_b and not hidden
        known = is_known_op(ma.op) and is_known_op(mb.op)
        class_differs = (ma.op != mb.op and known) or \
            (same_framework and ma.cls != mb.cls and (calls_differ or known))
        changed = by_module.get(path, [])
        if class_differs or calls_differ or changed:
            first = calls_a[0].labels_and_no_ops()
            repeated = len(calls_a) != len(calls_b) and \
                not any(S._apart(first, m.labels_and_no_ops()) for m in calls_a + calls_b)
            out.append(S.StructuralDiff(step, rank, path, ma.entry, mb.entry, ma.cls, mb.cls,
                                        ma.op, seq_a if calls_differ else [],
                                        seq_b if calls_differ else [], ma.seq, ma.order,
                                        list(changed),
                                        (len(calls_a), len(calls_b)) if repeated else None))
    out.sort(key=lambda d: d.seq)
    return S._outermost_first_only(out)


def ref_module_calls(table, path_of):
    out = {}
    if not len(table):
        return out
    idx = np.nonzero((table["kind"] == "module") & (table["direction"] == "forward"))[0]
    idx = idx[np.argsort(table["seq"][idx], kind="stable")]
    calls, first, returned = {}, {}, set()
    for entry, module, role, seq in zip(*(table[n][idx].tolist()
                                          for n in ("entry", "module", "role", "seq"))):
        if entry not in first:
            first[entry] = seq
            calls.setdefault(path_of(module), []).append(entry)
        if role == "output":
            returned.add(entry)
    for path, listed in calls.items():
        for k, entry in enumerate(listed):
            out[(path, k)] = (entry, first[entry], entry in returned)
    return out


# ------------------------------------------------------------------ random record tables
_OPS = ["linear", "gelu", "add", "mul", "view", "reshape", "zeros", "cast", "cat", "softmax",
        "layer_norm", "dropout", "matmul", "contiguous", "arange"]
_CLASSES = ["Linear", "GELU", "LayerNorm", "Dropout", "Block", "Attention", "Embedding"]
_DTYPES = ["float32", "float32", "bfloat16", "int64", "bool"]
_COLUMNS = ("entry", "kind", "prefix", "api", "op", "module", "direction", "role", "order",
            "seq", "dtype", "arg_index", "arg_key", "numel", "producer", "tensor_id", "text")


class _Run:
    """A forward pass of a random module tree, recorded as the capture records it."""

    def __init__(self, rng: np.random.Generator, shared_orders: bool) -> None:
        self.rng, self.rows, self.seq, self.order = rng, [], 0, 0
        self.shared = shared_orders          # some calls share an order (not what a capture does)
        self.count: Dict[str, int] = {}

    def _row(self, **fields) -> None:
        self.seq += int(self.rng.random() > 0.03)           # a few ties in seq
        row = {"arg_index": 0, "arg_key": "", "numel": 4, "producer": -1, "tensor_id": 0,
               "text": "", "direction": "forward", "dtype": "float32", "seq": self.seq}
        row.update(fields)
        self.rows.append(row)

    def _next_order(self) -> int:
        if not (self.shared and self.rng.random() < 0.2):
            self.order += 1
        return self.order

    def api_call(self, module: str) -> None:
        rng, op = self.rng, str(self.rng.choice(_OPS))
        k = self.count[op] = self.count.get(op, -1) + 1
        entry, order = f"Functional.{op}.{k}.forward", self._next_order()
        common = dict(entry=entry, kind="api", prefix="Functional", api=op, op=op,
                      module=module, order=order)
        self._row(**common, role="input", dtype=str(rng.choice(_DTYPES)),
                  producer=int(rng.integers(-1, max(self.seq, 1))),
                  numel=int(rng.integers(0, 2)) * 4)
        if rng.random() < 0.5:
            self._row(**common, role="input", arg_index=1, numel=int(rng.integers(0, 2)))
        if rng.random() < 0.4:
            kind_of = str(rng.choice(["py.float", "py.bool", "py.str", "py.int"]))
            text = str(rng.choice(["0.5", "nan", "inf", "-inf", "True", "x", "oops", "2"]))
            self._row(**common, role="input", arg_index=2, dtype=kind_of, text=text,
                      arg_key=str(rng.choice(["scale", "eps", "inplace", "p", "1", ""])))
        self._row(**common, role="output", dtype=str(rng.choice(_DTYPES)))
        if rng.random() < 0.3:
            self._row(**common, role="grad_input", direction="backward")

    def module_call(self, path: str, depth: int, cut: List[int]) -> None:
        rng = self.rng
        cls = str(rng.choice(_CLASSES))
        k = self.count[path] = self.count.get(path, -1) + 1
        entry = f"Module.{path}.{cls}.forward.{k}" if path else f"Module.Net.forward.{k}"
        common = dict(entry=entry, kind="module", prefix="Module", api=cls, op=cls.lower(),
                      module=path, order=self._next_order())
        self._row(**common, role="input")
        for _ in range(int(rng.integers(0, 5))):
            if cut[0] <= 0:
                return                           # the step stopped here: no output record
            cut[0] -= 1
            choice = rng.random()
            if choice < 0.55 or depth > 3:
                self.api_call(path)
            elif choice < 0.65 and path:
                self.module_call(path, depth + 1, cut)          # recursion: itself again
            else:
                name = f"{path}.m{int(rng.integers(0, 3))}".lstrip(".")
                self.module_call(name, depth + 1, cut)
        if rng.random() < 0.95:                 # a module returning no float: no output
            self._row(**common, role="output")


def random_table(seed: int, shared_orders: bool = False, stop: int = 10 ** 6,
                 level: str = "mix") -> RecordTable:
    rng = np.random.default_rng(seed)
    run = _Run(rng, shared_orders)
    cut = [stop]
    for _ in range(int(rng.integers(1, 3))):
        run.module_call("", 0, cut)
    if rng.random() < 0.5:
        run.api_call("")                        # the loss, outside the model
    rows = [r for r in run.rows if r["kind"] != {"api": "module", "module": "api"}.get(level)]
    if rng.random() < 0.3:                      # rows out of seq order
        rows = [rows[i] for i in rng.permutation(len(rows))]
    no_ids = rng.random() < 0.2                 # msprobe's: no tensor identities
    rows = [{**r, "tensor_id": -1} if no_ids else r for r in rows]
    columns = {n: np.array([r[n] for r in rows]) if rows else np.zeros(0, "U1")
               for n in _COLUMNS}
    return RecordTable({**columns, **{n: columns[n].astype(np.int64) for n in (
        "order", "seq", "arg_index", "numel", "producer", "tensor_id")}})


def _variant(table: RecordTable, seed: int) -> RecordTable:
    """b: a's records, the same or with a few changes (an op, a class, a setting, a call cut)."""
    rng = np.random.default_rng(seed)
    columns = {n: c.copy() for n, c in table.columns.items()}
    n = len(table)
    for _ in range(int(rng.integers(0, 3)) if n else 0):
        i = int(rng.integers(0, n))
        name = str(rng.choice(["op", "api", "text", "dtype", "module"]))
        column = columns[name].astype(object)
        column[i] = str(rng.choice(["gelu", "tanh", "0.25", "int64", "m1", "Linear"]))
        columns[name] = column.astype(str)
    if n and rng.random() < 0.2:
        keep = np.sort(rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False))
        columns = {k: c[keep] for k, c in columns.items()}
    if rng.random() < 0.2:                      # the same values, wider str columns
        columns["entry"] = columns["entry"].astype("U90")
    floats = np.nonzero(columns["dtype"] == "py.float")[0]
    if len(floats) and rng.random() < 0.5:      # a float keyword argument given otherwise
        text = columns["text"].astype(object)
        text[int(rng.choice(floats))] = "0.75"
        columns["text"] = text.astype(str)
    return RecordTable(columns)


def _side_facts(found) -> list:
    return [(path, m.entry, m.cls, m.op, m.seq, m.order, list(m.calls), sorted(m.no_op_casts),
             m.finished, [type(x) for x in (m.seq, m.order, m.entry, m.cls, m.op)])
            for path, calls in found.items() for m in calls]


_SEEDS = range(70)
_MODULES = {"m0": "renamed", "m1.m2": "m1"}


@pytest.mark.parametrize("seed", _SEEDS)
def test_calls_changing_no_number_as_before(seed):
    table = random_table(seed, shared_orders=seed % 3 == 0)
    found = calls_changing_no_number(table)
    assert found == ref_inert(table) and all(type(o) is int for o in found)


@pytest.mark.parametrize("seed", _SEEDS)
def test_each_modules_calls_as_before(seed):
    level = ("mix", "mix", "api", "module")[seed % 4]
    table = random_table(seed, shared_orders=seed % 3 == 0, level=level,
                         stop=10 ** 6 if seed % 5 else 6)
    for by_name, modules, interrupted, (apis, api_level) in itertools.product(
            (True, False), (None, _MODULES), (False, True),
            ((True, False), (False, False), (True, level == "api"))):
        args = (table, by_name, modules, apis, interrupted, api_level)
        assert _side_facts(S._side(*args)) == _side_facts(ref_side(*args))


def _settings(table: RecordTable, seed: int) -> list:
    """A layer setting apart (NaN in b) in one of the table's modules, for odd seeds none."""
    paths = sorted(set(table["module"].tolist()))[seed % 7:][:1 - seed % 2]
    return [SettingDifference(p, p, "Linear", "Linear", "linear", "eps", 1e-5, float("nan"))
            for p in paths]


@pytest.mark.parametrize("seed", _SEEDS)
def test_structural_differences_as_before(seed):
    level = ("mix", "mix", "mix", "api", "module")[seed % 5]
    ta = random_table(seed, shared_orders=seed % 4 == 0, level=level)
    tables = [ta, _variant(ta, seed), _variant(ta, seed + 1000),
              random_table(seed + 1, level=level, stop=10 ** 6 if seed % 3 else 8)]
    for tb in tables:
        for same_framework, mapping, interrupted, (settings, unobserved) in itertools.product(
                (True, False), (None, {"modules": _MODULES}),
                ((False, False), (True, False), (False, True), (True, True)),
                (([], ()), (_settings(ta, seed), ("m1",)))):
            args = (seed, 0, same_framework, mapping, settings, unobserved, interrupted)
            assert repr(S.structural_differences(ta, tb, *args)) == \
                repr(ref_structural(ta, tb, *args))
        assert repr(S.argument_differences(ta, tb, _MODULES)) == \
            repr(ref_argument_differences(ta, tb, _MODULES))


def test_the_random_tables_differ_often():
    """The comparisons above are of differences, not only of empty lists."""
    found = [S.structural_differences(random_table(seed), _variant(random_table(seed), seed),
                                      0, 0, True) for seed in _SEEDS]
    assert sum(bool(f) for f in found) >= 10
    assert any(d.calls_a for f in found for d in f) and any(d.settings for f in found for d in f)


@pytest.mark.parametrize("seed", _SEEDS)
def test_unfinished_step_as_before(seed):
    rng = np.random.default_rng(seed)
    ta = random_table(seed, shared_orders=seed % 4 == 0)
    tb = random_table(seed, shared_orders=seed % 4 == 0, stop=int(rng.integers(0, 12)))
    for table in (ta, tb):
        for rename in (str, lambda p: rename_module(p, _MODULES)):
            assert list(U._module_calls(table, rename).items()) == \
                list(ref_module_calls(table, rename).items())
    cases = []
    for share in (1.0, 0.7, 0.0):      # some rows paired, the others without counterpart
        k = int(min(len(ta), len(tb)) * share)
        pairs = [np.sort(rng.choice(len(t), size=k, replace=False)) for t in (ta, tb)]
        cases.append((*pairs, *(np.setdiff1d(np.arange(len(t)), p)
                                for t, p in zip((ta, tb), pairs))))
    cases.append((np.arange(min(len(ta), len(tb))), np.arange(min(len(ta), len(tb))),
                  np.zeros(0, np.int64), np.zeros(0, np.int64)))
    for case, interrupted, rename in itertools.product(
            cases, ((False, False), (True, False), (False, True)),
            (None, lambda p: rename_module(p, _MODULES))):
        _unfinished_as_before(ta, tb, case, seed, 0, interrupted, rename)


def _unfinished_as_before(ta: RecordTable, tb: RecordTable, case: tuple, *args) -> None:
    got = unfinished_step(ta, tb, *case, *args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(U, "_module_calls", ref_module_calls)
        assert repr(got) == repr(unfinished_step(ta, tb, *case, *args))


def test_a_cast_whose_order_two_calls_share_reads_its_last_first_input():
    rows = [("input", "float32"), ("input", "bfloat16"), ("output", "bfloat16")]
    table = RecordTable({**{n: np.array([""] * 3) for n in _COLUMNS},
                         "kind": np.array(["api"] * 3), "direction": np.array(["forward"] * 3),
                         "role": np.array([r for r, _ in rows]), "op": np.array(["cast"] * 3),
                         "dtype": np.array([d for _, d in rows]), "order": np.ones(3, np.int64),
                         "seq": np.arange(3), "arg_index": np.zeros(3, np.int64),
                         "numel": np.full(3, 4), "producer": np.array([-1, -1, 9]),
                         "tensor_id": np.zeros(3, np.int64)})
    assert calls_changing_no_number(table) == ref_inert(table) == {1}


def test_empty_and_one_record_tables():
    empty = random_table(0).select(np.zeros(0, np.int64))
    one = random_table(0).select(np.array([0]))
    for ta in (empty, one):
        for tb in (empty, one):
            args = (0, 0, True, None, [], (), (True, False))
            assert repr(S.structural_differences(ta, tb, *args)) == \
                repr(ref_structural(ta, tb, *args))
        args = (ta, True, None, True, True)
        assert calls_changing_no_number(ta) == ref_inert(ta)
        assert _side_facts(S._side(*args)) == _side_facts(ref_side(*args))


# ------------------------------------------------------------------ synthetic dumps
_DUMPS = {"base": {}, "extra": {"extra_call": True}, "tanh": {"approximate": "tanh"},
          "module": {"level": "module"}, "stop": {"stop_in": "act"},
          "interrupted": {"stop_in": "fc2", "interrupted": True}}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("structure_columns")
    return {name: open_dump(SYN.write_dump(root / name, **changes))
            for name, changes in _DUMPS.items()}


@pytest.mark.parametrize("name", [n for n in _DUMPS if n != "base"])
def test_synthetic_dumps_as_before(dumps, name):
    a, b = dumps["base"], dumps[name]
    for x, y in ((a, b), (b, a), (a, a)):
        ta, tb, _ = common_records(x, x.records(0, 0), y, y.records(0, 0), 0, 0)
        assert calls_changing_no_number(ta) == ref_inert(ta)
        al = align(ta, tb, True, None)
        for interrupted in ((False, False), (False, True), (True, False)):
            for same_framework in (True, False):
                args = (0, 0, same_framework, None, [], (), interrupted)
                assert repr(S.structural_differences(ta, tb, *args)) == \
                    repr(ref_structural(ta, tb, *args))
            _unfinished_as_before(ta, tb, (al.pairs_a, al.pairs_b, al.only_a, al.only_b), 0, 0,
                                  interrupted)
