"""MindSpore's activation recompute (`Cell.recompute()`, `mindspore.recompute`), as the adapter
sees it. The rule (a replayed call stands for the forward call it re-runs) is the core session's;
this module only tells the adapter when a replay runs and which cell it replays.

- Reentrant (the default): the cell's forward runs through a `_RecomputeCell` under `_no_grad`
  (its calls run without gradients: not watched), and `_RecomputeCell.bprop` runs the forward
  again with gradients during backward and differentiates it on the spot: the replay's backward
  hooks record the gradients of the original calls.
- Non-reentrant (MindSpore 2.8+; 2.7 has the reentrant one only, and no `_RecomputeHandle`):
  the forward runs with gradients (watched as usual); during backward
  `_RecomputeHandle.recompute` runs it again only to rebuild saved tensors. Nothing of that
  replay is recorded: the original calls' own hooks receive the gradients.

The `_RecomputeCell` (and its `_WrapCell`) that `Cell.recompute()` attaches to a cell is
MindSpore's plumbing, not a submodule of the model: it is left out of the module tree, so the
recomputed cell's calls belong to the cell itself and names match a run without recompute.
A reentrant replay differentiates every input of the recomputed cell: which of them the
original forward did not differentiate is read off MindSpore's `_detach_input` (wrapped) and
the gradient graph (`Replay`, `graph_input`).
"""
from __future__ import annotations

import importlib
from typing import (Any, Callable, Dict, FrozenSet, Hashable, Iterable, List, Optional,
                    Sequence, Tuple)

import mindspore as ms

from precdbg.capture import ClassPatch

from .call_arguments import is_floating

__all__ = ["RECOMPUTE_ATTRS", "Replay", "model_cells", "patch_recompute"]

# the attribute under which Cell.recompute() keeps its recompute cell
RECOMPUTE_ATTRS = ("_recompute_cell",)


def model_cells(named: Iterable[Tuple[str, Any]]) -> List[Tuple[str, Any]]:
    """`cells_and_names()` without the recompute cells MindSpore attaches, and their subtrees."""
    out = []
    for name, cell in named:
        if any(part in RECOMPUTE_ATTRS for part in name.split(".")):
            continue
        out.append((name, cell))
    return out


class Replay:
    """The adapter's state while a recompute replays a forward: how deep, and which tensors of
    the replay the original forward did not differentiate (its constants).

    A reentrant replay differentiates every tensor input of the recomputed cell (MindSpore
    detaches them and asks for all their gradients), so the replay's hooks would see gradients
    of inputs the original forward never differentiated: a data batch, a mask, rotary
    tables, and what the replay computes from them alone. Those are its constants; their
    gradients are not recorded, so the run pairs with one without recompute. Tensors are held
    (not just their ids) until the replay ends, so an id is never reused meanwhile."""
    __slots__ = ("depth", "_constants", "_inputs", "_origin")

    def __init__(self, origin: Callable[[Any], Hashable]) -> None:
        self.depth = 0
        self._constants: Dict[Hashable, Any] = {}
        self._inputs: List[Tuple[Any, Any]] = []   # (original, detached copy) of this replay
        self._origin = origin            # the id a tensor and MindSpore's copies of it share

    def begin(self) -> None:
        self.depth += 1

    def reset(self) -> None:
        """The capture window ended: no replay runs, nothing is constant any more."""
        self.depth = 0
        self._constants.clear()
        self._inputs.clear()

    def end(self) -> None:
        self.depth -= 1
        if self.depth <= 0:
            self.depth = 0
            self._constants.clear()
            self._inputs.clear()

    def detached(self, pairs: Sequence[Tuple[Any, Any]]) -> None:
        """MindSpore detached the recomputed cell's inputs for the replay: (original, copy)
        pairs. Each input reaches the cell through a HookBackward of its own, so each is a
        constant when it is not differentiated (see `graph_input`; a backward hook of the
        user's on the cell passes its inputs on together, which `graph_input` follows)."""
        if not self.depth:
            return
        self._inputs.extend(pairs)
        for original, copy in pairs:
            if graph_input(original):
                self._constants[self._origin(copy)] = copy
            else:
                self._constants.pop(self._origin(copy), None)

    def is_constant(self, t: Any) -> bool:
        return self._origin(t) in self._constants

    def computed(self, inputs: Sequence[Tuple[int, str, Any]],
                 outputs: Sequence[Tuple[int, str, Any]]) -> None:
        """A replayed call ran: what it computed from constants alone is constant too."""
        if any(is_floating(t) and not self.is_constant(t) for _, _, t in inputs):
            return
        for _, _, t in outputs:
            self._constants[self._origin(t)] = t

    def constant_positions(self, inputs: Sequence[Tuple[int, str, Any]]) -> FrozenSet[int]:
        return frozenset(index for index, _, t in inputs if self.is_constant(t))


