"""Judge `unseen_inputs` (precdbg/compare/judge/unseen_inputs.py): a call whose inputs agree by
every statistic while its output is far beyond tolerance, on entries made by hand and on
synthetic dumps (tests/core/synthetic.py, written without pos_mean, so a swap of two values is
invisible to their statistics). Assertions are on codes and values."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import pytest

from precdbg.compare import compare_dumps
from precdbg.compare.judge.entries import Entry
from precdbg.compare.judge.rows import Evidence
from precdbg.compare.judge.unseen_inputs import UNSEEN_FACTOR, Decision, unseen_inputs

import synthetic as S


def _entry(ratio: float, reads: List[Tuple[str, int, Optional[bool], bool]],
           op: str = "conv2d", tol: float = 2e-5, args_bad: bool = False) -> Entry:
    e = Entry(0, 0, "forward", "api", f"Functional.{op}.0.forward",
              f"Functional.{op}.0.forward", "conv1", op, 1, 3)
    e.outputs_bad.append(Evidence("output", 0, "", True, {"err": ratio * tol, "tol": tol}))
    e.reads_agreeing.extend(reads)
    e.inputs_ok = len(reads)
    if args_bad:
        from precdbg.compare.judge.rows import ArgDiff
        e.args_bad.append(ArgDiff("input", 3, "eps", "1e-5", "1e-2"))
    return e


STATS = [("input", 0, None, True), ("input", 1, None, True)]


def test_far_beyond_tolerance_with_agreeing_inputs_is_undecided_without_checksums():
    found = unseen_inputs(_entry(2700.0, STATS))
    assert found is not None and found.decision is Decision.UNDECIDED
    assert found.ratio == pytest.approx(2700.0)


def test_below_the_factor_the_call_stays_the_culprit():
    assert unseen_inputs(_entry(UNSEEN_FACTOR * 0.5, STATS)) is None


@pytest.mark.parametrize("equal, decision, differ", [
    ((False, True), Decision.INPUTS_DIFFER, [("input", 0)]),
    ((True, True), Decision.OP_DIFFERS, []),
    ((True, None), Decision.UNDECIDED, []),
])
def test_checksums_decide(equal, decision, differ):
    reads = [("input", i, eq, True) for i, eq in enumerate(equal)]
    found = unseen_inputs(_entry(500.0, reads))
    assert found is not None and (found.decision, found.checksums_differ) == (decision, differ)


@pytest.mark.parametrize("entry", [
    _entry(1e4, [("input", 0, None, False)]),          # compared element by element: seen
    _entry(1e4, STATS, op="dropout"),                   # draws random numbers
    _entry(1e4, STATS, args_bad=True),                  # a non-tensor argument explains it
    _entry(1e4, []),                                    # no compared inputs
])
def test_not_judged(entry):
    assert unseen_inputs(entry) is None


# ------------------------------------------------------------------- through compare_dumps
def _first(tmp_path: Any, **changes: Any) -> dict:
    base = {k: v for k, v in changes.items() if k == "checksum"}
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **changes)
    result = compare_dumps(a, b)
    assert result["verdict"] == "diverged" and result["contract"] == 2
    return result["first_divergence"]


def test_a_swap_the_statistics_cannot_see_is_said_so(tmp_path):
    first = _first(tmp_path, gelu_swap=True)
    assert (first["code"], first["name_a"], first["role"]) == \
        ("inputs_unseen", "Functional.linear.1.forward", "output")
    assert "statistics_blind" in first["annotations"]
    assert first["evidence"]["unseen_inputs"]["decision"] == "undecided"


def test_checksums_name_the_input_that_differs(tmp_path):
    first = _first(tmp_path, gelu_swap=True, checksum=True)
    assert (first["code"], first["name_a"], first["role"]) == \
        ("inputs_unseen", "Functional.linear.1.forward", "input")
    assert "checksums_decide" in first["annotations"]
    assert first["evidence"]["unseen_inputs"]["checksums_differ"] == \
        [{"role": "input", "arg_index": 0}]


def test_checksums_clear_the_inputs_of_a_call_that_computes_otherwise(tmp_path):
    first = _first(tmp_path, gelu_scale=2.0, checksum=True)
    assert (first["code"], first["name_a"]) == ("op_differs", "Functional.gelu.0.forward")
    assert first["annotations"] == ["checksums_decide"]
    assert first["evidence"]["unseen_inputs"]["decision"] == "op_differs"


def test_a_small_change_of_one_call_is_that_call(tmp_path):
    first = _first(tmp_path, gelu_scale=1.001)
    assert (first["code"], first["name_a"], first["annotations"]) == \
        ("op_differs", "Functional.gelu.0.forward", [])
    assert "unseen_inputs" not in first["evidence"]
