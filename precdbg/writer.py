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
  stacks/text     de-duplicated call stacks (records hold stack_id)
"""
from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .schema import MAX_NDIM, RECORD_COLUMNS, SCHEMA_VERSION, Record

__all__ = ["DumpWriter", "Payload", "step_file_path", "write_json_atomic"]

log = logging.getLogger("precdbg")

_STAGE_BYTES = 32 << 20      # stored tensors are packed into contiguous blobs of about this size
_CHUNK_BYTES = 1 << 20
_WRITER_NICE = 10


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
        os.makedirs(os.path.dirname(final_path), exist_ok=True)
        self.file = h5py.File(self.partial_path, "w", libver="latest")
        for key, value in attrs.items():
            self.file.attrs[key] = value if not isinstance(value, (dict, list)) else json.dumps(value)
        self.compression = compression
        self.records: List[Record] = []
        self.data = None
        self.data_size = 0
        self.stage: List[np.ndarray] = []
        self.stage_bytes = 0
        self.stage_start = 0
        self.offsets: Dict[int, Tuple[int, int]] = {}
        self.checksums: Dict[int, str] = {}
        self.failed = False

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
    def finish(self, modules: Sequence[Tuple[str, str, str]], stacks: Sequence[str]) -> str:
        import h5py
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
        for i, column in enumerate(("path", "cls", "parent")):
            mod.create_dataset(column, data=np.array([m[i] for m in modules], dtype=object),
                               dtype=str_dt)
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

    def abandon(self) -> None:
        try:
            self.file.close()
        except Exception:  # noqa: BLE001 - already failing; keep the .partial for inspection
            pass


class DumpWriter:
    """One background thread writing step files; the queue is bounded in bytes and blocks."""

    def __init__(self, dump_path: str, queue_bytes: int = 256 << 20,
                 compression: Optional[str] = None) -> None:
        # Import h5py here, on the caller's thread, before the debugger registers its atexit
        # close: exit handlers run last-registered first, so ours then runs before h5py's.
        import h5py  # noqa: F401
        self.dump_path = dump_path
        self.queue_bytes = int(queue_bytes)
        self.compression = compression
        self._items: Deque[Tuple[str, Any]] = collections.deque()
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._open: Optional[_OpenStep] = None
        self._idle = True
        self.errors = 0
        self.last_error = ""
        self.written: List[str] = []
        self._parts: Dict[Tuple[int, int], int] = {}

    # -- producer side (training thread) ----------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="precdbg-writer", daemon=True)
            self._thread.start()

    def _put(self, kind: str, item: Any, nbytes: int = 0) -> None:
        with self._cond:
            self._ensure_thread()
            while self._pending_bytes and self._pending_bytes + nbytes > self.queue_bytes:
                self._cond.wait(0.5)
                if self._thread is None or not self._thread.is_alive():
                    break
            self._pending_bytes += nbytes
            self._items.append((kind, (item, nbytes)))
            self._idle = False
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

    def close_step(self, modules: Sequence[Tuple[str, str, str]], stacks: Sequence[str]) -> None:
        self._put("close", (list(modules), list(stacks)))

    def abandon_step(self) -> None:
        """Drop the step being written (a start() that failed): no file is left behind."""
        self._put("abandon", None)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._put("flush", done)
        return done.wait(timeout)

    # -- consumer side (writer thread) --------------------------------------------------------
    def _run(self) -> None:
        # Below the training threads: on a saturated host a busy writer competing at equal
        # priority stalls every parallel region of the step (measured: tensor task on 2 cores).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICE)
        except (AttributeError, OSError):   # not Linux, or not permitted: equal priority
            pass
        while True:
            with self._cond:
                while not self._items:
                    self._idle = True
                    self._cond.wait()
                kind, (item, nbytes) = self._items.popleft()
            try:
                self._handle(kind, item)
            except Exception as exc:  # noqa: BLE001 - never raise into training; count and log
                self._fail(exc)
            finally:
                with self._cond:
                    self._pending_bytes -= nbytes
                    self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        where = self._open.partial_path if self._open is not None else self.dump_path
        log.error("precdbg: writing %s failed: %s", where, self.last_error)
        if self._open is not None:
            self._open.failed = True

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "flush":
            item.set()
            return
        if kind == "open":
            if self._open is not None:       # an unclosed step: close it before the next one
                self._finish([], [])
            path, attrs = item
            self._open = _OpenStep(path, attrs, self.compression)
            return
        if kind == "abandon":
            step, self._open = self._open, None
            if step is not None:
                step.abandon()
                try:
                    os.remove(step.partial_path)
                except OSError:
                    pass
            return
        step = self._open
        if step is None or step.failed:
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
            step.records.extend(records)
        elif kind == "close":
            self._finish(*item)

    def _finish(self, modules: Sequence[Tuple[str, str, str]], stacks: Sequence[str]) -> None:
        step, self._open = self._open, None
        if step is None:
            return
        if step.failed:
            step.abandon()
            return
        started = time.perf_counter()
        try:
            path = step.finish(modules, stacks)
        except Exception:
            step.abandon()
            raise
        self.written.append(path)
        log.debug("precdbg: wrote %s (%d records) in %.3fs", path, len(step.records),
                  time.perf_counter() - started)
