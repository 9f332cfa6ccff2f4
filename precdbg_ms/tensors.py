"""Tensor questions the core asks, for MindSpore tensors: `MindSporeTensors`, the object each
MindSpore adapter owns (its `tensors`, precdbg.capture.TensorOps), holding what changes while
one debugger captures; two debuggers of one process share none of it.

PyNative runs ops asynchronously: a Python call only enqueues the op. Reading a tensor's memory
(`data_ptr()`, `asnumpy()`, `device`) makes the host wait until the op has run, and so does
`_version` inside a gradient computation (MindSpore 2.10 on the CPU; it also never counts a
write there: `copy_`, `__setitem__` and `ops.assign` leave it at 0). One such wait per record
drained the pipeline about a thousand times a GPT step, so a record reads only its dtype and
shape when it is captured:

- a tensor is known by its Python object (`id`, alive while the batch's weak reference is), not
  by its data pointer; MindSpore's other objects over the same memory are linked by the adapter;
- CPU statistics are deferred (where the API wrappers are installed, levels mix and api: at
  level module nothing sees an in-place write coming, so they are read at capture): the handle
  holds the tensor, and `resolve` (once per batch) or `settle` reads every held tensor after
  one wait, with `precdbg.capture.fastats` (one pass: min, max, finite sum and sum of squares in
  float64, NaN and Inf counts). The value read is the value at capture because the adapter
  settles before anything captured writes in place (in-place APIs, primitives with memory side
  effects, optimizers); parameters that are not trainable (running statistics that kernels
  update in place) are read at capture;
- other devices (Ascend): min, max, sum and sum of squares stay on the device as 0-d tensors
  and cross to the host in one `ops.stack(...)` per batch.

What stays at module level is shared by every debugger of the process, and safe to share
because nothing in it depends on a capture: the dtype names cache (`_NAMES`, a pure function's
results), constant tables, and the pure functions `dtype_name`, `pointer` and `_host_row`.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import mindspore as ms
import numpy as np
from mindspore import ops

try:
    from precdbg.capture import fastats as _fastats
except ImportError:  # pragma: no cover - machines without a C compiler
    _fastats = None

__all__ = ["MindSporeTensors", "dtype_name", "pointer"]

# dtype -> its name: the results of a pure function of the dtype, the same for every debugger
_NAMES: Dict[Any, str] = {}
# constant tables (never written)
_FAST_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2,
             "bfloat16": 2, "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8,
             "float64": 8, "complex64": 8, "complex128": 16}

# min, max, mean, norm, NaN and Inf counts, pos_mean (the finite values' mean weighted by a hash
# of their row-major index: see precdbg/capture/_fastats.c)
HostRow = Tuple[float, float, float, float, int, int, float]


def dtype_name(dtype: Any) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        # "Float32"; under a torch shim (mindnlp's mindtorch, MSAdapter) "mindspore.float32"
        text = str(dtype).lower().rsplit(".", 1)[-1]
        name = {"bool": "bool", "bool_": "bool"}.get(text, text)
        _NAMES[dtype] = name
    return name


def pointer(t: ms.Tensor) -> Optional[int]:
    """Where the tensor's memory starts (waits for the op that makes it: use sparingly)."""
    try:
        return t.data_ptr()
    except Exception:  # noqa: BLE001 - no device memory yet
        return None


class _Facts:
    """What the core asks of the tensor it is recording, read once: in PyNative's asynchronous
    pipeline the first read of `shape` waits for the op's shape inference, and one record asks
    for it from describe(), identity(), storage() and summarize()."""
    __slots__ = ("ref", "shape", "numel")

    def __init__(self, t: ms.Tensor) -> None:
        self.ref = weakref.ref(t)
        self.shape = tuple(t.shape)
        self.numel = int(np.prod(self.shape)) if self.shape else 1


