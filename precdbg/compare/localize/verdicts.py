"""The JSON of a verdict: what the walk of `localize.py` found (its links, and why it stopped),
as the compare contract's `first_divergence` with its evidence and `chain`; the parameter
inventory's and a structural difference's verdicts. Codes and facts only: report/wording.py
writes the words."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...records.schema import Direction, RecordKind, Role
from ..judge.entries import Entry, StepEntries, all_zero_side
from ..judge.rows import Evidence, Producer
from ..judge.structure import StructuralDiff
from ..judge.unfinished import UnfinishedStep
from ..judge.unseen_inputs import Decision, unseen_inputs
from .verdict import FACTS, Annotation, LinkCode, Verdict, VerdictCode, empty_evidence

__all__ = ["Cause", "Link", "root_verdict", "chain", "inventory_verdict", "structural_verdict",
           "unfinished_verdict"]

_BACKWARD = Direction.BACKWARD
_API = RecordKind.API
_MODULE, _PARAM_GRAD = RecordKind.MODULE, RecordKind.PARAM_GRAD
_CHAIN_LIMIT = 12


class Cause(str, enum.Enum):
    """Why the walk stopped where it did."""
    CANDIDATE = "candidate"            # inputs agree, outputs differ
    INPUT_DATA = "input_data"          # a forward read of a tensor nothing captured produced
    ARRIVING_GRAD = "arriving_grad"    # a backward read of a gradient nothing captured produced
    CHANGED_AFTER = "changed_after"    # the producer agrees, what was read does not
    ONE_RUN = "one_run"                # the producer is in one run only


@dataclasses.dataclass
class Link:
    """One link of the walk: `entry`, what it says (`code`, and the facts of its words), and
    what it leads to."""
    entry: Entry
    code: LinkCode
    facts: Dict[str, Any]
    cause: Optional[Cause] = None      # set on the last link
    producer: Optional[Producer] = None
    evidence: Optional[Evidence] = None


def _descends(entry: Entry, parent: Entry) -> bool:
    if parent.kind != _MODULE:
        return False
    if parent.module == "":
        return True
    return entry.module == parent.module and entry.kind != _MODULE or \
        entry.module.startswith(parent.module + ".")


def _innermost(first: Entry, timeline: List[Entry]) -> Entry:
    """Forward: calls made inside the module come after its call; backward: after its first
    gradient record."""
    key = (lambda e: e.seq) if first.direction == _BACKWARD else (lambda e: e.order)
    culprit = first
    while True:
        inner = [e for e in timeline if e is not culprit and e.is_candidate
                 and e.direction == culprit.direction and key(e) > key(culprit)
                 and _descends(e, culprit)]
        if not inner:
            return culprit
        culprit = min(inner, key=key)


def ev_facts(ev: Optional[Evidence]) -> Optional[Dict[str, Any]]:
    """What the words of a differing tensor need."""
    if ev is None:
        return None
    return {"role": ev.role, "arg_index": ev.arg_index, "why": ev.why}


def _output_facts(entry: Entry) -> Dict[str, Any]:
    """(the code of what its outputs say, and the facts of its words)."""
    ev = entry.outputs_bad[0] if entry.outputs_bad else None
    out = {"ev": ev_facts(ev), "args": [(a.key, a.a, a.b) for a in entry.args_bad[:3]],
           "inputs_ok_err": entry.inputs_ok_err}
    if entry.args_bad:
        code = VerdictCode.ARGUMENT
    elif entry.inputs_ok and ev.metrics.get("tol") == 0.0 and entry.inputs_ok_err > 0.0:
        # exact values (indices, counts, a mask) from inputs that are close but not equal
        code = VerdictCode.NEAR_TIE
    elif entry.inputs_ok:
        code = VerdictCode.OP_DIFFERS
    else:
        code = VerdictCode.NO_COMPARED_INPUTS
    out["code"] = code.value
    return out


def _evidence(entry: Entry) -> Dict[str, Any]:
    return {"inputs_bad": [x.as_json() for x in entry.inputs_bad[:4]],
            "outputs_bad": [x.as_json() for x in entry.outputs_bad[:4]],
            "arguments_bad": [x.as_json() for x in entry.args_bad[:4]],
            "inputs_agreeing": entry.inputs_ok}


def _verdict(code: VerdictCode, entry: Entry, facts: Dict[str, Any], role: Optional[str] = None
             ) -> Verdict:
    evidence: Any = entry.outputs_bad[0] if entry.outputs_bad else (
        entry.inputs_bad[0] if entry.inputs_bad else (entry.args_bad or [None])[0])
    return Verdict(code, entry.step, entry.rank,
                   "backward" if entry.direction == _BACKWARD else "forward",
                   entry.kind, entry.name_a, entry.name_b, entry.module, entry.op,
                   role or (evidence.role if evidence is not None else ""),
                   dict(getattr(evidence, "metrics", {})), "", _evidence(entry), facts=facts)


def _candidate_facts(culprit: Entry, step: StepEntries) -> Tuple[VerdictCode, Dict[str, Any]]:
    facts: Dict[str, Any] = {"form": "candidate", "dw": None}
    if culprit.kind == _PARAM_GRAD:
        more = sum(1 for e in step.entries if e.kind == _PARAM_GRAD and e.rank == culprit.rank
                   and e.diverged and e is not culprit)
        # a module holding it whose dx differs (its backward's outputs): not dw-only
        dx_differs = any(e.direction == _BACKWARD and e.kind == _MODULE and e.outputs_bad
                         and e.rank == culprit.rank and _descends(culprit, e)
                         for e in step.entries)
        facts["dw"] = {"name": culprit.name, "more": more, "zero": all_zero_side(culprit),
                       "dx_differs": dx_differs}
        return (VerdictCode.DW_FIRST if dx_differs else VerdictCode.DW_ONLY), facts
    out = _output_facts(culprit)
    code = VerdictCode(out["code"])
    facts.update(out=out, backward=culprit.direction == _BACKWARD, zero="")
    if culprit.direction == _BACKWARD:
        facts["zero"] = all_zero_side(culprit)
        return (VerdictCode.BACKWARD_ONLY if code is VerdictCode.OP_DIFFERS else code), facts
    return code, facts


def gradient_verdict(entry: Entry, gradient: Dict[str, Any], step: StepEntries) -> Verdict:
    """The dw-only verdict of a weight gradient that differs far beyond what its module read
    (judge dw_beyond_inputs: `gradient` its facts), in a step whose weights entered apart: the
    forward and dx differ only as far as those weights make them."""
    _, facts = _candidate_facts(entry, step)
    facts["dw"]["beyond"] = gradient
    verdict = _verdict(VerdictCode.DW_ONLY, entry, facts)
    zero = all_zero_side(entry)
    if zero:
        verdict.evidence["all_zero_in"] = zero
        verdict.annotate(Annotation.ALL_ZERO)
    verdict.chain = [_item(entry, "backward", LinkCode.CULPRIT, {})]
    return verdict


def _enclosing_agreeing_module(e: Entry, step: StepEntries) -> Optional[Entry]:
    """The innermost module call holding `e`, in the same direction, whose own inputs (dy in
    backward) were compared and agree while its outputs (dx) differ: what `e` reads, which
    nothing captured produced, was then computed inside that module."""
    holders = [m for m in step.entries if m.kind == _MODULE and m.rank == e.rank
               and m.direction == e.direction and m is not e and m.inputs_ok
               and not m.inputs_bad and m.outputs_bad and _descends(e, m)]
    return max(holders, key=lambda m: (m.module.count(".") if m.module else -1, m.order),
               default=None)


def _uncaptured_inside_facts(holder: Entry, e: Entry, ev: Evidence, step: StepEntries
                             ) -> Dict[str, Any]:
    """The facts of an uncaptured call inside `holder` (module_only: the dumps hold module
    calls only)."""
    return {"form": "uncaptured_inside", "module": holder.module,
            "backward": e.direction == _BACKWARD, "name": e.name, "ev": ev_facts(ev),
            "module_only": not any(x.kind == _API for x in step.entries if x.rank == e.rank)}


def _unseen(verdict: Verdict, culprit: Entry) -> Verdict:
    """A call whose inputs agree by every statistic while its output differs far beyond
    tolerance (judge.unseen_inputs): said so, and decided by the inputs' checksums where
    both dumps hold them."""
    found = unseen_inputs(culprit)
    if found is None:
        return verdict
    verdict.evidence["unseen_inputs"] = found.as_json()
    if found.decision is Decision.OP_DIFFERS:
        verdict.annotate(Annotation.CHECKSUMS_DECIDE, op_differs=True)
        return verdict
    verdict.code = VerdictCode.INPUTS_UNSEEN
    unseen = {"name": culprit.name, "ratio": found.ratio,
              "args": list(found.checksums_differ[:3])}
    verdict.facts["unseen"] = unseen
    if found.decision is Decision.INPUTS_DIFFER:
        unseen["decision"] = "inputs_differ"
        verdict.role = found.checksums_differ[0][0]
        verdict.annotate(Annotation.CHECKSUMS_DECIDE)
        return verdict
    unseen["decision"] = "statistics_blind"
    verdict.annotate(Annotation.STATISTICS_BLIND)
    return verdict


def root_verdict(link: Link, step: StepEntries) -> Tuple[Verdict, Optional[Entry]]:
    """The verdict at the end of the walk, and the culprit entry when it is not the last link's
    (a module's innermost call)."""
    e, ev = link.entry, link.evidence
    if link.cause is Cause.CANDIDATE:
        culprit = _innermost(e, step.timeline(e.rank))
        code, facts = _candidate_facts(culprit, step)
        verdict = _verdict(code, culprit, facts)
        zero = all_zero_side(culprit) if culprit.direction == _BACKWARD else ""
        if zero:
            verdict.evidence["all_zero_in"] = zero
            verdict.annotate(Annotation.ALL_ZERO)
        return _unseen(verdict, culprit), (culprit if culprit is not e else None)
    if link.cause in (Cause.INPUT_DATA, Cause.ARRIVING_GRAD):
        holder = _enclosing_agreeing_module(e, step)
        if holder is not None:
            facts = _uncaptured_inside_facts(holder, e, ev, step)
            verdict = _verdict(VerdictCode.UNCAPTURED_CALL, holder, facts)
            if facts["module_only"]:
                verdict.annotate(Annotation.MODULE_LEVEL)
            return verdict, None
    if link.cause is Cause.INPUT_DATA:
        return _verdict(VerdictCode.INPUT_DATA, e, {"form": "input_data", "ev": ev_facts(ev)},
                        role=ev.role), None
    if link.cause is Cause.ARRIVING_GRAD:
        return _verdict(VerdictCode.ARRIVING_GRAD, e,
                        {"form": "arriving_grad", "ev": ev_facts(ev)}, role=ev.role), None
    p = link.producer
    if link.cause is Cause.CHANGED_AFTER and p.entry.kind == _PARAM_GRAD:
        # the gradient as the parameter's hook saw it agrees; `.grad` as read later does not
        first = _verdict(VerdictCode.GRAD_CHANGED_AFTER_HOOK, e,
                         {"form": "grad_changed_after_hook", "param": p.entry.name,
                          "name": e.name, "ev": ev_facts(ev)}, role=Role.PARAM_GRAD)
        first.kind, first.name_a, first.name_b = _PARAM_GRAD, p.entry.name_a, p.entry.name_b
        first.module, first.op, first.direction = p.entry.module, p.entry.op, "backward"
        return first, None
    if link.cause is Cause.CHANGED_AFTER:
        writer = ev.writer            # judge one_run_writer
        if writer is not None:       # a captured call changed it: that call is the culprit
            side = writer.side
            first = _verdict(VerdictCode.ONE_RUN_CALL, e,
                             {"form": "one_run_writer", "side": side, "writer": writer.name,
                              "name": e.name, "ev": ev_facts(ev), "producer": p.entry.name},
                             role=ev.role)
            first.kind, first.module, first.op = _API, writer.module, writer.op
            first.name_a = "" if side == "candidate" else writer.name
            first.name_b = writer.name if side == "candidate" else ""
            first.direction = "forward"
            first.cause = {"code": VerdictCode.ONE_RUN_CALL.value, "step": e.step,
                           "rank": e.rank, "module": first.module, "name_a": first.name_a,
                           "name_b": first.name_b, "text": "", FACTS: {"reason": True}}
            return first, None
        return _verdict(VerdictCode.CHANGED_AFTER, e,
                        {"form": "changed_after", "ev": ev_facts(ev), "producer": p.entry.name},
                        role=ev.role), None
    who = "baseline" if p.name_a and not p.name_b else (
        "candidate" if p.name_b and not p.name_a else "")
    first = _verdict(VerdictCode.CALLS_DIFFER, e,
                     {"form": "calls_differ", "module": p.module, "name": e.name, "who": who,
                      "p_name": p.name, "name_a": p.name_a, "name_b": p.name_b}, role=ev.role)
    first.kind, first.name_a, first.name_b = p.kind or e.kind, p.name_a, p.name_b
    first.module, first.op = p.module, p.op or e.op
    first.direction = "backward" if e.direction == _BACKWARD else "forward"
    return first, None


def _item(x: Any, direction: str, code: LinkCode, facts: Dict[str, Any],
          kind: Optional[str] = None) -> Dict[str, Any]:
    """A chain item of entry (or verdict) `x`: its words are report/wording.py's."""
    return {"name_a": x.name_a, "name_b": x.name_b, "step": x.step, "rank": x.rank,
            "kind": kind or x.kind, "direction": direction, "module": x.module, "text": "",
            "code": code.value, FACTS: facts}


def chain(links: List[Link], culprit: Optional[Entry], first: Verdict
          ) -> List[Dict[str, Any]]:
    items = [_item(link.entry, link.entry.direction, link.code, link.facts) for link in links]
    last = links[-1]
    if culprit is not None:
        items[-1].update(code=LinkCode.INSIDE.value, **{FACTS: {"name": last.entry.name}})
        items.append(_item(culprit, culprit.direction, LinkCode.CANDIDATE,
                           {"name": culprit.name}))
    elif last.cause is Cause.ONE_RUN:
        p = last.producer
        items.append(_item(first, last.entry.direction, LinkCode.CALLS_DIFFER,
                           {"name_a": p.name_a, "name_b": p.name_b}))
    elif first.code is VerdictCode.ONE_RUN_CALL:
        # a call one run made wrote it in between (root_verdict's `_one_run_writer`)
        items[-1].update(code=LinkCode.CHANGED_IN_BETWEEN.value,
                         **{FACTS: {"name": last.entry.name,
                                    "other": last.producer.entry.name}})
        items.append(_item(first, last.entry.direction, LinkCode.CULPRIT, {}))
    if len(items) > _CHAIN_LIMIT:     # the start, and the links nearest the culprit
        dropped = len(items) - _CHAIN_LIMIT
        items = items[:2] + items[2 + dropped:]
        items[2][FACTS]["dropped"] = dropped
    return items


def _most_telling(e: Entry) -> Tuple[int, float, int, int]:
    """Which differing parameter a verdict names where the weights entered the step apart: one
    frozen in one run, missing or reshaped first; then the largest relative error (a weight
    changed before training, 1e-3, among the parameters the training steps since moved apart
    from it, 1e-4: the first in order would name one of those), then the order the model
    reads them."""
    ev = e.outputs_bad[0] if e.outputs_bad else None
    if e.trainable_differs or (ev is not None and (ev.only_in or not ev.shape_ok)):
        return 0, 0.0, e.seq, e.rank
    err = float((ev.metrics if ev is not None else {}).get("err") or 0.0)
    return 1, -(err if math.isfinite(err) else math.inf), e.seq, e.rank


def inventory_verdict(entries: List[Entry], matched: AbstractSet[Tuple[int, int]],
                      setup: Sequence[str], others: Sequence[str] = (),
                      differed: AbstractSet[Tuple[int, int]] = frozenset(),
                      updates: Optional[Mapping[Tuple[int, int], Sequence[str]]] = None
                      ) -> Optional[Verdict]:
    """The parameter inventory's verdict at the start of a step; `matched`: the (step, rank)
    pairs compared before it, which all agreed (the step before on the same rank is then
    known to have matched)."""
    bad = [e for e in entries if e.diverged or e.trainable_differs]
    if not bad:
        return None
    # after a step that matched the cause is the update (the optimizer): named at the first
    # parameter the model reads; weights that entered apart: at the farthest apart
    e = min(bad, key=lambda x: (x.seq, x.rank))
    if (e.step - 1, e.rank) not in matched:
        e = min(bad, key=_most_telling)
    previous_matched = (e.step - 1, e.rank) in matched
    # the update that moved them apart is the step before's: quoted with its own settings
    setup = (updates or {}).get((e.step - 1, e.rank), setup)
    ev = e.outputs_bad[0] if e.outputs_bad else None
    facts: Dict[str, Any] = {"form": "inventory", "name": e.name, "step": e.step,
                             "rank": e.rank, "only_in": ev.only_in if ev is not None else "",
                             "others": list(others), "more": len(bad) - 1, "param": None}
    if e.trainable_differs:
        facts["what"] = "trainable"
    elif ev is not None and ev.only_in:
        facts["what"] = "only_in"
    elif ev is not None and not ev.shape_ok:
        facts["what"] = "shapes"
    else:       # judged against its last update where the optimizers agree (multistep.py)
        metrics = ev.metrics if ev is not None else {}
        facts["what"] = "values"
        facts["param"] = {"step": e.step, "share": metrics.get("update_share"),
                          "dw": metrics.get("dw_agreed"), "previous_matched": previous_matched,
                          "setup": list(setup), "others": list(others)}
    code = VerdictCode.TRAINABLE_DIFFERS if e.trainable_differs else \
        VerdictCode.PARAMETER_INVENTORY if ev is not None and ev.only_in else \
        VerdictCode.PARAMETER_SHAPES if ev is not None and not ev.shape_ok else \
        VerdictCode.UPDATE_DIFFERS if previous_matched else VerdictCode.PARAMETERS_DIFFER
    verdict = _verdict(code, e, facts)
    if facts["more"]:
        verdict.annotations.append(Annotation.MORE_PARAMETERS)
    if code is VerdictCode.PARAMETERS_DIFFER:
        verdict.annotations.append(Annotation.WEIGHTS_ENTERED_APART)
        if (e.step - 1, e.rank) in differed:
            verdict.annotations.append(Annotation.EARLIER_STEP_DIFFERS)
            facts["entered"] = "earlier"
        elif e.step > 0 and any(step < e.step for step, _ in matched):
            verdict.annotations.append(Annotation.STEP_NOT_COMPARED)
            facts["entered"] = "not_compared"
        else:
            verdict.annotations.append(Annotation.NOT_DUMPED)
            facts["entered"] = "not_dumped"
    verdict.chain = [_item(e, e.direction, LinkCode.START_OF_STEP,
                           {"name": e.name, "step": e.step})]
    return verdict


def structural_verdict(diff: StructuralDiff, step: StepEntries) -> Tuple[Verdict, List[Entry]]:
    """A module whose class or calls differ, named where it ran."""
    entry = next((e for e in step.entries if e.rank == diff.rank and e.kind == _MODULE
                  and e.direction == Direction.FORWARD and e.name_a == diff.name_a), None)
    code = VerdictCode.LAYER_SETTING if diff.settings and not diff.calls_differ \
        else VerdictCode.STRUCTURE
    first = Verdict(code, diff.step, diff.rank, "forward", _MODULE, diff.name_a, diff.name_b,
                    diff.module, diff.op, structure=diff.as_json(),
                    facts={"form": "structural", "diff": diff.facts()})
    if entry is not None:
        first.evidence = _evidence(entry)
        if entry.outputs_bad:          # the numbers differ too: say how
            first.annotate(Annotation.NUMBERS_DIFFER, out=_output_facts(entry))
            first.role = entry.outputs_bad[0].role
            first.metrics = dict(entry.outputs_bad[0].metrics)
    first.chain = [_item(diff, Direction.FORWARD, LinkCode.STRUCTURAL,
                         {"name_a": diff.name_a, "name_b": diff.name_b}, kind=_MODULE)]
    return first, [entry] if entry is not None else []


def unfinished_verdict(stop: UnfinishedStep, step: StepEntries) -> Tuple[Verdict, List[Entry]]:
    """One run's step stopped early (judge.unfinished): named where it stopped."""
    name_a, name_b = (stop.entry, stop.other_entry) if stop.side == "baseline" else \
        (stop.other_entry, stop.entry)
    first = Verdict(VerdictCode.UNFINISHED, stop.step, stop.rank, "forward", _MODULE, name_a,
                    name_b, stop.module, "", unfinished=stop.as_json(),
                    facts={"form": "unfinished", "side": stop.side, "module": stop.module,
                           "entry": stop.entry, "other_entry": stop.other_entry,
                           "last_record": stop.last_record,
                           "records_after": stop.records_after})
    first.chain = [_item(first, Direction.FORWARD, LinkCode.STOPPED,
                         {"side": stop.side, "module": stop.module})]
    return first, []
