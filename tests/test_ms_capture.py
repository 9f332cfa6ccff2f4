"""What the MindSpore adapter captures: entry names of Cells, ops.*, mint.*, Tensor methods and
primitives; nested calls once; canonical ops; parameter names and their PyTorch aliases; dw via
parameter hooks; true per-input dx; the optimizer phase; levels; data modes; statistics and
stored tensors."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import (DENSE_PATHS, LAYER_NORM_PATHS, as_tensors, assert_rel,  # noqa: E402
                        capture, dump_once, grads_of, make_batches, make_model, make_optimizer,
                        norm64, one_row, rows_where, run_steps, tiny_config)

from mindspore import mint, nn, ops  # noqa: E402

import precdbg  # noqa: E402
from precdbg_examples import gpt_ms  # noqa: E402
from precdbg_ms import PrecisionDebugger  # noqa: E402


# ----------------------------------------------------------------------------- shared GPT dump
@pytest.fixture(scope="module")
def gpt_dump(tmp_path_factory):
    """One captured forward + backward of the tiny GPT (value_and_grad made before start(), as
    gpt_ms.train_step_fn does; no optimizer step), with the gradients value_and_grad returned."""
    path = str(tmp_path_factory.mktemp("ms_gpt_mix"))
    model = make_model()
    batch = make_batches(1)[0]
    params = model.trainable_params()
    grad_fn = ms.value_and_grad(lambda x, y: _loss(model, x, y), None, params)
    x, y = as_tensors(batch)
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=path)
    dbg.start(model)
    loss, grads = grad_fn(x, y)
    dbg.stop()
    dbg.step()
    assert dbg.close()
    dump = precdbg.open_dump(path)
    return dict(dump=dump, table=dump.records(step=0), failures=dbg.failures,
                grads={p.name: g.asnumpy().copy() for p, g in zip(params, grads)},
                params={p.name: p.asnumpy().copy() for p in model.get_parameters()},
                cells={path: type(c).__name__ for path, c in model.cells_and_names()},
                loss=float(loss.asnumpy()))


def _loss(model, x, y):
    logits = model(x)
    return ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def test_gpt_dump_is_clean(gpt_dump):
    assert gpt_dump["failures"] == 0
    dump = gpt_dump["dump"]
    assert dump.steps == [0] and dump.ranks == [0] and dump.partial == []
    assert dump.run["framework"] == "mindspore"
    assert dump.run["framework_version"] == ms.__version__
    assert dump.run["mode"] == "PYNATIVE"


# ----------------------------------------------------------------------------- names
def test_cell_entry_names(gpt_dump):
    t = gpt_dump["table"]
    rows = rows_where(t, entry="Cell.blocks.0.attn.qkv.Dense.forward.0")
    assert {(r["role"], r["arg_index"]) for r in rows} == {("input", 0), ("output", 0)}
    r = rows[0]
    assert r["kind"] == "module" and r["prefix"] == "Cell" and r["api"] == "Dense"
    assert r["module"] == "blocks.0.attn.qkv" and r["op"] == "linear"
    assert one_row(t, entry="Cell.GPT.forward.0", role="output")["module"] == ""
    assert one_row(t, entry="Cell.blocks.1.Block.backward.0", role="grad_input")["shape"] == \
        (4, 16, 64)
    ln = one_row(t, entry="Cell.blocks.0.ln_1.LayerNorm.forward.0", role="output")
    assert ln["op"] == "layer_norm" and ln["api"] == "LayerNorm"


def test_every_cell_has_forward_and_backward(gpt_dump):
    t = gpt_dump["table"]
    for path, cls in gpt_dump["cells"].items():
        if cls == "CellList":
            continue                                  # a container: never called
        fwd = f"Cell.{path}.{cls}.forward.0" if path else f"Cell.{cls}.forward.0"
        assert {(r["role"], r["arg_index"]) for r in rows_where(t, entry=fwd)} == \
            {("input", 0), ("output", 0)}, fwd
        if cls == "Dropout":
            continue                                  # p=0 returns its input: no backward
        bwd = fwd.replace(".forward.", ".backward.")
        expected = {"grad_output"} if path in ("", "wte", "wpe") else {"grad_output",
                                                                        "grad_input"}
        assert {r["role"] for r in rows_where(t, entry=bwd)} == expected, bwd
        fin, fout = (one_row(t, entry=fwd, role=role) for role in ("input", "output"))
        assert one_row(t, entry=bwd, role="grad_output")["shape"] == fout["shape"], bwd
        if "grad_input" in expected:
            assert one_row(t, entry=bwd, role="grad_input")["shape"] == fin["shape"], bwd


def test_functional_entries_and_canonical_ops(gpt_dump):
    t = gpt_dump["table"]
    mm = one_row(t, entry="Functional.matmul.0.forward", role="output")   # ops.matmul
    assert mm["prefix"] == "Functional" and mm["api"] == "matmul" and mm["op"] == "matmul"
    assert mm["module"] == "blocks.0.attn" and mm["shape"] == (4, 4, 16, 16)
    # leaf cells are also recorded as their functional API, under the cell's path
    dense = rows_where(t, kind="api", api="dense", direction="forward", role="output")
    assert [r["module"] for r in sorted(dense, key=lambda r: r["order"])] == DENSE_PATHS
    assert {r["op"] for r in dense} == {"linear"}
    lns = rows_where(t, kind="api", op="layer_norm", direction="forward", role="output")
    assert [r["module"] for r in sorted(lns, key=lambda r: r["order"])] == LAYER_NORM_PATHS
    soft = rows_where(t, kind="api", op="softmax", direction="forward", role="output")
    assert [r["entry"] for r in soft] == ["Functional.softmax.0.forward",
                                          "Functional.softmax.1.forward"]
    assert [r["module"] for r in soft] == ["blocks.0.attn", "blocks.1.attn"]
    ce = one_row(t, entry="Functional.cross_entropy.0.forward", role="output")
    assert ce["op"] == "cross_entropy" and ce["module"] == ""
    assert ce["mean"] == pytest.approx(gpt_dump["loss"], rel=1e-6)


def test_tensor_method_and_operator_entries(gpt_dump):
    t = gpt_dump["table"]
    add = one_row(t, entry="Tensor.__add__.0.forward", role="output")     # wte(idx) + wpe(pos)
    assert add["prefix"] == "Tensor" and add["op"] == "add" and add["module"] == ""
    view = rows_where(t, entry="Tensor.view.0.forward")
    assert {r["module"] for r in view} == {"blocks.0.attn"}
    assert one_row(t, entry="Tensor.view.0.forward", role="output")["shape"] == (4, 16, 4, 16)
    div = one_row(t, entry="Tensor.__truediv__.0.forward", role="output")
    assert div["op"] == "div"


def test_nested_calls_are_recorded_once(gpt_dump):
    """The primitives inside ops.softmax, ops.matmul, nn.Dense, ... are not separate records."""
    t = gpt_dump["table"]
    assert not np.any(t["prefix"] == "Primitive"), sorted(set(t.select(
        t["prefix"] == "Primitive")["entry"]))[:10]
    # one forward entry per call: two blocks, two matmuls each
    matmuls = {e for e in t["entry"].tolist()
               if e.startswith("Functional.matmul.") and e.endswith(".forward")}
    assert len(matmuls) == 4, sorted(matmuls)


def test_nested_primitive_of_ops_softmax_not_recorded(tmp_path):
    x = ms.Tensor(np.linspace(-2, 2, 12).astype(np.float32).reshape(3, 4))

    grad = ms.grad(lambda x: (ops.softmax(x, axis=-1) * x).sum())
    t, dbg, _ = capture(tmp_path, lambda: grad(x), level="api")
    assert dbg.failures == 0
    assert set(t["entry"].tolist()) == {
        "Functional.softmax.0.forward", "Functional.softmax.0.backward",
        "Tensor.__mul__.0.forward", "Tensor.__mul__.0.backward",
        "Tensor.sum.0.forward", "Tensor.sum.0.backward"}


class MintCell(nn.Cell):
    """A cell calling mindspore.mint functions (both have CPU kernels in 2.10)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 4)),
                              name="w")

    def construct(self, x):
        return mint.add(mint.matmul(x, self.w), 1.5)


