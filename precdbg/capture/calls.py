"""The calls of one capture window: which module runs, what each call is named and counted as,
and whether the filters keep it. A helper object of the window (`window.CaptureWindow`), made
with it: it turns an adapter's "a call starts" into a `Call` to record into, or into nothing.
Call indices and the execution order count per step (`step_state.StepState`), so a second
window of the same step goes on from where the first stopped."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..records.call import Call
from ..records.layers import settings_text
from ..records.naming import (vocabulary, api_entry, canonical_op, module_entry, param_alias, param_entry,
                              save_entry, torch_param_leaf)
from ..records.schema import Direction, Phase, RecordKind, Role
from .call_stacks import StackTable
from .filters import NO_MODEL, CaptureFilter, ModelSelection
from .step_state import StepState

__all__ = ["WindowCalls"]

_API, _MODULE, _SAVED = RecordKind.API, RecordKind.MODULE, RecordKind.SAVED
_PARAM_GRAD = RecordKind.PARAM_GRAD
_FORWARD = Direction.FORWARD
_MODULE_SITE, _API_SITE = "module", "api"        # what a replayable call is keyed by

ModuleRow = Tuple[str, str, str, str]            # path, class, parent path, settings (JSON)


class WindowCalls:
    """Module stack, call naming and counting, call selection for one capture window. Its
    methods are the window's own (`CaptureWindow` binds them as its attributes at
    construction: an adapter's hook calls them with no call in between)."""
    __slots__ = ("step", "filter", "stacks", "framework", "keep_stacks", "store_all", "modules",
                 "module_cls", "model", "module_stack", "calls_seen", "phase")

    def __init__(self, step: StepState, capture_filter: CaptureFilter, stacks: StackTable,
                 framework: str, keep_stacks: bool, store_all: bool) -> None:
        self.step = step
        self.filter = capture_filter
        self.stacks = stacks
        self.framework = vocabulary(framework)      # whose names the records use
        self.keep_stacks = keep_stacks        # config `stack`: record each call's stack
        self.store_all = store_all            # task tensor: every call's tensors are stored
        self.modules: List[ModuleRow] = []    # the hooked model's module tree
        self.module_cls: Dict[str, str] = {}
        self.model: ModelSelection = NO_MODEL
        self.module_stack: List[Tuple[str, bool]] = []    # (path, keeps its subtree)
        self.calls_seen = 0                   # calls seen, kept or not
        self.phase = Phase.FORWARD            # the phase new calls are recorded in

    # ------------------------------------------------------------------ modules
    def set_module_tree(self, modules: Sequence[Tuple[str, str, str, Dict[str, Any]]]) -> None:
        """(path, class, parent path, raw layer settings) of every module/cell of the model; the
        settings are stored normalised (precdbg.records.layers), as JSON text per module."""
        framework = self.framework
        self.modules = [(path, cls, parent, settings_text(framework, cls, raw) if raw else "")
                        for path, cls, parent, raw in modules]
        self.module_cls = {path: cls for path, cls, _, _ in self.modules}
        self.model = self.filter.select_model([(path, cls) for path, cls, _, _ in self.modules])

    def enter_module(self, path: str, keep_subtree: bool) -> None:
        inside = bool(self.module_stack) and self.module_stack[-1][1]
        self.module_stack.append((path, keep_subtree or inside))

    def exit_module(self) -> None:
        if self.module_stack:
            self.module_stack.pop()

    @property
    def owning_module(self) -> str:
        return self.module_stack[-1][0] if self.module_stack else ""

    @property
    def inside_kept_module(self) -> bool:
        return bool(self.module_stack) and self.module_stack[-1][1]

    # ------------------------------------------------------------------ calls
    def _count(self, key: Tuple[str, str]) -> int:
        """The index of the next call of `key` (prefix, name) in the step."""
        self.calls_seen += 1
        counts = self.step.counts
        n = counts.get(key, 0)
        counts[key] = n + 1
        return n

    def begin_api(self, prefix: str, api: str, watched: bool = True,
                  replay: bool = False, replayable: bool = True) -> Optional[Call]:
        """An API call starts; returns the Call to record into, or None when not captured.
        `watched`: its backward is watched now (gradients were enabled). `replay`: the call
        re-runs an earlier forward call (activation recompute): see `precdbg.capture.recompute`.
        `replayable`: a call not watched may be re-run by a later replay (it runs in an
        activation checkpoint's forward; False for other calls without gradients, such as an
        evaluation forward, which a replay must not stand for; True where not known)."""
        stack = self.module_stack
        module = stack[-1][0] if stack else ""
        replays = self.step.replays
        if replay:       # outside every module of the replay: the module it replays
            if not watched:      # no backward to give (a checkpoint's forward in a replay):
                return None      # the call stays for the replay that has one
            return replays.replayed((_API_SITE, module or replays.owner, prefix, api))
        index = self._count((prefix, api))
        forward = api_entry(prefix, api, index, _FORWARD)
        call = None
        if self.filter.keep_entry(forward, api, module, self.phase,
                                  bool(stack) and stack[-1][1], False, self.step.position):
            step = self.step
            step.order += 1
            call = Call(_API, prefix, api, canonical_op(api), module, index, step.order,
                        self.phase, self._stack_id(), self._stores(forward, api), forward)
        if not watched and replayable:
            replays.not_watched((_API_SITE, module, prefix, api), call)
        return call

    def begin_module(self, prefix: str, path: str, cls: str, watched: bool = True,
                     replay: bool = False, replayable: bool = True
                     ) -> Tuple[Optional[Call], bool]:
        """A module call starts: (Call or None, whether the module selects its whole subtree).
        `watched`, `replay` and `replayable` as for `begin_api`."""
        position = self.step.position
        replays = self.step.replays
        if replay:
            replays.module_replayed(path, not self.module_stack)
            return (replays.replayed((_MODULE_SITE, prefix, path, cls)) if watched else None,
                    self.filter.module_selects_subtree(
                        module_entry(prefix, path, cls, _FORWARD, 0), cls, path, position))
        index = self._count((prefix, path))
        forward = module_entry(prefix, path, cls, _FORWARD, index)
        subtree = self.filter.module_selects_subtree(forward, cls, path, position)
        keep = self.filter.keep_entry(forward, cls, path, self.phase,
                                      self.inside_kept_module or subtree, True, position)
        call = None
        if keep:
            step = self.step
            step.order += 1
            call = Call(_MODULE, prefix, cls, canonical_op(cls), path, index, step.order,
                        self.phase, self._stack_id(), self._stores(forward, cls), forward)
        if not watched and replayable:
            replays.not_watched((_MODULE_SITE, prefix, path, cls), call)
        return call, subtree

    def param_call(self, path: str, kind: RecordKind = _PARAM_GRAD, owner_cls: str = "",
                   role: Role = Role.PARAM) -> Optional[Call]:
        """A parameter's gradient (`kind` param_grad: each backward pass counts) or inventory
        entry (`kind` param, `role` param or buffer). Its op is the parameter's PyTorch-style
        leaf name (`weight`, `bias`, ...) in every framework, and its alias is its full name in
        the other framework's convention."""
        if not self.filter.keep_param(path, self.model):
            return None
        grad = kind == _PARAM_GRAD
        index = self._count(("Param", path)) if grad else 0
        owner, _, leaf = path.rpartition(".")
        framework = self.framework
        entry = param_entry(path, Role.PARAM_GRAD if grad else role, index)
        call = Call(kind, "Param", path, torch_param_leaf(framework, leaf), owner, index, 0,
                    self.phase, -1, self.store_all, entry, entry)
        call.alias = param_alias(framework, path, owner_cls or self.module_cls.get(owner, ""))
        return call

    def save_call(self, name: str) -> Call:
        """`debugger.save(name, obj)`: an item saved by name, counted per name in the step."""
        index = self._count(("Save", name))
        step = self.step
        step.order += 1
        entry = save_entry(name, index)
        return Call(_SAVED, "Save", name, name, self.owning_module, index, step.order,
                    self.phase, self._stack_id(), self.store_all, entry, entry)

    def replay_begins(self, owner: Optional[str] = None) -> None:
        """A recompute starts replaying; `owner`: the module it replays (None when not known,
        "" for the root)."""
        self.step.replays.begins(owner)

    def _stores(self, entry: str, api: str) -> bool:
        return self.store_all or self.filter.stores_tensor(entry, api)

    def _stack_id(self) -> int:
        return self.stacks.current(3) if self.keep_stacks else -1
