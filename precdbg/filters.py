"""What to keep: level, phase, scope, list, scope range, data mode. One rule set for every adapter."""
from __future__ import annotations

import fnmatch
from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple

from .config import DumpConfig
from .schema import COMPUTED_ROLES, READ_ROLES, DataMode, Direction, Phase, Record

__all__ = ["CaptureFilter"]

_OPTIMIZER, _NONE = Phase.OPTIMIZER.value, Direction.NONE.value
_INPUT_ROLES = READ_ROLES
_OUTPUT_ROLES = COMPUTED_ROLES


def _glob_any(text: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(text, p) for p in patterns)


class CaptureFilter:
    """Decides, per entry at its forward call, whether it is captured; per record, by data mode."""

    def __init__(self, config: DumpConfig) -> None:
        self.config = config
        modes = set(config.data_mode)
        directions = {m for m in modes if m in (DataMode.FORWARD, DataMode.BACKWARD)}
        ios = {m for m in modes if m in (DataMode.INPUT, DataMode.OUTPUT)}
        self.directions: FrozenSet[str] = frozenset(
            d.value for d in directions) if directions else frozenset({"forward", "backward"})
        roles = set()
        if DataMode.INPUT in ios:
            roles |= _INPUT_ROLES
        if DataMode.OUTPUT in ios:
            roles |= _OUTPUT_ROLES
        self.roles: Optional[FrozenSet[str]] = frozenset(roles) if ios else None
        self.scope = list(config.scope)
        self.api_list = list(config.api_list)
        self.tensor_list = list(config.tensor_list)
        self.range_first, self.range_last = (config.scope_range + [None, None])[:2]
        self.range_state = 0 if self.range_first else 1   # 0 before, 1 inside, 2 after
        self.keeps_backward = "backward" in self.directions
        self.keeps_modules = config.keeps_modules
        self.keeps_apis = config.keeps_apis
        self.include_optimizer = config.include_optimizer

    def reset_step(self) -> None:
        self.range_state = 0 if self.range_first else 1

    # -- entry level ------------------------------------------------------------------------
    def _named(self, patterns, entry: str, api: str, module: str, substring: bool) -> bool:
        if substring:
            return any(p in entry or p == api for p in patterns)
        return (_glob_any(entry, patterns) or _glob_any(api, patterns)
                or (module != "" and (_glob_any(module, patterns)
                                      or _glob_any(module, [p + ".*" for p in patterns]))))

    def keep_entry(self, entry: str, api: str, module: str, phase: str, inside_kept_module: bool,
                   is_module: bool) -> bool:
        if phase == _OPTIMIZER and not self.include_optimizer:
            return False
        if is_module and not self.keeps_modules:
            return False
        if not is_module and not self.keeps_apis:
            return False
        if self.range_first is not None:
            if self.range_state == 0 and entry == self.range_first:
                self.range_state = 1
            if self.range_state != 1:
                return False
            if entry == self.range_last:
                self.range_state = 2
        if inside_kept_module:
            return True
        if self.scope and not self._named(self.scope, entry, api, module, substring=False):
            return False
        if self.api_list and not self._named(self.api_list, entry, api, module, substring=True):
            return False
        return True

    def module_selects_subtree(self, entry: str, cls: str, path: str) -> bool:
        """At level mix a module named by `list`/`scope` is dumped whole, with every call inside."""
        if self.api_list and self._named(self.api_list, entry, cls, path, substring=True):
            return True
        return bool(self.scope) and self._named(self.scope, entry, cls, path, substring=False)

    def kept_nothing(self, module_paths: Iterable[str]) -> Optional[str]:
        """Why a capture window whose calls ran recorded nothing, when the config selects
        (scope, list, scope_range): what it selects and, for comparison, some of the model's
        module paths. None when nothing is selected (then nothing ran)."""
        chosen = [f"{key}: {value}" for key, value in (
            ("scope", self.scope), ("list", self.api_list),
            ("scope_range", [self.range_first, self.range_last] if self.range_first else []))
            if value]
        if not chosen:
            return None
        shown = [p for p in module_paths if p and p.count(".") < 2][:6]
        model = f"; the model's modules include {', '.join(shown)}" if shown else ""
        return (f"the config's {' and '.join(chosen)} matched none of the calls that ran"
                f"{model} (patterns are fnmatch globs over module paths, entry and API names)")

    def stores_tensor(self, entry: str, api: str) -> bool:
        return bool(self.tensor_list) and self._named(self.tensor_list, entry, api, "", True)

    def keep_param(self, path: str) -> bool:
        if not self.scope:
            return True
        return _glob_any(path, self.scope) or _glob_any(path, [p + ".*" for p in self.scope])

    # -- overflow task ------------------------------------------------------------------------
    def overflow_only(self, records: List[Record], kept_so_far: int) -> Tuple[List[Record], int]:
        """Keep every non-finite record, and every record of the entries whose outputs are
        non-finite (what led to them). `overflow_nums` counts those entries in the order their
        first non-finite output appeared; returns (kept records, entries counted so far)."""
        first_bad: Dict[str, int] = {}
        for r in records:
            if r.is_nonfinite and r.role in _OUTPUT_ROLES:
                first_bad.setdefault(r.entry, r.seq)
        limit = self.config.overflow_nums
        keep = set()
        for entry in sorted(first_bad, key=first_bad.__getitem__):
            if limit >= 0 and kept_so_far >= limit:
                break
            kept_so_far += 1
            keep.add(entry)
        full = limit < 0 or kept_so_far < limit
        return [r for r in records if r.entry in keep or (r.is_nonfinite and full)], kept_so_far

    # -- record level -------------------------------------------------------------------------
    def keeps_every_record(self) -> bool:
        """Whether `keep_record` is true whatever it is asked (the default data mode)."""
        return self.roles is None and self.directions == frozenset({"forward", "backward"})

    def keep_record(self, direction: str, role: str) -> bool:
        if direction != _NONE and direction not in self.directions:
            return False
        if self.roles is not None and role not in self.roles and direction != _NONE:
            return False
        return True
