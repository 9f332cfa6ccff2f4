"""The compare pipeline: align two dumps' records, judge each pair, name the first divergence.

`compare_dumps(baseline, candidate)` returns the JSON-ready result of the compare contract:
`{"verdict", "first_divergence", "consequences", "unmatched", "notes", "rows", "setup"}`,
where "setup" lists the set-up differences `precdbg check` finds (run first, precdbg/check/).
`first_divergence["chain"]` is the producer chain the verdict was found through
(localize/locate.py): from the first differing entry seen in execution order to the culprit,
each link with `name_a`, `name_b`, `step`, `rank`, `text`. Each row (`judge.rows.Row`) names
the entries that produced the tensor it reads (`producer_a`, `producer_b`; "" when nothing
captured did). At steps k >= 1 a `judge.multistep.NoisePolicy` judges parameters by how much
the runs' last updates differ (`update_share`, `dw_agreed` on their rows) and the step's other
records above a floor from the parameters' difference, when `check` finds the optimizers
configured alike.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import DumpError
from ..storage.common_records import LIMITS, MINDSPORE_API_CALLS, common_records
from ..storage.reader import Dump, open_dump
from ..records.naming import vocabulary
from ..records.schema import RecordKind, Role, Task
from .align.alignment import align, load_mapping, rename_module
from .localize.callsite import place_first
from .judge.entries import Entry, StepCompare, StepEntries
from .judge.row_columns import pair_rows
from .engine import run_on_engine
from .parallel import RankFound, RankTask, compare_ranks, worth_parallel
from .localize.locate import contains, locate
from .localize.verdict import CONTRACT_VERSION, Verdict
from .judge.calls_underneath import causal_one_run_calls, split_underneath
from .judge.structure import StructuralDiff, structural_differences
from .judge.unfinished import UnfinishedStep, unfinished_step
from .judge.judges import judge_pairs
from .judge.metrics import tensor_metrics
from .judge.pairs import PairTable, StepContext
from .judge.multistep import NoisePolicy, optimizer_setup, other_setup
from .report.notes import (incomplete_parts, level_note, note_extra_calls, note_loss_scale,
                           other_causes, uncompared, unobserved_modules, unobserved_note,
                           unused_mapping, weights_agree_after)
from .report.progress import CompareProgress
from .report.wording import write_words
from .judge.rows import Note, NoteCode, Row

__all__ = ["compare_dumps", "load_mapping", "CompareProgress"]

Progress = Optional[Callable[[CompareProgress], None]]

_MAX_CONSEQUENCES = 20
_PARAM = RecordKind.PARAM
_STEP_KINDS = ("optimizer", "optimizer_groups")     # findings of the settings a step used


def _framework(dump: Dump) -> str:
    return dump.setting("framework")


def _interrupted(dump: Dump, step: int, rank: int) -> bool:
    """Whether the process ended while this step was being captured (no stop() ran)."""
    return any(f.attrs.get("interrupted") for f in dump.files(step, rank))


def _compare_step(a: Dump, b: Dump, step: int, rank: int, same: bool, mapping: Any,
                  rows: List[Row], unmatched: List[Dict[str, Any]],
                  progress: Progress, files: Tuple[int, int], noise: NoisePolicy,
                  structural: List[StructuralDiff],
                  unfinished: Optional[List[UnfinishedStep]] = None,
                  shim_pair: bool = False) -> List[Entry]:
    def report(done: int, total: int, phase: str) -> None:
        if progress is not None:
            progress(CompareProgress(files[0], files[1], step, rank, done, total, phase))
    # a precdbg dump against msprobe's: the records both tools write, compared on what both measure
    ta, tb, _ = common_records(a, a.records(step, rank), b, b.records(step, rank), step, rank)
    report(0, 0, "aligning")
    al = align(ta, tb, same, mapping)
    interrupted = (_interrupted(a, step, rank), _interrupted(b, step, rank))
    modules = (mapping or {}).get("modules")
    stop = unfinished_step(ta, tb, al.pairs_a, al.pairs_b, al.only_a, al.only_b, step, rank,
                           interrupted, (lambda p: rename_module(p, modules)) if modules else None)
    if stop is not None:
        if unfinished is not None:
            unfinished.append(stop)
        # the run that stopped is compared as far as it got
        interrupted = (interrupted[0] or stop.side == "baseline",
                       interrupted[1] or stop.side == "candidate")
    structural.extend(structural_differences(ta, tb, step, rank, same, mapping,
                                             _setting_differences(a, b, step, rank, mapping),
                                             unobserved_modules(a) + unobserved_modules(b),
                                             interrupted))
    table = PairTable(ta, tb, al.pairs_a, al.pairs_b)
    stored = (ta["data_offset"][al.pairs_a] >= 0) & (tb["data_offset"][al.pairs_b] >= 0)
    total = len(al.pairs_a)
    pairs = list(zip(al.pairs_a.tolist(), al.pairs_b.tolist()))
    for p, (i, j) in enumerate(pairs):
        if stored[p]:
            table.tensors[p] = tensor_metrics(a.tensor_at(ta, i), b.tensor_at(tb, j))
        if p % 200 == 0:
            report(p, total, "comparing")
    judge_pairs(table, StepContext(step, rank, noise, shim_pair))
    sc = StepCompare(ta, tb, al)
    step_rows = pair_rows(table)      # the rows made from the columns at once
    for row, (i, j) in zip(step_rows, pairs):
        sc.add(row, i, j)
    noise.remember(step, rank, table)
    for side, records, idx in (("a", ta, al.only_a), ("b", tb, al.only_b)):
        for i in idx.tolist():
            r = records.row(i)
            unmatched.append({"side": side, "step": step, "rank": rank, "name": r["entry"],
                              "kind": r["kind"], "module": r["module"], "op": r["op"],
                              "role": r["role"], "arg_index": r["arg_index"]})
            if r["kind"] == _PARAM and r["role"] == Role.PARAM:
                sc.one_run_param(side, r, step, rank)
    sc.producer_names(step_rows)
    sc.resolve_reads()
    rows.extend(step_rows)
    return list(sc.entries.values())


def _setting_differences(a: Dump, b: Dump, step: int, rank: int, mapping: Any
                         ) -> List[Any]:
    """Modules whose recorded numeric settings (eps, approximate, momentum, ...) differ."""
    from ..records.layers import dump_setting_differences
    modules = (mapping or {}).get("modules") or {}
    paths = {p: rename_module(p, modules) for p in b.module_settings(step, rank)} \
        if modules else None
    return dump_setting_differences(a, b, step, rank, paths)


def _pairs_of(a: Dump, b: Dump, step: Optional[int], rank: Optional[int]
              ) -> List[Tuple[int, int]]:
    """The (step, rank) pairs both dumps hold (of those asked). Two dumps of one step and rank
    each, different ones (two named files: rank 0 against rank 1), are compared with each
    other, under the baseline's step and rank."""
    only_a, only_b = [(s, r) for s in a.steps for r in a.ranks if a.files(s, r)], \
        [(s, r) for s in b.steps for r in b.ranks if b.files(s, r)]
    if len(only_a) == len(only_b) == 1 and only_a != only_b and step is None and rank is None:
        b.relabel(*only_a[0])
        return only_a
    common = [(s, r) for s in a.steps for r in a.ranks
              if a.files(s, r) and b.files(s, r)
              and (step is None or s == step) and (rank is None or r == rank)]
    if not common:
        asked = " ".join(f"{what} {value}" for what, value in (("step", step), ("rank", rank))
                         if value is not None)
        raise DumpError(f"no step/rank present in both dumps (baseline steps {a.steps} ranks "
                        f"{a.ranks}; candidate steps {b.steps} ranks {b.ranks}"
                        + (f"; asked {asked}" if asked else "") + ")")
    return common


