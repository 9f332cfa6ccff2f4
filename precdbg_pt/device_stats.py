"""Statistics of accelerator tensors, read once in their own dtype, results kept on the device.

Why: on an accelerator the old path launched 4-5 kernels per tensor (a float32 copy of half
tensors, `aminmax`, `sum`, a dot for the sum of squares) and crossed to the host every 256 tensors.
Here each captured tensor costs one kernel launch that reads its bytes once and adds its
statistics into a row of a device result buffer; nothing crosses to the host until `resolve`,
which copies all rows of a device in one transfer (one synchronisation per step).

A row holds seven float64 values: min, max (over the non-NaN values, so +-Inf shows: the
convention of the CPU `_fastats` pass), sum and sum of squares of the finite values, NaN count,
Inf count, and the finite values' sum weighted by a hash of their row-major index (sum of
x_i * s(i), s in precdbg/capture/_fastats.c: the order-sensitive statistic; `finish_rows` makes
it the record's `pos_mean`). A tensor that is
not contiguous is read through its contiguous copy, so that index is its logical one.
The tensor is not kept alive after its kernel is enqueued: stream order guarantees the kernel
reads the values as they were at capture time, and the caching allocator is stream-aware, so the
memory is not handed to another stream before the kernel ran.

Backends
--------
* ``triton`` (CUDA tensors of float32/float16/bfloat16/float64, when `triton` imports): one fused
  kernel. Each program reads a contiguous span of elements in blocks of ``_BLOCK``
  (precdbg_pt/stats_kernel.py; the span is chosen per launch so that the launch has a few
  programs per multiprocessor: enough loads in flight to read at memory speed); every lane
  keeps its min/max in the tensor's precision (float32 for the half types, which convert
  exactly) and its sum and sum of squares in float64, and the lanes are reduced once per
  program; programs combine their results with float64 atomics
  (`atomic_add`, `atomic_min/max`). Several tensors of one dtype may share one launch
  (`summarize_many`, up to ``SLOTS``): a fixed number of pointer arguments rather than a device
  table of pointers, because a table would need a host-to-device copy per launch (an extra
  transfer on the capture path) and integer-to-pointer casts the Triton interpreter cannot run.
* ``torch`` (`precdbg_pt.torch_stats`; everything else: NPU, XPU, integer/bool/complex/float8
  tensors, no Triton): device-neutral torch ops on the float32 (float64 for float64/integer) work view, NaN/Inf masked by
  `torch.where`, sums accumulated in float64, the row written with one `copy_` into the buffer:
  no host synchronisation, and the tensor is released once the ops are enqueued.

Accuracy (checked in tests/test_device_stats.py against numpy float64)
----------------------------------------------------------------------
Both backends convert every element exactly to float64 before it is added, so sums and sums of
squares carry float64 rounding only: a lane adds ``k = span / _BLOCK`` values, the lanes form a
tree of ``log2(_BLOCK) = 10`` levels and the ``p`` programs of a tensor add atomically (in any
order, ``k * p <= n / _BLOCK + p``), hence an error of at most ``(k + 10 + p) * 2**-53 * sum|x|``:
below 1e-12 of ``sum|x|`` for tensors up to 2**31 elements. The norm and the mean of float32
inputs therefore have relative errors far below 1e-6 (the tests require 1e-12; the previous
design, float32 sums per block, was bounded by ~6e-7). Min, max and the NaN and
Inf counts are exact.

State
-----
Everything that changes is held by one `DeviceStatistics` object per debugger (its adapter's
`TorchTensors` owns it): the result buffers of each device, the tensors each thread queued, the
count of host transfers. Two debuggers of one process share none of it: neither launches the
other's queued tensors, nor transfers or resets the other's rows. What stays module-level is
constant, or a cache of facts about the process (`stats_kernel`: the built kernel, its compiled
variants, each device's multiprocessor count).

Testing only: `DeviceStatistics.summarize_with(backend, tensors)` forces a backend, and runs the
Triton kernel in Triton's interpreter for CPU tensors; ``PRECDBG_DEVICE_STATS=triton|torch``
(read once by `precdbg_pt.tensors`) sends CPU tensors through this module so a whole dumped step
can be checked on a machine without an accelerator.
"""
from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import stats_kernel
from .torch_stats import torch_row

