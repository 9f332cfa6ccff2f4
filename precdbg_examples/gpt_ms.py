"""MindSpore twin of precdbg_examples/gpt_torch.py: same structure, same attribute names (wte, wpe,
drop, blocks.<i>.{ln_1, attn.{qkv, proj}, ln_2, mlp.{fc, act, proj}}, ln_f, lm_head) and the same
forward math op for op, in the same order, so a per-op comparison of the two runs lines up.

Written for MindSpore 2.x in PyNative mode on CPU. Importing this module has no side effects: the
caller picks the device and mode (``ms.set_device("CPU")``, ``ms.set_context(mode=ms.PYNATIVE_MODE)``).
Several ``mint.*`` kernels (gelu, layer_norm, dropout, cross_entropy) have no CPU kernel in 2.10,
so ``nn.*`` / ``ops.*`` are used instead. This module does not import torch.

Weights: build the torch model, then ``load_torch_state(ms_model, {k: v.detach().numpy() for k, v
in torch_model.state_dict().items()})``. Data: ``make_batches`` here is numpy-based and is NOT
value-identical to ``gpt_torch.make_batches`` (that one uses ``torch.Generator``); for parity tests
feed the same numpy batches to both models (cast to int64 for torch).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, Iterator, Tuple

import numpy as np

import mindspore as ms
from mindspore import nn, ops

__all__ = ["GPTConfig", "GPT", "make_batches", "make_batches_numpy", "train_step_fn",
           "load_torch_state", "ms_to_torch_name"]


@dataclasses.dataclass
class GPTConfig:
    vocab_size: int = 512
    seq_len: int = 64
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    dropout: float = 0.0


def _layer_norm(d: int) -> nn.LayerNorm:
    # torch.nn.LayerNorm defaults: eps 1e-5, affine over the last dim.
    return nn.LayerNorm(normalized_shape=(d,), epsilon=1e-5)


class Attention(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Dense(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Dense(cfg.d_model, cfg.d_model)
        # Buffer-like: a plain Tensor attribute, not a Parameter (torch: non-persistent buffer).
        mask = np.tril(np.ones((cfg.seq_len, cfg.seq_len), dtype=np.bool_))
        self.mask = ms.Tensor(mask.reshape(1, 1, cfg.seq_len, cfg.seq_len))

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        b, t, c = x.shape
        q, k, v = ops.split(self.qkv(x), c, axis=2)
        q = ops.swapaxes(q.view(b, t, self.n_head, c // self.n_head), 1, 2)
        k = ops.swapaxes(k.view(b, t, self.n_head, c // self.n_head), 1, 2)
        v = ops.swapaxes(v.view(b, t, self.n_head, c // self.n_head), 1, 2)
        scores = ops.matmul(q, ops.swapaxes(k, -2, -1)) / math.sqrt(c // self.n_head)
        scores = ops.masked_fill(scores, ops.logical_not(self.mask[:, :, :t, :t]), float("-inf"))
        weights = ops.softmax(scores, axis=-1)
        y = ops.swapaxes(ops.matmul(weights, v), 1, 2).reshape(b, t, c)
        return self.proj(y)


class MLP(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Dense(cfg.d_model, 4 * cfg.d_model)
        self.act = nn.GELU(approximate=False)   # exact erf GELU, like torch.nn.GELU()
        self.proj = nn.Dense(4 * cfg.d_model, cfg.d_model)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = _layer_norm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln_2 = _layer_norm(cfg.d_model)
        self.mlp = MLP(cfg)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Cell):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.drop = nn.Dropout(p=float(cfg.dropout))
        self.blocks = nn.CellList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = _layer_norm(cfg.d_model)
        self.lm_head = nn.Dense(cfg.d_model, cfg.vocab_size, has_bias=False)
        # torch modules start in training mode; MindSpore cells do not. Match torch.
        self.set_train(True)

    def construct(self, idx: ms.Tensor) -> ms.Tensor:
        pos = ops.arange(idx.shape[1])
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --- weights ---------------------------------------------------------------------------------

_LEAF_RENAMES = {"gamma": "weight", "beta": "bias", "embedding_table": "weight"}


def ms_to_torch_name(name: str) -> str:
    """MindSpore parameter name -> the gpt_torch state_dict name (e.g. blocks.0.ln_1.gamma ->
    blocks.0.ln_1.weight, wte.embedding_table -> wte.weight; Dense weight/bias unchanged)."""
    prefix, _, leaf = name.rpartition(".")
    leaf = _LEAF_RENAMES.get(leaf, leaf)
    return f"{prefix}.{leaf}" if prefix else leaf


def load_torch_state(ms_model: nn.Cell, state: Dict[str, np.ndarray]) -> None:
    """Copy weights given as numpy arrays keyed by PyTorch state_dict names into ``ms_model``.

    nn.Dense weights share torch.nn.Linear's [out, in] layout, so no transposes are needed.
    Raises KeyError on missing/extra names and ValueError on shape mismatches; loads nothing
    unless every name and shape checks out.
    """
    params = {ms_to_torch_name(p.name): p for p in ms_model.get_parameters()}
    missing = sorted(set(params) - set(state))
    extra = sorted(set(state) - set(params))
    if missing or extra:
        raise KeyError(f"load_torch_state: name mismatch; missing from state: {missing}; "
                       f"not in the MindSpore model: {extra}")
    bad = [f"{k}: model {tuple(p.shape)} vs state {tuple(np.shape(state[k]))}"
           for k, p in sorted(params.items()) if tuple(p.shape) != tuple(np.shape(state[k]))]
    if bad:
        raise ValueError("load_torch_state: shape mismatch: " + "; ".join(bad))
    for k, p in params.items():
        p.set_data(ms.Tensor(np.ascontiguousarray(state[k]), dtype=p.dtype))


# --- data ------------------------------------------------------------------------------------

def make_batches_numpy(cfg: GPTConfig, batch_size: int = 8, steps: int = 4, seed: int = 0
                       ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Deterministic random token batches (inputs, next-token targets) as numpy int32 arrays of
    shape [batch_size, seq_len], drawn with numpy's default_rng(seed). Feed the same arrays to
    both frameworks (``torch.from_numpy(x.astype(np.int64))`` on the torch side)."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        tokens = rng.integers(0, cfg.vocab_size, size=(batch_size, cfg.seq_len + 1), dtype=np.int32)
        yield tokens[:, :-1].copy(), tokens[:, 1:].copy()


def make_batches(cfg: GPTConfig, batch_size: int = 8, steps: int = 4, seed: int = 0
                 ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Same signature as gpt_torch.make_batches, but numpy-based (see make_batches_numpy): the
    values differ from gpt_torch.make_batches, which draws from torch.Generator."""
    return make_batches_numpy(cfg, batch_size, steps, seed)


# --- training --------------------------------------------------------------------------------

def _as_tensor(a) -> ms.Tensor:
    return a if isinstance(a, ms.Tensor) else ms.Tensor(np.asarray(a, dtype=np.int32))


def train_step_fn(model: GPT, optimizer: nn.Optimizer) -> Callable[[object, object], ms.Tensor]:
    """Return step(x, y) -> loss doing one training step (forward, grads, optimizer update).
    Loss: mean cross entropy over all tokens, as F.cross_entropy in gpt_torch.train_step.
    x and y may be ms.Tensor or integer numpy arrays."""
    def forward_fn(x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        logits = model(x)
        return ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def step(x, y) -> ms.Tensor:
        loss, grads = grad_fn(_as_tensor(x), _as_tensor(y))
        optimizer(grads)
        return loss

    return step
