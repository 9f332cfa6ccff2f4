"""Two ranks (torch.distributed, gloo, two real processes): one file per step per rank, and the
rank filter."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import precdbg

from conftest import run_ranks
from torch_support import TINY

WORKER = r"""
import contextlib, json, os, sys
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
for name in ("plain", "tanh1", "nudge1", "lr1"):  # one step of a fresh model; on rank 1
    torch.manual_seed(0)                     # only: GELU tanh, blocks.1.mlp.fc's output *
    variant = GPT(cfg)                       # 1.001, another learning rate
    if name == "tanh1" and rank == 1:
        for block in variant.blocks:
            block.mlp.act.approximate = "tanh"
    if name == "nudge1" and rank == 1:
        variant.blocks[1].mlp.fc.register_forward_hook(lambda m, i, out: out * 1.001)
    variant = DDP(variant)
    sgd = torch.optim.SGD(variant.parameters(), lr=0.5 if name == "lr1" and rank == 1 else 0.0)
    dbg = PrecisionDebugger(dump_path=os.path.join(OUT, name), level="mix")
    dbg.start(variant)
    for x, y in batches:                     # two micro-batches, the first without a
        with (variant.no_sync() if x is batches[0][0] else contextlib.nullcontext()):
            logits = variant(x)              # reduction; then clipping, as real loops do
            torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                              y.reshape(-1)).backward()
    torch.nn.utils.clip_grad_norm_(variant.parameters(), 1.0)
    sgd.step()
    sgd.zero_grad(set_to_none=True)
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


def test_compare_names_the_rank_where_the_difference_starts(two_ranks):
    """blocks.1.mlp.fc computes otherwise on rank 1 only, in both micro-batches of a step with
    gradient accumulation (the first under no_sync) and clipping. DDP's gradient all-reduce
    carries it to rank 0, whose first difference comes after backward (the reduced gradients,
    the clipping norm): the verdict started at rank 0's first differing record and walked
    from there into another phase, module or micro-batch. It starts on the rank where the
    difference came first in the step: rank 1's first forward call of that module."""
    from precdbg.compare import compare_dumps
    out, _ = two_ranks
    first = compare_dumps(str(out / "plain"), str(out / "nudge1"))["first_divergence"]
    assert first is not None and (first["rank"], first["direction"], first["module"]) == \
        (1, "forward", "blocks.1.mlp.fc"), first
    assert first["name_a"] == "Module.blocks.1.mlp.fc.Linear.forward.0", first


def test_each_ranks_manifest_is_kept_and_checked(two_ranks):
    """Every rank wrote run.json whole, and the last write won: which rank's optimizer a check
    saw (and so whether rank 1's other learning rate was found) changed from run to run. Each
    rank's manifest is kept; check compares them rank by rank."""
    from precdbg.check import check_dumps
    out, _ = two_ranks
    with open(out / "lr1" / "run.json", encoding="utf-8") as handle:
        run = json.load(handle)
    assert sorted(run["manifests"]) == ["0", "1"] and run["manifest"]["rank"] == 0
    rates = {rank: m["optimizers"][0]["param_groups"][0]["hyper"]["lr"]
             for rank, m in run["manifests"].items()}
    assert rates == {"0": 0.0, "1": 0.5}, rates
    found = [f["message"] for f in check_dumps(str(out / "plain"), str(out / "lr1"))["findings"]
             if f["kind"] == "optimizer"]
    assert found == ["rank 1: optimizer lr differs: A 0, B 0.5 (all 29 parameters)"], found