__all__ = ["DeviceHandle", "DeviceStatistics", "finish_rows", "triton_available"]

log = logging.getLogger("precdbg")

_CHUNK_ROWS = 4096            # rows per buffer chunk (192 KiB); a full chunk adds another
_COLUMNS = 7
_INIT = (math.inf, -math.inf, 0.0, 0.0, 0.0, 0.0, 0.0)
_UNKNOWN = np.array([math.nan, math.nan, math.nan, math.nan, -1.0, -1.0, math.nan])
_QUEUE_LIMIT = 64             # launch early past this many (a foreach call's tensor list)
_KERNEL_DTYPES = frozenset(stats_kernel.KERNEL_DTYPES)
_STRIDED = torch.strided


class DeviceHandle:
    """Where a tensor's statistics will be: a row of a device buffer (filled by `resolve`)."""
    __slots__ = ("buffer", "chunk", "row", "numel", "host")

    def __init__(self, buffer: Optional["_Buffer"], chunk: int, row: int, numel: int) -> None:
        self.buffer, self.chunk, self.row, self.numel = buffer, chunk, row, numel
        self.host: Optional[np.ndarray] = None


class _Buffer:
    """The result rows of one device for one `DeviceStatistics`: chunks of `_CHUNK_ROWS` x 6
    float64, allocated on first use and kept for later steps; rows are handed out in order and
    reset after each transfer."""

    def __init__(self, device: torch.device, owner: "DeviceStatistics") -> None:
        self.device = device
        self.owner = owner                  # its lock, and its count of host transfers
        self.on_host = device.type == "cpu"       # testing: CPU tensors through this path
        self.chunks: List[torch.Tensor] = []
        self.current = -1                   # chunk rows are taken from (-1: none yet)
        self.used = _CHUNK_ROWS             # rows used in the current chunk
        self.outstanding: List[DeviceHandle] = []
        self.streams: set = set()           # streams kernels were enqueued on since the transfer
        self.stream_of = _stream_query(device)
        # built on the device (fills, no host-to-device copy that could synchronise)
        self._init_row = torch.zeros(_COLUMNS, dtype=torch.float64, device=device)
        self._init_row[0] = _INIT[0]
        self._init_row[1] = _INIT[1]

    def _reset(self, chunk: torch.Tensor) -> None:
        chunk.copy_(self._init_row.expand_as(chunk))

    def take(self, numels: Sequence[int],
             handles: Optional[Sequence[DeviceHandle]] = None) -> List[DeviceHandle]:
        """Consecutive rows of one chunk, one per tensor (one launch writes them); `handles`:
        handles made earlier (queued tensors) that get these rows."""
        with self.owner.lock:
            return self._take(numels, handles)

    def _take(self, numels: Sequence[int],
              given: Optional[Sequence[DeviceHandle]]) -> List[DeviceHandle]:
        if self.used + len(numels) > _CHUNK_ROWS:
            self.current += 1
            self.used = 0
            if self.current == len(self.chunks):
                chunk = torch.empty((_CHUNK_ROWS, _COLUMNS), dtype=torch.float64,
                                    device=self.device)
                self._reset(chunk)
                self.chunks.append(chunk)
        if not self.on_host:
            self.streams.add(self.stream_of())
        if given is None:
            handles = [DeviceHandle(self, self.current, self.used + k, n)
                       for k, n in enumerate(numels)]
        else:
            handles = list(given)
            for k, h in enumerate(handles):
                h.buffer, h.chunk, h.row = self, self.current, self.used + k
        self.used += len(numels)
        self.outstanding.extend(handles)
        return handles

    def transfer(self) -> None:
        """One host crossing for every outstanding row of this device, then reset the rows
        (enqueued after the copy; the chunks are kept for the next step)."""
        if not self.outstanding:
            return
        parts = self.chunks[:self.current] + [self.chunks[self.current][:self.used]]
        # kernels enqueued on another stream (a side stream, a backward on the autograd
        # engine's stream) are not ordered before this copy: then wait for the whole device,
        # before the copy and after the reset (rare; one stream is one synchronisation)
        elsewhere = bool(self.streams - {self.stream_of()}) \
            if self.device.type != "cpu" else False
        if elsewhere:
            _synchronize(self.device)
        self.owner.transfers += 1
        host = _to_host(parts)
        for h in self.outstanding:
            h.host = host[h.chunk * _CHUNK_ROWS + h.row]
        for chunk in self.chunks[:self.current + 1]:
            self._reset(chunk)
        if elsewhere:
            _synchronize(self.device)
        self.current, self.used = -1, _CHUNK_ROWS
        self.outstanding = []
        self.streams = set()


