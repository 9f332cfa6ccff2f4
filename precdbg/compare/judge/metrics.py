"""How far apart two aligned records are, vectorised over all pairs.

Statistics task: relative differences of min, max, mean, norm and pos_mean (the order-sensitive
mean weighted by position: compared like the mean, and only where both records have it, so
files written before it compare as they did), each against the tensor's scale (its RMS, so a
mean near zero does not explode), plus NaN/Inf counts and shapes. Tensor task
(both sides hold data): cosine, max absolute and relative error, RMSE, share of elements beyond
0.1 % and 0.5 % relative error. Checksums: equal bytes are a match whatever the statistics say.

Tolerances depend on the precision a record's values carry (the `precision` column: the
coarsest float dtype along the computation that produced them, so the float32 output of a
LayerNorm of a residual stream that went through bf16 autocast linears is judged as bf16), or its
dtype in files without the column. Below float32 they are msprobe's published relative
thresholds (2^-10 float16, 2^-8 bfloat16: about the unit roundoff) and the unit roundoff of
float8 (2^-4 e4m3, 2^-3 e5m2),
and for float32/float64 calibrated so that a rerun, another CPU thread count or another
framework's kernel for the same math stay below them (measured: <= 2e-6 relative for float32 on
the bundled GPT, PyTorch vs MindSpore; <= 8.5e-7 for 1 vs 2 threads, bf16 autocast or not;
benchmarks/calibrate_tolerance.py) while a change of 1e-4 relative in one op's output is above.
Below float32, min and max are single elements that may each round another way in another
kernel: they are held against four times the tolerance (two units in the last place). Measured,
PyTorch vs MindSpore on CPU with the bundled GPT in float16 (tests/test_twins.py): min/max
differ by up to 2.3e-3 relative (a LayerNorm weight gradient; GELU's max 1.9e-3), mean and norm
by up to 3.6e-4; the worst record stands at 0.59 of the float16 tolerance.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ...records.precision import MANTISSA_BITS, is_floating
from ...storage.reader import RecordTable
from .entries import scalar_records, string_hashes
from .pairs import PairTable
from ...records.schema import DTYPE_VALUE, RecordKind, is_scalar_dtype

__all__ = ["TOLERANCE", "STATISTICS", "CHECKSUM", "INTEGER_PLUMBING", "stat_errors",
           "integer_plumbing", "worst_error", "tensor_metrics", "tolerance_of"]

STATISTICS, CHECKSUM, INTEGER_PLUMBING = "statistics", "checksum", "integer_plumbing"   # judges

TOLERANCE: Dict[str, float] = {
    "float64": 1e-9, "float32": 2e-5, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -8,
    "float8_e4m3fn": 2.0 ** -4, "float8_e4m3fnuz": 2.0 ** -4, "float8_e5m2": 2.0 ** -3,
    "float8_e5m2fnuz": 2.0 ** -3,
}
_EXTREMES_FACTOR = 4.0      # min and max, below float32: two units in the last place
_DEFAULT_TOL = 0.0          # integers, bools: exact
# Parameters at the start of a step are loaded or updated, not computed by different kernels:
# they match to float32 rounding, so one changed element already counts.
PARAM_TOLERANCE = 1e-6
_TINY = 1e-30


def tolerance_of(dtype: str) -> float:
    return TOLERANCE.get(dtype, 2e-5 if dtype.startswith("complex") else _DEFAULT_TOL)


def per_value(values: List[Any], fn: Callable[[Any], Any]) -> List[Any]:
    """`[fn(v) for v in values]`, `fn` called once per distinct value (a column of dtypes
    holds a handful)."""
    found = {v: fn(v) for v in set(values)}
    return list(map(found.__getitem__, values))


def _bits(precision: str) -> int:
    return MANTISSA_BITS.get(precision, 99)


def _carried(t: RecordTable) -> np.ndarray:
    """Per record, the precision its values carry (its dtype where the file has no precision
    column or the record none)."""
    dtype = t["dtype"]
    if "precision" not in t:
        return dtype
    prec = t["precision"]
    return np.where(prec == "", dtype, prec)


def distinct(column: np.ndarray) -> Tuple[np.ndarray, List[Any]]:
    """(per item, the index of its value in the list; the distinct values of `column`, as
    Python values): a run of equal items counts once, the runs of a column of str are told
    apart by a hash of their code points, and each checked equal to its value's first run
    (where one is not, the values are read one by one)."""
    if column.ndim == 1 and column.dtype.kind == "U" and len(column):
        new = np.ones(len(column), dtype=bool)
        new[1:] = column[1:] != column[:-1]
        heads = column[new]
        hashes = string_hashes(heads)
        if hashes is not None:
            _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1)
            again = np.flatnonzero(first[inverse] != np.arange(len(heads)))
            same = first[inverse[again]]
            if all(np.array_equal(heads[again[at:at + _CHUNK]], heads[same[at:at + _CHUNK]])
                   for at in range(0, len(again), _CHUNK)):
                return inverse[np.cumsum(new) - 1], heads[first].tolist()
    found: Dict[Any, int] = {}
    codes = [found.setdefault(v, len(found)) for v in column.tolist()]
    return np.asarray(codes, dtype=np.int64).reshape(-1), list(found)


_CHUNK = 2048       # items of str compared at once


def _as_codes(values: List[Any], fn: Callable[[Any], Any], dtype: Any) -> np.ndarray:
    """`fn` of each of `values` (distinct()'s), as an array to index by distinct()'s codes."""
    return np.array([fn(v) for v in values], dtype=dtype).reshape(-1)


def _dtype_arguments_explained(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray,
                               text_ok: np.ndarray) -> np.ndarray:
    """Pairs of a dtype argument naming two float dtypes (`torch.tensor(x, dtype=q.dtype)`
    under autocast in one run only) after the point where the runs' values already carry other
    precisions: a consequence of that precision difference (which `check` names), not a
    divergence of its own. The first such argument, before any value carries another
    precision, stays a divergence: it is where the precisions part (a cast to float16 in one
    run only)."""
    dtype_arg = (a["dtype"] == DTYPE_VALUE)[ia] & (b["dtype"] == DTYPE_VALUE)[ib] & ~text_ok
    if not dtype_arg.any():
        return dtype_arg
    args = np.flatnonzero(dtype_arg)          # whether both texts name floats: of these only
    floats = np.zeros(len(ia), dtype=bool)
    floats[args] = [is_floating(x) and is_floating(y) for x, y in
                    zip(a["text"][ia[args]].tolist(), b["text"][ib[args]].tolist())]
    apart = (_carried(a)[ia] != _carried(b)[ib]) & ~scalar_records(b)[ib]
    if not apart.any():
        return np.zeros_like(dtype_arg)
    seq = b["seq"][ib]
    return dtype_arg & floats & (seq > seq[apart].min())


def _rel(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.abs(a - b) / np.maximum(scale, _TINY)
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    diff = np.where(both_nan | same_inf, 0.0, diff)
    return np.where(np.isnan(diff), np.inf, diff)


def pos_mean_errors(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray,
                    scale: np.ndarray) -> np.ndarray:
    """pos_mean's relative differences, as the mean's: 0 where either side lacks it (NaN: a
    file written before the column, a sparse tensor's, a tensor without finite values, whose
    counts are compared instead)."""
    if "pos_mean" not in a or "pos_mean" not in b:
        return np.zeros(len(ia), dtype=np.float64)
    pa, pb = a["pos_mean"][ia], b["pos_mean"][ib]
    return np.where(np.isnan(pa) | np.isnan(pb), 0.0, _rel(pa, pb, scale))


def has_pos_mean(t: RecordTable) -> bool:
    """Whether a dump's records carry pos_mean (written by a version that computes it): any
    record of a tensor with finite values has a number there."""
    if "pos_mean" not in t or not len(t):
        return False
    return bool(np.any(~np.isnan(t["pos_mean"]) & (t["numel"] > 1)))


def stat_errors(t: PairTable) -> None:
    """Judge `statistics`: per pair, the relative differences of the statistics, the worst of
    them, the tolerance of the precision the values carry, and whether it diverges (this
    module's docstring: the measurements behind the tolerances). Equal checksums are a match
    whatever the statistics say, and where neither record has statistics but both a checksum
    (msprobe's summary_mode xor) the checksums decide alone; a dtype argument explained by precisions already apart is
    status 'precision'."""
    a, b, ia, ib = t.a, t.b, t.ia, t.ib
    min_a, min_b, max_a, max_b = a["min"][ia], b["min"][ib], a["max"][ia], b["max"][ib]
    norm_a, norm_b = a["norm"][ia], b["norm"][ib]
    numel_b = np.maximum(b["numel"][ib], 1).astype(np.float64)
    numel_a = np.maximum(a["numel"][ia], 1).astype(np.float64)
    rms_a = np.abs(norm_a) / np.sqrt(numel_a)
    rms_b = np.abs(norm_b) / np.sqrt(numel_b)
    scale = np.nan_to_num(np.fmax(rms_a, rms_b), nan=0.0, posinf=0.0)
    t.d_min = _rel(min_a, min_b, np.fmax(np.abs(np.nan_to_num(min_b)), scale))
    t.d_max = _rel(max_a, max_b, np.fmax(np.abs(np.nan_to_num(max_b)), scale))
    t.d_mean = _rel(a["mean"][ia], b["mean"][ib], scale)
    t.d_pos_mean = pos_mean_errors(a, b, ia, ib, scale)
    # relative to the larger norm: an all-zero side (a gradient that never arrived) is a 100 %
    # difference, not one over the 1e-30 floor
    t.d_norm = _rel(norm_a, norm_b, np.fmax(np.abs(np.nan_to_num(norm_a)),
                                            np.abs(np.nan_to_num(norm_b))))
    # the coarser of the two records' carried precisions, and its tolerance: per distinct
    # precision of each table (a handful), not per pair
    code_a, values_a = distinct(_carried(a))
    code_b, values_b = distinct(_carried(b))
    code_a, code_b = code_a[ia], code_b[ib]
    a_coarser = _as_codes(values_a, _bits, np.int64)[code_a] < \
        _as_codes(values_b, _bits, np.int64)[code_b]
    coarse_of = lambda p: _bits(p) < MANTISSA_BITS["float32"]  # noqa: E731
    coarse = np.where(a_coarser, _as_codes(values_a, coarse_of, bool)[code_a],
                      _as_codes(values_b, coarse_of, bool)[code_b])
    t.extremes = np.where(coarse, _EXTREMES_FACTOR, 1.0)
    # err is in units of the tolerance of mean and norm: min and max count at 1/extremes
    err = worst_error(t)
    tol = np.where(a_coarser, _as_codes(values_a, tolerance_of, np.float64)[code_a],
                   _as_codes(values_b, tolerance_of, np.float64)[code_b])
    t.tol = np.where((b["kind"] == RecordKind.PARAM)[ib], np.minimum(tol, PARAM_TOLERANCE),
                     tol)
    t.shape_ok = _equal_rows(a["shape"], b["shape"], ia, ib) & (a["ndim"][ia] == b["ndim"][ib])
    t.counts_ok = (a["nan_count"][ia] == b["nan_count"][ib]) & (
        a["inf_count"][ia] == b["inf_count"][ib])
    scalar = scalar_records(b)[ib]
    text_ok = _equal_text(a["text"], b["text"], ia, ib)
    has_a, has_b = (a["checksum"] != "")[ia], (b["checksum"] != "")[ib]
    t.checksum_equal = has_a & _equal_text(a["checksum"], b["checksum"], ia, ib)
    t.precision_explained = _dtype_arguments_explained(a, b, ia, ib, text_ok)
    text_ok = text_ok | t.precision_explained
    # checksums without statistics on either side (msprobe's summary_mode xor): the checksums
    # decide both ways, as bit-for-bit equality or not (err 0 or inf)
    no_stats = np.isnan(min_a) & np.isnan(min_b) & np.isnan(max_a) & np.isnan(max_b)
    checksum_only = ~scalar & no_stats & has_a & has_b
    err = np.where(checksum_only, np.where(t.checksum_equal, 0.0, np.inf), err)
    t.err = np.where(scalar, np.where(text_ok, 0.0, np.inf), err)
    t.diverged = np.where(scalar, ~text_ok, t.differs()) & ~t.checksum_equal
    judged_by = np.empty(len(ia), dtype=object)
    judged_by.fill(STATISTICS)
    judged_by[t.checksum_equal | checksum_only] = CHECKSUM
    t.judged_by = judged_by


def _equal_rows(x: np.ndarray, y: np.ndarray, ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
    """`np.all(x[ix] == y[iy], axis=1)` of two 2-D columns of as many columns, a column at a
    time, and none where each table holds one value throughout it (a shape's padding)."""
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or not len(ix):
        return np.all(x[ix] == y[iy], axis=1)
    equal = np.ones(len(ix), dtype=bool)
    for j in range(x.shape[1]):
        cx, cy = x[:, j], y[:, j]
        if len(cx) and len(cy) and (cx == cx[0]).all() and (cy == cy[0]).all():
            if not cx[0] == cy[0]:
                equal[:] = False
            continue
        equal &= cx[ix] == cy[iy]
    return equal


def _equal_text(x: np.ndarray, y: np.ndarray, ix: np.ndarray, iy: np.ndarray) -> np.ndarray:
    """`x[ix] == y[iy]` of two columns, for str columns compared only where neither is ""
    (the text of a tensor's record, a missing checksum): "" equals only ""."""
    if x.dtype.kind != "U" or y.dtype.kind != "U":
        return x[ix] == y[iy]
    empty_x, empty_y = (x == "")[ix], (y == "")[iy]
    equal = empty_x & empty_y
    some = np.flatnonzero(~empty_x & ~empty_y)
    if len(some):
        equal[some] = x[ix[some]] == y[iy[some]]
    return equal


def worst_error(t: PairTable, q: Any = slice(None)) -> np.ndarray:
    """The worst relative difference of the pairs `q`, in units of the tolerance of mean and
    norm (min and max count at 1/extremes)."""
    return np.max(np.stack([t.d_min[q] / t.extremes[q], t.d_max[q] / t.extremes[q],
                            t.d_mean[q], t.d_norm[q], t.d_pos_mean[q]]), axis=0)


def integer_plumbing(t: PairTable) -> None:
    """Judge `integer_plumbing`: pairs of integer or boolean tensors (positions, masks,
    indices) that differ in a step and rank where no other pair does: the runs reach the same
    floating-point numbers through integer plumbing computed another way (transformers builds
    its masks and positions one way with a KV cache and another without, and gradient
    checkpointing turns the cache off), and the pairing of such calls is by order, not by
    meaning. They are no divergence there (status 'integer'). Where an integer difference
    matters (other token ids, other positions), the floating-point records that read it
    differ too, and all stay divergences."""
    diverged = t.diverged
    bad = np.flatnonzero(diverged)      # only the pairs that differ are asked their dtypes
    if not len(bad):
        return
    dtype_a, dtype_b = t.a["dtype"][t.ia[bad]], t.b["dtype"][t.ib[bad]]
    integer = np.array(per_value(dtype_a.tolist(), _is_integer), dtype=bool) & \
        np.array(per_value(dtype_b.tolist(), _is_integer), dtype=bool)
    if not integer.all():               # a float differs too
        return
    plumbing = np.array(diverged, dtype=bool)      # every pair that differs: integer
    t.integer_plumbing = plumbing
    t.decide(plumbing, False, INTEGER_PLUMBING)


SHIM_CONVENTIONS = "shim_conventions"


def shim_conventions(t: PairTable) -> None:
    """Judge `shim_conventions`, for a torch shim's dump against PyTorch's only (the same
    PyTorch code on MindSpore: mindnlp's mindtorch): the non-tensor arguments of a call and
    its integer or boolean tensors are the shim's own conventions, no divergence (status
    'convention'). Measured on Hugging Face GPT-2 and Llama (transformers 4.57.6, mindnlp
    0.5.1): PyTorch hands a Python function's defaults to the capture by keyword
    (`F.softmax(x, dim, _stacklevel=3, dtype=None)`) where the shim sees what the caller
    passed, so arguments pair by position with other arguments; the shim's `finfo(float32).min`
    is -3.40282e+38, not -3.4028234663852886e+38; and the shim builds its attention masks and
    positions with code of its own (positions (1, 8) where PyTorch compares 0-d indices under
    vmap). What such a convention changes shows in the floating-point records that read it,
    which stay judged as they are."""
    dtype_a, dtype_b = t.a["dtype"][t.ia], t.b["dtype"][t.ib]
    integer_b = np.array(per_value(dtype_b.tolist(), _is_integer), dtype=bool)
    convention = np.array(per_value(dtype_b.tolist(), is_scalar_dtype), dtype=bool) | (
        np.array(per_value(dtype_a.tolist(), _is_integer), dtype=bool) & integer_b)
    covered = convention & t.diverged
    if covered.any():
        t.convention = covered
        t.decide(covered, False, SHIM_CONVENTIONS)


def _is_integer(dtype: str) -> bool:
    """An integer or boolean tensor's dtype (not a float, complex, or non-tensor argument)."""
    return bool(dtype) and not (is_floating(dtype) or is_scalar_dtype(dtype)
                                or dtype.startswith("complex"))


def _real_elements(x: np.ndarray) -> np.ndarray:
    """The elements as float64, a complex element as its real and imaginary parts."""
    x = np.asarray(x)
    if np.iscomplexobj(x):
        x = np.stack([x.real, x.imag], axis=-1)
    return x.astype(np.float64).ravel()


def tensor_metrics(x: np.ndarray, y: np.ndarray) -> Optional[Dict[str, Any]]:
    """Element-wise comparison of two stored tensors (baseline y); None if shapes differ."""
    if x.shape != y.shape:
        return None
    a, b = _real_elements(x), _real_elements(y)
    finite = np.isfinite(a) & np.isfinite(b)
    a, b = a[finite], b[finite]
    if a.size == 0:
        return {"cosine": 1.0, "max_abs": 0.0, "max_rel": 0.0, "rmse": 0.0, "rel_rmse": 0.0,
                "beyond_0.1%": 0.0, "beyond_0.5%": 0.0}
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), _TINY)
    rms_b = float(np.sqrt(np.mean(b * b)))
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cosine = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
    rmse = float(np.sqrt(np.mean(diff * diff)))
    return {"cosine": cosine, "max_abs": float(diff.max()), "max_rel": float(rel.max()),
            "rmse": rmse, "rel_rmse": rmse / rms_b if rms_b > 0 else float(rmse > 0),
            "beyond_0.1%": float(np.mean(rel > 1e-3)), "beyond_0.5%": float(np.mean(rel > 5e-3))}
