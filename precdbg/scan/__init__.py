"""`precdbg scan DUMP`: anomalies of one dump, no second run needed.

`scanner`: the first record that produced a NaN or Inf (and what led to it), exploding or
vanishing gradients, parameters whose gradient is zero; `anomalies`: the thresholds and
saturation tests it uses.

Imports: precdbg.errors, precdbg.records, precdbg.storage
"""
from __future__ import annotations

from .scanner import format_scan, scan_dump, scan_main

__all__ = ["scan_dump", "format_scan", "scan_main"]
