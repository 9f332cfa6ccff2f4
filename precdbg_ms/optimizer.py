"""MindSpore optimizers: their calls run as phase `optimizer` (the core's rule, see
`BaseInstrumentor.optimizer_begins`), and each one seen is recorded in the run manifest (class,
hyperparameters, parameter names in PyTorch style); so is the scale of an `ms.amp` loss scaler
(`DynamicLossScaler`, `StaticLossScaler`), as PyTorch's GradScaler's is."""
from __future__ import annotations

from typing import Any, Dict, List

from mindspore import nn

from precdbg.capture import ClassPatch, jsonable
from precdbg.records import param_alias

__all__ = ["optimizer_manifest", "patch_optimizer", "patch_loss_scalers"]

_HYPER = ("learning_rate", "weight_decay", "beta1", "beta2", "eps", "momentum", "loss_scale",
          "use_nesterov", "dampening")


# what every Cell has (vars of a bare one), found once: a fact of MindSpore, the same for every
# debugger of the process (filled once, never changed after)
_CELL_ATTRIBUTES: List[str] = []


def _schedule(cell: Any) -> Any:
    """A learning rate given as a list (MindSpore holds it in an `_IteratorLearningRate` cell)
    by its values; a `LearningRateSchedule` (CosineDecayLR, WarmUpLR, a user's) by its class
    and its own numeric settings, so that `check` names a schedule set up otherwise (its
    class name alone hid a max_lr of 1e-2 against 2e-2)."""
    rates = getattr(cell, "learning_rate", None)
    if hasattr(rates, "asnumpy"):
        return rates.asnumpy().tolist()
    if not _CELL_ATTRIBUTES:
        _CELL_ATTRIBUTES.extend(vars(nn.Cell()))
    settings = {key: value for key, value in vars(cell).items()
                if key not in _CELL_ATTRIBUTES and not key.startswith("_")
                and isinstance(value, (bool, int, float, str))}
    return {"schedule": type(cell).__name__, **settings}


def optimizer_manifest(optimizer: Any, adapter: Any = None) -> Dict[str, Any]:
    """Class, hyperparameters and parameter names (PyTorch-style) of a MindSpore optimizer:
    a parameter of the hooked model by its path there (`adapter.param_path`), as its
    inventory and gradient records name it; another by its own name."""
    hyper: Dict[str, Any] = {}
    for attr in _HYPER:
        value = getattr(optimizer, attr, None)
        if value is None:
            continue
        try:
            hyper[attr] = jsonable(value.asnumpy().tolist() if hasattr(value, "asnumpy")
                                   else _schedule(value) if isinstance(value, nn.Cell)
                                   else value)
        except Exception:  # noqa: BLE001 - what it is, at least
            hyper[attr] = type(value).__name__
    paths = [adapter.param_path(p) if adapter is not None else None
             for p in optimizer.parameters]
    names = [param_alias("mindspore", path or p.name, "")
             for p, path in zip(optimizer.parameters, paths)]
    return {"id": id(optimizer), "class": type(optimizer).__name__,
            "param_groups": [{"hyper": hyper, "params": names}]}


def patch_optimizer(adapter: Any) -> ClassPatch:
    """Wrap `nn.Optimizer.__call__` under the core's optimizer-phase rule; the patch is a handle
    of the adapter's (removing it puts the original back). The optimizer writes its parameters:
    each counts one write in the adapter's `tensors`."""
    note_write = adapter.tensors.note_write

    def make(original: Any) -> Any:
        def call(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if not adapter.installed:
                return original(opt, *args, **kwargs)
            adapter.settle_statistics()      # it updates the parameters in place
            token = adapter.optimizer_begins(opt, lambda o: optimizer_manifest(o, adapter))
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
                    note_write(param)
        return call
    return ClassPatch(nn.Optimizer, "__call__", make)


def patch_loss_scalers(adapter: Any) -> List[ClassPatch]:
    """Wrap `unscale` of the `ms.amp` loss scalers: the scale the step's gradients were scaled
    by goes to the manifest's `loss_scale` (one host read per unscale, after it)."""
    import mindspore as ms
    amp = getattr(ms, "amp", None)

    def make(original: Any) -> Any:
        def unscale(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scaler, *args, **kwargs)
            if adapter.installed:
                adapter.run_guarded(_note_scale, f"recording {type(scaler).__name__}", adapter,
                                    scaler)
            return result
        return unscale
    return [ClassPatch(cls, "unscale", make)
            for cls in (getattr(amp, "DynamicLossScaler", None),
                        getattr(amp, "StaticLossScaler", None))
            if isinstance(cls, type) and callable(getattr(cls, "unscale", None))]


def _note_scale(adapter: Any, scaler: Any) -> None:
    value = getattr(scaler, "scale_value", None)
    if value is not None:
        adapter.recorder.note_manifest("loss_scale", {
            "class": type(scaler).__name__,
            "scale": float(value.asnumpy() if hasattr(value, "asnumpy") else value)})