def test_mint_entries(tmp_path):
    cell = MintCell()
    x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))

    grad = ms.value_and_grad(lambda x: cell(x).sum(), None, cell.trainable_params())
    t, dbg, (out, grads) = capture(tmp_path, lambda: grad(x), model=cell)
    assert dbg.failures == 0
    mm = one_row(t, entry="Mint.matmul.0.forward", role="output")
    assert mm["prefix"] == "Mint" and mm["api"] == "matmul" and mm["op"] == "matmul"
    assert mm["module"] == "" and mm["shape"] == (2, 4)
    add = one_row(t, entry="Mint.add.0.forward", role="output")
    assert add["op"] == "add"
    scalar = one_row(t, entry="Mint.add.0.forward", role="input", arg_index=1)
    assert scalar["dtype"] == "py.float" and scalar["min"] == 1.5
    assert_rel(add["norm"], norm64(x.asnumpy() @ cell.w.asnumpy() + 1.5), 1e-6, "mint.add out")
    dw = one_row(t, entry="Mint.matmul.0.backward", role="grad_input", arg_index=1)
    assert_rel(dw["norm"], norm64(grads[0]), 1e-6, "mint.matmul dw")
    assert rows_where(t, entry="Cell.MintCell.forward.0", role="output")


def test_primitive_called_directly(tmp_path):
    a = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = ms.Tensor(np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 4))
    matmul = ops.MatMul()

    grad = ms.grad(lambda a, b: matmul(a, b).sum(), grad_position=(0, 1))
    t, dbg, (ga, gb) = capture(tmp_path, lambda: grad(a, b), level="api")
    assert dbg.failures == 0
    out = one_row(t, entry="Primitive.MatMul.0.forward", role="output")
    assert out["prefix"] == "Primitive" and out["api"] == "MatMul" and out["op"] == "matmul"
    assert out["shape"] == (2, 4)
    assert_rel(out["norm"], norm64(a.asnumpy() @ b.asnumpy()), 1e-6, "MatMul output")
    inputs = sorted(rows_where(t, entry="Primitive.MatMul.0.forward", role="input"),
                    key=lambda r: r["arg_index"])
    assert [(r["arg_index"], r["shape"]) for r in inputs] == [(0, (2, 3)), (1, (3, 4))]
    for i, g in enumerate((ga, gb)):
        dx = one_row(t, entry="Primitive.MatMul.0.backward", role="grad_input", arg_index=i)
        assert_rel(dx["norm"], norm64(g), 1e-6, f"MatMul dx {i}")


def test_primitive_argument_keys_are_the_call_positions(tmp_path):
    """arg_key says where a tensor came from: for `MatMul()(a, b)` a is argument 0 and b is 1,
    as for `ops.matmul(a, b)` (the primitive object itself is not an argument)."""
    a = ms.Tensor(np.ones((2, 3), np.float32))
    b = ms.Tensor(np.ones((3, 4), np.float32))

    def body():
        ops.MatMul()(a, b)
        ops.matmul(a, b)
    t, dbg, _ = capture(tmp_path, body, level="api", data_mode=["forward"])
    assert dbg.failures == 0
    for entry in ("Functional.matmul.0.forward", "Primitive.MatMul.0.forward"):
        keys = [(r["arg_index"], r["arg_key"]) for r in sorted(
            rows_where(t, entry=entry, role="input"), key=lambda r: r["arg_index"])]
        assert keys == [(0, "0"), (1, "1")], (entry, keys)


