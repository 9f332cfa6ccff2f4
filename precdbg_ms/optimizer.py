"""MindSpore optimizers: their calls run as phase `optimizer` (the core's rule, see
`BaseInstrumentor.optimizer_begins`), and each one seen is recorded in the run manifest (class,
hyperparameters, parameter names in PyTorch style)."""
from __future__ import annotations

from typing import Any, Dict

from mindspore import nn

from precdbg.instrumentor import ClassPatch
from precdbg.manifest import jsonable
from precdbg.naming import param_alias

from . import tensors

__all__ = ["optimizer_manifest", "patch_optimizer"]

_HYPER = ("learning_rate", "weight_decay", "beta1", "beta2", "eps", "momentum", "loss_scale",
          "use_nesterov", "dampening")


def optimizer_manifest(optimizer: Any) -> Dict[str, Any]:
    """Class, hyperparameters and parameter names (PyTorch-style) of a MindSpore optimizer."""
    hyper: Dict[str, Any] = {}
    for attr in _HYPER:
        value = getattr(optimizer, attr, None)
        if value is None:
            continue
        try:
            hyper[attr] = jsonable(value.asnumpy().tolist() if hasattr(value, "asnumpy")
                                   else value)
        except Exception:  # noqa: BLE001 - a dynamic learning rate cell, say
            hyper[attr] = type(value).__name__
    names = [param_alias("mindspore", p.name, "") for p in optimizer.parameters]
    return {"id": id(optimizer), "class": type(optimizer).__name__,
            "param_groups": [{"hyper": hyper, "params": names}]}


def patch_optimizer(adapter: Any) -> ClassPatch:
    """Wrap `nn.Optimizer.__call__` under the core's optimizer-phase rule; the patch is a handle
    of the adapter's (removing it puts the original back)."""
    def make(original: Any) -> Any:
        def call(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if not adapter.installed:
                return original(opt, *args, **kwargs)
            adapter.settle_statistics()      # it updates the parameters in place
            token = adapter.optimizer_begins(opt, optimizer_manifest)
            try:
                if adapter.paused:
                    return original(opt, *args, **kwargs)
                # recorded as one call too: MindSpore's optimizers compile their construct with
                # @jit, so the ops inside them never reach a hook; their inputs (the gradients
                # handed to the optimizer) and outputs still do
                return adapter._on_api_call(lambda *a, **k: original(opt, *a, **k),
                                            "Optimizer", type(opt).__name__, args, kwargs,
                                            inner=True)
            finally:
                adapter.optimizer_ends(token)
                for param in getattr(opt, "parameters", ()):
                    tensors.note_write(param)
        return call
    return ClassPatch(nn.Optimizer, "__call__", make)
