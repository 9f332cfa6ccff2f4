"""The leaner reads of a step file (issue 50) give what the plain ones gave: each dataset opened
and read through h5py's low-level API is `ds[()]`, bounded with the same refusals, a file opened
again keeps the attributes read the first time only while it is the same file, and the check's
shortcuts (the optimizer's values judged once, the compute dtypes read column-wise) find what
the plain loops found."""
from __future__ import annotations

import os
import random
import shutil
import types
from typing import Any, Dict, List, Optional, Tuple

import h5py
import numpy as np
import pytest

from precdbg.check import checker as checker_module
from precdbg.check.checker import Checker
from precdbg.check.ops import _FOLLOWING_OPS, compute_dtypes
from precdbg.check.values import _fmt, _nonzero, _same
from precdbg.errors import DumpError
from precdbg.records.precision import is_floating
from precdbg.storage import step_reader
from precdbg.storage.reader import RecordTable, open_dump
from precdbg.storage.step_checks import bounded, bounded_id
from precdbg.storage.step_reader import _dataset, _read_whole

import synthetic as S


def _equal(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.dtype.metadata == y.dtype.metadata and \
        x.shape == y.shape and (x.tolist() == y.tolist() if x.dtype.kind == "O"
                                else x.tobytes() == y.tobytes())


@pytest.fixture(scope="module")
def dump(tmp_path_factory) -> str:
    return S.write_dump(tmp_path_factory.mktemp("lean") / "dump", task="tensor", ranks=(0, 1))


def _step_file(root: str) -> str:
    folder = os.path.join(root, "step0")
    return os.path.join(folder, sorted(os.listdir(folder))[0])


def test_every_dataset_read_lean_is_what_h5py_reads(dump):
    path = _step_file(dump)
    with h5py.File(path, "r") as handle:
        size = os.path.getsize(path)
        for group in ("records", "modules", "stacks"):
            for name, ds in handle[group].items():
                dsid = _dataset(handle[group], name)
                assert dsid is not None, name
                width = ds.shape[1] if len(ds.shape) == 2 else None
                held = bounded_id(dsid, path, name, size, kinds="iufbSO", width=width)
                assert held[0] == ds.shape and held[1] == ds.dtype, name
                assert _equal(_read_whole(dsid, held), ds[()]), name
        # a group, not a dataset: the plain path says what it is
        assert _dataset(handle, "records") is None
        with pytest.raises(KeyError) as lean:       # a missing name: h5py's own error
            _dataset(handle["records"], "no_such_column")
        with pytest.raises(KeyError) as plain:
            handle["records"]["no_such_column"]
        assert str(lean.value) == str(plain.value)


def _bounded_messages(ds: Any, size: int, **limits: Any) -> Tuple[Optional[str], Optional[str]]:
    found: List[Optional[str]] = []
    for check in (lambda: bounded(ds, "f.h5", "x", size, **limits),
                  lambda: bounded_id(ds.id, "f.h5", "x", size, **limits)):
        try:
            check()
            found.append(None)
        except DumpError as exc:
            found.append(str(exc))
    return found[0], found[1]


def test_bounded_id_refuses_what_bounded_refuses(tmp_path):
    path = str(tmp_path / "crafted.h5")
    with h5py.File(path, "w") as handle:
        handle.create_dataset("ints", data=np.arange(10, dtype=np.int64))
        handle.create_dataset("empty", data=np.zeros(0, dtype=np.int32))
        handle.create_dataset("table", data=np.zeros((4, 3), dtype=np.int64))
        handle.create_dataset("text", data=np.array([b"ab", b"c"], dtype="S2"))
        handle.create_dataset("sparse", shape=(1 << 20,), dtype=np.float64)   # never written
        handle.create_dataset("packed", data=np.zeros(1 << 16, dtype=np.uint8),
                              compression="gzip", chunks=(1 << 14,))
    size = os.path.getsize(path)
    cases = [("ints", {}), ("ints", {"rows": 10, "kinds": "iu"}), ("ints", {"rows": 9}),
             ("ints", {"kinds": "f"}), ("ints", {"width": 2}), ("empty", {"rows": 0}),
             ("table", {"width": 3, "rows": 4}), ("table", {"width": 4}), ("table", {}),
             ("text", {"kinds": "S"}), ("text", {"kinds": "iu"}), ("sparse", {}),
             ("packed", {"kinds": "u"}), ("packed", {"kinds": "u", "rows": 1 << 16})]
    with h5py.File(path, "r") as handle:
        for name, limits in cases:
            plain, lean = _bounded_messages(handle[name], size, **limits)
            assert plain == lean, (name, limits)
        assert _bounded_messages(handle["sparse"], size)[0] is not None     # refused
        empty = _dataset(handle, "empty")
        assert _equal(_read_whole(empty, bounded_id(empty, path, "e", size)), handle["empty"][()])


def test_a_file_opened_again_reads_its_attributes_again_only_when_it_changed(dump, tmp_path,
                                                                         monkeypatch):
    root = str(tmp_path / "dump")
    shutil.copytree(dump, root)
    reads: List[str] = []
    plain = step_reader.StepFile._read_attrs

    def counted(self: Any, handle: Any) -> None:
        reads.append(self.path)
        plain(self, handle)
    monkeypatch.setattr(step_reader.StepFile, "_read_attrs", counted)
    d = open_dump(root)
    try:
        sf = d.files(0, 0)[0]
        first = sf.columns()
        d.release(0, 0)
        again = sf.columns()                 # the same file: its attributes as read
        assert len(reads) == 1
        assert set(first) == set(again) and all(_equal(first[k], again[k]) for k in first)
        d.release(0, 0)
        other = d.files(0, 1)[0]
        shutil.copyfile(other.path, sf.path)  # another step or rank's file under its name
        with pytest.raises(DumpError, match="not the step, rank and part its name says"):
            sf.columns()
        assert len(reads) == 2
    finally:
        d.close()


def test_a_damaged_file_is_refused_when_opened_again(dump, tmp_path):
    root = str(tmp_path / "dump")
    shutil.copytree(dump, root)
    d = open_dump(root)
    try:
        sf = d.files(0, 0)[0]
        sf.columns()
        d.release(0, 0)
        with h5py.File(sf.path, "r+") as handle:     # an edit after the seal
            handle["records"]["seq"][0] = 12345
        with pytest.raises(DumpError, match="records/seq does not match the checksum"):
            sf.columns()
    finally:
        d.close()


def test_strings_with_and_without_controls_are_escaped_as_before(dump, tmp_path):
    root = str(tmp_path / "dump")
    shutil.copytree(dump, root)
    path = _step_file(root)
    from precdbg.records.controls import escape_controls
    from precdbg.storage.step_checks import reseal
    with h5py.File(path, "r+") as handle:
        texts = [t.decode() for t in handle["modules"]["path"][()].tolist()]
        stacks = [t.decode() for t in handle["stacks"]["text"][()].tolist()]
        texts[-1] = "a\x1b]0;title\x07\u202e"
        stacks = stacks + ["f.py:1 in g\n\tx\x1b[2J"]
        for group, column, values in (("modules", "path", texts), ("stacks", "text", stacks)):
            del handle[group][column]
            handle[group].create_dataset(column, data=np.array(values, dtype=object),
                                         dtype=h5py.string_dtype("utf-8"))
    reseal(path)
    d = open_dump(path)
    try:
        sf = d.files()[0]
        assert sf.strings("modules", "path") == [escape_controls(t) for t in texts]
        assert sf.strings("stacks", "text") == [escape_controls(t, lines=True) for t in stacks]
        assert sf.strings("modules", "cls") == [
            escape_controls(t) for t in h5py.File(path, "r")["modules"]["cls"].asstr()[()]]
    finally:
        d.close()


# ------------------------------------------------------------------------------ the check
def _plain_pair(self: Checker, k: int, opt_a: Dict[str, Any], opt_b: Dict[str, Any],
                several: bool) -> None:
    """`Checker._optimizer_pair`'s parameter loop as it was: every parameter judged anew."""
    from precdbg.check.values import _HIGH_HYPER, _LOW_HYPER, _names, _per_parameter
    la, lb = self.a.label, self.b.label
    which = f"optimizer {k}" if several else "optimizer"
    per_a, _ = _per_parameter(opt_a)
    per_b, _ = _per_parameter(opt_b)
    common = [n for n in per_a if not n.startswith("<unnamed") and n in per_b]
    keys = sorted({key for n in common for key in per_a[n]} &
                  {key for n in common for key in per_b[n]})
    for key in keys:
        diffs: Dict[Tuple[str, str], List[str]] = {}
        decay_only: Dict[str, List[Tuple[str, Any, Any]]] = {la: [], lb: []}
        for n in common:
            if key not in per_a[n] or key not in per_b[n]:
                continue
            va, vb = per_a[n][key], per_b[n][key]
            if key == "weight_decay" and _nonzero(va) != _nonzero(vb):
                decay_only[la if _nonzero(va) else lb].append((n, va, vb))
                continue
            if not _same(va, vb):
                diffs.setdefault((_fmt(va), _fmt(vb)), []).append(n)
        for label, items in decay_only.items():
            if items:
                names = [n for n, _, _ in items]
                self.add("high", "optimizer_groups", f"{label} {names}", names=names)
        for (va, vb), names in diffs.items():
            severity = "high" if key in _HIGH_HYPER else (
                "low" if key in _LOW_HYPER else "medium")
            self.add(severity, "optimizer", f"{which} {key} {va} {vb} {_names(names)}",
                     va, vb, hyperparameter=key)


def _random_optimizer(rng: random.Random, names: List[str]) -> Dict[str, Any]:
    values = [0.0, 0, 0.01, 0.1, 1e-8, 1e-8 * (1 + 1e-9), float("nan"), True, None, "x",
              [0.9, 0.999], [0.9, 0.99]]
    groups, left = [], list(names)
    rng.shuffle(left)
    while left:
        cut = rng.randint(1, 6)
        params, left = left[:cut], left[cut:]
        hyper: Dict[str, Any] = {}
        for key in ("lr", "weight_decay", "eps", "momentum", "foreach", "betas"):
            if rng.random() < 0.8:
                hyper[key] = rng.choice(values) if key != "betas" else rng.choice(values[-2:])
        if len(params) > 1 and rng.random() < 0.4:     # given per parameter
            hyper["weight_decay"] = [rng.choice(values[:4]) for _ in params]
        groups.append({"params": params, "hyper": hyper})
    return {"class": "AdamW", "param_groups": groups}


def test_the_optimizer_values_judged_once_find_what_judging_each_found():
    rng = random.Random(50)
    side = types.SimpleNamespace(framework="pytorch", module_settings={})
    for trial in range(200):
        names = [f"p{i}" for i in range(rng.randint(1, 12))]
        opt_a, opt_b = _random_optimizer(rng, names), _random_optimizer(rng, names)
        fast = Checker(types.SimpleNamespace(**vars(side), label="A"),
                       types.SimpleNamespace(**vars(side), label="B"))
        slow = Checker(fast.a, fast.b)
        fast._optimizer_pair(0, opt_a, opt_b, False)
        _plain_pair(slow, 0, opt_a, opt_b, False)
        got = [(f["kind"], f["severity"], f.get("names"), f.get("hyperparameter"),
                f["a"], f["b"]) for f in fast.findings if f["kind"] == "optimizer" or
               "weight decay" in f["message"]]
        want = [(f["kind"], f["severity"], f.get("names"), f.get("hyperparameter"),
                 f["a"], f["b"]) for f in slow.findings]
        assert [(g[0], g[1], g[2], g[3]) for g in got] == \
            [(w[0], w[1], w[2], w[3]) for w in want], trial
        assert [(g[4], g[5]) for g in got if g[0] == "optimizer"] == \
            [(w[4], w[5]) for w in want if w[0] == "optimizer"], trial
    assert checker_module._same is _same


def test_compute_dtypes_read_column_wise_are_the_plain_loops(dump):
    d = open_dump(dump)
    try:
        table = d.records(0, 0)
    finally:
        d.close()
    t = table
    from precdbg.records.schema import Direction, RecordKind, Role
    mask = (t["kind"] == RecordKind.API) & (t["direction"] == Direction.FORWARD) & \
        (t["role"] == Role.OUTPUT)
    idx = np.nonzero(mask)[0]
    idx = idx[np.argsort(t["seq"][idx], kind="stable")]
    want: Dict[str, List[Tuple[int, str, str]]] = {}
    for i in idx.tolist():
        op, dtype = str(t["op"][i]), str(t["dtype"][i])
        if op not in _FOLLOWING_OPS and is_floating(dtype):
            want.setdefault(op, []).append((int(t["seq"][i]), dtype, str(t["module"][i])))
    got = compute_dtypes(types.SimpleNamespace(table=table))
    assert got == want and want
    assert all(type(seq) is int and type(dtype) is str and type(module) is str
               for calls in got.values() for seq, dtype, module in calls)
    assert compute_dtypes(types.SimpleNamespace(table=RecordTable({}))) == {}
