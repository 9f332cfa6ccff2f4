"""The device-neutral statistics backend of `precdbg_pt.device_stats`: torch ops on the float32
(float64 for float64 and integer) work view of a tensor, NaN and Inf masked by `torch.where`,
sums accumulated in float64, in pieces of `_PIECE` elements; nothing synchronises (NPU, XPU,
integer/bool/complex/float8 tensors, and CUDA without Triton)."""
from __future__ import annotations

import math

import torch

from . import stats_kernel

__all__ = ["torch_row", "index_hashes", "HASH_K"]

HASH_K = 0x9E3779B9   # pos_mean's index hash: s(i) = i * HASH_K mod 2^32, as a signed int32
                      # (precdbg/capture/_fastats.c)


def _work_view(x: torch.Tensor) -> torch.Tensor:
    if x.dtype in (torch.float32, torch.float64):
        return x
    if x.is_complex():
        return x.abs()
    if x.is_floating_point() and x.element_size() <= 2:
        return x.float()
    return x.double()


_PIECE = 1 << 24      # elements per torch-ops pass: bounds its temporaries (float32 copy of a
                      # half tensor, NaN/Inf masks, the finite values) to a few x 64 MiB


def index_hashes(first: int, n: int, device: torch.device) -> torch.Tensor:
    """s(i) for i in [first, first + n), float64 (exact: int64 products wrap modulo 2^64,
    which keeps their low 32 bits)."""
    index = torch.arange(first, first + n, dtype=torch.int64, device=device)
    return (((index * HASH_K + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).double()


def _index_weighted(values: torch.Tensor, first: int) -> torch.Tensor:
    """sum of values[k] * s(first + k) in float64 (`values`: the piece's finite values, 0
    elsewhere; `first`: the row-major index of its first element)."""
    return torch.dot(values.double(), index_hashes(first, values.numel(), values.device))


def _piece_row(piece: torch.Tensor, floating: bool, first: int = 0) -> torch.Tensor:
    """(min, max, finite sum, finite sum of squares, nan, inf, index-weighted finite sum) of a
    1-d piece, float64; `first`: the index of its first element in the tensor."""
    w = _work_view(piece)
    if w.dtype is torch.float64 and not floating:              # integers, bool: all finite
        zero = torch.zeros((), dtype=torch.float64, device=w.device)
        lo, hi = torch.aminmax(w)
        return torch.stack([lo.double(), hi.double(), w.sum(), torch.dot(w, w), zero, zero,
                            _index_weighted(w, first)])
    is_nan = torch.isnan(w)
    is_inf = torch.isinf(w)
    lo = torch.where(is_nan, math.inf, w).amin().double()
    hi = torch.where(is_nan, -math.inf, w).amax().double()
    finite = torch.where(is_nan | is_inf, 0.0, w)
    total = finite.sum(dtype=torch.float64)
    squares = torch.linalg.vector_norm(finite, dtype=torch.float64).square()
    return torch.stack([lo, hi, total.double(), squares.double(),
                        is_nan.sum(dtype=torch.float64), is_inf.sum(dtype=torch.float64),
                        _index_weighted(finite, first)])


def torch_row(t: torch.Tensor) -> torch.Tensor:
    """The seven raw statistics of one tensor as a float64 device tensor (enqueued, no sync),
    in pieces of `_PIECE` elements of its own dtype (converted piece by piece), in row-major
    order (a view that is not contiguous is read through its contiguous copy)."""
    flat = stats_kernel.flat_view(t).reshape(-1)
    floating = t.is_floating_point()
    n = flat.numel()
    if n <= _PIECE:
        return _piece_row(flat, floating)
    rows = torch.stack([_piece_row(flat[i:i + _PIECE], floating, i)
                        for i in range(0, n, _PIECE)])
    return torch.cat([rows[:, 0].amin().reshape(1), rows[:, 1].amax().reshape(1),
                      rows[:, 2:].sum(dim=0)])
