"""Room on disk for a step file, taken before HDF5 writes into it.

HDF5 does not survive a write that fails half-way: a full disk met while it writes metadata
leaves its caches in a state where the next flush (or closing the objects it wrote) crashes the
process (SIGSEGV, measured on a tmpfs filled by another process while a step was written). So
the room a write phase needs is checked first (`check_room`: the free space and the process's
file-size limit) and then taken (`reserve`: the file's blocks allocated up to where the phase
can reach, with Linux's fallocate(2)): a disk that fills afterwards, by another process, can no
longer fail HDF5's writes below that end. A file system without fallocate keeps the check only.
The blocks reserved past HDF5's data are given back when the file is complete
(`trim_to_hdf5_end`: the end HDF5 recorded in its superblock).
"""
from __future__ import annotations

import errno
import os
import shutil
import struct
from typing import Any, Optional, Tuple

__all__ = ["check_room", "reserve", "trim_to_hdf5_end", "free_space"]

_ROOM_BASE = 128 << 10       # room kept for HDF5's metadata: this much ...
_ROOM_SHARE = 16             # ... plus this share of the bytes written
_ENDS_OF_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _load_fallocate() -> Tuple[Any, Any]:
    """(fallocate(2), the errno it left), or (None, None) where there is none."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (ImportError, OSError, AttributeError):      # not Linux (or no C library found)
        return None, None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    fallocate.restype = ctypes.c_int
    return fallocate, ctypes.get_errno


_FALLOCATE, _ERRNO = _load_fallocate()


def margin_for(nbytes: int) -> int:
    return _ROOM_BASE + nbytes // _ROOM_SHARE


def check_room(path: str, written: int, nbytes: int) -> None:
    """Refuse a write of `nbytes` more into `path` (which holds `written` bytes so far) that
    cannot fit (disk full, quota, file-size limit), before HDF5 meets it."""
    margin = margin_for(nbytes)
    end = written + nbytes + margin
    limit = _file_size_limit()
    if limit is not None and end > limit:
        raise OSError(errno.EFBIG, f"{os.strerror(errno.EFBIG)}: the process's file-size "
                      f"limit (RLIMIT_FSIZE) is {size_text(limit)} and the file would reach "
                      f"{size_text(end)} ({size_text(margin)} of it kept for HDF5's metadata)")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):        # the step's folder comes with its file
        folder = os.path.dirname(folder)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    if nbytes + margin > free:
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {size_text(nbytes)} more "
                      f"to write (and {size_text(margin)} for HDF5's metadata), "
                      f"{size_text(free)} free")


def reserve(fd: int, end: int) -> None:
    """Allocate the file's blocks up to byte `end` (the file grows to at least `end`): a full
    disk is met here, as an OSError, and not by HDF5 later. Nothing where the file system
    cannot allocate ahead (then only `check_room` stands)."""
    if _FALLOCATE is None or fd < 0 or end <= 0:
        return
    if _FALLOCATE(fd, 0, 0, end) == 0:
        return
    err = _ERRNO()
    if err in _ENDS_OF_ROOM:
        raise OSError(err, f"{os.strerror(err)}: could not reserve {size_text(end)} for the "
                      "step file")
    # EOPNOTSUPP, ENOSYS, EINVAL, ...: this file system allocates as it writes


def trim_to_hdf5_end(path: str) -> None:
    """Give back what `reserve` allocated past the end of HDF5's data: the end HDF5 recorded
    in the superblock (version 2 and later: what libver="latest" writes) when it closed the
    file. A file it cannot read so is left as it is (still a valid HDF5 file)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(36)
        if len(head) < 36 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] not in (2, 3) \
                or head[9] != 8:
            return
        base, _, end = struct.unpack_from("<QQQ", head, 12)
        if base == 0 and 0 < end < os.path.getsize(path):
            os.truncate(path, end)
    except OSError:
        pass


def _file_size_limit() -> Optional[int]:
    try:
        import resource
    except ImportError:      # not POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def size_text(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def free_space(path: str) -> str:
    folder = os.path.dirname(path)
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return size_text(shutil.disk_usage(folder or ".").free)
    except OSError:
        return "unknown"
