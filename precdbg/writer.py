"""Background HDF5 writer: one thread owns every file; a byte-bounded queue feeds it.

One file per step per rank, `<dump>/step<S>/rank<R>.h5`, written as `.partial` and renamed once it
is complete and fsynced, so a crash loses at most the step being written. The training thread only
enqueues; a full queue blocks it (data is never dropped). Errors in the thread are logged and
counted, never raised into training.

Inside a step file:
  attrs           schema_version, step, rank, part, framework, task, level, ...
  records/<col>   one dataset per column of `schema.RECORD_COLUMNS`, plus `shape` (N x MAX_NDIM)
  data/<k>        contiguous byte blobs holding the stored tensors, packed; blob k has attribute
                  `start`, its offset in the step's byte space (records hold offset/nbytes there,
                  and a tensor never spans two blobs)
  modules/path, modules/cls, modules/parent   the module tree
  modules/settings  each module's numeric layer settings, JSON text ('' none; precdbg.layers)
  stacks/text     de-duplicated call stacks (records hold stack_id)
"""
from __future__ import annotations

import collections
import errno
import json
import logging
import os
import shutil
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import lifetime
from .schema import MAX_NDIM, RECORD_COLUMNS, SCHEMA_VERSION, Record

__all__ = ["DumpWriter", "Payload", "step_file_path", "write_json_atomic"]

log = logging.getLogger("precdbg")

_STAGE_BYTES = 32 << 20      # stored tensors are packed into contiguous blobs of about this size
_CHUNK_BYTES = 1 << 20
_WRITER_NICE = 10
_IDLE_POLL_SECONDS = 0.5      # an idle thread notices retire() this often
_ROOM_MARGIN = 1 << 20        # room kept for HDF5 metadata when checking that a write fits
_RECORD_BYTES = 512           # upper estimate of one record's bytes in the record table


class Payload:
    """Host bytes of one distinct tensor: stored (tensor task) and/or hashed (checksum)."""
    __slots__ = ("tensor_id", "array", "store", "checksum")

    def __init__(self, tensor_id: int, array: np.ndarray, store: bool, checksum: bool) -> None:
        self.tensor_id, self.array, self.store, self.checksum = tensor_id, array, store, checksum


