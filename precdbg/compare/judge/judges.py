"""The pair judges of a compared step, in the order they run (pairs.py says what each
decides; each module's docstring, the measurement behind it)."""
from __future__ import annotations

from typing import Sequence

from .floors import JUDGE_ID as ROUNDING_FLOOR, apply_floors
from .metrics import (INTEGER_PLUMBING, SHIM_CONVENTIONS, STATISTICS, integer_plumbing,
                      shim_conventions, stat_errors)
from .multistep import JUDGE_ID as UPDATE_NOISE
from .pairs import PairJudge, PairTable, StepContext, element_wise

__all__ = ["PAIR_JUDGES", "judge_pairs"]

PAIR_JUDGES: Sequence[PairJudge] = (
    PairJudge(STATISTICS, lambda t, ctx: stat_errors(t)),
    PairJudge(ROUNDING_FLOOR, lambda t, ctx: apply_floors(t)),
    PairJudge(UPDATE_NOISE, lambda t, ctx: ctx.noise.adjust(ctx.step, ctx.rank, t)),
    PairJudge("element_wise", element_wise),
    PairJudge(INTEGER_PLUMBING, lambda t, ctx: integer_plumbing(t)),
    PairJudge(SHIM_CONVENTIONS, lambda t, ctx: shim_conventions(t) if ctx.shim_pair else None),
)


def judge_pairs(table: PairTable, ctx: StepContext) -> PairTable:
    """Run the judges in order over one step's pairs."""
    for judge in PAIR_JUDGES:
        judge.apply(table, ctx)
    return table
