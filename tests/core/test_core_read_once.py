"""The quicker paths of reading and judging (issue 50) give what the plain ones gave: the step
file's kept columns (read once for check and compare), rows read column by column, text widened
by numpy, the scalar mask, the rounding floors' sums and `_same`'s shortcut."""
from __future__ import annotations

import math
import random

import numpy as np

from precdbg.check.values import _same
from precdbg.compare.judge.floors import _carried_sums
from precdbg.records.schema import scalar_mask
from precdbg.storage import step_reader
from precdbg.storage.reader import open_dump
from precdbg.storage.step_reader import _text

import synthetic as S


def _equal(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_a_second_read_of_the_columns_is_the_first_ones_and_a_private_copy(tmp_path):
    root = S.write_dump(tmp_path / "dump")
    dump = open_dump(root)
    try:
        sf = dump.files(0, 0)[0]
        sf.columns()
        assert sf._kept is None                # nothing kept unless asked
        first = sf.columns(keep=True)
        assert sf._kept is not None            # kept for the next read
        again = sf.columns()
        assert sf._kept is None                # taken by it
        assert set(first) == set(again)
        for name in first:
            assert _equal(first[name], again[name]), name
            assert not np.shares_memory(first[name], again[name]), name
        # what one reader does with its arrays never reaches the next one
        first["seq"][:] = -7
        first["entry"][:] = "x"
        third = sf.columns(keep=True)          # read again from the file
        fourth = sf.columns()                  # the third's copy
        for name in again:
            assert _equal(again[name], third[name]), name
            assert _equal(again[name], fourth[name]), name
        # step, rank and part follow the file as it is known at each read
        sf.columns(keep=True)
        sf.step = 9
        assert set(sf.columns()["step"].tolist()) == {9}
    finally:
        dump.close()
    assert sf._kept is None


def test_the_kept_columns_stay_within_their_budget(tmp_path, monkeypatch):
    root = S.write_dump(tmp_path / "dump", steps=(0, 1))
    dump = open_dump(root)
    try:
        files = dump.files()
        size = sum(v.nbytes for k, v in files[0].columns().items()
                   if k not in ("step", "rank", "part"))
        monkeypatch.setattr(step_reader, "KEEP_BYTES", size)
        files[0].columns(keep=True)
        files[1].columns(keep=True)
        assert files[0]._kept is not None and files[1]._kept is None
        dump.release_kept()
        assert files[0]._kept is None
        files[1].columns(keep=True)            # the budget is free again
        assert files[1]._kept is not None
        # the check's reads keep, and the compare's next read of the same file takes them
        dump.release_kept()
        dump.records(files[0].step, files[0].rank, keep=True)
        assert files[0]._kept is not None
        dump.records(files[0].step, files[0].rank)
        assert files[0]._kept is None
    finally:
        dump.close()


def test_rows_of_are_the_rows(tmp_path):
    dump = open_dump(S.write_dump(tmp_path / "dump"))
    try:
        table = dump.records(0, 0)
        idx = list(range(0, len(table), 3))
        rows = table.rows_of(idx)
        assert repr(rows) == repr([table.row(i) for i in idx])    # NaN as NaN
        for got, i in zip(rows, idx):          # the same Python types, not only equal values
            want = table.row(i)
            assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
            assert list(got) == list(want)
        assert table.rows_of([]) == []
        plain = {}
        for name, column in table.columns.items():
            value = column[1]
            if name == "shape":
                value = tuple(int(d) for d in value[:int(table.columns["ndim"][1])])
            elif isinstance(value, np.generic):
                value = value.item()
            plain[name] = value
        assert repr(table.row(1)) == repr(plain)
    finally:
        dump.close()


def test_ascii_text_is_widened_as_astype_gives_it():
    columns = [np.array([b"ab", b"a\x00b", b"", b"xyz"], dtype="S3"),
               np.array([b"Functional.linear.0.forward"] * 3, dtype="S40"),
               np.array([b"\x7e"], dtype="S1")]
    for data in columns:
        got = _text(data)
        assert _equal(got, data.astype(str))
    escaped = _text(np.array([b"a\x1bb"], dtype="S3"))
    assert escaped.tolist() == ["a\\x1bb"]


def test_the_scalar_mask_is_np_char_startswith():
    cases = [np.array(["py.int", "float32", "py", "", "py.", "xpy.a", "py.float"]),
             np.array(["ab", "py"]), np.array([], dtype="U6"),
             np.array(["py.int", "f", "py.x"])[::2], np.array(["py.x", "a"], dtype=">U4"),
             np.array([b"py.int", b"int8"])]
    for dtypes in cases:
        got = scalar_mask(dtypes)
        want = [(d.decode() if isinstance(d, bytes) else d).startswith("py.")
                for d in dtypes.tolist()]
        assert got.dtype == np.bool_ and got.tolist() == want, dtypes


def test_carried_sums_are_pythons_sum_to_the_last_bit():
    rng = random.Random(3)
    for _ in range(200):
        carried = [(rng.uniform(0, 1e-3) * 10 ** rng.randint(-8, 2),
                    rng.choice([0.0, rng.uniform(0, 10) * 10 ** rng.randint(-9, 3)]))
                   for _ in range(rng.randint(1, 40))]
        norms = [rng.choice([0.0, rng.uniform(0, 10) * 10 ** rng.randint(-9, 3)])
                 for _ in range(rng.randint(1, 5))]
        want = [sum(fr * (min(1.0, o / nr) if nr > 0.0 else 1.0) for fr, nr in carried)
                for o in norms]
        assert _carried_sums(carried, norms) == want


def _same_long_way(va, vb):
    """`_same` as it was before its shortcut."""
    def number(v):
        return float(v) if isinstance(v, (bool, int, float)) else None
    na, nb = number(va), number(vb)
    if na is not None and nb is not None:
        if math.isnan(na) or math.isnan(nb):
            return math.isnan(na) and math.isnan(nb)
        return abs(na - nb) <= 1e-6 * max(abs(na), abs(nb))
    if isinstance(va, (list, tuple)) and isinstance(vb, (list, tuple)):
        return len(va) == len(vb) and all(_same_long_way(x, y) for x, y in zip(va, vb))
    return va == vb


def test_same_shortcut_agrees_with_the_long_way():
    values = [0.1, 0.1 + 1e-9, 1.0, 1, True, False, 0, 0.0, -0.0, "adam", "Adam", math.inf,
              -math.inf, math.nan, [0.9, 0.999], (0.9, 0.999), [math.inf], [math.nan], None,
              10 ** 20, 1e20, {"a": 1}, 2 ** 70, float(2 ** 70)]
    for va in values:
        for vb in values:
            assert _same(va, vb) == _same_long_way(va, vb), (va, vb)


def test_a_compare_reads_each_step_file_once(tmp_path, monkeypatch):
    """The check's ranks after its first are checked where the compare reads them, and the
    optimizer settings of each step are taken there too: every step file's columns and
    attributes are read once by a compare of three ranks over two steps (that match: the
    verdict's own step is read again for its call site)."""
    from precdbg.compare import compare_dumps
    reads = {"columns": [], "attrs": []}
    read_columns, read_attrs = step_reader.StepFile._read_columns, \
        step_reader.StepFile._read_attrs

    def columns(self):
        reads["columns"].append(self.path)
        return read_columns(self)

    def attrs(self, handle):
        reads["attrs"].append(self.path)
        return read_attrs(self, handle)
    monkeypatch.setattr(step_reader.StepFile, "_read_columns", columns)
    monkeypatch.setattr(step_reader.StepFile, "_read_attrs", attrs)
    base = dict(ranks=(0, 1, 2), steps=(0, 1))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, gelu_ulps=1))
    result = compare_dumps(a, b)
    assert result["verdict"] == "match"
    files = sorted(f"{root}/step{s}/rank{r}.h5" for root in (a, b) for s in (0, 1)
                   for r in (0, 1, 2))
    assert sorted(reads["columns"]) == files
    assert sorted(reads["attrs"]) == files
