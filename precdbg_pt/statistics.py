"""How the statistics row of a PyTorch tensor (min, max, mean, norm, NaN and Inf counts, and the
order-sensitive `pos_mean`: the finite values' mean weighted by a hash of their row-major index,
precdbg/capture/_fastats.c) is
computed; which way a tensor goes is `TorchTensors.summarize`'s choice (precdbg_pt.tensors).

CPU tensors (whose device *is* host memory) go through `precdbg.capture._fastats` (`host_row`):
one vectorised pass over the bytes gives min, max, the finite sum and sum of squares, NaN and Inf
counts (float64 exact); a handle is then the finished row. Tensors of other dtypes or without the
extension use torch's reductions (`reductions`: a `Pending` handle), resolved per batch.

Other devices (CUDA, NPU, XPU, ...) go through `precdbg_pt.device_stats`: one fused kernel per
tensor (Triton on CUDA, torch ops elsewhere) writes the statistics into a device result buffer of
the debugger's `DeviceStatistics`; the tensor is not kept, and all rows of a device cross to the
host once, when the session resolves the step's records (`resolve`).

Nothing here holds state but `_LAYOUTS`, a cache of a pure function (see there).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .device_stats import DeviceHandle, DeviceStatistics, finish_rows
from .torch_stats import index_hashes

try:   # one-pass C statistics for tensors in host memory; optional (needs a C compiler)
    from precdbg.capture import fastats as _fastats
except ImportError:  # pragma: no cover - exercised on machines without the extension
    _fastats = None

__all__ = ["Pending", "HostRow", "Handle", "FAST_CODES", "host_row", "reductions",
           "stored_values", "with_zeros", "resolve", "nbytes", "element_layout", "version_of",
           "INFERENCE_VERSION"]

_HALF = (torch.float16, torch.bfloat16)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


INFERENCE_VERSION = -1     # an inference tensor (torch.inference_mode) counts no writes


def version_of(t: torch.Tensor) -> int:
    """The tensor's write count; `INFERENCE_VERSION` for an inference tensor, which keeps none
    (no later write of it can be told from its version)."""
    try:
        return t._version
    except RuntimeError:
        if t.is_inference():
            return INFERENCE_VERSION
        raise


# (shape, strides) -> element_layout's answer: a cache of a pure function of its key, so every
# debugger of the process may share it (bounded, cleared when full)
_LAYOUTS: Dict[Tuple[Any, Tuple[int, ...]], Tuple[Tuple[int, int, int], ...]] = {}
_LAYOUTS_MAX = 4096        # distinct (shape, strides) kept; a model has far fewer


def element_layout(t: torch.Tensor, stride: Optional[Tuple[int, ...]] = None
            ) -> Tuple[Tuple[int, int, int], ...]:
    """Canonical (size, stride, logical stride) triples, by increasing stride (the logical
    stride: how far the dimension moves the row-major index): equal for every view that
    addresses the same elements in the same row-major order (a view with more or fewer
    size-1 dimensions, dimensions merged or split where both the memory and the order allow),
    so their statistics, which depend on that order (`pos_mean`), are computed once; a
    transpose or a flip has a layout of its own. Answered once per (shape, strides): a
    model's views come in few shapes, and the sort costs ~3 us."""
    shape = t.shape
    if stride is None:
        stride = t.stride()
    found = _LAYOUTS.get((shape, stride))
    if found is not None:
        return found
    logical = []
    run = 1
    for size in reversed(shape):
        logical.append(run)
        run *= size
    logical.reverse()
    dims = sorted((st, lst, sz) for sz, st, lst in zip(shape, stride, logical) if sz != 1)
    merged: List[List[int]] = []
    for step, lstep, size in dims:
        if merged and merged[-1][1] != 0 and step == merged[-1][1] * merged[-1][0] \
                and lstep == merged[-1][2] * merged[-1][0]:
            merged[-1][0] *= size
        else:
            merged.append([size, step, lstep])
    found = tuple((size, step, lstep) for size, step, lstep in merged)
    if len(_LAYOUTS) >= _LAYOUTS_MAX:
        _LAYOUTS.clear()
    _LAYOUTS[(shape, stride)] = found
    return found


