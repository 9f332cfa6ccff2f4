"""Compare on real training loops that touch gradients after backward (issue 9): the verdict is
the earliest producer whose own inputs agree, found through the `producer` each record carries,
on the timeline that ran, across ranks.

Dumps are made by tests/realloop_support.py in fresh processes (a transformers GPT-2, tiny
config, random init): clip_grad_norm_ after backward (also behind GradScaler's unscale_),
activation recompute, two accumulated
micro-batches, DistributedDataParallel over gloo with two processes, and two processes that
average gradients with torch.distributed.all_reduce themselves. The compare runs as
`python -m precdbg compare ... --json` in a subprocess. The MindSpore twin (bundled GPT,
value_and_grad, clip_by_global_norm) is dumped in this process.
"""
from __future__ import annotations

import json
import shutil
from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

import compare_support as cs
import precdbg
import realloop_support as rl
from precdbg.compare import compare_dumps
from precdbg.records.schema import scalar_mask

pytest.importorskip("transformers")

# name -> (loop, defect, rank holding the defect)
SPECS: Dict[str, Tuple[str, Any, Any]] = {
    "clip": ("clip", None, None), "clip_dw": ("clip", "dw", None),
    "recompute": ("recompute", None, None), "recompute_act": ("recompute", "act", None),
    "recompute_dw": ("recompute", "dw", None),
    "accum": ("accum", None, None), "accum_data2": ("accum", "data2", None),
    "ddp": ("ddp", None, None), "ddp_dw_rank1": ("ddp", "dw", 1),
    "ddp_data_rank1": ("ddp", "data", 1),
    "unscale": ("unscale", None, None), "unscale_dw": ("unscale", "dw", None),
    "bucket": ("bucket", None, None), "bucket_dw_rank1": ("bucket", "dw", 1),
    "allreduce": ("allreduce", None, None), "allreduce_dw_rank1": ("allreduce", "dw", 1),
    "bf16": ("bf16", None, None), "bf16_act": ("bf16", "act", None),
    "bf16_rerun": ("bf16", None, None),
}
CHAIN_KEYS = {"name_a", "name_b", "step", "rank", "text"}
DW = f"Param.{rl.DW_WEIGHT}.grad"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Callable[[str], str]:
    root = tmp_path_factory.mktemp("realloop")
    made: Dict[str, str] = {}

    def get(name: str) -> str:
        if name not in made:        # every dump of the same loop, in one process (per rank)
            loop = SPECS[name][0]
            group = [n for n, spec in SPECS.items() if spec[0] == loop]
            rl.dump_runs(loop, [(str(root / n), SPECS[n][1], SPECS[n][2]) for n in group])
            made.update({n: str(root / n) for n in group})
        return made[name]
    return get


