"""Per-record host cost of a dumped PyTorch step: (dumped − plain) / records, on tiny tensors.

    python benchmarks/host_cost.py [--level mix|api|module] [--repeats 9] [--blocks 40]

A 40-block MLP of 4×16 tensors (Linear, LayerNorm, GELU, residual), SGD, one torch thread: the
statistics themselves cost next to nothing, so what is measured is precdbg's Python path per
record (hooks, names, provenance, batching, writer hand-off). Plain and dumped steps alternate in
one process after warm-up; times are the main thread's CPU time (`time.thread_time`), medians over
the repeats, so other processes on the machine disturb them little. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any, Callable, List, Optional, Tuple


def workload(blocks: int) -> Tuple[Any, Callable[[], None]]:
    """The measured model (`blocks` of Linear, LayerNorm, GELU, residual on 4x16 tensors, SGD,
    one torch thread) and its training step; also used by host_instructions.py."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.ln = torch.nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.nn.functional.gelu(self.fc(self.ln(x))) * 0.5

    model = torch.nn.Sequential(*[Block() for _ in range(blocks)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, step


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="mix", choices=["mix", "api", "module"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--blocks", type=int, default=40)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.blocks < 1:
        parser.error("--repeats and --blocks must be >= 1")

    from precdbg import open_dump
    from precdbg_pt import PrecisionDebugger

    model, step = workload(args.blocks)

    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level=args.level, dump_path=folder,
                                     step=[])
        for _ in range(3):
            step()
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
        plain, dumped = [], []
        for _ in range(args.repeats):
            began = time.thread_time()
            step()
            plain.append(time.thread_time() - began)
            began = time.thread_time()
            debugger.start(model)
            step()
            debugger.stop()
            debugger.step()
            dumped.append(time.thread_time() - began)
        debugger.close()
        with open_dump(folder) as dump:
            records = len(dump.records(step=dump.steps[-1]))
    p, d = statistics.median(plain) * 1e3, statistics.median(dumped) * 1e3
    print(f"{args.level}: plain {p:.2f} ms, dumped {d:.2f} ms ({d / p:.2f}x), {records} records, "
          f"{(d - p) / records * 1e3:.1f} us per record (main-thread CPU time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
