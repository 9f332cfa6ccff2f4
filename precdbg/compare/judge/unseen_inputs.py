"""Judge `unseen_inputs`: a call whose inputs agree by every statistic while its output differs
far beyond tolerance most likely read inputs that differ where the statistics cannot see.

Statistics (min, max, mean, norm, and since schema 4 the order-sensitive pos_mean) summarise a
tensor; a change that keeps all of them (a permutation in a dump written before pos_mean, a
horizontal flip of one image in a batch there, two equal-weight elements swapped) passes them.
A deterministic call computes the same output from the same input, so when its inputs agree to
within rounding and its output is `UNSEEN_FACTOR` times its tolerance or more apart, the inputs
are the likelier cause than the call. Measured: a horizontal flip of one image per batch into
timm's resnet18 (no pos_mean): `conv1`'s output 0.0534 relative apart against a float32
tolerance of 2e-5, 2,700 times it, with input statistics equal; a real 1e-3 change of one op's
output stands at 50 times the tolerance, a tanh GELU against the exact one at most a few times
(benchmarks/calibrate_tolerance.py). UNSEEN_FACTOR = 100 lies between.

Checksums decide it where both runs dumped them (summary_mode "checksum"): an agreeing input
whose checksum differs is the cause (`Decision.INPUTS_DIFFER`); inputs bit for bit equal clear
them, and the call itself computes differently (`Decision.OP_DIFFERS`). Inputs compared element
by element (task "tensor") are seen, and calls that draw random numbers (dropout) are not
deterministic: neither is judged here, nor a module call (what runs inside it is the likelier
cause: calls one run makes there, a detach, an uncaptured op).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Tuple

from ...records.schema import RecordKind
from .entries import Entry

__all__ = ["JUDGE_ID", "UNSEEN_FACTOR", "Decision", "UnseenInputs", "unseen_inputs"]

JUDGE_ID = "unseen_inputs"
UNSEEN_FACTOR = 100.0
_RANDOM = ("dropout", "rand", "bernoulli", "multinomial", "normal", "uniform", "randperm",
           "random", "exponential", "poisson", "alpha_dropout", "feature_alpha_dropout")


class Decision(str, enum.Enum):
    INPUTS_DIFFER = "inputs_differ"       # an agreeing input's checksum differs
    OP_DIFFERS = "op_differs"             # every input is bit for bit equal
    UNDECIDED = "undecided"               # no checksums: the inputs, likely


@dataclasses.dataclass
class UnseenInputs:
    decision: Decision
    ratio: float                          # the output's error over its tolerance
    checksums_differ: List[Tuple[str, int]]   # (role, arg_index) of the inputs

    def as_json(self) -> Dict[str, Any]:
        return {"judge": JUDGE_ID, "decision": self.decision.value, "ratio": self.ratio,
                "checksums_differ": [{"role": r, "arg_index": i}
                                     for r, i in self.checksums_differ]}


def _random(op: str) -> bool:
    name = op.lower().strip("_")
    return any(name == r or name.startswith(r + "_") or name.endswith("_" + r) or
               (r == "dropout" and "dropout" in name) for r in _RANDOM)


def unseen_inputs(entry: Entry) -> Optional[UnseenInputs]:
    """The judgement of a call whose tensor inputs agree and whose outputs do not (the walk's
    culprit), or None where it does not apply."""
    if entry.kind != RecordKind.API or entry.args_bad or entry.inputs_bad \
            or not entry.outputs_bad or _random(entry.op):
        return None
    reads = entry.reads_agreeing
    if not reads or any(not stats_only for _, _, _, stats_only in reads):
        return None
    metrics = entry.outputs_bad[0].metrics
    err, tol = metrics.get("err"), metrics.get("tol")
    if not isinstance(err, float) or not isinstance(tol, float) or tol <= 0.0 \
            or not entry.outputs_bad[0].shape_ok:
        return None
    ratio = err / tol
    if ratio < UNSEEN_FACTOR:
        return None
    differ = [(role, index) for role, index, equal, _ in reads if equal is False]
    if differ:
        return UnseenInputs(Decision.INPUTS_DIFFER, ratio, differ)
    if all(equal is True for _, _, equal, _ in reads):
        return UnseenInputs(Decision.OP_DIFFERS, ratio, [])
    return UnseenInputs(Decision.UNDECIDED, ratio, [])
