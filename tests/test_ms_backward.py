"""The backward of MindSpore cells and calls, through HookBackward (precdbg_ms.hook_backward): a cell's
dx and dy are the true gradients of each call (a cell called twice gets each call's own), an
input no gradient is asked of gets no dx (as in PyTorch), a user's own cell backward hook still
runs and sees what it saw without precdbg, and a write into a parameter inside the
differentiated function (`set_data`) still writes the parameter."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import assert_rel, capture, norm64, one_row, rows_where  # noqa: E402

from mindspore import nn  # noqa: E402

W = np.array([0.5, -1.5, 2.0, 0.25], np.float32)
C = np.array([1.0, 2.0, -0.5, 3.0], np.float32)
X = np.array([0.3, -0.7, 1.1, 2.0], np.float32)


class Scale(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(W), name="w")

    def construct(self, x: ms.Tensor, c: ms.Tensor) -> ms.Tensor:
        return x * self.w * c


class Net(nn.Cell):
    """y1 = scale(2x, c); y2 = scale(3 y1, c); loss = sum(y2^2): the same cell called twice,
    with an activation and a constant (`c`, no gradient asked of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()

    def construct(self, x: ms.Tensor, c: ms.Tensor) -> ms.Tensor:
        y1 = self.scale(x * 2.0, c)
        y2 = self.scale(y1 * 3.0, c)
        return (y2 * y2).sum()


def _expected() -> dict:
    """float64 gradients by hand: per call of `scale`, dy (at its output) and dx (at input 0)."""
    x, w, c = (a.astype(np.float64) for a in (X, W, C))
    y1 = 2 * x * w * c
    y2 = 3 * y1 * w * c
    dy1_call = 2 * y2                       # call 1: dL/dy2
    dx1_call = dy1_call * w * c
    dy0_call = 3 * dx1_call                 # call 0: dL/dy1
    dx0_call = dy0_call * w * c
    return {0: (dy0_call, dx0_call), 1: (dy1_call, dx1_call)}


def _grad(net: Net):
    c = ms.Tensor(C)
    return ms.grad(lambda x: net(x, c), grad_position=0, weights=net.trainable_params())


@pytest.mark.parametrize("level", ["mix", "module"])
def test_cell_dx_and_dy_are_each_calls_true_gradients(tmp_path, level):
    net = Net()
    x = ms.Tensor(X)
    reference = _grad(net)(x)
    t, dbg, got = capture(tmp_path, lambda: _grad(net)(x), model=net, level=level)
    assert dbg.failures == 0
    np.testing.assert_array_equal(got[0].asnumpy(), reference[0].asnumpy())  # numerics kept
    for call, (dy, dx) in _expected().items():
        entry = f"Cell.scale.Scale.backward.{call}"
        got_dy = one_row(t, entry=entry, role="grad_output")
        got_dx = one_row(t, entry=entry, role="grad_input", arg_index=0)
        for row, ref, what in ((got_dy, dy, "dy"), (got_dx, dx, "dx")):
            assert_rel(row["norm"], norm64(ref), 1e-6, f"call {call} {what} norm")
            assert_rel(row["min"], float(ref.min()), 1e-6, f"call {call} {what} min")
            assert_rel(row["max"], float(ref.max()), 1e-6, f"call {call} {what} max")
        # the constant gets no gradient, as in PyTorch (no dx record for input 1)
        assert not rows_where(t, entry=entry, role="grad_input", arg_index=1), entry


def test_a_users_cell_backward_hook_still_runs_and_sees_the_same(tmp_path):
    def run(capture_it: bool):
        net = Net()
        seen = []

        def user_hook(cell, grad_input, grad_output):
            seen.append((grad_input[0].asnumpy().copy(), grad_output[0].asnumpy().copy()))
        net.scale.register_backward_hook(user_hook)
        x = ms.Tensor(X)
        if not capture_it:
            return _grad(net)(x), seen, None
        t, dbg, grads = capture(tmp_path, lambda: _grad(net)(x), model=net, level="mix")
        assert dbg.failures == 0
        return grads, seen, t

    ref_grads, ref_seen, _ = run(False)
    grads, seen, t = run(True)
    np.testing.assert_array_equal(grads[0].asnumpy(), ref_grads[0].asnumpy())
    np.testing.assert_array_equal(grads[1][0].asnumpy(), ref_grads[1][0].asnumpy())
    assert len(seen) == len(ref_seen) == 2
    for (gi, go), (ref_gi, ref_go) in zip(seen, ref_seen):
        np.testing.assert_array_equal(gi, ref_gi)
        np.testing.assert_array_equal(go, ref_go)
    # backward runs the later call first: the hook's first call is call 1's
    dx = one_row(t, entry="Cell.scale.Scale.backward.1", role="grad_input", arg_index=0)
    assert_rel(dx["norm"], norm64(seen[0][0]), 1e-6, "the user's grad_input of call 1")


@pytest.mark.parametrize("level", ["mix", "module"])
def test_set_data_inside_the_differentiated_function_writes_the_parameter(tmp_path, level):
    """`Parameter.set_data` (MindSpore's `assign_value`) inside the function value_and_grad
    differentiates: the parameter holds the new values afterwards, as without precdbg."""
    net = Net()
    x, c = ms.Tensor(X), ms.Tensor(C)

    def loss(x):
        first = net(x, c)
        net.scale.w.set_data(ms.Tensor(np.full(4, 7.0, np.float32)))
        return first + net(x, c)

    step = ms.value_and_grad(loss, None, net.trainable_params())
    t, dbg, (value, _) = capture(tmp_path, lambda: step(x), model=net, level=level)
    assert dbg.failures == 0
    np.testing.assert_array_equal(net.scale.w.asnumpy(), np.full(4, 7.0, np.float32))
    x64, c64 = X.astype(np.float64), C.astype(np.float64)
    expected = sum(float(((3 * (2 * x64 * w * c64)) * w * c64) ** 2 @ np.ones(4))
                   for w in (W.astype(np.float64), np.full(4, 7.0)))
    assert_rel(float(value.asnumpy()), expected, 1e-5, "loss")


class _DenseNorm(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(16, 16)
        self.ln = nn.LayerNorm((16,))

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.ln(self.fc(x))


@pytest.mark.parametrize("amp_level", ["O2", "to_float"])
def test_a_cell_amp_keeps_in_float32_computes_the_same_numbers(tmp_path, amp_level):
    """amp O2 (and `Cell.to_float`) keep LayerNorm in float32 behind a cast: HookBackward inside
    it is cast to float32 by PyNative, which changed the LayerNorm's output (and the training)
    while its backward was captured. The numbers with and without the debugger are equal."""
    from precdbg_ms import PrecisionDebugger

    def run(dump: bool) -> tuple:
        ms.set_seed(0)
        net = _DenseNorm()
        rng = np.random.RandomState(1)
        net.ln.gamma.set_data(ms.Tensor(rng.rand(16).astype(np.float32) + 0.5))
        net.ln.beta.set_data(ms.Tensor(rng.rand(16).astype(np.float32) * 0.1))
        if amp_level == "O2":
            net = ms.amp.auto_mixed_precision(net, "O2")
        else:                                   # the network in float16, its norm in float32
            net.to_float(ms.float16)
            net.ln.to_float(ms.float32)
        x = ms.Tensor(np.random.RandomState(0).randn(4, 16).astype(np.float32))
        grad_fn = ms.value_and_grad(lambda x: net(x).astype(ms.float32).sum(), None,
                                    net.trainable_params())
        dbg = PrecisionDebugger(dump_path=str(tmp_path / f"dump{int(dump)}"), level="mix")
        if dump:
            dbg.start(net)
        loss, grads = grad_fn(x)
        if dump:
            dbg.stop()
            dbg.step()
            assert dbg.close() and not dbg.failures
        return float(loss), [g.asnumpy().astype(np.float64).tolist() for g in grads]

    assert run(True) == run(False)


def test_a_parameter_two_calls_read_gets_no_per_call_gradient(tmp_path):
    """MindSpore hands a parameter's gradient over once, summed over its uses: a Dense called
    twice (or a tied weight) records it as the dw only, never as one call's grad_input (which
    would hold the other call's share too); a Dense called once still gets it."""
    from precdbg_ms import PrecisionDebugger

    class Shared(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Dense(8, 8)
            self.once = nn.Dense(8, 8)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            return self.once(ms.ops.tanh(self.fc(ms.ops.tanh(self.fc(x)))))

    ms.set_seed(0)
    net = Shared()
    x = ms.Tensor(np.random.RandomState(0).randn(4, 8).astype(np.float32))
    grad_fn = ms.grad(lambda x: (net(x) ** 2).sum(), None, net.trainable_params())
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    dbg.start(net)
    grads = grad_fn(x)
    dbg.stop()
    dbg.step()
    assert dbg.close() and not dbg.failures
    import precdbg
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    dense_dx = rows_where(t, role="grad_input", module="fc", kind="api")
    assert dense_dx and all(r["arg_index"] == 0 for r in dense_dx), dense_dx   # inputs only
    once_dw = one_row(t, entry="Functional.dense.2.backward", role="grad_input", arg_index=1)
    weight = dict(zip([p.name for p in net.trainable_params()], grads))["once.weight"]
    assert_rel(once_dw["norm"], norm64(weight), what="the single call's weight gradient")
    total = one_row(t, entry="Param.fc.weight.grad", role="param_grad")
    fc_weight = dict(zip([p.name for p in net.trainable_params()], grads))["fc.weight"]
    assert_rel(total["norm"], norm64(fc_weight), what="the shared weight's dw")


class _HalveGradient(nn.Cell):
    """Identity forward, a bprop of its own that halves the gradient."""

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return x * 1.0

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> tuple:
        return (dout * 0.5,)


class _Inner(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()
        self.halve = _HalveGradient()

    def construct(self, x: ms.Tensor, c: ms.Tensor) -> ms.Tensor:
        return self.halve(self.scale(x, c))


class _BpropNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def construct(self, x: ms.Tensor, c: ms.Tensor) -> ms.Tensor:
        h = self.inner(x, c) + x         # the root's own call, after the bprop cell returned
        return (h * h).sum()


@pytest.mark.parametrize("level", ["mix", "module"])
def test_a_cell_with_its_own_bprop_ends_its_forward_and_its_bprop_is_its_backward(tmp_path,
                                                                                 level):
    """MindSpore refuses forward hooks on a cell with a bprop: its forward never ended, so every
    later call was filed inside it, and its bprop's ops were recorded as forward calls of the
    root (a false divergence against the PyTorch twin). The cell's forward ends where it returns,
    its dy and dx are what its bprop received and returned, the bprop's ops are not recorded,
    and the gradients are those of the run without precdbg."""
    net = _BpropNet()
    c = ms.Tensor(C)
    x = ms.Tensor(X)

    def grad() -> Any:
        return ms.grad(lambda x: net(x, c), grad_position=0, weights=net.trainable_params())(x)

    reference = grad()
    t, dbg, got = capture(tmp_path, grad, model=net, level=level)
    assert dbg.failures == 0
    np.testing.assert_array_equal(got[0].asnumpy(), reference[0].asnumpy())
    np.testing.assert_array_equal(got[1][0].asnumpy(), reference[1][0].asnumpy())
    out = one_row(t, entry="Cell.inner.halve._HalveGradient.forward.0", role="output")
    assert out["module"] == "inner.halve"
    if level == "mix":
        add = one_row(t, entry="Tensor.__add__.0.forward", role="output")
        assert add["module"] == "", "a call after the bprop cell returned is the root's"
        # the bprop's `dout * 0.5` is its backward, not a forward call of anything
        calls = {(r["module"], r["entry"]) for r in rows_where(t, direction="forward",
                                                               api="__mul__")}
        assert sorted(m for m, _ in calls) == ["", "inner.halve", "inner.scale",
                                               "inner.scale"], calls
    xv, w, cv = (a.astype(np.float64) for a in (X, W, C))
    h = xv * w * cv + xv                               # forward: halve is the identity
    dy = 2 * h                                         # at the bprop cell's output
    back = "Cell.inner.halve._HalveGradient.backward.0"
    assert_rel(one_row(t, entry=back, role="grad_output")["norm"], norm64(dy), 1e-6, "dy")
    assert_rel(one_row(t, entry=back, role="grad_input")["norm"], norm64(0.5 * dy), 1e-6, "dx")
