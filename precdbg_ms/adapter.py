"""The MindSpore adapter (PyNative mode): applies the patch registry and the cell, parameter and
optimizer hooks on `start`, removes all of them on `stop`, and turns MindSpore objects into calls
to the core session. Naming, filtering and layout are the core's.

Backward: a captured API call hands each floating-point input to the op through a fresh view
(`x.view(x.shape)`), whose gradient hook receives exactly the gradient this call sends to that
input (dx); a hook on each output receives the gradient arriving at it (dy). A cell's inputs and
outputs pass through HookBackward (precdbg_ms.cell_hooks). dw comes from `Parameter.register_hook`: the
gradient of this backward pass, before the optimizer.

Nothing here reads a tensor's memory while capturing (PyNative would wait for the op, see
precdbg_ms/tensors.py): tensors are known by their objects, and MindSpore's other objects over
the same memory are linked to them: a cell's hook copies (`CellHooks._alias`) and the gradients
a grad function returns (`link_returned_grads`).
"""
from __future__ import annotations

import os
import platform
import threading
from typing import Any, Callable, Dict, Iterable, List, Tuple

import mindspore as ms
from mindspore import nn

import precdbg
from precdbg.errors import FrameworkError
from precdbg.capture import BaseInstrumentor, NamedTensor, Recorder, jsonable, named_through
from precdbg.records import Direction, Role, in_place, inventory_role

from . import wrapper_cells
from .api_registry import PatchRegistry
from .call_arguments import (is_floating, is_tensor, scalar_inputs, takes_grad, tensor_inputs,
                             tensor_outputs)
from .cell_copies import CopyOrigins
from .cell_hooks import CellHooks, keep_attributes
from .hook_backward import replace_arguments, top_level
from .optimizer import patch_loss_scalers, patch_optimizer
from .pynative import _pynative_executor, register_tensor_hook
from .recompute import Replay, model_cells, patch_recompute
from .returned_grads import GradientLinks, patch_grad_executor
from .tensors import MindSporeTensors
from .untracked_writes import patch_writes

_BACKWARD = Direction.BACKWARD
_FORWARD = Direction.FORWARD
_GRAD_INPUT = Role.GRAD_INPUT
_GRAD_OUTPUT = Role.GRAD_OUTPUT
_INPUT = Role.INPUT
_OUTPUT = Role.OUTPUT
_PARAM_GRAD = Role.PARAM_GRAD

__all__ = ["MindSporeAdapter"]

_thread = threading.get_ident

_INTERNAL_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (ms, precdbg)) + (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,)


