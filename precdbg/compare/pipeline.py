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
from ..storage.common_records import LIMITS, MINDSPORE_API_CALLS
from ..storage.reader import Dump, open_dump
from ..storage.step_reader import StepFile
from ..records.naming import vocabulary
from ..records.schema import RecordKind, Task
from .align.alignment import load_mapping
from .localize.callsite import place_first
from .judge.entries import Entry, StepEntries
from .engine import run_on_engine
from .parallel import compare_ranks, worth_parallel
from .rank_compare import RankFound, RankTask, StepFound, StepUnread, compare_rank
from ..check import RankChecked
from .report.row_store import RowChunk, RowStore
from .localize.locate import contains, locate
from .localize.verdict import CONTRACT_VERSION, Verdict
from .judge.calls_underneath import causal_one_run_calls, split_underneath
from .judge.structure import StructuralDiff
from .judge.unfinished import UnfinishedStep
from .judge.multistep import NoisePolicy, optimizer_setup, other_setup
from .report.notes import (incomplete_parts, level_note, note_extra_calls, note_loss_scale,
                           other_causes, uncompared, unobserved_note, unused_mapping,
                           weights_agree_after)
from .report.progress import CompareProgress
from .report.wording import write_words
from .judge.rows import Note, NoteCode

__all__ = ["compare_dumps", "load_mapping", "CompareProgress"]

Progress = Optional[Callable[[CompareProgress], None]]

_MAX_CONSEQUENCES = 20
_PARAM = RecordKind.PARAM
_STEP_KINDS = ("optimizer", "optimizer_groups")     # findings of the settings a step used


