"""Name the first divergence: the earliest producer whose own inputs agree and whose outputs do not.

A step is a dataflow. Each record that reads a tensor knows the record of the step that produced
it (`producer`, recorded at dump time), so a divergence is traced back, not guessed from order:

1. Per step, the parameter inventory first (values at start).
2. Then each rank's timeline, the records in the order they ran (forward, backward as the
   gradients appeared, dw, then what ran after backward: clipping, norms, collectives, the
   optimizer). The walk starts at the entry of the first record that differs, on the rank
   where that came first in the step (ranks run the same program; ties: the lowest rank).
3. From there it follows the tensors that differ to their producers: an entry whose input
   differs is a consequence of the entry that produced it. The walk stops at an entry whose
   tensor inputs agree while its outputs (or a non-tensor argument) do not - a module there
   contains the culprit, and the search descends into the calls made inside it - or at a read
   of a tensor nothing captured produced: input data in forward, the arriving gradient in
   backward. A producer that only one run has (another module class, other calls) is named as
   such.
4. Ranks: a read that differs while its producer agrees was changed in between by something not
   captured; with several ranks that is a collective (DDP's all-reduce), and the same producer
   on another rank that differs is the cause. A captured collective whose inputs agree on one
   rank leads to the rank whose input differs.

The walk is the verdict's `chain`: from the first differing entry observed to the culprit.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...records.naming import is_collective
from ...records.schema import RecordKind, Role
from ..judge.entries import Entry, StepEntries
from ..judge.rows import Source
from ..judge.structure import StructuralDiff
from ..judge.unfinished import UnfinishedStep
from .step_causes import ENTERED_APART, cause_verdict, step_causes
from .verdict import Annotation, LinkCode, Verdict
from .verdicts import (Cause, Link, chain, inventory_verdict, root_verdict, structural_verdict,
                       unfinished_verdict)

__all__ = ["locate", "contains"]

_MODULE, _PARAM_GRAD = RecordKind.MODULE, RecordKind.PARAM_GRAD


def _explain(e: Entry, step: StepEntries) -> Tuple[Optional[Entry], Link]:
    """(the entry this one's difference comes from, or None at the culprit; this link)."""
    several = len(step.ranks()) > 1

    def _where(x: Entry, other: Optional[Entry] = None) -> Optional[int]:
        """The rank to name (None: not named)."""
        return x.rank if several and (other is None or x.rank != other.rank) else None

    def link(code: LinkCode, cause: Optional[Cause] = None, producer: Any = None,
             evidence: Any = None, **facts: Any) -> Link:
        return Link(e, code, dict(name=e.name, where=_where(e), **facts), cause, producer,
                    evidence)
    fwd = step.forward_of(e)
    if fwd is not None and fwd.diverged:       # forward ran first: its difference comes first
        return fwd, link(LinkCode.DIFFERENTIATES_FORWARD, other=fwd.name)
    if e.kind == _PARAM_GRAD:                   # a dw that is a dx passed on unchanged
        src = next((ev.producer.entry for ev in e.outputs_bad if ev.producer is not None
                    and ev.producer.entry is not None and ev.producer.entry is not e
                    and ev.producer.entry.diverged), None)
        if src is not None:
            return src, link(LinkCode.GRADIENT_OF, other=src.name)
    if e.inputs_bad:
        ranked = sorted(e.inputs_bad, key=lambda ev: (ev.producer.entry.seq if ev.producer and
                                                      ev.producer.entry else 1 << 62))
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ENTRY and p.entry is not e \
                    and p.entry.diverged:
                return p.entry, link(LinkCode.READS_OUTPUT, other=p.entry.name,
                                     other_where=_where(p.entry, e))
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ONE_RUN:
                return None, link(LinkCode.ONE_RUN_PRODUCER, Cause.ONE_RUN, p, ev,
                                  other=p.name, both=bool(p.name_a and p.name_b),
                                  side="baseline" if p.name_a else "candidate")
        for ev in ranked:
            p = ev.producer
            earlier = next((w for w in ev.same_memory if w is not e and
                            (p is None or w is not p.entry)), None)
            if earlier is not None:   # a buffer shared by several tensors (a gradient bucket)
                return earlier, link(LinkCode.SAME_MEMORY, other=earlier.name)
        for ev in ranked:              # any input whose producer differs on another rank
            p = ev.producer
            if p is not None and p.source is Source.ENTRY and p.entry is not e:
                other = next((c for c in step.counterparts(p.entry) if c.diverged), None)
                if other is not None:
                    return other, link(LinkCode.COLLECTIVE_RANK, other=p.entry.name,
                                       rank=e.rank, other_rank=other.rank)
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ENTRY and p.entry is not e:
                return None, link(LinkCode.CHANGED_AFTER, Cause.CHANGED_AFTER, p, ev,
                                  other=p.entry.name)
        ev = ranked[0]
        if ev.role == Role.GRAD_OUTPUT:
            return None, link(LinkCode.ARRIVING_GRAD, Cause.ARRIVING_GRAD, None, ev)
        return None, link(LinkCode.INPUT_DATA, Cause.INPUT_DATA, None, ev)
    if is_collective(e.op) and e.outputs_bad:
        other = next((c for c in step.counterparts(e) if c.inputs_bad), None)
        if other is not None:
            return other, link(LinkCode.COLLECTIVE_INPUT, rank=e.rank, other_rank=other.rank)
    return None, link(LinkCode.CANDIDATE, Cause.CANDIDATE)


def _walk(start: Entry, step: StepEntries) -> List[Link]:
    links: List[Link] = []
    seen = set()
    entry: Optional[Entry] = start
    while entry is not None and id(entry) not in seen:
        seen.add(id(entry))
        entry, link = _explain(entry, step)
        links.append(link)
    if links[-1].cause is None:        # a cycle (cannot happen in a dataflow): stop here
        links[-1].cause = Cause.CANDIDATE
    return links


def locate(steps: List[StepEntries], setup: Sequence[str] = (),
           structural: Sequence[StructuralDiff] = (), others: Sequence[str] = (),
           before: Optional[Dict[Tuple[int, int], bool]] = None,
           updates: Optional[Dict[Tuple[int, int], List[str]]] = None,
           unfinished: Sequence[UnfinishedStep] = (),
           one_run: Sequence[Dict[str, Any]] = ()
           ) -> Tuple[Optional[Verdict], List[Entry]]:
    """`steps` ascending; `setup`: the optimizer set-up differences `check` found (`others`:
    its other high and medium ones, which a parameter verdict names too). Returns the
    first divergence (None when the runs agree) and the entries of its chain (whatever else
    differs is a consequence). A structural difference (`structural`, see compare/structure.py)
    is named when it ran before the first record that differs in number. `before`: the
    steps both dumps hold just before the compared ones (`--step S`), compared only to judge
    S by: (step, rank) -> whether they agree. `updates`: (step, rank) -> the optimizer
    set-up differences of the settings that step used, where both dumps hold them (a
    parameter verdict quotes the step whose update it blames; `setup` otherwise).
    `unfinished`: steps one run stopped early in (judge.unfinished): named where it stopped,
    unless the numbers parted before that. `one_run`: calls one run made and the other did
    not (records without counterpart): with the structural differences and the step's
    optimizer settings, what a step whose weights entered apart shows as its cause
    (step_causes)."""
    before = before or {}
    # (step, rank) compared before this step, all agreeing
    matched: set = {key for key, agrees in before.items() if agrees}
    differed = {key for key, agrees in before.items() if not agrees}
    for step in steps:
        found = inventory_verdict([e for e in step.entries if e.is_inventory], matched, setup,
                                  others, differed, updates)
        if found:
            if ENTERED_APART in found.annotations:
                causes = step_causes(found.step, found.rank, structural, one_run,
                                     (updates or {}).get((found.step, found.rank), ()), step)
                if causes:
                    return cause_verdict(causes, found, step), []
            return found, []
        shapes = [d for d in structural if d.step == step.step]
        # each rank's earliest difference; the verdict starts at the one that came first in
        # the step (ranks run the same program, so their timelines line up): a difference on
        # rank 1's forward reaches rank 0 only through the gradient reduction after backward,
        # where rank 0's first difference is seen (ties: the lowest rank)
        starts = []
        for rank in sorted(set(step.ranks()) | {d.rank for d in shapes}):
            bad = [e for e in step.timeline(rank) if e.diverged]
            shape = min((d for d in shapes if d.rank == rank), key=lambda d: d.seq,
                        default=None)
            start = min(bad, key=lambda e: e.first_bad) if bad else None
            if shape is not None or start is not None:
                when = min(shape.seq if shape is not None else 1 << 62,
                           start.first_bad if start is not None else 1 << 62)
                starts.append((when, rank, shape, start))
        stops = [u for u in unfinished if u.step == step.step]
        if stops:
            stop = min(stops, key=lambda u: (u.seq, u.rank))
            if not any(when <= stop.seq for when, _, _, _ in starts):
                return unfinished_verdict(stop, step)
        if starts:
            _, _, shape, start = min(starts, key=lambda s: (s[0], s[1]))
            numeric = _numeric_verdict(start, step) if start is not None else None
            if shape is not None and (start is None or shape.seq <= start.first_bad):
                if numeric is not None and shape.settings and not shape.calls_differ \
                        and _within(numeric[0].module, shape.module):
                    # a layer setting (eps, approximate) decides the call the numbers name
                    # inside that module: name the call, with the setting
                    first = numeric[0]
                    first.annotate(Annotation.LAYER_SETTING, module=shape.module,
                                   settings=shape.setting_values())
                    first.structure = shape.as_json()
                    return numeric
                return structural_verdict(shape, step)
            if numeric is not None:
                return numeric
        matched.update((step.step, rank) for rank in step.ranks())
    return None, []


def _within(module: str, outer: str) -> bool:
    return outer == "" or module == outer or module.startswith(outer + ".")


def _numeric_verdict(start: Entry, step: StepEntries) -> Tuple[Verdict, List[Entry]]:
    links = _walk(start, step)
    first, culprit = root_verdict(links[-1], step)
    first.chain = chain(links, culprit, first)
    involved = [link.entry for link in links] + ([culprit] if culprit else [])
    return first, involved


def contains(e: Entry, first: Verdict) -> bool:
    """A module that encloses the culprit diverges because of it, not after it."""
    if e.kind != _MODULE or e.step != first.step or e.direction != first.direction \
            or e.rank != first.rank:
        return False
    return e.module == "" or first.module == e.module or first.module.startswith(e.module + ".")
