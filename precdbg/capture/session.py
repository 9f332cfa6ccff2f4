"""The start/stop/step lifecycle and the one place records are made.

A `Session` owns the writer, the filters and every per-step counter; an `Adapter` (PyTorch,
MindSpore) owns the framework hooks and only translates: it calls `begin_api`/`begin_module`
(precdbg.capture.call_naming), `capture` and `end_call` with framework tensors, and answers the few
tensor questions the core cannot (precdbg.capture.contract.TensorOps). Statistics stay on the device
until `resolve` is called once per batch of records.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from ..version import __version__
from ..storage import process_exit
from .gc_pause import CollectorPause
from ..config.dump_config import DumpConfig
from ..errors import ConfigError
from ..errors import one_line
from .failures import FailureLog
from .notices import Notices
from .filters import CaptureFilter
from ..records.precision import PrecisionTracker
from .run_file import RunInfo
from .step_selection import StepSelection
from .contract import Adapter, TensorOps
from .provenance import Provenance
from .recompute import ReplayTable
from .call_stacks import StackTable
from .arguments import tensor_results
from .batch import TensorBatch
from .call import Call
from .call_naming import CallNaming
from ..records.naming import save_entry, uninitialized_output
from ..records.schema import (NO_PRODUCER, Direction, Phase, Record, RecordKind, Role, Task,
                     scalar_dtype)
from ..storage.dump_folder import count_step, refuse_dump_folder, steps_counted
from ..storage.writer import DumpWriter

__all__ = ["Adapter", "TensorOps", "Call", "Session", "one_line"]

log = logging.getLogger("precdbg")

_API, _MODULE = RecordKind.API.value, RecordKind.MODULE.value
_INPUT, _OUTPUT, _FORWARD = Role.INPUT.value, Role.OUTPUT.value, Direction.FORWARD.value
_BACKWARD, _SETUP, _NONE = Phase.BACKWARD.value, Phase.SETUP.value, Direction.NONE.value
_NAN = float("nan")


class Session(CallNaming):
    """Lifecycle, records and batching; framework-neutral (calls are named and selected by
    `CallNaming`)."""

    def __init__(self, config: DumpConfig, adapter: Adapter) -> None:
        self.config = config
        self.adapter = adapter
        self.tensors = adapter.tensors
        self.filter = CaptureFilter(config)
        self._every_record = self.filter.keeps_every_record()
        refuse_dump_folder(config.dump_path)     # here, before training runs
        self.writer = DumpWriter(config.dump_path, config.queue_mb << 20, config.compression)
        self.current_step = steps_counted(config.dump_path)
        self.selection = StepSelection(config)
        self.notices = Notices()
        self._window_model: Any = None   # the model the window being captured was given
        self.active = False
        self.phase = Phase.FORWARD.value
        self._failures = FailureLog(self.notices)
        self.forked = False
        self.rank = 0
        self.world_size = 1
        self.run = RunInfo(config, adapter.framework)
        self._first_batch_parts: List[Tuple[Record, Any]] = []
        self._store_all = config.task is Task.TENSOR
        self._checksum = config.checksums
        self._overflow = config.task is Task.OVERFLOW
        self._overflow_kept = 0
        self.provenance = Provenance(adapter.tensors)
        self.collector = CollectorPause()
        self._stacks = StackTable(adapter.internal_dirs)
        self._reset_step_counters()
        self._reset_window()
        process_exit.track_session(self)

    # ------------------------------------------------------------------ lifecycle
    def _reset_step_counters(self) -> None:
        self._order = 0
        self._seq = 0
        self._counts: Dict[Tuple[str, str], int] = {}
        # forward calls not watched for backward, which a recompute may replay
        self._replays: ReplayTable[Call] = ReplayTable()
        self._precisions = PrecisionTracker()     # carried precision, per step
        self.provenance.reset()
        self.filter.reset_step()

    def _reset_window(self) -> None:
        previous = getattr(self, "_batch", None)
        if previous is not None:
            previous.release()
        self._batch = TensorBatch(self.tensors, self._checksum)
        self._stacks.new_window()
        self._modules: List[Tuple[str, str, str, str]] = []
        self._module_cls: Dict[str, str] = {}
        self._calls_seen = 0
        self._module_stack: List[Tuple[str, bool]] = []
        self._failures.new_window()

    def nothing_dumped_notice(self) -> Optional[str]:
        """Why this run wrote nothing (start() ran only on steps the config leaves out); None
        when the dump folder was refused (that was said when it happened)."""
        if self.run.refused:
            return None
        return self.selection.nothing_dumped_notice(self.run.written)

    def start(self, model: Any = None) -> bool:
        """Begin capturing if this step and rank are selected; repeat calls are no-ops."""
        if self.active:
            if model is not None and model is not self._window_model:
                if self._window_model is None:
                    self.notices.once("late model", "precdbg: start(model) while step %d is "
                                      "already being captured without a model: the model's "
                                      "modules are not hooked in this step (call start(model) "
                                      "first)", self.current_step)
                else:
                    self.notices.once("late model", "precdbg: start(model) with another model "
                                      "while step %d is already being captured: its modules "
                                      "are not hooked in this step (give every model to the "
                                      "first start: start([model_a, model_b]))",
                                      self.current_step)
            return True
        self.adapter.check_model(model)       # before run.json: a corrected rerun may follow
        self._window_model = model
        if model is None and self.config.keeps_modules:
            self._without_model()
        self.rank, self.world_size = self.adapter.rank_and_world()
        if not self.selection.selects(self.current_step, self.rank, self.world_size):
            return False
        self._reset_window()
        if not self.run.ready(self.writer, self.adapter, self.rank, self.world_size,
                              self.current_step):
            return False
        self.writer.open_step(self.current_step, self.rank, {
            "framework": self.adapter.framework, "task": self.config.task.value,
            "level": self.config.level.value, "world_size": self.world_size,
            "precdbg_version": __version__})
        self.phase = Phase.FORWARD.value
        self.active = True
        process_exit.capturing(+1)
        self._window_seq = self._seq
        self.collector.begin()
        try:
            self.adapter.install(self, model)
        except Exception:
            self.active = False
            self.collector.end()
            process_exit.capturing(-1)
            self.adapter.uninstall()
            self.writer.abandon_step()
            self._reset_window()
            raise
        return True

    def _without_model(self) -> None:
        """No model: level module would record nothing (an error), mix API calls only."""
        if not self.config.keeps_apis:
            raise ConfigError("level: 'module' records the calls of a model's modules, and "
                              "start() was given no model: call debugger.start(model)")
        self.notices.once("no model", "precdbg: level 'mix' and start() without a model: API "
                          "calls are recorded; module calls, parameter gradients and parameters "
                          "are not (call debugger.start(model) for them)")

    def api_calls_missed_in_thread(self, where: str, thread: str, start_thread: str) -> None:
        """A captured module ran in a thread whose framework API calls the adapter cannot see
        (its capture is per thread, and start() ran in another): said once per debugger, as
        the step's module records are there and its API records are not."""
        self.notices.once("other thread", "precdbg: step %d: %s ran in thread %r, not in %r "
                          "where start() was called: its module calls are recorded, the API "
                          "calls of that thread are not (call start() and stop() in the thread "
                          "that trains)", self.current_step, where, thread, start_thread)

    def stop_at_exit(self) -> None:
        """The interpreter is exiting while this session still captures (no stop() ran: an
        exception, sys.exit or Ctrl-C in the step): write what was captured, marked interrupted."""
        if not self.active or self.forked:
            return
        log.warning("precdbg: step %d was still being captured when the process ended (stop() "
                    "did not run); what was captured is written, marked interrupted",
                    self.current_step)
        self.stop(interrupted=True)

    def stop(self, interrupted: bool = False) -> None:
        """Remove every hook, flush statistics, close the step file; repeat calls are no-ops."""
        if not self.active:
            return
        self.active = False
        process_exit.capturing(-1)
        self._window_model = None            # not kept alive past its window
        if self._calls_seen == 0 and not interrupted and (self.config.keeps_apis
                                                          or self.config.keeps_modules):
            log.warning("precdbg: step %d: no API or module call ran between start() and stop(); "
                        "%s", self.current_step, getattr(self.adapter, "empty_capture_hint",
                                                         "nothing was captured"))
        elif self._seq == self._window_seq and not self.notices.said("kept nothing"):
            why = self.filter.kept_nothing(path for path, _, _, _ in self._modules)
            if why:
                self.notices.once("kept nothing", "precdbg: step %d recorded nothing: %s",
                                  self.current_step, why)
        # each stage on its own: a failing one is reported and the rest still run, so hooks
        # are gone, the step file is closed and the counters move on whatever fails
        self._guarded(self.adapter.uninstall, "stop(): removing hooks")
        self._guarded(self.flush_batch, "stop(): flushing statistics")
        self._guarded(lambda: self.writer.close_step(
            self._modules, self._stacks.texts,
            {"interrupted": interrupted, "failures": self._failures.window}),
            "stop(): closing the step file")
        self._guarded(self._note_first_batch, "stop(): recording the first batch")
        self._reset_window()
        self.collector.end()
        if self.run.dirty:
            self._guarded(lambda: self.run.write(self.adapter, self.rank, self.world_size),
                          "stop(): updating run.json")
        else:           # deleted during this step: its file needs run.json as much
            self._guarded(lambda: self.run.ready(self.writer, self.adapter, self.rank,
                                                 self.world_size, self.current_step),
                          "stop(): writing run.json again")

    def _guarded(self, stage: Any, where: str) -> None:
        try:
            stage()
        except Exception as exc:  # noqa: BLE001 - never raise into training
            self.hook_failed(exc, where)

    def step(self) -> None:
        """End the current iteration: stop if capturing, then count the step."""
        try:
            self.stop()
        finally:
            self.current_step += 1
            count_step(self.config.dump_path, self.current_step)
            self._reset_step_counters()

    def close(self, timeout: Optional[float] = 120.0) -> bool:
        """Stop, write everything, end the writer thread (a later start() starts a new one)."""
        self.stop()
        return self.writer.flush(timeout) and self.writer.shutdown()

    def _note_first_batch(self) -> None:
        parts, self._first_batch_parts = self._first_batch_parts, []
        if self.run.first_batch_done or not parts:
            return
        arrays, ready = self.tensors.hand_over([handle for _, handle in parts])
        if ready is not None:
            ready()                          # once, at the end of the first dumped step
        self.run.first_batch(self.current_step, parts, arrays)

    def note_optimizer(self, info: Dict[str, Any]) -> None:
        """An optimizer seen in this run (class, param groups with hyperparameters and the
        names of their parameters); run.json is rewritten at stop() when something is new."""
        self.run.note("optimizers", info)

    def note_manifest(self, section: str, info: Dict[str, Any]) -> None:
        self.run.note(section, info)

    # ------------------------------------------------------------------ failures
    def say_once(self, key: Any, message: str, *args: Any) -> bool:
        """Say `message % args` once per debugger (precdbg.capture.notices)."""
        return self.notices.once(key, message, *args)

    def hook_failed(self, exc: BaseException, where: str) -> None:
        """Count a failure inside precdbg (a hook, statistics, start/stop/step); training goes
        on (precdbg.capture.failures: each distinct one reported once, in one line)."""
        self._failures.add(exc, where, self.current_step)

    @property
    def failures(self) -> int:
        return self._failures.count

    def save(self, name: str, obj: Any) -> bool:
        """Store a tensor or nested list/tuple/dict of tensors (and numbers) under `name` in the
        current step; compare aligns saved items by name. Only while capturing."""
        if not self.active:
            return False
        if not isinstance(name, str) or not name or any(c in name for c in "/\\"):
            raise ConfigError(f"save(): name must be a non-empty string without slashes, got "
                              f"{name!r}")
        index = self._count(("Save", name))
        self._order += 1
        entry = save_entry(name, index)
        call = Call(RecordKind.SAVED.value, "Save", name, name, self.owning_module, index,
                    self._order, self.phase, self._stack_id(), self._store_all, entry, entry)
        found = tensor_results(obj, self.adapter.is_tensor)
        for ordinal, key, tensor in found:
            self.capture(call, "forward", Role.OUTPUT.value, ordinal, key, tensor)
        if not found and isinstance(obj, (bool, int, float, str)):
            self.capture_value(call, 0, "0", obj, role=Role.OUTPUT.value)
        self.end_call()
        return True

    def end_call(self, launch: bool = True) -> None:
        """Called after a call's records are captured: the batch crosses to the host when full
        (precdbg.capture.batch: host statistics stream, device statistics wait for stop()). `launch`:
        launch the statistics kernels queued so far (False: tensors that nothing changes before
        a later end_call, like the parameters of the inventory, share launches)."""
        if launch:
            self.tensors.launch_queued()
        if self._batch.full():
            self.flush_batch()

    # ------------------------------------------------------------------ records
    def capture(self, call: Call, direction: str, role: str, arg_index: int, arg_key: str,
                tensor: Any, trainable: bool = False, entry: Optional[str] = None,
                written: bool = False) -> None:
        """Record one framework tensor of a call. `written`: the call wrote the tensor in place
        without the framework counting a new version (a collective): nothing earlier about
        these bytes still holds."""
        if not self._every_record and not self.filter.keep_record(direction, role):
            return
        tensor = self.tensors.local(tensor)
        batch = self._batch
        values = not (role == _OUTPUT and call.kind == _API
                      and uninitialized_output(call.api, arg_index))
        (dtype, shape, numel, where), seen = batch.distinct(tensor, written, values,
                                                            self.provenance.epochs)
        if entry is None:
            entry = call.forward_entry if direction == "forward" else call.backward_entry
        self._seq += 1
        # every field positionally, in Record's order (~0.3 us less than keywords)
        rec = Record(entry, call.kind, call.prefix, call.api, call.op, call.module, direction, role,
                     call.phase if direction != _BACKWARD else _BACKWARD, arg_index,
                     arg_key, call.call_index, call.order, self._seq, dtype, shape, numel,
                     _NAN, _NAN, _NAN, _NAN, 0, 0, "", "", call.alias, trainable, call.stack_id,
                     -1, 0, seen.tensor_id, NO_PRODUCER, -1, "")
        if direction == _NONE:
            rec.phase = _SETUP
        self.provenance.note(rec, tensor, written, seen, where)
        rec.precision = self._precisions.of(call, rec, seen)      # knows its producer now
        batch.add(rec, seen)
        if not self.run.first_batch_done and call.kind == _MODULE and call.module == "" \
                and role == _INPUT and direction == _FORWARD:
            self._first_batch_input(rec, tensor)
        if (call.store or self._checksum) and not seen.copied and seen.has_values:
            batch.copy(seen, tensor, call.store)

    def _first_batch_input(self, rec: Record, tensor: Any) -> None:
        """A copy of the model's input for run.json's first batch, where the tensor has bytes
        to copy (not a tensor inside functorch's vmap, nor a wrapper without memory)."""
        try:
            self._first_batch_parts.append((rec, self.tensors.to_host(tensor)))
        except ValueError:
            pass

    def wrote(self, tensor: Any) -> None:
        """A captured call just wrote `tensor` in place (before its outputs are captured): any
        tensor over the same memory holds new values, whatever its own version counter says."""
        self.provenance.wrote(tensor)
        self._batch.forget_objects()

    def grad_produced(self, path: str, tensor: Any, hold: bool = False) -> None:
        """`tensor` holds parameter `path`'s gradient after backward (`.grad`, `main_grad`);
        `hold` keeps it (not its copy) until the step ends, see Provenance.grad_of."""
        self.provenance.grad_of(path, self.tensors.local(tensor), hold)

    def alias_of(self, original: Any, copy: Any) -> None:
        """`copy` holds `original`'s values, made by the framework outside any captured call."""
        self.provenance.alias(original, copy)

    def capture_value(self, call: Call, arg_index: int, arg_key: str, value: Any,
                      role: str = Role.INPUT.value) -> None:
        """Record a non-tensor argument (a number, bool, string, dtype) of a forward call;
        `arg_index` continues after the call's tensor inputs."""
        if not self.filter.keep_record("forward", role):
            return
        self._seq += 1
        rec = Record(call.forward_entry, call.kind, call.prefix, call.api, call.op, call.module,
                     "forward", role, call.phase, arg_index, arg_key, call.call_index,
                     call.order, self._seq, scalar_dtype(value), (), 1,
                     stack_id=call.stack_id)
        if isinstance(value, (bool, int, float)):
            number = float(value)
            rec.min = rec.max = rec.mean = number
            rec.norm = abs(number)
            rec.nan_count = int(number != number)
            rec.inf_count = int(number in (float("inf"), float("-inf")))
        rec.text = repr(value) if not isinstance(value, str) else str(value)
        self._batch.add(rec, None)

    def flush_batch(self) -> None:
        """One host sync: statistics (and host copies) of the pending batch, then to the writer."""
        if self._batch.empty():
            return
        records, payloads = self._batch.take()
        if self._overflow:
            records, self._overflow_kept = self.filter.overflow_only(
                records, self._overflow_kept, self.current_step)
            ids = {r.tensor_id for r in records}
            payloads = [p for p in payloads if p.tensor_id in ids]
        if records or payloads:
            self.writer.submit(records, payloads)