def _refuse_overflow_dumps(a: Dump, b: Dump, baseline: str, candidate: str) -> None:
    """A dump of task `overflow` keeps only the records whose values are not finite: which of
    them one run has and the other lacks is what `precdbg scan` reports of each run, not a
    comparison of numbers."""
    for dump, path in ((a, baseline), (b, candidate)):
        if dump.setting("task") == Task.OVERFLOW:
            raise DumpError(f"{path}: a dump of task 'overflow' holds only non-finite records, "
                            f"nothing to align with the other run; run `precdbg scan {path}` "
                            "for its first non-finite value, or dump task 'statistics'")


def compare_dumps(baseline: str, candidate: str, step: Optional[int] = None,
                  rank: Optional[int] = None, mapping_file: Optional[str] = None,
                  progress: Progress = None, allow_missing: bool = False,
                  jobs: int = 1, engine: Optional[Tuple[str, Optional[str]]] = None
                  ) -> Dict[str, Any]:
    """Compare two dumps (roots, step folders or step files). Baseline is `a`. `progress`, when
    given, is called with a CompareProgress as the compare goes (see compare/progress.py).
    Where no divergence is found but the compare does not cover both runs (`incomplete`: steps
    or ranks one dump lacks, steps not whole), the verdict is "incomplete", not "match", unless
    `allow_missing`. `jobs` > 1 compares ranks in that many worker processes (parallel.py),
    where the dumps hold two ranks or more and enough to compare; `engine` ("dask", ADDRESS)
    on a distributed engine's workers (engine.py), one task per rank, against dumps every
    worker reads at the same paths; the result is the same."""
    mapping = load_mapping(mapping_file) if mapping_file else None
    a, b = open_dump(baseline), open_dump(candidate)
    try:
        from ..check import check_dumps, incomplete_findings
        _refuse_overflow_dumps(a, b, baseline, candidate)
        own_b = [(s, r) for s in b.steps for r in b.ranks if b.files(s, r)]
        pairs = _pairs_of(a, b, step, rank)
        setup = check_dumps(a, b, step=step, rank=rank, labels=("baseline", "candidate"))
        fa, fb = _framework(a), _framework(b)
        same = bool(fa) and vocabulary(fa) == vocabulary(fb)   # one vocabulary of names
        shim_pair = same and fa != fb     # a torch shim's dump against PyTorch's
        rows: List[Row] = []
        unmatched: List[Dict[str, Any]] = []
        per_step: Dict[int, List[Entry]] = {}
        structural: List[StructuralDiff] = []
        unfinished: List[UnfinishedStep] = []
        optimizer_differs = optimizer_setup(setup["findings"])
        strict = optimizer_setup(setup["findings"], conventions=False)
        noise = NoisePolicy(alike=not strict,
                            unknown=[setup[side]["label"] for side in ("a", "b")
                                     if not setup[side]["manifest"]],
                            conventions=[m for m in optimizer_differs if m not in strict])
        updates = _optimizer_by_step(a, b, pairs, setup["findings"])
        before: Dict[Tuple[int, int], bool] = {}   # a step before --step S: whether it agrees
        unread: List[Note] = []       # such a step that cannot be read: --step S goes on
        relabelled = own_b != pairs and len(own_b) == 1 and len(pairs) == 1
        parallel = not relabelled and (engine is not None or worth_parallel(
            jobs, pairs, lambda: _step_bytes(a, pairs)))
        if parallel:
            run = (lambda tasks, done: compare_ranks(tasks, jobs, done)) if engine is None \
                else (lambda tasks, done: run_on_engine(engine[0], engine[1], tasks, done))
            _compare_parallel(baseline, candidate, a, b, pairs, run, same, shim_pair, mapping,
                              noise, progress, before, unread, rows, unmatched, structural,
                              unfinished, per_step)
            s, r = pairs[-1]
        for s, r in _previous_steps(a, b, pairs) if not parallel else ():
            try:
                found = _compare_step(a, b, s, r, same, mapping, [], [], None, (0, 0), noise,
                                      [], shim_pair=shim_pair)
            except DumpError as exc:
                unread.append(Note(NoteCode.PREVIOUS_STEP_UNREAD,
                                   facts={"step": s, "rank": r, "error": str(exc)}))
                continue
            noise.settle(r, found)
            before[(s, r)] = not any(e.diverged or e.trainable_differs for e in found)
        for k, (s, r) in enumerate(pairs if not parallel else ()):
            found = _compare_step(a, b, s, r, same, mapping, rows, unmatched, progress,
                                  (k, len(pairs)), noise, structural, unfinished,
                                  shim_pair=shim_pair)
            noise.settle(r, found)
            per_step.setdefault(s, []).extend(found)
        if progress is not None:
            progress(CompareProgress(len(pairs), len(pairs), s, r, 0, 0, "localizing"))
        stats_only = not any(row.tensor is not None or row.checksum_equal for row in rows)
        # both dumps carry pos_mean (schema 4): a permutation shows in the statistics
        ordered = any(row.pos_mean_a is not None for row in rows) and \
            any(row.pos_mean_b is not None for row in rows)
        steps = [StepEntries(s, per_step[s]) for s in sorted(per_step)]
        # a torch shim's dump against PyTorch's: its code underneath the model is a note
        structural, underneath = split_underneath(structural, shim_pair)
        first, involved = locate(steps, optimizer_differs, structural,
                                 other_setup(setup["findings"], optimizer_differs), before,
                                 updates, unfinished,
                                 causal_one_run_calls(_one_run_calls(unmatched, rows, same),
                                                      shim_pair))
        notes = uncompared(a, b, step, rank, pairs) + level_note(a, b, unmatched) + \
            unobserved_note(a, b) + unused_mapping(mapping, a, b) + unread + \
            other_causes(steps, structural, first) + weights_agree_after(steps, first)
        if own_b != pairs and len(own_b) == 1 and len(pairs) == 1:
            notes.insert(0, Note(NoteCode.RELABELLED,
                                 facts={"a": list(pairs[0]), "b": list(own_b[0])}))
        msprobe = [label for label, d in (("baseline", a), ("candidate", b))
                   if d.source == "msprobe"]
        if msprobe:
            kinds = {str(row.kind) for row in rows}
            notes.append(Note(NoteCode.MSPROBE_DUMPS, facts={
                "sides": msprobe, "files": a.notes(set(pairs)) + b.notes(set(pairs)),
                "no_parameters": bool(rows) and not kinds & {_PARAM.value, RecordKind.PARAM_GRAD.value}}))
        if a.source != b.source:     # precdbg's dump against msprobe's: what neither can see
            limits = list(LIMITS) + ([MINDSPORE_API_CALLS] if "mindspore" in (fa, fb) else [])
            notes.append(Note(NoteCode.TOOLS_DIFFER, facts={"a": a.source, "b": b.source,
                                                            "limits": limits}))
        if not same:      # a torch shim's dump names things as PyTorch's: aligned by name
            notes.append(Note(NoteCode.FRAMEWORKS_DIFFER, facts={"a": fa, "b": fb}))
        if underneath:
            notes.append(Note(NoteCode.CALLS_UNDERNEATH, facts={
                "a": fa, "b": fb, "modules": [d.module for d in underneath]}))
        notes.extend(noise.notes())
        explained = [row for row in rows if row.status == "precision"]
        if explained:
            notes.append(Note(NoteCode.PRECISION_ARGUMENTS,
                              facts={"count": len(explained), "first": explained[0].name_a}))
        plumbing = [row for row in rows if row.status == "integer"]
        if plumbing:
            notes.append(Note(NoteCode.INTEGER_PLUMBING,
                              facts={"count": len(plumbing), "first": plumbing[0].name_a,
                                     "role": plumbing[0].role,
                                     "arg_index": plumbing[0].arg_index}))
        floored = [row for row in rows if row.floor is not None]
        if floored:
            # name where a floor starts (a gradient reduced from dy), not a value it reached
            origin = next((row for row in floored if row.role == Role.GRAD_INPUT),
                          floored[0])
            notes.append(Note(NoteCode.ROUNDING_FLOOR,
                              facts={"count": len(floored), "first": origin.name_a,
                                     "role": origin.role, "arg_index": origin.arg_index}))
        if stats_only and not ordered and first is None:
            # a match by statistics alone, in dumps without pos_mean (a divergence says where
            # its verdict bears on it: judge.unseen_inputs)
            notes.append(Note(NoteCode.STATISTICS_ONLY, facts={}))
        consequences = _consequences(steps, first, involved)
        if first is not None and first.structure is None and first.unfinished is None \
                and first.cause is None:
            note_extra_calls(first, unmatched, rows)
            note_loss_scale(first, setup["findings"])
        place_first(first, a, b)
        write_words(first, notes)       # every word of the verdict and the notes, here
        incomplete = incomplete_parts(a, b, step, rank, pairs)
        verdict = "diverged" if first else \
            ("incomplete" if incomplete and not allow_missing else "match")
        return {"contract": CONTRACT_VERSION,
                "verdict": verdict, "incomplete": incomplete,
                "first_divergence": first.as_json() if first is not None else None,
                "consequences": consequences, "unmatched": unmatched[:1000],
                "unmatched_count": len(unmatched),
                "notes": [note.as_json() for note in notes],
                # every compared step that is not whole (check looks at one step)
                "setup": incomplete_findings((("baseline", a, set(pairs)),
                                              ("candidate", b, set(pairs))))
                + [f for f in setup["findings"] if f["kind"] != "incomplete"],
                "setup_notes": setup["notes"], "setup_unchecked": setup["unchecked"],
                "baseline": {"path": baseline, "framework": fa},
                "candidate": {"path": candidate, "framework": fb},
                "rows": _rows_json(rows)}
    finally:
        a.close()
        b.close()


