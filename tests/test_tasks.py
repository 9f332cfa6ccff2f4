"""Tasks: tensor (full tensors, dtype kept, each distinct tensor stored once), statistics with
checksums, and overflow (only what is non-finite and what led to it)."""
from __future__ import annotations

import logging

import re

import h5py
import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

import precdbg
from precdbg_pt import PrecisionDebugger

from conftest import DUMPING_TO, one_row
from torch_support import dump_once, loss_of, make_batch_list, make_model


def _capture_gpt(path, dtype=torch.float32, **settings):
    """One forward+backward of the tiny GPT under the debugger, with our own hooks keeping what
    the model computed: the qkv output, the logits and the gradient arriving at the logits."""
    model = make_model(dtype=dtype)
    x, y = make_batch_list(1)[0]
    seen = {}

    def keep_qkv(mod, args, out):
        seen["qkv"] = out.detach().clone()

    def keep_logits(mod, args, out):
        seen["logits"] = out.detach().clone()
        out.register_hook(lambda g: seen.__setitem__("dlogits", g.detach().clone()))

    model.blocks[0].attn.qkv.register_forward_hook(keep_qkv)
    model.register_forward_hook(keep_logits)
    dbg = PrecisionDebugger(dump_path=path, **settings)
    dbg.start(model)
    loss = loss_of(model, x, y)
    loss.backward()
    dbg.stop()
    assert dbg.close()
    assert dbg.failures == 0
    seen["x"] = x
    seen["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    seen["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    return precdbg.open_dump(path), seen


@pytest.fixture(scope="module")
def tensor_dump(tmp_path_factory):
    return _capture_gpt(str(tmp_path_factory.mktemp("tensor")), task="tensor")


# ----------------------------------------------------------------------------- tensor task
def test_tensors_equal_what_the_model_computed(tensor_dump):
    dump, seen = tensor_dump
    qkv = seen["qkv"].numpy()
    for key in ("Module.blocks.0.attn.qkv.Linear.forward.0.output.0",
                "Functional.linear.0.forward.output.0"):
        got = dump.tensor(key, step=0)
        assert got.dtype == np.float32 and got.shape == qkv.shape
        np.testing.assert_array_equal(got, qkv)
    np.testing.assert_array_equal(dump.tensor("Module.GPT.forward.0.output.0", step=0),
                                  seen["logits"].numpy())
    np.testing.assert_array_equal(dump.tensor("Module.GPT.backward.0.grad_output.0", step=0),
                                  seen["dlogits"].numpy())
    ids = dump.tensor("Functional.embedding.0.forward.input.0", step=0)
    assert ids.dtype == np.int64
    np.testing.assert_array_equal(ids, seen["x"].numpy())


def test_param_grads_and_inventory_tensors(tensor_dump):
    dump, seen = tensor_dump
    for name, grad in seen["grads"].items():
        np.testing.assert_array_equal(dump.tensor(f"Param.{name}.grad.param_grad.0", step=0),
                                      grad.numpy(), err_msg=name)
        np.testing.assert_array_equal(dump.tensor(f"Param.{name}.param.0", step=0),
                                      seen["params"][name].numpy(), err_msg=name)


def test_every_tensor_record_has_data(tensor_dump):
    dump, _ = tensor_dump
    t = dump.records(step=0)
    tensors = ~np.char.startswith(t["dtype"], "py.")
    assert np.all(t["data_offset"][tensors] >= 0)
    assert np.all(t["data_offset"][~tensors] == -1)        # plain Python arguments: no data
    for i in np.nonzero(tensors)[0][::37]:                  # a sample, read back by row
        row = t.row(int(i))
        arr = dump.tensor_at(t, int(i))
        assert arr.shape == row["shape"]
        assert str(arr.dtype) == row["dtype"]
        assert arr.nbytes == row["data_nbytes"]
        if arr.dtype.kind == "f" and arr.size:
            assert float(np.max(arr)) == row["max"] and float(np.min(arr)) == row["min"]


def test_each_distinct_tensor_is_stored_once(tensor_dump):
    dump, _ = tensor_dump
    t = dump.records(step=0)
    module_out = one_row(t, entry="Module.blocks.0.attn.qkv.Linear.forward.0", role="output")
    api_out = one_row(t, entry="Functional.linear.0.forward", role="output")
    assert module_out["tensor_id"] == api_out["tensor_id"]
    assert module_out["data_offset"] == api_out["data_offset"] >= 0
    # the module backward's dx is the API backward's dx
    mod_dx = one_row(t, entry="Module.blocks.0.attn.qkv.Linear.backward.0", role="grad_input")
    api_dx = one_row(t, entry="Functional.linear.0.backward", role="grad_input", arg_index=0)
    assert mod_dx["data_offset"] == api_dx["data_offset"]
    # one tensor id <-> one data region
    stored = t.select(t["data_offset"] >= 0)
    by_id = {}
    for tid, off, nbytes in zip(stored["tensor_id"], stored["data_offset"], stored["data_nbytes"]):
        assert by_id.setdefault(int(tid), (int(off), int(nbytes))) == (int(off), int(nbytes))
    regions = sorted(set(by_id.values()))
    assert len(regions) == len(by_id), "two tensor ids share one data region"
    for (a, na), (b, _) in zip(regions, regions[1:]):
        assert a + na <= b, "stored tensors overlap"
    # and nothing else is stored: the data blobs hold exactly the distinct tensors
    with h5py.File(dump.files(step=0)[0].path, "r") as f:
        assert sum(ds.shape[0] for ds in f["data"].values()) == sum(n for _, n in regions)


def test_stored_inputs_reproduce_stored_outputs(tensor_dump):
    """Every attention matmul's stored inputs multiply to its stored output (k is a transposed
    view of the qkv output, and k^T another view of the same memory)."""
    dump, _ = tensor_dump
    for i in range(4):
        a = dump.tensor(f"Torch.matmul.{i}.forward.input.0", step=0).astype(np.float64)
        b = dump.tensor(f"Torch.matmul.{i}.forward.input.1", step=0).astype(np.float64)
        out = dump.tensor(f"Torch.matmul.{i}.forward.output.0", step=0)
        np.testing.assert_allclose(np.matmul(a, b), out, rtol=1e-4, atol=1e-5,
                                   err_msg=f"Torch.matmul.{i}")
    for k in range(9):
        x = dump.tensor(f"Functional.linear.{k}.forward.input.0", step=0).astype(np.float64)
        w = dump.tensor(f"Functional.linear.{k}.forward.input.1", step=0).astype(np.float64)
        out = dump.tensor(f"Functional.linear.{k}.forward.output.0", step=0).astype(np.float64)
        if k < 8:
            x = x @ w.T + dump.tensor(f"Functional.linear.{k}.forward.input.2", step=0)
        else:
            x = x @ w.T
        np.testing.assert_allclose(x, out, rtol=1e-4, atol=1e-5, err_msg=f"Functional.linear.{k}")


@pytest.mark.parametrize("task", ["tensor", "checksum"])
def test_views_of_the_same_memory_keep_their_own_values(tmp_path, task):
    """Two views over the same elements in different orders are different tensors."""
    x = torch.arange(6.0).reshape(2, 3)
    views = [x, x.t(), x.view(3, 2).t(), x.view(3, 2), x.view(6)]
    settings = dict(task="tensor") if task == "tensor" else dict(summary_mode="checksum")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api", **settings)
    with dbg.capture():
        for v in views:
            torch.neg(v)
        torch.neg(x.view(3, 2).t().contiguous())       # the same values as views[2], contiguous
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    t = dump.records(step=0)
    if task == "tensor":
        for i, v in enumerate(views):
            got = dump.tensor(f"Torch.neg.{i}.forward.input.0", step=0)
            assert got.shape == tuple(v.shape)
            np.testing.assert_array_equal(got, v.numpy(), err_msg=f"view {i}")
    else:
        sums = [one_row(t, entry=f"Torch.neg.{i}.forward", role="input")["checksum"]
                for i in range(len(views) + 1)]
        assert sums[2] == sums[5]                   # equal values, equal checksum
        assert sums[1] != sums[2]                   # different values, different checksums


def test_bf16_keeps_dtype_and_round_trips_exactly(tmp_path):
    dump, seen = _capture_gpt(str(tmp_path), dtype=torch.bfloat16, task="tensor")
    t = dump.records(step=0)
    floats = t.select(np.char.startswith(t["dtype"], "float") | (t["dtype"] == "bfloat16"))
    assert set(np.unique(floats["dtype"])) == {"bfloat16"}
    got = dump.tensor("Module.blocks.0.attn.qkv.Linear.forward.0.output.0", step=0)
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    expected = seen["qkv"]
    assert expected.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(torch.int16).numpy()
                                  .view(np.uint16))
    grad = seen["grads"]["lm_head.weight"]
    got = dump.tensor("Param.lm_head.weight.grad.param_grad.0", step=0)
    np.testing.assert_array_equal(got.view(np.uint16), grad.view(torch.int16).numpy()
                                  .view(np.uint16))
    # bf16 statistics are those of the bf16 values
    row = one_row(t, entry="Functional.linear.0.forward", role="output")
    assert row["max"] == float(expected.float().max())
    assert row["min"] == float(expected.float().min())


