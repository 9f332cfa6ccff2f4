"""Ranks compared beyond one machine (`precdbg compare --engine dask ADDRESS`, issue 50): each
rank's steps are one task (parallel.compare_rank) run by the workers of a Dask distributed
cluster, which read both dumps at the same paths (a shared file system); the main process
merges what they return as `--jobs` does, so the verdict and the JSON are one process's
(tests/test_compare_engine.py starts a local cluster of worker processes).

ADDRESS is the scheduler's (`tcp://host:8786`), or DASK_SCHEDULER_ADDRESS when not given. The
engine is an optional extra: `pip install "precdbg[dask]"`. Ray is not offered yet.
"""
from __future__ import annotations

import os
from typing import Callable, List, Optional

from ..errors import ConfigError
from .parallel import RankFound, RankTask, compare_rank

__all__ = ["ENGINES", "run_on_engine", "engine_address"]

ENGINES = ("dask",)
_ADDRESS_VARIABLE = {"dask": "DASK_SCHEDULER_ADDRESS"}
_CONNECT_TIMEOUT_S = 30


def engine_address(engine: str, address: Optional[str]) -> str:
    """The scheduler's address: the one given, or the engine's usual environment variable."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine}: not available (engines: {', '.join(ENGINES)})")
    found = address or os.environ.get(_ADDRESS_VARIABLE[engine], "")
    if not found:
        raise ConfigError(f"--engine {engine}: give the scheduler's address (--engine {engine} "
                          f"tcp://HOST:8786) or set {_ADDRESS_VARIABLE[engine]}")
    return found


def run_on_engine(engine: str, address: Optional[str], tasks: List[RankTask],
                  done: Optional[Callable[[RankFound, int], None]] = None) -> List[RankFound]:
    """Run the rank tasks on the engine's workers; results by ascending rank. `done(found,
    count)` as each rank's result arrives. An interruption or an error cancels every task."""
    where = engine_address(engine, address)
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ConfigError(f"--engine {engine}: dask's distributed is not installed "
                          "(pip install \"precdbg[dask]\")") from None
    try:
        client = Client(where, timeout=_CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise ConfigError(f"--engine {engine}: cannot reach the scheduler at {where} "
                          f"({exc})") from None
    futures = []
    try:
        futures = client.map(compare_rank, tasks, pure=False)
        results: List[RankFound] = []
        for future in as_completed(futures):
            results.append(future.result())
            if done is not None:
                done(results[-1], len(results))
        return sorted(results, key=lambda f: f.rank)
    except BaseException:
        if futures:
            client.cancel(futures)
        raise
    finally:
        client.close()
