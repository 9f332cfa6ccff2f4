"""precdbg: find where two training runs stop agreeing.

The core is framework-neutral (it imports neither torch nor mindspore). Use the adapters
`precdbg_pt.PrecisionDebugger` (PyTorch, torch_npu) or `precdbg_ms.PrecisionDebugger` (MindSpore)
to dump, and `precdbg.open_dump` or the `precdbg` command to read.
"""
__version__ = "0.1.0"

from .config import DumpConfig, load_config  # noqa: E402
from .errors import ConfigError, DumpError, FrameworkError, PrecdbgError  # noqa: E402
from .reader import Dump, RecordTable, open_dump  # noqa: E402

__all__ = ["__version__", "open_dump", "Dump", "RecordTable", "DumpConfig", "load_config",
           "PrecdbgError", "ConfigError", "DumpError", "FrameworkError"]
