"""Fused device statistics (precdbg_pt.device_stats): both backends against numpy float64 on CPU
tensors (the Triton kernel in Triton's interpreter; tests/conftest.py sets TRITON_INTERPRET=1 on
machines without CUDA), the documented accuracy, one host crossing per dumped step through the
public API, and - on CUDA machines only - the kernel, sync count and peak memory on the GPU."""
from __future__ import annotations

import math
import warnings
from typing import List

import numpy as np
import pytest
import torch

import precdbg
from precdbg_pt import PrecisionDebugger, device_stats, torch_stats
from precdbg_pt import tensors as pt_tensors

from torch_support import make_batch_list, make_model, make_optimizer, run_steps

KERNEL_BOUND = 1e-12                # documented: float64 sums in both backends
HAS_TRITON = device_stats.triton_available()
TENSORS = pt_tensors.TorchTensors()     # the statistics of the tests below: one debugger's
STATS = TENSORS.device
try:
    STATS.summarize_with("triton", [torch.ones(3)])
    RUNS_ON_CPU = True              # the interpreter is on (TRITON_INTERPRET=1 at import)
except (RuntimeError, ValueError):
    RUNS_ON_CPU = False
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not (HAS_TRITON and RUNS_ON_CPU), reason="triton (interpreter) not available"))]
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
OTHERS = [torch.int32, torch.int64, torch.uint8, torch.int8, torch.bool]


def numpy_row(t: torch.Tensor) -> np.ndarray:
    """(min, max, finite sum, finite sum of squares, nan, inf) in float64."""
    w = t.detach().cpu()
    w = (w.float() if w.dtype is torch.bfloat16 else w).numpy().astype(np.float64).ravel()
    nan, inf = np.isnan(w), np.isinf(w)
    ordered = w[~nan]
    f = np.where(nan | inf, 0.0, w)
    lo, hi = (ordered.min(), ordered.max()) if ordered.size else (np.nan, np.nan)
    return np.array([lo, hi, f.sum(), (f * f).sum(), nan.sum(), inf.sum()])


def check_raw(raw: np.ndarray, t: torch.Tensor, bound: float) -> None:
    ref = numpy_row(t)
    w = t.detach().cpu().double().numpy().ravel()
    finite = w[np.isfinite(w)]
    abs_sum = np.abs(finite).sum()
    ordered = raw[4] < t.numel()          # all-NaN: min/max stay at +inf/-inf in the raw row
    if ordered:
        assert raw[0] == ref[0] and raw[1] == ref[1], (raw, ref)
    assert raw[4] == ref[4] and raw[5] == ref[5], (raw, ref)
    assert abs(raw[2] - ref[2]) <= bound * abs_sum + 1e-300, (raw[2], ref[2])
    assert abs(raw[3] - ref[3]) <= bound * ref[3] + 1e-300, (raw[3], ref[3])


