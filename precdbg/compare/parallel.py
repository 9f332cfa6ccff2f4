"""Ranks compared in parallel (`precdbg compare --jobs N`, issue 50): each rank's steps are
compared in a worker process of their own, in ascending step order (a step k >= 1 is judged
against the same rank's step k-1: multistep.NoisePolicy keeps one state per rank), and the
main process merges what each rank found in the order one process compares them (step, then
rank), so rows, notes, the verdict and the JSON are those of `--jobs 1`
(tests/core/test_core_compare_jobs.py).

A worker (forked where the platform can) opens both dumps itself (one (step, rank) pair of
files open at a time) and returns, per (step, rank), its rows, records without counterpart,
structural differences, where a run stopped, and its entries; plus, per rank, the steps
before `--step S` it judged against and the noise policy's counts. Workers ignore SIGINT:
Ctrl-C reaches the main process, which terminates every worker (`Pool.terminate`) and
re-raises. Progress counts ranks as they finish.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError
from .judge.entries import Entry
from .judge.multistep import NoisePolicy
from .judge.rows import Note, NoteCode, Row
from .judge.structure import StructuralDiff
from .judge.unfinished import UnfinishedStep

__all__ = ["RankTask", "StepFound", "RankFound", "available_cores", "compare_ranks",
           "worth_parallel"]

# below this many bytes of step files, starting workers and sending their rows back costs
# more than it saves
_MIN_PARALLEL_BYTES = 8 << 20


def available_cores() -> int:
    """The cores this process may run on (`--jobs`'s default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:        # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclasses.dataclass
class RankTask:
    """One rank's share of a compare: the steps to compare, and those before `--step S` whose
    parameters the first of them is judged against."""
    baseline: str
    candidate: str
    rank: int
    steps: List[int]
    previous: List[int]
    same: bool
    shim_pair: bool
    mapping: Any
    alike: bool
    unknown: List[str]
    conventions: List[str]


@dataclasses.dataclass
class StepFound:
    """What comparing one (step, rank) gave."""
    step: int
    rank: int
    rows: List[Row]
    unmatched: List[Dict[str, Any]]
    structural: List[StructuralDiff]
    unfinished: List[UnfinishedStep]
    entries: List[Entry]


@dataclasses.dataclass
class RankFound:
    rank: int
    steps: List[StepFound]
    before: Dict[Tuple[int, int], bool]
    unread: List[Tuple[Tuple[int, int], Note]]
    noise: NoisePolicy


def compare_rank(task: RankTask) -> RankFound:
    """A worker's job: every step of one rank, as compare_dumps compares them."""
    from ..errors import DumpError
    from ..storage.reader import open_dump
    from .pipeline import _compare_step
    noise = NoisePolicy(alike=task.alike, unknown=task.unknown, conventions=task.conventions)
    a, b = open_dump(task.baseline), open_dump(task.candidate)
    try:
        r = task.rank
        before: Dict[Tuple[int, int], bool] = {}
        unread: List[Tuple[Tuple[int, int], Note]] = []
        for s in task.previous:
            try:
                found = _compare_step(a, b, s, r, task.same, task.mapping, [], [], None, (0, 0),
                                      noise, [], shim_pair=task.shim_pair)
            except DumpError as exc:
                unread.append(((s, r), Note(NoteCode.PREVIOUS_STEP_UNREAD,
                                            facts={"step": s, "rank": r, "error": str(exc)})))
                continue
            noise.settle(r, found)
            before[(s, r)] = not any(e.diverged or e.trainable_differs for e in found)
        steps: List[StepFound] = []
        for s in task.steps:
            out = StepFound(s, r, [], [], [], [], [])
            out.entries = _compare_step(a, b, s, r, task.same, task.mapping, out.rows,
                                        out.unmatched, None, (0, 0), noise, out.structural,
                                        out.unfinished, shim_pair=task.shim_pair)
            noise.settle(r, out.entries)
            steps.append(out)
        return RankFound(r, steps, before, unread, noise)
    finally:
        a.close()
        b.close()


def worth_parallel(jobs: int, pairs: Sequence[Tuple[int, int]], sizes: Callable[[], int]
                   ) -> bool:
    """Whether `jobs` workers pay: two or more ranks, and step files large enough."""
    return jobs > 1 and len({r for _, r in pairs}) > 1 and sizes() >= _MIN_PARALLEL_BYTES


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def compare_ranks(tasks: List[RankTask], jobs: int,
                  done: Optional[Callable[[RankFound, int], None]] = None) -> List[RankFound]:
    """Run the rank tasks on `jobs` worker processes; results by ascending rank. `done(found,
    count)` is called in the main process as each rank finishes. Ctrl-C (KeyboardInterrupt)
    or an error terminates every worker."""
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: give 1 or more worker processes")
    # fork: a worker starts in milliseconds and imports nothing again (spawn re-runs the
    # caller's main module, which a script without `if __name__ == "__main__"` cannot bear);
    # a worker opens its own read-only files and leaves through os._exit, closing none of
    # the parent's
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    pool = context.Pool(min(jobs, len(tasks)), initializer=_ignore_sigint)
    results: List[RankFound] = []
    try:
        for found in pool.imap_unordered(compare_rank, tasks):
            results.append(found)
            if done is not None:
                done(found, len(results))
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
    return sorted(results, key=lambda f: f.rank)
