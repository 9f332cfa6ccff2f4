"""Rounding floors: how large a difference rounding alone can make in a value that is far
smaller than what it was computed from.

Statistics are compared relative to the value's own scale. That fails for a sum whose terms
cancel: the gradient of an attention key projection's bias is the sum of dy over every token,
which softmax makes exactly zero in exact arithmetic, so each run holds only its own rounding
(BERT, fp32 vs bf16 autocast: norms 8.6e-12 and 7.2e-8 against a dy of norm 4.3e-5), and a
relative error of 1 says nothing about either run. So does a convolution's bias before a
BatchNorm, which removes each channel's mean (tests/cnn_support.py --conv-bias, PyTorch vs
MindSpore on CPU, two SGD steps: conv2's bias gradient, norms 4.30e-8 and 3.66e-8 against a dy
of norm 0.476, err 1.75, DIVERGED; conv1's 5.37e-8 and 6.02e-8 against 0.402, err 0.63; step 1
0.71 and 1.78). The rounding of a sum of many terms grows with the terms, not with the sum:
accumulated term by term it is about the tolerance times the norm of the terms. So a gradient
a backward call reduces from its incoming gradient is judged against max(its own norm, the
norm of dy); where it is not far smaller than dy this changes nothing. With it the CNN twin's
bias gradients are at err 1.6e-7 and 9.5e-8 (step 1: 1.1e-7, 4.7e-7; tolerance 2e-5) and it
MATCHes; conv1's bias gradient changed by 1e-3 of dy's norm on each element (a torch hook) is
at err 3.0e-3, 150x the tolerance, and named (`precdbg compare`, the rows' err and floor).

Which gradients are such a reduction is decided per op (`_summed_from`), each element being a
sum of many dy elements over the dimensions the operand was broadcast along: a convolution's
bias (C,) from dy (N, C, H, W) and a batch/group/instance norm's weight and bias (dy's channel
dimension), a linear's bias (dy's last), and for broadcasting ops (add, mul, layer/RMS norm,
expand, a user module's records) any gradient whose dimensions are 1 or dy's aligned from the
right (for a product the terms are dy times the other operand; dy's norm stands for them).
Never a contraction's other gradients (a matmul's, linear's or convolution's dx and dw:
dx = dy W^T sums dy against a weight, its rounding scales with dx itself; a 1-channel input's
conv dx (N, 1, H, W) or a matmul's dx (N, T, 1) line up with dy from the right all the same),
nor a selection's (a cat's, stack's or getitem's dx is a part of dy, not a sum).

The floor is a property of the values, so it follows them through the step: every record of the
same tensor (the dw of that bias, the reads of `.grad` by `clip_grad_norm_`; MindSpore's
`Param.<name>.grad` record is the same tensor as the call's gradient record), and what a call
computes from them, as an absolute floor scaled by the call's gain capped at 1 (a norm, a cast,
a stack or a scaling down carry the noise along; a scaling up is not trusted to). It is found on
the baseline's records. A difference is then relative to max(the pair's own scale, its floor);
pairs without a floor (nearly all) are judged exactly as before.
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


# Ops whose per-channel parameters lie along dy's channel dimension (N, C, ...): a
# convolution's bias (its spatial dimensions: C is dimension 0 of an unbatched input's dy), a
# batch/group/instance norm's weight and bias, MindSpore's BiasAdd (NCHW)
_SPATIAL = {"conv1d": 1, "conv2d": 2, "conv3d": 3, "conv_transpose1d": 1, "conv_transpose2d": 2,
            "conv_transpose3d": 3, "conv1d_transpose": 1, "conv2d_transpose": 2,
            "conv3d_transpose": 3}
_CHANNEL_FIRST = frozenset(_SPATIAL) | {"batch_norm", "group_norm", "instance_norm", "bias_add"}
# Ops whose gradients for their operands contract dy with another operand (dx = dy W^T,
# dw = x^T dy: rounding that scales with the result): whatever their shapes, no sum of dy
# alone, except a bias (1-D, one per output channel) of those in _BIASED
_CONTRACTIONS = frozenset({
    "linear", "addmm", "matmul", "einsum", "tensordot", "bilinear", "mv", "dot", "vdot",
    "inner", "outer", "ger", "addmv", "addbmm", "baddbmm", "addr", "chain_matmul",
    "multi_dot", "scaled_dot_product_attention"}) | _CHANNEL_FIRST
# Ops whose dx is a part of dy (a slice of a cat's, a stack's; a gather's): no sum at all
_SELECTIONS = frozenset({
    "cat", "stack", "split", "getitem", "narrow", "select", "index_select", "gather",
    "take", "take_along_dim", "unbind", "pad", "slice", "strided_slice"})
_BIASED = frozenset({"linear", "addmm"}) | _CHANNEL_FIRST


def _channel_dim(op: str, dy: Tuple[int, ...]) -> int:
    """Where the dimension a call's bias runs along lies in its dy."""
    if op in _SPATIAL:
        return max(len(dy) - _SPATIAL[op] - 1, 0)
    return 1 if op in _CHANNEL_FIRST and len(dy) >= 2 else len(dy) - 1


