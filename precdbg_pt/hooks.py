"""The hooks precdbg puts on torch objects, as objects (no closures): the guard every hook runs
under, a module's forward pre-hooks and hook, a parameter's gradient hooks. Each turns its
arguments into calls to the core session; `TorchAdapter` registers and removes them."""
from __future__ import annotations

import threading
import weakref
from typing import Any, List, Optional, TYPE_CHECKING

import torch

from precdbg.capture import GuardedHook
from precdbg.records import Direction, Role

from .api import tensor_args, tensor_outputs
from .graph import input_targets
from .recompute import REPLAY

if TYPE_CHECKING:  # pragma: no cover
    from .adapter import TorchAdapter

__all__ = ["Guard", "ModuleHooks", "ParamGradHook", "GradHolderHook", "is_module_hook",
           "MODULE_NODE_LIMIT"]

MODULE_NODE_LIMIT = 200_000   # nodes one module call's backward watch may create

_is_grad_enabled = torch._C.is_grad_enabled
_get_ident = threading.get_ident
_set_grad_enabled = torch._C._set_grad_enabled
_DisableTorchFunction = torch._C.DisableTorchFunction
_BACKWARD, _PARAM_GRAD = Direction.BACKWARD, Role.PARAM_GRAD
_FORWARD, _INPUT, _OUTPUT = Direction.FORWARD, Role.INPUT, Role.OUTPUT


class Guard:
    """Inside our own hooks: no capture of our own torch calls, no graph, nothing raised; when
    it ends, the statistics kernels its hook queued are launched (the adapter's own
    `TorchTensors`)."""
    __slots__ = ("adapter", "prev_grad", "disable")

    def __init__(self, adapter: "TorchAdapter") -> None:
        self.adapter = adapter

    def __enter__(self) -> "Guard":
        self.adapter.busy += 1
        # torch functions off first: under a torch-function mode even the grad switch goes
        # through it (a Python call per switch)
        self.disable = _DisableTorchFunction()
        self.disable.__enter__()
        self.prev_grad = _is_grad_enabled()
        _set_grad_enabled(False)          # the C switch: torch.set_grad_enabled's class costs
        return self                       # ~3 us a hook, and hooks run per record

    def __exit__(self, *exc: Any) -> None:
        # statistics queued by this hook share kernel launches, before torch runs on (what
        # `TorchTensors.launch_queued` does, its check inlined: this runs several times a record)
        device = self.adapter.tensors.device
        if device.ever_queued:
            try:
                device.launch_queued()
            except Exception as error:  # noqa: BLE001 - never raise into training
                session = self.adapter.recorder
                if session is not None:
                    session.hook_failed(error, "launching statistics kernels")
        _set_grad_enabled(self.prev_grad)
        self.disable.__exit__(None, None, None)
        self.adapter.busy -= 1


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return f"thread {ident}"


