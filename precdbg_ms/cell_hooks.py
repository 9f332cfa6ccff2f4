"""The hooks of the model's cells: a cell call's forward pre-hook and hook record its inputs and
outputs, and hand its floating inputs and outputs on through HookBackward (precdbg_ms.hook_backward),
whose hooks record the gradient the call sends to each input (dx) and the one arriving at each
output (dy), per call. MindSpore's own cell backward hook is not used: it copies what crosses the
cell, waits for the copies, and couples the cell's inputs into one gradient node (a constant
passed with an activation gets a gradient there).

`CellHooks` is a helper object of `precdbg_ms.adapter.MindSporeAdapter` (its `cells`): it holds
what one cell call's hooks hand each other, and reads the adapter's flags (`installed`, `paused`,
`busy`) and recorder through the adapter it is given.
"""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, List, Optional, Tuple

from mindspore import nn

from precdbg.capture import ClassPatch, Recorder
from precdbg.records import Direction, Role, framework_table

from .call_arguments import is_floating, tensor_inputs, tensor_outputs
from .cell_copies import wrap_cell_backward_hook
from .hook_backward import replace_arguments, replace_result, through_hook, top_level

if TYPE_CHECKING:          # typing only: the adapter imports this module
    from .adapter import MindSporeAdapter

_BACKWARD = Direction.BACKWARD
_FORWARD = Direction.FORWARD
_GRAD_INPUT = Role.GRAD_INPUT
_GRAD_OUTPUT = Role.GRAD_OUTPUT
_INPUT = Role.INPUT
_OUTPUT = Role.OUTPUT

__all__ = ["CellHooks"]

_NONE: FrozenSet[int] = frozenset()


class _CellCall:
    """One call of a hooked cell, from its forward pre-hook to its backward hooks."""
    __slots__ = ("call", "api_call", "input_ids", "inputs", "entered", "backward",
                 "identity", "replay_inputs", "constant_inputs", "constant_outputs")

    def __init__(self) -> None:
        self.call = self.api_call = None          # the cell's Call, its functional API's
        self.input_ids: set = set()               # its inputs' memory (identity cells)
        self.inputs: list = []     # what input_ids name, held until the forward hook
        self.entered = False                      # the module was entered
        self.backward = False                     # its backward is watched
        self.identity = False      # it returned an input: no backward of its own
        # a recompute's replay: what the cell computes from (inputs and parameters), and the
        # positions of its inputs and outputs the forward did not differentiate
        self.replay_inputs: Optional[list] = None
        self.constant_inputs = self.constant_outputs = _NONE


class _CellGrad:
    """The hook of one HookBackward of a cell call: records the gradient it receives."""
    __slots__ = ("adapter", "hooks", "slot", "role", "index", "key")

    def __init__(self, hooks: "CellHooks", slot: _CellCall, role: Role, index: int,
                 key: str) -> None:
        self.adapter, self.hooks = hooks.adapter, hooks
        self.slot, self.role, self.index, self.key = slot, role, index, key

    def __call__(self, grad: Any) -> None:
        adapter = self.adapter
        if adapter.installed and grad is not None:
            adapter.run_guarded(self.hooks._cell_grad, "backward hook of "
                                + (self.slot.call or self.slot.api_call).backward_entry,
                                self.slot, self.role, self.index, self.key, grad)


def _always_call(module_type: type) -> Dict[str, bool]:
    """The option of `register_forward_hook` that runs the hook when the forward raises, where
    this module class has it (MindSpore 2.8+ Cells; a torch shim's modules, as PyTorch's)."""
    try:
        params = inspect.signature(module_type.register_forward_hook).parameters
    except (TypeError, ValueError, AttributeError):
        return {}
    return {"always_call": True} if "always_call" in params else {}


# module class -> its always_call option: a constant of the class (filled once per class)
_ALWAYS_CALL: Dict[type, Dict[str, bool]] = {}


def _always_call_of(module: Any) -> Dict[str, bool]:
    found = _ALWAYS_CALL.get(type(module))
    if found is None:
        found = _ALWAYS_CALL[type(module)] = _always_call(type(module))
    return found


