"""Issue 46, item 6: NPU fused ops and other registered operators on PyTorch. Calls of
`torch.ops.<namespace>.<op>` (packet or overload), of `torch.library.custom_op` functions and of
torch_npu's fused ops are captured as one API each, named by the core's operator rule
(`precdbg.records.operator_api`): `NPU.npu_rms_norm.0.forward` as msprobe names it, with its
backward; what the operator's implementation calls is not recorded; `torch.ops.aten.*` is not
captured. torch_npu cannot be installed here (it breaks `import torch` without CANN): its ops
are emulated by torch.library ops in the namespace `npu` and a `torch_npu` module of their
packets (tests/npu_ops_support.py), in a fresh process per dump (tests/npu_ops_guide.py, the
guides' pattern). Two such dumps MATCH under `precdbg compare`; a defect in one run's
npu_rms_norm is named at its forward call, one in its backward only at its backward."""
from __future__ import annotations

import importlib
import json
import os
from typing import Any, Dict, List, Tuple

import pytest
import torch

import precdbg
from compare_support import run_cli
from conftest import guide_dumps, one_row, rows_where
from precdbg.compare import compare_dumps
from precdbg_pt import PrecisionDebugger
from precdbg_pt.api import identify

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npu_ops_guide.py")
NORMS = ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2", "norm_f"]
# what the emulated ops' implementations and backward formulas call, and the model never does
INSIDE = {"rsqrt", "pow", "mean", "matmul", "exp", "amax", "masked_fill", "chunk", "cat", "neg",
          "sum", "mul", "sub", "div", "__mul__", "__rmul__", "__truediv__", "__sub__"}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Dict[str, str]:
    return guide_dumps(tmp_path_factory.mktemp("npu_ops"), GUIDE,
                       {"base": "base", "rerun": "base", "rms_forward": "rms_forward",
                        "rms_backward": "rms_backward"})


@pytest.fixture(scope="module")
def table(dumps) -> precdbg.RecordTable:
    return precdbg.open_dump(dumps["base"]).records(step=0)


def _calls(table: precdbg.RecordTable, prefix: str, api: str) -> List[Tuple[str, str]]:
    """(entry, module) of each forward call of prefix.api, in execution order."""
    rows = rows_where(table, kind="api", prefix=prefix, api=api, direction="forward",
                      role="output", arg_index=0)
    return [(r["entry"], r["module"]) for r in sorted(rows, key=lambda r: r["order"])]


# ----------------------------------------------------------------------------- names
def test_fused_ops_are_named_as_msprobe_names_them(table):
    # torch_npu.npu_rms_norm (the packet) in each RMSNorm, the custom_op function in norm_f:
    # one API, one counter
    assert _calls(table, "NPU", "npu_rms_norm") == [
        (f"NPU.npu_rms_norm.{i}.forward", m) for i, m in enumerate(NORMS)]
    # torch_npu.npu_rotary_mul for q, torch.ops.npu.npu_rotary_mul.default for k
    assert _calls(table, "NPU", "npu_rotary_mul") == [
        (f"NPU.npu_rotary_mul.{i}.forward", f"blocks.{i // 2}.attn") for i in range(4)]
    assert _calls(table, "NPU", "npu_fusion_attention") == [
        (f"NPU.npu_fusion_attention.{i}.forward", f"blocks.{i}.attn") for i in range(2)]
    # a custom op of another namespace: Torch.<namespace>.<op>
    assert _calls(table, "Torch", "guide.square") == [
        (f"Torch.guide.square.{i}.forward", f"blocks.{i}") for i in range(2)]
    ops = {(r["api"], r["op"]) for r in rows_where(table, kind="api", prefix="NPU")}
    assert ops == {("npu_rms_norm", "rms_norm"), ("npu_rotary_mul", "rotary_embedding"),
                   ("npu_fusion_attention", "scaled_dot_product_attention")}
    entries = set(table["entry"].tolist())
    assert not [e for e in entries if ".default." in e or e.startswith("Torch.npu")]


