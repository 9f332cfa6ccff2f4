"""Rounding floors: how large a difference rounding alone can make in a value that is far
smaller than what it was computed from.

Statistics are compared relative to the value's own scale. That fails for a sum whose terms
cancel: the gradient of an attention key projection's bias is the sum of dy over every token,
which softmax makes exactly zero in exact arithmetic, so each run holds only its own rounding
(BERT, fp32 vs bf16 autocast: norms 8.6e-12 and 7.2e-8 against a dy of norm 4.3e-5), and a
relative error of 1 says nothing about either run. The rounding of a sum of many terms grows
with the terms, not with the sum: accumulated term by term it is about the tolerance times the
norm of the terms. So a gradient a backward call reduces from its incoming gradient (fewer
elements than dy: a bias, a weight from a large batch) is judged against
max(its own norm, the norm of dy); where it is not far smaller than dy this changes nothing.
Only a gradient summed over the dimensions its operand was broadcast along gets a floor (a
bias, a norm's weight, a scale: shape-wise a reduction of dy); a matmul's dx sums over a
contracted dimension, whose rounding scales with dx itself.

The floor is a property of the values, so it follows them through the step: every record of the
same tensor (the dw of that bias, the reads of `.grad` by `clip_grad_norm_`), and what a call
computes from them, as an absolute floor scaled by the call's gain capped at 1 (a norm, a cast,
a stack or a scaling down carry the noise along; a scaling up is not trusted to). A difference
is then relative to max(the pair's own scale, its floor); pairs without a floor (nearly all) are
judged exactly as before.
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np

from ...storage.reader import RecordTable
from .metrics import worst_error
from .pairs import PairTable
from ...records.schema import NO_PRODUCER, READ_ROLES, Role, scalar_mask

__all__ = ["JUDGE_ID", "rounding_floors", "apply_floors"]

JUDGE_ID = "rounding_floor"

_GRAD_OUTPUT, _GRAD_INPUT = Role.GRAD_OUTPUT, Role.GRAD_INPUT


def _norms(t: RecordTable, idx: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.abs(t["norm"][idx].astype(np.float64)), nan=0.0, posinf=0.0)


def _summed_from(dx: Tuple[int, ...], dy: Tuple[int, ...]) -> bool:
    """Whether a gradient of shape `dx` is `dy` summed over the dimensions its operand was
    broadcast along (a bias, a norm's weight, a scale): fewer elements, and every dimension
    1 or dy's (aligned from the right)."""
    if len(dx) > len(dy) or math.prod(dx) >= math.prod(dy):
        return False
    return all(d == 1 or d == e for d, e in zip(reversed(dx), reversed(dy)))


def rounding_floors(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray
                    ) -> np.ndarray:
    """Per pair, the norm below which a difference is rounding (0: none). Calls are visited in
    the baseline's emission order; producers and tensors are linked on the baseline's side."""
    n = len(ia)
    floor = np.zeros(n, dtype=np.float64)
    if n == 0:
        return floor
    own = np.fmax(_norms(a, ia), _norms(b, ib))
    roles = a["role"][ia].tolist()
    seqs = a["seq"][ia].tolist()
    producers = a["producer"][ia].tolist() if "producer" in a else [NO_PRODUCER] * n
    tensors = a["tensor_id"][ia].tolist()
    shapes = [tuple(row[:nd]) for row, nd in zip(a["shape"][ia].tolist(), a["ndim"][ia].tolist())]
    scalar = scalar_mask(b["dtype"][ib])
    calls: Dict[Tuple[str, str], List[int]] = {}
    for p, key in enumerate(zip(a["direction"][ia].tolist(), a["entry"][ia].tolist())):
        if not scalar[p]:
            calls.setdefault(key, []).append(p)
    by_seq: Dict[int, float] = {}
    by_tensor: Dict[int, float] = {}
    for members in sorted(calls.values(), key=lambda m: min(seqs[p] for p in m)):
        carried: List[Tuple[float, float]] = []      # (floor, norm) of the reads with one
        dys: List[int] = []
        for p in members:
            role = roles[p]
            if role not in READ_ROLES:
                continue
            f = max(by_seq.get(producers[p], 0.0), by_tensor.get(tensors[p], 0.0))
            floor[p] = f
            if f > 0.0:
                carried.append((f, own[p]))
            if role == _GRAD_OUTPUT:
                dys.append(p)
        for p in members:
            if roles[p] in READ_ROLES:
                continue
            f = sum(fr * (min(1.0, own[p] / nr) if nr > 0.0 else 1.0) for fr, nr in carried)
            if roles[p] == _GRAD_INPUT:      # summed from dy: its rounding scales with dy
                f = max([f] + [own[q] for q in dys if _summed_from(shapes[p], shapes[q])])
            f = max(f, by_tensor.get(tensors[p], 0.0))
            floor[p] = f
            if f > 0.0:
                by_seq[seqs[p]] = f
                by_tensor[tensors[p]] = max(f, by_tensor.get(tensors[p], 0.0))
    return np.where(floor > own, floor, 0.0)


def apply_floors(t: PairTable) -> None:
    """Judge `rounding_floor`: the pairs with a floor are judged against it (this module's
    docstring): their relative differences are taken against max(own scale, floor) and their
    verdict redone; `t.floor` holds each pair's floor (0: none), `t.floor_decided` whether it
    turned the pair's verdict."""
    a, b, ia, ib = t.a, t.b, t.ia, t.ib
    floor = rounding_floors(a, b, ia, ib)
    t.floor = floor
    hit = np.nonzero(floor > 0.0)[0]
    if not len(hit):
        return
    ja, jb = ia[hit], ib[hit]
    f = floor[hit]
    rms = f / np.sqrt(np.maximum(np.maximum(a["numel"][ja], b["numel"][jb]), 1))
    with np.errstate(invalid="ignore"):
        for stat in ("min", "max", "mean", "pos_mean"):
            if stat not in a or stat not in b:
                continue
            column = getattr(t, f"d_{stat}")
            diff = np.abs(a[stat][ja] - b[stat][jb])
            relaxed = diff / rms
            column[hit] = np.where(np.isfinite(relaxed), np.fmin(column[hit], relaxed),
                                   column[hit])
        diff = np.abs(a["norm"][ja] - b["norm"][jb]) / f
        t.d_norm[hit] = np.where(np.isfinite(diff), np.fmin(t.d_norm[hit], diff), t.d_norm[hit])
    t.err[hit] = worst_error(t, hit)
    before = t.diverged[hit].copy()
    t.diverged[hit] = t.differs(hit)
    t.floor_decided[hit] = before & ~t.diverged[hit]
    t.judged_by[hit[t.floor_decided[hit]]] = JUDGE_ID
