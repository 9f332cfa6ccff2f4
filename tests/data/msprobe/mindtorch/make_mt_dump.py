"""msprobe dump of a tiny torch-style model run through mindnlp's mindtorch (torch shim on MindSpore).

venv /tmp/msprobe-mt = a copy of /tmp/mnlp (mindspore 2.7.0, mindnlp 0.5.1) + mindstudio-probe 26.2.0.
Usage: /tmp/msprobe-mt/bin/python make_mt_dump.py              (-> mt_stat_mix_clean)
       MT_NAME=mt_stat_L1_clean MT_LEVEL=L1 /tmp/msprobe-mt/bin/python make_mt_dump.py
mindtorch's torch.manual_seed does not make init/randint reproducible: losses differ run to run.
"""
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = os.environ.get("MT_NAME", "mt_stat_mix_clean")
LEVEL = os.environ.get("MT_LEVEL", "mix")
VOCAB, DIM, HID, SEQ, BATCH, STEPS = 16, 8, 16, 4, 2, 3

import mindspore as ms
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")

# mindtorch installs an import redirect torch -> mindtorch (torch_proxy.py). msprobe decides
# "mindtorch" mode once (msprobe/mindspore/common/utils.py::is_mindtorch: 'torch' in sys.modules
# and torch.tensor(0.0) is a mindspore.Tensor), so torch must be imported BEFORE msprobe.
_ms_register_hook = ms.Tensor.register_hook  # mindspore's own, saved before mindtorch replaces it
import mindtorch  # noqa: F401
import torch

# Workaround 0 (mindtorch 0.5.1 bug, independent of msprobe): mindtorch replaces
# mindspore.Tensor.register_hook with `return self._data.register_hook(hook)` (mindtorch/_tensor.py),
# and Parameters have no `_data`: "AttributeError: 'Parameter' object has no attribute '_data'".
# msprobe registers its parameters_grad hooks with param.register_hook, so put mindspore's back.
if ms.Tensor.register_hook is not _ms_register_hook:
    ms.Tensor.register_hook = _ms_register_hook
import torch.nn as nn
import torch.nn.functional as F

# Workaround 0b (CPU only): mindtorch keeps the device in a Python attribute `_device` that its own
# dispatcher sets on every op output (mindtorch/_tensor.py: `device` raises
# "ValueError: Tensor must have device" when it is missing). Tensors that come back out of msprobe's
# hooks (ApiTemplate/HOOKCell wrappers, backward-hook wrappers) are new mindspore Tensors without
# `_device`, so the next mindtorch op fails. Everything is on CPU here, so default to cpu.
_owner = next(c for c in type(torch.tensor(0.0)).__mro__ if "device" in c.__dict__)
_orig_device = _owner.__dict__["device"]


def _device_or_cpu(self):
    if not hasattr(self, "_device"):
        return torch.device("cpu")
    return self._device


_owner.device = property(_device_or_cpu, getattr(_orig_device, "fset", None))

# Workaround 1: in mindtorch mode msprobe's api_register does an unconditional `import torch_npu`.
# mindtorch only redirects torch_npu -> mindtorch.npu when device_target == 'Ascend'
# (mindtorch/torch_proxy.py REDIRECT_MAP), so on CPU give it an empty stand-in module
# (no torch_npu APIs exist to be wrapped on CPU anyway).
if "torch_npu" not in sys.modules:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        sys.modules["torch_npu"] = types.ModuleType("torch_npu")

# Workaround 2: same CPU Norm problem as make_ms_dumps.py (mint.norm -> LinalgVectorNorm kernel
# not registered on CPU). Must run before msprobe is imported.
sys.path.insert(0, HERE)
from make_ms_dumps import patch_mint_norm_for_cpu  # noqa: E402
patch_mint_norm_for_cpu()

from msprobe.mindspore import PrecisionDebugger  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, HID)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(HID, DIM)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln1(x))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    import shutil
    shutil.rmtree(os.path.join(HERE, NAME), ignore_errors=True)  # no stale proc<oldpid>/ folders
    cfg = {"task": "statistics", "dump_path": os.path.join(HERE, NAME), "rank": [], "step": [0, 1],
           "level": LEVEL, "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    cfg_path = os.path.join(HERE, "configs", NAME + ".json")
    os.makedirs(os.path.dirname(cfg_path), exist_ok=True)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)

    torch.manual_seed(0)
    model = Tiny()
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    tgt = torch.randint(0, VOCAB, (BATCH, SEQ))

    params = list(model.parameters())

    def loss_fn(x, y):
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    train_step = torch.autograd.value_and_grad(loss_fn, params)

    debugger = PrecisionDebugger(config_path=cfg_path)
    for step in range(STEPS):
        debugger.start(model)
        # mindtorch 0.5.1's Optimizer.zero_grad fails even without msprobe:
        # AttributeError: module 'mindtorch.autograd' has no attribute 'profiler'. Same effect by hand:
        for p in model.parameters():
            p.grad = None
        # mindtorch 0.5.1: Tensor.backward() is a no-op (`return self`, mindtorch/_tensor.py), grads
        # stay None. Its training API is mindtorch.autograd.value_and_grad (wraps
        # mindspore.value_and_grad and attaches .grad to the parameters).
        loss = train_step(ids, tgt)
        # mindtorch 0.5.1's torch.optim.SGD.step fails on CPU even without msprobe:
        # "RuntimeError: No implementation for function: raw_sgd on cpu." Plain SGD by hand:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
        debugger.stop()
        debugger.step()
        print(f"[{NAME}] step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
