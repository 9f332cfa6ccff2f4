"""FSDP2 (`fully_shard`, two real ranks over gloo): parameters are DTensors whose memory is a
shard, the guides' pattern dumps a step without crashing, each rank records its own shard, FSDP2's
all-gather and reduce-scatter plumbing is not captured, and modules keep their model's class
names.

Before, the parameter inventory read a DTensor's data pointer (0: a wrapper subclass has no
memory of its own) and the process died of SIGSEGV inside start(); with that fixed, FSDP2's
communication buffers (some not written yet) filled the dump with values that differ between
identical runs and pass for NaN, and every module was named `FSDP<class>`.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import precdbg
from precdbg.compare import compare_dumps

from conftest import run_ranks

pytest.importorskip("torch.distributed.fsdp")

WORKER = r"""
import json, os, sys
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches
from precdbg_pt import PrecisionDebugger

dist.init_process_group("gloo")
rank = dist.get_rank()
cfg = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)


def train(dump, config=None):
    torch.manual_seed(0)
    model = GPT(cfg)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(config_path=config) if dump else None
    losses, shards, grads, restored = [], {}, {}, None
    for step, (x, y) in enumerate(make_batches(cfg, batch_size=4, steps=3, seed=rank)):
        if step == 1 and dump:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
            before = dict(vars(FSDPParamGroup))
            shards = {name: [p.to_local().numel(), float(p.to_local().double().norm())]
                      for name, p in model.named_parameters()}
            debugger.start(model)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if step == 1 and dump:
            grads = {name: [p.grad.to_local().numel(), float(p.grad.to_local().double().norm())]
                     for name, p in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step == 1 and dump:
            debugger.stop()
            debugger.step()
            restored = dict(vars(FSDPParamGroup)) == before
        losses.append(loss.item())
    return losses, shards, grads, restored, debugger.failures if dump else 0


plain, _, _, _, _ = train(False)
dumped, shards, grads, restored, failures = train(True, CONFIG)
again, _, _, _, failures_again = train(True, CONFIG_AGAIN)
failures += failures_again
with open(os.path.join(OUT, f"result{rank}.json"), "w") as f:
    json.dump({"plain": plain, "dumped": dumped, "shards": shards, "grads": grads,
               "restored": restored, "failures": failures}, f)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    for name in ("dump", "again"):
        (out / f"{name}.json").write_text(json.dumps({"task": "statistics", "level": "mix",
                                                      "dump_path": str(out / name)}))
    script = out / "worker.py"
    script.write_text(f"OUT = {str(out)!r}\nCONFIG = {str(out / 'dump.json')!r}\n"
                      f"CONFIG_AGAIN = {str(out / 'again.json')!r}\n" + WORKER)
    run_ranks(str(script), timeout=300)
    return out, [json.loads((out / f"result{r}.json").read_text()) for r in range(2)]


def test_fsdp2_step_dumps_without_changing_training(fsdp_run):
    out, results = fsdp_run
    for result in results:
        assert result["failures"] == 0
        assert result["dumped"] == result["plain"]
        assert result["restored"] is True      # stop() put FSDP2's methods back
    dump = precdbg.open_dump(str(out / "dump"))
    assert dump.ranks == [0, 1]
    for rank in (0, 1):
        table = dump.records(step=0, rank=rank)
        assert {"api", "module", "param", "param_grad"} <= set(table["kind"].tolist())


def test_fsdp2_inventory_records_each_ranks_shard(fsdp_run):
    out, results = fsdp_run
    dump = precdbg.open_dump(str(out / "dump"))
    for rank, result in enumerate(results):
        table = dump.records(step=0, rank=rank)
        inventory = (table["kind"] == "param") & (table["role"] == "param")
        by_name = {str(api): i for i, api in zip(np.nonzero(inventory)[0],
                                                 table["api"][inventory])}
        assert set(by_name) == set(result["shards"])
        for name, (numel, norm) in result["shards"].items():
            i = by_name[name]
            assert int(table["numel"][i]) == numel, name
            assert table["norm"][i] == pytest.approx(norm, rel=1e-12, abs=1e-12), name
    # the shards differ between ranks: each rank recorded its own
    norms = [dump.records(step=0, rank=r)["norm"][dump.records(step=0, rank=r)["kind"] == "param"]
             for r in (0, 1)]
    assert not np.array_equal(norms[0], norms[1])


def test_fsdp2_plumbing_is_not_captured_and_classes_keep_their_names(fsdp_run):
    out, _ = fsdp_run
    dump = precdbg.open_dump(str(out / "dump"))
    for rank in (0, 1):
        table = dump.records(step=0, rank=rank)
        apis = set(table["api"][table["kind"] == "api"].tolist())
        assert not apis & {"all_gather_copy_in", "split_with_sizes_copy", "empty", "chunk_cat",
                           "all_gather_into_tensor", "reduce_scatter_tensor"}, apis
        assert "linear" in apis and "layer_norm" in apis
        assert int(table["nan_count"].sum()) == 0
        classes = {cls for _, cls, _ in dump.modules(step=0, rank=rank)}
        assert {"GPT", "Block", "Attention"} <= classes
        assert not [c for c in classes if c.startswith("FSDP")]
        modules = set(table["api"][table["kind"] == "module"].tolist())
        assert "GPT" in modules and not [m for m in modules if m.startswith("FSDP")]


def test_fsdp2_identical_runs_compare_as_a_match(fsdp_run):
    out, _ = fsdp_run
    for rank in (0, 1):
        result = compare_dumps(str(out / "dump"), str(out / "again"), rank=rank)
        assert result["verdict"] == "match", result["first_divergence"]
        assert not result["unmatched"]


def test_fsdp2_gradients_are_recorded_as_each_ranks_shard(fsdp_run):
    """FSDP2 assigns the reduce-scattered gradients itself (no autograd hook sees them): they
    are recorded once its backward is final, as each rank's shard of the averaged gradient."""
    out, results = fsdp_run
    dump = precdbg.open_dump(str(out / "dump"))
    for rank, result in enumerate(results):
        table = dump.records(step=0, rank=rank)
        dw = np.nonzero(table["kind"] == "param_grad")[0]
        by_name = {str(table["api"][i]): i for i in dw}
        assert set(by_name) == set(result["grads"])
        for name, (numel, norm) in result["grads"].items():
            i = by_name[name]
            assert int(table["numel"][i]) == numel, name
            assert table["norm"][i] == pytest.approx(norm, rel=1e-12, abs=1e-12), name
        # clip_grad_norm_ reads the gradients: their producer is the dw record
        seq_of = dict(zip(table["seq"].tolist(), range(len(table))))
        dw_seqs = {int(table["seq"][i]) for i in dw}
        produced = [p for p in table["producer"][table["kind"] == "api"].tolist() if p in dw_seqs]
        assert produced and all(table["kind"][seq_of[p]] == "param_grad" for p in produced)
