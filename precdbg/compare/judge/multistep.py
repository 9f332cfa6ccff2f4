"""Multi-step noise: judge step k >= 1 against the optimizer's update, not against rounding.

Across devices, thread counts or frameworks, step 0 agrees within float noise, but Adam divides
each gradient by its own RMS: a gradient near zero whose noise flips its sign becomes an update of
about +-lr of the opposite sign. The parameters at the start of step k then differ by far more
than float rounding although nothing is wrong. When the optimizers are configured alike (`precdbg
check` finds no optimizer, param-group, loss-scale or optimizer-semantics difference) and the
previous step of the same rank was compared, a `NoisePolicy` judges:

* a parameter at the start of step k by how much the runs' last updates disagree, as a share
  of the baseline's update: with s_a, s_b its statistics (min, max, mean, norm, and pos_mean
  where the dumps have it: an update the runs apply to other elements moves it) in baseline
  and candidate, `share = max_stat |(s_b(k) - s_b(k-1)) - (s_a(k) - s_a(k-1))| / max_stat |s_a(k) -
  s_a(k-1)|`. Comparing updates, not values, keeps earlier steps' noise from accumulating. It
  diverges when `share > UPDATE_SHARE`. Measured on the bundled GPT (AdamW lr 1e-2): 1 vs 2 CPU
  threads over 8 steps share <= 0.0032 (<= 0.0039 with pos_mean) (parameter err up to 1.6e-4); PyTorch vs MindSpore, SGD
  momentum 0.9, 3 steps <= 2.5e-5; real differences: lr 1.1e-2 vs 1e-2 >= 0.098 on every
  parameter, MindSpore AdamWeightDecay (no bias correction) vs torch AdamW >= 1.05, weight decay
  0.01 in one run only up to 3.2 (but about 0.01 on LayerNorm weights). UPDATE_SHARE = 0.02.
* every other record of step k against a noise floor: the parameters it computes from already
  differ by `param_err` (the largest relative error of any parameter at the start of the step),
  and a forward/backward pass carries that over with a small gain (measured: the largest record
  error / param_err <= 1.92 over 8 steps at 1 vs 2 threads); `tol = max(dtype tolerance,
  NOISE_GAIN * param_err)`, NOISE_GAIN = 5. A real defect of step k above that floor is still
  found (a 1e-3 change of one output at step 2, floor 8.5e-5 there). With stored tensors
  (task "tensor") the records' relative RMSE is judged against `max(that floor, TENSOR_GAIN *
  the parameters' largest relative RMSE)`, TENSOR_GAIN = 1: Adam's noise concentrates on a
  few elements, so the parameters' element-wise error (3.0e-4 at step 2, 1 vs 2 threads) exceeds
  what the records inherit (<= 8.2e-5, ratio 0.28). A record that reads a parameter reads the
  same tensor and gets the parameter's verdict.
* a parameter whose weight gradient at step k-1 agreed but was rounding noise in both runs (its
  norm at most ROUNDING_SHARE_OF_NOISE times the rounding, tolerance x floor, of the gradient
  it was summed from: precdbg.compare.judge.floors; a BERT attention key bias, 3e-12 against terms of
  1e-5) is not judged: Adam makes about +-lr of such noise (8 % apart at 1 vs 2 threads), and
  the runs' other parameters show any optimizer difference. It sets no floor for the others.

With differing optimizer set-up the strict parameter tolerance stays, and the verdict names the
set-up finding. The parameter explanation gives the share and whether last step's weight
gradients (dw) agreed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ...records.schema import READ_ROLES, RecordKind, Role, scalar_mask
from .metrics import PARAM_TOLERANCE
from .pairs import PairTable
from .rows import Note, NoteCode

__all__ = ["JUDGE_ID", "NoisePolicy", "UPDATE_SHARE", "NOISE_GAIN", "TENSOR_GAIN",
           "optimizer_setup"]

JUDGE_ID = "update_noise"
UPDATE_SHARE = 0.02
NOISE_GAIN = 5.0
TENSOR_GAIN = 1.0
ROUNDING_SHARE_OF_NOISE = 10.0   # a gradient under 10x its rounding floor's error is noise
_STATS = ("min", "max", "mean", "norm")
_PARAM, _PARAM_GRAD = RecordKind.PARAM, RecordKind.PARAM_GRAD
_OPTIMIZER_KINDS = {"optimizer", "optimizer_groups", "loss_scale"}
Key = Tuple[str, str]          # (module, op): a parameter, and its gradient record


def optimizer_setup(findings: Sequence[Dict[str, Any]], conventions: bool = True) -> List[str]:
    """The messages of the `check` findings that make the optimizer updates differ: optimizer
    class, hyperparameters, param groups, loss scale, and semantic notes about optimizers.
    `conventions=False` leaves out the notes of low impact (two frameworks' conventions that
    show only in corner cases, e.g. where Adam puts eps): those do not stop a `NoisePolicy`
    from judging parameters by their update, which measures how much they matter."""
    from ...check.values import semantics
    optimizer_notes = {str(e.get("id")) for e in semantics()["entries"]
                       if "optimizer" in (e.get("applies_when") or {})}
    return [str(f["message"]) for f in findings if f["kind"] in _OPTIMIZER_KINDS
            or (f["kind"] == "semantics" and str(f.get("id")) in optimizer_notes
                and (conventions or f.get("severity") != "low"))]


@dataclasses.dataclass
class _Last:
    """What a rank's previous compared step left: its step, the baseline's parameter statistics,
    and whether each weight gradient agreed."""
    step: int
    stats: Dict[Key, Tuple[np.ndarray, np.ndarray]]     # (baseline, candidate)
    dw_agreed: Dict[Key, bool]
    dw_rounding: Dict[Key, bool]     # the weight gradient was below its rounding floor


class NoisePolicy:
    """Carried across the steps of one compare (steps ascending); `alike` is False when the
    optimizer set-up differs, and then nothing is relaxed."""

    def __init__(self, alike: bool, unknown: Sequence[str] = (),
                 conventions: Sequence[str] = ()) -> None:
        self.alike = alike
        self.unknown = list(unknown)     # the runs without a manifest (their optimizer unknown)
        self.conventions = list(conventions)   # optimizer notes of low impact (still alike)
        self._last: Dict[int, _Last] = {}
        self._judged: Dict[int, int] = {}     # step -> parameters judged by their update
        self._rounding: Dict[int, List[str]] = {}   # step -> parameters updated from rounding

    def settle(self, rank: int, entries: Sequence[Any]) -> None:
        """After a step of `rank` (its compare.entries.Entry list): a step that differs is no
        base for the next one (it is only relaxed after a step that agreed)."""
        self.settle_apart(rank, any(e.diverged or e.trainable_differs for e in entries))

    def settle_apart(self, rank: int, apart: bool) -> None:
        """`settle`, told whether any entry of the step differs (`apart`)."""
        if apart:
            self._last.pop(rank, None)

    def merge(self, other: "NoisePolicy") -> None:
        """Add what `other` (the same policy carried over other ranks, in a worker process of
        `compare --jobs`) judged: parameters judged by their update and those updated from
        rounding. Merged in ascending rank order, the notes read as one process's."""
        for step, count in other._judged.items():
            self._judged[step] = self._judged.get(step, 0) + count
        for step, names in other._rounding.items():
            self._rounding.setdefault(step, []).extend(names)

    def forget_steps(self) -> None:
        """Let go of what the next steps would be judged against (a rank whose steps are all
        compared): what `merge` takes, the judged counts and names, stays."""
        self._last.clear()

    def notes(self) -> List[Note]:
        """Its notes, as codes and facts (report/note_words.py `note_text` writes them)."""
        out = []
        for step, names in sorted(self._rounding.items()):
            out.append(Note(NoteCode.UPDATE_OF_ROUNDING,
                            facts={"step": step, "count": len(names), "first": names[0]}))
        if not self._judged:
            return out
        steps = sorted(self._judged)
        if not self.alike:
            return [Note(NoteCode.JUDGED_BY_ROUNDING, facts={"steps": steps})]
        return out + [Note(NoteCode.JUDGED_BY_UPDATE,
                           facts={"steps": steps, "unknown": list(self.unknown),
                                  "conventions": bool(self.conventions)})]

    def adjust(self, step: int, rank: int, st: PairTable) -> None:
        """Judge `update_noise` (this module's docstring): rewrite the pair table of step k
        (the statistics' and rounding floors' verdicts; `tensors`, the element-wise metrics
        where stored): the parameters' tolerance from their last update (a read of a
        parameter is judged with it), the other records' from the parameters' difference.
        Sets `update_share` (NaN where not judged), `by_update` (judged by it: the
        element-wise metrics do not override) and `dw_agreed` (-1 unknown, 0, 1)."""
        ta, tb, ia, ib, tms = st.a, st.b, st.ia, st.ib, st.tensors
        n = len(ia)
        last = self._last.get(rank)
        if last is None or last.step != step - 1 or n == 0:
            return
        kind = tb["kind"][ib]
        is_param = (kind == _PARAM) & (ta["role"][ia] == Role.PARAM)
        keys = list(zip(ta["module"][ia].tolist(), ta["op"][ia].tolist()))
        now_a, now_b = _statistics(ta, ia), _statistics(tb, ib)
        param_err = param_rmse = 0.0
        for p in np.nonzero(is_param)[0].tolist():
            before = last.stats.get(keys[p])
            if keys[p] in last.dw_agreed:
                st.dw_agreed[p] = int(last.dw_agreed[keys[p]])
            if before is None or not st.shape_ok[p] or not st.counts_ok[p]:
                continue
            update_a, update_b = now_a[p] - before[0], now_b[p] - before[1]
            if np.isnan(update_a).all():     # no statistics (msprobe's xor checksums only)
                continue
            update = float(np.nanmax(np.abs(update_a)))
            diff = float(np.nanmax(np.abs(update_b - update_a)))
            if not np.isfinite(diff) or not np.isfinite(update):
                continue
            share = diff / update if update > 0 else (0.0 if diff == 0 else np.inf)
            st.update_share[p] = share
            self._judged[step] = self._judged.get(step, 0) + 1
            if not self.alike:        # explained by its update, judged by rounding
                continue
            err = float(st.err[p])
            if last.dw_rounding.get(keys[p]) and last.dw_agreed.get(keys[p]):
                # updated from rounding noise alone in both runs: whatever the optimizer made
                # of it (Adam: about +-lr) is no divergence, nor a floor for the other records
                st.tol[p] = max(PARAM_TOLERANCE, err)
                st.by_update[p] = True
                st.judged_by[p] = JUDGE_ID
                st.diverged[p] = False
                if err > PARAM_TOLERANCE:
                    self._rounding.setdefault(step, []).append(str(ta["entry"][ia[p]]))
                continue
            # in err's units: the error this parameter may have at UPDATE_SHARE of its update
            # (the same updates: what differs was there before, and step k-1 agreed)
            limit = err * UPDATE_SHARE / share if share > 0 else err
            st.tol[p] = max(PARAM_TOLERANCE, limit)
            st.by_update[p] = True
            st.judged_by[p] = JUDGE_ID
            st.diverged[p] = bool(err > st.tol[p]) and not st.checksum_equal[p]
            tm = tms[p]
            param_err = max(param_err, err)
            param_rmse = max(param_rmse, tm["rel_rmse"] if tm is not None else 0.0)
        if not self.alike:
            return
        self._reads_of_parameters(ta, ia, st)
        stored = np.array([tm is not None for tm in tms], dtype=bool)
        floor = np.where(stored, max(NOISE_GAIN * param_err, TENSOR_GAIN * param_rmse),
                         NOISE_GAIN * param_err)
        others = ~is_param & ~st.by_update & (kind != _PARAM) & \
            ~scalar_mask(tb["dtype"][ib]) & (st.tol < floor)
        if others.any():
            st.tol = np.where(others, floor, st.tol)
            st.decide(others, st.differs(), JUDGE_ID)

    @staticmethod
    def _reads_of_parameters(ta: RecordTable, ia: np.ndarray, st: PairTable) -> None:
        """A record that reads a parameter (its producer is the parameter's record at the start
        of the step) reads the same tensor: it gets the parameter's tolerance, and is judged by
        its own statistics (something not captured may have changed it in between)."""
        judged = np.nonzero(st.by_update)[0]
        if not len(judged):
            return
        of_seq = dict(zip(ta["seq"][ia[judged]].tolist(), judged.tolist()))
        producer, role = ta["producer"][ia], ta["role"][ia]
        for q in range(len(ia)):
            p = of_seq.get(int(producer[q]))
            if p is not None and role[q] in READ_ROLES and not st.by_update[q]:
                st.tol[q] = st.tol[p]
                st.diverged[q] = st.differs(q)
                st.by_update[q] = True
                st.judged_by[q] = JUDGE_ID

    def remember(self, step: int, rank: int, st: PairTable) -> None:
        """After the step's verdicts per pair (the judged pair table): keep what step k+1 is
        judged against."""
        ta, tb, ia, ib = st.a, st.b, st.ia, st.ib
        kind = ta["kind"][ia]
        params = np.nonzero((kind == _PARAM.value) & (ta["role"][ia] == Role.PARAM.value))[0]
        grads = np.nonzero(kind == _PARAM_GRAD.value)[0]
        stats: Dict[Key, Tuple[np.ndarray, np.ndarray]] = {}
        if len(params):
            at_a, at_b = ia[params], ib[params]
            now_a, now_b = _statistics(ta, at_a), _statistics(tb, at_b)
            keys = zip(ta["module"][at_a].tolist(), ta["op"][at_a].tolist())
            # rows of their own arrays: a view would keep the step's whole statistics table
            # alive per rank
            for key, sa, sb in zip(keys, now_a, now_b):
                stats[key] = (sa, sb)
        dw: Dict[Key, bool] = {}
        rounding: Dict[Key, bool] = {}
        if len(grads):
            at = ia[grads]
            own = np.fmax(np.abs(ta["norm"][at].astype(np.float64)),
                          np.abs(tb["norm"][ib[grads]].astype(np.float64)))
            # rounding of the sum is at least a tenth of the gradient: noise, not signal
            noise = own <= ROUNDING_SHARE_OF_NOISE * st.tol[grads] * st.floor[grads]
            keys = zip(ta["module"][at].tolist(), ta["op"][at].tolist())
            for key, bad, small in zip(keys, st.diverged[grads].tolist(), noise.tolist()):
                dw[key] = dw.get(key, True) and not bad
                rounding[key] = rounding.get(key, True) and small
        self._last[rank] = _Last(step, stats, dw, rounding)


def _statistics(t: RecordTable, idx: np.ndarray) -> np.ndarray:
    """Per record, its statistics as the update share compares them: min, max, mean, norm and
    the order-sensitive pos_mean (NaN where the dump has none: a file written before it, whose
    update is then judged by the other four)."""
    columns = [t[s][idx] for s in _STATS]
    columns.append(t["pos_mean"][idx] if "pos_mean" in t else np.full(len(idx), np.nan))
    return np.stack(columns, axis=1).astype(np.float64)


def other_setup(findings: Sequence[Dict[str, Any]], optimizer: Sequence[str]) -> List[str]:
    """The messages of high and medium `check` findings that are not optimizer set-up (nor
    the parameters' values at the checked step's start: what a parameter verdict itself says)."""
    return [str(f["message"]) for f in findings if f.get("severity") in ("high", "medium")
            and str(f["message"]) not in optimizer
            and f.get("kind") not in ("incomplete", "initial_values")]
