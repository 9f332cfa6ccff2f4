"""Entry names and the canonical op vocabulary.

Entry names are *derived* from record fields (prefix, API or module path and class, call index,
direction); nothing ever parses them back. Canonical ops put the same math under the same word in
every framework (`torch.matmul`, `Tensor.__matmul__`, `ops.matmul` are all `matmul`). The tables
are data files in `precdbg/records/tables/`, read on first use (importing this module reads nothing).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Dict, Iterable, Optional, Tuple

from .schema import Role

__all__ = ["COLLECTIVE_OPS", "is_collective", "in_place", "writes_arguments",
           "api_entry", "operator_api", "module_entry", "param_entry", "save_entry",
           "canonical_op", "framework_table", "api_members",
           "normalize_api_name", "param_alias", "torch_param_leaf", "inventory_role"]

_TABLES_DIR = os.path.join(os.path.dirname(__file__), "tables")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_REFLECTED = {"radd", "rsub", "rmul", "rtruediv", "rfloordiv", "rpow", "rmatmul", "rand", "ror",
              "rxor", "rdiv", "rmod", "rlshift", "rrshift"}
_INPLACE = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "ipow", "imatmul", "iand", "ior",
            "ixor", "idiv", "imod", "ilshift", "irshift"}


# canonical ops that combine the tensors of several ranks
COLLECTIVE_OPS = frozenset({
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_base",
    "all_to_all", "all_to_all_single", "reduce_scatter_v", "all_gather_v", "all_reduce_coalesced",
    "all_gather_coalesced", "reduce_scatter_coalesced"})


def is_collective(op: str) -> bool:
    return op in COLLECTIVE_OPS


def in_place(api: str) -> bool:
    """An API that writes its first tensor argument in place: `add_`, `__iadd__`,
    `__setitem__`, MindSpore's `assign` family and `Tensor.assign_value` (what
    `Parameter.set_data` calls)."""
    return (api.endswith("_") and not api.endswith("__")) or api.startswith("__i") or \
        api in _IN_PLACE


_IN_PLACE = frozenset({"__setitem__", "assign", "assign_add", "assign_sub", "scatter_update",
                       "assign_value", "assign_value_cpp"})


# APIs whose outputs (all, or those at the listed output indices) are memory nobody has written
# yet; FSDP2's all_gather_copy_in (torch.ops.fsdp: named `fsdp.all_gather_copy_in`, see
# operator_api) returns (its input, the all-gather's empty output buffer)
_UNINITIALIZED: Dict[str, Optional[Tuple[int, ...]]] = {
    "empty": None, "empty_like": None, "new_empty": None, "empty_strided": None,
    "empty_permuted": None, "all_gather_copy_in": (1,), "fsdp.all_gather_copy_in": (1,)}


def uninitialized_output(api: str, index: int) -> bool:
    """Output `index` of `api` is memory nobody has written yet (`torch.empty`, `new_empty`,
    `mint.empty_like`): its values are whatever the allocator left there, so no statistics of
    them are recorded (they would differ between identical runs, and look like NaN/Inf)."""
    if api not in _UNINITIALIZED:
        return False
    which = _UNINITIALIZED[api]
    return which is None or index in which


def writes_arguments(api: str, op: str) -> bool:
    """A call that returns nothing writes its tensor arguments: an in-place API (`add_`,
    `_foreach_mul_`) or a collective (`all_reduce`)."""
    return is_collective(op) or (api.endswith("_") and not api.endswith("__"))


def _join(*parts: Any) -> str:
    return ".".join(str(p) for p in parts if p != "" and p is not None)


def api_entry(prefix: str, api: str, call_index: int, direction: str) -> str:
    """`Functional.linear.3.forward` (made for every captured call: one f-string)."""
    if prefix and api:
        return f"{prefix}.{api}.{call_index}.{direction}"
    return _join(prefix, api, call_index, direction)


def module_entry(prefix: str, path: str, cls: str, direction: str, call_index: int) -> str:
    """`Module.blocks.0.attn.qkv.Linear.forward.0` (the root module has an empty path)."""
    if prefix and cls:
        if path:
            return f"{prefix}.{path}.{cls}.{direction}.{call_index}"
        return f"{prefix}.{cls}.{direction}.{call_index}"
    return _join(prefix, path, cls, direction, call_index)


def save_entry(name: str, call_index: int) -> str:
    """`Save.batch.0`: the call_index-th `debugger.save("batch", ...)` of the step."""
    return _join("Save", name, call_index)


@functools.lru_cache(maxsize=1 << 16)      # asked per parameter per step: the same names again
def param_entry(path: str, role: str, call_index: int = 0) -> str:
    """`Param.blocks.0.attn.qkv.weight.grad`; inventory `Param.<path>` / `Buffer.<path>`."""
    if role == Role.PARAM_GRAD:
        return _join("Param", path, "grad", call_index if call_index else "")
    return _join("Buffer" if role == Role.BUFFER else "Param", path)


@functools.lru_cache(maxsize=None)
def read_table(path: str) -> Dict[str, Any]:
    """One of precdbg's own YAML tables (read once per process), with libyaml's loader where
    PyYAML has it: the pure-Python one took ~50 ms of the first `start()` for these files."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, "r", encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader) or {}  # noqa: S506 - a safe loader