def _unremembered_facts(t: ms.Tensor) -> _Facts:
    """The facts of an object without weak references (not remembered)."""
    facts = _Facts.__new__(_Facts)
    facts.ref = lambda: None
    facts.shape = tuple(t.shape)
    facts.numel = int(np.prod(facts.shape)) if facts.shape else 1
    return facts


class _Pending:
    """Statistics of one tensor on their way: a host row (`host`), a host tensor read later
    (`deferred`: `tensor` is read by `settle`), or 0-d device tensors (`values`, with the
    `tensor` kept for an exact pass over non-finite values)."""
    __slots__ = ("tensor", "numel", "values", "host", "deferred_bytes")

    def __init__(self, tensor: Optional[ms.Tensor], numel: int, values: Any) -> None:
        self.tensor, self.numel, self.values = tensor, numel, values
        self.host: Optional[HostRow] = None
        self.deferred_bytes = 0


class _HostCopy:
    __slots__ = ("data", "moved")

    def __init__(self, data: Any, moved: bool) -> None:
        self.data, self.moved = data, moved     # a numpy copy, or a tensor being moved


_HASH_K = 0x9E3779B9     # pos_mean's index hash (precdbg/capture/_fastats.c)


def _index_hashes(n: int) -> np.ndarray:
    """s(i) = i * _HASH_K modulo 2^32 as a signed 32-bit integer, for i < n, float64."""
    hashed = (np.arange(n, dtype=np.uint64) * np.uint64(_HASH_K)) & np.uint64(0xFFFFFFFF)
    return hashed.astype(np.uint32).view(np.int32).astype(np.float64)


def _pos_mean(weighted: float, total: float, finite: float) -> float:
    return (total + (2.0 * weighted + total) * 2.0 ** -32) / finite if finite else math.nan


def _host_row(arr: np.ndarray) -> HostRow:
    if arr.dtype == np.bool_ or arr.dtype.kind in "iub":
        arr = arr.astype(np.float64)
    elif arr.dtype.kind == "c":           # complex: its magnitude, as precdbg_pt records it
        arr = np.abs(arr)
    code = _FAST_CODES.get(str(arr.dtype))
    arr = np.ascontiguousarray(arr)
    if _fastats is not None and code is not None:
        return _fastats.row(arr.ctypes.data, arr.size, code)
    w = arr.astype(np.float64)
    finite = np.isfinite(w)
    nan, inf = int(np.isnan(w).sum()), int(np.isinf(w).sum())
    fw = np.where(finite, w, 0.0)
    total, sq = float(fw.sum()), float((fw * fw).sum())
    valid = w[~np.isnan(w)]
    mn, mx = (float(valid.min()), float(valid.max())) if valid.size else (math.nan, math.nan)
    finite_n = arr.size - nan - inf
    weighted = float(np.dot(fw.reshape(-1), _index_hashes(arr.size)))
    pos = _pos_mean(weighted, total, finite_n)
    return (mn, mx, total / finite_n if finite_n else math.nan, math.sqrt(sq), nan, inf, pos)


def _read_at_capture(t: ms.Tensor) -> bool:
    """A parameter that is not trainable (BatchNorm's running statistics): kernels write it in
    place inside the cells that use it, where no hook sees the write. (`_param_info`, not
    `requires_grad`: the property waits for the whole pipeline.)"""
    if not isinstance(t, ms.Parameter):
        return False
    info = getattr(t, "_param_info", None)
    return not (info.requires_grad if info is not None else t.requires_grad)


def _storage_ref(t: ms.Tensor) -> Callable[[], bool]:
    try:
        ref = weakref.ref(t)
    except TypeError:
        return lambda: True
    return lambda: ref() is not None


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


