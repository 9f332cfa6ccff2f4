"""A rerun into the same dump folder: the earlier run's dump is moved aside, never overwritten.

msprobe users rerun a script with the same config all the time. When the debugger is made and
its `dump_path` holds the dump of an earlier run (files older than this process, see
`dump_folder.earlier_dump`), that dump moves to `<dump>/previous/<when>/` (`<when>`: the time
of its first file, `2026-11-29_07-11-41`), where it is a dump of its own that every command
reads; `<dump>` itself then holds this run, so `precdbg compare <dump> ...` reads the latest.
One line on stderr says so.

- Only run.json and the step<S> folders move (each whole); anything else in the folder stays
  where it is, and so do earlier runs moved before.
- The move cannot lose or mix anything: run.json is first copied (fsynced), then each step
  folder is renamed whole (atomic), then the folder's run.json is removed. A crash at any
  point leaves two readable dumps, each step folder whole in one of them; the next run
  finishes the move into the same `previous/<when>` (known by its run.json's bytes).
- The ranks of one job each make a debugger: they take turns (a lock on the folder), and
  those after the first find nothing earlier left to move.
- A dump still being written by another process of this machine (it holds a rank lock,
  `rank_lock`) is not an earlier run: the debugger is refused, as two jobs never share a
  folder.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, List, Optional

from ..errors import ConfigError
from .dump_folder import earlier_dump, folder_locked
from .json_files import fsync_dir, write_bytes_atomic
from .layout import PREVIOUS, dump_files, previous_runs, run_json_path, step_folders
from .rank_lock import held_elsewhere

__all__ = ["move_earlier_run"]

log = logging.getLogger("precdbg")


def move_earlier_run(dump_path: str) -> Optional[str]:
    """Move the earlier run's dump in `dump_path` aside (see the module's text) and say so in
    one line: the folder it now lives in, or None when there was none. A ConfigError when
    another process is writing into the folder."""
    folder = os.path.abspath(dump_path)
    if earlier_dump(folder) is None:
        return None
    with folder_locked(folder):
        if earlier_dump(folder) is None:          # another rank of this job moved it
            return None
        busy = held_elsewhere(folder)
        if busy is not None:
            raise ConfigError(f"dump_path: {dump_path}: {busy}; two jobs never write one "
                              "folder: wait for it to end, or choose another dump_path")
        moved = _move(folder)
    log.warning("precdbg: dump_path %s held an earlier run: moved to %s, this run writes %s",
                folder, moved, folder)
    return moved


def _move(folder: str) -> str:
    """run.json copied, step folders renamed, run.json removed (that order: see the module)."""
    run_json = run_json_path(folder)
    info = _read(run_json)                       # None: an earlier run whose run.json is gone
    steps = step_folders(folder)
    target = _target(folder, info, [os.path.basename(step) for step in steps])
    try:
        os.makedirs(target, exist_ok=True)
        if info is not None and not os.path.exists(run_json_path(target)):
            write_bytes_atomic(run_json_path(target), info)
        for step in steps:
            _gone_already(os.rename, step, os.path.join(target, os.path.basename(step)))
        fsync_dir(target)
        fsync_dir(folder)
        if info is not None:
            _gone_already(os.remove, run_json)
            fsync_dir(folder)
    except OSError as exc:
        raise ConfigError(f"dump_path: {folder} holds an earlier run that could not be moved "
                          f"to {target} ({exc.strerror or exc}); what was moved is complete "
                          "there, the rest is where it was") from None
    return target


def _target(folder: str, info: Optional[bytes], steps: List[str]) -> str:
    """Where the earlier run goes: the `previous/<when>` a crashed move began (the same
    run.json, none of these steps), else a new one named by its first file's time."""
    for earlier in previous_runs(folder):
        if info is not None and _read(run_json_path(earlier)) == info \
                and not any(os.path.exists(os.path.join(earlier, step)) for step in steps):
            return earlier
    times = []
    for path in dump_files(folder):
        try:
            times.append(os.stat(path).st_mtime)
        except OSError:
            continue
    when = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(min(times, default=time.time())))
    target, n = os.path.join(folder, PREVIOUS, when), 1
    while os.path.exists(target):
        n += 1
        target = os.path.join(folder, PREVIOUS, f"{when}-{n}")
    return target


def _gone_already(move: Callable[..., None], path: str, *to: str) -> None:
    """`move(path, *to)`, where `path` gone already is no failure: a rank of this job on
    another machine, where the folder's lock does not reach, moved it at the same time."""
    try:
        move(path, *to)
    except FileNotFoundError:
        pass


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None
