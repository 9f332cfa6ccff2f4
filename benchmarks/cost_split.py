"""Where a dumped PyTorch step's extra time goes: the statistics pass, the records, the hooks.

    python benchmarks/cost_split.py [--model gpt|mlp] [--level mix|api|module] [--repeats 9]

The same workload is measured three times, each in a fresh child process, plain and dumped steps
alternating after warm-up (medians of wall time, flushed after every dumped step, as in
overhead_torch.py):

- full: precdbg as it is;
- no statistics: every host statistics pass (`_fastats.row`) answers a constant row without
  reading the tensor: what is left is precdbg's Python, hooks and the writer;
- no records: `Session.capture` records nothing: what is left is the hook machinery itself
  (torch's hook dispatch and the capture mode, precdbg's guards, call bookkeeping, backward
  graph walks, start/stop/step).

Differences of the medians split the dumped step's extra time into statistics (full − no
statistics), records (no statistics − no records) and hooks (no records − plain), each also per
record of the full run. Models: `gpt`, the bundled GPT of overhead_torch.py (AdamW, clip, the
machine's torch threads); `mlp`, host_cost.py's 40 blocks of tiny tensors (one torch thread: the
Python path). Nothing is asserted; the variants are measurement only (never how precdbg runs).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

VARIANTS = ("full", "no statistics", "no records")
HERE = os.path.dirname(os.path.abspath(__file__))


def _workload(model: str) -> Tuple[Any, Callable[[], Any]]:
    sys.path.insert(0, HERE)
    if model == "mlp":
        from host_cost import workload
        return workload(40)
    import torch
    from bench_models import build
    work = build("gpt", torch.device("cpu"), False)
    return work.model, work.step


def _disable(variant: str) -> None:
    """Measurement only: take one part of precdbg's work out of this child process."""
    if variant == "no statistics":
        import precdbg_pt.tensors as tensors

        class _ConstantRow:
            @staticmethod
            def row(pointer: int, numel: int, code: int) -> Tuple[float, ...]:
                return (0.0, 0.0, 0.0, 0.0, 0, 0)
        tensors._fastats = _ConstantRow
    elif variant == "no records":
        from precdbg.session import Session
        Session.capture = lambda self, *args, **kwargs: None   # type: ignore[method-assign]


def _child(model: str, level: str, variant: str, repeats: int) -> Dict[str, Any]:
    _disable(variant)
    from precdbg import open_dump
    from precdbg_pt import PrecisionDebugger
    net, step = _workload(model)
    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level=level, dump_path=folder, step=[])
        plain: List[float] = []
        dumped: List[float] = []
        for round_ in range(repeats + 2):                # two warm-up rounds
            began = time.perf_counter()
            step()
            took = time.perf_counter() - began
            if round_ >= 2:
                plain.append(took)
            began = time.perf_counter()
            debugger.start(net)
            step()
            debugger.stop()
            debugger.step()
            took = time.perf_counter() - began
            debugger.flush()
            if round_ >= 2:
                dumped.append(took)
        debugger.close()
        with open_dump(folder) as dump:
            records = len(dump.records(step=dump.steps[-1]))
    return {"plain": statistics.median(plain) * 1e3, "dumped": statistics.median(dumped) * 1e3,
            "records": records}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt", choices=["gpt", "mlp"])
    parser.add_argument("--level", default="mix", choices=["mix", "api", "module"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.child:
        print(json.dumps(_child(args.model, args.level, args.child, args.repeats)))
        return 0
    found: Dict[str, Dict[str, Any]] = {}
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model,
                              "--level", args.level, "--repeats", str(args.repeats),
                              "--child", variant], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"cost_split: the '{variant}' run failed: "
                  f"{(out.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
            return 1
        found[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        row = found[variant]
        print(f"{variant:14s} plain {row['plain']:7.1f} ms  dumped {row['dumped']:7.1f} ms  "
              f"extra {row['dumped'] - row['plain']:6.1f} ms")
    records = found["full"]["records"]

    def extra(variant: str) -> float:
        return found[variant]["dumped"] - found[variant]["plain"]
    parts = (("statistics", extra("full") - extra("no statistics")),
             ("records", extra("no statistics") - extra("no records")),
             ("hooks", extra("no records")))
    print(f"{args.model}, {args.level}: {records} records; extra time per dumped step: "
          + ", ".join(f"{name} {ms:.1f} ms ({ms / records * 1e3:.1f} us/record)"
                      for name, ms in parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
