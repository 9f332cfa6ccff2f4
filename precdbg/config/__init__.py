"""Configuration: what a debugger dumps, validated once.

`dump_config`: the pydantic model (`DumpConfig`, `extra="forbid"`) and `load_config`, which reads
a file and applies keyword overrides; `files`: JSON or YAML text into a mapping, with one-line
errors naming the file; `msprobe`: an msprobe config.json translated into precdbg's settings.

Imports: precdbg.errors, precdbg.records
"""
from __future__ import annotations

from .dump_config import DumpConfig, load_config

__all__ = ["DumpConfig", "load_config"]
