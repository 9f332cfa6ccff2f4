"""A small CNN written twice, PyTorch and MindSpore (Conv2d, BatchNorm2d, ReLU, MaxPool2d,
Flatten, Linear/Dense), with the same attribute names, so that a twin of the same weights and
data can be dumped on both sides (tests/test_twins.py).

MindSpore's choices that differ from torch's are made explicit here: Conv2d pad_mode="pad",
has_bias=False (torch bias=False); BatchNorm2d momentum=0.9 (MindSpore's convention of torch's
0.1: `torch_momentum` below builds the MindSpore cell with torch's number instead). Run as a
script, one dump in a fresh process:

    python tests/cnn_support.py {torch|mindspore} DUMP_PATH [--steps N] [--torch-momentum]
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Dict, List, Tuple

import numpy as np

SEED = 0
BATCH, CHANNELS, SIZE, CLASSES = 4, 3, 8, 10
LR = 0.1
# MindSpore parameter leaf -> torch state_dict leaf
_MS_TO_TORCH = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
                "moving_variance": "running_var"}


def batches(steps: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(SEED)
    return [(rng.standard_normal((BATCH, CHANNELS, SIZE, SIZE)).astype(np.float32),
             rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)) for _ in range(steps)]


def torch_state() -> Dict[str, np.ndarray]:
    """The seeded torch CNN's initial weights (numpy, state_dict names)."""
    import torch
    torch.manual_seed(SEED)
    return {k: v.detach().numpy().copy() for k, v in torch_model().state_dict().items()}


def torch_model() -> Any:
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(CHANNELS, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(8)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(8 * (SIZE // 2) ** 2, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.relu(self.bn2(self.conv2(x)))
            return self.fc(self.flatten(x))
    return CNN()


def mindspore_model(torch_momentum: bool = False) -> Any:
    from mindspore import nn

    class CNN(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            momentum = 0.1 if torch_momentum else 0.9      # torch's number copied literally
            self.conv1 = nn.Conv2d(CHANNELS, 8, 3, pad_mode="pad", padding=1, has_bias=False)
            self.bn1 = nn.BatchNorm2d(8, momentum=momentum)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, has_bias=False)
            self.bn2 = nn.BatchNorm2d(8, momentum=0.9)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(8 * (SIZE // 2) ** 2, CLASSES)
            self.set_train(True)

        def construct(self, x: Any) -> Any:
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.relu(self.bn2(self.conv2(x)))
            return self.fc(self.flatten(x))
    return CNN()


def dump_torch(path: str, steps: int = 2) -> None:
    import torch
    import torch.nn.functional as F

    import precdbg_pt
    torch.manual_seed(SEED)
    model = torch_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dbg = precdbg_pt.PrecisionDebugger(dump_path=path, level="mix")
    for x, y in batches(steps):
        xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
        dbg.start(model)
        loss = F.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures


def dump_mindspore(path: str, steps: int = 2, torch_momentum: bool = False) -> None:
    import mindspore as ms
    from mindspore import nn, ops

    import precdbg_ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = mindspore_model(torch_momentum)
    state = torch_state()
    for p in model.get_parameters():
        prefix, _, leaf = p.name.rpartition(".")
        p.set_data(ms.Tensor(state[f"{prefix}.{_MS_TO_TORCH.get(leaf, leaf)}"]))
    opt = nn.SGD(model.trainable_params(), learning_rate=LR)

    def forward(x: Any, y: Any) -> Any:
        return ops.cross_entropy(model(x), y)
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    dbg = precdbg_ms.PrecisionDebugger(dump_path=path, level="mix")
    for x, y in batches(steps):
        xm, ym = ms.Tensor(x), ms.Tensor(y)
        dbg.start(model)
        _, grads = grad_fn(xm, ym)
        opt(grads)
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=["torch", "mindspore"])
    parser.add_argument("path")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--torch-momentum", action="store_true")
    args = parser.parse_args(argv)
    if args.framework == "torch":
        dump_torch(args.path, args.steps)
    else:
        dump_mindspore(args.path, args.steps, args.torch_momentum)
    return 0


if __name__ == "__main__":
    sys.exit(main())
