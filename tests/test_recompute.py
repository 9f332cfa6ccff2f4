"""Activation recompute in the guides' pattern: a run with torch.utils.checkpoint (reentrant and
non-reentrant) is recorded like the same run without it, in real processes.

Before, the recomputed forward was recorded a second time (and the reentrant checkpoint's
no_grad switches as `Torch._set_grad_enabled` calls), so `compare` found the two runs DIVERGED
in structure where nothing differed in value; with reentrant checkpointing the API calls inside
the checkpointed blocks had no backward records at all. Now a replayed call records nothing of
its forward, and its backward (reentrant: the recomputed graph is the one that gets the
gradients) under the name of the call it replays. The torch calls a custom autograd Function's
backward makes are backward work: not recorded as forward calls, whether backward is entered as
`loss.backward()` or `torch.autograd.backward(loss)`.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

import precdbg

from conftest import REPO, assert_same_run, run_variant

GUIDE = os.path.join(REPO, "tests", "recompute_guide.py")


def _run(root: Any, how: str, backward: str = "method") -> Dict[str, Any]:
    return run_variant(root, GUIDE, how, backward)


def _entries(dump: str) -> Tuple[np.ndarray, np.ndarray]:
    table = precdbg.open_dump(dump).records()
    return table["entry"], table["direction"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: Any) -> Dict[str, Any]:
    return _run(tmp_path_factory.mktemp("plain"), "none")


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant", "inner", "function",
                                 "function_nonreentrant", "own", "nested", "enable_grad"])
def test_recompute_run_pairs_with_the_run_without(tmp_path: Any, how: str,
                                                  plain: Dict[str, Any]) -> None:
    run = _run(tmp_path, how)
    assert_same_run(plain, run)
    entries, directions = _entries(run["dump"])
    assert not any("_set_grad_enabled" in e for e in entries)
    # the blocks' calls have their backward records (names of the forward calls they replay),
    # the checkpointed plain function's too (gelu: the first call of its replay)
    for name in ("Functional.layer_norm.0.backward", "Functional.linear.2.backward",
                 "Module.blocks.1.Block.backward.0", "Functional.gelu.0.backward",
                 "Functional.gelu.2.backward"):
        assert name in set(entries[directions == "backward"]), name


def test_backward_entered_through_the_engine_records_the_same(tmp_path: Any,
                                                              plain: Dict[str, Any]) -> None:
    """torch.autograd.backward(loss) runs the engine without precdbg's capture mode popped:
    the custom Function's backward calls (mul, rsub) must not be recorded either way."""
    run = _run(tmp_path, "none", "engine")
    a, b = _entries(plain["dump"]), _entries(run["dump"])
    assert list(a[0]) == list(b[0])
    assert not any(e.startswith("Tensor.rsub") for e in a[0])


@pytest.mark.parametrize("how", ["reentrant", "nonreentrant", "inner", "function", "own"])
def test_the_replayed_module_is_named_from_the_checkpoint(tmp_path: Any, how: str,
                                                          monkeypatch: Any) -> None:
    """The checkpoint's own function says which module a replay re-runs (`checkpoint(block)`,
    `checkpoint(self.body)`), or, for a plain function, the module its forward was called in:
    the session is told its path when the replay starts, not left to guess it from the first
    replayed submodule (a plain function may have none)."""
    import torch
    from precdbg.capture.calls import WindowCalls
    from precdbg_pt import PrecisionDebugger
    from recompute_guide import Net

    owners = []
    original = WindowCalls.replay_begins
    monkeypatch.setattr(WindowCalls, "replay_begins",
                        lambda self, owner="": (owners.append(owner), original(self, owner))[1])
    torch.manual_seed(0)
    model = Net(how)
    x = torch.randn(4, 16, requires_grad=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics",
                                 level="mix")
    debugger.start(model)
    model(x).square().mean().backward()
    debugger.stop()
    debugger.step()
    assert debugger.close()
    assert owners == ["blocks.2", "blocks.1", "blocks.0"], owners


def _backward_entries_after_an_evaluation(root: Any, how: str) -> List[str]:
    import torch
    from precdbg_pt import PrecisionDebugger
    from recompute_guide import Net

    torch.manual_seed(0)
    model = Net(how)
    x, held_out = torch.randn(4, 16, requires_grad=True), torch.randn(4, 16)
    debugger = PrecisionDebugger(dump_path=str(root / how), task="statistics", level="mix")
    debugger.start(model)
    with torch.no_grad():
        model(held_out)          # an evaluation forward in the captured step, checkpoints too
    model(x).square().mean().backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and debugger.failures == 0
    entries, directions = _entries(str(root / how))
    return sorted(set(entries[directions == "backward"]))


@pytest.mark.parametrize("how", ["reentrant", "function", "own", "nested"])
def test_an_evaluation_forward_is_not_what_a_replay_stands_for(tmp_path: Any, how: str) -> None:
    """Calls without gradients outside a checkpoint that has a backward (an evaluation
    forward under no_grad, its checkpoints included) are not replayed: the replay's backward
    records carry the training forward's names, as in the run without recompute."""
    expected = _backward_entries_after_an_evaluation(tmp_path, "none")
    assert "Module.blocks.0.Block.backward.1" in expected      # the second call: training's
    assert _backward_entries_after_an_evaluation(tmp_path, how) == expected


def test_a_failing_replay_entry_never_reaches_training(tmp_path: Any, monkeypatch: Any) -> None:
    """The checkpoint patches run precdbg's code inside torch's checkpoint: what it raises is
    counted as a failure, and the checkpoint runs (and its gradients come out) as without it."""
    import torch
    from precdbg_pt import PrecisionDebugger
    from precdbg_pt.api import ModeHandle
    from recompute_guide import Net

    def grads(debugger: Any) -> List[Any]:
        torch.manual_seed(0)
        model = Net("function")
        x = torch.randn(4, 16, requires_grad=True)
        if debugger is not None:
            debugger.start(model)
        model(x).square().mean().backward()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        return [p.grad.clone() for p in model.parameters()]

    expected = grads(None)

    def broken(self: Any) -> bool:
        raise RuntimeError("injected")
    monkeypatch.setattr(ModeHandle, "enter_replay", broken)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics",
                                 level="mix")
    got = grads(debugger)
    assert debugger.failures >= 1
    assert debugger.close()
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
