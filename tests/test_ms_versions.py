"""What differs between the MindSpore versions precdbg serves (2.7.1 to 2.10): where the PyNative
executor lives (`mindspore.graph.api` from 2.9, `mindspore.common.api` before), and dtype names
when a torch shim (mindnlp's mindtorch, MSAdapter) makes `str(ms.float32)` read
"mindspore.float32"; forward hooks without always_call in 2.7; and, where this version runs
them, the paths 2.7 needs: a cell with its own bprop hooked, a reentrant recompute followed."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import capture  # noqa: E402  (sets MindSpore up: CPU, PyNative)

from mindspore import nn  # noqa: E402


def test_the_pynative_executor_is_found_in_this_version():
    from precdbg_ms.pynative import _PyNativeExecutor, _pynative_executor
    assert isinstance(_pynative_executor, _PyNativeExecutor)
    assert callable(_pynative_executor.enable_grad) and callable(_pynative_executor.requires_grad)


class _ShimDtype:
    """A dtype as a torch shim prints it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


@pytest.mark.parametrize("text, name", [("mindspore.float32", "float32"),
                                        ("mindspore.bfloat16", "bfloat16"),
                                        ("torch.float16", "float16"), ("mindspore.bool_", "bool"),
                                        ("Int64", "int64")])
def test_dtype_names_do_not_depend_on_how_a_shim_prints_them(text, name):
    from precdbg_ms.tensors import dtype_name
    assert dtype_name(_ShimDtype(text)) == name


def test_mindspores_own_dtypes_keep_their_names():
    from precdbg_ms.tensors import dtype_name
    assert [dtype_name(d) for d in (ms.float32, ms.bfloat16, ms.int64, ms.bool_)] == \
        ["float32", "bfloat16", "int64", "bool"]


def test_forward_hooks_run_when_the_forward_raises_where_this_version_can():
    """2.8 added `always_call` to `Cell.register_forward_hook`; 2.7 has none, and the hook is
    registered without it there (measured on 2.7.1: start() raised TypeError before)."""
    from mindspore import nn

    from precdbg_ms.cell_hooks import _always_call
    has = "always_call" in inspect.signature(nn.Cell.register_forward_hook).parameters
    assert _always_call(nn.Cell) == ({"always_call": True} if has else {})


class _Halve(nn.Cell):
    """The identity forward, half the gradient backward: a cell with its own bprop."""

    def construct(self, x):
        return x * 1.0

    def bprop(self, x, out, dout):
        return (dout * 0.5,)


def test_a_cell_with_its_own_bprop_gets_its_forward_hook_in_this_version():
    """MindSpore (2.7 to 2.10) hands back an empty handle for a forward hook on a cell with its
    own bprop, yet `Cell._run_construct` runs the hooks the cell holds: precdbg keeps its hook
    there, marked as `register_forward_hook(with_kwargs=True)` marks it (and always_call where
    the version has it; 2.7 has neither that dict nor a HookHandle taking a list of them). On
    2.7.1 the cell was left unhooked before: every later call was filed inside it."""
    from precdbg_ms.cell_hooks import _custom_bprop_forward_hook
    cell = _Halve()
    x = ms.Tensor(np.array([1.0, -2.0, 4.0], np.float32))
    assert cell.has_bprop
    seen = []
    cell.register_forward_hook(lambda c, args, output: seen.append("refused"))
    cell(x)
    assert seen == [], "MindSpore ran a forward hook it refuses bprop cells: not needed here"
    handle = _custom_bprop_forward_hook(
        cell, lambda c, args, kwargs, output: seen.append((args[0] is x, kwargs, output)))
    assert handle is not None
    # marked always_call exactly where this version's register_forward_hook has the option
    has = "always_call" in inspect.signature(nn.Cell.register_forward_hook).parameters
    assert (handle.handle_id in getattr(cell, "_forward_hook_always_called", {})) == has
    out = cell(x)
    assert len(seen) == 1 and seen[0][0] and seen[0][1] == {} and seen[0][2] is out
    grad = ms.grad(cell)(x)                  # under grad: the bprop runs, and the hook too
    np.testing.assert_array_equal(grad.asnumpy(), [0.5, 0.5, 0.5])
    assert len(seen) == 2
    handle.remove()
    kept = [cell._forward_hook, cell._forward_hook_with_kwargs,
            getattr(cell, "_forward_hook_always_called", {})]
    assert [dict(d) for d in kept] == [{}, {}, {}]
    cell(x)
    assert len(seen) == 2


class _Block(nn.Cell):
    def __init__(self, seed: int) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc = nn.Dense(4, 4, weight_init=ms.Tensor(rng.standard_normal((4, 4), np.float32)),
                           bias_init=ms.Tensor(rng.standard_normal(4, np.float32)))
        self.act = nn.Tanh()

    def construct(self, x):
        return x + self.act(self.fc(x)) * 0.5


class _RecomputeNet(nn.Cell):
    """Two blocks, run plainly (`none`), through `Cell.recompute()` (`cell`: reentrant, the
    default of every version and the only recompute of 2.7) or `mindspore.recompute(block, x)`
    (`functional`)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.blocks = nn.CellList([_Block(1), _Block(2)])
        if how == "cell":
            for block in self.blocks:
                block.recompute()
        self.head = nn.Dense(4, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        for block in self.blocks:
            x = ms.recompute(block, x) if self.how == "functional" else block(x)
        return self.head(x).sum()


def _recompute_run(tmp_path, how: str):
    net = _RecomputeNet(how)
    x = ms.Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))

    def grads():
        return ms.grad(net, grad_position=None, weights=net.trainable_params())(x)
    reference = grads()
    table, dbg, got = capture(tmp_path / how, grads, model=net, level="mix")
    assert dbg.failures == 0
    for a, b in zip(got, reference):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    return table


@pytest.mark.parametrize("how", ["cell", "functional"])
def test_a_recompute_is_followed_in_this_version(tmp_path, how):
    """MindSpore's reentrant recompute (`_RecomputeCell`: its forward under no_grad, its bprop
    replaying the cell; 2.7 has no other) is recorded as the run without it: the replayed
    forward is not recorded a second time, its backward is recorded under the names of the
    calls it replays, and no `_recompute_cell` appears (measured on 2.7.1 and 2.10)."""
    plain, run = _recompute_run(tmp_path, "none"), _recompute_run(tmp_path, how)

    def records(table):
        return sorted(zip(table["entry"], table["role"], table["arg_index"].tolist(),
                          table["norm"].tolist()))
    got, want = records(run), records(plain)
    assert [r[:3] for r in got] == [r[:3] for r in want]
    np.testing.assert_allclose([r[3] for r in got], [r[3] for r in want], rtol=1e-6)
    entries = set(run["entry"])
    for block in ("blocks.0", "blocks.1"):
        assert f"Cell.{block}._Block.backward.0" in entries
        assert f"Cell.{block}.fc.Dense.backward.0" in entries
    assert not any("_recompute_cell" in e or "Generator" in e for e in entries)