def _summed_from(op: str, dx: Tuple[int, ...], dy: Tuple[int, ...]) -> bool:
    """Whether a gradient of shape `dx` of a call of `op` is `dy` summed over every dimension
    but the ones it keeps (a bias, a norm's weight, a scale): fewer elements than dy, and
    - of a channel-first op (convolution, batch/group/instance norm), a 1-D gradient as long as
      dy's channel dimension (C of N, C, H, W);
    - of a linear (addmm), a 1-D gradient as long as dy's last dimension;
    - of any other contraction or a selection, none (_CONTRACTIONS, _SELECTIONS);
    - of any other op (broadcast elementwise, layer/RMS norm, expand, a user module's record),
      every dimension 1 or dy's, aligned from the right, as broadcasting aligns them."""
    if not dy or len(dx) > len(dy) or math.prod(dx) >= math.prod(dy):
        return False
    if op in _CONTRACTIONS or op in _SELECTIONS:
        return op in _BIASED and len(dx) == 1 and dx[0] == dy[_channel_dim(op, dy)]
    return all(d == 1 or d == e for d, e in zip(reversed(dx), reversed(dy)))


def rounding_floors(a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray
                    ) -> np.ndarray:
    """Per pair, the norm below which a difference is rounding (0: none). Calls are visited in
    the baseline's emission order; producers and tensors are linked on the baseline's side."""
    n = len(ia)
    floor = np.zeros(n, dtype=np.float64)
    if n == 0:
        return floor
    own_column = np.fmax(_norms(a, ia), _norms(b, ib))
    own = own_column.tolist()
    roles = a["role"][ia].tolist()
    seqs = a["seq"][ia].tolist()
    producers = a["producer"][ia].tolist() if "producer" in a else [NO_PRODUCER] * n
    tensors = a["tensor_id"][ia].tolist()
    ops = a["op"][ia].tolist()
    shapes: List[Tuple[int, ...]] = []

    def shape(p: int) -> Tuple[int, ...]:          # the record's dimensions (all, when first asked)
        if not shapes:
            dims, ndim = a["shape"][ia].tolist(), a["ndim"][ia].tolist()
            shapes.extend(tuple(d[:k]) for d, k in zip(dims, ndim))
        return shapes[p]
    scalar = scalar_mask(b["dtype"][ib]).tolist()
    calls: Dict[Tuple[str, str], List[int]] = {}
    first: Dict[Tuple[str, str], int] = {}          # a call's first seq: the order visited
    dy_calls, dx_calls = set(), set()
    for p, key in enumerate(zip(a["direction"][ia].tolist(), a["entry"][ia].tolist())):
        if scalar[p]:
            continue
        members = calls.get(key)
        if members is None:
            calls[key], first[key] = [p], seqs[p]
        else:
            members.append(p)
            if seqs[p] < first[key]:
                first[key] = seqs[p]
        if roles[p] == _GRAD_OUTPUT:
            dy_calls.add(key)
        elif roles[p] == _GRAD_INPUT:
            dx_calls.add(key)
    # a floor begins at a dx summed from its call's dy: every call visited before the first
    # call with both has none, and passes none on
    begins = [first[key] for key in dy_calls & dx_calls]
    if not begins:
        return floor
    start = min(begins)
    by_seq: Dict[int, float] = {}
    by_tensor: Dict[int, float] = {}
    summed: Dict[Tuple[str, Tuple[int, ...], Tuple[int, ...]], bool] = {}   # _summed_from's
    floors = [0.0] * n
    for key in sorted(calls, key=first.__getitem__):
        if first[key] < start:
            continue
        carried: List[Tuple[float, float]] = []      # (floor, norm) of the reads with one
        dys: List[int] = []
        writes: List[int] = []
        for p in calls[key]:
            role = roles[p]
            if role not in READ_ROLES:
                writes.append(p)
                continue
            f = max(by_seq.get(producers[p], 0.0), by_tensor.get(tensors[p], 0.0))
            floors[p] = f
            if f > 0.0:
                carried.append((f, own[p]))
            if role == _GRAD_OUTPUT:
                dys.append(p)
        sums = _carried_sums(carried, [own[p] for p in writes]) if carried and writes else None
        for w, p in enumerate(writes):
            f = sums[w] if sums is not None else 0.0
            if dys and roles[p] == _GRAD_INPUT:      # summed from dy: its rounding scales with dy
                op, dx = ops[p], shape(p)
                for q in dys:
                    if own[q] > f:
                        asked = (op, dx, shape(q))
                        found = summed.get(asked)
                        if found is None:
                            found = summed[asked] = _summed_from(*asked)
                        if found:
                            f = own[q]
            t = tensors[p]
            f = max(f, by_tensor.get(t, 0.0))
            floors[p] = f
            if f > 0.0:
                by_seq[seqs[p]] = f
                by_tensor[t] = max(f, by_tensor.get(t, 0.0))
    floor[:] = floors
    return np.where(floor > own_column, floor, 0.0)


