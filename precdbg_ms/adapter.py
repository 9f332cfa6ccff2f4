"""The MindSpore adapter (PyNative mode): applies the patch registry and the cell, parameter and
optimizer hooks on `start`, removes all of them on `stop`, and turns MindSpore objects into calls
to the core session. Naming, filtering and layout are the core's.

Backward: a captured API call hands each floating-point input to the op through a fresh view
(`x.view(x.shape)`), whose gradient hook receives exactly the gradient this call sends to that
input (dx); a hook on each output receives the gradient arriving at it (dy). Cells use MindSpore's
own cell backward hooks (grad_input, grad_output). dw comes from `Parameter.register_hook`: the
gradient of this backward pass, before the optimizer.
"""
from __future__ import annotations

import os
import platform
from typing import Any, Callable, Dict, List, Optional, Tuple

import mindspore as ms
from mindspore import nn

import precdbg
from precdbg.arguments import tensor_arguments, tensor_results, value_arguments
from precdbg.errors import FrameworkError, PrecdbgError
from precdbg.layers import raw_settings
from precdbg.manifest import jsonable
from precdbg.naming import framework_table, inventory_role
from precdbg.schema import RecordKind

from . import aliasing, tensors
from .optimizer import OptimizerPatch
from .patches import PatchRegistry

__all__ = ["MindSporeAdapter"]

_INTERNAL_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (ms, precdbg)) + (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_FLOAT_NAMES = {"float16", "float32", "float64", "bfloat16"}


def _is_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor)


def _dtype_name(value: Any) -> Optional[str]:
    return tensors.dtype_name(value) if isinstance(value, ms.dtype.Type) else None


def _tensors(args: tuple, kwargs: dict) -> List[Tuple[int, str, Any]]:
    return tensor_arguments(args, kwargs, _is_tensor)


def _outputs(result: Any) -> List[Tuple[int, str, Any]]:
    return tensor_results(result, _is_tensor)


def _scalars(args: tuple, kwargs: dict) -> List[Tuple[str, Any]]:
    return value_arguments(args, kwargs, _dtype_name)


def _memory(t: Any) -> Tuple[int, Tuple[int, ...]]:
    """Where a tensor's elements are: equal for a tensor and MindSpore's hook-wrapped copy."""
    try:
        return t.data_ptr(), tuple(t.shape)
    except Exception:  # noqa: BLE001 - no device memory yet
        return id(t), ()


def _takes_grad(t: Any) -> bool:
    """Part of a gradient computation (MindSpore refuses hooks on other tensors)."""
    return bool(getattr(t, "_requires_grad", getattr(t, "requires_grad", False)))


def _is_floating(t: Any) -> bool:
    return tensors.dtype_name(t.dtype) in _FLOAT_NAMES


def _in_place(api: str) -> bool:
    return (api.endswith("_") and not api.endswith("__")) or api.startswith("__i") or \
        api in ("__setitem__", "assign", "assign_add", "assign_sub", "scatter_update")


