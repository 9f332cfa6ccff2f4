"""The dump folder as a whole: whether a debugger may dump into it (a file there, a folder it
cannot write: refused when the debugger is made, before training), whether it holds an earlier
run's dump (which `earlier_run` moves aside), and what the process's debuggers share about it
(the folders they write into, the steps counted, whether the folder was named on stderr)."""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Dict, Iterator, Optional, Set

from ..errors import ConfigError
from .layout import dump_files

__all__ = ["CLAIMED", "refuse_dump_folder", "earlier_dump", "unusable_folder",
           "check_writable", "steps_counted", "count_step", "folder_locked", "first_named"]

CLAIMED: Set[str] = set()          # dump folders this process writes into (any debugger)
_STEPS_COUNTED: Dict[str, int] = {}     # dump folder -> steps counted there by step() so far
_NAMED: Set[str] = set()           # dump folders this process said it dumps into


@contextlib.contextmanager
def folder_locked(folder: str) -> Iterator[None]:
    """An exclusive lock on the dump folder itself (flock of its directory), held by the ranks
    of one machine in turn: for a read-modify-write of run.json, and while an earlier run is
    moved aside; no lock where there are none (or no folder yet)."""
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                 # releases the lock


def first_named(dump_path: str) -> bool:
    """Whether this is the first time this process names `dump_path` as where it dumps (the
    one line of the first captured start(), however many debuggers and steps follow)."""
    folder = os.path.abspath(dump_path)
    if folder in _NAMED:
        return False
    _NAMED.add(folder)
    return True


def _process_started() -> Optional[float]:
    """When this process started (seconds since the epoch), where the system says (Linux).

    The start is read as an age: the boot clock now less the process's start tick, both counted
    from the same boot, taken off the wall clock. `btime` of /proc/stat is whole seconds and made
    the start up to a second early; the age is exact to a tick (10 ms)."""
    try:
        with open("/proc/self/stat", "r", encoding="ascii") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])   # field 22, starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    if age < 0:                     # clocks of different boots (a sandbox): nothing to go by
        return None
    return time.time() - age


def check_writable(path: str) -> None:
    """One clear error (ConfigError) at the first start() when the dump folder cannot be
    created or written."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".precdbg-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        raise ConfigError(f"dump_path: {path} is not a writable folder "
                          f"({exc.strerror or exc})") from None


def steps_counted(dump_path: str) -> int:
    """How many steps debuggers of this process counted (step()) into `dump_path` so far: a
    debugger made later for the same folder (a local of a function called once per epoch)
    goes on from there, as msprobe's one debugger per process does, instead of writing a
    second, other iteration as a part of step 0."""
    return _STEPS_COUNTED.get(os.path.abspath(dump_path), 0)


def count_step(dump_path: str, step: int) -> None:
    folder = os.path.abspath(dump_path)
    _STEPS_COUNTED[folder] = max(step, _STEPS_COUNTED.get(folder, 0))


def unusable_folder(path: str) -> Optional[str]:
    """Why `path` cannot become the dump folder, seen without creating anything (asked when
    the debugger is made, before training, as check_writable is at the first start()): a file
    there, or the nearest folder that exists is not writable. None: nothing known against it."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a folder"
    existing = path
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            return None
        existing = parent
    if not os.path.isdir(existing):
        return f"{existing} is a file, so {path} cannot be made"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable (or on a read-only file system)"
    return None


def refuse_dump_folder(dump_path: str) -> None:
    """A ConfigError when the debugger being made could not dump into `dump_path`: it cannot
    be made or written (unusable_folder). An earlier run's dump there is no reason: it is
    moved aside (`earlier_run.move_earlier_run`)."""
    unusable = unusable_folder(dump_path)
    if unusable is not None:
        raise ConfigError(f"dump_path: {dump_path}: {unusable}; choose a folder this process "
                          "can write")


def earlier_dump(dump_path: str) -> Optional[str]:
    """A file of a dump that an earlier run left in `dump_path` (written before this process
    started, in a folder no debugger of this process writes into), or None. Files of this
    run's other ranks are newer than this process; where the start time is unknown, None.
    Earlier runs already moved aside (`<dump>/previous/`) are not looked at."""
    folder = os.path.abspath(dump_path)
    started = _process_started()
    if folder in CLAIMED or started is None or not os.path.isdir(folder):
        return None
    for path in dump_files(folder):
        try:
            mtime_ns = os.stat(path).st_mtime_ns
        except OSError:
            continue
        # file systems that keep whole seconds (or two: FAT) need that much slack; others
        # only the start's tick (a rerun right after the last run ended is still refused)
        slack = 2.0 if mtime_ns % 1_000_000_000 == 0 else 0.05
        if mtime_ns / 1e9 < started - slack:
            return path
    return None
