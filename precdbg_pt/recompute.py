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
call records is the core's rule (`precdbg.capture.recompute`). Other torch calls
the engine runs (a custom Function's backward, a hook) are backward work, not forward calls: the
adapter lets them through unrecorded (ENGINE), however backward was entered.

Backward runs without the capture mode on torch's stack: a replay's calls are seen once the
mode is back. A replayed module's hook puts it back; for a checkpointed plain function (no
module in it) hooks on the checkpoint's ctx do, set at the first call of its forward (the
adapter's `replays.replayable`, `checkpoint_context`), or a patch of the replay function of
Megatron's and MindSpeed's output-discarding checkpoints (`checkpoint_patches`). The module the
checkpoint's forward was called in, noted on its ctx then, owns what it replays
(`forward_owner`).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional, Tuple

import torch

from precdbg.capture import ClassPatch

__all__ = ["RecomputeDetector", "CheckpointReplays", "FORWARD", "REPLAY", "ENGINE",
           "ENGINE_ENTRIES", "replayed_functions", "forward_owner", "note_owner",
           "checkpoint_patches", "checkpoint_context", "UNKNOWN_CONTEXT"]

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


UNKNOWN_CONTEXT = object()     # a checkpoint forward found without a ctx to hook


def checkpoint_context(frame: Any) -> Optional[Any]:
    """The ctx of the reentrant activation checkpoint whose replay will re-run a call made at
    `frame` (None when there is none): the innermost `forward` of a class whose qualified name
    mentions a checkpoint (torch's, Megatron's, MindSpeed's, DeepSpeed's `CheckpointFunction`,
    their output-discarding variants, any other `*Checkpoint*Function`) that has a backward. A
    checkpoint none of whose inputs needs a gradient (`ctx.needs_input_grad`) has none: one run
    under no_grad (an evaluation forward), or nested in another's forward, whose replay runs it
    again. Asked for calls that run without gradients, and for those with gradients right
    after a checkpoint's forward was seen (CheckpointReplays.forward_watch)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "forward" and "checkpoint" in (
                getattr(code, "co_qualname", None) or code.co_filename).lower():
            ctx = frame.f_locals.get("ctx")
            needs = getattr(ctx, "needs_input_grad", None)
            if needs is None or any(needs):  # else an outer checkpoint may replay this one
                return ctx if ctx is not None else UNKNOWN_CONTEXT
        frame = frame.f_back
    return None


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
    checkpoint's ctx by `note_owner`; None when not noted)."""
    local = frame.f_locals
    ctx = local.get("ctx")
    if ctx is None:
        ctx = getattr(local.get("self"), "ctx", None)   # Megatron's CheckpointWithoutOutput
    return getattr(ctx, _OWNER_ATTR, None)


def note_owner(ctx: Any, module: str) -> bool:
    """Keep on a checkpoint's ctx the module its forward runs in (see `forward_owner`), once:
    True the first time (the caller hooks the ctx's replay then), False after, or when the ctx
    takes no attributes."""
    if ctx is UNKNOWN_CONTEXT or hasattr(ctx, _OWNER_ATTR):
        return False
    try:
        setattr(ctx, _OWNER_ATTR, module)
    except (AttributeError, TypeError):     # a ctx that takes no attributes: owner unknown
        return False
    return True


# A reentrant checkpoint replays its function in its own backward: a hook on its ctx (the
# checkpoint's node), set at the first call of its forward, puts the capture mode back on torch's
# stack for it (`CheckpointReplays.replayable`). The output-discarding variants replay earlier,
# in a hook on a later tensor: their replay function is patched, where its module is imported
# already (nothing is imported for it): (module, class, replay function).
_OUTPUT_DISCARDING = (
    ("megatron.core.tensor_parallel.random", "CheckpointWithoutOutput", "_recompute"),
    ("mindspeed.core.tensor_parallel.random", "CheckpointWithoutOutput", "_recompute"),
)


def checkpoint_patches(replays: "CheckpointReplays") -> List[ClassPatch]:
    """Patches of the `_OUTPUT_DISCARDING` replays imported now: the adapter's
    `replays.replay_entered()` before, `replay_left(its answer)` after."""
    patches: List[ClassPatch] = []
    done = set()                # a class one module re-exports from another is patched once
    for module_name, class_name, replay in _OUTPUT_DISCARDING:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if not isinstance(owner, type) or owner in done or \
                not callable(getattr(owner, replay, None)):
            continue
        done.add(owner)

        def make(original: Any) -> Any:
            def replay_entry(*args: Any, **kwargs: Any) -> Any:
                put_back = replays.replay_entered()
                try:
                    return original(*args, **kwargs)
                finally:
                    replays.replay_left(put_back)
            return replay_entry
        patches.append(ClassPatch(owner, replay, make))
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


