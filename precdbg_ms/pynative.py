"""MindSpore's PyNative executor, wherever this MindSpore version keeps it: `mindspore.graph.api`
from 2.9 (where `mindspore.common.api` is deprecated and warns), `mindspore.common.api` in 2.7
and 2.8 (whose `mindspore.graph` has no `api`); and MindSpore's own tensor hook, whatever a
torch shim put on the Tensor class in its place."""
from __future__ import annotations

from typing import Any, Callable

from mindspore import Parameter
from mindspore._c_expression import TensorPy as _TensorPy
from mindspore.common.hook_handle import _TensorHookHandle, _update_hook_version

try:
    from mindspore.graph.api import _PyNativeExecutor, _pynative_executor
except ImportError:          # MindSpore 2.7, 2.8
    from mindspore.common.api import _PyNativeExecutor, _pynative_executor

__all__ = ["_PyNativeExecutor", "_pynative_executor", "register_tensor_hook", "tensor_view"]

# MindSpore's own Tensor.view: a method of the C tensor from 2.8 on, a Python method of Tensor
# (reshape through the tensor-operator registry) in 2.7, which a torch shim replaces by its own
_C_VIEW = _TensorPy.__dict__.get("view")


def tensor_view(t: Any, shape: Any) -> Any:
    """A view of `t` with `shape`, as MindSpore's `Tensor.view` makes it, whatever a torch shim
    put on the class (mindnlp's reads the shim's device, which a tensor MindSpore made lacks)."""
    if _C_VIEW is not None:
        return _C_VIEW(t, shape)
    from mindspore.common._register_for_tensor import tensor_operator_registry
    return tensor_operator_registry.get("reshape")(t, shape)


def register_tensor_hook(t: Any, hook: Callable[[Any], Any]) -> Any:
    """`mindspore.Tensor.register_hook(t, hook)` as MindSpore defines it (2.7 to 2.10): a torch
    shim replaces the method on the class by PyTorch's semantics over its own internals
    (mindnlp 0.5.1's reads a `_data` its Parameters lack), and a MindSpore Parameter's own
    calls that one; a Parameter's hook also invalidates the compiled graphs that saw it, as
    `Parameter.register_hook` does (its handle's removal does so again)."""
    handle = _TensorHookHandle(t)
    handle.id = _TensorPy.register_hook(t, hook)
    if isinstance(t, Parameter):
        _update_hook_version()
    return handle