class ModuleHooks:
    """The forward pre-hooks and hook of one module (one object, its bound methods; no
    closures). `open`, put before every other pre-hook, begins the module's call, so what the
    module's own pre-hooks compute (pruning's masked weight, weight_norm's, spectral_norm's
    power iteration, a user's) runs inside it; `pre`, after them, records the inputs the
    forward gets; `post` records its outputs and watches its backward when captured."""
    __slots__ = ("adapter", "path", "cls", "calls")

    def __init__(self, adapter: "TorchAdapter", path: str, cls: str) -> None:
        self.adapter, self.path, self.cls = adapter, path, cls
        # nested (re-entrant) calls: [Call or None, backward targets or None, replayed?,
        # gradients watched?]
        self.calls: List[List[Any]] = []

    def open(self, module: Any, args: tuple, kwargs: dict) -> None:
        adapter = self.adapter
        if not adapter.installed:
            return None
        session = adapter.recorder
        grad_on = _is_grad_enabled() and session.filter.keeps_backward
        replay = adapter._recompute.where() == REPLAY     # activation recompute
        mode = adapter._mode
        if mode is not None and mode.thread != _get_ident() and not replay:
            session.api_calls_missed_in_thread(self.path or self.cls,
                                               threading.current_thread().name,
                                               _thread_name(mode.thread))
        try:
            with Guard(adapter):
                grad_on, replayable = adapter.replays.forward_watch(grad_on)
                call, subtree = session.begin_module("Module", self.path, self.cls, grad_on,
                                                     replay, replayable)
                session.enter_module(self.path, subtree)
                if replay and adapter._mode is not None:
                    adapter._mode.enter_replay()   # so the replay's API calls are seen
                self.calls.append([call, None, replay, grad_on])
        except Exception as exc:  # noqa: BLE001 - never raise into training
            session.hook_failed(exc, f"forward pre-hook of {self.path or self.cls}")
        return None

    def pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        adapter = self.adapter
        if not adapter.installed or not self.calls:
            return None
        entry = self.calls[-1]
        call, _, replay, grad_on = entry
        if call is None:
            return None
        session = adapter.recorder
        try:
            with Guard(adapter):
                inputs = tensor_args(args, kwargs)
                if not replay:
                    for index, key, t in inputs:
                        session.capture(call, _FORWARD, _INPUT, index, key, t)
                if grad_on:
                    entry[1] = input_targets(inputs)   # None: no grad, no backward
        except Exception as exc:  # noqa: BLE001 - never raise into training
            session.hook_failed(exc, f"forward pre-hook of {self.path or self.cls}")
        return None

    def post(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        adapter = self.adapter
        if not adapter.installed or not self.calls:
            return None
        session = adapter.recorder
        call, targets, replay, _ = self.calls.pop()
        try:
            if call is not None:
                outputs = tensor_outputs(output)
                with Guard(adapter):
                    if not replay:                 # a replay's forward is recorded already
                        for index, key, t in outputs:
                            session.capture(call, _FORWARD, _OUTPUT, index, key, t)
                    if targets is not None:
                        adapter.watch(call, targets, outputs, MODULE_NODE_LIMIT)
                    session.end_call()
        except Exception as exc:  # noqa: BLE001 - never raise into training
            session.hook_failed(exc, f"forward hook of {self.path or self.cls}")
        finally:
            session.exit_module()
        return None


def is_module_hook(hook: Any) -> bool:
    """Whether a module's forward (pre-)hook is precdbg's (a bound method of `ModuleHooks`)."""
    return type(getattr(hook, "__self__", None)) is ModuleHooks


class ParamGradHook(GuardedHook):
    """A trainable parameter's gradient hook: records its dw."""
    __slots__ = ("path", "param")

    def __init__(self, adapter: "TorchAdapter", path: str,
                 param: Optional[torch.Tensor] = None) -> None:
        super().__init__(adapter)
        self.path = path
        # the parameter whose backward hook this is (weakly: the hook is held by it), or None
        # for a gradient handed over outside autograd's hooks
        self.param = weakref.ref(param) if param is not None else None

    def record(self, session: Any, grad: torch.Tensor) -> None:
        param = self.param() if self.param is not None else None
        if param is not None and not _accumulates(param):
            return
        call = session.param_call(self.path)
        if call is not None:
            session.capture(call, _BACKWARD, _PARAM_GRAD, 0, "", grad)

    def where(self) -> str:
        return f"gradient hook of {self.path}"


# a leaf's AccumulateGrad node (what `torch.autograd.graph.get_gradient_edge` reads, without
# the edge object it builds: ~4 us a call)
_grad_node = getattr(torch.autograd.graph, "_get_grad_fn_or_grad_acc", None)
_will_execute = getattr(torch._C, "_will_engine_execute_node", None)


def _accumulates(param: torch.Tensor) -> bool:
    """Whether the running backward accumulates `param`'s gradient (`.backward()`), not
    `torch.autograd.grad` (a MAML inner step, a gradient penalty), whose gradient goes back to
    its caller and never into `.grad`: that is no dw of the step (what is computed from it is
    captured as API calls). torch refuses the question for a leaf while autograd.grad runs."""
    if _grad_node is None or _will_execute is None:
        return True
    try:
        return bool(_will_execute(_grad_node(param)))
    except RuntimeError:
        return False            # "... we are currently running autograd.grad()"


class GradHolderHook(GuardedHook):
    """After a parameter's gradient is accumulated: what holds it (`.grad`, Megatron's
    `main_grad`) was produced by this parameter's dw record."""
    __slots__ = ("path",)

    def __init__(self, adapter: "TorchAdapter", path: str) -> None:
        super().__init__(adapter)
        self.path = path

    def record(self, session: Any, param: torch.Tensor) -> None:
        for holder in (param.grad, getattr(param, "main_grad", None)):
            if isinstance(holder, torch.Tensor):
                session.grad_produced(self.path, holder)

    def where(self) -> str:
        return f"gradient of {self.path}"
