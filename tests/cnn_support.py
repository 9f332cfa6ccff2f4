"""A small CNN written twice, PyTorch and MindSpore (Conv2d, BatchNorm2d, ReLU, MaxPool2d,
Flatten, Linear/Dense), with the same attribute names, so that a twin of the same weights and
data can be dumped on both sides (tests/test_twins.py).

MindSpore's choices that differ from torch's are made explicit here: Conv2d pad_mode="pad",
has_bias=False (torch bias=False; `conv_bias` gives both convolutions a bias, whose gradient
the BatchNorm after them makes pure rounding); BatchNorm2d momentum=0.9 (MindSpore's convention
of torch's 0.1: `torch_momentum` below builds the MindSpore cell with torch's number instead).
Run as a script, one dump in a fresh process:

    python tests/cnn_support.py {torch|mindspore} DUMP_PATH [--steps N] [--torch-momentum]
        [--conv-bias] [--bias-grad-offset F]

`--bias-grad-offset F` (torch) adds F x the norm of conv1's dy to each element of conv1's bias
gradient before the optimizer reads it (tensor hooks): a real change of that gradient alone.
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


def torch_state(conv_bias: bool = False) -> Dict[str, np.ndarray]:
    """The seeded torch CNN's initial weights (numpy, state_dict names)."""
    import torch
    torch.manual_seed(SEED)
    return {k: v.detach().numpy().copy() for k, v in torch_model(conv_bias).state_dict().items()}


def torch_model(conv_bias: bool = False) -> Any:
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(CHANNELS, 8, 3, padding=1, bias=conv_bias)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=conv_bias)
            self.bn2 = nn.BatchNorm2d(8)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(8 * (SIZE // 2) ** 2, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.relu(self.bn2(self.conv2(x)))
            return self.fc(self.flatten(x))
    return CNN()


def mindspore_model(torch_momentum: bool = False, conv_bias: bool = False) -> Any:
    from mindspore import nn

    class CNN(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            momentum = 0.1 if torch_momentum else 0.9      # torch's number copied literally
            self.conv1 = nn.Conv2d(CHANNELS, 8, 3, pad_mode="pad", padding=1, has_bias=conv_bias)
            self.bn1 = nn.BatchNorm2d(8, momentum=momentum)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="pad", padding=1, has_bias=conv_bias)
            self.bn2 = nn.BatchNorm2d(8, momentum=0.9)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(8 * (SIZE // 2) ** 2, CLASSES)
            self.set_train(True)

        def construct(self, x: Any) -> Any:
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.relu(self.bn2(self.conv2(x)))
            return self.fc(self.flatten(x))
    return CNN()


def _offset_bias_grad(model: Any, offset: float) -> None:
    """Add `offset` x the norm of conv1's incoming gradient (dy) to each element of conv1's
    bias gradient before the optimizer reads it: a real change, `offset` of the terms that
    gradient is summed from (it is itself only their rounding under BatchNorm)."""
    seen: Dict[str, Any] = {}

    def keep_dy(grad: Any) -> None:
        seen["dy"] = grad.detach().norm()

    def hook_output(module: Any, args: Any, out: Any) -> None:
        out.register_hook(keep_dy)

    model.conv1.register_forward_hook(hook_output)
    model.conv1.bias.register_hook(lambda grad: grad + offset * seen["dy"])


def dump_torch(path: str, steps: int = 2, conv_bias: bool = False,
               bias_grad_offset: float = 0.0) -> None:
    import torch
    import torch.nn.functional as F

    import precdbg_pt
    torch.manual_seed(SEED)
    model = torch_model(conv_bias)
    if bias_grad_offset:
        _offset_bias_grad(model, bias_grad_offset)
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


def dump_mindspore(path: str, steps: int = 2, torch_momentum: bool = False,
                   conv_bias: bool = False) -> None:
    import mindspore as ms
    from mindspore import nn, ops

    import precdbg_ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = mindspore_model(torch_momentum, conv_bias)
    state = torch_state(conv_bias)
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
    parser.add_argument("--conv-bias", action="store_true")
    parser.add_argument("--bias-grad-offset", type=float, default=0.0,
                        help="torch only: add this x |dy| to conv1's bias gradient")
    args = parser.parse_args(argv)
    if args.framework == "torch":
        dump_torch(args.path, args.steps, args.conv_bias, args.bias_grad_offset)
    else:
        dump_mindspore(args.path, args.steps, args.torch_momentum, args.conv_bias)
    return 0


if __name__ == "__main__":
    sys.exit(main())
