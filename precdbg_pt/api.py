"""API capture through `torch.overrides.TorchFunctionMode`: every torch.*, torch.nn.functional.*,
Tensor method and operator called inside the captured region, with nothing to patch or restore.

Which prefix and name an API gets comes from the namespaces it is found in (table built once, on
the first start) and the core's name table (`precdbg/records/tables/torch.yaml`).

Registered operators reach the mode too: a call of `torch.ops.<ns>.<op>` as the
`OpOverloadPacket` it is, a call of one overload (`torch.ops.<ns>.<op>.default`) and a call of a
`torch.library.custom_op` function as that `OpOverload`. Both are named by the core's operator
rule (`precdbg.records.operator_api`: `npu` -> `NPU`, `aten` not captured, other namespaces
`Torch.<ns>.<op>`) from the operator's qualified name, the overload left out, so every way to
call one operator counts as one API. torch_npu's fused ops (`torch_npu.npu_rms_norm`) are
`torch.ops.npu` packets, found in torch_npu's namespace (prefix `NPU`) as well. What an
operator's implementation calls runs inside the mode's handler, unseen: one call, one record,
and its backward is the operator's registered autograd formula.
"""
from __future__ import annotations

import functools
import importlib
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from precdbg.capture import call_arguments, tensor_arguments, tensor_results
from precdbg.records import api_members, framework_table, operator_api

from .recompute import ENGINE_ENTRIES

__all__ = ["identify", "CaptureMode", "ModeHandle", "call_args", "tensor_args", "tensor_outputs"]

_IGNORED = "ignored"
_push_mode = torch._C._push_on_torch_function_stack
_pop_mode = torch._C._pop_torch_function_stack
_stack_size = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
_Ident = Optional[Tuple[str, str]]


# The table of names (made once per process, grown by `identify`): each entry is a pure function
# of its key, the torch function (its namespaces and the core's name table), so every debugger
# of the process may share it.
@functools.lru_cache(maxsize=1)
def _table() -> Dict[Any, Any]:
    names = framework_table("torch")
    prefixes: Dict[str, str] = names["prefixes"]
    ignore = set(names.get("ignore", ()))
    table: Dict[Any, Any] = {}

    def add(namespace: Any, prefix: str, members: Optional[Tuple[str, ...]] = None) -> None:
        for attr, obj in vars(namespace).items():
            if members is not None and attr not in members:
                continue
            if not callable(obj) or isinstance(obj, type):
                continue
            try:
                hash(obj)
            except TypeError:
                continue
            if obj in table:
                continue
            table[obj] = _IGNORED if attr in ignore else (prefix, attr)

    # the core's namespaces, most specific first: an object found in F and in torch is named
    # as in F (a torch shim over MindSpore lists its APIs from the same table)
    for name in names["api_namespaces"]:
        prefix = prefixes.get(name, prefixes["torch"])
        if name == "torch.Tensor":
            for cls in (torch.Tensor, torch._C.TensorBase):
                add(cls, prefix)
            continue
        try:   # torch_npu is optional; importing it fails without CANN
            add(importlib.import_module(name), prefix, api_members("torch", name))
        except (ImportError, RuntimeError, OSError):
            pass
    return table


_OPERATORS = (torch._ops.OpOverloadPacket, torch._ops.OpOverload)


