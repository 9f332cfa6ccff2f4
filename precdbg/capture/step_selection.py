"""Which steps and ranks are dumped, and why a run that dumped none says so at exit."""
from __future__ import annotations

from typing import Optional, Set, Tuple

from ..config.dump_config import DumpConfig

__all__ = ["StepSelection"]


class StepSelection:
    """The config's `step` and `rank` lists, asked at every `start()`; remembers the steps
    `start()` ran on that the config leaves out (the guides call `step()` on the dumped iteration
    only, so the step counter then counts dumped iterations, not training iterations)."""

    def __init__(self, config: DumpConfig) -> None:
        self.steps = config.step
        self.ranks = config.rank
        self.skipped: Optional[Tuple[int, int, int]] = None   # (how many, first, last)
        self.selected: Set[int] = set()          # the listed steps start() ran on
        self.world: Optional[Tuple[int, int]] = None   # (rank, world size) the config leaves out

    def selects(self, step: int, rank: int, world_size: int = 1) -> bool:
        """Whether `start()` on this step and rank dumps; a step left out is remembered."""
        if self.steps and step not in self.steps:
            seen = self.skipped
            self.skipped = (1, step, step) if seen is None else \
                (seen[0] + (step != seen[2]), seen[1], step)
            return False
        self.selected.add(step)
        if self.ranks and rank not in self.ranks:
            self.world = (rank, world_size)
            return False
        return True

    def nothing_dumped_notice(self, written: bool) -> Optional[str]:
        """Why this run wrote nothing, or not every step the config lists, when start() ran
        on steps the config leaves out, or when no rank of the run is one the config lists;
        None otherwise (a rank left out of a run whose other ranks dump says nothing)."""
        if self.world is not None and not written:
            rank, world_size = self.world
            if not any(r < world_size for r in self.ranks):
                return (f"precdbg: nothing was dumped: config rank is {sorted(self.ranks)}, "
                        f"and this run has rank(s) 0 to {world_size - 1} only (this process "
                        f"is rank {rank})")
            if self.selected:
                return None
        if self.skipped is None:
            return None
        count, first, last = self.skipped
        ran = f"step {first}" if count == 1 else f"{count} steps ({first} to {last})"
        how = (f"steps are counted by debugger.step() calls from 0 (call step() after every "
               f"training iteration, or list the steps start() runs on)")
        if not written:
            return (f"precdbg: nothing was dumped: start() ran on {ran} only, and config "
                    f"step is {sorted(self.steps)}; {how}")
        missed = sorted(set(self.steps) - self.selected)
        if not missed:
            return None
        reached = max(last, max(self.selected, default=last))
        return (f"precdbg: config step is {sorted(self.steps)}, and steps {missed} were not "
                f"dumped: the step count reached {reached} (start() also ran on {ran}, which "
                f"the config leaves out); if training went further, note that {how}")
