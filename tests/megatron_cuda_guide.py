"""Megatron-Core's GPTModel on one CUDA GPU (NCCL, world size 1, local transformer layers, no
TransformerEngine), wrapped in Megatron's own DistributedDataParallel: gradients land in its
contiguous `main_grad` buffers (param.grad is None after backward), `finish_grad_sync()` reduces
them, and the loop copies them into `.grad` for clipping and AdamW, as Megatron's optimizer does.
The guides' pattern exactly: a config.json, the debugger a local of main(), start(model) / stop()
/ step() on the dumped iteration only, no close().

    python tests/megatron_cuda_guide.py OUT RECOMPUTE [--bf16]

RECOMPUTE: none | full | selective (Megatron's own activation recompute). Prints one JSON line:
the losses, the parameter names, and the float64 norm of every parameter's `main_grad` after
the dumped iteration's backward (what the dump's `Param.<name>.grad` records must hold).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

RECOMPUTE = {"none": {}, "full": dict(recompute_granularity="full", recompute_method="uniform",
                                      recompute_num_layers=1),
             "selective": dict(recompute_granularity="selective")}
DUMP_ITERATION = 1


def main(out: str, recompute: str, bf16: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", "29527")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    from precdbg_pt import PrecisionDebugger

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=256, num_attention_heads=8,
                               attention_dropout=0.0, hidden_dropout=0.0,
                               pipeline_dtype=torch.float32, **RECOMPUTE[recompute])
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=1024, max_sequence_length=128).cuda()
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False),
        module=model)
    # named as precdbg names them: through Megatron's DDP wrapper (its `module.` prefix is the
    # wrapper's, not the model's; runs with and without the wrapper align so)
    params = [(name, p) for name, p in model.module.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([p for _, p in params], lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    config_path = os.path.join(out, f"config_{recompute}.json")
    with open(config_path, "w", encoding="utf-8") as handle:
        json.dump({"task": "statistics", "level": "mix", "step": [0],
                   "dump_path": os.path.join(out, recompute)}, handle)
    debugger = PrecisionDebugger(config_path=config_path)
    losses, norms = [], {}
    for iteration in range(3):
        ids = torch.randint(0, 1024, (4, 128), generator=generator).cuda()
        positions = torch.arange(128, device="cuda").unsqueeze(0).expand(4, 128)
        mask = torch.ones(4, 1, 128, 128, dtype=torch.bool, device="cuda").tril().logical_not()
        if iteration == DUMP_ITERATION:
            debugger.start(model)
        model.zero_grad_buffer()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model(ids, positions, mask, labels=ids).float().mean()
        loss.backward()
        model.finish_grad_sync()
        if iteration == DUMP_ITERATION:
            norms = {name: torch.linalg.vector_norm(p.main_grad.double()) for name, p in params}
        for _, p in params:
            p.grad = p.main_grad.to(p.dtype)
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if iteration == DUMP_ITERATION:
            debugger.stop()
            debugger.step()
        losses.append(loss.item())
    print(json.dumps({"losses": losses, "params": [name for name, _ in params],
                      "main_grad_norms": {k: float(v) for k, v in norms.items()},
                      "failures": debugger.failures}))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--bf16" in sys.argv[3:])
