"""Where one dumped PyTorch step spends its time, on the host and on the device.

    python benchmarks/profile_step.py --device cuda --model gpt2-small [--bf16] [--level mix]
        [--top 30] [--out DIR]

The workload of overhead_torch.py (bench_models.build). After warm-up (plain and dumped steps),
it measures, for a plain and a dumped step:

- host time: wall time until the step's last Python line returned, without waiting for the device
  (on an accelerator the device is synchronised before the timer starts, not before it stops), and
  wall time until the device finished;
- a cProfile of the dumped step (top functions by own time and by cumulative time);
- a torch.profiler table of the dumped step's device kernels (top by device time), when the device
  is CUDA, and the count of records of the step.

Nothing is asserted: measurement only. `--out DIR` also writes the tables to DIR/profile_*.txt.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def _timed(step: Callable[[], Any], sync: Callable[[], None]) -> tuple:
    sync()
    start = time.perf_counter()
    step()
    host = time.perf_counter() - start
    sync()
    return host, time.perf_counter() - start


def _phases(tool: Any, step: Callable[[], Any], sync: Callable[[], None]) -> tuple:
    """Host wall time of start(model), of the step's own code, of stop() + step(), and how
    long the device ran on after stop() returned (one dumped step, no sync in between)."""
    sync()
    t0 = time.perf_counter()
    tool.begin()
    t1 = time.perf_counter()
    step()
    t2 = time.perf_counter()
    tool.end()
    t3 = time.perf_counter()
    sync()
    return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3


def main(argv: Optional[List[str]] = None) -> int:
    import bench_models
    from bench_tools import PrecdbgTool

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--level", default="mix", choices=("mix", "api", "module"))
    parser.add_argument("--task", default="statistics", choices=("statistics", "tensor"))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", help="also write the tables into this folder")
    args = parser.parse_args(argv)

    from precdbg_pt import PrecisionDebugger

    device = bench_models.resolve_device(args.device)
    work = bench_models.build(args.model, device, args.bf16, args.batch, args.seq, args.layers)
    sync = (lambda: bench_models.synchronize(device)) if device.type != "cpu" else (lambda: None)
    for _ in range(3):
        work.step()
    texts: List[str] = []
    with tempfile.TemporaryDirectory(prefix="precdbg_profile_") as tmp:
        tool = PrecdbgTool(PrecisionDebugger, args.task, args.level, tmp, work.model)

        def dumped() -> None:
            tool.begin()
            work.step()
            tool.end()

        for _ in range(2):
            work.step()
            dumped()
            sync()
            tool.drain()
        plain_t, dumped_t = [], []
        for _ in range(args.repeats):
            plain_t.append(_timed(work.step, sync))
            dumped_t.append(_timed(dumped, sync))
            tool.drain()
        med = lambda xs, k: sorted(x[k] for x in xs)[len(xs) // 2]  # noqa: E731
        phases = []
        for _ in range(args.repeats):
            phases.append(_phases(tool, work.step, sync))
            tool.drain()
        _, count = tool.files()
        lines = [f"workload: {work.describe()}",
                 f"plain step: host {med(plain_t, 0) * 1e3:.1f} ms, "
                 f"done {med(plain_t, 1) * 1e3:.1f} ms",
                 f"dumped step ({args.task}/{args.level}): host {med(dumped_t, 0) * 1e3:.1f} ms, "
                 f"done {med(dumped_t, 1) * 1e3:.1f} ms; ratio "
                 f"{med(dumped_t, 1) / med(plain_t, 1):.2f}x; {count} records",
                 f"host cost per record: "
                 f"{(med(dumped_t, 1) - med(plain_t, 1)) / max(count, 1) * 1e6:.1f} us",
                 "dumped step by phase (host wall ms, medians): start(model) "
                 f"{med(phases, 0) * 1e3:.1f}, step's own code {med(phases, 1) * 1e3:.1f}, "
                 f"stop()+step() {med(phases, 2) * 1e3:.1f}, device still busy after "
                 f"{med(phases, 3) * 1e3:.1f}"]
        print("\n".join(lines), flush=True)
        texts.append("\n".join(lines))

        profiler = cProfile.Profile()
        sync()
        profiler.enable()
        dumped()
        sync()
        profiler.disable()
        tool.drain()
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats(key).print_stats(args.top)
            text = f"--- cProfile of the dumped step, by {key}\n" + buf.getvalue()
            print(text, flush=True)
            texts.append(text)

        if device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile
            for label, fn in (("plain", work.step), ("dumped", dumped)):
                sync()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    fn()
                    sync()
                tool.drain()
                table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.top)
                text = f"--- torch.profiler, {label} step, by device time\n{table}"
                print(text, flush=True)
                texts.append(text)
        tool.close()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        name = f"profile_{args.device}_{args.model}{'_bf16' if args.bf16 else ''}_{args.level}.txt"
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as handle:
            handle.write("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
