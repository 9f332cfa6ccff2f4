"""torch.compile in a captured step: the compiled code runs eagerly while precdbg captures.

Compiled code (TorchDynamo) calls no Python hooks and no torch-function mode, and Dynamo
cannot trace precdbg's mode at all: a compiled model called inside a captured step fails with
an internal Dynamo error. So while a step is captured the compiler's stance is `force_eager`
(`torch.compiler.set_stance`): every compiled function and module runs as plain PyTorch and
every API and module call is captured; the compiled code and its caches stay as they are and
run again after `stop()`. A compiled model is named as the model it wraps (no `_orig_mod.`
in module paths: precdbg_pt.wrappers), so its dump aligns with an uncompiled run and with
MindSpore.

Nothing here imports TorchDynamo itself: where it has not been imported when capture starts,
nothing has been compiled yet, and `torch.compile` is patched for the captured step instead, so
that code compiled inside it (a loss or attention function compiled on its first use) also runs
eagerly: the stance is set as soon as TorchDynamo is there.
"""
from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, List, Optional

import torch

from precdbg.capture import ClassPatch

from . import wrappers

__all__ = ["EagerStance", "eager_stance", "eager_while_captured", "compiled_paths",
           "note_compiled", "note_scripted"]

log = logging.getLogger("precdbg")


def compiled_paths(model: Any) -> List[str]:
    """Paths of the compiled modules of `model` (a `torch.compile` wrapper, or
    `nn.Module.compile()` in place), "" for the model itself; `model` as `start(model)` takes
    it (a module or a list/tuple of them, whose paths start with `"{i}."`)."""
    if "torch._dynamo.eval_frame" not in sys.modules:
        return []
    if isinstance(model, torch.nn.Module):
        return [path for path, _, compiled in wrappers.walk(model) if compiled]
    found: List[str] = []
    if isinstance(model, (list, tuple)):
        for i, item in enumerate(model):
            found.extend(f"{i}.{path}" if path else str(i) for path in compiled_paths(item))
    return found


def note_compiled(session: Any, paths: List[str]) -> None:
    """Say once per debugger, and in the run manifest, that compiled modules ran eagerly."""
    if not paths:
        return
    session.note_manifest("compiled", {"framework": "torch.compile", "modules": paths,
                                       "captured_steps_run": "eager"})
    session.say_once("torch.compile", "precdbg: %s compiled with torch.compile; captured steps "
                     "run compiled code eagerly (torch.compiler.set_stance('force_eager')) so "
                     "that every API and module call is seen, the other steps run it compiled; "
                     "random ops draw other numbers eagerly than compiled, so with dropout on, "
                     "the loss of a captured step and of the steps after it differs from a run "
                     "without precdbg (set dropout to 0 to compare losses)", _listed(paths))


def note_scripted(session: Any, paths: List[str]) -> None:
    """Say once per debugger, and in the run manifest, that TorchScript modules of the model
    (`torch.jit.script`/`trace`) were not hooked: TorchScript runs no Python hooks and no
    torch-function mode, so neither they nor the calls inside them are captured (what goes in
    and comes out is, as the arguments and results of the calls around them)."""
    if not paths:
        return
    session.note_manifest("unobserved", {"compiler": "torch.jit", "modules": paths})
    session.say_once("torch.jit", "precdbg: %s TorchScript (torch.jit): nothing inside %s is "
                     "captured, only the calls around %s", _listed(paths),
                     "it" if len(paths) == 1 else "them", "it" if len(paths) == 1 else "them")


def _listed(paths: List[str]) -> str:
    if paths == [""]:
        return "the model is"
    return ("module " if len(paths) == 1 else "modules ") + ", ".join(
        repr(p) if p else "(the model)" for p in paths[:3]) + (" ..." if len(paths) > 3 else "") + \
        (" is" if len(paths) == 1 else " are")


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


def eager_while_captured(adapter: Any) -> bool:
    """Make compiled code run eagerly until the adapter's handles are removed (stop()): the
    `force_eager` stance now, or, while TorchDynamo is not imported, a patch of `torch.compile`
    that sets the stance once something is compiled. True when the stance is set now
    (compiled code may already exist)."""
    stance = eager_stance()
    if stance is not None:
        adapter.hold(stance)
        return True
    if "torch._dynamo" not in sys.modules and callable(getattr(torch, "compile", None)):
        adapter.hold(ClassPatch(torch, "compile",
                                lambda original: _EagerAfterCompile(original, adapter)))
    return False


class _EagerAfterCompile:
    """`torch.compile` while a step is captured: compiles as asked, unobserved (TorchDynamo's
    import and set-up are the framework's, not the model's calls), then sets the `force_eager`
    stance (once), before anything compiled can run; `torch.compile(mode=...)` used as a
    decorator sets it when the decorator is applied."""

    def __init__(self, original: Callable[..., Any], adapter: Any) -> None:
        self.original, self.adapter, self.done = original, adapter, False
        functools.update_wrapper(self, original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.adapter.unobserved():
            result = self.original(*args, **kwargs)
        if not args and kwargs.get("model") is None and callable(result):
            decorate = result                    # torch.compile(**options) -> a decorator

            def decorator(fn: Any) -> Any:
                with self.adapter.unobserved():
                    compiled = decorate(fn)
                self._eager()
                return compiled
            return decorator
        self._eager()
        return result

    def _eager(self) -> None:
        if self.done:
            return
        stance = eager_stance()
        if stance is not None:
            self.done = True
            self.adapter.hold(stance)
            log.debug("precdbg: code compiled inside a captured step runs eagerly until stop()")
