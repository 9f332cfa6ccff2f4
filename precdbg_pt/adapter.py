"""The PyTorch adapter: installs every hook on `start`, removes every hook on `stop`, and turns
torch objects into calls to the core session. No rule lives here (naming, filtering and layout are
the core's). Its state is the handles it must remove and the objects it owns, one set per
debugger: `tensors` (a `TorchTensors`: the tensor questions the core asks, with the device
statistics' buffers and queues), `replays` (activation checkpoints' replays) and the recompute
detector.
"""
from __future__ import annotations

import contextlib
import os
import platform
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

import precdbg
from precdbg.capture import BaseInstrumentor, NamedTensor, Recorder
from precdbg.records import Direction, Role, in_place, writes_arguments

from . import compiled, module_patches, plumbing, wrappers
from .api import CaptureMode, ModeHandle, call_args, tensor_outputs
from .graph import input_targets, watch_backward
from .hooks import GradHolderHook, Guard, ModuleHooks, ParamGradHook, is_module_hook
from .recompute import (ENGINE, REPLAY, CheckpointReplays, RecomputeDetector,
                        checkpoint_patches)
from .tensors import TorchTensors
from .training_state import watch_training_state

_FORWARD = Direction.FORWARD
_INPUT = Role.INPUT
_OUTPUT = Role.OUTPUT
_PARAM = Role.PARAM
_BUFFER = Role.BUFFER

__all__ = ["TorchAdapter"]

_API_NODE_LIMIT = 512          # nodes one API call may create (composite ops stay far below)
_INTERNAL_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, precdbg)) + (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,)

_is_grad_enabled = torch._C.is_grad_enabled
_UNINITIALIZED = torch.nn.parameter.UninitializedTensorMixin
_NAMED_PARAMETERS = torch.nn.Module.named_parameters
_NAMED_BUFFERS = torch.nn.Module.named_buffers


