"""precdbg in one minute: train the bundled GPT for 3 steps, dump step 1, summarise the dump.

    python -m precdbg_examples.demo [--out DIR]

Writes DIR/dump (default DIR: ./precdbg_demo), then runs `precdbg inspect DIR/dump`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from typing import List, Optional

STEPS = 3          # iterations trained
DUMP_STEP = 1      # the iteration dumped (steps count from 0)


def run(out: str) -> int:
    import torch

    import precdbg.cli
    from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dump_path = os.path.join(out, "dump")

    # line 1: the debugger (keywords here; a config file works too: config_path="...")
    debugger = PrecisionDebugger(task="statistics", level="mix", step=[DUMP_STEP],
                                 dump_path=dump_path)
    began = time.perf_counter()
    for step, (x, y) in enumerate(make_batches(cfg, batch_size=8, steps=STEPS)):
        t0 = time.perf_counter()
        debugger.start(model)                       # line 2: capture (only on selected steps)
        loss = train_step(model, optimizer, x, y)   # the user's own forward/backward/optimizer
        debugger.stop()                             # line 3: remove every hook
        debugger.step()                             # line 4: next iteration
        dumped = " (dumped)" if step == DUMP_STEP else ""
        print(f"step {step}: loss {loss.item():.4f}  {1000 * (time.perf_counter() - t0):.0f} ms"
              f"{dumped}", flush=True)
    ok = debugger.close()                           # wait until every step file is on disk
    print(f"trained {STEPS} steps in {time.perf_counter() - began:.1f} s; "
          f"{'all written' if ok else 'WRITE INCOMPLETE'}; hook failures: {debugger.failures}",
          flush=True)
    if not ok:
        return 1

    print(f"\n$ precdbg inspect {dump_path}", flush=True)
    code = precdbg.cli.main(["inspect", dump_path])
    sys.stdout.flush()
    if code != 0:
        return code

    print("\n(the -inf values are the causal attention mask: masked_fill(..., -inf) before "
          "softmax, as intended)")
    step_dir = os.path.join(dump_path, f"step{DUMP_STEP}")
    files = sorted(os.listdir(step_dir)) if os.path.isdir(step_dir) else []
    size = sum(os.path.getsize(os.path.join(step_dir, f)) for f in files)
    print(f"\ndump written to {os.path.abspath(dump_path)}")
    print(f"  run.json, step{DUMP_STEP}/{', '.join(files)} ({size / 1e6:.2f} MB)")
    print("read it in Python:\n"
          f"  import precdbg; d = precdbg.open_dump({dump_path!r}); t = d.records({DUMP_STEP})\n"
          "  t['entry'], t['role'], t['max'], t['norm']   # numpy columns, one row per tensor")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m precdbg_examples.demo",
                                     description="train the bundled GPT 3 steps with precdbg, "
                                                 "dump step 1, inspect the dump")
    parser.add_argument("--out", default="precdbg_demo",
                        help="output folder; the dump goes to OUT/dump (default ./precdbg_demo)")
    args = parser.parse_args(argv)
    dump_path = os.path.join(args.out, "dump")
    os.makedirs(args.out, exist_ok=True)
    ignore = os.path.join(args.out, ".gitignore")
    if not os.path.exists(ignore):   # keep demo output out of git when run inside a checkout
        with open(ignore, "w", encoding="utf-8") as handle:
            handle.write("# written by python -m precdbg_examples.demo\n*\n")
    if os.path.isdir(dump_path) and os.listdir(dump_path):
        # precdbg refuses to write into an earlier dump: remove the previous demo's dump, and
        # only a dump (run.json, step<S>/ folders)
        names = os.listdir(dump_path)
        if not all(n == "run.json" or re.fullmatch(r"step\d+", n) for n in names):
            print(f"{dump_path} holds files that are not a precdbg dump; choose another --out",
                  file=sys.stderr)
            return 2
        shutil.rmtree(dump_path)
    return run(args.out)


if __name__ == "__main__":
    sys.exit(main())
