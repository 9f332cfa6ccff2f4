"""Judge `dw_beyond_inputs`: a weight gradient that differs far beyond what its module read.

A module's weight gradient is computed from what the module read: its forward input x and the
gradient dy arriving at its backward (dw = dy^T x for a linear layer), and, through the
forward's consequences, its own weights. When the weights already differ at the start of the
dumped step (the guides dump iteration 1, and an earlier iteration ran apart), everything after
the first differing parameter differs a little, and no record agrees within tolerance: the plain
`dw_only` reading (forward and dx agree) cannot be made. What still shows a gradient computed
differently is its size: a dw whose relative error is many times the largest relative error of
what its module read and of its own weights at the step's start.

Measured on the vendor guide's GLM4 shape (tests/shim_guide.py `--function`: Llama tiny, layer 1's
down projection through a custom `torch.autograd.Function` whose backward scales dw by 1.5 in one
run, iteration 1 dumped): that dw's relative error 0.333; its weight at the step's start 0.00099
(PyTorch against PyTorch) and 0.0031 (PyTorch against mindtorch), its module's forward input
<= 6.6e-7, its dy <= 1.5e-4: 108x to 337x. The next largest dw error of the step was 0.0099
(a layer norm's, whose module read differing inputs). A forward defect or a dx defect in an
earlier iteration moves a dw only as far as what its module read moved (ratio about 1), so
`RATIO` = 30 sits an order of magnitude away from both.

A dw all zero in one run and not in the other is judged by that alone, wherever its module's
forward was recorded (its backward may be missing in the run whose graph was cut): no difference
of what the module read makes a gradient exactly zero. Measured on mindnlp 0.5.1 (GPT-2 tiny
under `value_and_grad`, iteration 1 dumped): `wpe`'s dw all zero on the shim (its `Tensor.to`
cuts the graph), 0.41 in norm on PyTorch; wpe entered the step 13% apart, so its error (3.06)
was only 23x what explains it by the ratio.

Otherwise only modules whose forward and backward were both recorded (levels module and mix) are
judged: without them nothing says what the dw read.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, List, Optional

from ...records.schema import Direction, RecordKind
from .entries import Entry, StepEntries, all_zero_side

__all__ = ["JUDGE_ID", "RATIO", "GradientBeyond", "gradients_beyond_inputs"]

JUDGE_ID = "dw_beyond_inputs"
RATIO = 30.0


@dataclasses.dataclass
class GradientBeyond:
    """A weight gradient whose error is `ratio` times the largest error of what it read."""
    entry: Entry               # the parameter's gradient (kind param_grad)
    err: float                 # its relative error
    explained: Optional[float]  # the largest relative error of x, dy and the entering weight
    zero_in: str = ""          # "baseline" / "candidate": all zero in that run only

    @property
    def ratio(self) -> float:
        if not self.explained:      # nothing read differs, or what it read is unknown
            return math.inf
        return self.err / self.explained

    def facts(self) -> dict:
        tol = self.entry.outputs_bad[0].metrics.get("tol") if self.entry.outputs_bad else None
        return {"name": self.entry.name, "module": self.entry.module, "err": self.err, "tol": tol,
                "explained": self.explained, "zero_in": self.zero_in,
                "ratio": None if math.isinf(self.ratio) else self.ratio}


def _largest_err(errors: Iterable[Optional[float]]) -> Optional[float]:
    """The largest of the errors; None when one is unknown (a shape that differs)."""
    largest = 0.0
    for err in errors:
        if err is None or not math.isfinite(err):
            return None
        largest = max(largest, err)
    return largest


def _read_err(entry: Entry) -> Optional[float]:
    """The largest relative error of what a call read (agreeing or not)."""
    return _largest_err([entry.inputs_ok_err] + [ev.metrics.get("err") for ev in entry.inputs_bad])


def _own_err(entry: Entry) -> Optional[float]:
    return _largest_err([ev.metrics.get("err") for ev in entry.outputs_bad + entry.inputs_bad])


def gradients_beyond_inputs(step: StepEntries, rank: int) -> List[GradientBeyond]:
    """The weight gradients of `step` on `rank` that differ `RATIO` times beyond what their
    module read and their weights at the step's start, largest ratio first."""
    entries = [e for e in step.entries if e.rank == rank]
    modules = {}
    for e in entries:
        if e.kind == RecordKind.MODULE and e.direction in (Direction.FORWARD, Direction.BACKWARD):
            modules.setdefault(e.module, []).append(e)
    weights = {(e.module, e.op): e for e in entries
               if e.kind == RecordKind.PARAM and e.direction == Direction.NONE}
    found = []
    for dw in entries:
        if dw.kind != RecordKind.PARAM_GRAD or not dw.outputs_bad:
            continue
        calls = modules.get(dw.module, [])
        directions = {c.direction for c in calls}
        zero = all_zero_side(dw)
        if Direction.FORWARD not in directions or \
                (Direction.BACKWARD not in directions and not zero):
            continue
        err = _own_err(dw)
        weight = weights.get((dw.module, dw.op))
        read = _largest_err([_read_err(c) for c in calls]
                            + [_own_err(weight) if weight is not None else 0.0])
        if err is None:
            continue
        if zero or (read is not None and err >= RATIO * read):
            found.append(GradientBeyond(dw, err, read, zero))
    found.sort(key=lambda g: (not g.zero_in, -g.ratio))
    return found