def _rows_json(rows: List[Optional[Row]]) -> List[Dict[str, Any]]:
    """Each row as JSON, the row let go of as it is written: a compare of many ranks holds its
    rows once, not twice. `rows` is emptied."""
    out = []
    for k, row in enumerate(rows):
        out.append(row.as_json())      # type: ignore[union-attr]
        rows[k] = None
    rows.clear()
    return out


def _step_bytes(a: Dump, pairs: List[Tuple[int, int]]) -> int:
    """The size of the baseline's step files of the compared pairs."""
    total = 0
    for s, r in pairs:
        for f in a.files(s, r):
            try:
                total += os.path.getsize(f.path)
            except (OSError, AttributeError):
                pass
    return total


def _compare_parallel(baseline: str, candidate: str, a: Dump, b: Dump,
                      pairs: List[Tuple[int, int]], run: Callable[..., List[RankFound]],
                      same: bool, shim_pair: bool,
                      mapping: Any, noise: NoisePolicy, progress: Progress,
                      before: Dict[Tuple[int, int], bool], unread: List[Note], rows: List[Row],
                      unmatched: List[Dict[str, Any]], structural: List[StructuralDiff],
                      unfinished: List[UnfinishedStep], per_step: Dict[int, List[Entry]]
                      ) -> None:
    """compare_dumps's loops over (step, rank) on worker processes, one rank each
    (parallel.py, or an engine's workers: engine.py); what they find is merged in the order
    the loops would have made it."""
    previous = _previous_steps(a, b, pairs)
    ranks = sorted({r for _, r in pairs})
    baseline, candidate = os.path.abspath(baseline), os.path.abspath(candidate)
    tasks = [RankTask(baseline, candidate, r, [s for s, q in pairs if q == r],
                      [s for s, q in previous if q == r], same, shim_pair, mapping, noise.alike,
                      noise.unknown, noise.conventions) for r in ranks]
    done = None
    if progress is not None:
        files = [0]

        def done(found: RankFound, count: int) -> None:     # a rank's steps all compared
            files[0] += len(found.steps)
            last = found.steps[-1].step if found.steps else 0
            progress(CompareProgress(files[0], len(pairs), last, found.rank, 0, 0, "comparing"))
    results = run(tasks, done)
    for key, note in sorted((u for f in results for u in f.unread), key=lambda u: u[0]):
        unread.append(note)
    for key in sorted(k for f in results for k in f.before):
        before[key] = next(f.before[key] for f in results if key in f.before)
    for f in results:
        noise.merge(f.noise)
    found_at = {(st.step, st.rank): st for f in results for st in f.steps}
    for s, r in pairs:
        st = found_at[(s, r)]
        rows.extend(st.rows)
        unmatched.extend(st.unmatched)
        structural.extend(st.structural)
        unfinished.extend(st.unfinished)
        per_step.setdefault(s, []).extend(st.entries)


