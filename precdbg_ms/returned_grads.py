"""The gradients a MindSpore grad function returns, linked to what the parameter hooks saw.

`value_and_grad` (every PyNative grad function: they all end in `_PyNativeExecutor.grad`) hands
back each parameter's gradient as a new Python object over the memory the parameter's gradient
hook received. precdbg knows a tensor by its object (`MindSporeTensors.identity`: reading a
data pointer waits for the op that makes the tensor), so once the backward pass returns, each
returned gradient is paired with the hook's object over the same memory and reported as its
alias: one wait for the pipeline per backward pass instead of one per record.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from precdbg.capture import ClassPatch

from .call_arguments import tensor_outputs
from .pynative import _PyNativeExecutor
from .tensors import pointer

__all__ = ["GradientLinks", "patch_grad_executor"]


class GradientLinks:
    """The gradients the parameter hooks received during one backward pass."""

    def __init__(self) -> None:
        self.seen: List[Any] = []

    def saw(self, grad: Any) -> None:
        self.seen.append(grad)

    def clear(self) -> None:
        self.seen = []

    def pairs(self, returned: Any) -> List[Tuple[Any, Any]]:
        """(hook's gradient, returned object) for each returned tensor over the memory of a
        gradient a hook saw; forgets the hooks' gradients (the pass is over)."""
        seen, self.seen = self.seen, []
        if not seen:
            return []
        by_memory: Dict[Tuple[int, Tuple[int, ...]], Any] = {}
        for grad in seen:
            where = _memory(grad)
            if where is not None:
                by_memory[where] = grad
        out = []
        for _, _, tensor in tensor_outputs(returned):
            where = _memory(tensor)
            grad = by_memory.get(where) if where is not None else None
            if grad is not None and grad is not tensor:
                out.append((grad, tensor))
        return out


def _memory(t: Any) -> Optional[Tuple[int, Tuple[int, ...]]]:
    ptr = pointer(t)
    return None if ptr is None else (ptr, tuple(t.shape))


def patch_grad_executor(adapter: Any) -> ClassPatch:
    """Wrap `_PyNativeExecutor.grad`: after the backward pass, `adapter.link_returned_grads`
    gets what it returned. The patch is a handle of the adapter's (removing it restores)."""
    def make(original: Any) -> Any:
        def grad(executor: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(executor, *args, **kwargs)
            if adapter.installed:
                adapter.run_guarded(adapter.link_returned_grads,
                                    "linking the gradients a grad function returned", out)
            return out
        return grad
    return ClassPatch(_PyNativeExecutor, "grad", make)
