"""A torch shim over MindSpore (MSAdapter, mindnlp's `mindtorch`): PyTorch code whose `torch`
is a module of MindSpore tensors. Found by what msprobe checks too: the `torch` the process
imported makes tensors that are `mindspore.Tensor`s.

Under a shim the model's modules are the shim's `torch.nn.Module`s (plain Python classes, not
Cells) and its API calls are the shim's `torch.*`, `torch.nn.functional.*` and Tensor methods:
`ShimRegistry` lists those under exactly the names PyTorch's own calls get (the core's name
table, `precdbg/records/tables/torch.yaml`: its `api_namespaces`, prefixes and ignore list,
the ones precdbg_pt reads), and the MindSpore ops underneath are not listed.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

import mindspore as ms

from precdbg.records import api_members, framework_table

from .api_registry import PatchRegistry, public_functions, tensor_methods

__all__ = ["find_shim", "shim_versions", "ShimRegistry", "SHIM_DISTRIBUTIONS"]

# the distributions that install a torch shim, by the package name they install
SHIM_DISTRIBUTIONS = {"mindtorch": "mindnlp", "msadapter": "msadapter", "torch": "msadapter"}


def find_shim() -> Optional[Any]:
    """The shim's `torch` module when the process imported one, else None (real torch, or no
    torch). Imports nothing: a process that has not imported `torch` runs no shim."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None)
    if not isinstance(tensor_type, type):
        return None
    if issubclass(tensor_type, ms.Tensor):
        return torch
    try:            # msprobe's test: a tensor the shim makes is a MindSpore tensor
        return torch if isinstance(torch.tensor(0.0), ms.Tensor) else None
    except Exception:  # noqa: BLE001 - a torch that cannot make a tensor is no shim of ours
        return None


def _distribution_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout)
        return None


def shim_versions(torch: Any) -> Dict[str, str]:
    """What the run manifest says of the shim: its package (`mindtorch`, `msadapter`), the
    version of the distribution that installed it (or its checkout's own version string) and
    the PyTorch version it emulates (`torch_api`)."""
    package = (getattr(torch, "__file__", None) or "").replace("\\", "/").split("/")[-2:-1]
    package_name = package[0] if package else "torch"
    dist = SHIM_DISTRIBUTIONS.get(package_name, package_name)
    version = _distribution_version(dist) or str(getattr(torch, "__version__", "unknown"))
    return {"shim": package_name, "shim_distribution": dist, "shim_version": version,
            "torch_api": str(getattr(torch, "__version__", ""))}


def _real_module(module: Any) -> Any:
    """The module that holds a namespace's functions: mindnlp's `torch` and its submodules
    are proxies whose attributes are read from a `mindtorch` module (their loader's
    `target_name`); patching the proxy would miss calls made through that module."""
    target = getattr(getattr(module, "__loader__", None), "target_name", None)
    if isinstance(target, str):
        try:
            return importlib.import_module(target)
        except Exception:  # noqa: BLE001 - the proxy itself then
            return module
    return module


def _namespace(torch: Any, dotted: str) -> Optional[Any]:
    """One of `api_namespaces` in the shim: `torch.nn.functional` is the shim's module."""
    return _real_module(_proxied_namespace(torch, dotted))


def _proxied_namespace(torch: Any, dotted: str) -> Optional[Any]:
    if dotted == "torch":
        return torch
    if dotted.startswith("torch."):
        found: Any = torch
        for part in dotted.split(".")[1:]:
            found = getattr(found, part, None)
            if found is None:
                break
        if found is not None:
            return found
        try:
            return importlib.import_module(torch.__name__ + dotted[len("torch"):])
        except ImportError:
            return None
    return sys.modules.get(dotted)      # torch_npu: the shim's, when it made one


class ShimRegistry(PatchRegistry):
    """The shim's APIs as `PatchRegistry` entries: every function of its namespaces and every
    Tensor method, named as PyTorch names the same object: by the most specific namespace it
    is found in (the core's `api_namespaces` order: one object that is both `torch.conv2d` and
    `F.conv2d` is `Functional.conv2d`, whichever attribute the code called it through)."""

    def __init__(self, torch: Any) -> None:
        super().__init__()
        self.torch = torch

    def entries(self) -> List[Tuple[Any, str, str, str]]:
        if self._entries is None:
            table = framework_table("torch")
            prefixes, ignore = table["prefixes"], set(table.get("ignore", ()))
            operators = table.get("operator_names", {})   # `x + y` is Tensor.add, as in torch
            named: Dict[Any, str] = {}      # object -> the prefix it was first found under
            entries: List[Tuple[Any, str, str, str]] = []

            def add(owner: Any, name: str, prefix: str, api: str = "") -> None:
                obj = inspect.getattr_static(owner, name, None)
                try:
                    prefix = named.setdefault(obj, prefix)
                except TypeError:       # unhashable: named where found
                    pass
                entries.append((owner, name, prefix, api or name))

            for dotted in table.get("api_namespaces", ()):
                prefix = prefixes.get(dotted, prefixes["torch"])
                if dotted == "torch.Tensor":
                    tensor_type = self.torch.Tensor
                    for name in tensor_methods(tensor_type, ignore):
                        add(tensor_type, name, prefix, operators.get(name, name))
                    continue
                module = _namespace(self.torch, dotted)
                if isinstance(module, types.ModuleType):
                    members = api_members("torch", dotted)
                    names = public_functions(module, ignore) if members is None else \
                        [name for name in members if callable(getattr(module, name, None))]
                    for name in names:
                        add(module, name, prefix)
            self._entries = entries
        return self._entries
