"""What the run manifest needs beyond hooks: the loss scale of an AMP GradScaler and the state of
LR schedulers. Both are read after their own `update()`/`step()` through a wrapper on the base
class (a core ClassPatch), installed at start() and removed (the original put back) at stop()."""
from __future__ import annotations

from typing import Any, Callable, List

import torch

from precdbg.capture import BaseInstrumentor, ClassPatch, jsonable

__all__ = ["watch_training_state"]


def watch_training_state(adapter: BaseInstrumentor) -> List[ClassPatch]:
    """Wrap GradScaler.update and LRScheduler.step to note their state in the manifest."""
    patches: List[ClassPatch] = []

    def after(original: Any, note: Callable[[Any], None]) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            if adapter.installed:
                adapter.run_guarded(note, f"recording {type(self).__name__}", self)
            return result
        return wrapper

    def scaler(obj: Any) -> None:
        if obj.is_enabled():     # one host read per optimizer step, after the update
            adapter.recorder.note_manifest("loss_scale", {"class": type(obj).__name__,
                                                         "scale": float(obj.get_scale())})

    def scheduler(obj: Any) -> None:
        state = {"id": id(obj), "class": type(obj).__name__,
                 "last_epoch": getattr(obj, "last_epoch", None),
                 "last_lr": jsonable(list(getattr(obj, "_last_lr", []) or [])),
                 "base_lrs": jsonable(list(getattr(obj, "base_lrs", []) or []))}
        adapter.recorder.note_manifest("lr_schedulers", state)

    grad_scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if grad_scaler is not None:
        patches.append(ClassPatch(grad_scaler, "update", lambda o: after(o, scaler)))
    patches.append(ClassPatch(torch.optim.lr_scheduler.LRScheduler, "step",
                              lambda o: after(o, scheduler)))
    return patches
