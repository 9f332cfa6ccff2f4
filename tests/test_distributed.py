"""Two ranks (torch.distributed, gloo, two real processes): one file per step per rank, and the
rank filter."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import precdbg

from conftest import TINY, run_ranks

WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
cfg = GPTConfig(**TINY)
model = DDP(GPT(cfg))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = list(make_batches(cfg, batch_size=2, steps=2, seed=100 + rank))
result = {"rank": rank, "world": dist.get_world_size()}
for name, ranks in (("all", []), ("only1", [1])):
    dbg = PrecisionDebugger(dump_path=os.path.join(OUT, name), rank=ranks, step=[0, 1])
    for x, y in batches:
        dbg.start(model)
        train_step(model, opt, x, y)
        dbg.stop()
        dbg.step()
    dbg.close()
    result[name] = dbg.failures
result["weight_sum"] = float(model.module.lm_head.weight.double().sum())
for name in ("plain", "tanh1"):       # one step of a fresh model; rank 1's GELU tanh in one
    torch.manual_seed(0)
    variant = GPT(cfg)
    if name == "tanh1" and rank == 1:
        for block in variant.blocks:
            block.mlp.act.approximate = "tanh"
    variant = DDP(variant)
    dbg = PrecisionDebugger(dump_path=os.path.join(OUT, name), level="mix")
    dbg.start(variant)
    train_step(variant, torch.optim.SGD(variant.parameters(), lr=0.0), *batches[0])
    dbg.stop()
    dbg.step()
    dbg.close()
with open(os.path.join(OUT, f"result{rank}.json"), "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    script = out / "worker.py"
    script.write_text(f"TINY = {TINY!r}\nOUT = {str(out)!r}\n" + WORKER)
    run_ranks(str(script))
    results = [json.loads((out / f"result{r}.json").read_text()) for r in range(2)]
    return out, results


def test_ranks_ran_and_nothing_failed(two_ranks):
    _, results = two_ranks
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 for r in results)
    assert all(r["all"] == 0 and r["only1"] == 0 for r in results)
    # DDP kept the replicas in sync: the debugger did not disturb the all-reduce
    assert results[0]["weight_sum"] == results[1]["weight_sum"]


def test_every_rank_writes_its_own_file(two_ranks):
    out, _ = two_ranks
    root = out / "all"
    for step in (0, 1):
        assert sorted(os.listdir(root / f"step{step}")) == ["rank0.h5", "rank1.h5"]
    dump = precdbg.open_dump(str(root))
    assert dump.steps == [0, 1]
    assert dump.ranks == [0, 1]
    assert dump.run["world_size"] == 2
    both = dump.records(step=0)
    assert set(np.unique(both["rank"])) == {0, 1}
    r0, r1 = dump.records(step=0, rank=0), dump.records(step=0, rank=1)
    assert len(r0) + len(r1) == len(both)
    assert np.all(r0["rank"] == 0) and np.all(r1["rank"] == 1)
    # same model, same calls on both ranks; different data, different values
    assert list(r0["entry"]) == list(r1["entry"])
    out0 = [r for r in r0.rows() if r["entry"] == "Module.GPT.forward.0"
            and r["role"] == "output"]
    out1 = [r for r in r1.rows() if r["entry"] == "Module.GPT.forward.0"
            and r["role"] == "output"]
    assert len(out0) == len(out1) == 1
    assert out0[0]["norm"] != out1[0]["norm"]
    # DDP wraps the model: it is named as the model it wraps (no "module." in paths)
    linear = [r for r in r0.rows() if r["entry"] == "Functional.linear.0.forward"]
    assert linear and linear[0]["module"] == "blocks.0.attn.qkv"
    assert not [m for m in np.unique(r0["module"]).tolist() if m.startswith("module")]
    # a dw record for every parameter on every rank
    assert np.count_nonzero(r1["kind"] == "param_grad") == np.count_nonzero(r1["role"] == "param")


def test_rank_filter_keeps_only_that_rank(two_ranks):
    out, _ = two_ranks
    root = out / "only1"
    for step in (0, 1):
        assert sorted(os.listdir(root / f"step{step}")) == ["rank1.h5"]
    dump = precdbg.open_dump(str(root))
    assert dump.ranks == [1]
    assert dump.steps == [0, 1]
    assert len(dump.records(step=1, rank=1)) > 0
    with pytest.raises(precdbg.DumpError):
        dump.records(step=0, rank=0)


def test_check_finds_a_difference_on_another_rank_than_the_first(two_ranks):
    """A layer setting that differs on rank 1 only (its GELU's approximation): check looked at
    rank 0 alone and found nothing; every rank both dumps hold is checked, and the finding
    names its rank."""
    from precdbg.check import check_dumps
    out, _ = two_ranks
    result = check_dumps(str(out / "plain"), str(out / "tanh1"))
    found = [f for f in result["findings"] if f["kind"] == "layer_settings"]
    assert len(found) == 1 and found[0]["message"].startswith("rank 1: gelu approximate"), \
        result["findings"]
    assert found[0]["rank"] == 1
    assert any("checked on ranks 0, 1" in n for n in result["notes"]), result["notes"]
    assert not check_dumps(str(out / "plain"), str(out / "plain"))["findings"]
