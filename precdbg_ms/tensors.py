"""Tensor questions the core asks, for MindSpore tensors.

CPU tensors: `precdbg._fastats` reads their host memory in one pass (min, max, finite sum and sum
of squares in float64, NaN and Inf counts). Other devices (Ascend): min, max, sum and sum of
squares stay on the device as 0-d tensors and cross to the host in one `ops.stack(...)` per batch.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import ops

try:
    from precdbg import _fastats
except ImportError:  # pragma: no cover - machines without a C compiler
    _fastats = None

__all__ = ["describe", "facts", "identity", "storage", "storage_ref", "summarize", "resolve",
           "retained_bytes", "deferrable", "launch_queued", "to_host", "hand_over",
           "nbytes"]

_NAMES: Dict[Any, str] = {}
_FAST_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_FLOATS = {"float16", "float32", "float64", "bfloat16"}


def dtype_name(dtype: Any) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        text = str(dtype).lower()
        name = {"bool": "bool", "bool_": "bool"}.get(text, text)
        _NAMES[dtype] = name
    return name


class _Facts:
    """What the core asks of the tensor it is recording, read once: in PyNative's asynchronous
    pipeline `shape` and `data_ptr()` can each cost tens to hundreds of microseconds, and one
    record asks for them from describe(), identity(), storage() and summarize()."""
    __slots__ = ("ref", "version", "shape", "numel", "_ptr")

    def __init__(self, t: ms.Tensor) -> None:
        self.ref = weakref.ref(t)
        self.version = t._version
        self.shape = tuple(t.shape)
        self.numel = int(np.prod(self.shape)) if self.shape else 1
        self._ptr: Optional[int] = None

    def ptr(self, t: ms.Tensor) -> int:
        if self._ptr is None:
            self._ptr = t.data_ptr()
        return self._ptr


_LAST: List[Optional[_Facts]] = [None]      # the tensor being recorded (one record at a time)


def _facts(t: ms.Tensor) -> _Facts:
    last = _LAST[0]
    if last is not None and last.ref() is t and last.version == t._version:
        return last
    try:
        facts = _Facts(t)
    except TypeError:                        # no weak reference to this object: not remembered
        facts = _Facts.__new__(_Facts)
        facts.ref, facts.version, facts._ptr = (lambda: None), t._version, None
        facts.shape = tuple(t.shape)
        facts.numel = int(np.prod(facts.shape)) if facts.shape else 1
        return facts
    _LAST[0] = facts
    return facts


def describe(t: ms.Tensor) -> Tuple[str, Tuple[int, ...], int]:
    facts = _facts(t)
    return dtype_name(t.dtype), facts.shape, facts.numel


def nbytes(t: ms.Tensor) -> int:
    return int(t.nbytes)


def _on_host(t: ms.Tensor) -> bool:
    try:
        return "CPU" in str(t.device).upper()
    except Exception:  # noqa: BLE001 - older tensors without .device: ask the context
        return ms.get_context("device_target") == "CPU"


def identity(t: ms.Tensor) -> Optional[Tuple[Hashable, Hashable]]:
    """(statistics key, data key): the same storage, shape, strides and version."""
    try:
        facts = _facts(t)
        key = (facts.ptr(t), facts.shape, tuple(t.stride()), dtype_name(t.dtype), facts.version)
    except Exception:  # noqa: BLE001 - tensors without device memory yet
        return None
    return key, key


def storage(t: ms.Tensor) -> Optional[Tuple[Hashable, Hashable, int]]:
    """(storage, view, version): where the tensor's memory starts, which elements (start and
    count), and its write count."""
    try:
        facts = _facts(t)
        ptr = facts.ptr(t)
        return ptr, (ptr, facts.numel), facts.version
    except Exception:  # noqa: BLE001 - tensors without device memory yet
        return None


def facts(t: ms.Tensor) -> Tuple[str, Tuple[int, ...], int,
                                 Optional[Tuple[Hashable, Hashable]],
                                 Optional[Tuple[Hashable, Hashable, int]]]:
    """`describe`, `identity` and `storage` in one call (the facts are read once anyway)."""
    dtype, shape, numel = describe(t)
    return dtype, shape, numel, identity(t), storage(t)


def storage_ref(t: ms.Tensor) -> Callable[[], bool]:
    """Whether the tensor still exists (its memory cannot have been reused while it does)."""
    try:
        ref = weakref.ref(t)
    except TypeError:
        return lambda: True
    return lambda: ref() is not None


class _Pending:
    __slots__ = ("tensor", "numel", "values", "host")

    def __init__(self, tensor: Optional[ms.Tensor], numel: int, values: Any) -> None:
        self.tensor, self.numel, self.values = tensor, numel, values
        self.host: Optional[Tuple[float, float, float, float, int, int]] = None


def _host_row(arr: np.ndarray) -> Tuple[float, float, float, float, int, int]:
    code = _FAST_CODES.get(str(arr.dtype))
    arr = np.ascontiguousarray(arr)
    if _fastats is not None and code is not None:
        mn, mx, total, sq, nan, inf = _fastats.stats(arr.ctypes.data, arr.size, code)
    else:
        w = arr.astype(np.float64)
        finite = np.isfinite(w)
        nan, inf = int(np.isnan(w).sum()), int(np.isinf(w).sum())
        fw = np.where(finite, w, 0.0)
        total, sq = float(fw.sum()), float((fw * fw).sum())
        valid = w[~np.isnan(w)]
        mn, mx = (float(valid.min()), float(valid.max())) if valid.size else (math.nan, math.nan)
    finite_n = arr.size - nan - inf
    return (mn, mx, total / finite_n if finite_n else math.nan, math.sqrt(sq), nan, inf)


def summarize(t: ms.Tensor) -> _Pending:
    numel = _facts(t).numel
    if numel == 0:
        return _Pending(None, 0, None)
    name = dtype_name(t.dtype)
    if _on_host(t) and (_fastats is not None or name not in _FLOATS):
        p = _Pending(None, numel, None)
        arr = t.asnumpy()                     # host memory: a view, no copy
        if name == "bool" or arr.dtype.kind in "iub":
            arr = arr.astype(np.float64)
        p.host = _host_row(arr)
        return p
    x = t.astype(ms.float32) if name in ("float16", "bfloat16") or name not in _FLOATS else t
    x = ops.stop_gradient(x)
    return _Pending(t, numel, (x.min(), x.max(), x.sum(), (x * x).sum()))


def retained_bytes(handle: Any) -> int:
    """Bytes a handle keeps alive until it is resolved: a host copy (`to_host`), or the tensor
    whose statistics are on the device as 0-d tensors; 0 for host statistics computed already."""
    if isinstance(handle, _HostCopy):
        return int(handle.data.nbytes)
    return nbytes(handle.tensor) if handle.tensor is not None else 0


def deferrable(handle: _Pending) -> bool:
    """MindSpore statistics hold their tensor until resolved: never free to wait."""
    return False


def launch_queued() -> None:
    """MindSpore statistics are enqueued as they are captured: nothing waits for a launch."""


def resolve(handles: Sequence[_Pending]) -> np.ndarray:
    """Rows of (min, max, mean, norm, nan_count, inf_count); one host transfer per batch."""
    out = np.full((len(handles), 6), np.nan, dtype=np.float64)
    out[:, 4:] = 0
    device = [i for i, p in enumerate(handles) if p.host is None and p.values is not None]
    for i, p in enumerate(handles):
        if p.host is not None:
            out[i] = p.host
    if device:
        flat = [v.astype(ms.float64) for i in device for v in handles[i].values]
        host = ops.stack(flat).asnumpy().reshape(len(device), 4)
        for row, i in zip(host, device):
            lo, hi, total, sq = (float(v) for v in row)
            p = handles[i]
            if all(math.isfinite(v) for v in (lo, hi, total, sq)):
                out[i] = (lo, hi, total / p.numel, math.sqrt(sq), 0, 0)
            else:                              # non-finite values: exact pass on the host
                out[i] = _host_row(p.tensor.asnumpy())
    for p in handles:
        p.tensor = None
    return out


class _HostCopy:
    __slots__ = ("data", "moved")

    def __init__(self, data: Any, moved: bool) -> None:
        self.data, self.moved = data, moved     # a numpy copy, or a tensor being moved


def to_host(t: ms.Tensor) -> _HostCopy:
    """Start copying a tensor to host memory (asynchronously where the device allows)."""
    if _on_host(t):
        return _HostCopy(np.array(t.asnumpy(), copy=True), False)
    try:
        return _HostCopy(t.move_to("CPU", blocking=False), True)
    except Exception:  # noqa: BLE001 - no asynchronous copy here: copy now
        return _HostCopy(np.array(t.asnumpy(), copy=True), False)


def hand_over(handles: Sequence[_HostCopy]
              ) -> Tuple[List[np.ndarray], Optional[Callable[[], None]]]:
    """The arrays, waited for here (MindSpore's moves finish with a runtime-wide wait)."""
    return _finish_host(handles), None


def _finish_host(handles: Sequence[_HostCopy]) -> List[np.ndarray]:
    """Wait once for the moves still under way; bfloat16 leaves as its raw 16-bit words."""
    if any(h.moved for h in handles):
        ms.runtime.synchronize()
    out = []
    for h in handles:
        arr = h.data.asnumpy() if h.moved else h.data
        if str(arr.dtype) == "bfloat16":
            arr = arr.view(np.uint16)
        out.append(arr)
    return out
