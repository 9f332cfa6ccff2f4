"""Reading a MindSpore checkpoint (.ckpt) into numpy arrays, for `precdbg compare-weights`."""
from __future__ import annotations

from typing import Dict, Tuple

import mindspore
import numpy as np

from precdbg.weights import as_float_format
from precdbg.errors import DumpError

__all__ = ["load_state"]


def load_state(path: str) -> Tuple[Dict[str, np.ndarray], int]:
    try:
        params = mindspore.load_checkpoint(path)
    except Exception as exc:  # noqa: BLE001
        raise DumpError(f"{path}: not a loadable MindSpore checkpoint "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                        ) from None
    out: Dict[str, np.ndarray] = {}
    skipped = 0
    for name, value in params.items():
        try:
            out[str(name)] = value.asnumpy()
        except Exception:  # noqa: BLE001 - dtypes numpy cannot hold (bf16 in some versions)
            try:
                out[str(name)] = as_float_format(value.astype(mindspore.float32).asnumpy(),
                                                 str(value.dtype).lower())
            except Exception:  # noqa: BLE001
                skipped += 1
    return out, skipped
