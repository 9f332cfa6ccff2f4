"""The explicit registry of what precdbg wraps in MindSpore, applied by `start()` and restored
exactly by `stop()`: functions of `mindspore.ops`, `mindspore.mint`, `mindspore.mint.nn.functional`,
the methods and operators of `Tensor`, and the `__call__` of primitive classes.

The registry only discovers what to wrap; each wrap is a core `ClassPatch`, a handle that
restores exactly what was there (the owner's own attribute put back, or the wrapper deleted again
so an inherited C method shows through as before).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import mindspore as ms

from precdbg.capture import ClassPatch
from precdbg.records import framework_table

__all__ = ["PatchRegistry", "OPERATORS", "public_functions", "tensor_methods"]

_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType)
_METHOD_TYPES = (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                 types.BuiltinFunctionType)
# operators worth capturing; other dunders are object plumbing
OPERATORS = frozenset({
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__",
    "__imul__", "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__",
    "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__", "__rmatmul__", "__neg__",
    "__abs__", "__invert__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__getitem__", "__setitem__",
})


def public_functions(module: Any, ignore: set) -> List[str]:
    """The public functions of a namespace (MindSpore's, or a torch shim's), sorted."""
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_") or name in ignore or inspect.isclass(obj):
            continue
        if isinstance(obj, _FUNCTION_TYPES):
            names.append(name)
    return sorted(names)


def tensor_methods(tensor_type: type, ignore: set) -> List[str]:
    """The methods and operators of a Tensor class to wrap (the wrapper goes on the class
    itself, the original may come from its C base class), sorted."""
    out = []
    for name in sorted(set(dir(tensor_type))):
        if name in ignore or (name.startswith("_") and name not in OPERATORS):
            continue
        raw = inspect.getattr_static(tensor_type, name, None)
        if isinstance(raw, (property, staticmethod, classmethod)) or raw is None:
            continue
        if isinstance(raw, _METHOD_TYPES):
            out.append(name)
    return out


def _primitive_classes(ignore: set) -> List[type]:
    """Primitive classes that define their own `__call__` (the generated ops and the base),
    except MindSpore's own hook and autograd plumbing."""
    seen: Dict[int, type] = {}
    stack = [ms.ops.Primitive]
    while stack:
        cls = stack.pop()
        if id(cls) in seen:
            continue
        seen[id(cls)] = cls
        stack.extend(cls.__subclasses__())
    return [cls for cls in seen.values()
            if "__call__" in cls.__dict__ and cls.__name__ not in ignore]


class PatchRegistry:
    """Builds the list of entries once; `apply(make_wrapper)` wraps them all. The wrappers are
    made once too and reused by every later `apply` whose original and `make_wrapper` are the
    same (the guides' pattern starts and stops every dumped step: making ~2,500 wrappers each
    time cost ~0.1 of a step of the bundled GPT)."""

    def __init__(self) -> None:
        self._entries: Optional[List[Tuple[Any, str, str, str]]] = None
        # (id(owner), attribute) -> (original, make_wrapper, its wrapper)
        self._wrappers: Dict[Tuple[int, str], Tuple[Any, Callable, Callable]] = {}

    def entries(self) -> List[Tuple[Any, str, str, str]]:
        """(owner, attribute, prefix, API name) of everything wrapped."""
        if self._entries is None:
            table = framework_table("mindspore")
            prefixes, ignore = table["prefixes"], set(table.get("ignore", ()))
            entries: List[Tuple[Any, str, str, str]] = []
            for module_name in ("mindspore.ops", "mindspore.mint",
                                "mindspore.mint.nn.functional"):
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    continue
                prefix = prefixes[module_name]
                entries += [(module, n, prefix, n) for n in public_functions(module, ignore)]
            entries += [(ms.Tensor, n, prefixes["mindspore.Tensor"], n)
                        for n in tensor_methods(ms.Tensor, ignore)]
            entries += [(cls, "__call__", prefixes["mindspore.ops.Primitive"], "")
                        for cls in _primitive_classes(set(table.get("ignore_primitives", ())))]
            self._entries = entries
        return self._entries

    def apply(self, make_wrapper: Callable[[Any, str, str], Callable]) -> List[ClassPatch]:
        """Wrap every entry; `make_wrapper(original, prefix, api)` returns the replacement.
        Returns the patches, each a handle whose `remove()` restores its entry; entries the
        owner refuses to hold a wrapper for are skipped."""
        patches: List[ClassPatch] = []
        for owner, attr, prefix, api in self.entries():
            try:
                patches.append(ClassPatch(owner, attr, functools.partial(
                    self._wrapper, make_wrapper, (id(owner), attr), prefix, api)))
            except (AttributeError, TypeError):
                continue
        return patches

    def _wrapper(self, make_wrapper: Callable[[Any, str, str], Callable], key: Tuple[int, str],
                 prefix: str, api: str, original: Any) -> Callable:
        """The wrapper of `original` made before for this entry, or a new one."""
        known = self._wrappers.get(key)
        if known is not None and known[0] is original and known[1] == make_wrapper:
            return known[2]
        wrapper = _wrapped(make_wrapper, original, prefix, api)
        self._wrappers[key] = (original, make_wrapper, wrapper)
        return wrapper


def _wrapped(make_wrapper: Callable[[Any, str, str], Callable], original: Any, prefix: str,
             api: str) -> Callable:
    """The wrapper of one entry, looking like the original and pointing back at it."""
    wrapper = make_wrapper(original, prefix, api)
    try:
        functools.update_wrapper(wrapper, original, updated=())
    except (AttributeError, TypeError):
        pass
    wrapper.__precdbg_original__ = original
    return wrapper
