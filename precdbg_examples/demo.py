"""precdbg in one minute: the main job on the bundled GPT.

    python -m precdbg_examples.demo [--out DIR]

1. PyTorch: train the GPT 3 steps with the four precdbg lines, dump steps 0 and 1 to DIR/dump,
   and `precdbg inspect` it.
2. MindSpore (when installed): the same GPT, same initial weights, data and optimizer (plain
   SGD), written with the classic migration slip — `mindspore.nn.GELU()` defaults to the tanh approximation where
   `torch.nn.GELU()` is exact — dumped to DIR/dump_ms.
3. `precdbg compare DIR/dump DIR/dump_ms --html DIR/report.html` names the culprit.
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
DUMP_STEPS = [0, 1]  # the iterations dumped (steps count from 0)
DUMP_STEP = DUMP_STEPS[-1]
# plain SGD on both sides: the one optimizer whose update is the same in both frameworks
# (AdamW and AdamWeightDecay differ in their defaults and in bias correction, a second
# difference the twin would show beside its GELU)
LEARNING_RATE = 0.1


def run(out: str) -> int:
    import torch

    import precdbg.cli
    from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
    from precdbg_pt import PrecisionDebugger

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    initial = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    dump_path = os.path.join(out, "dump")
    batches = [(x.numpy(), y.numpy()) for x, y in make_batches(cfg, batch_size=8, steps=STEPS)]

    # line 1: the debugger (keywords here; a config file works too: config_path="...")
    debugger = PrecisionDebugger(task="statistics", level="mix", step=DUMP_STEPS,
                                 dump_path=dump_path)
    began = time.perf_counter()
    print("== PyTorch", flush=True)
    for step, (x, y) in enumerate((torch.from_numpy(x), torch.from_numpy(y))
                                  for x, y in batches):
        t0 = time.perf_counter()
        debugger.start(model)                       # line 2: capture (only on selected steps)
        loss = train_step(model, optimizer, x, y)   # the user's own forward/backward/optimizer
        debugger.stop()                             # line 3: remove every hook
        debugger.step()                             # line 4: next iteration
        dumped = " (dumped)" if step in DUMP_STEPS else ""
        print(f"step {step}: loss {loss.item():.4f}  {1000 * (time.perf_counter() - t0):.0f} ms"
              f"{dumped}", flush=True)
    ok = debugger.close()                           # wait until every step file is on disk
    print(f"trained {STEPS} steps in {time.perf_counter() - began:.1f} s; "
          f"{'all written' if ok else 'WRITE INCOMPLETE'}; hook failures: {debugger.failures}",
          flush=True)
    if not ok:
        return 1

    print(f"\n$ precdbg inspect {dump_path} --step {DUMP_STEP}", flush=True)
    code = precdbg.cli.main(["inspect", dump_path, "--step", str(DUMP_STEP)])
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
    return run_mindspore(out, initial, batches, dump_path)


def run_mindspore(out: str, initial: dict, batches: list, torch_dump: str) -> int:
    """The same GPT in MindSpore, with MindSpore's default GELU; then compare the two dumps."""
    try:
        import mindspore as ms
    except ImportError:
        print("\n(MindSpore is not installed: pip install -e '.[mindspore]' for the "
              "PyTorch-vs-MindSpore part of the demo)")
        return 0
    import precdbg.cli
    from mindspore import nn

    from precdbg_examples import gpt_ms
    from precdbg_ms import PrecisionDebugger

    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = gpt_ms.GPT(gpt_ms.GPTConfig())
    gpt_ms.load_torch_state(model, initial)
    for block in model.blocks:
        block.mlp.act = nn.GELU()      # the slip: MindSpore's default is approximate=True
    optimizer = nn.SGD(model.trainable_params(), learning_rate=LEARNING_RATE)
    train_step = gpt_ms.train_step_fn(model, optimizer)
    dump_ms = os.path.join(out, "dump_ms")
    print("\n== MindSpore (same weights, data and optimizer; blocks.*.mlp.act = "
          "mindspore.nn.GELU())")
    debugger = PrecisionDebugger(task="statistics", level="mix", step=DUMP_STEPS,
                                 dump_path=dump_ms)
    for step, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        debugger.start(model)
        loss = train_step(x, y)
        debugger.stop()
        debugger.step()
        print(f"step {step}: loss {float(loss.asnumpy()):.4f}  "
              f"{1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
    debugger.close()
    report = os.path.join(out, "report.html")
    print(f"\n$ precdbg compare {torch_dump} {dump_ms} --html {report}", flush=True)
    code = precdbg.cli.main(["compare", torch_dump, dump_ms, "--html", report])
    print(f"\n(exit code {code}: 0 match, 1 divergence found, 2 unusable input, 3 incomplete)")
    return 0 if code in (0, 1) else code


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
    for path in (dump_path, os.path.join(args.out, "dump_ms")):
        if os.path.isdir(path) and os.listdir(path):
            # a rerun of the demo starts clean (precdbg itself would keep the earlier run in
            # DIR/dump/previous/): remove the previous demo's dump, and only a dump
            names = os.listdir(path)
            if not all(n in ("run.json", "previous") or re.fullmatch(r"step\d+", n)
                       for n in names):
                print(f"{path} holds files that are not a precdbg dump; choose another --out",
                      file=sys.stderr)
                return 2
            shutil.rmtree(path)
    return run(args.out)


if __name__ == "__main__":
    sys.exit(main())