def _framework(dump: Dump) -> str:
    return dump.setting("framework")


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
                  jobs: int = 1, engine: Optional[Tuple[str, Optional[str]]] = None,
                  spool_rows: bool = False, keep_rows: bool = True) -> Dict[str, Any]:
    """Compare two dumps (roots, step folders or step files). Baseline is `a`. `progress`, when
    given, is called with a CompareProgress as the compare goes (see compare/progress.py).
    Where no divergence is found but the compare does not cover both runs (`incomplete`: steps
    or ranks one dump lacks, steps not whole), the verdict is "incomplete", not "match", unless
    `allow_missing`. `jobs` > 1 compares ranks in that many worker processes (parallel.py),
    where the dumps hold two ranks or more and enough to compare; `engine` ("dask", ADDRESS)
    on a distributed engine's workers (engine.py), one task per rank, against dumps every
    worker reads at the same paths; the result is the same. `spool_rows`: the result's "rows"
    is a row_store.RowStore holding them on disk (iterable, `len`; report.formats writes it),
    so the compare's memory does not grow with the ranks, instead of a list of dicts;
    `keep_rows` False: no row is kept or encoded, only counted (a caller that writes no rows:
    "rows" is then an empty RowStore whose `len` is their number). A
    (step, rank) whose files cannot be read is named (note `step_unread`, `incomplete` part
    `unreadable`) and the others are compared."""
    mapping = load_mapping(mapping_file) if mapping_file else None
    a, b = open_dump(baseline), open_dump(candidate)
    try:
        from ..check import SetupCheck, incomplete_findings
        _refuse_overflow_dumps(a, b, baseline, candidate)
        own_b = [(s, r) for s in b.steps for r in b.ranks if b.files(s, r)]
        pairs = _pairs_of(a, b, step, rank)
        # the check's first rank now; each other rank where the compare reads it (its task)
        check = SetupCheck(a, b, step, rank, ("baseline", "candidate"))
        fa, fb = _framework(a), _framework(b)
        same = bool(fa) and vocabulary(fa) == vocabulary(fb)   # one vocabulary of names
        shim_pair = same and fa != fb     # a torch shim's dump against PyTorch's
        unknown = [run.label for run in (check.run_a, check.run_b) if run.manifest is None]
        noise = _noise_policy(check.checker.findings, unknown)
        relabelled = own_b != pairs and len(own_b) == 1 and len(pairs) == 1
        parallel = not relabelled and (engine is not None or worth_parallel(
            jobs, pairs, lambda: _step_bytes(a, pairs)))
        previous = _previous_steps(a, b, pairs)
        checked_here = set(check.others)
        tasks = [RankTask(os.path.abspath(baseline), os.path.abspath(candidate), r,
                          [s for s, q in pairs if q == r], [s for s, q in previous if q == r],
                          same, shim_pair, mapping, noise.alike, noise.unknown,
                          noise.conventions, spool=spool_rows, keep_rows=keep_rows,
                          check=(check.step_a, check.step_b) if r in checked_here else None)
                 for r in sorted({r for _, r in pairs})]
        if parallel:        # the ranks are read again by the workers: the check's copies go
            a.release_kept()
            b.release_kept()
        run = _RankRunner(tasks, (a, b), parallel, jobs, engine, progress, len(pairs))
        taken = run(RowStore(spool=spool_rows, keep=keep_rows), noise)
        setup = check.result(taken.checked)
        settled = _noise_policy(setup["findings"], unknown)
        if (settled.alike, settled.conventions) != (noise.alike, noise.conventions):
            # another rank's optimizer differs: every rank judged again under its policy
            noise = settled
            for task in tasks:
                task.alike, task.conventions, task.check = noise.alike, noise.conventions, None
            taken = run(RowStore(spool=spool_rows, keep=keep_rows), noise)
        optimizer_differs = optimizer_setup(setup["findings"])
        updates = _optimizer_updates(taken.optimizers, setup["findings"])
        store = taken.store
        if taken.unreadable and not taken.per_step:      # nothing could be compared
            raise DumpError(taken.unreadable[0].error)
        rows_facts = store.facts()
        unmatched, one_run = taken.unmatched, taken.one_run
        structural, unfinished, before = taken.structural, taken.unfinished, taken.before
        unread = taken.unread + [Note(NoteCode.STEP_UNREAD, facts={
            "step": u.step, "rank": u.rank, "side": u.side, "error": u.error})
            for u in taken.unreadable]
        s, r = pairs[-1]
        if progress is not None:
            progress(CompareProgress(len(pairs), len(pairs), s, r, 0, 0, "localizing"))
        stats_only = not rows_facts.measured
        # both dumps carry pos_mean (schema 4): a permutation shows in the statistics
        ordered = rows_facts.pos_a and rows_facts.pos_b
        steps = [StepEntries(s, entries, taken.ranks_of_step[s])
                 for s, entries in sorted(taken.per_step.items())]
        # a torch shim's dump against PyTorch's: its code underneath the model is a note
        structural, underneath = split_underneath(structural, shim_pair)
        first, involved = locate(steps, optimizer_differs, structural,
                                 other_setup(setup["findings"], optimizer_differs), before,
                                 updates, unfinished,
                                 causal_one_run_calls(one_run if same else [],
                                                      shim_pair))
        notes = uncompared(a, b, step, rank, pairs) + level_note(a, b, unmatched) + \
            unobserved_note(a, b) + unused_mapping(mapping, a, b) + unread + \
            other_causes(steps, structural, first) + weights_agree_after(taken.params_agree, first)
        if own_b != pairs and len(own_b) == 1 and len(pairs) == 1:
            notes.insert(0, Note(NoteCode.RELABELLED,
                                 facts={"a": list(pairs[0]), "b": list(own_b[0])}))
        msprobe = [label for label, d in (("baseline", a), ("candidate", b))
                   if d.source == "msprobe"]
        if msprobe:
            kinds = set(rows_facts.kinds)
            notes.append(Note(NoteCode.MSPROBE_DUMPS, facts={
                "sides": msprobe, "files": a.notes(set(pairs)) + b.notes(set(pairs)),
                "no_parameters": bool(rows_facts.count)
                and not kinds & {_PARAM.value, RecordKind.PARAM_GRAD.value}}))
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
        f = rows_facts
        if f.explained:
            notes.append(Note(NoteCode.PRECISION_ARGUMENTS,
                              facts={"count": f.explained, "first": f.explained_first}))
        if f.plumbing and f.plumbing_first is not None:
            name, role, arg_index = f.plumbing_first
            notes.append(Note(NoteCode.INTEGER_PLUMBING,
                              facts={"count": f.plumbing, "first": name, "role": role,
                                     "arg_index": arg_index}))
        if f.floored and f.floored_first is not None:
            # name where a floor starts (a gradient reduced from dy), not a value it reached
            name, role, arg_index = f.floored_grad_input or f.floored_first
            notes.append(Note(NoteCode.ROUNDING_FLOOR,
                              facts={"count": f.floored, "first": name, "role": role,
                                     "arg_index": arg_index}))
        if stats_only and not ordered and first is None:
            # a match by statistics alone, in dumps without pos_mean (a divergence says where
            # its verdict bears on it: judge.unseen_inputs)
            notes.append(Note(NoteCode.STATISTICS_ONLY, facts={}))
        consequences = _consequences(steps, first, involved)
        if first is not None and first.structure is None and first.unfinished is None \
                and first.cause is None:
            note_extra_calls(first, one_run)
            note_loss_scale(first, setup["findings"])
        place_first(first, a, b)
        write_words(first, notes)       # every word of the verdict and the notes, here
        incomplete = incomplete_parts(a, b, step, rank, pairs, taken.whys)
        # a file that cannot be read is damage, not a step one run lacks: never a match
        unreadable = [{"side": u.side, "step": u.step, "rank": u.rank, "why": "unreadable",
                       "error": u.error} for u in taken.unreadable]
        incomplete = unreadable + incomplete
        verdict = "diverged" if first else \
            ("incomplete" if unreadable or (incomplete and not allow_missing) else "match")
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
                "rows": store if spool_rows or not keep_rows else store.as_list()}
    finally:
        a.close()
        b.close()