def keep_attributes(original: Any, passed_on: Any) -> Any:
    """`passed_on` (a new tensor object over `original`'s memory, handed to the model in its
    place) with the attributes a torch shim keeps on `original` (mindnlp 0.5.1's `_device`, in
    the instance's dict; mindnlp 0.6's device name, in MindSpore's own `init` slot, which a new
    tensor has as None): the model's `x.device` reads what it read without precdbg. Native
    tensors keep none (their `init`, an initializer or None, is not a name: left alone)."""
    own = getattr(original, "__dict__", None)
    if own:
        theirs = getattr(passed_on, "__dict__", None)
        if theirs is not None:
            for key, value in own.items():
                theirs.setdefault(key, value)
    device = getattr(original, "init", None)
    if isinstance(device, str) and getattr(passed_on, "init", device) is None:
        passed_on.init = device
    return passed_on


def _custom_bprop_forward_hook(cell: nn.Cell, hook: Callable[..., Any]) -> Optional[Any]:
    """`hook` as `register_forward_hook(hook, with_kwargs=True, **_always_call_of(cell))` would
    hold it, on a cell with its own `bprop`, for which MindSpore returns an empty handle although
    PyNative runs the hooks it holds (`Cell._run_construct`, 2.7 to 2.10); None where this
    MindSpore keeps forward hooks otherwise (the cell is then left unhooked).

    The hook is kept where `register_forward_hook` keeps it: `_forward_hook`, marked in
    `_forward_hook_with_kwargs` and, where MindSpore has it (not 2.7),
    `_forward_hook_always_called`; the handle removes it from each (2.7's `HookHandle` takes
    one extra dict, 2.10's a list)."""
    try:
        from mindspore.common.hook_handle import HookHandle
        hooks = cell._forward_hook
        extras = [cell._forward_hook_with_kwargs]
    except (ImportError, AttributeError):
        return None
    if _always_call_of(cell):     # always_call: the hook runs when the forward raises too
        extras.append(getattr(cell, "_forward_hook_always_called", None))
    if not all(isinstance(d, dict) for d in [hooks] + extras):
        return None
    try:
        handle = HookHandle(hooks, extra_dict=extras if len(extras) > 1 else extras[0])
    except TypeError:
        return None
    if getattr(handle, "handle_id", None) is None:
        return None
    hooks[handle.handle_id] = hook
    for extra in extras:
        extra[handle.handle_id] = True
    return handle


