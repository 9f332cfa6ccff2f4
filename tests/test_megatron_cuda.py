"""Megatron-Core on a CUDA GPU (tests/megatron_cuda_guide.py, real processes, NCCL world size 1):
Megatron's DistributedDataParallel keeps gradients in `main_grad` buffers and sets `.grad` to
None, so a parameter's gradient is never where plain PyTorch leaves it. Every parameter's dw
must be dumped with the norm `main_grad` holds, the guides' pattern without close() must leave a
whole step on disk, and runs with and without Megatron's activation recompute must MATCH."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

if importlib.util.find_spec("megatron") is None or \
        importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed", allow_module_level=True)

from compare_support import describe  # noqa: E402
from conftest import run_python  # noqa: E402
import precdbg  # noqa: E402
from precdbg.compare import compare_dumps  # noqa: E402

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_cuda_guide.py")
pytestmark = pytest.mark.cuda


def _run(out, recompute: str, bf16: bool = False) -> dict:
    port = str(29400 + (os.getpid() + len(recompute) + bf16) % 300)
    proc = run_python([GUIDE, str(out), recompute] + (["--bf16"] if bf16 else []),
                      env={"MASTER_PORT": port}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    out = tmp_path_factory.mktemp("megatron_cuda")
    return out, {name: _run(out, name) for name in ("none", "full")}


def test_megatron_ddp_main_grads_are_dumped_with_their_norms(runs):
    out, results = runs
    result = results["none"]
    assert result["failures"] == 0
    assert not [f for _, _, files in os.walk(out) for f in files if f.endswith(".partial")]
    with precdbg.open_dump(str(out / "none")) as dump:
        assert dump.steps == [0]
        table = dump.records(step=0)
        kinds = table["kind"].astype(str)
        grads = table.select(kinds == "param_grad")
        by_name = {str(row["api"]): float(row["norm"]) for row in grads.rows()}
    params = result["params"]
    assert sorted(by_name) == sorted(params), (sorted(set(params) ^ set(by_name)))[:10]
    want = np.array([result["main_grad_norms"][name] for name in params])
    got = np.array([by_name[name] for name in params])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_megatron_recompute_on_cuda_matches_the_run_without(runs):
    out, results = runs
    assert results["full"]["losses"] == results["none"]["losses"]
    result = compare_dumps(str(out / "none"), str(out / "full"))
    assert result["verdict"] == "match", describe(result)
    assert any(r["direction"] == "backward" and r["module"].startswith("decoder.layers.1")
               for r in result["rows"])
