"""API capture through `torch.overrides.TorchFunctionMode`: every torch.*, torch.nn.functional.*,
Tensor method and operator called inside the captured region, with nothing to patch or restore.

Which prefix and name an API gets comes from the namespaces it is found in (table built once, on
the first start) and the core's name table (`precdbg/names/torch.yaml`).
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from precdbg.arguments import call_arguments, tensor_arguments, tensor_results
from precdbg.naming import framework_table

from .recompute import ENGINE_ENTRIES

__all__ = ["identify", "CaptureMode", "call_args", "tensor_args", "tensor_outputs"]

_IGNORED = "ignored"
_Ident = Optional[Tuple[str, str]]


@functools.lru_cache(maxsize=1)
def _table() -> Dict[Any, Any]:
    names = framework_table("torch")
    prefixes: Dict[str, str] = names["prefixes"]
    ignore = set(names.get("ignore", ()))
    table: Dict[Any, Any] = {}

    def add(namespace: Any, prefix: str) -> None:
        for attr, obj in vars(namespace).items():
            if not callable(obj) or isinstance(obj, type):
                continue
            try:
                hash(obj)
            except TypeError:
                continue
            if obj in table:
                continue
            table[obj] = _IGNORED if attr in ignore else (prefix, attr)

    # most specific first: an object found in F and in torch is named as in F
    add(torch.nn.functional, prefixes["torch.nn.functional"])
    for cls in (torch.Tensor, torch._C.TensorBase):
        add(cls, prefixes["torch.Tensor"])
    for module_name in ("torch.linalg", "torch.special", "torch.fft", "torch"):
        key = module_name if module_name in prefixes else "torch"
        add(importlib.import_module(module_name), prefixes[key])
    try:   # torch_npu is optional; importing it fails without CANN
        import torch_npu  # type: ignore
        add(torch_npu, prefixes["torch_npu"])
    except (ImportError, RuntimeError, OSError):
        pass
    return table


def identify(func: Any) -> _Ident:
    """(prefix, api name) of a function seen by the mode, or None when it is not captured."""
    table = _table()
    try:
        hit = table.get(func)
    except TypeError:
        return None
    if hit is not None:
        return None if hit is _IGNORED else hit
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__") or not name:
        return None          # attribute access (x.shape, x.grad, ...): metadata, not math
    owner = getattr(func, "__qualname__", name).split(".")[0]
    prefix = "Tensor" if owner in ("Tensor", "TensorBase", "_TensorBase") else "Torch"
    ident = None if name in set(framework_table("torch").get("ignore", ())) else (prefix, name)
    try:
        table[func] = ident if ident is not None else _IGNORED
    except TypeError:
        pass
    return ident


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _dtype_name(value: Any) -> Optional[str]:
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    return None


def tensor_args(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> List[Tuple[int, str, Any]]:
    return tensor_arguments(args, kwargs, _is_tensor)


def tensor_outputs(result: Any) -> List[Tuple[int, str, Any]]:
    return tensor_results(result, _is_tensor)


def call_args(args: Tuple[Any, ...], kwargs: Dict[str, Any]
              ) -> Tuple[List[Tuple[int, str, Any]], List[Tuple[str, Any]]]:
    """(tensor arguments, value arguments) of an API call, in one pass."""
    return call_arguments(args, kwargs, _is_tensor, _dtype_name)


class CaptureMode(TorchFunctionMode):
    """Routes every torch function call to `on_call(func, ident, args, kwargs)`, unless `state`
    (the adapter: its `busy` and `paused`) says precdbg's own code or a skipped phase runs."""

    def __init__(self, on_call: Any, state: Any) -> None:
        super().__init__()
        self._on_call = on_call
        self._state = state
        self._table = _table()

    def __torch_function__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        if kwargs is None:
            kwargs = {}
        state = self._state
        if state.busy or state.paused:
            return func(*args, **kwargs)
        try:                        # every torch call, attribute reads included: one lookup
            ident = self._table.get(func)
        except TypeError:
            ident = None
        if ident is None:
            ident = identify(func)
        if func in ENGINE_ENTRIES:      # backward runs in here: a recompute in it may put the
            try:                        # mode back on the stack, taken off once it returns
                if ident is None or ident is _IGNORED:
                    return func(*args, **kwargs)
                return self._on_call(func, ident, args, kwargs)
            finally:
                state.engine_returned()
        if ident is None or ident is _IGNORED:
            return func(*args, **kwargs)
        return self._on_call(func, ident, args, kwargs)
