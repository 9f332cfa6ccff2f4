"""`TorchTensors`: the tensor questions the core asks (precdbg.capture.TensorOps), answered for
torch tensors. One object per adapter, so that two debuggers of one process share no state:

- facts of a tensor: `local` (the tensor a record describes), `describe`, `identity`, `storage`,
  `facts` (the three in one call), `holds`, `storage_ref`, `object_state`;
- statistics: `summarize` chooses how a tensor's row is computed (precdbg_pt.statistics: the C
  pass over host memory, torch's reductions; precdbg_pt.device_stats: the fused kernel of an
  accelerator), `resolve` turns a batch of handles into rows, `launch_queued` launches the
  kernels queued by a hook; `retained_bytes` and `deferrable` say what a handle costs to keep;
- host copies of the tensor task: `to_host`, `hand_over` (precdbg_pt.host_copies).

Its state is the device statistics (`self.device`, a `DeviceStatistics`: result buffers and
queued tensors); the module-level names below are constants (the testing switch
`_FORCED_BACKEND` among them), pure functions and `_DTYPE_NAMES`, a cache of a pure function.

Testing only: ``PRECDBG_DEVICE_STATS=triton|torch`` (read once, at import, into
`_FORCED_BACKEND`) sends CPU tensors through the device statistics with that backend, so the
device path runs on machines without one.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from precdbg.capture import fastats

from . import host_copies, stats_kernel
from .device_stats import DeviceHandle, DeviceStatistics
from .host_copies import HostCopy, has_memory
from .statistics import (FAST_CODES, Handle, Pending, element_layout, host_row, nbytes,
                         reductions, resolve, stored_values, version_of, with_zeros)

__all__ = ["TorchTensors", "dtype_name"]

# testing only: route CPU tensors through the device statistics with this backend ("triton",
# "torch"); the environment is read once, at import; summarize reads this name (tests patch it)
_FORCED_BACKEND = os.environ.get("PRECDBG_DEVICE_STATS") or None

# dtype -> its name in records: a cache of a pure function, shared by every debugger
_DTYPE_NAMES: Dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


# Which storage holds a tensor: the address of its StorageImpl (what `untyped_storage()._cdata`
# answers, without making a storage object per record); older torch builds make the object.
_storage_id: Callable[[torch.Tensor], int] = getattr(
    torch._C, "_storage_id", lambda t: t.untyped_storage()._cdata)
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
# precdbg's own torch calls outside the adapter's hooks (a batch resolved at stop()): no torch
# function mode sees them (another debugger's capture, still open; a user's mode)
_Unobserved = torch._C.DisableTorchFunction


class TorchTensors:
    """The tensor questions of one adapter (see the module's text). Methods, not functions
    bound at construction: the core asks several of them per record, and a method of a class
    is looked up as fast as a module's function."""

    __slots__ = ("device",)
    # a weak reference of the storage itself, not of `t` (see storage_ref)
    STORAGE_REF_FOLLOWS_MEMORY = True

    def __init__(self) -> None:
        self.device = DeviceStatistics()

    # ------------------------------------------------------------------ facts
    def local(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor holding `t`'s elements in this process's memory: `t` itself, or a
        DTensor's local shard (FSDP2, tensor parallelism). Statistics of a whole DTensor would
        take a collective inside a hook (a hang unless every rank reaches the same record), so
        each rank records the shard it holds: its shape, its statistics, its bytes. A nested
        tensor (the eval fast path of nn.TransformerEncoder makes one of a padded batch) has no
        single shape: it is recorded as its values, every component's elements in one flat
        tensor. A quantized tensor is recorded as the values it stands for (`dequantize()`,
        float32)."""
        if t.is_nested:
            return _nested_values(t)
        if type(t) in _PLAIN_TYPES:
            return t.dequantize() if t.is_quantized else t
        dtensor_module = sys.modules.get("torch.distributed.tensor")  # none made if not imported
        dtensor = getattr(dtensor_module, "DTensor", None)
        if dtensor is not None and isinstance(t, dtensor):
            return t.to_local()
        return t

    def describe(self, t: torch.Tensor) -> Tuple[str, Tuple[int, ...], int]:
        return dtype_name(t.dtype), tuple(t.shape), t.numel()

    def identity(self, t: torch.Tensor) -> Optional[Tuple[Hashable, Hashable]]:
        """(statistics key, data key). Equal statistics keys: the same elements of the same
        storage at the same version in the same row-major order (the statistics' `pos_mean`
        depends on it: a transpose or a flip has statistics of its own; a contiguous view of
        any shape shares its base's). Equal data keys: also the same shape and strides.
        The core checks that the first tensor of a key is still alive, so its storage cannot
        have been reused."""
        try:
            contiguous = t.is_contiguous()
            ptr = t.data_ptr()
            if not ptr and t.numel():
                return None                   # no memory of its own (a wrapper subclass)
            base = (ptr, t.dtype, t._version, t.get_device())
            if t.is_neg() or t.is_conj():     # the same bytes read negated or conjugated
                base += (t.is_neg(), t.is_conj())
            layout = ((t.numel(), 1, 1),) if contiguous else element_layout(t)
            shape = tuple(t.shape)
            return (base, layout), (base, shape, None if contiguous else t.stride())
        except (RuntimeError, NotImplementedError):  # tensors without storage (sparse, fake)
            return None

    def holds(self, t: torch.Tensor, key: Tuple[Any, ...]) -> bool:
        """Whether `t` (alive) still holds the memory its identity key was made from: a storage
        resized to nothing and back (FSDP2 frees and re-gathers unsharded parameters so) moves,
        and its old address may go to another tensor whose key would then match."""
        return t.data_ptr() == key[0][0]

    def facts(self, t: torch.Tensor) -> Tuple[str, Tuple[int, ...], int,
                                               Optional[Tuple[Hashable, Hashable]],
                                               Optional[Tuple[Hashable, Hashable, int]]]:
        """`describe`, `identity` and `storage` of a tensor in one call (asked for every
        record): dtype name, shape, numel, (statistics key, data key), (storage, view,
        version)."""
        dtype = t.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = dtype_name(dtype)
        shape = t.shape      # a torch.Size is a tuple (tuple() of it costs ~0.2 us a record)
        numel = t.numel()
        try:
            ptr, version = t.data_ptr(), t._version
            if not ptr and numel:
                return name, shape, numel, None, None  # no memory of its own (wrapper subclass)
            # the device's index, not a device object per record (-1: host memory; one kind of
            # accelerator runs in a process)
            base = (ptr, dtype, version, t.get_device())
            if t.is_neg() or t.is_conj():    # the same bytes read negated or conjugated
                base += (t.is_neg(), t.is_conj())
            if t.is_contiguous():
                keys = ((base, ((numel, 1, 1),)), (base, shape, None))
            else:
                stride = t.stride()
                keys = ((base, element_layout(t, stride)), (base, shape, stride))
            return name, shape, numel, keys, (_storage_id(t), (ptr, numel), version)
        except Exception:  # noqa: BLE001 - no storage (sparse, fake, wrapper subclasses, ...)
            return name, shape, numel, self.identity(t), self.storage(t)

    def storage(self, t: torch.Tensor) -> Optional[Tuple[Hashable, Hashable, int]]:
        """(storage, view, version): which storage holds the tensor (every view of it shares
        one), which elements of it (start and count), and the storage's write count (views
        share it)."""
        try:     # an inference tensor counts no writes: the state of its storage is its latest
            return _storage_id(t), (t.data_ptr(), t.numel()), version_of(t)   # writer's
        except Exception:  # noqa: BLE001 - no storage (sparse, fake, wrapper subclasses)
            return None

    def storage_ref(self, t: torch.Tensor) -> Callable[[], bool]:
        """Whether the tensor's storage still exists (a freed one's key may come back)."""
        return _StorageAlive(t.untyped_storage())

    @staticmethod
    def object_state(t: torch.Tensor) -> Optional[Tuple[int, int, torch.Size]]:
        """What changes whenever the elements a tensor object shows may have: its version
        (every in-place write, in-place view changes too), its data pointer (`.data =`, a
        storage resized and refilled) and its shape. The core reuses what it learnt of an
        object at its last record while this stays the same. None: no version to trust (an
        inference tensor counts none). A static method: the core takes it once per window
        (`getattr(tensors, "object_state")`) and calls it twice a record, and a plain
        function is called faster than a bound method."""
        try:
            return t._version, t.data_ptr(), t.shape
        except Exception:  # noqa: BLE001 - inference tensors, tensors without storage
            return None

    def nbytes(self, t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    # ------------------------------------------------------------------ statistics
    def summarize(self, t: torch.Tensor) -> Handle:
        """Queue min, max, sum, sum of squares, NaN and Inf counts of a tensor; nothing leaves
        the device. Called with gradients disabled (the adapter's guard)."""
        numel = t.numel()
        if numel == 0:
            return Pending(None, numel, None)   # no values
        if t.layout is not _STRIDED:
            return self._sparse(t, numel)
        if not has_memory(t):   # no memory of its own to read (a wrapper subclass, a tensor of
            return Pending(None, numel, None)   # functorch's vmap/grad, a fake tensor)
        if t.is_neg():          # a lazy negation (the imaginary part of a conjugate view): its
            t = t.detach().resolve_neg()     # memory holds the values negated
        if not t.is_cpu:                    # a flag read; t.device.type builds a device object
            if t.is_meta:
                return Pending(None, numel, None)
            return self.device.summarize(t)
        if _FORCED_BACKEND is not None:
            return self._forced(t)
        if fastats is not None:
            code = FAST_CODES.get(t.dtype)
            if code is not None:
                return host_row(t, code)
            # integers and bools as float64 (exact below 2**53), complex as its magnitude: one
            # C pass over the converted copy, not five torch reductions, each of which may wake
            # the intra-op thread pool (~1 ms for a 4 K-element bool mask)
            w = t.detach().abs() if t.is_complex() else t.detach().double()
            code = FAST_CODES.get(w.dtype)
            if code is not None:
                return host_row(w, code)
        return reductions(t, numel)

    def _sparse(self, t: torch.Tensor, numel: int) -> Handle:
        """Statistics of a sparse tensor (the gradient of an `nn.Embedding(sparse=True)`): of
        its stored values and the zeros it does not store, as of the same tensor made dense. On
        the host from the stored values alone; on a device from the dense tensor (one
        temporary)."""
        t = t.detach()
        values = stored_values(t)
        if values is None:              # another layout (mkldnn, ...): values not read
            return Pending(None, numel, None)
        if values.is_cpu:
            row = self.summarize(values)
            if type(row) is tuple:
                return with_zeros(row, values.numel(), numel)   # type: ignore[arg-type]
        return self.summarize(t.to_dense())

    def _forced(self, t: torch.Tensor) -> DeviceHandle:
        backend = _FORCED_BACKEND
        if backend == "triton" and not (t.dtype in stats_kernel.KERNEL_DTYPES
                                        and t.layout is torch.strided):
            backend = "torch"                       # the kernel does not take this dtype
        if backend not in ("triton", "torch"):
            raise ValueError(f"PRECDBG_DEVICE_STATS={backend!r}: expected triton or torch")
        if backend == "triton" and not stats_kernel.triton_available():
            raise ValueError("PRECDBG_DEVICE_STATS=triton: triton does not import")
        with torch.no_grad():
            return self.device.summarize(t, backend)

    def resolve(self, handles: Sequence[Handle]) -> np.ndarray:
        """Rows of (min, max, mean, norm, nan_count, inf_count, pos_mean) of a batch of handles
        (precdbg_pt.statistics.resolve), unobserved: the session resolves at stop() too,
        outside every hook."""
        with _Unobserved():
            return resolve(handles, self.device)

    def launch_queued(self) -> None:
        """Launch the statistics kernels this thread queued (at the end of every hook and of
        every call's records): cheap while this debugger never queued any."""
        device = self.device
        if device.ever_queued:
            device.launch_queued()

    def retained_bytes(self, handle: Any) -> int:
        """Bytes a handle keeps alive until it is resolved: a host copy (`to_host`), or a
        tensor held for statistics computed at resolve time; 0 for statistics computed already
        or enqueued into a device buffer."""
        if isinstance(handle, HostCopy):
            return nbytes(handle.tensor)
        if isinstance(handle, Pending) and handle.tensor is not None:
            return nbytes(handle.tensor)
        return 0

    def deferrable(self, handle: Any) -> bool:
        """Whether the handle's statistics can wait for the step's end at no cost: they are
        being computed on a device into its result buffer, whose rows all cross to the host at
        once."""
        return isinstance(handle, DeviceHandle)

    # ------------------------------------------------------------------ host copies
    def to_host(self, t: torch.Tensor) -> HostCopy:
        return host_copies.to_host(t)

    def hand_over(self, handles: Sequence[HostCopy]
                  ) -> Tuple[List[np.ndarray], Optional[Callable[[], None]]]:
        with _Unobserved():                 # asked at stop() too (see resolve)
            return host_copies.hand_over(handles)


def _nested_values(t: torch.Tensor) -> torch.Tensor:
    try:
        return t.values()                # the components' elements, as stored (no copy)
    except (RuntimeError, NotImplementedError):    # not contiguous: its components, copied
        return torch.cat([part.reshape(-1) for part in t.unbind()])


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
