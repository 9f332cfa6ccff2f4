"""The subcommands' work: each takes the parsed arguments and returns the exit code."""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ConfigError, DumpError, PrecdbgError
from ..storage.layout import dump_root, run_json_path, step_of_folder, would_overwrite_dump
from .show import asked_step_rank, show_main
from .words import existing_dump, same_dump, user_words

__all__ = ["run_inspect", "run_compare", "run_check", "run_scan", "run_weights", "run_show"]


def _check_outputs(inputs: Sequence[str], outputs: Sequence[Optional[str]]) -> None:
    """Before any work: every output file can be written, and none would overwrite what is
    being read (a dump's run.json, its step folders, an input file itself)."""
    guarded = set()
    for given in inputs:
        root = dump_root(given)
        guarded.add(os.path.abspath(given))
        guarded.add(run_json_path(root))
    roots = {dump_root(given) for given in inputs}
    chosen: Dict[str, str] = {}
    for out in outputs:
        if out is None:
            continue
        if not out.strip():
            raise DumpError("an output file name given is empty (\"\"); give a path")
        target = os.path.abspath(out)
        inside_step = step_of_folder(os.path.basename(os.path.dirname(target))) is not None and \
            os.path.dirname(os.path.dirname(target)) in roots
        if target in guarded or inside_step:
            raise DumpError(f"{out}: is part of a dump being read; write the output elsewhere")
        if would_overwrite_dump(target):
            raise DumpError(f"{out}: is part of a dump (its run.json or step files); write the "
                            "output elsewhere")
        if target in chosen:
            raise DumpError(f"{out}: given for two outputs ({chosen[target]} and this one); "
                            "give each its own file")
        chosen[target] = out
        if os.path.isdir(target):
            raise DumpError(f"{out}: is a directory; give a file name")
        folder = os.path.dirname(target)
        if not os.path.isdir(folder):
            raise DumpError(f"{out}: no such directory {folder}")
        if not os.access(folder, os.W_OK) or (os.path.exists(target)
                                              and not os.access(target, os.W_OK)):
            raise DumpError(f"{out}: permission denied")


def _dumps(*paths: str) -> None:
    """Every dump path given exists (else the closest sibling is named)."""
    for path in paths:
        existing_dump(path)


def run_inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from ..storage.reader import open_dump
    _dumps(args.dump)
    dump = open_dump(args.dump)
    try:
        asked_step_rank(dump, args.dump, args.step, args.rank)
    except DumpError:
        dump.close()
        raise
    out = sys.stdout
    run = dump.run
    if run:
        cfg = run.get("config", {})
        out.write(f"dump      {args.dump}\n")
        out.write(f"framework {run.get('framework', '?')} {run.get('framework_version', '')}  "
                  f"device {run.get('device', '?')}  world size {run.get('world_size', '?')}\n")
        out.write(f"task      {cfg.get('task', '?')}  level {cfg.get('level', '?')}  "
                  f"schema {run.get('schema_version', '?')}\n")
        chosen = [f"{key} {cfg[key]}" for key in ("step", "rank", "scope", "scope_range", "list",
                                                  "data_mode", "summary_mode")
                  if cfg.get(key) and cfg[key] not in (["all"], "statistics")]
        if chosen:          # what the config selected: a thin dump may be what was asked
            out.write(f"selected  {'  '.join(chosen)}\n")
    if dump.source != "precdbg":           # msprobe's folders: what its files say of the run
        out.write(f"dump      {args.dump} (written by {dump.source})\n")
        out.write(f"framework {dump.setting('framework') or '?'}  task "
                  f"{dump.setting('task') or '?'}  level {dump.setting('level') or '?'}\n")
    out.write(f"steps     {dump.steps}\nranks     {dump.ranks}\n")
    if dump.partial:
        out.write(f"incomplete (skipped): {', '.join(dump.partial)}\n")
    shown = {(s, r) for s in dump.steps for r in dump.ranks
             if (args.step is None or s == args.step) and (args.rank is None or r == args.rank)}
    for warning in dump.warnings(shown):      # only the files shown are read
        out.write(f"warning   {warning}\n")
    for note in dump.notes(shown):
        out.write(f"note      {note}\n")
    unreadable: List[str] = []          # damaged files: said, the other steps still shown
    for step in dump.steps:
        if args.step is not None and step != args.step:
            continue
        for rank in dump.ranks:
            if (args.rank is not None and rank != args.rank) or not dump.files(step, rank):
                continue
            try:
                table = dump.records(step, rank)
            except PrecdbgError as exc:
                out.write(f"\nstep {step} rank {rank}: unreadable: {user_words(str(exc))}\n")
                unreadable.append(str(exc))
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
            # floating-point tensors with values (not token ids, masks or indices): an empty
            # one has none, nor has memory nobody had written (torch.empty): min and max NaN
            # with no NaN counted
            no_values = np.isnan(table["max"]) & (table["nan_count"] == 0)
            floating = np.char.startswith(table["dtype"], "float") | \
                np.char.startswith(table["dtype"], "bfloat")
            tensors = np.nonzero(floating & (table["numel"] > 0) & ~no_values)[0]
            if len(tensors):
                peak = np.fmax(np.abs(table["max"][tensors]), np.abs(table["min"][tensors]))
                top = tensors[np.argsort(-np.nan_to_num(peak, nan=np.inf))[:args.top]]
                out.write("  largest |values|:\n")
                for i in top:
                    out.write(f"    {max(abs(table['max'][i]), abs(table['min'][i])):>12.5g}  "
                              f"{table['entry'][i]} {table['role'][i]} {table['arg_index'][i]}"
                              f"  {table['dtype'][i]}\n")
    dump.close()
    if unreadable:
        raise DumpError(unreadable[0] if len(unreadable) == 1 else
                        f"{len(unreadable)} step files unreadable; the first: {unreadable[0]}")
    return 0


