"""One process per (dump folder, rank) on a machine: a lock file in the temporary folder.

Two jobs started together into the same folder would each write the same rank's step files
before either sees a file of the other's; an exclusive `flock` on a file named by the folder's
path and the rank keeps the second out. The lock lives as long as the process (every debugger
of the process shares it) and its file is removed when the process ends normally, so the
temporary folder does not fill with one empty file per run.

Removing a lock file races with a process that opened it just before: that process may then
lock the removed file while a third creates and locks a new one under the same name. So a lock
counts only when the file locked is still the one the name gives (same device and inode);
otherwise it is tried again. Only the process that took a lock removes its file (a forked
child shares the parent's lock and leaves it alone).
"""
from __future__ import annotations

import atexit
import glob
import hashlib
import os
import tempfile
import threading
from typing import Dict, Optional, Tuple

__all__ = ["lock_rank", "lock_path", "held_elsewhere"]

_ATTEMPTS = 20                                   # a file replaced under us this often: give up
_held: Dict[Tuple[str, int], Tuple[int, str, int]] = {}   # key -> (descriptor, path, owner pid)
_lock = threading.Lock()
_cleanup_registered = False


def lock_path(folder: str, rank: int) -> str:
    """The lock file of rank `rank` writing into `folder` (an absolute path)."""
    digest = hashlib.sha1(folder.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"precdbg-{digest}.rank{rank}.lock")


def lock_rank(folder: str, rank: int) -> Optional[str]:
    """Hold the lock of (`folder`, `rank`) until the process ends: None when held (or when
    this system has no file locks), else why not (another process holds it)."""
    key = (folder, rank)
    with _lock:
        if key in _held:
            return None
        path = lock_path(folder, rank)
        try:
            import fcntl
        except ImportError:                      # Windows: not checked
            _held[key] = (-1, path, os.getpid())
            return None
        for _ in range(_ATTEMPTS):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:                      # a read-only temporary folder: not checked
                fd = -1
                break
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return _busy(rank, path)
            except OSError:                      # a file system without flock: not checked
                break
            if _still_named(fd, path):
                break
            os.close(fd)                         # removed by its last holder: take the new one
        else:
            fd = -1
        _held[key] = (fd, path, os.getpid())
        _register_cleanup()
    return None


def held_elsewhere(folder: str) -> Optional[str]:
    """Why another process is writing into `folder` (an absolute path): one holds the lock of
    one of its ranks. None when no other process does (or this system has no file locks).
    Asked before an earlier run is moved aside: the run still writing is another job's."""
    try:
        import fcntl
    except ImportError:
        return None
    digest = os.path.basename(lock_path(folder, 0)).split(".rank")[0]
    with _lock:
        mine = {path for _, path, _ in _held.values()}
    for path in sorted(glob.glob(os.path.join(tempfile.gettempdir(), f"{digest}.rank*.lock"))):
        if path in mine:
            continue
        try:
            fd = os.open(path, os.O_RDWR)        # never created here: only a lock file found
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return _busy(path.rsplit(".rank", 1)[1].split(".")[0], path)
        except OSError:
            pass
        finally:
            os.close(fd)
    return None


def _busy(rank: object, path: str) -> str:
    return f"another process is writing rank {rank} into it (lock {path})"


def _still_named(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _register_cleanup() -> None:
    global _cleanup_registered
    if not _cleanup_registered:
        _cleanup_registered = True
        atexit.register(release_all)


def release_all() -> None:
    """Remove and unlock every lock file this process took (at exit). Never raises."""
    with _lock:
        held = list(_held.values())
        _held.clear()
    for fd, path, owner in held:
        if fd < 0:
            continue
        try:
            if owner == os.getpid() and _still_named(fd, path):
                os.unlink(path)                  # while still locked: see the module's text
        except OSError:
            pass
        try:
            os.close(fd)
        except OSError:
            pass
