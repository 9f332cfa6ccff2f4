"""Name the first divergence: the earliest producer whose own inputs agree and whose outputs do not.

A step is a dataflow. Each record that reads a tensor knows the record of the step that produced
it (`producer`, recorded at dump time), so a divergence is traced back, not guessed from order:

1. Per step, the parameter inventory first (values at start).
2. Then each rank's timeline, the records in the order they ran (forward, backward as the
   gradients appeared, dw, then what ran after backward: clipping, norms, collectives, the
   optimizer). The walk starts at the entry of the first record that differs (lowest rank
   first).
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

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..naming import is_collective
from ..schema import Direction, RecordKind, Role
from .multistep import param_reason
from .rows import ArgDiff, Evidence, Producer, Source
from .structure import StructuralDiff

__all__ = ["Entry", "StepEntries", "locate", "contains"]

_BACKWARD, _NONE = Direction.BACKWARD.value, Direction.NONE.value
_MODULE, _PARAM_GRAD = RecordKind.MODULE.value, RecordKind.PARAM_GRAD.value
_OUTPUT_WORDS = {Role.OUTPUT.value: "output", Role.GRAD_INPUT.value: "gradient for input (dx)",
                 Role.PARAM_GRAD.value: "weight gradient (dw)"}
_CHAIN_LIMIT = 12


@dataclasses.dataclass(eq=False)
class Entry:
    """One entry (a call of an API or module, a parameter) of one step and rank, with what of
    it differs between the runs."""
    step: int
    rank: int
    direction: str
    kind: str
    name_a: str
    name_b: str
    module: str
    op: str
    order: int
    seq: int                       # position in the step's timeline (first record emitted)
    first_bad: int = 1 << 62       # when it was first seen to differ (its first differing record)
    inputs_bad: List[Evidence] = dataclasses.field(default_factory=list)
    outputs_bad: List[Evidence] = dataclasses.field(default_factory=list)
    args_bad: List[ArgDiff] = dataclasses.field(default_factory=list)
    inputs_ok: int = 0
    outputs_ok: int = 0
    inputs_ok_err: float = 0.0     # the largest relative error among the agreeing inputs
    trainable_differs: bool = False

    @property
    def name(self) -> str:
        return self.name_a or self.name_b

    @property
    def diverged(self) -> bool:
        return bool(self.inputs_bad or self.outputs_bad or self.args_bad)

    @property
    def is_candidate(self) -> bool:
        """Tensor inputs agree (or there are none); outputs, or a non-tensor argument, do not."""
        return bool(self.outputs_bad or self.args_bad) and not self.inputs_bad

    @property
    def is_inventory(self) -> bool:
        return self.direction == _NONE


@dataclasses.dataclass
class StepEntries:
    """Every entry of one step, all ranks."""
    step: int
    entries: List[Entry]

    def __post_init__(self) -> None:
        self._ranks = sorted({e.rank for e in self.entries})
        self._forward = {(e.rank, e.kind, e.order): e for e in self.entries
                         if e.direction == Direction.FORWARD.value and e.order > 0}

    def forward_of(self, entry: Entry) -> Optional[Entry]:
        """The forward call whose backward `entry` is (its saved tensors feed the backward)."""
        return self._forward.get((entry.rank, entry.kind, entry.order)) \
            if entry.direction == _BACKWARD else None

    def ranks(self) -> List[int]:
        return self._ranks

    def timeline(self, rank: int) -> List[Entry]:
        return sorted((e for e in self.entries if e.rank == rank and not e.is_inventory),
                      key=lambda e: e.seq)

    def counterparts(self, entry: Entry) -> List[Entry]:
        """The same entry on the other ranks, lowest rank first."""
        return sorted((e for e in self.entries if e.rank != entry.rank
                       and e.direction == entry.direction and e.name_a == entry.name_a),
                      key=lambda e: e.rank)


class Cause(str, enum.Enum):
    """Why the walk stopped where it did."""
    CANDIDATE = "candidate"            # inputs agree, outputs differ
    INPUT_DATA = "input_data"          # a forward read of a tensor nothing captured produced
    ARRIVING_GRAD = "arriving_grad"    # a backward read of a gradient nothing captured produced
    CHANGED_AFTER = "changed_after"    # the producer agrees, what was read does not
    ONE_RUN = "one_run"                # the producer is in one run only


@dataclasses.dataclass
class _Step:
    """One link of the walk: `entry`, and what it leads to."""
    entry: Entry
    text: str
    cause: Optional[Cause] = None      # set on the last link
    producer: Optional[Producer] = None
    evidence: Optional[Evidence] = None


def _explain(e: Entry, step: StepEntries) -> Tuple[Optional[Entry], _Step]:
    """(the entry this one's difference comes from, or None at the culprit; this link)."""
    several = len(step.ranks()) > 1

    def _where(x: Entry, other: Optional[Entry] = None) -> str:
        return f" on rank {x.rank}" if several and (other is None or x.rank != other.rank) \
            else ""
    fwd = step.forward_of(e)
    if fwd is not None and fwd.diverged:       # forward ran first: its difference comes first
        return fwd, _Step(e, f"{e.name}{_where(e)} differentiates {fwd.name}, whose forward "
                          "already differs")
    if e.kind == _PARAM_GRAD:                   # a dw that is a dx passed on unchanged
        src = next((ev.producer.entry for ev in e.outputs_bad if ev.producer is not None
                    and ev.producer.entry is not None and ev.producer.entry is not e
                    and ev.producer.entry.diverged), None)
        if src is not None:
            return src, _Step(e, f"{e.name}{_where(e)} is the gradient {src.name} produced, "
                              "which differs")
    if e.inputs_bad:
        ranked = sorted(e.inputs_bad, key=lambda ev: (ev.producer.entry.seq if ev.producer and
                                                      ev.producer.entry else 1 << 62))
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ENTRY and p.entry is not e \
                    and p.entry.diverged:
                return p.entry, _Step(e, f"{e.name}{_where(e)} reads the output of "
                                      f"{p.entry.name}{_where(p.entry, e)}, which differs")
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ONE_RUN:
                how = "the runs compute with different calls" if p.name_a and p.name_b else \
                    f"only the {'baseline' if p.name_a else 'candidate'} computes"
                return None, _Step(e, f"{e.name}{_where(e)} reads the output of {p.name}, which "
                                   f"{how}", Cause.ONE_RUN, p, ev)
        for ev in ranked:
            p = ev.producer
            earlier = next((w for w in ev.same_memory if w is not e and
                            (p is None or w is not p.entry)), None)
            if earlier is not None:   # a buffer shared by several tensors (a gradient bucket)
                return earlier, _Step(e, f"{e.name}{_where(e)} reads memory that "
                                      f"{earlier.name} wrote earlier, which differs")
        for ev in ranked:
            p = ev.producer
            if p is not None and p.source is Source.ENTRY and p.entry is not e:
                other = next((c for c in step.counterparts(p.entry) if c.diverged), None)
                if other is not None:
                    return other, _Step(e, f"{e.name}{_where(e)} reads {p.entry.name}, which "
                                        f"agrees on rank {e.rank} but was changed after it by a "
                                        f"collective across ranks; on rank {other.rank} it "
                                        "differs")
                return None, _Step(e, f"{e.name}{_where(e)} reads the output of {p.entry.name}, "
                                   "which agrees; something not captured changed it in between",
                                   Cause.CHANGED_AFTER, p, ev)
        ev = ranked[0]
        if ev.role == Role.GRAD_OUTPUT.value:
            return None, _Step(e, f"the gradient arriving at {e.name}{_where(e)} differs and no "
                               "captured call produced it", Cause.ARRIVING_GRAD, None, ev)
        return None, _Step(e, f"{e.name}{_where(e)} reads input data that differs (nothing "
                           "captured in the step produced it)", Cause.INPUT_DATA, None, ev)
    if is_collective(e.op) and e.outputs_bad:
        other = next((c for c in step.counterparts(e) if c.inputs_bad), None)
        if other is not None:
            return other, _Step(e, f"{e.name} is a collective: its inputs agree on rank "
                                f"{e.rank}, its output differs because rank {other.rank}'s "
                                "input differs")
    return None, _Step(e, f"{e.name}{_where(e)} differs while its inputs agree", Cause.CANDIDATE)


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


def _walk(start: Entry, step: StepEntries) -> List[_Step]:
    links: List[_Step] = []
    seen = set()
    entry: Optional[Entry] = start
    while entry is not None and id(entry) not in seen:
        seen.add(id(entry))
        entry, link = _explain(entry, step)
        links.append(link)
    if links[-1].cause is None:        # a cycle (cannot happen in a dataflow): stop here
        links[-1].cause = Cause.CANDIDATE
    return links


# --------------------------------------------------------------------------- verdicts
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
        return ("dw-only difference: forward and dx agree, the weight gradient of "
                f"{culprit.name} does not" + (f" ({more} more)" if more else ""))
    if culprit.direction == _BACKWARD:
        return "backward-only difference: the forward agrees; " + _output_reason(culprit)
    return _output_reason(culprit)


def _enclosing_agreeing_module(e: Entry, step: StepEntries) -> Optional[Entry]:
    """The innermost module call holding `e`, in the same direction, whose own inputs (dy in
    backward) were compared and agree while its outputs (dx) differ: what `e` reads, which
    nothing captured produced, was then computed inside that module."""
    holders = [m for m in step.entries if m.kind == _MODULE and m.rank == e.rank
               and m.direction == e.direction and m is not e and m.inputs_ok
               and not m.inputs_bad and m.outputs_bad and _descends(e, m)]
    return max(holders, key=lambda m: (m.module.count(".") if m.module else -1, m.order),
               default=None)


def _uncaptured_inside_reason(holder: Entry, e: Entry, ev: Evidence) -> str:
    where = f"module '{holder.module}'" if holder.module else "the root module"
    read = "the gradient arriving at" if e.direction == _BACKWARD else "a value read by"
    side = "its dy agrees but its dx does not" if e.direction == _BACKWARD else \
        "its inputs agree but its outputs do not"
    return (f"{'backward-only difference: ' if e.direction == _BACKWARD else ''}{side}; "
            f"inside it, {read} {e.name} already differs and no captured call produced it: a "
            f"call inside {where} that precdbg does not capture computes it (a custom autograd "
            f"Function, a C++/CUDA extension op, compiled code){ev.why}")


def _root_verdict(link: _Step, step: StepEntries) -> Tuple[Dict[str, Any], Optional[Entry]]:
    """The verdict at the end of the walk, and the culprit entry when it is not the last link's
    (a module's innermost call)."""
    e, ev = link.entry, link.evidence
    if link.cause is Cause.CANDIDATE:
        culprit = _innermost(e, step.timeline(e.rank))
        return _verdict(culprit, _candidate_reason(culprit, step)), \
            (culprit if culprit is not e else None)
    if link.cause in (Cause.INPUT_DATA, Cause.ARRIVING_GRAD):
        holder = _enclosing_agreeing_module(e, step)
        if holder is not None:
            return _verdict(holder, _uncaptured_inside_reason(holder, e, ev)), None
    if link.cause is Cause.INPUT_DATA:
        return _verdict(e, f"input data differs: its {ev.role} {ev.arg_index} was produced by "
                        f"nothing captured in the step (the batch, RNG, the data loader) and "
                        f"already disagrees{ev.why}", role=ev.role), None
    if link.cause is Cause.ARRIVING_GRAD:
        return _verdict(e, "the gradient arriving here already differs (loss or an uncaptured "
                        f"op){ev.why}", role=ev.role), None
    p = link.producer
    if link.cause is Cause.CHANGED_AFTER:
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


def _chain(links: List[_Step], culprit: Optional[Entry], first: Dict[str, Any]
           ) -> List[Dict[str, Any]]:
    items = [{"name_a": link.entry.name_a, "name_b": link.entry.name_b, "step": link.entry.step,
              "rank": link.entry.rank, "kind": link.entry.kind,
              "direction": link.entry.direction, "module": link.entry.module,
              "text": link.text} for link in links]
    last = links[-1]
    if culprit is not None:
        items[-1]["text"] = f"{last.entry.name}'s outputs differ while its inputs agree; inside it"
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
    if len(items) > _CHAIN_LIMIT:     # the start, and the links nearest the culprit
        dropped = len(items) - _CHAIN_LIMIT
        items = items[:2] + items[2 + dropped:]
        items[2]["text"] = f"({dropped} links in between) " + items[2]["text"]
    return items


# --------------------------------------------------------------------------- inventory
def _inventory(entries: List[Entry], previous_matched: bool, setup: Sequence[str]
               ) -> Optional[Dict[str, Any]]:
    bad = [e for e in entries if e.diverged or e.trainable_differs]
    if not bad:
        return None
    e = min(bad, key=lambda x: (x.seq, x.rank))
    ev = e.outputs_bad[0] if e.outputs_bad else None
    if e.trainable_differs:
        reason = "parameter is trainable in one run and frozen in the other"
    elif ev is not None and ev.only_in:
        reason = f"parameter inventory differs: {e.name} (only in the {ev.only_in})"
    elif ev is not None and not ev.shape_ok:
        reason = "parameter shapes differ"
    else:       # judged against its last update where the optimizers agree (multistep.py)
        reason = param_reason(e.step, ev.metrics if ev is not None else {}, previous_matched,
                              setup)
    others = len(bad) - 1
    if others:
        reason += f" ({others} more parameter(s) differ)"
    if not previous_matched and not e.trainable_differs and \
            (ev is None or (not ev.only_in and ev.shape_ok)):
        reason += (f": the runs entered step {e.step} with different weights (the "
                   "initialisation, the checkpoint, or an earlier step that was not dumped); "
                   "dump from the first training step, or load one checkpoint in both")
    verdict = _verdict(e, reason)
    verdict["chain"] = [{"name_a": e.name_a, "name_b": e.name_b, "step": e.step, "rank": e.rank,
                         "kind": e.kind, "direction": e.direction, "module": e.module,
                         "text": f"{e.name} differs at the start of step {e.step}"}]
    return verdict


def _structural_verdict(diff: StructuralDiff, step: StepEntries) -> Tuple[Dict[str, Any],
                                                                          List[Entry]]:
    """A module whose class or calls differ, named where it ran."""
    entry = next((e for e in step.entries if e.rank == diff.rank and e.kind == _MODULE
                  and e.direction == Direction.FORWARD.value and e.name_a == diff.name_a), None)
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
                       "rank": diff.rank, "kind": _MODULE, "direction": Direction.FORWARD.value,
                       "module": diff.module,
                       "text": f"{diff.name_a} and {diff.name_b} run different code (a "
                               "structural difference)"}]
    return first, [entry] if entry is not None else []