class TorchAdapter(BaseInstrumentor):
    """Owner of every hook, mode and handle precdbg puts into torch."""
    framework = "pytorch"
    module_type = torch.nn.Module
    module_type_name = "torch.nn.Module"
    Guard = Guard    # what the base's GuardedHook enters
    empty_capture_hint = ("was the training step run between start() and stop()? (code compiled "
                          "with torch.jit runs no Python hooks)")
    internal_dirs = _INTERNAL_DIRS

    def __init__(self) -> None:
        super().__init__()
        self.tensors = TorchTensors()      # the core's TensorOps: this adapter's own
        self.replays = CheckpointReplays(self)
        self._mode: Optional[ModeHandle] = None
        self._compiled: List[str] = []
        self._scripted: List[str] = []     # TorchScript modules left unhooked (outermost)
        self._recompute = RecomputeDetector(self._replay_begins)

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

    @staticmethod
    def is_tensor(value: Any) -> bool:
        return isinstance(value, torch.Tensor)

    # ------------------------------------------------------------------ what the base asks
    def named_submodules(self, module: torch.nn.Module) -> Iterable[Tuple[str, Any]]:
        return wrappers.named_submodules(module)    # named through compile and DDP wrappers

    def class_name(self, module: torch.nn.Module) -> str:
        return plumbing.model_class(module).__name__

    def walk(self, model: Any) -> List[Tuple[str, Any]]:
        modules = super().walk(model)
        self._compiled = compiled.compiled_paths(model)
        return modules

    def own_parameters(self, module: torch.nn.Module) -> Iterable[Tuple[str, Any]]:
        # the module's own dict where `named_parameters` is torch's (what it reads, without
        # its generator layers: asked per module at every start); an override is asked
        if type(module).named_parameters is _NAMED_PARAMETERS:
            return self._initialized(module._parameters.items())
        return self._initialized(module.named_parameters(recurse=False))

    def own_buffers(self, module: torch.nn.Module) -> Iterable[Tuple[str, Any]]:
        if type(module).named_buffers is _NAMED_BUFFERS:
            return self._initialized(module._buffers.items())
        return self._initialized(module.named_buffers(recurse=False))

    def _initialized(self, named: Iterable[Tuple[str, Any]]) -> Iterable[Tuple[str, Any]]:
        """A module's parameters or buffers without the uninitialized ones of a lazy module
        (`nn.LazyLinear` before its first forward: no shape, no values), said once."""
        named = list(named)
        if not any(isinstance(value, _UNINITIALIZED) for _, value in named):
            return named
        if self.recorder is not None:
            self.recorder.say_once("lazy parameters", "precdbg: a lazy module's parameters are "
                                   "not initialized yet at start(model): they are left out of "
                                   "this step's parameter inventory and weight gradients (the "
                                   "API calls that read them still record them)")
        return [(name, value) for name, value in named
                if not isinstance(value, _UNINITIALIZED)]

    def inventory_role(self, leaf: str, value: Any, is_param: bool) -> Tuple[str, bool]:
        return (_PARAM, bool(value.requires_grad)) if is_param else (_BUFFER, False)

    def gradient_hooks(self, path: str, param: torch.Tensor) -> Iterable[Any]:
        return (param.register_hook(ParamGradHook(self, path, param)),
                param.register_post_accumulate_grad_hook(GradHolderHook(self, path)))

    def _instrument(self, session: Recorder, params: List[NamedTensor]) -> None:
        # compiled code runs no hooks and cannot trace the capture mode: eager while captured
        if compiled.eager_while_captured(self):
            compiled.note_compiled(session, self._compiled)
        compiled.note_scripted(session, self._scripted)
        from torch.optim import optimizer as opt
        self.hold(opt.register_optimizer_step_pre_hook(self.optimizer_step_pre))
        self.hold(opt.register_optimizer_step_post_hook(self.optimizer_step_post))
        for patch in (watch_training_state(self) + plumbing.plumbing_patches(self)
                      + checkpoint_patches(self.replays)):
            self.hold(patch)
        self.hold(module_patches.hookless_copies(is_module_hook))
        cfg = session.config
        # API calls are dumped: every torch call goes through the mode (at level module
        # nothing an API call records is kept, so the mode is not entered at all)
        if cfg.keeps_apis:
            for patch in module_patches.fast_path_patches(self):
                self.hold(patch)
            self._mode = ModeHandle(CaptureMode(self._on_api_call, self,
                                                self.replays.engine_returned))
            self.hold(self._mode)

    def _uninstrument(self) -> None:
        self._mode = None
        self._scripted = []
        self.replays.forget()
        self._recompute.forget()

    def _replay_begins(self, replayed: List[Any], forward_owner: Optional[str]) -> None:
        if self.recorder is not None:
            self.recorder.replay_begins(self.module_path(replayed) or forward_owner)

    # ------------------------------------------------------------------ backward
    def watch(self, call: Any, targets: list, outputs: list, limit: int) -> None:
        """Hook the backward of a call whose forward ran with gradients enabled (called only
        when the backward is captured)."""
        outs = [o for o in outputs if o[2].requires_grad]
        if outs:
            watch_backward(self, call, targets, outs, limit)

    # ------------------------------------------------------------------ API calls
    def _on_api_call(self, func: Any, ident: Tuple[str, str], args: tuple, kwargs: dict) -> Any:
        session = self.recorder
        call = inputs = targets = None
        # the graph is read only when the backward is captured (no walk, no closures otherwise)
        grad_on = _is_grad_enabled() and session.filter.keeps_backward
        where = self._recompute.where()
        if where == ENGINE:          # backward's own code (a custom Function's, a hook's)
            return func(*args, **kwargs)
        replay = where == REPLAY     # activation recompute: its backward only
        try:
            with Guard(self):
                grad_on, replayable = self.replays.forward_watch(grad_on)
                call = session.begin_api(ident[0], ident[1], grad_on, replay, replayable)
                if call is not None:
                    inputs, values = call_args(args, kwargs)
                    if not replay:
                        for index, key, t in inputs:
                            session.capture(call, _FORWARD, _INPUT, index, key, t)
                        for index, (key, value) in enumerate(values, len(inputs)):
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
            with Guard(self):
                if replay:                             # its forward is recorded already
                    outputs = [o for o in outputs if o[2].requires_grad]
                    if grad_on and outputs:
                        watch_backward(self, call, targets, outputs, _API_NODE_LIMIT)
                    session.end_call()
                    return result
                if args and in_place(call.api):        # also every other object over it
                    first = args[0]                    # a tensor, or _foreach_*_'s list
                    for t in first if isinstance(first, (list, tuple)) else (first,):
                        if self.is_tensor(t):
                            session.wrote(t)
                elif "out" in kwargs and self.is_tensor(kwargs["out"]):
                    session.wrote(kwargs["out"])
                for index, key, t in outputs:
                    session.capture(call, _FORWARD, _OUTPUT, index, key, t)
                if not outputs and writes_arguments(call.api, call.op):
                    # what it wrote are its outputs (collectives and AMP's unscale count no
                    # new version: their statistics are taken afresh)
                    for index, key, t in inputs:
                        session.capture(call, _FORWARD, _OUTPUT, index, key, t, written=True)
                if grad_on:
                    self.watch(call, targets, outputs, _API_NODE_LIMIT)
                session.end_call()
        except Exception as exc:  # noqa: BLE001
            session.hook_failed(exc, f"capturing outputs of {call.forward_entry}")
        return result

    # ------------------------------------------------------------------ modules
    def hook_module(self, path: str, module: torch.nn.Module) -> None:
        if isinstance(module, torch.jit.ScriptModule):     # refuses Python hooks (said once)
            if not any(path.startswith(p + ".") or not p for p in self._scripted):
                self._scripted.append(path)
            return
        hooks = ModuleHooks(self, path, self.class_name(module))
        self.hold(module.register_forward_pre_hook(hooks.open, with_kwargs=True, prepend=True))
        self.hold(module.register_forward_pre_hook(hooks.pre, with_kwargs=True))
        self.hold(module.register_forward_hook(hooks.post, with_kwargs=True, always_call=True))

    def record_gradient(self, param: torch.Tensor) -> None:
        """A parameter's gradient handed over outside autograd's hooks (FSDP2 assigns the
        reduce-scattered `.grad` itself): recorded as its dw, and `.grad` as what holds it."""
        path = self.param_path(param)
        if path is not None and param.requires_grad and param.grad is not None:
            ParamGradHook(self, path)(param.grad)
            GradHolderHook(self, path)(param)

    @contextlib.contextmanager
    def unobserved(self) -> Iterator[None]:
        """Framework plumbing runs inside (precdbg_pt.plumbing): paused, as a skipped optimizer
        is, so nothing it calls is captured or passes through the capture mode."""
        was, self.paused = self.paused, True
        self.pause_changed()
        try:
            yield
        finally:
            self.paused = was
            self.pause_changed()

    def pause_changed(self) -> None:
        """The capture mode off torch's stack while paused, back on once not."""
        if self._mode is not None:
            if self.paused:
                self._mode.suspend()
            else:
                self._mode.resume()

