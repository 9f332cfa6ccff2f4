"""The debugger's lifetime: the start/stop/step lifecycle around objects of shorter lifetimes.

A `Session` lives as long as its debugger and owns what lasts that long: the configuration and
its filter, the adapter, the writer, run.json (`run_file.RunInfo`), the step selection, the
notices and failures, the call-stack cache and the step counter. It makes a fresh
`step_state.StepState` when a step begins (at construction and at every `step()`) and a fresh
`window.CaptureWindow` at every `start()` that captures; the adapter records into that window
until `stop()` drops it. Nothing here is reset by hand: a new lifetime is a new object.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional

from ..config.dump_config import DumpConfig
from ..errors import ConfigError
from ..records.schema import Record, Task
from ..storage import process_exit
from ..storage.dump_folder import count_step, refuse_dump_folder, steps_counted
from ..storage.earlier_run import move_earlier_run
from ..storage.json_files import jsonable
from ..storage.step_file import Payload
from ..storage.writer import DumpWriter
from ..version import __version__
from .call_stacks import StackCache
from .contract import Adapter
from .failures import FailureLog
from .filters import CaptureFilter
from .gc_pause import CollectorPause
from .notices import Notices
from .run_file import RunInfo
from .step_selection import StepSelection
from .step_state import StepState
from .window import CaptureWindow

__all__ = ["Session"]

log = logging.getLogger("precdbg")


class Session:
    """The lifecycle of one debugger (see the module's text)."""

    def __init__(self, config: DumpConfig, adapter: Adapter) -> None:
        self.config = config
        self.adapter = adapter
        self.tensors = adapter.tensors
        self.filter = CaptureFilter(config)
        refuse_dump_folder(config.dump_path)     # here, before training runs
        move_earlier_run(config.dump_path)       # a rerun: the earlier dump goes aside
        self.writer = DumpWriter(config.dump_path, config.queue_mb << 20, config.compression)
        self.current_step = steps_counted(config.dump_path)
        self.selection = StepSelection(config)
        self.notices = Notices()
        self._failures = FailureLog(self.notices)
        self.run = RunInfo(config, adapter.framework)
        self.collector = CollectorPause()
        self._stacks = StackCache(adapter.internal_dirs)
        self._overflow = config.task is Task.OVERFLOW
        self._overflow_kept = 0          # entries with non-finite outputs kept so far (the run)
        self.forked = False              # set in a forked child (process_exit)
        self.rank = 0
        self.world_size = 1
        self.step_state = StepState(self.current_step, self.tensors, self.filter)
        self.window: Optional[CaptureWindow] = None     # the capture window, while capturing
        process_exit.track_session(self)

    @property
    def active(self) -> bool:
        """Whether a capture window is open (between a capturing start() and its stop())."""
        return self.window is not None

    def nothing_dumped_notice(self) -> Optional[str]:
        """Why this run wrote nothing (start() ran only on steps the config leaves out); None
        when the dump folder was refused (that was said when it happened)."""
        if self.run.refused:
            return None
        return self.selection.nothing_dumped_notice(self.run.written)

    # ------------------------------------------------------------------ start
    def start(self, model: Any = None) -> bool:
        """Begin capturing if this step and rank are selected; repeat calls are no-ops."""
        window = self.window
        if window is not None:
            if model is not None and model is not window.model:
                self._late_model(window.model)
            return True
        self.adapter.check_model(model)       # before run.json: a corrected rerun may follow
        if model is None and self.config.keeps_modules:
            self._without_model()
        self.rank, self.world_size = self.adapter.rank_and_world()
        if not self.selection.selects(self.current_step, self.rank, self.world_size):
            return False
        with process_exit.no_park():     # a SIGTERM parks training once the window is open
            return self._open_window(model)

    def _open_window(self, model: Any) -> bool:
        if not self.run.ready(self.writer, self.adapter, self.rank, self.world_size,
                              self.current_step):
            return False
        self.writer.open_step(self.current_step, self.rank, {
            "framework": self.adapter.framework, "task": self.config.task.value,
            "level": self.config.level.value, "world_size": self.world_size,
            "precdbg_version": __version__})
        window = self.window = CaptureWindow(self, self.step_state, model, self._stacks.window())
        process_exit.capturing(+1, self.current_step)
        self.collector.begin()
        try:
            self.adapter.install(window, model)
        except Exception:
            self.window = None
            self.collector.end()
            process_exit.capturing(-1)
            self.adapter.uninstall()
            self.writer.abandon_step()
            window.release()
            raise
        return True

    def _late_model(self, window_model: Any) -> None:
        """start(model) while a window captures already: the model is not hooked."""
        if window_model is None:
            self.notices.once("late model", "precdbg: start(model) while step %d is already "
                              "being captured without a model: the model's modules are not "
                              "hooked in this step (call start(model) first)", self.current_step)
        else:
            self.notices.once("late model", "precdbg: start(model) with another model while "
                              "step %d is already being captured: its modules are not hooked "
                              "in this step (give every model to the first start: "
                              "start([model_a, model_b]))", self.current_step)

    def _without_model(self) -> None:
        """No model: level module would record nothing (an error), mix API calls only."""
        if not self.config.keeps_apis:
            raise ConfigError("level: 'module' records the calls of a model's modules, and "
                              "start() was given no model: call debugger.start(model)")
        self.notices.once("no model", "precdbg: level 'mix' and start() without a model: API "
                          "calls are recorded; module calls, parameter gradients and parameters "
                          "are not (call debugger.start(model) for them)")

    # ------------------------------------------------------------------ stop, step, close
    def stop_at_exit(self) -> None:
        """The interpreter is exiting while this session still captures (no stop() ran: an
        exception, sys.exit or Ctrl-C in the step): write what was captured, marked interrupted."""
        if self.window is None or self.forked:
            return
        step = self.current_step
        log.warning("precdbg: step %d was still being captured when the process ended (stop() "
                    "did not run); writing what was captured, marked interrupted", step)
        # said again only once the file is renamed and fsynced (a SIGKILL may come first)
        self.stop(interrupted=True, written=lambda path: log.warning(
            "precdbg: step %d (interrupted) is written: %s", step, path))

    def stop(self, interrupted: bool = False, written: Any = None) -> None:
        """Remove every hook, flush statistics, close the step file; repeat calls are no-ops.
        `written(path)` runs once the step file is renamed and fsynced."""
        if self.window is None:
            return
        # one hand-over: the step counts as handed to the writer before it stops counting as
        # captured, and a SIGTERM meanwhile waits for it (then stops training where it ends)
        with process_exit.handing_over():
            window, closed = self.window, self.writer.closed_steps
            self.window = None
            try:
                self._hand_over(window, interrupted, written)
            except BaseException:       # a Ctrl-C inside stop()
                if self.writer.closed_steps == closed:
                    self.window = window    # not handed over: the exit writes it, interrupted
                else:
                    process_exit.capturing(-1)
                raise
            process_exit.capturing(-1)  # only now: it counts as handed over already
            self._after_hand_over(window)

    def _hand_over(self, window: CaptureWindow, interrupted: bool, written: Any) -> None:
        if window.calls.calls_seen == 0 and not interrupted and (self.config.keeps_apis
                                                                 or self.config.keeps_modules):
            log.warning("precdbg: step %d: no API or module call ran between start() and "
                        "stop(); %s", self.current_step,
                        getattr(self.adapter, "empty_capture_hint", "nothing was captured"))
        elif self.step_state.seq == window.first_seq and not self.notices.said("kept nothing"):
            why = self.filter.kept_nothing(path for path, _, _, _ in window.modules)
            if why:
                self.notices.once("kept nothing", "precdbg: step %d recorded nothing: %s",
                                  self.current_step, why)
        # each stage on its own: a failing one is reported and the rest still run, so hooks
        # are gone, the step file is closed and the counters move on whatever fails
        self._guarded(window, self.adapter.uninstall, "stop(): removing hooks")
        self._guarded(window, window.flush_batch, "stop(): flushing statistics")
        self._guarded(window, lambda: self.writer.close_step(
            window.modules, window.stacks.texts,
            self._step_attributes(window, interrupted), written),
            "stop(): closing the step file")

    def _after_hand_over(self, window: CaptureWindow) -> None:
        self._guarded(window, lambda: self._note_first_batch(window.first_batch_parts),
                      "stop(): recording the first batch")
        window.release()
        self.collector.end()
        if self.run.dirty:
            self._guarded(window, lambda: self.run.write(self.adapter, self.rank,
                                                         self.world_size),
                          "stop(): updating run.json")
        else:           # deleted during this step: its file needs run.json as much
            self._guarded(window, lambda: self.run.ready(self.writer, self.adapter, self.rank,
                                                         self.world_size, self.current_step),
                          "stop(): writing run.json again")

    def _guarded(self, window: CaptureWindow, stage: Any, where: str) -> None:
        try:
            stage()
        except Exception as exc:  # noqa: BLE001 - never raise into training
            window.failures += 1
            self._failures.add(exc, where, self.current_step)

    def step(self) -> None:
        """End the current iteration: stop if capturing, then count the step (a new step
        state)."""
        try:
            self.stop()
        finally:
            self.current_step += 1
            count_step(self.config.dump_path, self.current_step)
            self.step_state = StepState(self.current_step, self.tensors, self.filter)

    def close(self, timeout: Optional[float] = 120.0) -> bool:
        """Stop, write everything, end the writer thread (a later start() starts a new one)."""
        self.stop()
        return self.writer.flush(timeout) and self.writer.shutdown()

    # ------------------------------------------------------------------ what windows hand over
    def submit(self, records: List[Record], payloads: List[Payload]) -> None:
        """A window's batch, its statistics resolved, to the writer (the overflow task keeps
        only what is not finite, counted over the run)."""
        if self._overflow:
            records, self._overflow_kept = self.filter.overflow_only(
                records, self._overflow_kept, self.current_step)
            ids = {r.tensor_id for r in records}
            payloads = [p for p in payloads if p.tensor_id in ids]
        if records or payloads:
            self.writer.submit(records, payloads)

    @staticmethod
    def _step_attributes(window: CaptureWindow, interrupted: bool) -> Dict[str, Any]:
        """What the step file says of its window besides its records: whether the process
        ended inside it, the failures inside precdbg, and the optimizers that stepped in it with
        the settings this step used (JSON; `Dump.optimizers` reads them)."""
        attrs: Dict[str, Any] = {"interrupted": interrupted, "failures": window.failures}
        if window.optimizers:
            attrs["optimizers"] = json.dumps(jsonable(window.optimizers), allow_nan=True)
        return attrs

    def _note_first_batch(self, parts: List[Any]) -> None:
        if self.run.first_batch_done or not parts:
            return
        arrays, ready = self.tensors.hand_over([handle for _, handle in parts])
        if ready is not None:
            ready()                          # once, at the end of the first dumped step
        self.run.first_batch(self.current_step, parts, arrays)

    def save(self, name: str, obj: Any) -> bool:
        """Store a tensor or nested list/tuple/dict of tensors (and numbers) under `name` in the
        current step; compare aligns saved items by name. Only while capturing."""
        window = self.window
        if window is None:
            return False
        window.save(name, obj)
        return True

    # ------------------------------------------------------------------ failures
    def hook_failed(self, exc: BaseException, where: str) -> None:
        """Count a failure inside precdbg (a hook, statistics, start/stop/step); training goes
        on (precdbg.capture.failures: each distinct one said once, in one line)."""
        if self.window is not None:
            self.window.failures += 1
        self._failures.add(exc, where, self.current_step)

    @property
    def failures(self) -> int:
        return self._failures.count