def name_table(name: str) -> Dict[str, Any]:
    """One of the vocabulary's tables, `precdbg/records/tables/<name>`."""
    return read_table(os.path.join(_TABLES_DIR, name))



# The vocabulary a dump's framework names things in: a torch shim over MindSpore (framework
# `mindtorch`: PyTorch code on MindSpore tensors) names its modules, APIs, parameters and layer
# settings as PyTorch does, so that its dump and a PyTorch dump align by name.
_VOCABULARIES = {"pytorch": "pytorch", "mindtorch": "pytorch", "mindspore": "mindspore"}


def vocabulary(framework: str) -> str:
    """`pytorch` or `mindspore`: whose names a dump of `framework` uses (itself if unknown)."""
    return _VOCABULARIES.get(framework, framework)


def framework_table(framework: str) -> Dict[str, Any]:
    """The name table of one framework (`torch`, `mindspore`): prefixes, ignore list, aliases."""
    return name_table(f"{framework}.yaml")


def api_members(framework: str, namespace: str) -> Optional[Tuple[str, ...]]:
    """The functions of `namespace` that are APIs where the name table lists them
    (`torch.distributed`: its collectives and point-to-point calls, not `init_process_group` or
    `get_rank`), else None: every public function of it is. Read by precdbg_pt and by a torch
    shim's registry alike."""
    members = (framework_table(framework).get("api_members") or {}).get(namespace)
    return None if members is None else tuple(members)


@functools.lru_cache(maxsize=4096)
def operator_api(namespace: str, op: str) -> Optional[Tuple[str, str]]:
    """(prefix, api) of a call of the registered operator `namespace::op`, or None when such
    calls are not captured: `torch.ops.npu.npu_rms_norm` (the packet, an overload of it, the
    `torch_npu.npu_rms_norm` it is exposed as, a `torch.library.custom_op` function of that
    name) is `("NPU", "npu_rms_norm")`, msprobe's `NPU.npu_rms_norm.0.forward`;
    `torch.ops.aten.add` is None (not a user-level API); `torch.ops.mylib.scale` is
    `("Torch", "mylib.scale")`. The rules are the `operators` section of the torch name table
    (`tables/torch.yaml`); a torch shim on MindSpore names its operators by the same rules, so
    both sides of a migration name a fused op alike. The overload is never part of the name.

    >>> operator_api("npu", "npu_fusion_attention")
    ('NPU', 'npu_fusion_attention')
    """
    table = framework_table("torch")
    if op in set(table.get("ignore", ())) or not op:
        return None
    rules = table.get("operators") or {}
    namespaces = rules.get("namespaces") or {}
    if namespace in namespaces:
        prefix = namespaces[namespace]
        return (str(prefix), op) if prefix else None
    return str(rules.get("other") or "Torch"), f"{namespace}.{op}"