def _stream_query(device: torch.device) -> Callable[[], Any]:
    """A cheap question 'which stream is current on this device?' (asked once per launch): the
    raw CUDA stream handle where torch offers it, else the device-neutral stream object."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if device.type == "cuda" and raw is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return lambda: raw(index)
    return lambda: _current_stream(device)


def _current_stream(device: torch.device) -> Any:
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "current_stream"):
        return accel.current_stream(device)
    module = getattr(torch, device.type, None)
    return module.current_stream(device) if module is not None else None


def _synchronize(device: torch.device) -> None:
    accel = getattr(torch, "accelerator", None)
    if accel is not None and hasattr(accel, "synchronize"):
        accel.synchronize(device)
    else:
        getattr(torch, device.type).synchronize(device)


def _to_host(parts: Sequence[torch.Tensor]) -> np.ndarray:
    """The single device-to-host transfer (and synchronisation) of a device's result rows."""
    joined = parts[0] if len(parts) == 1 else torch.cat(list(parts))
    # a copy: for CPU tensors (testing) `.cpu()` is the buffer itself, which is reset next
    return np.array(joined.cpu().numpy(), copy=True)


# ------------------------------------------------------------------ triton backend
triton_available = stats_kernel.triton_available


def _launch_triton(tensors: Sequence[torch.Tensor], handles: Sequence[DeviceHandle],
                   interpret: bool) -> None:
    """One fused launch for up to `SLOTS` tensors whose rows (consecutive) are `handles`."""
    first = handles[0]
    stats_kernel.launch(tensors, first.buffer.chunks[first.chunk], first.row, interpret)


# ------------------------------------------------------------------ torch backend
def _launch_torch(tensors: Sequence[torch.Tensor], handles: Sequence[DeviceHandle]) -> None:
    rows = torch.stack([torch_row(t) for t in tensors])
    h = handles[0]
    h.buffer.chunks[h.chunk][h.row:h.row + len(handles)].copy_(rows)


def _kernel_takes(t: torch.Tensor) -> bool:
    return t.dtype in stats_kernel.KERNEL_DTYPES and t.layout is torch.strided


def _backend_for(t: torch.Tensor) -> str:
    # flag reads, not `t.device.type` (a device object per tensor)
    if t.is_cuda and t.dtype in _KERNEL_DTYPES and t.layout is _STRIDED \
            and stats_kernel.triton_available():
        return "triton"
    return "torch"


class _Queue:
    """Tensors one thread captured for the fused kernel since its last launch. A hook's tensors
    (a call's inputs, its outputs, the gradients of one backward node) share launches: the
    adapter calls `launch_queued()` when the hook ends, before the framework runs on (an
    in-place op could change a queued input), on the thread and stream that captured them."""
    __slots__ = ("items", "__weakref__")

    def __init__(self) -> None:
        self.items: List[Tuple[torch.Tensor, DeviceHandle]] = []


