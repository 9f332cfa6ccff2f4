"""What differs between the MindSpore versions precdbg serves (2.7.1 to 2.10): where the PyNative
executor lives (`mindspore.graph.api` from 2.9, `mindspore.common.api` before), and dtype names
when a torch shim (mindnlp's mindtorch, MSAdapter) makes `str(ms.float32)` read
"mindspore.float32"."""
from __future__ import annotations

import pytest

ms = pytest.importorskip("mindspore")


def test_the_pynative_executor_is_found_in_this_version():
    from precdbg_ms.pynative import _PyNativeExecutor, _pynative_executor
    assert isinstance(_pynative_executor, _PyNativeExecutor)
    assert callable(_pynative_executor.enable_grad) and callable(_pynative_executor.requires_grad)


class _ShimDtype:
    """A dtype as a torch shim prints it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize("text, name", [("mindspore.float32", "float32"),
                                        ("mindspore.bfloat16", "bfloat16"),
                                        ("torch.float16", "float16"), ("mindspore.bool_", "bool"),
                                        ("Int64", "int64")])
def test_dtype_names_do_not_depend_on_how_a_shim_prints_them(text, name):
    from precdbg_ms.tensors import dtype_name
    assert dtype_name(_ShimDtype(text)) == name


def test_mindspores_own_dtypes_keep_their_names():
    from precdbg_ms.tensors import dtype_name
    assert [dtype_name(d) for d in (ms.float32, ms.bfloat16, ms.int64, ms.bool_)] == \
        ["float32", "bfloat16", "int64", "bool"]


def test_forward_hooks_run_when_the_forward_raises_where_this_version_can():
    """2.8 added `always_call` to `Cell.register_forward_hook`; 2.7 has none, and the hook is
    registered without it there (measured on 2.7.1: start() raised TypeError before)."""
    import inspect

    from mindspore import nn

    from precdbg_ms.cell_hooks import _always_call
    has = "always_call" in inspect.signature(nn.Cell.register_forward_hook).parameters
    assert _always_call(nn.Cell) == ({"always_call": True} if has else {})
