"""What a precdbg dump costs a PyTorch training step, on the CPU or an accelerator.

    python benchmarks/overhead_torch.py [--device cpu|cuda|npu] [--model gpt|gpt2-small|gpt2-tiny|llama-1b]
        [--bf16] [--batch B] [--seq S] [--layers N] [--modes task/level ...] [--repeats 9]
        [--warmup 2] [--msprobe] [--results FILE|-] [--json FILE]

The model (benchmarks/bench_models.py): the bundled GPT (default; precdbg_examples.gpt_torch,
GPTConfig() defaults, batch 8), GPT-2 small (or its 12-layer structure at d_model 64,
gpt2-tiny) or a Llama-shaped 1.1B model built from configs with random init (nothing
downloaded). One training step = forward, LM cross-entropy on random token ids, backward,
clip_grad_norm_(1.0), AdamW step, zero_grad; under bf16 autocast with --bf16.
In ONE process, for each mode (task/level) it alternates a plain step and a dumped step (a
debugger with step=[] so every started step is dumped: start(model) / step / stop() / step()),
after warm-up rounds; on an accelerator the device is synchronised before every timer read, so
each time is of finished work. Reported per mode:

- plain ms:    median time of a plain step (train step only)
- dumped ms:   median time of a dumped step, start(model) .. step(): what the training loop sees
- ratio:       dumped ms / plain ms (each a median over the repeats)
- per-round:   quartiles of each round's own dumped / plain ratio: the spread
- drain ms:    median time debugger.flush() then waits for the background writer to put that
               step on disk (measured after each dumped step, so the writer never overlaps the
               next plain step; on a saturated machine this work competes with training)
- +drain:      (dumped ms + drain ms) / plain ms: the cost when the writer cannot overlap at all
- MB/step:     median size of one step file (<dump>/step<S>/rank0.h5)
- records:     records in one step file
- µs/record:   (dumped ms - plain ms) / records: the host cost of one captured record
- close ms:    debugger.close() at the end (stop + flush + the writer's last step)
- other CPU:   share of the machine's CPU time other processes used meanwhile (from /proc/stat);
               timings taken while it is above a few percent are distorted, so a mode is
               measured again (--retries, default 2) while it is above --max-other (5 %), and the
               least disturbed measurement is kept
- accelerators only, from one extra untimed round after the timed ones: syncs = host<->device
  synchronisations on the training thread in a dumped step (plain step in brackets; CUDA:
  set_sync_debug_mode("warn") warnings plus wrapped synchronize calls, see bench_tools.
  count_syncs); peak mem = peak device memory allocated in the dumped step (until flushed) over
  the plain step's, as +%.

--msprobe measures msprobe (mindstudio-probe) on the same workload and modes, each mode in a
child process (its debugger is a process-wide singleton that wraps torch), when it is installed.
Each mode writes into a fresh temporary folder that is deleted afterwards. Timings are what this
machine measured; nothing here asserts on wall-clock time.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import DEVICES, MODELS, BenchError, Workload  # noqa: E402
from bench_tools import (PrecdbgTool, count_syncs, peak_bytes, prune_older_steps,  # noqa: E402
                         reset_peak)
from bench_tools import machine_info as shared_machine_info  # noqa: E402

MODES: Tuple[Tuple[str, str], ...] = (("statistics", "mix"), ("tensor", "mix"),
                                      ("statistics", "api"), ("statistics", "module"))
HERE = os.path.dirname(os.path.abspath(__file__))


def machine_info() -> Dict[str, Any]:
    import torch
    try:             # `nproc`, as the results name it: it obeys OMP_NUM_THREADS / affinity
        nproc: Optional[int] = int(subprocess.run(["nproc"], capture_output=True, text=True,
                                                  check=True).stdout)
    except (OSError, ValueError, subprocess.CalledProcessError):
        nproc = None
    info = shared_machine_info(nproc)
    info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    return info


class CpuMeter:
    """How busy the machine was with OTHER processes: (all CPU time - this process's) over
    (wall time x cores), from /proc/stat; None where /proc/stat is missing."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.ncpu = os.cpu_count() or 1
        self.start = self._sample()

    @staticmethod
    def _busy() -> Optional[float]:
        try:
            with open("/proc/stat", "r", encoding="utf-8") as handle:
                fields = [int(v) for v in handle.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return float(sum(fields[:8]) - idle)

    def _sample(self) -> Tuple[Optional[float], float, float]:
        own = os.times()
        return self._busy(), own.user + own.system, time.monotonic()

    def foreign_share(self) -> Optional[float]:
        busy1, own1, wall1 = self._sample()
        busy0, own0, wall0 = self.start
        if busy0 is None or busy1 is None or wall1 <= wall0:
            return None
        other = (busy1 - busy0) / self.tick - (own1 - own0)
        return round(max(0.0, other) / ((wall1 - wall0) * self.ncpu), 3)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def _nothing() -> None:
    """The CPU's synchronize: its ops have finished when they return."""


def measure_mode(task: str, level: str, debugger_cls: Any, model: Any, run_step: Any,
                 repeats: int, warmup: int, prefix: str = "precdbg_bench", *,
                 sync: Callable[[], None] = _nothing, device: Any = None,
                 tool_factory: Optional[Callable[[str, str, str], Any]] = None
                 ) -> Dict[str, Any]:
    """Alternate a plain step and a dumped step (`run_step()` is one training step); medians
    over the repeats after warm-up. Shared by both frameworks and by precdbg and msprobe:
    `tool_factory(task, level, dump_path)` makes the dumper (bench_tools; default precdbg's
    `debugger_cls`). `sync()` waits for the device before every timer read. On an accelerator
    (`device` not cpu) one extra untimed round counts host syncs and peak device memory."""
    meter = CpuMeter()
    tmp = tempfile.mkdtemp(prefix=f"{prefix}_{task}_{level}_")
    probe: Dict[str, Any] = {}
    try:
        dump_path = os.path.join(tmp, "dump")
        tool = (tool_factory(task, level, dump_path) if tool_factory is not None
                else PrecdbgTool(debugger_cls, task, level, dump_path, model))
        plain: List[float] = []
        dumped: List[float] = []
        drain: List[float] = []
        pruned: List[int] = []       # sizes of the step folders deleted after their drain
        for i in range(warmup + repeats):
            sync()
            t0 = time.perf_counter()
            run_step()
            sync()
            t1 = time.perf_counter()
            tool.begin()
            run_step()
            tool.end()
            sync()
            t2 = time.perf_counter()
            if not tool.drain():
                raise RuntimeError(f"{task}/{level}: the writer did not finish a step")
            t3 = time.perf_counter()
            pruned += prune_older_steps(dump_path)     # one step on disk at a time
            if i >= warmup:
                plain.append(t1 - t0)
                dumped.append(t2 - t1)
                drain.append(t3 - t2)
        rounds = warmup + repeats
        if device is not None and device.type != "cpu":
            probe = probe_round(tool, run_step, sync, device)
            rounds += 1
        t0 = time.perf_counter()
        closed, why = tool.close()
        close_s = time.perf_counter() - t0
        if not closed:
            raise RuntimeError(f"{task}/{level}: {why}")
        sizes, records = tool.files()
        sizes = pruned + sizes
        if len(sizes) != rounds:
            raise RuntimeError(f"{task}/{level}: expected {rounds} step dumps, "
                               f"found {len(sizes)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    p, d, w = statistics.median(plain), statistics.median(dumped), statistics.median(drain)
    per_round = sorted(b / a for a, b in zip(plain, dumped))
    q1, q3 = (statistics.quantiles(per_round, n=4, method="inclusive")[::2]
              if len(per_round) > 1 else (per_round[0], per_round[0]))
    return {
        "task": task, "level": level, "repeats": repeats, "warmup": warmup,
        "plain_ms": _ms(p), "dumped_ms": _ms(d), "ratio": round(d / p, 2),
        "round_ratio_q1": round(q1, 2), "round_ratio_q3": round(q3, 2),
        "drain_ms": _ms(w), "ratio_with_drain": round((d + w) / p, 2),
        "mb_per_step": round(statistics.median(sizes) / 1e6, 2), "records_per_step": records,
        "us_per_record": round((d - p) * 1e6 / records, 2) if records else None,
        "close_ms": _ms(close_s), "other_cpu": meter.foreign_share(), **probe,
        "plain_ms_all": [_ms(v) for v in plain], "dumped_ms_all": [_ms(v) for v in dumped],
        "drain_ms_all": [_ms(v) for v in drain],
    }


def probe_round(tool: Any, run_step: Any, sync: Callable[[], None], device: Any
                ) -> Dict[str, Any]:
    """One plain and one dumped step, untimed, counting host syncs (bench_tools.count_syncs:
    CUDA only) and the peak device memory of each; the dumped step's peak runs until its dump
    is drained, since statistics waiting for the writer occupy device memory too."""
    sync()
    reset_peak(device)
    with count_syncs(device) as plain_syncs:
        run_step()
    sync()
    peak_plain = peak_bytes(device)
    reset_peak(device)
    with count_syncs(device) as dumped_syncs:
        tool.begin()
        run_step()
        tool.end()
        if dumped_syncs is not None:
            dumped_syncs.phase = "drain"
        drained = tool.drain()
    sync()
    peak_dumped = peak_bytes(device)
    if not drained:
        raise RuntimeError("the writer did not finish the probe step")
    out: Dict[str, Any] = {"peak_plain_mb": None, "peak_dumped_mb": None, "peak_mem_pct": None}
    if peak_plain and peak_dumped is not None:
        out = {"peak_plain_mb": round(peak_plain / 1e6, 1),
               "peak_dumped_mb": round(peak_dumped / 1e6, 1),
               "peak_mem_pct": round(100.0 * (peak_dumped / peak_plain - 1.0), 1)}
    if plain_syncs is not None and dumped_syncs is not None:
        out.update({"syncs_plain": plain_syncs.step, "syncs_dumped": dumped_syncs.step,
                    "syncs_writer": dumped_syncs.writer,
                    "sync_sources": dumped_syncs.messages})
    return out


def measure_modes(modes: List[str], bench: Any, retries: int, max_other: float
                  ) -> List[Dict[str, Any]]:
    """Each task/level mode via `bench(task, level)`, measured again (up to `retries` times)
    while other processes used more than `max_other` of the CPU; the quietest run is kept."""
    rows = []
    for mode in modes:
        task, _, level = mode.partition("/")
        t0 = time.perf_counter()
        row: Optional[Dict[str, Any]] = None
        for attempt in range(1, retries + 2):
            got = bench(task, level or "mix")
            got["attempts"] = attempt
            if row is None or (got["other_cpu"] or 0.0) < (row["other_cpu"] or 0.0):
                row = dict(got)
            if (got["other_cpu"] or 0.0) <= max_other:
                break
            print(f"{task}/{got['level']}: other processes used {_share(got['other_cpu'])} of "
                  f"the CPU meanwhile; measuring again", flush=True)
        if row is None:   # retries >= 0, so the loop ran at least once
            raise RuntimeError(f"{mode}: nothing measured")
        rows.append(row)
        print(f"{task}/{row['level']}: plain {row['plain_ms']:.1f} ms, dumped "
              f"{row['dumped_ms']:.1f} ms ({row['ratio']:.2f}×), drain {row['drain_ms']:.1f} ms, "
              f"{row['mb_per_step']:.2f} MB/step, {row['records_per_step']} records "
              f"({_num(row.get('us_per_record'))} µs each), other processes' CPU "
              f"{_share(row['other_cpu'])}  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return rows


def _num(value: Optional[float], fmt: str = ".1f") -> str:
    return "n/a" if value is None else format(value, fmt)


def table(rows: List[Dict[str, Any]]) -> str:
    """Markdown table of the rows; a tool column when msprobe rows are present and the syncs /
    peak memory columns when the rows come from an accelerator."""
    tools = any(r.get("tool", "precdbg") != "precdbg" for r in rows)
    accel = any("peak_mem_pct" in r for r in rows)
    cols = (["tool"] if tools else []) + [
        "task / level", "plain ms", "dumped ms", "ratio", "per-round", "drain ms", "+drain",
        "MB/step", "records", "µs/record", "close ms", "other CPU"] + (
        ["syncs", "peak mem"] if accel else [])
    left = 2 if tools else 1   # text columns; the rest are numbers, right-aligned
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "|".join(["---"] * left + ["---:"] * (len(cols) - left)) + "|"]
    for r in rows:
        cells = ([r.get("tool", "precdbg")] if tools else []) + [
            f"{r['task']} / {r['level']}", f"{r['plain_ms']:.1f}", f"{r['dumped_ms']:.1f}",
            f"{r['ratio']:.2f}×", f"{r['round_ratio_q1']:.2f}–{r['round_ratio_q3']:.2f}",
            f"{r['drain_ms']:.1f}", f"{r['ratio_with_drain']:.2f}×", f"{r['mb_per_step']:.2f}",
            str(r["records_per_step"]), _num(r.get("us_per_record")), f"{r['close_ms']:.1f}",
            _share(r["other_cpu"])]
        if accel:
            syncs = ("n/a" if r.get("syncs_dumped") is None
                     else f"{r['syncs_dumped']} ({r['syncs_plain']})")
            pct = r.get("peak_mem_pct")
            cells += [syncs, "n/a" if pct is None else f"{pct:+.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _share(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{100 * value:.0f} %"


def results_markdown(info: Dict[str, Any], work: Workload, rows: List[Dict[str, Any]],
                     argv: List[str], notes: List[str]) -> str:
    """The results file: the machine, versions, workload and exact command line first, so a
    number is never read without what produced it."""
    cmd = shlex.join(["python", "benchmarks/overhead_torch.py"] + argv)
    accel = ""
    if info.get("accelerator"):
        accel = (f"- accelerator: {info['accelerator']}"
                 + (f", {info['accelerator_memory_gb']} GiB" if "accelerator_memory_gb" in info
                    else "")
                 + (f", CUDA {info['cuda']}, cuDNN {info['cudnn']}, compute capability "
                    f"{info['capability']}" if "cuda" in info else "")
                 + (f", torch_npu {info['torch_npu']}" if "torch_npu" in info else "") + "\n")
    probe_note = ("syncs = host↔device synchronisations on the training thread during one "
                  "dumped step, start(model) .. step() (in brackets: during a plain step); peak "
                  "mem = peak device memory allocated by a dumped step until its dump is "
                  "drained, over a plain step's. " if any("peak_mem_pct" in r for r in rows)
                  else "")
    return (
        "# precdbg overhead, PyTorch\n\n"
        f"Measured {info['date']} with `{cmd}`.\n\n"
        f"- machine: {info['nproc']} cores (nproc), {info['cpu']}, "
        f"{info['memory_gb']} GB RAM, {info['platform']}\n" + accel +
        f"- python {info['python']}, torch {info['torch']} ({info['torch_threads']} threads), "
        f"numpy {info['numpy']}, h5py {info['h5py']}, precdbg {info['precdbg']}"
        + (f", msprobe {info['msprobe']}" if info.get("msprobe") else "") + "\n"
        f"- workload: {work.describe()}\n"
        f"- {rows[0]['repeats']} repeats after {rows[0]['warmup']} warm-up rounds per mode, "
        "one process, plain and dumped steps alternating"
        + (", the device synchronised before every timer read" if work.device.type != "cpu"
           else "") + "\n" + "".join(f"- {n}\n" for n in notes) + "\n"
        + table(rows) +
        "\nratio = median dumped step ÷ median plain step (start(model) .. step(), what the "
        "training loop sees). per-round = quartiles (25 %–75 %) of each round's own dumped ÷ "
        "plain, to show the spread. drain = median wait in debugger.flush() after a dumped step for "
        "the background writer to finish it; +drain = (dumped + drain) ÷ plain, the cost when "
        "the writer cannot overlap training at all. MB/step = size of one step file. µs/record "
        "= (dumped − plain) ÷ records, the host cost of one captured record. close = "
        "debugger.close() at the end. other CPU = share of the machine's CPU time used by "
        "other processes during the mode (0 % = the machine was otherwise idle; more than a "
        "few % distorts the timings). " + probe_note +
        "Aims: statistics ≤ 1.3×, tensor ≤ 2.5×. See benchmarks/README.md.\n")


def msprobe_rows(args: argparse.Namespace, work: Workload) -> List[Dict[str, Any]]:
    """msprobe on the same workload, one child process per mode (`--tool msprobe`): its
    debugger is a singleton that wraps torch's APIs for the rest of the process, so it can
    neither switch modes nor share a process with the precdbg measurements."""
    rows: List[Dict[str, Any]] = []
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix="precdbg_bench_msprobe_") as tmp:
            out = os.path.join(tmp, "rows.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--tool", "msprobe",
                   "--device", args.device, "--model", args.model, "--batch", str(work.batch),
                   "--seq", str(work.seq), "--layers", str(work.layers),
                   "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--retries", str(args.retries), "--max-other", str(args.max_other),
                   "--results", "-", "--json", out, "--modes", mode] + (
                ["--bf16"] if args.bf16 else [])
            print(f"msprobe {mode}: child process", flush=True)
            rc = subprocess.run(cmd, check=False).returncode
            if rc != 0 or not os.path.exists(out):
                print(f"msprobe {mode}: the child process failed (exit {rc}); skipped",
                      flush=True)
                continue
            with open(out, "r", encoding="utf-8") as handle:
                rows.extend(json.load(handle)["rows"])
    return rows


def _default_results(device: str, model: str) -> str:
    """results_torch.md for the historical CPU/GPT run; one file per device and model otherwise,
    so an accelerator run never overwrites the CPU numbers."""
    if device == "cpu" and model == "gpt":
        return os.path.join(HERE, "results_torch.md")
    return os.path.join(HERE, f"results_{device}_{model}.md")


def add_timing_args(parser: argparse.ArgumentParser,
                    modes: Tuple[Tuple[str, str], ...]) -> None:
    """The flags of how each mode is measured (shared with overhead_ms.py)."""
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per mode (9)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds per mode (2)")
    parser.add_argument("--modes", nargs="*", default=[f"{t}/{lv}" for t, lv in modes],
                        help="task/level pairs (default: %(default)s)")
    parser.add_argument("--max-other", type=float, default=0.05,
                        help="measure a mode again when other processes used more than this "
                             "share of the CPU meanwhile (default 0.05)")
    parser.add_argument("--retries", type=int, default=2,
                        help="how often to measure a mode again (default 2); the least disturbed "
                             "measurement is kept")


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="precdbg dump overhead on a PyTorch training "
                                                 "step (see benchmarks/README.md)")
    parser.add_argument("--device", default="cpu", choices=DEVICES, help="cpu (default), cuda, npu")
    parser.add_argument("--model", default="gpt", choices=MODELS,
                        help="gpt (bundled, default), gpt2-small, gpt2-tiny, llama-1b (random init)")
    parser.add_argument("--bf16", action="store_true", help="run the step under bf16 autocast")
    parser.add_argument("--batch", type=int, help="batch size (default depends on model/device)")
    parser.add_argument("--seq", type=int, help="sequence length (default: model/device)")
    parser.add_argument("--layers", type=int, help="keep only N layers (shrinks big models)")
    add_timing_args(parser, MODES)
    parser.add_argument("--msprobe", action="store_true",
                        help="also measure msprobe (mindstudio-probe) when it is installed")
    parser.add_argument("--tool", default="precdbg", choices=("precdbg", "msprobe"),
                        help=argparse.SUPPRESS)   # the child process of --msprobe
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--results", metavar="FILE",
                        help="markdown results file (default benchmarks/results_torch.md for "
                             "cpu/gpt, else benchmarks/results_<device>_<model>.md); '-' to skip")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or args.retries < 0:
        parser.error("--repeats must be >= 1, --warmup and --retries >= 0")
    for mode in args.modes:
        task, _, level = mode.partition("/")
        if task not in ("statistics", "tensor") or level not in ("", "mix", "api", "module"):
            parser.error(f"--modes {mode}: expected statistics|tensor / mix|api|module")
    if args.results is None:
        args.results = _default_results(args.device, args.model)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        return run(args, argv)
    except BenchError as exc:
        print(f"overhead_torch.py: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, argv: List[str]) -> int:
    import bench_models
    import bench_tools

    device = bench_models.resolve_device(args.device)
    if args.tool == "msprobe" and not bench_tools.msprobe_available():
        raise BenchError("--tool msprobe: msprobe (mindstudio-probe) is not installed")
    info = machine_info()
    info.update(bench_models.device_info(device))
    work = bench_models.build(args.model, device, args.bf16, args.batch, args.seq, args.layers)
    notes: List[str] = []
    if args.msprobe or args.tool == "msprobe":
        if bench_tools.msprobe_available():
            import importlib.metadata
            try:
                info["msprobe"] = importlib.metadata.version("mindstudio-probe")
            except importlib.metadata.PackageNotFoundError:
                info["msprobe"] = "unknown"
        elif args.msprobe:
            line = "msprobe (mindstudio-probe) is not installed: measuring precdbg only"
            print(line, flush=True)
            notes.append(line)
    print(f"{info['nproc']} cores, {info['cpu']}"
          + (f", {info['accelerator']}" if info.get("accelerator") else "")
          + f"; torch {info['torch']} ({info['torch_threads']} threads)", flush=True)
    print(f"workload: {work.describe()}", flush=True)
    sync = (lambda: bench_models.synchronize(device)) if device.type != "cpu" else _nothing
    for _ in range(3):   # first iterations allocate; keep them out of every mode
        work.step()
    sync()

    if args.tool == "msprobe":
        factory = lambda task, level, path: bench_tools.MsprobeTool(  # noqa: E731
            task, level, path, work.model)
        prefix = "precdbg_bench_msprobe"
    else:
        from precdbg_pt import PrecisionDebugger
        factory = lambda task, level, path: PrecdbgTool(  # noqa: E731
            PrecisionDebugger, task, level, path, work.model)
        prefix = "precdbg_bench"
    rows = measure_modes(args.modes, lambda task, level: measure_mode(
        task, level, None, work.model, work.step, args.repeats, args.warmup, prefix,
        sync=sync, device=device, tool_factory=factory), args.retries, args.max_other)
    for row in rows:
        row["tool"] = args.tool
    if args.msprobe and args.tool == "precdbg" and info.get("msprobe"):
        rows += msprobe_rows(args, work)

    print()
    print(table(rows), end="")
    if args.results != "-":
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(results_markdown(info, work, rows, argv, notes))
        print(f"\nwrote {args.results}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"machine": info, "argv": argv, "workload": work.describe(),
                       "device": args.device, "model_name": args.model, "bf16": args.bf16,
                       "batch": work.batch, "seq": work.seq, "layers": work.layers,
                       "model": work.config, "rows": rows}, handle, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
