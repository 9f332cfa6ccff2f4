"""The start/stop/step lifecycle and the one place records are made.

A `Session` owns the writer, the filters and every per-step counter; an `Adapter` (PyTorch,
MindSpore) owns the framework hooks and only translates: it calls `begin_call`/`capture`/
`end_call` with framework tensors, and answers the few tensor questions the core cannot
(`describe`, `identity`, `summarize`/`resolve` for device statistics, `to_host`/`hand_over`).
Statistics stay on the device until `resolve` is called once per batch of records.
"""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple


from . import __version__, lifetime
from .collector import CollectorPause
from .config import DumpConfig
from .errors import ConfigError
from .failures import FailureLog, one_line
from .filters import CaptureFilter
from .layers import settings_text
from .precision import PrecisionTracker
from .runinfo import RunInfo
from .selection import StepSelection
from .protocols import Adapter, TensorOps
from .provenance import Provenance
from .replay import ReplayTable
from .stacks import StackTable
from .arguments import tensor_results
from .batch import TensorBatch
from .call import Call
from .naming import (api_entry, canonical_op, module_entry, param_alias, param_entry,
                     save_entry, torch_param_leaf, uninitialized_output)
from .schema import (NO_PRODUCER, Direction, Phase, Record, RecordKind, Role, Task,
                     scalar_dtype)
from .writer import DumpWriter

__all__ = ["Adapter", "TensorOps", "Call", "Session", "one_line"]

log = logging.getLogger("precdbg")

_API, _MODULE = RecordKind.API.value, RecordKind.MODULE.value
_INPUT, _OUTPUT, _FORWARD = Role.INPUT.value, Role.OUTPUT.value, Direction.FORWARD.value
_BACKWARD, _SETUP, _NONE = Phase.BACKWARD.value, Phase.SETUP.value, Direction.NONE.value
_NAN = float("nan")


