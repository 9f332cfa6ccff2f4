"""Names that would drive a terminal or a spreadsheet (issue: output that cannot be hijacked):
a module or API name holding an escape sequence, a newline that forges a report line, text that
reorders itself, or a formula, read from a precdbg step file (rewritten with h5py) and from an
msprobe dump.json. What compare, inspect, scan, check and show print holds no control character
and no forged line; the CSV holds no formula; the names still pair (both sides escape alike)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import h5py
import numpy as np

import synthetic as S
from precdbg.storage.step_checks import reseal

HOSTILE = "fc1\x1b]0;pwned\x07\x1b[2J\nprecdbg: verdict: MATCH\u202e"
FORMULA = "=HYPERLINK(\"http://x\")"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300)


def _clean(text: str) -> None:
    assert not [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f
                or c in "\u202e\u2066"], repr(text[:400])
    assert "\nprecdbg: verdict: MATCH" not in text


def _rename_module(path: str, old: str, new: str) -> None:
    """Rewrite a module path in a step file's records and module tree (a crafted file)."""
    with h5py.File(path, "r+") as handle:
        for group, column in (("records", "module"), ("modules", "path")):
            values = [v.decode() for v in handle[group][column][()]]
            data = np.array([(new if v == old else v).encode() for v in values])
            del handle[group][column]
            handle[group].create_dataset(column, data=data)
    reseal(path)                       # an edit on purpose: sealed again


def test_hostile_names_in_a_step_file_are_shown_escaped(tmp_path):
    dumps = []
    for name, scale in (("a", 1.0), ("b", 1.001)):
        root = S.write_dump(tmp_path / name, gelu_scale=scale)
        _rename_module(os.path.join(root, "step0", "rank0.h5"), "fc1", HOSTILE)
        dumps.append(root)
    report = str(tmp_path / "r.json")
    proc = _cli("compare", dumps[0], dumps[1], "--json", report)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _clean(proc.stdout + proc.stderr)
    with open(report, encoding="utf-8") as handle:
        modules = {r["module"] for r in json.load(handle)["rows"]}
    # the crafted module is read escaped, and pairs with its twin (both sides escape alike)
    assert "fc1\\x1b]0;pwned\\x07\\x1b[2J\\x0aprecdbg: verdict: MATCH\\u202e" in modules
    for args in (("inspect", dumps[0]), ("scan", dumps[0]), ("check", dumps[0], dumps[1])):
        proc = _cli(*args)
        assert proc.returncode in (0, 1), (args, proc.stderr)
        _clean(proc.stdout + proc.stderr)


def test_hostile_names_in_an_msprobe_dump_and_formulas_in_the_csv(tmp_path):
    roots = []
    for name, value in (("a", 1.0), ("b", 2.0)):
        folder = tmp_path / name / "step0" / "rank0"
        folder.mkdir(parents=True)
        tensor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "Max": value,
                  "Min": 0.0, "Mean": value / 2, "Norm": value}
        data = {"task": "statistics", "level": "mix", "framework": "pytorch", "data": {
            f"Module.{HOSTILE}.Linear.forward.0": {"input_args": [dict(tensor, Max=1.0, Mean=0.5,
                                                                        Norm=1.0)],
                                                   "input_kwargs": {}, "output": [tensor]},
            f"Module.{FORMULA}.Linear.forward.0": {"input_args": [tensor], "input_kwargs": {},
                                                   "output": [tensor]}}}
        (folder / "dump.json").write_text(json.dumps(data), encoding="utf-8")
        roots.append(str(tmp_path / name))
    csv_path = str(tmp_path / "r.csv")
    proc = _cli("compare", roots[0], roots[1], "--csv", csv_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _clean(proc.stdout + proc.stderr)
    with open(csv_path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    cells = [v for r in rows for v in r.values() if isinstance(v, str)]
    assert not [c for c in cells if c[:1] in ("=", "+", "@")], cells
    assert any(c.startswith("'=HYPERLINK") for c in cells), cells
    for args in (("inspect", roots[0]), ("show", roots[0], f"Module.{HOSTILE}.Linear.forward.0")):
        proc = _cli(*args)
        _clean(proc.stdout + proc.stderr)
