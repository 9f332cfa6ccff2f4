"""The cause a step shows when its weights already differ at its start.

The guides dump one iteration, and it is usually not the first: when iteration 0 already ran
apart, the parameters differ at the dumped step's start and the earliest differing parameter was
the headline, while what differs in the code that ran (a layer's eps, another activation, a
call only one run makes, an optimizer setting of that step) was left to the notes. Measured on
ten pairs of transformers/timm models dumped at iteration 1 only: the cause was the headline once,
and somewhere in the text all ten times.

`step_causes` lists what the step itself shows to differ, ranked: a layer setting, a structural
difference (class or calls of a module), a weight gradient that differs far beyond what its
module read (judge `dw_beyond_inputs`: the vendor guide's GLM4 case, a custom autograd.Function
computing dw otherwise, dumped at iteration 1), a call one run makes and the other does not (one
that writes a tensor in place first), an optimizer setting of that step. The parameter difference is
the evidence. The earliest parameter difference stays the headline only when the step shows
none of these.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Sequence

from ...records.naming import in_place
from ...records.schema import Direction, RecordKind
from ..judge.dw_beyond_inputs import gradients_beyond_inputs
from ..judge.entries import Entry, StepEntries
from ..judge.structure import StructuralDiff
from .verdict import FACTS, Annotation, LinkCode, Verdict, VerdictCode

__all__ = ["CauseCode", "StepCause", "step_causes", "cause_verdict", "ENTERED_APART"]

ENTERED_APART = Annotation.WEIGHTS_ENTERED_APART  # the annotation of an inventory verdict
_SHOWN = 5


class CauseCode(str, enum.Enum):
    """What a step shows to differ, most telling first."""
    LAYER_SETTING = "layer_setting"
    STRUCTURE = "structure"
    WEIGHT_GRADIENT = "weight_gradient"
    ONE_RUN_CALL = "one_run_call"
    OPTIMIZER_SETTING = "optimizer_setting"


@dataclasses.dataclass
class StepCause:
    code: CauseCode
    step: int
    rank: int
    module: str
    name_a: str
    name_b: str
    facts: Dict[str, Any]      # what its words need (report/wording.py `cause_text`)
    structural: Optional[StructuralDiff] = None
    entry: Optional[Entry] = None      # a weight gradient's entry (WEIGHT_GRADIENT)

    def as_json(self) -> Dict[str, Any]:
        """"text" is written by report/wording.py from FACTS."""
        return {"code": self.code.value, "step": self.step, "rank": self.rank,
                "module": self.module, "name_a": self.name_a, "name_b": self.name_b,
                "text": "", FACTS: self.facts}


def _inside(module: str, outer: str) -> bool:
    return outer == "" or module == outer or module.startswith(outer + ".")


def step_causes(step: int, rank: int, structural: Sequence[StructuralDiff],
                one_run_calls: Sequence[Dict[str, Any]], optimizer: Sequence[str],
                entries: Optional[StepEntries] = None) -> List[StepCause]:
    """What step `step` on `rank` shows to differ (see the module's text), ranked.
    `one_run_calls`: the records without counterpart of that step and rank (the compare's
    `unmatched` items); `optimizer`: the optimizer set-up differences of the settings that step
    used; `entries`: the step's compared entries (its weight gradients are judged)."""
    causes: List[StepCause] = []
    shapes = [d for d in structural if d.step == step and d.rank == rank]
    for d in shapes:
        # a setting of a module of the same class decides the calls it makes too (a dropout
        # of p 0 makes no call that changes a number): a layer setting, calls or not
        code = CauseCode.LAYER_SETTING if d.settings and not d.class_differs \
            else CauseCode.STRUCTURE
        causes.append(StepCause(code, step, rank, d.module, d.name_a, d.name_b,
                                {"diff": d.facts()}, d))
    for found in gradients_beyond_inputs(entries, rank) if entries is not None else ():
        causes.append(StepCause(CauseCode.WEIGHT_GRADIENT, step, rank, found.entry.module,
                                found.entry.name_a, found.entry.name_b,
                                {"gradient": found.facts()}, entry=found.entry))
    seen = set()
    calls = []
    for u in one_run_calls:
        if u["step"] != step or u["rank"] != rank or u["kind"] != RecordKind.API \
                or not str(u["name"]).endswith("." + Direction.FORWARD.value):
            continue
        if any(_inside(str(u["module"]), d.module) and d.calls_differ for d in shapes):
            continue           # a call of a module whose calls differ: that difference's
        key = (u["side"], u["name"])
        if key in seen:
            continue
        seen.add(key)
        calls.append(u)
    # calls that write a tensor in place first (what changes a tensor the other run reads)
    calls.sort(key=lambda u: not in_place(_api_of(str(u["name"]))))
    for u in calls:
        side = "candidate" if u["side"] == "b" else "baseline"
        writes = in_place(_api_of(str(u["name"])))
        facts = {"side": side, "name": u["name"], "module": u["module"], "writes": writes}
        name_a, name_b = ("", u["name"]) if u["side"] == "b" else (u["name"], "")
        causes.append(StepCause(CauseCode.ONE_RUN_CALL, step, rank, str(u["module"]), name_a,
                                name_b, facts))
    for message in optimizer:
        causes.append(StepCause(CauseCode.OPTIMIZER_SETTING, step, rank, "", "", "",
                                {"step": step, "message": message}))
    return causes


def _api_of(entry: str) -> str:
    """`Tensor.__setitem__.0.forward` -> `__setitem__` (the entry's API name)."""
    parts = entry.split(".")
    return parts[-3] if len(parts) >= 3 else entry


def cause_verdict(causes: List[StepCause], parameter: Verdict, step: StepEntries) -> Verdict:
    """The verdict of a step whose weights entered apart, headed by its most telling cause;
    `parameter` (the inventory verdict) is the evidence."""
    from .verdicts import gradient_verdict, structural_verdict
    top = causes[0]
    # the words (report/wording.py) add the parameter's: which earlier step to dump (or
    # compare) to confirm it
    weights = {"step": top.step, "name_a": parameter.name_a, "parameter": parameter}
    if top.structural is not None:
        first, _ = structural_verdict(top.structural, step)
    elif top.entry is not None:
        first = gradient_verdict(top.entry, top.facts["gradient"], step)
    else:
        kind = RecordKind.API if top.code == CauseCode.ONE_RUN_CALL else RecordKind.PARAM
        first = Verdict(VerdictCode(top.code.value), top.step, top.rank, "forward", kind,
                        top.name_a or (parameter.name_a if kind == RecordKind.PARAM else ""),
                        top.name_b or (parameter.name_b if kind == RecordKind.PARAM else ""),
                        top.module, "", facts={"form": "cause", "cause": top.facts})
        first.chain = [{"name_a": first.name_a, "name_b": first.name_b, "step": top.step,
                        "rank": top.rank, "kind": kind, "direction": Direction.FORWARD,
                        "module": top.module, "text": "", "code": LinkCode.CAUSE.value,
                        FACTS: {"cause": top.facts}}]
    first.facts["weights"] = weights
    first.cause = top.as_json()
    first.candidates = [c.as_json() for c in causes[:_SHOWN]]
    first.parameters = {"name_a": parameter.name_a, "name_b": parameter.name_b,
                        "code": parameter.code.value, "metrics": parameter.metrics,
                        "reason": ""}     # written by report/wording.py
    for note in parameter.annotations:      # what to dump to confirm it
        if note not in first.annotations:
            first.annotations.append(note)
    return first