def _one_run_calls(unmatched: List[Dict[str, Any]], rows: List[Row], same: bool
                   ) -> List[Dict[str, Any]]:
    """The records of calls only one run made (not a call with a counterpart one of whose
    records the other run lacks); across frameworks none (their calls differ by design)."""
    if not same:
        return []
    paired = {("a", row.step, row.rank, row.name_a) for row in rows} | \
        {("b", row.step, row.rank, row.name_b) for row in rows}
    return [u for u in unmatched if (u["side"], u["step"], u["rank"], u["name"]) not in paired]


def _optimizer_by_step(a: Dump, b: Dump, pairs: List[Tuple[int, int]],
                       findings: List[Dict[str, Any]]) -> Dict[Tuple[int, int], List[str]]:
    """(step, rank) -> the optimizer set-up differences of the settings that step used, for
    the compared steps and the ones just before them whose files both hold them: a parameter
    that differs at a step's start is explained by the update of the step before, with the lr
    a schedule gave that step (run.json holds the last captured window's). The run's other
    optimizer findings (`findings` of the check: loss scale, the frameworks' optimizer
    conventions) hold for every step."""
    from ..check import step_optimizer_findings
    every_step = optimizer_setup([f for f in findings if f["kind"] not in _STEP_KINDS])
    out: Dict[Tuple[int, int], List[str]] = {}
    for s, r in sorted(set(pairs) | {(s - 1, r) for s, r in pairs}):
        if not (a.files(s, r) and b.files(s, r)):
            continue
        try:
            found = step_optimizer_findings(a, b, s, r, ("baseline", "candidate"))
        except DumpError:       # what compares the step says why it cannot be read
            continue
        if found is not None:
            out[(s, r)] = optimizer_setup(found) + every_step
    return out


