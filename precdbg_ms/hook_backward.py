"""Gradients of one captured cell call, through MindSpore's `HookBackward` primitive.

A floating-point input reaches the cell's construct through `HookBackward`, an identity in the
forward (over the same memory) whose backward hands the gradient of this very use to a hook
(dx); an output leaves through one as well (dy), and the caller gets that output. It is one more
op in PyNative's pipeline, where a cell's own backward hook (`CellBackwardHook`) copies the
cell's inputs and outputs, waits for the copies, and makes all inputs one gradient node.

Only tensors at the top level of the arguments and of the result are hooked, as MindSpore's
cell hooks do. (API calls keep a view and `Tensor.register_hook` per input, precdbg_ms.adapter:
an API that writes its argument without saying so, as `assign_value` does, must still write the
caller's tensor.)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

from mindspore._c_expression import MixedPrecisionType
from mindspore.ops.operations.debug_ops import HookBackward

from .pynative import _pynative_executor as _executor

__all__ = ["through_hook", "top_level", "replace_arguments", "replace_result"]

_NO_AMP = MixedPrecisionType.NOTSET


def through_hook(t: Any, on_grad: Callable[[Any], None]) -> Any:
    """`t` through a HookBackward whose backward calls `on_grad(gradient)`; the gradient goes
    on unchanged. Inside a cell of another precision (amp O2 keeps LayerNorm in float32,
    `Cell.to_float`) PyNative casts every op's inputs to it, and would cast HookBackward's:
    it runs with no precision of its own, so the cell gets `t` as it was given (its own
    casts then round it as they do without precdbg) and the numbers do not change."""
    def backward(grads: Tuple[Any, ...]) -> None:   # a function: HookBackward wants __code__
        on_grad(grads[0] if isinstance(grads, tuple) else grads)
    _executor.set_mixed_precision_type(_NO_AMP, True)       # pushed: no amp cast for it
    try:
        return HookBackward(backward)(t)
    finally:
        _executor.set_mixed_precision_type(_NO_AMP, False)  # popped: the cell's own again


def top_level(key: str) -> bool:
    """Whether an argument or result key names a tensor at the top level ("0", "x", not
    "0.1")."""
    return "." not in key


def replace_arguments(args: tuple, kwargs: Dict[str, Any], replaced: Dict[str, Any]
                      ) -> Tuple[tuple, Dict[str, Any]]:
    """`args` and `kwargs` with the top-level arguments named in `replaced` (by key)."""
    if not replaced:
        return args, kwargs
    new_args: List[Any] = list(args)
    new_kwargs = dict(kwargs)
    for key, value in replaced.items():
        if key.isdigit():
            new_args[int(key)] = value
        else:
            new_kwargs[key] = value
    return tuple(new_args), new_kwargs


def replace_result(result: Any, replaced: Dict[str, Any]) -> Any:
    """A call's result with its top-level tensors named in `replaced` (by key: "0" is the
    result itself when it is one tensor, else its first element)."""
    if not replaced:
        return result
    if isinstance(result, dict):
        return _replace_items(result, replaced)
    if not isinstance(result, (tuple, list)):
        return replaced.get("0", result)
    items = [replaced.get(str(i), item) for i, item in enumerate(result)]
    if isinstance(result, list):
        return items
    if type(result) is tuple:
        return tuple(items)
    return type(result)(*items)          # a named tuple


def _replace_items(result: Dict[Any, Any], replaced: Dict[str, Any]) -> Dict[Any, Any]:
    """A dict result (a Hugging Face `ModelOutput`: an ordered dict whose items are also its
    attributes) with the items named in `replaced`: a copy of the caller's type, or the
    result itself changed where its type cannot be copied."""
    import copy
    try:
        out = copy.copy(result)
    except Exception:  # noqa: BLE001 - a type that cannot be copied: changed in place
        out = result
    for key in list(out.keys()):
        if str(key) in replaced:
            out[key] = replaced[str(key)]
    return out