def _operator(func: Any) -> Optional[Tuple[str, str]]:
    """(namespace, op) of a registered operator's packet or overload, else None (also where a
    torch version lacks the attribute read: such a call runs uncaptured, never raising)."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        qualified = getattr(func, "_qualified_op_name", "")     # 'npu::npu_rms_norm'
    elif isinstance(func, torch._ops.OpOverload):               # the same, without overload
        qualified = getattr(getattr(func, "_schema", None), "name", "")
    else:
        return None
    namespace, _, op = str(qualified).partition("::")
    return (namespace, op) if op else None


def identify(func: Any) -> _Ident:
    """(prefix, api name) of a function seen by the mode, or None when it is not captured."""
    table = _table()
    try:
        hit = table.get(func)
    except TypeError:
        return None
    if hit is not None:
        return None if hit is _IGNORED else hit
    if isinstance(func, _OPERATORS):
        found = _operator(func)
        ident = operator_api(*found) if found is not None else None
        try:
            table[func] = ident if ident is not None else _IGNORED
        except TypeError:
            pass
        return ident
    name = getattr(func, "__name__", "")
    if name in ("__get__", "__set__", "__delete__") or not name:
        # attribute access (x.shape, x.grad, ...): metadata, not math. Each access brings a
        # new method-wrapper of the same descriptor (equal to the last): answered from the
        # table from then on (not when it is bound to a tensor: that one would be kept alive)
        if name and not isinstance(getattr(func, "__self__", None), torch.Tensor):
            try:
                table[func] = _IGNORED
            except TypeError:
                pass
        return None
    if isinstance(func, type):
        # a class called through the mode (torch.device, which device contexts route through
        # it, called by Megatron's activation checkpoint and by torch.cuda's RNG helpers;
        # torch.autocast, which HF rotary embeddings enter per call): it builds a description
        # or a context, not numbers; a call only one run makes would read as a structural
        # difference (what autocast changes shows in the dtypes of the calls it governs)
        try:
            table[func] = _IGNORED
        except TypeError:
            pass
        return None
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
    (the adapter: its `busy` and `paused`) says precdbg's own code or a skipped phase runs;
    `engine_returned()` is called when an entry to the autograd engine returns."""

    def __init__(self, on_call: Any, state: Any, engine_returned: Callable[[], None]) -> None:
        super().__init__()
        self._on_call = on_call
        self._state = state
        self._engine_returned = engine_returned
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
                self._engine_returned()
        if ident is None or ident is _IGNORED:
            return func(*args, **kwargs)
        return self._on_call(func, ident, args, kwargs)


class ModeHandle:
    """The capture mode on torch's function-mode stack, as a handle: removing it takes exactly
    this mode off (modes pushed above it stay). While a phase that is not captured runs (an
    optimizer step) it is taken off the stack, so that phase's torch calls (thousands per step
    in an optimizer) do not each pass through a Python handler that only forwards them."""
    __slots__ = ("mode", "suspended", "replaying", "thread")

    def __init__(self, mode: CaptureMode) -> None:
        self.mode = mode
        self.suspended = False
        self.replaying = False
        # torch's function-mode stack is per thread: only this thread's API calls are seen
        self.thread = threading.get_ident()
        mode.__enter__()

    def suspend(self) -> None:
        """Off the stack, when it is the innermost mode (otherwise it stays and forwards)."""
        size = _stack_size()
        if not self.suspended and size and _stack_at(size - 1) is self.mode:
            _pop_mode()
            self.suspended = True

    def resume(self) -> None:
        if self.suspended:
            self.suspended = False
            _push_mode(self.mode)

    def enter_replay(self) -> bool:
        """Put the mode back on the stack for a replayed forward (activation recompute inside
        backward, which runs under the mode's own handler, so without it): until the engine
        entry that runs it returns (`leave_replay`, called by CaptureMode; the engine also puts
        the stack back as it was when its graph task ends). True when it was put back now."""
        size = _stack_size()
        if self.suspended or (size and _stack_at(size - 1) is self.mode):
            return False
        _push_mode(self.mode)
        self.replaying = True
        return True

    def leave_replay(self) -> None:
        if self.replaying:
            self.replaying = False
            size = _stack_size()
            if size and _stack_at(size - 1) is self.mode:
                _pop_mode()

    def remove(self) -> None:
        if self.suspended:
            self.suspended = False
            return
        above = []
        while _stack_size():
            top = _pop_mode()
            if top is self.mode:
                break
            above.append(top)
        for mode in reversed(above):    # the modes above it (or all, had it gone) go back
            _push_mode(mode)
