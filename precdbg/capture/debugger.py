"""The user-facing debugger object, shared by every adapter: an ordinary object and a context
manager around one `Session`. `start/stop/step` are safe to repeat and never raise into training
except for invalid arguments (a `PrecdbgError` with a one-line reason).

`close()` is optional: every stopped step is written however the process ends, and whether or
not the user keeps a reference to the debugger (see `precdbg.storage.process_exit`)."""
from __future__ import annotations

import contextlib
import logging
import os
import weakref
from typing import Any, Callable, Iterator, Optional

from ..config.dump_config import DumpConfig, load_config
from ..errors import PrecdbgError
from .session import Adapter, Session
from .uncaught import say_in_one_line

__all__ = ["BaseDebugger"]

log = logging.getLogger("precdbg")


class BaseDebugger:
    """`PrecisionDebugger(config_path=None, model=None, **settings)`; settings override the
    file. `model` (msprobe's constructor argument): what `start()` without a model hooks."""

    def __init__(self, config_path: Optional[str], adapter_factory: Callable[[], Adapter],
                 model: Any = None, **settings: Any) -> None:
        try:
            self.config: DumpConfig = load_config(config_path, **settings)
            # where the script was when it made the debugger, whatever it changes to later
            self.config.dump_path = os.path.abspath(self.config.dump_path)
            self._model = _reference(model)
            self._session = Session(self.config, adapter_factory())
        except PrecdbgError as exc:     # uncaught: one line, not a traceback (uncaught.py)
            say_in_one_line(exc)
            raise
        self._closed = False
        # Garbage-collected (a local of main() that returned): the writer finishes what is
        # queued and its thread ends; a capture still running is stopped at exit.
        finalizer = weakref.finalize(self, self._session.writer.retire)
        finalizer.atexit = False
        # At garbage collection or exit: one line when start() never ran on a configured step
        weakref.finalize(self, _say_if_nothing_dumped, self._session)

    # -- the four lines ----------------------------------------------------------------------
    def start(self, model: Any = None) -> bool:
        """Start capturing (no-op on steps/ranks not selected). Returns whether it captures.
        Without `model`, the model given to the constructor, if any."""
        self._closed = False
        if model is None and self._model is not None:
            model = self._model()
        try:
            return self._session.start(model)
        except PrecdbgError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop training
            self._session.hook_failed(exc, "start()")
            return False

    def stop(self) -> None:
        try:
            self._session.stop()
        except Exception as exc:  # noqa: BLE001
            self._session.hook_failed(exc, "stop()")

    def step(self) -> None:
        try:
            self._session.step()
        except Exception as exc:  # noqa: BLE001
            self._session.hook_failed(exc, "step()")

    def save(self, name: str, obj: Any) -> bool:
        """Store a tensor, or a nested list/tuple/dict of tensors, under `name` in the current
        step (a batch after augmentation, a loss, an intermediate the hooks cannot see).
        Returns whether it was stored (only between start() and stop() of a dumped step)."""
        try:
            return bool(self._session.adapter.quietly(self._session.save, name, obj))
        except PrecdbgError:
            raise
        except Exception as exc:  # noqa: BLE001 - never raise into training
            self._session.hook_failed(exc, f"save({name!r})")
            return False

    @contextlib.contextmanager
    def capture(self, model: Any = None) -> Iterator["BaseDebugger"]:
        """`with debugger.capture(model): ...` is start(model) ... stop()."""
        self.start(model)
        try:
            yield self
        finally:
            self.stop()

    # -- lifetime ------------------------------------------------------------------------------
    def close(self, timeout: Optional[float] = 120.0) -> bool:
        """Stop, then wait until every step file is written and end the writer thread.
        Optional (the same happens at exit); safe to repeat; a later start() works again."""
        if self._closed and not self._session.active:
            return True
        self._closed = True
        try:
            return self._session.close(timeout)
        except Exception as exc:  # noqa: BLE001
            self._session.hook_failed(exc, "close()")
            return False

    def flush(self, timeout: Optional[float] = 120.0) -> bool:
        """Wait until everything captured so far is on disk."""
        return self._session.writer.flush(timeout)

    def __enter__(self) -> "BaseDebugger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- state -------------------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        return self._session.current_step

    @property
    def capturing(self) -> bool:
        return self._session.active

    @property
    def failures(self) -> int:
        """Hook and writer failures so far (each logged; none raised into training)."""
        return self._session.failures + self._session.writer.errors

    @property
    def dump_path(self) -> str:
        return self.config.dump_path


def _reference(model: Any) -> Optional[Callable[[], Any]]:
    """The constructor's model, held weakly where it can be (the debugger must not keep a
    model the script has dropped, and its device memory, alive)."""
    if model is None:
        return None
    try:
        return weakref.ref(model)
    except TypeError:
        return lambda: model


def _say_if_nothing_dumped(session: Session) -> None:
    try:
        notice = session.nothing_dumped_notice()
    except Exception:  # noqa: BLE001 - a notice must never fail the exit
        return
    if notice:
        log.warning(notice)
