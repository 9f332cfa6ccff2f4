"""Activation recompute: whether a torch call runs inside the replay of an earlier forward.

Activation checkpointing runs a block's forward twice: once in the forward pass (without keeping
its activations), and again during backward to rebuild them. Every module and API call of the
block runs again then, and precdbg would record them a second time, as if the model called them
twice: a run with recompute and one without (or a Megatron run against a MindSpeed one) would
differ in structure where nothing differs in value.

The replay is recognised where it runs: the autograd engine is executing a node on this thread
(`torch._C._current_autograd_node()`, None during forward: one C call per captured call), and
the Python frames above the call, up to the engine's entry, include a recompute function of a
checkpoint implementation:

- `recompute_fn` of torch.utils.checkpoint's non-reentrant checkpoint (called from the unpack
  hook of a saved tensor);
- `CheckpointFunction.backward` of its reentrant checkpoint, and the classes of that name in
  Megatron-LM (`megatron.core.tensor_parallel.random`) and DeepSpeed;
- `CheckpointWithoutOutput._recompute` (Megatron) and `checkpoint_function_backward`
  (MindSpeed's patch of Megatron's).

That is, a frame whose function is named `recompute_fn`, `_recompute`, `recompute`, `backward`
or `checkpoint_function_backward` and whose qualified name mentions a checkpoint. The answer is
kept for the node being executed, so the frames are read once per node, not once per call; the
recompute frame also says which module is replayed (`replayed_functions`). What a replayed
call records is the core's rule (`precdbg.replay`). Other torch calls
the engine runs (a custom Function's backward, a hook) are backward work, not forward calls: the
adapter lets them through unrecorded (ENGINE), however backward was entered.

Backward runs without the capture mode on torch's stack: a replay's calls are seen once the
mode is back. A replayed module's hook puts it back; for a checkpointed plain function (no
module in it) the checkpoint's replay entry does (`checkpoint_patches`), and the module its
forward was called in, noted on its ctx then, is the owner of what it replays (`forward_owner`).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional

import torch

from precdbg.instrumentor import ClassPatch

__all__ = ["RecomputeDetector", "FORWARD", "REPLAY", "ENGINE", "ENGINE_ENTRIES",
           "replayed_functions", "forward_owner", "note_owner", "checkpoint_patches",
           "in_checkpoint_forward"]

_current_node = getattr(torch._C, "_current_autograd_node", None)
_RECOMPUTE_FUNCTIONS = frozenset({"recompute_fn", "_recompute", "recompute", "backward",
                                  "checkpoint_function_backward"})
_ENGINE_ENTRY = "_engine_run_backward"       # torch.autograd.graph: where the engine is entered
# the Python entries to the engine that run under a torch-function mode's handler, so without the
# capture mode (a replay puts it back; the handler takes it off when they return)
ENGINE_ENTRIES = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


def _recompute_frame(frame: Any) -> Optional[Any]:
    """The frame of a checkpoint's recompute function above `frame`, up to the engine's entry;
    None when there is none."""
    while frame is not None:
        code = frame.f_code
        name = code.co_name
        # the qualified name (Python 3.11+), else the file (torch/utils/checkpoint.py)
        if name in _RECOMPUTE_FUNCTIONS and \
                "checkpoint" in (getattr(code, "co_qualname", None) or code.co_filename).lower():
            return frame
        if name == _ENGINE_ENTRY:
            return None
        frame = frame.f_back
    return None


def in_checkpoint_forward(frame: Any) -> bool:
    """Whether `frame` runs inside the forward of a reentrant activation checkpoint (a
    `forward` of a class whose qualified name mentions a checkpoint: torch's, Megatron's,
    MindSpeed's and DeepSpeed's `CheckpointFunction` and their output-discarding variants),
    whose calls, run without gradients, a replay re-runs in backward. A checkpoint none of
    whose inputs needs a gradient (`ctx.needs_input_grad`) has no backward: one run under
    no_grad (an evaluation forward), or nested in another's forward, whose replay then runs it
    again. Asked only for calls that run without gradients."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and "checkpoint" in (
                getattr(code, "co_qualname", None) or code.co_filename).lower():
            needs = getattr(frame.f_locals.get("ctx"), "needs_input_grad", None)
            if needs is None or any(needs):  # else an outer checkpoint may replay this one
                return True
        frame = frame.f_back
    return False


def replayed_functions(frame: Any) -> List[Any]:
    """What a recompute frame replays, outermost first: the checkpoint's function
    (`ctx.run_function` of a reentrant CheckpointFunction, Megatron's and MindSpeed's too;
    `self.run_function` of Megatron's CheckpointWithoutOutput; the `fn` torch's non-reentrant
    `recompute_fn` closes over) and what it wraps (a bound method's module, a partial's
    function). A module among them is the one whose forward is replayed."""
    local = frame.f_locals
    fn = None
    for holder in (local.get("ctx"), local.get("self")):
        fn = getattr(holder, "run_function", None)
        if fn is not None:
            break
    if fn is None:
        fn = local.get("fn")
    out: List[Any] = []
    while fn is not None and len(out) < 6 and not any(fn is seen for seen in out):
        out.append(fn)
        bound_to = getattr(fn, "__self__", None)
        fn = bound_to if bound_to is not None else getattr(fn, "func", None)
    return out


