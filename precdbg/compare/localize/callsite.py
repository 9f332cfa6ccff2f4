"""Where a verdict's call ran: the line of the user's code that made it, and, for a call outside
every module, where in the step it ran (before the model's forward, after the backward).

A clipping, loss-scaling or gradient-reduction call that differs is a forward API call of the
root module like the model's own first op; what tells them apart is when it ran and which line
made it. Both come from the records: their call stack (`stack_id` into the step file's stack
texts, innermost user frame first) and their place in the step's timeline (`seq`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ...errors import DumpError
from ...storage.reader import Dump, RecordTable
from ...records.schema import Direction, RecordKind
from .verdict import Verdict

__all__ = ["place_first"]

_API, _MODULE = RecordKind.API, RecordKind.MODULE
_BACKWARD, _FORWARD = Direction.BACKWARD, Direction.FORWARD

# where in the step a root call ran (`Verdict.facts["when"]`; report/wording.py says it)
AFTER_BACKWARD, BEFORE_FORWARD = "after_backward", "before_forward"


def place_first(first: Optional[Verdict], a: Dump, b: Dump) -> None:
    """Add `call_site` ({"baseline": "file:line in function", "candidate": ...}, the runs that
    recorded one) to a verdict about an API or module call, and `facts["when"]`
    (AFTER_BACKWARD, BEFORE_FORWARD; report/wording.py writes `when` from it) for a forward
    call outside every module. Never raises for a dump it cannot read again."""
    if first is None or first.kind not in (_API, _MODULE):
        return
    sites: Dict[str, str] = {}
    for label, dump, name in (("baseline", a, first.name_a), ("candidate", b, first.name_b)):
        if not name:
            continue
        try:
            table = dump.records(first.step, first.rank)
            row = _row_of(table, name, first.direction)
            if row is None:
                continue
            site = _site(dump, table, row, first.step, first.rank)
        except (DumpError, OSError, KeyError, ValueError):
            continue
        if site:
            sites[label] = site
        if "when" not in first.facts:
            when = _when(table, row)
            if when:
                first.facts["when"] = when
    if sites:
        first.call_site = sites


def _row_of(table: RecordTable, name: str, direction: str) -> Optional[int]:
    rows = np.nonzero((table["entry"] == name) & (table["direction"] == direction))[0]
    return int(rows[0]) if len(rows) else None


def _site(dump: Dump, table: RecordTable, row: int, step: int, rank: int) -> str:
    stack = int(table["stack_id"][row])
    texts = dump.stacks(step, rank, int(table["part"][row]))
    if not 0 <= stack < len(texts) or not texts[stack]:
        return ""
    return texts[stack].split("\n", 1)[0]


def _when(table: RecordTable, row: int) -> str:
    """For a forward API call of the root module (outside every module): before the model's
    first forward call, or after the step's last backward record."""
    if table["kind"][row] != _API or table["module"][row] != "" or \
            table["direction"][row] != _FORWARD:
        return ""
    seq = int(table["seq"][row])
    backward = table["seq"][table["direction"] == _BACKWARD]
    if len(backward) and seq > int(backward.max()):
        return AFTER_BACKWARD
    modules = table["seq"][(table["kind"] == _MODULE) & (table["direction"] == _FORWARD)]
    if len(modules) and seq < int(modules.min()):
        return BEFORE_FORWARD
    return ""
