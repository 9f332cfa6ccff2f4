"""How `precdbg compare` scales with the number of ranks: record pairs per second, wall time and
peak memory (issue 50).

    python benchmarks/compare_scale.py [--ranks 8 64 1024] [--layers 12] [--jobs N]
                                       [--no-json] [--out DIR] [--keep] [--profile FILE]

Dumps one step (iteration 1 of 3, the guides' pattern) of a transformers GPT-2 with random init
(`--layers` layers, d_model 64, 4 heads, level mix, task statistics), once. Its rank-0 file is
then copied to ranks 0..N-1 of a synthetic N-rank dump (the `rank` attribute of each copy
rewritten, `step<S>/rank<R>.h5`, run.json's world_size set to N); the candidate is a second copy
of the same N-rank dump, so the compare reads 2 N real step files and every pair matches.
`precdbg compare BASE CAND --json F` then runs in a subprocess per N, and the benchmark prints
the record pairs compared, the wall time, pairs per second and the peak resident memory of the
compare process (`resource.getrusage(RUSAGE_CHILDREN)` of a fresh child per run). `--jobs N`
is passed on to the compare when the command has it; `--no-json` runs it without `--json` (the
verdict and its summary: no row is written, so none is made); `--profile FILE` runs the
smallest N under cProfile and writes its stats to FILE.

Results: benchmarks/results_compare_scale.md.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

_DUMP_SCRIPT = r'''
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging
from precdbg_pt import PrecisionDebugger
hf_logging.set_verbosity_error()
path, layers = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
cfg = GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                 bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0, activation_function="gelu")
model = GPT2LMHeadModel(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)
debugger = PrecisionDebugger(dump_path=path, level="mix", task="statistics")
for step in range(3):
    ids = torch.randint(1, 128, (2, 16), generator=data)
    if step == 1:
        debugger.start(model)
    loss = model(ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step == 1:
        debugger.stop()
        debugger.step()
if not debugger.close():
    raise SystemExit("the dump writer did not finish")
'''

_MEASURE = r'''
import resource, subprocess, sys, time, json
began = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - began
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss   # KiB on Linux: the largest child
print(json.dumps({"rc": proc.returncode, "wall": wall, "peak_kib": peak,
                  "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-4000:]}))
'''


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PRECDBG_PROGRESS_AFTER", None)
    return env


def make_dump(path: str, layers: int) -> str:
    """One real dump of `layers`-layer GPT-2 (iteration 1 of 3); returns its rank-0 step file."""
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-c", _DUMP_SCRIPT, path, str(layers)], check=True,
                   env=_env())
    files = sorted(glob.glob(os.path.join(path, "step*", "rank0.h5")))
    if not files:
        raise SystemExit(f"{path}: no step file was written")
    return files[0]


def synthetic_ranks(source: str, root: str, ranks: int) -> None:
    """An N-rank dump at `root` made of copies of the step file `source` (rank attribute and
    file name rewritten; run.json's world_size and rank set for N ranks)."""
    import h5py
    from precdbg.storage.step_checks import reseal
    shutil.rmtree(root, ignore_errors=True)
    step_dir = os.path.join(root, os.path.basename(os.path.dirname(source)))
    os.makedirs(step_dir)
    with open(os.path.join(os.path.dirname(os.path.dirname(source)), "run.json")) as handle:
        run = json.load(handle)
    run["world_size"] = ranks
    with open(os.path.join(root, "run.json"), "w") as handle:
        json.dump(run, handle, indent=1)
    for rank in range(ranks):
        copy = os.path.join(step_dir, f"rank{rank}.h5")
        shutil.copyfile(source, copy)
        if rank:
            with h5py.File(copy, "r+") as handle:
                handle.attrs["rank"] = rank
            reseal(copy)               # the rank rewritten on purpose: sealed again


def measure(base: str, cand: str, report: Optional[str], extra: List[str]) -> Dict[str, object]:
    """`precdbg compare` in a fresh child process (`report`: its --json file, None: none):
    wall, peak RSS, record pairs."""
    cmd = [sys.executable, "-m", "precdbg", "compare", base, cand] + \
        (["--json", report] if report else []) + extra
    out = subprocess.run([sys.executable, "-c", _MEASURE] + cmd, capture_output=True, text=True,
                         env=_env(), check=True)
    result = json.loads(out.stdout)
    if result["rc"] not in (0, 1):
        raise SystemExit(f"compare failed (exit {result['rc']}):\n{result['stderr']}")
    # read from the summary: the JSON file of 1,024 ranks is gigabytes
    counted = re.search(r"(\d[\d,]*) record pairs compared", result["stdout"])
    verdict = re.search(r"^verdict: (\w+)", result["stdout"], re.M)
    return {"verdict": verdict.group(1).lower() if verdict else "?",
            "pairs": int(counted.group(1).replace(",", "")) if counted else 0,
            "wall": result["wall"], "peak_gb": result["peak_kib"] * 1024 / 1e9,
            "json_gb": os.path.getsize(report) / 1e9 if report and os.path.exists(report)
            else 0.0}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=None, help="passed as --jobs N")
    parser.add_argument("--no-json", action="store_true",
                        help="compare without --json: the verdict only")
    parser.add_argument("--out", default=None, help="folder for the dumps (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--profile", default=None, help="cProfile the smallest N into FILE")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="precdbg_scale_")
    os.makedirs(out, exist_ok=True)
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    try:
        source = os.path.join(out, "source")
        step_file = sorted(glob.glob(os.path.join(source, "step*", "rank0.h5")))
        step_file = step_file[0] if step_file else make_dump(source, args.layers)
        print(f"GPT-2 {args.layers} layers d64, level mix, statistics: {step_file}")
        print("| ranks | record pairs | verdict | wall (s) | pairs/s | peak RSS (GB) | JSON (GB) |")
        print("| ---: | ---: | --- | ---: | ---: | ---: | ---: |")
        for ranks in sorted(args.ranks):
            base, cand = os.path.join(out, f"base{ranks}"), os.path.join(out, f"cand{ranks}")
            synthetic_ranks(step_file, base, ranks)
            synthetic_ranks(step_file, cand, ranks)
            report = None if args.no_json else os.path.join(out, f"report{ranks}.json")
            if args.profile and ranks == min(args.ranks):
                subprocess.run([sys.executable, "-m", "cProfile", "-o", args.profile, "-m",
                                "precdbg", "compare", base, cand]
                               + (["--json", report] if report else []) + extra,
                               env=_env(), capture_output=True)
            r = measure(base, cand, report, extra)
            print(f"| {ranks} | {r['pairs']:,} | {r['verdict']} | {r['wall']:.1f} | "
                  f"{r['pairs'] / r['wall']:,.0f} | {r['peak_gb']:.3f} | {r['json_gb']:.2f} |",
                  flush=True)
            for path in (base, cand, report):
                if path is None:
                    continue
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.exists(path):
                    os.remove(path)
        if args.keep or args.out:
            print(f"files in {out}")
    finally:
        if not (args.keep or args.out):
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
