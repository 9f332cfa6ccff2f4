"""The core adapter base (precdbg.capture.instrumentor) on the real frameworks: install/uninstall are
idempotent and leave nothing behind, a failing `remove()` neither stops the others nor is
reported more than once, one optimizer-phase rule (the previous phase comes back), and
ClassPatch restores an owner's own attribute and lets an inherited one show through again."""
from __future__ import annotations

import json
import logging
import os
import types
from typing import Any, List

import numpy as np
import pytest
import torch

import precdbg
from precdbg.errors import PrecdbgError
from precdbg.capture.instrumentor import BaseInstrumentor, ClassPatch
from precdbg_pt import PrecisionDebugger as TorchDebugger

from conftest import rows_where
from torch_support import loss_of, torch_hooks_left


class _FailingHandle:
    """A handle whose removal fails, put among the real ones."""

    def __init__(self) -> None:
        self.calls = 0

    def remove(self) -> None:
        self.calls += 1
        raise RuntimeError("this handle cannot be removed")


def _insert_failing(adapter: BaseInstrumentor) -> _FailingHandle:
    bad = _FailingHandle()
    adapter._handles.insert(len(adapter._handles) // 2, bad)
    return bad


def _removal_warnings(caplog: Any) -> List[str]:
    return [r.getMessage() for r in caplog.records
            if "this handle cannot be removed" in r.getMessage()]


def _phases_after_stop(dbg: Any, dump_path: str) -> Any:
    """Stop and close; then the phases the forward records of an API were recorded with."""
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(dump_path).records(step=0)
    return lambda api: {r["phase"] for r in rows_where(t, api=api, direction="forward")}


def _optimizers_in_manifest(dump_path: str) -> List[str]:
    with open(os.path.join(dump_path, "run.json")) as f:
        run = json.load(f)
    found = run.get("optimizers") or run.get("manifest", {}).get("optimizers") or []
    return [o["class"] for o in found]


# ----------------------------------------------------------------------------- ClassPatch
class _Base:
    def greet(self) -> str:
        return "base"


class _Own(_Base):
    def greet(self) -> str:
        return "own"


class _Inherits(_Base):
    pass


def _loud(original: Any) -> Any:
    def wrapper(self: Any) -> str:
        return original(self).upper()
    return wrapper


def test_class_patch_restores_an_own_attribute():
    before = vars(_Own)["greet"]
    patch = ClassPatch(_Own, "greet", _loud)
    assert _Own().greet() == "OWN"
    patch.remove()
    assert vars(_Own)["greet"] is before
    assert _Own().greet() == "own"


def test_class_patch_lets_an_inherited_attribute_show_through_again():
    assert "greet" not in vars(_Inherits)
    patch = ClassPatch(_Inherits, "greet", _loud)
    assert "greet" in vars(_Inherits) and _Inherits().greet() == "BASE"
    patch.remove()
    assert "greet" not in vars(_Inherits)
    assert _Inherits.greet is _Base.greet
    patch.remove()                      # twice: still nothing there, base untouched
    assert "greet" not in vars(_Inherits) and vars(_Base)["greet"](None) == "base"


def test_class_patch_on_a_module_and_a_refusing_owner():
    module = types.ModuleType("patched_here")
    module.fn = lambda: 1
    original = module.fn
    patch = ClassPatch(module, "fn", lambda o: (lambda: o() + 1))
    assert module.fn() == 2
    patch.remove()
    assert module.fn is original
    with pytest.raises(TypeError):      # a builtin type refuses: nothing changed
        ClassPatch(int, "bit_length", _loud)
    assert int(5).bit_length() == 3


# ----------------------------------------------------------------------------- torch
def _torch_originals() -> dict:
    from torch.optim.lr_scheduler import LRScheduler
    return {"LRScheduler.step": vars(LRScheduler)["step"],
            "GradScaler.update": vars(torch.amp.GradScaler)["update"]}


def _torch_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    x, y = batch
    loss_of(model, x, y).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_torch_install_and_uninstall_are_idempotent(tmp_path, gpt, optimizer, batch):
    originals = _torch_originals()
    dbg = TorchDebugger(dump_path=str(tmp_path))
    adapter = dbg._session.adapter
    adapter.uninstall()                         # never installed: a no-op
    assert not adapter.installed
    for _ in range(2):
        assert dbg.start(gpt) and dbg.start(gpt)
        held = len(adapter._handles)
        assert held > 0 and adapter.installed
        adapter.install(dbg._session, gpt)      # the adapter's own guard, not only Session's
        assert len(adapter._handles) == held
        assert _torch_originals() != originals  # the training-state patches are in place
        _torch_step(gpt, optimizer, batch)
        dbg.stop()
        dbg.stop()
        assert not adapter.installed and adapter._handles == []
        assert torch_hooks_left(gpt) == []
        assert _torch_originals() == originals
        dbg.step()
    adapter.uninstall()
    assert dbg.close()
    assert dbg.failures == 0


def test_torch_failing_remove_still_removes_the_rest(tmp_path, gpt, optimizer, batch, caplog):
    originals = _torch_originals()
    dbg = TorchDebugger(dump_path=str(tmp_path))
    dbg.start(gpt)
    bad = _insert_failing(dbg._session.adapter)
    _torch_step(gpt, optimizer, batch)
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        dbg.stop()
    assert bad.calls == 1
    assert torch_hooks_left(gpt) == []
    assert _torch_originals() == originals
    assert dbg.failures == 1
    assert len(_removal_warnings(caplog)) == 1
    dbg.step()
    assert dbg.close()


def test_torch_model_walk_names_the_bad_item(tmp_path, gpt):
    dbg = TorchDebugger(dump_path=str(tmp_path))
    with pytest.raises(PrecdbgError, match=r"item 1 is int, not a torch.nn.Module"):
        dbg.start([gpt, 3])
    with pytest.raises(PrecdbgError, match=r"a torch.nn.Module or a list of them, got str"):
        dbg.start("model")
    assert not dbg._session.adapter.installed and torch_hooks_left(gpt) == []
    dbg.close()


class _Outer(torch.optim.Optimizer):
    """An optimizer whose step runs another optimizer, then more torch calls of its own."""

    def __init__(self, params: Any, inner: torch.optim.Optimizer) -> None:
        super().__init__(params, {})
        self.inner = inner

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        self.inner.step()
        for group in self.param_groups:
            for p in group["params"]:
                torch.sign(p)          # after the inner optimizer, still inside this one


def test_torch_optimizer_restores_the_previous_phase(tmp_path):
    model = torch.nn.Linear(4, 3)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = _Outer(model.parameters(), inner)
    x = torch.randn(2, 4)
    dbg = TorchDebugger(dump_path=str(tmp_path), level="api", include_optimizer=True)
    dbg.start(model)
    torch.exp(x)
    model(x).sum().backward()
    outer.step()
    torch.tanh(x)
    outer.step()                       # noted in the manifest once
    phases = _phases_after_stop(dbg, str(tmp_path))
    assert phases("exp") == {"forward"}
    assert phases("sign") == {"optimizer"}      # the inner step ended: the outer's phase is back
    assert phases("tanh") == {"forward"}        # the outer step ended: forward is back
    assert sorted(_optimizers_in_manifest(str(tmp_path))) == ["SGD", "_Outer"]


def test_torch_optimizer_pauses_capture_unless_included(tmp_path, gpt, optimizer, batch):
    dbg = TorchDebugger(dump_path=str(tmp_path), level="api")
    dbg.start(gpt)
    _torch_step(gpt, optimizer, batch)
    x = torch.ones(3)
    torch.tanh(x)
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert not np.any(t["phase"] == "optimizer")
    assert {r["phase"] for r in rows_where(t, api="tanh", direction="forward")} == {"forward"}
    assert _optimizers_in_manifest(str(tmp_path)) == ["AdamW"]


# ----------------------------------------------------------------------------- MindSpore
@pytest.fixture(scope="module")
def mss():
    pytest.importorskip("mindspore")
    import ms_support
    return ms_support


def _ms_train_one(mss: Any, dbg: Any, model: Any, optimizer: Any) -> None:
    from precdbg_examples import gpt_ms
    step = gpt_ms.train_step_fn(model, optimizer)
    x, y = mss.as_tensors(mss.make_batches(1)[0])
    step(x, y)


def test_ms_install_and_uninstall_are_idempotent(tmp_path, mss):
    from mindspore import nn
    from precdbg_ms import PrecisionDebugger
    model, before = mss.make_model(), mss.snapshot()
    optimizer = mss.make_optimizer(model)
    call_before = nn.Optimizer.__call__
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    adapter = dbg._session.adapter
    adapter.uninstall()
    for _ in range(2):
        assert dbg.start(model) and dbg.start(model)
        held = len(adapter._handles)
        adapter.install(dbg._session, model)
        assert len(adapter._handles) == held
        assert nn.Optimizer.__call__ is not call_before
        _ms_train_one(mss, dbg, model, optimizer)
        dbg.stop()
        dbg.stop()
        assert not adapter.installed and adapter._handles == []
        assert mss.snapshot_differences(before) == []
        assert mss.hooks_left(model) == []
        assert nn.Optimizer.__call__ is call_before
        dbg.step()
    assert dbg.close()
    assert dbg.failures == 0


def test_ms_failing_remove_still_removes_the_rest(tmp_path, mss, caplog):
    from precdbg_ms import PrecisionDebugger
    model, before = mss.make_model(), mss.snapshot()
    optimizer = mss.make_optimizer(model)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start(model)
    bad = _insert_failing(dbg._session.adapter)
    _ms_train_one(mss, dbg, model, optimizer)
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        dbg.stop()
    assert bad.calls == 1
    assert mss.snapshot_differences(before) == []
    assert mss.hooks_left(model) == []
    assert dbg.failures == 1
    assert len(_removal_warnings(caplog)) == 1
    dbg.step()
    assert dbg.close()


def test_ms_model_walk_names_the_bad_item(tmp_path, mss):
    from precdbg_ms import PrecisionDebugger
    model, before = mss.make_model(), mss.snapshot()
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with pytest.raises(PrecdbgError, match=r"item 1 is int, not a mindspore.nn.Cell"):
        dbg.start([model, 3])
    assert not dbg._session.adapter.installed
    assert mss.snapshot_differences(before) == [] and mss.hooks_left(model) == []
    dbg.close()


def test_ms_optimizer_restores_the_previous_phase(tmp_path, mss):
    import mindspore as ms
    from mindspore import nn, ops
    from precdbg_ms import PrecisionDebugger

    class Outer(nn.Optimizer):
        """Runs another optimizer, then MindSpore calls of its own (PyNative, no @jit)."""

        def __init__(self, params: Any, inner: nn.Optimizer) -> None:
            super().__init__(0.1, params)
            self.inner = inner

        def construct(self, grads: Any) -> Any:
            done = self.inner(grads)
            for g in grads:
                ops.sign(g)
            return done

    net = nn.Dense(4, 3)
    inner = nn.SGD(net.trainable_params(), learning_rate=0.1)
    outer = Outer(net.trainable_params(), inner)
    x = ms.Tensor(np.ones((2, 4), np.float32))
    grad_fn = ms.value_and_grad(lambda v: net(v).sum(), None, net.trainable_params())
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api", include_optimizer=True)
    dbg.start(net)
    ops.exp(x)
    _, grads = grad_fn(x)
    outer(grads)
    ops.tanh(x)
    outer(grads)
    phases = _phases_after_stop(dbg, str(tmp_path))
    assert phases("exp") == {"forward"}
    assert phases("SGD") == {"optimizer"}
    assert phases("sign") == {"optimizer"}      # the inner optimizer ended: the outer's phase
    assert phases("tanh") == {"forward"}        # the outer optimizer ended: forward is back
    assert sorted(_optimizers_in_manifest(str(tmp_path))) == ["Outer", "SGD"]
