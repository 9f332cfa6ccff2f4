"""What the set-up checks read off the calls a run made: the dtypes each op computes in, and
which ops draw random numbers."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ..records.precision import is_floating
from ..records.schema import Direction, RecordKind, Role
from .values import _Run

__all__ = ["RANDOM_OPS", "compute_dtypes", "dtype_counts", "dtype_mix", "first_apart"]


# ops whose output dtype is their input's or the one they are asked for: they follow the
# compute dtype and would only repeat it (casts are the point of their call)
_FOLLOWING_OPS = frozenset({
    "cast", "copy", "contiguous", "clone", "detach", "view", "view_as", "reshape", "expand",
    "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose", "t",
    "getitem", "setitem", "cat", "stack", "split", "chunk", "unbind", "narrow", "select",
    "index_select", "gather", "repeat", "neg", "zeros_like", "ones_like", "empty_like",
    "full_like", "zeros", "ones", "empty", "full", "arange", "tensor", "pad"})


# canonical ops that draw random numbers (a seed changes what they compute)
RANDOM_OPS = frozenset({
    "dropout", "alpha_dropout", "feature_alpha_dropout", "drop_path", "rand", "randn",
    "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "multinomial",
    "normal", "uniform", "exponential", "geometric", "cauchy", "log_normal", "random", "rrelu",
    "gumbel_softmax", "poisson", "standard_normal", "standard_laplace", "gamma", "random_gamma",
    "random_categorical", "uniform_int", "uniform_real", "dropout_gen_mask", "dropout_do_mask",
    "fused_dropout", "native_dropout"})


def compute_dtypes(run: _Run) -> Dict[str, List[Tuple[int, str, str]]]:
    """op -> [(seq, float dtype, module)] of one run's forward API outputs in floating point,
    in execution order."""
    t = run.table
    out: Dict[str, List[Tuple[int, str, str]]] = {}
    if not len(t):
        return out
    mask = (t["kind"] == RecordKind.API) & (t["direction"] == Direction.FORWARD) & \
        (t["role"] == Role.OUTPUT)
    idx = np.nonzero(mask)[0]
    idx = idx[np.argsort(t["seq"][idx], kind="stable")]
    # each column read once for all the calls (Python values), each dtype looked up once
    ops, dtypes = t["op"][idx].tolist(), t["dtype"][idx].tolist()
    modules, seqs = t["module"][idx].tolist(), t["seq"][idx].tolist()
    floating = {dtype: is_floating(dtype) for dtype in set(dtypes)}
    for op, dtype, module, seq in zip(ops, dtypes, modules, seqs):
        if op not in _FOLLOWING_OPS and floating[dtype]:
            out.setdefault(op, []).append((seq, dtype, module))
    return out


def dtype_counts(calls: List[Tuple[int, str, str]]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for _, dtype, _ in calls:
        counts[dtype] = counts.get(dtype, 0) + 1
    return counts


def first_apart(a: List[Tuple[int, str, str]], b: List[Tuple[int, str, str]]
                 ) -> Tuple[int, str]:
    """(seq, module) in run a of the first call of an op whose dtype is not the one of the
    other run's call at the same position; where they all agree and one run calls it more
    often, its first call beyond the other's (a loss scaler's float32 unscale after the
    float16 model), in that run."""
    for (seq, dtype_a, module), (_, dtype_b, _) in zip(a, b):
        if dtype_a != dtype_b:
            return seq, module
    longer = a if len(a) > len(b) else b
    extra = longer[min(len(a), len(b), len(longer) - 1)]
    return extra[0], extra[2]


def dtype_mix(counts: Dict[str, int]) -> str:
    if len(counts) == 1:
        return next(iter(counts))
    return " + ".join(f"{n} {dtype}" for dtype, n in sorted(counts.items(), key=lambda x: -x[1]))