def _previous_steps(a: Dump, b: Dump, pairs: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """(step - 1, rank) of each compared step whose previous step both dumps hold but the
    compare does not cover (`--step S`): the noise policy needs its parameters."""
    chosen = set(pairs)
    return sorted({(s - 1, r) for s, r in pairs if (s - 1, r) not in chosen
                   and a.files(s - 1, r) and b.files(s - 1, r)})


def _consequences(steps: List[StepEntries], first: Optional[Verdict],
                  involved: List[Entry]) -> List[Dict[str, Any]]:
    """What differs besides the verdict's chain and the modules holding the culprit, in the
    order it ran (step, rank, timeline)."""
    if first is None:
        return []
    skip = {id(e) for e in involved}
    out = []
    for step in steps:
        for e in sorted(step.entries, key=lambda x: (x.rank, x.seq)):
            if not e.diverged or id(e) in skip or contains(e, first) or \
                    (e.name_a == first.name_a and e.step == first.step
                     and e.rank == first.rank):
                continue
            ev = (e.outputs_bad or e.inputs_bad or [None])[0]
            found = {"step": e.step, "rank": e.rank, "direction": e.direction,
                     "kind": e.kind, "name_a": e.name_a, "name_b": e.name_b,
                     "module": e.module, "op": e.op,
                     "role": ev.role if ev else "", "err": ev.metrics.get("err") if ev
                     else None, "tol": ev.metrics.get("tol") if ev else None}
            if ev is not None and ev.only_in:
                found["only_in"] = ev.only_in
            if ev is None and e.args_bad:     # only a non-tensor argument differs (an eps)
                arg = e.args_bad[0]
                found["argument"] = {"key": arg.key or str(arg.arg_index), "a": arg.a,
                                     "b": arg.b}
            out.append(found)
            if len(out) >= _MAX_CONSEQUENCES:
                return out
    return out
