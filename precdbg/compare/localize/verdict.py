"""The verdict of a compare, typed: what the first divergence is (`VerdictCode`), where (the
entry's fields), the evidence, the chain that led there, ranked candidates where a step shows
several causes, and `Annotation` codes for what else bears on it. `Verdict.as_json()` is the
contract's `first_divergence` (version `CONTRACT_VERSION`, docs/compare.md): programs read
`code` and `annotations`; `reason` is its wording for people.

A decision stores codes and typed facts only (`Verdict.facts`, each annotation's facts in
`annotation_facts`, each chain item's `code` and `_facts`, each evidence item's `_why`); the
words (`reason`, the chain's and causes' `text`, evidence's `why`) are written once, at the end
of the compare, by report/wording.py.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["CONTRACT_VERSION", "VerdictCode", "Annotation", "LinkCode", "Verdict",
           "empty_evidence", "FACTS"]

FACTS = "_facts"     # the key of a JSON item's facts, which the wording replaces with words

# 2: first_divergence.code and .annotations (codes), rows' judged_by; notes unchanged (text)
CONTRACT_VERSION = 2


class VerdictCode(str, enum.Enum):
    """What the first divergence is."""
    # a call whose tensor inputs agree (the walk's culprit)
    OP_DIFFERS = "op_differs"                  # its outputs differ
    ARGUMENT = "argument"                      # a non-tensor argument differs (an eps, a mode)
    NEAR_TIE = "near_tie"                      # exact outputs (indices) from near-equal inputs
    NO_COMPARED_INPUTS = "no_compared_inputs"  # its output differs; nothing it read was compared
    BACKWARD_ONLY = "backward_only"            # the forward agrees; a backward output differs
    DW_ONLY = "dw_only"                        # forward and dx agree; a weight gradient not
    DW_FIRST = "dw_first"                      # the first backward record to differ is a dw
    # what a call read, which no captured call of both runs produced as it was read
    UNCAPTURED_CALL = "uncaptured_call"        # computed inside a module by an uncaptured call
    INPUT_DATA = "input_data"                  # the batch, RNG, the data loader
    INPUTS_UNSEEN = "inputs_unseen"            # inputs differ where the statistics cannot see
    ARRIVING_GRAD = "arriving_grad"            # the gradient arriving at a backward call
    GRAD_CHANGED_AFTER_HOOK = "grad_changed_after_hook"   # .grad changed after its record
    CHANGED_AFTER = "changed_after"            # changed between its producer and the read
    ONE_RUN_CALL = "one_run_call"              # a call one run makes (one that writes in place)
    CALLS_DIFFER = "calls_differ"              # its producer is in one run only
    # the code that ran
    STRUCTURE = "structure"                    # a module's class or calls differ
    LAYER_SETTING = "layer_setting"            # a module's constructed settings differ
    OPTIMIZER_SETTING = "optimizer_setting"    # the optimizer set-up of the step differs
    UNFINISHED = "unfinished"                  # one run's step stopped early
    # the parameters at a step's start
    TRAINABLE_DIFFERS = "trainable_differs"
    PARAMETER_INVENTORY = "parameter_inventory"   # a parameter only one run has
    PARAMETER_SHAPES = "parameter_shapes"
    UPDATE_DIFFERS = "update_differs"          # the step before matched: the update differs
    PARAMETERS_DIFFER = "parameters_differ"    # they entered the step apart, no cause in it


class Annotation(str, enum.Enum):
    """What else bears on a verdict."""
    WEIGHTS_ENTERED_APART = "weights_entered_apart"   # the step's parameters differ at start
    EARLIER_STEP_DIFFERS = "earlier_step_differs"     # the step before, left out, differs
    STEP_NOT_COMPARED = "step_not_compared"           # the step before is not in both dumps
    NOT_DUMPED = "not_dumped"                         # dump from the first training step
    MORE_PARAMETERS = "more_parameters"               # more parameters differ
    LAYER_SETTING = "layer_setting"                   # the module holding it has other settings
    NUMBERS_DIFFER = "numbers_differ"                 # a structural verdict's numbers differ
    ALL_ZERO = "all_zero"                             # its outputs are all zero in one run
    GRADIENT_STOPPED = "gradient_stopped"             # a detach one run makes stops it
    CALLS_IN_ONE_RUN_ONLY = "calls_in_one_run_only"   # calls inside it one run makes
    LOSS_SCALE = "loss_scale"                         # the loss scale differs
    MODULE_LEVEL = "module_level"                     # the dumps hold module calls only
    CHECKSUMS_DECIDE = "checksums_decide"             # the inputs' checksums decided it
    STATISTICS_BLIND = "statistics_blind"             # statistics may not see the difference


class LinkCode(str, enum.Enum):
    """What one item of a verdict's `chain` says."""
    DIFFERENTIATES_FORWARD = "differentiates_forward"   # a backward whose forward differs
    GRADIENT_OF = "gradient_of"                 # a dw that is the gradient a call produced
    READS_OUTPUT = "reads_output"               # reads the output of a call that differs
    ONE_RUN_PRODUCER = "one_run_producer"       # reads what one run computes with other calls
    SAME_MEMORY = "same_memory"                 # reads memory an earlier call wrote
    COLLECTIVE_RANK = "collective_rank"         # its producer differs on another rank
    CHANGED_AFTER = "changed_after"             # its producer agrees; changed in between
    ARRIVING_GRAD = "arriving_grad"             # the gradient arriving at it differs
    INPUT_DATA = "input_data"                   # reads input data that differs
    COLLECTIVE_INPUT = "collective_input"       # a collective: another rank's input differs
    CANDIDATE = "candidate"                     # differs while its inputs agree
    INSIDE = "inside"                           # a module: the first record inside it next
    CALLS_DIFFER = "calls_differ"               # the calls (or class) differ between the runs
    CHANGED_IN_BETWEEN = "changed_in_between"   # reads an agreeing output, changed in between
    CULPRIT = "culprit"                         # the call one run makes that wrote it
    START_OF_STEP = "start_of_step"             # a parameter differs at the step's start
    STRUCTURAL = "structural"                   # a module runs different code
    STOPPED = "stopped"                         # one run's step stopped inside a module
    CAUSE = "cause"                             # what the step shows to differ


