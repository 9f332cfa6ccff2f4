"""Precision-aware tolerance: a record's tolerance follows the precision its values carry (the
`precision` column recorded at dump time), not only its dtype.

Real runs of the tiny GPT (tests/compare_support.py) under CPU bfloat16 autocast, in
subprocesses: a float32 record downstream of a bf16 linear (the residual stream, block 1's
LayerNorm) carries bf16 rounding and is judged at the bf16 tolerance 2^-8; a clean pair (1 vs 2
threads) matches; a 1e-2 scaling of one bf16 layer's output, which the former dtype tolerance for
bf16 (1.6e-2) let through, is found; GELU tanh vs exact under autocast is found at
blocks.1.mlp.act.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, Optional

import numpy as np
import pytest

import precdbg
import compare_support as cs
from compare_support import (PYTHON, REPO, THIS, assert_first, assert_match)
from precdbg.compare import compare_dumps
from precdbg.compare.report.formats import summary_text
from precdbg.compare.judge.metrics import TOLERANCE

BF16_TOL = 2.0 ** -8


def _dumps(root, specs: Dict[str, Dict[str, Optional[str]]]) -> Dict[str, str]:
    """Dump every spec at once in its own process (autocast on): {name: path}."""
    procs, paths = {}, {}
    for name, spec in specs.items():
        paths[name] = str(root / name)
        args = [PYTHON, THIS, paths[name], "--autocast", "--threads", spec.get("threads") or "1"]
        if spec.get("defect"):
            args += ["--defect", spec["defect"]]
        procs[name] = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {out[-2000:]}"
    return paths


@pytest.fixture(scope="module")
def bf16(tmp_path_factory) -> Dict[str, str]:
    return _dumps(tmp_path_factory.mktemp("bf16"), {
        "base": {}, "threads2": {"threads": "2"}, "scaled": {"defect": "proj_1e-2"},
        "gelu_tanh": {"defect": "gelu_tanh"}})


def test_tolerances_below_float32_are_msprobes_thresholds():
    assert TOLERANCE["bfloat16"] == BF16_TOL and TOLERANCE["float16"] == 2.0 ** -10
    assert TOLERANCE["float8_e4m3fn"] == 2.0 ** -4 and TOLERANCE["float32"] == 2e-5


def test_records_carry_the_precision_they_were_computed_with(bf16):
    t = precdbg.open_dump(bf16["base"]).records(step=0)

    def precision(**where) -> set:
        mask = np.ones(len(t), dtype=bool)
        for key, value in where.items():
            mask &= t[key] == value
        assert mask.any(), where
        return set(t["precision"][mask].tolist())
    # before any bf16 op: float32 all the way (embedding, first LayerNorm's input)
    assert precision(kind="api", op="embedding", role="output") == {"float32"}
    assert precision(kind="module", module="blocks.0.ln_1", role="input",
                     direction="forward") == {"float32"}
    # an autocast linear: float32 inputs, bf16 output
    assert precision(kind="api", module="blocks.0.attn.qkv", role="output",
                     direction="forward") == {"bfloat16"}
    # block 1's LayerNorm computes in float32 (CPU autocast keeps layer_norm in float32) on a
    # residual stream that went through bf16 linears: float32 records carrying bf16
    ln = (t["module"] == "blocks.1.ln_1") & (t["kind"] == "api") & (t["role"] == "output") & \
        (t["direction"] == "forward")
    assert set(t["dtype"][ln].tolist()) == {"float32"}
    assert set(t["precision"][ln].tolist()) == {"bfloat16"}
    # gradients and dw flow back through bf16; the inventory is what it is
    assert precision(kind="param_grad") == {"bfloat16"}
    assert precision(kind="param", role="param") == {"float32"}
    ints = t["dtype"] == "int64"
    assert ints.any() and set(t["precision"][ints].tolist()) == {""}


def test_clean_bf16_pair_matches_and_float32_records_get_the_bf16_tolerance(bf16):
    result = compare_dumps(bf16["base"], bf16["threads2"])
    assert_match(result)
    rows = [r for r in result["rows"] if r["module"] == "blocks.1.ln_1" and r["kind"] == "api"
            and r["role"] == "output" and r["direction"] == "forward"]
    assert rows and all(r["dtype_a"] == "float32" and r["tol"] == BF16_TOL for r in rows)


def test_a_one_percent_change_in_a_bf16_layer_is_found(bf16):
    result = compare_dumps(bf16["base"], bf16["scaled"])
    first = assert_first(result, step=0, direction="forward", kind={"module", "api"},
                         module="blocks.0.attn.proj")
    err = first["metrics"]["err"]
    assert BF16_TOL < err < 1.6e-2, first      # the former bf16 tolerance (1.6e-2) missed it


def test_gelu_tanh_versus_exact_under_bf16_autocast_is_found(bf16):
    result = compare_dumps(bf16["base"], bf16["gelu_tanh"])
    first = assert_first(result, step=0, direction="forward", kind={"module", "api"},
                         module="blocks.1.mlp.act", op="gelu")
    assert [a["key"] for a in first["evidence"]["arguments_bad"]] == ["approximate"], first


def test_old_files_without_the_column_use_the_dtype(bf16, tmp_path):
    """A schema-1 file (no precision column) reads with precision '' and is judged by dtype."""
    import h5py
    import shutil
    old = tmp_path / "old"
    shutil.copytree(bf16["base"], old)
    for root, _, files in os.walk(old):
        for name in files:
            if name.endswith(".h5"):
                with h5py.File(os.path.join(root, name), "r+") as f:
                    del f["records"]["precision"]
                    del f["modules"]["settings"]
                    f.attrs["schema_version"] = 1
    dump = precdbg.open_dump(str(old))
    t = dump.records(step=0)
    assert set(t["precision"].tolist()) == {""}
    assert all(settings == {} for _, settings in dump.module_settings(0).values())
    result = compare_dumps(str(old), bf16["threads2"])
    rows = [r for r in result["rows"] if r["module"] == "blocks.1.ln_1" and r["kind"] == "api"
            and r["role"] == "output" and r["direction"] == "forward"]
    assert rows and all(r["tol"] == BF16_TOL for r in rows)   # the coarser side decides


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("autocast", [True, False])
def test_gradients_read_after_backward_carry_the_backward_precision(tmp_path, micro_batches,
                                                                    autocast):
    """clip_grad_norm_ reads every `.grad` after backward: with the forward under bf16 autocast,
    those reads (and what they compute) carry bf16 like the dw records, so a float32-vs-bf16
    comparison judges them at the bf16 tolerance, not at float32's 2e-5. With two micro-batches
    `.grad` is accumulated in place (a new version nothing captured read before): the read
    carries what the record that wrote it carried. Without autocast everything stays float32."""
    import torch
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path),
                                 step=[0])
    debugger.start(model)
    for _ in range(micro_batches):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(torch.randn(8, 16)).float().pow(2).mean()
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    assert debugger.close() and debugger.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    want = {"bfloat16"} if autocast else {"float32"}
    dw = t["kind"] == "param_grad"
    assert dw.sum() == 4 * micro_batches and set(t["precision"][dw].tolist()) == want
    norms = (t["api"] == "_foreach_norm") & (t["dtype"] == "float32")
    assert norms.sum() == 8          # the four gradients read, their four norms
    assert set(t["precision"][norms].tolist()) == want
    scaled = (t["api"] == "_foreach_mul_") & (t["dtype"] == "float32")
    assert scaled.any() and set(t["precision"][scaled].tolist()) == want


class _MaskedNet:
    """A linear, then a constant made in the dtype of its output (`torch.tensor(v,
    dtype=h.dtype)`, as transformers' attention masks are made), then a cast of the result to
    `cast_to`."""

    def __init__(self, cast_to: "object") -> None:
        import torch
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        self.cast_to = cast_to

    def loss(self, x):
        import torch
        h = self.model[0](x)
        floor = torch.tensor(-1e4, dtype=h.dtype)
        h = torch.maximum(h, floor).to(self.cast_to)
        return self.model[1](h.float()).float().pow(2).mean()


def _dump_masked(path: str, autocast: bool, cast_to: "object") -> str:
    import torch
    from precdbg_pt import PrecisionDebugger

    net = _MaskedNet(cast_to)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=path, step=[0])
    debugger.start(net.model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = net.loss(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)))
    loss.backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and debugger.failures == 0
    return path


def test_dtype_arguments_that_follow_a_precision_difference_are_not_its_culprit(tmp_path):
    """float32 vs bf16 autocast: `torch.tensor(v, dtype=h.dtype)` passes float32 in one run and
    bfloat16 in the other because the linear before it ran under autocast; the argument is
    recorded as a dtype (py.dtype), its pair counts as that precision difference (status
    'precision', a note says so) and is not named as the first divergence. A cast whose dtype
    argument is where the precisions first part (`.to(float16)` in one run only) stays the
    culprit."""
    import torch
    fp32 = _dump_masked(str(tmp_path / "fp32"), False, torch.float32)
    bf16 = _dump_masked(str(tmp_path / "bf16"), True, torch.float32)
    t = precdbg.open_dump(bf16).records(step=0)
    made = np.nonzero((t["api"] == "tensor") & (t["dtype"] == "py.dtype"))[0]
    assert len(made) == 1 and t["text"][made[0]] == "bfloat16"
    result = compare_dumps(fp32, bf16)
    rows = [r for r in result["rows"] if r["name_a"].startswith("Torch.tensor.")
            and r["dtype_a"] == "py.dtype"]
    assert len(rows) == 1 and rows[0]["status"] == "precision"
    assert "precision_arguments" in cs.note_codes(result), result["notes"]
    first = result["first_divergence"]
    assert first is None or not first["name_a"].startswith("Torch.tensor."), first
    # a cast that is an identity in float32 has a backward under autocast only: the summary
    # shows such records as examples when no forward record lacks a counterpart
    only_b = [u for u in result["unmatched"] if u["side"] == "b"]
    assert only_b and all(u["role"] in ("grad_output", "grad_input") for u in only_b), only_b
    assert f"only in the candidate: {only_b[0]['name']} ({only_b[0]['role']}" in \
        summary_text(result)

    half = _dump_masked(str(tmp_path / "half"), False, torch.float16)
    result = compare_dumps(fp32, half)
    first = result["first_divergence"]
    assert first is not None and first["name_a"].startswith("Tensor.to."), first
    assert first["code"] == "argument" and [(a["a"], a["b"]) for a in first["evidence"][
        "arguments_bad"]] == [("float32", "float16")], first
    assert not [r for r in result["rows"] if r["status"] == "precision"]


class _KeyBiasAttention:
    """One softmax attention head whose key projection has a bias (as BERT's): softmax ignores
    a shift shared by a query's scores, so the key bias's gradient is exactly zero in exact
    arithmetic and each run holds only its rounding."""

    def __init__(self) -> None:
        import torch
        torch.manual_seed(0)
        self.model = torch.nn.ModuleDict({
            "q": torch.nn.Linear(32, 32), "k": torch.nn.Linear(32, 32),
            "v": torch.nn.Linear(32, 32), "out": torch.nn.Linear(32, 8)})

    def loss(self, x):
        import torch
        m = self.model
        scores = m["q"](x) @ m["k"](x).transpose(-1, -2) / 32 ** 0.5
        h = torch.softmax(scores.float(), dim=-1) @ m["v"](x).float()
        return m["out"](h).float().pow(2).mean()


def _dump_attention(path: str, autocast: bool) -> str:
    import torch
    from precdbg_pt import PrecisionDebugger

    net = _KeyBiasAttention()
    opt = torch.optim.SGD(net.model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=path, step=[0])
    debugger.start(net.model)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = net.loss(torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(1)))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    assert debugger.close() and debugger.failures == 0
    return path


def test_a_gradient_that_cancels_to_rounding_is_judged_against_what_it_was_reduced_from(
        tmp_path):
    """fp32 vs bf16 autocast: the key bias's gradient is rounding in both runs (norms orders of
    magnitude apart, relative error ~1 against its own scale). It is judged against the
    rounding of the dy it was summed from, and so are the records of the same values after it
    (its dw, clip_grad_norm_'s reads and results): the pair matches; the floor is on the rows
    and in a note. A 1e-2 change of the same dy would still be found (the floor is the
    tolerance times dy's norm)."""
    fp32 = _dump_attention(str(tmp_path / "fp32"), False)
    bf16 = _dump_attention(str(tmp_path / "bf16"), True)
    result = compare_dumps(fp32, bf16)
    dw = [r for r in result["rows"] if r["name_a"] == "Param.k.bias.grad"]
    assert len(dw) == 1 and dw[0]["floor"] is not None, dw
    assert dw[0]["norm_a"] < 1e-3 * dw[0]["floor"] and dw[0]["status"] == "match", dw[0]
    dx = [r for r in result["rows"] if r["module"] == "k" and r["role"] == "grad_input"
          and r["kind"] == "api" and r["floor"] is not None]
    assert dx and all(r["status"] == "match" for r in dx), dx
    assert not [r for r in result["rows"] if r["status"] == "diverged"]
    assert result["verdict"] == "match", result["first_divergence"]
    notes = cs.notes_of(result, "rounding_floor")
    assert len(notes) == 1 and "grad_input" in notes[0], notes   # names where a floor starts
    # without the floor the same pair is ~1 relative apart, far beyond the bf16 tolerance
    assert abs(dw[0]["norm_a"] - dw[0]["norm_b"]) > BF16_TOL * max(dw[0]["norm_a"],
                                                                   dw[0]["norm_b"])


def _dump_router(path: str, autocast: bool) -> str:
    """A mixture-of-experts router: two experts' scores differ by 1e-4 relative, which bf16
    cannot tell apart, so top-1 picks another expert under bf16 autocast."""
    import torch
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(0)
    gate = torch.nn.Linear(16, 4, bias=False)
    with torch.no_grad():
        gate.weight[1] = gate.weight[0] * (1 + 1e-4)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).abs()
    x[:, 0] += 4.0                       # every token prefers expert 0 or 1
    with torch.no_grad():
        gate.weight[:, 0] = 1.0
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=path, step=[0])
    debugger.start(gate)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        scores = gate(x).float()      # a cast with a backward under autocast only
    torch.topk(scores, 1, dim=-1).values.sum().backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and debugger.failures == 0
    return path


def test_a_selection_flipped_by_rounding_is_named_as_a_near_tie(tmp_path):
    """fp32 vs bf16 autocast: the router's scores agree within the bf16 tolerance, but top-1
    picks another expert for tokens whose two best scores bf16 rounds to one value. The top-k
    is the first divergence (the runs route differently from there), and the reason says its
    indices differ on inputs that are close, not equal: a near tie, not a wrong top-k."""
    fp32 = _dump_router(str(tmp_path / "fp32"), False)
    bf16 = _dump_router(str(tmp_path / "bf16"), True)
    t32 = precdbg.open_dump(fp32).records(step=0)
    assert "topk" in t32["api"].tolist()
    result = compare_dumps(fp32, bf16)
    first = result["first_divergence"]
    assert first is not None and first["op"] == "topk", first
    assert first["code"] == "near_tie", first