def sample(n: int, dtype: torch.dtype, seed: int = 0, specials: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -1000), min(info.max, 1000), (n,), generator=g,
                             dtype=dtype)
    x = (torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1).to(dtype)
    if specials and n >= 8:
        x[n // 7] = math.nan
        x[n // 3] = math.inf
        x[n // 2] = -math.inf
        x[n - 1] = math.nan
    return x


def bound_for(backend: str, dtype: torch.dtype) -> float:
    return KERNEL_BOUND if backend == "triton" and dtype is not torch.float64 else 1e-12


# ----------------------------------------------------------------------------- both backends
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [1, 7, 1023, 1025, 16385, 40001])
def test_backend_matches_numpy(backend, dtype, n):
    x = sample(n, dtype, seed=n)
    raw = STATS.resolve(STATS.summarize_with(backend, [x]))
    check_raw(raw[0], x, bound_for(backend, dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_several_million_elements_with_specials(backend):
    x = sample(2_000_003, torch.bfloat16, seed=3)
    raw = STATS.resolve(STATS.summarize_with(backend, [x]))
    check_raw(raw[0], x, bound_for(backend, torch.bfloat16))


@pytest.mark.parametrize("dtype", OTHERS)
def test_integers_and_bool_through_torch_ops(dtype):
    x = sample(5003, dtype)
    raw = STATS.resolve(STATS.summarize_with("torch", [x]))
    check_raw(raw[0], x, 1e-15)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_views(backend):
    base = sample(64 * 130, torch.float32, seed=5).reshape(64, 130)
    views = [base.t(), base[:, ::3], base[5:40, 7:100], base.reshape(8, 8, 130).permute(2, 0, 1)]
    raw = STATS.resolve(STATS.summarize_with(backend, views))
    for row, v in zip(raw, views):
        check_raw(row, v, bound_for(backend, torch.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_launch_covers_several_tensors_of_mixed_sizes(backend):
    xs = [sample(n, torch.float16, seed=n) for n in (1, 20000, 3, 1024, 17000, 9)]
    handles = STATS.summarize_with(backend, xs)
    raw = STATS.resolve(handles)
    for row, x in zip(raw, xs):
        check_raw(row, x, bound_for(backend, torch.float16))


def _queued_one_by_one(tensors: List[torch.Tensor], backend: str) -> np.ndarray:
    """What a hook does: each tensor queued, then the queue launched (one tensor per launch),
    and a last queue of several tensors of two dtypes (one launch per dtype)."""
    handles = []
    with torch.no_grad():
        for t in tensors:
            handles.append(STATS.summarize(t, backend))
            STATS.launch_queued()
        mixed = [tensors[0], tensors[1].double(), tensors[2], tensors[3].double()]
        handles += [STATS.summarize(t, backend) for t in mixed]
        STATS.launch_queued()
    return STATS.resolve(handles), tensors + mixed


@pytest.mark.skipif(not (HAS_TRITON and RUNS_ON_CPU), reason="triton (interpreter) not available")
def test_tensors_queued_one_per_launch_match_numpy():
    """The launch of a single queued tensor (the common hook) has its own argument path: views at
    every offset, non-contiguous views, a tensor that requires grad, each against numpy."""
    base = sample(4099, torch.float32, seed=11)
    leaf = sample(300, torch.float32, seed=12).requires_grad_()
    views = [base[k:] for k in range(5)] + [base[:4096].reshape(64, 64).t(), base[::3], leaf]
    raw, tensors = _queued_one_by_one(views, "triton")
    for row, t in zip(raw, tensors):
        check_raw(row, t, bound_for("triton", t.dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_nan_overflow_and_extremes(backend):
    all_nan = torch.full((2000,), math.nan)
    big = torch.full((3000,), 3.0e38)                  # squares overflow float32
    big[::2] = -1.0e30
    tiny = torch.full((100,), 1e-30, dtype=torch.bfloat16)
    handles = STATS.summarize_with(backend, [all_nan, big, tiny])
    for h in handles[1:]:
        assert h.host is None                          # nothing crossed at capture time
    rows = TENSORS.resolve(handles)
    assert math.isnan(rows[0, 0]) and math.isnan(rows[0, 1]) and rows[0, 4] == 2000
    assert math.isnan(rows[0, 2]) and rows[0, 3] == 0
    ref = big.double()
    assert math.isfinite(rows[1, 3])
    assert abs(rows[1, 3] - float(ref.norm())) <= 1e-6 * float(ref.norm())
    assert abs(rows[1, 2] - float(ref.mean())) <= 1e-6 * float(ref.abs().mean())
    assert rows[2, 0] == rows[2, 1] == float(tiny[0].float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_documented_accuracy_of_mean_and_norm(backend):
    """float32: mean and norm within 1e-12 relative of numpy float64 (float64 sums; the issue
    asks for 1e-6); for cancelling values the documented bound 1e-12 * mean(|x|) on the mean."""
    g = torch.Generator().manual_seed(11)
    shifted = torch.randn(1 << 18, generator=g) * 2 + 5
    cancelling = torch.randn(1 << 18, generator=g)
    rows = TENSORS.resolve(STATS.summarize_with(backend, [shifted, cancelling]))
    for row, x in zip(rows, (shifted, cancelling)):
        w = x.double().numpy()
        assert abs(row[3] - np.linalg.norm(w)) <= 1e-12 * np.linalg.norm(w)
        assert abs(row[2] - w.mean()) <= 1e-12 * np.abs(w).mean() + 1e-300
    w = shifted.double().numpy()
    assert abs(rows[0, 2] - w.mean()) <= 1e-12 * abs(w.mean())


def test_buffer_grows_past_a_chunk_and_crosses_once():
    xs = [torch.full((3,), float(i)) for i in range(device_stats._CHUNK_ROWS + 50)]
    before = STATS.host_transfers()
    handles = [STATS.summarize_with("torch", [x])[0] for x in xs]
    assert len({h.chunk for h in handles}) == 2
    rows = TENSORS.resolve(handles)
    assert STATS.host_transfers() == before + 1
    np.testing.assert_array_equal(rows[:, 2], np.arange(len(xs), dtype=np.float64))
    # rows are reset and reused: the next step starts in the first chunk again
    again = STATS.summarize_with("torch", [torch.ones(4)])
    assert again[0].chunk == 0 and again[0].row == 0
    assert TENSORS.resolve(again)[0, 2] == 1.0


def test_mixed_batch_of_host_and_device_handles(monkeypatch):
    xs = [sample(100, torch.float32, 1), torch.zeros(0), sample(2 << 20, torch.float32, 2, specials=False),
          sample(50, torch.int64, 3)]
    host = TENSORS.resolve([TENSORS.summarize(x) for x in xs])
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", "torch")
    handles = [TENSORS.summarize(x) for x in xs]
    assert [TENSORS.deferrable(h) for h in handles] == [True, False, True, True]
    assert all(TENSORS.retained_bytes(h) == 0 for h in handles)
    mixed = TENSORS.resolve(handles)
    np.testing.assert_allclose(mixed, host, rtol=1e-6, atol=1e-12, equal_nan=True)


# ----------------------------------------------------------------------------- a dumped step
def dump_step(path: str, steps: int = 1) -> precdbg.RecordTable:
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=path)
    model = make_model()
    run_steps(dbg, model, make_optimizer(model), make_batch_list(steps), steps)
    assert dbg.failures == 0
    return precdbg.open_dump(path).records(step=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dumped_step_crosses_to_the_host_at_most_twice(tmp_path, monkeypatch, backend):
    reference = dump_step(str(tmp_path / "cpu"))
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", backend)
    transfers = count_transfers(monkeypatch)
    table = dump_step(str(tmp_path / backend))
    assert 1 <= transfers[0] <= 2
    assert len(table) == len(reference) > 100
    for col in ("entry", "role", "dtype"):
        assert list(table[col]) == list(reference[col])
    for col in ("min", "max", "nan_count", "inf_count"):
        np.testing.assert_array_equal(table[col], reference[col], err_msg=col)
    norm, ref_norm = table["norm"], reference["norm"]
    same = (norm == ref_norm) | (np.isnan(norm) & np.isnan(ref_norm))   # non-tensor values
    bad = np.nonzero(~(same | (np.abs(norm - ref_norm) <= 1e-10 * ref_norm)))[0]
    assert bad.size == 0, [(table["entry"][i], norm[i], ref_norm[i]) for i in bad[:5]]
    # mean: both sides sum in float64 (in other orders): 1e-10 * mean(|x|) <= 1e-10 * norm /
    # sqrt(n) (Cauchy-Schwarz)
    n = np.maximum(reference["numel"], 1)
    slack = 1e-10 * ref_norm / np.sqrt(n) + 1e-10 * np.abs(reference["mean"])
    finite = np.isfinite(reference["mean"]) & np.isfinite(ref_norm)
    assert np.all(np.abs(table["mean"][finite] - reference["mean"][finite]) <= slack[finite])


# ----------------------------------------------------------------------------- CUDA only
cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("dtype", FLOATS + OTHERS)
def test_cuda_fused_statistics_match_numpy(dtype):
    xs = [sample(n, dtype, seed=n).cuda() for n in (1, 1025, 3_000_001)]
    raw = STATS.resolve(STATS.summarize_many(xs))
    backend = "triton" if HAS_TRITON and dtype in FLOATS else "torch"
    for row, x in zip(raw, xs):
        check_raw(row, x, bound_for(backend, dtype) if dtype.is_floating_point else 1e-15)


@cuda
@pytest.mark.parametrize("dtype", FLOATS)
def test_cuda_compiled_kernel_launched_directly_matches_numpy(dtype):
    """After its first launch a compiled kernel is launched without Triton's binder: views at
    every alignment (a kernel specialised for 16-byte aligned pointers must never read an
    unaligned one) and several rounds, each against numpy."""
    from precdbg_pt import stats_kernel
    base = sample(40_003, dtype, seed=7).cuda()
    views = [base[k:] for k in range(5)] + [base[k:k + 1025] for k in range(3)]
    for _ in range(3):
        raw = STATS.resolve(STATS.summarize_many(views))
        for row, x in zip(raw, views):
            check_raw(row, x, bound_for("triton", dtype))
    if stats_kernel.triton_available():
        assert stats_kernel._direct_launch_supported() == bool(stats_kernel._COMPILED)


@cuda
@pytest.mark.parametrize("dtype", FLOATS)
def test_cuda_tensors_queued_one_per_launch_match_numpy(dtype):
    """Single-tensor launches through the compiled kernel (Triton's binder skipped after the
    first of each alignment): views at every offset, several rounds, each against numpy."""
    base = sample(40_003, dtype, seed=9).cuda()
    views = [base[k:] for k in range(5)] + [base[:40_000].reshape(200, 200).t(), base[1::3]]
    for _ in range(3):
        raw, tensors = _queued_one_by_one(views, "triton")
        for row, t in zip(raw, tensors):
            check_raw(row, t, bound_for("triton", t.dtype))


def _gpu_step(dbg: "PrecisionDebugger | None", model, opt, batch) -> List[str]:
    """One training step on the GPU; the synchronisations torch reports while it runs."""
    x, y = (t.cuda() for t in batch)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            if dbg is not None:
                dbg.start(model)
            from precdbg_examples.gpt_torch import train_step
            train_step(model, opt, x, y)
            if dbg is not None:
                dbg.stop()
                dbg.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message)]


@cuda
def test_cuda_dumped_step_syncs_and_peak_memory(tmp_path):
    from precdbg_examples.gpt_torch import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, d_model=512, n_head=8, seq_len=256, vocab_size=4096)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = (torch.randint(0, 4096, (8, 256)), torch.randint(0, 4096, (8, 256)))
    _gpu_step(None, model, opt, batch)                 # warm up: allocator, kernels, optimizer
    torch.cuda.reset_peak_memory_stats()
    plain_syncs = _gpu_step(None, model, opt, batch)
    plain_peak = torch.cuda.max_memory_allocated()
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path / "d"))
    _gpu_step(dbg, model, opt, batch)                  # compiles the kernels
    torch.cuda.reset_peak_memory_stats()
    device = dbg._session.adapter.tensors.device      # the debugger's device statistics
    before = device.host_transfers()
    dumped_syncs = _gpu_step(dbg, model, opt, batch)
    dumped_peak = torch.cuda.max_memory_allocated()
    assert dbg.close() and dbg.failures == 0
    assert device.host_transfers() - before <= 2
    assert len(dumped_syncs) - len(plain_syncs) <= 2, dumped_syncs
    assert dumped_peak <= 1.05 * plain_peak, (dumped_peak, plain_peak)


def count_transfers(monkeypatch) -> List[int]:
    """A spy on the real device-to-host transfer of result rows: how many crossed."""
    calls = [0]
    original = device_stats._to_host

    def to_host(parts):
        calls[0] += 1
        return original(parts)
    monkeypatch.setattr(device_stats, "_to_host", to_host)
    return calls


def count_flushes(monkeypatch) -> List[int]:
    """A spy on the real CaptureWindow.flush_batch: how many batches crossed to the writer."""
    from precdbg.capture.window import CaptureWindow
    calls = [0]
    original = CaptureWindow.flush_batch

    def flush_batch(self):
        calls[0] += 1
        return original(self)
    monkeypatch.setattr(CaptureWindow, "flush_batch", flush_batch)
    return calls


@pytest.mark.parametrize("backend", [None, "torch"])
def test_host_statistics_stream_and_device_statistics_wait_for_stop(tmp_path, monkeypatch,
                                                                      backend):
    """CPU statistics go to the writer in batches of BATCH_TENSORS; device ones (deferrable,
    holding nothing) cross once, at stop()."""
    from precdbg.capture import batch as batch_module
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(150)])
    dbg = PrecisionDebugger(task="statistics", level="module", dump_path=str(tmp_path / "d"))
    calls = count_flushes(monkeypatch)
    dbg.start(model)
    with torch.no_grad():
        model(torch.randn(4, 8))
    during = calls[0]
    dbg.stop()
    assert dbg.close() and dbg.failures == 0
    distinct = 150 + 1 + 300                      # activations, input, parameter inventory
    if backend is None:
        assert during >= distinct // batch_module.BATCH_TENSORS >= 1, during
    else:
        assert during == 0 and calls[0] == 1
    table = precdbg.open_dump(str(tmp_path / "d")).records(step=0)
    assert np.all(np.isfinite(table["norm"][table["dtype"] == "float32"]))


def test_host_copies_of_the_tensor_task_bound_a_batch_by_their_bytes(tmp_path, monkeypatch):
    """Device statistics wait for stop(), but host copies of full tensors do not pile up: a
    batch crosses once they hold BATCH_BYTES."""
    from precdbg.capture import batch as batch_module
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", "torch")
    model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(10)])
    x = torch.randn(2 << 20)                              # 8 MiB per activation
    dbg = PrecisionDebugger(task="tensor", level="module", dump_path=str(tmp_path / "d"))
    calls = count_flushes(monkeypatch)
    dbg.start(model)
    model(x)
    during = calls[0]
    dbg.stop()
    assert dbg.close() and dbg.failures == 0
    assert during >= 11 * x.numel() * 4 // batch_module.BATCH_BYTES >= 1, during


def test_torch_ops_in_pieces_match_numpy(monkeypatch):
    """The torch-ops backend bounds its temporaries: a tensor of several pieces (and a
    transposed one, read in memory order without a copy) gives the one-piece statistics."""
    monkeypatch.setattr(torch_stats, "_PIECE", 1000)
    for t in (sample(4567, torch.float32), sample(3001, torch.bfloat16),
              sample(60 * 70, torch.float16).reshape(60, 70).t(),
              torch.arange(-2500, 2500, dtype=torch.int32)):
        raw = STATS.resolve(STATS.summarize_with("torch", [t]))[0]
        check_raw(raw, t, 1e-12 if t.dtype in (torch.int32,) else KERNEL_BOUND)