class MindSporeTensors:
    """The tensor questions of one MindSpore adapter (precdbg.capture.TensorOps), and the state
    they keep while it captures: the context's device target and whether host statistics may
    wait (read at `begin_window`), the writes captured calls made (in place of `_version`, see
    the module's text), the facts of the tensor being recorded, and the deferred host
    statistics not read yet."""
    __slots__ = ("_host_target", "_defer", "_writes", "_last", "_unsettled", "_index")

    # a weak reference of the tensor object: one per holder
    STORAGE_REF_FOLLOWS_MEMORY = False

    def __init__(self) -> None:
        # the context's device target is the CPU (every tensor is in host memory), and host
        # statistics may be read at the batch's end: both set at `begin_window`
        self._host_target = True
        self._defer = True
        # id(tensor) -> (weak reference to it, writes seen): the count of the in-place writes
        # made by captured calls, in place of `_version` (see the module's text)
        self._writes: Dict[int, Tuple[Any, int]] = {}
        self._last: Optional[_Facts] = None     # the tensor being recorded (one at a time)
        # deferred host statistics not read yet, in capture order
        self._unsettled: List[_Pending] = []
        # 0, 1, 2, ... as a tensor, grown by doubling: the row-major index of pos_mean's hash
        # (sliced, not `ops.arange(..., dtype=ms.int64)`: a torch shim's `str(ms.int64)`,
        # "mindspore.int64", fails arange's dtype check in MindSpore 2.7)
        self._index: Optional[ms.Tensor] = None

    # ------------------------------------------------------------------ the adapter's
    def begin_window(self, defer_host_statistics: bool) -> None:
        """A capture window starts: read the context's device target (on the CPU every tensor
        is in host memory, without asking each tensor's `device`, which waits for the op that
        makes it), and whether host statistics may wait for the batch (only where the adapter
        sees, and settles before, every in-place write: its API wrappers are installed)."""
        self._host_target = ms.get_context("device_target") == "CPU"
        self._defer = defer_host_statistics

    def note_write(self, t: ms.Tensor) -> None:
        """A captured call wrote `t` in place: later records of it are a new version."""
        last = self._last
        if last is not None and last.ref() is t:
            self._last = None                    # set_data may change its shape too
        writes = self._writes
        entry = writes.get(id(t))
        count = entry[1] if entry is not None and entry[0]() is t else 0
        try:
            writes[id(t)] = (weakref.ref(t), count + 1)
        except TypeError:                        # no weak reference to this object: not counted
            pass

    def forget_writes(self) -> None:
        """The capture window ended: its tensors' write counts are no longer asked for."""
        self._writes.clear()

    def settle(self) -> None:
        """Read every deferred host tensor now (one wait for the pipeline): before anything
        writes in place, so each record keeps the value it had when captured."""
        unsettled = self._unsettled
        if not unsettled:
            return
        pending = unsettled[:]
        del unsettled[:]
        failure: Optional[Exception] = None
        for p in pending:
            if p.host is None and p.tensor is not None:
                try:
                    p.host = _host_row(p.tensor.asnumpy())
                except Exception as exc:  # noqa: BLE001 - the others are still read; then raise
                    failure = exc
                p.tensor = None
        if failure is not None:
            raise failure

    # ------------------------------------------------------------------ facts
    def _facts(self, t: ms.Tensor) -> _Facts:
        last = self._last
        if last is not None and last.ref() is t:
            return last
        try:
            facts = _Facts(t)
        except TypeError:                        # no weak reference to this object
            return _unremembered_facts(t)
        self._last = facts
        return facts

    def _writes_of(self, t: ms.Tensor) -> int:
        entry = self._writes.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else 0

    def local(self, t: ms.Tensor) -> ms.Tensor:
        """A PyNative tensor holds all its elements in this process: the tensor itself."""
        return t

    def describe(self, t: ms.Tensor) -> Tuple[str, Tuple[int, ...], int]:
        facts = self._facts(t)
        return dtype_name(t.dtype), facts.shape, facts.numel

    def nbytes(self, t: ms.Tensor) -> int:
        return int(t.nbytes)

    def _on_host(self, t: ms.Tensor) -> bool:
        """Whether `t` is in host memory (asks the tensor: off the CPU target only)."""
        if self._host_target:
            return True
        try:
            return "CPU" in str(t.device).upper()
        except Exception:  # noqa: BLE001 - older tensors without .device: ask the context
            return ms.get_context("device_target") == "CPU"

    def identity(self, t: ms.Tensor) -> Optional[Tuple[Hashable, Hashable]]:
        """(statistics key, data key): the same tensor object, written as often by captured
        calls (`note_write`; MindSpore's `_version` waits for the pipeline). The object, not its
        memory: `data_ptr()` waits for the op that makes the tensor. Two objects over the same
        memory are summarised twice; an id is never taken for another object's, since the batch
        holds a weak reference to the tensor each key came from and drops dead ones."""
        try:
            self._facts(t)
            key = (id(t), self._writes_of(t))
        except Exception:  # noqa: BLE001 - not a tensor the framework can describe
            return None
        return key, key

    def holds(self, t: ms.Tensor, key: Hashable) -> bool:
        """A key is the object itself (`identity`): a live object is always its own."""
        return True

    def storage(self, t: ms.Tensor) -> Optional[Tuple[Hashable, Hashable, int]]:
        """(storage, view, version): the tensor object (alive as `storage_ref` tells), all of
        its elements, and the writes captured calls made (`note_write`). Its other objects over
        the same memory (a gradient value_and_grad returns, a cell's hook copy) are linked to it
        by the adapter (`alias_of`)."""
        try:
            facts = self._facts(t)
            key = id(t)
            return key, (key, facts.numel), self._writes_of(t)
        except Exception:  # noqa: BLE001 - not a tensor the framework can describe
            return None

    def facts(self, t: ms.Tensor) -> Tuple[str, Tuple[int, ...], int,
                                           Optional[Tuple[Hashable, Hashable]],
                                           Optional[Tuple[Hashable, Hashable, int]]]:
        """`describe`, `identity` and `storage` in one call: the facts read once, the write
        count looked up once."""
        facts = self._facts(t)
        key = id(t)
        entry = self._writes.get(key)
        writes = entry[1] if entry is not None and entry[0]() is t else 0
        identity = (key, writes)
        return (dtype_name(t.dtype), facts.shape, facts.numel, (identity, identity),
                (key, (key, facts.numel), writes))

    def storage_ref(self, t: ms.Tensor) -> Callable[[], bool]:
        """Whether the tensor still exists (its memory cannot have been reused while it does)."""
        return _storage_ref(t)

    # ------------------------------------------------------------------ statistics
    def summarize(self, t: ms.Tensor) -> Union[HostRow, _Pending]:
        """Host tensors: the finished row, or (deferred) a handle read at `settle`; device
        tensors: reductions enqueued on the device, read at `resolve`."""
        numel = self._facts(t).numel
        if numel == 0:
            return _Pending(None, 0, None)
        name = dtype_name(t.dtype)
        if (self._host_target or self._on_host(t)) and \
                (_fastats is not None or name not in _FLOATS):
            if not self._defer or _read_at_capture(t):
                return _host_row(t.asnumpy())   # host memory: a view, no copy; the finished row
            p = _Pending(t, numel, None)
            p.deferred_bytes = numel * _ITEMSIZE.get(name, 8)
            self._unsettled.append(p)
            return p
        # MindSpore's functions, not Tensor methods: a torch shim replaces those by its own,
        # which read a device attribute tensors MindSpore makes here lack
        x = ops.cast(t, ms.float32) if name in ("float16", "bfloat16") or name not in _FLOATS \
            else t
        x = ops.stop_gradient(x)
        index = self._index_upto(numel)
        hashed = ops.sub(ops.bitwise_and(ops.add(ops.mul(index, _HASH_K), 1 << 31), 0xFFFFFFFF),
                         1 << 31)
        weighted = ops.sum(ops.mul(ops.cast(ops.reshape(x, (-1,)), ms.float64),
                                   ops.cast(hashed, ms.float64)))
        return _Pending(t, numel, (ops.amin(x), ops.amax(x), ops.sum(x), ops.sum(ops.mul(x, x)),
                                   weighted))

    def _index_upto(self, numel: int) -> ms.Tensor:
        """[0, numel) as int64 on the device: a slice of one index tensor, made again (twice
        as long) only when a larger tensor comes."""
        if self._index is None or self._index.shape[0] < numel:
            size = max(numel, 2 * (self._index.shape[0] if self._index is not None else 0))
            self._index = ms.Tensor(np.arange(size, dtype=np.int64))
        return ops.narrow(self._index, 0, 0, numel)

    def retained_bytes(self, handle: Any) -> int:
        """Bytes a handle keeps alive until it is resolved: a host copy (`to_host`), the host
        tensor read later, or the tensor whose statistics are on the device as 0-d tensors; 0
        for host statistics computed already."""
        if isinstance(handle, _HostCopy):
            return int(handle.data.nbytes)
        if handle.deferred_bytes:
            return handle.deferred_bytes if handle.host is None else 0
        return int(handle.tensor.nbytes) if handle.tensor is not None else 0

    def deferrable(self, handle: _Pending) -> bool:
        """Deferred host statistics wait for the batch's end at no cost but the bytes they hold
        (retained_bytes): the host waits for the pipeline once per batch, not once per record.
        Device statistics hold their tensor until resolved: never free to wait."""
        return handle.deferred_bytes > 0

    def launch_queued(self) -> None:
        """MindSpore statistics are enqueued as they are captured: nothing waits for a launch."""

    def resolve(self, handles: Sequence[_Pending]) -> np.ndarray:
        """Rows of (min, max, mean, norm, nan_count, inf_count, pos_mean); one wait for the
        pipeline per batch (the first deferred read waits, the rest are done by then)."""
        self.settle()
        out = np.full((len(handles), 7), np.nan, dtype=np.float64)
        out[:, 4:6] = 0
        for i, p in enumerate(handles):
            if type(p) is tuple:                  # a finished row (callers need not resolve it)
                out[i] = p
            elif p.host is not None:
                out[i] = p.host
        device = [i for i, p in enumerate(handles)
                  if type(p) is not tuple and p.host is None and p.values is not None]
        if device:
            flat = [ops.cast(v, ms.float64) for i in device for v in handles[i].values]
            host = ops.stack(flat).asnumpy().reshape(len(device), 5)
            for row, i in zip(host, device):
                lo, hi, total, sq, weighted = (float(v) for v in row)
                p = handles[i]
                if all(math.isfinite(v) for v in (lo, hi, total, sq, weighted)):
                    n = p.numel
                    out[i] = (lo, hi, total / n, math.sqrt(sq), 0, 0,
                              _pos_mean(weighted, total, n))
                else:                              # non-finite values: exact pass on the host
                    out[i] = _host_row(p.tensor.asnumpy())
        for p in handles:
            if type(p) is not tuple:
                p.tensor = None
        return out

    # ------------------------------------------------------------------ host copies
    def to_host(self, t: ms.Tensor) -> _HostCopy:
        """Start copying a tensor to host memory (asynchronously where the device allows)."""
        if self._on_host(t):
            return _HostCopy(np.array(t.asnumpy(), copy=True), False)
        try:
            return _HostCopy(t.move_to("CPU", blocking=False), True)
        except Exception:  # noqa: BLE001 - no asynchronous copy here: copy now
            return _HostCopy(np.array(t.asnumpy(), copy=True), False)

    def hand_over(self, handles: Sequence[_HostCopy]
                  ) -> Tuple[List[np.ndarray], Optional[Callable[[], None]]]:
        """The arrays, waited for here (MindSpore's moves finish with a runtime-wide wait)."""
        return _finish_host(handles), None
