"""`precdbg.scan.scanner`: the first non-finite value and the anomalies of one real dump
(small PyTorch models run under a PrecisionDebugger), the terminal text, the JSON and the exit
codes of `scan_main`."""
from __future__ import annotations

import argparse
import json
from typing import Callable, Dict, List, Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from precdbg.scan.scanner import (EXPLODING_GRAD_RATIO, VANISHING_GRAD_RATIO, format_scan,
                                  scan_dump, scan_main)
from precdbg.errors import DumpError
from precdbg_pt import PrecisionDebugger

from torch_support import dump_once


def _run(tmp_path, model: nn.Module, make_input: Callable[[int], torch.Tensor], steps: int = 1,
         sgd: bool = False, **settings) -> str:
    """Train `steps` steps of `model` (loss = model(x)) under a debugger; the dump's path."""
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=path, **settings)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if sgd else None
    for i in range(steps):
        dbg.start(model)
        loss = model(make_input(i))
        loss.backward()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        dbg.stop()
        dbg.step()
    assert dbg.close(), "the writer did not finish in time"
    assert dbg.failures == 0
    return path


def _randn(shape=(3, 4)):
    def make(i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(100 + i)
        return torch.randn(*shape, generator=g)
    return make


def _kinds(result: Dict) -> List[str]:
    return [f["kind"] for f in result["findings"]]


def _strict_json(path) -> Dict:
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    with open(path, "r", encoding="utf-8") as handle:
        return json.loads(handle.read(), parse_constant=refuse)


def _args(dump: str, json_path: Optional[str] = None, step=None, rank=None) -> argparse.Namespace:
    return argparse.Namespace(dump=dump, json=json_path, step=step, rank=rank)


# --------------------------------------------------------------------------- models
class LogOfNegative(nn.Module):
    """log(fc(x) - 100): NaN produced by `torch.log` from finite inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.log(self.fc(x) - 100.0)
        return self.out(h).mean()


class ExpOverflow(nn.Module):
    """exp(100 * |fc(x)| + 100) overflows to Inf; `h - h` then makes NaN (not the first)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.exp(self.fc(x).abs() * 100.0 + 100.0)
        return (h - h).sum()


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x))).mean()


class FullyMaskedSoftmax(nn.Module):
    """An intended -inf mask (masked_fill) that masks a whole row: softmax makes NaN of it."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ x.t()
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask[0] = True                                   # row 0 entirely masked
        probs = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return (probs @ x).sum()


class CausalMask(nn.Module):
    """A causal -inf mask, as in every GPT: intended, not an anomaly."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ x.t()
        causal = torch.triu(torch.full(scores.shape, float("-inf")), diagonal=1)
        probs = F.softmax(scores + causal, dim=-1)
        return (probs @ x).pow(2).mean()


class GradientTrouble(nn.Module):
    """`big`: tiny weights and a huge loss scale (exploding); `tiny`: loss scaled by 1e-14
    (vanishing); `dead`: multiplied by zero (zero gradient); `frozen`: not trainable."""

    def __init__(self) -> None:
        super().__init__()
        self.big = nn.Linear(4, 4)
        self.tiny = nn.Linear(4, 4)
        self.dead = nn.Linear(4, 4)
        self.ok = nn.Linear(4, 4)
        with torch.no_grad():
            self.big.weight.fill_(1e-4)
            self.big.bias.zero_()                        # norm 0: no ratio, never judged
            self.tiny.bias.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1e6 * self.big(x).sum() + 1e-14 * self.tiny(x).sum()
                + 0.0 * self.dead(x).sum() + self.ok(x).pow(2).mean())