class _ReplayHooks:
    """The pre-hook and hook of a reentrant checkpoint's node (one object, two bound methods):
    its backward replays its forward, with the capture mode back on torch's stack."""
    __slots__ = ("replays", "put_back")

    def __init__(self, replays: "CheckpointReplays") -> None:
        self.replays, self.put_back = replays, False

    def enter(self, grad_outputs: Any) -> None:
        self.put_back = self.replays.replay_entered()
        return None

    def leave(self, grad_inputs: Any, grad_outputs: Any) -> None:
        put_back, self.put_back = self.put_back, False
        self.replays.replay_left(put_back)
        return None


class CheckpointReplays:
    """The adapter's part in checkpoint replays, a helper object each `TorchAdapter` owns (as
    `replays`) and calls: whether a forward call may be replayed, and the capture mode put back
    on torch's stack while a replay runs. Reads the adapter's `recorder`, `_mode` (the capture
    mode's handle), `installed`, `paused`, and registers through its `hold`."""
    __slots__ = ("adapter", "in_checkpoint")

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.in_checkpoint = False     # a reentrant checkpoint's forward was seen running

    def forget(self) -> None:
        """The capture window is over (uninstall)."""
        self.in_checkpoint = False

    def replayable(self) -> bool:
        """Whether a call may be re-run by a recompute's replay (asked for calls without
        gradients, see `forward_watch`): the backward is captured and the call runs in the
        forward of an activation checkpoint with a backward (read off the stack: the frame of
        `forward_watch`'s caller and above). At the first such call of a checkpoint, its ctx
        keeps the module it runs in (the owner of what its replay re-runs) and gets the hooks
        that put the capture mode back for its replay."""
        adapter = self.adapter
        recorder = adapter.recorder
        if not recorder.filter.keeps_backward:
            return False
        ctx = checkpoint_context(sys._getframe(2))
        if ctx is None:
            return False
        self.in_checkpoint = True
        if note_owner(ctx, recorder.owning_module):
            hooks = _ReplayHooks(self)
            adapter.hold(ctx.register_prehook(hooks.enter))
            adapter.hold(ctx.register_hook(hooks.leave))
        return True

    def forward_watch(self, grad_on: bool) -> Tuple[bool, bool]:
        """(watched, replayable) of a forward call about to run (`grad_on`: gradients are
        enabled and the backward is captured), asked by the adapter's hooks themselves (the
        stack above them is read). Without gradients it is not watched, and a replay may re-run
        it (`replayable`). With them it is watched, unless it runs in a reentrant checkpoint's
        forward all the same (`torch.enable_grad()` inside one, as Megatron's
        bias-dropout-add): the graph it makes there is dropped and the checkpoint's replay has
        its backward. The stack is read for that only after a checkpoint's forward was seen,
        until a call with gradients runs outside one."""
        if not grad_on:
            return False, self.replayable()
        if self.in_checkpoint:
            if self.replayable():
                return False, True
            self.in_checkpoint = False
        return True, False

    def replay_entered(self) -> bool:
        """A checkpoint's replay starts inside backward: the capture mode goes back on torch's
        stack for it (True when it was put back now)."""
        adapter = self.adapter
        session, mode = adapter.recorder, adapter._mode
        if not adapter.installed or adapter.paused or mode is None or session is None:
            return False
        try:
            return mode.enter_replay()
        except Exception as exc:  # noqa: BLE001 - never raise into training
            session.hook_failed(exc, "starting a checkpoint's replay")
            return False

    def replay_left(self, put_back: bool) -> None:
        session, mode = self.adapter.recorder, self.adapter._mode
        if put_back and mode is not None and session is not None:
            try:
                mode.leave_replay()
            except Exception as exc:  # noqa: BLE001 - never raise into training
                session.hook_failed(exc, "ending a checkpoint's replay")

    def engine_returned(self) -> None:
        """An engine entry (backward, autograd.grad) returned: a replay's mode comes off."""
        mode = self.adapter._mode
        if mode is not None:
            mode.leave_replay()
