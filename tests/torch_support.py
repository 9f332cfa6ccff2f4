"""PyTorch helpers of the test suite: a tiny seeded GPT, its optimizer and batches, training steps
under a `precdbg_pt.PrecisionDebugger`, and what precdbg could leave behind in torch.

Imported by the tests that need torch (and by tests/conftest.py for the fixtures `gpt`,
`optimizer`, `batches` and `batch`, only where torch is installed): tests/conftest.py itself
needs no framework, so that the core suite (tests/core) runs where neither torch nor mindspore
is installed."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels (precdbg_pt.device_stats) run on CPU tensors only in Triton's interpreter,
    # which must be chosen before triton is first imported (tests/conftest.py sets it first)
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch.nn.functional as F

import precdbg
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

__all__ = ["TINY", "BATCH", "SEED", "LINEAR_PATHS", "tiny_config", "make_model",
           "make_optimizer", "make_batch_list", "gpt", "optimizer", "batches", "batch",
           "loss_of", "run_steps", "dump_once", "norm64", "torch_hooks_left"]

TINY = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=128)
BATCH = 2
SEED = 1234

# every nn.Linear of the tiny GPT, in forward execution order
LINEAR_PATHS = [f"blocks.{i}.{p}" for i in range(2)
                for p in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")] + ["lm_head"]


def tiny_config() -> GPTConfig:
    return GPTConfig(**TINY)


def make_model(seed: int = SEED, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config())
    return model.to(dtype)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_batch_list(steps: int = 4, batch: int = BATCH, seed: int = 0
                    ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return list(make_batches(tiny_config(), batch_size=batch, steps=steps, seed=seed))


@pytest.fixture
def gpt() -> GPT:
    return make_model()


@pytest.fixture
def optimizer(gpt: GPT) -> torch.optim.Optimizer:
    return make_optimizer(gpt)


@pytest.fixture
def batches() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return make_batch_list(4)


@pytest.fixture
def batch(batches) -> Tuple[torch.Tensor, torch.Tensor]:
    return batches[0]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def run_steps(dbg: Optional[PrecisionDebugger], model: torch.nn.Module,
              optimizer: torch.optim.Optimizer,
              batches: Sequence[Tuple[torch.Tensor, torch.Tensor]], n: Optional[int] = None,
              start_on: Optional[Sequence[int]] = None,
              close: bool = True) -> List[torch.Tensor]:
    """Train n steps. With `start_on` None, start/stop every iteration (the step filter selects);
    otherwise start only on the listed iterations. step() is called every iteration."""
    n = len(batches) if n is None else n
    losses = []
    for i in range(n):
        x, y = batches[i % len(batches)]
        capture = dbg is not None and (start_on is None or i in start_on)
        if capture:
            dbg.start(model)
        losses.append(train_step(model, optimizer, x, y))
        if capture:
            dbg.stop()
        if dbg is not None:
            dbg.step()
    if dbg is not None and close:
        assert dbg.close(), "the writer did not finish in time"
    return losses


def dump_once(tmp_path, steps: int = 1, model: Optional[torch.nn.Module] = None,
              **settings: Any) -> Tuple[precdbg.Dump, PrecisionDebugger]:
    """Train `steps` steps of a fresh tiny GPT with a debugger of `settings`; open the dump."""
    settings.setdefault("dump_path", str(tmp_path / "dump"))
    dbg = PrecisionDebugger(**settings)
    model = model if model is not None else make_model()
    run_steps(dbg, model, make_optimizer(model), make_batch_list(steps), steps)
    return precdbg.open_dump(settings["dump_path"]), dbg


def norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().double()))


def torch_hooks_left(model: torch.nn.Module) -> List[str]:
    """Every hook or mode precdbg could have left in torch, as readable strings."""
    left = []
    for path, module in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks", "_forward_hooks_with_kwargs",
                     "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs"):
            if getattr(module, attr, None):
                left.append(f"{path or '<root>'}.{attr}")
    for name, p in model.named_parameters():
        if p._backward_hooks:
            left.append(f"param {name}._backward_hooks")
        if getattr(p, "_post_accumulate_grad_hooks", None):
            left.append(f"param {name}._post_accumulate_grad_hooks")
    if torch._C._len_torch_function_stack() != 0:
        left.append("torch function mode stack")
    from torch.optim import optimizer as opt
    if opt._global_optimizer_pre_hooks:
        left.append("global optimizer pre hooks")
    if opt._global_optimizer_post_hooks:
        left.append("global optimizer post hooks")
    from torch.nn.modules import module as nn_module
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks"):
        if getattr(nn_module, attr, None):
            left.append(f"torch.nn.modules.module.{attr}")
    return left
