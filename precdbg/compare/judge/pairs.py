"""The aligned record pairs of one step and rank as a table of typed columns, and the ordered
judges that decide each pair's status.

`PairTable` holds, per pair, how far apart the two records are (relative differences of each
statistic, the worst of them `err`, the tolerance `tol`), what is known of them (shapes,
NaN/Inf counts, checksums, the rounding floor, the share of the last update), the `status` and
`judged_by`: the id of the judge whose rule decided the status. The judges (judges.py's
`PAIR_JUDGES`) run in order, each reading the columns the ones before it wrote and rewriting
the status of the pairs its rule covers:

1. `statistics`       (metrics.py)    statistics against the precision's tolerance; checksums
2. `rounding_floor`   (floors.py)     a value far below the terms it was summed from
3. `update_noise`     (multistep.py)  parameters at step k >= 1 against their last update
4. `element_wise`     (this module)   stored tensors: relative RMSE instead of statistics
5. `integer_plumbing` (metrics.py)    integer records where every float agrees
6. `shim_conventions` (metrics.py)    a torch shim's own arguments and integer plumbing

Each judge's docstring gives the measurement behind its rule; tests/core/test_core_pair_judges.py
tests each on tables made by hand.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ...storage.reader import RecordTable

__all__ = ["PairStatus", "PairTable", "PairJudge", "StepContext", "element_wise"]


class PairStatus(str, enum.Enum):
    MATCH = "match"
    DIVERGED = "diverged"
    PRECISION = "precision"     # a dtype argument explained by precisions already apart
    INTEGER = "integer"         # integer plumbing in a step whose floats all agree
    CONVENTION = "convention"   # a torch shim's own way to the same call (see shim_conventions)


def _floats(n: int, fill: float = 0.0) -> np.ndarray:
    return np.full(n, fill, dtype=np.float64)


def _flags(n: int) -> np.ndarray:
    return np.zeros(n, dtype=bool)


@dataclasses.dataclass(eq=False)
class PairTable:
    """Pairs `ia[p]` of the baseline's table `a` and `ib[p]` of the candidate's `b`."""
    a: RecordTable
    b: RecordTable
    ia: np.ndarray
    ib: np.ndarray
    d_min: np.ndarray = None            # relative differences (see metrics.py)
    d_max: np.ndarray = None
    d_mean: np.ndarray = None
    d_pos_mean: np.ndarray = None
    d_norm: np.ndarray = None
    err: np.ndarray = None              # the worst, in units of the tolerance of mean/norm
    tol: np.ndarray = None
    extremes: np.ndarray = None         # min and max are held against tol * extremes
    shape_ok: np.ndarray = None
    counts_ok: np.ndarray = None        # NaN and Inf counts equal
    checksum_equal: np.ndarray = None   # both have a checksum, and they are equal
    diverged: np.ndarray = None
    precision_explained: np.ndarray = None
    floor: np.ndarray = None            # the rounding floor's norm (0: none)
    floor_decided: np.ndarray = None    # the floor turned the pair's verdict
    update_share: np.ndarray = None     # NaN: not judged by its update
    by_update: np.ndarray = None
    dw_agreed: np.ndarray = None        # -1 unknown, 0, 1
    integer_plumbing: np.ndarray = None
    convention: np.ndarray = None       # a torch shim's convention (shim_conventions)
    judged_by: np.ndarray = None        # per pair, the id of the judge that decided it
    tensors: List[Optional[Dict[str, Any]]] = None   # element-wise metrics, where stored

    def __post_init__(self) -> None:
        n = len(self.ia)
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                continue
            if f.name in ("shape_ok", "counts_ok"):
                setattr(self, f.name, np.ones(n, dtype=bool))
            elif f.name in ("checksum_equal", "diverged", "precision_explained",
                            "floor_decided", "by_update", "integer_plumbing", "convention"):
                setattr(self, f.name, _flags(n))
            elif f.name == "update_share":
                self.update_share = _floats(n, np.nan)
            elif f.name == "dw_agreed":
                self.dw_agreed = np.full(n, -1, dtype=np.int8)
            elif f.name == "extremes":
                self.extremes = _floats(n, 1.0)
            elif f.name == "judged_by":
                self.judged_by = np.full(n, "statistics", dtype=object)
            elif f.name == "tensors":
                self.tensors = [None] * n
            else:
                setattr(self, f.name, _floats(n))

    def __len__(self) -> int:
        return len(self.ia)

    def differs(self, q: Any = slice(None)) -> Any:
        """The statistics' verdict under the tolerance now in `tol`."""
        return ((self.err[q] > self.tol[q]) | ~self.shape_ok[q] | ~self.counts_ok[q]) & \
            ~self.checksum_equal[q]

    def decide(self, mask: np.ndarray, diverged: Any, judge: str) -> None:
        """Set the verdict of the pairs in `mask` (a bool array), naming the judge."""
        self.diverged = np.where(mask, diverged, self.diverged)
        self.judged_by = np.where(mask, judge, self.judged_by)

    def status(self, p: int) -> PairStatus:
        if self.diverged[p]:
            return PairStatus.DIVERGED
        if self.precision_explained[p]:
            return PairStatus.PRECISION
        if self.integer_plumbing[p]:
            return PairStatus.INTEGER
        if self.convention[p]:
            return PairStatus.CONVENTION
        return PairStatus.MATCH


@dataclasses.dataclass
class StepContext:
    """What the judges of one step may read besides the table: the step and rank, and the
    noise policy carried across the compare's steps (multistep.NoisePolicy)."""
    step: int
    rank: int
    noise: Any
    # the candidate is a torch shim's dump of PyTorch code, the baseline PyTorch's (or the
    # other way round): one vocabulary of names, two frameworks
    shim_pair: bool = False


@dataclasses.dataclass(frozen=True)
class PairJudge:
    """A rule over the pair table: `apply(table, context)` rewrites the columns of the pairs
    it covers, naming itself in `judged_by`."""
    id: str
    apply: Callable[[PairTable, StepContext], None]


def element_wise(t: PairTable, ctx: StepContext) -> None:
    """Judge `element_wise`: where both records hold their tensor (task "tensor"), the pair is
    judged by the relative RMSE of its elements (against the baseline's RMS, or its rounding
    floor where it has one), which sees a change that keeps every statistic; the NaN/Inf counts
    still count. Equal checksums and a parameter judged by its update keep their verdict."""
    for p, tm in enumerate(t.tensors):
        if tm is None or t.checksum_equal[p] or t.by_update[p]:
            continue
        numel = int(t.b["numel"][t.ib[p]])
        t.diverged[p] = (_rel_rmse(tm, float(t.floor[p]), numel) > max(t.tol[p], 1e-12)) \
            or not t.counts_ok[p]
        t.judged_by[p] = "element_wise"


def _rel_rmse(tm: Dict[str, Any], floor: float, numel: int) -> float:
    """The RMSE relative to the baseline's RMS, or to the pair's rounding floor where it has
    one above that (floors.py)."""
    if floor <= 0.0:
        return float(tm["rel_rmse"])
    rms_b = tm["rmse"] / tm["rel_rmse"] if tm["rel_rmse"] > 0 else 0.0
    return float(tm["rmse"] / max(rms_b, floor / max(numel, 1) ** 0.5, 1e-300))
