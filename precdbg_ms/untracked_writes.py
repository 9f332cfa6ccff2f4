"""Writes into a tensor's memory that no captured API makes: `Parameter.set_data` (a manual
update, a checkpoint load), `Tensor.assign_value`, and `asnumpy()`/`numpy()`, which hand out a
writable view of host memory.

Statistics of host tensors wait for the batch at levels mix and api (see `tensors`), so before
any of these runs the adapter reads what is still waiting (`settle`): each record keeps the
value its tensor had when captured. Afterwards the tensor counts one more write (for a view
handed out: it may be written through), so a later record of the same object is a new version
with statistics of its own. (A write through a view handed out earlier, made after a later
record of the same object was captured, is not seen before that record's batch is read.)
"""
from __future__ import annotations

from typing import Any, List

import mindspore as ms

from precdbg.capture import ClassPatch

__all__ = ["patch_writes"]

_METHODS = ((ms.Parameter, "set_data"), (ms.Tensor, "assign_value"), (ms.Tensor, "asnumpy"),
            (ms.Tensor, "numpy"))


def patch_writes(adapter: Any) -> List[ClassPatch]:
    """Patches (handles of the adapter's) that settle deferred statistics before the methods
    above and count a write after them (in the adapter's `tensors`). precdbg's own calls
    (`adapter.busy`) pass through."""
    note_write = adapter.tensors.note_write

    def wrap(original: Any) -> Any:
        def call(t: Any, *args: Any, **kwargs: Any) -> Any:
            if adapter.busy or not adapter.installed:
                return original(t, *args, **kwargs)
            adapter.settle_statistics()
            out = original(t, *args, **kwargs)
            adapter.run_guarded(note_write, "counting a write", t)
            return out
        call.__precdbg_original__ = original          # type: ignore[attr-defined]
        return call

    return [ClassPatch(owner, name, wrap) for owner, name in _METHODS if hasattr(owner, name)]
