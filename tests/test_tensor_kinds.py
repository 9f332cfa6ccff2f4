"""Tensors that are not plain strided memory, in a captured step.

Sparse: the gradient of an `nn.Embedding(sparse=True)` (trained with SparseAdam) and a sparse COO
tensor passed through an API call. Before, their statistics went through dense reductions that
sparse layouts do not have: each such call counted a failure and its records were lost (the
embedding had no dw). Now their statistics are those of the dense tensor they stand for (the
zeros they do not store count in min, max and mean), and the tensor task stores them dense.

functorch: per-sample gradients (`vmap(grad(...))` over `functional_call`, as differential
privacy trains) run the model on tensors without memory of their own. Before, every call inside
counted a failure; now they are recorded with their shapes and unknown values, and the step's
ordinary records are whole.

Lazy views: `z.conj()` of a complex tensor and the imaginary part of such a view (negated) hold
the bytes of `z` with a bit that says how to read them. Before, their statistics and stored bytes
were those of the raw memory (the negated view's min was its true max negated), and they shared
the statistics of the tensor they view.

Nested and quantized: a nested tensor (strided, as nn.TransformerEncoder's eval fast path makes
of a padded batch, or jagged) has no single shape, and a quantized tensor no float values in
memory. Before, capturing either failed (counted, its records lost); now a nested tensor is
recorded as its values (every component's elements, flat) and a quantized one as the values it
stands for (dequantized).
"""
from __future__ import annotations

from typing import Any, Dict

import numpy as np
import pytest
import torch

import precdbg
from precdbg_pt import PrecisionDebugger

from conftest import one_row


class _Bag(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8, sparse=True)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(dim=1)).squeeze(-1)


def _train_step(path: str, task: str) -> Dict[str, Any]:
    torch.manual_seed(0)
    model = _Bag()
    sparse = torch.optim.SparseAdam(list(model.emb.parameters()), lr=1e-2)
    dense = torch.optim.SGD(model.head.parameters(), lr=1e-2)
    ids = torch.randint(0, 50, (4, 6), generator=torch.Generator().manual_seed(1))
    ids[0, :2] = 7                                 # a row used twice: summed in the gradient
    seen: Dict[str, Any] = {}
    debugger = PrecisionDebugger(dump_path=path, task=task, level="mix", step=[0])
    debugger.start(model)
    loss = model(ids).square().mean()
    loss.backward()
    seen["grad"] = model.emb.weight.grad.detach().clone()
    coo = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2], [1, 1, 3]]),
                                  torch.tensor([1.5, 2.0, -4.0]), (3, 5),
                                  check_invariants=True)            # uncoalesced
    seen["scaled"] = coo.mul(2.0)
    sparse.step()
    dense.step()
    debugger.stop()
    debugger.step()
    assert debugger.close()
    seen["failures"] = debugger.failures
    seen["dump"] = precdbg.open_dump(path)
    return seen


def _expected(t: torch.Tensor) -> Dict[str, float]:
    dense = t.to_dense().double().numpy()
    return {"min": dense.min(), "max": dense.max(), "mean": dense.mean(),
            "norm": float(np.sqrt((dense * dense).sum()))}


