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
"""
from __future__ import annotations

import sys
from typing import Any, Callable, List, Optional

import torch

__all__ = ["RecomputeDetector", "FORWARD", "REPLAY", "ENGINE", "ENGINE_ENTRIES",
           "replayed_functions"]

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


FORWARD, REPLAY, ENGINE = 0, 1, 2     # where a call runs: see RecomputeDetector.where


class RecomputeDetector:
    """`where()`: whether the current call runs outside the autograd engine (FORWARD), re-runs
    a forward inside it (REPLAY, see the module's text) or is other code the engine runs
    (ENGINE: a custom Function's backward, a hook). One object per adapter; `forget()` drops
    the node it holds (at uninstall)."""
    __slots__ = ("_node", "_answer", "_replay_begins")

    def __init__(self, replay_begins: Callable[[List[Any]], None]) -> None:
        self._node: Optional[Any] = None
        self._answer = ENGINE
        # called when a replay starts (a new node), with `replayed_functions` of it
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
                self._replay_begins(replayed_functions(frame))
        return self._answer

    def forget(self) -> None:
        self._node, self._answer = None, ENGINE
