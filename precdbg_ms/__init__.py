"""precdbg for MindSpore (PyNative mode; CPU, GPU and Ascend through the same code), for native
Cells and for PyTorch code running on MindSpore through a torch shim (mindnlp's `mindtorch`,
MSAdapter): where the process's `torch` is such a shim, the debugger records the shim's modules
and `torch.*` calls under PyTorch's names (framework `mindtorch`)."""
from __future__ import annotations

import random
from typing import Any, Optional

from precdbg.capture import BaseDebugger

__all__ = ["PrecisionDebugger", "seed_all"]


def seed_all(seed: int = 1234, deterministic: bool = True) -> None:
    """Seed Python, numpy and MindSpore and optionally ask for deterministic kernels."""
    import os

    import mindspore as ms
    import numpy as np
    from precdbg.capture import record_seed_all
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    if deterministic:
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
        ms.set_context(deterministic="ON")
    record_seed_all("mindspore", seed, deterministic)


def _adapter_factory() -> Any:
    """The adapter for this process: the shim mode's where `torch` is a shim over MindSpore."""
    from .torch_shim import find_shim
    torch = find_shim()
    if torch is None:
        from .adapter import MindSporeAdapter
        return MindSporeAdapter
    import functools

    from .shim_adapter import ShimAdapter
    return functools.partial(ShimAdapter, torch)


class PrecisionDebugger(BaseDebugger):
    """Dump MindSpore training steps to HDF5, with the same config and records as PyTorch.

    >>> debugger = PrecisionDebugger(task="statistics", level="mix", dump_path="./dump", step=[1])
    >>> for x, y in dataset:
    ...     debugger.start(model); loss = train_step(x, y); debugger.stop(); debugger.step()
    """

    def __init__(self, config_path: Optional[str] = None, model: Any = None,
                 **settings: Any) -> None:
        super().__init__(config_path, _adapter_factory(), model=model, **settings)
        if self.config.seed is not None or self.config.deterministic:
            seed_all(self.config.seed if self.config.seed is not None else 1234,
                     self.config.deterministic)
