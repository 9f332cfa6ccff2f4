"""The guides' pattern on a Hugging Face model (tiny GPT-2 or Llama, random init), on real
PyTorch or on MindSpore through a torch shim (mindnlp's `mindtorch`): the same PyTorch code,
the same weights and batch (a .npz the torch side writes and the shim side reads).

    python tests/shim_guide.py torch|shim DUMP_DIR WEIGHTS.npz [--model gpt2|llama]
        [--level mix|module|api] [--grads backward|value_and_grad] [--defect NAME]
        [--function]

Two steps of SGD; step 1 is dumped (`dump_step = 1`, the weights at its start already
updated once). Defects (on the side they are given to): `act` (layer 1's MLP activation
scaled in the forward), `dx` (layer 1's down projection's input gradient scaled, forward
untouched), `dw` (that projection's weight gradient scaled in the hook, nothing else),
`function_dw` (with --function: the Function's backward computes that weight gradient
scaled). `--function` (Llama): layer 1's down projection computes through a custom
`torch.autograd.Function` whose backward returns dx and dw itself, the shape of Megatron's
`LinearWithGradAccumulationAndAsyncCommunication` (the vendor guide's GLM4 case).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["torch", "shim"])
    parser.add_argument("dump")
    parser.add_argument("weights")
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--level", default="mix")
    parser.add_argument("--grads", choices=["backward", "value_and_grad"], default="backward")
    parser.add_argument("--defect", choices=["", "act", "dx", "dw", "function_dw"], default="")
    parser.add_argument("--function", action="store_true",
                        help="layer 1's down projection through a custom autograd.Function")
    parser.add_argument("--raise-in-forward", action="store_true")
    parser.add_argument("--dump-step", type=int, default=1, help="the iteration dumped")
    parser.add_argument("--optimizer", choices=["plain", "sgd"], default="plain",
                        help="plain: PlainSGD below; sgd: torch.optim.SGD (the shim's own)")
    return parser.parse_args()


ARGS = _args()
if ARGS.side == "shim":
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    import mindnlp  # noqa: F401  - makes `torch` the shim (mindtorch)
    from precdbg_ms import PrecisionDebugger
else:
    from precdbg_pt import PrecisionDebugger
import torch  # noqa: E402

VOCAB, SEQ, BATCH = 64, 8, 2


def make_model():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if ARGS.model == "gpt2":
        config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        config._attn_implementation = "eager"
        return GPT2LMHeadModel(config)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=SEQ)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)


def mlp_parts(model):
    """(layer 1's MLP activation module, its down projection) of either model."""
    if ARGS.model == "gpt2":
        mlp = model.transformer.h[1].mlp
        return mlp.act, mlp.c_proj
    mlp = model.model.layers[1].mlp
    return mlp.act_fn, mlp.down_proj


def load_or_save_weights(model) -> dict:
    if not os.path.exists(ARGS.weights):     # the first side run writes them
        state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        rng = np.random.default_rng(0)
        batches = rng.integers(0, VOCAB, size=(2, BATCH, SEQ))
        np.savez(ARGS.weights, batches=batches, **{"w:" + k: v for k, v in state.items()})
    data = np.load(ARGS.weights)
    state = {k[2:]: torch.tensor(data[k]) for k in data.files if k.startswith("w:")}
    model.load_state_dict(state, strict=False)
    return {"batches": data["batches"]}


def grad_hook(t, scale: float) -> None:
    """A gradient hook on `t` that scales its gradient; on the shim through MindSpore's own
    tensor hook and op (mindnlp 0.5.1's Tensor.register_hook reads a `_data` its tensors lack,
    and its operators a device the gradient MindSpore hands the hook lacks)."""
    if ARGS.side == "shim":
        import mindspore
        from mindspore._c_expression import TensorPy
        TensorPy.register_hook(t, lambda g: mindspore.ops.mul(g, scale))
    else:
        t.register_hook(lambda g: g * scale)


class LinearWithGradAccumulation(torch.autograd.Function):
    """y = x @ w.T with its own backward, as Megatron's tensor-parallel linear layers compute
    it: dx = dy @ w, dw = dy^T x over the flattened tokens (`scale` != 1: dw computed
    otherwise, the defect)."""

    @staticmethod
    def forward(ctx, x, weight, scale):
        ctx.save_for_backward(x, weight)
        ctx.scale = scale
        return torch.matmul(x, weight.t())

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        grad_input = torch.matmul(grad_output, weight)
        dy = grad_output.reshape(-1, grad_output.shape[-1])
        grad_weight = torch.matmul(dy.t(), x.reshape(-1, x.shape[-1]))
        if ctx.scale != 1.0:
            grad_weight = grad_weight * ctx.scale
        return grad_input, grad_weight, None


def through_function(proj, scale: float) -> None:
    """The projection's forward through LinearWithGradAccumulation (Llama: no bias)."""
    proj.forward = lambda x: LinearWithGradAccumulation.apply(x, proj.weight, scale)


def inject(model) -> None:
    act, proj = mlp_parts(model)
    if ARGS.function:
        through_function(proj, 1.5 if ARGS.defect == "function_dw" else 1.0)
    if ARGS.defect == "act":
        act.register_forward_hook(lambda m, a, out: out * 1.05)
    elif ARGS.defect == "dx":
        def dx_scaled(m, args):
            x = args[0] * 1.0          # the same values; its gradient scaled on the way back
            grad_hook(x, 1.25)
            return (x,)
        proj.register_forward_pre_hook(dx_scaled)
    elif ARGS.defect == "dw":
        grad_hook(proj.weight, 1.5)


class PlainSGD(torch.optim.Optimizer):
    """SGD as a `torch.optim.Optimizer` of the user's (mindnlp 0.5.1's own optimizers call
    fused kernels that have no CPU implementation): its step is the optimizer phase."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.sub_(p.grad * group["lr"])
        return None


def main() -> int:
    model = make_model()
    data = load_or_save_weights(model)
    inject(model)
    model.train()
    opt = (PlainSGD(model.parameters(), lr=0.1) if ARGS.optimizer == "plain"
           else torch.optim.SGD(model.parameters(), lr=0.1))
    debugger = PrecisionDebugger(task="statistics", level=ARGS.level, dump_path=ARGS.dump,
                                 step=[0])      # the first step() call ends step 0
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_of(ids):
        out = model(input_ids=ids, labels=ids)
        return out.loss

    for step in range(2):
        ids = torch.tensor(data["batches"][step], dtype=torch.long)
        if step == ARGS.dump_step:
            debugger.start(model)
        if ARGS.raise_in_forward and step == ARGS.dump_step:
            try:
                act, _ = mlp_parts(model)
                act.register_forward_hook(lambda m, a, out: (_ for _ in ()).throw(
                    RuntimeError("raised in the forward")))
                loss_of(ids)
            except RuntimeError:
                pass
            debugger.stop()
            debugger.step()
            return 0
        for p in params:       # opt.zero_grad(): mindnlp 0.5.1's needs autograd.profiler
            p.grad = None
        if ARGS.grads == "backward":
            loss = loss_of(ids)
            loss.backward()
        else:
            from mindtorch.autograd import value_and_grad
            loss = value_and_grad(loss_of, params)(ids)
        opt.step()
        if step == ARGS.dump_step:
            debugger.stop()
            debugger.step()
        print(f"step {step} loss {float(loss):.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
