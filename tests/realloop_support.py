"""Helpers of tests/test_realloop.py: dumps of real training loops that touch gradients after
backward, each with one defect, made in fresh processes.

The model is a transformers GPT-2 (tiny config, random init, built offline). A loop is one of
  clip       forward, backward, clip_grad_norm_, AdamW step (the whole step captured)
  recompute  the same with activation recompute (torch.utils.checkpoint, non-reentrant)
  accum      two micro-batches accumulated into .grad, then clip_grad_norm_ and AdamW
  ddp        clip under DistributedDataParallel (gloo, two processes, one batch per rank)
  allreduce  two ranks averaging gradients with torch.distributed.all_reduce themselves
  bucket     two ranks reducing one flat buffer holding two gradients (as a bucket of
             Megatron's main_grad buffer): copied in, all_reduce, averaged, copied back
  unscale    clip with a loss scale: torch.amp.GradScaler scales the loss and unscales the
             gradients in place before clipping
  bf16       clip with the forward under CPU bfloat16 autocast
A defect is one change to the candidate (see DEFECTS). Run as a script it makes dumps of one
loop, one after the other (`--run PATH::DEFECT::RANK`, defect and rank may be empty):

    python tests/realloop_support.py --loop clip --run /tmp/base:::: --run /tmp/dw::dw::

(dump_runs() starts the two ranks of ddp and allreduce, each a process running this file).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

from ranks_support import launch_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
THIS = os.path.abspath(__file__)
VOCAB, SEQ, BATCH = 128, 16, 2
DW_WEIGHT = "transformer.h.1.mlp.c_fc.weight"       # the dw-only defect's parameter
ACT_MODULE = "transformer.h.1.mlp.act"               # the swapped activation
DISTRIBUTED = ("ddp", "allreduce", "bucket")          # loops run by two ranks


def _model(recompute: bool):
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                     n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _batches(count: int, seed: int) -> List:
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(count)]


# --------------------------------------------------------------------------- defects
def _dw(model, batches) -> None:
    """Scale one weight's gradient by 1.001 inside backward (a dw-only difference)."""
    model.get_parameter(DW_WEIGHT).register_hook(lambda g: g * 1.001)


def _act(model, batches) -> None:
    """Layer 1's activation is exact GELU where the baseline has GPT-2's tanh approximation."""
    import torch
    model.get_submodule(ACT_MODULE.rpartition(".")[0]).act = torch.nn.GELU()


def _data(model, batches) -> None:
    """The (first) batch holds other tokens."""
    x = batches[0].clone()
    x[0, 3] = (x[0, 3] + 1) % VOCAB
    batches[0] = x


def _data2(model, batches) -> None:
    """The second micro-batch holds other tokens."""
    x = batches[1].clone()
    x[0, 3] = (x[0, 3] + 1) % VOCAB
    batches[1] = x


DEFECTS: Dict[str, Callable] = {"dw": _dw, "act": _act, "data": _data, "data2": _data2}


# --------------------------------------------------------------------------- one run
def train(path: str, loop: str, defect: Optional[str], rank: int = 0,
          defect_rank: Optional[int] = None) -> int:
    """Dump one training step of `loop`; returns the debugger's failure count."""
    import torch
    from precdbg_pt import PrecisionDebugger
    torch.set_num_threads(1)
    model = _model(recompute=loop == "recompute")
    batches = _batches(2 if loop == "accum" else 1, seed=100 + rank)
    if defect is not None and (defect_rank is None or defect_rank == rank):
        DEFECTS[defect](model, batches)
    net = model
    if loop == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=loop == "unscale")
    dbg = PrecisionDebugger(dump_path=path, level="mix")
    dbg.start(net)
    for ids in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=loop == "bf16"):
            loss = net(input_ids=ids, labels=ids).loss / len(batches)
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    if loop == "allreduce":
        import torch.distributed as dist
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(dist.get_world_size())
    if loop == "bucket":
        # one bucket of layer 1's MLP weights, the defect's weight first (each in its slice)
        params = [model.get_parameter(DW_WEIGHT),
                  model.get_parameter(DW_WEIGHT.replace("c_fc", "c_proj"))]
        bucket = torch.zeros(sum(p.numel() for p in params))
        start = 0
        for param in params:
            bucket[start:start + param.numel()].copy_(param.grad.view(-1))
            start += param.numel()
        import torch.distributed as dist
        dist.all_reduce(bucket)
        bucket.div_(dist.get_world_size())
        start = 0
        for param in params:
            param.grad.copy_(bucket[start:start + param.numel()].view_as(param))
            start += param.numel()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    dbg.stop()
    dbg.step()
    if not dbg.close():
        raise RuntimeError("the dump writer did not finish")
    return dbg.failures


