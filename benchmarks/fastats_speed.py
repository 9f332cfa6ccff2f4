"""How fast `precdbg.capture._fastats` summarises host memory, per float32 pass this CPU has (plain C,
AVX2, AVX-512; `_fastats.simd(cap)` picks one), on its own and inside a dumped step.

    python benchmarks/fastats_speed.py                 # buffers of 4 K .. 1 M float32, hot
    python benchmarks/fastats_speed.py --step          # also: the bundled GPT, statistics/mix

Buffers: the best of 5 timings of a loop over one buffer (it stays in cache: the pass's own
speed). --step: plain and dumped steps alternate, each dumped step with the next pass; per pass
the median time spent inside `_fastats.row` during a dumped step, the bytes it read, and the
median dumped step over the median plain step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from precdbg.capture import _fastats  # noqa: E402

_LEVELS = {"plain": 0, "avx2": 1, "avx512": 2}


def passes() -> List[str]:
    best = _fastats.simd(2)
    return [name for name, level in _LEVELS.items() if level <= _LEVELS[best]]


def buffers(sizes: List[int]) -> None:
    rng = np.random.default_rng(0)
    print("float32 elements  " + "  ".join(f"{p:>16}" for p in passes()))
    for n in sizes:
        a = rng.standard_normal(n).astype(np.float32)
        cells = []
        for name in passes():
            _fastats.simd(_LEVELS[name])
            loops = max(5, 20_000_000 // n)
            best = float("inf")
            for _ in range(5):
                began = time.perf_counter()
                for _ in range(loops):
                    _fastats.row(a.ctypes.data, n, 0)
                best = min(best, (time.perf_counter() - began) / loops)
            cells.append(f"{best * 1e6:7.1f} us {n * 4 / best / 1e9:4.1f} GB/s")
        print(f"{n:>16}  " + "  ".join(cells))
    _fastats.simd(2)


class _Timed:
    """`_fastats` as precdbg_pt.statistics calls it, with the time inside row() added up."""

    def __init__(self) -> None:
        self.seconds, self.bytes = 0.0, 0

    def row(self, address: int, count: int, code: int):  # noqa: ANN201
        began = time.perf_counter()
        try:
            return _fastats.row(address, count, code)
        finally:
            self.seconds += time.perf_counter() - began
            self.bytes += count * (4 if code == 0 else 8 if code == 1 else 2)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(_fastats, name)


def in_step(rounds: int) -> None:
    from bench_models import build, resolve_device

    import precdbg_pt.statistics as tensors
    from precdbg_pt import PrecisionDebugger
    work = build("gpt", resolve_device("cpu"), False)
    names = passes()
    plain: List[float] = []
    dumped: Dict[str, List[float]] = {n: [] for n in names}
    inside: Dict[str, List[float]] = {n: [] for n in names}
    read = 0
    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=folder, step=[])
        try:
            for round_ in range(rounds + 2):                 # two warm-up rounds
                for name in names:
                    began = time.perf_counter()
                    work.step()
                    plain_took = time.perf_counter() - began
                    _fastats.simd(_LEVELS[name])
                    timed = _Timed()
                    tensors._fastats = timed
                    began = time.perf_counter()
                    debugger.start(work.model)
                    work.step()
                    debugger.stop()
                    debugger.step()
                    took = time.perf_counter() - began
                    tensors._fastats = _fastats
                    _fastats.simd(2)
                    debugger.flush()
                    if round_ >= 2:
                        plain.append(plain_took)
                        dumped[name].append(took)
                        inside[name].append(timed.seconds)
                        read = timed.bytes
        finally:
            tensors._fastats = _fastats
            _fastats.simd(2)
            debugger.close()
    base = statistics.median(plain)
    print(f"bundled GPT, statistics/mix, {rounds} rounds: plain step {base * 1e3:.1f} ms; "
          f"{read / 1e6:.0f} MB summarised per dumped step")
    for name in names:
        secs = statistics.median(inside[name])
        print(f"  {name:>7}: inside row() {secs * 1e3:5.1f} ms ({read / secs / 1e9:4.1f} GB/s), "
              f"dumped step {statistics.median(dumped[name]) / base:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*",
                        default=[4096, 32768, 131072, 524288, 1 << 20])
    parser.add_argument("--step", action="store_true", help="also time a dumped GPT step")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(f"passes on this CPU: {', '.join(passes())} (precdbg uses {_fastats.simd()})")
    buffers(args.sizes)
    if args.step:
        in_step(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
