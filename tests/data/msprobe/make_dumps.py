"""Produce real msprobe dumps (CPU) for several config variants.

Usage: python make_dumps.py            -> runs every variant, each in its own subprocess
       python make_dumps.py VARIANT    -> runs one variant in this process
PrecisionDebugger is a process-wide singleton, hence one process per variant.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = {
    # name: (task, level, summary_mode, gelu_defect, world_size)
    "stat_mix_clean":   ("statistics", "mix", "statistics", False, 1),
    "stat_mix_gelu":    ("statistics", "mix", "statistics", True, 1),
    "md5_mix_clean":    ("statistics", "mix", "md5", False, 1),
    "tensor_mix_clean": ("tensor", "mix", None, False, 1),
    "stat_L0_clean":    ("statistics", "L0", "statistics", False, 1),
    "stat_L1_clean":    ("statistics", "L1", "statistics", False, 1),
    "stat_mix_2ranks":  ("statistics", "mix", "statistics", False, 2),
    # extras (not in the brief): xor summary mode, and a run that shows NaN/inf,
    # bool/float64/float16/empty tensors, tuple outputs, dtype/device kwargs,
    # with risk_level ALL so that low-risk APIs (reshape, to, split...) are dumped too.
    "xor_mix_clean":    ("statistics", "mix", "xor", False, 1),
    "stat_mix_extras":  ("statistics", "mix", "statistics", False, 1),
}

VOCAB, DIM, HID, SEQ, BATCH, STEPS = 16, 8, 16, 4, 2, 3


def write_config(name):
    task, level, summary_mode, _, _ = VARIANTS[name]
    cfg = {
        "task": task,
        "dump_path": os.path.join(HERE, name),
        "rank": [],
        "step": [0, 1],
        "level": level,
        "async_dump": False,
    }
    if name == "stat_mix_extras":
        cfg["risk_level"] = "ALL"
    if task == "statistics":
        cfg["statistics"] = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}
    else:
        cfg["tensor"] = {"scope": [], "list": [], "data_mode": ["all"]}
    os.makedirs(os.path.join(HERE, "configs"), exist_ok=True)
    path = os.path.join(HERE, "configs", name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def build_model(gelu_defect):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, approximate):
            super().__init__()
            self.ln1 = nn.LayerNorm(DIM)
            self.fc1 = nn.Linear(DIM, HID)
            self.act = nn.GELU(approximate=approximate)
            self.fc2 = nn.Linear(HID, DIM)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(self.ln1(x))))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            self.blocks = nn.ModuleList([
                Block("none"),
                Block("tanh" if gelu_defect else "none"),  # blocks.1 = "block 1"
            ])
            self.head = nn.Linear(DIM, VOCAB)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    return Tiny()


def train(name, rank=0, world_size=1):
    import torch
    import torch.nn.functional as F
    from msprobe.pytorch import PrecisionDebugger

    _, _, _, gelu_defect, _ = VARIANTS[name]
    cfg_path = os.path.join(HERE, "configs", name + ".json")
    torch.manual_seed(0)
    model = build_model(gelu_defect)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    tgt = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)

    extras = name == "stat_mix_extras"
    if extras:
        with torch.no_grad():  # defect: one +inf weight in blocks.1.fc1 -> inf/NaN downstream
            model.blocks[1].fc1.weight[0, 0] = float("inf")

    debugger = PrecisionDebugger(config_path=cfg_path)
    for step in range(STEPS):
        debugger.start(model)
        opt.zero_grad()
        logits = model(ids)
        if extras:
            f = ids.float()                                   # Tensor.float (low risk)
            _ = torch.isnan(logits)                           # bool tensor output
            _ = f.to(torch.float64).sum()                     # positional dtype, float64
            _ = torch.split(f, 2, dim=-1)                     # tuple output, int kwarg
            _ = f.sum(dim=(0, 1), keepdim=True)               # tuple arg
            _ = f.to(dtype=torch.float16, device="cpu")       # dtype/device kwargs
            _ = F.softmax(f, dim=-1, dtype=torch.float32)     # dtype kwarg (Functional)
            _ = torch.cat((f, f[:, :0]), dim=1)               # tuple-of-tensors arg, empty tensor
            _ = torch.max(f, dim=1)                           # namedtuple output
            _ = torch.clamp(f, min=None, max=3.0)             # None kwarg
            _ = f.mean() * 2                                  # 0-d tensor, float scalar
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1))
        loss.backward()
        if world_size > 1:
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad /= world_size
        opt.step()
        debugger.stop()
        debugger.step()
        print(f"[{name} rank{rank}] step {step} loss {loss.item():.6f}", flush=True)


def _dist_worker(rank, name, world_size):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29517"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        train(name, rank, world_size)
    finally:
        dist.destroy_process_group()


def run_one(name):
    write_config(name)
    ws = VARIANTS[name][4]
    if ws == 1:
        train(name)
    else:
        import torch.multiprocessing as mp
        mp.spawn(_dist_worker, args=(name, ws), nprocs=ws, join=True)


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
