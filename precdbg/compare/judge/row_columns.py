"""The rows of a judged step made from its columns at once (issue 50): each column of the pair
table and of the two record tables is indexed by the pairs and turned into Python values in
one call (`tolist`), instead of a dict of every column per record and `numpy.generic.item` per
value.

`row_columns(t)` holds every row's values column by column (a list per JSON key of a row, in
`ROW_KEYS` order, and the element-wise metrics): what the JSON file is written from without a
`Row` per pair (report/json_out.encode_row_columns). `pair_rows(t, which)` makes `Row`s of the
pairs that need one (the evidence of those that differ). `pair_rows(t)` gives exactly
`[entries.pair_row(t, p) for p in range(len(t))]`, with the producers of what each reads
(tests/core/test_core_compare_columns.py holds them equal on synthetic dumps).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np

from ...records.schema import NO_PRODUCER
from .pairs import PairTable
from .rows import ROW_KEYS, Row, finite_or_none

__all__ = ["RowColumns", "row_columns", "pair_rows", "finite_list", "status_column"]

_BIG = 1e308


def finite_list(values: Any) -> List[Optional[float]]:
    """`[finite_or_none(v) for v in values]` for a numeric array: NaN -> None, +-Inf -> +-1e308."""
    clipped = np.clip(np.asarray(values, dtype=np.float64), -_BIG, _BIG).tolist()
    return [None if v != v else v for v in clipped]


def _shapes(t: Any, idx: np.ndarray) -> List[List[int]]:
    dims, ndim = t["shape"][idx].tolist(), t["ndim"][idx].tolist()
    return [row[:n] for row, n in zip(dims, ndim)]


def status_column(t: PairTable) -> np.ndarray:
    """PairTable.status of every pair, as its value."""
    return np.select([t.diverged, t.precision_explained, t.integer_plumbing, t.convention],
                     ["diverged", "precision", "integer", "convention"], "match")


def producer_names(table: Any, idx: np.ndarray) -> List[str]:
    """Per record `idx` of a record table, the entry of the record of the same table that
    produced the tensor it reads ("" where none was captured, or none is in the table)."""
    if not len(idx) or "producer" not in table:
        return [""] * len(idx)
    seq = table["seq"]
    order = np.argsort(seq, kind="stable")
    ordered = seq[order]
    wanted = table["producer"][idx]
    # the last record of a seq, as a dict of seq -> row keeps it
    at = np.searchsorted(ordered, wanted, side="right") - 1
    found = (wanted != NO_PRODUCER) & (at >= 0)
    found[found] = ordered[at[found]] == wanted[found]
    names = np.full(len(idx), "", dtype=object)
    names[found] = table["entry"][order[at[found]]].astype(str).astype(object)
    return names.tolist()


@dataclasses.dataclass
class RowColumns:
    """Rows held column by column: `values[k]` the values of key ROW_KEYS[k], in pair order,
    and `tensors` each row's element-wise metrics (None: not compared element-wise)."""
    values: List[List[Any]]
    tensors: List[Optional[Dict[str, Optional[float]]]]

    def __len__(self) -> int:
        return len(self.tensors)

    def rows(self) -> List[Row]:
        return [Row(*v) for v in zip(*self.values, self.tensors)]

    def dicts(self) -> List[Dict[str, Any]]:
        """Each row's JSON dict (Row.as_json)."""
        out = [dict(zip(ROW_KEYS, v)) for v in zip(*self.values)]
        for d, tm in zip(out, self.tensors):
            if tm is not None:
                d.update(tm)
        return out


def row_columns(t: PairTable, which: Optional[np.ndarray] = None) -> RowColumns:
    """The rows of the pairs `which` (pair indices, ascending; None: every pair) of a judged
    pair table, column by column."""
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

    def col(table: Any, idx: np.ndarray, name: str) -> List[Any]:
        return table[name][idx].tolist()

    sums = (col(a, ia, "checksum"), col(b, ib, "checksum"))
    checksum_equal = pick(t.checksum_equal).tolist()
    floor, floor_decided = pick(t.floor).tolist(), pick(t.floor_decided).tolist()
    share = pick(t.update_share)
    judged_share = np.isfinite(share).tolist()
    stats = {f"{s}_{side}": finite_list(table[s][idx])
             for s in ("min", "max", "mean", "norm")
             for side, table, idx in (("a", a, ia), ("b", b, ib))}
    column: Dict[str, List[Any]] = {
        "step": col(a, ia, "step"), "rank": col(a, ia, "rank"),
        "name_a": col(a, ia, "entry"), "name_b": col(b, ib, "entry"),
        "kind": col(a, ia, "kind"), "direction": col(a, ia, "direction"),
        "module": col(a, ia, "module"), "op": col(a, ia, "op"), "role": col(a, ia, "role"),
        "arg_index": col(a, ia, "arg_index"),
        "dtype_a": col(a, ia, "dtype"), "dtype_b": col(b, ib, "dtype"),
        "shape_a": _shapes(a, ia), "shape_b": _shapes(b, ib),
        "order": col(a, ia, "order"), "seq": col(a, ia, "seq"),
        "status": pick(status_column(t)).tolist(),
        "judged_by": [str(j) for j in pick(t.judged_by).tolist()],
        **stats,
        "pos_mean_a": finite_list(a["pos_mean"][ia]) if "pos_mean" in a else [None] * n,
        "pos_mean_b": finite_list(b["pos_mean"][ib]) if "pos_mean" in b else [None] * n,
        "nan_a": col(a, ia, "nan_count"), "nan_b": col(b, ib, "nan_count"),
        "inf_a": col(a, ia, "inf_count"), "inf_b": col(b, ib, "inf_count"),
        # None: a side has no checksum, nothing was compared
        "checksum_equal": [q if x and y else None
                           for q, x, y in zip(checksum_equal, sums[0], sums[1])],
        "producer_a": producer_names(a, ia), "producer_b": producer_names(b, ib),
        "module_b": col(b, ib, "module"), "phase": col(a, ia, "phase"),
        "floor": [float(f) if d else None for f, d in zip(floor, floor_decided)],
        "update_share": [s if j else None for s, j in zip(finite_list(share), judged_share)],
        "dw_agreed": [None if d < 0 else bool(d) for d in pick(t.dw_agreed).tolist()],
    }
    for k in ("d_min", "d_max", "d_mean", "d_norm", "d_pos_mean", "err", "tol"):
        column[k] = finite_list(pick(getattr(t, k)))
    metrics = [None if tm is None else {k: finite_or_none(v) for k, v in tm.items()}
               for tm in tensors]
    return RowColumns([column[k] for k in ROW_KEYS], metrics)


def pair_rows(t: PairTable, which: Optional[np.ndarray] = None) -> List[Row]:
    """The rows of the pairs `which` (pair indices, ascending; None: every pair) of a judged
    pair table, in pair order."""
    return row_columns(t, which).rows()
