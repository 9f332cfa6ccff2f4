"""The device-neutral statistics backend of `precdbg_pt.device_stats`: torch ops on the float32
(float64 for float64 and integer) work view of a tensor, NaN and Inf masked by `torch.where`,
sums accumulated in float64, in pieces of `_PIECE` elements; nothing synchronises (NPU, XPU,
integer/bool/complex/float8 tensors, and CUDA without Triton)."""
from __future__ import annotations

import math

import torch

from . import stats_kernel

__all__ = ["torch_row"]


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


def _piece_row(piece: torch.Tensor, floating: bool) -> torch.Tensor:
    """(min, max, finite sum, finite sum of squares, nan, inf) of a 1-d piece, float64."""
    w = _work_view(piece)
    if w.dtype is torch.float64 and not floating:              # integers, bool: all finite
        zero = torch.zeros((), dtype=torch.float64, device=w.device)
        lo, hi = torch.aminmax(w)
        return torch.stack([lo.double(), hi.double(), w.sum(), torch.dot(w, w), zero, zero])
    is_nan = torch.isnan(w)
    is_inf = torch.isinf(w)
    lo = torch.where(is_nan, math.inf, w).amin().double()
    hi = torch.where(is_nan, -math.inf, w).amax().double()
    finite = torch.where(is_nan | is_inf, 0.0, w)
    total = finite.sum(dtype=torch.float64)
    squares = torch.linalg.vector_norm(finite, dtype=torch.float64).square()
    return torch.stack([lo, hi, total.double(), squares.double(),
                        is_nan.sum(dtype=torch.float64), is_inf.sum(dtype=torch.float64)])


def torch_row(t: torch.Tensor) -> torch.Tensor:
    """The six statistics of one tensor as a float64 device tensor (enqueued, no sync), in
    pieces of `_PIECE` elements of its own dtype (converted piece by piece)."""
    dense = stats_kernel.flat_view(t)
    # a permutation of a dense block (a transpose): its memory in order, no copy
    flat = dense.reshape(-1) if dense.is_contiguous() else \
        dense.as_strided((dense.numel(),), (1,))
    floating = t.is_floating_point()
    n = flat.numel()
    if n <= _PIECE:
        return _piece_row(flat, floating)
    rows = torch.stack([_piece_row(flat[i:i + _PIECE], floating) for i in range(0, n, _PIECE)])
    return torch.cat([rows[:, 0].amin().reshape(1), rows[:, 1].amax().reshape(1),
                      rows[:, 2:].sum(dim=0)])
