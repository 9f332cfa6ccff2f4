"""A process whose `torch` is mindnlp's shim dumping a native MindSpore Cell model and a shim
model side by side (tests/test_shim.py): the guides' pattern, then checks that every hook the
user set on the shim's modules is still there and runs, and nothing of precdbg's is left.

    python tests/shim_mixed_guide.py DUMP_DIR
"""
from __future__ import annotations

import sys

import mindspore as ms

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
import mindnlp  # noqa: E402,F401  - `torch` is the shim from here on
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mindspore import nn  # noqa: E402

from precdbg_ms import PrecisionDebugger  # noqa: E402


def hook_counts(module) -> list:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules()]


def main() -> int:
    cell = nn.SequentialCell([nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2)])
    shim = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh())
    seen = []
    shim[0].register_forward_hook(lambda m, a, out: seen.append("user hook"))
    before = hook_counts(shim)
    params = cell.trainable_params() + list(shim.parameters())
    x = ms.Tensor(np.ones((5, 4), np.float32))
    y = torch.ones(5, 2)           # the shim's own tensor (a MindSpore one has no device)

    def loss_fn(x):
        # MindSpore functions for the native part: the shim replaced the Tensor methods with its
        # own, which need a device a MindSpore tensor lacks (without precdbg as with it)
        return ms.ops.add(ms.ops.sum(cell(x)), ms.ops.sum(shim(y)))

    grad_fn = ms.value_and_grad(loss_fn, None, params)
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=sys.argv[1],
                                 step=[0])
    for step in range(2):
        if step == 1:
            debugger.start([cell, shim])
        loss, grads = grad_fn(x)
        if step == 1:
            debugger.stop()
            debugger.step()
    assert hook_counts(shim) == before, (hook_counts(shim), before)
    assert seen == ["user hook"] * 2, seen
    print("loss", float(loss.asnumpy()), "grads", len(grads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
