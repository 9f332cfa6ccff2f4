"""The command line: every subcommand with its description, an example and its exit codes, and
every option with its help."""
from __future__ import annotations

import argparse
import textwrap
from typing import Any, Callable, Dict

from ..errors import PrecdbgError

__all__ = ["UsageError", "build_parser", "COMMANDS"]

_EXITS = {"compare": "0 no divergence beyond tolerance, 1 diverged, 2 bad input (a missing or "
                     "damaged dump, a bad option), 3 incomplete: no divergence in what both "
                     "dumps hold, but steps or ranks one lacks, or steps not whole "
                     "(--allow-missing: 0)",
          "check": "0 no set-up finding, 1 findings, 2 bad input",
          "scan": "0 no anomaly, 1 anomalies found, 2 bad input",
          "compare-weights": "0 the checkpoints agree, 1 they differ, 2 bad input"}
_ZERO_OR_TWO = "0 shown, 2 bad input (a missing or damaged dump, a step or entry it lacks)"

# name -> (one-line help, description, example)
COMMANDS: Dict[str, tuple] = {
    "inspect": ("summarise a dump: steps, ranks, counts, extremes",
                "What a dump holds: the run it came from, its steps and ranks, per step the "
                "records by kind and direction, the first non-finite record and the "
                "floating-point tensors of largest magnitude.",
                "precdbg inspect dump_torch --step 1"),
    "show": ("one record in detail: statistics, producers, call site, settings, tensor",
             "One entry (a call, module or parameter gradient, e.g. "
             "Functional.gelu.0.forward) of a dump: each of its tensors' statistics and which "
             "record produced it, the line of code that called it, the layer settings of its "
             "module and, where the dump stored tensors (task 'tensor'), their first values. "
             "An entry name it does not hold is answered with the closest names.",
             "precdbg show dump_torch Functional.gelu.0.forward --step 1"),
    "compare": ("name the first divergence between two dumps",
                "Pair the records of two dumps (PyTorch or MindSpore, any mix), judge each pair "
                "against its tolerance and name the first API, module or parameter gradient "
                "that diverges, with its producer chain and evidence.",
                "precdbg compare dump_torch dump_ms --html report.html"),
    "check": ("set-up differences between two runs (manifests, parameter inventories, first "
              "batch), ranked by likely impact",
              "Compare what the two runs were set up with: framework and library versions, "
              "optimizer settings, layer settings, initial parameters, the first batch.",
              "precdbg check dump_torch dump_ms"),
    "scan": ("anomalies in one dump (first NaN/Inf, gradients)",
             "Look through one dump for the first NaN or Inf, exploding or vanishing "
             "gradients and other anomalies.",
             "precdbg scan dump_torch --json anomalies.json"),
    "compare-weights": ("compare two checkpoints (.ckpt, .pt, .pth, .safetensors, .npz) with "
                        "MindSpore/PyTorch names mapped",
                        "Compare two checkpoints parameter by parameter, MindSpore and PyTorch "
                        "names mapped (gamma <-> weight, ...).",
                        "precdbg compare-weights model.pt model.ckpt --rtol 1e-4"),
}
_OVERVIEW = """commands:
  inspect          what a dump holds
  show             one entry of a dump in detail
  compare          the first divergence between two dumps
  check            set-up differences between two runs
  scan             anomalies in one dump
  compare-weights  two checkpoints compared
  help [COMMAND]   this overview, or a command's help

example:
  precdbg compare dump_torch dump_ms --html report.html

exit codes: 0 match, nothing found or shown; 1 diverged or findings (compare, check, scan,
compare-weights); 2 bad input; 3 incomplete (compare: what both dumps hold matches, but they
do not cover both runs) (see each command's --help)"""


