"""The `precdbg` command. Imports no framework: reading a dump needs only numpy and h5py."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .errors import PrecdbgError

__all__ = ["main"]


def _inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from .reader import open_dump
    dump = open_dump(args.dump)
    out = sys.stdout
    run = dump.run
    if run:
        cfg = run.get("config", {})
        out.write(f"dump      {args.dump}\n")
        out.write(f"framework {run.get('framework', '?')} {run.get('framework_version', '')}  "
                  f"device {run.get('device', '?')}  world size {run.get('world_size', '?')}\n")
        out.write(f"task      {cfg.get('task', '?')}  level {cfg.get('level', '?')}  "
                  f"schema {run.get('schema_version', '?')}\n")
    out.write(f"steps     {dump.steps}\nranks     {dump.ranks}\n")
    if dump.partial:
        out.write(f"incomplete (skipped): {', '.join(dump.partial)}\n")
    for step in dump.steps:
        if args.step is not None and step != args.step:
            continue
        for rank in dump.ranks:
            if args.rank is not None and rank != args.rank:
                continue
            try:
                table = dump.records(step, rank)
            except PrecdbgError:
                continue
            n = len(table)
            entries = len(set(table["entry"].tolist()))
            stored = int((table["data_offset"] >= 0).sum())
            out.write(f"\nstep {step} rank {rank}: {n} records in {entries} entries, "
                      f"{stored} tensors stored\n")
            pairs, counts = np.unique(np.char.add(np.char.add(table["kind"], " "),
                                                  table["direction"]), return_counts=True)
            for pair, count in zip(pairs, counts):
                out.write(f"  {pair:<24} {count:>8}\n")
            nonfinite = np.nonzero((table["nan_count"] != 0) | (table["inf_count"] != 0))[0]
            if len(nonfinite):
                first = nonfinite[np.argmin(table["seq"][nonfinite])]
                out.write(f"  non-finite: {len(nonfinite)} records; first "
                          f"{table['entry'][first]} {table['role'][first]}"
                          f" {table['arg_index'][first]}\n")
            tensors = np.nonzero(~np.char.startswith(table["dtype"], "py."))[0]
            if len(tensors):
                peak = np.fmax(np.abs(table["max"][tensors]), np.abs(table["min"][tensors]))
                top = tensors[np.argsort(-np.nan_to_num(peak, nan=np.inf))[:args.top]]
                out.write(f"  largest |values|:\n")
                for i in top:
                    out.write(f"    {max(abs(table['max'][i]), abs(table['min'][i])):>12.5g}  "
                              f"{table['entry'][i]} {table['role'][i]} {table['arg_index'][i]}"
                              f"  {table['dtype'][i]}\n")
    dump.close()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="precdbg", description="precision debugger for training")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="summarise a dump: steps, ranks, counts, extremes")
    inspect.add_argument("dump", help="dump root, step folder or step file")
    inspect.add_argument("--step", type=int, default=None)
    inspect.add_argument("--rank", type=int, default=None)
    inspect.add_argument("--top", type=int, default=5, help="how many largest values to list")
    inspect.set_defaults(func=_inspect)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except PrecdbgError as exc:
        sys.stderr.write(f"precdbg: {exc}\n")
        return 2
    except BrokenPipeError:
        return 0
