"""The cause a step shows when its weights already differ at its start
(precdbg/compare/localize/step_causes.py): the headline is what differs in the code that ran
(a layer setting, a structural difference, a call one run makes, an optimizer setting of that
step), the parameter difference its evidence; the earliest parameter difference stays the
headline only when the step shows none of these. Synthetic dumps and record lists, no
framework."""
from __future__ import annotations

from precdbg.compare import compare_dumps
from precdbg.compare.judge.structural_diff import StructuralDiff
from precdbg.compare.localize.step_causes import ENTERED_APART, CauseCode, step_causes
from precdbg.records.layers import SettingDifference

import synthetic as S


def _compare(tmp_path, **changes):
    return compare_dumps(S.write_dump(tmp_path / "a"),
                         S.write_dump(tmp_path / "b", weight_scale=1.1, **changes))


def test_weights_apart_and_nothing_else_keep_the_parameter_headline(tmp_path):
    first = _compare(tmp_path)["first_divergence"]
    assert (first["kind"], first["name_a"]) == ("param", "Param.fc2.weight")
    assert ENTERED_APART in first["annotations"]
    assert "cause" not in first


def test_a_layer_setting_is_the_headline_over_the_weights(tmp_path):
    first = _compare(tmp_path, approximate="tanh")["first_divergence"]
    assert first["cause"]["code"] == CauseCode.LAYER_SETTING.value
    assert (first["kind"], first["module"]) == ("module", "act")
    assert first["structure"]["settings"][0]["setting"] == "approximate"
    assert first["parameters"]["name_a"] == "Param.fc2.weight"
    assert ENTERED_APART in first["annotations"]
    assert [c["code"] for c in first["candidates"]][0] == "layer_setting"


def test_a_structural_difference_is_the_headline_over_the_weights(tmp_path):
    first = _compare(tmp_path, extra_call=True)["first_divergence"]
    assert first["cause"]["code"] == CauseCode.STRUCTURE.value
    assert first["module"] == "act"


def _diff(module: str, settings=(), calls=(["a"], ["b"])) -> StructuralDiff:
    return StructuralDiff(1, 0, module, f"Module.{module}.X.forward.0",
                          f"Module.{module}.X.forward.0", "X", "X", "x", list(calls[0]),
                          list(calls[1]), 10, 1, list(settings))


def _call(name: str, module: str, side: str = "b", step: int = 1) -> dict:
    return {"side": side, "step": step, "rank": 0, "name": name, "kind": "api",
            "module": module, "op": name.split(".")[1], "role": "input", "arg_index": 0}


def test_causes_are_ranked_settings_structure_calls_in_place_first_optimizer():
    setting = SettingDifference("norm", "norm", "LayerNorm", "LayerNorm", "layer_norm", "eps",
                                1e-5, 1e-2)
    causes = step_causes(
        1, 0, [_diff("norm", [setting], ([], [])), _diff("mlp")],
        [_call("Torch.mul.3.forward", "head"), _call("Tensor.add_.0.forward", "head"),
         _call("Torch.relu.1.forward", "mlp.act"),           # inside mlp, whose calls differ
         _call("Torch.relu.9.forward", "head", step=0),      # another step
         {**_call("Torch.exp.0.forward", "head"), "name": "Torch.exp.0.backward"}],
        ["optimizer lr differs: A 0.001, B 0.002"])
    assert [(c.code, c.module, c.name_a, c.name_b) for c in causes] == [
        (CauseCode.LAYER_SETTING, "norm", "Module.norm.X.forward.0", "Module.norm.X.forward.0"),
        (CauseCode.STRUCTURE, "mlp", "Module.mlp.X.forward.0", "Module.mlp.X.forward.0"),
        (CauseCode.ONE_RUN_CALL, "head", "", "Tensor.add_.0.forward"),
        (CauseCode.ONE_RUN_CALL, "head", "", "Torch.mul.3.forward"),
        (CauseCode.OPTIMIZER_SETTING, "", "", "")]


def test_no_cause_when_the_step_shows_nothing():
    assert step_causes(1, 0, [], [], []) == []
    assert step_causes(1, 0, [_diff("mlp")], [], [])[0].code == CauseCode.STRUCTURE
    baseline_only = step_causes(1, 0, [], [_call("Torch.mul.3.forward", "head", side="a")], [])
    assert (baseline_only[0].name_a, baseline_only[0].name_b) == ("Torch.mul.3.forward", "")


# ------------------------------------------------------------ a weight gradient beyond its reads
def _dumped_at_iteration_1(tmp_path, level: str = "mix", **changes):
    """Both runs trained one step (SGD, lr 0.01) before the dumped one (dump_step = 1)."""
    a = S.write_dump(tmp_path / "a", steps=(1,), trained_before=1, level=level, lr=0.01)
    b = S.write_dump(tmp_path / "b", steps=(1,), trained_before=1, level=level, lr=0.01,
                     **changes)
    return compare_dumps(a, b)


def test_a_weight_gradient_computed_otherwise_is_named_when_the_weights_entered_apart(tmp_path):
    """fc1's dw scaled in every step: it entered iteration 1 apart, and in iteration 1 its dw
    differs far beyond what fc1 read: named at that dw (dw_only), the parameter the evidence."""
    for level in ("mix", "module"):
        first = _dumped_at_iteration_1(tmp_path / level, level, dw_scale=1.5)["first_divergence"]
        assert first["cause"]["code"] == CauseCode.WEIGHT_GRADIENT.value
        assert (first["code"], first["kind"], first["direction"]) == \
            ("dw_only", "param_grad", "backward")
        assert first["name_a"] == "Param.fc1.weight.grad"
        assert first["parameters"]["name_a"] == "Param.fc1.weight"
        assert ENTERED_APART in first["annotations"]


def test_a_forward_or_dx_difference_moves_no_gradient_beyond_its_reads(tmp_path):
    """Where the earlier step ran apart through the forward (gelu scaled) or dx (gelu's
    backward scaled), each dw moves as far as what its module read: no weight-gradient
    cause."""
    for name, change in (("fwd", {"gelu_scale": 1.05}), ("dx", {"gelu_grad_scale": 1.25})):
        first = _dumped_at_iteration_1(tmp_path / name, **change)["first_divergence"]
        assert first.get("cause", {}).get("code") != CauseCode.WEIGHT_GRADIENT.value, first
        assert first["code"] != "dw_only", first
