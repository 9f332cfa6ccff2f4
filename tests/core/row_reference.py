"""Row-by-row references for the compare's column paths (issue 50): what the facts of a
(step, rank)'s rows and its entries were when they were made one `Row` at a time. The tests
hold `pair_rows`, `RowFacts.of(table)` and `StepCompare.add_pairs` equal to these."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from precdbg.compare.judge.entries import Entry
import numpy as np

from precdbg.compare.judge.pairs import PairTable
from precdbg.compare.judge.row_columns import RowColumns
from precdbg.compare.judge.rows import ROW_KEYS, ArgDiff, Evidence, Row, finite_or_none
from precdbg.compare.report.row_store import RowFacts
from precdbg.records.schema import NO_PRODUCER, READ_ROLES, RecordKind, Role, is_scalar_dtype


def facts_of_rows(rows: List[Row]) -> RowFacts:
    """The facts of `rows`, row by row."""
    f = RowFacts(count=len(rows))
    kinds = set()
    for row in rows:
        kinds.add(str(row.kind))
        if row.status == "diverged":
            f.diverged += 1
        elif row.status == "precision":
            if not f.explained:
                f.explained_first = row.name_a
            f.explained += 1
        elif row.status == "integer":
            if not f.plumbing:
                f.plumbing_first = (row.name_a, row.role, row.arg_index)
            f.plumbing += 1
        if row.tensor is not None or row.checksum_equal:
            f.measured = True
        if row.pos_mean_a is not None:
            f.pos_a = True
        if row.pos_mean_b is not None:
            f.pos_b = True
        if row.floor is not None:
            where = (row.name_a, row.role, row.arg_index)
            if not f.floored:
                f.floored_first = where
            if f.floored_grad_input is None and row.role == Role.GRAD_INPUT:
                f.floored_grad_input = where
            f.floored += 1
    f.kinds = tuple(sorted(kinds))
    return f


def entries_row_by_row(ta: Any, tb: Any, rows: List[Row], pairs: List[Tuple[int, int]]
                       ) -> Tuple[Dict[Tuple[str, str], Entry], List[Tuple[Evidence, int, int]]]:
    """The entries of a step's rows (every pair's, in pair order), and its differing reads."""
    entries: Dict[Tuple[str, str], Entry] = {}
    reads: List[Tuple[Evidence, int, int]] = []
    for row, (i, j) in zip(rows, pairs):
        key = (row.direction, row.name_a)
        e = entries.get(key)
        if e is None:
            e = entries[key] = Entry(row.step, row.rank, row.direction, row.kind, row.name_a,
                                     row.name_b, row.module, row.op, row.order, row.seq)
        e.seq = min(e.seq, row.seq)
        if row.diverged:
            e.first_bad = min(e.first_bad, row.seq)
        if row.kind == RecordKind.PARAM and bool(ta["trainable"][i]) != bool(tb["trainable"][j]):
            e.trainable_differs = True
        is_read = row.role in READ_ROLES
        if is_scalar_dtype(row.dtype_b):
            if row.diverged:
                e.args_bad.append(ArgDiff(row.role, row.arg_index, str(ta["arg_key"][i]),
                                          str(ta["text"][i]), str(tb["text"][j])))
            continue
        if row.diverged:
            ev = Evidence.of(row)
            (e.inputs_bad if is_read else e.outputs_bad).append(ev)
            if is_read or row.kind == RecordKind.PARAM_GRAD:
                reads.append((ev, i, j))
        elif is_read:
            e.inputs_ok += 1
            e.reads_agreeing.append((row.role, row.arg_index, row.checksum_equal,
                                     row.tensor is None))
            if row.err is not None and row.err > e.inputs_ok_err:
                e.inputs_ok_err = row.err
        else:
            e.outputs_ok += 1
    return entries, reads


def entry_fields(e: Entry) -> Tuple:
    """What an entry holds, comparable (Entry compares by identity)."""
    return (e.step, e.rank, e.direction, e.kind, e.name_a, e.name_b, e.module, e.op, e.order,
            e.seq, e.first_bad, e.inputs_bad, e.outputs_bad, e.args_bad, e.inputs_ok,
            e.outputs_ok, e.inputs_ok_err, e.reads_agreeing, e.trainable_differs)


def pair_row(t: PairTable, p: int) -> Row:
    """The row of pair `p` of a judged pair table, record by record, with the producers of
    what it reads (the entry of the record of its own run whose seq is its producer)."""
    ra, rb = t.a.row(int(t.ia[p])), t.b.row(int(t.ib[p]))
    row = Row(ra["step"], ra["rank"], ra["entry"], rb["entry"], ra["kind"], ra["direction"],
              ra["module"], ra["op"], ra["role"], ra["arg_index"], ra["dtype"], rb["dtype"],
              list(ra["shape"]), list(rb["shape"]), ra["order"], ra["seq"],
              t.status(p).value)
    row.judged_by = str(t.judged_by[p])
    row.module_b = rb["module"]
    row.phase = ra["phase"]
    for stat in ("min", "max", "mean", "norm"):
        setattr(row, f"{stat}_a", finite_or_none(ra[stat]))
        setattr(row, f"{stat}_b", finite_or_none(rb[stat]))
    for key in ("d_min", "d_max", "d_mean", "d_norm", "d_pos_mean", "err", "tol"):
        setattr(row, key, finite_or_none(getattr(t, key)[p]))
    row.pos_mean_a = finite_or_none(ra.get("pos_mean", np.nan))
    row.pos_mean_b = finite_or_none(rb.get("pos_mean", np.nan))
    row.nan_a, row.nan_b = ra["nan_count"], rb["nan_count"]
    row.inf_a, row.inf_b = ra["inf_count"], rb["inf_count"]
    if ra["checksum"] and rb["checksum"]:      # None: a side has none, nothing was compared
        row.checksum_equal = bool(t.checksum_equal[p])
    if t.floor_decided[p]:
        row.floor = float(t.floor[p])
    tm = t.tensors[p]
    if tm is not None:
        row.tensor = {k: finite_or_none(v) for k, v in tm.items()}
    if np.isfinite(t.update_share[p]):
        row.update_share = finite_or_none(t.update_share[p])
    if t.dw_agreed[p] >= 0:
        row.dw_agreed = bool(t.dw_agreed[p])
    for attr, table, i in (("producer_a", t.a, int(t.ia[p])), ("producer_b", t.b, int(t.ib[p]))):
        rows_of_seq = dict(zip(table["seq"].tolist(), range(len(table))))
        k = rows_of_seq.get(int(table["producer"][i])) \
            if int(table["producer"][i]) != NO_PRODUCER else None
        if k is not None:
            setattr(row, attr, str(table["entry"][k]))
    return row


def columns_of_rows(rows: List[Row]) -> RowColumns:
    """Rows held column by column, as row_columns holds them."""
    return RowColumns([[getattr(r, k) for r in rows] for k in ROW_KEYS], [r.tensor for r in rows])
