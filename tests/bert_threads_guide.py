"""A tiny transformers BERT (random init) trained 3 steps with AdamW and clipping, every step
dumped with the guides' four lines (test_multistep.py runs it in fresh processes).

    python tests/bert_threads_guide.py OUT THREADS [--lr LR]
"""
from __future__ import annotations

import argparse
import json
import os

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("threads", type=int)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(1234)
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=128,
                                     max_position_embeddings=64, num_labels=3,
                                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    config._attn_implementation = "eager"
    model = transformers.BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "config.json")
    with open(path, "w") as handle:
        json.dump({"task": "statistics", "level": "mix", "step": [],
                   "dump_path": os.path.join(args.out, "dump")}, handle)
    debugger = PrecisionDebugger(config_path=path)
    for _ in range(3):
        ids = torch.randint(0, 128, (4, 16))
        labels = torch.randint(0, 3, (4,))
        debugger.start(model)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()


if __name__ == "__main__":
    main()
