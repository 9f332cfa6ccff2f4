"""The words and JSON of a verdict: what the walk of `localize.py` found (its links, and why it
stopped), said as the compare contract's `first_divergence` with its evidence and `chain`; the
parameter inventory's and a structural difference's verdicts."""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import AbstractSet, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ...records.naming import in_place
from ...records.schema import Direction, RecordKind, Role
from ..judge.entries import Entry, StepEntries
from ..judge.multistep import param_reason
from ..judge.rows import Evidence, Producer
from ..judge.structure import StructuralDiff
from ..judge.unfinished import UnfinishedStep
from .step_causes import ENTERED_APART

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


def _output_reason(entry: Entry) -> str:
    if entry.args_bad:
        args = "; ".join(f"argument {a.key!r}: {a.a!r} vs {a.b!r}" for a in entry.args_bad[:3])
        if not entry.outputs_bad:
            return f"a non-tensor argument differs ({args})"
        ev = entry.outputs_bad[0]
        return (f"its tensor inputs agree but a non-tensor argument differs ({args}); its "
                f"{ev.role} {ev.arg_index} differs{ev.why}")
    ev = entry.outputs_bad[0]
    what = _OUTPUT_WORDS.get(ev.role, ev.role)
    if entry.inputs_ok and ev.metrics.get("tol") == 0.0 and entry.inputs_ok_err > 0.0:
        # exact values (indices, counts, a mask) from inputs that are close but not equal
        return (f"its inputs agree within tolerance (largest relative error "
                f"{entry.inputs_ok_err:.3g}) but its {what} {ev.arg_index}, exact values "
                f"(indices, counts, a mask), differs{ev.why}: a near tie decided by rounding "
                "(a top-k or argmax choosing between almost equal values), expected where the "
                "runs' precisions or kernels differ; the runs take different paths from here")
    if entry.inputs_ok:
        return f"its inputs agree but its {what} {ev.arg_index} differs{ev.why}"
    return f"its {what} {ev.arg_index} differs{ev.why} (it has no compared inputs)"


def _verdict(entry: Entry, reason: str, role: Optional[str] = None) -> Dict[str, Any]:
    evidence: Any = entry.outputs_bad[0] if entry.outputs_bad else (
        entry.inputs_bad[0] if entry.inputs_bad else (entry.args_bad or [None])[0])
    return {"step": entry.step, "rank": entry.rank,
            "direction": "backward" if entry.direction == _BACKWARD else "forward",
            "kind": entry.kind, "name_a": entry.name_a, "name_b": entry.name_b,
            "module": entry.module, "op": entry.op,
            "role": role or (evidence.role if evidence is not None else ""),
            "metrics": getattr(evidence, "metrics", {}), "reason": reason,
            "evidence": {"inputs_bad": [x.as_json() for x in entry.inputs_bad[:4]],
                         "outputs_bad": [x.as_json() for x in entry.outputs_bad[:4]],
                         "arguments_bad": [x.as_json() for x in entry.args_bad[:4]],
                         "inputs_agreeing": entry.inputs_ok}}


def _candidate_reason(culprit: Entry, step: StepEntries) -> str:
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
            return (f"the first backward record that differs is the weight gradient of "
                    f"{culprit.name}{more_text}{zero_text}; the forward agrees")
        return ("dw-only difference: forward and dx agree, the weight gradient of "
                f"{culprit.name} does not" + more_text + zero_text)
    if culprit.direction == _BACKWARD:
        zero = _all_zero_side(culprit)
        return ("backward-only difference: the forward agrees; " + _output_reason(culprit)
                + (f"; it is all zero in the {zero}" if zero else ""))
    return _output_reason(culprit)


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
                              ) -> str:
    where = f"module '{holder.module}'" if holder.module else "the root module"
    read = "the gradient arriving at" if e.direction == _BACKWARD else "a value read by"
    side = "its dy agrees but its dx does not" if e.direction == _BACKWARD else \
        "its inputs agree but its outputs do not"
    head = (f"{'backward-only difference: ' if e.direction == _BACKWARD else ''}{side}; "
            f"inside it, {read} {e.name} already differs and no captured call produced it: ")
    if not any(x.kind == _API for x in step.entries if x.rank == e.rank):
        return (head + f"an API call inside {where} computes it, and these dumps hold module "
                f"calls only (level module): dump level mix to name that call{ev.why}")
    return (head + f"a call inside {where} that precdbg does not capture computes it (a "
            f"custom autograd Function, a C++/CUDA extension op, compiled code){ev.why}")