class Pending:
    """Statistics still to be read: torch reductions of a tensor (`values`) taken on the host
    at resolve time, or none at all (no values, or none precdbg may read: `values` None)."""
    __slots__ = ("tensor", "version", "numel", "values")

    def __init__(self, tensor: Optional[torch.Tensor], numel: int, values: Any) -> None:
        self.tensor, self.numel, self.values = tensor, numel, values
        self.version = version_of(tensor) if tensor is not None else 0


_DOT_LIMIT = 1 << 20        # up to this size a BLAS dot is accurate to ~1e-7; beyond, row dots
_ROW = 4096


def _work_view(x: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    if dtype is torch.float32 or dtype is torch.float64:
        return x
    if dtype in _HALF:
        return x.float()
    if x.is_complex():
        return x.abs()
    return x.double()


def _sum_of_squares(flat: torch.Tensor) -> torch.Tensor:
    n = flat.numel()
    if n <= _DOT_LIMIT:
        return torch.dot(flat, flat)
    m = n // _ROW
    rows = flat[:m * _ROW].view(m, 1, _ROW)
    total = torch.bmm(rows, rows.transpose(1, 2)).sum(dtype=flat.dtype)
    if n > m * _ROW:
        rest = flat[m * _ROW:]
        total = total + torch.dot(rest, rest)
    return total


FAST_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
# Every CPU tensor of these dtypes goes through the C pass, whatever its size: float64 sums
# (exact against numpy float64), min/max over non-NaN values, one read. From 1 M elements it
# splits across two threads (precdbg/capture/_fastats.c: PAR_MIN).


HostRow = Tuple[float, float, float, float, int, int, float]


def host_row(t: torch.Tensor, code: int) -> HostRow:
    """The record's row itself (min, max, mean, norm, NaN and Inf counts, pos_mean), computed
    now: a host tensor's statistics handle is its finished row (no object, no arithmetic
    here)."""
    if not t.is_contiguous():
        dims = element_layout(t)
        if len(dims) != 1 or dims[0][1] != 1:   # not a dense block in row-major order
            # contiguous rows (a split, a slice, a transpose's columns, a broadcast's copies
            # read again): no copy
            row = _fastats.row_layout(t.data_ptr(), code, dims)
            if row is not None:
                return row
            t = t.contiguous()
    return _fastats.row(t.data_ptr(), t.numel(), code)


Handle = Union[HostRow, Pending, DeviceHandle]


def reductions(t: torch.Tensor, numel: int) -> Pending:
    """Torch's reductions of a host tensor that the C pass does not take (resolved per batch)."""
    t = t.detach()
    w = _work_view(t)
    lo, hi = torch.aminmax(w)
    flat = w.reshape(-1)
    return Pending(t, numel, (lo, hi, w.sum(), _sum_of_squares(flat), _index_weighted(flat)))


def _index_weighted(flat: torch.Tensor) -> torch.Tensor:
    """sum of flat[i] * s(i) in float64 (`flat`: row-major; s: pos_mean's index hash)."""
    return torch.dot(flat.double(), index_hashes(0, flat.numel(), flat.device))


def pos_mean(weighted: float, total: float, finite: float) -> float:
    """pos_mean from the finite values' hash-weighted sum and sum (`_fastats.c`)."""
    return (total + (2.0 * weighted + total) * _UNIT) / finite if finite else math.nan


_UNIT = 2.0 ** -32


# the values a sparse layout stores (duplicates of an uncoalesced COO tensor summed first)
_STORED_VALUES: Dict[Any, Callable[[torch.Tensor], torch.Tensor]] = {
    torch.sparse_coo: lambda t: t.coalesce().values()}
for _layout_name in ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc"):
    if hasattr(torch, _layout_name):
        _STORED_VALUES[getattr(torch, _layout_name)] = lambda t: t.values()


def stored_values(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The values a sparse tensor stores (None for a layout whose values are not read)."""
    stored = _STORED_VALUES.get(t.layout)
    return stored(t) if stored is not None else None


def with_zeros(row: HostRow, stored: int, numel: int) -> HostRow:
    """The row of `stored` values extended by the `numel - stored` zeros a sparse tensor holds
    without storing them (min, max and mean change; the norm and the counts do not; pos_mean
    is unknown, NaN: the stored values are not in the dense tensor's order)."""
    zeros = numel - stored
    lo, hi, mean, norm, nan, inf = row[:6]
    if zeros <= 0:
        return lo, hi, mean, norm, nan, inf, math.nan
    finite = stored - nan - inf
    total = mean * finite if finite > 0 else 0.0
    lo = min(lo, 0.0) if lo == lo else 0.0       # NaN: no stored value is a number
    hi = max(hi, 0.0) if hi == hi else 0.0
    return lo, hi, total / (finite + zeros), norm, nan, inf, math.nan


def _nonfinite_rows(pending: Sequence[Pending]) -> List[Optional[List[float]]]:
    """For tensors whose min or max is NaN/Inf: NaN and Inf counts, and the sum and sum of squares
    of the finite values, for all of them in one host transfer. None where the tensor changed."""
    rows: List[Optional[List[float]]] = [None] * len(pending)
    stacks, where = [], []
    for i, p in enumerate(pending):
        x = p.tensor
        if x is None or p.version == INFERENCE_VERSION or version_of(x) != p.version:
            continue
        w = _work_view(x).double()
        nan = torch.isnan(w).sum()
        inf = torch.isinf(w).sum()
        finite = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
        flat = finite.reshape(-1)
        stacks.append(torch.stack([nan.double(), inf.double(), flat.sum(), torch.dot(flat, flat),
                                   _index_weighted(flat)]))
        where.append(i)
    if stacks:
        host = torch.stack(stacks).cpu().tolist()
        for i, row in zip(where, host):
            rows[i] = row
    return rows


def _resolve_device(handles: Sequence[Handle], out: np.ndarray,
                    device: DeviceStatistics) -> None:
    where = [i for i, h in enumerate(handles) if isinstance(h, DeviceHandle)]
    if not where:
        return
    on_device = [handles[i] for i in where]
    raw = device.resolve(on_device)           # type: ignore[arg-type]
    out[where] = finish_rows(raw, [h.numel for h in on_device])


def resolve(handles: Sequence[Handle], device: DeviceStatistics) -> np.ndarray:
    """Rows of (min, max, mean, norm, nan_count, inf_count, pos_mean), one host transfer per
    device (and per dtype for large CPU tensors); `device`: the statistics object device
    handles are of. min/max are over all non-NaN values (so -inf shows); mean, norm and
    pos_mean over the finite values."""
    out = np.full((len(handles), 7), np.nan, dtype=np.float64)
    out[:, 4:6] = 0
    _resolve_device(handles, out, device)
    groups: Dict[Tuple[torch.dtype, torch.device], List[int]] = {}
    for i, p in enumerate(handles):
        if type(p) is tuple:                # a finished row (callers need not resolve it)
            out[i] = p
            continue
        if isinstance(p, DeviceHandle):
            continue
        if p.values is not None:
            groups.setdefault((p.values[0].dtype, p.values[0].device), []).append(i)
    redo: List[int] = []
    for indices in groups.values():
        flat = [v.double() for i in indices for v in handles[i].values]
        host = torch.stack(flat).cpu().double().numpy().reshape(len(indices), 5)
        for row, i in zip(host, indices):
            lo, hi, total, sq, weighted = row
            out[i, 0], out[i, 1] = lo, hi
            if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(total)
                    and math.isfinite(sq)):
                redo.append(i)       # non-finite values, or float32 sums that overflowed
                continue
            n = handles[i].numel
            out[i, 2], out[i, 3] = total / n, math.sqrt(sq)
            out[i, 6] = pos_mean(weighted, total, n)
    if redo:
        for i, row in zip(redo, _nonfinite_rows([handles[i] for i in redo])):
            if row is None:
                out[i, 4:6] = -1              # changed in place since: counts unknown
                continue
            nan, inf, total, sq, weighted = row
            n = handles[i].numel
            finite = n - nan - inf
            out[i, 2] = total / finite if finite else math.nan
            out[i, 6] = pos_mean(weighted, total, finite)
            out[i, 3] = math.sqrt(sq)
            out[i, 4], out[i, 5] = nan, inf
    for p in handles:
        if isinstance(p, Pending):
            p.tensor = None                   # release every tensor once its row is known
    return out
