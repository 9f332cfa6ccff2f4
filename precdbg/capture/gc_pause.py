"""Keep Python's full garbage collections off the objects that existed before a dumped step.

A dumped step allocates tens of thousands of small container objects (records, hook objects,
handles). They trip CPython's generational collector, and every third or so young collection
becomes a *full* one that walks every tracked object of the process: with torch imported that is
hundreds of thousands of objects, ~100-200 ms each time (measured: 10 full collections, 1.9 s,
over 15 dumped steps of a 40-block MLP), charged to whatever hook happened to allocate.

`gc.freeze()` moves every object tracked at `start()` into the permanent generation, so the
collections a dumped step triggers look only at objects the step made; `gc.unfreeze()` at `stop()`
hands the old objects back to the oldest generation, where the next full collection sees them as
before. The young generation's threshold is raised for the step (700 -> 20,000 allocations): the
step's objects live until their batch is written, so collecting them every 700 allocations only
promotes them (1,257 young collections per 15 steps, 0.17 s). Both are restored at stop().

Nothing is collected later than it would be without precdbg except garbage made of objects that
existed before the step and were no longer young then (a young collection runs just before the
freeze); the first full collection after stop() finds it. Processes that froze objects themselves
(a fork server's pre-fork `gc.freeze()`) or turned the collector off are left alone.
"""
from __future__ import annotations

import gc
from typing import Tuple

__all__ = ["CollectorPause"]

_YOUNG_THRESHOLD = 20_000


class CollectorPause:
    """`begin()` at start, `end()` at stop; both idempotent. Owns only what it froze."""

    def __init__(self) -> None:
        self.frozen = False
        self.thresholds: Tuple[int, ...] = ()

    def begin(self) -> None:
        if self.frozen or not gc.isenabled() or gc.get_freeze_count():
            return
        gc.collect(1)       # recent garbage (the previous step's) is freed now, not frozen
        gc.freeze()
        self.frozen = True
        self.thresholds = gc.get_threshold()
        if 0 < self.thresholds[0] < _YOUNG_THRESHOLD:
            gc.set_threshold(_YOUNG_THRESHOLD, *self.thresholds[1:])

    def end(self) -> None:
        if not self.frozen:
            return
        self.frozen = False
        if self.thresholds and gc.get_threshold()[0] == _YOUNG_THRESHOLD:
            gc.set_threshold(*self.thresholds)      # unless the program changed them meanwhile
        gc.unfreeze()