def _one_run_writer(e: Entry, one_run: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """A call only one run made, in `e`'s step and rank, within `e`'s module (or around it),
    that writes its input in place: what changed a tensor between the call that produced it
    (which agrees) and `e`, which reads it changed."""
    for u in one_run:
        name = str(u["name"])
        parts = name.split(".")
        if u["step"] != e.step or u["rank"] != e.rank or u["kind"] != _API \
                or not name.endswith(".forward") or len(parts) < 3 or not in_place(parts[-3]):
            continue
        module = str(u["module"])
        if module == "" or e.module == module or e.module.startswith(module + ".") or \
                module.startswith(e.module + "."):
            return u
    return None


def root_verdict(link: Link, step: StepEntries, one_run: Sequence[Dict[str, Any]] = ()
                 ) -> Tuple[Dict[str, Any], Optional[Entry]]:
    """The verdict at the end of the walk, and the culprit entry when it is not the last link's
    (a module's innermost call). `one_run`: calls only one run made (records without
    counterpart), which may have changed what a call read."""
    e, ev = link.entry, link.evidence
    if link.cause is Cause.CANDIDATE:
        culprit = _innermost(e, step.timeline(e.rank))
        verdict = _verdict(culprit, _candidate_reason(culprit, step))
        zero = _all_zero_side(culprit) if culprit.direction == _BACKWARD else ""
        if zero:
            verdict["evidence"]["all_zero_in"] = zero
        return verdict, (culprit if culprit is not e else None)
    if link.cause in (Cause.INPUT_DATA, Cause.ARRIVING_GRAD):
        holder = _enclosing_agreeing_module(e, step)
        if holder is not None:
            return _verdict(holder, _uncaptured_inside_reason(holder, e, ev, step)), None
    if link.cause is Cause.INPUT_DATA:
        return _verdict(e, f"input data differs: its {ev.role} {ev.arg_index} was produced by "
                        f"nothing captured in the step (the batch, RNG, the data loader) and "
                        f"already disagrees{ev.why}", role=ev.role), None
    if link.cause is Cause.ARRIVING_GRAD:
        return _verdict(e, "the gradient arriving here already differs (loss or an uncaptured "
                        f"op){ev.why}", role=ev.role), None
    p = link.producer
    if link.cause is Cause.CHANGED_AFTER and p.entry.kind == _PARAM_GRAD:
        # the gradient as the parameter's hook saw it agrees; `.grad` as read later does not
        first = _verdict(e, "", role=Role.PARAM_GRAD)
        first.update(kind=_PARAM_GRAD, name_a=p.entry.name_a, name_b=p.entry.name_b,
                     module=p.entry.module, op=p.entry.op, direction="backward")
        first["reason"] = (f"the weight gradient {p.entry.name} agrees as its hook recorded "
                           f"it, but {e.name} reads it changed (its {ev.role} {ev.arg_index} "
                           f"differs{ev.why}): something changed the gradient after it was "
                           "recorded, outside the captured calls - a gradient hook "
                           "registered after start() (it runs after precdbg's), or code that "
                           "writes .grad")
        return first, None
    if link.cause is Cause.CHANGED_AFTER:
        writer = _one_run_writer(e, one_run)
        if writer is not None:       # a captured call changed it: that call is the culprit
            side = "candidate" if writer["side"] == "b" else "baseline"
            first = _verdict(e, "", role=ev.role)
            first.update(kind=_API, module=str(writer["module"]), op=str(writer["op"]),
                         name_a="" if side == "candidate" else str(writer["name"]),
                         name_b=str(writer["name"]) if side == "candidate" else "",
                         direction="forward")
            first["reason"] = (f"only the {side} calls {writer['name']}, which writes its "
                               f"input in place: {e.name} reads its {ev.role} {ev.arg_index} "
                               f"changed{ev.why}, while {p.entry.name}, which produced it, "
                               "agrees")
            first["cause"] = {"code": "one_run_call", "step": e.step, "rank": e.rank,
                              "module": str(writer["module"]), "name_a": first["name_a"],
                              "name_b": first["name_b"], "text": first["reason"]}
            return first, None
        return _verdict(e, f"its {ev.role} {ev.arg_index} differs{ev.why} while "
                        f"{p.entry.name}, which produced it, agrees: something not captured "
                        "changed it in between", role=ev.role), None
    who = "baseline" if p.name_a and not p.name_b else (
        "candidate" if p.name_b and not p.name_a else "")
    first = _verdict(e, "", role=ev.role)
    first.update(kind=p.kind or e.kind, name_a=p.name_a, name_b=p.name_b, module=p.module,
                 op=p.op or e.op, direction="backward" if e.direction == _BACKWARD else "forward")
    where = f"module '{p.module}'" if p.module else "the root module"
    first["reason"] = (f"calls differ in {where}: {e.name} reads what "
                       + (f"only the {who} computes ({p.name})" if who else
                          f"each run computes differently (baseline {p.name_a}, candidate "
                          f"{p.name_b})"))
    return first, None


def chain(links: List[Link], culprit: Optional[Entry], first: Dict[str, Any]
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
        items.append({"name_a": first["name_a"], "name_b": first["name_b"],
                      "step": first["step"], "rank": first["rank"], "kind": first["kind"],
                      "direction": last.entry.direction, "module": first["module"],
                      "text": f"{p.name_a or '(nothing)'} in the baseline vs "
                              f"{p.name_b or '(nothing)'} in the candidate: the calls (or the "
                              "module's class) differ between the runs"})
    elif last.cause is Cause.CHANGED_AFTER and first.get("cause"):
        # a call one run made wrote it in between (root_verdict's `_one_run_writer`)
        items[-1]["text"] = (f"{last.entry.name} reads the output of "
                             f"{last.producer.entry.name}, which agrees, changed in between")
        items.append({"name_a": first["name_a"], "name_b": first["name_b"],
                      "step": first["step"], "rank": first["rank"], "kind": first["kind"],
                      "direction": last.entry.direction, "module": first["module"],
                      "text": first["cause"]["text"].split(":")[0]})
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
                      ) -> Optional[Dict[str, Any]]:
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
    more = len(bad) - 1
    if more:
        reason += f" ({more} more parameter(s) differ)"
    entered_apart = not previous_matched and not e.trainable_differs and \
        (ev is None or (not ev.only_in and ev.shape_ok))
    if entered_apart:
        if (e.step - 1, e.rank) in differed:
            reason += (f": the runs entered step {e.step} with different weights, and step "
                       f"{e.step - 1} (rank {e.rank}), which both dumps hold but this compare "
                       "left out, already differs: compare without --step to see where")
        elif e.step > 0 and any(step < e.step for step, _ in matched):
            reason += (f": the runs entered step {e.step} with different weights, and step "
                       f"{e.step - 1} (rank {e.rank}) was not compared: the difference arose "
                       "in a step that is not in both dumps; dump every step from the last "
                       "one that matched")
        else:
            reason += (f": the runs entered step {e.step} with different weights (the "
                       "initialisation, the checkpoint, or an earlier step that was not "
                       "dumped); dump from the first training step, or load one checkpoint "
                       "in both")
            if others:     # what an undumped training step would have carried into them
                reason += ("; set-up differences an earlier training step turns into other "
                           "weights: " + "; ".join(list(others)[:2]))
    verdict = _verdict(e, reason)
    verdict["chain"] = [{"name_a": e.name_a, "name_b": e.name_b, "step": e.step, "rank": e.rank,
                         "kind": e.kind, "direction": e.direction, "module": e.module,
                         "text": f"{e.name} differs at the start of step {e.step}"}]
    if entered_apart:
        verdict["annotations"] = [ENTERED_APART]
    return verdict


def structural_verdict(diff: StructuralDiff, step: StepEntries) -> Tuple[Dict[str, Any],
                                                                          List[Entry]]:
    """A module whose class or calls differ, named where it ran."""
    entry = next((e for e in step.entries if e.rank == diff.rank and e.kind == _MODULE
                  and e.direction == Direction.FORWARD and e.name_a == diff.name_a), None)
    first = {"step": diff.step, "rank": diff.rank, "direction": "forward", "kind": _MODULE,
             "name_a": diff.name_a, "name_b": diff.name_b, "module": diff.module, "op": diff.op,
             "role": "", "metrics": {}, "reason": diff.reason(),
             "evidence": {"inputs_bad": [], "outputs_bad": [], "arguments_bad": [],
                          "inputs_agreeing": 0},
             "structure": diff.as_json()}
    if entry is not None:
        first["evidence"] = _verdict(entry, "")["evidence"]
        if entry.outputs_bad:          # the numbers differ too: say how
            first["reason"] += "; " + _output_reason(entry)
            first["role"] = entry.outputs_bad[0].role
            first["metrics"] = entry.outputs_bad[0].metrics
    first["chain"] = [{"name_a": diff.name_a, "name_b": diff.name_b, "step": diff.step,
                       "rank": diff.rank, "kind": _MODULE, "direction": Direction.FORWARD,
                       "module": diff.module,
                       "text": f"{diff.name_a} and {diff.name_b} run different code (a "
                               "structural difference)"}]
    return first, [entry] if entry is not None else []


def unfinished_verdict(stop: UnfinishedStep, step: StepEntries
                       ) -> Tuple[Dict[str, Any], List[Entry]]:
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
    first = {"step": stop.step, "rank": stop.rank, "direction": "forward", "kind": _MODULE,
             "name_a": name_a, "name_b": name_b, "module": stop.module, "op": "",
             "role": "", "metrics": {}, "reason": reason,
             "evidence": {"inputs_bad": [], "outputs_bad": [], "arguments_bad": [],
                          "inputs_agreeing": 0},
             "unfinished": stop.as_json()}
    first["chain"] = [{"name_a": name_a, "name_b": name_b, "step": stop.step,
                       "rank": stop.rank, "kind": _MODULE, "direction": Direction.FORWARD,
                       "module": stop.module,
                       "text": f"the {stop.side}'s step stopped inside {where}"}]
    return first, []