def step_file_path(dump_path: str, step: int, rank: int, part: int = 0) -> str:
    name = f"rank{rank}.h5" if part == 0 else f"rank{rank}.part{part}.h5"
    return os.path.join(dump_path, f"step{step}", name)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class _OpenStep:
    """State of the step file being written (owned by the writer thread)."""

    def __init__(self, final_path: str, attrs: Dict[str, Any], compression: Optional[str]) -> None:
        import h5py
        self.final_path = final_path
        self.partial_path = final_path + ".partial"
        self.attrs = attrs
        os.makedirs(os.path.dirname(final_path), exist_ok=True)
        self.file = h5py.File(self.partial_path, "w", libver="latest")
        try:
            for key, value in attrs.items():
                self.file.attrs[key] = value if not isinstance(value, (dict, list)) \
                    else json.dumps(value)
        except Exception:
            self.abandon()
            raise
        self.compression = compression
        self.records: List[Record] = []
        self.data = None
        self.data_size = 0
        self.stage: List[np.ndarray] = []
        self.stage_bytes = 0
        self.stage_start = 0
        self.offsets: Dict[int, Tuple[int, int]] = {}
        self.checksums: Dict[int, str] = {}

    # -- tensor bytes ------------------------------------------------------------------------
    def add_bytes(self, tensor_id: int, flat: np.ndarray) -> None:
        """Pack a tensor's bytes; a full stage becomes one contiguous blob dataset."""
        nbytes = flat.nbytes
        if self.stage and self.stage_bytes + nbytes > _STAGE_BYTES:
            self.flush_stage()
        if not self.stage:
            self.stage_start = self.data_size
        self.offsets[tensor_id] = (self.data_size, nbytes)
        self.data_size += nbytes
        self.stage.append(flat)
        self.stage_bytes += nbytes

    def flush_stage(self) -> None:
        """Write the staged tensors as one contiguous blob dataset: piece by piece through the
        low-level API (no concatenated copy), or concatenated into chunks when compressing."""
        if not self.stage:
            return
        self.check_room(self.stage_bytes)
        group = self.data if self.data is not None else self.file.create_group("data")
        self.data = group
        name, total = str(len(group)), self.stage_bytes
        if self.compression and total:
            blob = self.stage[0] if len(self.stage) == 1 else np.concatenate(self.stage)
            ds = group.create_dataset(name, data=blob, compression=self.compression,
                                      chunks=(min(_CHUNK_BYTES, total),))
        else:
            from h5py import h5s
            ds = group.create_dataset(name, shape=(total,), dtype=np.uint8)
            file_space = ds.id.get_space()
            offset = 0
            for piece in self.stage:
                if piece.nbytes:
                    file_space.select_hyperslab((offset,), (piece.nbytes,))
                    ds.id.write(h5s.create_simple((piece.nbytes,)), file_space, piece)
                    offset += piece.nbytes
        ds.attrs["start"] = self.stage_start
        self.stage, self.stage_bytes = [], 0

    # -- close ---------------------------------------------------------------------------------
    def finish(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
               attrs: Optional[Dict[str, Any]] = None) -> str:
        import h5py
        for key, value in (attrs or {}).items():
            self.file.attrs[key] = value
        self.flush_stage()
        records = self.records
        for rec in records:
            if rec.tensor_id >= 0:
                where = self.offsets.get(rec.tensor_id)
                if where is not None:
                    rec.data_offset, rec.data_nbytes = where
                digest = self.checksums.get(rec.tensor_id)
                if digest is not None:
                    rec.checksum = digest
        self.check_room(len(records) * _RECORD_BYTES + sum(len(t) for t in stacks))
        group = self.file.create_group("records")
        group.attrs["count"] = len(records)
        for column, dtype in RECORD_COLUMNS:
            values = [getattr(rec, column) for rec in records]
            if dtype is None:
                arr = np.array([v.encode("utf-8") for v in values], dtype=bytes) if values \
                    else np.zeros((0,), dtype="S1")
            else:
                arr = np.asarray(values, dtype=dtype) if values else np.zeros((0,), dtype=dtype)
            group.create_dataset(column, data=arr)
        shapes = np.full((len(records), MAX_NDIM), -1, dtype=np.int64)
        ndims = np.zeros((len(records),), dtype=np.int8)
        for i, rec in enumerate(records):
            dims = rec.shape[:MAX_NDIM]
            ndims[i] = len(rec.shape)
            if dims:
                shapes[i, :len(dims)] = dims
        group.create_dataset("shape", data=shapes)
        group.create_dataset("ndim", data=ndims)
        mod = self.file.create_group("modules")
        str_dt = h5py.string_dtype("utf-8")
        for i, column in enumerate(("path", "cls", "parent", "settings")):
            mod.create_dataset(column, data=np.array([m[i] if len(m) > i else "" for m in modules],
                                                     dtype=object), dtype=str_dt)
        self.file.create_group("stacks").create_dataset(
            "text", data=np.array(list(stacks), dtype=object), dtype=str_dt)
        self.file.attrs["complete"] = True
        self.file.flush()
        fd = self.file.id.get_vfd_handle()
        os.fsync(fd)
        self.file.close()
        os.replace(self.partial_path, self.final_path)
        _fsync_dir(os.path.dirname(self.final_path))
        return self.final_path

    def check_room(self, nbytes: int) -> None:
        """Refuse a write that cannot fit (disk full, quota, file-size limit) before HDF5 meets
        it: an HDF5 file whose write failed half-way cannot even be closed cleanly."""
        end = self.data_size + nbytes + _ROOM_MARGIN
        limit = _file_size_limit()
        if limit is not None and end > limit:
            raise OSError(errno.EFBIG, f"{os.strerror(errno.EFBIG)}: the process's file-size "
                          f"limit (RLIMIT_FSIZE) is {_size(limit)} and the file would reach "
                          f"{_size(end)}")
        try:
            free = shutil.disk_usage(os.path.dirname(self.partial_path)).free
        except OSError:
            return
        if nbytes + _ROOM_MARGIN > free:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {_size(nbytes)} more "
                          f"to write")

    def abandon(self) -> None:
        """Close and delete the unfinished file: a step is either complete or absent."""
        try:
            self.file.close()
        except Exception:  # noqa: BLE001 - already failing
            pass
        try:
            os.remove(self.partial_path)
        except OSError:
            pass


