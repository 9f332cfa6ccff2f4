"""What one MindSpore call's arguments and results are, for the adapter's hooks: its tensors and
other values, whether a tensor takes part in a gradient computation, whether the API writes in
place, and where a tensor's elements lie. Plain functions of their arguments (no state),
imported by name into the hooks."""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import mindspore as ms

from precdbg.capture import tensor_arguments, tensor_results, value_arguments

from .tensors import dtype_name

__all__ = ["is_floating", "is_tensor", "scalar_inputs", "takes_grad",
           "tensor_inputs", "tensor_outputs"]

_FLOAT_NAMES = frozenset({"float16", "float32", "float64", "bfloat16"})   # constant


def is_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor)


def dtype_of(value: Any) -> Optional[str]:
    return dtype_name(value) if isinstance(value, ms.dtype.Type) else None


def tensor_inputs(args: tuple, kwargs: dict) -> List[Tuple[int, str, Any]]:
    return tensor_arguments(args, kwargs, is_tensor)


def tensor_outputs(result: Any) -> List[Tuple[int, str, Any]]:
    return tensor_results(result, is_tensor)


def scalar_inputs(args: tuple, kwargs: dict) -> List[Tuple[str, Any]]:
    return value_arguments(args, kwargs, dtype_of)


def takes_grad(t: Any) -> bool:
    """Part of a gradient computation (MindSpore refuses hooks on other tensors)."""
    return bool(getattr(t, "_requires_grad", getattr(t, "requires_grad", False)))


def shim_takes_grad(t: Any) -> bool:
    """`takes_grad` under a torch shim, which puts a `_requires_grad` of its own on the Tensor
    class (mindnlp's reads False for every activation): MindSpore's own flag, and where the
    shim's ops left that unset (None), the tensor is taken as part of the computation (a hook
    MindSpore refuses is then skipped where it is registered)."""
    flag = _autograd_flag(t) if _autograd_flag is not None else None
    if flag is None:
        return bool(getattr(t, "requires_grad", False)) or _autograd_flag is not None
    return bool(flag)


def _tensor_py_flag() -> Any:
    try:
        from mindspore._c_expression import TensorPy
        return TensorPy.__dict__["_requires_grad"].__get__
    except (ImportError, KeyError, AttributeError):
        return None


_autograd_flag = _tensor_py_flag()


def is_floating(t: Any) -> bool:
    return dtype_name(t.dtype) in _FLOAT_NAMES