def _compare(dumps: Callable[[str], str], base: str, cand: str, tmp_path
             ) -> Tuple[Dict[str, Any], str]:
    out = tmp_path / f"{cand}.json"
    proc = cs.run_cli("compare", dumps(base), dumps(cand), "--json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    first = result["first_divergence"]
    assert cs.FIRST_KEYS <= set(first), cs.FIRST_KEYS - set(first)
    chain = first["chain"]
    assert chain and all(CHAIN_KEYS <= set(link) for link in chain), chain
    assert (chain[-1]["name_a"], chain[-1]["rank"]) == (first["name_a"], first["rank"]), chain
    assert "producer chain" in proc.stdout and chain[-1]["text"] in proc.stdout
    return result, proc.stdout


def _reads(dump: str, entry: str, rank: int = 0):
    t = precdbg.open_dump(dump).records(step=0, rank=rank)
    names = dict(zip(t["seq"].tolist(), t["entry"].tolist()))
    rows = np.nonzero((t["entry"] == entry) & (t["role"] == "input")
                      & ~scalar_mask(t["dtype"]))[0]
    return [names.get(int(t["producer"][i])) for i in rows]


# =========================================================================== PyTorch
def test_clip_grad_norm_blames_the_weight_gradient(dumps, tmp_path):
    result, _ = _compare(dumps, "clip", "clip_dw", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight", code="dw_only")
    assert first["name_a"] == DW and first["rank"] == 0, cs.describe(result)
    # clipping reads every gradient; the one that differs names its producer, the dw record
    norm = [r for r in result["rows"] if r["name_a"] == "Torch._foreach_norm.0.forward"
            and r["role"] == "input" and r["status"] == "diverged"]
    assert [r["producer_a"] for r in norm] == [DW], norm
    assert any(c["name_a"] == "Torch._foreach_norm.0.forward"
               for c in result["consequences"]), result["consequences"]


def test_every_gradient_read_after_backward_has_its_dw_as_producer(dumps):
    producers = _reads(dumps("clip"), "Torch._foreach_norm.0.forward")
    assert producers and all(p is not None and p.startswith("Param.") and p.endswith(".grad")
                             for p in producers), producers
    # and activations inside the model are produced by the calls that computed them
    t = precdbg.open_dump(dumps("clip")).records(step=0)
    inner = (t["kind"] == "api") & (t["direction"] == "forward") & (t["role"] == "input") \
        & np.char.startswith(t["module"], "transformer.h.") & (t["dtype"] == "float32")
    assert inner.sum() > 50 and np.all(t["producer"][inner] >= 0), \
        t["entry"][inner & (t["producer"] < 0)][:5]


def test_unscale_in_place_is_a_producer_and_the_dw_is_still_named(dumps, tmp_path):
    # GradScaler.unscale_ rewrites the gradients in place (no new version): its outputs get
    # their own statistics, and clipping reads what it produced
    unscale = "Torch._amp_foreach_non_finite_check_and_unscale_.0.forward"
    t = precdbg.open_dump(dumps("unscale")).records(step=0)
    first_grad = (t["entry"] == unscale) & (t["arg_index"] == 0)
    norm_in = float(t["norm"][first_grad & (t["role"] == "input")][0])
    norm_out = float(t["norm"][first_grad & (t["role"] == "output")][0])
    assert norm_out == pytest.approx(norm_in / 1024.0, rel=1e-6), (norm_in, norm_out)
    assert set(_reads(dumps("unscale"), "Torch._foreach_norm.0.forward")) == {unscale}
    result, _ = _compare(dumps, "unscale", "unscale_dw", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight", code="dw_only")
    assert first["name_a"] == DW, cs.describe(result)


def test_ddp_defect_on_rank_1_is_named_on_rank_1(dumps, tmp_path):
    result, _ = _compare(dumps, "ddp", "ddp_dw_rank1", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight",
                            code="dw_only")
    assert first["rank"] == 1 and first["name_a"] == DW, \
        cs.describe(result)
    # the walk starts where the difference came first in the step, rank 1's backward; rank 0
    # sees it only after DDP's all-reduce, a consequence
    chain = first["chain"]
    assert {link["rank"] for link in chain} == {1}, chain
    assert any(c["rank"] == 0 for c in result["consequences"]), result["consequences"]


def test_ddp_data_on_rank_1_is_input_data_on_rank_1(dumps, tmp_path):
    # rank 0 only sees averaged gradients differ; the chain leads through rank 1's dw, its
    # backward and its forward to the tokens
    result, _ = _compare(dumps, "ddp", "ddp_data_rank1", tmp_path)
    first = cs.assert_first(result, step=0, direction="forward", kind=("api", "module"),
                            module=None, code="input_data")
    assert first["rank"] == 1 and first["role"] == "input", cs.describe(result)
    assert first["op"] in ("embedding", "reshape", "view", "gpt2_lm_head_model"), \
        cs.describe(result)
    chain = first["chain"]
    assert {link["rank"] for link in chain} == {1}, chain


def test_captured_all_reduce_leads_to_the_rank_whose_input_differs(dumps, tmp_path):
    result, _ = _compare(dumps, "allreduce", "allreduce_dw_rank1", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight", code="dw_only")
    assert first["rank"] == 1 and first["name_a"] == DW, cs.describe(result)
    assert {link["rank"] for link in first["chain"]} == {1}, first["chain"]
    # all_reduce writes the gradient in place without a new version: what reads it afterwards
    # sees the reduced values (not statistics cached from before) and names all_reduce
    rows = {(r["rank"], r["name_a"], r["role"]): r for r in result["rows"]}
    reduce_name = next(r["name_a"] for r in result["rows"] if r["rank"] == 0
                       and r["name_a"].startswith("Distributed.all_reduce.") and r["role"] == "output"
                       and r["status"] == "diverged")
    div = next(r for r in result["rows"] if r["rank"] == 0 and r["role"] == "input"
               and r["producer_a"] == reduce_name)
    assert div["status"] == "diverged", div
    assert rows[(0, reduce_name, "input")]["status"] == "match"
    assert rows[(0, reduce_name, "output")]["norm_a"] != rows[(0, reduce_name, "input")]["norm_a"]


def test_shared_gradient_buffer_leads_to_what_wrote_the_slice(dumps, tmp_path):
    # all_reduce reads the whole bucket, whose last writer (the second weight's copy) agrees;
    # the difference came first on rank 1, where the verdict starts
    result, _ = _compare(dumps, "bucket", "bucket_dw_rank1", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight", code="dw_only")
    assert first["rank"] == 1 and first["name_a"] == DW, cs.describe(result)
    # rank 0 alone (rank 1 not compared): its all_reduce, whose inputs agree, is named
    alone = compare_dumps(dumps("bucket"), dumps("bucket_dw_rank1"), rank=0)
    cs.assert_first(alone, step=0, direction="forward", kind="api", module="", op="all_reduce",
                    code={"op_differs", "backward_only", "argument"})


def test_recompute_swapped_activation_is_not_input_data(dumps, tmp_path):
    result, _ = _compare(dumps, "recompute", "recompute_act", tmp_path)
    first = cs.assert_first(result, step=0, direction="forward", kind="module",
                            module=rl.ACT_MODULE, code={"structure", "calls_differ"})
    assert first["code"] != "input_data", cs.describe(result)
    assert "NewGELUActivation" in first["name_a"] and ".GELU." in first["name_b"], \
        cs.describe(result)


def test_recompute_keeps_dw_verdict(dumps, tmp_path):
    result, _ = _compare(dumps, "recompute", "recompute_dw", tmp_path)
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="transformer.h.1.mlp.c_fc", op="weight", code="dw_only")
    assert first["name_a"] == DW, cs.describe(result)


def test_accumulation_second_micro_batch_data(dumps, tmp_path):
    result, _ = _compare(dumps, "accum", "accum_data2", tmp_path)
    first = cs.assert_first(result, step=0, direction="forward", kind="module", module="",
                            code="input_data")
    # the model's call on the second micro-batch; everything of the first one agrees
    assert first["name_a"] == "Module.GPT2LMHeadModel.forward.1", cs.describe(result)
    first_pass = [r for r in result["rows"] if r["name_a"] == "Module.GPT2LMHeadModel.forward.0"]
    assert first_pass and all(r["status"] == "match" for r in first_pass), first_pass


# =========================================================================== MindSpore
@pytest.fixture(scope="module")
def ms_dumps(tmp_path_factory) -> Dict[str, str]:
    pytest.importorskip("mindspore")
    root = tmp_path_factory.mktemp("realloop_ms")
    return {"base": rl.dump_mindspore(str(root / "base"), defect=False),
            "dw": rl.dump_mindspore(str(root / "dw"), defect=True)}


def test_mindspore_records_carry_producers(ms_dumps):
    producers = _reads(ms_dumps["base"], "Functional.clip_by_global_norm.0.forward")
    assert producers and all(p is not None and p.startswith("Param.") and p.endswith(".grad")
                             for p in producers), producers
    t = precdbg.open_dump(ms_dumps["base"]).records(step=0)
    inner = (t["kind"] == "api") & (t["direction"] == "forward") & (t["role"] == "input") \
        & np.char.startswith(t["module"], "blocks.") & (t["dtype"] == "float32")
    assert inner.sum() > 30 and np.all(t["producer"][inner] >= 0), \
        t["entry"][inner & (t["producer"] < 0)][:5]


def test_mindspore_dw_only_defect(ms_dumps):
    result = compare_dumps(ms_dumps["base"], ms_dumps["dw"])
    first = cs.assert_first(result, step=0, direction="backward", kind="param_grad",
                            module="blocks.1.mlp.fc", op="weight", code="dw_only")
    assert first["name_a"] == "Param.blocks.1.mlp.fc.weight.grad", cs.describe(result)


# =========================================================================== older files
def test_schema_1_files_still_read(dumps, tmp_path):
    import h5py
    old = tmp_path / "v1"
    shutil.copytree(dumps("clip_dw"), old)
    for path in old.glob("step*/rank*.h5"):
        with h5py.File(path, "r+") as f:
            del f["records/producer"]
            f.attrs["schema_version"] = 1
    t = precdbg.open_dump(str(old)).records(step=0)
    assert len(t) and np.all(t["producer"] == -1)
    # without provenance the timeline alone still names the weight gradient
    result = compare_dumps(dumps("clip"), str(old))
    assert result["first_divergence"]["name_a"] == DW, cs.describe(result)


# --------------------------------------------------------------------------- structure (issue 10)
def test_structural_swap_under_bf16_is_named_at_its_module(dumps, tmp_path):
    """GPT-2's tanh GELU (seven elementwise calls) replaced by nn.GELU() in layer 1, forward
    under CPU bf16 autocast: the change stays within bf16 rounding in the layer itself, and the
    first record beyond a tolerance is a float32 residual add after it. The module whose class
    and calls differ is named, with the calls."""
    result, stdout = _compare(dumps, "bf16", "bf16_act", tmp_path)
    first = cs.assert_first(result, step=0, direction="forward", kind="module",
                            module=rl.ACT_MODULE, code="structure")
    assert "NewGELUActivation" in first["name_a"] and ".GELU." in first["name_b"]
    structure = first["structure"]
    assert (structure["class_a"], structure["class_b"]) == ("NewGELUActivation", "GELU")
    assert "Torch.tanh" in structure["calls_a"] and structure["calls_b"] == ["Functional.gelu"]


def test_clean_bf16_pair_has_no_structural_difference(dumps, tmp_path):
    proc = cs.run_cli("compare", dumps("bf16"), dumps("bf16_rerun"), "--json",
                      str(tmp_path / "same.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_other_tokens_are_still_input_data_where_integers_differ(dumps, tmp_path):
    """Token ids are integers too: where they differ, the floating-point records reading
    them differ as well, and the verdict stays the input data."""
    result, _ = _compare(dumps, "accum", "accum_data2", tmp_path)
    assert not [r for r in result["rows"] if r["status"] == "integer"]