class _Taken:
    """What the ranks found, taken as each rank's result arrives (in any order) and handed
    over in the order one process compares them: (step, rank)."""

    def __init__(self, store: RowStore, dumps: Tuple[Dump, Dump]) -> None:
        self.store, self.dumps = store, dumps
        self._found: Dict[Tuple[int, int], StepFound] = {}
        self._ranks: Dict[int, RankFound] = {}
        self.before: Dict[Tuple[int, int], bool] = {}
        self.unread: List[Note] = []
        self.unreadable: List[StepUnread] = []
        self.unmatched: List[Dict[str, Any]] = []
        self.one_run: List[Dict[str, Any]] = []
        self.structural: List[StructuralDiff] = []
        self.unfinished: List[UnfinishedStep] = []
        self.per_step: Dict[int, List[Entry]] = {}
        self.ranks_of_step: Dict[int, List[int]] = {}
        self.params_agree: Dict[Tuple[int, int], Optional[bool]] = {}
        self.whys: Dict[Tuple[str, int, int], List[str]] = {}    # notes.incomplete_parts's
        self.checked: List[RankChecked] = []      # the check of the ranks besides its first
        self.optimizers: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}

    def take(self, found: RankFound) -> None:
        for st in found.steps:
            self._know_statuses(st)
            self.store.add(st.rows)
            st.rows = RowChunk(st.step, st.rank, st.rows.facts)     # the rows are stored
            self._found[(st.step, st.rank)] = st
        found.steps = []
        found.noise.forget_steps()      # the rank is done: kept until merged, without its state
        self._ranks[found.rank] = found

    def _know_statuses(self, st: StepFound) -> None:
        """The step files' status as the rank's task read it: this process does not open
        them again to say which steps are not whole (`Dump.warnings`)."""
        for side, dump in zip(("baseline", "candidate"), self.dumps):
            files = [sf for sf in dump.files(st.step, st.rank) if isinstance(sf, StepFile)]
            statuses = st.statuses.get(side, [])
            if len(files) == len(statuses):
                for sf, status in zip(files, statuses):
                    sf.know_status(status)

    def finish(self, noise: NoisePolicy) -> None:
        """Merge in (step, rank) order; the ranks' noise policies into `noise`."""
        ranks = [self._ranks[r] for r in sorted(self._ranks)]
        for key, note in sorted((u for f in ranks for u in f.unread), key=lambda u: u[0]):
            self.unread.append(note)
        for key in sorted(k for f in ranks for k in f.before):
            self.before[key] = next(f.before[key] for f in ranks if key in f.before)
        self.unreadable = sorted((u for f in ranks for u in f.unreadable),
                                 key=lambda u: (u.step, u.rank))
        for f in ranks:
            noise.merge(f.noise)
            if f.checked is not None:
                self.checked.append(f.checked)
            self.optimizers.update(f.optimizers)
        for (s, _), st in sorted(self._found.items()):
            self.unmatched.extend(st.unmatched)
            self.one_run.extend(st.one_run)
            self.structural.extend(st.structural)
            self.unfinished.extend(st.unfinished)
            self.per_step.setdefault(s, []).extend(st.entries)
            self.ranks_of_step.setdefault(s, []).append(st.rank)
            for side, whys in st.whys.items():
                self.whys[(side, s, st.rank)] = whys
            self.params_agree[(s, st.rank)] = st.params_agree
        self._found.clear()
        self._ranks.clear()