class MindSporeAdapter(BaseInstrumentor):
    """Owner of every patch and hook precdbg puts into MindSpore, and of the objects that keep
    what one debugger's capture needs: its tensor questions (`tensors`), the hooks of the
    model's cells (`cells`), a cell's hook copies (`copies`), the gradients a grad function
    returns and a recompute's replay."""
    framework = "mindspore"
    module_type = nn.Cell
    module_type_name = "mindspore.nn.Cell"
    empty_capture_hint = ("code compiled with @jit (or run in GRAPH_MODE) does not run hooks: "
                          "dump the step in PyNative mode without @jit")
    internal_dirs = _INTERNAL_DIRS
    is_tensor = staticmethod(is_tensor)

    def __init__(self) -> None:
        super().__init__()
        # the tensor questions the core asks (precdbg.capture.TensorOps), with their state
        self.tensors = MindSporeTensors()
        self._note_write = self.tensors.note_write      # bound once: called per in-place call
        self._settle = self.tensors.settle
        self._registry = PatchRegistry()
        self.capturing_thread = 0
        self.copies = CopyOrigins()      # a cell's hook copies and what they copy
        self._grad_links = GradientLinks()
        self.replay = Replay(self.copies.origin)   # inside a recompute's replay of a forward
        self._enable_grad = _pynative_executor.enable_grad
        # inside a gradient computation (value_and_grad): a flag, no wait for the pipeline
        self.requires_grad = _pynative_executor.requires_grad
        self._view = ms.Tensor.view       # the original, unpatched
        self.takes_grad = takes_grad      # whether a tensor is part of a gradient computation
        self.cells = CellHooks(self)      # the hooks of the model's cells

    # ------------------------------------------------------------------ environment
    def environment(self) -> Dict[str, Any]:
        return {"framework_version": ms.__version__,
                "device": ms.get_context("device_target"),
                "mode": "PYNATIVE" if ms.get_context("mode") == ms.PYNATIVE_MODE else "GRAPH",
                "machine": platform.machine()}

    def manifest(self) -> Dict[str, Any]:
        """Versions, device, and the settings that decide determinism and precision."""
        det: Dict[str, Any] = {"seed": ms.get_seed()}
        for key in ("deterministic", "mode"):
            try:
                det[key] = jsonable(ms.get_context(key))
            except (ValueError, RuntimeError):
                pass
        return {"versions": {"mindspore": ms.__version__},
                "device": {"kind": ms.get_context("device_target"), "count": 1},
                "determinism": det}

    def rank_and_world(self) -> Tuple[int, int]:
        try:
            from mindspore.communication import GlobalComm, get_group_size, get_rank
            if GlobalComm.INITED:
                return get_rank(), get_group_size()
        except (ImportError, RuntimeError):
            pass
        return 0, 1

    # ------------------------------------------------------------------ what the base asks
    def check_model(self, model: Any) -> None:
        """Also refuse GRAPH_MODE here, before run.json is written: the corrected script may
        use the same folder."""
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise FrameworkError(
                "MindSpore is in GRAPH_MODE: precdbg's hooks only run in PyNative mode (and not "
                "inside @jit functions); call ms.set_context(mode=ms.PYNATIVE_MODE) before the "
                "steps you dump")
        super().check_model(model)

    def _prepare(self, session: Recorder) -> None:
        self.cells.prepare(session)
        # host statistics wait for the batch only where every in-place write goes through a
        # wrapped API first (it settles them): not at level module, where nothing wraps APIs
        self.tensors.begin_window(defer_host_statistics=session.config.keeps_apis)

    def named_submodules(self, module: nn.Cell) -> Iterable[Tuple[str, Any]]:
        return named_through(model_cells(module.cells_and_names()), wrapper_cells.held_as)

    def own_parameters(self, module: nn.Cell) -> Iterable[Tuple[str, Any]]:
        return module.parameters_and_names(expand=False)

    def inventory_role(self, leaf: str, value: Any, is_param: bool) -> Tuple[str, bool]:
        trainable = bool(value.requires_grad)
        return inventory_role(self.framework, leaf, trainable), trainable

    def hook_module(self, path: str, cell: nn.Cell) -> None:
        self.cells.hook(path, cell)

    def gradient_hooks(self, path: str, param: Any) -> Iterable[Any]:
        return (register_tensor_hook(param, self._param_grad_hook(path, param)),)

    def _instrument(self, session: Recorder, params: List[NamedTensor]) -> None:
        cfg = session.config
        # the patched APIs are process-wide: only the thread that started the capture (the
        # training loop's) is recorded, as PyTorch's capture mode is per thread
        self.capturing_thread = _thread()
        jitted = self.cells.jitted
        if jitted:
            session.note_manifest("unobserved", {"compiler": "ms.jit", "modules": jitted})
            session.say_once("ms.jit", "precdbg: cell(s) %s run compiled (ms.jit): their calls "
                             "are captured, nothing inside them",
                             ", ".join(p or "(the model)" for p in jitted))
        # API calls are dumped: wrap the registry (not at level module: nothing kept)
        if cfg.keeps_apis:
            for patch in self._registry.apply(self._make_wrapper):
                self.hold(patch)
        self.hold(patch_optimizer(self))
        for patch in patch_loss_scalers(self):
            self.hold(patch)
        self.hold(patch_grad_executor(self))
        for patch in patch_recompute(self._replayed, self._detached):
            self.hold(patch)
        for patch in patch_writes(self):
            self.hold(patch)

    def _uninstrument(self) -> None:
        self.cells.clear()
        self.replay.reset()
        self.copies.clear()
        self._grad_links.clear()
        self.tensors.forget_writes()

    # ------------------------------------------------------------------ API calls
    def _make_wrapper(self, original: Any, prefix: str, api: str) -> Callable:
        adapter = self

        if api:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if adapter.busy or adapter.paused or not adapter.installed or \
                        _thread() != adapter.capturing_thread:
                    return original(*args, **kwargs)
                return adapter._on_api_call(original, prefix, api, args, kwargs)
            return wrapper

        def call_primitive(prim: Any, *args: Any, **kwargs: Any) -> Any:
            """A primitive's arguments are those of its call, not the primitive itself."""
            if adapter.busy or adapter.paused or not adapter.installed or \
                    _thread() != adapter.capturing_thread:
                return original(prim, *args, **kwargs)
            bound = lambda *a, **k: original(prim, *a, **k)  # noqa: E731
            name = type(prim).__name__     # a generic Primitive("typeof") by its own name
            if name == "Primitive":
                name = str(getattr(prim, "name", "") or name)
            return adapter._on_api_call(bound, prefix, name, args, kwargs,
                                        writes=bool(getattr(prim, "side_effect_mem", False)))
        return call_primitive

    def _on_api_call(self, func: Any, prefix: str, api: str, args: tuple, kwargs: dict,
                     inner: bool = False, writes: bool = False) -> Any:
        """Record one call; the calls it makes are not separate entries unless `inner`.
        `writes`: the call writes memory in place (as do APIs named so, see `in_place`)."""
        session = self.recorder
        watched: List[Tuple[int, str, Any]] = []
        grad_on, replay = self.grad_state()
        given = (args, kwargs)
        call = self.run_guarded(session.begin_api, f"capturing {prefix}.{api}", prefix, api,
                                grad_on, replay)
        if call is not None:
            result = self.run_guarded(self._api_inputs,
                                      f"capturing inputs of {call.forward_entry}",
                                      call, api, args, kwargs, replay, grad_on and not inner)
            if result is not None and not inner:
                args, kwargs, watched = result
        writes = writes or in_place(api)
        if writes:
            self.settle_statistics()
        if not inner:
            self.busy += 1
        try:
            out = func(*args, **kwargs)
        finally:
            if not inner:
                self.busy -= 1
        if writes:                # the first tensor argument is the one written
            written = next((a for a in args if is_tensor(a)), None)
            if written is not None:
                self._note_write(written)
        if call is not None:
            self.run_guarded(self._api_outputs, f"capturing outputs of {call.forward_entry}",
                             call, watched, out, replay)
        if replay:
            self.run_guarded(self._replay_computed, f"following a recompute of {api}",
                             tensor_inputs(*given), out)
        return out

    def _replay_computed(self, inputs: list, out: Any) -> None:
        self.replay.computed(inputs, tensor_outputs(out))

    def grad_state(self) -> Tuple[bool, bool]:
        """(whether a call's backward is watched: gradients are enabled and the backward is
        captured, whether the call replays an earlier one: activation recompute)"""
        return (self.recorder.filter.keeps_backward and bool(self._enable_grad()),
                self.replay.depth > 0)

    def _replayed(self, owners: List[Any], run: Callable[..., Any], *args: Any) -> Any:
        """Run a recompute's replay of a forward (`precdbg_ms.recompute`): of the first of
        `owners` that is a module of the model."""
        if not self.installed:
            return run(*args)
        self.run_guarded(self.recorder.replay_begins, "starting a recompute",
                         self.module_path(owners) or None)
        replay = self.replay
        replay.begin()
        try:
            return run(*args)
        finally:
            replay.end()

    def _detached(self, pairs: List[Tuple[Any, Any]]) -> None:
        if self.installed:
            self.run_guarded(self.replay.detached, "noting a recompute's inputs", pairs)

    def settle_statistics(self) -> None:
        """Something is about to write in place: the statistics deferred so far are read now,
        with the values they had when captured (one wait for the pipeline)."""
        self.run_guarded(self._settle, "reading deferred statistics before an in-place write")

    def _api_inputs(self, call: Any, api: str, args: tuple, kwargs: dict, replay: bool,
                    grad_on: bool):
        session = self.recorder
        inputs = tensor_inputs(args, kwargs)
        if not replay:                  # a replay's forward is recorded already
            for index, key, t in inputs:
                session.capture(call, _FORWARD, _INPUT, index, key, t)
            for index, (key, value) in enumerate(scalar_inputs(args, kwargs), len(inputs)):
                session.capture_value(call, index, key, value)
        if not grad_on or in_place(api):
            return args, kwargs, []
        # each floating input reaches the op through a view of its own, whose hook sees this
        # call's dx (a view, not HookBackward: an API that writes its argument without saying
        # so, as `assign_value` does, must still write the caller's tensor)
        watched: List[Tuple[int, str, Any]] = []
        replaced: Dict[str, Any] = {}
        for index, key, t in inputs:
            if not top_level(key) or not is_floating(t) or not self.takes_grad(t) or \
                    (replay and self.replay.is_constant(t)):
                continue
            view = keep_attributes(t, self._view(t, t.shape))
            try:
                register_tensor_hook(view, self._grad_hook(call, _GRAD_INPUT, index, key))
            except RuntimeError:      # not inside a gradient computation after all
                continue
            replaced[key] = view
            watched.append((index, key, view))
        args, kwargs = replace_arguments(args, kwargs, replaced)
        return args, kwargs, watched

    def _api_outputs(self, call: Any, watched: list, out: Any, replay: bool) -> None:
        session = self.recorder
        outputs = tensor_outputs(out)
        if not replay:
            for index, key, t in outputs:
                session.capture(call, _FORWARD, _OUTPUT, index, key, t)
        if watched:               # the gradient arriving at each output (dy)
            for index, key, t in outputs:
                if is_floating(t) and self.takes_grad(t):
                    try:
                        register_tensor_hook(t, self._grad_hook(call, _GRAD_OUTPUT, index,
                                                                key))
                    except RuntimeError:
                        pass
        session.end_call()

    def _grad_hook(self, call: Any, role: Role, index: int, key: str) -> Callable:
        def record(grad: Any) -> None:
            self.recorder.capture(call, _BACKWARD, role, index, key, grad)
            self.recorder.end_call()

        def hook(grad: Any) -> None:
            if self.installed and grad is not None:
                self.run_guarded(record, f"backward hook of {call.backward_entry}", grad)
            return None
        return hook

    def link_returned_grads(self, returned: Any) -> None:
        """A grad function returned: its gradients are the parameter hooks' ones, in new objects."""
        for grad, copy in self._grad_links.pairs(returned):
            self.recorder.alias_of(grad, copy)

    # ------------------------------------------------------------------ parameters
    def _param_grad_hook(self, path: str, param: Any) -> Callable:
        param_users = self.cells.param_users      # the same dict for the adapter's lifetime

        def record(grad: Any) -> None:
            call = self.recorder.param_call(path)
            if call is not None:
                self.recorder.capture(call, _BACKWARD, _PARAM_GRAD, 0, "", grad)
                # the gradient value_and_grad returns is this memory in another object
                self.recorder.grad_produced(path, grad, hold=True)
                self._grad_links.saw(grad)
            users = param_users.pop(id(param), ())
            if len(users) == 1:        # dw of the leaf cell's functional call that read it; a
                api_call, index, key = users[0]     # parameter two calls read (tied weights,
                self.recorder.capture(api_call, _BACKWARD, _GRAD_INPUT, index, key, grad)
            # a cell called twice) has no per-call gradient here: the dw alone holds the sum
            self.recorder.end_call()

        def hook(grad: Any) -> None:
            if self.installed and grad is not None:
                self.run_guarded(record, f"gradient hook of {path}", grad)
            return None
        return hook
