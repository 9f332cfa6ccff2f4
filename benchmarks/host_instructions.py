"""Instructions per dumped step, counted by valgrind: a host-cost figure that noise cannot move.

    python benchmarks/host_instructions.py [--level mix|api|module] [--steps 4] [--blocks 20]
                                           [--against DIR]

On a shared 2-core machine the same step's time moves by ±20 % from one minute to the next, so a
change worth 5 % cannot be seen in timings. Here the workload of `host_cost.py` (an MLP of tiny
tensors, SGD, one torch thread) runs under `valgrind --tool=callgrind` twice: with no dumped step
and with `--steps` dumped steps after the same warm-up; the difference, divided by the steps, is
what one dumped step executes in every thread (hooks, records, statistics, the writer's work for
that step). `--against DIR` also counts another checkout (`DIR` put first on PYTHONPATH, e.g. a
`git worktree` of the commit before a change, its extensions built) and prints the change.
Needs valgrind; ~2 minutes per run (runs go two at a time). Nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional


def _workload(level: str, steps: int, blocks: int) -> None:
    from host_cost import workload          # the same model and step as host_cost.py
    from precdbg_pt import PrecisionDebugger

    model, step = workload(blocks)
    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level=level, dump_path=folder, step=[])
        for _ in range(2):                  # warm-up: every code path and table is made
            step()
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
        debugger.close()
        for _ in range(steps):
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
        debugger.close()


def _count(args: argparse.Namespace, steps: int, path: Optional[str]) -> int:
    env = dict(os.environ, PYTHONHASHSEED="0")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg",
                   sys.executable, os.path.abspath(__file__), "--workload", "--level", args.level,
                   "--steps", str(steps), "--blocks", str(args.blocks)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:] or 'no output'}")
    return int(found.group(1).replace(",", ""))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="mix", choices=["mix", "api", "module"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--against", metavar="DIR", help="also count this checkout")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:            # the counted process (0 steps: the run to subtract)
        _workload(args.level, args.steps, args.blocks)
        return 0
    if args.steps < 1 or args.blocks < 1:
        parser.error("--steps and --blocks must be >= 1")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing counted", file=sys.stderr)
        return 2
    if args.against and not os.path.isdir(os.path.join(args.against, "precdbg")):
        parser.error(f"--against: {args.against} holds no precdbg package")
    # each tree against its own run without dumped steps (imports and warm-up differ)
    runs = [(args.steps, None), (0, None)]
    if args.against:
        runs += [(args.steps, args.against), (0, args.against)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda run: _count(args, *run), runs))
    this = (counts[0] - counts[1]) / args.steps
    print(f"{args.level}: {this / 1e6:.1f} M instructions per dumped step "
          f"({args.blocks} blocks, all threads)")
    if args.against:
        other = (counts[2] - counts[3]) / args.steps
        print(f"{args.against}: {other / 1e6:.1f} M per dumped step; this tree "
              f"{(this - other) / other * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