_OWNER_ATTR = "_precdbg_owner"      # on a checkpoint's ctx: the module its forward ran in


def forward_owner(frame: Any) -> Optional[str]:
    """The module whose forward called the checkpoint a recompute frame replays (noted on the
    checkpoint's ctx by `checkpoint_patches`; None when not noted)."""
    local = frame.f_locals
    ctx = local.get("ctx")
    if ctx is None:
        ctx = getattr(local.get("self"), "ctx", None)   # Megatron's CheckpointWithoutOutput
    return getattr(ctx, _OWNER_ATTR, None)


def note_owner(ctx: Any, module: str) -> None:
    """Keep on a checkpoint's ctx the module its forward runs in (see `forward_owner`)."""
    try:
        setattr(ctx, _OWNER_ATTR, module)
    except (AttributeError, TypeError):     # a ctx that takes no attributes: owner unknown
        pass


# Checkpoint implementations whose forward runs a function without gradients and whose replay
# runs it again inside backward: (module, class, forward, replay). The forward notes on its ctx
# the module it runs in; the replay puts the capture mode back on torch's stack, so the calls it
# re-runs are seen from its first, not from its first submodule's hook (a checkpointed plain
# function, as Megatron's and MindSpeed's activation-function recompute use, has none). Patched
# only where the module is imported already (nothing is imported for it).
_CHECKPOINTS = (
    ("torch.utils.checkpoint", "CheckpointFunction", "forward", "backward"),
    ("megatron.core.tensor_parallel.random", "CheckpointFunction", "forward", "backward"),
    ("megatron.core.tensor_parallel.random", "CheckpointWithoutOutputFunction", "forward", ""),
    ("megatron.core.tensor_parallel.random", "CheckpointWithoutOutput", "", "_recompute"),
    ("mindspeed.core.tensor_parallel.random", "CheckpointFunctionWithoutOutput", "forward", ""),
    ("mindspeed.core.tensor_parallel.random", "CheckpointWithoutOutput", "", "_recompute"),
    ("deepspeed.runtime.activation_checkpointing.checkpointing", "CheckpointFunction",
     "forward", "backward"),
)


def _wrapped(original: Any, before: Callable[[tuple], Any],
             after: Callable[[Any], None]) -> Any:
    """`original` (a function or staticmethod) with `before(args)` run first and `after` of
    its answer run once it returns or raises; a staticmethod stays one."""
    static = isinstance(original, staticmethod)
    function = original.__func__ if static else original

    def checkpoint_entry(*args: Any, **kwargs: Any) -> Any:
        token = before(args)
        try:
            return function(*args, **kwargs)
        finally:
            after(token)
    return staticmethod(checkpoint_entry) if static else checkpoint_entry


def checkpoint_patches(adapter: Any) -> List[ClassPatch]:
    """The patches of `_CHECKPOINTS` for the adapter (its `checkpoint_forward(ctx)` and
    `replay_entered()` / `replay_left(token)`), for the implementations imported now."""
    patches: List[ClassPatch] = []
    done = set()                # a class one module re-exports from another is patched once
    for module_name, class_name, forward, replay in _CHECKPOINTS:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if not isinstance(owner, type) or owner in done:
            continue
        done.add(owner)
        if forward and callable(getattr(owner, forward, None)):
            patches.append(ClassPatch(owner, forward, lambda original: _wrapped(
                original, lambda args: adapter.checkpoint_forward(args[0] if args else None),
                lambda token: None)))
        if replay and callable(getattr(owner, replay, None)):
            patches.append(ClassPatch(owner, replay, lambda original: _wrapped(
                original, lambda args: adapter.replay_entered(), adapter.replay_left)))
    return patches


FORWARD, REPLAY, ENGINE = 0, 1, 2     # where a call runs: see RecomputeDetector.where


class RecomputeDetector:
    """`where()`: whether the current call runs outside the autograd engine (FORWARD), re-runs
    a forward inside it (REPLAY, see the module's text) or is other code the engine runs
    (ENGINE: a custom Function's backward, a hook). One object per adapter; `forget()` drops
    the node it holds (at uninstall)."""
    __slots__ = ("_node", "_answer", "_replay_begins")

    def __init__(self, replay_begins: Callable[[List[Any], Optional[str]], None]) -> None:
        self._node: Optional[Any] = None
        self._answer = ENGINE
        # called when a replay starts (a new node), with `replayed_functions` and
        # `forward_owner` of it
        self._replay_begins = replay_begins

    def where(self) -> int:
        node = _current_node() if _current_node is not None else None
        if node is None:
            return FORWARD
        if node is not self._node:
            self._node = node
            frame = _recompute_frame(sys._getframe(1))
            self._answer = ENGINE if frame is None else REPLAY
            if frame is not None:
                self._replay_begins(replayed_functions(frame), forward_owner(frame))
        return self._answer

    def forget(self) -> None:
        self._node, self._answer = None, ENGINE
