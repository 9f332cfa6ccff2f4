"""The guides' pattern on a small residual model with activation recompute (used by
tests/test_recompute.py): `python recompute_guide.py HOW BACKWARD CONFIG` where HOW is `none`,
`reentrant` or `nonreentrant` (torch.utils.checkpoint around each block's call), `inner` (a
reentrant checkpoint of the block's body inside its forward, as transformers' checkpointing
layers do: the block's hooks run outside the checkpoint, its own calls inside), or `function`
/ `function_nonreentrant` (a checkpoint of a plain function, no module in it, inside the block:
the activation recompute of Megatron and MindSpeed), `own` (the same through a reentrant
checkpoint Function of the script's own, as other frameworks write them), `nested`
(`reentrant` around blocks that are `function` inside), or `enable_grad` (`reentrant`, the
residual add under torch.enable_grad() inside the checkpoint's forward, as Megatron's
bias-dropout-add runs) and BACKWARD is
`method` (loss.backward()) or `engine` (torch.autograd.backward(loss), as Megatron calls it).
Each block also runs a custom autograd Function whose backward calls torch functions. Prints one
JSON line: the losses and precdbg's failure count."""
from __future__ import annotations

import json
import sys

import torch
from torch.utils.checkpoint import checkpoint

from precdbg_pt import PrecisionDebugger


class ScaledTanh(torch.autograd.Function):
    """A custom op: its backward's torch calls are backward work, not forward calls."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y * 0.5

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * 0.5 * (1 - y * y)


class OwnCheckpointFunction(torch.autograd.Function):
    """A reentrant checkpoint of a framework's own (fairscale's and ColossalAI's have this
    shape): its forward runs the function without gradients, its backward runs it again with
    them and differentiates that."""

    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
        ctx.save_for_backward(*args)
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        with torch.enable_grad():
            outputs = ctx.run_function(*inputs)
        torch.autograd.backward(outputs, grads)
        return (None, *(t.grad for t in inputs))


def activation(h):
    """A plain function: the block's activation, checkpointed on its own in `function` runs."""
    return ScaledTanh.apply(torch.nn.functional.gelu(h))


class Block(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)
        self.how = how

    def forward(self, x):
        if self.how == "inner":   # the checkpoint inside: the block's own hooks run outside it
            return checkpoint(self.body, x, use_reentrant=True)
        return self.body(x)

    def body(self, x):
        h = self.fc(self.norm(x))
        if self.how == "own":
            return x + OwnCheckpointFunction.apply(activation, h)
        if self.how.startswith("function") or self.how == "nested":
            reentrant = self.how != "function_nonreentrant"
            return x + checkpoint(activation, h, use_reentrant=reentrant)
        if self.how == "enable_grad":        # a graph made in the checkpoint's forward, dropped
            y = activation(h)
            with torch.enable_grad():
                return x + y
        return x + activation(h)


class Net(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.blocks = torch.nn.ModuleList(Block(how) for _ in range(3))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for block in self.blocks:
            if self.how not in ("reentrant", "nonreentrant", "nested", "enable_grad"):
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.how != "nonreentrant")
        return self.head(x)


def main() -> None:
    how, backward, config = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.manual_seed(0)
    model = Net(how)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(config_path=config)
    x = torch.randn(8, 16, requires_grad=True)   # reentrant checkpoint needs an input with grad
    y = torch.randint(0, 4, (8,))
    losses = []
    for step in range(3):
        if step == 1:
            debugger.start(model)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if backward == "engine":
            torch.autograd.backward(loss)
        else:
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:
            debugger.stop()
            debugger.step()
        losses.append(loss.item())
    print(json.dumps({"losses": losses, "failures": debugger.failures}))


if __name__ == "__main__":
    main()