def dump_mindspore(path: str, defect: bool) -> str:
    """The MindSpore twin of `clip` (bundled GPT, value_and_grad, clip_by_global_norm, AdamW),
    in this process; `defect`: blocks.1.mlp.fc.weight's gradient x1.001 through
    `Parameter.register_hook`."""
    import mindspore as ms
    from mindspore import ops

    import ms_support
    from precdbg_ms import PrecisionDebugger
    model = ms_support.make_model()
    opt = ms_support.make_optimizer(model)
    if defect:
        model.blocks[1].mlp.fc.weight.register_hook(lambda g: g * 1.001)
    grad_fn = ms.value_and_grad(ms_support.loss_fn(model), None, model.trainable_params())
    x, y = ms_support.as_tensors(ms_support.make_batches(1)[0])
    dbg = PrecisionDebugger(dump_path=path, level="mix")
    dbg.start(model)
    _, grads = grad_fn(x, y)
    opt(ops.clip_by_global_norm(grads, 1.0))
    dbg.stop()
    dbg.step()
    if not dbg.close() or dbg.failures:
        raise RuntimeError(f"MindSpore dump failed ({dbg.failures} capture failures)")
    from precdbg_ms.cell_copies import AliasingHook
    left = [name for name, cell in model.cells_and_names()
            if isinstance(cell.__dict__.get("_cell_backward_hook"), AliasingHook)]
    if left:
        raise RuntimeError(f"stop() left precdbg's hook wrapper in cells {left[:3]}")
    return path


Run = Tuple[str, Optional[str], Optional[int]]      # (dump path, defect, rank holding it)


def dump_runs(loop: str, runs: List[Run], timeout: float = 600) -> None:
    """Dump each run of `loop` in one fresh process (two for the distributed loops), one after
    the other: the imports are paid once."""
    ranks = 2 if loop in DISTRIBUTED else 1
    args = [PYTHON, THIS, "--loop", loop]
    for path, defect, defect_rank in runs:
        args += ["--run", f"{path}::{defect or ''}::"
                          f"{'' if defect_rank is None else defect_rank}"]
    for code, out, err in launch_ranks(args, ranks, REPO, timeout):
        if code != 0:
            raise RuntimeError(f"dump of {loop} {runs} failed:\n{out}\n{err[-4000:]}")


def dump(path: str, loop: str, defect: Optional[str] = None,
         defect_rank: Optional[int] = None) -> str:
    """One dump of `loop` in fresh process(es)."""
    dump_runs(loop, [(path, defect, defect_rank)])
    return path


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", required=True,
                        choices=("clip", "recompute", "accum", "unscale", "bf16") + DISTRIBUTED)
    parser.add_argument("--run", action="append", required=True,
                        help="PATH::DEFECT::RANK (defect and rank may be empty)")
    args = parser.parse_args(argv)
    rank = 0
    if args.loop in DISTRIBUTED:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    failures = 0
    for spec in args.run:
        path, defect, defect_rank = spec.split("::")
        if defect and defect not in DEFECTS:
            parser.error(f"unknown defect {defect!r}")
        failures += train(path, args.loop, defect or None, rank,
                          int(defect_rank) if defect_rank else None)
    if args.loop in DISTRIBUTED:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()
    if failures:
        print(f"precdbg capture failures: {failures}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