def _assert_stats(row: Dict[str, Any], t: torch.Tensor) -> None:
    for key, value in _expected(t).items():
        assert row[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    assert row["nan_count"] == 0 and row["inf_count"] == 0
    assert row["shape"] == tuple(t.shape)


@pytest.fixture(scope="module")
def statistics_run(tmp_path_factory: Any) -> Dict[str, Any]:
    return _train_step(str(tmp_path_factory.mktemp("sparse")), "statistics")


def test_sparse_gradient_is_recorded_without_failure(statistics_run: Dict[str, Any]) -> None:
    assert statistics_run["failures"] == 0
    table = statistics_run["dump"].records(step=0)
    grad = statistics_run["grad"]
    assert grad.layout is torch.sparse_coo
    _assert_stats(one_row(table, kind="param_grad", api="emb.weight"), grad)
    # zeros count: most rows of the embedding were not used in this batch
    assert one_row(table, kind="param_grad", api="emb.weight")["min"] <= 0.0 <= \
        one_row(table, kind="param_grad", api="emb.weight")["max"]


def test_sparse_api_output_has_the_statistics_of_its_dense_tensor(
        statistics_run: Dict[str, Any]) -> None:
    table = statistics_run["dump"].records(step=0)
    out = one_row(table, entry="Tensor.mul.0.forward", role="output")
    _assert_stats(out, statistics_run["scaled"])
    assert out["min"] == -8.0 and out["max"] == 7.0          # duplicates summed: (1.5+2)*2


def test_tensor_task_stores_sparse_tensors_dense(tmp_path: Any) -> None:
    run = _train_step(str(tmp_path), "tensor")
    assert run["failures"] == 0
    dump = run["dump"]
    np.testing.assert_array_equal(dump.tensor("Param.emb.weight.grad.param_grad.0", step=0),
                                  run["grad"].to_dense().numpy())
    np.testing.assert_array_equal(dump.tensor("Tensor.mul.0.forward.output.0", step=0),
                                  run["scaled"].to_dense().numpy())


def test_calls_inside_functorch_transforms_are_recorded_without_values(tmp_path: Any) -> None:
    from torch.func import functional_call, grad, vmap
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 8)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p: Dict[str, torch.Tensor], sample: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (sample.unsqueeze(0),)).square().sum()

    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="mix", step=[0])
    debugger.start(model)
    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
    model(x).square().mean().backward()                # an ordinary step besides
    debugger.stop()
    debugger.step()
    assert debugger.close()
    assert debugger.failures == 0
    assert per_sample["0.weight"].shape == (5, 8, 8)
    table = precdbg.open_dump(str(tmp_path)).records(step=0)
    linear = table.select((table["api"] == "linear") & (table["role"] == "output")
                          & (table["direction"] == "forward"))
    # the model ran twice (once inside vmap, once plainly): two layers each
    assert len(linear) == 4
    rows = [linear.row(i) for i in range(len(linear))]
    # inside vmap, per sample (the shapes the model sees there), values unknown; then the plain
    # call, with its statistics
    assert [(r["shape"], np.isnan(r["norm"])) for r in rows] == [
        ((1, 8), True), ((1, 1), True), ((5, 8), False), ((5, 1), False)]
    dw = table.select(table["kind"] == "param_grad")
    assert sorted(set(dw["api"])) == sorted(params)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_lazy_negated_and_conjugated_views_are_recorded_as_read(tmp_path: Any, task: str) -> None:
    torch.manual_seed(0)
    z = torch.randn(3, 4, dtype=torch.complex64)
    dbg = PrecisionDebugger(task=task, level="api", dump_path=str(tmp_path))
    dbg.start()
    z.imag.exp()
    negated = z.conj().imag                  # a view with the negative bit: -z.imag
    assert negated.is_neg()
    negated.exp()
    conjugated = z.conj()
    conjugated.mul(2)
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    t = dump.records(step=0)
    plain = one_row(t, entry="Tensor.exp.0.forward", role="input")
    flipped = one_row(t, entry="Tensor.exp.1.forward", role="input")
    expected = -z.imag.double().numpy()
    assert (flipped["min"], flipped["max"]) == (expected.min(), expected.max())
    assert flipped["mean"] == pytest.approx(expected.mean(), rel=1e-12)
    assert flipped["tensor_id"] != plain["tensor_id"]
    if task == "tensor":
        np.testing.assert_array_equal(dump.tensor("Tensor.exp.1.forward.input.0", step=0),
                                      negated.resolve_neg().numpy())
        np.testing.assert_array_equal(dump.tensor("Tensor.mul.0.forward.input.0", step=0),
                                      conjugated.resolve_conj().numpy())


