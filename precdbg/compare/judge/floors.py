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

import heapq
import math
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from ...storage.reader import RecordTable
from .entries import call_codes, scalar_records, string_hashes
from .metrics import worst_error
from .pairs import PairTable
from ...records.schema import NO_PRODUCER, Role

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
    the baseline's emission order; producers and tensors are linked on the baseline's side.

    Only the calls that can hold a floor are visited (`_Calls`): a call where one begins (a dx
    summed from a dy of non-zero norm) and a call after one visited that reads or writes what
    that one gave a floor. Any other call would find nothing carried in and begin nothing, so
    visiting it would change nothing: the floors are those of visiting every call in order."""
    n = len(ia)
    floor = np.zeros(n, dtype=np.float64)
    if n == 0:
        return floor
    own_column = np.fmax(_norms(a, ia), _norms(b, ib))
    calls = _Calls.of(a, b, ia, ib, own_column)
    if calls is None:
        return floor
    own, read, seqs, producers, tensors = calls.own, calls.read, calls.seq, calls.producer, \
        calls.tensor
    bounds, summed_from = calls.bounds, calls.summed_from
    by_producer, producer_lo, producer_hi = calls.by_producer, calls.producer_lo, \
        calls.producer_hi
    by_tensor_id, tensor_lo, tensor_hi = calls.by_tensor_id, calls.tensor_lo, calls.tensor_hi
    heap = list(calls.seeds)
    queued = set(heap)
    by_seq: Dict[int, float] = {}
    by_tensor: Dict[int, float] = {}
    floors: Dict[int, float] = {}       # member -> its floor, where above 0
    while heap:
        c = heapq.heappop(heap)
        carried: List[Tuple[float, float]] = []      # (floor, norm) of the reads with one
        writes: List[int] = []
        for k in range(bounds[c], bounds[c + 1]):
            if not read[k]:
                writes.append(k)
                continue
            # max(by_seq's, by_tensor's), as max() picks; a floor of 0 is not kept (the
            # floor of a member not visited)
            f = by_seq.get(producers[k], 0.0)
            g = by_tensor.get(tensors[k], 0.0)
            if g > f:
                f = g
            if f > 0.0:
                floors[k] = f
                carried.append((f, own[k]))
        sums = _carried_sums(carried, [own[k] for k in writes]) if carried and writes else None
        for w, k in enumerate(writes):
            f = sums[w] if sums is not None else 0.0
            for q in summed_from.get(k, ()):     # summed from dy: its rounding scales with dy
                if own[q] > f:
                    f = own[q]
            t = tensors[k]
            g = by_tensor.get(t, 0.0)
            if g > f:                            # max(f, g); NaN stays NaN, and is no floor
                f = g
            if f > 0.0:
                floors[k] = f
                s = seqs[k]
                if s not in by_seq or t not in by_tensor:   # the calls after c it reaches
                    for d in by_producer[producer_lo[k]:producer_hi[k]] + \
                            by_tensor_id[tensor_lo[k]:tensor_hi[k]]:
                        if d > c and d not in queued:
                            queued.add(d)
                            heapq.heappush(heap, d)
                by_seq[s] = f
                by_tensor[t] = f                 # f >= what by_tensor held
    if floors:
        found = np.fromiter(floors.keys(), dtype=np.int64, count=len(floors))
        floor[calls.pair[found]] = np.fromiter(floors.values(), dtype=np.float64,
                                               count=len(floors))
    return np.where(floor > own_column, floor, 0.0)


class _Calls:
    """The calls of a step's pairs as rounding_floors walks them: their tensor records
    ("members"; a non-tensor argument's pair is in no call) grouped by call, the calls in the
    order they are visited (by their first seq, then as first met in pair order), each member's
    Python values, which members share a producer or a tensor, and per dx the dys of its call
    it is summed from (`_summed_from`)."""

    @classmethod
    def of(cls, a: RecordTable, b: RecordTable, ia: np.ndarray, ib: np.ndarray,
           own_column: np.ndarray) -> Optional["_Calls"]:
        """The calls; None where no floor begins (no dx is summed from a dy)."""
        members = np.flatnonzero(~scalar_records(b)[ib])
        if not len(members):
            return None
        rows = ia[members]
        role = a["role"]
        dy, dx = (role == _GRAD_OUTPUT)[rows], (role == _GRAD_INPUT)[rows]
        if not dy.any() or not dx.any():
            return None
        code = call_codes(a, ia)[members]
        ncodes = int(code.max()) + 1
        has_dy, has_dx = np.zeros(ncodes, dtype=bool), np.zeros(ncodes, dtype=bool)
        has_dy[code[dy]] = True
        has_dx[code[dx]] = True
        if not (has_dy & has_dx).any():
            return None
        seq = a["seq"][rows].astype(np.int64)
        first_seq = np.full(ncodes, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first_seq, code, seq)
        first_met = np.full(ncodes, len(members), dtype=np.int64)
        np.minimum.at(first_met, code, np.arange(len(members), dtype=np.int64))
        present = np.flatnonzero(first_met < len(members))
        visit = present[np.lexsort((first_met[present], first_seq[present]))]
        rank = np.zeros(ncodes, dtype=np.int64)
        rank[visit] = np.arange(len(visit), dtype=np.int64)
        call = rank[code]
        by_call = np.argsort(call, kind="stable")           # by call, each in pair order
        rows, call, seq, dy, dx = rows[by_call], call[by_call], seq[by_call], dy[by_call], \
            dx[by_call]
        members = members[by_call]
        summed_from, begins = _dx_summed_from(a, rows, call, dx, dy, own_column[members])
        if not begins:
            return None
        # the calls before the first where a floor begins are never visited: left out
        first = min(begins)
        base = int(np.searchsorted(call, first))
        self = cls()
        self.summed_from = {k - base: [q - base for q in dys] for k, dys in summed_from.items()}
        self.seeds = sorted(c - first for c in begins)
        self.pair = members[base:]
        rows, call, seq, dy = rows[base:], call[base:] - first, seq[base:], dy[base:]
        self.bounds = np.searchsorted(call, np.arange(len(visit) - first + 1)).tolist()
        self.own = own_column[self.pair].tolist()
        self.read = (dy | (role == Role.INPUT)[rows]).tolist()
        self.seq = seq.tolist()
        producer = a["producer"][rows].astype(np.int64) if "producer" in a else \
            np.full(len(rows), NO_PRODUCER, dtype=np.int64)
        tensor = a["tensor_id"][rows].astype(np.int64)
        self.producer, self.tensor = producer.tolist(), tensor.tolist()
        # per member, where the members it reaches lie: those whose producer is its seq, and
        # those of its tensor, in the members sorted by producer, by tensor
        order = np.argsort(producer, kind="stable")
        keys = producer[order]
        self.by_producer = call[order].tolist()
        self.producer_lo = np.searchsorted(keys, seq, "left").tolist()
        self.producer_hi = np.searchsorted(keys, seq, "right").tolist()
        order = np.argsort(tensor, kind="stable")
        keys = tensor[order]
        self.by_tensor_id = call[order].tolist()
        self.tensor_lo = np.searchsorted(keys, tensor, "left").tolist()
        self.tensor_hi = np.searchsorted(keys, tensor, "right").tolist()
        return self


def _dx_summed_from(a: RecordTable, rows: np.ndarray, call: np.ndarray, dx: np.ndarray,
                    dy: np.ndarray, own: np.ndarray) -> Tuple[Dict[int, List[int]], Set[int]]:
    """Per dx (its index k in `rows`, the members sorted by call), the dys q of its call that it
    is summed from (`_summed_from` of its op, its shape and q's), in order; and the calls where
    a floor begins (such a q of non-zero norm). `_summed_from` is asked once per (op, dx shape,
    dy shape), and only where the dx has fewer elements than the dy by a product of their
    dimensions in floats (within 1e-15 of the exact one; dy's raised by _SLACK): where that
    says no, so would `_summed_from`."""
    ks, qs = np.flatnonzero(dx), np.flatnonzero(dy)
    # each dx against each dy of its call, dys in order
    lo = np.searchsorted(call[qs], call[ks], "left")
    count = np.searchsorted(call[qs], call[ks], "right") - lo
    k = np.repeat(ks, count)
    q = qs[np.repeat(lo - np.cumsum(count) + count, count) + np.arange(int(count.sum()))]
    if not len(k):
        return {}, set()
    either = np.concatenate([k, q])
    ndim = a["ndim"][rows[either]].astype(np.int64)
    dims = a["shape"][rows[either]].astype(np.int64)
    kept = np.arange(dims.shape[1]) < ndim[:, None]
    odd = (kept & (dims < 0)).any(axis=1) | (ndim < 0)      # not a shape: always a maybe
    size = np.where(kept, dims, 1).astype(np.float64).prod(axis=1)
    dx_size = np.where(odd, -np.inf, size)[:len(k)]
    dy_size = np.where(odd, np.inf, np.where(ndim > 0, size * (1.0 + _SLACK), -np.inf))[len(k):]
    maybe = np.flatnonzero(dx_size < dy_size)
    k, q = k[maybe], q[maybe]
    if not len(k):
        return {}, set()
    chosen = _ask_summed_from(a, rows[k], rows[q])
    k, q = k[chosen], q[chosen]
    out: Dict[int, List[int]] = {}
    begins: Set[int] = set()
    for dx_k, dy_q, c, norm in zip(k.tolist(), q.tolist(), call[k].tolist(), own[q].tolist()):
        out.setdefault(dx_k, []).append(dy_q)
        if norm > 0.0:
            begins.add(c)
    return out, begins


_SLACK = 1e-9       # a float product of a shape's dimensions against its exact one: 1e-15 apart
_WEIGHTS = np.random.default_rng(45).random(64) + 0.5


def _ask_summed_from(a: RecordTable, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """`_summed_from(op, dx shape, dy shape)` per pair of records (`dx[i]`, `dy[i]`, the op
    dx's), asked once per distinct question: the questions are told apart by a hash of the op's
    code points and the dimensions, and each checked equal to the first with its hash (where
    one is not, each pair is asked as is)."""
    ops = a["op"][dx]
    shape_dx, shape_dy = _shapes_as_rows(a, dx), _shapes_as_rows(a, dy)
    op_hash = string_hashes(ops)
    if op_hash is not None:
        weights = _WEIGHTS[:shape_dx.shape[1]]
        question = op_hash * 7.0 + np.einsum("ij,j->i", shape_dx.astype(np.float64), weights) * \
            3.0 + np.einsum("ij,j->i", shape_dy.astype(np.float64), weights[::-1])
        _, first, inverse = np.unique(question, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        again = np.flatnonzero(first[inverse] != np.arange(len(dx)))
        same = first[inverse[again]]
        if np.array_equal(ops[again], ops[same]) and \
                np.array_equal(shape_dx[again], shape_dx[same]) and \
                np.array_equal(shape_dy[again], shape_dy[same]):
            answers = [_summed_from(*asked) for asked in _questions(a, dx[first], dy[first])]
            return np.asarray(answers, dtype=bool)[inverse]
    found: Dict[Tuple[str, Tuple[int, ...], Tuple[int, ...]], bool] = {}
    answers = []
    for asked in _questions(a, dx, dy):
        known = found.get(asked)
        if known is None:
            known = found[asked] = _summed_from(*asked)
        answers.append(known)
    return np.asarray(answers, dtype=bool)


def _questions(a: RecordTable, dx: np.ndarray, dy: np.ndarray
               ) -> List[Tuple[str, Tuple[int, ...], Tuple[int, ...]]]:
    """(op, dx's dimensions, dy's dimensions) per pair of records, as Python values."""
    def dims(rows: np.ndarray) -> List[Tuple[int, ...]]:
        return [tuple(d[:n]) for d, n in zip(a["shape"][rows].tolist(), a["ndim"][rows].tolist())]
    return list(zip(a["op"][dx].tolist(), dims(dx), dims(dy)))


def _shapes_as_rows(a: RecordTable, rows: np.ndarray) -> np.ndarray:
    """Per record, its dimensions `shape[:ndim]` as a row equal where they are: their number,
    then each (0 past the last)."""
    ndim = a["ndim"][rows].astype(np.int64)
    dims = a["shape"][rows].astype(np.int64)
    width = dims.shape[1]
    kept = np.clip(np.where(ndim < 0, width + ndim, ndim), 0, width)    # len(range(width)[:ndim])
    return np.concatenate([kept[:, None], np.where(np.arange(width) < kept[:, None], dims, 0)],
                          axis=1)


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