def test_autograd_plumbing_primitives_are_not_captured(tmp_path):
    """Making a gradient function inside the captured window runs MindSpore's constexpr
    argument checks (the ProxyOp primitive); that is plumbing, not the user's math."""
    model = make_model()
    x, y = as_tensors(make_batches(1)[0])

    def body():
        return ms.value_and_grad(lambda x, y: _loss(model, x, y), None,
                                 model.trainable_params())(x, y)
    t, dbg, _ = capture(tmp_path, body, model=model)
    assert dbg.failures == 0
    plumbing = sorted({e for e in t["entry"].tolist() if e.startswith("Primitive.")})
    assert plumbing == [], plumbing


def test_hook_plumbing_methods_are_not_captured(tmp_path):
    """Tensor methods that manage autograd hooks (register_hook, hooks) are not math: like
    `register_hook` (in the ignore table), `hooks()` called inside the window is no API record."""
    model = make_model()
    t, dbg, _ = capture(tmp_path, lambda: [p.hooks() for p in model.trainable_params()],
                        model=model, level="api", data_mode=["forward"])
    assert dbg.failures == 0
    calls = sorted({e for e in t["entry"].tolist() if not e.startswith("Param.")})
    assert calls == [], calls[:5]


# ----------------------------------------------------------------------------- parameters
def test_parameter_names_and_aliases(gpt_dump):
    t = gpt_dump["table"]
    cases = {"blocks.0.ln_1.gamma": ("weight", "blocks.0.ln_1.weight"),
             "blocks.0.ln_1.beta": ("bias", "blocks.0.ln_1.bias"),
             "wte.embedding_table": ("weight", "wte.weight"),
             "wpe.embedding_table": ("weight", "wpe.weight"),
             "blocks.1.attn.qkv.weight": ("weight", "blocks.1.attn.qkv.weight"),
             "ln_f.beta": ("bias", "ln_f.bias")}
    for name, (op, alias) in cases.items():
        inv = one_row(t, entry=f"Param.{name}")
        assert (inv["kind"], inv["role"], inv["op"], inv["alias"]) == ("param", "param", op,
                                                                         alias), name
        dw = one_row(t, entry=f"Param.{name}.grad")
        assert (dw["kind"], dw["role"], dw["op"], dw["alias"]) == ("param_grad", "param_grad",
                                                                     op, alias), name
        assert dw["api"] == name and dw["module"] == name.rpartition(".")[0]


def test_inventory_lists_every_parameter(gpt_dump):
    t = gpt_dump["table"]
    inv = {r["api"]: r for r in rows_where(t, kind="param")}
    assert set(inv) == set(gpt_dump["params"])
    for name, value in gpt_dump["params"].items():
        r = inv[name]
        assert r["direction"] == "none" and r["phase"] == "setup" and r["trainable"] is True
        assert r["shape"] == value.shape and r["dtype"] == "float32"
        assert_rel(r["norm"], norm64(value), 1e-6, name)
        assert r["min"] == float(value.min()) and r["max"] == float(value.max())


def test_dw_equals_value_and_grad(gpt_dump):
    t = gpt_dump["table"]
    dw = rows_where(t, kind="param_grad")
    by_name = {r["api"]: r for r in dw}
    assert len(by_name) == len(dw), "one dw record per parameter per backward"
    assert set(by_name) == set(gpt_dump["grads"])
    for name, grad in gpt_dump["grads"].items():
        r = by_name[name]
        assert r["entry"] == f"Param.{name}.grad"
        assert r["direction"] == "backward" and r["phase"] == "backward"
        assert r["shape"] == grad.shape
        assert_rel(r["norm"], norm64(grad), 1e-6, name)
        assert r["min"] == pytest.approx(float(grad.min()), rel=1e-6, abs=1e-12)
        assert r["max"] == pytest.approx(float(grad.max()), rel=1e-6, abs=1e-12)


def test_leaf_cell_api_dw_equals_param_grad(gpt_dump):
    t = gpt_dump["table"]
    for k, path in enumerate(DENSE_PATHS):
        dw = one_row(t, entry=f"Functional.dense.{k}.backward", role="grad_input", arg_index=1)
        assert_rel(dw["norm"], norm64(gpt_dump["grads"][path + ".weight"]), 1e-6, path)
        dy = one_row(t, entry=f"Functional.dense.{k}.backward", role="grad_output")
        out = one_row(t, entry=f"Functional.dense.{k}.forward", role="output")
        assert dy["shape"] == out["shape"] and dy["module"] == path


