"""Helpers of tests/test_compare.py: dump pairs of the bundled GPT (precdbg_examples.gpt_torch)
that differ by exactly one defect, run `python -m precdbg compare` in a real subprocess, and read
the result.

Every dump trains a tiny seeded GPT (GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=16,
vocab_size=128), batch 4, AdamW lr 1e-2) under `precdbg_pt.PrecisionDebugger` at level "mix".
A defect is one named change to the candidate run (see DEFECTS); the baseline has none.

Run as a script it makes one dump in a fresh process (a thread count must be set before torch
does any work, so another thread count needs another process):

    python tests/compare_support.py DUMP_PATH [--threads N] [--steps N] [--task T] [--defect D]
                                    [--autocast]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
THIS = os.path.abspath(__file__)

TINY = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=128)
BATCH = 4
SEED = 0
LR = 1e-2

# the keys of the compare JSON contract, and of its first_divergence
RESULT_KEYS = {"verdict", "first_divergence", "consequences", "unmatched", "notes", "rows"}
FIRST_KEYS = {"step", "rank", "direction", "kind", "name_a", "name_b", "module", "op", "role",
              "metrics", "reason", "evidence"}

Batch = Tuple[torch.Tensor, torch.Tensor]


def tiny_config(**overrides: Any) -> GPTConfig:
    return GPTConfig(**{**TINY, **overrides})


# --------------------------------------------------------------------------- defects
# Each defect changes the candidate before training: (model, optimizer, batches) -> optimizer.
# Hooks are registered before the debugger starts, as a user's code would have them.

def _gelu_tanh(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[1].mlp.act = nn.GELU(approximate="tanh")
    return opt


def _layer_norm_eps(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[0].ln_2.eps = 1e-3
    return opt


def _every_layer_norm_eps(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    """Every LayerNorm's eps 1e-5 -> 1.1e-5 (a config's layer_norm_eps): the outputs stay
    within tolerance, only the argument differs."""
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1.1e-5
    return opt


def _weight(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    with torch.no_grad():
        model.blocks[1].mlp.fc.weight[3, 5] += 1e-2
    return opt


def _data(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    x, y = batches[0]
    x = x.clone()
    x[0, 3] = (x[0, 3] + 1) % model.cfg.vocab_size
    batches[0] = (x, y)
    return opt


def _dx_only(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[1].mlp.act.register_full_backward_hook(
        lambda mod, grad_in, grad_out: (grad_in[0] * 1.001,))
    return opt


def _dw_only(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[0].attn.qkv.weight.register_hook(lambda g: g * 1.001)
    return opt


class _FusedLinear(torch.autograd.Function):
    """A linear with a backward of its own (as Megatron's and fused kernels' are): a custom
    autograd Function, whose backward no hook sees. `scale` scales its dx (a defect)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                scale: float) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.scale = scale
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        dx = (grad @ weight) * ctx.scale
        dw = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return dx, dw, grad.reshape(-1, grad.shape[-1]).sum(0), None


