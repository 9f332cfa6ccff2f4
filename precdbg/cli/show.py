"""`precdbg show DUMP ENTRY`: one record's statistics, who produced its inputs, where it was
called, its module's layer settings and, when stored, its tensors."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Optional, TextIO, Tuple

import numpy as np

from ..errors import DumpError, PrecdbgError
from ..records.schema import NO_PRODUCER, is_scalar_dtype
from ..storage.reader import Dump, RecordTable
from .words import closest, user_words

__all__ = ["show_main", "asked_step_rank"]

HEAD = 8                    # values of a stored tensor shown


def asked_step_rank(dump: Dump, path: str, step: Optional[int], rank: Optional[int]) -> None:
    """A DumpError when `--step`/`--rank` names one the dump does not hold."""
    for flag, asked, present in (("step", step, dump.steps), ("rank", rank, dump.ranks)):
        if asked is not None and asked not in present:
            raise DumpError(f"{path}: no {flag} {asked} ({flag}s {present})")


def _find(dump: Dump, entry: str, step: Optional[int], rank: Optional[int]
          ) -> Tuple[RecordTable, np.ndarray, List[str]]:
    """The table of the first step and rank (of those asked) holding `entry`, the rows of its
    records, and every entry name seen (for the closest names when none holds it)."""
    seen: List[str] = []
    for s in dump.steps if step is None else [step]:
        for r in dump.ranks if rank is None else [rank]:
            if not dump.files(s, r):
                continue
            table = dump.records(s, r)
            rows = np.nonzero(table["entry"] == entry)[0]
            if len(rows):
                return table, rows, seen
            seen.extend(set(table["entry"].tolist()))
    return RecordTable({}), np.zeros(0, dtype=np.int64), seen


def _num(value: float) -> str:
    return f"{value:.6g}"


def _producer(table: RecordTable, i: int) -> str:
    seq = int(table["producer"][i])
    if seq == NO_PRODUCER:
        return "-"
    hits = np.nonzero(table["seq"] == seq)[0]
    if not len(hits):
        return f"seq {seq}"
    j = int(hits[0])
    return f"{table['entry'][j]} {table['role'][j]} {table['arg_index'][j]}"


def _tensor_lines(table: RecordTable, rows: np.ndarray, out: TextIO) -> None:
    out.write("tensors:\n")
    out.write(f"  {'role':<12}{'arg':>4}  {'dtype':<10}{'shape':<16}{'min':>12}{'max':>12}"
              f"{'mean':>12}{'norm':>12}{'nan':>6}{'inf':>6}  produced by\n")
    for i in rows:
        dtype = str(table["dtype"][i])
        head = f"  {table['role'][i]:<12}{table['arg_index'][i]:>4}  {dtype:<10}"
        if is_scalar_dtype(dtype):           # a non-tensor argument: its value
            out.write(f"{head}value {table['text'][i]!s}"
                      + (f" ({table['arg_key'][i]})" if table["arg_key"][i] else "") + "\n")
            continue
        shape = str(list(table.row(int(i))["shape"]))
        out.write(f"{head}{shape:<16}" + "".join(
            f"{_num(float(table[c][i])):>12}" for c in ("min", "max", "mean", "norm"))
            + f"{int(table['nan_count'][i]):>6}{int(table['inf_count'][i]):>6}"
            f"  {_producer(table, int(i))}\n")


def _call_site(dump: Dump, table: RecordTable, i: int) -> List[str]:
    stack = int(table["stack_id"][i])
    texts = dump.stacks(int(table["step"][i]), int(table["rank"][i]), int(table["part"][i]))
    if not 0 <= stack < len(texts) or not texts[stack]:
        return []
    return texts[stack].splitlines()


def _settings(dump: Dump, step: int, rank: int, module: str) -> Optional[str]:
    settings: Dict[str, Tuple[str, Dict[str, Any]]] = dump.module_settings(step, rank)
    if module not in settings:
        return None
    cls, values = settings[module]
    shown = "  ".join(f"{k} {v}" for k, v in sorted(values.items())) or "(none recorded)"
    return f"module '{module}' ({cls}): {shown}"


def _stored(dump: Dump, table: RecordTable, rows: np.ndarray, out: TextIO) -> None:
    stored = [int(i) for i in rows if table["data_offset"][i] >= 0]
    if not stored:
        return
    out.write("stored tensors:\n")
    for i in stored:
        try:
            values = dump.tensor_at(table, i)
        except PrecdbgError as exc:
            out.write(f"  {table['role'][i]} {table['arg_index'][i]}: unreadable: "
                      f"{user_words(str(exc))}\n")
            continue
        flat = np.asarray(values).ravel()[:HEAD]
        if "float" in str(values.dtype):       # bfloat16 and float8 too: shown as numbers
            head = ", ".join(_num(float(v)) for v in flat.astype(np.float64))
        else:
            head = ", ".join(str(v) for v in flat.tolist())
        more = ", ..." if values.size > HEAD else ""
        out.write(f"  {table['role'][i]} {table['arg_index'][i]}  {table['dtype'][i]} "
                  f"{list(values.shape)}  head [{head}{more}]\n")


def show_main(args: argparse.Namespace) -> int:
    from ..storage.reader import open_dump
    dump = open_dump(args.dump)
    try:
        asked_step_rank(dump, args.dump, args.step, args.rank)
        table, rows, seen = _find(dump, args.entry, args.step, args.rank)
        if not len(rows):
            near = closest(args.entry, seen, n=3, cutoff=0.4)
            where = "".join(f" {k} {v}" for k, v in (("step", args.step), ("rank", args.rank))
                            if v is not None)
            raise DumpError(f"{args.dump}: no entry {args.entry!r}{where or ''}"
                            + (f"; closest: {', '.join(near)}" if near else ""))
        _write(dump, table, rows, sys.stdout)
    finally:
        dump.close()
    return 0


def _write(dump: Dump, table: RecordTable, rows: np.ndarray, out: TextIO) -> None:
    i = int(rows[0])
    step, rank = int(table["step"][i]), int(table["rank"][i])
    module = str(table["module"][i])
    out.write(f"entry     {table['entry'][i]}\n")
    out.write(f"step {step} rank {rank}  kind {table['kind'][i]}  direction "
              f"{table['direction'][i]}  phase {table['phase'][i]}\n")
    out.write(f"api       {table['prefix'][i]}.{table['api'][i]}  op {table['op'][i] or '-'}  "
              f"module '{module}'  call {table['call_index'][i]}  order {table['order'][i]}\n")
    _tensor_lines(table, rows, out)
    site = _call_site(dump, table, i)
    out.write("call site:" + ("\n" + "\n".join(f"  {line}" for line in site) if site
                              else " (not recorded)") + "\n")
    # a module record's own settings; an API call's, those of the module it ran in
    settings = _settings(dump, step, rank, module)
    out.write(f"layer settings: {settings or 'none recorded'}\n")
    _stored(dump, table, rows, out)
