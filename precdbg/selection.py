"""Which steps and ranks are dumped, and why a run that dumped none says so at exit."""
from __future__ import annotations

from typing import Optional, Tuple

from .config import DumpConfig

__all__ = ["StepSelection"]


class StepSelection:
    """The config's `step` and `rank` lists, asked at every `start()`; remembers the steps
    `start()` ran on that the config leaves out (the guides call `step()` on the dumped iteration
    only, so the step counter then counts dumped iterations, not training iterations)."""

    def __init__(self, config: DumpConfig) -> None:
        self.steps = config.step
        self.ranks = config.rank
        self.skipped: Optional[Tuple[int, int, int]] = None   # (how many, first, last)

    def selects(self, step: int, rank: int) -> bool:
        """Whether `start()` on this step and rank dumps; a step left out is remembered."""
        if self.steps and step not in self.steps:
            seen = self.skipped
            self.skipped = (1, step, step) if seen is None else \
                (seen[0] + (step != seen[2]), seen[1], step)
            return False
        return not self.ranks or rank in self.ranks

    def nothing_dumped_notice(self, written: bool) -> Optional[str]:
        """Why this run wrote nothing, when start() ran only on steps the config leaves out.
        None when something was `written` (or start() never ran on a step left out)."""
        if written or self.skipped is None:
            return None
        count, first, last = self.skipped
        ran = f"step {first}" if count == 1 else f"{count} steps ({first} to {last})"
        return (f"precdbg: nothing was dumped: start() ran on {ran} only, and config "
                f"step is {sorted(self.steps)}; steps are counted by debugger.step() "
                f"calls from 0 (call step() after every training iteration, or list the steps "
                f"start() runs on)")
