"""Judge dw_beyond_inputs (precdbg/compare/judge/dw_beyond_inputs.py): a weight gradient whose
relative error is RATIO times what its module read (x, dy) and its weights at the step's start,
on hand-made entries of one step; no framework."""
from __future__ import annotations

import math

from precdbg.compare.judge.dw_beyond_inputs import JUDGE_ID, RATIO, gradients_beyond_inputs
from precdbg.compare.judge.entries import Entry, StepEntries
from precdbg.compare.judge.rows import Evidence


def _bad(role: str, err) -> Evidence:
    return Evidence(role, 0, {}, True, {"err": err, "tol": 2e-5})


AGREES = ...      # no differing tensor (None: one whose error is unknown, a shape apart)


def _entry(kind: str, direction: str, name: str, module: str = "mlp.down", op: str = "linear",
           read_bad=AGREES, read_ok_err: float = 0.0, out_bad=AGREES, rank: int = 0) -> Entry:
    e = Entry(1, rank, direction, kind, name, name, module, op, 1, 0)
    e.inputs_ok_err = read_ok_err
    if read_bad is not AGREES:
        e.inputs_bad = [_bad("input", read_bad)]
    if out_bad is not AGREES:
        e.outputs_bad = [_bad("output", out_bad)]
    return e


def _step(dw_err, weight_err=2e-3, dy_err=1e-3, x_ok_err=1e-6, backward=True, rank=0):
    entries = [
        _entry("module", "forward", "Module.mlp.down.Linear.forward.0", read_ok_err=x_ok_err,
               out_bad=5e-3, rank=rank),
        _entry("param", "none", "Param.mlp.down.weight", op="weight", out_bad=weight_err,
               rank=rank),
        _entry("param_grad", "backward", "Param.mlp.down.weight.grad", op="weight",
               out_bad=dw_err, rank=rank)]
    if backward:
        entries.append(_entry("module", "backward", "Module.mlp.down.Linear.backward.0",
                              read_bad=dy_err, out_bad=4e-3, rank=rank))
    return StepEntries(1, entries)


def test_a_gradient_far_beyond_its_reads_is_found_with_its_ratio():
    found = gradients_beyond_inputs(_step(0.3), 0)
    assert JUDGE_ID == "dw_beyond_inputs" and len(found) == 1
    g = found[0]
    assert g.entry.name == "Param.mlp.down.weight.grad"
    assert math.isclose(g.err, 0.3) and math.isclose(g.explained, 2e-3)   # the weight's
    assert math.isclose(g.ratio, 150.0)
    assert g.facts()["ratio"] == g.ratio


def test_the_largest_read_explains_the_gradient():
    # dy differs as much as the dw: a consequence, not a cause
    assert gradients_beyond_inputs(_step(0.3, dy_err=0.05), 0) == []
    # just under and just over RATIO times the largest read
    assert gradients_beyond_inputs(_step(2e-3 * RATIO * 0.99), 0) == []
    assert len(gradients_beyond_inputs(_step(2e-3 * RATIO * 1.01), 0)) == 1
    # an agreeing read counts with its own error
    assert gradients_beyond_inputs(_step(0.3, x_ok_err=0.02), 0) == []


def test_nothing_is_judged_without_what_the_module_read():
    # no backward record of the module (level api, or a module not hooked): no dy known
    assert gradients_beyond_inputs(_step(0.3, backward=False), 0) == []
    # an unknown error (a shape that differs) explains anything
    assert gradients_beyond_inputs(_step(0.3, dy_err=None), 0) == []
    # another rank's entries are not this rank's
    assert gradients_beyond_inputs(_step(0.3, rank=1), 0) == []


def test_an_agreeing_weight_and_reads_give_an_unbounded_ratio():
    found = gradients_beyond_inputs(_step(0.3, weight_err=AGREES, dy_err=AGREES, x_ok_err=0.0), 0)
    assert len(found) == 1 and math.isinf(found[0].ratio) and found[0].facts()["ratio"] is None
    assert gradients_beyond_inputs(_step(0.3, weight_err=None), 0) == []


def test_a_gradient_all_zero_in_one_run_only_is_found_whatever_the_ratio():
    """mindnlp 0.5.1's GPT-2 wpe: all zero on the shim (its graph cut there: no backward record
    of the module in that run), its weights 13% apart: found, first, by the zero alone."""
    step = _step(0.4, weight_err=0.13, backward=False)
    dw = next(e for e in step.entries if e.kind == "param_grad")
    dw.outputs_bad[0].metrics.update(norm_a=0.41, norm_b=0.0)
    found = gradients_beyond_inputs(step, 0)
    assert len(found) == 1 and found[0].zero_in == "candidate"
    assert math.isclose(found[0].ratio, 0.4 / 0.13)
    # zero in both runs, or in neither: the ratio decides, and without dy nothing is judged
    dw.outputs_bad[0].metrics.update(norm_a=0.0, norm_b=0.0)
    assert gradients_beyond_inputs(step, 0) == []