def test_dw_of_a_cell_used_twice_is_summed(tmp_path):
    class Twice(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Dense(4, 4)

        def construct(self, x):
            return self.lin(ops.tanh(self.lin(x)))

    ms.set_seed(0)
    model = Twice()
    x = ms.Tensor(np.linspace(-1, 1, 12).astype(np.float32).reshape(3, 4))
    params = model.trainable_params()

    grad = ms.value_and_grad(lambda x: (model(x) ** 2).sum(), None, params)
    t, dbg, (_, grads) = capture(tmp_path, lambda: grad(x), model=model)
    assert dbg.failures == 0
    r = one_row(t, entry="Param.lin.weight.grad")
    assert_rel(r["norm"], norm64(grads[0]), 1e-6, "shared dw")
    assert rows_where(t, entry="Cell.lin.Dense.forward.1", role="output")
    assert rows_where(t, entry="Cell.lin.Dense.backward.1", role="grad_output")


# ----------------------------------------------------------------------------- dx
def test_dx_is_per_input_of_each_call(tmp_path):
    """f(x) = sum(mul(x, 2) + mul(x, 3)): each mul's dx is its own share (2 and 3 per element),
    not the total gradient of x (5 per element)."""
    n = 10
    x = ms.Tensor(np.linspace(-1, 1, n).astype(np.float32))

    grad = ms.grad(lambda x: (ops.mul(x, 2.0) + ops.mul(x, 3.0)).sum())
    t, dbg, gx = capture(tmp_path, lambda: grad(x), level="api")
    assert dbg.failures == 0
    np.testing.assert_allclose(gx.asnumpy(), np.full(n, 5.0))
    for k, factor in ((0, 2.0), (1, 3.0)):
        dx = one_row(t, entry=f"Functional.mul.{k}.backward", role="grad_input", arg_index=0)
        assert_rel(dx["norm"], factor * math.sqrt(n), 1e-6, f"mul {k} dx")
        assert dx["min"] == dx["max"] == factor
        dy = one_row(t, entry=f"Functional.mul.{k}.backward", role="grad_output")
        assert_rel(dy["norm"], math.sqrt(n), 1e-6, f"mul {k} dy")
        scalar = one_row(t, entry=f"Functional.mul.{k}.forward", role="input", arg_index=1)
        assert scalar["dtype"] == "py.float" and scalar["min"] == factor


def test_dx_of_matmul_matches_the_true_gradient(tmp_path):
    rng = np.random.default_rng(0)
    a = ms.Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    b = ms.Tensor(rng.standard_normal((4, 5)).astype(np.float32))

    grad = ms.grad(lambda a, b: (ops.matmul(a, b) * 2.0).sum(), grad_position=(0, 1))
    t, dbg, (ga, gb) = capture(tmp_path, lambda: grad(a, b), level="api")
    assert dbg.failures == 0
    ones = np.full((3, 5), 2.0)
    ref_a, ref_b = ones @ b.asnumpy().astype(np.float64).T, a.asnumpy().astype(np.float64).T @ ones
    for i, (ref, got) in enumerate(((ref_a, ga), (ref_b, gb))):
        dx = one_row(t, entry="Functional.matmul.0.backward", role="grad_input", arg_index=i)
        assert_rel(dx["norm"], norm64(ref), 1e-6, f"dx {i} by hand")
        assert_rel(dx["norm"], norm64(got), 1e-6, f"dx {i} from ms.grad")
    dy = one_row(t, entry="Functional.matmul.0.backward", role="grad_output")
    assert dy["min"] == dy["max"] == 2.0 and dy["shape"] == (3, 5)


def test_constant_float_input_inside_grad(tmp_path):
    """A float tensor that does not require grad (a constant of the closure) as an op input:
    the call's dx of the other input and its dy are recorded, and nothing fails."""
    x = ms.Tensor(np.linspace(-1, 1, 6).astype(np.float32))
    c = ms.Tensor(np.arange(6, dtype=np.float32))

    grad = ms.grad(lambda x: ops.mul(x, c).sum())
    t, dbg, gx = capture(tmp_path, lambda: grad(x), level="api")
    assert dbg.failures == 0
    dx = one_row(t, entry="Functional.mul.0.backward", role="grad_input", arg_index=0)
    assert_rel(dx["norm"], norm64(c), 1e-6, "dx of x is c")
    assert_rel(norm64(gx), norm64(c), 1e-6, "ms.grad")
    assert one_row(t, entry="Functional.mul.0.backward", role="grad_output")["shape"] == (6,)


def test_forward_only_capture(tmp_path):
    """Inference (no gradient function anywhere): forward records only, and no failures."""
    model = make_model()
    model.set_train(False)
    x, _ = as_tensors(make_batches(1)[0])
    t, dbg, logits = capture(tmp_path, lambda: model(x), model=model)
    assert dbg.failures == 0
    assert not np.any(t["direction"] == "backward")
    out = one_row(t, entry="Cell.GPT.forward.0", role="output")
    assert_rel(out["norm"], norm64(logits), 1e-6, "logits")
    assert len(rows_where(t, kind="api", api="dense", role="output")) == len(DENSE_PATHS)


# ----------------------------------------------------------------------------- optimizer
class PlainSGD(nn.Optimizer):
    """An optimizer whose update runs as PyNative Python (MindSpore's own are @jit)."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(lr, params)
        self.lr_value = lr

    def construct(self, gradients):
        for p, g in zip(self._parameters, gradients):
            ops.assign(p, ops.sub(p, ops.mul(g, self.lr_value)))
        return True


def _optimizer_dump(tmp_path, optimizer_factory, **settings):
    model = make_model()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), **settings)
    run_steps(dbg, model, optimizer_factory(model), make_batches(2), 2)
    return precdbg.open_dump(str(tmp_path / "dump")), dbg.failures


@pytest.mark.parametrize("include", [False, True])
def test_optimizer_phase_of_a_pynative_optimizer(tmp_path, include):
    dump, failures = _optimizer_dump(tmp_path, lambda m: PlainSGD(m.trainable_params()),
                                     include_optimizer=include)
    assert dump.steps == [0, 1]
    for step in dump.steps:
        t = dump.records(step=step)
        opt = t.select(t["phase"] == "optimizer")
        if not include:
            assert len(opt) == 0
            assert set(np.unique(t["phase"])) == {"setup", "forward", "backward"}
            continue
        assert set(np.unique(opt["kind"])) == {"api"}
        assert {"sub", "mul"} <= set(np.unique(opt["op"]))
        n_params = len(rows_where(t, kind="param"))
        assert len(rows_where(t, kind="api", api="sub", phase="optimizer", role="output")) == \
            n_params
        # the model's own calls keep their phases
        assert set(np.unique(t.select(t["op"] == "linear")["phase"])) <= {"forward",
                                                                          "backward"}
    assert failures == 0


def test_optimizer_phase_of_mindspore_optimizers(tmp_path):
    """nn.AdamWeightDecay (its construct is @jit, so no API inside it runs through a hook):
    with include_optimizer the optimizer step must still appear in phase "optimizer"; without
    it, nothing of it does."""
    off, failures = _optimizer_dump(tmp_path / "off", make_optimizer)
    assert failures == 0
    t = off.records(step=0)
    assert not np.any(t["phase"] == "optimizer")
    on, failures = _optimizer_dump(tmp_path / "on", make_optimizer, include_optimizer=True)
    assert failures == 0
    t = on.records(step=0)
    assert np.any(t["phase"] == "optimizer"), \
        "include_optimizer=True recorded nothing of the nn.AdamWeightDecay step"


# ----------------------------------------------------------------------------- levels, modes
def test_level_api_has_no_cell_records(tmp_path):
    dump, dbg = dump_once(tmp_path, level="api")
    assert dbg.failures == 0
    t = dump.records(step=0)
    assert set(np.unique(t["kind"])) == {"api", "param", "param_grad"}
    assert not np.any(np.char.startswith(t["entry"], "Cell."))
    assert rows_where(t, entry="Functional.dense.0.backward", role="grad_input", arg_index=1)


def test_level_module_has_no_api_records(tmp_path):
    dump, dbg = dump_once(tmp_path, level="module")
    assert dbg.failures == 0
    t = dump.records(step=0)
    assert set(np.unique(t["kind"])) == {"module", "param", "param_grad"}
    assert len(rows_where(t, kind="param_grad")) == len(rows_where(t, kind="param"))
    assert rows_where(t, entry="Cell.blocks.0.attn.qkv.Dense.backward.0", role="grad_input")


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_level_aliases(tmp_path, level):
    dump, dbg = dump_once(tmp_path, level=level)
    assert dbg.failures == 0
    kinds = set(np.unique(dump.records(step=0)["kind"]))
    assert ("module" in kinds) is (level == "L0") and ("api" in kinds) is (level == "L1")


def test_data_mode_forward_has_no_backward_records(tmp_path):
    dump, dbg = dump_once(tmp_path, data_mode=["forward"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    assert not np.any(t["direction"] == "backward")
    assert not np.any(t["kind"] == "param_grad")
    calls = t.select(t["direction"] != "none")
    assert set(np.unique(calls["role"])) == {"input", "output"}
    assert {"api", "module"} <= set(np.unique(calls["kind"]))


def test_data_mode_backward_output(tmp_path):
    dump, dbg = dump_once(tmp_path, data_mode=["backward", "output"])
    assert dbg.failures == 0
    calls = dump.records(step=0)
    calls = calls.select(calls["direction"] != "none")
    assert set(np.unique(calls["role"])) == {"grad_input", "param_grad"}


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
def test_statistics_equal_numpy(tmp_path, dtype):
    rng = np.random.default_rng(7)
    values = (rng.standard_normal((37, 29)) * 3 + 0.5)
    values = values.astype(dtype) if dtype != "int32" else np.round(values * 10).astype(dtype)
    x = ms.Tensor(values)
    t, dbg, out = capture(tmp_path, lambda: ops.neg(x), level="api", data_mode=["forward"])
    assert dbg.failures == 0
    ref = values.astype(np.float64)
    r = one_row(t, entry="Functional.neg.0.forward", role="input")
    assert r["dtype"] == dtype and r["shape"] == (37, 29) and r["numel"] == 37 * 29
    assert r["min"] == ref.min() and r["max"] == ref.max()
    assert abs(r["mean"] - ref.mean()) <= 1e-9 * np.abs(ref).mean()
    assert_rel(r["norm"], float(np.sqrt((ref * ref).sum())), 1e-9, "norm")
    assert r["nan_count"] == 0 and r["inf_count"] == 0
    o = one_row(t, entry="Functional.neg.0.forward", role="output")
    assert o["min"] == -ref.max() and o["max"] == -ref.min()


def test_statistics_of_a_large_tensor(tmp_path):
    """Bigger than the one-pass host limit: statistics still equal numpy's in float64."""
    rng = np.random.default_rng(1)
    values = (rng.standard_normal(700_000) + 3).astype(np.float32)
    x = ms.Tensor(values)
    t, dbg, _ = capture(tmp_path, lambda: ops.neg(x), level="api", data_mode=["forward"])
    assert dbg.failures == 0
    ref = values.astype(np.float64)
    r = one_row(t, entry="Functional.neg.0.forward", role="input")
    assert r["min"] == ref.min() and r["max"] == ref.max()
    assert_rel(r["mean"], ref.mean(), 1e-6, "mean")
    assert_rel(r["norm"], float(np.sqrt((ref * ref).sum())), 1e-6, "norm")


def test_statistics_count_nan_and_inf(tmp_path):
    values = np.array([1.0, np.nan, -np.inf, 4.0, np.inf, np.nan, -2.0], dtype=np.float32)
    x = ms.Tensor(values)
    t, dbg, _ = capture(tmp_path, lambda: ops.abs(x), level="api", data_mode=["forward"])
    assert dbg.failures == 0
    r = one_row(t, entry="Functional.abs.0.forward", role="input")
    assert r["nan_count"] == 2 and r["inf_count"] == 2
    assert r["min"] == -math.inf and r["max"] == math.inf
    assert r["mean"] == pytest.approx(1.0)         # the finite values: (1 + 4 - 2) / 3


def test_debugger_does_not_change_numerics():
    """Same seed, same batches: losses and parameters are bitwise identical with and without
    the debugger (statistics and tensor tasks)."""
    import tempfile
    batches = make_batches(2)
    reference = make_model()
    ref_losses = run_steps(None, reference, make_optimizer(reference), batches, 2)
    ref_params = {p.name: p.asnumpy().copy() for p in reference.get_parameters()}
    for task in ("statistics", "tensor"):
        with tempfile.TemporaryDirectory() as path:
            model = make_model()
            dbg = PrecisionDebugger(task=task, dump_path=path)
            losses = run_steps(dbg, model, make_optimizer(model), batches, 2)
            assert dbg.failures == 0
            assert losses == ref_losses, task
            for p in model.get_parameters():
                np.testing.assert_array_equal(p.asnumpy(), ref_params[p.name],
                                              err_msg=f"{task} {p.name}")


# ----------------------------------------------------------------------------- tensor task
def test_tensor_task_stores_values(tmp_path):
    rng = np.random.default_rng(3)
    a = ms.Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    b = ms.Tensor(rng.standard_normal((4, 5)).astype(np.float32))
    keep = {}

    def f(a, b):
        keep["y"] = ops.matmul(a, b)
        keep["tanh"] = ops.tanh(keep["y"])
        return keep["tanh"].sum()

    grad = ms.grad(f, grad_position=(0, 1))
    t, dbg, (ga, gb) = capture(tmp_path, lambda: grad(a, b), level="api", task="tensor")
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    y = keep["y"].asnumpy()
    np.testing.assert_array_equal(dump.tensor("Functional.matmul.0.forward.input.0", step=0),
                                  a.asnumpy())
    np.testing.assert_array_equal(dump.tensor("Functional.matmul.0.forward.input.1", step=0),
                                  b.asnumpy())
    np.testing.assert_array_equal(dump.tensor("Functional.matmul.0.forward.output.0", step=0), y)
    th = keep["tanh"].asnumpy()
    stored = dump.tensor("Functional.tanh.0.forward.output.0", step=0)
    assert stored.dtype == np.float32 and stored.shape == (3, 5)
    np.testing.assert_array_equal(stored, th)
    np.testing.assert_array_equal(dump.tensor("Functional.tanh.0.forward.input.0", step=0), y)
    # d tanh(y) / dy = 1 - tanh(y)^2 (from MindSpore's own float32 tanh)
    dy = dump.tensor("Functional.matmul.0.backward.grad_output.0", step=0)
    np.testing.assert_allclose(dy, 1 - th.astype(np.float64) ** 2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dump.tensor("Functional.matmul.0.backward.grad_input.0",
                                              step=0), ga.asnumpy())
    np.testing.assert_array_equal(dump.tensor("Functional.matmul.0.backward.grad_input.1",
                                              step=0), gb.asnumpy())
    # every tensor record of the step has its data, of its own shape and dtype
    for i in np.nonzero(~np.char.startswith(t["dtype"], "py."))[0]:
        arr = dump.tensor_at(t, int(i))
        assert arr.shape == t.row(int(i))["shape"] and str(arr.dtype) == t.row(int(i))["dtype"]


def test_tensor_task_on_the_gpt(tmp_path):
    model = make_model()
    grads_ref = grads_of(make_model(), make_batches(1)[0])[1]
    dump, dbg = dump_once(tmp_path, model=model, task="tensor")
    assert dbg.failures == 0
    for name in ("lm_head.weight", "blocks.0.ln_1.gamma", "wte.embedding_table"):
        np.testing.assert_allclose(dump.tensor(f"Param.{name}.grad", step=0), grads_ref[name],
                                   rtol=1e-5, atol=1e-7, err_msg=name)
    inv = dump.tensor("Param.blocks.1.mlp.fc.weight", step=0)     # taken at start()
    assert inv.shape == (256, 64) and inv.dtype == np.float32
    np.testing.assert_array_equal(inv, make_model().blocks[1].mlp.fc.weight.asnumpy())


class _Keep(nn.Cell):
    def construct(self, x):
        return x * 1.0


class _KeepThenWrite(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.keep = _Keep()

    def construct(self, x):
        y = self.keep(x)
        y[0] = 100.0              # __setitem__: in place, into what the sub-cell returned
        return y + 0.0


@pytest.mark.parametrize("level", ["module", "mix"])
def test_a_later_in_place_write_does_not_change_a_record(tmp_path, level):
    """Statistics are of the value at capture, also where MindSpore's are read after the op ran
    (deferred to the batch, to spare the pipeline a wait per record)."""
    model = _KeepThenWrite()
    x = ms.Tensor(np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3))
    t, dbg, _ = capture(tmp_path, lambda: model(x), model=model, level=level)
    assert dbg.failures == 0
    kept = one_row(t, entry="Cell.keep._Keep.forward.0", role="output")
    assert kept["max"] == 6.0 and kept["min"] == 1.0, kept
    whole = one_row(t, entry="Cell._KeepThenWrite.forward.0", role="output")
    assert whole["max"] == 100.0, whole


class _Scale(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.ones((4,), np.float32)), name="w")

    def construct(self, x):
        return x * self.w