def _compare_jobs(args: argparse.Namespace) -> int:
    """--jobs N, or the cores available."""
    from ..compare.parallel import available_cores
    jobs = getattr(args, "jobs", None)
    return jobs if jobs else available_cores()


def _compare_engine(args: argparse.Namespace) -> Optional[Tuple[str, Optional[str]]]:
    """--engine ENGINE [ADDRESS]: checked before anything is read."""
    words = getattr(args, "engine", None)
    if not words:
        return None
    if len(words) > 2:
        raise ConfigError(f"--engine {' '.join(words)}: give ENGINE and at most one ADDRESS")
    from ..compare.engine import engine_address
    engine_address(words[0], words[1] if len(words) > 1 else None)
    return words[0], (words[1] if len(words) > 1 else None)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """A compare makes many short-lived objects and few reference cycles: the objects made
    before it (modules, constants) are left out of the collector's passes (`gc.freeze`), and
    the youngest generation is collected every 20,000 allocations instead of 700 (the
    collector took about 5 % of a compare of 64 GPT-2 ranks, 0.16 s; 0.01 s so). As before
    once the compare is done (worker processes inherit it)."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def run_compare(args: argparse.Namespace) -> int:
    with _few_collections():
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from ..compare import compare_dumps
    from ..compare.report.progress import TerminalProgress
    from ..compare.report.formats import summary_text, write_csv, write_html, write_json
    _dumps(args.baseline, args.candidate)
    _check_outputs((args.baseline, args.candidate), (args.json, args.csv, args.html))
    # draws only on a terminal, after a while; on the stream underneath the escaping one
    progress = TerminalProgress(getattr(sys.stderr, "raw", sys.stderr))
    try:
        result = compare_dumps(args.baseline, args.candidate, step=args.step, rank=args.rank,
                               mapping_file=args.map, progress=progress,
                               allow_missing=args.allow_missing, jobs=_compare_jobs(args),
                               engine=_compare_engine(args),
                               # rows on disk (memory bounded per rank), and only when a
                               # file will hold them
                               spool_rows=True,
                               keep_rows=bool(args.json or args.csv or args.html))
    finally:
        progress.close()
    sys.stdout.write(user_words(summary_text(result)))     # a damaged file in the user's words
    one = same_dump((args.baseline, args.candidate))
    if one is not None:         # said, the verdict kept: a dump matches itself by construction
        sys.stdout.write(f"note: baseline and candidate are one dump ({one}): they match by "
                         "construction; give two runs' dumps to compare them\n")
    for path, write, what in ((args.json, write_json, "JSON"), (args.csv, write_csv, "CSV"),
                              (args.html, write_html, "HTML report")):
        if path:
            try:
                write(result, path)
            except OSError as exc:
                raise DumpError(f"{path}: cannot write the {what} "
                                f"({exc.strerror or exc})") from None
    if args.html:
        sys.stdout.write(f"html report: {args.html}\n")
    return 1 if result["first_divergence"] else (3 if result["verdict"] == "incomplete" else 0)


def run_check(args: argparse.Namespace) -> int:
    from ..check import check_main
    _dumps(args.a, args.b)
    _check_outputs((args.a, args.b), (args.json,))
    return check_main(args)


def run_scan(args: argparse.Namespace) -> int:
    from ..scan.scanner import scan_main
    _dumps(args.dump)
    _check_outputs((args.dump,), (args.json,))
    return scan_main(args)


def run_weights(args: argparse.Namespace) -> int:
    from ..weights.compare_weights import weights_main
    _check_outputs((args.a, args.b), (args.json,))
    return weights_main(args)


def run_show(args: argparse.Namespace) -> int:
    _dumps(args.dump)
    return show_main(args)
