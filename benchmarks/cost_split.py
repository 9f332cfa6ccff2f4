"""Where a dumped PyTorch step's extra time goes, part by part, measured in one process.

    python benchmarks/cost_split.py [--model gpt|gpt2-tiny|gpt2-small|llama-1b|mlp]
                                    [--device cpu|cuda|npu] [--bf16] [--level mix|api|module]
                                    [--repeats 15] [--threads N] [--clock wall|cpu]

One workload, one debugger, one process. Each round runs, for every variant below in turn, a
plain step and then a dumped step with that variant applied (and undone right after), so every
variant sees the same machine state; a variant's extra time is the median over rounds of
(its dumped step − the plain step just before it). Each variant takes one more part of
precdbg's work out (measurement only: the benchmark replaces precdbg functions, never how
precdbg runs):

1. full: precdbg as it is;
2. no statistics: every tensor's statistics are a constant row, nothing read or launched;
3. no records: `CaptureWindow.capture` and `capture_value` record nothing (no statistics either);
4. no backward watch: no autograd-graph walk, no backward hooks on captured calls;
5. no API bookkeeping: the capture mode passes every torch call straight through;
6. no module hooks: the module pre- and post-hooks return at once.

Differences of neighbouring variants are the parts: statistics, records (facts, distinct
tensors, provenance, precision, the record itself), backward watch, API calls (names, filters,
argument splitting, guards), module calls; what variant 6 still costs is the rest (start/stop
with the parameter walk and hook registration, the capture mode's dispatch, gradient hooks,
the writer hand-off). Models: `gpt`, the bundled GPT of overhead_torch.py; `gpt2-tiny`, GPT-2
small's 12-layer structure at d_model 64 (next to no arithmetic: host-bound, as GPT-2 small is
on a GPU); the other models of bench_models.py (`--device cuda` for their sizes); `mlp`,
host_cost.py's 40 blocks of tiny tensors (CPU only). On an accelerator the device is
synchronised before every timer read. `--clock cpu` times the main thread's CPU time
(`time.thread_time`; meaningful with `--threads 1` on a CPU), `wall` (default) what the
training loop sees. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

VARIANTS = ("full", "no statistics", "no records", "no backward watch", "no API bookkeeping",
            "no module hooks")
PARTS = ("statistics", "records", "backward watch", "API calls", "module calls")


def _workload(model: str, device_name: str, bf16: bool, threads: Optional[int]
              ) -> Tuple[Any, Callable[[], Any], Any, str]:
    import torch
    from bench_models import BenchError, build, resolve_device
    device = resolve_device(device_name)
    if threads:
        torch.set_num_threads(threads)
    if model == "mlp":
        if device.type != "cpu" or bf16:
            raise BenchError("--model mlp runs on the CPU in fp32 only")
        from host_cost import workload
        net, step = workload(40)         # sets one torch thread itself
        if threads:
            torch.set_num_threads(threads)
        return net, step, device, "mlp: 40 blocks of Linear, LayerNorm, GELU on 4x16 tensors, SGD"
    work = build(model, device, bf16)
    return work.model, work.step, device, work.describe()


class _Patches:
    """precdbg functions replaced for one dumped step and put back after it. A name that is
    not there (precdbg renamed it) is an error, never a variant that silently changes nothing."""

    def __init__(self) -> None:
        self._saved: List[Tuple[Any, str, Any]] = []

    def set(self, owner: Any, attr: str, value: Any) -> None:
        if attr not in vars(owner):
            raise AttributeError(f"cost_split: {getattr(owner, '__name__', owner)}.{attr} is "
                                 f"gone; update the variants to precdbg's code")
        self._saved.append((owner, attr, vars(owner)[attr]))
        setattr(owner, attr, value)

    def undo(self) -> None:
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        self._saved.clear()


def _apply(variant: str, patches: _Patches) -> None:
    """Take the parts of `variant` and of every variant before it out (measurement only)."""
    import precdbg_pt.adapter as adapter
    import precdbg_pt.hooks as hooks
    import precdbg_pt.tensors as tensors
    from precdbg.capture.window import CaptureWindow
    level = VARIANTS.index(variant)
    if level >= 1:      # a finished row: what host statistics return, nothing left to resolve
        patches.set(tensors.TorchTensors, "summarize",
                    lambda self, t: (0.0, 0.0, 0.0, 0.0, 0, 0, 0.0))
    if level >= 2:
        patches.set(CaptureWindow, "capture", lambda self, *args, **kwargs: None)
        patches.set(CaptureWindow, "capture_value", lambda self, *args, **kwargs: None)
    if level >= 3:
        patches.set(adapter, "watch_backward", lambda *args, **kwargs: True)
        patches.set(adapter.TorchAdapter, "watch", lambda *args, **kwargs: None)
    if level >= 4:
        patches.set(adapter.TorchAdapter, "_on_api_call",
                    lambda self, func, ident, args, kwargs: func(*args, **kwargs))
    if level >= 5:
        patches.set(hooks.ModuleHooks, "open", lambda self, *args: None)
        patches.set(hooks.ModuleHooks, "pre", lambda self, *args: None)
        patches.set(hooks.ModuleHooks, "post", lambda self, *args: None)


def measure(model: str, device_name: str, bf16: bool, level: str, repeats: int,
            threads: Optional[int], clock_name: str) -> Dict[str, Any]:
    from bench_models import synchronize
    from precdbg import open_dump
    from precdbg_pt import PrecisionDebugger
    net, run_step, device, described = _workload(model, device_name, bf16, threads)
    timer = time.thread_time if clock_name == "cpu" else time.perf_counter

    def clock() -> float:
        synchronize(device)                 # finished work only (a no-op on the CPU)
        return timer()
    step = run_step
    extra: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    plain: List[float] = []
    patches = _Patches()
    with tempfile.TemporaryDirectory() as folder:
        debugger = PrecisionDebugger(task="statistics", level=level, dump_path=folder, step=[])
        last_step: Dict[str, int] = {}
        for round_ in range(repeats + 2):                   # two warm-up rounds
            for variant in VARIANTS:
                began = clock()
                step()
                plain_took = clock() - began
                _apply(variant, patches)
                try:
                    began = clock()
                    debugger.start(net)
                    step()
                    debugger.stop()
                    debugger.step()
                    took = clock() - began
                finally:
                    patches.undo()
                debugger.flush()
                last_step[variant] = debugger.current_step - 1
                if round_ >= 2:
                    plain.append(plain_took)
                    extra[variant].append(took - plain_took)
        debugger.close()
        with open_dump(folder) as dump:       # what each variant's last dumped step wrote
            written = {v: len(dump.records(step=s)) for v, s in last_step.items()}
    import torch
    return {"workload": described, "threads": torch.get_num_threads(),
            "records": written["full"], "records_written": written,
            "plain_ms": statistics.median(plain) * 1e3,
            "extra_ms": {v: statistics.median(x) * 1e3 for v, x in extra.items()}}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt",
                        choices=["gpt", "gpt2-tiny", "gpt2-small", "llama-1b", "mlp"])
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or npu")
    parser.add_argument("--bf16", action="store_true", help="the step under bf16 autocast")
    parser.add_argument("--level", default="mix", choices=["mix", "api", "module"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own; mlp: 1)")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    parser.add_argument("--json", help="also write the figures into this JSON file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_models import BenchError
    try:
        found = measure(args.model, args.device, args.bf16, args.level, args.repeats,
                        args.threads, args.clock)
    except BenchError as exc:
        print(f"cost_split: {exc}", file=sys.stderr)
        return 2
    extra, records = found["extra_ms"], found["records"]
    print(f"{found['workload']}; level {args.level}; {found['threads']} torch thread(s); "
          f"{args.clock} clock; {args.repeats} rounds")
    print(f"plain step {found['plain_ms']:.1f} ms; dumped step +{extra['full']:.1f} ms "
          f"({(found['plain_ms'] + extra['full']) / found['plain_ms']:.2f}x), "
          f"{records} records ({extra['full'] / records * 1e3:.1f} us each)")
    print(f"{'part':16s} {'ms/step':>8s} {'us/record':>10s}")
    for part, (before, after) in zip(PARTS, zip(VARIANTS, VARIANTS[1:])):
        ms = extra[before] - extra[after]
        print(f"{part:16s} {ms:8.1f} {ms / records * 1e3:10.1f}")
    rest = extra[VARIANTS[-1]]
    print(f"{'rest':16s} {rest:8.1f} {rest / records * 1e3:10.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(dict(found, level=args.level, clock=args.clock, repeats=args.repeats),
                      out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
