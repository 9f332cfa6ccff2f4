"""A transformers Llama (2 layers, GQA, random init, built offline) trained the way the vendor
guides show, on a CUDA GPU or the CPU: a config.json, the debugger a local of main(), start(model)
/ stop() / step() around the dumped iteration only, no close(); two micro-batches accumulated,
clip_grad_norm_, AdamW. Used by tests/test_cuda_realloop.py (real processes).

    python tests/cuda_realloop_guide.py OUT VARIANT [--device cuda|cpu] [--bf16] [--dump N]

VARIANT: plain | recompute (HF gradient checkpointing, non-reentrant) | eps (layer 1's input
RMSNorm built with eps 1e-2 instead of 1e-6: the defect a user would be hunting).
--dump N: the iteration dumped (default 1 of 3). Prints one JSON line: the losses.
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("variant", choices=("plain", "recompute", "eps"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--dump", type=int, default=1)
    args = parser.parse_args()

    import transformers

    from precdbg_pt import PrecisionDebugger

    device = torch.device(args.device)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688,
                                      num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, vocab_size=1024,
                                      max_position_embeddings=256, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    if args.variant == "eps":
        model.model.layers[1].input_layernorm.variance_epsilon = 1e-2
    if args.variant == "recompute":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    batches = [[torch.randint(0, 1024, (2, 128), generator=generator) for _ in range(2)]
               for _ in range(3)]
    config_path = os.path.join(args.out, f"config_{args.variant}.json")
    os.makedirs(args.out, exist_ok=True)
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump({"task": "statistics", "level": "mix", "step": [0],
                   "dump_path": os.path.join(args.out, args.variant)}, handle)
    debugger = PrecisionDebugger(config_path=config_path)
    losses = []
    for iteration, micro_batches in enumerate(batches):
        if iteration == args.dump:
            debugger.start(model)
        total = 0.0
        for ids in micro_batches:
            ids = ids.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss / len(micro_batches)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if iteration == args.dump:
            debugger.stop()
            debugger.step()
        losses.append(total)
    print(json.dumps({"losses": losses, "failures": debugger.failures}))


if __name__ == "__main__":
    main()
