"""Reading a PyTorch checkpoint (.pt/.pth) into numpy arrays, for `precdbg compare-weights`."""
from __future__ import annotations

from typing import Dict, Mapping, Tuple

import numpy as np
import torch

from precdbg.weights import as_float_format
from precdbg.errors import DumpError

__all__ = ["load_state"]


def _why_unloadable(exc: Exception) -> str:
    """torch.load's failure in a few words: its weights-only unpickler explains at length."""
    text = str(exc)
    if "Unsupported global:" in text:       # a whole model pickled: never unpickled here
        found = text[text.index("Unsupported global:"):].split(" was not")[0].strip()
        return (f"holds pickled Python objects, not only tensors ({found}); compare-weights "
                "reads state dicts: save model.state_dict()")
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n")[0]
        return f"not a PyTorch checkpoint (torch.load: {reason})"
    first = text.splitlines()[0] if text else ""
    return f"not a loadable PyTorch checkpoint ({type(exc).__name__}: {first})"


def load_state(path: str) -> Tuple[Dict[str, np.ndarray], int]:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure means an unusable file
        raise DumpError(f"{path}: {_why_unloadable(exc)}") from None
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
        if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32,
                                                     torch.float64):
            # bfloat16 / float8: numpy has none; ml_dtypes' array of the same values (exact)
            out[str(name)] = as_float_format(t.float().numpy(), str(t.dtype).split(".")[-1])
        else:
            out[str(name)] = t.numpy()
    return out, skipped
