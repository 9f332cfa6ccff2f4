"""What the PyTorch adapter captures: API and module records, real dy/dx, dw, the parameter
inventory, phases, levels, filters, execution order and statistics."""
from __future__ import annotations

import collections
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import precdbg
from precdbg_pt import PrecisionDebugger

from conftest import assert_rel, one_row, rows_where
from torch_support import (LINEAR_PATHS, dump_once, loss_of, make_batch_list, make_model,
                           make_optimizer, norm64, run_steps)

FORWARD_ONLY_INPUT_MODULES = {"", "wte", "wpe"}   # their inputs are token ids: no dx


# ----------------------------------------------------------------------------- shared dump
@pytest.fixture(scope="module")
def gpt_dump(tmp_path_factory):
    """One captured forward + backward of the tiny GPT (no optimizer step), with the true
    gradients kept for comparison."""
    path = str(tmp_path_factory.mktemp("gpt_mix"))
    model = make_model()
    x, y = make_batch_list(1)[0]
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=path)
    dbg.start(model)
    loss = loss_of(model, x, y)
    loss.backward()
    dbg.stop()
    dbg.step()
    assert dbg.close()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    modules = {path: type(m).__name__ for path, m in model.named_modules()}
    dump = precdbg.open_dump(path)
    return dict(dump=dump, table=dump.records(step=0), grads=grads, params=params,
                buffers=buffers, modules=modules, failures=dbg.failures, loss=float(loss.detach()))


def test_no_failures_and_one_step(gpt_dump):
    assert gpt_dump["failures"] == 0
    dump = gpt_dump["dump"]
    assert dump.steps == [0] and dump.ranks == [0] and dump.partial == []
    assert dump.run["framework"] == "pytorch"
    assert dump.run["framework_version"] == torch.__version__


def test_api_records_carry_module_paths(gpt_dump):
    t = gpt_dump["table"]
    linear = rows_where(t, kind="api", op="linear", direction="forward", role="output")
    assert [r["module"] for r in sorted(linear, key=lambda r: r["order"])] == LINEAR_PATHS
    first = one_row(t, entry="Functional.linear.0.forward", role="output")
    assert first["module"] == "blocks.0.attn.qkv"
    assert first["prefix"] == "Functional" and first["api"] == "linear"
    assert first["shape"] == (2, 16, 192)
    # softmax is called directly in Attention.forward: owned by the attention module
    soft = rows_where(t, kind="api", op="softmax", direction="forward", role="output")
    assert [r["module"] for r in soft] == ["blocks.0.attn", "blocks.1.attn"]
    # the embedding add happens in GPT.forward itself: the root, written ''
    assert one_row(t, entry="Tensor.add.0.forward", role="output")["module"] == ""
    assert one_row(t, entry="Torch.matmul.1.forward", role="output")["module"] == "blocks.0.attn"
    gelu = one_row(t, entry="Functional.gelu.0.forward", role="output")
    assert gelu["module"] == "blocks.0.mlp.act" and gelu["op"] == "gelu"


def test_api_forward_inputs_and_outputs(gpt_dump):
    t = gpt_dump["table"]
    rows = rows_where(t, entry="Functional.linear.0.forward")
    inputs = sorted((r for r in rows if r["role"] == "input"), key=lambda r: r["arg_index"])
    assert [r["shape"] for r in inputs] == [(2, 16, 64), (192, 64), (192,)]
    assert all(r["phase"] == "forward" and r["direction"] == "forward" for r in rows)
    # the weight input is the parameter itself: same statistics as the inventory
    inv = one_row(t, entry="Param.blocks.0.attn.qkv.weight")
    assert inputs[1]["norm"] == inv["norm"]
    assert inputs[1]["tensor_id"] == inv["tensor_id"]


def test_every_module_has_forward_and_backward(gpt_dump):
    t = gpt_dump["table"]
    for path, cls in gpt_dump["modules"].items():
        if cls == "ModuleList":
            continue          # a container: never called
        fwd = f"Module.{path}.{cls}.forward.0" if path else f"Module.{cls}.forward.0"
        roles = {(r["role"], r["arg_index"]) for r in rows_where(t, entry=fwd)}
        assert roles == {("input", 0), ("output", 0)}, fwd
        row = rows_where(t, entry=fwd)[0]
        assert row["kind"] == "module" and row["module"] == path and row["api"] == cls
        if cls == "Dropout":
            continue          # p=0 on CPU returns its input: an identity has no backward
        bwd = f"Module.{path}.{cls}.backward.0" if path else f"Module.{cls}.backward.0"
        roles = {r["role"] for r in rows_where(t, entry=bwd)}
        expected = {"grad_output"} if path in FORWARD_ONLY_INPUT_MODULES else \
            {"grad_output", "grad_input"}
        assert roles == expected, bwd
        for r in rows_where(t, entry=bwd):
            assert r["direction"] == "backward" and r["phase"] == "backward"


def test_module_backward_shapes_match_forward(gpt_dump):
    t = gpt_dump["table"]
    for path in LINEAR_PATHS:
        fwd_in = one_row(t, entry=f"Module.{path}.Linear.forward.0", role="input")
        fwd_out = one_row(t, entry=f"Module.{path}.Linear.forward.0", role="output")
        dx = one_row(t, entry=f"Module.{path}.Linear.backward.0", role="grad_input")
        dy = one_row(t, entry=f"Module.{path}.Linear.backward.0", role="grad_output")
        assert dx["shape"] == fwd_in["shape"]
        assert dy["shape"] == fwd_out["shape"]


def test_api_backward_has_dy_and_dx_per_input(gpt_dump):
    t = gpt_dump["table"]
    for k in range(len(LINEAR_PATHS)):
        entry = f"Functional.linear.{k}"
        fwd_inputs = {r["arg_index"]: r["shape"] for r in rows_where(t, entry=entry + ".forward",
                                                                     role="input")}
        fwd_out = one_row(t, entry=entry + ".forward", role="output")
        dy = one_row(t, entry=entry + ".backward", role="grad_output")
        assert dy["shape"] == fwd_out["shape"]
        dx = {r["arg_index"]: r["shape"] for r in rows_where(t, entry=entry + ".backward",
                                                             role="grad_input")}
        assert dx == fwd_inputs, entry        # one dx per input (x, weight, bias where present)
        bwd = rows_where(t, entry=entry + ".backward")
        assert {r["module"] for r in bwd} == {LINEAR_PATHS[k]}
        assert {r["order"] for r in bwd} == {fwd_out["order"]}


def test_api_dw_equals_param_grad(gpt_dump):
    t = gpt_dump["table"]
    grads = gpt_dump["grads"]
    for k, path in enumerate(LINEAR_PATHS):
        dw = one_row(t, entry=f"Functional.linear.{k}.backward", role="grad_input", arg_index=1)
        assert_rel(dw["norm"], norm64(grads[path + ".weight"]), 1e-6, path)


