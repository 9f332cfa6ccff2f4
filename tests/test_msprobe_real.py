"""Dumps made by msprobe itself, now, and read by precdbg (skipped where msprobe is not at hand:
the `msprobe` extra in a venv of its own, named by PRECDBG_MSPROBE_PYTHON, or importable here).
tests/data/msprobe/make_dumps.py runs each msprobe config in its own process (msprobe's debugger
is one per process): statistics (clean, the GELU defect), md5, tensor, levels L0 and L1, two ranks
over gloo. Every variant reads; compares name the defect or match; tensor files read; the levels
pair; a precdbg dump of the same run matches msprobe's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import precdbg

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "msprobe")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("stat_mix_clean", "stat_mix_gelu", "md5_mix_clean", "tensor_mix_clean",
            "stat_L0_clean", "stat_L1_clean", "stat_mix_2ranks")


def _msprobe_python():
    named = os.environ.get("PRECDBG_MSPROBE_PYTHON")
    if named:
        return named
    probe = subprocess.run([sys.executable, "-c", "import msprobe.pytorch"],
                           capture_output=True, timeout=120)
    return sys.executable if probe.returncode == 0 else None


MSPROBE_PYTHON = _msprobe_python()
pytestmark = pytest.mark.skipif(
    MSPROBE_PYTHON is None, reason="msprobe is not installed: pip install '.[msprobe]' in a venv "
    "of its own and set PRECDBG_MSPROBE_PYTHON to its python")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("msprobe")
    shutil.copy(os.path.join(DATA, "make_dumps.py"), str(root))
    for name in VARIANTS:
        proc = subprocess.run([MSPROBE_PYTHON, str(root / "make_dumps.py"), name],
                              capture_output=True, text=True, timeout=600, cwd=str(root))
        assert proc.returncode == 0, (name, proc.stdout[-3000:], proc.stderr[-3000:])
    return {name: str(root / name) for name in VARIANTS}


def _compare(made, a: str, b: str, tmp_path, *extra: str):
    out = str(tmp_path / "r.json")
    proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", made.get(a, a),
                           made.get(b, b), "--json", out, *extra], capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def test_every_variant_reads(made):
    for name, path in made.items():
        with precdbg.open_dump(path) as dump:
            assert dump.source == "msprobe" and dump.steps == [0, 1], name
            assert dump.ranks == ([0, 1] if name.endswith("2ranks") else [0]), name
            for step in dump.steps:
                for rank in dump.ranks:
                    assert len(dump.records(step, rank)) > 20, (name, step, rank)
            assert not dump.warnings() and not dump.notes(), (name, dump.notes())
    with precdbg.open_dump(made["md5_mix_clean"]) as dump:
        t = dump.records(0, 0)
        floats = t["dtype"] == "float32"
        assert all(len(c) == 8 for c in t["checksum"][floats].tolist())
    with precdbg.open_dump(made["stat_L0_clean"]) as dump:
        assert dump.setting("level") == "module"
        assert set(dump.records(0, 0)["kind"].tolist()) == {"module", "param", "param_grad"}


def test_the_gelu_defect_is_named_and_clean_variants_match(made, tmp_path):
    first = _compare(made, "stat_mix_clean", "stat_mix_gelu", tmp_path)["first_divergence"]
    assert (first["name_a"], first["module"], first["step"]) == \
        ("Functional.gelu.1.forward", "blocks.1.act", 0), first
    for other in ("md5_mix_clean", "tensor_mix_clean", "stat_L0_clean", "stat_L1_clean"):
        result = _compare(made, "stat_mix_clean", other, tmp_path)
        assert result["verdict"] == "match", (other, result["first_divergence"])
    result = _compare(made, "stat_mix_2ranks", "stat_mix_2ranks", tmp_path)
    assert result["verdict"] == "match" and {r["rank"] for r in result["rows"]} == {0, 1}


def test_tensor_files_read_as_the_statistics_say(made):
    with precdbg.open_dump(made["tensor_mix_clean"]) as dump:
        t = dump.records(0, 0)
        stored = np.nonzero(t["data_offset"] >= 0)[0]
        assert len(stored) > 50
        for i in stored[:40].tolist():
            values = dump.tensor_at(t, i)
            assert values.shape == tuple(t.row(i)["shape"])
            if values.size and values.dtype.kind == "f":
                assert float(values.max()) == pytest.approx(float(t["max"][i]), rel=1e-6)


def test_precdbg_dump_of_the_same_run_matches_msprobes(made, tmp_path):
    from test_msprobe_dumps import _TWIN
    path = str(tmp_path / "precdbg_clean")
    proc = subprocess.run([sys.executable, "-c", _TWIN, DATA, "stat_mix_clean", path],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for a, b in ((path, "stat_mix_clean"), ("stat_mix_clean", path)):
        result = _compare(made, a, b, tmp_path)
        assert result["verdict"] == "match", result["first_divergence"]
    first = _compare(made, path, "stat_mix_gelu", tmp_path, "--step", "0")["first_divergence"]
    assert first["name_a"] == "Functional.gelu.1.forward", first
