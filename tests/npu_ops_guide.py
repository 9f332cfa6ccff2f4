"""A small transformer calling torch_npu's fused ops the way MindSpeed does (npu_rms_norm,
npu_rotary_mul, npu_fusion_attention), emulated on CPU (tests/npu_ops_support.py: torch.library
ops in the namespace `npu`, a `torch_npu` module of their packets), trained the way the vendor
guides show: a config file, start(model) / stop() / step() around iteration 0 of 2, no close().
Used by tests/test_npu_ops.py.

    python tests/npu_ops_guide.py CONFIG VARIANT

VARIANT: base | rms_forward (npu_rms_norm's output scaled by 1 + 1e-3) | rms_backward (only the
dx of npu_rms_norm's backward scaled by 1 + 1e-3).

The ops are reached every way a script reaches them: `torch_npu.npu_rms_norm` (the packet),
`torch.ops.npu.npu_rotary_mul.default` (an overload), the custom_op function itself (the final
norm), and `guide::square`, a custom op of another namespace, as the MLP's activation.
Prints one JSON line: the losses and precdbg's failure count.
"""
from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import npu_ops_support  # noqa: E402

D, HEADS, SEQ, VOCAB, LAYERS, BATCH = 32, 4, 8, 64, 2, 2


@torch.library.custom_op("guide::square", mutates_args=())
def square(x: Tensor) -> Tensor:
    return x * x


def _square_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])


def _square_backward(ctx: Any, grad: Tensor) -> Tensor:
    (x,) = ctx.saved_tensors
    return 2 * x * grad


square.register_autograd(_square_backward, setup_context=_square_setup)


class RMSNorm(nn.Module):
    """MindSpeed's fused RMSNorm: torch_npu.npu_rms_norm(x, weight, epsilon)[0]."""

    def __init__(self, dim: int, fused: Any = None, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fused = fused

    def forward(self, x: Tensor) -> Tensor:
        import torch_npu
        fused = self.fused or torch_npu.npu_rms_norm
        return fused(x, self.weight, epsilon=self.eps)[0]


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        import torch_npu
        b, t, c = x.shape
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        q = torch_npu.npu_rotary_mul(q, cos, sin)
        k = torch.ops.npu.npu_rotary_mul.default(k, cos, sin)
        y = torch_npu.npu_fusion_attention(q, k, v, HEADS, "BNSD", atten_mask=mask,
                                           scale=1.0 / math.sqrt(c // HEADS))[0]
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn = RMSNorm(D), Attention()
        self.norm2, self.fc, self.out = RMSNorm(D), nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.out(square(self.fc(self.norm2(x))))


class Model(nn.Module):
    def __init__(self, rms_fn: Any) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm_f = RMSNorm(D, fused=rms_fn)
        self.head = nn.Linear(D, VOCAB, bias=False)
        half = D // HEADS // 2
        angles = torch.outer(torch.arange(SEQ, dtype=torch.float32),
                             10000.0 ** (-torch.arange(half, dtype=torch.float32) / half))
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)
        self.register_buffer("mask", torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.wte(ids)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, self.mask)
        return self.head(self.norm_f(x))


def main() -> None:
    config_path, variant = sys.argv[1], sys.argv[2]
    rms_fn = npu_ops_support.register(None if variant == "base" else variant)
    npu_ops_support.install_torch_npu()
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(0)
    model = Model(rms_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    debugger = PrecisionDebugger(config_path=config_path)
    losses = []
    for step in range(2):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=data)
        if step == 0:
            debugger.start(model)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.detach()))
    print(json.dumps({"losses": losses, "failures": debugger.failures}))


if __name__ == "__main__":
    main()
