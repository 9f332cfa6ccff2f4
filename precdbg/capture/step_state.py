"""What the capture windows of one step share, made fresh when the step begins (at the
debugger's construction and at every `step()`): the call counters that name calls (a second
window of the same step goes on counting), the record sequence, the calls a recompute may replay,
the precision carried so far, the dataflow provenance and where the step stands in the config's
`scope_range`."""
from __future__ import annotations

from typing import Dict, Tuple

from ..records.call import Call
from ..records.precision import PrecisionTracker
from .contract import TensorOps
from .filters import CaptureFilter, RangePosition
from .provenance import Provenance
from .recompute import ReplayTable

__all__ = ["StepState"]


class StepState:
    """One step's counters and dataflow (see the module's text)."""
    __slots__ = ("number", "order", "seq", "counts", "replays", "precisions", "provenance",
                 "position")

    def __init__(self, number: int, tensors: TensorOps, capture_filter: CaptureFilter) -> None:
        self.number = number
        self.order = 0                                  # forward calls kept so far
        self.seq = 0                                    # records made so far
        self.counts: Dict[Tuple[str, str], int] = {}    # calls per (prefix, name) so far
        # forward calls not watched for backward, which a recompute may replay
        self.replays: ReplayTable[Call] = ReplayTable()
        self.precisions = PrecisionTracker()            # precision carried, per step
        self.provenance = Provenance(tensors)
        self.position: RangePosition = capture_filter.range_position()
