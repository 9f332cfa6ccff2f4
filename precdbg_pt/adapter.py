"""The PyTorch adapter: installs every hook on `start`, removes every hook on `stop`, and turns
torch objects into calls to the core session. No rule lives here (naming, filtering and layout are
the core's); the only state is the handles it must remove.
"""
from __future__ import annotations

import os
import platform
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import precdbg
from precdbg.errors import PrecdbgError
from precdbg.layers import raw_settings
from precdbg.manifest import jsonable
from precdbg.naming import writes_arguments
from precdbg.schema import Phase, RecordKind

from . import tensors
from .api import CaptureMode, scalar_args, tensor_args, tensor_outputs
from .graph import input_targets, watch_backward
from .training_state import watch_training_state

__all__ = ["TorchAdapter"]

_API_NODE_LIMIT = 512          # nodes one API call may create (composite ops stay far below)
_MODULE_NODE_LIMIT = 200_000   # nodes one module call may create
_INTERNAL_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, precdbg)) + (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,)


_is_grad_enabled = torch._C.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_DisableTorchFunction = torch._C.DisableTorchFunction


class _Guard:
    """Inside our own hooks: no capture of our own torch calls, no graph, nothing raised."""
    __slots__ = ("adapter", "prev_grad", "disable")

    def __init__(self, adapter: "TorchAdapter") -> None:
        self.adapter = adapter

    def __enter__(self) -> "_Guard":
        self.adapter.busy += 1
        self.prev_grad = _is_grad_enabled()
        _set_grad_enabled(False)          # the C switch: torch.set_grad_enabled's class costs
        self.disable = _DisableTorchFunction()      # ~3 us a hook, and hooks run per record
        self.disable.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disable.__exit__(None, None, None)
        _set_grad_enabled(self.prev_grad)
        self.adapter.busy -= 1


