"""A torch shim's dump (framework `mindtorch`: PyTorch code on MindSpore) against PyTorch's, on
hand-made records: one vocabulary of names, what changes no number, and which structural
differences are the shim's own code underneath the model."""
from __future__ import annotations

from precdbg.compare.judge.inert import calls_changing_no_number
from precdbg.compare.judge.structural_diff import StructuralDiff
from precdbg.compare.judge.calls_underneath import layer_changed
from precdbg.records import vocabulary
from precdbg.records.layers import SettingDifference

from test_core_pair_judges import _table


def test_a_shim_dump_speaks_pytorchs_vocabulary():
    assert vocabulary("mindtorch") == vocabulary("pytorch") == "pytorch"
    assert vocabulary("mindspore") == "mindspore"


def _cast(dtype_in: str, dtype_out: str):
    """Tensor.to(x) (order 1) whose output the next call (order 2) reads."""
    to = {"entry": "Tensor.to.0.forward", "op": "cast", "order": 1}
    return _table([dict(to, role="input", dtype=dtype_in),
                   dict(to, role="output", dtype=dtype_out, tensor_id=7),
                   {"entry": "Tensor.add.0.forward", "op": "add", "order": 2, "role": "input",
                    "producer": 1}])


def test_a_conversion_to_the_dtype_it_had_changes_no_number():
    """PyTorch's `x.to(x.device)` returns x (nothing reads the call's output); a shim's returns
    a new tensor that the next call reads: the same copy, no number changed, either way."""
    assert 1 in calls_changing_no_number(_cast("float32", "float32"))
    assert 1 not in calls_changing_no_number(_cast("float32", "bfloat16"))


def _diff(**kw) -> StructuralDiff:
    base = dict(step=0, rank=0, module="m", name_a="Module.m.A.forward.0",
                name_b="Module.m.A.forward.0", class_a="A", class_b="A", op="a",
                calls_a=["Functional.softmax"], calls_b=["Tensor.softmax"], seq=0, order=0)
    base.update(kw)
    return StructuralDiff(**base)


def _setting(call: bool) -> SettingDifference:
    return SettingDifference("m", "m", "A", "A", "a", "softmax(dim=)" if call else "eps",
                             1, 2, call=call)


def test_calls_and_call_arguments_are_the_shims_own_a_layers_shape_is_not():
    assert not layer_changed(_diff())                                 # other calls
    assert not layer_changed(_diff(settings=[_setting(call=True)]))   # a call's argument
    assert layer_changed(_diff(settings=[_setting(call=False)]))      # the layer's own eps
    assert layer_changed(_diff(class_b="B"))                          # another class
