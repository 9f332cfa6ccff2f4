"""Tensor questions the core asks: describe, identity, storage; statistics are in
`precdbg_pt.statistics` and host copies (the tensor task) in `precdbg_pt.host_copies`, both
re-exported here: this module is the adapter's whole tensor interface to the core."""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Hashable, Optional, Tuple

import torch

from .host_copies import hand_over, to_host  # tensor task copies
from .statistics import (deferrable, element_layout, launch_queued, nbytes, resolve,
                         retained_bytes, summarize, version_of)

__all__ = ["local", "describe", "facts", "identity", "holds", "storage", "storage_ref",
           "object_state", "STORAGE_REF_FOLLOWS_MEMORY", "summarize", "resolve", "to_host",
           "hand_over", "nbytes", "launch_queued", "retained_bytes", "deferrable"]

_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def describe(t: torch.Tensor) -> Tuple[str, Tuple[int, ...], int]:
    return dtype_name(t.dtype), tuple(t.shape), t.numel()


# Which storage holds a tensor: the address of its StorageImpl (what `untyped_storage()._cdata`
# answers, without making a storage object per record); older torch builds make the object.
_storage_id: Callable[[torch.Tensor], int] = getattr(
    torch._C, "_storage_id", lambda t: t.untyped_storage()._cdata)


def identity(t: torch.Tensor) -> Optional[Tuple[Hashable, Hashable]]:
    """(statistics key, data key). Equal statistics keys: the same elements of the same storage
    at the same version, in any order (a transpose has the statistics of its base). Equal data
    keys: also the same shape and strides, so the same bytes in the same order. The core checks
    that the first tensor of a key is still alive, so its storage cannot have been reused."""
    try:
        contiguous = t.is_contiguous()
        ptr = t.data_ptr()
        if not ptr and t.numel():
            return None                   # no memory of its own (a wrapper subclass)
        base = (ptr, t.dtype, t._version, t.get_device())
        if t.is_neg() or t.is_conj():     # the same bytes read negated or conjugated
            base += (t.is_neg(), t.is_conj())
        layout = ((t.numel(), 1),) if contiguous else element_layout(t)
        shape = tuple(t.shape)
        return (base, layout), (base, shape, None if contiguous else t.stride())
    except (RuntimeError, NotImplementedError):   # tensors without storage (sparse, fake, ...)
        return None


def holds(t: torch.Tensor, key: Tuple[Any, ...]) -> bool:
    """Whether `t` (alive) still holds the memory its identity key was made from: a storage
    resized to nothing and back (FSDP2 frees and re-gathers unsharded parameters so) moves,
    and its old address may go to another tensor whose key would then match."""
    return t.data_ptr() == key[0][0]


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding `t`'s elements in this process's memory: `t` itself, or a DTensor's
    local shard (FSDP2, tensor parallelism). Statistics of a whole DTensor would take a
    collective inside a hook (a hang unless every rank reaches the same record), so each rank
    records the shard it holds: its shape, its statistics, its bytes. A nested tensor (the
    eval fast path of nn.TransformerEncoder makes one of a padded batch) has no single shape:
    it is recorded as its values, every component's elements in one flat tensor. A quantized
    tensor is recorded as the values it stands for (`dequantize()`, float32)."""
    if t.is_nested:
        return _nested_values(t)
    if type(t) in _PLAIN_TYPES:
        return t.dequantize() if t.is_quantized else t
    dtensor_module = sys.modules.get("torch.distributed.tensor")   # none made if not imported
    dtensor = getattr(dtensor_module, "DTensor", None)
    if dtensor is not None and isinstance(t, dtensor):
        return t.to_local()
    return t


def _nested_values(t: torch.Tensor) -> torch.Tensor:
    try:
        return t.values()                # the components' elements, as stored (no copy)
    except (RuntimeError, NotImplementedError):    # not contiguous: its components, copied
        return torch.cat([part.reshape(-1) for part in t.unbind()])


def facts(t: torch.Tensor) -> Tuple[str, Tuple[int, ...], int,
                                    Optional[Tuple[Hashable, Hashable]],
                                    Optional[Tuple[Hashable, Hashable, int]]]:
    """`describe`, `identity` and `storage` of a tensor in one call (asked for every record):
    dtype name, shape, numel, (statistics key, data key), (storage, view, version)."""
    dtype = t.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = dtype_name(dtype)
    shape = t.shape          # a torch.Size is a tuple (tuple() of it costs ~0.2 us a record)
    numel = t.numel()
    try:
        ptr, version = t.data_ptr(), t._version
        if not ptr and numel:
            return name, shape, numel, None, None    # no memory of its own (wrapper subclass)
        # the device's index, not a device object per record (-1: host memory; one kind of
        # accelerator runs in a process)
        base = (ptr, dtype, version, t.get_device())
        if t.is_neg() or t.is_conj():    # the same bytes read negated or conjugated (lazy views)
            base += (t.is_neg(), t.is_conj())
        if t.is_contiguous():
            keys = ((base, ((numel, 1),)), (base, shape, None))
        else:
            stride = t.stride()
            keys = ((base, element_layout(t, stride)), (base, shape, stride))
        return name, shape, numel, keys, (_storage_id(t), (ptr, numel), version)
    except Exception:  # noqa: BLE001 - no storage (sparse, fake, wrapper subclasses, ...)
        return name, shape, numel, identity(t), storage(t)


def storage(t: torch.Tensor) -> Optional[Tuple[Hashable, Hashable, int]]:
    """(storage, view, version): which storage holds the tensor (every view of it shares one),
    which elements of it (start and count), and the storage's write count (views share it)."""
    try:     # an inference tensor counts no writes: the state of its storage is its latest
        return _storage_id(t), (t.data_ptr(), t.numel()), version_of(t)   # writer's
    except Exception:  # noqa: BLE001 - no storage (sparse, fake, wrapper subclasses)
        return None


class _StorageAlive:
    """Whether a storage still exists, through the storage's own weak reference (what torch's
    StorageWeakRef holds, without its Python layers: asked once per record)."""
    __slots__ = ("cdata",)
    _expired = staticmethod(torch.UntypedStorage._expired)
    _free = staticmethod(torch.UntypedStorage._free_weak_ref)   # kept: torch may be torn down first

    def __init__(self, storage: torch.UntypedStorage) -> None:
        self.cdata = storage._weak_ref()

    def __call__(self) -> bool:
        return not self._expired(self.cdata)

    def __del__(self) -> None:
        self._free(self.cdata)


STORAGE_REF_FOLLOWS_MEMORY = True    # a weak reference of the storage itself, not of `t`


def storage_ref(t: torch.Tensor) -> Callable[[], bool]:
    """Whether the tensor's storage still exists (a freed one's key may come back)."""
    return _StorageAlive(t.untyped_storage())


def object_state(t: torch.Tensor) -> Optional[Tuple[int, int, torch.Size]]:
    """What changes whenever the elements a tensor object shows may have: its version (every
    in-place write, in-place view changes too), its data pointer (`.data =`, a storage resized
    and refilled) and its shape. The core reuses what it learnt of an object at its last record
    while this stays the same. None: no version to trust (an inference tensor counts none)."""
    try:
        return t._version, t.data_ptr(), t.shape
    except Exception:  # noqa: BLE001 - inference tensors, tensors without storage
        return None
