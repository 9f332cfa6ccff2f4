"""The PrecdbgError family: every error precdbg raises on purpose is one of these."""
from __future__ import annotations

__all__ = ["PrecdbgError", "ConfigError", "DumpError", "FrameworkError", "one_line"]


class PrecdbgError(Exception):
    """Base of all precdbg errors; str() is a one-line reason fit for a terminal."""


class ConfigError(PrecdbgError, ValueError):
    """A configuration file or keyword argument is invalid (the message names the key)."""


class DumpError(PrecdbgError):
    """A dump on disk is missing, unreadable or of an unknown schema (the message names the file)."""


class FrameworkError(PrecdbgError):
    """The framework cannot be hooked as asked (e.g. MindSpore GRAPH_MODE)."""


def one_line(exc: BaseException, limit: int = 240) -> str:
    """An exception's message on one line, shortened (how precdbg says a failure)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
