"""A transformers GPT-2 (4 layers, random init, offline) trained the way the vendor guides show:
a config.json, the debugger a local of main(), start(model) / stop() / step() around iteration 1
only (of 3), no close(); AdamW, clip_grad_norm_. Used by tests/test_cause_headline.py.

    python tests/guide_gpt2_iteration1.py CONFIG VARIANT

VARIANT: base | eps (h.2.ln_2 built with eps 1e-2) | tanh (h.3's activation the tanh GELU) |
write (the batch written in place by the script inside the window: ids[:, 0] = 0).
"""
from __future__ import annotations

import sys

import torch


def main() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.activations import NewGELUActivation
    from transformers.utils import logging as hf_logging

    from precdbg_pt import PrecisionDebugger

    hf_logging.set_verbosity_error()
    config_path, variant = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, activation_function="gelu")
    model = GPT2LMHeadModel(cfg)
    if variant == "eps":
        model.transformer.h[2].ln_2.eps = 1e-2
    if variant == "tanh":
        model.transformer.h[3].mlp.act = NewGELUActivation()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    debugger = PrecisionDebugger(config_path=config_path)
    dump_step = 1
    for step in range(3):
        ids = torch.randint(1, 128, (2, 16), generator=data)
        if step == dump_step:
            debugger.start(model)
        if variant == "write":
            ids[:, 0] = 0
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == dump_step:
            debugger.stop()
            debugger.step()


if __name__ == "__main__":
    main()
