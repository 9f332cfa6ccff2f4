"""The guides' pattern on a model compiled with torch.compile (run by tests/test_compiled.py):

    python tests/compiled_guide.py HOW CONFIG

HOW: `none` (not compiled), `model:<backend>` (torch.compile of the whole model),
`blocks:<backend>` (each transformer block compiled on its own), `inplace:<backend>`
(nn.Module.compile()), `loss:<backend>` (the loss function compiled on its first use, inside the
dumped step, and plain SGD written out instead of a torch.optim optimizer, which would import
TorchDynamo: so it is first imported while precdbg captures), `sgd` (the same SGD, nothing
compiled). Step 1 of 3 is dumped; no
close(). Prints one JSON line: the losses, the debugger's failure count, the compiler's stance
after stop(), how many graphs Dynamo compiled before and after the dumped step, and whether
TorchDynamo was imported when the step started.
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches
from precdbg_pt import PrecisionDebugger

CONFIG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=4, d_model=32)


def main(how: str, config_path: str) -> None:
    torch.manual_seed(0)
    model = GPT(CONFIG)
    kind, _, backend = how.partition(":")
    run = model
    if kind == "model":
        run = torch.compile(model, backend=backend)
    elif kind == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = torch.compile(block, backend=backend)
    elif kind == "inplace":
        model.compile(backend=backend)
    optimizer = _SGD(model) if kind in ("loss", "sgd") else \
        torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(config_path=config_path)
    graphs, losses = [], []
    loss_fn = _loss
    dynamo_at_start = None
    for step, (x, y) in enumerate(make_batches(CONFIG, batch_size=4, steps=3)):
        if step == 1:
            graphs.append(_graphs())
            dynamo_at_start = "torch._dynamo" in sys.modules
            debugger.start(run)
            if kind == "loss":            # compiled on its first use, while captured
                loss_fn = torch.compile(_loss, backend=backend)
        logits = run(x)
        loss = loss_fn(logits, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 1:
            debugger.stop()
            debugger.step()
            graphs.append(_graphs())
        losses.append(loss.item())
    graphs.append(_graphs())
    stance = None
    if "torch._dynamo" in sys.modules:
        stance = torch._dynamo.eval_frame._stance.stance
    print(json.dumps({"losses": losses, "failures": debugger.failures, "stance": stance,
                      "graphs": graphs, "dynamo_at_start": dynamo_at_start}))


class _SGD:
    """Plain SGD without torch.optim (whose optimizers import TorchDynamo when made)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())

    def step(self) -> None:
        with torch.no_grad():
            for p in self.params:
                p.add_(p.grad, alpha=-0.1)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def _loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _graphs() -> int:
    if "torch._dynamo" not in sys.modules:
        return 0
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
