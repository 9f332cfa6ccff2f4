"""One capture window, from `start()` to `stop()`: what the adapter's hooks record into.

The session makes a `CaptureWindow` at every `start()` that captures and drops it at `stop()`;
the adapter holds it as its recorder while installed (precdbg.capture.contract.Recorder). It
names and selects calls through its `WindowCalls`, turns framework tensors into records (the
tensor questions go to the adapter's `TensorOps`), and hands full batches to the session, which
writes them. Statistics stay on the device until a batch is resolved, once per batch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Hashable, List, Optional, Sequence, Tuple

from ..config.dump_config import DumpConfig
from ..errors import ConfigError
from ..records.call import Call
from ..records.naming import uninitialized_output
from ..records.schema import Direction, Phase, Record, RecordKind, Role, Task, scalar_dtype
from ..records.arguments import tensor_results
from .batch import TensorBatch
from .call_stacks import StackTable
from .calls import ModuleRow, WindowCalls
from .contract import TensorOps
from .filters import CaptureFilter
from .step_state import StepState

if TYPE_CHECKING:
    from .session import Session

__all__ = ["CaptureWindow"]

_API, _MODULE = RecordKind.API, RecordKind.MODULE
_INPUT, _OUTPUT = Role.INPUT, Role.OUTPUT
_FORWARD = Direction.FORWARD


class CaptureWindow:
    """The records of one capture window of step `current_step` (see the module's text)."""

    def __init__(self, session: "Session", step: StepState, model: Any,
                 stacks: StackTable) -> None:
        config: DumpConfig = session.config
        self._session = session
        self.config = config
        self.filter: CaptureFilter = session.filter
        self.tensors: TensorOps = session.tensors
        self.current_step = step.number
        self.model = model                   # what start() was given (None: no model)
        self.step = step
        self.stacks = stacks
        calls = self.calls = WindowCalls(step, self.filter, stacks, session.adapter.framework,
                                         config.stack, config.task is Task.TENSOR)
        # the calls' own methods, as the window's (no call in between on the hot path)
        self.begin_api = calls.begin_api
        self.begin_module = calls.begin_module
        self.param_call = calls.param_call
        self.replay_begins = calls.replay_begins
        self.enter_module = calls.enter_module
        self.exit_module = calls.exit_module
        self.set_module_tree = calls.set_module_tree
        self.batch = TensorBatch(self.tensors, config.checksums)
        self.first_seq = step.seq            # records made before this window
        self.failures = 0                    # failures inside precdbg in this window
        self.first_batch_parts: List[Tuple[Record, Any]] = []
        self.optimizers: List[Dict[str, Any]] = []   # as each stepped first in this window
        self._every_record = self.filter.keeps_every_record()
        self._checksum = config.checksums
        self._run = session.run

    # ------------------------------------------------------------------ calls
    # begin_api, begin_module, param_call, replay_begins, enter_module, exit_module and
    # set_module_tree are the `WindowCalls` helper's methods, bound in __init__.
    @property
    def owning_module(self) -> str:
        """The innermost module whose forward runs ("" for none)."""
        return self.calls.owning_module

    @property
    def phase(self) -> Phase:
        """The phase new calls are recorded in (the adapter sets `optimizer` and back)."""
        return self.calls.phase

    @phase.setter
    def phase(self, phase: Phase) -> None:
        self.calls.phase = phase

    @property
    def modules(self) -> List[ModuleRow]:
        return self.calls.modules

    # ------------------------------------------------------------------ records
    def capture(self, call: Call, direction: Direction, role: Role, arg_index: int,
                arg_key: str, tensor: Any, trainable: bool = False,
                written: bool = False) -> None:
        """Record one framework tensor of a call. `written`: the call wrote the tensor in place
        without the framework counting a new version (a collective): nothing earlier about
        these bytes still holds."""
        if not self._every_record and not self.filter.keep_record(direction, role):
            return
        tensor = self.tensors.local(tensor)
        batch = self.batch
        step = self.step
        values = not (role == _OUTPUT and call.kind == _API
                      and uninitialized_output(call.api, arg_index))
        (dtype, shape, numel, where), seen = batch.distinct(tensor, written, values,
                                                            step.provenance.epochs)
        seq = step.seq = step.seq + 1
        rec = Record(call, direction, role, arg_index, arg_key, seq, dtype, shape, numel,
                     seen.tensor_id)
        if trainable:
            rec.trainable = True
        step.provenance.note(rec, tensor, written, seen, where)
        rec.precision = step.precisions.of(call, rec, seen)      # knows its producer now
        batch.add(rec, seen)
        if not self._run.first_batch_done and call.kind == _MODULE and call.module == "" \
                and role == _INPUT and direction == _FORWARD:
            self._first_batch_input(rec, tensor)
        if (call.store or self._checksum) and not seen.copied and seen.has_values:
            batch.copy(seen, tensor, call.store)

    def _first_batch_input(self, rec: Record, tensor: Any) -> None:
        """A copy of the model's input for run.json's first batch, where the tensor has bytes
        to copy (not a tensor inside functorch's vmap, nor a wrapper without memory)."""
        try:
            self.first_batch_parts.append((rec, self.tensors.to_host(tensor)))
        except ValueError:
            pass

    def capture_value(self, call: Call, arg_index: int, arg_key: str, value: Any,
                      role: Role = _INPUT) -> None:
        """Record a non-tensor argument (a number, bool, string, dtype) of a forward call;
        `arg_index` continues after the call's tensor inputs."""
        if not self.filter.keep_record(_FORWARD, role):
            return
        step = self.step
        seq = step.seq = step.seq + 1
        rec = Record(call, _FORWARD, role, arg_index, arg_key, seq, scalar_dtype(value), (), 1,
                     -1)
        if isinstance(value, (bool, int, float)):
            number = float(value)
            rec.min = rec.max = rec.mean = rec.pos_mean = number
            rec.norm = abs(number)
            rec.nan_count = int(number != number)
            rec.inf_count = int(number in (float("inf"), float("-inf")))
        rec.text = repr(value) if not isinstance(value, str) else str(value)
        self.batch.add(rec, None)

    def save(self, name: str, obj: Any) -> None:
        """Store a tensor or nested list/tuple/dict of tensors (and numbers) under `name`;
        compare aligns saved items by name."""
        if not isinstance(name, str) or not name or any(c in name for c in "/\\"):
            raise ConfigError(f"save(): name must be a non-empty string without slashes, got "
                              f"{name!r}")
        call = self.calls.save_call(name)
        found = tensor_results(obj, self._session.adapter.is_tensor)
        for ordinal, key, tensor in found:
            self.capture(call, _FORWARD, _OUTPUT, ordinal, key, tensor)
        if not found and isinstance(obj, (bool, int, float, str)):
            self.capture_value(call, 0, "0", obj, role=_OUTPUT)
        self.end_call()

    def end_call(self, launch: bool = True) -> None:
        """Called after a call's records are captured: the batch crosses to the host when full
        (precdbg.capture.batch: host statistics stream, device statistics wait for stop()).
        `launch`: launch the statistics kernels queued so far (False: tensors that nothing
        changes before a later end_call, like the parameters of the inventory, share
        launches)."""
        if launch:
            self.tensors.launch_queued()
        if self.batch.full():
            self.flush_batch()

    def flush_batch(self) -> None:
        """One host sync: statistics (and host copies) of the pending batch, then to the
        session's writer."""
        if self.batch.empty():
            return
        records, payloads = self.batch.take()
        self._session.submit(records, payloads)

    def release(self) -> None:
        """The window is over: what its batch still holds is let go, and the model (the
        adapter may keep its recorder past stop(): the model must not live on in it)."""
        self.batch.release()
        self.model = None

    # ------------------------------------------------------------------ dataflow
    def wrote(self, tensor: Any) -> None:
        """A captured call just wrote `tensor` in place (before its outputs are captured): any
        tensor over the same memory holds new values, whatever its own version counter says."""
        self.step.provenance.wrote(tensor)
        self.batch.forget_objects()

    def grad_produced(self, path: str, tensor: Any, hold: bool = False) -> None:
        """`tensor` holds parameter `path`'s gradient after backward (`.grad`, `main_grad`);
        `hold` keeps it (not its copy) until the step ends, see Provenance.grad_of."""
        self.step.provenance.grad_of(path, self.tensors.local(tensor), hold)

    def alias_of(self, original: Any, copy: Any) -> None:
        """`copy` holds `original`'s values, made by the framework outside any captured call."""
        self.step.provenance.alias(original, copy)

    # ------------------------------------------------------------------ the debugger's
    def hook_failed(self, exc: BaseException, where: str) -> None:
        """A failure inside precdbg (a hook, statistics): counted, said once per kind;
        training goes on."""
        self._session.hook_failed(exc, where)

    def say_once(self, key: Hashable, message: str, *args: Any) -> bool:
        """Say `message % args` once per debugger (precdbg.capture.notices)."""
        return self._session.notices.once(key, message, *args)

    def api_calls_missed_in_thread(self, where: str, thread: str, start_thread: str) -> None:
        """A captured module ran in a thread whose framework API calls the adapter cannot see
        (its capture is per thread, and start() ran in another): said once per debugger, as
        the step's module records are there and its API records are not."""
        self.say_once("other thread", "precdbg: step %d: %s ran in thread %r, not in %r where "
                      "start() was called: its module calls are recorded, the API calls of "
                      "that thread are not (call start() and stop() in the thread that trains)",
                      self.current_step, where, thread, start_thread)

    def note_optimizer(self, info: Dict[str, Any]) -> None:
        """An optimizer stepping in this window (class, param groups with hyperparameters and
        the names of their parameters), described at its first step here: the values this step
        used (a scheduler changes the lr between steps). Kept with the step (its file's
        `optimizers`) and in the run manifest (run.json, rewritten at stop() when something is
        new: the last window's values)."""
        self._run.note("optimizers", info)
        self.optimizers = [seen for seen in self.optimizers if seen.get("id") != info.get("id")]
        self.optimizers.append(info)

    def note_manifest(self, section: str, info: Dict[str, Any]) -> None:
        self._run.note(section, info)
