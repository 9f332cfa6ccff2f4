"""Patches of torch.nn classes for the captured window (core ClassPatches, put back at stop()).

Copies: `copy.deepcopy(model)` (an EMA or best-model snapshot) and `torch.save(model)` inside a
captured step go through `nn.Module.__getstate__`, whose state holds the module's forward hook
dicts, precdbg's hooks among them (bound to objects that reach the whole session: no copy or
pickle of them can work). The patched `__getstate__` leaves precdbg's hooks out of the state, so
the copy or the saved model holds the user's hooks only, and nothing of precdbg after stop().

Fast paths: `nn.MultiheadAttention`, `nn.TransformerEncoderLayer` and `nn.TransformerEncoder`
run a fused native kernel in eval mode (no grad), but not when
`torch.overrides.has_torch_function` answers True for their arguments, as it does for every
tensor while a torch-function mode (the API capture) is on the stack: captured, they would take
their slow path, whose numbers differ (padding positions of a `src_key_padding_mask` above all).
When such a module may take its fast path, its forward runs unobserved (`adapter.unobserved()`:
the capture mode off the stack), so it computes what it computes without precdbg; its module
record is kept, the API calls inside it are not captured (said once per class and debugger).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Set

import torch

from precdbg.capture import ClassPatch

__all__ = ["hookless_copies", "fast_path_patches"]

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")
# per hook id: registered with kwargs / always called (ids of hooks left out go too)
_HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called")


def hookless_copies(is_ours: Callable[[Any], bool]) -> ClassPatch:
    """`nn.Module.__getstate__` without the hooks `is_ours` recognises."""
    return ClassPatch(torch.nn.Module, "__getstate__",
                      lambda original: _state_without(original, is_ours))


def _state_without(original: Callable[[Any], dict], is_ours: Callable[[Any], bool]
                   ) -> Callable[[Any], dict]:
    @functools.wraps(original)
    def __getstate__(self: Any) -> dict:
        state = original(self)          # a copy of the module's __dict__ (its dicts shared)
        left_out: Set[int] = set()
        for name in _HOOK_DICTS:
            hooks = state.get(name)
            if not hooks:
                continue
            ours = {key for key, hook in hooks.items() if is_ours(hook)}
            if ours:
                state[name] = type(hooks)((k, h) for k, h in hooks.items() if k not in ours)
                left_out |= ours
        if left_out:
            for name in _HOOK_FLAGS:
                flags = state.get(name)
                if flags and not left_out.isdisjoint(flags):
                    state[name] = type(flags)((k, v) for k, v in flags.items()
                                              if k not in left_out)
        return state
    return __getstate__


_FAST_PATH_CLASSES = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer,
                      torch.nn.TransformerEncoder)


def fast_path_patches(adapter: Any) -> List[ClassPatch]:
    """The forwards of the modules with a fused eval fast path, run unobserved when it may be
    taken (installed only while API calls are captured)."""
    return [ClassPatch(cls, "forward", lambda original: _fast_path_forward(adapter, original))
            for cls in _FAST_PATH_CLASSES]


def _may_take_fast_path(module: torch.nn.Module) -> bool:
    """What every fast path asks first: eval mode, the fast path switched on, and no gradient
    to compute (the rest of torch's conditions only matter if these hold: a module for which
    they hold and torch still takes the slow path is left uncaptured, nothing worse)."""
    if module.training:
        return False
    enabled = getattr(getattr(torch.backends, "mha", None), "get_fastpath_enabled", None)
    if enabled is not None and not enabled():
        return False
    return not (torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()))


def _fast_path_forward(adapter: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not adapter.installed or adapter.paused or not _may_take_fast_path(self):
            return original(self, *args, **kwargs)
        name = type(self).__name__
        adapter.recorder.say_once(("fast path", name), "precdbg: %s runs PyTorch's fused fast "
                                  "path in eval mode, which capturing its API calls would turn "
                                  "off (its numbers would change): the calls inside it are not "
                                  "captured", name)
        with adapter.unobserved():
            return original(self, *args, **kwargs)
    return forward
