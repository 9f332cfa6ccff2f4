"""Megatron-Core's GPTModel (megatron-core from PyPI, local transformer layers, no
TransformerEngine) trained on the CPU with the guides' pattern, one dump per recompute setting:

    python tests/megatron_guide.py OUT      # OUT/none, OUT/full, OUT/selective; losses on stdout

`full`: `recompute_granularity="full"` (Megatron's own reentrant CheckpointFunction over each
layer, whose bias-dropout-add runs under torch.enable_grad() inside the checkpoint's forward);
`selective`: the core attention recomputed. Megatron-Core needs CUDA for three things this test
replaces with CPU equivalents, for this test only: the global memory buffer of the attention
scores (a CPU tensor), the model-parallel CUDA RNG tracker (dropout is 0: nothing to fork) and
the CUDA RNG state its checkpoint saves.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist


def _cpu_megatron() -> None:
    import megatron.core.tensor_parallel as tensor_parallel
    import megatron.core.utils as utils
    from megatron.core.tensor_parallel import random

    def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
        return torch.empty(tensor_shape, dtype=dtype)

    class Tracker:
        def fork(self, *args, **kwargs):
            return contextlib.nullcontext()

        def get_states(self):
            return {}

        def set_states(self, states):
            pass

    tracker = Tracker()
    utils.GlobalMemoryBuffer.get_tensor = get_tensor
    random.get_cuda_rng_tracker = tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: tracker
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.zeros(1)
    random._set_cuda_rng_state = lambda *args, **kwargs: None
    random.is_graph_safe_cuda_rng_tracker = lambda *args, **kwargs: False


RECOMPUTE = {"none": {}, "full": dict(recompute_granularity="full", recompute_method="uniform",
                                      recompute_num_layers=1),
             "selective": dict(recompute_granularity="selective")}


def train(out: str, recompute: str) -> list:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                               use_cpu_initialization=True, pipeline_dtype=torch.float32,
                               attention_dropout=0.0, hidden_dropout=0.0, **RECOMPUTE[recompute])
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=128, max_sequence_length=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(32).unsqueeze(0).expand(2, 32)
    mask = torch.ones(2, 1, 32, 32, dtype=torch.bool).tril().logical_not()
    debugger = PrecisionDebugger(dump_path=os.path.join(out, recompute), level="mix", step=[0])
    losses = []
    for _ in range(2):
        debugger.start(model)
        loss = model(ids, positions, mask, labels=ids).float().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        debugger.stop()
        debugger.step()
        losses.append(loss.item())
    if debugger.failures:
        raise SystemExit(f"{recompute}: {debugger.failures} precdbg failure(s)")
    return losses


def main(out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo")
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    _cpu_megatron()
    losses = {name: train(out, name) for name in RECOMPUTE}
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    print(json.dumps(losses))


if __name__ == "__main__":
    main(sys.argv[1])
