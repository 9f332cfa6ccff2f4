"""The guides' pattern on a small MindSpore model with activation recompute (used by
tests/test_ms_recompute.py): `python recompute_guide_ms.py HOW [perturb] CONFIG` where HOW is
`none`, `reentrant` or `nonreentrant` (`Cell.recompute()` on each block; `nonreentrant` needs
MindSpore 2.8+) or `functional` (`mindspore.recompute(block, ...)` in the model's construct);
`perturb` scales the second block's first weight by 1.01 just before the dumped step (a real
difference). Each block takes the activations and a constant table (a data input no gradient is
asked of, as rotary tables and masks are) and runs a parameter-free cell on it; a dropout with
p=0 returns its input.
Prints one JSON line: the losses and precdbg's failure count."""
from __future__ import annotations

import inspect
import json
import sys

import numpy as np

import mindspore as ms
from mindspore import mint, nn

ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.runtime.launch_blocking()

from precdbg_ms import PrecisionDebugger  # noqa: E402

# `Cell.recompute(use_reentrant=...)` (2.8+); MindSpore 2.7's takes no such keyword and its
# recompute is the reentrant one (tests/test_ms_recompute.py skips `nonreentrant` there)
NON_REENTRANT = "use_reentrant" in inspect.signature(nn.Cell.recompute).parameters


class Block(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm((16,), epsilon=1e-5)
        self.fc = nn.Dense(16, 16)
        self.act = nn.Tanh()
        self.fc2 = nn.Dense(16, 16)
        self.drop = nn.Dropout(p=0.0)             # returns its input: no backward of its own

    def construct(self, x: ms.Tensor, table: ms.Tensor) -> ms.Tensor:
        scaled = self.act(table) * 0.5            # computed from the constant alone
        h = self.fc(self.norm(x)) * scaled
        return x + self.drop(self.fc2(mint.tanh(h)))


class Net(nn.Cell):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.blocks = nn.CellList([Block() for _ in range(3)])
        if how == "reentrant" and not NON_REENTRANT:
            for block in self.blocks:
                block.recompute()     # MindSpore 2.7: reentrant is the only recompute
        elif how in ("reentrant", "nonreentrant"):
            for block in self.blocks:
                block.recompute(use_reentrant=how == "reentrant")
        self.head = nn.Dense(16, 4)

    def construct(self, x: ms.Tensor, table: ms.Tensor) -> ms.Tensor:
        for block in self.blocks:
            x = ms.recompute(block, x, table) if self.how == "functional" else block(x, table)
        return self.head(x)


def main() -> None:
    how, config = sys.argv[1], sys.argv[-1]
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    net = Net(how)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    x = ms.Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    table = ms.Tensor(rng.standard_normal((8, 16)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((8, 4)).astype(np.float32))

    def loss_fn(x: ms.Tensor, table: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        return ((net(x, table) - y) ** 2).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
    debugger = PrecisionDebugger(config_path=config)
    losses = []
    for step in range(3):
        if step == 1:
            if "perturb" in sys.argv[2:-1]:
                weight = net.blocks[1].fc.weight
                weight.set_data(weight * 1.01)
            debugger.start(net)
        loss, grads = grad_fn(x, table, y)
        optimizer(grads)
        if step == 1:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.asnumpy()))
    print(json.dumps({"losses": losses, "failures": debugger.failures}))


if __name__ == "__main__":
    main()