def _write_outside_captured_apis(how: str, model: _Scale, y: ms.Tensor) -> None:
    seven = ms.Tensor(np.full((4,), 7.0, np.float32))
    if how == "set_data":                   # a manual update of a parameter
        model.w.set_data(seven)
    elif how == "assign_value":
        y.assign_value(seven)
    else:                                   # through the host view asnumpy() hands out
        y.asnumpy()[:] = 7.0


@pytest.mark.parametrize("level", ["module", "mix"])
@pytest.mark.parametrize("how", ["set_data", "assign_value", "asnumpy_view"])
def test_writes_outside_captured_apis_keep_earlier_records_and_start_a_new_version(
        tmp_path, level, how):
    """`Parameter.set_data`, `Tensor.assign_value` and a write into `asnumpy()`'s view are no
    captured API: a record taken before keeps the value at its capture (the parameter's
    inventory, an API's output), and a record of the same object after the write has the new
    value, not the statistics of the old one. (The tensors written are an API's output: a
    hooked cell's output does not share its memory with asnumpy()'s view, in MindSpore itself.)"""
    model = _Scale()
    x = ms.Tensor(np.full((4,), 2.0, np.float32))

    def body():
        y = model(x) if how == "set_data" else x * 1.0            # 2.0
        written = model.w if how == "set_data" else y
        _write_outside_captured_apis(how, model, y)
        return model(written)                           # reads the written tensor again

    t, dbg, _ = capture(tmp_path, body, model=model, level=level)
    assert dbg.failures == 0
    inventory = one_row(t, entry="Param.w", role="param")
    assert (inventory["min"], inventory["max"]) == (1.0, 1.0), inventory
    if how == "set_data":
        first = one_row(t, entry="Cell._Scale.forward.0", role="output")
        assert (first["min"], first["max"]) == (2.0, 2.0), first
    elif level == "mix":
        first = one_row(t, op="mul", kind="api", role="output", call_index=0)
        assert (first["min"], first["max"]) == (2.0, 2.0), first
    index = 1 if how == "set_data" else 0
    second = one_row(t, entry=f"Cell._Scale.forward.{index}", role="input")
    if how == "set_data":      # the second call reads the new weight: 7 * 7
        out = one_row(t, entry="Cell._Scale.forward.1", role="output")
        assert out["max"] == 49.0, out
    else:                      # the second call's input is the written tensor
        assert (second["min"], second["max"]) == (7.0, 7.0), second


