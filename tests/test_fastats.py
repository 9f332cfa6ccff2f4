"""The C statistics pass of host memory (precdbg.capture._fastats) against numpy float64, below and above
the size where it splits across two threads, with NaN/Inf, from concurrent Python threads and
in a forked child (whose worker thread must be started anew)."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

fastats = pytest.importorskip("precdbg.capture._fastats")

CODES = {np.float32: 0, np.float64: 1, np.float16: 2}
SIZES = [1, 1000, (1 << 20) - 1, 1 << 20, (1 << 20) + 12345, 3 << 20]   # splits from 1 << 20


def reference(a: np.ndarray):
    w = a.astype(np.float64)
    nan, inf = np.isnan(w), np.isinf(w)
    ordered = w[~nan]
    f = np.where(nan | inf, 0.0, w)
    return ordered.min(), ordered.max(), f.sum(), (f * f).sum(), int(nan.sum()), int(inf.sum())


def check(a: np.ndarray, code: int) -> None:
    mn, mx, total, sq, nan, inf = fastats.stats(a.ctypes.data, a.size, code)
    rmn, rmx, rtotal, rsq, rnan, rinf = reference(a)
    assert (mn, mx, nan, inf) == (rmn, rmx, rnan, rinf)
    scale = np.abs(np.where(np.isfinite(a), a, 0).astype(np.float64)).sum()
    assert abs(total - rtotal) <= 1e-12 * scale + 1e-300
    assert abs(sq - rsq) <= 1e-12 * rsq + 1e-300


def sample(n: int, dtype, specials: bool, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 3 + 1).astype(dtype)
    if specials and n > 10:
        a[rng.integers(0, n, 3)] = np.nan
        a[n - 1] = np.inf                        # in the second half, where the worker reads
        a[n // 3] = -np.inf
    return a


@pytest.fixture(params=["avx512", "avx2", "plain"])
def simd_pass(request):
    """Each float32 pass this CPU runs (the widest one is what precdbg uses), then back."""
    levels = {"plain": 0, "avx2": 1, "avx512": 2}
    best = fastats.simd(2)
    if levels[request.param] > levels[best]:
        pytest.skip(f"this CPU has no {request.param} pass (widest: {best})")
    assert fastats.simd(levels[request.param]) == request.param
    yield request.param
    fastats.simd(2)


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan-inf"])
def test_matches_numpy_float64(dtype, n, specials, simd_pass):
    check(sample(n, dtype, specials), CODES[dtype])


@pytest.mark.parametrize("n", [31, 32, 33, 1023, 1024, 1025, 4096 + 17])
def test_every_pass_gives_the_same_statistics(n):
    """The passes differ only in the order of their float64 sums: min, max and counts equal,
    sums within float64 rounding of each other."""
    a = sample(n, np.float32, False, seed=n)
    best = fastats.simd(2)
    try:
        rows = {}
        for level in range(3):
            name = fastats.simd(level)
            rows[name] = fastats.stats(a.ctypes.data, a.size, 0)
    finally:
        fastats.simd(2)
    assert fastats.simd() == best
    first = rows["plain"]
    for name, row in rows.items():
        assert row[:2] == first[:2] and row[4:] == first[4:], name
        np.testing.assert_allclose(row[2:4], first[2:4], rtol=1e-13, err_msg=name)


@pytest.mark.parametrize("values", [[1.5, -2.0, 3.0], [1.0, np.nan, np.inf, -4.0],
                                    [np.nan, np.nan], [np.inf, -np.inf], [0.0]],
                         ids=["finite", "mixed", "all-nan", "only-inf", "zero"])
def test_row_is_what_a_record_stores(values):
    """row(): mean over the finite values (NaN when there are none), norm of the finite values,
    min/max over the non-NaN ones, and the counts, as a record stores them."""
    a = np.array(values, dtype=np.float32)
    mn, mx, mean, norm, nan, inf = fastats.row(a.ctypes.data, a.size, 0)[:6]
    rmn, rmx, rtotal, rsq, rnan, rinf = reference(a) if not np.isnan(a).all() else (
        np.nan, np.nan, 0.0, 0.0, a.size, 0)
    finite = a.size - rnan - rinf
    np.testing.assert_equal((mn, mx, nan, inf), (rmn, rmx, rnan, rinf))
    np.testing.assert_allclose([mean, norm], [rtotal / finite if finite else np.nan,
                                              np.sqrt(rsq)], rtol=1e-15)
    with pytest.raises(ValueError):
        fastats.row(a.ctypes.data, a.size, 9)


@pytest.mark.parametrize("n", [15, 16, 17, 1024, 1040, 5000])
@pytest.mark.parametrize("special", ["one-nan", "plus-inf", "minus-inf", "both-inf", "all-nan",
                                     "float32-max"])
def test_one_special_value_anywhere(n, special):
    """The float32 pass sums every value as it is and finds NaN/Inf through the sum: one special
    value in the 16-wide part or in the tail, alone or cancelling (+Inf and -Inf), and the
    largest finite float32 values (whose squares still fit a float64) are all exact."""
    for where in (0, n // 2, n - 1):
        a = sample(n, np.float32, False, seed=where)
        if special == "one-nan":
            a[where] = np.nan
        elif special == "plus-inf":
            a[where] = np.inf
        elif special == "minus-inf":
            a[where] = -np.inf
        elif special == "both-inf":
            a[where], a[(where + 1) % n] = np.inf, -np.inf
        elif special == "all-nan":
            a[:] = np.nan
        else:
            a[where], a[(where + 7) % n] = np.finfo(np.float32).max, np.finfo(np.float32).min
        if special == "all-nan":
            mn, mx, total, sq, nan, inf = fastats.stats(a.ctypes.data, a.size, 0)
            assert np.isnan(mn) and np.isnan(mx) and (total, sq, nan, inf) == (0.0, 0.0, n, 0)
        else:
            check(a, 0)


def test_bfloat16_bits_above_the_split():
    a = sample((1 << 20) + 3, np.float32, True)
    bits = (a.view(np.uint32) >> 16).astype(np.uint16)          # truncated to bfloat16
    as_float = (bits.astype(np.uint32) << 16).view(np.float32)
    mn, mx, total, sq, nan, inf = fastats.stats(bits.ctypes.data, bits.size, 3)
    rmn, rmx, rtotal, rsq, rnan, rinf = reference(as_float)
    assert (mn, mx, nan, inf) == (rmn, rmx, rnan, rinf)
    assert total == pytest.approx(rtotal, rel=1e-12) and sq == pytest.approx(rsq, rel=1e-12)


def test_concurrent_callers_share_one_worker():
    """Threads that find the worker busy run alone; every answer is still right."""
    arrays = [sample(1 << 20, np.float32, i % 2 == 0, seed=i) for i in range(8)]
    errors = []

    def work(a):
        try:
            for _ in range(20):
                check(a, 0)
        except AssertionError as exc:      # reported by the main thread
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(a,)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_starts_its_own_worker():
    a = sample(1 << 20, np.float32, True)
    check(a, 0)                               # the parent's worker exists now
    pid = os.fork()
    if pid == 0:                              # child: must not wait for the parent's thread
        signal.alarm(30)                      # a hang ends the child, and the test fails
        try:
            check(a, 0)
            code = 0
        except BaseException:                 # noqa: BLE001
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    check(a, 0)


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """bfloat16 as its bits: the top half of each float32 (exact for values rounded to it)."""
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("n", [7, 8, 1023, 1024, 1025, 4096 + 3, 70000])
@pytest.mark.parametrize("pattern", ["masked", "only-plus-inf", "only-minus-inf", "infs-and-nans",
                                     "nans-and-one-value"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_exact_pass_of_non_finite_buffers(n, pattern, dtype):
    """Buffers holding NaN or Inf go through the exact pass: a causal attention mask (half the
    values -Inf), only infinities, infinities and NaNs without a finite value, NaNs and one
    value; min/max over every value but NaN, sums over the finite ones, exact counts."""
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 2).astype(np.float32)
    if pattern == "masked":
        a[rng.random(n) < 0.5] = -np.inf
    elif pattern == "only-plus-inf":
        a[:] = np.inf
    elif pattern == "only-minus-inf":
        a[:] = -np.inf
    elif pattern == "infs-and-nans":
        a[:] = np.where(rng.random(n) < 0.5, np.inf, np.nan)
        a[0] = -np.inf
    else:
        a[:] = np.nan
        a[n // 2] = -3.5
    if dtype == "float16":
        a = a.astype(np.float16)
        check(a, 2)
    elif dtype == "bfloat16":
        rounded = (_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
        bits = _bf16_bits(a)
        mn, mx, total, sq, nan, inf = fastats.stats(bits.ctypes.data, bits.size, 3)
        rmn, rmx, rtotal, rsq, rnan, rinf = reference(rounded)
        assert (mn, mx, nan, inf) == (rmn, rmx, rnan, rinf)
        assert abs(total - rtotal) <= 1e-12 * np.abs(np.nan_to_num(rounded, posinf=0,
                                                                    neginf=0)).sum() + 1e-300
    else:
        check(a, 0)


def position_weights(n: int) -> np.ndarray:
    """pos_mean's weights of n elements in row-major order: 1 + (2 s(i) + 1) / 2^32, s(i) the
    index times 0x9E3779B9 modulo 2^32 read as a signed 32-bit integer (_fastats.c)."""
    hashed = (np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B9)) & np.uint64(0xFFFFFFFF)
    signed = hashed.astype(np.uint32).view(np.int32).astype(np.float64)
    return 1.0 + (2.0 * signed + 1.0) / 2.0 ** 32


def _view_layout(v: np.ndarray):
    """A numpy view's canonical (size, step, logical step) triples in elements, innermost
    first, as precdbg_pt.statistics.element_layout makes them (sorted by step, dimensions that
    continue each other in memory and in row-major order merged, size-1 dimensions left
    out)."""
    item = v.itemsize
    logical, run = [], 1
    for size in reversed(v.shape):
        logical.append(run)
        run *= size
    logical.reverse()
    dims = sorted((st // item, lst, sz) for sz, st, lst in zip(v.shape, v.strides, logical)
                  if sz != 1)
    merged = []
    for step, lstep, size in dims:
        if merged and merged[-1][1] != 0 and step == merged[-1][1] * merged[-1][0] \
                and lstep == merged[-1][2] * merged[-1][0]:
            merged[-1][0] *= size
        else:
            merged.append([size, step, lstep])
    return tuple((size, step, lstep) for size, step, lstep in merged)


def _strided_views(dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((8, 64, 768)) * 3 + 1).astype(dtype)
    y = (rng.standard_normal((6, 10)) * 2).astype(dtype)
    y[2, 3], y[4, 1], y[0, 0] = np.nan, np.inf, -np.inf
    z = np.full((4, 8), np.nan, dtype=dtype)
    z[1, 3] = 2.0
    col = rng.standard_normal((5, 1)).astype(dtype)
    return {
        "split": x[:, :, 256:512],                                   # q, k, v of a qkv split
        "split-transposed": x[:, :, :256].reshape(8, 64, 4, 64).transpose(0, 2, 1, 3),
        "strided-slice": x[:, ::2, 5:300],
        "sliding-windows": np.lib.stride_tricks.sliding_window_view(x[0, 0], 4)[::2],
        "broadcast": np.broadcast_to(col, (5, 7)),
        "broadcast-middle": np.broadcast_to(y[:, None, 1:4], (6, 3, 3)),
        "nan-inf-slice": y[:, 1:5],
        "broadcast-inf": np.broadcast_to(y[4], (3, 10)),
        "nan-rows-and-one-value": z[:, 2:5],
        "only-nan": z[:, 4:6],
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("name", list(_strided_views(np.float32)))
def test_strided_view_without_a_copy(dtype, name):
    """row_layout(): a strided view summarised in place (contiguous rows, broadcast dimensions
    counted, not read) gives the statistics of the same elements copied out, as numpy float64
    computes them, NaN and Inf included."""
    v = _strided_views(dtype)[name]
    assert not v.flags["C_CONTIGUOUS"]
    got = fastats.row_layout(v.__array_interface__["data"][0], CODES[dtype], _view_layout(v))
    w = np.ascontiguousarray(v).astype(np.float64)
    nan, inf = np.isnan(w), np.isinf(w)
    finite = w[~nan & ~inf]
    ordered = w[~nan]
    want = (ordered.min() if ordered.size else np.nan, ordered.max() if ordered.size else np.nan,
            finite.mean() if finite.size else np.nan, np.sqrt((finite * finite).sum()),
            int(nan.sum()), int(inf.sum()))
    flat = w.reshape(-1)
    keep = np.isfinite(flat)
    pos = (flat[keep] * position_weights(flat.size)[keep]).sum() / keep.sum() \
        if keep.any() else np.nan
    want = want + (pos,)
    assert got[4:6] == want[4:6]
    for a, b in zip(got[:4] + got[6:], want[:4] + want[6:]):
        assert (np.isnan(a) and np.isnan(b)) or a == b or abs(a - b) <= 1e-12 * max(1.0, abs(b)), \
            (got, want)


def test_a_layout_without_contiguous_rows_is_left_to_the_caller():
    a = np.zeros(12, dtype=np.float32)
    assert fastats.row_layout(a.ctypes.data, 0, ((3, 4), (2, 2))) is None
    with pytest.raises(TypeError):
        fastats.row_layout(a.ctypes.data, 0, ((3,),))
