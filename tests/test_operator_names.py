"""The core's `operator_names` (precdbg/records/tables/torch.yaml) is what precdbg_pt names each
Tensor operator on this torch: a torch shim's operators are named from that table, so a shim's
`x + y` pairs with PyTorch's by name. Measured through the adapter's own `identify` on the
function torch's function mode receives for each operator."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402

from precdbg.records import framework_table  # noqa: E402
from precdbg_pt.api import identify  # noqa: E402

_BOOLEAN = {"__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__"}
_UNARY = {"__neg__", "__abs__", "__invert__"}
_SCALAR_RIGHT = {"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rfloordiv__",
                 "__rmod__", "__rpow__"}


class _Seen(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        found = identify(func)
        if found is not None:
            self.names.append(found)
        return func(*args, **(kwargs or {}))


def _called(op: str):
    x = torch.randn(3) if op not in _BOOLEAN else torch.randn(3) > 0
    y = torch.randn(3) if op not in _BOOLEAN else torch.randn(3) > 0
    with _Seen() as seen:
        if op in _UNARY:
            getattr(x, op)()
        elif op == "__getitem__":
            x[0]
        elif op == "__setitem__":
            x[0] = 1
        elif op in _SCALAR_RIGHT:
            getattr(x, op)(2.0)
        else:
            getattr(x, op)(y)
    return seen.names


@pytest.mark.parametrize("op", sorted({
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
    "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__",
    "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__", "__neg__", "__abs__",
    "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lt__",
    "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__getitem__", "__setitem__"}))
def test_an_operator_is_named_as_the_core_table_says(op):
    names = _called(op)
    table = framework_table("torch").get("operator_names", {})
    assert names == [("Tensor", table.get(op, op))]