class _Two(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.ln = nn.LayerNorm((8,))
        self.head = nn.Dense(8, 4)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.head(self.ln(self.fc(x)))


@pytest.mark.parametrize("target", ["with_loss", "train_one_step"])
def test_training_wrappers_are_named_through(tmp_path, target):
    """`start(WithLossCell(net))` and `start(TrainOneStepCell(...))` name the network as
    `start(net)` does: the same module paths and parameter names, no optimizer state in the
    inventory, and the two dumps compare as a match."""
    from precdbg.compare import compare_dumps

    def dump(name: str, which: str) -> str:
        ms.set_seed(0)
        net = _Two()
        opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
        with_loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True,
                                                                          reduction="mean"))
        train = nn.TrainOneStepCell(with_loss, opt)
        train.set_train()
        start = {"net": net, "with_loss": with_loss, "train_one_step": train}[which]
        x = ms.Tensor(np.random.RandomState(0).randn(4, 8).astype(np.float32))
        y = ms.Tensor(np.array([0, 1, 2, 3], np.int32))
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
        dbg.start(start)
        train(x, y)
        dbg.stop()
        dbg.step()
        assert dbg.close() and not dbg.failures
        return str(tmp_path / name)

    plain, wrapped = dump("net", "net"), dump("wrapped", target)
    tables = [precdbg.open_dump(p).records(step=0) for p in (plain, wrapped)]
    for kind in ("module", "param"):
        a, b = (sorted(set(t["module"][t["kind"] == kind].tolist())) for t in tables)
        assert a == b, (kind, a, b)
    params = sorted(set(tables[1]["entry"][tables[1]["kind"] == "param"].tolist()))
    assert not [p for p in params if "moment" in p or "global_step" in p or "optimizer" in p]
    result = compare_dumps(plain, wrapped)
    assert result["verdict"] == "match", result["first_divergence"]


