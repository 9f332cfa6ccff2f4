"""Framework plumbing that is not the model's math (FSDP2's communication, data loading):
nothing it calls is captured, and the classes FSDP2 wraps the model's modules in keep their own
names.

FSDP2 (`torch.distributed.fsdp.fully_shard`) all-gathers each module's sharded parameters into
unsharded ones before its forward and backward, frees them after, and reduce-scatters the
gradients: dozens of torch calls per module (`empty`, `all_gather_copy_in`, views of buffers the
all-gather has not filled yet, `split_with_sizes_copy`, ...). Captured, they would fill a dump
with records of communication buffers, some of them memory nobody has written yet (values that
differ between identical runs, and pass for NaN or Inf), and `compare` could name one of them
as the first divergence. What the model computes with the gathered parameters is captured as
usual: its modules' and API calls' records read the unsharded parameters.

Data loading is no model math either: a `DataLoader` iterated inside the captured step (a
validation loader, a batch fetched inside the step function) runs unobserved, so the tensors
rebuilt as worker processes' batches arrive, at moments that depend on the workers' timing, do
not shift the order of the calls around them between two runs.

Each method is patched (a `ClassPatch`, removed at stop()) only when its module is imported.
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Dict, List, Optional

from precdbg.capture import ClassPatch

__all__ = ["plumbing_patches", "model_class"]

# module, class, methods: FSDP2's parameter group does every all-gather, free and reduce-scatter
_PLUMBING = (("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup",
              ("pre_forward", "post_forward", "pre_backward", "post_backward",
               "finalize_backward", "unshard", "wait_for_unshard", "reshard")),
             # a batch fetched inside the captured step (a validation loader): its seed draw,
             # the tensors rebuilt as workers' batches arrive (when depends on the workers'
             # timing), the dataset and collate of a loader without workers
             ("torch.utils.data.dataloader", "DataLoader", ("__iter__",)),
             ("torch.utils.data.dataloader", "_BaseDataLoaderIter", ("__next__",)))


def _fsdp2_gradients(adapter: Any, group: Any) -> None:
    """FSDP2's backward is final for a parameter group (its reduce-scatters waited for): each
    sharded parameter's `.grad`, a DTensor, is that parameter's dw (its rank's shard)."""
    for fsdp_param in getattr(group, "fsdp_params", ()):
        param = getattr(fsdp_param, "sharded_param", None)
        if param is not None:
            adapter.record_gradient(param)


# what runs after a plumbing method, observed: (class name, method) -> action(adapter, self)
_AFTER = {("FSDPParamGroup", "finalize_backward"): _fsdp2_gradients}


def plumbing_patches(adapter: Any) -> List[ClassPatch]:
    """Patches making the framework's plumbing methods run unobserved (`adapter.unobserved()`),
    for the frameworks this process has imported."""
    patches: List[ClassPatch] = []
    for module_name, class_name, methods in _PLUMBING:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if owner is None:
            continue
        for name in methods:
            if callable(getattr(owner, name, None)):
                after = _AFTER.get((class_name, name))
                patches.append(ClassPatch(owner, name, lambda original, after=after:
                                          _unobserved(adapter, original, after)))
    return patches


def _unobserved(adapter: Any, original: Callable[..., Any],
                after: Optional[Callable[[Any, Any], None]] = None) -> Callable[..., Any]:
    @functools.wraps(original)
    def plumbing(owner: Any, *args: Any, **kwargs: Any) -> Any:
        if not adapter.installed or adapter.paused:
            return original(owner, *args, **kwargs)
        with adapter.unobserved():
            result = original(owner, *args, **kwargs)
        if after is not None and adapter.installed:
            after(adapter, owner)
        return result
    return plumbing


_FSDP2_MODULE = ("torch.distributed.fsdp._fully_shard._fully_shard", "FSDPModule")


def model_class(module: Any) -> type:
    """The model's own class of a module: FSDP2's `fully_shard` turns a `GPT` into an instance
    of a new class `FSDPGPT(FSDPModule, GPT)`; its entries keep the name `GPT`, as in an
    unsharded run. Answered once per class (asked several times per module at every start:
    a class made by `fully_shard` exists only once FSDP2 is imported, so an answer never goes
    stale)."""
    cls = type(module)
    found = _MODEL_CLASSES.get(cls)
    if found is None:
        found = cls
        wrapper = getattr(sys.modules.get(_FSDP2_MODULE[0]), _FSDP2_MODULE[1], None)
        if wrapper is not None and cls is not wrapper and issubclass(cls, wrapper):
            found = next((base for base in cls.__bases__ if not issubclass(base, wrapper)), cls)
        if len(_MODEL_CLASSES) >= _MODEL_CLASSES_MAX:
            _MODEL_CLASSES.clear()
        _MODEL_CLASSES[cls] = found
    return found


# class -> the model's own class: a cache of a pure function of the class (see model_class),
# so every debugger of the process may share it
_MODEL_CLASSES: Dict[type, type] = {}
_MODEL_CLASSES_MAX = 4096     # classes kept (a model has tens; a bound for classes made at runtime)
