"""A `PrecisionDebugger(...)` that refuses its arguments (a config key, a dump_path, a framework
mode) says so in one line, `precdbg: <reason>`, without a traceback, when the user's script does
not catch it; the script still ends with a non-zero exit code.

Nothing happens at import. The constructor calls `say_in_one_line(exc)` only as it raises: that
installs, once per process, a `sys.excepthook` which prints the one line for exactly the
exceptions handed to it (while they are alive) and hands every other exception to the hook it
found, unchanged. A script that catches the error sees the exception as raised; a hook the user
sets later replaces this one, and nothing is restored over it."""
from __future__ import annotations

import sys
import weakref
from types import TracebackType
from typing import Any, Callable, Optional, Type

from ..errors import PrecdbgError

__all__ = ["say_in_one_line"]

_said: "weakref.WeakSet[BaseException]" = weakref.WeakSet()
_installed: Optional[Callable[..., Any]] = None


def _hook(previous: Callable[..., Any]) -> Callable[..., Any]:
    def excepthook(kind: Type[BaseException], exc: BaseException,
                   tb: Optional[TracebackType]) -> None:
        if exc in _said:
            sys.stderr.write(f"precdbg: {' '.join(str(exc).split())}\n")
            sys.stderr.flush()
            return
        previous(kind, exc, tb)
    return excepthook


def say_in_one_line(exc: PrecdbgError) -> None:
    """Have `exc`, if it reaches the top of the main thread uncaught, printed as one line."""
    global _installed
    _said.add(exc)
    if _installed is None or sys.excepthook is not _installed:
        _installed = _hook(sys.excepthook)
        sys.excepthook = _installed