class CellHooks:
    """Forward and backward hooks of the model's cells, for one adapter (which owns this object
    as its `cells`): the adapter's `hook_module` hooks each cell through `hook`, and its
    parameters' gradient hooks read `param_users`."""
    __slots__ = ("adapter", "recorder", "leaf_cells", "calls", "param_users", "jitted",
                 "_copies", "_origin", "_replay", "_requires_grad", "_grad_state",
                 "_run_guarded", "_hold")

    def __init__(self, adapter: "MindSporeAdapter") -> None:
        self.adapter = adapter
        self.recorder: Optional[Recorder] = None    # the adapter's, from its `install` on
        # cell classes recorded as one functional API call too (nn.Dense: `dense`)
        self.leaf_cells: Dict[str, str] = {}
        # id(cell) -> its calls under way (a cell may call itself), innermost last
        self.calls: Dict[int, List[_CellCall]] = {}
        # id(parameter) -> the functional calls that read it since its last gradient (see the
        # adapter's parameter gradient hook)
        self.param_users: Dict[int, List[Tuple[Any, int, str]]] = {}
        self.jitted: List[str] = []       # cells whose construct is compiled (ms.jit)
        # the adapter's, fixed for its lifetime: bound once here, not looked up per call
        self._copies = adapter.copies
        self._origin = adapter.copies.origin
        self._replay = adapter.replay
        self._requires_grad = adapter.requires_grad
        self._grad_state = adapter.grad_state
        self._run_guarded = adapter.run_guarded
        self._hold = adapter.hold

    def prepare(self, session: Recorder) -> None:
        """The adapter is about to hook the model for a capture window (`session`, the
        adapter's recorder from now on): read the leaf cells' table."""
        self.recorder = session
        self.leaf_cells = dict(framework_table("mindspore").get("leaf_cells", {}))

    def clear(self) -> None:
        """Every hook is removed: forget the window's cell calls and compiled cells."""
        self.jitted = []
        self.calls.clear()
        self.param_users.clear()

    def hook(self, path: str, cell: nn.Cell) -> None:
        """Hook one cell of the model (`BaseInstrumentor.hook_module`), every handle held by
        the adapter."""
        cls = type(cell).__name__
        if any(path.startswith(p + ".") or not p for p in self.jitted):
            return       # inside a compiled cell: a hook there would be compiled into its graph
        if getattr(getattr(cell, "construct", None), "__wrapped_by_jit__", False):
            self.jitted.append(path)    # its call is seen, nothing inside it (said once)
        leaf_api = self.leaf_cells.get(cls) if type(cell).__module__.startswith("mindspore.") \
            else None
        key = id(cell)
        adapter, run_guarded = self.adapter, self._run_guarded
        cell_pre, cell_post = self._cell_pre, self._cell_post
        pre_where, post_where = f"forward pre-hook of {path or cls}", \
            f"forward hook of {path or cls}"

        def pre(c: Any, args: tuple, kwargs: dict) -> Any:
            if not adapter.installed or adapter.paused:
                return None
            hooked = run_guarded(cell_pre, pre_where, cell, path, cls, leaf_api, args, kwargs)
            if leaf_api:
                adapter.busy += 1       # the primitives inside a leaf cell are that one API
            return hooked               # (args, kwargs) through HookBackward, or None

        def post(c: Any, args: tuple, kwargs: dict, output: Any) -> Any:
            if not adapter.installed or adapter.paused:
                return None
            if leaf_api:
                adapter.busy = max(0, adapter.busy - 1)
            return run_guarded(cell_post, post_where, key, output)

        hold = self._hold
        if getattr(cell, "has_bprop", False):
            # a cell with its own bprop: MindSpore hands back an empty handle for its forward
            # hook (its forward would never end here); the ops of its bprop are its backward
            post_handle = _custom_bprop_forward_hook(cell, post)
            if post_handle is None:
                return
            hold(cell.register_forward_pre_hook(pre, with_kwargs=True))
            hold(post_handle)
            hold(ClassPatch(cell, "bprop", self._uncaptured_bprop))
        else:
            hold(cell.register_forward_pre_hook(pre, with_kwargs=True))
            # always_call (2.8+): the hook runs when the forward raises too (a step that stops
            # early is then seen to stop there); 2.7 has no such option
            hold(cell.register_forward_hook(post, with_kwargs=True, **_always_call_of(cell)))
        if self.recorder.filter.keeps_backward:
            # a backward hook of the user's copies what crosses the cell: linked to originals
            aliased = wrap_cell_backward_hook(cell, self._alias)
            if aliased is not None:
                hold(aliased)

    def _uncaptured_bprop(self, bprop: Callable[..., Any]) -> Callable[..., Any]:
        """A cell's own bprop, run with nothing in it captured: its ops compute the cell's
        backward (recorded as its dx and dy), as a PyTorch autograd Function's backward."""
        adapter = self.adapter

        def run(*args: Any) -> Any:
            adapter.busy += 1
            try:
                return bprop(*args)
            finally:
                adapter.busy = max(0, adapter.busy - 1)
        return run

    def _alias(self, original: Any, copy: Any) -> None:
        if self.adapter.installed:
            self._run_guarded(self._link_copy, "linking a cell's copy of a tensor", original,
                              copy)

    def _link_copy(self, original: Any, copy: Any) -> None:
        self._copies.link(original, copy)
        self.recorder.alias_of(original, copy)

    def _cell_pre(self, cell: nn.Cell, path: str, cls: str, leaf_api: Optional[str],
                  args: tuple, kwargs: dict) -> Optional[Tuple[tuple, dict]]:
        session = self.recorder
        # the module is entered and its slot pushed first, so the forward hook always finds
        # both (and leaves the module) even when capturing below fails
        slot = _CellCall()
        self.calls.setdefault(id(cell), []).append(slot)
        grad_on, replay = self._grad_state()
        call, subtree = session.begin_module("Cell" if isinstance(cell, nn.Cell) else "Module",
                                             path, cls, grad_on, replay)
        session.enter_module(path, subtree)
        slot.call, slot.entered = call, True
        api_call = (session.begin_api("Functional", leaf_api, grad_on, replay) if leaf_api
                    else None)
        slot.api_call = api_call
        # a call not captured, or a replay that stands for none (non-reentrant recompute: the
        # original call's hooks get the gradients), has no backward watched
        slot.backward = grad_on and (call is not None or api_call is not None)
        inputs = tensor_inputs(args, kwargs)
        origin = self._origin
        slot.input_ids = {origin(t) for _, _, t in inputs}
        root = self._copies.root
        slot.inputs = [root(t) for _, _, t in inputs]
        if replay:        # its forward is recorded already; what it computes may be constant
            params = cell.get_parameters() if isinstance(cell, nn.Cell) else cell.parameters()
            slot.replay_inputs = inputs + [(0, "", p) for p in params]
            slot.constant_inputs = self._replay.constant_positions(inputs)
            return self._hook_cell_inputs(slot, inputs, args, kwargs)
        if call is not None:
            for index, k, t in inputs:
                session.capture(call, _FORWARD, _INPUT, index, k, t)
        if api_call is not None:
            # the functional form takes the cell's parameters as arguments after its inputs
            # (F.linear(x, weight, bias)); their dw is this call's grad_input too
            for index, k, t in inputs:
                session.capture(api_call, _FORWARD, _INPUT, index, k, t)
            users = self.param_users
            for index, (name, param) in enumerate(cell.parameters_and_names(expand=False),
                                                  len(inputs)):
                key = name.rpartition(".")[2]
                session.capture(api_call, _FORWARD, _INPUT, index, key, param)
                users.setdefault(id(param), []).append((api_call, index, key))
        return self._hook_cell_inputs(slot, inputs, args, kwargs)

    def _hook_cell_inputs(self, slot: _CellCall, inputs: list, args: tuple, kwargs: dict
                          ) -> Optional[Tuple[tuple, dict]]:
        """The cell's floating inputs through HookBackward (its dx), each linked to the tensor
        it passes on; None when the cell's backward is not watched."""
        if not slot.backward or not self._requires_grad():
            return None
        replaced = self._through_hooks(slot, _GRAD_INPUT, inputs, slot.constant_inputs)
        return replace_arguments(args, kwargs, replaced) if replaced else None

    def _cell_post(self, key: int, output: Any) -> Any:
        """Capture the cell's outputs; with its backward watched, they leave through
        HookBackward (its dy) and the cell returns those (the output returned, or None)."""
        session = self.recorder
        stack = self.calls.get(key)
        if not stack:
            return None
        slot = stack[-1]
        try:
            outputs = tensor_outputs(output)
            # a cell returning its input (Dropout in eval or p=0) has no backward of its own
            origin = self._origin
            slot.identity = any(origin(t) in slot.input_ids for _, _, t in outputs)
            slot.inputs = []
            if slot.replay_inputs is not None:    # a replay's forward is recorded already
                self._replay.computed(slot.replay_inputs, outputs)
                slot.constant_outputs = self._replay.constant_positions(outputs)
                return self._hook_cell_outputs(slot, output, outputs)
            hooked = self._hook_cell_outputs(slot, output, outputs)
            if hooked is not None:
                outputs = tensor_outputs(hooked)
            for target in (slot.api_call, slot.call):
                if target is not None:
                    for index, k, t in outputs:
                        session.capture(target, _FORWARD, _OUTPUT, index, k, t)
            session.end_call()
            return hooked
        finally:
            if slot.entered:
                session.exit_module()
            stack.pop()

    def _hook_cell_outputs(self, slot: _CellCall, output: Any, outputs: list) -> Any:
        """The cell's floating outputs through HookBackward (its dy): the new output, or None
        when nothing is hooked."""
        if not slot.backward or slot.identity or not self._requires_grad():
            return None
        replaced = self._through_hooks(slot, _GRAD_OUTPUT, outputs, slot.constant_outputs)
        return replace_result(output, replaced) if replaced else None

    def _through_hooks(self, slot: _CellCall, role: Role, found: list,
                       constants: FrozenSet[int]) -> Dict[str, Any]:
        """{key: the tensor through HookBackward} of the top-level floating tensors among
        `found` (a call's inputs or outputs), each linked to the tensor it passes on; not a
        recompute's constants (tensors the forward did not differentiate)."""
        replaced: Dict[str, Any] = {}
        for index, key, t in found:
            if top_level(key) and index not in constants and is_floating(t):
                hooked = keep_attributes(t, through_hook(t, _CellGrad(self, slot, role, index,
                                                                       key)))
                self._link_copy(t, hooked)
                replaced[key] = hooked
        return replaced

    def _cell_grad(self, slot: _CellCall, role: Role, index: int, key: str, grad: Any) -> None:
        """A gradient of one of a cell call's inputs (dx) or outputs (dy), for the cell and
        its functional API."""
        if slot.identity:
            return
        session = self.recorder
        for target in (slot.call, slot.api_call):
            if target is not None:
                session.capture(target, _BACKWARD, role, index, key, grad)
        session.end_call()
