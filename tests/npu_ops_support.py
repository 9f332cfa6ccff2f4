"""torch_npu's fused ops emulated on CPU, for tests that cannot install torch_npu (it breaks
`import torch` without CANN): `npu_rms_norm`, `npu_rotary_mul` and `npu_fusion_attention`
registered with `torch.library.custom_op` in the namespace `npu` (so they are
`torch.ops.npu.<op>` packets, as torch_npu's are), each with its backward registered through
`register_autograd`, and a `torch_npu` module whose attributes are those packets, put into
`sys.modules`. Registration is per process: use it in a fresh one (tests/npu_ops_guide.py).

`defect` puts one known error into one op: `rms_forward` scales npu_rms_norm's output by
1 + 1e-3, `rms_backward` scales only the dx its backward returns by 1 + 1e-3.

The formulas follow torch_npu's documented semantics for the arguments used here: npu_rms_norm
returns (y, rstd); npu_rotary_mul is x * r1 + rotate_half(x) * r2; npu_fusion_attention (layout
BNSD, `atten_mask` True where a position takes no part) returns (attention_out, softmax_max,
softmax_sum) and its backward recomputes the probabilities from softmax_max and softmax_sum.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

DEFECTS = ("rms_forward", "rms_backward")
OPS = ("npu_rms_norm", "npu_rotary_mul", "npu_fusion_attention")


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_t(u: Tensor) -> Tensor:
    """The transpose of rotate_half (what its backward applies to a gradient)."""
    u1, u2 = u.chunk(2, dim=-1)
    return torch.cat((u2, -u1), dim=-1)


def register(defect: Optional[str] = None) -> Any:
    """Register the three ops in `torch.ops.npu`; returns the custom_op function of
    npu_rms_norm (a `torch.library.custom_op` object, callable like the op)."""
    if defect is not None and defect not in DEFECTS:
        raise ValueError(f"unknown defect {defect!r}")
    out_scale = 1.0 + 1e-3 if defect == "rms_forward" else 1.0
    dx_scale = 1.0 + 1e-3 if defect == "rms_backward" else 1.0

    @torch.library.custom_op("npu::npu_rms_norm", mutates_args=())
    def npu_rms_norm(x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> Tuple[Tensor, Tensor]:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
        return x * rstd * gamma * out_scale, rstd

    def rms_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(inputs[0], inputs[1], output[1])

    def rms_backward(ctx: Any, grad: Tensor, grad_rstd: Any) -> Tuple[Any, ...]:
        x, gamma, rstd = ctx.saved_tensors
        xhat = x * rstd
        dgamma = (grad * xhat).reshape(-1, x.shape[-1]).sum(0)
        dxhat = grad * gamma
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        return dx * dx_scale, dgamma, None

    npu_rms_norm.register_autograd(rms_backward, setup_context=rms_setup)

    @torch.library.custom_op("npu::npu_rotary_mul", mutates_args=())
    def npu_rotary_mul(x: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
        return x * r1 + _rotate_half(x) * r2

    def rotary_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(inputs[1], inputs[2])

    def rotary_backward(ctx: Any, grad: Tensor) -> Tuple[Any, ...]:
        r1, r2 = ctx.saved_tensors
        return grad * r1 + _rotate_half_t(grad * r2), None, None

    npu_rotary_mul.register_autograd(rotary_backward, setup_context=rotary_setup)

    @torch.library.custom_op("npu::npu_fusion_attention", mutates_args=())
    def npu_fusion_attention(query: Tensor, key: Tensor, value: Tensor, head_num: int,
                             input_layout: str, pse: Optional[Tensor] = None,
                             padding_mask: Optional[Tensor] = None,
                             atten_mask: Optional[Tensor] = None, scale: float = 1.0,
                             keep_prob: float = 1.0) -> Tuple[Tensor, Tensor, Tensor]:
        if input_layout != "BNSD" or pse is not None or padding_mask is not None \
                or keep_prob != 1.0 or query.shape[1] != head_num:
            raise NotImplementedError("emulated for layout BNSD without pse, padding or dropout")
        scores = torch.matmul(query, key.transpose(-2, -1)) * scale
        if atten_mask is not None:
            scores = scores.masked_fill(atten_mask, float("-inf"))
        smax = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores - smax)
        ssum = weights.sum(-1, keepdim=True)
        return torch.matmul(weights / ssum, value), smax, ssum

    def attention_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, ...]) -> None:
        query, key, value = inputs[:3]
        ctx.save_for_backward(query, key, value, inputs[7], output[1], output[2])
        ctx.scale = inputs[8]
        ctx.masked = inputs[7] is not None

    def attention_backward(ctx: Any, grad: Tensor, *unused: Any) -> Tuple[Any, ...]:
        query, key, value, mask, smax, ssum = ctx.saved_tensors
        scores = torch.matmul(query, key.transpose(-2, -1)) * ctx.scale
        if ctx.masked:
            scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.exp(scores - smax) / ssum                # recomputed, as the kernel does
        dvalue = torch.matmul(probs.transpose(-2, -1), grad)
        dprobs = torch.matmul(grad, value.transpose(-2, -1))
        dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True)) * ctx.scale
        dquery = torch.matmul(dscores, key)
        dkey = torch.matmul(dscores.transpose(-2, -1), query)
        return (dquery, dkey, dvalue) + (None,) * 7

    npu_fusion_attention.register_autograd(attention_backward, setup_context=attention_setup)
    return npu_rms_norm


def install_torch_npu() -> types.ModuleType:
    """A `torch_npu` module in sys.modules whose fused ops are the `torch.ops.npu` packets (as
    torch_npu's own are, on torch versions without its device guard)."""
    module = types.ModuleType("torch_npu")
    module.__version__ = "emulated"
    for name in OPS:
        setattr(module, name, getattr(torch.ops.npu, name))
    sys.modules["torch_npu"] = module
    return module