def test_fused_ops_record_inputs_and_outputs(table):
    rows = rows_where(table, entry="NPU.npu_fusion_attention.0.forward")
    outputs = {r["arg_index"]: r["shape"] for r in rows if r["role"] == "output"}
    assert outputs == {0: (2, 4, 8, 8), 1: (2, 4, 8, 1), 2: (2, 4, 8, 1)}
    tensors = {r["arg_index"]: r["shape"] for r in rows if r["role"] == "input" and r["shape"]}
    assert tensors[0] == tensors[1] == tensors[2] == (2, 4, 8, 8)
    rms = rows_where(table, entry="NPU.npu_rms_norm.0.forward", role="output")
    assert sorted((r["arg_index"], r["shape"]) for r in rms) == [(0, (2, 8, 32)),
                                                                  (1, (2, 8, 1))]


def test_each_fused_op_has_its_backward(table):
    for entry in [f"NPU.npu_rms_norm.{i}" for i in range(5)] + \
            [f"NPU.npu_rotary_mul.{i}" for i in range(4)] + \
            [f"NPU.npu_fusion_attention.{i}" for i in range(2)]:
        forward = {r["arg_index"]: r["shape"] for r in rows_where(
            table, entry=entry + ".forward", role="input") if r["shape"]}
        backward = rows_where(table, entry=entry + ".backward")
        assert {r["role"] for r in backward} == {"grad_output", "grad_input"}, entry
        dy = one_row(table, entry=entry + ".backward", role="grad_output", arg_index=0)
        assert dy["shape"] == one_row(table, entry=entry + ".forward", role="output",
                                      arg_index=0)["shape"]
        dx = {r["arg_index"]: r["shape"] for r in backward if r["role"] == "grad_input"}
        assert dx and all(forward[i] == shape for i, shape in dx.items()), entry
        assert all(r["direction"] == r["phase"] == "backward" for r in backward)
    # npu_rms_norm's dx and dgamma; npu_fusion_attention's dq, dk, dv
    assert {r["arg_index"] for r in rows_where(table, entry="NPU.npu_rms_norm.4.backward",
                                               role="grad_input")} == {0, 1}
    assert {r["arg_index"] for r in rows_where(
        table, entry="NPU.npu_fusion_attention.1.backward", role="grad_input")} == {0, 1, 2}


def test_the_backward_records_hold_the_registered_formulas_gradients(table):
    # norm_f's weight is used only by its npu_rms_norm call: the dgamma its backward returned
    # is the parameter's gradient
    dgamma = one_row(table, entry="NPU.npu_rms_norm.4.backward", role="grad_input", arg_index=1)
    dw = one_row(table, entry="Param.norm_f.weight.grad")
    assert dgamma["norm"] == pytest.approx(dw["norm"], rel=1e-6)
    assert dgamma["mean"] == pytest.approx(dw["mean"], rel=1e-5, abs=1e-9)


def test_calls_inside_an_operator_are_not_recorded(table):
    apis = set(table["api"][table["kind"] == "api"].tolist())
    assert not apis & INSIDE, apis & INSIDE
    for module in NORMS:          # an RMSNorm module's forward is its one fused call
        rows = rows_where(table, kind="api", module=module)
        assert {r["api"] for r in rows} == {"npu_rms_norm"}, module
    forward = rows_where(table, kind="api", direction="forward")
    assert {r["phase"] for r in forward} == {"forward"}


