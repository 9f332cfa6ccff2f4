"""Multi-step noise: judge step k >= 1 against the optimizer's update, not against rounding.

Across devices, thread counts or frameworks, step 0 agrees within float noise, but Adam divides
each gradient by its own RMS: a gradient near zero whose noise flips its sign becomes an update of
about +-lr of the opposite sign. The parameters at the start of step k then differ by far more
than float rounding although nothing is wrong. When the optimizers are configured alike (`precdbg
check` finds no optimizer, param-group, loss-scale or optimizer-semantics difference) and the
previous step of the same rank was compared, a `NoisePolicy` judges:

* a parameter at the start of step k by the share of its last update that the runs disagree on:
  `share = max_stat |s_b(k) - s_a(k)| / max_stat |s_a(k) - s_a(k-1)|` over min, max, mean and
  norm (s_a: baseline, s_b: candidate). It diverges when `share > UPDATE_SHARE` (and its error
  is beyond float rounding). Measured on the bundled GPT (AdamW lr 1e-2, 3 steps): 1 vs 2 CPU
  threads share <= 0.0023 (err up to 1.7e-5); a 10 % different lr 0.1, no bias correction (the
  MindSpore AdamWeightDecay) >= 0.3. UPDATE_SHARE = 0.02 sits between.
* every other record of step k against a noise floor: the parameters it computes from already
  differ by `param_err` (the largest relative error of any parameter at the start of the step),
  and a forward/backward pass amplifies that by a small factor (measured <= 2.5 at 1 vs 2
  threads); `tol = max(dtype tolerance, NOISE_GAIN * param_err)`, NOISE_GAIN = 10. A real defect
  of step k above that floor is still found (the floor is 1.7e-4 relative at 1 vs 2 threads).

With differing optimizer set-up the strict parameter tolerance stays, and the verdict names the
set-up finding. The parameter explanation gives the share and whether last step's weight
gradients (dw) agreed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..reader import RecordTable
from ..schema import RecordKind, Role, scalar_mask
from .metrics import PARAM_TOLERANCE

__all__ = ["NoisePolicy", "UPDATE_SHARE", "NOISE_GAIN", "optimizer_setup", "param_reason"]

UPDATE_SHARE = 0.02
NOISE_GAIN = 10.0
_STATS = ("min", "max", "mean", "norm")
_PARAM, _PARAM_GRAD = RecordKind.PARAM.value, RecordKind.PARAM_GRAD.value
_OPTIMIZER_KINDS = {"optimizer", "optimizer_groups", "loss_scale"}
Key = Tuple[str, str]          # (module, op): a parameter, and its gradient record


def optimizer_setup(findings: Sequence[Dict[str, Any]]) -> List[str]:
    """The messages of the `check` findings that make the optimizer updates differ: optimizer
    class, hyperparameters, param groups, loss scale, and semantic notes about optimizers."""
    from ..check.values import semantics
    optimizer_notes = {str(e.get("id")) for e in semantics()["entries"]
                       if "optimizer" in (e.get("applies_when") or {})}
    return [str(f["message"]) for f in findings if f["kind"] in _OPTIMIZER_KINDS
            or (f["kind"] == "semantics" and str(f.get("id")) in optimizer_notes)]


@dataclasses.dataclass
class _Last:
    """What a rank's previous compared step left: its step, the baseline's parameter statistics,
    and whether each weight gradient agreed."""
    step: int
    stats: Dict[Key, np.ndarray]
    dw_agreed: Dict[Key, bool]


class NoisePolicy:
    """Carried across the steps of one compare (steps ascending); `alike` is False when the
    optimizer set-up differs, and then nothing is relaxed."""

    def __init__(self, alike: bool) -> None:
        self.alike = alike
        self._last: Dict[int, _Last] = {}

    def adjust(self, step: int, rank: int, ta: RecordTable, tb: RecordTable, ia: np.ndarray,
               ib: np.ndarray, st: Dict[str, np.ndarray]) -> None:
        """Rewrite `st` (metrics.stat_errors of the pairs ia/ib) for step k: the parameters'
        tolerance from their last update, the other records' from the parameters' difference.
        Adds `update_share` (NaN where not judged) and `dw_agreed` (-1 unknown, 0, 1)."""
        n = len(ia)
        st["update_share"] = np.full(n, np.nan)
        st["dw_agreed"] = np.full(n, -1, dtype=np.int8)
        last = self._last.get(rank)
        if last is None or last.step != step - 1 or n == 0:
            return
        kind = tb["kind"][ib]
        is_param = (kind == _PARAM) & (ta["role"][ia] == Role.PARAM.value)
        keys = list(zip(ta["module"][ia].tolist(), ta["op"][ia].tolist()))
        now_a = np.stack([ta[s][ia] for s in _STATS], axis=1).astype(np.float64)
        now_b = np.stack([tb[s][ib] for s in _STATS], axis=1).astype(np.float64)
        param_err = 0.0
        for p in np.nonzero(is_param)[0].tolist():
            before = last.stats.get(keys[p])
            if keys[p] in last.dw_agreed:
                st["dw_agreed"][p] = int(last.dw_agreed[keys[p]])
            if before is None or not st["shape_ok"][p] or not st["counts_ok"][p]:
                continue
            update = float(np.nanmax(np.abs(now_a[p] - before)))
            diff = float(np.nanmax(np.abs(now_b[p] - now_a[p])))
            if not np.isfinite(diff) or not np.isfinite(update):
                continue
            share = diff / update if update > 0 else (0.0 if diff == 0 else np.inf)
            st["update_share"][p] = share
            if not self.alike:        # explained by its update, judged by rounding
                continue
            err = float(st["err"][p])
            # in err's units: the error this parameter may have at UPDATE_SHARE of its update
            limit = err * UPDATE_SHARE / share if share > 0 else np.inf
            st["tol"][p] = max(PARAM_TOLERANCE, limit)
            st["diverged"][p] = bool(err > st["tol"][p]) and not st["checksum_equal"][p]
            param_err = max(param_err, err)
        floor = NOISE_GAIN * param_err
        if not self.alike:
            return
        others = ~is_param & (kind != _PARAM) & ~scalar_mask(tb["dtype"][ib]) & \
            (st["tol"] < floor)
        if floor > 0 and others.any():
            st["tol"] = np.where(others, floor, st["tol"])
            st["diverged"] = np.where(others, (st["err"] > floor) & st["shape_ok"]
                                      & st["counts_ok"] & ~st["checksum_equal"],
                                      st["diverged"])

    def remember(self, step: int, rank: int, ta: RecordTable, ia: np.ndarray,
                 diverged: np.ndarray) -> None:
        """After the step's verdicts per pair: keep what step k+1 is judged against."""
        kind, role = ta["kind"][ia], ta["role"][ia]
        keys = list(zip(ta["module"][ia].tolist(), ta["op"][ia].tolist()))
        stats: Dict[Key, np.ndarray] = {}
        dw: Dict[Key, bool] = {}
        for p in range(len(ia)):
            if kind[p] == _PARAM and role[p] == Role.PARAM.value:
                stats[keys[p]] = np.array([ta[s][ia[p]] for s in _STATS], dtype=np.float64)
            elif kind[p] == _PARAM_GRAD:
                dw[keys[p]] = dw.get(keys[p], True) and not bool(diverged[p])
        self._last[rank] = _Last(step, stats, dw)


def param_reason(step: int, metrics: Dict[str, Any], previous_matched: bool,
                 setup: Sequence[str]) -> str:
    """Why a parameter differs at the start of `step`, in terms a user can check."""
    if not previous_matched:
        return "parameter values differ at start"
    head = (f"parameters differ at the start of step {step} while step {step - 1} matched: "
            "the optimizer update differs")
    share, dw = metrics.get("update_share"), metrics.get("dw_agreed")
    facts = []
    if share is not None:
        facts.append(f"the runs disagree on {share:.1%} of its last update (the baseline's "
                     f"change since step {step - 1}; float noise through the optimizer stays "
                     f"under {UPDATE_SHARE:.0%})")
    if dw is not None and dw >= 0:
        facts.append(f"step {step - 1}'s weight gradient (dw) "
                     + ("agreed, so the optimizer computed a different update from the same "
                        "gradient" if dw else "already differed"))
    if setup:
        facts.append("set-up: " + "; ".join(setup[:2]))
    else:
        facts.append("optimizer type, hyperparameters, param groups or loss scale")
    return head + " (" + "; ".join(facts) + ")"
