"""Floating-point precision: which of two dtypes rounds more coarsely, and the precision a
tensor's values carry.

A float32 tensor computed from bfloat16 values (the residual stream after an autocast linear, a
LayerNorm of it, the float32 gradient of a weight used in bf16) carries bf16 rounding, not float32
rounding. The session records, per tensor record, the lowest precision along the computation that
produced it (the `precision` column: the lowest of the record's dtype, the precision its call's
inputs carried, and, for backward records and dw, the lowest precision the step's forward used);
the compare's tolerance follows it (precdbg/compare/metrics.py).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from .schema import NO_PRODUCER, Direction, Role

__all__ = ["MANTISSA_BITS", "is_floating", "lowest", "PrecisionTracker"]

# explicit mantissa bits: fewer bits, coarser rounding (unit roundoff 2^-(bits+1))
MANTISSA_BITS: Dict[str, int] = {
    "float64": 52, "float32": 23, "float16": 10, "bfloat16": 7,
    "float8_e4m3fn": 3, "float8_e4m3fnuz": 3, "float8_e5m2": 2, "float8_e5m2fnuz": 2,
}


def is_floating(dtype: str) -> bool:
    return dtype in MANTISSA_BITS


def _coarser(a: str, b: str) -> str:
    bits_a, bits_b = MANTISSA_BITS.get(a), MANTISSA_BITS.get(b)
    if bits_a is None:
        return b if bits_b is not None else ""
    if bits_b is None:
        return a
    return a if bits_a <= bits_b else b


_LOWEST: Dict[Tuple[str, str], str] = {}      # asked several times per record: answered once


def lowest(a: str, b: str) -> str:
    """The coarser of two floating dtypes ('' and non-floating dtypes count as unknown)."""
    found = _LOWEST.get((a, b))
    if found is None:
        found = _LOWEST[(a, b)] = _coarser(a, b)
    return found


_FORWARD, _NONE, _INPUT = Direction.FORWARD.value, Direction.NONE.value, Role.INPUT.value


class PrecisionTracker:
    """The precision carried by the tensors of one step, as the session captures them. Calls and
    distinct tensors (the session's `Call` and `_Seen`) hold a `precision` attribute."""
    __slots__ = ("forward", "_written")

    def __init__(self) -> None:
        self.forward = ""          # the lowest precision of this step's forward so far
        self._written: Dict[int, str] = {}    # seq of a record -> the precision it carried

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
        dtype = rec.dtype
        if dtype not in MANTISSA_BITS:
            return ""
        direction = rec.direction
        if direction == _FORWARD:
            if rec.role == _INPUT:
                held = seen.precision
                if not held and rec.producer != NO_PRODUCER:
                    held = self._written.get(rec.producer, "")
                carried = lowest(held, dtype)
                call.precision = lowest(call.precision, carried)
            else:
                carried = lowest(lowest(seen.precision, call.precision), dtype)
                self._written[rec.seq] = carried
            seen.precision = carried
            self.forward = lowest(self.forward, carried)
            return carried
        if direction == _NONE:
            seen.precision = lowest(seen.precision, dtype)
            return dtype
        carried = lowest(lowest(self.forward, call.precision), dtype)
        seen.precision = lowest(seen.precision, carried)
        self._written[rec.seq] = carried
        return carried