class Session:
    """Lifecycle, selection, naming and batching; framework-neutral."""

    def __init__(self, config: DumpConfig, adapter: Adapter) -> None:
        self.config = config
        self.adapter = adapter
        self.tensors = adapter.tensors
        self.filter = CaptureFilter(config)
        self._every_record = self.filter.keeps_every_record()
        self.writer = DumpWriter(config.dump_path, config.queue_mb << 20, config.compression)
        self.current_step = 0
        self.selection = StepSelection(config)
        self._told_no_model = False
        self.active = False
        self.phase = Phase.FORWARD.value
        self._failures = FailureLog()
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
        lifetime.track_session(self)

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
        """Why this run wrote nothing (start() ran only on steps the config leaves out)."""
        return self.selection.nothing_dumped_notice(self.run.written)

    def start(self, model: Any = None) -> bool:
        """Begin capturing if this step and rank are selected; repeat calls are no-ops."""
        if self.active:
            return True
        if model is None and self.config.keeps_modules:
            self._without_model()
        self.rank, self.world_size = self.adapter.rank_and_world()
        if not self.selection.selects(self.current_step, self.rank):
            return False
        self._reset_window()
        if not self.run.written:
            self._check_dump_path()
            earlier = self.writer.existing_files(self.rank)
            if earlier:
                raise ConfigError(f"dump_path: {self.config.dump_path} already holds a dump of "
                                  f"rank {self.rank} ({earlier[0]}); choose an empty folder")
            self.run.write(self.adapter, self.rank, self.world_size)
        self.writer.open_step(self.current_step, self.rank, {
            "framework": self.adapter.framework, "task": self.config.task.value,
            "level": self.config.level.value, "world_size": self.world_size,
            "precdbg_version": __version__})
        self.phase = Phase.FORWARD.value
        self.active = True
        self.collector.begin()
        try:
            self.adapter.install(self, model)
        except Exception:
            self.active = False
            self.collector.end()
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
        if not self._told_no_model:
            self._told_no_model = True
            log.warning("precdbg: level 'mix' and start() without a model: API calls are "
                        "recorded; module calls, parameter gradients and parameters are not "
                        "(call debugger.start(model) for them)")

    def _check_dump_path(self) -> None:
        """One clear error at the first start() when the dump folder cannot be written."""
        path = self.config.dump_path
        try:
            os.makedirs(path, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".precdbg-probe-", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as exc:
            raise ConfigError(f"dump_path: {path} is not a writable folder "
                              f"({exc.strerror or exc})") from None

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
        if self._calls_seen == 0 and (self.config.keeps_apis or self.config.keeps_modules):
            log.warning("precdbg: step %d: no API or module call ran between start() and stop(); "
                        "%s", self.current_step, getattr(self.adapter, "empty_capture_hint",
                                                         "nothing was captured"))
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
    def hook_failed(self, exc: BaseException, where: str) -> None:
        """Count a failure inside precdbg (a hook, statistics, start/stop/step); training goes
        on (precdbg.failures: each distinct one reported once, in one line)."""
        self._failures.add(exc, where, self.current_step)

    @property
    def failures(self) -> int:
        return self._failures.count

    # ------------------------------------------------------------------ modules
    def set_module_tree(self, modules: Sequence[Tuple[str, str, str, Dict[str, Any]]]) -> None:
        """(path, class, parent path, raw layer settings) of every module/cell of the model; the
        settings are stored normalised (precdbg.layers), as JSON text per module."""
        framework = self.adapter.framework
        self._modules = [(path, cls, parent, settings_text(framework, cls, raw) if raw else "")
                         for path, cls, parent, raw in modules]
        self._module_cls = {path: cls for path, cls, _, _ in self._modules}

    def enter_module(self, path: str, keep_subtree: bool) -> None:
        inside = bool(self._module_stack) and self._module_stack[-1][1]
        self._module_stack.append((path, keep_subtree or inside))

    def exit_module(self) -> None:
        if self._module_stack:
            self._module_stack.pop()

    @property
    def owning_module(self) -> str:
        return self._module_stack[-1][0] if self._module_stack else ""

    @property
    def inside_kept_module(self) -> bool:
        return bool(self._module_stack) and self._module_stack[-1][1]

    # ------------------------------------------------------------------ calls
    def _count(self, key: Tuple[str, str]) -> int:
        self._calls_seen += 1
        n = self._counts.get(key, 0)
        self._counts[key] = n + 1
        return n

    def begin_api(self, prefix: str, api: str, watched: bool = True,
                  replay: bool = False, replayable: bool = True) -> Optional[Call]:
        """An API call starts; returns the Call to record into, or None when not captured.
        `watched`: its backward is watched now (gradients were enabled). `replay`: the call
        re-runs an earlier forward call (activation recompute): see `precdbg.replay`.
        `replayable`: a call not watched may be re-run by a later replay (it runs in an
        activation checkpoint's forward; False for other calls without gradients, such as an
        evaluation forward, which a replay must not stand for; True where not known)."""
        module = self.owning_module
        if replay:       # outside every module of the replay: the module it replays
            if not watched:      # no backward to give (a checkpoint's forward in a replay):
                return None      # the call stays for the replay that has one
            return self._replays.replayed(("api", module or self._replays.owner, prefix, api))
        index = self._count((prefix, api))
        forward = api_entry(prefix, api, index, "forward")
        call = None
        if self.filter.keep_entry(forward, api, module, self.phase, self.inside_kept_module,
                                  is_module=False):
            self._order += 1
            call = Call(_API, prefix, api, canonical_op(api), module, index,
                        self._order, self.phase, self._stack_id(), self._stores(forward, api),
                        forward)
        if not watched and replayable:
            self._replays.not_watched(("api", module, prefix, api), call)
        return call

    def begin_module(self, prefix: str, path: str, cls: str, watched: bool = True,
                     replay: bool = False, replayable: bool = True
                     ) -> Tuple[Optional[Call], bool]:
        """A module call starts: (Call or None, whether the module selects its whole subtree).
        `watched`, `replay` and `replayable` as for `begin_api`."""
        if replay:
            self._replays.module_replayed(path, not self._module_stack)
            return (self._replays.replayed(("module", prefix, path, cls)) if watched else None,
                    self.filter.module_selects_subtree(module_entry(prefix, path, cls, "forward",
                                                                    0), cls, path))
        index = self._count((prefix, path))
        forward = module_entry(prefix, path, cls, "forward", index)
        subtree = self.filter.module_selects_subtree(forward, cls, path)
        keep = self.filter.keep_entry(forward, cls, path, self.phase,
                                      self.inside_kept_module or subtree, is_module=True)
        call = None
        if keep:
            self._order += 1
            call = Call(_MODULE, prefix, cls, canonical_op(cls), path, index,
                        self._order, self.phase, self._stack_id(), self._stores(forward, cls),
                        forward)
        if not watched and replayable:
            self._replays.not_watched(("module", prefix, path, cls), call)
        return call, subtree

    def replay_begins(self, owner: Optional[str] = None) -> None:
        """A recompute starts replaying; `owner`: the module it replays (None when not known,
        "" for the root)."""
        self._replays.begins(owner)

    def param_call(self, path: str, kind: str = RecordKind.PARAM_GRAD.value, owner_cls: str = "",
                   role: str = Role.PARAM.value) -> Optional[Call]:
        """A parameter's gradient (each backward pass counts) or inventory entry. Its op is the
        parameter's PyTorch-style leaf name (`weight`, `bias`, ...) in every framework, and
        its alias is its full name in the other framework's convention."""
        if not self.filter.keep_param(path):
            return None
        grad = kind == RecordKind.PARAM_GRAD.value
        index = self._count(("Param", path)) if grad else 0
        owner, _, leaf = path.rpartition(".")
        framework = self.adapter.framework
        entry = param_entry(path, Role.PARAM_GRAD.value if grad else role, index)
        call = Call(kind, "Param", path, torch_param_leaf(framework, leaf), owner, index, 0,
                    self.phase, -1, self._store_all, entry, entry)
        call.alias = param_alias(framework, path, owner_cls or self._module_cls.get(owner, ""))
        return call

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

    def _stores(self, entry: str, api: str) -> bool:
        return self._store_all or self.filter.stores_tensor(entry, api)

    def end_call(self, launch: bool = True) -> None:
        """Called after a call's records are captured: the batch crosses to the host when full
        (precdbg.batch: host statistics stream, device statistics wait for stop()). `launch`:
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
        dtype, shape, numel, keys, where = self.tensors.facts(tensor)
        if numel == 0:
            keys = None          # no elements, no unique address: every empty tensor is its own
        elif self.provenance.epochs and keys is not None and where is not None:
            epoch = self.provenance.epochs.get(where[0])
            if epoch:            # written in place through another object: a state of its own
                keys = ((keys[0], epoch), (keys[1], epoch))
        batch = self._batch
        values = not (role == _OUTPUT and call.kind == _API
                      and uninitialized_output(call.api, arg_index))
        seen = batch.seen_tensor(tensor, written, keys, values,
                                 where[0] if where is not None else None)
        if entry is None:
            entry = call.forward_entry if direction == "forward" else call.backward_entry
        self._seq += 1
        # every field positionally, in Record's order (~0.3 us less than keywords, per record)
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
            records, self._overflow_kept = self.filter.overflow_only(records,
                                                                      self._overflow_kept)
            ids = {r.tensor_id for r in records}
            payloads = [p for p in payloads if p.tensor_id in ids]
        if records or payloads:
            self.writer.submit(records, payloads)

    def _stack_id(self) -> int:
        return self._stacks.current(3) if self.config.stack else -1
