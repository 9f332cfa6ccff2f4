"""Ranks compared in parallel (`precdbg compare --jobs N`, issue 50): each rank's steps are
compared in a worker process of their own (rank_compare.compare_rank, the unit of work of
every way a compare runs), and the main process takes each rank's result as it arrives and
merges what the ranks found in the order one process compares them (step, then rank), so
rows, notes, the verdict and the JSON are those of `--jobs 1`
(tests/core/test_core_compare_jobs.py).

A worker (forked where the platform can) opens both dumps itself (one (step, rank) pair of
files open at a time) and returns its rank's `RankFound`, the rows already encoded as the
JSON file's text where the compare spools them. Workers ignore SIGINT: Ctrl-C reaches the main
process, which terminates every worker (`Pool.terminate`) and re-raises. Progress counts
ranks as they finish.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Callable, List, Sequence, Tuple

from ..errors import ConfigError
from .rank_compare import RankFound, RankTask, StepFound, compare_rank

__all__ = ["RankTask", "StepFound", "RankFound", "available_cores", "compare_rank",
           "compare_ranks", "worth_parallel"]

# below this many bytes of step files, starting workers and sending their rows back costs
# more than it saves
_MIN_PARALLEL_BYTES = 8 << 20


def available_cores() -> int:
    """The cores this process may run on (`--jobs`'s default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:        # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def worth_parallel(jobs: int, pairs: Sequence[Tuple[int, int]], sizes: Callable[[], int]
                   ) -> bool:
    """Whether `jobs` workers pay: two or more ranks, and step files large enough."""
    return jobs > 1 and len({r for _, r in pairs}) > 1 and sizes() >= _MIN_PARALLEL_BYTES


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def compare_ranks(tasks: List[RankTask], jobs: int,
                  done: Callable[[RankFound, int], None]) -> None:
    """Run the rank tasks on `jobs` worker processes; `done(found, count)` is called in the
    main process with each rank's result as it arrives (and nothing is kept here). Ctrl-C
    (KeyboardInterrupt) or an error terminates every worker."""
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give 1 or more worker processes")
    # fork: a worker starts in milliseconds and imports nothing again (spawn re-runs the
    # caller's main module, which a script without `if __name__ == "__main__"` cannot bear);
    # a worker opens its own read-only files and leaves through os._exit, closing none of
    # the parent's
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    pool = context.Pool(min(jobs, len(tasks)), initializer=_ignore_sigint)
    count = 0
    try:
        for found in pool.imap_unordered(compare_rank, tasks):
            count += 1
            done(found, count)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
