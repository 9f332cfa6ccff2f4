"""Workloads for benchmarks/overhead_torch.py: the model, its batch, the device and one training
step, built offline from configs written here (random init, nothing downloaded).

Kept apart from the timing loop so the loop stays readable and so other benchmarks can build the
same workloads. Every user-facing problem (no such device, torch_npu or transformers missing, a
sequence longer than the model allows) is raised as BenchError with a one-line message; the
command prints it and exits non-zero instead of showing a traceback.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional, Tuple

MODELS: Tuple[str, ...] = ("gpt", "gpt2-small", "gpt2-tiny", "llama-1b")
DEVICES: Tuple[str, ...] = ("cpu", "cuda", "npu")

# (batch, seq, layers) when the command line leaves them out. None = the model's own value.
# Accelerator defaults are the sizes; the CPU defaults are small enough that a run with
# the default repeats finishes in minutes on a 2-core machine (llama-1b keeps 2 of its 16 layers:
# the full 1.1B model needs ~18 GB for weights, gradients and AdamW state and minutes to init).
DEFAULTS: Dict[Tuple[str, bool], Tuple[int, Optional[int], Optional[int]]] = {
    ("gpt", False): (8, None, None), ("gpt", True): (8, None, None),
    ("gpt2-small", False): (1, 128, None), ("gpt2-small", True): (8, 512, None),
    ("gpt2-tiny", False): (2, 32, None), ("gpt2-tiny", True): (2, 32, None),
    ("llama-1b", False): (1, 64, 2), ("llama-1b", True): (4, 1024, None),
}


class BenchError(Exception):
    """A problem with the requested benchmark that the user can fix; printed as one line."""


def resolve_device(name: str) -> Any:
    """The torch.device for --device, or BenchError when it cannot be used here. torch_npu is
    imported only for npu (it registers the device with torch) and is never installed by us."""
    import torch
    if name not in DEVICES:
        raise BenchError(f"--device {name}: expected one of {', '.join(DEVICES)}")
    if name == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except ImportError:
            raise BenchError("--device npu: torch_npu is not installed") from None
        if not torch.npu.is_available():
            raise BenchError("--device npu: torch_npu found no NPU")
    if name == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"--device cuda: no CUDA device is available (torch {torch.__version__}, "
                         f"built with CUDA {torch.version.cuda or 'none'})")
    return torch.device(name)


def synchronize(device: Any) -> None:
    """Wait for the device's queued work, so a timer read afterwards measures finished work
    (kernels run asynchronously on accelerators). A no-op on the CPU."""
    import torch
    if device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        accelerator.synchronize()
    else:
        getattr(torch, device.type).synchronize()


@dataclasses.dataclass
class Workload:
    """One model on one device with a fixed random batch and its optimizer; step() is one
    training step: forward, LM cross-entropy, backward, clip_grad_norm_, AdamW step, zero_grad."""
    name: str
    model: Any
    optimizer: Any
    x: Any
    y: Any
    forward: Callable[[Any], Any]
    device: Any
    bf16: bool
    batch: int
    seq: int
    layers: int
    full_layers: int
    params: int
    config: Dict[str, Any]

    def step(self) -> Any:
        """One training step; returns the detached loss without reading it (reading it would
        synchronise the device inside the timed region)."""
        import torch
        import torch.nn.functional as F
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.forward(self.x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def describe(self) -> str:
        """One line naming the model, its size and the batch, and saying when layers were cut."""
        layers = (f"shrunk to {self.layers} of its {self.full_layers} layers (--layers N)"
                  if self.layers != self.full_layers else f"{self.layers} layers")
        return (f"{self.name} ({self.params / 1e6:.1f} M parameters, {layers}), "
                f"batch {self.batch} × seq {self.seq}, "
                f"{'bf16 autocast' if self.bf16 else 'fp32'}, AdamW, clip_grad_norm_ 1.0, "
                f"on {self.device.type}")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise BenchError("this --model needs the transformers package, which is not installed"
                         ) from None
    return transformers


def build(model: str, device: Any, bf16: bool, batch: Optional[int] = None,
          seq: Optional[int] = None, layers: Optional[int] = None, seed: int = 0) -> Workload:
    """Build the named workload with the device's defaults for whatever is None."""
    import torch
    if model not in MODELS:
        raise BenchError(f"--model {model}: expected one of {', '.join(MODELS)}")
    d_batch, d_seq, d_layers = DEFAULTS[(model, device.type != "cpu")]
    batch = d_batch if batch is None else batch
    seq = d_seq if seq is None else seq
    layers = d_layers if layers is None else layers
    for flag, value in (("--batch", batch), ("--seq", seq), ("--layers", layers)):
        if value is not None and value < 1:
            raise BenchError(f"{flag} must be >= 1, got {value}")
    torch.manual_seed(seed)
    if model == "gpt":
        from precdbg_examples.gpt_torch import GPT, GPTConfig
        base = GPTConfig()
        cfg = GPTConfig(seq_len=seq or base.seq_len, n_layer=layers or base.n_layer)
        full, seq, vocab = base.n_layer, cfg.seq_len, cfg.vocab_size
        with device:
            net = GPT(cfg)
        forward: Callable[[Any], Any] = net
        config = dataclasses.asdict(cfg)
    else:
        transformers = _transformers()
        if model in ("gpt2-small", "gpt2-tiny"):
            # gpt2-tiny: GPT-2 small's 12 layers and modules at d_model 64 (4 heads, 512
            # tokens): next to no arithmetic, so a step is host-bound, as GPT-2 small's is on
            # a GPU, and a CPU measures the host cost of dumping that model structure
            cfg = (transformers.GPT2Config() if model == "gpt2-small" else
                   transformers.GPT2Config(n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                                           bos_token_id=0, eos_token_id=0))
            full = cfg.n_layer
            if seq > cfg.n_positions:
                raise BenchError(f"--seq {seq}: {model} has {cfg.n_positions} positions")
            cfg.n_layer = layers or full
            cls = transformers.GPT2LMHeadModel
        else:
            cfg = transformers.LlamaConfig(
                hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                max_position_embeddings=max(2048, seq))
            full = cfg.num_hidden_layers
            cfg.num_hidden_layers = layers or full
            cls = transformers.LlamaForCausalLM
        cfg.use_cache = False
        vocab = cfg.vocab_size
        with device:   # initialise on the device: far faster than on the host for 1B weights
            net = cls(cfg)
        net.train()
        forward = lambda ids: net(input_ids=ids, use_cache=False).logits  # noqa: E731
        config = cfg.to_dict()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    params = sum(p.numel() for p in net.parameters())
    n_layers = layers or full
    return Workload(model, net, optimizer, x, y, forward, device, bf16, batch, seq, n_layers,
                    full, params, config)


def device_info(device: Any) -> Dict[str, Any]:
    """What names the accelerator in a results file: its name, memory, and the CUDA/cuDNN (or
    torch_npu) versions; empty on the CPU."""
    import torch
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"accelerator": props.name, "accelerator_memory_gb":
                round(props.total_memory / (1 << 30), 1), "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(device)))}
    if device.type == "npu":
        import torch_npu
        return {"accelerator": torch.npu.get_device_name(device),
                "torch_npu": getattr(torch_npu, "__version__", "unknown")}
    return {}
