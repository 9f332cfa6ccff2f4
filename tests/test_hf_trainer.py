"""precdbg inside a Hugging Face `Trainer` (tests/hf_trainer_guide.py): the guides' pattern in a
callback, each variant a real training process; compare and check name what differs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from compare_support import assert_first, describe  # noqa: E402
from conftest import beyond_dumping_to  # noqa: E402
from precdbg.check import check_dumps  # noqa: E402
from precdbg.compare import compare_dumps  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, "tests", "hf_trainer_guide.py")
VARIANTS = ("base", "eps", "bf16", "recompute")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_trainer")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    procs = {}
    for variant in VARIANTS:
        out = root / variant
        out.mkdir()
        procs[variant] = (out, subprocess.Popen([sys.executable, GUIDE, str(out), variant],
                                                cwd=REPO, env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True))
    found = {}
    for variant, (out, proc) in procs.items():
        log, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{variant}: exit {proc.returncode}\n{log[-3000:]}"
        assert "precdbg:" not in beyond_dumping_to(log), log[-3000:]           # no failure, no warning
        with open(out / "losses.json") as handle:
            found[variant] = {"dump": str(out / "dump"), "losses": json.load(handle)}
    return found


def test_every_variant_trained_and_dumped_step_0(runs):
    for variant, run in runs.items():
        assert len(run["losses"]) == 2, (variant, run["losses"])
        assert sorted(os.listdir(run["dump"])) == ["run.json", "step0"], variant


def test_trainer_gradient_checkpointing_matches_the_plain_run(runs):
    assert runs["recompute"]["losses"] == runs["base"]["losses"]
    result = compare_dumps(runs["base"]["dump"], runs["recompute"]["dump"])
    assert result["verdict"] == "match", describe(result)
    assert not result["unmatched"], result["unmatched"][:5]
    # both micro-batches of the accumulated step, forward and backward, are in the pairs
    names = {row["name_a"] for row in result["rows"]}
    assert {"Module.model.layers.1.LlamaDecoderLayer.forward.1",
            "Module.model.layers.1.LlamaDecoderLayer.backward.1"} <= names


def test_rms_norm_epsilon_is_named_at_the_first_norm(runs):
    result = compare_dumps(runs["base"]["dump"], runs["eps"]["dump"])
    first = assert_first(result, step=0, direction="forward", kind="api",
                         module="model.layers.0.input_layernorm", op="add",
                         code="argument")
    assert [(a["a"], a["b"]) for a in first["evidence"]["arguments_bad"]][:1] == \
        [("1e-06", "0.01")], first
    assert first["name_a"] == "Tensor.add.1.forward", first


def test_bf16_autocast_is_a_set_up_difference_and_pairs_per_micro_batch(runs):
    check = check_dumps(runs["base"]["dump"], runs["bf16"]["dump"])
    dtype = [f for f in check["findings"] if f["kind"] == "compute_dtype"]
    assert dtype and dtype[0]["severity"] == "high", check["findings"]
    assert "linear float32 vs bfloat16" in dtype[0]["message"]
    assert "first: linear in module 'model.layers.0.self_attn.q_proj'" in dtype[0]["message"]
    result = compare_dumps(runs["base"]["dump"], runs["bf16"]["dump"])
    assert any(f["kind"] == "compute_dtype" for f in result["setup"])
    # accelerate's extra output cast in each micro-batch is unmatched, never paired with the
    # other micro-batch's cast
    extra = [u for u in result["unmatched"] if u["op"] == "cast"]
    assert extra and all(u["side"] == "b" and u["module"] == "" and ".float." in u["name"]
                         for u in extra), extra
    casts = [r for r in result["rows"] if r["name_a"].startswith("Tensor.float.")]
    assert casts and all(r["status"] == "match" for r in casts), casts