class UsageError(PrecdbgError):
    """A command line argparse refuses: one line, as every other error of the command."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


# what a DUMP argument may be
_DUMP = "dump root, step folder or step file, or an msprobe dump folder"


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count (a whole number >= 0), got "
                                         f"{text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {value}")
    return value


def _step_rank(parser: argparse.ArgumentParser, step_help: str,
               rank_help: str = "only this rank (default: every rank)") -> None:
    parser.add_argument("--step", type=int, default=None, metavar="S", help=step_help)
    parser.add_argument("--rank", type=int, default=None, metavar="R", help=rank_help)


def _sub(sub: Any, name: str, func: Callable[[argparse.Namespace], int]
         ) -> argparse.ArgumentParser:
    short, description, example = COMMANDS[name]
    parser = sub.add_parser(name, help=short, description=textwrap.fill(description, 78),
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=f"example:\n  {example}\n\nexit codes: "
                                   + textwrap.fill(_EXITS.get(name, _ZERO_OR_TWO), 66,
                                                   subsequent_indent="  "))
    parser.set_defaults(func=func)
    return parser


def _jobs(text: str) -> int:
    """--jobs N: a whole number of worker processes, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of worker processes, 1 or more")
    return value


def build_parser(commands: Dict[str, Callable[[argparse.Namespace], int]]
                 ) -> argparse.ArgumentParser:
    """The parser; `commands`: the function each subcommand runs."""
    from ..version import __version__
    parser = _Parser(prog="precdbg", description="precision debugger for training: where two "
                     "runs (PyTorch, MindSpore) stop agreeing",
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_OVERVIEW)
    parser.add_argument("--version", action="version", version=f"precdbg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = _sub(sub, "inspect", commands["inspect"])
    inspect.add_argument("dump", help=_DUMP)
    _step_rank(inspect, "only this step (default: every step)")
    inspect.add_argument("--top", type=_count, default=5, metavar="N",
                         help="how many largest values to list (default 5)")
    show = _sub(sub, "show", commands["show"])
    show.add_argument("dump", help=_DUMP)
    show.add_argument("entry", help="entry name, e.g. Functional.linear.0.forward or "
                      "Module.fc1.Linear.backward.0 (as compare and inspect name them)")
    _step_rank(show, "the step to read it from (default: the first step holding it)",
               "the rank to read it from (default: the first rank holding it)")
    compare = _sub(sub, "compare", commands["compare"])
    compare.add_argument("baseline", help="baseline: " + _DUMP)
    compare.add_argument("candidate", help="candidate: " + _DUMP)
    compare.add_argument("--json", metavar="F", help="write the full result as JSON")
    compare.add_argument("--csv", metavar="F", help="write every compared pair as CSV")
    compare.add_argument("--html", metavar="F", help="write a self-contained HTML report")
    _step_rank(compare, "only this step (default: every step both dumps hold)")
    compare.add_argument("--allow-missing", action="store_true",
                         help="a compare that finds no divergence but does not cover both runs "
                              "(steps or ranks one dump lacks, steps not whole) is a match "
                              "(exit 0) instead of incomplete (exit 3)")
    compare.add_argument("--map", metavar="YAML", default=None,
                         help="mapping file: modules/ops of the candidate -> the baseline's")
    compare.add_argument("--jobs", metavar="N", type=_jobs, default=None,
                         help="compare ranks in N worker processes (default: the cores "
                              "available; 1: in this process)")
    compare.add_argument("--engine", metavar=("ENGINE", "ADDRESS"), nargs="+", default=None,
                         help="compare ranks on a distributed engine's workers, which read the "
                              "dumps at the same paths: dask ADDRESS (the scheduler's, or "
                              "DASK_SCHEDULER_ADDRESS) or ray ADDRESS (HOST:6379, auto, or "
                              "RAY_ADDRESS)")
    check = _sub(sub, "check", commands["check"])
    check.add_argument("a", help="first: " + _DUMP)
    check.add_argument("b", help="second: " + _DUMP)
    check.add_argument("--json", metavar="F", help="write the findings as JSON")
    _step_rank(check, "step to check (default: the first step in both dumps)")
    scan = _sub(sub, "scan", commands["scan"])
    scan.add_argument("dump", help=_DUMP)
    scan.add_argument("--json", metavar="F", help="write the anomalies found as JSON")
    _step_rank(scan, "only this step (default: every step)")
    weights = _sub(sub, "compare-weights", commands["compare-weights"])
    weights.add_argument("a", help="first checkpoint file")
    weights.add_argument("b", help="second checkpoint file")
    weights.add_argument("--json", metavar="F", help="write every parameter's comparison as "
                         "JSON")
    weights.add_argument("--rtol", type=float, default=1e-5, metavar="X",
                         help="relative tolerance (default 1e-5)")
    weights.add_argument("--atol", type=float, default=0.0, metavar="X",
                         help="absolute tolerance (default 0)")
    return parser