def _carried_sums(carried: List[Tuple[float, float]], norms: List[float]) -> List[float]:
    """Per written value of norm `o` (`norms`), the floors its call's reads carry in, each
    scaled by the call's gain capped at 1: sum over the reads (floor f, norm nr) of
    f * min(1, o / nr) (f where nr is 0), added in the reads' order as Python's sum adds (an
    accumulate, not numpy's pairwise sum: the same float to the last bit). A small call in
    Python floats (numpy's overhead is most of its cost there), a large one in numpy: the
    same operations on the same doubles, the same result."""
    if len(carried) * len(norms) <= _SMALL_CALL:
        out = []
        for o in norms:
            total = None
            for f, nr in carried:
                gain = o / nr if nr > 0.0 else 1.0
                if gain >= 1.0:            # np.minimum(1, gain): NaN stays NaN
                    gain = 1.0
                term = f * gain
                total = term if total is None else total + term
            out.append(total)
        return out
    fr = np.array([f for f, _ in carried], dtype=np.float64)
    nr = np.array([n for _, n in carried], dtype=np.float64)
    o = np.array(norms, dtype=np.float64)[:, None]
    positive = nr > 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gain = np.where(positive, np.minimum(1.0, o / np.where(positive, nr, 1.0)), 1.0)
    return np.add.accumulate(fr * gain, axis=1)[:, -1].tolist()


_SMALL_CALL = 256       # reads x writes of a call summed in Python floats


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
