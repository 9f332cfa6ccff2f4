"""The calls of a captured step: which module runs, what each call is named and counted as,
and whether the filters keep it (`Session`'s part that turns an adapter's "a call starts" into a
`Call`, or into nothing). A mixin of `Session`: it reads the session's state named below, which
`Session` creates and resets per step (counters) and per capture window (the module stack)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .call import Call
from ..config.dump_config import DumpConfig
from .filters import CaptureFilter
from ..records.layers import settings_text
from ..records.naming import (api_entry, canonical_op, module_entry, param_alias, param_entry,
                     torch_param_leaf)
from .contract import Adapter
from .recompute import ReplayTable
from ..records.schema import RecordKind, Role
from .call_stacks import StackTable

__all__ = ["CallNaming"]

_API, _MODULE = RecordKind.API.value, RecordKind.MODULE.value


class CallNaming:
    """Module stack, call counting and naming, call selection; mixed into `Session`."""
    config: DumpConfig
    adapter: Adapter
    filter: CaptureFilter
    phase: str
    _store_all: bool
    _stacks: StackTable
    _order: int                                    # per step: forward calls kept so far
    _counts: Dict[Tuple[str, str], int]            # per step: calls per (prefix, name)
    _calls_seen: int                               # per window: calls seen, kept or not
    _replays: ReplayTable[Call]                    # per step
    _modules: List[Tuple[str, str, str, str]]      # per window: the model's module tree
    _module_cls: Dict[str, str]
    _module_stack: List[Tuple[str, bool]]          # per window: (path, keeps its subtree)

    # ------------------------------------------------------------------ modules
    def set_module_tree(self, modules: Sequence[Tuple[str, str, str, Dict[str, Any]]]) -> None:
        """(path, class, parent path, raw layer settings) of every module/cell of the model; the
        settings are stored normalised (precdbg.records.layers), as JSON text per module."""
        framework = self.adapter.framework
        self._modules = [(path, cls, parent, settings_text(framework, cls, raw) if raw else "")
                         for path, cls, parent, raw in modules]
        self._module_cls = {path: cls for path, cls, _, _ in self._modules}
        self.filter.set_modules([(path, cls) for path, cls, _, _ in self._modules])

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
        re-runs an earlier forward call (activation recompute): see `precdbg.capture.recompute`.
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

    def _stores(self, entry: str, api: str) -> bool:
        return self._store_all or self.filter.stores_tensor(entry, api)

    def _stack_id(self) -> int:
        return self._stacks.current(3) if self.config.stack else -1
