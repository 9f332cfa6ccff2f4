"""Floating-point precision: which of two dtypes rounds more coarsely, and the precision a
tensor's values carry.

A float32 tensor computed from bfloat16 values (the residual stream after an autocast linear, a
LayerNorm of it, the float32 gradient of a weight used in bf16) carries bf16 rounding, not float32
rounding. The session records, per tensor record, the lowest precision along the computation that
produced it (the `precision` column: the lowest of the record's dtype, the precision its call's
inputs carried, and, for backward records and dw, the lowest precision the step's forward used);
the compare's tolerance follows it (precdbg/compare/judge/metrics.py).
"""
from __future__ import annotations

from typing import Any, Dict

from .schema import NO_PRODUCER, Direction, Role

__all__ = ["MANTISSA_BITS", "UNKNOWN", "is_floating", "PrecisionTracker"]

# explicit mantissa bits: fewer bits, coarser rounding (unit roundoff 2^-(bits+1))
MANTISSA_BITS: Dict[str, int] = {
    "float64": 52, "float32": 23, "float16": 10, "bfloat16": 7,
    "float8_e4m3fn": 3, "float8_e4m3fnuz": 3, "float8_e5m2": 2, "float8_e5m2fnuz": 2,
}


def is_floating(dtype: str) -> bool:
    return dtype in MANTISSA_BITS


_FORWARD, _NONE, _INPUT = Direction.FORWARD, Direction.NONE, Role.INPUT

# The tracker carries precisions as ranks (ints: coarser is smaller) so that "the lowest of" is a
# comparison, not a call per operand (it runs several times per record). A rank orders by
# mantissa bits first; dtypes of equal bits (float8 variants) keep distinct ranks.
UNKNOWN = 1 << 30                   # no floating precision known: the identity of min
_RANK: Dict[str, int] = {name: bits * 8 + i
                         for i, (name, bits) in enumerate(MANTISSA_BITS.items())}
_NAME: Dict[int, str] = {rank: name for name, rank in _RANK.items()}
_NAME[UNKNOWN] = ""


class PrecisionTracker:
    """The precision carried by the tensors of one step, as the session captures them. Calls and
    distinct tensors (the session's `Call` and `Seen`) hold a `precision` attribute: a rank
    (`UNKNOWN` until something is known)."""
    __slots__ = ("forward", "_written")

    def __init__(self) -> None:
        self.forward = UNKNOWN     # the lowest precision of this step's forward so far
        self._written: Dict[int, int] = {}    # seq of a record -> the precision it carried

    def of(self, call: Any, rec: Any, seen: Any) -> str:
        """The precision of one tensor record (its `producer` already known): a forward input
        carries what it was computed with (what its bytes carried when the window saw them, or
        what the captured record that wrote them carried, such as a gradient accumulated into
        `.grad` in place; its own dtype when nothing captured produced it); an output, the
        lowest of its dtype and of its call's inputs (an autocast linear's bf16 output, a
        float32 LayerNorm of a bf16-rounded residual); backward records and dw, also the lowest
        precision of the step's forward (the gradients flow back through it), which later reads
        of the same gradient (clipping, an all-reduce, the optimizer) carry too; the inventory,
        its dtype."""
        dtype = _RANK.get(rec.dtype)
        if dtype is None:
            return ""
        direction = rec.direction
        if direction == _FORWARD:
            if rec.role == _INPUT:
                held = seen.precision
                if held == UNKNOWN and rec.producer != NO_PRODUCER:
                    held = self._written.get(rec.producer, UNKNOWN)
                carried = held if held < dtype else dtype
                if carried < call.precision:
                    call.precision = carried
            else:
                carried = seen.precision
                if call.precision < carried:
                    carried = call.precision
                if dtype < carried:
                    carried = dtype
                self._written[rec.seq] = carried
            seen.precision = carried
            if carried < self.forward:
                self.forward = carried
            return _NAME[carried]
        if direction == _NONE:
            if dtype < seen.precision:
                seen.precision = dtype
            return _NAME[dtype]
        carried = self.forward if self.forward < call.precision else call.precision
        if dtype < carried:
            carried = dtype
        if carried < seen.precision:
            seen.precision = carried
        self._written[rec.seq] = carried
        return _NAME[carried]