def test_a_cell_compiled_with_ms_jit_is_said_and_not_compared_inside(tmp_path, caplog):
    """A cell whose construct runs compiled (ms.jit) records its own call and nothing inside
    it: precdbg says so once and in the manifest, and a compare with a run that saw inside
    it is a match with a note, not a structural difference."""
    import logging

    from precdbg.compare import compare_dumps

    class Outer(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _Two()
            self.out = nn.Dense(4, 2)

        def construct(self, x: ms.Tensor) -> ms.Tensor:
            return self.out(ms.ops.tanh(self.inner(x)))

    def dump(name: str, jit: bool) -> str:
        ms.set_seed(0)
        net = Outer()
        if jit:
            net.inner.construct = ms.jit(net.inner.construct)
        x = ms.Tensor(np.random.RandomState(0).randn(4, 8).astype(np.float32))
        grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, net.trainable_params())
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
        dbg.start(net)
        grad_fn(x)
        dbg.stop()
        dbg.step()
        assert dbg.close() and not dbg.failures
        return str(tmp_path / name)

    with caplog.at_level(logging.WARNING, logger="precdbg"):
        plain, jitted = dump("plain", False), dump("jitted", True)
    said = [r.getMessage() for r in caplog.records if "ms.jit" in r.getMessage()]
    assert len(said) == 1 and "inner" in said[0], said
    opened = precdbg.open_dump(jitted)
    assert opened.run["manifest"]["unobserved"] == {"compiler": "ms.jit", "modules": ["inner"]}
    table = opened.records(step=0)
    calls = np.isin(table["kind"], ["api", "module"])
    assert not (calls & np.char.startswith(table["module"], "inner.")).any()
    assert (table["entry"] == "Param.inner.fc.weight.grad").any()     # its parameters' dw
    assert (table["entry"] == "Cell.inner._Two.forward.0").any()
    result = compare_dumps(plain, jitted)
    assert result["verdict"] == "match", result["first_divergence"]
    assert any("inner" in n["text"] for n in result["notes"]
               if n["code"] == "unobserved_modules"), result["notes"]


