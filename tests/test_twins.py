"""PyTorch vs MindSpore twins that must line up record for record: a CNN (Conv2d, BatchNorm2d,
ReLU, MaxPool2d, Flatten, Linear/Dense; tests/cnn_support.py) over two SGD steps, the same CNN
with MindSpore's BatchNorm momentum copied literally from torch (0.1 instead of 0.9), with a
bias on each Conv2d (a gradient BatchNorm leaves only rounding in), and the bundled GPT where
PyTorch calls F.gelu in MLP.forward while MindSpore has a GELU cell `mlp.act`.
Dumps are made in real subprocesses; `precdbg check` / `precdbg compare` run as commands.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, List

import pytest

pytest.importorskip("torch")
pytest.importorskip("mindspore")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CNN = os.path.join(REPO, "tests", "cnn_support.py")
PYTHON = sys.executable


def _run_all(commands: Dict[str, List[str]]) -> None:
    """Start every dump at once (two cores: MindSpore's start-up dominates), wait for all."""
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": REPO}
    procs = {name: subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name, cmd in commands.items()}
    failed = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            failed[name] = out[-3000:]
    assert not failed, failed


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "precdbg", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Dict[str, str]:
    root = tmp_path_factory.mktemp("cnn")
    paths = {name: str(root / name) for name in ("pt", "ms", "ms_momentum")}
    _run_all({"pt": [PYTHON, CNN, "torch", paths["pt"]],
              "ms": [PYTHON, CNN, "mindspore", paths["ms"]],
              "ms_momentum": [PYTHON, CNN, "mindspore", paths["ms_momentum"],
                              "--torch-momentum"]})
    return paths


def _compare(a: str, b: str, out: str) -> Dict:
    proc = _cli("compare", a, b, "--json", out)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def test_cnn_twin_is_clean_over_two_steps_with_nothing_unmatched(cnn, tmp_path):
    proc = _cli("check", cnn["pt"], cnn["ms"], "--json", str(tmp_path / "check.json"))
    assert proc.returncode == 0, proc.stdout        # moving_mean <-> running_mean: same inventory
    result = _compare(cnn["pt"], cnn["ms"], str(tmp_path / "compare.json"))
    assert result["verdict"] == "match", result["first_divergence"]
    assert result["unmatched_count"] == 0, result["unmatched"][:10]
    rows = result["rows"]
    assert {r["step"] for r in rows} == {0, 1}
    buffers = {r["name_b"] for r in rows if r["role"] == "buffer"}
    assert {"Buffer.bn1.moving_mean", "Buffer.bn1.moving_variance"} <= buffers
    assert any(r["op"] == "batch_norm" and r["kind"] == "api" for r in rows)


def test_cnn_twin_with_torch_momentum_names_bn1(cnn, tmp_path):
    out = tmp_path / "check.json"
    proc = _cli("check", cnn["pt"], cnn["ms_momentum"], "--json", str(out))
    assert proc.returncode == 1, proc.stdout
    data = json.loads(out.read_text())
    notes = [f for f in data["findings"] if f.get("id") == "batchnorm-momentum-convention"]
    assert len(notes) == 1 and notes[0]["message"].endswith("[bn1: momentum 0.1 vs 0.9]"), \
        data["findings"]
    assert [(d["path_a"], d["path_b"], d["setting"]) for d in data["layer_settings"]] == \
        [("bn1", "bn1", "momentum")]
    assert data["layer_settings"][0]["a"] == pytest.approx(0.1)
    assert data["layer_settings"][0]["b"] == pytest.approx(0.9)
    # step 0's numbers agree (the running statistics only differ at the start of step 1), but
    # a differing layer setting is a divergence of its own, named at bn1 where it first runs
    result = _compare(cnn["pt"], cnn["ms_momentum"], str(tmp_path / "compare.json"))
    first = result["first_divergence"]
    assert result["verdict"] == "diverged" and first["step"] == 0, first
    assert first["module"] == "bn1" and first["kind"] == "module", first
    assert first["code"] == "layer_setting", first
    assert [d["setting"] for d in first["structure"]["settings"]] == ["momentum"]
    assert result["unmatched_count"] == 0
    # the running statistics that momentum feeds differ at the start of step 1
    later = [c for c in result["consequences"] if c["step"] == 1 and c["module"] == "bn1"]
    assert later, result["consequences"]


# --------------------------------------------------------------------------- conv bias, BatchNorm
@pytest.fixture(scope="module")
def cnn_bias(tmp_path_factory) -> Dict[str, str]:
    """The CNN with a bias on each Conv2d (before its BatchNorm2d); `pt_off`: torch with conv1's
    bias gradient changed by 1e-3 of its dy's norm on each element (a tensor hook)."""
    root = tmp_path_factory.mktemp("cnn_bias")
    paths = {name: str(root / name) for name in ("pt", "ms", "pt_off")}
    _run_all({"pt": [PYTHON, CNN, "torch", paths["pt"], "--conv-bias"],
              "ms": [PYTHON, CNN, "mindspore", paths["ms"], "--conv-bias"],
              "pt_off": [PYTHON, CNN, "torch", paths["pt_off"], "--conv-bias",
                         "--bias-grad-offset", "1e-3"]})
    return paths


_BIAS_GRADS = {("Functional.conv2d.0.backward", "grad_input", 2),
               ("Functional.conv2d.1.backward", "grad_input", 2),
               ("Param.conv1.bias.grad", "param_grad", 0),
               ("Param.conv2.bias.grad", "param_grad", 0)}


def test_cnn_twin_with_conv_bias_before_batchnorm_matches(cnn_bias, tmp_path):
    """BatchNorm removes each channel's mean, so a conv bias's gradient before it is rounding in
    both runs (norms ~5e-8 against a dy of norm ~0.4; PyTorch and MindSpore 0.6 to 1.8 apart
    relative to themselves: conv2's was DIVERGED). Judged against the rounding of the dy it was
    summed from, and so is its Param grad record, the twin matches over two steps, with either
    run as the baseline (whose records the floor is found on)."""
    for a, b in (("pt", "ms"), ("ms", "pt")):
        out = tmp_path / f"{a}_{b}.json"
        proc = _cli("compare", cnn_bias[a], cnn_bias[b], "--json", str(out))
        result = json.loads(out.read_text())
        assert proc.returncode == 0, result["first_divergence"]
        assert result["verdict"] == "match" and result["unmatched_count"] == 0, \
            result["unmatched"][:10]
        rows = [r for r in result["rows"]
                if (r["name_a"], r["role"], r["arg_index"]) in _BIAS_GRADS]
        assert sorted((r["name_a"], r["step"]) for r in rows) == \
            sorted((name, step) for name, _, _ in _BIAS_GRADS for step in (0, 1))
        assert all(r["status"] == "match" for r in rows), rows
        # relative to their own scale most are far beyond the tolerance: the floor decided them
        apart = [r for r in rows
                 if abs(r["norm_a"] - r["norm_b"]) > r["tol"] * max(r["norm_a"], r["norm_b"])]
        assert len(apart) >= 4 and all(r["floor"] is not None for r in apart), rows


def test_cnn_twin_finds_a_real_change_of_a_conv_bias_gradient(cnn_bias, tmp_path):
    """conv1's bias gradient changed by 1e-3 of its dy's norm (the floor is the tolerance, 2e-5,
    of that norm): found at that gradient, against MindSpore's run and against the torch run
    without the change. (A change of 1e-3 of the gradient itself, ~5e-11, is far below what
    PyTorch and MindSpore already differ by there.)"""
    for base in ("ms", "pt"):
        out = tmp_path / f"{base}.json"
        proc = _cli("compare", cnn_bias[base], cnn_bias["pt_off"], "--json", str(out))
        result = json.loads(out.read_text())
        first = result["first_divergence"]
        assert proc.returncode == 1 and result["verdict"] == "diverged", first
        assert (first["step"], first["name_a"], first["name_b"], first["role"], first["module"]) \
            == (0, "Param.conv1.bias.grad", "Param.conv1.bias.grad", "param_grad", "conv1"), first
        (row,) = [r for r in result["rows"] if r["name_a"] == "Param.conv1.bias.grad"
                  and r["step"] == 0]
        assert row["status"] == "diverged" and row["err"] > 10 * row["tol"], row


# --------------------------------------------------------------------------- F.gelu vs GELU cell
_GELU_SCRIPT = r"""
import sys
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from precdbg_examples import gpt_torch
sys.path.insert(0, "tests")
from compare_support import SEED, dump_torch_steps, numpy_batch, tiny_config

class MLP(nn.Module):            # same class name as the twin's cell, no `act` child
    def __init__(self, fc, proj):
        super().__init__()
        self.fc, self.proj = fc, proj

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))

torch.manual_seed(SEED)
net = gpt_torch.GPT(tiny_config())
state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
for block in net.blocks:
    block.mlp = MLP(block.mlp.fc, block.mlp.proj)
x, y = numpy_batch()
np.savez(sys.argv[2], **state)
dump_torch_steps(sys.argv[1], net, torch.optim.SGD(net.parameters(), lr=0.1), [(x, y)])
"""

_MS_SCRIPT = r"""
import sys
import numpy as np
import mindspore as ms
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
sys.path.insert(0, "tests")
from compare_support import dump_mindspore, numpy_batch
state = dict(np.load(sys.argv[2]))
x, y = numpy_batch()
dump_mindspore(sys.argv[1], state, x, y)
"""


def test_functional_gelu_pairs_with_the_gelu_cell(tmp_path):
    """PyTorch calls F.gelu inside MLP.forward (module `blocks.<i>.mlp`); the MindSpore twin has
    a GELU cell `blocks.<i>.mlp.act`: the gelu records pair, nothing is left without
    counterpart, and the twin matches."""
    pt, ms_dump, weights = tmp_path / "pt", tmp_path / "ms", tmp_path / "w.npz"
    _run_all({"pt": [PYTHON, "-c", _GELU_SCRIPT, str(pt), str(weights)]})
    _run_all({"ms": [PYTHON, "-c", _MS_SCRIPT, str(ms_dump), str(weights)]})
    result = _compare(str(pt), str(ms_dump), str(tmp_path / "compare.json"))
    assert result["unmatched_count"] == 0, result["unmatched"][:10]
    assert result["verdict"] == "match", result["first_divergence"]
    # F.gelu's approximate='none' (its default) and the cell's approximate=False agree: no note
    assert not [f for f in result["setup"] if f.get("id") == "mindspore-gelu-approximate-default"]
    gelu = [r for r in result["rows"] if r["op"] == "gelu" and r["kind"] == "api"]
    assert {r["module"] for r in gelu} == {"blocks.0.mlp", "blocks.1.mlp"}
    assert {r["direction"] for r in gelu} == {"forward", "backward"}


# python -c _CUSTOM_CELL_SCRIPT PT_DUMP MS_DUMP FACTOR: the tiny GPT twin, one SGD step; the
# MindSpore twin's blocks[1].mlp.act is a user's own cell (a class name torch has no match
# for) with a custom bprop that scales the exact GELU gradient by FACTOR
_CUSTOM_CELL_SCRIPT = r"""
import math
import sys
import mindspore as ms
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
from mindspore import nn as msnn, ops
sys.path.insert(0, "tests")
import compare_support as cs


class GeluWithBprop(msnn.Cell):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def construct(self, x):
        return ops.gelu(x, approximate="none")

    def bprop(self, x, out, dout):
        cdf = 0.5 * (1.0 + ops.erf(x / math.sqrt(2.0)))
        pdf = ops.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return (dout * (cdf + x * pdf) * self.factor,)


x, y = cs.numpy_batch()
state = cs.dump_torch_numpy(sys.argv[1], x, y)
cs.dump_mindspore(sys.argv[2], state, x, y, act_1=GeluWithBprop(float(sys.argv[3])))
"""


def test_a_users_own_cell_pairs_with_the_torch_module_at_its_path(tmp_path):
    """nn.GELU at blocks.1.mlp.act against a MindSpore cell of the user's own class there: the
    module's records and the gelu call inside pair by path (they were all left unmatched, and
    the twin said MATCH with 10 records without counterpart); a bprop 1% off is named as a
    backward-only difference of that module, with its dx as evidence."""
    paths = {name: str(tmp_path / name) for name in ("pt", "ms_ok", "pt_", "ms_off")}
    _run_all({"ok": [PYTHON, "-c", _CUSTOM_CELL_SCRIPT, paths["pt"], paths["ms_ok"], "1.0"],
              "off": [PYTHON, "-c", _CUSTOM_CELL_SCRIPT, paths["pt_"], paths["ms_off"], "1.01"]})
    same = _compare(paths["pt"], paths["ms_ok"], str(tmp_path / "ok.json"))
    assert same["verdict"] == "match", same["first_divergence"]
    # the only records left: torch's autograd gelu backward, which the custom bprop replaces
    assert {(u["side"], u["name"]) for u in same["unmatched"]} == \
        {("a", "Functional.gelu.1.backward")}, same["unmatched"]
    paired = {(r["kind"], r["direction"]) for r in same["rows"]
              if r["module"] == "blocks.1.mlp.act" and r["op"] == "gelu"}
    assert paired == {("api", "forward"), ("module", "forward"), ("module", "backward")}, paired
    off = _compare(paths["pt_"], paths["ms_off"], str(tmp_path / "off.json"))
    first = off["first_divergence"]
    assert off["verdict"] == "diverged" and first["module"] == "blocks.1.mlp.act", first
    assert (first["kind"], first["direction"], first["role"]) == \
        ("module", "backward", "grad_input"), first
    assert first["code"] == "backward_only", first


# --------------------------------------------------------------------------- float16 twins
# python -c _HALF_SCRIPT PT_DUMP MS_DUMP MODE: the tiny GPT twin, one SGD step each. MODE
# "fp16": both models cast to float16; "o2": PyTorch in float32, MindSpore through
# ms.amp.auto_mixed_precision(net, "O2") (float16, LayerNorm kept float32 in wrapper cells)
_HALF_SCRIPT = r"""
import sys
import mindspore as ms
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
import torch
from mindspore import nn as msnn
sys.path.insert(0, "tests")
import compare_support as cs
import precdbg_ms
from precdbg_examples import gpt_ms, gpt_torch
mode = sys.argv[3]
x, y = cs.numpy_batch()
torch.manual_seed(cs.SEED)
net = gpt_torch.GPT(cs.tiny_config())
state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
if mode == "fp16":
    net = net.to(torch.float16)
else:             # logits cast in the root module, as loss code does: no counterpart in O2's
    forward = net.forward                  # casts, whose shapes are those of hidden states
    net.forward = lambda idx: forward(idx).float()
cs.dump_torch_steps(sys.argv[1], net, torch.optim.SGD(net.parameters(), lr=0.1), [(x, y)])
model = gpt_ms.GPT(gpt_ms.GPTConfig(**cs.TINY))
gpt_ms.load_torch_state(model, state)
if mode == "fp16":
    for p in model.get_parameters():
        p.set_dtype(ms.float16)
else:
    model = ms.amp.auto_mixed_precision(model, "O2")
step = gpt_ms.train_step_fn(model, msnn.SGD(model.trainable_params(), learning_rate=0.1))
dbg = precdbg_ms.PrecisionDebugger(dump_path=sys.argv[2], level="mix")
dbg.start(model)
step(ms.Tensor(x), ms.Tensor(y))
dbg.stop()
assert dbg.close() and not dbg.failures
"""


def test_float16_twin_matches_within_the_float16_tolerance(tmp_path):
    """PyTorch and MindSpore kernels in float16 (CPU) differ by a few units in the last place:
    the twin stays within the float16 tolerance (2^-10; min/max 4x), with margin, and every
    floating record is judged as float16."""
    pt, ms_dump = tmp_path / "pt", tmp_path / "ms"
    _run_all({"fp16": [PYTHON, "-c", _HALF_SCRIPT, str(pt), str(ms_dump), "fp16"]})
    result = _compare(str(pt), str(ms_dump), str(tmp_path / "compare.json"))
    assert result["verdict"] == "match", result["first_divergence"]
    assert result["unmatched_count"] == 0, result["unmatched"][:10]
    judged = [r for r in result["rows"] if r["dtype_b"] == "float16" and r["kind"] != "param"]
    assert judged and {r["tol"] for r in judged} == {2.0 ** -10}
    worst = max(r["err"] for r in judged)
    assert 1e-4 < worst < 0.8 * 2.0 ** -10, worst     # real float16 noise, under tolerance


def test_mindspore_amp_o2_is_named_through_its_wrappers(tmp_path):
    """`auto_mixed_precision(net, "O2")` wraps the network and each LayerNorm in cells holding
    them as `_backbone`: the MindSpore dump is named as the network itself, so against the
    PyTorch float32 run the parameters pair, the set-up check names the float16 compute, and the
    records pair within the float16 tolerance; only casts have no counterpart (O2's, and the
    PyTorch run's cast of its logits, which paired k-th with k-th with an O2 cast of a hidden
    state of another shape and was named the culprit)."""
    pt, ms_dump = tmp_path / "pt", tmp_path / "ms"
    _run_all({"o2": [PYTHON, "-c", _HALF_SCRIPT, str(pt), str(ms_dump), "o2"]})
    result = _compare(str(pt), str(ms_dump), str(tmp_path / "compare.json"))
    kinds = {f["kind"] for f in result["setup"]}
    assert "inventory" not in kinds and "compute_dtype" in kinds, result["setup"]
    dtype = next(f for f in result["setup"] if f["kind"] == "compute_dtype")
    assert "linear float32 vs float16" in dtype["message"], dtype["message"]
    assert result["verdict"] == "match", result["first_divergence"]
    casts = {"cast", "mixed_precision_cast"}
    assert result["unmatched"] and {u["op"] for u in result["unmatched"]} <= casts, \
        result["unmatched"][:6]
    paths = {r["module"] for r in result["rows"]}
    assert "blocks.0.ln_1" in paths and not [p for p in paths if "_backbone" in p]


# --------------------------------------------------------------------------- the bundled GPT twin
_GPT_SCRIPT = r"""
import sys
import mindspore as ms
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
sys.path.insert(0, "tests")
import compare_support as cs
x, y = cs.numpy_batch()
state = cs.dump_torch_numpy(sys.argv[1], x, y)
cs.dump_mindspore(sys.argv[2], state, x, y)
cs.dump_mindspore(sys.argv[3], state, x, y, default_gelu=True)
cs.dump_mindspore(sys.argv[4], state, x, y, default_layer_norm=True)
"""


def test_gpt_twin_notes_only_the_layer_that_keeps_mindspores_default(tmp_path):
    """The bundled twin passes approximate=False and epsilon=1e-5: no note on MindSpore's
    defaults (the check used to print both on every twin). With blocks.1.mlp.act left at
    MindSpore's nn.GELU() (tanh), the GELU note names that module and compare names it."""
    pt, ms_twin, ms_gelu, ms_eps = (str(tmp_path / n) for n in ("pt", "ms", "ms_gelu", "ms_eps"))
    _run_all({"gpt": [PYTHON, "-c", _GPT_SCRIPT, pt, ms_twin, ms_gelu, ms_eps]})
    clean = _compare(pt, ms_twin, str(tmp_path / "clean.json"))
    assert clean["verdict"] == "match" and clean["unmatched_count"] == 0, \
        (clean["first_divergence"], clean["unmatched"][:5])
    assert clean["setup"] == [], clean["setup"]
    result = _compare(pt, ms_gelu, str(tmp_path / "gelu.json"))
    notes = [f for f in result["setup"] if f.get("id") == "mindspore-gelu-approximate-default"]
    assert len(notes) == 1 and notes[0]["message"].endswith(
        "[blocks.1.mlp.act: approximate none vs tanh]"), result["setup"]
    assert not [f for f in result["setup"] if f.get("id") == "layernorm-epsilon-default"]
    first = result["first_divergence"]
    assert first["module"] == "blocks.1.mlp.act" and first["op"] == "gelu", first

    # every LayerNorm keeps MindSpore's default epsilon: the effect (~1e-6) stays under the
    # float32 tolerance, but the setting is a divergence of its own, named at the first one
    result = _compare(pt, ms_eps, str(tmp_path / "eps.json"))
    first = result["first_divergence"]
    assert result["verdict"] == "diverged", result["rows"][:3]
    assert (first["step"], first["module"], first["kind"]) == (0, "blocks.0.ln_1", "module"), \
        first
    assert first["code"] == "layer_setting", first
    assert [d["setting"] for d in first["structure"]["settings"]] == ["eps"], first


def test_step_files_without_run_json_still_map_mindspore_names(cnn, tmp_path):
    """Bare step files copied out of their dumps (no run.json): the step files say which
    framework wrote them, so MindSpore's parameter names (gamma, moving_mean) still map to
    PyTorch's and nothing is reported as one run's only; compare says which checks a missing
    manifest skipped."""
    import shutil
    files = {}
    for side in ("pt", "ms"):
        files[side] = str(tmp_path / f"{side}_step0.h5")
        shutil.copy(os.path.join(cnn[side], "step0", "rank0.h5"), files[side])
    result = _compare(files["pt"], files["ms"], str(tmp_path / "bare.json"))
    assert result["verdict"] == "match", result["first_divergence"]
    assert not [f for f in result["setup"] if f["kind"] == "inventory"], result["setup"]
    proc = _cli("compare", files["pt"], files["ms"])
    assert "note: no run manifest in baseline and candidate" in proc.stdout, proc.stdout
