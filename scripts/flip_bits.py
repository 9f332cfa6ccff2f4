"""Measure issue 51's item 4: flip one random bit of a real step file, N times, and count how
`precdbg compare` (the unflipped dump against the flipped one) takes each: refused as damage,
refused otherwise (one line, exit 2), read as written (a bit no reader uses), or compared as
other data (DIVERGED: what the seal is there to prevent), or a traceback.

    PYTHONPATH=. .venv/bin/python scripts/flip_bits.py [N] [SEED]

The dump is made here with the guides' four lines (torch: 8 x (Linear(256), LayerNorm, GELU),
AdamW, gradient clipping, level mix, task statistics, iteration 1 of 3 dumped).
"""
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

_MAKE = r'''
import json, sys, torch
from precdbg_pt import PrecisionDebugger
json.dump({"task": "statistics", "level": "mix", "dump_path": sys.argv[1]}, open(sys.argv[2], "w"))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256),
                              torch.nn.LayerNorm(256), torch.nn.GELU()) for _ in range(8)])
opt = torch.optim.AdamW(model.parameters(), 1e-3)
debugger = PrecisionDebugger(config_path=sys.argv[2])
for step in range(3):
    if step == 1: debugger.start(model)
    loss = model(torch.randn(16, 256)).square().mean()
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
    if step == 1: debugger.stop(); debugger.step()
'''


def _flip(path: str, rng: random.Random) -> int:
    at = rng.randrange(os.path.getsize(path))
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return at


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    with tempfile.TemporaryDirectory(prefix="precdbg-flips-") as tmp:
        base = os.path.join(tmp, "base")
        subprocess.run([sys.executable, "-c", _MAKE, base, os.path.join(tmp, "config.json")],
                       check=True, capture_output=True)
        step_file = os.path.join("step0", "rank0.h5")
        counts: "collections.Counter[str]" = collections.Counter()
        for _ in range(runs):
            flipped = os.path.join(tmp, "flipped")
            shutil.rmtree(flipped, ignore_errors=True)
            shutil.copytree(base, flipped)
            at = _flip(os.path.join(flipped, step_file), rng)
            done = subprocess.run([sys.executable, "-m", "precdbg", "compare", base, flipped],
                                  capture_output=True, text=True, timeout=300)
            kind = ("traceback" if "Traceback" in done.stderr else "damaged" if "damaged"
                    in done.stderr else "refused otherwise" if done.returncode == 2 else
                    {0: "read as written", 1: "DIVERGED", 3: "incomplete"}.get(
                        done.returncode, f"exit {done.returncode}"))
            counts[kind] += 1
            if kind in ("traceback", "DIVERGED", "refused otherwise"):
                print(f"byte {at}: {kind}: {done.stderr.strip()[-300:]}")
        size = os.path.getsize(os.path.join(base, step_file))
        print(json.dumps({"file_bytes": size, "flips": runs, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