class DeviceStatistics:
    """The device statistics of one debugger: its result buffers (one per device) and the
    tensors each thread queued for the fused kernel. Made by `TorchTensors`, one per adapter."""
    __slots__ = ("lock", "transfers", "ever_queued", "local", "_queues", "_buffers", "_by_index")

    def __init__(self) -> None:
        self.lock = threading.Lock()        # rows may be taken from autograd's device threads
        self.transfers = 0                  # times results crossed to the host (see resolve)
        # True once a tensor was queued (never reset: a hint that needs no lock; the cost of
        # every hook of a debugger that never queues is this flag's read)
        self.ever_queued = False
        self.local = threading.local()      # .queue: the calling thread's _Queue
        self._queues: "weakref.WeakSet[_Queue]" = weakref.WeakSet()   # every thread's
        self._buffers: Dict[torch.device, _Buffer] = {}
        # the buffer of a tensor's device by its index (`get_device()`: -1 for host memory),
        # asked per launch: a torch.device object and its hash cost more than the launch's own
        # arithmetic. One kind of accelerator runs in a process, so the index names the device.
        self._by_index: Dict[int, _Buffer] = {}

    def host_transfers(self) -> int:
        """How many times results crossed to the host (one per device per `resolve`)."""
        return self.transfers

    def _buffer_of(self, t: torch.Tensor) -> _Buffer:
        buf = self._by_index.get(t.get_device())
        if buf is None:
            device = t.device
            buf = self._buffers.get(device)
            if buf is None:
                buf = self._buffers[device] = _Buffer(device, self)
            self._by_index[t.get_device()] = buf
        return buf

    def _enqueue(self, backend: str, tensors: Sequence[torch.Tensor],
                 given: Optional[Sequence[DeviceHandle]] = None) -> List[DeviceHandle]:
        """Rows for `tensors` (all on one device, non-empty) and the kernels that fill them."""
        handles = self._buffer_of(tensors[0]).take([t.numel() for t in tensors], given)
        if backend == "torch":
            _launch_torch(tensors, handles)
            return handles
        interpret = tensors[0].is_cpu
        slots = stats_kernel.SLOTS
        for start in range(0, len(tensors), slots):
            group, rows = (tensors, handles) if len(tensors) <= slots else \
                (tensors[start:start + slots], handles[start:start + slots])
            try:
                _launch_triton(group, rows, interpret)
            except Exception as exc:  # noqa: BLE001 - a kernel that cannot be built or launched
                if interpret:
                    raise                           # testing: the kernel itself must work
                stats_kernel.disable(exc)
                _launch_torch(group, rows)
        return handles

    def _queue(self) -> _Queue:
        queue = getattr(self.local, "queue", None)
        if queue is None:
            queue = self.local.queue = _Queue()
            with self.lock:
                self._queues.add(queue)
        return queue

    # ------------------------------------------------------------------ entry points
    def summarize(self, t: torch.Tensor, backend: Optional[str] = None) -> DeviceHandle:
        """The statistics of one non-empty device tensor: queued for the fused kernel (launched
        by `launch_queued`), or enqueued now through torch ops. Returns where they will be.
        Called with gradients disabled (the adapter's guard): the tensor itself is queued, not
        a detached alias of it (the kernel reads its memory, nothing builds a graph)."""
        backend = backend or _backend_for(t)
        if backend != "triton":
            return self._enqueue(backend, [t.detach()])[0]
        handle = DeviceHandle(None, -1, -1, t.numel())      # rows are taken at launch
        self.ever_queued = True
        queue = getattr(self.local, "queue", None) or self._queue()
        items = queue.items
        items.append((t, handle))
        if len(items) >= _QUEUE_LIMIT:
            self.launch_queued()
        return handle

    def launch_queued(self) -> None:
        """Launch the fused kernel for the tensors this thread queued: one launch per device
        and dtype for up to `SLOTS` tensors. Cheap when nothing is queued."""
        if not self.ever_queued:
            return
        queue = getattr(self.local, "queue", None)
        if queue is not None and queue.items:
            self._launch_items(queue)

    def _launch_items(self, queue: _Queue) -> None:
        items, queue.items = queue.items, []
        first = items[0][0]
        if len(items) == 1:                 # most hooks queue one tensor, or tensors of one kind
            self._enqueue("triton", [first], [items[0][1]])
            return
        device, dtype = first.get_device(), first.dtype
        if all(t.get_device() == device and t.dtype is dtype for t, _ in items):
            self._enqueue("triton", [t for t, _ in items], [h for _, h in items])
            return
        groups: Dict[Tuple[int, torch.dtype], List[Tuple[torch.Tensor, DeviceHandle]]] = {}
        for item in items:
            groups.setdefault((item[0].get_device(), item[0].dtype), []).append(item)
        for group in groups.values():
            self._enqueue("triton", [t for t, _ in group], [h for _, h in group])

    def summarize_many(self, tensors: Sequence[torch.Tensor]) -> List[DeviceHandle]:
        """Enqueue the statistics of several non-empty tensors of one device: tensors the kernel
        takes share launches by dtype (up to `SLOTS` each), the rest go through torch ops."""
        groups: Dict[Tuple[str, Any], List[int]] = {}
        for i, t in enumerate(tensors):
            backend = _backend_for(t)
            groups.setdefault((backend, t.dtype if backend == "triton" else None),
                              []).append(i)
        out: List[Optional[DeviceHandle]] = [None] * len(tensors)
        for (backend, _), indices in groups.items():
            for i, h in zip(indices, self._enqueue(backend,
                                                   [tensors[i].detach() for i in indices])):
                out[i] = h
        return out  # type: ignore[return-value]

    def summarize_with(self, backend: str, tensors: Sequence[torch.Tensor]
                       ) -> List[DeviceHandle]:
        """Testing only: force `backend` ("triton" or "torch") for non-empty tensors of one
        device, CPU tensors included (the Triton kernel then runs in Triton's interpreter)."""
        if backend not in ("triton", "torch"):
            raise ValueError(f"unknown statistics backend {backend!r}")
        if backend == "triton" and not (stats_kernel.triton_available()
                                        and all(map(_kernel_takes, tensors))):
            raise ValueError("the triton backend needs triton and float32/16, bfloat16, "
                             "float64")
        with torch.no_grad():
            return self._enqueue(backend, [t.detach() for t in tensors])

    def resolve(self, handles: Sequence[DeviceHandle]) -> np.ndarray:
        """Raw rows (min, max, sum, sum of squares, nan, inf, index-weighted sum) of `handles`:
        one transfer per
        device whose rows are not on the host yet (every outstanding row of that device comes
        along)."""
        self.launch_queued()
        if any(h.buffer is None for h in handles):    # queued by a thread whose hook never ended
            with self.lock:
                queues = [q for q in self._queues if q.items]
            for queue in queues:
                self._launch_items(queue)
        for h in handles:
            if h.host is None and h.buffer is not None:
                h.buffer.transfer()
        if not handles:
            return np.zeros((0, _COLUMNS))
        # a row whose launch failed (reported then): statistics unknown, counts -1
        return np.stack([h.host if h.host is not None else _UNKNOWN for h in handles])


def finish_rows(raw: np.ndarray, numels: Sequence[int]) -> np.ndarray:
    """(min, max, mean, norm, nan, inf, pos_mean) from raw rows: mean over the finite values,
    pos_mean sum x_i (1 + (2 s(i) + 1) / 2^32) over them divided by their count (as
    `_fastats.row`), min
    and max NaN when every value is NaN (the `_fastats` convention)."""
    out = np.array(raw, dtype=np.float64, copy=True)
    n = np.asarray(numels, dtype=np.float64)
    finite = n - raw[:, 4] - raw[:, 5]
    with np.errstate(invalid="ignore", divide="ignore"):
        out[:, 2] = np.where(finite > 0, raw[:, 2] / np.maximum(finite, 1), np.nan)
        out[:, 6] = np.where(finite > 0, (raw[:, 2] + (2.0 * raw[:, 6] + raw[:, 2]) * 2.0 ** -32)
                             / np.maximum(finite, 1), np.nan)
    out[:, 3] = np.sqrt(raw[:, 3])
    all_nan = raw[:, 4] >= n
    out[all_nan, 0] = np.nan
    out[all_nan, 1] = np.nan
    return out

