"""Host copies of tensors for the tensor task: started at capture (asynchronous from an
accelerator, into pinned memory), handed to the writer's thread as arrays with the wait for
their bytes, so the training thread never waits on a copy."""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = ["HostCopy", "has_memory", "to_host", "hand_over"]

# numpy cannot hold these; their bytes go out as unsigned integers of the same width
_RAW_VIEW = {torch.bfloat16: torch.uint16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _RAW_VIEW[getattr(torch, _name)] = torch.uint8


def has_memory(t: torch.Tensor) -> bool:
    """Whether a tensor's elements are in memory of its own (not so for a wrapper subclass,
    whose data pointer is 0, nor for fake and functional tensors)."""
    try:
        return t.data_ptr() != 0
    except Exception:  # noqa: BLE001 - no storage at all
        return False


class HostCopy:
    __slots__ = ("tensor", "asynchronous", "event")

    def __init__(self, tensor: torch.Tensor, asynchronous: bool,
                 event: Optional[Any] = None) -> None:
        self.tensor, self.asynchronous, self.event = tensor, asynchronous, event


def to_host(t: torch.Tensor) -> HostCopy:
    """Start copying a tensor to host memory (asynchronous on accelerators)."""
    if t.layout is not torch.strided:      # sparse: stored as the dense tensor it stands for
        x = t.detach().to_dense()
    elif t.numel() and not has_memory(t):
        raise ValueError(f"a {type(t).__name__} without memory of its own has nothing to store "
                         f"(a tensor subclass wrapping others, or a tensor inside functorch's "
                         f"vmap/grad); its statistics are not recorded either")
    else:
        x = t.detach()
    if x.is_neg() or x.is_conj():      # lazy negation or conjugation: store the values it holds
        x = x.resolve_neg().resolve_conj()
    raw = _RAW_VIEW.get(x.dtype)
    with torch.no_grad():
        if x.device.type == "cpu":
            host = x.clone(memory_format=torch.contiguous_format)
        else:
            host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            host.copy_(x, non_blocking=True)
            # done when this stream gets there: the stream that issued the copy (a backward
            # hook runs on autograd's device thread and stream)
            event = _new_event(x.device)
            return HostCopy(host.view(raw) if raw is not None else host, True, event)
    return HostCopy(host.view(raw) if raw is not None else host, False)


def _new_event(device: torch.device) -> Optional[Any]:
    try:
        event = torch.Event(device=device)
        event.record()
        return event
    except (AttributeError, RuntimeError, TypeError):   # no generic events for this device
        return None


def hand_over(handles: Sequence[HostCopy]
              ) -> Tuple[List[np.ndarray], Optional[Callable[[], None]]]:
    """Arrays of the copies now, and the wait (for the writer's thread) until their bytes are
    there: each copy's event, or the whole device where a copy has none."""
    arrays = [h.tensor.numpy() for h in handles]
    pending = [h for h in handles if h.asynchronous]
    if not pending:
        return arrays, None
    events = [h.event for h in pending if h.event is not None]
    whole_device = len(events) < len(pending)
    done = [False]

    def wait() -> None:
        if done[0]:
            return
        for event in events:
            event.synchronize()
        if whole_device:
            _synchronize()
        done[0] = True
    return arrays, wait


def _synchronize() -> None:
    accel = getattr(torch, "accelerator", None)
    if accel is not None and accel.is_available():
        accel.synchronize()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()
