"""The fused statistics kernel (Triton, CUDA): one read of each tensor in its own dtype, six
values per tensor into a row of a device result buffer (min, max, finite sum and sum of squares,
NaN and Inf counts, and the finite sum weighted by a hash of the row-major index: s(i) = i *
0x9E3779B9 modulo 2^32 as a signed 32-bit integer, precdbg/capture/_fastats.c) (`precdbg_pt.device_stats`). Sums and
sums of squares are accumulated in float64 per lane and reduced once per program (a float64
add per element is far below what memory bandwidth lets the kernel do). Triton is
imported lazily and optionally; a kernel that cannot be built or launched turns the fused path
off for the process (statistics then use torch ops) and says so once. On CPU tensors the same
kernel runs in Triton's interpreter (TRITON_INTERPRET=1): testing only.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Dict, Sequence, Tuple

import torch

__all__ = ["SLOTS", "KERNEL_DTYPES", "triton_available", "disable", "launch", "flat_view"]

log = logging.getLogger("precdbg")

_BLOCK = 1024                 # elements a program reads at a time (one per lane)
_PROGRAMS_PER_SM = 4          # programs a launch aims at per multiprocessor (see launch)
_INTERPRETED_PROGRAMS = 4     # the same aim in Triton's interpreter (CPU tensors, testing)
SLOTS = 4                     # tensors one launch may cover
_INT32 = 2 ** 31
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# compile options: squares and sums rounded as written (no fused multiply-add), stated rather than
# left to Triton's changing default (and its warning)
_OPTIONS = {"enable_fp_fusion": False}


# Facts about this process's Triton, shared by every debugger of the process: the kernel once
# built ("kernel"), whether it builds and launches ("ok": a kernel that failed to build fails
# alike for every debugger), whether compiled kernels may be launched directly ("direct", with
# the "driver" and "hooks" that launch takes)
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

    @triton.jit(do_not_specialize=["n0", "n1", "n2", "n3", "c1", "c2", "c3", "row0", "span"])
    def _stats_kernel(p0, p1, p2, p3, n0, n1, n2, n3, c1, c2, c3, out, row0, span,
                      BLOCK: tl.constexpr, F64: tl.constexpr):
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
        begin = first * span
        end = tl.minimum(begin + span, n)
        lanes = tl.arange(0, BLOCK)
        # every lane keeps its own min/max (in the tensor's precision: exact), counts and float64
        # sums over the span / BLOCK elements it reads; the lanes are reduced once at the end
        mn = tl.full((BLOCK,), float("inf"), acc_t)
        mx = tl.full((BLOCK,), float("-inf"), acc_t)
        nans = tl.full((BLOCK,), 0, tl.int32)
        infs = tl.full((BLOCK,), 0, tl.int32)
        total = tl.full((BLOCK,), 0.0, tl.float64)
        squares = tl.full((BLOCK,), 0.0, tl.float64)
        weighted = tl.full((BLOCK,), 0.0, tl.float64)       # sum of x_i * s(i) (i: row-major)
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
            v = tl.where(is_nan | is_inf, 0.0, x).to(tl.float64)
            total += v
            squares += v * v
            hashed = offs.to(tl.uint32) * 0x9E3779B9         # wraps modulo 2^32
            weighted += v * hashed.to(tl.int32, bitcast=True).to(tl.float64)
        base = out + (row0 + slot) * 7
        tl.atomic_min(base, tl.min(mn, axis=0).to(tl.float64))
        tl.atomic_max(base + 1, tl.max(mx, axis=0).to(tl.float64))
        tl.atomic_add(base + 2, tl.sum(total, axis=0))
        tl.atomic_add(base + 3, tl.sum(squares, axis=0))
        tl.atomic_add(base + 4, tl.sum(nans, axis=0).to(tl.float64))
        tl.atomic_add(base + 5, tl.sum(infs, axis=0).to(tl.float64))
        tl.atomic_add(base + 6, tl.sum(weighted, axis=0))

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
    """The tensor's elements as one dense block in row-major order: the tensor itself when it
    is contiguous, else its contiguous copy (a transpose too: the index-weighted sum is that of
    the logical order, so that every layout of the same tensor gets the same statistics)."""
    return t if t.is_contiguous() else t.contiguous()


def launch(tensors: Sequence[torch.Tensor], chunk: torch.Tensor, row0: int,
           interpret: bool) -> None:
    """One launch for up to SLOTS tensors of one dtype and device, into rows row0.. of chunk.
    Runs once per captured call on the training thread: plain arithmetic on a few ints."""
    # the span of a program: enough programs to keep the memory system busy (a few per SM:
    # each reads one block of BLOCK elements at a time), few enough that the atomics that
    # combine them stay cheap
    wanted = _WANTED.get(chunk.get_device()) or _programs_wanted(chunk)
    if len(tensors) == 1:                       # most launches: one hook, one new tensor
        first = tensors[0]
        if not first.is_contiguous():
            first = flat_view(first)
        total = first.numel()
        span = -(-total // (_BLOCK * wanted)) * _BLOCK
        programs = -(-total // span)
        ptrs: Sequence[torch.Tensor] = (first,) * SLOTS
        args: Tuple[Any, ...] = (first, first, first, first, total, 0, 0, 0, programs,
                                 programs, programs, chunk, row0, span)
        grid = (programs,)
    else:
        flats = [t if t.is_contiguous() else flat_view(t) for t in tensors]
        numels = [t.numel() for t in flats]
        total = sum(numels)
        span = -(-total // (_BLOCK * wanted)) * _BLOCK
        pad = SLOTS - len(flats)
        first = flats[0]
        ptrs = flats + [first] * pad if pad else flats
        ns = numels + [0] * pad if pad else numels
        bounds = list(itertools.accumulate([-(-n // span) for n in ns]))   # a few ints
        grid = (bounds[-1],)
        args = (*ptrs, *ns, bounds[0], bounds[1], bounds[2], chunk, row0, span)
    dtype = first.dtype
    f64 = dtype is torch.float64
    if interpret:
        _interpreted()[grid](*args, BLOCK=_BLOCK, F64=f64, **_OPTIONS)
        return
    # the compiled kernel Triton chose for this device, dtype, pointer alignments and integer
    # widths (pointers are specialised on 16-byte alignment; integers are not specialised, but
    # typed int32 or int64 by their value: all int32 unless an element count or the span
    # reaches 2**31, when every width is part of the key)
    aligned = 0
    if len(tensors) == 1:
        if not first.data_ptr() & 15:
            aligned = (1 << SLOTS) - 1
    else:
        for i, p in enumerate(ptrs):
            if not p.data_ptr() & 15:
                aligned |= 1 << i
    if chunk.data_ptr() & 15:
        aligned |= 1 << SLOTS
    if total < _INT32 and span < _INT32 and row0 < _INT32:
        key: Tuple[Any, ...] = (dtype, chunk.get_device(), aligned)
    else:
        key = (dtype, chunk.get_device(), aligned, *[v >= _INT32 for v in args[SLOTS:SLOTS + 7]],
               row0 >= _INT32, span >= _INT32)
    compiled = _COMPILED.get(key)
    if compiled is not None:
        try:
            _launch_compiled(compiled, grid, (*args, _BLOCK, f64))
            return
        except Exception as exc:  # noqa: BLE001 - this Triton launches otherwise: its own way
            _TRITON["direct"] = False
            _COMPILED.clear()
            log.warning("precdbg: launching the compiled statistics kernel directly failed "
                        "(%s); launching through Triton", " ".join(str(exc).split())[:200])
    compiled = _TRITON["kernel"][grid](*args, BLOCK=_BLOCK, F64=f64, **_OPTIONS)
    if _direct_launch_supported() and compiled is not None:
        _COMPILED[key] = compiled


# Triton's JITFunction.run binds and specialises every argument and computes a cache key on each
# launch (~20 us of Python). Once the compiled kernel of a key is known, it is launched the way
# JITFunction.run launches it, where the installed Triton launches that way (checked once, from
# its source); elsewhere every launch goes through JITFunction.run. A cache of compiled code,
# keyed by everything the compilation depends on: every debugger of the process may share it.
_COMPILED: Dict[Any, Any] = {}


def _direct_launch_supported() -> bool:
    if "direct" not in _TRITON:
        _TRITON["direct"] = False
        try:
            import inspect

            from triton import knobs, runtime
            from triton.runtime.jit import JITFunction
            _TRITON["driver"], _TRITON["hooks"] = runtime.driver.active, knobs.runtime
            source = " ".join(inspect.getsource(JITFunction.run).split())
            _TRITON["direct"] = (
                "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, "
                "kernel.packed_metadata, launch_metadata, knobs.runtime.launch_enter_hook, "
                "knobs.runtime.launch_exit_hook, *bound_args.values())" in source
                and hasattr(knobs.runtime, "launch_enter_hook"))
        except Exception:  # noqa: BLE001 - any doubt: launch through JITFunction.run
            pass
    return _TRITON["direct"]


def _launch_compiled(compiled: Any, grid: Tuple[int], values: Tuple[Any, ...]) -> None:
    """JITFunction.run's launch of an already compiled kernel: `values` are every argument in
    the kernel's order, constexprs included (what Triton's bound arguments hold)."""
    driver, hooks = _TRITON["driver"], _TRITON["hooks"]
    stream = driver.get_current_stream(driver.get_current_device())
    compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *values),
                 hooks.launch_enter_hook, hooks.launch_exit_hook, *values)


# device index -> programs per launch (its multiprocessors): a fact of the device, shared
_WANTED: Dict[int, int] = {}


def _programs_wanted(chunk: torch.Tensor) -> int:
    """How many programs one launch on the chunk's device aims at (multiprocessors x a few)."""
    device = chunk.device
    wanted = _WANTED.get(chunk.get_device())
    if wanted is None:
        if device.type == "cuda":
            count = torch.cuda.get_device_properties(device).multi_processor_count
            wanted = _PROGRAMS_PER_SM * count
        else:
            wanted = _INTERPRETED_PROGRAMS
        _WANTED[chunk.get_device()] = wanted      # by index: one kind of device per process
    return wanted


def disable(exc: BaseException) -> None:
    """The fused kernel failed to compile or launch (host-side, before anything ran): use
    torch ops from now on, and say so once."""
    _TRITON["ok"] = False
    log.warning("precdbg: the Triton statistics kernel failed (%s); statistics use torch ops",
                " ".join(str(exc).split())[:300])
