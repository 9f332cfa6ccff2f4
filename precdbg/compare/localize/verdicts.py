"""The words and JSON of a verdict: what the walk of `localize.py` found (its links, and why it
stopped), said as the compare contract's `first_divergence` with its evidence and `chain`; the
parameter inventory's and a structural difference's verdicts."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...records.schema import Direction, RecordKind, Role
from ..judge.entries import Entry, StepEntries
from ..judge.multistep import param_reason
from ..judge.rows import Evidence, Producer
from ..judge.structure import StructuralDiff
from ..judge.unfinished import UnfinishedStep
from ..judge.unseen_inputs import Decision, unseen_inputs
from .verdict import Annotation, Verdict, VerdictCode, empty_evidence

__all__ = ["Cause", "Link", "root_verdict", "chain", "inventory_verdict", "structural_verdict",
           "unfinished_verdict"]

_BACKWARD = Direction.BACKWARD
_API = RecordKind.API
_MODULE, _PARAM_GRAD = RecordKind.MODULE, RecordKind.PARAM_GRAD
_OUTPUT_WORDS = {Role.OUTPUT: "output", Role.GRAD_INPUT: "gradient for input (dx)",
                 Role.PARAM_GRAD: "weight gradient (dw)"}
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
    """One link of the walk: `entry`, and what it leads to."""
    entry: Entry
    text: str
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


def _output_reason(entry: Entry) -> Tuple[VerdictCode, str]:
    if entry.args_bad:
        args = "; ".join(f"argument {a.key!r}: {a.a!r} vs {a.b!r}" for a in entry.args_bad[:3])
        if not entry.outputs_bad:
            return VerdictCode.ARGUMENT, f"a non-tensor argument differs ({args})"
        ev = entry.outputs_bad[0]
        return VerdictCode.ARGUMENT, (f"its tensor inputs agree but a non-tensor argument "
                                      f"differs ({args}); its {ev.role} {ev.arg_index} "
                                      f"differs{ev.why}")
    ev = entry.outputs_bad[0]
    what = _OUTPUT_WORDS.get(ev.role, ev.role)
    if entry.inputs_ok and ev.metrics.get("tol") == 0.0 and entry.inputs_ok_err > 0.0:
        # exact values (indices, counts, a mask) from inputs that are close but not equal
        return VerdictCode.NEAR_TIE, (f"its inputs agree within tolerance (largest relative error "
                f"{entry.inputs_ok_err:.3g}) but its {what} {ev.arg_index}, exact values "
                f"(indices, counts, a mask), differs{ev.why}: a near tie decided by rounding "
                "(a top-k or argmax choosing between almost equal values), expected where the "
                "runs' precisions or kernels differ; the runs take different paths from here")
    if entry.inputs_ok:
        return VerdictCode.OP_DIFFERS, f"its inputs agree but its {what} {ev.arg_index} " \
            f"differs{ev.why}"
    return VerdictCode.NO_COMPARED_INPUTS, \
        f"its {what} {ev.arg_index} differs{ev.why} (it has no compared inputs)"


def _evidence(entry: Entry) -> Dict[str, Any]:
    return {"inputs_bad": [x.as_json() for x in entry.inputs_bad[:4]],
            "outputs_bad": [x.as_json() for x in entry.outputs_bad[:4]],
            "arguments_bad": [x.as_json() for x in entry.args_bad[:4]],
            "inputs_agreeing": entry.inputs_ok}


def _verdict(code: VerdictCode, entry: Entry, reason: str, role: Optional[str] = None
             ) -> Verdict:
    evidence: Any = entry.outputs_bad[0] if entry.outputs_bad else (
        entry.inputs_bad[0] if entry.inputs_bad else (entry.args_bad or [None])[0])
    return Verdict(code, entry.step, entry.rank,
                   "backward" if entry.direction == _BACKWARD else "forward",
                   entry.kind, entry.name_a, entry.name_b, entry.module, entry.op,
                   role or (evidence.role if evidence is not None else ""),
                   dict(getattr(evidence, "metrics", {})), reason, _evidence(entry))


def _candidate_reason(culprit: Entry, step: StepEntries) -> Tuple[VerdictCode, str]:
    if culprit.kind == _PARAM_GRAD:
        more = sum(1 for e in step.entries if e.kind == _PARAM_GRAD and e.rank == culprit.rank
                   and e.diverged and e is not culprit)
        more_text = f" ({more} more)" if more else ""
        # a module holding it whose dx differs (its backward's outputs): not dw-only
        dx_differs = any(e.direction == _BACKWARD and e.kind == _MODULE and e.outputs_bad
                         and e.rank == culprit.rank and _descends(culprit, e)
                         for e in step.entries)
        zero = _all_zero_side(culprit)
        zero_text = f"; it is all zero in the {zero}" if zero else ""
        if dx_differs:
            return VerdictCode.DW_FIRST, (
                f"the first backward record that differs is the weight gradient of "
                f"{culprit.name}{more_text}{zero_text}; the forward agrees")
        return VerdictCode.DW_ONLY, ("dw-only difference: forward and dx agree, the weight "
                                     f"gradient of {culprit.name} does not" + more_text
                                     + zero_text)
    code, text = _output_reason(culprit)
    if culprit.direction == _BACKWARD:
        zero = _all_zero_side(culprit)
        return (VerdictCode.BACKWARD_ONLY if code is VerdictCode.OP_DIFFERS else code,
                "backward-only difference: the forward agrees; " + text
                + (f"; it is all zero in the {zero}" if zero else ""))
    return code, text


def _all_zero_side(e: Entry) -> str:
    """"baseline" / "candidate" where every differing output of `e` is all zero in that run
    only (a norm of exactly 0 against a non-zero one), else ""."""
    sides = set()
    for x in e.outputs_bad:
        na, nb = x.metrics.get("norm_a"), x.metrics.get("norm_b")
        if not isinstance(na, float) or not isinstance(nb, float):
            return ""
        if (na == 0.0) == (nb == 0.0):
            return ""
        sides.add("baseline" if na == 0.0 else "candidate")
    return sides.pop() if len(sides) == 1 else ""


def _enclosing_agreeing_module(e: Entry, step: StepEntries) -> Optional[Entry]:
    """The innermost module call holding `e`, in the same direction, whose own inputs (dy in
    backward) were compared and agree while its outputs (dx) differ: what `e` reads, which
    nothing captured produced, was then computed inside that module."""
    holders = [m for m in step.entries if m.kind == _MODULE and m.rank == e.rank
               and m.direction == e.direction and m is not e and m.inputs_ok
               and not m.inputs_bad and m.outputs_bad and _descends(e, m)]
    return max(holders, key=lambda m: (m.module.count(".") if m.module else -1, m.order),
               default=None)


def _uncaptured_inside_reason(holder: Entry, e: Entry, ev: Evidence, step: StepEntries
                              ) -> Tuple[bool, str]:
    """(whether the dumps hold module calls only, the words)."""
    where = f"module '{holder.module}'" if holder.module else "the root module"
    read = "the gradient arriving at" if e.direction == _BACKWARD else "a value read by"
    side = "its dy agrees but its dx does not" if e.direction == _BACKWARD else \
        "its inputs agree but its outputs do not"
    head = (f"{'backward-only difference: ' if e.direction == _BACKWARD else ''}{side}; "
            f"inside it, {read} {e.name} already differs and no captured call produced it: ")
    if not any(x.kind == _API for x in step.entries if x.rank == e.rank):
        return True, (head + f"an API call inside {where} computes it, and these dumps hold "
                      f"module calls only (level module): dump level mix to name that "
                      f"call{ev.why}")
    return False, (head + f"a call inside {where} that precdbg does not capture computes it "
                   f"(a custom autograd Function, a C++/CUDA extension op, compiled "
                   f"code){ev.why}")


def _unseen(verdict: Verdict, culprit: Entry) -> Verdict:
    """A call whose inputs agree by every statistic while its output differs far beyond
    tolerance (judge.unseen_inputs): said so, and decided by the inputs' checksums where
    both dumps hold them."""
    found = unseen_inputs(culprit)
    if found is None:
        return verdict
    verdict.evidence["unseen_inputs"] = found.as_json()
    if found.decision is Decision.OP_DIFFERS:
        verdict.annotate(Annotation.CHECKSUMS_DECIDE,
                         "its inputs are bit for bit equal (checksums): the call itself "
                         "computes differently")
        return verdict
    verdict.code = VerdictCode.INPUTS_UNSEEN
    if found.decision is Decision.INPUTS_DIFFER:
        args = ", ".join(f"{role} {index}" for role, index in found.checksums_differ[:3])
        verdict.role = found.checksums_differ[0][0]
        verdict.annotate(Annotation.CHECKSUMS_DECIDE)
        verdict.reason = (f"input data differs in a way its statistics cannot see: the "
                          f"checksums of {culprit.name}'s {args} differ while min, max, mean "
                          f"and norm agree, and its output differs {found.ratio:.0f} times "
                          f"its tolerance (a permutation, flip or shuffle of the input)")
        return verdict
    verdict.annotate(Annotation.STATISTICS_BLIND)
    verdict.reason = (f"its inputs likely differ in a way the statistics cannot see: they agree "
                      f"by every statistic, yet {culprit.name}, a deterministic call, computes "
                      f"an output {found.ratio:.0f} times its tolerance apart ({verdict.reason}); "
                      "dump with summary_mode 'checksum' (or task 'tensor') to decide between "
                      "the inputs and the call")
    return verdict


def root_verdict(link: Link, step: StepEntries) -> Tuple[Verdict, Optional[Entry]]:
    """The verdict at the end of the walk, and the culprit entry when it is not the last link's
    (a module's innermost call)."""
    e, ev = link.entry, link.evidence
    if link.cause is Cause.CANDIDATE:
        culprit = _innermost(e, step.timeline(e.rank))
        code, words = _candidate_reason(culprit, step)
        verdict = _verdict(code, culprit, words)
        zero = _all_zero_side(culprit) if culprit.direction == _BACKWARD else ""
        if zero:
            verdict.evidence["all_zero_in"] = zero
            verdict.annotate(Annotation.ALL_ZERO)
        return _unseen(verdict, culprit), (culprit if culprit is not e else None)
    if link.cause in (Cause.INPUT_DATA, Cause.ARRIVING_GRAD):
        holder = _enclosing_agreeing_module(e, step)
        if holder is not None:
            module_only, words = _uncaptured_inside_reason(holder, e, ev, step)
            verdict = _verdict(VerdictCode.UNCAPTURED_CALL, holder, words)
            if module_only:
                verdict.annotate(Annotation.MODULE_LEVEL)
            return verdict, None
    if link.cause is Cause.INPUT_DATA:
        return _verdict(VerdictCode.INPUT_DATA, e,
                        f"input data differs: its {ev.role} {ev.arg_index} was produced by "
                        f"nothing captured in the step (the batch, RNG, the data loader) and "
                        f"already disagrees{ev.why}", role=ev.role), None
    if link.cause is Cause.ARRIVING_GRAD:
        return _verdict(VerdictCode.ARRIVING_GRAD, e,
                        "the gradient arriving here already differs (loss or an uncaptured "
                        f"op){ev.why}", role=ev.role), None
    p = link.producer
    if link.cause is Cause.CHANGED_AFTER and p.entry.kind == _PARAM_GRAD:
        # the gradient as the parameter's hook saw it agrees; `.grad` as read later does not
        first = _verdict(VerdictCode.GRAD_CHANGED_AFTER_HOOK, e, "", role=Role.PARAM_GRAD)
        first.kind, first.name_a, first.name_b = _PARAM_GRAD, p.entry.name_a, p.entry.name_b
        first.module, first.op, first.direction = p.entry.module, p.entry.op, "backward"
        first.reason = (f"the weight gradient {p.entry.name} agrees as its hook recorded "
                        f"it, but {e.name} reads it changed (its {ev.role} {ev.arg_index} "
                        f"differs{ev.why}): something changed the gradient after it was "
                        "recorded, outside the captured calls - a gradient hook "
                        "registered after start() (it runs after precdbg's), or code that "
                        "writes .grad")
        return first, None
    if link.cause is Cause.CHANGED_AFTER:
        writer = ev.writer            # judge one_run_writer
        if writer is not None:       # a captured call changed it: that call is the culprit
            side = writer.side
            first = _verdict(VerdictCode.ONE_RUN_CALL, e, "", role=ev.role)
            first.kind, first.module, first.op = _API, writer.module, writer.op
            first.name_a = "" if side == "candidate" else writer.name
            first.name_b = writer.name if side == "candidate" else ""
            first.direction = "forward"
            first.reason = (f"only the {side} calls {writer.name}, which writes its "
                            f"input in place: {e.name} reads its {ev.role} {ev.arg_index} "
                            f"changed{ev.why}, while {p.entry.name}, which produced it, "
                            "agrees")
            first.cause = {"code": VerdictCode.ONE_RUN_CALL.value, "step": e.step,
                           "rank": e.rank, "module": first.module, "name_a": first.name_a,
                           "name_b": first.name_b, "text": first.reason}
            return first, None
        return _verdict(VerdictCode.CHANGED_AFTER, e,
                        f"its {ev.role} {ev.arg_index} differs{ev.why} while "
                        f"{p.entry.name}, which produced it, agrees: something not captured "
                        "changed it in between", role=ev.role), None
    who = "baseline" if p.name_a and not p.name_b else (
        "candidate" if p.name_b and not p.name_a else "")
    first = _verdict(VerdictCode.CALLS_DIFFER, e, "", role=ev.role)
    first.kind, first.name_a, first.name_b = p.kind or e.kind, p.name_a, p.name_b
    first.module, first.op = p.module, p.op or e.op
    first.direction = "backward" if e.direction == _BACKWARD else "forward"
    where = f"module '{p.module}'" if p.module else "the root module"
    first.reason = (f"calls differ in {where}: {e.name} reads what "
                    + (f"only the {who} computes ({p.name})" if who else
                       f"each run computes differently (baseline {p.name_a}, candidate "
                       f"{p.name_b})"))
    return first, None


def _link(verdict: Verdict, direction: str, text: str) -> Dict[str, Any]:
    return {"name_a": verdict.name_a, "name_b": verdict.name_b, "step": verdict.step,
            "rank": verdict.rank, "kind": verdict.kind, "direction": direction,
            "module": verdict.module, "text": text}


def chain(links: List[Link], culprit: Optional[Entry], first: Verdict
          ) -> List[Dict[str, Any]]:
    items = [{"name_a": link.entry.name_a, "name_b": link.entry.name_b, "step": link.entry.step,
              "rank": link.entry.rank, "kind": link.entry.kind,
              "direction": link.entry.direction, "module": link.entry.module,
              "text": link.text} for link in links]
    last = links[-1]
    if culprit is not None:
        items[-1]["text"] = (f"{last.entry.name}'s outputs differ while its inputs agree; the "
                              "first record inside it that differs:")
        items.append({"name_a": culprit.name_a, "name_b": culprit.name_b, "step": culprit.step,
                      "rank": culprit.rank, "kind": culprit.kind,
                      "direction": culprit.direction, "module": culprit.module,
                      "text": f"{culprit.name} differs while its inputs agree"})
    elif last.cause is Cause.ONE_RUN:
        p = last.producer
        items.append(_link(first, last.entry.direction,
                           f"{p.name_a or '(nothing)'} in the baseline vs "
                           f"{p.name_b or '(nothing)'} in the candidate: the calls (or the "
                           "module's class) differ between the runs"))
    elif first.code is VerdictCode.ONE_RUN_CALL:
        # a call one run made wrote it in between (root_verdict's `_one_run_writer`)
        items[-1]["text"] = (f"{last.entry.name} reads the output of "
                             f"{last.producer.entry.name}, which agrees, changed in between")
        items.append(_link(first, last.entry.direction, first.reason.split(":")[0]))
    if len(items) > _CHAIN_LIMIT:     # the start, and the links nearest the culprit
        dropped = len(items) - _CHAIN_LIMIT
        items = items[:2] + items[2 + dropped:]
        items[2]["text"] = f"({dropped} links in between) " + items[2]["text"]
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
    if e.trainable_differs:
        reason = "parameter is trainable in one run and frozen in the other"
    elif ev is not None and ev.only_in:
        reason = f"parameter inventory differs: {e.name} (only in the {ev.only_in})"
    elif ev is not None and not ev.shape_ok:
        reason = "parameter shapes differ"
    else:       # judged against its last update where the optimizers agree (multistep.py)
        reason = param_reason(e.step, ev.metrics if ev is not None else {}, previous_matched,
                              setup, others)
    code = VerdictCode.TRAINABLE_DIFFERS if e.trainable_differs else \
        VerdictCode.PARAMETER_INVENTORY if ev is not None and ev.only_in else \
        VerdictCode.PARAMETER_SHAPES if ev is not None and not ev.shape_ok else \
        VerdictCode.UPDATE_DIFFERS if previous_matched else VerdictCode.PARAMETERS_DIFFER
    verdict = _verdict(code, e, reason)
    more = len(bad) - 1
    if more:
        verdict.annotations.append(Annotation.MORE_PARAMETERS)
        verdict.reason += f" ({more} more parameter(s) differ)"
    if code is VerdictCode.PARAMETERS_DIFFER:
        verdict.annotations.append(Annotation.WEIGHTS_ENTERED_APART)
        if (e.step - 1, e.rank) in differed:
            verdict.annotations.append(Annotation.EARLIER_STEP_DIFFERS)
            verdict.reason += (f": the runs entered step {e.step} with different weights, and "
                               f"step {e.step - 1} (rank {e.rank}), which both dumps hold but "
                               "this compare left out, already differs: compare without "
                               "--step to see where")
        elif e.step > 0 and any(step < e.step for step, _ in matched):
            verdict.annotations.append(Annotation.STEP_NOT_COMPARED)
            verdict.reason += (f": the runs entered step {e.step} with different weights, and "
                               f"step {e.step - 1} (rank {e.rank}) was not compared: the "
                               "difference arose in a step that is not in both dumps; dump "
                               "every step from the last one that matched")
        else:
            verdict.annotations.append(Annotation.NOT_DUMPED)
            verdict.reason += (f": the runs entered step {e.step} with different weights (the "
                               "initialisation, the checkpoint, or an earlier step that was "
                               "not dumped); dump from the first training step, or load one "
                               "checkpoint in both")
            if others:     # what an undumped training step would have carried into them
                verdict.reason += ("; set-up differences an earlier training step turns into "
                                   "other weights: " + "; ".join(list(others)[:2]))
    verdict.chain = [{"name_a": e.name_a, "name_b": e.name_b, "step": e.step, "rank": e.rank,
                      "kind": e.kind, "direction": e.direction, "module": e.module,
                      "text": f"{e.name} differs at the start of step {e.step}"}]
    return verdict


def structural_verdict(diff: StructuralDiff, step: StepEntries) -> Tuple[Verdict, List[Entry]]:
    """A module whose class or calls differ, named where it ran."""
    entry = next((e for e in step.entries if e.rank == diff.rank and e.kind == _MODULE
                  and e.direction == Direction.FORWARD and e.name_a == diff.name_a), None)
    code = VerdictCode.LAYER_SETTING if diff.settings and not diff.calls_differ \
        else VerdictCode.STRUCTURE
    first = Verdict(code, diff.step, diff.rank, "forward", _MODULE, diff.name_a, diff.name_b,
                    diff.module, diff.op, reason=diff.reason(), structure=diff.as_json())
    if entry is not None:
        first.evidence = _evidence(entry)
        if entry.outputs_bad:          # the numbers differ too: say how
            first.annotate(Annotation.NUMBERS_DIFFER, _output_reason(entry)[1])
            first.role = entry.outputs_bad[0].role
            first.metrics = dict(entry.outputs_bad[0].metrics)
    first.chain = [{"name_a": diff.name_a, "name_b": diff.name_b, "step": diff.step,
                    "rank": diff.rank, "kind": _MODULE, "direction": Direction.FORWARD,
                    "module": diff.module,
                    "text": f"{diff.name_a} and {diff.name_b} run different code (a "
                            "structural difference)"}]
    return first, [entry] if entry is not None else []


def unfinished_verdict(stop: UnfinishedStep, step: StepEntries) -> Tuple[Verdict, List[Entry]]:
    """One run's step stopped early (judge.unfinished): named where it stopped."""
    other = "baseline" if stop.side == "candidate" else "candidate"
    where = f"module '{stop.module}'" if stop.module else "the root module"
    if stop.other_entry:
        how = (f"{stop.entry} began and did not return (in the {other} it did)")
    else:
        how = "the process ended in it (the step file is marked interrupted)"
    reason = (f"the {stop.side}'s step stopped early, inside {where}: {how}; its last record is "
              f"{stop.last_record}, and {stop.records_after} record(s) of the {other} from "
              "there on have no counterpart (an exception the training script caught before "
              "stop(), or a process that ended): what ran before agrees as far as both got")
    name_a, name_b = (stop.entry, stop.other_entry) if stop.side == "baseline" else \
        (stop.other_entry, stop.entry)
    first = Verdict(VerdictCode.UNFINISHED, stop.step, stop.rank, "forward", _MODULE, name_a,
                    name_b, stop.module, "", reason=reason, unfinished=stop.as_json())
    first.chain = [{"name_a": name_a, "name_b": name_b, "step": stop.step,
                    "rank": stop.rank, "kind": _MODULE, "direction": Direction.FORWARD,
                    "module": stop.module,
                    "text": f"the {stop.side}'s step stopped inside {where}"}]
    return first, []