# ----------------------------------------------------------------------------- compare
def test_two_runs_match(dumps):
    proc = run_cli("compare", dumps["base"], dumps["rerun"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = compare_dumps(dumps["base"], dumps["rerun"])
    assert result["verdict"] == "match" and not result["unmatched"]
    compared = {r["name_a"].rsplit(".", 2)[0] for r in result["rows"]
                if r["name_a"].startswith("NPU.")}
    assert {"NPU.npu_rms_norm", "NPU.npu_rotary_mul", "NPU.npu_fusion_attention"} <= compared


def _first(dumps: Dict[str, str], candidate: str, tmp_path: Any) -> Dict[str, Any]:
    out = tmp_path / "result.json"
    proc = run_cli("compare", dumps["base"], dumps[candidate], "--json", str(out))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["verdict"] == "diverged"
    return result["first_divergence"]


def test_a_defect_in_the_fused_forward_is_named_at_that_call(dumps, tmp_path):
    first = _first(dumps, "rms_forward", tmp_path)
    got = {k: first[k] for k in ("code", "step", "direction", "kind", "name_a", "name_b",
                                 "module", "op", "role")}
    assert got == {"code": "op_differs", "step": 0, "direction": "forward", "kind": "api",
                   "name_a": "NPU.npu_rms_norm.0.forward",
                   "name_b": "NPU.npu_rms_norm.0.forward", "module": "blocks.0.norm1",
                   "op": "rms_norm", "role": "output"}, first["reason"]


def test_a_defect_in_the_fused_backward_only_is_named_at_its_backward(dumps, tmp_path):
    # backward runs the last call's formula first: norm_f's
    first = _first(dumps, "rms_backward", tmp_path)
    got = {k: first[k] for k in ("code", "step", "direction", "kind", "name_a", "name_b",
                                 "module", "op", "role")}
    assert got == {"code": "backward_only", "step": 0, "direction": "backward", "kind": "api",
                   "name_a": "NPU.npu_rms_norm.4.backward",
                   "name_b": "NPU.npu_rms_norm.4.backward", "module": "norm_f",
                   "op": "rms_norm", "role": "grad_input"}, first["reason"]


# ----------------------------------------------------------------------------- in process
@torch.library.custom_op("precdbg_test::scale", mutates_args=())
def _scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


_scale.register_autograd(lambda ctx, grad: (grad * ctx.factor, None),
                         setup_context=lambda ctx, inputs, output:
                         setattr(ctx, "factor", inputs[1]))


def test_identify_names_operators_by_the_cores_rule():
    op = torch.ops.precdbg_test.scale
    for func in (op, op.default):
        assert identify(func) == ("Torch", "precdbg_test.scale")
    for func in (torch.ops.aten.add, torch.ops.aten.add.Tensor,
                 torch.ops.profiler._record_function_enter_new):
        assert identify(func) is None
    if torch.distributed.is_available():
        importlib.import_module("torch.distributed._functional_collectives")  # its ops
        assert identify(torch.ops._c10d_functional.all_reduce) == ("Distributed", "all_reduce")
        # torch.distributed's collectives are msprobe's Distributed.*, its group set-up no API
        dist = torch.distributed
        for func, name in ((dist.all_reduce, "all_reduce"), (dist.broadcast, "broadcast"),
                           (dist._all_gather_base, "_all_gather_base")):
            assert identify(func) == ("Distributed", name)
        assert identify(dist.init_process_group) != ("Distributed", "init_process_group")
    # an ATen packet torch exposes as a torch function keeps its torch name
    assert identify(torch.quantized_lstm) == ("Torch", "quantized_lstm")


def test_packet_overload_and_custom_op_function_count_as_one_api(tmp_path):
    x = torch.randn(4, 3, requires_grad=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="api")
    with dbg.capture():
        y = _scale(x, 2.0)                                  # the custom_op function
        y = torch.ops.precdbg_test.scale(y, 3.0)            # the packet
        y = torch.ops.precdbg_test.scale.default(y, 0.5)    # an overload
        y = torch.ops.aten.mul(y, 1.0)                      # ATen: not captured
        y.sum().backward()
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert _calls(t, "Torch", "precdbg_test.scale") == [
        (f"Torch.precdbg_test.scale.{i}.forward", "") for i in range(3)]
    assert not rows_where(t, kind="api", api="mul")
    for i, factor in enumerate((2.0, 3.0, 0.5)):
        dy = one_row(t, entry=f"Torch.precdbg_test.scale.{i}.backward", role="grad_output")
        dx = one_row(t, entry=f"Torch.precdbg_test.scale.{i}.backward", role="grad_input")
        assert dx["norm"] == pytest.approx(dy["norm"] * factor, rel=1e-6)
    assert float(x.grad.mean()) == pytest.approx(3.0, rel=1e-6)
