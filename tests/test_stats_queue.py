"""The fused kernel's launches are shared by the tensors of one hook (queued, launched when the
hook ends), and a queued tensor's statistics are those it had when it was captured, even when the
call it is an input of changes it in place. Runs the Triton kernel in Triton's interpreter on
CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import precdbg
from precdbg_pt import PrecisionDebugger, device_stats
from precdbg_pt import tensors as pt_tensors

from torch_support import make_batch_list, make_model, make_optimizer, run_steps

try:
    device_stats.DeviceStatistics().summarize_with("triton", [torch.ones(3)])
    INTERPRETED = device_stats.triton_available()
except (RuntimeError, ValueError):
    INTERPRETED = False
pytestmark = pytest.mark.skipif(not INTERPRETED, reason="triton (interpreter) not available")


@pytest.fixture
def launches(monkeypatch):
    """Count the fused kernel's launches and the tensors they cover (a spy on the real one)."""
    counts = {"launches": 0, "tensors": 0}
    original = device_stats._launch_triton

    def spy(tensors, handles, interpret):
        counts["launches"] += 1
        counts["tensors"] += len(tensors)
        return original(tensors, handles, interpret)
    monkeypatch.setattr(device_stats, "_launch_triton", spy)
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", "triton")
    return counts


class ThreeInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(a, b, c)


def test_tensors_of_one_hook_share_a_launch(tmp_path, launches):
    """The module's pre-hook captures three new tensors: one launch; its call's output: one."""
    model = ThreeInputs()
    a, b, c = (torch.randn(5, 7) for _ in range(3))
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path), step=[0])
    dbg.start(model)
    model(a, b, c)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.failures == 0
    assert launches == {"launches": 2, "tensors": 4}, launches
    table = precdbg.open_dump(str(tmp_path)).records(step=0)
    inputs = table.select((table["kind"] == "module") & (table["role"] == "input"))
    for row, t in zip(sorted(inputs.rows(), key=lambda r: r["arg_index"]), (a, b, c)):
        assert row["min"] == t.min().item() and row["max"] == t.max().item()
        assert row["norm"] == pytest.approx(t.double().norm().item(), rel=1e-6)


def test_a_training_step_launches_fewer_kernels_than_tensors(tmp_path, launches):
    model = make_model()
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path), step=[0])
    run_steps(dbg, model, make_optimizer(model), make_batch_list(1), 1)
    assert dbg.failures == 0
    table = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert 50 < launches["launches"] < launches["tensors"], launches
    tensors = table.select(np.isin(table["dtype"], ["float32", "int64"]) & (table["numel"] > 0))
    assert len(tensors) > 100
    assert np.all(tensors["nan_count"] >= 0)        # every queued tensor was launched
    assert np.all(np.isfinite(tensors["norm"]))


class InPlace(torch.nn.Module):
    """Its forward changes a captured tensor in place right after capturing it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale
        y.add_(10.0)                  # Tensor.add_: its input y is queued, then changed
        return y.sum()


def test_queued_input_has_its_values_before_the_in_place_call(tmp_path, launches):
    model = InPlace()
    x = torch.arange(8, dtype=torch.float32)
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path), step=[0])
    dbg.start(model)
    model(x).backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.failures == 0
    table = precdbg.open_dump(str(tmp_path)).records(step=0)
    add = table.select((table["api"] == "add_") & (table["direction"] == "forward"))
    roles = {(r["role"], r["arg_index"]): r for r in add.rows()}
    assert roles[("input", 0)]["mean"] == pytest.approx(3.5)       # x * 1 before the add
    assert roles[("output", 0)]["mean"] == pytest.approx(13.5)
    assert launches["launches"] > 0


def test_statistics_queued_outside_any_hook_are_launched_by_the_step_end(tmp_path, launches):
    """save() from the training loop (no hook around it) still gets its statistics."""
    model = InPlace()
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path), step=[0])
    dbg.start(model)
    value = torch.full((4,), 2.0)
    dbg.save("probe", value)
    value.mul_(100.0)                 # after save(): the saved statistics are the earlier ones
    dbg.stop()
    dbg.step()
    dbg.close()
    table = precdbg.open_dump(str(tmp_path)).records(step=0)
    probe = table.select(table["api"] == "probe")
    assert len(probe) == 1 and probe["mean"][0] == 2.0 and probe["nan_count"][0] == 0
