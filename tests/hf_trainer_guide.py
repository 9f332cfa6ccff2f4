"""The guides' pattern inside a Hugging Face `Trainer`: a `TrainerCallback` that calls
`start(model)` in `on_step_begin` and `stop(); step()` in `on_step_end` (no close(), no `with`),
on a tiny random-init Llama (offline), with the Trainer's own loop: gradient accumulation 2,
`max_grad_norm` clipping through accelerate, AdamW, a linear schedule.

    python tests/hf_trainer_guide.py OUT VARIANT     # VARIANT: base, eps, bf16, recompute

`eps` builds RMSNorm with another epsilon, `bf16` trains under the Trainer's bf16 autocast,
`recompute` turns on the Trainer's gradient checkpointing. Step 0 is dumped into OUT/dump; the
losses of every step go to OUT/losses.json.
"""
from __future__ import annotations

import json
import os
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

from precdbg_pt import PrecisionDebugger


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class PrecdbgCallback(TrainerCallback):
    def __init__(self, config_path: str) -> None:
        self.debugger = PrecisionDebugger(config_path=config_path)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.debugger.start(model)

    def on_step_end(self, args, state, control, **kwargs):
        self.debugger.stop()
        self.debugger.step()


class _Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main(out: str, variant: str) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                         max_position_embeddings=32, use_cache=False,
                         rms_norm_eps=1e-2 if variant == "eps" else 1e-6)
    model = LlamaForCausalLM(config)
    config_path = os.path.join(out, "config.json")
    with open(config_path, "w") as handle:
        json.dump({"task": "statistics", "level": "mix", "step": [0],
                   "dump_path": os.path.join(out, "dump")}, handle)
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), max_steps=2,
                             per_device_train_batch_size=2, gradient_accumulation_steps=2,
                             max_grad_norm=1.0, learning_rate=1e-3, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True,
                             bf16=variant == "bf16",
                             gradient_checkpointing=variant == "recompute")
    losses = _Losses()
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(),
                      callbacks=[PrecdbgCallback(config_path), losses])
    trainer.train()
    with open(os.path.join(out, "losses.json"), "w") as handle:
        json.dump(losses.losses, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
