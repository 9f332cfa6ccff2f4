"""Ranks compared beyond one machine (`precdbg compare --engine dask|ray ADDRESS`, issue 50):
each rank's steps are one task (parallel.compare_rank) run by the workers of a Dask distributed
cluster or a Ray cluster, which read both dumps at the same paths (a shared file system); the
main process merges what they return as `--jobs` does, so the verdict and the JSON are one
process's (tests/test_compare_engine.py starts a local cluster of each).

ADDRESS is the one given, else the engine's usual environment variable: the Dask scheduler's
(`tcp://host:8786`, DASK_SCHEDULER_ADDRESS), or the Ray cluster's (`host:6379` on a node of the
cluster, `ray://host:10001` through Ray Client, or `auto`; RAY_ADDRESS). A process already
connected to Ray (`ray.init`) keeps its connection and Ray is shut down only where this module
started it. Each engine is an optional extra: `pip install "precdbg[dask]"` or
`"precdbg[ray]"`.

What both engines share is written once (run_on_engine): the address, the one-line errors,
results handed to `done` as each rank's arrives (none kept here, so memory stays bounded), and
every task cancelled on Ctrl-C or an error, which is then re-raised. An engine class says only
how to import, connect, submit, wait, cancel and close.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any, Callable, Dict, Iterator, List, Optional, Type

from ..errors import ConfigError
from .parallel import RankFound, RankTask, compare_rank

__all__ = ["ENGINES", "run_on_engine", "engine_address"]

_CONNECT_TIMEOUT_S = 30


class _Engine:
    """One engine's side of run_on_engine; an instance serves one run."""
    name = ""
    variable = ""       # the environment variable that holds the address
    server = ""         # what the address names, in messages
    example = ""        # how to give an address, in messages
    package = ""        # what `pip install "precdbg[name]"` brings

    def load(self) -> None:
        """Import the engine's package (ImportError: not installed)."""
        raise NotImplementedError

    def connect(self, where: str) -> None:
        """Connect to the cluster (OSError or TimeoutError: unreachable)."""
        raise NotImplementedError

    def submit(self, tasks: List[RankTask], handles: List[Any]) -> None:
        """Start one task per rank, appending each handle as it is made."""
        raise NotImplementedError

    def arrivals(self, handles: List[Any]) -> Iterator[RankFound]:
        """The tasks' results, each as soon as it is there."""
        raise NotImplementedError

    def cancel(self, handles: List[Any]) -> None:
        """Stop every task still queued or running."""
        raise NotImplementedError

    def close(self) -> None:
        """Leave the cluster as it was found."""


class _Dask(_Engine):
    name, variable, server = "dask", "DASK_SCHEDULER_ADDRESS", "scheduler"
    example, package = "--engine dask tcp://HOST:8786", "dask's distributed"

    def load(self) -> None:
        import distributed
        self.distributed = distributed
        self.client = None

    def connect(self, where: str) -> None:
        self.client = self.distributed.Client(where, timeout=_CONNECT_TIMEOUT_S)

    def submit(self, tasks: List[RankTask], handles: List[Any]) -> None:
        handles.extend(self.client.map(compare_rank, tasks, pure=False))

    def arrivals(self, handles: List[Any]) -> Iterator[RankFound]:
        for future in self.distributed.as_completed(handles):
            yield future.result()

    def cancel(self, handles: List[Any]) -> None:
        self.client.cancel(handles)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


class _Ray(_Engine):
    name, variable, server = "ray", "RAY_ADDRESS", "cluster"
    example, package = "--engine ray HOST:6379, or auto", "ray"

    def load(self) -> None:
        import ray
        self.ray = ray
        self.started = False

    def connect(self, where: str) -> None:
        if where != "auto":
            # ray.init retries an address where nothing listens for minutes: ask first
            host, _, port = where[len("ray://"):].rpartition(":") if where.startswith(
                "ray://") else where.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"--engine ray {where}: give HOST:PORT, ray://HOST:PORT "
                                  "or auto")
            socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT_S).close()
        if self.ray.is_initialized():
            return
        try:
            self.ray.init(address=where, log_to_driver=False, include_dashboard=False,
                          ignore_reinit_error=False, logging_level=logging.WARNING)
        except ValueError as exc:   # ray://: Ray Client's package (ray[client]) is missing
            raise ConfigError(f"--engine ray {where}: {_first_line(exc)}") from None
        self.started = True

    def submit(self, tasks: List[RankTask], handles: List[Any]) -> None:
        remote = self.ray.remote(compare_rank)
        for task in tasks:
            handles.append(remote.remote(task))

    def arrivals(self, handles: List[Any]) -> Iterator[RankFound]:
        pending = list(handles)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1)
            for ref in ready:
                yield self.ray.get(ref)

    def cancel(self, handles: List[Any]) -> None:
        # the tasks not done yet, each interrupted where it runs (a KeyboardInterrupt in its
        # worker): killing the workers (force=True) races with their replies, which Ray 2.60's
        # driver answers by aborting this process
        _, running = self.ray.wait(list(handles), num_returns=len(handles), timeout=0)
        for ref in running:
            self.ray.cancel(ref, force=False)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


_ENGINES: Dict[str, Type[_Engine]] = {"dask": _Dask, "ray": _Ray}
ENGINES = tuple(_ENGINES)


def engine_address(engine: str, address: Optional[str]) -> str:
    """The cluster's address: the one given, or the engine's usual environment variable."""
    if engine not in _ENGINES:
        raise ConfigError(f"--engine {engine}: not available (engines: {', '.join(ENGINES)})")
    kind = _ENGINES[engine]
    found = address or os.environ.get(kind.variable, "")
    if not found:
        raise ConfigError(f"--engine {engine}: give the {kind.server}'s address ({kind.example})"
                          f" or set {kind.variable}")
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_on_engine(engine: str, address: Optional[str], tasks: List[RankTask],
                  done: Callable[[RankFound, int], None]) -> None:
    """Run the rank tasks on the engine's workers and call `done(found, count)` for each
    rank's result as it arrives, in no set order (none is kept: the caller merges them). An
    interruption or an error cancels every task and is re-raised."""
    where = engine_address(engine, address)
    runner = _ENGINES[engine]()
    try:
        runner.load()
    except ImportError:
        raise ConfigError(f"--engine {engine}: {runner.package} is not installed "
                          f"(pip install \"precdbg[{engine}]\")") from None
    try:
        runner.connect(where)
    except (OSError, TimeoutError) as exc:      # ConnectionError is an OSError
        runner.close()
        raise ConfigError(f"--engine {engine}: cannot reach the {runner.server} at {where} "
                          f"({_first_line(exc)})") from None
    handles: List[Any] = []
    try:
        runner.submit(tasks, handles)
        for count, found in enumerate(runner.arrivals(handles), 1):
            done(found, count)
    except BaseException:
        if handles:
            with contextlib.suppress(Exception):    # the error that stopped us is the one told
                runner.cancel(handles)
        raise
    finally:
        runner.close()
