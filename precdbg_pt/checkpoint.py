"""Reading a PyTorch checkpoint (.pt/.pth) into numpy arrays, for `precdbg compare-weights`."""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np
import torch

from precdbg.errors import DumpError

__all__ = ["load_state"]


def load_state(path: str) -> Tuple[Dict[str, np.ndarray], int]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means an unusable file
        raise DumpError(f"{path}: not a loadable PyTorch checkpoint "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                        ) from None
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model", "module"):
            inner = obj.get(key)
            if isinstance(inner, Mapping) and any(isinstance(v, torch.Tensor)
                                                  for v in inner.values()):
                obj = inner
                break
    elif isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, Mapping):
        raise DumpError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    out: Dict[str, np.ndarray] = {}
    skipped = 0
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            skipped += 1
            continue
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16 or (t.is_floating_point() and t.dtype not in
                                         (torch.float16, torch.float32, torch.float64)):
            t = t.float()
        out[str(name)] = t.numpy()
    return out, skipped