def locate(steps: List[StepEntries], setup: Sequence[str] = (),
           structural: Sequence[StructuralDiff] = ()
           ) -> Tuple[Optional[Dict[str, Any]], List[Entry]]:
    """`steps` ascending; `setup`: the optimizer set-up differences `check` found. Returns the
    first divergence (None when the runs agree) and the entries of its chain (whatever else
    differs is a consequence). A structural difference (`structural`, see compare/structure.py)
    is named when it ran before the first record that differs in number."""
    previous_matched = False
    for step in steps:
        found = _inventory([e for e in step.entries if e.is_inventory], previous_matched,
                           setup)
        if found:
            return found, []
        shapes = [d for d in structural if d.step == step.step]
        for rank in sorted(set(step.ranks()) | {d.rank for d in shapes}):
            bad = [e for e in step.timeline(rank) if e.diverged]
            shape = min((d for d in shapes if d.rank == rank), key=lambda d: d.seq,
                        default=None)
            start = min(bad, key=lambda e: e.first_bad) if bad else None
            numeric = _numeric_verdict(start, step) if start is not None else None
            if shape is not None and (start is None or shape.seq <= start.first_bad):
                if numeric is not None and shape.settings and not shape.calls_differ \
                        and _within(numeric[0]["module"], shape.module):
                    # a layer setting (eps, approximate) decides the call the numbers name
                    # inside that module: name the call, with the setting
                    first = numeric[0]
                    first["reason"] += (f"; module '{shape.module}' is constructed with other "
                                        "settings: " + shape.settings_text())
                    first["structure"] = shape.as_json()
                    return numeric
                return _structural_verdict(shape, step)
            if numeric is not None:
                return numeric
        previous_matched = True
    return None, []


def _within(module: str, outer: str) -> bool:
    return outer == "" or module == outer or module.startswith(outer + ".")


def _numeric_verdict(start: Entry, step: StepEntries
                     ) -> Tuple[Dict[str, Any], List[Entry]]:
    links = _walk(start, step)
    first, culprit = _root_verdict(links[-1], step)
    first["chain"] = _chain(links, culprit, first)
    involved = [link.entry for link in links] + ([culprit] if culprit else [])
    return first, involved


def contains(e: Entry, first: Dict[str, Any]) -> bool:
    """A module that encloses the culprit diverges because of it, not after it."""
    if e.kind != _MODULE or e.step != first["step"] or e.direction not in (
            first["direction"], ) or e.rank != first["rank"]:
        return False
    return e.module == "" or first["module"] == e.module or \
        first["module"].startswith(e.module + ".")
