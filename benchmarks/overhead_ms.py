"""What a precdbg dump costs a MindSpore training step (PyNative, CPU).

    python benchmarks/overhead_ms.py [--repeats 9] [--warmup 2] [--json FILE]
                                     [--results benchmarks/results_ms.md] [--modes ...]

The MindSpore twin of benchmarks/overhead_torch.py, with the same columns. On the bundled GPT
(precdbg_examples.gpt_ms, GPTConfig() defaults: 4 layers, d_model 256, seq_len 64, vocab 512;
batch 8; nn.AdamWeightDecay; one step = gpt_ms.train_step_fn: value_and_grad + optimizer), in ONE
process, for each mode (task/level) it alternates a plain training step and a dumped step (a
debugger with step=[] so every started step is dumped: start(model) / train step / stop() /
step()), after warm-up rounds. Every timed step ends by waiting for its kernels (reading the
loss and the last parameter back on the CPU, ms.runtime.synchronize() elsewhere), so queued work
is counted in the step that launched it. Reported per mode:

- plain ms, dumped ms, ratio (dumped / plain, each a median over the repeats), per-round
  quartiles of each round's own ratio, drain ms (debugger.flush() waiting for the writer after a
  dumped step), +drain, MB/step, records, µs/record ((dumped ms - plain ms) / records: the host
  cost of one captured record), close ms, other CPU: as in overhead_torch.py (same table).

Aim (the issue): statistics <= 2x a plain step; the incumbent (msprobe) measured ~17x at level
mix on CPU. Nothing here asserts on wall-clock time.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tools import machine_info as shared_machine_info  # noqa: E402
from overhead_torch import add_timing_args, measure_mode, measure_modes, table  # noqa: E402  (shared helpers)

MODES: Tuple[Tuple[str, str], ...] = (("statistics", "mix"), ("statistics", "api"),
                                      ("statistics", "module"), ("tensor", "mix"))
BATCH = 8
AIM = 2.0


def machine_info() -> Dict[str, Any]:
    import mindspore as ms
    # not `nproc`: it obeys OMP_NUM_THREADS, which MindSpore sets for itself on import
    info = shared_machine_info()
    info.update(mindspore=ms.__version__,
                mindspore_threads=ms.get_context("runtime_num_threads"))
    return info


def make_sync(model: Any) -> Any:
    """Wait until a step's kernels are done: ms.runtime.synchronize() where the device supports
    it; on CPU (where it does not) read the loss and the last parameter back to the host, which
    waits for the forward, the backward and the optimizer's update."""
    import mindspore as ms
    last = model.trainable_params()[-1]
    if ms.get_context("device_target") != "CPU":
        return lambda loss: ms.runtime.synchronize()
    return lambda loss: (float(loss.asnumpy()), last.asnumpy())


def bench_mode(task: str, level: str, model: Any, step_fn: Any, batch: Tuple[Any, Any],
               repeats: int, warmup: int) -> Dict[str, Any]:
    from precdbg_ms import PrecisionDebugger
    x, y = batch
    sync = make_sync(model)
    return measure_mode(task, level, PrecisionDebugger, model, lambda: sync(step_fn(x, y)),
                        repeats, warmup, prefix="precdbg_bench_ms")


def verdicts(rows: List[Dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        if r["task"] != "statistics":
            continue
        met = "meets" if r["ratio"] <= AIM else "misses"
        lines.append(f"- statistics / {r['level']}: {r['ratio']:.2f}× — {met} the ≤ {AIM:.0f}× "
                     f"aim ({r['ratio_with_drain']:.2f}× if the writer cannot overlap at all)")
    return "\n".join(lines) + "\n"


def results_markdown(info: Dict[str, Any], rows: List[Dict[str, Any]], argv: List[str]) -> str:
    cmd = " ".join(["python", "benchmarks/overhead_ms.py"] + argv)
    return (
        "# precdbg overhead, MindSpore\n\n"
        f"Measured {info['date']} with `{cmd}`.\n\n"
        f"- machine: {info['nproc']} cores (nproc), {info['cpu']}, "
        f"{info['memory_gb']} GB RAM, {info['platform']}\n"
        f"- python {info['python']}, mindspore {info['mindspore']} (PyNative, CPU, runtime "
        f"threads {info['mindspore_threads']}), numpy {info['numpy']}, h5py {info['h5py']}, "
        f"precdbg {info['precdbg']}\n"
        f"- model: bundled GPT (precdbg_examples.gpt_ms), GPTConfig() defaults (4 layers, "
        f"d_model 256, seq_len 64, vocab 512), batch {BATCH}, nn.AdamWeightDecay; one step = "
        "gpt_ms.train_step_fn (value_and_grad + optimizer), then a wait for its kernels\n"
        f"- {rows[0]['repeats']} repeats after {rows[0]['warmup']} warm-up rounds per mode, "
        "one process, plain and dumped steps alternating\n\n"
        + table(rows) + "\n" + verdicts(rows) +
        "\nratio = median dumped step ÷ median plain step (start(model) .. step(), what the "
        "training loop sees). per-round = quartiles (25 %–75 %) of each round's own dumped ÷ "
        "plain. drain = median wait in debugger.flush() after a dumped step for the background "
        "writer; +drain = (dumped + drain) ÷ plain, the cost when the writer cannot overlap "
        "training at all. MB/step = size of one step file. µs/record = (dumped − plain) ÷ "
        "records, the host cost of one captured record. close = debugger.close() at the end. "
        "other CPU = share of the machine's CPU time used by other processes meanwhile (more "
        f"than a few % distorts the timings). Aim: statistics ≤ {AIM:.0f}× a plain step; the "
        "incumbent msprobe measured ~17× at level mix on CPU. The PyTorch numbers are in "
        "results_torch.md; see benchmarks/README.md for the method.\n")


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description="precdbg dump overhead on the MindSpore GPT")
    add_timing_args(parser, MODES)
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--results", metavar="FILE",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "results_ms.md"),
                        help="markdown results file (default benchmarks/results_ms.md); "
                             "'-' to skip")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")

    import mindspore as ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    from mindspore import nn

    from precdbg_examples.gpt_ms import GPT, GPTConfig, make_batches_numpy, train_step_fn

    info = machine_info()
    print(f"{info['nproc']} cores, {info['cpu']}; mindspore {info['mindspore']}", flush=True)
    ms.set_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    optimizer = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-4)
    step_fn = train_step_fn(model, optimizer)
    x, y = next(make_batches_numpy(cfg, batch_size=BATCH, steps=1))
    batch = (ms.Tensor(x), ms.Tensor(y))
    sync = make_sync(model)
    for _ in range(6):   # the first iterations compile the optimizer and allocate (~3x slower)
        sync(step_fn(*batch))

    rows = measure_modes(args.modes, lambda task, level: bench_mode(
        task, level, model, step_fn, batch, args.repeats, args.warmup),
        args.retries, args.max_other)

    print()
    print(table(rows), end="")
    print(verdicts(rows), end="")
    if args.results != "-":
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(results_markdown(info, rows, argv))
        print(f"\nwrote {args.results}")
    if args.json:
        import dataclasses
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": info, "batch": BATCH, "model": dataclasses.asdict(cfg),
                       "rows": rows}, handle, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
