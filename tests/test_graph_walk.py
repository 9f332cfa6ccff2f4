"""The autograd-graph walk of watch_backward in C (precdbg_pt._graphwalk) against its Python
reference (graph._walk_python): the same edges, in the same order, and the same expected counts,
on real autograd graphs and on hand-made nodes (None entries, errors, node_limit)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from precdbg_pt import graph

_graphwalk = pytest.importorskip("precdbg_pt._graphwalk")


class _Adapter:
    """What watch_backward needs of an adapter: hooks are held here and never record."""
    installed = False

    def __init__(self) -> None:
        self.held = []

    def hold(self, handle) -> None:
        self.held.append(handle)


@pytest.fixture
def walks(monkeypatch):
    """watch_backward's walk run both ways on the arguments watch_backward builds: asserts they
    agree and keeps (edges, expected) of each walk."""
    seen = []

    def both(start, node_targets, target_nodes, leaf_targets, accumulate, node_limit, expected):
        py_expected = list(expected)
        py_edges = graph._walk_python(list(start), node_targets, target_nodes, leaf_targets,
                                      accumulate, node_limit, py_expected)
        c_edges = _graphwalk.walk(start, node_targets, target_nodes, leaf_targets, accumulate,
                                  node_limit, expected)
        assert list(c_edges.items()) == list(py_edges.items())   # same nodes, same order
        assert expected == py_expected
        seen.append((dict(c_edges), list(expected)))
        return c_edges
    monkeypatch.setattr(graph, "_walk", both)
    return seen


def _graph_nodes(tensors):
    """Every node behind `tensors`, held: a node's Python object stays the same only while it is
    held, and the two walks' edges are compared by node."""
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    nodes = []
    while stack:
        node = stack.pop()
        if node in nodes:
            continue
        nodes.append(node)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return nodes


def _watch(fn, inputs, node_limit=10_000, keep=()):
    """Runs `fn` on the (name, tensor) inputs the way a captured call does and watches its
    backward; returns the graph's nodes (held) and the adapter."""
    targets = graph.input_targets([(i, key, t) for i, (key, t) in enumerate(inputs)])
    result = fn(*(t for _, t in inputs))
    results = result if isinstance(result, (list, tuple)) else (result,)
    outputs = [(i, "out", t) for i, t in enumerate(results)]
    nodes = _graph_nodes(list(results) + list(keep))
    adapter = _Adapter()
    assert graph.watch_backward(adapter, None, targets, outputs, node_limit)
    return nodes, adapter


def test_an_input_used_twice(walks):
    x = torch.randn(3, requires_grad=True) * 2
    _watch(torch.mul, [("input", x), ("other", x)])        # two targets, one tensor
    edges, expected = walks[-1]
    assert expected == [1, 1] and list(edges.values()) == [[(0, 0), (1, 1)]]
    _watch(lambda v: torch.mul(v, v) + v, [("x", x)])    # one target, three edges into it
    edges, expected = walks[-1]
    assert expected == [3] and sum(len(e) for e in edges.values()) == 3
    _watch(lambda a, b: a * b + a, [("a", x), ("b", x)])  # extra edges go to the last target
    assert walks[-1][1] == [1, 2]


def test_leaf_parameter_inputs(walks):
    x = torch.randn(2, 4, requires_grad=True).tanh()
    w = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    _watch(F.linear, [("input", x), ("weight", w), ("bias", b)])
    edges, expected = walks[-1]
    assert expected == [1, 1, 1] and sorted(ti for e in edges.values() for _, ti in e) == [0, 1, 2]
    _watch(lambda v, weight: F.linear(v, weight, b), [("input", x), ("weight", w)])
    assert walks[-1][1] == [1, 1]                        # b: a leaf met, not a target
    _watch(lambda v: v * 3, [("x", w)])                  # the leaf itself as the input
    assert walks[-1][1] == [1]


def test_multi_output_calls(walks):
    h = torch.randn(4, 6, requires_grad=True).sin()
    _watch(lambda t: torch.split(t, 2, dim=1), [("t", h)])
    assert walks[-1][1] == [1]
    first, second = torch.chunk(h, 2)                    # two outputs of one node, as inputs
    nodes, _ = _watch(lambda a, b: (a * b).relu() + a.exp(), [("a", first), ("b", second)])
    assert walks[-1][1] == [2, 1]
    _watch(lambda a: a.sum() + first.sum(), [("a", second)])   # into output 0: no target's
    assert walks[-1][1] == [1]


