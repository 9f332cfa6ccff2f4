"""The cause is the headline under the guides' own usage (issue 45): a transformers GPT-2 dumped
at iteration 1 only (tests/guide_gpt2_iteration1.py, a fresh process each), whose weights
already differ at that step's start because iteration 0 ran the same difference. The verdict
names what the step shows to differ (a layer setting, a structural difference, a call only one
run makes) with the parameter difference as evidence; a rerun of the baseline matches."""
from __future__ import annotations

import os
from typing import Dict

import pytest

from conftest import guide_dumps, run_python, write_config_file
from precdbg.compare import compare_dumps

pytest.importorskip("transformers")
GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guide_gpt2_iteration1.py")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Dict[str, str]:
    return guide_dumps(tmp_path_factory.mktemp("cause_headline"), GUIDE,
                       {"base": "base", "rerun": "base", "eps": "eps", "tanh": "tanh",
                        "write": "write"})


def test_a_rerun_matches(dumps):
    assert compare_dumps(dumps["base"], dumps["rerun"])["verdict"] == "match"


@pytest.mark.parametrize("variant, code, module", [
    ("eps", "layer_setting", "transformer.h.2.ln_2"),
    ("tanh", "structure", "transformer.h.3.mlp.act"),
])
def test_the_step_shows_the_cause_over_the_weights(dumps, variant, code, module):
    first = compare_dumps(dumps["base"], dumps[variant])["first_divergence"]
    assert (first["cause"]["code"], first["module"]) == (code, module), first["reason"]
    assert "weights_entered_apart" in first["annotations"]
    assert first["parameters"]["name_a"].startswith("Param.transformer.")


def test_a_candidate_only_write_into_the_batch_is_named(dumps):
    first = compare_dumps(dumps["base"], dumps["write"])["first_divergence"]
    assert first["cause"]["code"] == "one_run_call", first["reason"]
    assert first["name_b"].startswith("Tensor.__setitem__.") and first["name_a"] == ""


_MICRO_BATCH_WRITE = r'''
import sys
import torch
from precdbg_pt import PrecisionDebugger

def main():
    config, variant = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    debugger = PrecisionDebugger(config_path=config)
    for step in range(3):
        x = torch.randn(8, 8, generator=data)
        if step == 1:
            debugger.start(model)
        opt.zero_grad()
        for micro_batch in range(2):
            part = x[micro_batch * 4:(micro_batch + 1) * 4]
            if variant == "write" and micro_batch == 1 and step == 1:
                part[:, 0] = 0.0          # the script writes into the batch, in this step only
            model(part).pow(2).mean().backward()
        opt.step()
        if step == 1:
            debugger.stop()
            debugger.step()

main()
'''


def test_a_captured_write_between_micro_batches_is_the_culprit(tmp_path):
    """The candidate's own code writes into the batch between micro-batches inside the window
    (the weights agree at the step's start): the `Tensor.__setitem__` only it calls is named,
    not "something not captured changed it"."""
    dumps = {}
    for variant in ("plain", "write"):
        dump = str(tmp_path / variant)
        config = write_config_file(tmp_path / f"{variant}.json", {
            "task": "statistics", "level": "mix", "dump_path": dump, "step": [0]})
        done = run_python(["-c", _MICRO_BATCH_WRITE, config, variant], timeout=300)
        assert done.returncode == 0, done.stderr
        dumps[variant] = dump
    first = compare_dumps(dumps["plain"], dumps["write"])["first_divergence"]
    assert first["cause"]["code"] == "one_run_call", first["reason"]
    assert (first["kind"], first["name_a"]) == ("api", "")
    assert first["name_b"].startswith("Tensor.__setitem__.")
    assert first["chain"][-1]["name_b"] == first["name_b"]
    assert first["annotations"] == []          # the weights agreed at the step's start
