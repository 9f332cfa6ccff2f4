"""MindSpore optimizers: their calls run as phase `optimizer`, and each one seen is recorded in
the run manifest (class, hyperparameters, parameter names in PyTorch style)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from mindspore import nn

from precdbg.manifest import jsonable
from precdbg.naming import param_alias
from precdbg.schema import Phase

__all__ = ["OptimizerPatch", "optimizer_manifest"]

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


class OptimizerPatch:
    """Wraps `nn.Optimizer.__call__` while installed; `restore()` puts the original back."""

    def __init__(self) -> None:
        self._saved: Optional[Tuple[Any, bool]] = None
        self._noted: set = set()

    def apply(self, adapter: Any) -> None:
        if self._saved is not None:
            return
        original = nn.Optimizer.__call__
        self._saved = (original, "__call__" in vars(nn.Optimizer))
        self._noted = set()
        noted = self._noted

        def call(opt: Any, *args: Any, **kwargs: Any) -> Any:
            session = adapter.session
            if not adapter.installed or session is None:
                return original(opt, *args, **kwargs)
            if id(opt) not in noted:
                noted.add(id(opt))
                adapter._run(lambda: session.note_optimizer(optimizer_manifest(opt)),
                             "recording the optimizer")
            previous = session.phase
            session.phase = Phase.OPTIMIZER.value
            adapter.paused = not session.config.include_optimizer
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
                session.phase = previous
                adapter.paused = False
        nn.Optimizer.__call__ = call

    def restore(self) -> None:
        if self._saved is None:
            return
        original, own = self._saved
        self._saved = None
        if own:
            nn.Optimizer.__call__ = original
        elif "__call__" in vars(nn.Optimizer):
            del nn.Optimizer.__call__
