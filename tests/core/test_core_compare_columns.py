"""The compare's column paths (issue 50) give what the row-by-row paths gave: the rows of a
judged step made from its columns at once (`judge.row_columns.pair_rows`) equal
`row_reference.pair_row` pair by pair, and the JSON file written by `report.json_out` has the bytes of
`json.dump(result, handle, indent=1, default=str)`."""
from __future__ import annotations

import enum
import io
import json

import numpy as np
import pytest

import synthetic as S
from precdbg.compare import compare_dumps
from precdbg.compare.align.alignment import align
from precdbg.compare.judge.entries import StepCompare
from precdbg.compare.judge.judges import judge_pairs
from precdbg.compare.judge.metrics import tensor_metrics
from precdbg.compare.judge.multistep import NoisePolicy
from precdbg.compare.judge.pairs import PairTable, StepContext
from precdbg.compare.judge.row_columns import finite_list, pair_rows, row_columns
from precdbg.compare.judge.rows import ROW_KEYS
from precdbg.compare.judge.rows import finite_or_none
from precdbg.compare.report.formats import write_json
from precdbg.compare.report.json_out import (dumps_indent1, encode_row_columns, encode_rows,
                                             write_indent1)
from precdbg.compare.report.row_store import RowFacts
from precdbg.storage.reader import open_dump
from row_reference import entries_row_by_row, entry_fields, facts_of_rows, pair_row

VARIANTS = {
    "gelu": dict(gelu_scale=1.01),
    "nan": dict(nan_in_gelu=True),
    "tensor": dict(task="tensor", gelu_grad_scale=1.001),
    "checksum": dict(checksum=True, gelu_swap=True),
    "bf16": dict(dtype="bfloat16", gelu_ulps=2),
    "steps": dict(steps=(0, 1), dw_scale=1.01),
}


def _tables(a_root: str, b_root: str, step: int):
    a, b = open_dump(a_root), open_dump(b_root)
    ta, tb = a.records(step, 0), b.records(step, 0)
    al = align(ta, tb, True, None)
    table = PairTable(ta, tb, al.pairs_a, al.pairs_b)
    stored = (ta["data_offset"][al.pairs_a] >= 0) & (tb["data_offset"][al.pairs_b] >= 0)
    for p, (i, j) in enumerate(zip(al.pairs_a.tolist(), al.pairs_b.tolist())):
        if stored[p]:
            table.tensors[p] = tensor_metrics(a.tensor_at(ta, i), b.tensor_at(tb, j))
    judge_pairs(table, StepContext(step, 0, NoisePolicy(alike=True)))
    return a, b, table


def _judged_steps(tmp_path, changes):
    """The judged pair table of each step of a reference dump against one with `changes`
    (the reference takes the variant's task, checksum, dtype and steps)."""
    base = {k: v for k, v in changes.items() if k in ("task", "checksum", "dtype", "steps")}
    a_root = S.write_dump(tmp_path / "a", **base)
    b_root = S.write_dump(tmp_path / "b", **changes)
    for step in base.get("steps", (0,)):
        a, b, table = _tables(a_root, b_root, step)
        try:
            yield table
        finally:
            a.close()
            b.close()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_rows_from_columns_equal_row_by_row(tmp_path, name):
    for table in _judged_steps(tmp_path, VARIANTS[name]):
        rows = pair_rows(table)
        assert len(rows) == len(table) > 0
        assert rows == [pair_row(table, p) for p in range(len(table))]
        assert [r.as_json() for r in rows] == \
            [pair_row(table, p).as_json() for p in range(len(table))]


def test_finite_list_is_finite_or_none():
    values = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 1e-320, 3.0], dtype=np.float64)
    assert finite_list(values) == [finite_or_none(v) for v in values]
    assert finite_list(values.astype(np.float32)) == \
        [finite_or_none(v) for v in values.astype(np.float32)]


class _Word(str, enum.Enum):
    X = "x"


ODD = {"a": [1, 2.5, float("nan"), float("inf"), -float("inf"), None, True, False, (1, 2), [],
             {}, "\u00e9\n\"\x1b", _Word.X, np.float64(1.5), np.int64(3), object.__new__(object)
             .__class__.__name__, {1: 2, 2.5: 3, True: 4, None: 5}],
       "rows": [{"x": [1, [2, {}]], "y": -0.0}], "c": {}, "d": [{"x": []}], "e": 1e308}


