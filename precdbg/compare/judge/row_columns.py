"""The rows of a judged step made from its columns at once (issue 50): each column of the pair
table and of the two record tables is indexed by the pairs and turned into Python values in
one call (`tolist`), instead of a dict of every column per record and `numpy.generic.item` per
value. `pair_rows(t)` gives exactly `[entries.pair_row(t, p) for p in range(len(t))]`
(tests/core/test_core_compare_columns.py holds them equal on synthetic dumps).
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from .pairs import PairTable
from .rows import Row, finite_or_none

__all__ = ["pair_rows", "finite_list", "status_column"]

_BIG = 1e308


def finite_list(values: Any) -> List[Optional[float]]:
    """`[finite_or_none(v) for v in values]` for a numeric array: NaN -> None, +-Inf -> +-1e308."""
    clipped = np.clip(np.asarray(values, dtype=np.float64), -_BIG, _BIG).tolist()
    return [None if v != v else v for v in clipped]


def _shapes(t: Any, idx: np.ndarray) -> List[List[int]]:
    dims, ndim = t["shape"][idx].tolist(), t["ndim"][idx].tolist()
    return [[int(d) for d in row[:n]] for row, n in zip(dims, ndim)]


def status_column(t: PairTable) -> np.ndarray:
    """PairTable.status of every pair, as its value."""
    return np.select([t.diverged, t.precision_explained, t.integer_plumbing, t.convention],
                     ["diverged", "precision", "integer", "convention"], "match")


def pair_rows(t: PairTable, which: Optional[np.ndarray] = None) -> List[Row]:
    """The rows of the pairs `which` (pair indices, ascending; None: every pair) of a judged
    pair table, in pair order."""
    a, b = t.a, t.b
    if which is None:
        ia, ib, tensors = t.ia, t.ib, t.tensors

        def pick(values: np.ndarray) -> np.ndarray:
            return values
    else:
        ia, ib = t.ia[which], t.ib[which]
        tensors = [t.tensors[p] for p in which.tolist()]

        def pick(values: np.ndarray) -> np.ndarray:
            return values[which]
    n = len(ia)
    if n == 0:
        return []

    def col(table: Any, idx: np.ndarray, name: str) -> List[Any]:
        return table[name][idx].tolist()

    step, rank = col(a, ia, "step"), col(a, ia, "rank")
    name_a, name_b = col(a, ia, "entry"), col(b, ib, "entry")
    kind, direction = col(a, ia, "kind"), col(a, ia, "direction")
    module, module_b, op = col(a, ia, "module"), col(b, ib, "module"), col(a, ia, "op")
    role, arg_index = col(a, ia, "role"), col(a, ia, "arg_index")
    dtype_a, dtype_b = col(a, ia, "dtype"), col(b, ib, "dtype")
    shape_a, shape_b = _shapes(a, ia), _shapes(b, ib)
    order, seq, phase = col(a, ia, "order"), col(a, ia, "seq"), col(a, ia, "phase")
    status = pick(status_column(t)).tolist()
    judged_by = [str(j) for j in pick(t.judged_by).tolist()]
    stats = {f"{s}_{side}": finite_list(table[s][idx])
             for s in ("min", "max", "mean", "norm")
             for side, table, idx in (("a", a, ia), ("b", b, ib))}
    deltas = {k: finite_list(pick(getattr(t, k))) for k in
              ("d_min", "d_max", "d_mean", "d_norm", "d_pos_mean", "err", "tol")}
    pos_a = finite_list(a["pos_mean"][ia]) if "pos_mean" in a else [None] * n
    pos_b = finite_list(b["pos_mean"][ib]) if "pos_mean" in b else [None] * n
    nan_a, nan_b = col(a, ia, "nan_count"), col(b, ib, "nan_count")
    inf_a, inf_b = col(a, ia, "inf_count"), col(b, ib, "inf_count")
    sums = (col(a, ia, "checksum"), col(b, ib, "checksum"))
    checksum_equal = pick(t.checksum_equal).tolist()
    floor, floor_decided = pick(t.floor).tolist(), pick(t.floor_decided).tolist()
    share = pick(t.update_share)
    shares = finite_list(share)
    judged_share = np.isfinite(share).tolist()
    dw_agreed = pick(t.dw_agreed).tolist()
    rows: List[Row] = []
    for p in range(n):
        row = Row(step[p], rank[p], name_a[p], name_b[p], kind[p], direction[p], module[p],
                  op[p], role[p], arg_index[p], dtype_a[p], dtype_b[p], shape_a[p],
                  shape_b[p], order[p], seq[p], status[p])
        row.judged_by = judged_by[p]
        row.module_b = module_b[p]
        row.phase = phase[p]
        row.min_a, row.min_b = stats["min_a"][p], stats["min_b"][p]
        row.max_a, row.max_b = stats["max_a"][p], stats["max_b"][p]
        row.mean_a, row.mean_b = stats["mean_a"][p], stats["mean_b"][p]
        row.norm_a, row.norm_b = stats["norm_a"][p], stats["norm_b"][p]
        row.d_min, row.d_max = deltas["d_min"][p], deltas["d_max"][p]
        row.d_mean, row.d_norm = deltas["d_mean"][p], deltas["d_norm"][p]
        row.d_pos_mean = deltas["d_pos_mean"][p]
        row.err, row.tol = deltas["err"][p], deltas["tol"][p]
        row.pos_mean_a, row.pos_mean_b = pos_a[p], pos_b[p]
        row.nan_a, row.nan_b = nan_a[p], nan_b[p]
        row.inf_a, row.inf_b = inf_a[p], inf_b[p]
        if sums[0][p] and sums[1][p]:      # None: a side has none, nothing was compared
            row.checksum_equal = checksum_equal[p]
        if floor_decided[p]:
            row.floor = float(floor[p])
        tm = tensors[p]
        if tm is not None:
            row.tensor = {k: finite_or_none(v) for k, v in tm.items()}
        if judged_share[p]:
            row.update_share = shares[p]
        if dw_agreed[p] >= 0:
            row.dw_agreed = bool(dw_agreed[p])
        rows.append(row)
    return rows
