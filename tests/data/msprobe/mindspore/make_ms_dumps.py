"""Produce real msprobe dumps of MindSpore (PyNative, CPU) training, several config variants.

Usage: python make_ms_dumps.py            -> runs every variant, each in its own subprocess
       python make_ms_dumps.py VARIANT    -> runs one variant in this process
PrecisionDebugger is a process-wide singleton, hence one process per variant.
venv: /tmp/msprobe-ms (mindspore 2.7.1, numpy 1.26.4, mindstudio-probe 26.2.0)
CPU workaround: see patch_mint_norm_for_cpu().
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = {
    # name: (task, level, summary_mode, gelu_defect)
    "ms_stat_mix_clean":   ("statistics", "mix", "statistics", False),
    "ms_stat_mix_gelu":    ("statistics", "mix", "statistics", True),
    "ms_tensor_mix_clean": ("tensor", "mix", None, False),
    # extra (not in the brief): mint APIs and value encodings (float64, bool, 0-d, dtype kwarg, tuple out)
    "ms_stat_mix_extras":  ("statistics", "mix", "statistics", False),
}

VOCAB, DIM, HID, SEQ, BATCH, STEPS = 16, 8, 16, 4, 2, 3


def write_config(name):
    task, level, summary_mode, _ = VARIANTS[name]
    cfg = {
        "task": task,
        "dump_path": os.path.join(HERE, name),
        "rank": [],
        "step": [0, 1],
        "level": level,
        "async_dump": False,
    }
    if task == "statistics":
        cfg["statistics"] = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}
    else:
        cfg["tensor"] = {"scope": [], "list": [], "data_mode": ["all"]}
    path = os.path.join(HERE, "configs", name + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def build_model(gelu_defect):
    from mindspore import nn

    class Block(nn.Cell):
        def __init__(self, approximate):
            super().__init__()
            self.ln1 = nn.LayerNorm((DIM,))
            self.fc1 = nn.Dense(DIM, HID)
            self.act = nn.GELU(approximate=approximate)
            self.fc2 = nn.Dense(HID, DIM)

        def construct(self, x):
            return x + self.fc2(self.act(self.fc1(self.ln1(x))))

    class Tiny(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            # MindSpore nn.GELU defaults to approximate=True (tanh); the defect flips block 1
            # to the exact erf form (approximate=False).
            self.blocks = nn.CellList([
                Block(True),
                Block(False if gelu_defect else True),  # blocks.1 = "block 1"
            ])
            self.head = nn.Dense(DIM, VOCAB)

        def construct(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return Tiny()


def patch_mint_norm_for_cpu():
    """CPU workaround, applied BEFORE msprobe is imported.

    msprobe computes the "Norm" statistic with mindspore.mint.norm(data)
    (core/dump/data_dump/data_processor/mindspore_processor.py, get_stat_info). In MindSpore 2.7.1
    the CPU backend has no kernel for it: mint.norm, ops.norm and mint.linalg.vector_norm all fail
    with "RuntimeError: The kernel LinalgVectorNorm unregistered." (pyboost_utils.cc SelectKernel).
    Because PyNative runs ops asynchronously, the error surfaces at the next op (here msprobe's own
    ops.HookBackward on Embedding's get_shp primitive) as "DumpException: Dump Error Code 27".
    Replace mint.norm, for the only call form msprobe uses (whole-tensor L2 norm), with numpy's
    np.linalg.norm (what msprobe itself uses for complex tensors); other forms go to the original.
    msprobe's ApiRegistry records mint.norm when it is built and restores that record while it
    computes statistics (_inner_used_api), so the patch must happen before msprobe is imported.
    """
    import numpy as np
    import mindspore as ms
    from mindspore import mint

    orig_norm = mint.norm

    def cpu_norm(input, p="fro", dim=None, keepdim=False, *, dtype=None):
        if p in ("fro", 2) and dim is None and not keepdim and dtype is None:
            x = input if input.dtype != ms.bfloat16 else input.astype(ms.float32)
            arr = x.asnumpy()
            return ms.Tensor(np.asarray(np.linalg.norm(arr), dtype=arr.dtype))
        return orig_norm(input, p, dim, keepdim, dtype=dtype)

    mint.norm = cpu_norm


def train(name):
    import numpy as np
    import mindspore as ms
    from mindspore import nn, ops
    patch_mint_norm_for_cpu()
    from msprobe.mindspore import PrecisionDebugger

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    _, _, _, gelu_defect = VARIANTS[name]
    cfg_path = os.path.join(HERE, "configs", name + ".json")

    model = build_model(gelu_defect)
    opt = nn.SGD(model.trainable_params(), learning_rate=0.1)
    rng = np.random.default_rng(1)
    ids = ms.Tensor(rng.integers(0, VOCAB, (BATCH, SEQ)), ms.int32)
    tgt = ms.Tensor(rng.integers(0, VOCAB, (BATCH, SEQ)), ms.int32)

    extras = name == "ms_stat_mix_extras"

    def forward_fn(x, y):
        logits = model(x)
        if extras:
            from mindspore import mint
            f = x.astype(ms.float32)
            _ = mint.mean(logits)                                   # Mint.*, 0-d output
            _ = mint.nn.functional.softmax(logits, dim=-1)          # MintFunctional.* (mint gelu: no CPU kernel GeluExt)
            _ = mint.isnan(logits)                                  # bool output
            _ = f.astype(ms.float64).sum()                          # float64
            _ = mint.split(f, 2, dim=-1)                            # tuple output
            _ = mint.sum(f, dim=(0, 1), keepdim=True, dtype=ms.float16)  # tuple arg, dtype kwarg
            _ = f * 2.5                                             # float scalar
        return ops.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)

    debugger = PrecisionDebugger(config_path=cfg_path)
    for step in range(STEPS):
        debugger.start(model)
        loss, grads = grad_fn(ids, tgt)
        opt(grads)
        debugger.stop()
        debugger.step()
        print(f"[{name}] step {step} loss {float(loss.asnumpy()):.6f}", flush=True)


def run_one(name):
    import shutil
    shutil.rmtree(os.path.join(HERE, name), ignore_errors=True)  # no stale proc<oldpid>/ folders
    write_config(name)
    train(name)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run_one(sys.argv[1])
    else:
        failed = []
        for name in VARIANTS:
            print(f"=== {name}", flush=True)
            rc = subprocess.call([sys.executable, os.path.abspath(__file__), name], cwd=HERE)
            if rc:
                failed.append((name, rc))
        print("failed:", failed)
