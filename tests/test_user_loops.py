"""What users do inside a captured step that the plain loop does not: copy or save the model
(a best-model snapshot, a checkpoint), keep TorchScript submodules, validate an
nn.TransformerEncoder in eval (its fused fast path), step an optimizer that takes a closure
(LBFGS). Each runs under a real PrecisionDebugger on real modules and is read back from disk."""
from __future__ import annotations

import copy
import dataclasses
import io
import logging
from typing import Callable, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import precdbg
from precdbg_pt import PrecisionDebugger

from torch_support import make_model


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
               + len(m._forward_hooks_with_kwargs) + len(m._forward_pre_hooks_with_kwargs)
               + len(m._forward_hooks_always_called) for m in model.modules())


def _users_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    return None


@pytest.mark.parametrize("level", ["mix", "module", "api"])
def test_a_model_copied_or_saved_while_captured_carries_no_hooks(tmp_path, level):
    model = make_model()
    user_hook = model.blocks[0].register_forward_hook(_users_hook)   # the user's own
    x = torch.randint(0, 64, (2, 8))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    dbg.start(model)
    model(x).float().mean().backward()
    snapshot = copy.deepcopy(model)                 # a best-model snapshot inside the window
    saved = io.BytesIO()
    torch.save(model, saved)                        # a whole-model checkpoint
    assert _hook_count(model) > 1                   # precdbg's hooks are on the model itself
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    for copied in (snapshot, loaded):
        # the user's hook is copied (its dict entries and the with-kwargs flags of none of ours)
        assert _hook_count(copied) == 1
        assert list(copied.blocks[0]._forward_hooks) == list(model.blocks[0]._forward_hooks)
        assert torch.equal(copied(x), model(x))
    assert _hook_count(model) == 1
    user_hook.remove()
    with precdbg.open_dump(str(tmp_path / "dump")) as dump:
        assert len(dump.records(step=0)) > 0


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _WithScripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scripted = torch.jit.script(_Pair())
        self.traced = torch.jit.trace(_Pair(), torch.randn(2, 8))
        self.plain = _Pair()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.plain(self.traced(self.scripted(x)))


def test_torchscript_submodules_are_left_unhooked_and_the_rest_is_captured(tmp_path, caplog):
    torch.manual_seed(0)
    model = _WithScripted()
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=path, level="mix")
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        dbg.start(model)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        dbg.stop()
        dbg.step()
    assert dbg.close() and dbg.failures == 0
    said = [r.getMessage() for r in caplog.records if "TorchScript" in r.getMessage()]
    assert len(said) == 1 and "'scripted', 'traced'" in said[0], said
    with precdbg.open_dump(path) as dump:
        table = dump.records(step=0)
        modules = set(table["module"][table["kind"] == "module"].tolist())
        assert {"plain", "plain.a", "plain.b", ""} <= modules
        assert not any(m.startswith(("scripted", "traced")) for m in modules)
        grads = set(table["api"][table["kind"] == "param_grad"].tolist())
        assert {"scripted.a.weight", "traced.b.bias", "plain.a.weight"} <= grads
        assert dump.run["manifest"]["unobserved"] == {"compiler": "torch.jit",
                                                      "modules": ["scripted", "traced"]}


def _encoder() -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0,
                                       batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True)


def _evaluate(model: nn.Module, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        out = model(x, src_key_padding_mask=pad)
    model.train()
    return out.to_padded_tensor(0.0) if out.is_nested else out


@pytest.mark.parametrize("level", ["mix", "api"])
def test_eval_fast_path_of_a_transformer_encoder_gives_the_same_numbers(tmp_path, level, caplog,
                                                                       monkeypatch):
    """Captured API calls would send nn.TransformerEncoder to its slow path in eval (padding
    positions come out nonzero instead of 0): it runs its fast path unobserved instead. The
    nested tensor it hands its layers is recorded as its values."""
    model = _encoder()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=g)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    expected = _evaluate(model, x, pad)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        dbg.start(model)
        model(x).pow(2).mean().backward()           # training: captured as usual
        got = _evaluate(model, x, pad)
        dbg.stop()
        dbg.step()
    assert dbg.close() and dbg.failures == 0
    assert torch.equal(got, expected)
    assert any("fast path" in r.getMessage() for r in caplog.records)
    with precdbg.open_dump(str(tmp_path / "dump")) as dump:
        table = dump.records(step=0)
        ops = set(table["op"][table["kind"] == "api"].tolist())
        assert "linear" in ops                      # the training forward's calls are there
        if level == "mix":                          # the eval calls of the layers: their input
            layer = table.select((table["kind"] == "module") & (table["module"] == "layers.1")
                                 & (table["role"] == "input") & (table["arg_index"] == 0))
            assert sorted(layer["numel"].tolist()) == [12 * 16, 3 * 5 * 16]