def test_dx_matches_true_gradients_numerically(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(5, 4, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start()
    y = x * 2
    z = F.linear(y, w)
    z.sum().backward()
    dbg.stop()
    assert dbg.close()
    assert dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    dl_dy = torch.ones(3, 5, dtype=torch.float64) @ w.detach().double()   # d sum(y w^T) / dy
    dl_dw = torch.ones(3, 5, dtype=torch.float64).T @ (x.detach().double() * 2)
    lin_dx = one_row(t, entry="Functional.linear.0.backward", role="grad_input", arg_index=0)
    lin_dw = one_row(t, entry="Functional.linear.0.backward", role="grad_input", arg_index=1)
    assert_rel(lin_dx["norm"], norm64(dl_dy), 1e-6, "dL/dy")
    assert_rel(lin_dw["norm"], norm64(w.grad), 1e-6, "dL/dw")
    assert_rel(lin_dw["norm"], norm64(dl_dw), 1e-6, "dL/dw by hand")
    assert lin_dx["min"] == pytest.approx(float(dl_dy.min()), rel=1e-6)
    assert lin_dx["max"] == pytest.approx(float(dl_dy.max()), rel=1e-6)
    dy = one_row(t, entry="Functional.linear.0.backward", role="grad_output")
    assert dy["shape"] == (3, 5) and dy["min"] == 1.0 and dy["max"] == 1.0
    assert_rel(dy["norm"], math.sqrt(15), 1e-6, "dy")
    mul_dx = one_row(t, entry="Tensor.mul.0.backward", role="grad_input", arg_index=0)
    assert_rel(mul_dx["norm"], norm64(x.grad), 1e-6, "Tensor.mul dx")
    assert_rel(mul_dx["mean"], float(x.grad.double().mean()), 1e-6, "Tensor.mul dx mean")
    mul_dy = one_row(t, entry="Tensor.mul.0.backward", role="grad_output")
    assert_rel(mul_dy["norm"], norm64(dl_dy), 1e-6, "Tensor.mul dy")


def test_dx_for_each_argument_when_an_input_is_passed_twice(tmp_path):
    x = torch.randn(6, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api")
    with dbg.capture():
        y = torch.mul(x, x)               # both arguments are x: dx = 2x, reported per input
        y.sum().backward()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    dx = rows_where(t, entry="Torch.mul.0.backward", role="grad_input")
    assert sorted(r["arg_index"] for r in dx) == [0, 1]
    for r in dx:                          # each position receives x (d(a*b)/da = b = x)
        assert_rel(r["norm"], norm64(x), 1e-6, f"dx of argument {r['arg_index']}")
    assert_rel(norm64(x.grad), 2 * norm64(x), 1e-6, "x.grad")


# ----------------------------------------------------------------------------- dw
def test_dw_for_every_trainable_parameter(gpt_dump):
    t = gpt_dump["table"]
    dw = rows_where(t, kind="param_grad")
    by_name = {r["api"]: r for r in dw}
    assert len(by_name) == len(dw), "one dw record per parameter per backward"
    assert set(by_name) == set(gpt_dump["grads"])
    for name, grad in gpt_dump["grads"].items():
        r = by_name[name]
        assert r["entry"] == f"Param.{name}.grad"
        assert r["role"] == "param_grad" and r["direction"] == "backward"
        assert r["phase"] == "backward"
        assert r["shape"] == tuple(grad.shape)
        assert_rel(r["norm"], norm64(grad), 1e-6, name)
        assert r["min"] == pytest.approx(float(grad.min()), rel=1e-6, abs=1e-12)
        assert r["max"] == pytest.approx(float(grad.max()), rel=1e-6, abs=1e-12)


def test_dw_of_a_shared_module_is_summed_over_uses(tmp_path):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    torch.manual_seed(0)
    model = Twice()
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with dbg.capture(model):
        model(torch.randn(3, 4)).pow(2).sum().backward()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert len(rows_where(t, kind="param_grad", api="lin.weight")) == 1
    r = one_row(t, entry="Param.lin.weight.grad")
    assert_rel(r["norm"], norm64(model.lin.weight.grad), 1e-6, "shared dw")
    # the module was called twice: two forward and two backward entries
    assert rows_where(t, entry="Module.lin.Linear.forward.1", role="output")
    assert rows_where(t, entry="Module.lin.Linear.backward.1", role="grad_output")


def test_dw_is_per_backward_pass(tmp_path):
    """Two backward passes in one captured step (gradient accumulation): each dw record is the
    gradient of its own pass, not the accumulated .grad."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 2)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="module")
    with dbg.capture(lin):
        lin(a).sum().backward()
        first = lin.weight.grad.clone()
        lin(b).pow(2).sum().backward()
    assert dbg.close() and dbg.failures == 0
    second = lin.weight.grad - first
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    dw = sorted(rows_where(t, kind="param_grad", api="weight"), key=lambda r: r["seq"])
    assert [r["entry"] for r in dw] == ["Param.weight.grad", "Param.weight.grad.1"]
    assert_rel(dw[0]["norm"], norm64(first), 1e-6, "first pass")
    assert_rel(dw[1]["norm"], norm64(second), 1e-5, "second pass")


# ----------------------------------------------------------------------------- inventory
def test_inventory_lists_every_parameter_and_buffer(gpt_dump):
    t = gpt_dump["table"]
    inv = rows_where(t, kind="param")
    params = {r["api"]: r for r in inv if r["role"] == "param"}
    buffers = {r["api"]: r for r in inv if r["role"] == "buffer"}
    assert set(params) == set(gpt_dump["params"])
    assert set(buffers) == set(gpt_dump["buffers"])
    assert len(inv) == len(params) + len(buffers)
    for name, value in gpt_dump["params"].items():
        r = params[name]
        assert r["entry"] == f"Param.{name}"
        assert r["direction"] == "none" and r["phase"] == "setup"
        assert r["trainable"] is True
        assert r["shape"] == tuple(value.shape) and r["dtype"] == "float32"
        assert_rel(r["norm"], norm64(value), 1e-6, name)
    for name, value in gpt_dump["buffers"].items():
        r = buffers[name]
        assert r["entry"] == f"Buffer.{name}"
        assert r["trainable"] is False
        assert r["dtype"] == "bool" and r["shape"] == tuple(value.shape)


def test_inventory_follows_a_module_that_overrides_named_parameters(tmp_path):
    """The inventory reads a module's own parameters through its `named_parameters` where
    the class overrides it (a library hiding or renaming parameters), through torch's dict
    only where it does not."""
    class Hiding(torch.nn.Linear):
        def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
            for name, value in super().named_parameters(prefix, recurse, remove_duplicate):
                if not name.endswith("bias"):
                    yield name, value

    model = torch.nn.Sequential(Hiding(4, 4), torch.nn.Linear(4, 2))
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path / "d"))
    dbg.start(model)
    model(torch.randn(3, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.failures == 0
    table = precdbg.open_dump(str(tmp_path / "d")).records(step=0)
    assert {r["api"] for r in rows_where(table, kind="param", role="param")} == \
        {"0.weight", "1.weight", "1.bias"}


def test_frozen_parameter_is_not_trainable_and_has_no_dw(tmp_path):
    model = make_model()
    model.blocks[0].attn.qkv.weight.requires_grad_(False)
    model.ln_f.bias.requires_grad_(False)
    dump, dbg = dump_once(tmp_path, model=model)
    assert dbg.failures == 0
    t = dump.records(step=0)
    frozen = {"blocks.0.attn.qkv.weight", "ln_f.bias"}
    for name, p in model.named_parameters():
        inv = one_row(t, entry=f"Param.{name}")
        assert inv["trainable"] is (name not in frozen), name
        grads = rows_where(t, entry=f"Param.{name}.grad")
        assert len(grads) == (0 if name in frozen else 1), name
    # no dx is reported for the frozen weight either
    dw = rows_where(t, entry="Functional.linear.0.backward", role="grad_input")
    assert sorted(r["arg_index"] for r in dw) == [0, 2]


# ----------------------------------------------------------------------------- phases
def test_optimizer_phase_absent_by_default(tmp_path):
    dump, dbg = dump_once(tmp_path, steps=2)
    assert dbg.failures == 0
    for step in dump.steps:
        t = dump.records(step=step)
        assert not np.any(t["phase"] == "optimizer")
        assert set(np.unique(t["phase"])) == {"setup", "forward", "backward"}


def test_optimizer_phase_with_include_optimizer(tmp_path):
    dump, dbg = dump_once(tmp_path, steps=2, include_optimizer=True)
    assert dbg.failures == 0
    for step in dump.steps:
        t = dump.records(step=step)
        opt = t.select(t["phase"] == "optimizer")
        assert len(opt) > 0
        assert set(np.unique(opt["kind"])) == {"api"}
        # the model's own calls are still forward/backward
        linear = t.select(t["op"] == "linear")
        assert set(np.unique(linear["phase"])) <= {"forward", "backward"}
        # the optimizer runs after the backward pass
        assert opt["seq"].min() > t.select(t["direction"] == "backward")["seq"].max()


# ----------------------------------------------------------------------------- levels
def test_level_api_has_no_module_records(tmp_path):
    dump, dbg = dump_once(tmp_path, level="api")
    t = dump.records(step=0)
    assert dbg.failures == 0
    kinds = set(np.unique(t["kind"]))
    assert kinds == {"api", "param", "param_grad"}
    assert not np.any(np.char.startswith(t["entry"], "Module."))
    # module paths are still attributed to API records
    assert one_row(t, entry="Functional.linear.0.forward", role="output")["module"] == \
        "blocks.0.attn.qkv"


def test_level_module_has_no_api_records(tmp_path):
    dump, dbg = dump_once(tmp_path, level="L0")
    t = dump.records(step=0)
    assert dbg.failures == 0
    kinds = set(np.unique(t["kind"]))
    assert kinds == {"module", "param", "param_grad"}
    assert rows_where(t, entry="Module.blocks.1.mlp.fc.Linear.backward.0", role="grad_input")


# ----------------------------------------------------------------------------- filters
def test_step_filter_dumps_only_selected_steps(tmp_path):
    dump, dbg = dump_once(tmp_path, steps=3, step=[1])
    assert dump.steps == [1]
    assert sorted(os.listdir(tmp_path / "dump")) == ["run.json", "step1"]
    assert len(dump.records(step=1)) > 0
    with pytest.raises(precdbg.DumpError):
        dump.records(step=0)


def test_step_range_filter(tmp_path):
    dump, _ = dump_once(tmp_path, steps=4, step=["1-2"])
    assert dump.steps == [1, 2]
    a, b = dump.records(step=1), dump.records(step=2)
    assert list(a["entry"]) == list(b["entry"])           # same calls, different values
    assert not np.array_equal(a["norm"], b["norm"])


def test_scope_filter(tmp_path):
    dump, dbg = dump_once(tmp_path, scope=["blocks.0.*"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    calls = t.select(np.isin(t["kind"], ["api", "module"]))
    assert len(calls) > 0
    modules = set(np.unique(calls["module"]))
    assert all(m.startswith("blocks.0.") for m in modules), modules
    assert {"blocks.0.attn.qkv", "blocks.0.attn", "blocks.0.mlp.fc"} <= modules
    assert {r for r in np.unique(calls["direction"])} == {"forward", "backward"}
    params = t.select(np.isin(t["kind"], ["param", "param_grad"]))
    assert len(params) > 0
    assert all(a.startswith("blocks.0.") for a in params["api"])


def test_a_scope_that_matches_nothing_is_said_once(tmp_path, caplog):
    """A scope written for another model (`layers.*` where the model has `blocks`) keeps no
    record: each step is written empty, and one warning names the scope and the model's
    modules. A scope that matches says nothing."""
    caplog.set_level("WARNING", logger="precdbg")
    dump, dbg = dump_once(tmp_path, steps=2, scope=["layers.*"])
    assert dbg.failures == 0 and dump.steps == [0, 1]
    assert len(dump.records(step=0)) == 0
    said = [r.getMessage() for r in caplog.records if "recorded nothing" in r.getMessage()]
    assert len(said) == 1, said
    assert "scope: ['layers.*']" in said[0] and "blocks.0" in said[0], said
    caplog.clear()
    dump_once(tmp_path / "matching", scope=["blocks.0.*"])
    assert not [r for r in caplog.records if "recorded nothing" in r.getMessage()]


def test_scope_by_api_name(tmp_path):
    dump, _ = dump_once(tmp_path, scope=["Functional.softmax.*"], level="api")
    t = dump.records(step=0)
    calls = t.select(t["kind"] == "api")
    assert set(np.unique(calls["entry"])) == {"Functional.softmax.0.forward",
                                             "Functional.softmax.1.forward",
                                             "Functional.softmax.0.backward",
                                             "Functional.softmax.1.backward"}


def test_list_filter(tmp_path):
    dump, dbg = dump_once(tmp_path, list=["linear"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    calls = t.select(np.isin(t["kind"], ["api", "module"]))
    assert set(np.unique(calls["op"])) == {"linear"}
    api = calls.select(calls["kind"] == "api")
    forward = set(np.unique(api.select(api["direction"] == "forward")["entry"]))
    assert forward == {f"Functional.linear.{k}.forward" for k in range(len(LINEAR_PATHS))}
    assert len(api.select(api["direction"] == "backward")) > 0


def test_scope_range_filter(gpt_dump, tmp_path):
    first, last = "Module.blocks.0.attn.Attention.forward.0", "Functional.linear.1.forward"
    dump, dbg = dump_once(tmp_path, scope_range=[first, last])
    assert dbg.failures == 0
    t = dump.records(step=0)
    full = gpt_dump["table"]
    lo = one_row(full, entry=first, role="input")["order"]
    hi = one_row(full, entry=last, role="output")["order"]
    fwd = full.select((full["direction"] == "forward") & (full["order"] >= lo)
                      & (full["order"] <= hi))
    expected = set(np.unique(fwd["entry"]))
    got = t.select((t["direction"] == "forward") & np.isin(t["kind"], ["api", "module"]))
    assert set(np.unique(got["entry"])) == expected
    assert "Module.blocks.0.attn.qkv.Linear.forward.0" in expected
    assert "Functional.linear.2.forward" not in expected


def test_data_mode_forward(tmp_path):
    dump, _ = dump_once(tmp_path, data_mode=["forward"])
    t = dump.records(step=0)
    assert len(t) > 0
    assert not np.any(t["direction"] == "backward")
    assert not np.any(t["kind"] == "param_grad")
    assert set(np.unique(t["direction"])) == {"forward", "none"}


def test_data_mode_backward(tmp_path):
    dump, _ = dump_once(tmp_path, data_mode=["backward"])
    t = dump.records(step=0)
    calls = t.select(np.isin(t["kind"], ["api", "module", "param_grad"]))
    assert set(np.unique(calls["direction"])) == {"backward"}
    assert np.any(calls["kind"] == "param_grad")


def test_data_mode_input(tmp_path):
    dump, _ = dump_once(tmp_path, data_mode=["input"])
    t = dump.records(step=0)
    calls = t.select(t["direction"] != "none")
    assert set(np.unique(calls["role"])) == {"input", "grad_output"}


def test_data_mode_output(tmp_path):
    dump, _ = dump_once(tmp_path, data_mode=["output"])
    t = dump.records(step=0)
    calls = t.select(t["direction"] != "none")
    assert set(np.unique(calls["role"])) == {"output", "grad_input", "param_grad"}


# ----------------------------------------------------------------------------- order
def test_forward_order_follows_the_model(gpt_dump):
    t = gpt_dump["table"]
    fwd = t.select(t["direction"] == "forward")
    order = {}
    for r in fwd.rows():
        order.setdefault(r["entry"], r["order"])
    # every record of one forward entry has the same order; distinct entries distinct orders
    per_entry = collections.defaultdict(set)
    for r in fwd.rows():
        per_entry[r["entry"]].add(r["order"])
    assert all(len(v) == 1 for v in per_entry.values())
    assert len(set(order.values())) == len(order)
    chain = ["Module.GPT.forward.0", "Module.wte.Embedding.forward.0",
             "Functional.embedding.0.forward", "Module.wpe.Embedding.forward.0",
             "Tensor.add.0.forward", "Module.blocks.0.Block.forward.0",
             "Module.blocks.0.ln_1.LayerNorm.forward.0", "Module.blocks.0.attn.Attention.forward.0",
             "Module.blocks.0.attn.qkv.Linear.forward.0", "Functional.linear.0.forward",
             "Functional.softmax.0.forward", "Functional.linear.1.forward",
             "Module.blocks.0.mlp.MLP.forward.0", "Functional.gelu.0.forward",
             "Module.blocks.1.Block.forward.0", "Functional.softmax.1.forward",
             "Module.ln_f.LayerNorm.forward.0", "Module.lm_head.Linear.forward.0",
             "Functional.linear.8.forward", "Functional.cross_entropy.0.forward"]
    orders = [order[e] for e in chain]
    assert orders == sorted(orders), list(zip(chain, orders))
    # call indices of one API increase with execution order
    linear = [order[f"Functional.linear.{k}.forward"] for k in range(len(LINEAR_PATHS))]
    assert linear == sorted(linear)


def test_backward_runs_in_reverse(gpt_dump):
    t = gpt_dump["table"]
    seq = {}
    for r in t.select(t["direction"] == "backward").rows():
        seq.setdefault(r["entry"], r["seq"])
    linear = [seq[f"Functional.linear.{k}.backward"] for k in range(len(LINEAR_PATHS))]
    assert linear == sorted(linear, reverse=True)
    assert seq["Functional.cross_entropy.0.backward"] < seq["Module.lm_head.Linear.backward.0"]
    assert seq["Module.blocks.1.Block.backward.0"] < seq["Module.blocks.0.Block.backward.0"]
    # seq is the emission order: unique over the step
    assert len(np.unique(t["seq"])) == len(t)


# ----------------------------------------------------------------------------- statistics
def _stats_of(tmp_path, x: torch.Tensor):
    op = torch.clone if x.dtype is torch.bool else torch.neg     # no neg of a bool
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api")
    with dbg.capture():
        op(x)
    assert dbg.close()
    assert dbg.failures == 0
    return one_row(precdbg.open_dump(str(tmp_path)).records(step=0),
                   entry=f"Torch.{op.__name__}.0.forward", role="input")


@pytest.mark.parametrize("dtype,numel", [(torch.float32, 1000), (torch.float32, (1 << 21) + 123),
                                         (torch.float64, 777), (torch.bfloat16, 4096),
                                         (torch.float16, 513), (torch.int64, 100),
                                         (torch.int32, 5000), (torch.int8, 77), (torch.uint8, 300),
                                         (torch.bool, 4096), (torch.complex64, 129)])
def test_statistics_match_numpy(tmp_path, dtype, numel):
    """Floats of every width, integers and bools (as float64), complex (its magnitude)."""
    rng = np.random.RandomState(7)
    values = rng.randn(numel) * 3.0 + 1.25
    if dtype in (torch.int64, torch.int32):
        values = np.round(values * 10)
    elif dtype in (torch.int8, torch.uint8):
        values = np.round(np.abs(values) * 10) if dtype is torch.uint8 else np.round(values * 10)
    elif dtype is torch.bool:
        values = values > 1.25
    elif dtype is torch.complex64:
        values = values + 1j * rng.randn(numel)
    x = torch.tensor(values).to(dtype)
    if dtype is torch.complex64:
        ref = x.abs().double().numpy()
    else:
        ref = x.double().numpy() if dtype is not torch.bfloat16 else x.float().double().numpy()
    r = _stats_of(tmp_path, x)
    assert r["dtype"] == str(dtype).replace("torch.", "")
    assert r["shape"] == (numel,) and r["numel"] == numel
    assert r["min"] == ref.min() and r["max"] == ref.max()
    assert_rel(r["mean"], float(ref.mean()), 1e-6, "mean")
    assert_rel(r["norm"], float(np.sqrt(np.sum(ref * ref))), 1e-6, "norm")
    assert r["nan_count"] == 0 and r["inf_count"] == 0


def test_statistics_of_a_known_tensor(tmp_path):
    r = _stats_of(tmp_path, torch.tensor([[3.0, -4.0], [0.5, 0.5]]))
    assert (r["min"], r["max"]) == (-4.0, 3.0)
    assert r["mean"] == pytest.approx(0.0, abs=1e-12)
    assert_rel(r["norm"], math.sqrt(9 + 16 + 0.25 + 0.25), 1e-12, "norm")
    assert r["shape"] == (2, 2)


def test_nan_and_inf_counts(tmp_path):
    values = [1.0, float("nan"), 2.0, float("inf"), float("nan"), -float("inf"), -3.0,
              float("nan"), float("inf")]
    r = _stats_of(tmp_path, torch.tensor(values))
    assert r["nan_count"] == 3
    assert r["inf_count"] == 3
    finite = np.array([1.0, 2.0, -3.0])
    assert r["mean"] == pytest.approx(finite.mean())          # over the finite values
    assert r["norm"] == pytest.approx(np.linalg.norm(finite))


def test_inf_only_min_max(tmp_path):
    r = _stats_of(tmp_path, torch.tensor([1.0, float("inf"), -float("inf"), 2.0]))
    assert r["nan_count"] == 0 and r["inf_count"] == 2
    assert r["min"] == -math.inf and r["max"] == math.inf
    assert r["mean"] == pytest.approx(1.5)
    assert r["norm"] == pytest.approx(math.sqrt(5))


@pytest.mark.parametrize("dtype,value", [(torch.float32, 3e30), (torch.float32, 2e19),
                                         (torch.bfloat16, 1e20)])
def test_large_finite_values_get_a_finite_norm(tmp_path, dtype, value):
    """Finite values whose squares overflow float32 must still get a finite, accurate norm
    (statistics are float64), and no NaN/Inf count."""
    x = torch.full((1000,), value, dtype=dtype)
    r = _stats_of(tmp_path, x)
    assert r["nan_count"] == 0 and r["inf_count"] == 0
    v = float(x[0].double())
    assert r["min"] == v and r["max"] == v
    assert_rel(r["mean"], v, 1e-6, "mean")
    assert_rel(r["norm"], v * math.sqrt(1000), 1e-6, "norm")


@pytest.mark.parametrize("view", ["transpose", "slice", "step", "expand", "permute3d", "offset"])
def test_statistics_of_views_match_numpy(tmp_path, view):
    torch.manual_seed(3)
    base = torch.randn(40, 30)
    x = {"transpose": lambda: base.t(),
         "slice": lambda: base[5:17, 3:29],
         "step": lambda: base[::3, ::2],
         "expand": lambda: base[:1].expand(7, 30),
         "permute3d": lambda: base.view(4, 10, 30).permute(2, 0, 1),
         "offset": lambda: base.view(-1)[17:917]}[view]()
    ref = x.double().contiguous().numpy()
    r = _stats_of(tmp_path, x)
    assert r["shape"] == tuple(x.shape)
    assert r["min"] == ref.min() and r["max"] == ref.max()
    # the mean of zero-centred data: error relative to the mean magnitude
    assert abs(r["mean"] - ref.mean()) <= 1e-6 * np.abs(ref).mean()
    assert_rel(r["norm"], float(np.sqrt(np.sum(ref * ref))), 1e-6, "norm")


def test_view_layout_names_the_same_elements_however_often_asked():
    """The canonical layout of a view (remembered per shape and strides) is the same for every
    view over exactly the same elements in the same row-major order (the statistics' pos_mean
    depends on the order), and differs for other elements or another order (a permutation),
    the first time and from the table alike."""
    from precdbg_pt import statistics
    base = torch.randn(6, 10, 4)
    same = [base, base.view(60, 4), base.view(240), base.unsqueeze(1),
            base.view(60, 4).t().t()]
    other = [base[:, ::2], base[1:], base[:, :, :2], base.view(240)[::3],
             base.permute(2, 0, 1), base.transpose(0, 1)]
    for _ in range(2):                       # computed, then answered from the table
        layouts = {statistics.element_layout(v) for v in same}
        assert len(layouts) == 1, layouts
        assert all(statistics.element_layout(v) not in layouts for v in other)
        assert len({statistics.element_layout(v) for v in other}) == len(other)
    # the same elements in the same row-major order, another shape: one layout
    assert statistics.element_layout(base.permute(2, 0, 1)) == \
        statistics.element_layout(base.view(60, 4).t())
    statistics._LAYOUTS.clear()
    # rows of 4 (row-major step 1), 30 of them (memory step 8, row-major step 4)
    assert statistics.element_layout(base[:, ::2]) == ((4, 1, 1), (30, 8, 4))


def test_debugger_does_not_change_numerics(batches):
    """Same seed, same batches: losses and final parameters are bitwise identical with and
    without the debugger (statistics and tensor tasks)."""
    import tempfile
    reference = make_model()
    ref_losses = run_steps(None, reference, make_optimizer(reference), batches, 3)
    for task in ("statistics", "tensor"):
        with tempfile.TemporaryDirectory() as path:
            model = make_model()
            dbg = PrecisionDebugger(task=task, dump_path=path, include_optimizer=True)
            losses = run_steps(dbg, model, make_optimizer(model), batches, 3)
            assert dbg.failures == 0
            assert [float(l) for l in losses] == [float(l) for l in ref_losses], task
            for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
                assert torch.equal(a, b), (task, name)


def test_non_tensor_arguments_are_recorded(tmp_path):
    x = torch.ones(3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api")
    with dbg.capture():
        torch.add(x, 2.5)
        x.masked_fill(torch.tensor([True, False, True]), float("-inf"))
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    scalar = one_row(t, entry="Torch.add.0.forward", role="input", arg_index=1)
    assert scalar["dtype"] == "py.float" and scalar["text"] == "2.5"
    assert scalar["min"] == scalar["max"] == scalar["mean"] == 2.5
    assert scalar["data_offset"] == -1
    fill = one_row(t, entry="Tensor.masked_fill.0.forward", role="input", arg_index=2)
    assert fill["dtype"] == "py.float" and fill["min"] == -math.inf
    # a non-finite scalar is counted like a non-finite tensor element
    assert fill["inf_count"] == 1 and fill["nan_count"] == 0


def test_classes_called_through_the_mode_are_not_api_calls(tmp_path):
    """torch.device(...) reaches the capture mode (device contexts route it there); Megatron's
    activation checkpoint calls it in its forward only when it recomputes, so a record of it
    made runs with and without recompute differ in structure (found on a GPU)."""
    x = torch.ones(3)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api")
    with dbg.capture():
        device = torch.device("cpu")
        with torch.autocast("cpu", enabled=False):     # HF rotary embeddings do this per call
            torch.add(x, 1).to(device)
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    apis = set(t["api"].astype(str))
    assert "add" in apis and not {"device", "autocast"} & apis, apis


def test_in_place_op_records_values_before_and_after(tmp_path):
    x = torch.arange(5, dtype=torch.float32)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api", task="tensor")
    with dbg.capture():
        x.add_(10)
        x.mul_(2)
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    t = dump.records(step=0)
    add_in = one_row(t, entry="Tensor.add_.0.forward", role="input", arg_index=0)
    add_out = one_row(t, entry="Tensor.add_.0.forward", role="output")
    mul_out = one_row(t, entry="Tensor.mul_.0.forward", role="output")
    assert (add_in["min"], add_in["max"]) == (0.0, 4.0)
    assert (add_out["min"], add_out["max"]) == (10.0, 14.0)
    assert (mul_out["min"], mul_out["max"]) == (20.0, 28.0)
    assert add_out["op"] == "add"
    np.testing.assert_array_equal(dump.tensor("Tensor.add_.0.forward.input.0", step=0),
                                  np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(dump.tensor("Tensor.mul_.0.forward.output.0", step=0),
                                  (np.arange(5, dtype=np.float32) + 10) * 2)


def test_empty_tensor(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api", task="tensor")
    with dbg.capture():
        torch.neg(torch.empty(0, 3))
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    r = one_row(dump.records(step=0), entry="Torch.neg.0.forward", role="input")
    assert r["numel"] == 0 and r["shape"] == (0, 3)
    assert r["nan_count"] == 0 and r["inf_count"] == 0
    assert dump.tensor("Torch.neg.0.forward.input.0", step=0).shape == (0, 3)


def test_list_of_models(tmp_path):
    torch.manual_seed(0)
    enc, dec = nn.Linear(4, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 2))
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with dbg.capture([enc, dec]):
        dec(enc(torch.randn(2, 4))).sum().backward()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert one_row(t, entry="Functional.linear.0.forward", role="output")["module"] == "0"
    assert one_row(t, entry="Functional.linear.1.forward", role="output")["module"] == "1.1"
    assert rows_where(t, entry="Module.1.0.ReLU.forward.0", role="output")
    assert {r["api"] for r in rows_where(t, kind="param_grad")} == \
        {"0.weight", "0.bias", "1.1.weight", "1.1.bias"}


@pytest.mark.parametrize("modes,roles,directions", [
    (["forward", "input"], {"input"}, {"forward"}),
    (["backward", "output"], {"grad_input", "param_grad"}, {"backward"}),
    (["backward", "input"], {"grad_output"}, {"backward"}),
])
def test_data_mode_combinations(tmp_path, modes, roles, directions):
    dump, _ = dump_once(tmp_path, data_mode=modes)
    t = dump.records(step=0)
    calls = t.select(t["direction"] != "none")
    assert set(np.unique(calls["role"])) == roles
    assert set(np.unique(calls["direction"])) == directions


def test_two_capture_windows_in_one_step(tmp_path):
    """start/stop twice before step(): both windows are kept (a second part file), call
    indices continue, and everything reads back."""
    model = make_model()
    x, y = make_batch_list(1)[0]
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="tensor")
    with dbg.capture(model):
        loss_of(model, x, y).backward()
    with dbg.capture(model):
        loss_of(model, x, y).backward()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0]
    t = dump.records(step=0)
    n_linear = len(LINEAR_PATHS)
    for k in range(2 * n_linear):
        assert len(rows_where(t, entry=f"Functional.linear.{k}.forward", role="output")) == 1
    assert len(rows_where(t, entry="Module.GPT.forward.1", role="output")) == 1
    a = dump.tensor("Functional.linear.0.forward.output.0", step=0)
    b = dump.tensor(f"Functional.linear.{n_linear}.forward.output.0", step=0)
    np.testing.assert_array_equal(a, b)            # same model, same batch, no update between
    i = int(np.nonzero(t["entry"] == f"Functional.linear.{n_linear}.forward")[0][-1])
    assert dump.tensor_at(t, i).shape == t.row(i)["shape"]


def test_records_of_all_steps(tmp_path):
    dump, _ = dump_once(tmp_path, steps=3, step=[0, 2])
    every = dump.records()
    assert len(every) == len(dump.records(step=0)) + len(dump.records(step=2))
    assert set(np.unique(every["step"])) == {0, 2}


def test_a_second_debugger_into_the_same_dump_path(tmp_path):
    """A second debugger of the same process dumping into one path must not mix the two in
    one file nor overwrite the first: it counts on from the first one's steps, so its step is
    step 1, whole (a rerun in another process is refused by the constructor: test_lifecycle)."""
    first, _ = dump_once(tmp_path)
    n = len(first.records(step=0))
    first_file = first.files(step=0)[0].path
    first.close()
    with open(first_file, "rb") as handle:
        before = handle.read()
    second, dbg = dump_once(tmp_path, seed=None)
    assert second.steps == [0, 1]
    assert [sf.part for sf in second.files(step=1)] == [0]
    t = second.records(step=1)
    keys = list(zip(t["entry"], t["role"], t["arg_index"]))
    assert len(keys) == len(set(keys)) == n, "records of two debuggers mixed in one file"
    with open(first_file, "rb") as handle:
        assert handle.read() == before


# ----------------------------------------------------------------------------- dy / dx exactness
def _api_dump(tmp_path, fn, level="api"):
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level=level)
    with dbg.capture():
        fn()
    assert dbg.close() and dbg.failures == 0
    return precdbg.open_dump(str(tmp_path)).records(step=0)


def test_dy_is_summed_over_every_use_of_an_output(tmp_path):
    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(5, 4, requires_grad=True)
    keep = {}

    def run():
        y = F.linear(x, w)
        y.register_hook(lambda g: keep.__setitem__("dy", g.clone()))
        (y * y + y).sum().backward()
    t = _api_dump(tmp_path, run)
    dy = one_row(t, entry="Functional.linear.0.backward", role="grad_output")
    y = (x @ w.detach().T).double()
    assert_rel(dy["norm"], norm64(2 * y + 1), 1e-6, "dy")
    assert_rel(dy["norm"], norm64(keep["dy"]), 1e-6, "dy via a tensor hook")


def test_dx_is_only_this_calls_share(tmp_path):
    """x feeds the linear and another term: the linear's dx excludes the other term."""
    torch.manual_seed(0)
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4)

    def run():
        (F.linear(x, w).sum() + (x * 3).sum()).backward()
    t = _api_dump(tmp_path, run)
    dx = one_row(t, entry="Functional.linear.0.backward", role="grad_input", arg_index=0)
    assert_rel(dx["norm"], norm64(torch.ones(3, 5, dtype=torch.float64) @ w.double()), 1e-6,
               "linear dx")
    assert_rel(norm64(x.grad), norm64(torch.ones(3, 5) @ w + 3), 1e-6, "x.grad")
    assert one_row(t, entry="Tensor.mul.0.backward", role="grad_input")["norm"] == \
        pytest.approx(3 * math.sqrt(12), rel=1e-6)


def test_dx_of_composite_ops(tmp_path):
    """Ops made of several autograd nodes: dx per input is the true gradient of each input."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8, requires_grad=True) for _ in range(3))
    logits = torch.randn(6, 7, requires_grad=True)
    target = torch.randint(0, 7, (6,))

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.pow(2).sum().backward()
        F.cross_entropy(logits, target).backward()
    t = _api_dump(tmp_path, run)
    for i, leaf in enumerate((q, k, v)):
        dx = one_row(t, entry="Functional.scaled_dot_product_attention.0.backward",
                     role="grad_input", arg_index=i)
        assert_rel(dx["norm"], norm64(leaf.grad), 1e-5, f"sdpa dx {i}")
    dx = one_row(t, entry="Functional.cross_entropy.0.backward", role="grad_input", arg_index=0)
    assert_rel(dx["norm"], norm64(logits.grad), 1e-6, "cross_entropy dx")


def test_module_dx_sums_every_path_inside_the_module(tmp_path):
    """A block uses its input twice (the residual and ln_1): its dx is the input's gradient."""
    model = make_model()
    x, y = make_batch_list(1)[0]
    keep = {}

    def grab(mod, args):
        args[0].register_hook(lambda g: keep.__setitem__("dx", g.clone()))
    model.blocks[1].register_forward_pre_hook(grab)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with dbg.capture(model):
        loss_of(model, x, y).backward()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    dx = one_row(t, entry="Module.blocks.1.Block.backward.0", role="grad_input")
    assert_rel(dx["norm"], norm64(keep["dx"]), 1e-6, "block dx")
    dy = one_row(t, entry="Module.blocks.0.Block.backward.0", role="grad_output")
    assert_rel(dy["norm"], norm64(keep["dx"]), 1e-6, "previous block dy")


def test_capture_under_no_grad(tmp_path):
    model = make_model()
    x, _ = make_batch_list(1)[0]
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    model.eval()
    with dbg.capture(model), torch.no_grad():
        logits = model(x)
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert not np.any(t["direction"] == "backward")
    out = one_row(t, entry="Module.GPT.forward.0", role="output")
    assert_rel(out["norm"], norm64(logits), 1e-6, "logits")


def test_backward_with_retain_graph_twice(tmp_path):
    torch.manual_seed(0)
    x, w = torch.randn(3, 4), torch.randn(5, 4, requires_grad=True)

    def run():
        loss = F.linear(x, w).pow(2).sum()
        loss.backward(retain_graph=True)
        loss.backward()
    t = _api_dump(tmp_path, run)
    dw = rows_where(t, entry="Functional.linear.0.backward", role="grad_input", arg_index=1)
    assert len(dw) == 2                                   # one per backward pass
    assert dw[0]["norm"] == pytest.approx(dw[1]["norm"], rel=1e-6)
    assert_rel(dw[0]["norm"], norm64(w.grad) / 2, 1e-6, "each pass's dw")


def test_scope_module_path_keeps_the_module_and_everything_in_it(tmp_path):
    """As config_examples/scoped.yaml: "blocks.1" is block 1 and all inside; "blocks.*.attn"
    every block's attention."""
    dump, dbg = dump_once(tmp_path, scope=["blocks.1", "blocks.*.attn"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    calls = t.select(np.isin(t["kind"], ["api", "module"]))
    modules = set(np.unique(calls["module"]))
    inside = lambda m: m == "blocks.1" or m.startswith("blocks.1.") or \
        m == "blocks.0.attn" or m.startswith("blocks.0.attn.")
    assert all(inside(m) for m in modules), modules
    assert {"blocks.1", "blocks.1.mlp.fc", "blocks.0.attn", "blocks.0.attn.qkv"} <= modules
    for entry in ("Module.blocks.1.Block.forward.0", "Module.blocks.1.Block.backward.0",
                  "Module.blocks.0.attn.Attention.backward.0", "Tensor.add.4.forward"):
        assert np.any(t["entry"] == entry), entry
    params = set(t.select(np.isin(t["kind"], ["param", "param_grad"]))["api"])
    assert params and all(inside(p.rpartition(".")[0]) for p in params), params
    assert "blocks.1.ln_1.weight" in params and "blocks.0.attn.qkv.bias" in params


def test_scope_range_of_two_blocks(gpt_dump, tmp_path):
    """As msprobe ends a range: [block 0, block 1] keeps both blocks whole (the range closes
    when its last module returns) and nothing after them; the parameters kept are those of
    the modules in the range."""
    dump, dbg = dump_once(tmp_path, scope_range=["Module.blocks.0.Block.forward.0",
                                                 "Module.blocks.1.Block.forward.0"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    calls = t.select(np.isin(t["kind"], ["api", "module"]))
    modules = set(np.unique(calls["module"]))
    assert all(m.split(".")[:2] in (["blocks", "0"], ["blocks", "1"]) for m in modules), modules
    full = gpt_dump["table"]
    blocks = full.select(np.char.startswith(full["module"], "blocks.0")
                         | np.char.startswith(full["module"], "blocks.1"))
    assert set(np.unique(blocks.select(np.isin(blocks["kind"], ["api", "module"]))["entry"])) \
        == set(np.unique(calls["entry"]))
    params = set(np.unique(t.select(np.isin(t["kind"], ["param", "param_grad"]))["module"]))
    assert params and all(m.split(".")[:2] in (["blocks", "0"], ["blocks", "1"])
                          for m in params), params


def test_list_and_backward_names_keep_only_what_they_name(tmp_path):
    """msprobe's `list` names calls: an API name keeps no parameter (with task tensor every
    weight and gradient would be stored in full), a module entry keeps that module's; a
    backward name (`Functional.linear.1.backward`, as msprobe's guides write it) stands for
    its call."""
    dump, dbg = dump_once(tmp_path / "api", task="tensor", level="api",
                          api_list=["Functional.gelu", "Functional.linear.1.backward"])
    t = dump.records(step=0)
    assert set(np.unique(t["kind"])) == {"api"}, set(np.unique(t["entry"]))
    assert {e.rsplit(".", 1)[0] for e in np.unique(t["entry"])} == \
        {"Functional.gelu.0", "Functional.gelu.1", "Functional.linear.1"}
    dump, dbg = dump_once(tmp_path / "op", level="api", api_list=["Tensor.__add__"])
    assert {e.rsplit(".", 2)[0] for e in np.unique(dump.records(step=0)["entry"])} == \
        {"Tensor.add"}                    # msprobe's name of `x + y`, as torch hands it over
    dump, dbg = dump_once(tmp_path / "module",
                          api_list=["Module.blocks.1.mlp.MLP.forward.0"])
    t = dump.records(step=0)
    params = set(np.unique(t.select(np.isin(t["kind"], ["param", "param_grad"]))["module"]))
    assert params and all(m.startswith("blocks.1.mlp") for m in params), params


def test_forward_only_dump_never_reads_the_autograd_graph(tmp_path, monkeypatch):
    """data_mode forward: no graph walk, no backward hook, no closure per call."""
    from precdbg_pt import adapter as pt_adapter
    walked = collections.Counter()
    for name in ("watch_backward", "input_targets"):
        original = getattr(pt_adapter, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            walked[_name] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(pt_adapter, name, spy)
    dump, dbg = dump_once(tmp_path / "fwd", data_mode=["forward"])
    assert dbg.failures == 0 and len(dump.records(step=0)) > 50
    assert not walked, walked
    dump_once(tmp_path / "all")
    assert walked["watch_backward"] > 10 and walked["input_targets"] > 10


def test_bytes_passed_through_thousands_of_calls_keep_their_producer(tmp_path):
    """`contiguous()` of a contiguous tensor returns the same bytes: each call is one more holder
    of the producing record's memory. Two thousand of them in one step once built a chain of
    liveness checks that blew the recursion limit (every later record failed)."""
    class Passes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            for _ in range(2000):
                y = y.contiguous()
            return y * 2

    folder = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=folder, level="api", step=[0])
    model = Passes()
    dbg.start(model)
    model(torch.randn(4, 8)).sum().backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    table = precdbg.open_dump(folder).records(step=0)
    names = {int(s): e for s, e in zip(table["seq"], table["entry"])}
    mul_input = one_row(table, entry="Tensor.mul.0.forward", role="input", arg_index=0)
    assert names[int(mul_input["producer"])] == "Functional.linear.0.forward"
    last = one_row(table, entry="Tensor.contiguous.1999.forward", role="input")
    assert names[int(last["producer"])] == "Functional.linear.0.forward"


def test_each_empty_tensor_keeps_its_own_producer(tmp_path):
    """Empty tensors have no unique data address (often 0): two of them alive at once are still
    two tensors, each read with the producer that made it."""
    class Empties(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = torch.zeros(0), torch.ones(0)
            return torch.cat([a, x.flatten()]) + torch.cat([b, x.flatten()])

    folder = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=folder, level="api", step=[0])
    model = Empties()
    dbg.start(model)
    model(torch.randn(2, 3))
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    table = precdbg.open_dump(folder).records(step=0)
    names = {int(s): e for s, e in zip(table["seq"], table["entry"])}
    for cat, factory in (("Torch.cat.0.forward", "Torch.zeros.0.forward"),
                         ("Torch.cat.1.forward", "Torch.ones.0.forward")):
        empty = one_row(table, entry=cat, role="input", arg_key="0.0")
        assert names[int(empty["producer"])] == factory, (cat, names.get(int(empty["producer"])))


def _helper_that_adds(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b)


def test_call_stacks_name_the_user_code(tmp_path):
    """Each API record holds the id of its caller's stack: the user's frames (file:line in
    function), never precdbg's or torch's; one call site in a loop is one stack, two call
    sites two, and a helper called from two places gives two stacks."""
    model = nn.Linear(4, 4)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    dbg.start(model)
    for _ in range(3):
        torch.mul(a, b)                                   # one site, three calls
    torch.sub(a, b)
    _helper_that_adds(a, b)
    _helper_that_adds(b, a)
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    t = dump.records(step=0)
    texts = dump.stacks(0)
    here = os.path.abspath(__file__)

    def stacks_of(api):
        rows = [r for r in rows_where(t, kind="api", api=api, direction="forward", role="output")]
        return [texts[r["stack_id"]] for r in sorted(rows, key=lambda r: r["order"])]
    mul, sub, add = stacks_of("mul"), stacks_of("sub"), stacks_of("add")
    assert len(mul) == 3 and len(set(mul)) == 1 and len(add) == 2
    assert len({mul[0], sub[0], add[0], add[1]}) == 4
    first = mul[0].splitlines()[0]
    assert first.startswith(here + ":") and first.endswith(" in test_call_stacks_name_the_user_code")
    assert add[0].splitlines()[0].endswith(" in _helper_that_adds")
    assert add[0].splitlines()[1].endswith(" in test_call_stacks_name_the_user_code")
    internal = (os.path.dirname(torch.__file__), os.path.dirname(precdbg.__file__))
    assert not any(line.startswith(internal) for text in texts for line in text.splitlines())


@pytest.mark.parametrize("write", ["data_mul", "foreach_mul", "detach_fill", "no_grad_mul"])
def test_an_in_place_write_through_another_object_is_a_new_state(tmp_path, write):
    """`p.data.mul_(2)` (custom optimizers, EMA, Megatron's param copies) writes p's memory
    through another object whose version counter is its own: p._version does not move. A
    later read of p still has the new values, and names the write as its producer; the
    inventory taken before keeps the old ones."""
    model = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    dbg.start(model)
    if write == "data_mul":
        model.weight.data.mul_(2.0)
    elif write == "foreach_mul":                 # the second tensor of the list is the weight
        torch._foreach_mul_([torch.ones(3), model.weight.data], 2.0)
    elif write == "detach_fill":
        model.weight.detach().fill_(2.0)
    else:
        with torch.no_grad():
            model.weight.mul_(2.0)
    model(torch.ones(2, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    inventory = one_row(t, entry="Param.weight", role="param")
    assert (inventory["min"], inventory["max"]) == (1.0, 1.0)
    weight = one_row(t, entry="Functional.linear.0.forward", role="input", arg_index=1)
    assert (weight["min"], weight["max"]) == (2.0, 2.0), weight
    api = {"detach_fill": "fill_", "foreach_mul": "_foreach_mul_"}.get(write, "mul_")
    # _foreach_mul_ returns nothing: what it wrote are its outputs, the weight the second
    writer = rows_where(t, kind="api", direction="forward", api=api, role="output",
                        **({"arg_index": 1} if write == "foreach_mul" else {}))
    assert len(writer) == 1 and weight["producer"] == writer[0]["seq"], (weight, writer)
    out = one_row(t, entry="Functional.linear.0.forward", role="output")
    assert (out["min"], out["max"]) == (8.0, 8.0)


def _precdbg_closures_during_a_step(tmp_path, blocks):
    """Functions defined in precdbg's packages that are alive between the backward and stop()
    of a dumped step of a `blocks`-deep MLP."""
    import gc
    roots = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                  for m in (precdbg, __import__("precdbg_pt")))
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU())
                            for _ in range(blocks)])
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix", step=[0])
    dbg.start(model)
    (model(torch.randn(2, 8)) * 0.5).sum().backward()
    alive = sum(1 for o in gc.get_objects() if type(o).__name__ == "function"
                and o.__code__.co_filename.startswith(roots) and o.__closure__)
    dbg.stop()
    dbg.step()
    dbg.close()
    assert dbg.failures == 0
    return alive


def test_hooks_made_per_call_are_no_closures(tmp_path):
    """Backward hooks are made per captured call, module and gradient hooks per start(): each is
    one object, never a closure with its cells, so the number of precdbg closures alive in a
    step does not grow with the model (every cell is one more object for the collector)."""
    small = _precdbg_closures_during_a_step(tmp_path / "small", 4)
    large = _precdbg_closures_during_a_step(tmp_path / "large", 16)
    assert large == small, (small, large)


class _Wrapper(torch.Tensor):
    """A wrapper tensor subclass (as torchao's and DTensor are): no memory of its own, data
    pointer 0; every op runs on the wrapped tensor."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "_Wrapper":
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype,
                                                   device=inner.device)

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map
        unwrap = lambda x: x.inner if isinstance(x, _Wrapper) else x  # noqa: E731
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: _Wrapper(x) if isinstance(x, torch.Tensor) else x, out)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_wrapper_subclass_without_memory_is_recorded_without_values(tmp_path, task):
    """Its data pointer is 0: nothing is read there (that was a SIGSEGV), two such tensors are
    never taken for the same bytes, and the plain tensors of the same batch keep their values."""
    a, b = _Wrapper(torch.tensor([1.0, -2.0, 3.0])), _Wrapper(torch.tensor([4.0, 5.0, 6.0]))
    plain = torch.tensor([7.0, 8.0])
    assert a.data_ptr() == 0
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task=task)
    dbg.start()
    for name, tensor in (("a", a), ("b", b), ("plain", plain)):
        dbg.save(name, tensor)
    dbg.stop()
    dbg.close()
    assert dbg.failures == (2 if task == "tensor" else 0)    # no bytes of their own to store
    table = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    rows = {str(e): i for i, e in enumerate(table["entry"])}
    for name in ("Save.a.0", "Save.b.0"):
        i = rows[name]
        assert int(table["numel"][i]) == 3 and math.isnan(table["norm"][i])
    assert table["tensor_id"][rows["Save.a.0"]] != table["tensor_id"][rows["Save.b.0"]]
    i = rows["Save.plain.0"]
    assert (table["min"][i], table["max"][i]) == (7.0, 8.0)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_memory_nobody_wrote_has_no_statistics(tmp_path, task):
    """torch.empty and friends return whatever the allocator left: no statistics (they would
    differ between identical runs and pass for NaN/Inf), no stored bytes; once written, the
    same memory is recorded as usual."""
    src = torch.arange(6, dtype=torch.float32)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task=task)
    dbg.start()
    buf = torch.empty(6)
    like = torch.empty_like(src)
    new = src.new_empty((2, 3))
    read_before = buf + 0          # reads the unwritten bytes: its output is garbage too,
    buf.copy_(src)                 # ...but a record of the output is an ordinary record
    read_after = buf * 2
    dbg.stop()
    dbg.close()
    assert dbg.failures == 0
    del like, new, read_before, read_after
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    table = dump.records(step=0)
    rows = {(str(e), str(r), int(a)): i for i, (e, r, a) in
            enumerate(zip(table["entry"], table["role"], table["arg_index"]))}
    for entry in ("Torch.empty.0.forward", "Torch.empty_like.0.forward",
                  "Tensor.new_empty.0.forward"):
        i = rows[(entry, "output", 0)]
        assert math.isnan(table["max"][i]) and table["nan_count"][i] == 0, entry
        assert table["inf_count"][i] == 0 and table["data_offset"][i] < 0, entry
    i = rows[("Tensor.add.0.forward", "input", 0)]    # the same unwritten bytes
    assert math.isnan(table["max"][i]) and table["data_offset"][i] < 0
    i = rows[("Tensor.mul.0.forward", "input", 0)]    # written by copy_
    assert (table["min"][i], table["max"][i]) == (0.0, 5.0)
    if task == "tensor":
        assert np.array_equal(dump.tensor_at(table, i), np.arange(6, dtype=np.float32))


def test_memory_a_live_tensor_gave_up_is_not_taken_for_it(tmp_path):
    """A live tensor can stop holding its memory at an unchanged version (FSDP2 frees and
    re-gathers unsharded parameters by resizing their storage; here `.data` is swapped). A new
    tensor over that memory is another tensor, with statistics of its own."""
    memory = np.ones(4096, dtype=np.float32)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics")
    x = torch.from_numpy(memory)
    dbg.start()
    dbg.save("x", x)
    version = x._version
    x.data = torch.zeros(4096)            # x lives on, elsewhere, at the same version
    memory[:] = 2.0
    y = torch.from_numpy(memory)          # the same address, version and shape as x had
    assert x._version == version == y._version and x.data_ptr() != y.data_ptr()
    dbg.save("y", y)
    dbg.stop()
    dbg.close()
    table = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    rows = {str(e): i for i, e in enumerate(table["entry"])}
    assert table["max"][rows["Save.x.0"]] == 1.0
    assert table["max"][rows["Save.y.0"]] == 2.0
    assert table["tensor_id"][rows["Save.y.0"]] != table["tensor_id"][rows["Save.x.0"]]


def test_an_object_recorded_again_is_read_afresh_once_it_changed(tmp_path):
    """A tensor object recorded again in a window reuses what its last record learnt only while
    its version, data pointer and shape are unchanged: `.data` swapped (same version), an
    in-place view change (`t_`), an in-place write under no_grad each give a new distinct tensor
    with its own statistics; an unchanged object and an inference tensor are recorded as
    before."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with torch.inference_mode():
        frozen = torch.full((3,), 4.0)
    dbg.start()
    dbg.save("a", x)
    dbg.save("b", x)                       # unchanged: the same distinct tensor
    x.data = torch.full((2, 3), 9.0)       # same object, same version, other memory
    dbg.save("c", x)
    x.t_()                                 # in place: other shape, new version
    dbg.save("d", x)
    with torch.no_grad():
        x.mul_(2.0)                        # an uncaptured in-place write (level L1 sees it not)
    dbg.save("e", x)
    dbg.save("f", frozen)
    dbg.save("g", frozen)
    dbg.stop()
    dbg.close()
    assert dbg.failures == 0
    table = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    row = {str(e).split(".")[1]: i for i, e in enumerate(table["entry"])}
    ids = {name: int(table["tensor_id"][i]) for name, i in row.items()}
    assert ids["a"] == ids["b"]
    assert len({ids["b"], ids["c"], ids["d"], ids["e"]}) == 4
    maxima = {name: float(table["max"][i]) for name, i in row.items()}
    assert (maxima["a"], maxima["b"], maxima["c"], maxima["d"], maxima["e"]) == \
        (5.0, 5.0, 9.0, 9.0, 18.0)
    assert table.row(row["c"])["shape"] == (2, 3) and table.row(row["d"])["shape"] == (3, 2)
    assert maxima["f"] == maxima["g"] == 4.0


def test_bytes_seen_through_a_gone_object_keep_their_tensor(tmp_path):
    """A gradient is seen first through the object a backward hook receives, which is gone by
    the time `clip_grad_norm_` reads it again as `.grad`: the same bytes in the same live
    storage, so the clip's records carry the dw record's tensor (one statistics pass, one
    tensor id), and their statistics are those of the gradient."""
    model = make_model()
    x, y = make_batch_list(1)[0]
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    dbg.start(model)
    loss_of(model, x, y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)     # reads every .grad, no write
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    weight = "blocks.0.attn.qkv.weight"
    dw = one_row(t, kind="param_grad", api=weight)
    grad = dict(model.named_parameters())[weight].grad
    assert_rel(dw["norm"], norm64(grad), 1e-6, "dw")
    norm_inputs = [r for r in rows_where(t, kind="api", op="foreach_norm", role="input")
                   if r["tensor_id"] == dw["tensor_id"]]
    assert len(norm_inputs) == 1, "the clip's read of .grad is the dw record's tensor"
    assert norm_inputs[0]["norm"] == dw["norm"]


def test_a_transposed_view_has_statistics_of_its_own_a_reshape_shares_them(tmp_path,
                                                                            monkeypatch):
    """A permutation of a dense tensor holds the same elements in another row-major order: its
    pos_mean differs, so its statistics are taken again (min, max, mean and norm agree to
    rounding); a contiguous view of another shape keeps the order and shares them."""
    from precdbg_pt import tensors as pt_tensors
    passes = []
    summarize = pt_tensors.TorchTensors.summarize

    def counted(self, t):
        passes.append(tuple(t.shape))
        return summarize(self, t)

    monkeypatch.setattr(pt_tensors.TorchTensors, "summarize", counted)
    a, b = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 5, 4)
    dbg = PrecisionDebugger(task="statistics", level="api", dump_path=str(tmp_path))
    dbg.start()
    out = torch.matmul(a, b)
    out.transpose(1, 2)
    out.reshape(2, 3, 16)
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    product = one_row(t, op="matmul", role="output")
    moved = one_row(t, op="transpose", role="output")
    flat = one_row(t, op="reshape", role="output")
    assert moved["tensor_id"] != product["tensor_id"]          # another order of the bytes
    assert (moved["min"], moved["max"]) == (product["min"], product["max"])
    for stat in ("mean", "norm"):
        assert moved[stat] == pytest.approx(product[stat], rel=1e-12)
    assert moved["pos_mean"] != product["pos_mean"]
    assert flat["pos_mean"] == product["pos_mean"]
    assert passes.count((2, 3, 4, 4)) == 1 and passes.count((2, 4, 3, 4)) == 1
    assert passes.count((2, 3, 16)) == 0


def test_statistics_of_strided_views_are_those_of_their_elements(tmp_path):
    """A split's pieces, a strided slice and a broadcast are summarised in place (rows read
    where they lie, broadcast copies counted): the same statistics as their elements copied
    out, in float64, NaN and Inf included."""
    torch.manual_seed(0)
    qkv = torch.randn(4, 8, 96)
    qkv[1, 2, 40] = float("nan")
    qkv[3, 5, 70] = float("-inf")
    column = torch.randn(6, 1)
    dbg = PrecisionDebugger(task="statistics", level="api", dump_path=str(tmp_path))
    dbg.start()
    q, k, v = qkv.split(32, dim=2)
    qkv[:, ::2, 5:50].relu()                        # relu: a strided input of its own
    column.expand(6, 5).exp()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    pieces = sorted(rows_where(t, op="split", role="output"), key=lambda r: r["arg_index"])
    strided = one_row(t, op="relu", role="input")
    broadcast = one_row(t, op="exp", role="input")
    for row, view in [(pieces[0], q), (pieces[1], k), (pieces[2], v),
                      (strided, qkv[:, ::2, 5:50]), (broadcast, column.expand(6, 5))]:
        a = view.double().numpy().ravel()
        finite = a[np.isfinite(a)]
        ordered = a[~np.isnan(a)]
        assert row["nan_count"] == int(np.isnan(a).sum())
        assert row["inf_count"] == int(np.isinf(a).sum())
        assert row["min"] == ordered.min() and row["max"] == ordered.max()
        assert_rel(row["mean"], finite.mean(), 1e-12, "mean")
        assert_rel(row["norm"], float(np.sqrt((finite * finite).sum())), 1e-12, "norm")