def test_statistics_task_stores_no_tensors(tmp_path):
    dump, _ = dump_once(tmp_path)
    t = dump.records(step=0)
    assert np.all(t["data_offset"] == -1)
    with pytest.raises(precdbg.DumpError, match="statistics only"):
        dump.tensor("Functional.linear.0.forward.output.0", step=0)
    with pytest.raises(precdbg.DumpError):
        dump.tensor("No.such.entry.forward.output.0", step=0)


def test_tensor_list_stores_only_listed_entries(tmp_path):
    dump, dbg = dump_once(tmp_path, tensor_list=["Functional.linear.0"])
    assert dbg.failures == 0
    t = dump.records(step=0)
    listed = t.select(np.char.startswith(t["entry"], "Functional.linear.0."))
    assert len(listed) > 0 and np.all(listed["data_offset"] >= 0)
    other = t.select(np.char.startswith(t["entry"], "Functional.linear.5."))
    assert len(other) > 0 and np.all(other["data_offset"] == -1)
    assert dump.tensor("Functional.linear.0.forward.output.0", step=0).shape == (2, 16, 192)


# ----------------------------------------------------------------------------- checksums
_HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_checksums_identify_identical_tensors(tmp_path):
    a = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
    b = a.clone()                                   # equal values, another tensor
    c = a.clone()
    c[2, 3] += 1e-6                                 # one element differs
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api", summary_mode="checksum")
    with dbg.capture():
        torch.neg(a)
        torch.neg(b)
        torch.neg(c)
        torch.neg(a.to(torch.float64))
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    sums = [one_row(t, entry=f"Torch.neg.{i}.forward", role="input")["checksum"]
            for i in range(4)]
    assert all(_HEX16.match(s) for s in sums), sums
    assert sums[0] == sums[1]
    assert sums[2] != sums[0]
    assert sums[3] != sums[0]
    outs = [one_row(t, entry=f"Torch.neg.{i}.forward", role="output")["checksum"]
            for i in range(2)]
    assert outs[0] == outs[1] != sums[0]


