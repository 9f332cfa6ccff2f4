"""The core's naming of registered operators (precdbg.records.operator_api and the `operators`
section of tables/torch.yaml), no framework: the rule both adapters follow, so that a fused op
is named alike on PyTorch (torch_npu, torch.ops.<namespace>) and on a torch shim over MindSpore,
and pairs across a migration by its name and its canonical op."""
from __future__ import annotations

import pytest

from precdbg.records import api_members, canonical_op, framework_table, operator_api


@pytest.mark.parametrize("namespace, op, expected", [
    # torch_npu's fused ops: msprobe's prefix NPU and the op's own name
    ("npu", "npu_fusion_attention", ("NPU", "npu_fusion_attention")),
    ("npu", "npu_rms_norm", ("NPU", "npu_rms_norm")),
    ("npu", "npu_rotary_mul", ("NPU", "npu_rotary_mul")),
    # functional collectives are collectives
    ("_c10d_functional", "all_reduce", ("Distributed", "all_reduce")),
    ("c10d_functional", "all_gather_into_tensor", ("Distributed", "all_gather_into_tensor")),
    # any other namespace: Torch, and the namespace in the name (no counter shared with torch.*)
    ("mylib", "add", ("Torch", "mylib.add")),
    ("fsdp", "all_gather_copy_in", ("Torch", "fsdp.all_gather_copy_in")),
])
def test_operators_are_named_by_namespace(namespace, op, expected):
    assert operator_api(namespace, op) == expected


@pytest.mark.parametrize("namespace, op", [
    ("aten", "add"), ("aten", "_scaled_dot_product_flash_attention"), ("prims", "mul"),
    ("profiler", "_record_function_enter_new"), ("rngprims", "philox_rand"),
    ("mylib", "size"),            # a name the torch table ignores is ignored in any namespace
    ("mylib", ""),
])
def test_operators_below_the_users_api_are_not_captured(namespace, op):
    assert operator_api(namespace, op) is None


def test_every_listed_namespace_has_a_known_prefix_or_none():
    rules = framework_table("torch")["operators"]
    prefixes = set(framework_table("torch")["prefixes"].values())
    for namespace, prefix in rules["namespaces"].items():
        assert prefix is None or prefix in prefixes, namespace
    assert rules["other"] in prefixes


@pytest.mark.parametrize("api, op", [
    ("npu_rms_norm", "rms_norm"), ("npu_fusion_attention", "scaled_dot_product_attention"),
    ("npu_rotary_mul", "rotary_embedding"),
    # MindSpore's own names of the same math pair with them across frameworks
    ("flash_attention_score", "scaled_dot_product_attention"),
    ("rotary_position_embedding", "rotary_embedding"),
    ("mylib.square", "square"),   # another namespace's op: its canonical op is the op's name
])
def test_fused_ops_have_the_canonical_op_of_their_math(api, op):
    assert canonical_op(api) == op


def test_uninitialized_outputs_of_fsdp_copy_in_by_either_name():
    from precdbg.records.naming import uninitialized_output
    assert uninitialized_output("fsdp.all_gather_copy_in", 1)
    assert not uninitialized_output("fsdp.all_gather_copy_in", 0)


def test_distributed_apis_are_the_calls_that_move_tensors():
    # both adapters name torch.distributed's members from this one list (msprobe's
    # `Distributed.` list): collectives and point-to-point calls, never group set-up
    members = api_members("torch", "torch.distributed")
    assert {"all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
            "_all_gather_base", "_reduce_scatter_base", "isend", "irecv", "send",
            "recv"} <= set(members)
    assert not {"init_process_group", "get_rank", "barrier", "new_group"} & set(members)
    # Megatron's private names reach the collective's canonical op
    assert canonical_op("_all_gather_base") == "all_gather_base"
    assert api_members("torch", "torch.nn.functional") is None
    assert "torch.distributed" in framework_table("torch")["api_namespaces"]
