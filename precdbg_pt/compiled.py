"""torch.compile in a captured step: the compiled code runs eagerly while precdbg captures.

Compiled code (TorchDynamo) calls no Python hooks and no torch-function mode, and Dynamo
cannot trace precdbg's mode at all: a compiled model called inside a captured step fails with
an internal Dynamo error. So while a step is captured the compiler's stance is `force_eager`
(`torch.compiler.set_stance`): every compiled function and module runs as plain PyTorch and
every API and module call is captured; the compiled code and its caches stay as they are and
run again after `stop()`. A compiled model is named as the model it wraps (no `_orig_mod.`
in module paths), so its dump aligns with an uncompiled run and with MindSpore.

Nothing here imports TorchDynamo itself: where it has not been imported, nothing can have been
compiled and there is nothing to change.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Iterator, List, Optional, Tuple

import torch

__all__ = ["EagerStance", "eager_stance", "named_submodules", "compiled_paths", "note_compiled"]

log = logging.getLogger("precdbg")
_WRAPPED = "_orig_mod"       # torch._dynamo.eval_frame.OptimizedModule's wrapped module


def _optimized_module_type() -> Optional[type]:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None) if eval_frame is not None else None


def _unwrap(module: torch.nn.Module, optimized: Optional[type]) -> Tuple[torch.nn.Module, bool]:
    """(the module a compile wrapper wraps, or the module itself; whether it is compiled)."""
    compiled = bool(getattr(module, "_compiled_call_impl", None))     # nn.Module.compile()
    while optimized is not None and isinstance(module, optimized):
        inner = getattr(module, _WRAPPED, None)
        if not isinstance(inner, torch.nn.Module):
            break
        module, compiled = inner, True
    return module, compiled or bool(getattr(module, "_compiled_call_impl", None))


def _walk(module: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module, bool]]:
    """(path, module, compiled) of `module` and everything below it, in `named_modules()`
    order, every `torch.compile` wrapper (OptimizedModule) replaced by the module it wraps
    under the wrapper's own path; shared modules once."""
    optimized = _optimized_module_type()
    seen = set()
    top, compiled = _unwrap(module, optimized)
    stack: List[Tuple[str, torch.nn.Module, bool]] = [("", top, compiled)]
    while stack:
        path, current, compiled = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield path, current, compiled
        children = []
        for name, child in current._modules.items():
            if child is not None:
                inner, child_compiled = _unwrap(child, optimized)
                children.append((f"{path}.{name}" if path else name, inner, child_compiled))
        stack.extend(reversed(children))


def named_submodules(module: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """`module.named_modules()` (the model's own, should it override it); where that holds a
    compile wrapper, the walk of `_walk` instead, wrappers replaced by what they wrap."""
    entries = list(module.named_modules())
    optimized = _optimized_module_type()
    if optimized is None or not any(isinstance(sub, optimized) for _, sub in entries):
        return entries
    return [(path, sub) for path, sub, _ in _walk(module)]


def compiled_paths(model: Any) -> List[str]:
    """Paths of the compiled modules of `model` (a `torch.compile` wrapper, or
    `nn.Module.compile()` in place), "" for the model itself; `model` as `start(model)` takes
    it (a module or a list/tuple of them, whose paths start with `"{i}."`)."""
    if _optimized_module_type() is None:
        return []
    if isinstance(model, torch.nn.Module):
        return [path for path, _, compiled in _walk(model) if compiled]
    found: List[str] = []
    if isinstance(model, (list, tuple)):
        for i, item in enumerate(model):
            found.extend(f"{i}.{path}" if path else str(i) for path in compiled_paths(item))
    return found


_warned = False


def note_compiled(session: Any, paths: List[str]) -> None:
    """Say once per process, and in the run manifest, that compiled modules ran eagerly."""
    global _warned
    if not paths:
        return
    session.note_manifest("compiled", {"framework": "torch.compile", "modules": paths,
                                       "captured_steps_run": "eager"})
    if not _warned:
        _warned = True
        what = ("the model is" if paths == [""] else
                "modules " + ", ".join(repr(p or "(the model)") for p in paths[:3])
                + (" ..." if len(paths) > 3 else "") + " are")
        log.warning("precdbg: %s compiled with torch.compile; captured steps run compiled code "
                    "eagerly (torch.compiler.set_stance('force_eager')) so that every API and "
                    "module call is seen, the other steps run it compiled", what)


class EagerStance:
    """The compiler's stance set to `force_eager` as a handle: `remove()` puts back the stance
    that was current before (once)."""
    __slots__ = ("_setting",)

    def __init__(self, setting: Any) -> None:
        self._setting = setting

    def remove(self) -> None:
        setting, self._setting = self._setting, None
        if setting is not None:
            setting.__exit__(None, None, None)


def eager_stance() -> Optional[EagerStance]:
    """Make compiled code run eagerly until the handle is removed; None when nothing can have
    been compiled (TorchDynamo not imported), this torch has no stances (before 2.6), or the
    caller itself runs inside compiled code."""
    if "torch._dynamo" not in sys.modules:
        return None
    compiler = getattr(torch, "compiler", None)
    set_stance = getattr(compiler, "set_stance", None)
    if set_stance is None:
        return None
    try:
        return EagerStance(set_stance("force_eager"))
    except RuntimeError as exc:         # "attempted to set_stance in a torch.compile region"
        log.debug("precdbg: compiler stance left as it is (%s)", exc)
        return None