def test_complex_tensors_and_generic_primitives(tmp_path):
    """A complex tensor is recorded by its magnitude (as PyTorch's are), with no numpy warning
    on the user's stderr; a generic Primitive("...") is named by its own name."""
    import warnings

    def body():
        z = ms.Tensor(np.array([3 + 4j, 0 + 1j], np.complex64))
        z * z
        ms.ops.Primitive("typeof")(z)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table, _, _ = capture(tmp_path, body, level="api")
    row = one_row(table, entry="Tensor.__mul__.0.forward", role="input", arg_index=0)
    assert_rel(row["norm"], math.sqrt(26.0), what="the magnitude's norm")
    assert (row["min"], row["max"]) == (1.0, 5.0)
    assert any(e.startswith("Primitive.typeof.") for e in table["entry"].tolist()), \
        sorted(set(table["entry"].tolist()))


def test_calls_of_other_threads_are_not_recorded(tmp_path):
    """The patched APIs are process-wide; only the thread that started the capture is
    recorded (a data or logging thread's ops are not the step's), as in PyTorch."""
    import threading

    def body():
        a = ms.Tensor(np.ones((4,), np.float32))
        worker = threading.Thread(target=lambda: ms.ops.mul(a, 3.0))
        worker.start()
        worker.join()
        ms.ops.mul(a, 2.0)

    table, _, _ = capture(tmp_path, body, level="api")
    muls = sorted(set(e for e in table["entry"].tolist() if ".mul." in e))
    assert muls == ["Functional.mul.0.forward"], muls
    scalar = one_row(table, entry="Functional.mul.0.forward", role="input", arg_index=1)
    assert scalar["mean"] == 2.0


def test_an_amp_loss_scalers_scale_is_in_the_manifest(tmp_path):
    """`ms.amp.DynamicLossScaler`: the scale the gradients were unscaled by is the manifest's
    `loss_scale` (PyTorch's GradScaler's is), so check compares the runs' scales; stop() puts
    the scaler's own `unscale` back."""
    import json
    from mindspore import nn
    original = ms.amp.DynamicLossScaler.unscale
    net = nn.Dense(4, 1)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    scaler = ms.amp.DynamicLossScaler(1024.0, 2, 1000)
    grad_fn = ms.value_and_grad(lambda x: scaler.scale(net(x).sum()), None, opt.parameters)

    def step() -> None:
        _, grads = grad_fn(ms.Tensor(np.ones((2, 4), np.float32)))
        opt(scaler.unscale(grads))
    _, dbg, _ = capture(tmp_path, step, model=net, level="mix")
    assert dbg.failures == 0
    assert ms.amp.DynamicLossScaler.unscale is original
    with open(tmp_path / "dump" / "run.json", encoding="utf-8") as handle:
        manifest = json.load(handle)["manifest"]
    assert manifest["loss_scale"] == {"class": "DynamicLossScaler", "scale": 1024.0}


def test_a_learning_rate_list_or_schedule_is_in_the_manifest(tmp_path):
    """A learning rate given as a list, or a LearningRateSchedule, was recorded as its class
    name (`_IteratorLearningRate()`, `CosineDecayLR()`): check could not name a schedule set
    up otherwise. The list's rates and the schedule's settings are recorded, and check names
    a differing max_lr."""
    import json

    from precdbg.check import check_dumps

    def dump(name: str, learning_rate) -> str:
        net = nn.Dense(4, 1)
        opt = nn.Momentum(net.trainable_params(), learning_rate=learning_rate, momentum=0.9)
        grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)

        def step() -> None:
            _, grads = grad_fn(ms.Tensor(np.ones((2, 4), np.float32)))
            opt(grads)
        _, dbg, _ = capture(tmp_path / name, step, model=net, level="mix")
        assert dbg.failures == 0
        return str(tmp_path / name / "dump")

    def hyper(path: str):
        with open(os.path.join(path, "run.json"), encoding="utf-8") as handle:
            groups = json.load(handle)["manifest"]["optimizers"][0]["param_groups"]
        return groups[0]["hyper"]["learning_rate"]
    assert hyper(dump("list", [0.5, 0.25, 0.125])) == [0.5, 0.25, 0.125]
    cosine = dump("cosine", nn.CosineDecayLR(1e-4, 1e-2, 10))
    assert hyper(cosine) == {"schedule": "CosineDecayLR", "min_lr": 1e-4, "max_lr": 1e-2,
                             "decay_steps": 10, "math_pi": math.pi,
                             "delta": pytest.approx(0.00495)}
    other = dump("cosine_2e-2", nn.CosineDecayLR(1e-4, 2e-2, 10))
    found = [f["message"] for f in check_dumps(cosine, other)["findings"]
             if f["kind"] == "optimizer"]
    assert found and "optimizer lr differs" in found[0] and "'max_lr': 0.02" in found[0], found


def test_optimizer_names_a_replaced_cells_parameters_by_their_path(tmp_path):
    """A cell replaced after the model was built (`model.blocks[1].mlp = MLP(cfg)`) keeps the
    parameter names MindSpore gave it where it was made (`mlp.fc.weight`); the manifest's
    optimizer lists them by their path in the model, as the inventory names them, so a check
    of two such runs finds no parameter that one optimizer updates and the other does not."""
    model = make_model()
    model.blocks[1].mlp = gpt_ms.MLP(tiny_config())
    assert model.blocks[1].mlp.fc.weight.name == "mlp.fc.weight"       # MindSpore's own name
    dump, dbg = dump_once(tmp_path, model=model)
    assert dbg.failures == 0
    optimizers = dump.run["manifest"]["optimizers"]
    assert dump.optimizers(0, 0) == optimizers      # the step's own: the one window's settings
    names = set(optimizers[0]["param_groups"][0]["params"])
    t = dump.records(step=0)
    inventory = set(t["alias"][(t["kind"] == "param") & (t["role"] == "param")].tolist())
    assert "blocks.1.mlp.fc.weight" in names and names == inventory, names ^ inventory