def _progress_of_ranks(progress: Progress, total: int, taken: _Taken
                       ) -> Callable[[RankFound, int], None]:
    """The runners' `done`: each rank's result taken; progress counted by (step, rank)."""
    files = [0]

    def done(found: RankFound, count: int) -> None:
        files[0] += len(found.steps) + len(found.unreadable)
        last = found.steps[-1].step if found.steps else 0
        taken.take(found)
        if progress is not None:
            progress(CompareProgress(files[0], total, last, found.rank, 0, 0, "comparing"))
    return done


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


def _noise_policy(findings: List[Dict[str, Any]], unknown: List[str]) -> NoisePolicy:
    """How steps k >= 1 are judged, from the check's findings: relaxed by the runs' updates
    only where the optimizers are set up alike (multistep.NoisePolicy)."""
    optimizer_differs = optimizer_setup(findings)
    strict = optimizer_setup(findings, conventions=False)
    return NoisePolicy(alike=not strict, unknown=unknown,
                       conventions=[m for m in optimizer_differs if m not in strict])


def _optimizer_updates(per_step: Dict[Tuple[int, int], List[Dict[str, Any]]],
                       findings: List[Dict[str, Any]]) -> Dict[Tuple[int, int], List[str]]:
    """(step, rank) -> the optimizer set-up differences of the settings that step used, for
    the compared steps and the ones just before them whose files both hold them (the ranks'
    `RankFound.optimizers`): a parameter that differs at a step's start is explained by the
    update of the step before, with the lr a schedule gave that step (run.json holds the last
    captured window's). The run's other optimizer findings (`findings` of the check: loss
    scale, the frameworks' optimizer conventions) hold for every step."""
    every_step = optimizer_setup([f for f in findings if f["kind"] not in _STEP_KINDS])
    return {key: optimizer_setup(found) + every_step
            for key, found in sorted(per_step.items())}


class _RankRunner:
    """The ranks' tasks run, here or in workers (`parallel`: processes, or `engine`), each
    rank's result taken as it arrives; called again with new tasks' settings when another
    rank's check changes how they are judged."""

    def __init__(self, tasks: List[RankTask], dumps: Tuple[Dump, Dump], parallel: bool,
                 jobs: int, engine: Optional[Tuple[str, Optional[str]]], progress: Progress,
                 total: int) -> None:
        self.tasks, self.dumps, self.parallel = tasks, dumps, parallel
        self.jobs, self.engine, self.progress, self.total = jobs, engine, progress, total

    def __call__(self, store: RowStore, noise: NoisePolicy) -> "_Taken":
        """Every rank compared, their results merged (`_Taken.finish`; their noise policies
        into `noise`)."""
        taken = _Taken(store, self.dumps)
        done = _progress_of_ranks(self.progress, self.total, taken)
        progress, total = self.progress, self.total
        if self.parallel and self.engine is None:
            compare_ranks(self.tasks, self.jobs, done)
        elif self.parallel:
            run_on_engine(self.engine[0], self.engine[1], self.tasks, done)
        else:
            started = [0]

            def step_progress(s: int, r: int, done: int, count: int, phase: str) -> None:
                if phase == "aligning":
                    started[0] += 1
                progress(CompareProgress(started[0] - 1, total, s, r, done, count, phase))
            for task in self.tasks:
                taken.take(compare_rank(task, self.dumps,
                                        step_progress if progress else None))
        taken.finish(noise)
        return taken


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
