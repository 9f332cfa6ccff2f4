"""A call's own settings (judge/structure.py): a keyword argument that is a number, a flag or a
word and differs between the two runs' same call (an attention's `scale=`, a loss's
`label_smoothing=`) is a setting of the module that makes the call, as a layer's eps is; and a
step whose weights entered apart names a setting of a module of the same class as a layer
setting even when it changes the module's calls (a dropout of p 0 makes none that changes a
number) (localize/step_causes.py)."""
from __future__ import annotations

import pytest
import torch

import precdbg
from precdbg.compare import compare_dumps
from precdbg.compare.judge.structural_diff import StructuralDiff
from precdbg.compare.judge.structure import argument_differences
from precdbg.compare.localize.step_causes import CauseCode, step_causes
from precdbg.records.layers import SettingDifference
from precdbg_pt import PrecisionDebugger


class _Net(torch.nn.Module):
    def __init__(self, scale: float, inplace: bool) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)
        self.head = torch.nn.Linear(8, 4)
        self.scale, self.inplace = scale, inplace

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.head(torch.nn.functional.relu(y, inplace=self.inplace))


def _dump(path: str, scale: float = 0.25, inplace: bool = False, smoothing: float = 0.0) -> str:
    torch.manual_seed(0)
    net = _Net(scale, inplace)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (10,), generator=torch.Generator().manual_seed(2))
    debugger = PrecisionDebugger(dump_path=path, level="mix")
    debugger.start(net)
    torch.nn.functional.cross_entropy(net(x).reshape(-1, 4), y,
                                      label_smoothing=smoothing).backward()
    debugger.stop()
    debugger.step()
    assert debugger.close() and not debugger.failures
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("call_settings")
    return {"base": _dump(str(tmp / "base")), "scale": _dump(str(tmp / "scale"), scale=0.5),
            "inplace": _dump(str(tmp / "inplace"), inplace=True),
            "smooth": _dump(str(tmp / "smooth"), smoothing=0.1)}


def _tables(a: str, b: str):
    return precdbg.open_dump(a).records(0, 0), precdbg.open_dump(b).records(0, 0)


def test_a_keyword_setting_of_a_call_is_a_setting_of_its_module(dumps):
    found = argument_differences(*_tables(dumps["base"], dumps["scale"]))
    assert [(d.path_a, d.op, d.setting, d.a, d.b) for d in found] == [
        ("", "scaled_dot_product_attention", "scaled_dot_product_attention(scale=)", 0.25, 0.5)]
    first = compare_dumps(dumps["base"], dumps["scale"])["first_divergence"]
    # the call the numbers name, with the setting that decides it
    assert first["name_a"] == "Functional.scaled_dot_product_attention.0.forward"
    assert [s["setting"] for s in first["structure"]["settings"]] == [
        "scaled_dot_product_attention(scale=)"]


def test_a_loss_setting_outside_the_model_counts_for_the_root(dumps):
    found = argument_differences(*_tables(dumps["base"], dumps["smooth"]))
    assert [(d.path_a, d.setting, d.a, d.b) for d in found] == [
        ("", "cross_entropy(label_smoothing=)", 0.0, 0.1)]


def test_arguments_that_change_no_number_are_no_setting(dumps):
    # (the call's record still says its arguments differ: that is no setting of the module)
    assert argument_differences(*_tables(dumps["base"], dumps["inplace"])) == []
    assert compare_dumps(dumps["base"], dumps["inplace"])["first_divergence"].get(
        "structure") is None


def _diff(module: str, cls_b: str, calls_b, settings) -> StructuralDiff:
    return StructuralDiff(1, 0, module, f"Module.{module}.Dropout.forward.0",
                          f"Module.{module}.{cls_b}.forward.0", "Dropout", cls_b, "dropout",
                          [], list(calls_b), 10, 5, list(settings))


def test_a_setting_that_changes_a_modules_calls_is_a_layer_setting():
    p = SettingDifference("h.1.drop", "h.1.drop", "Dropout", "Dropout", "dropout", "p", 0.0,
                          0.1)
    causes = step_causes(1, 0, [_diff("h.1.drop", "Dropout", ["Functional.dropout"], [p])],
                         [], [])
    assert [(c.code, c.module) for c in causes] == [(CauseCode.LAYER_SETTING, "h.1.drop")]
    # another class is a structural difference, settings or not
    causes = step_causes(1, 0, [_diff("h.1.drop", "Identity", [], [p])], [], [])
    assert [c.code for c in causes] == [CauseCode.STRUCTURE]