class MindSporeAdapter:
    """Owner of every patch and hook precdbg puts into MindSpore."""
    framework = "mindspore"
    empty_capture_hint = ("code compiled with @jit (or run in GRAPH_MODE) does not run hooks: "
                          "dump the step in PyNative mode without @jit")

    def __init__(self) -> None:
        self.session: Any = None
        self.busy = 0
        self.paused = False
        self.installed = False
        self._registry = PatchRegistry()
        self._handles: List[Any] = []
        self._cell_calls: Dict[int, List[Any]] = {}
        self._param_users: Dict[int, Tuple[Any, int, str]] = {}
        self._optimizer_patch = OptimizerPatch()
        self._leaf_cells: Dict[str, str] = {}
        self._view = ms.Tensor.view       # the original, unpatched
        self._wrapped_hooks: List[Tuple[Any, Any]] = []

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

    tensors = tensors
    internal_dirs = _INTERNAL_DIRS

    # ------------------------------------------------------------------ install / uninstall
    def install(self, session: Any, model: Any) -> None:
        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise FrameworkError(
                "MindSpore is in GRAPH_MODE: precdbg's hooks only run in PyNative mode (and not "
                "inside @jit functions); call ms.set_context(mode=ms.PYNATIVE_MODE) before the "
                "steps you dump")
        cells = self._named_cells(model)
        self.session = session
        self.busy = 0
        self.paused = False
        self.installed = True
        self._leaf_cells = dict(framework_table("mindspore").get("leaf_cells", {}))
        self.busy += 1
        try:
            if cells:
                session.set_module_tree([(path, type(c).__name__, path.rpartition(".")[0],
                                          raw_settings(self.framework, type(c).__name__, c))
                                         for path, c in cells])
                self._inventory(cells)
        finally:
            self.busy -= 1
        for path, cell in cells:
            self._hook_cell(path, cell)
        for full, param in self._named_params(cells):
            if param.requires_grad:
                self._handles.append(param.register_hook(self._param_grad_hook(full, param)))
        cfg = session.config
        if cfg.keeps_apis or cfg.keeps_modules:
            self._registry.apply(self._make_wrapper)
        self._optimizer_patch.apply(self)

    def uninstall(self) -> None:
        failed = self._registry.restore()
        self._optimizer_patch.restore()
        handles, self._handles = self._handles, []
        for handle in handles:
            try:
                handle.remove()
            except Exception as exc:  # noqa: BLE001
                if self.session is not None:
                    self.session.hook_failed(exc, "removing a hook")
        self._cell_calls.clear()
        self._param_users.clear()
        aliasing.restore(self._wrapped_hooks)
        self._wrapped_hooks = []

        self.installed = False
        if failed and self.session is not None:
            self.session.hook_failed(RuntimeError("; ".join(failed[:3])), "restoring patches")

    @staticmethod
    def _named_cells(model: Any) -> List[Tuple[str, nn.Cell]]:
        if model is None:
            return []
        if isinstance(model, nn.Cell):
            return list(model.cells_and_names())
        if isinstance(model, (list, tuple)):
            out: List[Tuple[str, nn.Cell]] = []
            for i, cell in enumerate(model):
                if not isinstance(cell, nn.Cell):
                    raise PrecdbgError(f"start(model): item {i} is {type(cell).__name__}, "
                                       "not a mindspore.nn.Cell")
                out.extend((f"{i}.{p}" if p else str(i), c) for p, c in cell.cells_and_names())
            return out
        raise PrecdbgError(f"start(model): expected a mindspore.nn.Cell or a list of them, got "
                           f"{type(model).__name__}")

    @staticmethod
    def _named_params(cells: List[Tuple[str, nn.Cell]]) -> List[Tuple[str, Any]]:
        seen, out = set(), []
        for path, cell in cells:
            for name, param in cell.parameters_and_names(expand=False):
                if id(param) in seen:
                    continue
                seen.add(id(param))
                out.append((f"{path}.{name}" if path else name, param))
        return out

    is_tensor = staticmethod(_is_tensor)

    def quietly(self, fn: Callable, *args: Any) -> Any:
        """Run our own code: nothing it calls is captured (errors propagate to the caller)."""
        self.busy += 1
        try:
            return fn(*args)
        finally:
            self.busy -= 1

    # ------------------------------------------------------------------ guard
    def _run(self, fn: Callable, where: str, *args: Any) -> Any:
        """Run our own code: nothing it calls is captured, nothing it raises reaches training."""
        self.busy += 1
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.session.hook_failed(exc, where)
            return None
        finally:
            self.busy -= 1

    # ------------------------------------------------------------------ API calls
    def _make_wrapper(self, original: Any, prefix: str, api: str) -> Callable:
        adapter = self

        if api:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if adapter.busy or adapter.paused or not adapter.installed:
                    return original(*args, **kwargs)
                return adapter._on_api_call(original, prefix, api, args, kwargs)
            return wrapper

        def call_primitive(prim: Any, *args: Any, **kwargs: Any) -> Any:
            """A primitive's arguments are those of its call, not the primitive itself."""
            if adapter.busy or adapter.paused or not adapter.installed:
                return original(prim, *args, **kwargs)
            bound = lambda *a, **k: original(prim, *a, **k)  # noqa: E731
            return adapter._on_api_call(bound, prefix, type(prim).__name__, args, kwargs)
        return call_primitive

    def _on_api_call(self, func: Any, prefix: str, api: str, args: tuple, kwargs: dict,
                     inner: bool = False) -> Any:
        """Record one call; the calls it makes are not separate entries unless `inner`."""
        session = self.session
        watched: List[Tuple[int, str, Any]] = []
        call = self._run(session.begin_api, f"capturing {prefix}.{api}", prefix, api)
        if call is not None:
            result = self._run(self._api_inputs, f"capturing inputs of {call.forward_entry}",
                               call, api, args, kwargs)
            if result is not None and not inner:
                args, kwargs, watched = result
        if not inner:
            self.busy += 1
        try:
            out = func(*args, **kwargs)
        finally:
            if not inner:
                self.busy -= 1
        if call is not None:
            self._run(self._api_outputs, f"capturing outputs of {call.forward_entry}", call,
                      watched, out)
        return out

    def _api_inputs(self, call: Any, api: str, args: tuple, kwargs: dict):
        session = self.session
        inputs = _tensors(args, kwargs)
        for index, key, t in inputs:
            session.capture(call, "forward", "input", index, key, t)
        for index, (key, value) in enumerate(_scalars(args, kwargs), len(inputs)):
            session.capture_value(call, index, key, value)
        if not session.filter.keeps_backward or _in_place(api):
            return args, kwargs, []
        # give each floating input to the op through its own view: its hook sees this call's dx
        watched, args, kwargs = [], list(args), dict(kwargs)
        for index, key, t in inputs:
            top = key.split(".")[0]
            if "." in key or not _is_floating(t) or not _takes_grad(t):
                continue
            view = self._view(t, t.shape)
            try:
                view.register_hook(self._grad_hook(call, "grad_input", index, key))
            except RuntimeError:      # not inside a gradient computation after all
                continue
            if top.isdigit():
                args[int(top)] = view
            else:
                kwargs[top] = view
            watched.append((index, key, view))
        return tuple(args), kwargs, watched

    def _api_outputs(self, call: Any, watched: list, out: Any) -> None:
        session = self.session
        outputs = _outputs(out)
        for index, key, t in outputs:
            session.capture(call, "forward", "output", index, key, t)
        if session.filter.keeps_backward and watched:
            for index, key, t in outputs:
                if _is_floating(t) and _takes_grad(t):
                    try:
                        t.register_hook(self._grad_hook(call, "grad_output", index, key))
                    except RuntimeError:
                        pass
        session.end_call()

    def _grad_hook(self, call: Any, role: str, index: int, key: str) -> Callable:
        def record(grad: Any) -> None:
            self.session.capture(call, "backward", role, index, key, grad)
            self.session.end_call()

        def hook(grad: Any) -> None:
            if self.installed and grad is not None:
                self._run(record, f"backward hook of {call.backward_entry}", grad)
            return None
        return hook

    # ------------------------------------------------------------------ cells
    def _hook_cell(self, path: str, cell: nn.Cell) -> None:
        cls = type(cell).__name__
        leaf_api = self._leaf_cells.get(cls) if type(cell).__module__.startswith("mindspore.") \
            else None
        key = id(cell)

        def pre(c: Any, args: tuple, kwargs: dict) -> None:
            if not self.installed or self.paused:
                return None
            self._run(self._cell_pre, f"forward pre-hook of {path or cls}", cell, path, cls,
                      leaf_api, args, kwargs)
            if leaf_api:
                self.busy += 1          # the primitives inside a leaf cell are that one API
            return None

        def post(c: Any, args: tuple, kwargs: dict, output: Any) -> None:
            if not self.installed or self.paused:
                return None
            if leaf_api:
                self.busy = max(0, self.busy - 1)
            self._run(self._cell_post, f"forward hook of {path or cls}", key, output)
            return None

        def backward(c: Any, grad_input: Any, grad_output: Any) -> None:
            if self.installed:
                self._run(self._cell_backward, f"backward hook of {path or cls}", key,
                          grad_input, grad_output)
            return None

        self._handles.append(cell.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(cell.register_forward_hook(post, with_kwargs=True, always_call=True))
        if self.session.filter.keeps_backward:
            self._handles.append(cell.register_backward_hook(backward))
            self._wrapped_hooks.append(aliasing.wrap_cell_backward_hook(cell, self._alias))

    def _alias(self, original: Any, copy: Any) -> None:
        if self.installed:
            self._run(self.session.alias_of, "linking a cell's copy of a tensor", original, copy)

    def _cell_pre(self, cell: nn.Cell, path: str, cls: str, leaf_api: Optional[str],
                  args: tuple, kwargs: dict) -> None:
        session = self.session
        # the module is entered and its slot pushed first, so the forward hook always finds
        # both (and leaves the module) even when capturing below fails
        slot: List[Any] = [None, None, set(), False]     # call, API call, input memory, entered
        self._cell_calls.setdefault(id(cell), []).append(slot)
        call, subtree = session.begin_module("Cell", path, cls)
        session.enter_module(path, subtree)
        slot[0], slot[3] = call, True
        api_call = session.begin_api("Functional", leaf_api) if leaf_api else None
        slot[1] = api_call
        inputs = _tensors(args, kwargs)
        slot[2] = {_memory(t) for _, _, t in inputs}
        if call is not None:
            for index, k, t in inputs:
                session.capture(call, "forward", "input", index, k, t)
        if api_call is not None:
            # the functional form takes the cell's parameters as arguments after its inputs
            # (F.linear(x, weight, bias)); their dw is this call's grad_input too
            for index, k, t in inputs:
                session.capture(api_call, "forward", "input", index, k, t)
            for index, (name, param) in enumerate(cell.parameters_and_names(expand=False),
                                                  len(inputs)):
                key = name.rpartition(".")[2]
                session.capture(api_call, "forward", "input", index, key, param)
                self._param_users[id(param)] = (api_call, index, key)

    def _cell_post(self, key: int, output: Any) -> None:
        session = self.session
        stack = self._cell_calls.get(key)
        if not stack:
            return
        call, api_call, input_ids, entered = stack[-1]
        identity = False
        try:
            outputs = _outputs(output)
            # a cell returning its input (Dropout in eval or p=0) has no backward of its own
            identity = any(_memory(t) in input_ids for _, _, t in outputs)
            for target in (api_call, call):
                if target is not None:
                    for index, k, t in outputs:
                        session.capture(target, "forward", "output", index, k, t)
            session.end_call()
        finally:
            if entered:
                session.exit_module()
            stack.pop()
            # the backward hook runs in reverse order of the forward calls
            self._pending_backward(key).append(None if identity else (call, api_call))

    def _pending_backward(self, key: int) -> List[Tuple[Any, Any]]:
        return self._cell_calls.setdefault(-key - 1, [])

    def _cell_backward(self, key: int, grad_input: Any, grad_output: Any) -> None:
        pending = self._pending_backward(key)
        if not pending:
            return
        calls = pending.pop()
        if calls is None:
            return
        call, api_call = calls
        session = self.session
        for target in (call, api_call):
            if target is None:
                continue
            for index, k, g in _outputs(grad_output):
                session.capture(target, "backward", "grad_output", index, k, g)
            for index, k, g in _outputs(grad_input):
                session.capture(target, "backward", "grad_input", index, k, g)
        session.end_call()

    # ------------------------------------------------------------------ parameters
    def _inventory(self, cells: List[Tuple[str, nn.Cell]]) -> None:
        session = self.session
        owners = {}
        for path, cell in cells:
            for name, param in cell.parameters_and_names(expand=False):
                owners.setdefault(id(param), type(cell).__name__)
        for full, param in self._named_params(cells):
            leaf, trainable = full.rpartition(".")[2], bool(param.requires_grad)
            role = inventory_role(self.framework, leaf, trainable)
            call = session.param_call(full, RecordKind.PARAM.value, owners.get(id(param), ""),
                                      role=role)
            if call is None:
                continue
            session.capture(call, "none", role, 0, leaf, param, trainable=trainable)
            session.end_call()

    def _param_grad_hook(self, path: str, param: Any) -> Callable:
        def record(grad: Any) -> None:
            call = self.session.param_call(path)
            if call is not None:
                self.session.capture(call, "backward", "param_grad", 0, "", grad)
                # the gradient value_and_grad returns is this memory in another object
                self.session.grad_produced(path, grad, hold=True)
            user = self._param_users.get(id(param))
            if user is not None:                 # dw of the leaf cell's functional call
                api_call, index, key = user
                self.session.capture(api_call, "backward", "grad_input", index, key, grad)
            self.session.end_call()

        def hook(grad: Any) -> None:
            if self.installed and grad is not None:
                self._run(record, f"gradient hook of {path}", grad)
            return None
        return hook