# gradient nodes that only pass a tensor on: a cell hook's copy, precdbg's HookBackward, and
# the copy made contiguous
_PASS_THROUGH = frozenset({"CellBackwardHook", "HookBackward", "Contiguous"})


def graph_input(t: Any) -> bool:
    """Whether the forward leaves `t` out of its gradient computation: no operation produced it
    and it is no parameter (a data batch, a mask), or it is a cell hook's copy of such tensors
    only. MindSpore marks every tensor inside `value_and_grad` as taking part, and a cell
    hook's copy node passes all its inputs on together: its outputs are differentiated as soon
    as one input is (measured: a constant table passed with the activations into a hooked
    cell gets gradients there, passed with the data batch it does not)."""
    if isinstance(t, ms.Parameter):
        return False
    budget = [256]
    return not _reaches_computation(getattr(t, "_grad_node", None), budget)


def _reaches_computation(node: Any, budget: List[int]) -> bool:
    """Whether a gradient node is, or passes on, an operation's result."""
    budget[0] -= 1
    if budget[0] < 0:
        return True                        # too far to tell: taken as differentiated
    if node is None or node.is_leaf():
        return False
    if node.name() not in _PASS_THROUGH:
        return True
    return any(edge is not None and _reaches_computation(edge[0], budget)
               for edge in node.next_functions)


def _owners(recompute_cell: Any) -> List[Any]:
    """What a `_RecomputeCell` replays, outermost first: its `net` (the recomputed cell's
    bound `construct`, or the cell itself for `mindspore.recompute(cell, ...)`) and what that
    wraps (a bound method's object, a `_WrapCell`'s function)."""
    out: List[Any] = []
    item = getattr(recompute_cell, "net", None)
    while item is not None and len(out) < 6 and not any(item is o for o in out):
        out.append(item)
        bound_to = getattr(item, "__self__", None)
        item = bound_to if bound_to is not None else getattr(item, "function", None)
    return out


def _tensor_pairs(arg: Any, out: Any, tensor_type: type) -> Iterable[Tuple[Any, Any]]:
    """(original, detached) tensors of `_detach_input(arg) -> out`, through its containers."""
    if isinstance(arg, tensor_type):
        if out is not arg and isinstance(out, tensor_type):
            yield arg, out
    elif isinstance(arg, (list, tuple)) and isinstance(out, (list, tuple)):
        for a, o in zip(arg, out):
            yield from _tensor_pairs(a, o, tensor_type)
    elif isinstance(arg, dict) and isinstance(out, dict):
        for key, value in arg.items():
            if key in out:
                yield from _tensor_pairs(value, out[key], tensor_type)


def _recompute_module() -> Optional[Any]:
    try:     # by module name: `mindspore.common.recompute` the attribute is the function
        return importlib.import_module("mindspore.common.recompute")
    except ImportError:           # a MindSpore without activation recompute
        return None


def patch_recompute(replaying: Callable[..., Any],
                    detached: Callable[[List[Tuple[Any, Any]]], None]) -> List[ClassPatch]:
    """Wrap the two places MindSpore replays a forward during backward:
    `replaying(owners, run, *args)` runs `run(*args)` as a replay of the cell whose forward
    is replayed (the first of `owners` that is a module of the model; none where it is not
    known); and the detach of a reentrant replay's inputs: `detached(pairs)` with the
    (original, copy) of each tensor."""
    recompute = _recompute_module()
    if recompute is None:
        return []
    patches = []
    tensor_type = getattr(recompute, "Tensor", None)
    if tensor_type is not None and callable(getattr(recompute, "_detach_input", None)):
        def make_detach(original: Any) -> Any:
            nesting = [0]                # containers recurse through this wrapper

            def detach(arg: Any) -> Any:
                nesting[0] += 1
                try:
                    out = original(arg)
                finally:
                    nesting[0] -= 1
                if nesting[0] == 0:
                    pairs = list(_tensor_pairs(arg, out, tensor_type))
                    if pairs:
                        detached(pairs)
                return out
            return detach
        patches.append(ClassPatch(recompute, "_detach_input", make_detach))
    def replay_patch(owner: Any, attr: str, owners_of: Callable[[Any], List[Any]]) -> None:
        if owner is not None and callable(getattr(owner, attr, None)):
            def make(original: Any) -> Any:
                def replayed(obj: Any, *args: Any) -> Any:
                    return replaying(owners_of(obj), original, obj, *args)
                return replayed
            patches.append(ClassPatch(owner, attr, make))

    # reentrant: the recompute cell's bprop replays the cell it wraps; non-reentrant: the
    # handle's recompute replays a function (its cell's hooks run again and say which)
    replay_patch(getattr(recompute, "_RecomputeCell", None), "bprop", _owners)
    replay_patch(getattr(recompute, "_RecomputeHandle", None), "recompute", lambda _: [])
    return patches
