"""The words of a compare are written once, at its end (report/wording.py), from the codes and
facts the decisions store: every chain item has a `code` and its `text`, no facts leak into the
JSON, and the decision stages hold no words."""
import json

import pytest

import synthetic as S
from precdbg.compare import compare_dumps
from precdbg.compare.localize.verdict import LinkCode
from precdbg.compare.report.wording import evidence_why, note_text, structural_reason
from precdbg.compare.judge.rows import NoteCode


@pytest.mark.parametrize("changes", [dict(gelu_scale=1.01), dict(stop_in="act"),
                                     dict(settings_approximate="tanh"),
                                     dict(weight_scale=1.001, steps=(1,))])
def test_chain_items_carry_a_code_and_words(tmp_path, changes):
    base = {"steps": changes.pop("steps")} if "steps" in changes else {}
    result = compare_dumps(S.write_dump(tmp_path / "a", **base),
                           S.write_dump(tmp_path / "b", **dict(base, **changes)))
    first = result["first_divergence"]
    assert first["reason"]
    for item in first["chain"]:
        assert LinkCode(item["code"]) and item["text"], item
    text = json.dumps(result, default=str)
    assert '"_facts"' not in text and '"_why"' not in text
    for ev in first["evidence"]["outputs_bad"]:
        assert "why" in ev


def test_words_from_facts():
    same = {"shape_a": [2], "shape_b": [2], "nan_a": 0, "inf_a": 0, "nan_b": 0, "inf_b": 0,
            "err": 0.5, "tol": 0.01}
    assert evidence_why(same) == " (relative error 0.5 > tolerance 0.01)"
    assert evidence_why(dict(same, shape_b=[3])) == " (shape [2] vs [3])"
    assert evidence_why({}) == ""
    diff = {"module": "act", "class_a": "GELU", "class_b": "GELU", "calls_a": ["gelu"],
            "calls_b": ["gelu", "mul"], "times": None, "settings": []}
    assert structural_reason(diff).startswith("calls differ in module 'act': the baseline "
                                              "calls gelu, the candidate gelu, mul")
    assert note_text(NoteCode.JUDGED_BY_ROUNDING, {"steps": [1, 2]}).startswith(
        "parameters of step(s) 1, 2 judged against float rounding")


def test_decisions_hold_no_words():
    """localize and judge keep no sentence of a verdict (report/wording.py writes them)."""
    import inspect
    from precdbg.compare.localize import locate, step_causes, verdicts
    from precdbg.compare.judge import multistep, structural_diff
    for module, phrase in ((verdicts, "differs while its inputs agree"),
                           (verdicts, "input data differs"), (locate, "reads the output of"),
                           (step_causes, "which writes its input in place"),
                           (multistep, "judged against float rounding"),
                           (structural_diff, "a structural difference: it counts")):
        assert phrase not in inspect.getsource(module), (module.__name__, phrase)
