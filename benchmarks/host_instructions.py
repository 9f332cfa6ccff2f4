"""Instructions per dumped step, counted by valgrind: a host-cost figure that noise cannot move.

    python benchmarks/host_instructions.py [--model mlp|gpt|gpt2-tiny] [--level mix|api|module]
                                           [--steps 4] [--blocks 20] [--against DIR] [--by-library]

On a shared 2-core machine the same step's time moves by ±20 % from one minute to the next, so a
change worth 5 % cannot be seen in timings. Here a workload runs under `valgrind --tool=callgrind`
twice after the same warm-up: `--steps` dumped steps, and as many plain steps; the difference,
divided by the steps, is what dumping one step adds in every thread (hooks, records, statistics,
the writer's work for that step), and divided by the step's records, per record. Models: `mlp`,
the workload of `host_cost.py` (tiny tensors, SGD: the Python path per record); `gpt`, the
bundled GPT of `overhead_torch.py` (AdamW, clip: what its timings measure); `gpt2-tiny`, GPT-2
small's 12-layer structure at d_model 64 (bench_models.py: the host cost of dumping a real
transformers model, whose step on a GPU is host-bound). One torch thread
(idle threads' spinning would count). `--against DIR` also counts another checkout (`DIR` put
first on PYTHONPATH, e.g. a `git worktree` of the commit before a change, its extensions built)
and prints the change. `--by-library` also prints where this tree's extra instructions run: per
shared library (the interpreter, numpy, HDF5, torch's bindings) and per function. Needs
valgrind; a run takes ~2 minutes for mlp, ~6 for gpt2-tiny (`--steps 2`) and over half an hour
for gpt (torch's kernels run slowly under valgrind); runs go two at a time. Nothing is asserted.
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
from typing import Any, Callable, Dict, List, Optional, Tuple


def _model(name: str, blocks: int) -> Tuple[Any, Callable[[], Any]]:
    if name == "mlp":
        from host_cost import workload          # the same model and step as host_cost.py
        return workload(blocks)
    import torch
    from bench_models import build              # the same model and step as overhead_torch.py
    torch.set_num_threads(1)
    work = build(name, torch.device("cpu"), False)
    return work.model, work.step


def _workload(model_name: str, level: str, steps: int, blocks: int, dumped: bool) -> None:
    from precdbg import open_dump
    from precdbg_pt import PrecisionDebugger

    model, step = _model(model_name, blocks)
    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level=level, dump_path=folder, step=[])
        for _ in range(2):                  # warm-up: every code path and table is made
            step()
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
        debugger.flush()
        for _ in range(steps):
            if dumped:
                debugger.start(model)
            step()
            if dumped:
                debugger.stop()
            debugger.step()
        debugger.close()
        with open_dump(folder) as dump:
            print(f"records {len(dump.records(step=dump.steps[-1]))}")


def _count(args: argparse.Namespace, dumped: bool, path: Optional[str]
           ) -> Tuple[int, int, Dict[Tuple[str, str], int]]:
    """(instructions, records of the last dumped step, own instructions per (library,
    function) when `--by-library`) of one counted run."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg",
                   sys.executable, os.path.abspath(__file__), "--workload", "--model", args.model,
                   "--level", args.level, "--steps", str(args.steps), "--blocks", str(args.blocks)]
        command += ["--dumped"] if dumped else []
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        own = _own_costs(f"{out}/cg") if args.by_library and done.returncode == 0 else {}
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    records = re.search(r"^records (\d+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None or records is None:
        raise SystemExit(f"valgrind run failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:] or 'no output'}")
    return int(found.group(1).replace(",", "")), int(records.group(1)), own


_NAMED = re.compile(r"\((\d+)\)(?:\s+(.*))?")


def _own_costs(path: str) -> Dict[Tuple[str, str], int]:
    """Instructions each (library, function) ran itself, from a callgrind output file (name
    compression resolved; the inclusive costs after `calls=` lines are left out)."""
    names: Dict[str, Dict[str, str]] = {"ob": {}, "fn": {}}
    own: Dict[Tuple[str, str], int] = {}
    library = function = "?"
    after_call = False

    def name(kind: str, text: str) -> str:
        match = _NAMED.match(text)
        if match is None:
            return text
        if match.group(2) is not None:
            names[kind][match.group(1)] = match.group(2)
        return names[kind].get(match.group(1), "?")

    with open(path, errors="replace") as lines:
        for line in lines:
            if line.startswith("ob="):
                library = os.path.basename(name("ob", line[3:].strip()))
            elif line.startswith("fn="):
                function = name("fn", line[3:].strip())
            elif line.startswith(("cob=", "cfn=")):
                name(line[1:3], line[4:].strip())
            elif line.startswith("calls="):
                after_call = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                fields = line.split()
                if len(fields) >= 2 and not after_call:
                    own[(library, function)] = own.get((library, function), 0) + int(fields[1])
                after_call = False
    return own


def _print_split(dumped: Dict[Tuple[str, str], int], plain: Dict[Tuple[str, str], int],
                 steps: int, top: int = 25) -> None:
    """What dumping adds per step, by library and by function (own instructions)."""
    extra = {key: (dumped.get(key, 0) - plain.get(key, 0)) / steps
             for key in set(dumped) | set(plain)}
    total = sum(extra.values()) or 1.0
    libraries: Dict[str, float] = {}
    for (library, _), count in extra.items():
        libraries[library] = libraries.get(library, 0.0) + count
    print("by library (own instructions per dumped step over a plain one):")
    for library, count in sorted(libraries.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {count / 1e6:8.1f} M {count / total * 100:5.1f} %  {library}")
    print(f"top {top} functions:")
    for (library, function), count in sorted(extra.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count / 1e6:8.2f} M {count / total * 100:5.1f} %  {library}: {function[:80]}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "gpt", "gpt2-tiny"])
    parser.add_argument("--level", default="mix", choices=["mix", "api", "module"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--against", metavar="DIR", help="also count this checkout")
    parser.add_argument("--by-library", action="store_true",
                        help="also split this tree's extra instructions by library and function")
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dumped", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workload:            # the counted process (0 steps: the run to subtract)
        _workload(args.model, args.level, args.steps, args.blocks, args.dumped)
        return 0
    if args.steps < 1 or args.blocks < 1:
        parser.error("--steps and --blocks must be >= 1")
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing counted", file=sys.stderr)
        return 2
    if args.against and not os.path.isdir(os.path.join(args.against, "precdbg")):
        parser.error(f"--against: {args.against} holds no precdbg package")
    # each tree against its own plain steps (imports and warm-up differ between trees)
    runs = [(True, None), (False, None)]
    if args.against:
        runs += [(True, args.against), (False, args.against)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda run: _count(args, *run), runs))
    model = f"{args.blocks}-block mlp" if args.model == "mlp" else args.model
    this = (counts[0][0] - counts[1][0]) / args.steps
    if args.by_library:
        _print_split(counts[0][2], counts[1][2], args.steps)
    print(f"{model}, {args.level}: {this / 1e6:.1f} M instructions per dumped step over a plain "
          f"one (all threads), {counts[0][1]} records: {this / counts[0][1] / 1e3:.1f} K each")
    if args.against:
        other = (counts[2][0] - counts[3][0]) / args.steps
        print(f"{args.against}: {other / 1e6:.1f} M per dumped step, "
              f"{other / counts[2][1] / 1e3:.1f} K per record; this tree "
              f"{(this - other) / other * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
