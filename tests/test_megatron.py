"""Megatron-Core's GPTModel with Megatron's own activation recompute, on the CPU
(tests/megatron_guide.py, one real process): a run with full or selective recompute pairs record
for record with the run without, backward included; what is left without counterpart is only
the constants Megatron's recompute makes (zeros for arguments given as None, a tensor of the
mask type), which change no number."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("megatron") is None or \
        importlib.util.find_spec("megatron.core") is None:   # found, not imported here
    pytest.skip("megatron-core is not installed", allow_module_level=True)

from compare_support import describe  # noqa: E402
from conftest import run_python  # noqa: E402
from precdbg.compare import compare_dumps  # noqa: E402

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_guide.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron")
    port = str(29100 + os.getpid() % 300)
    proc = run_python([GUIDE, str(out)], env={"MASTER_PORT": port, "OMP_NUM_THREADS": "1"},
                      timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("recompute, constants", [("full", {"zeros"}),
                                                  ("selective", {"zeros", "tensor"})])
def test_megatron_recompute_pairs_with_the_run_without(runs, recompute, constants):
    out, losses = runs
    assert losses[recompute] == losses["none"]
    result = compare_dumps(str(out / "none"), str(out / recompute))
    assert result["verdict"] == "match", describe(result)
    assert len(result["rows"]) > 1000
    backward = [r for r in result["rows"] if r["direction"] == "backward"]
    assert any(r["module"].startswith("decoder.layers.1") for r in backward)
    left = result["unmatched"]
    assert left and all(u["side"] == "b" and u["op"] in constants for u in left), left[:6]