class Saturating(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = self.act(h.abs() + 20.0)                     # tanh saturated at +1
        b = torch.sigmoid(-(h.abs() + 30.0))             # sigmoid saturated at 0
        c = F.softmax(h * 1e4, dim=-1)                   # one-hot rows
        d = torch.tanh(h * 0.01)                         # healthy
        e = F.softmax(h * 1e-3, dim=-1)                  # healthy: nearly uniform
        return (a + b + c + d + e).sum()


# --------------------------------------------------------------------------- non-finite
def test_nan_produced_by_log_of_negative(tmp_path):
    torch.manual_seed(0)
    path = _run(tmp_path, LogOfNegative(), _randn(), steps=2, sgd=True)
    result = scan_dump(path)
    first = result["first_nonfinite"]
    assert first is not None
    assert first["name"] == "Torch.log.0.forward"
    assert (first["step"], first["rank"], first["direction"], first["kind"], first["op"],
            first["role"], first["module"]) == (0, 0, "forward", "api", "log", "output", "")
    assert first["metrics"]["nan_count"] == 12 and first["metrics"]["inf_count"] == 0
    assert first["metrics"]["shape"] == [3, 4]
    assert "finite inputs" in first["reason"]
    nonfinite = [f for f in result["findings"] if f["kind"] == "nonfinite"]
    assert [(f["step"], f["name"]) for f in nonfinite] == [(0, "Torch.log.0.forward"),
                                                           (1, "Torch.log.0.forward")]
    text = format_scan(result)
    assert "first non-finite: step 0 rank 0 forward api Torch.log.0.forward" in text
    assert "produces non-finite values from finite inputs" in text
    # step selection
    only1 = scan_dump(path, step=1)
    assert only1["first_nonfinite"]["step"] == 1
    assert {f["step"] for f in only1["findings"]} == {1}


def test_inf_from_exp_overflow_is_first_not_the_nan_after_it(tmp_path):
    torch.manual_seed(0)
    path = _run(tmp_path, ExpOverflow(), _randn())
    first = scan_dump(path)["first_nonfinite"]
    assert first["name"] == "Torch.exp.0.forward" and first["op"] == "exp"
    assert first["metrics"]["inf_count"] == 12 and first["metrics"]["nan_count"] == 0
    assert first["role"] == "output"


def test_nan_in_the_input_data(tmp_path):
    torch.manual_seed(0)

    def make(i):
        x = _randn()(i)
        x[1, 2] = float("nan")
        return x
    path = _run(tmp_path, Plain(), make)
    result = scan_dump(path)
    first = result["first_nonfinite"]
    assert first["reason"] == "non-finite values arrive in the input data"
    assert first["role"] == "input" and first["direction"] == "forward"
    assert first["metrics"]["nan_count"] == 1
    # everything downstream (forward, backward, parameter gradients) is explained by it
    assert [f["kind"] for f in result["findings"]] == ["nonfinite"]


def test_nan_already_in_a_parameter(tmp_path):
    torch.manual_seed(0)
    model = Plain()
    with torch.no_grad():
        model.out.weight[0, 1] = float("nan")
    result = scan_dump(_run(tmp_path, model, _randn()))
    first = result["first_nonfinite"]
    assert first["kind"] == "param" and first["name"] == "Param.out.weight"
    assert "parameter" in first["reason"]


def test_intended_masks_are_not_anomalies(tmp_path):
    torch.manual_seed(0)
    path = _run(tmp_path, CausalMask(), _randn((5, 4)))
    result = scan_dump(path)
    assert result["first_nonfinite"] is None, result["first_nonfinite"]
    assert result["findings"] == []
    assert scan_main(_args(path)) == 0


def test_tiny_gpt_with_causal_mask_is_clean(tmp_path):
    dump, dbg = dump_once(tmp_path, steps=1)
    dump.close()
    result = scan_dump(str(tmp_path / "dump"))
    assert result["first_nonfinite"] is None
    assert not [f for f in result["findings"] if f["kind"] == "nonfinite"]


def test_softmax_of_a_fully_masked_row_is_named(tmp_path):
    torch.manual_seed(0)
    result = scan_dump(_run(tmp_path, FullyMaskedSoftmax(), _randn((3, 4))))
    first = result["first_nonfinite"]
    assert first["name"] == "Functional.softmax.0.forward"
    assert first["reason"] == "produces NaN from inputs holding only Inf"
    assert first["metrics"]["nan_count"] == 3


def test_overflow_task_dump_gives_the_same_answer(tmp_path):
    torch.manual_seed(0)
    path = _run(tmp_path, LogOfNegative(), _randn(), task="overflow")
    first = scan_dump(path)["first_nonfinite"]
    assert first["name"] == "Torch.log.0.forward"
    assert "finite inputs" in first["reason"]


# --------------------------------------------------------------------------- gradients
def test_exploding_vanishing_and_zero_gradients(tmp_path):
    torch.manual_seed(0)
    model = GradientTrouble()
    model.ok.bias.requires_grad_(False)
    path = _run(tmp_path, model, _randn())
    result = scan_dump(path)
    assert result["first_nonfinite"] is None
    got = sorted((f["kind"], f["metrics"]["param"]) for f in result["findings"])
    assert got == [("exploding_grad", "big.weight"), ("vanishing_grad", "tiny.bias"),
                   ("vanishing_grad", "tiny.weight"), ("zero_grad", "dead.bias"),
                   ("zero_grad", "dead.weight")], got
    by_param = {f["metrics"]["param"]: f for f in result["findings"]}
    big = by_param["big.weight"]
    assert big["name"] == "Param.big.weight.grad" and big["role"] == "param_grad"
    assert big["metrics"]["ratio"] > EXPLODING_GRAD_RATIO
    assert big["module"] == "big" and big["op"] == "weight"
    assert by_param["tiny.weight"]["metrics"]["ratio"] < VANISHING_GRAD_RATIO
    assert by_param["dead.weight"]["metrics"]["min"] == 0 == by_param["dead.weight"]["metrics"]["max"]
    text = format_scan(result)
    for kind in ("exploding_grad", "vanishing_grad", "zero_grad"):
        assert f"  {kind}:" in text
    assert "Param.dead.weight.grad" in text
    assert scan_main(_args(path)) == 1


def test_gradients_of_a_loss_scaled_backward_are_judged_unscaled(tmp_path):
    """Under an AMP GradScaler the dw records hold gradients times the loss scale (65536 here):
    judged against the parameters as they are they would all read as exploding; the scan
    divides by the scale the run's manifest noted, and says so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=path, level="mix")
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = _randn((8, 16))(0)
    dbg.start(model)
    scaler.scale(model(x).pow(2).mean()).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    result = scan_dump(path)
    assert "exploding_grad" not in _kinds(result), format_scan(result)
    with open(tmp_path / "dump" / "run.json", "r", encoding="utf-8") as handle:
        run = json.load(handle)
    assert run["manifest"]["loss_scale"]["scale"] == 65536.0
    from precdbg.scan.anomalies import gradient_findings
    from precdbg.storage.reader import open_dump
    with open_dump(path) as dump:
        table = dump.records(step=0)
    exploding = [f for f in gradient_findings(table, 1.0) if f["kind"] == "exploding_grad"]
    assert exploding, "the scaled gradients, taken as they are, exceed the threshold"
    assert not [f for f in gradient_findings(table, 65536.0) if f["kind"] == "exploding_grad"]


# --------------------------------------------------------------------------- saturation
def test_saturated_activations(tmp_path):
    torch.manual_seed(0)
    result = scan_dump(_run(tmp_path, Saturating(), _randn((6, 4))))
    sat = [f for f in result["findings"] if f["kind"] == "saturated"]
    names = [f["name"] for f in sat]
    # nn.Tanh and the torch.tanh it runs record one tensor: reported once
    assert len(names) == 3, names
    ops = sorted(f["op"] for f in sat)
    assert ops == ["sigmoid", "softmax", "tanh"]
    tanh = next(f for f in sat if f["op"] == "tanh")
    assert tanh["module"] == "act" and tanh["metrics"]["mean"] > 0.99
    sigmoid = next(f for f in sat if f["op"] == "sigmoid")
    assert sigmoid["metrics"]["mean"] < 0.01
    softmax = next(f for f in sat if f["op"] == "softmax")
    assert softmax["name"] == "Functional.softmax.0.forward"
    assert softmax["metrics"]["saturation"] > 0.99
    assert all(f["role"] == "output" for f in sat)


# --------------------------------------------------------------------------- CLI function
def test_scan_main_prints_writes_strict_json_and_returns_1(tmp_path, capsys):
    torch.manual_seed(0)
    path = _run(tmp_path, LogOfNegative(), _randn(), steps=2, sgd=True)
    out_json = tmp_path / "scan.json"
    assert scan_main(_args(path, str(out_json))) == 1
    printed = capsys.readouterr().out
    assert "Torch.log.0.forward" in printed
    data = _strict_json(out_json)
    assert data["first_nonfinite"]["name"] == "Torch.log.0.forward"
    assert data["first_nonfinite"]["metrics"]["min"] == "nan"     # strict JSON: as a string
    assert set(data["first_nonfinite"]) >= {"step", "rank", "direction", "kind", "module", "op",
                                            "role", "name", "metrics", "reason"}
    for f in data["findings"]:
        assert set(f) >= {"kind", "step", "rank", "name", "module", "op", "role", "detail",
                          "metrics"}
    assert scan_main(_args(path, None, step=0, rank=0)) == 1


def test_scan_main_clean_dump_returns_0(tmp_path, capsys):
    torch.manual_seed(0)
    path = _run(tmp_path, Plain(), _randn())
    out_json = tmp_path / "scan.json"
    assert scan_main(_args(path, str(out_json))) == 0
    assert "no anomalies found" in capsys.readouterr().out
    data = _strict_json(out_json)
    assert data["first_nonfinite"] is None and data["findings"] == []


def test_unusable_input_raises_dump_error(tmp_path):
    with pytest.raises(DumpError, match="no such dump"):
        scan_dump(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DumpError, match="no complete step files"):
        scan_main(_args(str(empty)))
    torch.manual_seed(0)
    path = _run(tmp_path, Plain(), _randn())
    with pytest.raises(DumpError, match="no step 7"):
        scan_dump(path, step=7)
    with pytest.raises(DumpError, match="no rank 3"):
        scan_dump(path, rank=3)
    with pytest.raises(DumpError, match="cannot write JSON"):
        scan_main(_args(path, str(tmp_path / "no" / "dir" / "x.json")))