def test_branch_reaching_outside_the_call(walks):
    p = torch.randn(5, requires_grad=True)
    x = (p * 2).cos()
    outside = x.exp() + p                                # made before the call, from its input
    constant = torch.randn(5)                            # no grad: a None next function
    nodes, _ = _watch(lambda v: v * outside * constant, [("x", x)], keep=[outside])
    edges, expected = walks[-1]
    assert expected == [2]              # one edge from the call, one through `outside`
    assert any(n is None for node in nodes for n, _ in node.next_functions)


def test_node_limit_truncates_both_alike(walks):
    x = torch.randn(3, requires_grad=True) * 1
    w = torch.randn(3, requires_grad=True)

    def chain(v, weight):
        for i in range(12):
            v = (v + weight * i).tanh() if i % 3 else v * v
        return v
    counts = []
    for limit in range(0, 40):
        _watch(chain, [("x", x), ("weight", w)], node_limit=limit)
        counts.append(sum(walks[-1][1]))
    assert counts[0] == 0 and counts[-1] == 10 and 0 < counts[12] < 10
    assert counts == sorted(counts)


class _Node:
    """A hand-made node: next_functions as given (or raising)."""

    def __init__(self, next_functions=()) -> None:
        self._next = next_functions

    @property
    def next_functions(self):
        if isinstance(self._next, Exception):
            raise self._next
        return self._next


def _both(start, node_targets=None, leaf_targets=None, accumulate=None, node_limit=100,
          n_targets=3):
    """Runs both walks; returns (edges, expected) or the class of the exception both raised
    (the messages may differ)."""
    node_targets = node_targets or {}
    outcome = []
    for walk in (graph._walk_python, _graphwalk.walk):
        expected = [0] * n_targets
        try:
            edges = walk(list(start), node_targets, {key[0] for key in node_targets},
                         leaf_targets or {}, accumulate, node_limit, expected)
            outcome.append((list(edges.items()), expected))
        except Exception as exc:  # noqa: BLE001
            outcome.append((type(exc), None))
    assert outcome[0] == outcome[1]
    return outcome[0]


def test_hand_made_nodes():
    target = _Node()
    middle = _Node([(None, 0), [target, 1], (target, 0)])   # None, a list entry, two outputs
    top = _Node(((middle, 0), (target, 0), (middle, 0), (None, 0)))
    edges, expected = _both([top], {(target, 0): [0, 1], (target, 1): [2]})
    assert expected == [1, 1, 1]
    assert edges == [(top, [(1, 0)]), (middle, [(1, 2), (2, 1)])]

    class Leaf:
        def __init__(self, variable) -> None:
            self.variable, self.next_functions = variable, ()
    weight = object()
    start = [_Node([(Leaf(weight), 0), (Leaf(object()), 0)])]
    assert _both(start, leaf_targets={id(weight): [1]}, accumulate=Leaf)[1] == [0, 1, 0]
    assert _both(start, leaf_targets={id(weight): [1]})[1] == [0, 0, 0]   # no leaf targets
    assert _both([_Node([(target, 0)])], {(target, 0): None, (_Node(), 0): [0]})[1] == [0, 0, 0]


def test_errors_propagate_alike():
    assert _both([_Node(RuntimeError("no graph"))])[0] is RuntimeError
    assert _both([_Node([(_Node(), 0, 1)])])[0] is ValueError
    assert _both([_Node([(_Node(),)])])[0] is ValueError
    assert _both([_Node(5)])[0] is TypeError
    target = _Node()
    assert _both([_Node([(target, 0)])], {(target, 0): []})[0] is IndexError
    assert _both([_Node([(target, 0)])], {(target, 0): [7]})[0] is IndexError   # expected[7]

    class Unhashable(_Node):
        __hash__ = None
    assert _both([_Node([(Unhashable(), 0)])])[0] is TypeError
    with pytest.raises(TypeError):
        _graphwalk.walk([], {}, [], {}, None, 10, [])          # target_nodes: a set
