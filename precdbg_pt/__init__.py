"""precdbg for PyTorch (and Ascend NPU through torch_npu, imported only when present)."""
from __future__ import annotations

import random
from typing import Any, Optional

from precdbg.capture import BaseDebugger

__all__ = ["PrecisionDebugger", "seed_all"]


def seed_all(seed: int = 1234, deterministic: bool = True) -> None:
    """Seed Python, numpy and torch (every device) and optionally force deterministic kernels."""
    import os

    import numpy as np
    import torch
    from precdbg.capture import record_seed_all
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)     # every device's generator, CUDA and NPU included
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    record_seed_all("pytorch", seed, deterministic)


class PrecisionDebugger(BaseDebugger):
    """Dump PyTorch training steps to HDF5.

    >>> debugger = PrecisionDebugger(task="statistics", level="mix", dump_path="./dump", step=[1])
    >>> for batch in loader:
    ...     debugger.start(model); train_step(batch); debugger.stop(); debugger.step()
    """

    def __init__(self, config_path: Optional[str] = None, model: Any = None,
                 **settings: Any) -> None:
        from .adapter import TorchAdapter
        super().__init__(config_path, TorchAdapter, model=model, **settings)
        if self.config.seed is not None or self.config.deterministic:
            seed_all(self.config.seed if self.config.seed is not None else 1234,
                     self.config.deterministic)
