"""How large and how quick the HTML report of a big compare is: about 10,000 records per step and
rank, 8 ranks.

    python benchmarks/html_report_size.py [--layers 20] [--ranks 8] [--out DIR] [--keep]

Dumps one step of the bundled GPT (`precdbg_examples.gpt_torch`, `--layers` layers, d_model 32,
seq 8, level mix, statistics) twice: a baseline, and a candidate whose blocks.1.mlp.act is
GELU(approximate="tanh"). Each dump's rank-0 file is copied to ranks 1..N-1 (rank attribute
rewritten), so the compare reads N real step files per side. Then it runs `precdbg compare
--json --html` in a subprocess and prints the record count, the compare's wall time, and the
sizes of both reports; with `chromium` on PATH it also loads the page headless and prints how long
that took and whether the page opened its tree at the culprit (`<body data-culprit="visible">`).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional


def _dump(path: str, layers: int, defect: bool) -> None:
    import torch
    from torch import nn

    from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=layers, d_model=32, n_head=2, seq_len=8, vocab_size=64)
    model = GPT(cfg)
    if defect:
        model.blocks[1].mlp.act = nn.GELU(approximate="tanh")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = next(iter(make_batches(cfg, batch_size=2, steps=1)))
    dbg = PrecisionDebugger(dump_path=path, level="mix", task="statistics")
    dbg.start(model)
    train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    if not dbg.close():
        raise RuntimeError(f"{path}: the dump writer did not finish")


def _more_ranks(root: str, ranks: int) -> None:
    import h5py
    from precdbg.storage.step_checks import reseal
    for path in glob.glob(os.path.join(root, "step*", "rank0.h5")):
        for rank in range(1, ranks):
            copy = os.path.join(os.path.dirname(path), f"rank{rank}.h5")
            shutil.copyfile(path, copy)
            with h5py.File(copy, "r+") as handle:
                handle.attrs["rank"] = rank
            reseal(copy)                 # the rank rewritten on purpose: sealed again


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--out", default=None, help="folder for dumps and reports (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    out = args.out or tempfile.mkdtemp(prefix="precdbg_html_")
    os.makedirs(out, exist_ok=True)
    try:
        base, cand = os.path.join(out, "base"), os.path.join(out, "cand")
        for path, defect in ((base, False), (cand, True)):
            shutil.rmtree(path, ignore_errors=True)
            _dump(path, args.layers, defect)
            _more_ranks(path, args.ranks)
        report_json = os.path.join(out, "report.json")
        report_html = os.path.join(out, "report.html")
        began = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", base, cand, "--json",
                               report_json, "--html", report_html], capture_output=True, text=True)
        took = time.perf_counter() - began
        if proc.returncode not in (0, 1):
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return 2
        counted = re.search(r"(\d+) record pairs compared", proc.stdout)
        print(f"{counted.group(1) if counted else '?'} record pairs in {args.ranks} ranks "
              f"({args.layers}-layer GPT, one step): compare --json --html {took:.1f} s")
        print(f"  report.html {os.path.getsize(report_html) / 1e6:.2f} MB, report.json "
              f"{os.path.getsize(report_json) / 1e6:.2f} MB")
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium:
            began = time.perf_counter()
            page = subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 f"--user-data-dir={os.path.join(out, 'profile')}", "--window-size=1400,1100",
                 "--dump-dom", "file://" + os.path.abspath(report_html)],
                capture_output=True, text=True, timeout=300)
            state = re.search(r'data-culprit="(\w+)"', page.stdout)
            drawn = re.search(r'data-render-ms="(\d+)"', page.stdout)
            print(f"  headless chromium: {time.perf_counter() - began:.1f} s with the browser's "
                  f"start; the page's script took {drawn.group(1) if drawn else '?'} ms; culprit "
                  f"{state.group(1) if state else 'not reported'}")
        print(f"  files in {out}" if args.keep or args.out else "")
    finally:
        if not (args.keep or args.out):
            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