def _lbfgs_run(tmp_path, level: str) -> List[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x.sum(1, keepdim=True).sin()
    evaluations: List[float] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        evaluations.append(float(loss.detach()))
        return loss

    dbg = PrecisionDebugger(dump_path=str(tmp_path / level), level=level) if level else None
    for step in range(2):
        if dbg is not None and step == 1:
            dbg.start(model)
        opt.step(closure)
        if dbg is not None and step == 1:
            dbg.stop()
            dbg.step()
    if dbg is not None:
        assert dbg.close() and dbg.failures == 0
    return evaluations


@pytest.mark.parametrize("level", ["mix", "module"])
def test_an_optimizer_closure_is_captured_as_the_model(tmp_path, level):
    """LBFGS evaluates the model in the closure it is given, several times per step, inside
    its own step(): those forwards and backwards are the model's, captured in the forward and
    backward phases, not skipped with the optimizer's own arithmetic."""
    assert _lbfgs_run(tmp_path, level) == _lbfgs_run(tmp_path, "")
    with precdbg.open_dump(str(tmp_path / level)) as dump:
        table = dump.records(step=0)
    forward = table.select((table["kind"] == "module") & (table["direction"] == "forward"))
    calls = set(forward["entry"][forward["module"] == "0"].tolist())
    assert len(calls) >= 2, calls                    # the closure ran more than once
    assert "optimizer" not in set(forward["phase"].tolist())
    assert (table["kind"] == "param_grad").sum() >= 8   # 4 parameters, twice or more
    if level == "mix":
        assert "linear" in set(table["op"][table["kind"] == "api"].tolist())


class _HandsThrough(nn.Module):
    """Returns a new tensor and, unchanged, one of its inputs (T5's attention hands the position
    bias it was given on to the next layer; DeBERTa's encoder returns its input among its hidden
    states)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, bias: torch.Tensor):
        return torch.tanh(self.fc(x) + bias), bias


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(8))
        self.layers = nn.ModuleList([_HandsThrough() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias * 2
        for layer in self.layers:
            x, bias = layer(x, bias)
        return x


def test_a_module_handing_an_input_through_keeps_its_backward(tmp_path):
    torch.manual_seed(0)
    model = _Stack()
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=path, level="module")
    dbg.start(model)
    model(torch.randn(4, 8, requires_grad=True)).pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    with precdbg.open_dump(path) as dump:
        table = dump.records(step=0)
    backward = table.select((table["kind"] == "module") & (table["direction"] == "backward"))
    for i in range(3):
        mine = backward.select(backward["module"] == f"layers.{i}")
        roles = sorted(zip(mine["role"].tolist(), mine["arg_index"].tolist()))
        # dy of the new output, dx of x and of the bias; none for the bias handed through
        assert roles == [("grad_input", 0), ("grad_input", 1), ("grad_output", 0)], (i, roles)


def test_what_a_modules_pre_hooks_compute_runs_inside_the_module(tmp_path):
    """Pruning's masked weight (`weight_orig * weight_mask`) and a user's own pre-hook are
    computed by the module's forward pre-hooks: their calls belong to that module (not to its
    parent, before the module's call), and the module's inputs are those its forward gets."""
    import torch.nn.utils.prune as prune
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    prune.l1_unstructured(model[0], "weight", amount=0.5)
    model[2].register_forward_pre_hook(lambda module, args: (args[0] * 0.5,))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    dbg.start(model)
    model(torch.randn(4, 8)).sum().backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and not dbg.failures
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)

    def rows(entry: str, role: str):
        return [t.row(i) for i in range(len(t)) if t["entry"][i] == entry and
                t["role"][i] == role]
    masked = rows("Tensor.mul.0.forward", "output")[0]
    assert masked["module"] == "0", masked
    scaled = rows("Tensor.mul.1.forward", "output")[0]
    assert scaled["module"] == "2", scaled
    module_input = rows("Module.2.Linear.forward.0", "input")[0]
    assert module_input["producer"] == scaled["seq"]        # the input its forward got
    for name, inner in (("Module.0.Linear.forward.0", masked), ("Module.2.Linear.forward.0",
                                                                scaled)):
        assert rows(name, "input")[0]["order"] < inner["order"]   # the module's call began first


@dataclasses.dataclass
class _BlockOutput:
    hidden: torch.Tensor
    extra: object = None


class _Block(nn.Module):
    """Returns its hidden state with a second float output (computed straight from its input)
    that the caller drops, or a plain dataclass."""

    def __init__(self, returns: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.returns = returns

    def forward(self, x: torch.Tensor):
        h = torch.tanh(self.lin(x))
        if self.returns == "unused_output":
            return h, x.sum()
        return _BlockOutput(h, None)


class _Outer(nn.Module):
    def __init__(self, returns: str) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.blk = _Block(returns)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.blk(self.pre(x))
        return (out[0] if isinstance(out, tuple) else out.hidden).sum()


@pytest.mark.parametrize("returns", ["unused_output", "dataclass"])
@pytest.mark.parametrize("level", ["mix", "module"])
def test_a_modules_backward_is_recorded_whatever_its_outputs_are(tmp_path, returns, level):
    """A module with an output no gradient reaches (its node never runs, so one edge into the
    input never arrives) still gets its dx: what arrived, recorded when the backward ends. A
    module returning a plain dataclass gets its outputs, dy and dx as a tuple's would. The dx
    is the input's true gradient."""
    torch.manual_seed(0)
    model = _Outer(returns)
    seen = {}

    def keep_input(mod: nn.Module, args: tuple) -> None:
        args[0].retain_grad()               # its .grad: the true gradient of the input
        seen["input"] = args[0]
    model.blk.register_forward_pre_hook(keep_input)
    x = torch.randn(4, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    dbg.start(model)
    model(x).backward()
    dbg.stop()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    rows = [t.row(i) for i in range(len(t)) if t["entry"][i].startswith("Module.blk._Block.")]
    roles = {(r["direction"], r["role"]) for r in rows}
    assert roles == {("forward", "input"), ("forward", "output"), ("backward", "grad_output"),
                     ("backward", "grad_input")}, roles
    dx = [r for r in rows if r["role"] == "grad_input"]
    assert len(dx) == 1
    expected = float(seen["input"].grad.double().norm())
    assert dx[0]["norm"] == pytest.approx(expected, rel=1e-6)


def test_a_lazy_modules_first_step_is_dumped(tmp_path, caplog):
    """nn.LazyLinear has no shape before its first forward: start(model) on that step left the
    step undumped. Its uninitialized parameters are left out of that step's inventory (said
    once); the step is dumped, and the next step's inventory has them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for _ in range(2):
            dbg.start(model)
            model(torch.randn(2, 3)).sum().backward()
            dbg.stop()
            dbg.step()
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    assert dump.steps == [0, 1]
    inventory = []
    for step in (0, 1):
        t = dump.records(step=step)
        inventory.append({t["api"][i] for i in range(len(t)) if t["kind"][i] == "param"
                          and t["direction"][i] == "none"})
        assert any(t["entry"][i].startswith("Functional.linear.0.forward")
                   for i in range(len(t)))
    assert inventory[0] == {"2.weight", "2.bias"}
    assert inventory[1] == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert sum("lazy module" in r.getMessage() for r in caplog.records) == 1


class _Pairs(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.x = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tanh(self.x[i]) * 2             # torch calls of the data pipeline


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_iterated_inside_the_step_is_not_captured(tmp_path, workers):
    """A validation loader iterated inside the captured step: its seed draw, its dataset and
    collate, and the tensors rebuilt as workers' batches arrive (when they arrive depends on
    the workers' timing, which shifted the calls around them between two runs) are data
    loading, not captured; the model's calls on each batch are."""
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    loader = torch.utils.data.DataLoader(_Pairs(), batch_size=4, num_workers=workers)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    dbg.start(model)
    with torch.no_grad():
        outputs = [model(batch) for batch in loader]
    dbg.stop()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    apis = {str(a) for a, k in zip(t["api"], t["kind"]) if k == "api"}
    assert not apis & {"empty", "random_", "tanh", "stack", "mul"}, apis
    linear = {str(e) for e in t["entry"] if str(e).startswith("Functional.linear.")}
    assert linear == {"Functional.linear.0.forward", "Functional.linear.1.forward"}, linear
    assert len(outputs) == 2


def test_a_gradient_torch_autograd_grad_returns_is_no_dw(tmp_path):
    """MAML: an inner `torch.autograd.grad` gives the parameters' gradients back to the caller
    (never into .grad); the outer backward accumulates the step's dw. Only the latter is the
    parameter's dw record (the inner one took its name, and the true dw became `.grad.1`)."""
    from torch.func import functional_call
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    x = torch.randn(8, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    dbg.start(net)
    params = dict(net.named_parameters())
    inner = torch.autograd.grad((net(x) ** 2).mean(), list(params.values()), create_graph=True)
    fast = {k: p - 0.1 * g for (k, p), g in zip(params.items(), inner)}
    (functional_call(net, fast, (x,)) ** 2).mean().backward()
    dbg.stop()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    dw = {str(t["entry"][i]): float(t["norm"][i]) for i in range(len(t))
          if t["kind"][i] == "param_grad"}
    assert set(dw) == {"Param.weight.grad", "Param.bias.grad"}, dw
    assert dw["Param.weight.grad"] == pytest.approx(float(net.weight.grad.double().norm()),
                                                    rel=1e-6)
    assert dw["Param.bias.grad"] == pytest.approx(float(net.bias.grad.double().norm()), rel=1e-6)