@pytest.mark.parametrize("value", [ODD, [], {}, "s", 1, [1, [2, [3]]], {"rows": []}])
def test_json_bytes_as_json_dump(value):
    expected = json.dumps(value, indent=1, default=str)
    assert dumps_indent1(value) == expected
    out = io.StringIO()
    write_indent1(value, out)
    assert out.getvalue() == expected


def test_compare_json_file_as_json_dump(tmp_path):
    result = compare_dumps(S.write_dump(tmp_path / "a"), S.write_dump(tmp_path / "b",
                                                                      gelu_scale=1.01))
    path = tmp_path / "r.json"
    write_json(result, str(path))
    assert path.read_text(encoding="utf-8") == json.dumps(result, indent=1, default=str)


ENTRY_VARIANTS = dict(VARIANTS, approximate=dict(approximate="tanh"),
                      weight=dict(weight_scale=1.5), data=dict(input_scale=2.0),
                      extra=dict(extra_call=True, gelu_scale=1.01))


@pytest.mark.parametrize("name", sorted(ENTRY_VARIANTS))
def test_entries_and_facts_from_columns_equal_row_by_row(tmp_path, name):
    """StepCompare.add_pairs (rows made only for the pairs that differ) gives the entries and
    differing reads the row-by-row loop gave from every pair's row; RowFacts.of(table) the
    facts of every row; pair_rows of a subset the rows of those pairs."""
    differing = 0
    for table in _judged_steps(tmp_path, ENTRY_VARIANTS[name]):
        rows = pair_rows(table)
        bad = np.nonzero(table.diverged)[0]
        differing += len(bad)
        assert pair_rows(table, bad) == [rows[p] for p in bad.tolist()]
        some = np.arange(0, len(table), 3)
        assert pair_rows(table, some) == [rows[p] for p in some.tolist()]
        assert RowFacts.of(table) == facts_of_rows(rows)
        al = align(table.a, table.b, True, None)
        sc = StepCompare(table.a, table.b, al)
        sc.add_pairs(table, pair_rows(table, bad))
        pairs = list(zip(table.ia.tolist(), table.ib.tolist()))
        expected, reads = entries_row_by_row(table.a, table.b, rows, pairs)
        assert list(sc.entries) == list(expected)
        assert [entry_fields(e) for e in sc.entries.values()] == \
            [entry_fields(e) for e in expected.values()]
        assert [(ev, i, j) for ev, i, j in sc.reads] == reads
        assert sc.entry_of_a == {i: sc.entries[(r.direction, r.name_a)]
                                 for r, (i, _) in zip(rows, pairs)}
    assert differing > 0 or name == "bf16"


@pytest.mark.parametrize("name", sorted(ENTRY_VARIANTS))
def test_row_columns_json_text_equals_the_rows_json(tmp_path, name):
    """The JSON text written from a step's columns (encode_row_columns) is encode_rows of
    every row's dict; RowColumns.dicts() are the rows' as_json()."""
    for table in _judged_steps(tmp_path, ENTRY_VARIANTS[name]):
        columns = row_columns(table)
        dicts = [r.as_json() for r in pair_rows(table)]
        assert columns.dicts() == dicts
        assert encode_row_columns(ROW_KEYS, columns.values, columns.tensors, 2) == \
            encode_rows(dicts, 2)


def test_row_columns_json_text_of_odd_values():
    """Columns of mixed and odd values (NaN, infinities, str enums, numpy scalars, nested
    lists, control characters, -0.0) are written as the standard encoder writes them."""
    keys = ["s", "f", "i", "b", "l", "mixed"]
    columns = [["a\u00e9\n\"\x1b", "", _Word.X], [float("nan"), -0.0, float("inf")],
               [1, -(1 << 70), np.int64(3)], [True, None, False], [[1, 2], [], [[3], 4]],
               [1.5, "x", {"k": [1, {}]}]]
    extra = [None, {"cosine": 1.0, "i": 7}, None]
    dicts = []
    for p in range(3):
        d = dict(zip(keys, (c[p] for c in columns)))
        if extra[p] is not None:
            d.update(extra[p])
        dicts.append(d)
    for level in (1, 2, 3):
        assert encode_row_columns(keys, columns, extra, level) == encode_rows(dicts, level)
    assert "[\n " + encode_row_columns(keys, columns, extra, 1) + "\n]" == \
        json.dumps(dicts, indent=1, default=str)
    assert encode_row_columns(keys, [[] for _ in keys], [], 2) == ""
