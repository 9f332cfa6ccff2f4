"""What happens to precdbg when the process ends, however it ends.

Users write the guides' four lines and never call `close()`; the debugger is often a local of
`main()` that is garbage-collected long before the interpreter exits. So nothing here depends on
the user keeping a reference:

- every writer with a running thread is held (strongly) in `_writers` until its thread ends;
- every session is known (weakly) in `_sessions`;
- the first writer thread installs one shutdown hook with `threading._register_atexit`, which
  CPython runs in `threading._shutdown()` — after the main module has finished (normally, by
  `sys.exit`, an uncaught exception or KeyboardInterrupt) and *before* non-daemon threads are
  joined, `atexit` handlers run and modules are torn down. The hook stops every session still
  capturing (its step is written, marked interrupted), then drains every writer and joins its
  thread while the interpreter, h5py and the frameworks are all still intact.

The writer threads are daemons so that a disk that stops answering can never keep the process
alive; the hook waits for them as long as they make progress and gives up only after
`_STALL_SECONDS` without any. `os._exit(n)` (distributed scripts call it to skip a teardown that
may hang) runs no shutdown hook: while a writer thread runs, `os._exit` is wrapped so that it
drains the writers first, then exits with `n`; the wrapper is removed once no writer runs.
SIGTERM (a scheduler's first word, `timeout`, torchrun ending the other ranks) stops training at
once and waits for the stopped steps being written (`_termguard`, a handler in C and a watcher
thread that needs no GIL): the main thread is parked at its next bytecode boundary (no user code
runs on), the writers finish every step handed to them, and the process ends by SIGTERM's
default action, with the same status as without precdbg. A second SIGTERM, or
`_SIGTERM_STALL_SECONDS` without any progress of the writers, ends it at once. The main thread
is never parked inside precdbg's own code that holds a lock the writer needs (`no_park`), nor
while a stop() hands its step to a writer (`handing_over`: the step counts as handed over before
it stops counting as captured, and a SIGTERM meanwhile waits for it). SIGKILL ends the process
without anything running: every step already renamed from `.partial` was fsynced first, and the
reader never takes a `.partial` for a step.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Optional, Set

from .rank_lock import release_all
from .step_file import disown_after_fork

try:
    from . import _termguard
except ImportError:                 # built without a C compiler: SIGTERM acts at once
    _termguard = None  # type: ignore[assignment]

__all__ = ["track_writer", "untrack_writer", "track_session", "shutting_down",
           "drain_at_exit", "step_queued", "step_finished", "wrote_something", "capturing",
           "no_park", "handing_over"]

log = logging.getLogger("precdbg")

_STALL_SECONDS = 60.0           # give up on a writer that wrote nothing for this long
_SIGTERM_STALL_SECONDS = 30.0   # after SIGTERM: a scheduler's usual grace before its SIGKILL

_lock = threading.Lock()
_writers: Set[Any] = set()
_sessions: "weakref.WeakSet[Any]" = weakref.WeakSet()
_installed = False
_shutting_down = False


def shutting_down() -> bool:
    """True once the interpreter's shutdown has begun (no new writer threads then)."""
    return _shutting_down


def _install() -> None:
    """Register the shutdown hook once, on first use (importing precdbg registers nothing)."""
    global _installed
    if _installed:
        return
    _installed = True
    register: Callable[[Callable[[], None]], None] = getattr(threading, "_register_atexit",
                                                             atexit.register)
    try:
        register(drain_at_exit)
    except RuntimeError:            # already shutting down: atexit still runs before teardown
        atexit.register(drain_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_after_fork)


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) has none of its parent's threads: drain nothing,
    and never write the parent's step files (precdbg.storage.step_file.disown_after_fork)."""
    global _lock
    disown_after_fork()
    _lock = threading.Lock()
    _writers.clear()
    _unwrap_exit()
    for session in list(_sessions):
        session.forked = True
        session.collector.end()      # the child's objects are its own to collect
    _sessions.clear()


_real_exit: Callable[[int], Any] = os._exit
_exit_owner = 0                   # the process whose writers the os._exit wrapper drains


def _exit_after_drain(code: int) -> None:
    """`os._exit` while precdbg's writers run: the stopped steps are written first."""
    if os.getpid() == _exit_owner and _writers:
        drain_at_exit()
        release_all()                # no exit handler runs: the rank locks' files go here
    _real_exit(code)


# What the SIGTERM watcher counts (C atomics, read without the GIL). Without the extension,
# no-ops: SIGTERM then ends the process at once, as its default action does.
def step_queued() -> None:
    """A stopped step was handed to a writer."""
    if _termguard is not None:
        _termguard.note_queued()


