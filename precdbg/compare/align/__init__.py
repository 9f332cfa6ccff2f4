"""Align: which record of the baseline pairs with which record of the candidate.

`alignment`: records pair by module path, API (one framework) or canonical op (two frameworks)
and their occurrence within each call of their module; a mapping file pins what cannot be paired
automatically; `casts`: dtype conversions pair by what they convert; `grouping`: the keys as
integer codes and their occurrences paired by numpy sorts (no Python tuple per record).

Imports: precdbg.errors, precdbg.records, precdbg.config, precdbg.storage
"""
from __future__ import annotations

from .alignment import Alignment, align, load_mapping, rename_module

__all__ = ["Alignment", "align", "load_mapping", "rename_module"]
