"""Compare two dumps: align their records, judge each pair, localize the first divergence, report.

The stages are sub-packages, each importing only those before it: `align` (which records
pair), `judge` (whether a pair differs, and how much that means), `localize` (the first
divergence and its producer chain) and `report` (text, JSON, CSV, HTML). `pipeline` runs them
for every step and rank both dumps hold, after `precdbg check` has listed the set-up
differences: `compare_dumps(baseline, candidate)` returns the JSON-ready result of the compare
contract (docs/dump-format.md).

Imports: precdbg.errors, precdbg.records, precdbg.config, precdbg.storage, precdbg.check, precdbg.compare.align, precdbg.compare.judge, precdbg.compare.localize, precdbg.compare.report
"""
from __future__ import annotations

from .align import load_mapping
from .pipeline import compare_dumps
from .report.progress import CompareProgress

__all__ = ["compare_dumps", "load_mapping", "CompareProgress"]
