"""One rank's share of a compare (issue 50): its steps aligned, judged and turned into what the
localizer needs, one (step, rank) pair of files at a time.

`compare_rank(task)` is the unit of work of every way a compare runs: in the main process
(`--jobs 1`), in worker processes (parallel.py) and on a distributed engine's workers
(engine.py). Its steps run in ascending order (a step k >= 1 is judged against the same rank's
step k-1: multistep.NoisePolicy keeps one state per rank), and it returns per step a
`StepFound`: the rows as one row_store.RowChunk (JSON text, compressed, when the caller
spools them), the records without counterpart, structural differences, where a run stopped,
and the entries. The entries of a (step, rank) where nothing differs are cut to its
parameters (all the localizer and the notes read of a rank that agrees), so what a compare
keeps across ranks is small. A (step, rank) whose files cannot be read is named
(`StepUnread`) and the rank's other steps are still compared. Where the task says so, the
rank's share of the check (check.run_check.check_rank) and the optimizer settings of its steps
are taken here too, while its files are open: each step file is read once by a compare.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..check import RankChecked, check_rank, step_optimizer_findings
from ..errors import DumpError
from ..records.schema import Direction, RecordKind, Role
from ..storage.common_records import common_records
from ..storage.reader import Dump, RecordTable, open_dump
from ..storage.step_reader import StepFile
from .align.alignment import align, rename_module
from .judge.entries import Entry, StepCompare
from .judge.judges import judge_pairs
from .judge.metrics import tensor_metrics
from .judge.multistep import NoisePolicy
from .judge.pairs import PairTable, StepContext
from .judge.row_columns import pair_rows, row_columns
from .judge.rows import Note, NoteCode
from .judge.structure import StructuralDiff, structural_differences
from .judge.unfinished import UnfinishedStep, unfinished_step
from .report.notes import file_why, unobserved_modules
from .report.row_store import RowChunk, RowFacts, make_chunk

__all__ = ["RankTask", "StepFound", "StepUnread", "RankFound", "compare_rank", "compare_step"]

_PARAM = RecordKind.PARAM
# (step, rank, pairs done, pairs of the step, phase): a compare's progress inside one step
StepProgress = Optional[Callable[[int, int, int, int, str], None]]


@dataclasses.dataclass
class RankTask:
    """One rank's share of a compare: the steps to compare, and those before `--step S` whose
    parameters the first of them is judged against. `spool`: the rows as compressed JSON text
    (row_store); `keep_rows` False: their facts only."""
    baseline: str
    candidate: str
    rank: int
    steps: List[int]
    previous: List[int]
    same: bool
    shim_pair: bool
    mapping: Any
    alike: bool
    unknown: List[str]
    conventions: List[str]
    spool: bool = False
    keep_rows: bool = True
    # the check's steps (baseline, candidate) where this rank is one of `SetupCheck.others`:
    # checked here, where its files are read, once
    check: Optional[Tuple[int, int]] = None


@dataclasses.dataclass
class StepFound:
    """What comparing one (step, rank) gave. `one_run`: the records without counterpart that
    are not a paired call's missing record (a call only one run made)."""
    step: int
    rank: int
    rows: RowChunk
    unmatched: List[Dict[str, Any]]
    one_run: List[Dict[str, Any]]
    structural: List[StructuralDiff]
    unfinished: List[UnfinishedStep]
    entries: List[Entry]
    params_agree: Optional[bool] = None
    # per side, report.notes.file_why of each of its files (read while they are open)
    whys: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    # per side, step_status of each of its step files (known to the main process so, which
    # did not open them where a worker compared them)
    statuses: Dict[str, List[Dict[str, Any]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepUnread:
    """A (step, rank) whose files could not be read: the side whose file failed ("" when the
    error does not name one of them) and the reader's one line."""
    step: int
    rank: int
    side: str
    error: str


@dataclasses.dataclass
class RankFound:
    rank: int
    steps: List[StepFound]
    before: Dict[Tuple[int, int], bool]
    unread: List[Tuple[Tuple[int, int], Note]]      # steps before --step S that failed
    noise: NoisePolicy
    unreadable: List[StepUnread] = dataclasses.field(default_factory=list)
    checked: Optional[RankChecked] = None        # the task's `check`
    # (step, rank) -> the check's optimizer findings of the settings that step used, for the
    # steps compared and those before them whose files both hold them (step_optimizer_findings)
    optimizers: Dict[Tuple[int, int], List[Dict[str, Any]]] = \
        dataclasses.field(default_factory=dict)


def _interrupted(dump: Dump, step: int, rank: int) -> bool:
    """Whether the process ended while this step was being captured (no stop() ran)."""
    return any(f.attrs.get("interrupted") for f in dump.files(step, rank))


def _setting_differences(a: Dump, b: Dump, step: int, rank: int, mapping: Any) -> List[Any]:
    """Modules whose recorded numeric settings (eps, approximate, momentum, ...) differ."""
    from ..records.layers import dump_setting_differences
    modules = (mapping or {}).get("modules") or {}
    paths = {p: rename_module(p, modules) for p in b.module_settings(step, rank)} \
        if modules else None
    return dump_setting_differences(a, b, step, rank, paths)


def compare_step(a: Dump, b: Dump, step: int, rank: int, same: bool, mapping: Any,
                 noise: NoisePolicy, shim_pair: bool = False, spool: bool = False,
                 progress: StepProgress = None, keep_rows: bool = True,
                 tables: Optional[Tuple[RecordTable, RecordTable]] = None) -> StepFound:
    """Align, judge and sort into entries one (step, rank) of both dumps (`tables`: their
    records, read already)."""
    def report(done: int, total: int, phase: str) -> None:
        if progress is not None:
            progress(step, rank, done, total, phase)
    # a precdbg dump against msprobe's: the records both tools write, compared on what both measure
    ra, rb = tables if tables is not None else (a.records(step, rank), b.records(step, rank))
    ta, tb, _ = common_records(a, ra, b, rb, step, rank)
    report(0, 0, "aligning")
    al = align(ta, tb, same, mapping)
    interrupted = (_interrupted(a, step, rank), _interrupted(b, step, rank))
    modules = (mapping or {}).get("modules")
    unfinished: List[UnfinishedStep] = []
    stop = unfinished_step(ta, tb, al.pairs_a, al.pairs_b, al.only_a, al.only_b, step, rank,
                           interrupted, (lambda p: rename_module(p, modules)) if modules else None)
    if stop is not None:
        unfinished.append(stop)
        # the run that stopped is compared as far as it got
        interrupted = (interrupted[0] or stop.side == "baseline",
                       interrupted[1] or stop.side == "candidate")
    structural = structural_differences(ta, tb, step, rank, same, mapping,
                                        _setting_differences(a, b, step, rank, mapping),
                                        unobserved_modules(a) + unobserved_modules(b),
                                        interrupted)
    table = PairTable(ta, tb, al.pairs_a, al.pairs_b)
    total = len(al.pairs_a)
    report(0, total, "comparing")
    stored = (ta["data_offset"][al.pairs_a] >= 0) & (tb["data_offset"][al.pairs_b] >= 0)
    shown = 0
    for p in np.nonzero(stored)[0].tolist():       # element-wise metrics where both stored
        table.tensors[p] = tensor_metrics(a.tensor_at(ta, int(al.pairs_a[p])),
                                          b.tensor_at(tb, int(al.pairs_b[p])))
        if p - shown >= 200:
            shown = p
            report(p, total, "comparing")
    judge_pairs(table, StepContext(step, rank, noise, shim_pair))
    # rows only for what is reported: every pair's when a file will hold them, else only the
    # pairs that differ (the entries' evidence); the rest is counted from the columns
    sc = StepCompare(ta, tb, al)
    sc.add_pairs(table, pair_rows(table, np.nonzero(table.diverged)[0]))
    step_rows = row_columns(table) if keep_rows else None
    facts = RowFacts.of(table)
    noise.remember(step, rank, table)
    unmatched: List[Dict[str, Any]] = []
    for side, records, idx in (("a", ta, al.only_a), ("b", tb, al.only_b)):
        unmatched += _unmatched(side, step, rank, records, idx)
        params = idx[(records["kind"][idx] == _PARAM) & (records["role"][idx] == Role.PARAM)]
        for r in records.rows_of(params):
            sc.one_run_param(side, r, step, rank)
    sc.resolve_reads()
    one_run: List[Dict[str, Any]] = []
    if unmatched:
        paired = {("a", name) for name in ta["entry"][al.pairs_a].tolist()} | \
            {("b", name) for name in tb["entry"][al.pairs_b].tolist()}
        one_run = [u for u in unmatched if (u["side"], u["name"]) not in paired]
    sides = (("baseline", a), ("candidate", b))
    whys = {side: [file_why(sf) for sf in d.files(step, rank)] for side, d in sides}
    statuses = {side: _statuses(d, step, rank) for side, d in sides}
    return StepFound(step, rank, make_chunk(step, rank, facts, step_rows, spool, keep_rows),
                     unmatched, one_run, structural, unfinished, list(sc.entries.values()),
                     whys=whys, statuses=statuses)


def _statuses(dump: Dump, step: int, rank: int) -> List[Dict[str, Any]]:
    """step_status of each step file of (step, rank), [] where one cannot say."""
    try:
        return [sf.status() for sf in dump.files(step, rank) if isinstance(sf, StepFile)]
    except DumpError:
        return []


def _unmatched(side: str, step: int, rank: int, records: RecordTable, idx: np.ndarray
               ) -> List[Dict[str, Any]]:
    """The records `idx` of one side without counterpart, as the compare lists them (each
    column read once for all of them, in the order of `idx`)."""
    if not len(idx):
        return []
    names, kinds, modules, ops, roles, args = (records[c][idx].tolist() for c in (
        "entry", "kind", "module", "op", "role", "arg_index"))
    return [{"side": side, "step": step, "rank": rank, "name": name, "kind": kind,
             "module": module, "op": op, "role": role, "arg_index": arg}
            for name, kind, module, op, role, arg in zip(names, kinds, modules, ops, roles,
                                                         args)]


def params_agree(entries: List[Entry], apart: Optional[bool] = None) -> Optional[bool]:
    """Whether every parameter of a compared (step, rank) agrees at its start (None: it has
    none): what report.notes.weights_agree_after reads of a step after the verdict's.
    `apart` False: no entry differs (the caller knows), so each parameter agrees."""
    if apart is False:
        return True if any(e.kind == _PARAM and e.direction == Direction.NONE
                           for e in entries) else None
    params = [e for e in entries if e.kind == _PARAM and e.direction == Direction.NONE]
    if not params:
        return None
    return not any(e.diverged or e.trainable_differs for e in params)


def kept_entries(found: StepFound, apart: Optional[bool] = None) -> List[Entry]:
    """The entries the localizer needs of a compared (step, rank): all of them where anything
    differs (an entry, a structure, a run that stopped); none where nothing does (the rank
    still counts as compared: StepEntries.compared; its parameters' agreement is
    `params_agree`). `apart`: whether an entry differs, where the caller knows."""
    if apart is None:
        apart = _entries_apart(found.entries)
    if found.structural or found.unfinished or apart:
        return found.entries
    return []


def _entries_apart(entries: List[Entry]) -> bool:
    """Whether any entry differs (its records, or which parameter is trainable)."""
    return any(e.diverged or e.trainable_differs for e in entries)


_LABELS = ("baseline", "candidate")


def _step_optimizers(a: Dump, b: Dump, step: int, rank: int,
                     out: Dict[Tuple[int, int], List[Dict[str, Any]]]) -> None:
    """The optimizer findings of the settings (step, rank) used, into `out` where both dumps'
    files hold them (a step that cannot be read: what compares it says why)."""
    try:
        found = step_optimizer_findings(a, b, step, rank, _LABELS)
    except DumpError:
        return
    if found is not None:
        out[(step, rank)] = found


def _both_records(a: Dump, b: Dump, steps: Tuple[int, int], rank: int
                  ) -> Optional[Tuple[RecordTable, RecordTable]]:
    """Both sides' records of the check's steps, or None where a file cannot be read (what
    reads it next says why)."""
    if steps[0] != steps[1]:
        return None
    try:
        return a.records(steps[0], rank), b.records(steps[1], rank)
    except DumpError:
        return None


def _side_of(exc: DumpError, a: Dump, b: Dump, step: int, rank: int) -> str:
    text = str(exc)
    for side, dump in (("baseline", a), ("candidate", b)):
        if any(getattr(f, "path", None) and str(f.path) in text for f in dump.files(step, rank)):
            return side
    return ""


def compare_rank(task: RankTask, dumps: Optional[Tuple[Dump, Dump]] = None,
                 progress: StepProgress = None) -> RankFound:
    """Every step of one rank, as compare_dumps compares them; `dumps`: both dumps already
    open (the main process), else opened here (a worker) and closed after."""
    noise = NoisePolicy(alike=task.alike, unknown=task.unknown, conventions=task.conventions)
    a, b = dumps if dumps is not None else (open_dump(task.baseline), None)
    try:
        if b is None:
            b = open_dump(task.candidate)
        r = task.rank
        before: Dict[Tuple[int, int], bool] = {}
        unread: List[Tuple[Tuple[int, int], Note]] = []
        optimizers: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
        checked, tables = None, None
        if task.check is not None:      # the records read once, for the check and the compare
            tables = _both_records(a, b, task.check, r)
            checked = check_rank(a, b, task.check[0], task.check[1], r, _LABELS, tables)
        for s in task.previous:
            _step_optimizers(a, b, s, r, optimizers)
            try:
                found = compare_step(a, b, s, r, task.same, task.mapping, noise,
                                     task.shim_pair)
            except DumpError as exc:
                unread.append(((s, r), Note(NoteCode.PREVIOUS_STEP_UNREAD,
                                            facts={"step": s, "rank": r, "error": str(exc)})))
                continue
            finally:
                a.release(s, r)
                b.release(s, r)
            noise.settle(r, found.entries)
            before[(s, r)] = not any(e.diverged or e.trainable_differs for e in found.entries)
        steps: List[StepFound] = []
        unreadable: List[StepUnread] = []
        for s in task.steps:
            if checked is not None and checked.step_optimizers is not None and \
                    task.check == (s, s):     # found by the check of this step already
                optimizers[(s, r)] = checked.step_optimizers
            else:
                _step_optimizers(a, b, s, r, optimizers)
            try:
                out = compare_step(a, b, s, r, task.same, task.mapping, noise, task.shim_pair,
                                   task.spool, progress, task.keep_rows,
                                   tables if task.check == (s, s) else None)
            except DumpError as exc:     # named; the rank's other steps are still compared
                unreadable.append(StepUnread(s, r, _side_of(exc, a, b, s, r), str(exc)))
                continue
            finally:                     # one (step, rank) pair of files open at a time
                if task.check == (s, s):
                    tables = None
                a.release(s, r, forget=True)
                b.release(s, r, forget=True)
            apart = _entries_apart(out.entries)
            noise.settle_apart(r, apart)
            out.params_agree = params_agree(out.entries, apart)
            out.entries = kept_entries(out, apart)
            steps.append(out)
        return RankFound(r, steps, before, unread, noise, unreadable, checked,
                         dict(sorted(optimizers.items())))
    finally:
        if dumps is None:
            a.close()
            if b is not None:
                b.close()