class DumpWriter:
    """One background thread writing step files; the queue is bounded in bytes and blocks.

    The thread starts with the first item and ends when told to (`shutdown`, or `retire` once
    the debugger that owned it is gone) and everything queued is written. While it runs, the
    process-wide shutdown hook (`lifetime`) holds it and drains it before the interpreter tears
    anything down, so no user reference, `close()` or `with` is needed for complete files.
    """

    def __init__(self, dump_path: str, queue_bytes: int = 256 << 20,
                 compression: Optional[str] = None) -> None:
        import h5py  # noqa: F401 - imported on the caller's thread, never first in the writer's
        self.dump_path = dump_path
        self.queue_bytes = int(queue_bytes)
        self.compression = compression
        self._items: Deque[Tuple[str, Any, int]] = collections.deque()
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._open: Optional[_OpenStep] = None
        self._dropped_open = False        # the open step failed: ignore it until the next open
        self._stopping = False            # shutdown(): write everything, then end the thread
        self._retired = False             # the owner is gone: end the thread once idle
        self.progress = 0                 # grows with every item and blob written
        self.errors = 0
        self.last_error = ""
        self.written: List[str] = []
        self._parts: Dict[Tuple[int, int], int] = {}

    # -- producer side (training thread) ----------------------------------------------------
    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ensure_thread(self) -> bool:
        """Start the thread if needed; False when it cannot run (interpreter shutting down)."""
        if self._thread_alive():
            return True
        if lifetime.shutting_down():
            return False
        self._stopping = self._retired = False
        lifetime.track_writer(self)             # the shutdown hook now drains this writer
        self._thread = threading.Thread(target=self._run, name="precdbg-writer", daemon=True)
        self._thread.start()
        return True

    def _put(self, kind: str, item: Any, nbytes: int = 0) -> None:
        with self._cond:
            if not self._ensure_thread():
                # after the shutdown hook (a user's own atexit handler): write inline
                self._handle_guarded(kind, item)
                return
            while self._pending_bytes and self._pending_bytes + nbytes > self.queue_bytes:
                self._cond.wait(0.5)
                if not self._thread_alive():
                    break
            self._pending_bytes += nbytes
            self._items.append((kind, item, nbytes))
            self._cond.notify_all()

    def existing_files(self, rank: int) -> List[str]:
        """Step files of this rank already in the dump folder (from an earlier run)."""
        import glob
        pattern = os.path.join(self.dump_path, "step*", f"rank{rank}.*h5*")
        return sorted(glob.glob(pattern))

    def open_step(self, step: int, rank: int, attrs: Dict[str, Any]) -> None:
        """Queue a new step file; a second capture window in the same step gets `.partN`."""
        part = self._parts.get((step, rank), 0)
        self._parts[(step, rank)] = part + 1
        attrs = dict(attrs, step=step, rank=rank, part=part, schema_version=SCHEMA_VERSION)
        self._put("open", (step_file_path(self.dump_path, step, rank, part), attrs))

    def submit(self, records: List[Record], payloads: List[Payload]) -> None:
        nbytes = sum(p.array.nbytes for p in payloads)
        self._put("batch", (records, payloads), nbytes)

    def close_step(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
                   attrs: Optional[Dict[str, Any]] = None) -> None:
        self._put("close", (list(modules), list(stacks), dict(attrs or {})))

    def abandon_step(self) -> None:
        """Drop the step being written (a start() that failed): no file is left behind."""
        self._put("abandon", None)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        if not self._thread_alive() and not self._items:
            return True
        done = threading.Event()
        self._put("flush", done)
        return done.wait(timeout)

    def retire(self) -> None:
        """The owner is gone: end the thread once everything queued is written. Lock-free (it
        runs from a garbage-collection finalizer, possibly inside `_put` on the same thread)."""
        self._retired = True

    def shutdown(self, stall_seconds: float = 60.0) -> bool:
        """Write everything queued, then end the thread; waits as long as writing progresses.
        A step still open (never closed) is dropped. False if the writer stalled."""
        with self._cond:
            thread = self._thread
            if thread is None:
                return True
            self._stopping = True
            self._cond.notify_all()
        finished = lifetime.wait_while_progressing(thread.is_alive, lambda: self.progress,
                                                   thread.join, stall_seconds)
        if not finished:
            log.warning("precdbg: the writer of %s wrote nothing for %.0f s; giving up (steps "
                        "not renamed from .partial are incomplete)", self.dump_path,
                        stall_seconds)
        return finished

    # -- consumer side (writer thread) --------------------------------------------------------
    def _run(self) -> None:
        # Below the training threads: on a saturated host a busy writer competing at equal
        # priority stalls every parallel region of the step (measured: tensor task on 2 cores).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
        except (AttributeError, OSError):   # not Linux, or not permitted: equal priority
            pass
        leftover: Optional[_OpenStep] = None
        try:
            while True:
                with self._cond:
                    while not self._items:
                        if self._stopping or (self._retired and self._open is None):
                            leftover, self._open = self._open, None
                            self._end_thread_locked()
                            return
                        self._cond.wait(_IDLE_POLL_SECONDS)
                    kind, item, nbytes = self._items.popleft()
                try:
                    self._handle_guarded(kind, item)
                finally:
                    with self._cond:
                        self._pending_bytes -= nbytes
                        self.progress += 1
                        self._cond.notify_all()
        except BaseException:  # noqa: BLE001 - a thread that dies must not strand the queue
            with self._cond:
                if self._thread is threading.current_thread():
                    leftover, self._open = self._open, None
                    self._end_thread_locked()
            raise
        finally:
            if leftover is not None:
                log.warning("precdbg: %s was never closed (its stop() did not run); dropped",
                            leftover.final_path)
                leftover.abandon()

    def _end_thread_locked(self) -> None:
        """Under `_cond`: this thread is done; a later `_put` starts a new one."""
        self._thread = None
        lifetime.untrack_writer(self)
        self._cond.notify_all()

    def _handle_guarded(self, kind: str, item: Any) -> None:
        failure: Optional[BaseException] = None
        try:
            self._handle(kind, item)
        except Exception as exc:  # noqa: BLE001 - never raise into training; count and log
            # Drop the traceback first: its frames hold HDF5 objects of the failed file, and
            # releasing those after the file is closed crashes HDF5 (measured: SIGSEGV on a
            # full disk). Without it they are released here, while the file is still open.
            exc.__traceback__ = None
            failure = exc
        if failure is not None:
            self._fail(failure)

    def _fail(self, exc: BaseException) -> None:
        """A failure while writing a step drops that step (its .partial is removed, earlier
        steps are untouched) and is reported once, with the file and the free space."""
        from .session import one_line
        self.errors += 1
        if isinstance(exc, OSError) and exc.errno and isinstance(exc.strerror, str) \
                and exc.strerror.startswith(os.strerror(exc.errno)):
            self.last_error = exc.strerror          # our own room check: already one line
        else:
            self.last_error = f"{type(exc).__name__}: {one_line(exc, 300)}"
        step, self._open = self._open, None
        if step is None:
            log.warning("precdbg: writing to %s failed (%s)", self.dump_path, self.last_error)
            return
        self._dropped_open = True
        step.abandon()
        log.warning("precdbg: step %s rank %s dropped: writing %s failed (%s; %s free on its "
                    "disk); training continues", step.attrs.get("step"), step.attrs.get("rank"),
                    step.final_path, self.last_error, _free_space(step.final_path))

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "flush":
            item.set()
            return
        if kind == "open":
            if self._open is not None:       # an unclosed step: close it before the next one
                self._finish([], [], {"interrupted": True})
            path, attrs = item
            self._dropped_open = True        # until the file exists: its batches go nowhere
            self._open = _OpenStep(path, attrs, self.compression)
            self._dropped_open = False
            return
        if kind == "abandon":
            step, self._open = self._open, None
            if step is not None:
                step.abandon()
            return
        step = self._open
        if step is None:
            if not self._dropped_open:
                log.debug("precdbg: %s with no step open: ignored", kind)
            return
        if kind == "batch":
            records, payloads = item
            for payload in payloads:
                flat = np.ascontiguousarray(payload.array).reshape(-1).view(np.uint8)
                if payload.checksum:
                    import xxhash
                    step.checksums[payload.tensor_id] = xxhash.xxh3_64_hexdigest(flat)
                if payload.store:
                    step.add_bytes(payload.tensor_id, flat)
                    self.progress += 1
            step.records.extend(records)
        elif kind == "close":
            self._finish(*item)

    def _finish(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
                attrs: Dict[str, Any]) -> None:
        step = self._open
        if step is None:
            return
        started = time.perf_counter()
        path = step.finish(modules, stacks, attrs)     # on failure, _fail drops the step
        self._open = None
        self.written.append(path)
        log.debug("precdbg: wrote %s (%d records) in %.3fs", path, len(step.records),
                  time.perf_counter() - started)


def _file_size_limit() -> Optional[int]:
    try:
        import resource
    except ImportError:      # not POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def _free_space(path: str) -> str:
    folder = os.path.dirname(path)
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    try:
        return _size(shutil.disk_usage(folder or ".").free)
    except OSError:
        return "unknown"