@functools.lru_cache(maxsize=None)
def _alias_index() -> Dict[str, str]:
    index: Dict[str, str] = {}
    for canonical, names in name_table("ops.yaml").items():
        index[canonical] = canonical
        for name in names or ():
            index[str(name)] = canonical
    return index


def normalize_api_name(name: str) -> str:
    """`__radd__` -> `add`, `add_` -> `add`, `LayerNorm` -> `layer_norm`, `Conv2d` -> `conv2d`."""
    base = name.rsplit(".", 1)[-1]
    dunder = base.startswith("__") and base.endswith("__")
    base = base.strip("_")
    if dunder:
        if base in _REFLECTED or base in _INPLACE:
            base = base[1:]
    elif name.endswith("_") and not name.endswith("__"):
        base = base.rstrip("_")
    if any(ch.isupper() for ch in base):
        base = _CAMEL.sub("_", base).lower()
    return base


# A model's own class for a standard layer: its name prefixed with the model's (Qwen2RMSNorm,
# MistralRMSNorm, MixedFusedRMSNorm), or an activation class (SiLUActivation). Only these ops are
# read through such names: a suffix alone says nothing of other layers (LlamaRotaryEmbedding is
# no embedding lookup, LinearActivation no linear layer).
_PREFIXED_NORMS = frozenset({"rms_norm", "layer_norm", "group_norm", "batch_norm"})
_ACTIVATIONS = frozenset({"gelu", "silu", "relu", "sigmoid", "tanh"})


@functools.lru_cache(maxsize=8192)
def canonical_op(name: str) -> str:
    """The canonical op of an API, method or module/cell class name."""
    base = normalize_api_name(name)
    index = _alias_index()
    if base in index:
        return index[base]
    compact = base.replace("_", "")
    for candidate in (compact, re.sub(r"\d+d$", "", base)):
        if candidate in index:
            return index[candidate]
    parts = base.split("_")
    for start in range(1, len(parts) - 1):        # a model's prefix before a norm's name
        found = index.get("_".join(parts[start:]))
        if found in _PREFIXED_NORMS:
            return found
    if len(parts) > 1 and parts[-1] == "activation":
        rest = parts[:-1]
        found = index.get("_".join(rest)) or index.get("".join(rest))
        if found in _ACTIVATIONS:
            return found
    return base


def is_known_op(op: str) -> bool:
    """Whether `op` is a canonical op of the table (a known layer or function), not merely a
    normalised name of something precdbg does not know (a user's own module class)."""
    return op in set(_alias_index().values())


def matches_any(text: str, patterns: Iterable[str]) -> bool:
    """Glob match (fnmatch, case-sensitive) of `text` against any pattern."""
    import fnmatch
    return any(fnmatch.fnmatchcase(text, p) for p in patterns)


def torch_param_leaf(framework: str, leaf: str) -> str:
    """A parameter's leaf name as PyTorch calls it (`gamma` -> `weight` in MindSpore)."""
    if framework == "mindspore":
        return framework_table("mindspore").get("param_aliases", {}).get(leaf, leaf)
    return leaf


@functools.lru_cache(maxsize=1 << 16)      # asked per parameter per step
def param_alias(framework: str, path: str, owner_cls: str) -> str:
    """The parameter's full name in the other framework's convention: MindSpore
    `ln_1.gamma` <-> PyTorch `ln_1.weight` (PyTorch names need the owning module's class)."""
    owner, _, leaf = path.rpartition(".")
    if framework == "mindspore":
        other = torch_param_leaf(framework, leaf)
    else:
        by_op = framework_table("torch").get("param_aliases_by_op", {})
        other = by_op.get(canonical_op(owner_cls), {}).get(leaf, leaf) if owner_cls else leaf
    return f"{owner}.{other}" if owner else other


def inventory_role(framework: str, leaf: str, trainable: bool) -> Role:
    """`buffer` for a frozen parameter that PyTorch keeps as a buffer (MindSpore BatchNorm's
    `moving_mean`, `moving_variance`), else `param`."""
    if not trainable and vocabulary(framework) == "mindspore" and \
            leaf in framework_table("mindspore").get("buffer_params", ()):
        return Role.BUFFER
    return Role.PARAM

