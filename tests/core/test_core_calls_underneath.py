"""Judge calls_underneath (precdbg/compare/judge/calls_underneath.py): in a torch shim's dump
compared with PyTorch's, a module's other calls or call arguments are the shim's code underneath
the model (a note); another class or another layer setting stays a cause. No framework."""
from __future__ import annotations

from precdbg.compare.judge.calls_underneath import (JUDGE_ID, causal_one_run_calls,
                                                    split_underneath)
from precdbg.compare.judge.structural_diff import StructuralDiff
from precdbg.records.layers import SettingDifference


def _diff(module: str, class_b: str = "X", settings=(), calls_b=("b",)) -> StructuralDiff:
    return StructuralDiff(1, 0, module, f"Module.{module}.X.forward.0",
                          f"Module.{module}.{class_b}.forward.0", "X", class_b, "x", ["a"],
                          list(calls_b), 10, 1, list(settings))


def _setting(call: bool) -> SettingDifference:
    return SettingDifference("norm", "norm", "LayerNorm", "LayerNorm", "layer_norm", "eps",
                             1e-5, 1e-2, call=call)


def test_a_shim_pairs_calls_and_call_arguments_are_underneath():
    calls = _diff("model.layers.0.self_attn")                       # its own masking
    argument = _diff("model.rotary_emb", settings=[_setting(call=True)], calls_b=("a",))
    layer = _diff("model.norm", settings=[_setting(call=False)], calls_b=("a",))
    renamed = _diff("model.act", class_b="Y")
    kept, underneath = split_underneath([calls, argument, layer, renamed], shim_pair=True)
    assert JUDGE_ID == "calls_underneath"
    assert [d.module for d in underneath] == ["model.layers.0.self_attn", "model.rotary_emb"]
    assert [d.module for d in kept] == ["model.norm", "model.act"]


def test_two_pytorch_runs_keep_every_structural_difference_and_call():
    diffs = [_diff("model.layers.0.self_attn"), _diff("model.act", class_b="Y")]
    assert split_underneath(diffs, shim_pair=False) == (diffs, [])
    calls = [{"side": "b", "name": "Torch.arange.2.forward"}]
    assert causal_one_run_calls(calls, shim_pair=False) == calls
    assert causal_one_run_calls(calls, shim_pair=True) == []
