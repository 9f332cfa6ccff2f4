"""Activation recompute's rule, once for every framework: a replayed call stands for the forward
call it re-runs.

Activation checkpointing runs a block's forward again during backward (a reentrant checkpoint's
first forward runs without gradients; a non-reentrant one's with them). The adapters tell the
session when a call is a replay; this table says which earlier call it re-runs: the first not
yet replayed of the same API or module, in the same module, that ran without gradients in a
checkpoint's forward (the adapter says which calls may be replayed: not an evaluation
forward's). Calls of a checkpoint's forward run again inside an outer replay (nested
checkpoints) have no gradients either and stand for nothing: the inner replay does. Its
forward is not recorded again (its values are those of that call); its backward, where there is
one, is recorded under that call's name, so a run with recompute pairs record for record with
one without. None (nothing recorded) when no such call is left: the original's backward is
watched already (non-reentrant recompute replays a forward whose own graph gets the
gradients), or it was not captured.
"""
from __future__ import annotations

import collections
from typing import Deque, Dict, Generic, Optional, Tuple, TypeVar

__all__ = ["ReplayTable"]

C = TypeVar("C")
Key = Tuple[str, ...]


class ReplayTable(Generic[C]):
    """Forward calls a recompute may replay, per (kind, module, prefix, name), for one step."""
    __slots__ = ("_queues", "owner", "_owner_known")

    def __init__(self) -> None:
        self._queues: Dict[Key, Deque[Optional[C]]] = {}
        self.owner = ""               # the module the replay re-runs ("" while not known)
        self._owner_known = False

    def not_watched(self, key: Key, call: Optional[C]) -> None:
        """A forward call whose backward was not watched (it ran without gradients, as the
        forward of a reentrant activation checkpoint does): a later replay may stand for it."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = collections.deque()
        queue.append(call)

    def replayed(self, key: Key) -> Optional[C]:
        """The call a replayed call with this key re-runs (see the module's text)."""
        queue = self._queues.get(key)
        return queue.popleft() if queue else None

    def begins(self, owner: Optional[str] = None) -> None:
        """A recompute starts replaying. `owner`: the module whose forward it replays, where
        the adapter knows it (from the checkpoint's function, MindSpore's recompute cell, or
        the module a checkpointed plain function was called in: "" for the root).
        A checkpoint may wrap a module's forward function, not its call (transformers'
        GradientCheckpointingLayer, MindSpore's Cell.recompute): the module's hooks do not run
        in the replay, and the calls it makes itself outside its submodules are that module's;
        with no owner given (None), that module is taken as the parent of the first replayed
        submodule (`module_replayed`)."""
        self.owner = owner or ""
        self._owner_known = owner is not None

    def module_replayed(self, path: str, outside_modules: bool) -> None:
        """A replayed module starts; `outside_modules`: no other module of the replay is
        entered (it is the first)."""
        if outside_modules and not self._owner_known:
            self.owner = path.rpartition(".")[0]
