"""Small transformers models (a GPT-2 and a ResNet, 2-4 layers, random init, offline) trained the
way the vendor guides show: a config.json, the debugger a local of main(), start(model) / stop() /
step() around iteration 1 only (of 3), no close(); the loss an `nn.CrossEntropyLoss` of the
script's, outside the model; AdamW. One defect per variant, present from iteration 0 on, so the
weights already differ at the dumped step's start. Used by tests/test_iteration1_pairs.py.

    python tests/guide_iteration1_pairs.py CONFIG VARIANT

GPT-2 variants: base | scale (h.1's attention scale 1.0 instead of head_dim**-0.5) |
initw (h.0.attn.c_proj's weight scaled by 1.01 at init) | hook (a gradient hook scaling
h.2.mlp.c_fc's weight gradient by 1.01) | adam_eps (AdamW eps 1e-6 instead of 1e-8) |
wd (weight decay 0.1 instead of 0.0) | dropout (h.1.mlp.dropout's p 0.1 instead of 0.0) |
smooth (the loss module's label_smoothing 0.1 instead of 0.0) | threads (2 torch threads, not 1).
ResNet variants: resnet_base | resnet_eps (one BatchNorm's eps 1e-3 instead of 1e-5) |
resnet_momentum (another BatchNorm's momentum 0.2 instead of 0.1: only its running statistics) |
resnet_threads (2 torch threads, not 1).
"""
from __future__ import annotations

import sys

import torch


def gpt2(variant: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, activation_function="gelu")
    model = GPT2LMHeadModel(cfg)
    h = model.transformer.h
    if variant == "scale":
        h[1].attn.scaling = 1.0                  # as scale_attn_weights=False builds it
    if variant == "initw":
        with torch.no_grad():
            h[0].attn.c_proj.weight.mul_(1.01)
    if variant == "hook":
        h[2].mlp.c_fc.weight.register_hook(lambda g: g * 1.01)
    if variant == "dropout":
        h[1].mlp.dropout.p = 0.1
    data = torch.Generator().manual_seed(1)

    def batch():
        ids = torch.randint(1, 64, (2, 12), generator=data)
        return ids[:, :-1], ids[:, 1:]

    def logits(model, x):
        return model(x).logits.reshape(-1, 64)

    return model, batch, logits


def resnet(variant: str):
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                       layer_type="basic", num_labels=4)
    model = ResNetForImageClassification(cfg)
    if variant == "resnet_eps":
        model.resnet.encoder.stages[1].layers[0].layer[0].normalization.eps = 1e-3
    if variant == "resnet_momentum":
        model.resnet.encoder.stages[0].layers[0].layer[1].normalization.momentum = 0.2
    data = torch.Generator().manual_seed(1)

    def batch():
        return torch.randn(4, 3, 16, 16, generator=data), torch.randint(0, 4, (4,),
                                                                         generator=data)

    def logits(model, x):
        return model(x).logits

    return model, batch, logits


def main() -> None:
    from transformers.utils import logging as hf_logging

    from precdbg_pt import PrecisionDebugger

    hf_logging.set_verbosity_error()
    config_path, variant = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2 if variant.endswith("threads") else 1)
    torch.manual_seed(0)
    model, batch, logits = (resnet if variant.startswith("resnet") else gpt2)(variant)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3,
                            eps=1e-6 if variant == "adam_eps" else 1e-8,
                            weight_decay=0.1 if variant == "wd" else 0.0)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1 if variant == "smooth" else 0.0)
    debugger = PrecisionDebugger(config_path=config_path)
    dump_step = 1
    for step in range(3):
        x, y = batch()
        if step == dump_step:
            debugger.start(model)
        loss = loss_fn(logits(model, x), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == dump_step:
            debugger.stop()
            debugger.step()


if __name__ == "__main__":
    main()
