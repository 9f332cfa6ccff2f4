"""precdbg: find where two training runs stop agreeing.

The core is framework-neutral (it imports neither torch nor mindspore). Use the adapters
`precdbg_pt.PrecisionDebugger` (PyTorch, torch_npu) or `precdbg_ms.PrecisionDebugger` (MindSpore)
to dump, and `precdbg.open_dump` or the `precdbg` command to read. Attributes are imported on
first use, so `import precdbg` (and the command's start-up) stays cheap.
"""
from typing import Any

from .errors import ConfigError, DumpError, FrameworkError, PrecdbgError
from .version import __version__

_LAZY = {"open_dump": "storage", "Dump": "storage", "RecordTable": "storage",
         "DumpConfig": "config", "load_config": "config"}

__all__ = ["__version__", "open_dump", "Dump", "RecordTable", "DumpConfig", "load_config",
           "PrecdbgError", "ConfigError", "DumpError", "FrameworkError"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'precdbg' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
