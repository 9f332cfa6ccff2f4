"""A model is named through the wrappers around it (precdbg_pt/wrappers.py): a run under
DistributedDataParallel, DataParallel or activation-checkpoint wrappers pairs record for record
with the plain run, with no `module.` or `_checkpoint_wrapped_module.` in any path. Each run is
the guides' pattern on the tiny GPT in one real process (DDP over gloo, world size 1)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import precdbg
from precdbg.compare import compare_dumps

from conftest import run_python
from torch_support import TINY

SCRIPT = r"""
import functools, json, os, sys
import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing)
from precdbg_examples.gpt_torch import GPT, Block, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

out, tiny = sys.argv[1], json.loads(sys.argv[2])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
cfg = GPTConfig(**tiny)
failures = {}
for variant in ("plain", "ddp", "data_parallel", "checkpoint_wrapper", "ddp_checkpoint"):
    torch.manual_seed(0)
    model = GPT(cfg)
    if "checkpoint" in variant:
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    net = model
    if variant.startswith("ddp"):
        net = torch.nn.parallel.DistributedDataParallel(model)
    elif variant == "data_parallel":
        net = torch.nn.DataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(dump_path=os.path.join(out, variant), level="mix", step=[1])
    for x, y in make_batches(cfg, batch_size=2, steps=2, seed=0):
        debugger.start(net)
        train_step(net, opt, x, y)
        debugger.stop()
        debugger.step()
    failures[variant] = debugger.failures
dist.destroy_process_group()
print(json.dumps(failures))
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    out = tmp_path_factory.mktemp("wrappers")
    port = str(29500 + (hash(str(out)) % 400))
    proc = run_python(["-c", SCRIPT, str(out), json.dumps(TINY), port], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(failures.values()), (failures, proc.stderr[-3000:])
    return out


@pytest.mark.parametrize("variant", ["ddp", "data_parallel", "checkpoint_wrapper",
                                     "ddp_checkpoint"])
def test_wrapped_run_pairs_with_the_plain_run(dumps, variant):
    result = compare_dumps(str(dumps / "plain"), str(dumps / variant))
    assert result["verdict"] == "match", result["first_divergence"]
    assert result["unmatched_count"] == 0, result["unmatched"][:5]
    assert not result["setup"], result["setup"]          # same parameter names, same inventory
    table = precdbg.open_dump(str(dumps / variant)).records(step=1)
    paths = set(np.unique(table["module"]).tolist()) | set(np.unique(table["api"][
        table["kind"] == "param"]).tolist())
    assert "blocks.0.attn.qkv" in paths and "blocks.0.attn.qkv.weight" in paths
    assert not [p for p in paths if p.startswith("module") or "_wrapped_module" in p], paths
    # the root is the model's own class, as in the plain run
    assert "Module.GPT.forward.0" in set(table["entry"].tolist())
