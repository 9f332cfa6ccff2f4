"""Wrappers a model is named through: `torch.compile`'s `OptimizedModule` and the wrappers whose
forward only hands the call to the module they hold (DistributedDataParallel, DataParallel,
DeepSpeed's engine, Megatron's DistributedDataParallel and Float16Module, the activation
checkpoint wrapper of `apply_activation_checkpointing`). A wrapped module is walked and named as
the module it wraps, under the wrapper's own path: `module.` / `_orig_mod.` /
`_checkpoint_wrapped_module.` never appear in module paths or parameter names, so a DDP run, a
compiled run and a single-process eager run (and MindSpore's twin) pair record for record.

Calls a wrapper makes itself (DDP's buffer broadcast, Float16Module's input and output casts)
are still captured, as calls outside the wrapped model. Wrapper classes are looked up in
`sys.modules`: nothing is imported here.
"""
from __future__ import annotations

import sys
from typing import Iterator, List, Optional, Tuple

import torch

__all__ = ["named_submodules", "walk", "unwrap"]

_ORIG_MOD = "_orig_mod"       # torch._dynamo.eval_frame.OptimizedModule's wrapped module
_COMPILE_WRAPPER = ("torch._dynamo.eval_frame", "OptimizedModule", _ORIG_MOD)
# (module, class, attribute holding the wrapped module)
_HANDING_OVER = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "module"),
    ("torch.nn.parallel.data_parallel", "DataParallel", "module"),
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper", "ActivationWrapper",
     "_checkpoint_wrapped_module"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "module"),
    ("megatron.core.distributed.distributed_data_parallel", "DistributedDataParallel", "module"),
    ("megatron.core.transformer.module", "Float16Module", "module"),
)


def _wrapper_types() -> List[Tuple[type, str, bool]]:
    """(class, attribute, is the compile wrapper) of every wrapper class imported so far."""
    found = []
    for module_name, cls_name, attribute in (_COMPILE_WRAPPER,) + _HANDING_OVER:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if isinstance(cls, type):
            found.append((cls, attribute, attribute == _ORIG_MOD))
    return found


def unwrap(module: torch.nn.Module, wrappers: Optional[List[Tuple[type, str, bool]]] = None
           ) -> Tuple[torch.nn.Module, bool]:
    """(the module the wrappers around `module` hold, or the module itself; whether it is
    compiled: a `torch.compile` wrapper was among them, or `nn.Module.compile()` in place)."""
    wrappers = _wrapper_types() if wrappers is None else wrappers
    compiled = bool(getattr(module, "_compiled_call_impl", None))
    while True:
        for cls, attribute, is_compile in wrappers:
            inner = getattr(module, attribute, None) if isinstance(module, cls) else None
            if isinstance(inner, torch.nn.Module):
                module, compiled = inner, compiled or is_compile
                break
        else:
            return module, compiled or bool(getattr(module, "_compiled_call_impl", None))


def walk(module: torch.nn.Module) -> Iterator[Tuple[str, torch.nn.Module, bool]]:
    """(path, module, compiled) of `module` and everything below it, in `named_modules()`
    order, every wrapper replaced by the module it wraps under the wrapper's own path; shared
    modules once."""
    wrappers = _wrapper_types()
    seen = set()
    top, compiled = unwrap(module, wrappers)
    stack: List[Tuple[str, torch.nn.Module, bool]] = [("", top, compiled)]
    while stack:
        path, current, compiled = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield path, current, compiled
        children = []
        for name, child in current._modules.items():
            if child is not None:
                inner, child_compiled = unwrap(child, wrappers)
                children.append((f"{path}.{name}" if path else name, inner, child_compiled))
        stack.extend(reversed(children))


def named_submodules(module: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    """`module.named_modules()` (the model's own, should it override it); where that holds a
    wrapper, the walk of `walk` instead, wrappers replaced by what they wrap."""
    entries = list(module.named_modules())
    wrappers = tuple(cls for cls, _, _ in _wrapper_types())
    if not wrappers or not any(isinstance(sub, wrappers) for _, sub in entries):
        return entries
    return [(path, sub) for path, sub, _ in walk(module)]
