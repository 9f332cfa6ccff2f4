"""torch.compile in a captured step: the compiled code runs eagerly while precdbg captures.

Compiled code (TorchDynamo) calls no Python hooks and no torch-function mode, and Dynamo
cannot trace precdbg's mode at all: a compiled model called inside a captured step fails with
an internal Dynamo error. So while a step is captured the compiler's stance is `force_eager`
(`torch.compiler.set_stance`): every compiled function and module runs as plain PyTorch and
every API and module call is captured; the compiled code and its caches stay as they are and
run again after `stop()`. A compiled model is named as the model it wraps (no `_orig_mod.`
in module paths: precdbg_pt.wrappers), so its dump aligns with an uncompiled run and with
MindSpore.

Nothing here imports TorchDynamo itself: where it has not been imported, nothing can have been
compiled and there is nothing to change.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, List, Optional

import torch

from . import wrappers

__all__ = ["EagerStance", "eager_stance", "compiled_paths", "note_compiled"]

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
