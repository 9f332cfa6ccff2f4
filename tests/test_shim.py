"""precdbg_ms in torch-shim mode: PyTorch code (Hugging Face GPT-2, tiny, random init) running on
MindSpore through mindnlp's `mindtorch`, dumped with the guides' pattern (`dump_step = 1`,
gradients through `value_and_grad`), and compared with a real-torch dump of the same weights and
batches (tests/shim_guide.py; the torch side is the main venv's python).

Runs where mindnlp imports (scripts/test_shim.sh builds that environment: MindSpore 2.7.0,
mindnlp 0.5.1); skipped elsewhere. The twin needs the torch side: PRECDBG_TORCH_PYTHON (a
python with torch and precdbg) and PRECDBG_TORCH_PATH (what it puts first on sys.path: the same
transformers version as the shim side's, whose model code both run).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List

import pytest

pytest.importorskip("mindspore")
try:
    import importlib.util
    _HAS_MINDNLP = importlib.util.find_spec("mindnlp") is not None
except (ImportError, ValueError):
    _HAS_MINDNLP = False
pytestmark = pytest.mark.skipif(not _HAS_MINDNLP, reason="mindnlp (the torch shim) is not "
                                "installed here; scripts/test_shim.sh builds its environment")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, "tests", "shim_guide.py")
TORCH_PYTHON = os.environ.get("PRECDBG_TORCH_PYTHON", "")
TORCH_PATH = os.environ.get("PRECDBG_TORCH_PATH", "")


def _run(python: str, args: List[str], extra_path: str = "") -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (extra_path, REPO) if p)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": path}
    return subprocess.run([python, GUIDE, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def _records(dump: str) -> List[Dict]:
    import precdbg
    return list(precdbg.open_dump(dump).records(0, 0).rows())


@pytest.fixture(scope="module")
def shim_dump(tmp_path_factory) -> Dict[str, str]:
    root = tmp_path_factory.mktemp("shim")
    weights, dump = str(root / "w.npz"), str(root / "shim")
    if TORCH_PYTHON:          # the torch side writes the weights and batches both use
        torch_side = _run(TORCH_PYTHON, ["torch", str(root / "torch"), weights, "--level",
                                         "module"], TORCH_PATH)
        assert torch_side.returncode == 0, torch_side.stdout + torch_side.stderr
    shim = _run(sys.executable, ["shim", dump, weights, "--level", "module",
                                 "--grads", "value_and_grad"])
    assert shim.returncode == 0, shim.stdout + shim.stderr
    return {"root": str(root), "weights": weights, "shim": dump, "torch": str(root / "torch"),
            "stderr": shim.stderr}


def test_the_guides_pattern_dumps_the_shims_modules_under_pytorchs_paths(shim_dump):
    with open(os.path.join(shim_dump["shim"], "run.json"), encoding="utf-8") as handle:
        run = json.load(handle)
    assert run["framework"] == "mindtorch"
    versions = run["manifest"]["versions"]
    assert "mindspore" in versions and "mindtorch" in versions and "torch_api" in versions
    rows = _records(shim_dump["shim"])
    entries = {str(r["entry"]) for r in rows}
    assert "Module.transformer.h.1.mlp.c_proj.Conv1D.forward.0" in entries
    assert "Module.transformer.h.1.mlp.c_proj.Conv1D.backward.0" in entries
    # dw of every parameter, through value_and_grad
    grads = {str(r["entry"]) for r in rows if r["role"] == "param_grad"}
    params = {str(r["entry"]) for r in rows if r["role"] == "param"}
    assert len(grads) == len(params) > 20
    assert "precdbg:" not in shim_dump["stderr"].replace("precdbg: wrote", "")


def test_mindnlp_0_5_1s_zero_position_gradient_is_in_the_dump(shim_dump):
    """mindnlp 0.5.1 leaves GPT-2's `wpe` gradient all zero under value_and_grad (its
    `Tensor.to` cuts the graph): the dump shows it, as the shim computed it."""
    wpe = [r for r in _records(shim_dump["shim"])
           if str(r["entry"]) == "Param.transformer.wpe.weight.grad"]
    assert len(wpe) == 1 and wpe[0]["norm"] == 0.0


@pytest.mark.skipif(not TORCH_PYTHON, reason="no torch side (PRECDBG_TORCH_PYTHON)")
def test_a_real_torch_dump_and_the_shims_align_by_name_and_name_the_position_embedding(
        shim_dump):
    proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", shim_dump["torch"],
                           shim_dump["shim"], "--json",
                           os.path.join(shim_dump["root"], "cmp.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(os.path.join(shim_dump["root"], "cmp.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    first = result["first_divergence"]
    # the weights entering the dumped step differ at wpe: its gradient of the step before
    assert first["module"] == "transformer.wpe"
    # records pair by name (no mapping): nearly every record has its counterpart
    assert len(result["unmatched"]) <= 8, result["unmatched"][:8]
