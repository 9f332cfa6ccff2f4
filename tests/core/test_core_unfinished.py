"""Judge `unfinished_step` (precdbg/compare/judge/unfinished.py) on synthetic dumps: a step that
stopped inside a module's forward (an exception the training script caught before stop(), or a
process that ended) is never a match; the verdict names the run, the module and the call where
it stopped, unless the numbers parted before that."""
from __future__ import annotations

import numpy as np
import pytest

from precdbg.compare import compare_dumps
from precdbg.compare.align.alignment import align
from precdbg.compare.judge.unfinished import JUDGE_ID, unfinished_step
from precdbg.storage.reader import open_dump

import synthetic as S


def _compare(tmp_path, a=None, b=None):
    return compare_dumps(S.write_dump(tmp_path / "a", **(a or {})),
                         S.write_dump(tmp_path / "b", **(b or {})))


@pytest.mark.parametrize("module, call", [("act", "Module.act.GELU.forward.0"),
                                          ("fc2", "Module.fc2.Linear.forward.0")])
def test_a_candidate_that_stopped_inside_a_module_is_named_there(tmp_path, module, call):
    result = _compare(tmp_path, b={"stop_in": module})
    assert result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert first["unfinished"]["judge"] == JUDGE_ID
    assert {k: first["unfinished"][k] for k in ("side", "module", "call", "interrupted")} == \
        {"side": "candidate", "module": module, "call": call, "interrupted": False}
    assert first["unfinished"]["last_record"] == call
    assert first["unfinished"]["records_after"] > 0
    assert (first["kind"], first["module"], first["name_a"], first["name_b"]) == \
        ("module", module, call, call)
    assert not [row for row in result["rows"] if row["status"] == "diverged"]


def test_a_baseline_that_stopped_is_named_as_the_baseline(tmp_path):
    first = _compare(tmp_path, a={"stop_in": "act"})["first_divergence"]
    assert (first["unfinished"]["side"], first["unfinished"]["module"]) == ("baseline", "act")


def test_an_interrupted_step_is_said_so(tmp_path):
    first = _compare(tmp_path, b={"stop_in": "fc2", "interrupted": True})["first_divergence"]
    assert (first["unfinished"]["side"], first["unfinished"]["interrupted"]) == \
        ("candidate", True)


def test_numbers_that_parted_before_the_stop_are_the_verdict(tmp_path):
    """The input data differs from the first call on: that is named, not where it stopped."""
    first = _compare(tmp_path, b={"stop_in": "fc2", "input_scale": 2.0})["first_divergence"]
    assert "unfinished" not in first
    assert first["direction"] == "forward"


def test_whole_steps_are_no_unfinished_step(tmp_path):
    a = S.write_dump(tmp_path / "a")
    b = S.write_dump(tmp_path / "b", gelu_scale=1.01)
    result = compare_dumps(a, b)
    assert "unfinished" not in result["first_divergence"]
    assert compare_dumps(a, S.write_dump(tmp_path / "c"))["verdict"] == "match"


def _tables(tmp_path, a, b):
    da = open_dump(S.write_dump(tmp_path / "a", **a))
    db = open_dump(S.write_dump(tmp_path / "b", **b))
    ta, tb = da.records(0, 0), db.records(0, 0)
    return ta, tb, align(ta, tb, True, None)


def test_the_judge_on_record_tables(tmp_path):
    ta, tb, al = _tables(tmp_path, {}, {"stop_in": "act"})
    stop = unfinished_step(ta, tb, al.pairs_a, al.pairs_b, al.only_a, al.only_b, 0, 0)
    assert (stop.side, stop.module, stop.entry, stop.other_entry) == \
        ("candidate", "act", "Module.act.GELU.forward.0", "Module.act.GELU.forward.0")
    assert stop.records_after == len(al.only_a)
    # where it stopped, in the baseline's order: the baseline's record of act's input
    i = int(np.nonzero((ta["entry"] == "Module.act.GELU.forward.0") & (ta["role"] == "input"))[0][0])
    assert stop.seq == int(ta["seq"][i])
    # nothing left without counterpart on the other side: no judgement
    empty = np.zeros(0, np.int64)
    assert unfinished_step(ta, tb, al.pairs_a, al.pairs_b, empty, al.only_b, 0, 0) is None


def test_a_call_that_returns_nothing_recorded_in_both_runs_is_no_stop(tmp_path):
    """A module without an output record in either run (it returns no float tensor) did not
    stop anything."""
    ta, tb, al = _tables(tmp_path, {}, {})
    keep = ~((ta["entry"] == "Module.act.GELU.forward.0") & (ta["role"] == "output"))
    keep_b = ~((tb["entry"] == "Module.act.GELU.forward.0") & (tb["role"] == "output"))
    ta2, tb2 = ta.select(keep), tb.select(keep_b)
    al2 = align(ta2, tb2, True, None)
    assert unfinished_step(ta2, tb2, al2.pairs_a, al2.pairs_b, al2.only_a, al2.only_b, 0,
                           0) is None