def step_finished() -> None:
    """A writer is done with a stopped step (written, or dropped on a failure)."""
    if _termguard is not None:
        _termguard.note_finished()


def capturing(delta: int, step: int = -1) -> None:
    """A capture window of `step` opened (+1) or closed (-1): a SIGTERM inside one says that
    step is not written (training is parked inside it, so nothing can stop the capture)."""
    note = getattr(_termguard, "note_capturing", None)   # None: not built, or built before it
    if note is not None:
        note(delta, step)


def wrote_something() -> None:
    """A writer made progress (a deferred SIGTERM waits only while it does)."""
    if _termguard is not None:
        _termguard.note_progress()


class _Section:
    """`with`: a section of precdbg's own code in which a SIGTERM does not park the main
    thread; a park asked for inside happens where the outermost section ends."""
    __slots__ = ("_note",)

    def __init__(self, note: Optional[Callable[[int], None]]) -> None:
        self._note = note

    def __enter__(self) -> None:
        if self._note is not None:
            self._note(1)

    def __exit__(self, *exc: Any) -> None:
        if self._note is not None:
            self._note(-1)          # may park the main thread here, for good


_NO_PARK = _Section(getattr(_termguard, "hold", None))   # None: not built, or built before it
_HANDING_OVER = _Section(getattr(_termguard, "hand_over", None))


def no_park() -> _Section:
    """Main-thread code that holds a lock the writer needs (the writer's queue): a SIGTERM
    parks the main thread only once it is out."""
    return _NO_PARK


def handing_over() -> _Section:
    """A stop() handing its step to a writer: a SIGTERM meanwhile waits until the step is
    handed over, then for that step too (and parks the main thread once it is out)."""
    return _HANDING_OVER


def _guard_sigterm() -> None:
    """Defer SIGTERM while stopped steps are written, where SIGTERM has its default action
    (a handler of the user's, a framework's or a scheduler wrapper's is left alone)."""
    if _termguard is not None:
        try:
            if hasattr(_termguard, "hold"):
                _termguard.install(_SIGTERM_STALL_SECONDS, threading.main_thread().ident or 0)
            else:                   # built before parking: defers, does not park
                _termguard.install(_SIGTERM_STALL_SECONDS)
        except Exception:  # noqa: BLE001 - without the guard SIGTERM acts at once, as before
            pass


def _end_if_terminated() -> None:
    """A SIGTERM deferred while the writers finished: end by it now that they have."""
    if _termguard is not None and _termguard.deferred():
        _termguard.end_by_sigterm()


def _wrap_exit() -> None:
    global _exit_owner
    if os._exit is not _exit_after_drain:
        _exit_owner = os.getpid()
        os._exit = _exit_after_drain


def _unwrap_exit() -> None:
    if os._exit is _exit_after_drain:
        os._exit = _real_exit


def track_writer(writer: Any) -> None:
    with _lock:
        _install()
        _writers.add(writer)
        _wrap_exit()
    _guard_sigterm()


def untrack_writer(writer: Any) -> None:
    with _lock:
        _writers.discard(writer)
        if not _writers:
            _unwrap_exit()


def track_session(session: Any) -> None:
    with _lock:
        _sessions.add(session)


def drain_at_exit() -> None:
    """Stop what is still capturing, then write out everything queued. Never raises."""
    global _shutting_down
    _shutting_down = True
    try:
        with handing_over():        # a SIGTERM now waits for these steps too
            for session in list(_sessions):
                try:
                    session.stop_at_exit()
                except BaseException as exc:  # noqa: BLE001 - never break the exit
                    log.warning("precdbg: stopping the capture at exit failed (%s: %s)",
                                type(exc).__name__, exc)
        with _lock:
            writers = list(_writers)
        for writer in writers:
            try:
                writer.shutdown(stall_seconds=_STALL_SECONDS)
            except KeyboardInterrupt:
                log.warning("precdbg: interrupted while writing %s; what was not written yet "
                            "is lost (finished steps are complete)", writer.dump_path)
                return
            except BaseException as exc:  # noqa: BLE001
                log.warning("precdbg: finishing the writer of %s failed (%s: %s)",
                            writer.dump_path, type(exc).__name__, exc)
        _end_if_terminated()
    except BaseException:  # noqa: BLE001 - e.g. a second Ctrl-C: exit as Python would
        pass


def wait_while_progressing(alive: Callable[[], bool], progress: Callable[[], int],
                           join: Callable[[float], None], stall_seconds: float) -> bool:
    """Join a thread for as long as it keeps making progress; False if it stalled."""
    last, last_change = progress(), time.monotonic()
    while alive():
        join(0.2)
        now = progress()
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > stall_seconds:
            return False
    return True