def empty_evidence() -> Dict[str, Any]:
    return {"inputs_bad": [], "outputs_bad": [], "arguments_bad": [], "inputs_agreeing": 0}


@dataclasses.dataclass
class Verdict:
    """The first divergence. `name_a`/`name_b` name the entry in each run ("" where it has
    none); `metrics`: the evidence's; `evidence`: the differing tensors and arguments."""
    code: VerdictCode
    step: int
    rank: int
    direction: str
    kind: str
    name_a: str
    name_b: str
    module: str
    op: str
    role: str = ""
    metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    reason: str = ""
    evidence: Dict[str, Any] = dataclasses.field(default_factory=empty_evidence)
    chain: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    annotations: List[Annotation] = dataclasses.field(default_factory=list)
    cause: Optional[Dict[str, Any]] = None          # the step's cause (code, module, text)
    candidates: Optional[List[Dict[str, Any]]] = None   # ranked causes the step shows
    parameters: Optional[Dict[str, Any]] = None     # the parameter difference, as evidence
    structure: Optional[Dict[str, Any]] = None      # the structural difference
    unfinished: Optional[Dict[str, Any]] = None     # where one run's step stopped
    call_site: Optional[Dict[str, str]] = None      # the user's line that made the call
    when: Optional[str] = None                      # where in the step a root call ran
    # what the words need (report/wording.py): typed values, never words
    facts: Dict[str, Any] = dataclasses.field(default_factory=dict)
    annotation_facts: List[Tuple[Annotation, Dict[str, Any]]] = dataclasses.field(
        default_factory=list)

    @property
    def name(self) -> str:
        return self.name_a or self.name_b

    def annotate(self, code: Annotation, **facts: Any) -> None:
        """Add an annotation code; with `facts`, what its words (appended to the reason by
        report/wording.py) need."""
        if code not in self.annotations:
            self.annotations.append(code)
        if facts:
            self.annotation_facts.append((code, facts))

    def as_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"code": self.code.value}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("code", "facts", "annotation_facts") or \
                    (value is None and f.default is None):
                continue
            out[f.name] = value
        out["annotations"] = [a.value for a in self.annotations]
        return out
