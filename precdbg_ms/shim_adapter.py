"""The MindSpore adapter in torch-shim mode: PyTorch code running on MindSpore through a shim
(mindnlp's `mindtorch`, MSAdapter; precdbg_ms.torch_shim finds it). Framework `mindtorch`.

What differs from native Cells is only where things are found; how they are recorded is the
MindSpore adapter's (its tensors, HookBackward, parameter hooks, deferred statistics):

- modules are the shim's `torch.nn.Module`s, walked and named as PyTorch names them
  (`named_modules()`: `transformer.h.1.mlp.c_proj`), hooked through the shim's own
  `register_forward_pre_hook` / `register_forward_hook` (PyTorch's API, which the shim copies);
  a native Cell given to `start` alongside is hooked as a Cell;
- API calls are the shim's `torch.*`, `torch.nn.functional.*` and Tensor methods, under
  PyTorch's names (`ShimRegistry`); the MindSpore ops they run are inside those calls;
- the optimizer phase is the shim's `torch.optim` step, through its global step hooks, as
  PyTorch's is; MindSpore's own optimizers still are too;
- tensors handed back to the model (through HookBackward) carry the attributes the shim keeps
  on its tensors (`_device`, ...), so the model's `x.device` reads what it read before.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from mindspore import nn

from precdbg.capture import Recorder
from precdbg.records import Role

from .adapter import MindSporeAdapter
from .call_arguments import shim_takes_grad
from .pynative import tensor_view
from .torch_shim import ShimRegistry, shim_versions

__all__ = ["ShimAdapter"]

# what a shim module must offer for its calls to be seen (PyTorch's hook API)
_NEEDED = ("register_forward_pre_hook", "register_forward_hook")


def _step_hook_registrars(torch: Any) -> Optional[Tuple[Callable, Callable]]:
    """The shim's `register_optimizer_step_pre_hook` / `_post_hook`, or None."""
    module = getattr(getattr(torch, "optim", None), "optimizer", None)
    pre = getattr(module, "register_optimizer_step_pre_hook", None)
    post = getattr(module, "register_optimizer_step_post_hook", None)
    return (pre, post) if callable(pre) and callable(post) else None


class ShimAdapter(MindSporeAdapter):
    """`MindSporeAdapter` for a process whose `torch` is a shim over MindSpore."""
    framework = "mindtorch"
    empty_capture_hint = ("code compiled with @jit (or run in GRAPH_MODE) does not run hooks: "
                          "dump the step in PyNative mode without @jit")

    def __init__(self, torch: Any) -> None:
        super().__init__()
        self.torch = torch
        self.shim_module = torch.nn.Module
        self.module_type = (nn.Cell, torch.nn.Module)          # type: ignore[assignment]
        self.module_type_name = f"{torch.__name__}.nn.Module (a torch shim's) or mindspore.nn.Cell"
        self._registry = ShimRegistry(torch)
        self._versions = shim_versions(torch)
        self._step_hooks = _step_hook_registrars(torch)
        self.takes_grad = shim_takes_grad
        self._view = tensor_view          # MindSpore's view, not the shim's Tensor.view

    # ------------------------------------------------------------------ environment
    def environment(self) -> Dict[str, Any]:
        return {**super().environment(), "shim": self._versions["shim"],
                "shim_version": self._versions["shim_version"],
                "torch_api": self._versions["torch_api"]}

    def manifest(self) -> Dict[str, Any]:
        out = super().manifest()
        out["versions"] = {**out["versions"], self._versions["shim"]:
                           self._versions["shim_version"],
                           "torch_api": self._versions["torch_api"]}
        return out

    # ------------------------------------------------------------------ the model
    def named_submodules(self, module: Any) -> Iterable[Tuple[str, Any]]:
        if isinstance(module, nn.Cell):
            return super().named_submodules(module)
        named = getattr(module, "named_modules", None)
        return named() if callable(named) else [("", module)]

    def own_parameters(self, module: Any) -> Iterable[Tuple[str, Any]]:
        if isinstance(module, nn.Cell):
            return super().own_parameters(module)
        named = getattr(module, "named_parameters", None)
        return named(recurse=False) if callable(named) else ()

    def hook_module(self, path: str, module: Any) -> None:
        """A shim module through the shim's own PyTorch-style hooks; where the shim lacks one
        of them, its modules are left unhooked (said once, naming it): training runs as
        without precdbg, API calls and parameter gradients are still captured."""
        if not isinstance(module, nn.Cell):
            missing = next((name for name in _NEEDED
                            if not callable(getattr(module, name, None))), None)
            if missing is not None:
                self.recorder.say_once(("shim lacks", missing),
                                       "precdbg: this torch shim's nn.Module has no %s, which "
                                       "precdbg needs to see a module's calls: its modules are "
                                       "not hooked (API calls and weight gradients are still "
                                       "captured)", missing)
                return
        super().hook_module(path, module)

    def own_buffers(self, module: Any) -> Iterable[Tuple[str, Any]]:
        if isinstance(module, nn.Cell):
            return ()
        named = getattr(module, "named_buffers", None)
        return named(recurse=False) if callable(named) else ()

    def inventory_role(self, leaf: str, value: Any, is_param: bool) -> Tuple[str, bool]:
        if not is_param:            # a shim module's buffer, as PyTorch's
            return Role.BUFFER, False
        return super().inventory_role(leaf, value, is_param)

    # ------------------------------------------------------------------ what is installed
    def _instrument(self, session: Recorder, params: list) -> None:
        super()._instrument(session, params)       # the registry is the shim's (ShimRegistry)
        if self._step_hooks is not None:
            register_pre, register_post = self._step_hooks
            self.hold(register_pre(self._shim_step_pre))
            self.hold(register_post(self._shim_step_post))

    def _shim_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if not self.installed:
            return None
        self.settle_statistics()          # it updates the parameters in place
        return self.optimizer_step_pre(optimizer, args, kwargs)

    def _shim_step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_step_post(optimizer, args, kwargs)
        if self.installed:
            for group in getattr(optimizer, "param_groups", ()):
                for param in group.get("params", ()):
                    self._note_write(param)
        return None