def test_checksums_of_a_gpt_step(tmp_path):
    dump_a, dbg = dump_once(tmp_path / "a", dump_path=str(tmp_path / "a"),
                            summary_mode="checksum")
    assert dbg.failures == 0
    dump_b, _ = dump_once(tmp_path / "b", dump_path=str(tmp_path / "b"), summary_mode="checksum")
    ta, tb = dump_a.records(step=0), dump_b.records(step=0)
    tensors = ~np.char.startswith(ta["dtype"], "py.")
    assert all(_HEX16.match(s) for s in ta["checksum"][tensors])
    assert np.all(ta["checksum"][~tensors] == "")
    # statistics are still there
    assert np.all(np.isfinite(ta["norm"][tensors & (ta["numel"] > 0)]))
    # same seed, same data: every checksum equal between the two runs
    assert list(ta["entry"]) == list(tb["entry"])
    assert list(ta["checksum"]) == list(tb["checksum"])
    # the same tensor seen by a module and by an API has the same checksum
    assert one_row(ta, entry="Module.lm_head.Linear.forward.0", role="output")["checksum"] == \
        one_row(ta, entry="Functional.linear.8.forward", role="output")["checksum"]
    # statistics-only: no tensor data
    assert np.all(ta["data_offset"] == -1)


# ----------------------------------------------------------------------------- overflow
class Overflowing(nn.Module):
    """A finite linear layer, then exp of large finite values: inf appears in exp's output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return torch.exp(h * 1000.0).sum()


def _overflow_run(path, **settings):
    torch.manual_seed(0)
    model = Overflowing()
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert torch.isinf(torch.exp(model.lin(x) * 1000.0)).any()
        assert torch.isfinite(model.lin(x) * 1000.0).all()
    dbg = PrecisionDebugger(dump_path=path, **settings)
    with dbg.capture(model):
        model(x).backward()
    assert dbg.close()
    assert dbg.failures == 0
    return precdbg.open_dump(path).records(step=0)


def _key(row):
    return row["entry"], row["role"], row["arg_index"]


def test_overflow_keeps_non_finite_records_and_their_inputs(tmp_path):
    full = _overflow_run(str(tmp_path / "full"))
    over = _overflow_run(str(tmp_path / "over"), task="overflow")
    full_rows = {_key(r): r for r in full.rows()}
    over_rows = {_key(r): r for r in over.rows()}
    assert len(over_rows) == len(over), "duplicate records"
    nonfinite = {k for k, r in full_rows.items() if r["nan_count"] or r["inf_count"]}
    assert nonfinite, "the model produced no inf"
    # every non-finite record is kept ...
    assert nonfinite <= set(over_rows)
    # ... and the rest are the inputs of entries whose results are non-finite
    bad_entries = {k[0] for k in nonfinite if k[1] in ("output", "grad_input", "param_grad")}
    for key in set(over_rows) - nonfinite:
        assert key[0] in bad_entries, key
    # the op that overflowed, with its finite input
    exp_in = over_rows[("Torch.exp.0.forward", "input", 0)]
    assert exp_in["nan_count"] == 0 and exp_in["inf_count"] == 0
    assert np.isfinite(exp_in["max"])
    assert over_rows[("Torch.exp.0.forward", "output", 0)]["inf_count"] > 0
    # finite-only calls are gone
    entries = set(over["entry"])
    assert "Functional.linear.0.forward" not in entries
    assert "Tensor.mul.0.forward" not in entries
    assert not any(e.startswith("Param.lin.") and not e.endswith(".grad") for e in entries)
    # statistics of kept records are those of the full run
    for key, r in over_rows.items():
        for col in ("min", "max", "nan_count", "inf_count"):
            assert r[col] == full_rows[key][col] or (np.isnan(r[col]) and
                                                     np.isnan(full_rows[key][col])), (key, col)


def test_overflow_nums_keeps_the_first_overflowing_op(tmp_path, caplog):
    """msprobe stops training at overflow_nums; precdbg never does, and says so once."""
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        over = _overflow_run(str(tmp_path), task="overflow", overflow_nums=1)
    assert set(over["entry"]) == {"Torch.exp.0.forward"}
    said = [r.getMessage() for r in caplog.records if "overflow_nums" in r.getMessage()
            and not r.getMessage().startswith(DUMPING_TO)]   # its path names the test
    assert said == ["precdbg: step 0: overflow_nums 1 reached: later non-finite values are "
                    "not recorded; training goes on (precdbg never stops it, where msprobe "
                    "would)"], said


def test_overflow_without_non_finite_values_keeps_nothing(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 2))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="overflow")
    with dbg.capture(model):
        model(torch.randn(4, 8)).pow(2).mean().backward()
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0]
    assert len(dump.records(step=0)) == 0


def test_overflow_keeps_the_attention_mask_fill(tmp_path):
    """The GPT's causal mask puts -inf into the attention scores (by design): the overflow task
    reports exactly the masked_fill calls and the calls that read their -inf."""
    dump, dbg = dump_once(tmp_path, task="overflow")
    assert dbg.failures == 0
    t = dump.records(step=0)
    assert {e for e in t["entry"] if not e.startswith("Functional.softmax.")} == \
        {"Tensor.masked_fill.0.forward", "Tensor.masked_fill.1.forward"}
    out = one_row(t, entry="Tensor.masked_fill.0.forward", role="output")
    assert out["inf_count"] == 2 * 4 * (16 * 15 // 2)      # batch x heads x upper triangle


# ----------------------------------------------------------------------------- writer settings
@pytest.mark.parametrize("settings", [dict(compression="gzip"), dict(compression="lzf"),
                                      dict(queue_mb=1)])
def test_writer_settings_keep_every_byte(tensor_dump, tmp_path, settings):
    """Compression and a tiny, blocking queue change how the bytes travel, not what is stored."""
    dump, _ = _capture_gpt(str(tmp_path), task="tensor", **settings)
    ref_dump, _ = tensor_dump
    t, ref = dump.records(step=0), ref_dump.records(step=0)
    assert list(t["entry"]) == list(ref["entry"])
    assert np.array_equal(t["norm"], ref["norm"], equal_nan=True)
    for i in range(0, len(t), 11):
        if t["data_offset"][i] >= 0:
            np.testing.assert_array_equal(dump.tensor_at(t, i), ref_dump.tensor_at(ref, i))
    if "compression" in settings:
        with h5py.File(dump.files(step=0)[0].path, "r") as f:
            blobs = list(f["data"].values())
            assert blobs and all(ds.compression == settings["compression"] for ds in blobs)


def test_large_and_small_tensors_round_trip(tmp_path):
    torch.manual_seed(0)
    big = torch.randn(5_000_000)                 # 20 MB: beyond one staged write
    small = [torch.randn(k) for k in (1, 7, 1000)]
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="api")
    with dbg.capture():
        for s in small[:2]:
            torch.neg(s)
        torch.neg(big)
        torch.neg(small[2])
        torch.neg(big[::2])
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    expected = small[:2] + [big, small[2], big[::2]]
    for i, x in enumerate(expected):
        np.testing.assert_array_equal(dump.tensor(f"Torch.neg.{i}.forward.input.0", step=0),
                                      x.numpy())
        np.testing.assert_array_equal(dump.tensor(f"Torch.neg.{i}.forward.output.0", step=0),
                                      (-x).numpy())


def test_names_outside_ascii_round_trip(tmp_path):
    """Module paths and saved names in any script (text columns are written as UTF-8, ASCII
    ones in one pass, others string by string)."""
    model = nn.Sequential()
    model.add_module("Δschicht", nn.Linear(4, 4))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix", step=[0])
    dbg.start(model)
    out = model(torch.randn(2, 4))
    dbg.save("größe", out)
    out.sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    with precdbg.open_dump(str(tmp_path)) as dump:
        t = dump.records(step=0)
        modules = set(t["module"].tolist())
        entries = set(t["entry"].tolist())
    assert "Δschicht" in modules
    assert any(e.startswith("Save.größe.") for e in entries), sorted(entries)[:5]
    assert any(e.startswith("Module.Δschicht.Linear.") for e in entries), sorted(entries)[:5]
