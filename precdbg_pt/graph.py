"""Backward of one call, read off the autograd graph without changing it.

dy: a pre-hook on the node that produced each output receives the gradient arriving at it (summed
over every use of the output). dx: the nodes created by the call are walked from its outputs back
to its inputs' nodes; a hook on each node with an edge into an input receives exactly the
gradient this call sends to that input (summed when the call uses an input twice). This is the true
per-input dx, not the grad_input of the call's last autograd node.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from precdbg.capture import GuardedHook
from precdbg.records import Direction, Role

try:                     # the walk in C (optional: without a C compiler, the same walk in Python)
    from . import _graphwalk
except ImportError:      # pragma: no cover - depends on the build
    _graphwalk = None

__all__ = ["input_targets", "watch_backward", "Target"]

# (arg_index, arg_key, node or None, output_nr, leaf tensor or None)
Target = Tuple[int, str, Any, int, Optional[torch.Tensor]]


def input_targets(inputs: Sequence[Tuple[int, str, torch.Tensor]]) -> List[Target]:
    """Where each grad-requiring input sits in the graph, taken *before* the call runs (an
    in-place call replaces its input's grad_fn)."""
    targets: List[Target] = []
    for index, key, t in inputs:
        if t.requires_grad:
            node = t.grad_fn
            targets.append((index, key, node, t.output_nr if node is not None else 0,
                            None if node is not None else t))
    return targets


class _DxState:
    __slots__ = ("expected", "arrived", "partial", "flush_queued")

    def __init__(self, n: int) -> None:
        self.expected = [0] * n
        self.arrived = [0] * n
        self.partial: List[Optional[torch.Tensor]] = [None] * n
        self.flush_queued = False     # a flush of what arrived runs when this backward ends


_queue_callback = torch.autograd.Variable._execution_engine.queue_callback


_ACCUMULATE_GRAD: type = torch._C._functions.AccumulateGrad   # a leaf's node: .variable


def watch_backward(adapter: Any, call: Any, targets: Sequence[Target],
                   outputs: Sequence[Tuple[int, str, torch.Tensor]], node_limit: int) -> bool:
    """Hook dy of every output and dx of every target of `call`; the hooks record through
    `adapter.recorder.capture`, guarded by `adapter.Guard`, and are held by `adapter.hold`.
    An output that *is* one of the inputs (handed through unchanged: T5's position bias, a
    tuple of hidden states that includes the input) has no backward in this call and is left
    out; returns False when every output is so (the call is an identity on its input). Nodes
    are keys themselves (a node's Python object stays the same while it is held): asked for
    every captured call whose backward is watched."""
    # a tensor passed as several arguments (torch.mul(x, x)) is several targets: its k-th edge
    # found in the graph goes to its k-th argument (extra edges sum into the last one)
    node_targets: Dict[Tuple[Any, int], List[int]] = {}
    leaf_targets: Dict[int, List[int]] = {}
    for i, (_, _, node, nr, leaf) in enumerate(targets):
        if node is not None:
            hits = node_targets.get((node, nr))
            if hits is None:
                node_targets[(node, nr)] = [i]
            else:
                hits.append(i)
        else:
            hits = leaf_targets.get(id(leaf))
            if hits is None:
                leaf_targets[id(leaf)] = [i]
            else:
                hits.append(i)
    target_nodes = {key[0] for key in node_targets}
    by_node: Dict[Any, List[Tuple[int, int, str]]] = {}
    handed_through = False
    for index, key, t in outputs:
        node = t.grad_fn
        if node is None:
            continue
        if node in target_nodes:
            handed_through = True
            continue
        outs = by_node.get(node)
        if outs is None:
            by_node[node] = [(t.output_nr, index, key)]
        else:
            outs.append((t.output_nr, index, key))
    if not by_node:
        return not handed_through
    hold = adapter.hold
    if not targets:
        for node, outs in by_node.items():
            hold(node.register_prehook(DyHook(adapter, call, outs)))
        return True
    state = _DxState(len(targets))
    expected = state.expected
    accumulate = _ACCUMULATE_GRAD if leaf_targets else None
    edges = _walk(list(by_node), node_targets, target_nodes, leaf_targets, accumulate,
                  node_limit, expected)
    # a node that received an output's dy and sends dx to an input (most API calls are one
    # node) gets one hook for both: its post-hook sees the gradients it consumed and produced
    for node, outs in by_node.items():
        node_edges = edges.pop(node, None)
        if node_edges is None:
            hold(node.register_prehook(DyHook(adapter, call, outs)))
        else:
            hold(node.register_hook(DxHook(adapter, call, outs, node_edges, state, targets)))
    for node, node_edges in edges.items():
        hold(node.register_hook(DxHook(adapter, call, None, node_edges, state, targets)))
    return True


def _walk_python(start: List[Any], node_targets: Dict[Tuple[Any, int], List[int]],
                 target_nodes: Set[Any], leaf_targets: Dict[int, List[int]],
                 accumulate: Optional[type], node_limit: int,
                 expected: List[int]) -> Dict[Any, List[Tuple[int, int]]]:
    """The edges {node: [(position in its next_functions, target index)]} into the targets
    met walking back from the `start` nodes, each counted in `expected`; the walk stops at the
    targets' nodes and after `node_limit` nodes. `accumulate`: the class of a leaf's node, or
    None when no target is a leaf. Depth first, the last next function first. What
    `_graphwalk.walk` does in C, kept for builds without a C compiler and as its reference."""
    edges: Dict[Any, List[Tuple[int, int]]] = {}
    edges_found: Dict[int, int] = {}          # per target list (its first index): edges met
    stack = list(start)
    visited = set()
    while stack and len(visited) < node_limit:
        node = stack.pop()
        if node in visited:
            continue
        visited.add(node)
        for position, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            if nxt in target_nodes:           # an input's node: an edge into it, or a stop
                hits = node_targets.get((nxt, nr))
                if hits is None:
                    continue
            elif type(nxt) is accumulate:     # a leaf: an input itself, or a parameter
                hits = leaf_targets.get(id(nxt.variable))
                if hits is None:
                    continue
            else:
                if nxt not in visited:
                    stack.append(nxt)
                continue
            k = edges_found.get(hits[0], 0)
            edges_found[hits[0]] = k + 1
            ti = hits[k] if k < len(hits) else hits[-1]
            node_edges = edges.get(node)
            if node_edges is None:
                edges[node] = [(position, ti)]
            else:
                node_edges.append((position, ti))
            expected[ti] += 1
    return edges


_walk = _graphwalk.walk if _graphwalk is not None else _walk_python


_GRAD_OUTPUT, _GRAD_INPUT = Role.GRAD_OUTPUT, Role.GRAD_INPUT
_BACKWARD = Direction.BACKWARD


class DyHook(GuardedHook):
    """Pre-hook on the node that produced outputs of a captured call: records the gradient
    arriving at each (dy). One object per hooked node."""
    __slots__ = ("call", "outs")

    def __init__(self, adapter: Any, call: Any, outs: List[Tuple[int, int, str]]) -> None:
        super().__init__(adapter)
        self.call, self.outs = call, outs

    def record(self, session: Any, grad_outputs: Sequence[Optional[torch.Tensor]]) -> None:
        _record_dy(session, self.call, self.outs, grad_outputs)

    def where(self) -> str:
        return "backward hook of " + self.call.backward_entry


def _record_dy(session: Any, call: Any, outs: List[Tuple[int, int, str]],
               grad_outputs: Sequence[Optional[torch.Tensor]]) -> None:
    for output_nr, index, key in outs:
        grad = grad_outputs[output_nr] if output_nr < len(grad_outputs) else None
        if grad is not None:
            session.capture(call, _BACKWARD, _GRAD_OUTPUT, index, key, grad)


class DxHook(GuardedHook):
    """Post-hook on a node with edges into a captured call's inputs: records the gradient the
    call sends to each input (dx, summed over the edges into it once all have arrived) and,
    on the node that produced outputs, their dy as well."""
    __slots__ = ("call", "outs", "edges", "state", "targets")

    def __init__(self, adapter: Any, call: Any, outs: Optional[List[Tuple[int, int, str]]],
                 edges: List[Tuple[int, int]], state: _DxState,
                 targets: Sequence[Target]) -> None:
        super().__init__(adapter)
        self.call, self.outs, self.edges = call, outs, edges
        self.state, self.targets = state, targets

    def record(self, session: Any, grad_inputs: Sequence[Optional[torch.Tensor]],
               grad_outputs: Sequence[Optional[torch.Tensor]]) -> None:
        call = self.call
        if self.outs is not None:                  # the dy of the outputs this node produced
            _record_dy(session, call, self.outs, grad_outputs)
        state = self.state
        for position, ti in self.edges:
            grad = grad_inputs[position] if position < len(grad_inputs) else None
            state.arrived[ti] += 1
            if grad is not None:
                prev = state.partial[ti]
                state.partial[ti] = grad if prev is None else prev + grad
            if state.arrived[ti] >= state.expected[ti]:
                _record_dx(session, call, state, self.targets, ti)
            elif not state.flush_queued:
                # an edge whose node never runs (an output nothing used, `(h, x.sum())` with
                # the sum dropped) never arrives: what did arrive is this input's dx, recorded
                # when the backward ends
                state.flush_queued = True
                _queue_callback(DxFlush(self.adapter, call, state, self.targets))

    def where(self) -> str:
        return "backward hook of " + self.call.backward_entry


def _record_dx(session: Any, call: Any, state: _DxState, targets: Sequence[Target],
               ti: int) -> None:
    total, state.partial[ti] = state.partial[ti], None
    state.arrived[ti] = 0                # ready for another backward (retain_graph)
    if total is not None:
        target = targets[ti]
        session.capture(call, _BACKWARD, _GRAD_INPUT, target[0], target[1], total)


class DxFlush(GuardedHook):
    """At the end of a backward: the dx of inputs some of whose edges never ran."""
    __slots__ = ("call", "state", "targets")

    def __init__(self, adapter: Any, call: Any, state: _DxState,
                 targets: Sequence[Target]) -> None:
        super().__init__(adapter)
        self.call, self.state, self.targets = call, state, targets

    def record(self, session: Any) -> None:
        state = self.state
        state.flush_queued = False
        for ti, arrived in enumerate(state.arrived):
            if arrived:
                _record_dx(session, self.call, state, self.targets, ti)

    def where(self) -> str:
        return "end of the backward of " + self.call.backward_entry
