"""The guides' pattern on a model compiled with torch.compile (run by tests/test_compiled.py):

    python tests/compiled_guide.py HOW CONFIG

HOW: `none` (not compiled), `model:<backend>` (torch.compile of the whole model),
`blocks:<backend>` (each transformer block compiled on its own), `inplace:<backend>`
(nn.Module.compile()). Step 1 of 3 is dumped; no close(). Prints one JSON line: the losses, the
debugger's failure count, the compiler's stance after stop(), and how many graphs Dynamo
compiled before and after the dumped step.
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(config_path=config_path)
    graphs, losses = [], []
    for step, (x, y) in enumerate(make_batches(CONFIG, batch_size=4, steps=3)):
        if step == 1:
            graphs.append(_graphs())
            debugger.start(run)
        logits = run(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
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
                      "graphs": graphs}))


def _graphs() -> int:
    if "torch._dynamo" not in sys.modules:
        return 0
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
