"""The fused statistics kernel (Triton, CUDA): one read of each tensor in its own dtype, six
values per tensor into a row of a device result buffer (`precdbg_pt.device_stats`). Triton is
imported lazily and optionally; a kernel that cannot be built or launched turns the fused path
off for the process (statistics then use torch ops) and says so once. On CPU tensors the same
kernel runs in Triton's interpreter (TRITON_INTERPRET=1): testing only.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Dict, Sequence

import torch

__all__ = ["SLOTS", "KERNEL_DTYPES", "triton_available", "disable", "launch", "flat_view"]

log = logging.getLogger("precdbg")

_BLOCK = 1024                 # elements per block (one float32 partial each)
_SPAN = 16 * _BLOCK           # elements per program: fewer atomics on the result row
SLOTS = 4                     # tensors one launch may cover
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# compile options: squares and sums rounded as written (no fused multiply-add), stated rather than
# left to Triton's changing default (and its warning)
_OPTIONS = {"enable_fp_fusion": False}


_TRITON: Dict[str, Any] = {}


def triton_available() -> bool:
    """Whether the fused kernel can be built (triton imports); tried once."""
    if "ok" not in _TRITON:
        try:
            _TRITON["kernel"] = _build_kernel()
            _TRITON["ok"] = True
        except Exception:  # noqa: BLE001 - any import/definition failure means: use torch ops
            _TRITON["ok"] = False
    return _TRITON["ok"]


def _build_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n0", "n1", "n2", "n3", "c1", "c2", "c3", "row0"])
    def _stats_kernel(p0, p1, p2, p3, n0, n1, n2, n3, c1, c2, c3, out, row0,
                      BLOCK: tl.constexpr, SPAN: tl.constexpr, F64: tl.constexpr):
        # which tensor this program reads: programs [0,c1) tensor 0, [c1,c2) tensor 1, ...
        pid = tl.program_id(0).to(tl.int64)
        ptr = p0
        n = n0.to(tl.int64)
        first = pid
        # the row: computed, not assigned in branches (branches must yield tensors, not ints)
        slot = (pid >= c1).to(tl.int64) + (pid >= c2).to(tl.int64) + (pid >= c3).to(tl.int64)
        if pid >= c1:
            ptr = p1
            n = n1.to(tl.int64)
            first = pid - c1
        if pid >= c2:
            ptr = p2
            n = n2.to(tl.int64)
            first = pid - c2
        if pid >= c3:
            ptr = p3
            n = n3.to(tl.int64)
            first = pid - c3
        acc_t = tl.float64 if F64 else tl.float32
        begin = first * SPAN
        end = tl.minimum(begin + SPAN, n)
        lanes = tl.arange(0, BLOCK)
        # min/max and counts are exact in any order: kept per lane, reduced once per program;
        # the sums are reduced per block in float32 and accumulated in float64
        mn = tl.full((BLOCK,), float("inf"), acc_t)
        mx = tl.full((BLOCK,), float("-inf"), acc_t)
        nans = tl.full((BLOCK,), 0, tl.int32)
        infs = tl.full((BLOCK,), 0, tl.int32)
        total = tl.full((), 0.0, tl.float64)
        squares = tl.full((), 0.0, tl.float64)
        for start in range(begin, end, BLOCK):
            offs = start + lanes
            inside = offs < end
            x = tl.load(ptr + offs, mask=inside, other=0.0).to(acc_t)
            is_nan = x != x
            is_inf = tl.abs(x) == float("inf")
            skip = is_nan | (~inside)
            mn = tl.where(skip, mn, tl.minimum(mn, x))
            mx = tl.where(skip, mx, tl.maximum(mx, x))
            nans += is_nan.to(tl.int32)                  # masked lanes load 0.0: never counted
            infs += is_inf.to(tl.int32)
            v = tl.where(is_nan | is_inf, 0.0, x)
            s = tl.sum(v, axis=0)
            q = tl.sum(v * v, axis=0)
            if q == float("inf"):           # float32 overflow of the squares: redo in float64
                vd = v.to(tl.float64)
                total += tl.sum(vd, axis=0)
                squares += tl.sum(vd * vd, axis=0)
            else:
                total += s.to(tl.float64)
                squares += q.to(tl.float64)
        base = out + (row0 + slot) * 6
        tl.atomic_min(base, tl.min(mn, axis=0).to(tl.float64))
        tl.atomic_max(base + 1, tl.max(mx, axis=0).to(tl.float64))
        tl.atomic_add(base + 2, total)
        tl.atomic_add(base + 3, squares)
        tl.atomic_add(base + 4, tl.sum(nans, axis=0).to(tl.float64))
        tl.atomic_add(base + 5, tl.sum(infs, axis=0).to(tl.float64))

    return _stats_kernel


def _interpreted() -> Any:
    """The same kernel run by Triton's interpreter (numpy, CPU tensors): testing only."""
    from triton.runtime.interpreter import InterpretedFunction
    kernel = _TRITON["kernel"]
    if not isinstance(kernel, InterpretedFunction):
        raise RuntimeError("the Triton kernel runs on CPU tensors only in Triton's interpreter: "
                           "set TRITON_INTERPRET=1 before triton is first imported")
    return kernel


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as one dense block in some order: the tensor itself when it is a
    permutation of a dense block (statistics do not depend on order), else a contiguous copy."""
    if t.is_contiguous():
        return t
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return t.contiguous()
        expected *= size
    return t


def launch(tensors: Sequence[torch.Tensor], chunk: torch.Tensor, row0: int,
           interpret: bool) -> None:
    """One launch for up to SLOTS tensors of one dtype and device, into rows row0.. of chunk."""
    flats = [flat_view(t) for t in tensors]
    numels = [t.numel() for t in flats]
    programs = [-(-n // _SPAN) for n in numels]
    pad = SLOTS - len(flats)
    ptrs = flats + [flats[0]] * pad
    ns = numels + [0] * pad
    bounds = list(itertools.accumulate(programs + [0] * pad))   # a few ints: no numpy call
    kernel = _interpreted() if interpret else _TRITON["kernel"]
    kernel[(int(bounds[-1]),)](*ptrs, *ns, int(bounds[0]), int(bounds[1]), int(bounds[2]),
                                chunk, row0, BLOCK=_BLOCK, SPAN=_SPAN,
                                F64=flats[0].dtype is torch.float64, **_OPTIONS)


def disable(exc: BaseException) -> None:
    """The fused kernel failed to compile or launch (host-side, before anything ran): use
    torch ops from now on, and say so once."""
    _TRITON["ok"] = False
    log.warning("precdbg: the Triton statistics kernel failed (%s); statistics use torch ops",
                " ".join(str(exc).split())[:300])
