"""The `precdbg` command. Imports no framework: reading a dump needs only numpy and h5py.

parser (the command line, each subcommand's help), commands (each subcommand's work), show
(`precdbg show`), words (the closest names, a damaged file in the user's words), safe_output
(what a command prints cannot drive the terminal)."""
from __future__ import annotations

import re
import sys
from typing import List, Optional

from ..errors import PrecdbgError
from .commands import (run_check, run_compare, run_inspect, run_scan, run_show,
                       run_weights)
from .parser import COMMANDS, UsageError, build_parser
from .safe_output import escaped_output
from .words import closest, user_words

__all__ = ["main"]

_RUN = {"inspect": run_inspect, "show": run_show, "compare": run_compare, "check": run_check,
        "scan": run_scan, "compare-weights": run_weights}


def _command_word(argv: List[str]) -> Optional[int]:
    """Where the subcommand is in argv: the first word not an option (None: there is none)."""
    for i, word in enumerate(argv):
        if not word.startswith("-"):
            return i
    return None


def _run(argv: List[str]) -> int:
    parser = build_parser(_RUN)
    at = _command_word(argv)
    if not argv or (at is not None and argv[at] == "help"):
        rest = argv[at + 1:] if at is not None else []
        if rest and rest[0] in COMMANDS:     # `precdbg help compare`: compare's help
            parser.parse_args([rest[0], "--help"])
        sys.stdout.write(parser.format_help())
        return 0
    if at is not None and argv[at] not in COMMANDS:
        near = closest(argv[at], COMMANDS)
        raise UsageError(f"unknown command {argv[at]!r}"
                         + (f"; did you mean {near[0]}?" if near else
                            f" (commands: {', '.join(COMMANDS)}; see precdbg --help)"))
    args = parser.parse_args(argv)
    return args.func(args)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command; returns its exit code: 0 match, 1 diverged, 2 bad input. What it prints
    cannot drive the terminal (control characters shown escaped: cli/safe_output.py)."""
    with escaped_output():
        return _main(argv)


def _main(argv: Optional[List[str]]) -> int:
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except PrecdbgError as exc:    # one line, without a library's terminal colour codes
        text = user_words(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)))
        sys.stderr.write(f"precdbg: {' '.join(text.split())}\n")
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:      # Ctrl-C: worker processes already stopped (compare --jobs)
        sys.stderr.write("precdbg: interrupted\n")
        return 130
    except OSError as exc:
        sys.stderr.write(f"precdbg: {exc.filename or ''}: {exc.strerror or exc}\n")
        return 2