class _Odd(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 3)

    def forward(self, idx: torch.Tensor):
        dense = self.emb(idx)
        parts = [dense[:1].detach(), dense[1:].detach()]
        return dense.sum(), (torch.nested.nested_tensor(parts),
                             torch.nested.nested_tensor(parts, layout=torch.jagged),
                             torch.quantize_per_tensor(dense.detach(), 0.05, 10, torch.quint8))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_nested_and_quantized_outputs_are_recorded_as_their_values(tmp_path: Any,
                                                                   task: str) -> None:
    torch.manual_seed(0)
    model = _Odd()
    idx = torch.tensor([1, 2, 2, 7])
    dbg = PrecisionDebugger(dump_path=str(tmp_path), task=task, level="module")
    dbg.start(model)
    total, (strided, jagged, quantized) = model(idx)
    total.backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    values = model.emb(idx).detach().reshape(-1).double()
    with precdbg.open_dump(str(tmp_path)) as dump:
        table = dump.records(step=0)
        for index, expected in ((1, values), (2, values),
                                (3, quantized.dequantize().reshape(-1).double())):
            row = one_row(table, entry="Module._Odd.forward.0", role="output", arg_index=index)
            assert row["numel"] == 12 and row["dtype"] == "float32", row
            assert row["min"] == pytest.approx(float(expected.min()))
            assert row["norm"] == pytest.approx(float(expected.norm()))
            if task == "tensor":
                stored = dump.tensor_at(table, int(np.flatnonzero(
                    (table["entry"] == row["entry"]) & (table["role"] == "output")
                    & (table["arg_index"] == index))[0]))
                np.testing.assert_array_equal(stored.reshape(-1),
                                              expected.float().numpy())


def test_inference_tensors_keep_their_producers_and_fresh_statistics(tmp_path: Any) -> None:
    """Under torch.inference_mode tensors count no writes (`_version` raises): each record
    still names the call that produced what it reads, and a tensor written in place (relu_)
    is summarised as it is when read, never from an earlier record of the same bytes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with torch.inference_mode():
        dbg.start(model)
        hidden = model(torch.randn(4, 8))
        before = hidden.clone()
        hidden.relu_()
        out = hidden * 2.0
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures
    table = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    linear_out = one_row(table, entry="Functional.linear.0.forward", role="output")
    norm_in = one_row(table, entry="Functional.layer_norm.0.forward", role="input", arg_index=0)
    assert norm_in["producer"] == linear_out["seq"]
    norm_out = one_row(table, entry="Functional.layer_norm.0.forward", role="output")
    assert norm_out["min"] == pytest.approx(float(before.min()), rel=1e-6)
    assert norm_out["min"] < 0
    mul_in = one_row(table, entry="Tensor.mul.0.forward", role="input", arg_index=0)
    assert mul_in["min"] == 0.0 and mul_in["max"] == pytest.approx(float(out.max()) / 2)
    relu_out = one_row(table, entry="Tensor.relu_.0.forward", role="output")
    assert mul_in["producer"] == relu_out["seq"]


def test_a_key_two_backward_passes_share_is_refused_by_name(tmp_path: Any) -> None:
    """retain_graph: a second backward over one graph records the same calls' gradients
    again under the same keys; `Dump.tensor(key)` says so instead of returning either."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="module", task="tensor")
    dbg.start(layer)
    loss = layer(torch.randn(2, 4)).square().sum()
    loss.backward(retain_graph=True)
    (loss * 2).backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and not dbg.failures
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    key = "Module.Linear.backward.0.grad_output.0"
    table = dump.records(step=0)
    rows = np.nonzero(table.key == key)[0]
    assert len(rows) == 2
    with pytest.raises(precdbg.DumpError, match="names 2 records"):
        dump.tensor(key)
    first, second = (dump.tensor_at(table, int(i)) for i in rows[np.argsort(table["seq"][rows])])
    np.testing.assert_allclose(second, 2 * first, rtol=1e-6)
