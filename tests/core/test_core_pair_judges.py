"""The pair judges (precdbg/compare/judge/judges.py), each on record tables made by hand: no
framework, no training, no file. Each test builds the two runs' records of one step, runs the
judges in order and asserts each pair's status and the judge that decided it (`judged_by`)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pytest

from precdbg.compare.judge.judges import PAIR_JUDGES, judge_pairs
from precdbg.compare.judge.metrics import PARAM_TOLERANCE, TOLERANCE, tensor_metrics
from precdbg.compare.judge.multistep import NoisePolicy
from precdbg.compare.judge.pairs import PairStatus, PairTable, StepContext
from precdbg.records.schema import NO_PRODUCER
from precdbg.storage.reader import RecordTable

_DEFAULTS: Dict[str, Any] = {
    "entry": "Functional.linear.0.forward", "kind": "api", "direction": "forward",
    "role": "output", "module": "fc", "op": "linear", "arg_index": 0, "dtype": "float32",
    "shape": (4, 8), "min": -1.0, "max": 1.0, "mean": 0.1, "norm": 3.0,
    "pos_mean": float("nan"), "nan_count": 0, "inf_count": 0, "text": "", "checksum": "",
    "precision": "", "seq": 0, "producer": NO_PRODUCER, "tensor_id": -1, "trainable": True,
    "data_offset": -1, "storage": -1, "order": 1,
}


def _table(rows: Sequence[Dict[str, Any]]) -> RecordTable:
    """A record table of these records (fields as `_DEFAULTS` names them)."""
    full = [dict(_DEFAULTS, seq=k, **row) for k, row in enumerate(rows)]
    cols: Dict[str, np.ndarray] = {}
    for name in _DEFAULTS:
        if name == "shape":
            continue
        values = [r[name] for r in full]
        cols[name] = np.array(values) if not isinstance(values[0], str) else \
            np.array(values, dtype=str)
    cols["ndim"] = np.array([len(r["shape"]) for r in full], dtype=np.int64)
    shapes = np.zeros((len(full), 8), dtype=np.int64)
    for k, r in enumerate(full):
        shapes[k, :len(r["shape"])] = r["shape"]
    cols["shape"] = shapes
    cols["numel"] = np.array([int(np.prod(r["shape"])) for r in full], dtype=np.int64)
    for name in ("min", "max", "mean", "norm", "pos_mean"):
        cols[name] = cols[name].astype(np.float64)
    return RecordTable(cols)


def _judge(a_rows: List[Dict[str, Any]], b_rows: List[Dict[str, Any]],
           noise: Optional[NoisePolicy] = None, step: int = 0,
           tensors: Optional[List[Any]] = None, shim_pair: bool = False) -> PairTable:
    a, b = _table(a_rows), _table(b_rows)
    idx = np.arange(len(a_rows))
    t = PairTable(a, b, idx, idx.copy())
    if tensors is not None:
        t.tensors = [tensor_metrics(x, y) if x is not None else None for x, y in tensors]
    return judge_pairs(t, StepContext(step, 0, noise or NoisePolicy(alike=True), shim_pair))


def _verdicts(t: PairTable) -> List[tuple]:
    return [(t.status(p).value, str(t.judged_by[p])) for p in range(len(t))]


def test_the_judges_run_in_a_fixed_documented_order():
    assert [j.id for j in PAIR_JUDGES] == ["statistics", "rounding_floor", "update_noise",
                                           "element_wise", "integer_plumbing",
                                           "shim_conventions"]


# --------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("change, status", [
    ({}, "match"),
    ({"mean": 0.1 + 3.0 / np.sqrt(32) * TOLERANCE["float32"] * 0.5}, "match"),
    ({"mean": 0.1 + 3.0 / np.sqrt(32) * 1e-4}, "diverged"),     # 1e-4 of the RMS
    ({"shape": (8, 4)}, "diverged"),
    ({"nan_count": 1}, "diverged"),
    ({"pos_mean": 0.2}, "match"),            # the baseline has none (an old file): not judged
])
def test_statistics_against_the_float32_tolerance(change, status):
    t = _judge([{}], [change])
    assert _verdicts(t) == [(status, "statistics")]


def test_a_reordering_shows_in_pos_mean_when_both_have_it():
    t = _judge([{"pos_mean": 0.1}], [{"pos_mean": 0.1 + 3.0 / np.sqrt(32) * 1e-3}])
    assert _verdicts(t) == [("diverged", "statistics")]
    assert t.d_pos_mean[0] == pytest.approx(1e-3, rel=1e-6)


def test_equal_checksums_are_a_match_whatever_the_statistics():
    t = _judge([{"checksum": "ab12"}], [{"checksum": "ab12", "mean": 5.0}])
    assert _verdicts(t) == [("match", "checksum")]


def test_bfloat16_extremes_are_held_against_four_times_the_tolerance():
    tol = TOLERANCE["bfloat16"]
    t = _judge([{"dtype": "bfloat16"}] * 2,
               [{"dtype": "bfloat16", "max": 1.0 + 3 * tol},
                {"dtype": "bfloat16", "max": 1.0 + 5 * tol}])
    assert [s for s, _ in _verdicts(t)] == ["match", "diverged"]


def test_parameters_match_to_float32_rounding():
    t = _judge([{"kind": "param", "role": "param"}],
               [{"kind": "param", "role": "param", "mean": 0.1 + 3.0 / np.sqrt(32) * 1e-5}])
    assert t.tol[0] == PARAM_TOLERANCE and _verdicts(t) == [("diverged", "statistics")]


def test_a_non_tensor_argument_is_equal_or_not():
    t = _judge([{"dtype": "py.float", "text": "1e-05"}] * 2,
               [{"dtype": "py.float", "text": "1e-05"}, {"dtype": "py.float", "text": "0.01"}])
    assert _verdicts(t) == [("match", "statistics"), ("diverged", "statistics")]


def test_a_dtype_argument_after_the_precisions_parted_is_that_precision():
    a = [{"precision": "float32"}, {"dtype": "py.dtype", "text": "float32", "role": "input"}]
    b = [{"precision": "float16"}, {"dtype": "py.dtype", "text": "float16", "role": "input"}]
    t = _judge(a, b)
    assert t.status(1) is PairStatus.PRECISION


# --------------------------------------------------------------------------- rounding floor
def _bias_backward(bias_norm_b: float, dx_norm_b: float = 2.0) -> PairTable:
    """A linear's backward: dy (4, 8) of norm 2, dx (4, 8), and the bias gradient (8,),
    dy summed over the batch, which cancels to 1e-8 (rounding of terms of norm 2)."""
    common = {"direction": "backward", "entry": "Functional.linear.0.backward"}
    a = [dict(common, role="grad_output", shape=(4, 8), norm=2.0, min=-1.0, max=1.0, mean=0.0),
         dict(common, role="grad_input", shape=(4, 8), norm=2.0, min=-1.0, max=1.0, mean=0.0),
         dict(common, role="grad_input", arg_index=2, shape=(8,), norm=1e-8, min=-1e-8,
              max=1e-8, mean=0.0)]
    b = [dict(a[0]), dict(a[1], norm=dx_norm_b),
         dict(a[2], norm=bias_norm_b, min=-bias_norm_b, max=bias_norm_b)]
    return _judge(a, b)


def test_a_gradient_summed_to_rounding_is_judged_against_its_terms():
    t = _bias_backward(bias_norm_b=1.7e-8)            # 70 % apart, both rounding of dy
    assert _verdicts(t)[2] == ("match", "rounding_floor") and t.floor_decided[2]
    assert t.floor[2] == pytest.approx(2.0)


def test_a_real_change_of_such_a_gradient_is_still_found():
    t = _bias_backward(bias_norm_b=1e-8 + 2.0 * 1e-3)  # 1e-3 of the terms' norm
    assert _verdicts(t)[2] == ("diverged", "statistics")


def test_a_gradient_as_large_as_its_terms_gets_no_floor():
    t = _bias_backward(bias_norm_b=1e-8, dx_norm_b=2.0 * (1 + 1e-4))
    assert t.floor[1] == 0.0 and _verdicts(t)[1] == ("diverged", "statistics")


# --------------------------------------------------------------------------- update noise
def _param(mean: float) -> Dict[str, Any]:
    return {"kind": "param", "role": "param", "direction": "none", "entry": "Param.fc.weight",
            "module": "fc", "op": "weight", "mean": mean, "min": mean - 1, "max": mean + 1,
            "norm": 3.0}


def test_parameters_of_step_k_are_judged_by_their_last_update():
    noise = NoisePolicy(alike=True)
    t0 = _judge([_param(0.1)], [_param(0.1)], noise, step=0)
    noise.remember(0, 0, t0)
    # the update moved the mean by 0.01; the runs' updates differ by 0.1 % of it
    t1 = _judge([_param(0.11)], [_param(0.11 + 1e-5)], noise, step=1)
    assert _verdicts(t1) == [("match", "update_noise")]
    assert t1.update_share[0] == pytest.approx(1e-3, rel=1e-3)
    noise.remember(0, 0, t0)
    t2 = _judge([_param(0.11)], [_param(0.11 + 1e-3)], noise, step=1)   # 10 % of it
    assert _verdicts(t2) == [("diverged", "update_noise")]


def test_with_the_optimizer_set_up_apart_parameters_keep_float_rounding():
    noise = NoisePolicy(alike=False)
    t0 = _judge([_param(0.1)], [_param(0.1)], noise, step=0)
    noise.remember(0, 0, t0)
    t1 = _judge([_param(0.11)], [_param(0.11 + 1e-5)], noise, step=1)
    assert _verdicts(t1) == [("diverged", "statistics")]


# --------------------------------------------------------------------------- element-wise
def test_stored_tensors_are_judged_element_by_element():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    swapped = x.copy()
    swapped[0, [0, 1]] = swapped[0, [1, 0]]              # statistics unchanged
    t = _judge([{}] * 2, [{}] * 2, tensors=[(x, x.copy()), (swapped, x)])
    assert _verdicts(t) == [("match", "element_wise"), ("diverged", "element_wise")]


# --------------------------------------------------------------------------- integer plumbing
def test_integers_that_differ_where_every_float_agrees_are_plumbing():
    a = [{}, {"dtype": "int64", "role": "input", "mean": 3.0}]
    t = _judge(a, [{}, {"dtype": "int64", "role": "input", "mean": 4.0}])
    assert _verdicts(t) == [("match", "statistics"), ("integer", "integer_plumbing")]


# --------------------------------------------------------------------------- shim_conventions
_SOFTMAX = {"entry": "Functional.softmax.0.forward", "op": "softmax", "role": "input"}


def test_a_torch_shims_arguments_and_integers_are_its_conventions():
    """A shim's dump against PyTorch's: an argument paired by position with another one
    (`_stacklevel` 3 vs dtype float32) and positions built another way are conventions, while
    the floats that read them are judged as always (here one differs: it stays diverged)."""
    a = [dict(_SOFTMAX, dtype="py.int", text="3", arg_index=2),
         {"dtype": "int64", "role": "input", "mean": 3.5, "shape": ()},
         {"mean": 1.0}]
    b = [dict(_SOFTMAX, dtype="py.dtype", text="float32", arg_index=2),
         {"dtype": "int64", "role": "input", "mean": 3.5, "shape": (1, 8)},
         {}]
    assert _verdicts(_judge(a, b, shim_pair=True)) == [
        ("convention", "shim_conventions"), ("convention", "shim_conventions"),
        ("diverged", "statistics")]


def test_the_same_differences_between_two_pytorch_runs_stay_divergences():
    a = [dict(_SOFTMAX, dtype="py.int", text="3", arg_index=2),
         {"dtype": "int64", "role": "input", "mean": 3.5, "shape": ()}, {"mean": 1.0}]
    b = [dict(_SOFTMAX, dtype="py.dtype", text="float32", arg_index=2),
         {"dtype": "int64", "role": "input", "mean": 3.5, "shape": (1, 8)}, {}]
    assert [v[0] for v in _verdicts(_judge(a, b))] == ["diverged"] * 3


def test_integers_stay_divergences_where_a_float_differs_too():
    a = [{}, {"dtype": "int64", "role": "input", "mean": 3.0}]
    t = _judge(a, [{"mean": 1.0}, {"dtype": "int64", "role": "input", "mean": 4.0}])
    assert _verdicts(t) == [("diverged", "statistics"), ("diverged", "statistics")]


def test_checksums_without_statistics_decide_both_ways():
    # msprobe's summary_mode xor: no statistics on either side, a checksum on both
    none = {"min": float("nan"), "max": float("nan"), "mean": float("nan"),
            "norm": float("nan")}
    a = [dict(none, checksum="0x01"), dict(none, checksum="0x02"), dict(checksum="0x03")]
    b = [dict(none, checksum="0x01"), dict(none, checksum="0x0f"), dict(checksum="0x0e")]
    assert _verdicts(_judge(a, b)) == [("match", "checksum"), ("diverged", "checksum"),
                                       ("match", "statistics")]