class TorchAdapter:
    """Owner of every hook, mode and handle precdbg puts into torch."""
    framework = "pytorch"
    empty_capture_hint = ("was the training step run between start() and stop()? (code compiled "
                          "with torch.compile or torch.jit runs no Python hooks)")

    def __init__(self) -> None:
        self.session: Any = None
        self.busy = 0
        self.paused = False     # inside optimizer.step() when optimizer calls are not captured
        self._handles: List[Any] = []
        self._mode: Optional[CaptureMode] = None
        self._module_calls: Dict[int, List[Tuple[Any, list]]] = {}
        self._param_names: Dict[int, str] = {}
        self._optimizers_noted: set = set()
        self.installed = False

    # ------------------------------------------------------------------ environment
    def environment(self) -> Dict[str, Any]:
        env: Dict[str, Any] = {"framework_version": torch.__version__, "device": self._device()}
        env["torch_cuda"] = torch.version.cuda
        try:
            import torch_npu  # type: ignore
            env["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
        except (ImportError, RuntimeError, OSError):
            pass
        env["threads"] = torch.get_num_threads()
        env["machine"] = platform.machine()
        return env

    def manifest(self) -> Dict[str, Any]:
        """Versions, device, and the settings that decide determinism and precision."""
        accel = getattr(torch, "accelerator", None)
        has_accel = accel is not None and accel.is_available()
        versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
        try:
            import torch_npu  # type: ignore
            versions["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
            versions["cann"] = getattr(getattr(torch_npu, "version", None), "cann", None)
        except (ImportError, RuntimeError, OSError):
            pass
        return {
            "versions": versions,
            "device": {"kind": accel.current_accelerator().type if has_accel else "cpu",
                       "count": accel.device_count() if has_accel else 1},
            "determinism": {
                "initial_seed": torch.initial_seed(),
                "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
                "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
                "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
                "allow_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                "allow_tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "num_threads": torch.get_num_threads()},
        }

    def _note_optimizer(self, optimizer: Any) -> None:
        """Class, and per param group its hyperparameters and the names of its parameters."""
        if id(optimizer) in self._optimizers_noted:
            return
        self._optimizers_noted.add(id(optimizer))
        groups = []
        for group in optimizer.param_groups:
            groups.append({"hyper": {k: jsonable(v) for k, v in group.items() if k != "params"},
                           "params": [self._param_names.get(id(p), f"<unnamed {tuple(p.shape)}>")
                                      for p in group["params"]]})
        self.session.note_optimizer({"id": id(optimizer), "class": type(optimizer).__name__,
                                     "param_groups": groups})

    @staticmethod
    def _device() -> str:
        accel = getattr(torch, "accelerator", None)
        if accel is not None and accel.is_available():
            device = accel.current_accelerator()
            return f"{device.type}:{accel.current_device_index()}"
        return "cpu"

    def rank_and_world(self) -> Tuple[int, int]:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    # ------------------------------------------------------------------ tensor questions
    tensors = tensors
    internal_dirs = _INTERNAL_DIRS

    @staticmethod
    def is_tensor(value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    def quietly(self, fn: Callable, *args: Any) -> Any:
        """Run our own code with torch: no capture, no graph."""
        with _Guard(self):
            return fn(*args)

    def guard(self) -> "_Guard":
        return _Guard(self)

    # ------------------------------------------------------------------ install / uninstall
    def install(self, session: Any, model: Any) -> None:
        self.session = session
        self.busy = 0
        self.paused = False
        self.installed = True
        modules = self._named_modules(model)
        cfg = session.config
        with _Guard(self):
            if modules:
                session.set_module_tree([(path, type(m).__name__, path.rpartition(".")[0],
                                          raw_settings(self.framework, type(m).__name__, m))
                                         for path, m in modules])
                self._inventory(modules)
        for path, module in modules:
            self._hook_module(path, module)
        self._param_names = {id(p): name for name, p in self._named_tensors(modules, "param")}
        self._optimizers_noted = set()
        for full, param in self._named_tensors(modules, "param"):
            if param.requires_grad:
                self._handles.append(param.register_hook(self._param_grad_hook(full)))
                self._handles.append(param.register_post_accumulate_grad_hook(
                    self._safe(self._grad_holder(full), f"gradient of {full}")))
        from torch.optim import optimizer as opt
        self._handles.append(opt.register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(opt.register_optimizer_step_post_hook(self._optimizer_post))
        self._handles.extend(watch_training_state(self))
        if cfg.keeps_apis or cfg.keeps_modules:
            self._mode = CaptureMode(self._on_api_call, lambda: self.busy > 0 or self.paused)
            self._mode.__enter__()

    def uninstall(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:   # noqa: BLE001 - a mode pushed under ours; still drop it
                if self.session is not None:
                    self.session.hook_failed(exc, "removing the torch function mode")
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._module_calls.clear()
        self.installed = False

    @staticmethod
    def _named_modules(model: Any) -> List[Tuple[str, torch.nn.Module]]:
        if model is None:
            return []
        if isinstance(model, torch.nn.Module):
            return list(model.named_modules())
        if isinstance(model, (list, tuple)):
            out: List[Tuple[str, torch.nn.Module]] = []
            for i, m in enumerate(model):
                if not isinstance(m, torch.nn.Module):
                    raise PrecdbgError(f"start(model): item {i} is {type(m).__name__}, "
                                       "not a torch.nn.Module")
                out.extend((f"{i}.{p}" if p else str(i), sub) for p, sub in m.named_modules())
            return out
        raise PrecdbgError(f"start(model): expected a torch.nn.Module or a list of them, got "
                           f"{type(model).__name__}")

    # ------------------------------------------------------------------ guarded hook plumbing
    def _safe(self, fn: Callable, where: str) -> Callable:
        def guarded(*args: Any) -> None:
            if not self.installed:
                return None
            try:
                with _Guard(self):
                    fn(*args)
                    self.session.end_call()
            except Exception as exc:  # noqa: BLE001 - never raise into training
                self.session.hook_failed(exc, where)
            return None
        return guarded

    def _grad_sink(self, call: Any) -> Callable[[str, int, str, torch.Tensor], None]:
        session = self.session

        def on_grad(role: str, index: int, key: str, grad: torch.Tensor) -> None:
            session.capture(call, "backward", role, index, key, grad)
        return on_grad

    def _watch(self, call: Any, targets: list, outputs: list, limit: int) -> None:
        """Hook the backward of a call whose forward ran with gradients enabled."""
        if not self.session.filter.keeps_backward:
            return
        outs = [o for o in outputs if o[2].requires_grad]
        if outs:
            watch_backward(targets, outs, self._grad_sink(call), self._handles.append, limit,
                           lambda hook: self._safe(hook, f"backward hook of {call.backward_entry}"))

    # ------------------------------------------------------------------ API calls
    def _on_api_call(self, func: Any, ident: Tuple[str, str], args: tuple, kwargs: dict) -> Any:
        session = self.session
        call = inputs = targets = None
        grad_on = torch.is_grad_enabled()
        try:
            with _Guard(self):
                call = session.begin_api(*ident)
                if call is not None:
                    inputs = tensor_args(args, kwargs)
                    for index, key, t in inputs:
                        session.capture(call, "forward", "input", index, key, t)
                    for index, (key, value) in enumerate(scalar_args(args, kwargs), len(inputs)):
                        session.capture_value(call, index, key, value)
                    targets = input_targets(inputs) if grad_on else []
        except Exception as exc:  # noqa: BLE001
            session.hook_failed(exc, f"capturing inputs of {ident[0]}.{ident[1]}")
            call = None
        result = func(*args, **kwargs)
        if call is None:
            return result
        try:
            outputs = tensor_outputs(result)
            with _Guard(self):
                for index, key, t in outputs:
                    session.capture(call, "forward", "output", index, key, t)
                if not outputs and writes_arguments(call.api, call.op):
                    # what it wrote are its outputs (collectives and AMP's unscale count no
                    # new version: their statistics are taken afresh)
                    for index, key, t in inputs:
                        session.capture(call, "forward", "output", index, key, t, written=True)
                if grad_on:
                    self._watch(call, targets, outputs, _API_NODE_LIMIT)
                session.end_call()
        except Exception as exc:  # noqa: BLE001
            session.hook_failed(exc, f"capturing outputs of {call.forward_entry}")
        return result

    # ------------------------------------------------------------------ modules
    def _hook_module(self, path: str, module: torch.nn.Module) -> None:
        cls = type(module).__name__
        key = id(module)

        def pre(mod: Any, args: tuple, kwargs: dict) -> None:
            session = self.session
            if not self.installed:
                return None
            grad_on = torch.is_grad_enabled()
            try:
                with _Guard(self):
                    call, subtree = session.begin_module("Module", path, cls)
                    session.enter_module(path, subtree)
                    targets: Optional[list] = None
                    if call is not None:
                        inputs = tensor_args(args, kwargs)
                        for index, k, t in inputs:
                            session.capture(call, "forward", "input", index, k, t)
                        if grad_on:
                            targets = input_targets(inputs)   # None: no grad, no backward
                    self._module_calls.setdefault(key, []).append((call, targets))
            except Exception as exc:  # noqa: BLE001
                session.hook_failed(exc, f"forward pre-hook of {path or cls}")
            return None

        def post(mod: Any, args: tuple, kwargs: dict, output: Any) -> None:
            session = self.session
            if not self.installed:
                return None
            stack = self._module_calls.get(key)
            if not stack:
                return None
            call, targets = stack.pop()
            try:
                if call is not None:
                    outputs = tensor_outputs(output)
                    with _Guard(self):
                        for index, k, t in outputs:
                            session.capture(call, "forward", "output", index, k, t)
                        if targets is not None:
                            self._watch(call, targets, outputs, _MODULE_NODE_LIMIT)
                        session.end_call()
            except Exception as exc:  # noqa: BLE001
                session.hook_failed(exc, f"forward hook of {path or cls}")
            finally:
                session.exit_module()
            return None

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(module.register_forward_hook(post, with_kwargs=True,
                                                          always_call=True))

    # ------------------------------------------------------------------ parameters
    @staticmethod
    def _named_tensors(modules: List[Tuple[str, torch.nn.Module]], kind: str
                       ) -> List[Tuple[str, torch.Tensor]]:
        """(full name, tensor) of every parameter or buffer, a shared (tied) one once under its
        first name, as `named_parameters()` does."""
        seen, out = set(), []
        for path, module in modules:
            items = module.named_parameters(recurse=False) if kind == "param" \
                else module.named_buffers(recurse=False)
            for name, value in items:
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                out.append((f"{path}.{name}" if path else name, value))
        return out

    def _inventory(self, modules: List[Tuple[str, torch.nn.Module]]) -> None:
        session = self.session
        for kind in ("param", "buffer"):
            for full, value in self._named_tensors(modules, kind):
                call = session.param_call(full, RecordKind.PARAM.value, role=kind)
                if call is None:
                    continue
                session.capture(call, "none", kind, 0, full.rpartition(".")[2], value,
                                trainable=bool(kind == "param" and value.requires_grad))
                session.end_call()

    def _param_grad_hook(self, path: str) -> Callable:
        def record(grad: torch.Tensor) -> None:
            call = self.session.param_call(path)
            if call is not None:
                self.session.capture(call, "backward", "param_grad", 0, "", grad)
        safe = self._safe(record, f"gradient hook of {path}")

        def hook(grad: torch.Tensor) -> None:
            safe(grad)
            return None
        return hook

    def _grad_holder(self, path: str) -> Callable:
        """After the gradient is accumulated: what holds it (`.grad`, Megatron's `main_grad`)
        was produced by this parameter's dw record."""
        def linked(param: torch.Tensor) -> None:
            for holder in (param.grad, getattr(param, "main_grad", None)):
                if isinstance(holder, torch.Tensor):
                    self.session.grad_produced(path, holder)
        return linked

    # ------------------------------------------------------------------ optimizer phase
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.session is not None:
            try:
                self._note_optimizer(optimizer)
            except Exception as exc:  # noqa: BLE001
                self.session.hook_failed(exc, "recording the optimizer")
            self.session.phase = Phase.OPTIMIZER.value
            self.paused = not self.session.config.include_optimizer
        return None

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.session is not None:
            self.session.phase = Phase.FORWARD.value
        self.paused = False
        return None