def _fused_proj(scale: float) -> Callable[..., torch.optim.Optimizer]:
    """blocks.1.mlp's output projection computed by `_FusedLinear` inside the MLP's own
    forward, not through its `proj` module (whose parameters it uses)."""
    def apply(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
        mlp = model.blocks[1].mlp
        mlp.forward = lambda x: _FusedLinear.apply(mlp.act(mlp.fc(x)), mlp.proj.weight,
                                                   mlp.proj.bias, scale)
        return opt
    return apply


def _optimizer(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    return torch.optim.AdamW(model.parameters(), lr=1.1e-2)


def _nan(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[1].mlp.act.register_forward_hook(
        lambda mod, inp, out: out.masked_fill(out > 1.5, float("nan")))
    return opt


def _proj_1e4(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[0].attn.proj.register_forward_hook(lambda mod, inp, out: out * (1 + 1e-4))
    return opt


def _proj_1e2(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[0].attn.proj.register_forward_hook(lambda mod, inp, out: out * (1 + 1e-2))
    return opt


def _proj_permuted(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    # a permutation: min, max, mean and norm of the output stay what they were
    model.blocks[0].attn.proj.register_forward_hook(lambda mod, inp, out: out.flip(-1))
    return opt


def _gelu_formula(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    # the tanh approximation written out (pow, mul, add, tanh: each rounded to the input's
    # dtype) in the same GELU module: no argument differs, only the numbers
    act = model.blocks[1].mlp.act

    def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
        inner = 0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))
    act.forward = tanh_gelu
    return opt


class TanhGELU(torch.nn.Module):
    """GELU's tanh approximation as a module class of its own (transformers' NewGELUActivation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def _gelu_class(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    # another module class at blocks.1.mlp.act: its records are named after the class
    # (Module.blocks.1.mlp.act.TanhGELU...), so nothing of the baseline's GELU pairs with them
    model.blocks[1].mlp.act = TanhGELU()
    return opt


def _no_weight_decay(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    # torch AdamW decays by 0.01 by default: the baseline decays, this candidate does not
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)


def _lr_after_first_step(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    # lr 1e-2 -> 1.1e-2 from the second optimizer step on: the run manifest (written when the
    # optimizer is first seen) cannot show it, only the parameters at the start of step 2 do
    def bump(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            group["lr"] = 1.1e-2
    opt.register_step_post_hook(bump)
    return opt


def _proj_1e3_at_step2(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    calls = {"n": 0}

    def hook(mod: nn.Module, inp: Any, out: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return out * (1 + 1e-3) if calls["n"] > 2 else out
    model.blocks[0].attn.proj.register_forward_hook(hook)
    return opt


def _attn_scale(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    """blocks.1.attn scales its scores by 1.01/sqrt(d) (its own API calls, no child module)."""
    attn = model.blocks[1].attn

    def forward(x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, attn.n_head, c // attn.n_head).transpose(1, 2)
                   for z in attn.qkv(x).split(c, dim=2))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.01 / math.sqrt(c // attn.n_head))
        scores = scores.masked_fill(~attn.mask[:, :, :t, :t], float("-inf"))
        y = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, c)
        return attn.proj(y)
    attn.forward = forward
    return opt


def _dw_zero(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    model.blocks[0].attn.qkv.weight.register_hook(lambda g: g * 0)
    return opt


def _detach_ln(model: GPT, opt: torch.optim.Optimizer, batches: List[Batch]):
    """blocks.1.ln_1's output detached: no gradient reaches ln_1 (its dw and dx are zero)."""
    model.blocks[1].ln_1.register_forward_hook(lambda mod, inp, out: out.detach())
    return opt


DEFECTS: Dict[str, Callable[[GPT, torch.optim.Optimizer, List[Batch]], torch.optim.Optimizer]] = {
    "attn_scale": _attn_scale, "detach_ln": _detach_ln, "dw_zero": _dw_zero,
    "gelu_tanh": _gelu_tanh, "layer_norm_eps": _layer_norm_eps, "weight": _weight,
    "every_layer_norm_eps": _every_layer_norm_eps,
    "data": _data, "dx_only": _dx_only, "dw_only": _dw_only, "optimizer": _optimizer,
    "fused_proj": _fused_proj(1.0), "fused_proj_dx": _fused_proj(1.001),
    "nan": _nan, "proj_1e-4": _proj_1e4, "proj_permuted": _proj_permuted,
    "gelu_formula": _gelu_formula, "gelu_class": _gelu_class, "proj_1e-2": _proj_1e2,
    "no_weight_decay": _no_weight_decay, "lr_after_first_step": _lr_after_first_step,
    "proj_1e-3_at_step2": _proj_1e3_at_step2,
}


# --------------------------------------------------------------------------- models
class LayersGPT(GPT):
    """The same GPT with its `blocks` attribute renamed `layers` (module paths layers.<i>...)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        self.layers = self.blocks
        del self.blocks

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class WrappedGPT(nn.Module):
    """The same GPT held by a wrapper: every module path gains the prefix `model.`."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.model = GPT(cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)


MODELS: Dict[str, Callable[[GPTConfig], nn.Module]] = {
    "gpt": GPT, "layers": LayersGPT, "wrapped": WrappedGPT}


# --------------------------------------------------------------------------- dumping
def dump_gpt(path: str, defect: Optional[str] = None, steps: int = 1, task: str = "statistics",
             cfg: Optional[GPTConfig] = None, batch: int = BATCH, model: str = "gpt",
             threads: Optional[int] = None, autocast: bool = False, level: str = "mix") -> str:
    """Train `steps` steps of a seeded GPT with one defect (or none) and dump every step; with
    `autocast`, the forward and loss run under CPU bfloat16 autocast."""
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = cfg or tiny_config()
    torch.manual_seed(SEED)
    net = MODELS[model](cfg)
    opt: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=LR)
    batches = list(make_batches(cfg, batch_size=batch, steps=steps))
    if defect is not None:
        opt = DEFECTS[defect](net, opt, batches)
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task=task)
    for x, y in batches:
        dbg.start(net)
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = net(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            train_step(net, opt, x, y)
        dbg.stop()
        dbg.step()
    assert dbg.close(), "the dump writer did not finish"
    assert not dbg.failures, f"capture failures: {dbg.failures}"
    return str(path)


def dump_gpt_subprocess(path: str, threads: Optional[int] = None, steps: int = 1,
                        task: str = "statistics", defect: Optional[str] = None,
                        timeout: float = 120, autocast: bool = False) -> str:
    """dump_gpt in a fresh Python process (this file run as a script)."""
    args = [PYTHON, THIS, str(path), "--steps", str(steps), "--task", task]
    if autocast:
        args.append("--autocast")
    if threads is not None:
        args += ["--threads", str(threads)]
    if defect is not None:
        args += ["--defect", defect]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"dump subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return str(path)


# --------------------------------------------------------------------------- PyTorch vs MindSpore
def numpy_batch(batch: int = BATCH) -> Tuple[Any, Any]:
    """One numpy int32 batch (inputs, targets), fed to both frameworks."""
    return numpy_batches(batch, 1)[0]


def numpy_batches(batch: int = BATCH, steps: int = 1) -> List[Tuple[Any, Any]]:
    """`steps` numpy int32 batches (inputs, targets), fed to both frameworks."""
    from precdbg_examples import gpt_ms
    return list(gpt_ms.make_batches_numpy(gpt_ms.GPTConfig(**TINY), batch, steps))


def dump_torch_numpy(path: str, x: Any, y: Any, more: Sequence[Tuple[Any, Any]] = (),
                     momentum: float = 0.0, adamw: bool = False, adam: bool = False
                     ) -> Dict[str, Any]:
    """SGD steps (lr 0.1, `momentum`; with `adamw` AdamW lr 1e-2, with `adam` Adam lr 1e-2)
    of the seeded tiny torch GPT
    on numpy data, the batch (x, y) and then `more`, each dumped; returns the weights it
    started from (numpy, state_dict names) for gpt_ms.load_torch_state."""
    torch.manual_seed(SEED)
    net = GPT(tiny_config())
    state = {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2) if adamw else \
        torch.optim.Adam(net.parameters(), lr=1e-2) if adam else \
        torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
    dump_torch_steps(path, net, opt, [(x, y), *more])
    return state


def dump_torch_steps(path: str, net: torch.nn.Module, opt: Any,
                     batches: Sequence[Tuple[Any, Any]]) -> None:
    """Train `net` one step per numpy batch, each step dumped (level mix) into `path`."""
    dbg = PrecisionDebugger(dump_path=str(path), level="mix")
    for xs, ys in batches:
        xt, yt = torch.from_numpy(xs.astype("int64")), torch.from_numpy(ys.astype("int64"))
        dbg.start(net)
        train_step(net, opt, xt, yt)
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures, "the dump failed or its writer did not finish"


def dump_mindspore(path: str, state: Dict[str, Any], x: Any, y: Any,
                   default_gelu: bool = False, more: Sequence[Tuple[Any, Any]] = (),
                   momentum: float = 0.0, adam_weight_decay: bool = False,
                   default_layer_norm: bool = False, adam: bool = False,
                   act_1: Any = None) -> str:
    """The MindSpore twin with the same weights and data, SGD steps (learning_rate 0.1,
    `momentum`: the same update as torch's SGD) dumped. With `default_gelu`, blocks[1].mlp.act
    is mindspore.nn.GELU() (approximate=True by default: tanh) where torch.nn.GELU() is exact
    (erf). With `adam_weight_decay`, nn.AdamWeightDecay with torch AdamW's hyperparameters (lr
    1e-2, eps 1e-8, weight decay 0.01) but no bias correction; with `adam`, nn.Adam with torch
    Adam's (lr 1e-2, eps 1e-8: added to sqrt(v), not sqrt(v_hat)). With `default_layer_norm`, every
    LayerNorm keeps MindSpore's default epsilon (1e-7; torch's is 1e-5). `act_1`: a cell that
    replaces blocks[1].mlp.act. The caller has set
    MindSpore up (CPU, PyNative)."""
    import mindspore as ms
    from mindspore import nn as msnn

    import precdbg_ms
    from precdbg_examples import gpt_ms
    build_layer_norm = gpt_ms._layer_norm
    if default_layer_norm:      # the twin as ported without passing torch's eps
        gpt_ms._layer_norm = lambda d: msnn.LayerNorm(normalized_shape=(d,))
    try:
        net = gpt_ms.GPT(gpt_ms.GPTConfig(**TINY))
    finally:
        gpt_ms._layer_norm = build_layer_norm
    if default_gelu:
        net.blocks[1].mlp.act = msnn.GELU()
    if act_1 is not None:
        net.blocks[1].mlp.act = act_1
    gpt_ms.load_torch_state(net, state)
    opt = msnn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-2, eps=1e-8,
                               weight_decay=0.01) if adam_weight_decay else \
        msnn.Adam(net.trainable_params(), learning_rate=1e-2, eps=1e-8) if adam else \
        msnn.SGD(net.trainable_params(), learning_rate=0.1, momentum=momentum)
    step = gpt_ms.train_step_fn(net, opt)
    dbg = precdbg_ms.PrecisionDebugger(dump_path=str(path), level="mix")
    for xs, ys in [(x, y), *more]:
        dbg.start(net)
        step(ms.Tensor(xs), ms.Tensor(ys))
        dbg.stop()
        dbg.step()
    assert dbg.close(), "the dump writer did not finish"
    return str(path)


# --------------------------------------------------------------------------- compare
def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m precdbg ARGS...` in a real subprocess."""
    return subprocess.run([PYTHON, "-m", "precdbg", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def notes_of(result: Dict[str, Any], code: str) -> List[str]:
    """The texts of the compare's notes with this code (`notes[].code`)."""
    return [n["text"] for n in result["notes"] if n["code"] == code]


def note_codes(result: Dict[str, Any]) -> List[str]:
    return [n["code"] for n in result["notes"]]


def describe(result: Dict[str, Any]) -> str:
    """The verdict and first divergence in one readable string (assertion messages)."""
    first = result.get("first_divergence")
    if not first:
        return f"verdict {result.get('verdict')!r}, no first divergence"
    shown = {k: first.get(k) for k in ("code", "annotations", "step", "direction", "kind",
                                       "module", "op", "role", "name_a", "name_b", "reason")}
    return f"verdict {result.get('verdict')!r}, first divergence {json.dumps(shown, default=str)}"


def assert_first(result: Dict[str, Any], *, step: int, direction: str, kind: Any,
                 module: Optional[str], op: Optional[str] = None,
                 code: Any = None, annotations: Sequence[str] = ()) -> Dict[str, Any]:
    """The result names a divergence with these fields; `kind` may be a set of accepted kinds;
    `code`: the verdict's code (or a set of accepted codes); `annotations`: codes it carries. `module` or `op` None: not
    checked here."""
    assert result["verdict"] == "diverged", describe(result)
    first = result["first_divergence"]
    assert first is not None, describe(result)
    assert FIRST_KEYS <= set(first), f"missing keys {FIRST_KEYS - set(first)}"
    kinds = {kind} if isinstance(kind, str) else set(kind)
    got = (first["step"], first["direction"], first["module"] if module is not None else None)
    assert got == (step, direction, module) and first["kind"] in kinds, \
        f"expected step {step} {direction} {sorted(kinds)} in module {module!r}; " \
        + describe(result)
    if op is not None:
        assert first["op"] == op, f"expected op {op!r}; " + describe(result)
    if code is not None:
        codes = {code} if isinstance(code, str) else set(code)
        assert first["code"] in codes, f"expected code {sorted(codes)}; " + describe(result)
    missing = set(annotations) - set(first["annotations"])
    assert not missing, f"expected annotations {sorted(missing)}; " + describe(result)
    return first


def assert_match(result: Dict[str, Any]) -> None:
    assert result["verdict"] == "match" and result["first_divergence"] is None, \
        describe(result)
    assert result["rows"], "nothing was compared"
    bad = [r for r in result["rows"] if r["status"] != "match"]
    assert not bad, f"{len(bad)} rows beyond tolerance, e.g. {bad[:2]}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--task", default="statistics")
    parser.add_argument("--defect", default=None, choices=sorted(DEFECTS))
    parser.add_argument("--autocast", action="store_true", help="CPU bfloat16 autocast")
    args = parser.parse_args(argv)
    dump_gpt(args.path, defect=args.defect, steps=args.steps, task=args.task,
             threads=args.threads, autocast=args.autocast)
    return 0


if __name__ == "__main__":
    sys.exit(main())
