"""Background HDF5 writer: one thread owns every file; a byte-bounded queue feeds it.

One file per step per rank, `<dump>/step<S>/rank<R>.h5`, written as `.partial` and renamed once it
is complete and fsynced, so a crash loses at most the step being written. The training thread only
enqueues; a full queue blocks it (data is never dropped). Errors in the thread are logged and
counted, never raised into training.


The layout of a step file is `precdbg.storage.step_file`'s.
"""
from __future__ import annotations

import collections
import logging
import errno
import os
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from . import process_exit
from .dump_folder import CLAIMED
from .rank_lock import lock_rank
from ..records.schema import SCHEMA_VERSION, Record
from .layout import partial_path, rank_files, step_file_path
from .step_file import OpenStep, Payload, free_space

__all__ = ["DumpWriter", "Payload"]

log = logging.getLogger("precdbg")

# step files any debugger of this process has opened: two debuggers capturing into one folder
# at once (their windows overlapping) each get a part of their own, never the same file (whose
# `.partial` exists only once the writer thread first writes to it)
_TAKEN: Set[str] = set()
_TAKEN_LOCK = threading.Lock()


_WRITER_NICE = 10
_IDLE_POLL_SECONDS = 0.5      # an idle thread notices retire() this often


class DumpWriter:
    """One background thread writing step files; the queue is bounded in bytes and blocks.

    The thread starts with the first item and ends when told to (`shutdown`, or `retire` once
    the debugger that owned it is gone) and everything queued is written. While it runs, the
    process-wide shutdown hook (`process_exit`) holds it and drains it before the interpreter tears
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
        self._open: Optional[OpenStep] = None
        self._dropped_open = False        # the open step failed: ignore it until the next open
        self._stopping = False            # shutdown(): write everything, then end the thread
        self._retired = False             # the owner is gone: end the thread once idle
        self.progress = 0                 # grows with every item and blob written
        self.errors = 0
        self.last_error = ""
        self.written: List[str] = []
        self.closed_steps = 0             # steps whose end is queued (or written inline)
        self._parts: Dict[Tuple[int, int], int] = {}

    # -- producer side (training thread) ----------------------------------------------------
    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _ensure_thread(self) -> bool:
        """Start the thread if needed; False when it cannot run (interpreter shutting down)."""
        if self._thread_alive():
            return True
        if process_exit.shutting_down():
            return False
        self._stopping = self._retired = False
        process_exit.track_writer(self)             # the shutdown hook now drains this writer
        self._thread = threading.Thread(target=self._run, name="precdbg-writer", daemon=True)
        self._thread.start()
        return True

    def _put(self, kind: str, item: Any, nbytes: int = 0) -> None:
        with process_exit.no_park(), self._cond:    # never parked holding the writer's lock
            if not self._ensure_thread():
                # after the shutdown hook (a user's own atexit handler): write inline
                self.closed_steps += kind == "close"
                self._handle_guarded(kind, item)
                return
            while self._pending_bytes and self._pending_bytes + nbytes > self.queue_bytes:
                self._cond.wait(0.5)
                if not self._thread_alive():
                    break
            self._pending_bytes += nbytes
            self._items.append((kind, item, nbytes))
            if kind == "close":
                self.closed_steps += 1      # handed over (stop() tells by this count)
            self._cond.notify_all()

    def existing_files(self, rank: int) -> List[str]:
        """Step files of this rank in the dump folder that no debugger of this process wrote
        (an earlier run's, or another job's writing into the same folder)."""
        if os.path.abspath(self.dump_path) in CLAIMED:
            return []
        return rank_files(self.dump_path, rank)

    def claim(self, rank: int) -> Optional[str]:
        """This process writes rank `rank` into the dump folder (its other debuggers may add
        steps): None, or what refuses it. A lock held until the process ends keeps a second job
        of this machine writing the same rank into the same folder at the same time out (two
        runs started together, before either wrote a file to be seen); the ranks of one job
        lock files of their own. The lock files live in the temporary folder, named by the
        dump folder's path, so the dump holds only run.json and its steps."""
        folder = os.path.abspath(self.dump_path)
        refused = lock_rank(folder, rank)
        if refused is not None:
            return refused
        CLAIMED.add(folder)
        return None

    def open_step(self, step: int, rank: int, attrs: Dict[str, Any]) -> None:
        """Queue a new step file; a second capture window in the same step gets `.partN`, and
        so does a step another debugger of this process wrote already."""
        part = self._parts.get((step, rank), 0)
        with _TAKEN_LOCK:
            while os.path.abspath(step_file_path(self.dump_path, step, rank, part)) in _TAKEN \
                    or any(os.path.exists(path) for path in (
                        step_file_path(self.dump_path, step, rank, part),
                        partial_path(step_file_path(self.dump_path, step, rank, part)))):
                part += 1
            _TAKEN.add(os.path.abspath(step_file_path(self.dump_path, step, rank, part)))
        self._parts[(step, rank)] = part + 1
        attrs = dict(attrs, step=step, rank=rank, part=part, schema_version=SCHEMA_VERSION)
        self._put("open", (step_file_path(self.dump_path, step, rank, part), attrs))

    def submit(self, records: List[Record], payloads: List[Payload]) -> None:
        nbytes = sum(p.array.nbytes for p in payloads)
        self._put("batch", (records, payloads), nbytes)

    def close_step(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
                   attrs: Optional[Dict[str, Any]] = None,
                   written: Optional[Callable[[str], None]] = None) -> None:
        """Queue the end of the open step; `written(path)` runs on the writer's thread once
        the file is renamed from `.partial` and fsynced (not when the step is dropped)."""
        process_exit.step_queued()          # a SIGTERM from now on waits for this step
        try:
            self._put("close", (list(modules), list(stacks), dict(attrs or {}), written))
        except BaseException:           # (a Ctrl-C while the queue was full): never queued
            process_exit.step_finished()
            raise

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
        finished = process_exit.wait_while_progressing(thread.is_alive, lambda: self.progress,
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
        leftover: Optional[OpenStep] = None
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
                    process_exit.wrote_something()
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
        process_exit.untrack_writer(self)
        self._cond.notify_all()

    def _handle_guarded(self, kind: str, item: Any) -> None:
        failure: Optional[BaseException] = None
        try:
            try:
                self._handle(kind, item)
            except Exception as exc:  # noqa: BLE001 - never raise into training; count, log
                # Drop the traceback first: its frames hold HDF5 objects of the failed file,
                # and releasing those after the file is closed crashes HDF5 (measured: SIGSEGV
                # on a full disk). Without it they are released here, while the file is open.
                exc.__traceback__ = None
                failure = exc
            if failure is not None:
                self._fail(failure)
        finally:
            if kind == "close":
                process_exit.step_finished()    # written, or dropped: done with either way

    def _fail(self, exc: BaseException) -> None:
        """A failure while writing a step drops that step (its .partial is removed, earlier
        steps are untouched) and is reported once, with the file and the free space."""
        from ..errors import one_line
        self.errors += 1
        if isinstance(exc, OSError) and exc.errno and isinstance(exc.strerror, str) \
                and exc.strerror.startswith(os.strerror(exc.errno)):
            self.last_error = exc.strerror          # our own room check: already one line
        elif isinstance(exc, OSError) and exc.errno and isinstance(exc.strerror, str):
            # HDF5's own (h5py: "Unable to create file (file write failed: time = ..., buf =
            # 0x..., ...)"): the system's reason and HDF5's first words
            self.last_error = f"{os.strerror(exc.errno)}: {exc.strerror.split(' (')[0]}"
        else:
            self.last_error = f"{type(exc).__name__}: {one_line(exc, 300)}"
        step, self._open = self._open, None
        if step is None:
            log.warning("precdbg: writing to %s failed (%s)", self.dump_path, self.last_error)
            return
        self._dropped_open = True
        step.abandon()
        room = ""          # the free space, where a lack of it may be why
        if not isinstance(exc, OSError) or exc.errno in (None, 0, errno.ENOSPC, errno.EDQUOT,
                                                         errno.EFBIG):
            room = f"; {free_space(step.final_path)} free on its disk once the unfinished " \
                   "file was removed"
        log.warning("precdbg: step %s rank %s dropped: writing %s failed (%s%s); training "
                    "continues", step.attrs.get("step"), step.attrs.get("rank"),
                    step.final_path, self.last_error, room)

    def _handle(self, kind: str, item: Any) -> None:
        if kind == "flush":
            item.set()
            return
        if kind == "open":
            if self._open is not None:       # an unclosed step: close it before the next one
                self._finish([], [], {"interrupted": True})
            path, attrs = item
            self._dropped_open = True        # until the file exists: its batches go nowhere
            self._open = OpenStep(path, attrs, self.compression)
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
                if payload.ready is not None:
                    payload.ready()          # a device copy: this thread waits, not training
                flat = np.ascontiguousarray(payload.array).reshape(-1).view(np.uint8)
                if payload.checksum:
                    import xxhash
                    step.checksums[payload.tensor_id] = xxhash.xxh3_64_hexdigest(flat)
                if payload.store:
                    step.add_bytes(payload.tensor_id, flat)
                    self.progress += 1
                    process_exit.wrote_something()
            step.records.extend(records)
        elif kind == "close":
            self._finish(*item)

    def _finish(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
                attrs: Dict[str, Any], written: Optional[Callable[[str], None]] = None) -> None:
        step = self._open
        if step is None:
            return
        started = time.perf_counter()
        path = step.finish(modules, stacks, attrs)     # on failure, _fail drops the step
        self._open = None
        self.written.append(path)
        if written is not None:             # renamed and fsynced: now it may be said
            try:
                written(path)
            except Exception:  # noqa: BLE001 - the step is written whatever its line does
                log.debug("precdbg: announcing %s failed", path, exc_info=True)
        log.debug("precdbg: wrote %s (%d records) in %.3fs", path, len(step.records),
                  time.perf_counter() - started)
