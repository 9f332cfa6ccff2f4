"""What to keep: level, phase, scope, list, scope range, data mode. One rule set for every adapter."""
from __future__ import annotations

import fnmatch
import logging
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..config.dump_config import DumpConfig
from ..records.naming import module_entry, normalize_api_name
from ..records.schema import COMPUTED_ROLES, READ_ROLES, DataMode, Direction, Phase, Record

__all__ = ["CaptureFilter", "RangePosition", "ModelSelection", "NO_MODEL"]

log = logging.getLogger("precdbg")

_OPTIMIZER, _NONE = Phase.OPTIMIZER, Direction.NONE
_INPUT_ROLES = READ_ROLES
_OUTPUT_ROLES = COMPUTED_ROLES
_BOTH_DIRECTIONS = frozenset({Direction.FORWARD, Direction.BACKWARD})


_MODULE_PREFIXES = ("Module", "Cell")


def _forward_name(name: str) -> str:
    """`Torch.addmm.3.backward` -> `Torch.addmm.3.forward`, `Module.fc.Linear.backward.0` ->
    `Module.fc.Linear.forward.0` (as msprobe names a call's backward); other names as given."""
    if name.endswith(".backward"):
        return name[:-len("backward")] + "forward"
    stem, _, index = name.rpartition(".")
    if index.isdigit() and stem.endswith(".backward"):
        return f"{stem[:-len('backward')]}forward.{index}"
    return name


def _operator_alias(item: str) -> str:
    """`Tensor.__add__` -> `Tensor.add`, `__matmul__` -> `matmul` (the name a `list` item of
    msprobe's gives an operator, as PyTorch's records name it); other items as given."""
    parts = item.split(".")
    return ".".join(normalize_api_name(p) if len(p) > 4 and p.startswith("__")
                    and p.endswith("__") else p for p in parts)


def _subtree(order: List[str], at: int) -> List[str]:
    """The module at `at` of a pre-order list of paths, and its submodules."""
    stem = order[at] + "." if order[at] else ""
    return [order[at]] + [p for p in order[at + 1:] if p.startswith(stem)]


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
            Direction(d.value) for d in directions) if directions else _BOTH_DIRECTIONS
        roles = set()
        if DataMode.INPUT in ios:
            roles |= _INPUT_ROLES
        if DataMode.OUTPUT in ios:
            roles |= _OUTPUT_ROLES
        self.roles: Optional[FrozenSet[str]] = frozenset(roles) if ios else None
        self.scope = list(config.scope)
        # a call is kept or not at its forward: a backward name stands for its call's forward
        self.api_list = [_forward_name(item) for item in config.api_list]
        # msprobe names Python operators as their dunder (`Tensor.__add__`), as MindSpore's
        # records do; PyTorch's torch-function API hands precdbg `Tensor.add` for `a + b`
        self.api_list += [alias for alias in map(_operator_alias, self.api_list)
                          if alias not in self.api_list]
        self.tensor_list = list(config.tensor_list)
        self.range_first, self.range_last = ([_forward_name(n) for n in config.scope_range]
                                             + [None, None])[:2]
        self.keeps_backward = Direction.BACKWARD in self.directions
        self.keeps_modules = config.keeps_modules
        self.keeps_apis = config.keeps_apis
        self.include_optimizer = config.include_optimizer

    def range_position(self) -> "RangePosition":
        """Where a new step stands in the config's `scope_range` (inside it when there is none)."""
        return RangePosition(0 if self.range_first else 1)

    # -- entry level ------------------------------------------------------------------------
    def _named(self, patterns, entry: str, api: str, module: str, substring: bool) -> bool:
        if substring:
            return any(p in entry or p == api for p in patterns)
        return (_glob_any(entry, patterns) or _glob_any(api, patterns)
                or (module != "" and (_glob_any(module, patterns)
                                      or _glob_any(module, [p + ".*" for p in patterns]))))

    def keep_entry(self, entry: str, api: str, module: str, phase: str, inside_kept_module: bool,
                   is_module: bool, position: "RangePosition") -> bool:
        """Whether a call is captured, asked at its forward; moves the step's `position` in
        the scope_range."""
        if phase == _OPTIMIZER and not self.include_optimizer:
            return False
        if is_module and not self.keeps_modules:
            return False
        if not is_module and not self.keeps_apis:
            return False
        if self.range_first is not None:
            if position.state == _BEFORE and entry == self.range_first:
                position.state = _INSIDE
            # after the range: only inside its last module, kept whole (module_selects_subtree)
            if position.state != _INSIDE and not (position.state == _AFTER and inside_kept_module):
                return False
            if entry == self.range_last:
                position.state = _AFTER
        if inside_kept_module:
            return True
        if self.scope and not self._named(self.scope, entry, api, module, substring=False):
            return False
        if self.api_list and not self._named(self.api_list, entry, api, module, substring=True):
            return False
        return True

    def module_selects_subtree(self, entry: str, cls: str, path: str,
                               position: "RangePosition") -> bool:
        """At level mix a module named by `list`/`scope` is dumped whole, with every call inside;
        so is the last module of a `scope_range` (as msprobe ends a range when that module's
        forward returns)."""
        if self.range_last is not None and entry == self.range_last and \
                (position.state == _INSIDE or entry == self.range_first):
            return True
        if self.api_list and self._named(self.api_list, entry, cls, path, substring=True):
            return True
        return bool(self.scope) and self._named(self.scope, entry, cls, path, substring=False)

    def kept_nothing(self, module_paths: Iterable[str]) -> Optional[str]:
        """Why a capture window whose calls ran recorded nothing, when the config selects
        (scope, list, scope_range): what it selects and, for comparison, some of the model's
        module paths. None when nothing is selected (then nothing ran)."""
        chosen = [f"{key}: {value}" for key, value in (
            ("scope", self.scope), ("list", list(self.config.api_list)),
            ("scope_range", [self.range_first, self.range_last] if self.range_first else []))
            if value]
        if not chosen:
            return None
        shown = [p for p in module_paths if p and p.count(".") < 2][:6]
        model = f"; the model's modules include {', '.join(shown)}" if shown else ""
        how = [text for key, text in (
            ("scope", "scope: fnmatch globs over module paths, entry and API names"),
            ("list", "list: names or parts of names of entries, APIs and module paths"),
            ("scope_range", "scope_range: two whole entry names, as the dump names them"))
            if any(c.startswith(key + ":") for c in chosen)]
        return (f"the config's {' and '.join(chosen)} matched none of the calls that ran"
                f"{model} ({'; '.join(how)})")

    def stores_tensor(self, entry: str, api: str) -> bool:
        return bool(self.tensor_list) and self._named(self.tensor_list, entry, api, "", True)

    def select_model(self, modules: Sequence[Tuple[str, str]]) -> "ModelSelection":
        """What the config selects of a model whose modules are (path, class) in the order the
        model lists them. A `scope_range` whose both ends are module entries keeps the
        parameters of the modules from the first to the last, the last one's submodules
        included (any other range keeps none); a `list` item that is a module entry keeps that
        module's."""
        order = [path for path, _ in modules]
        named = [at for at in (self._module_at(item, modules) for item in self.api_list)
                 if at is not None]
        listed = frozenset(p for at in named for p in _subtree(order, at))
        if self.range_first is None:
            return ModelSelection(listed, None)
        first = self._module_at(self.range_first, modules)
        last = self._module_at(self.range_last, modules)
        if first is None or last is None or last < first:
            return ModelSelection(listed, frozenset())
        return ModelSelection(listed, frozenset(order[first:last] + _subtree(order, last)))

    @staticmethod
    def _module_at(name: Optional[str], modules: Sequence[Tuple[str, str]]) -> Optional[int]:
        """Where in `modules` the module an entry name (any call, either direction, PyTorch's
        `Module` or MindSpore's `Cell`) is; None when it names no module."""
        for at, (path, cls) in enumerate(modules):
            for prefix in _MODULE_PREFIXES:
                for direction in (Direction.FORWARD, Direction.BACKWARD):
                    stem = module_entry(prefix, path, cls, direction, 0)[:-1]
                    if name is not None and name.startswith(stem) and \
                            name[len(stem):].isdigit():
                        return at
        return None

    def keep_param(self, path: str, model: "ModelSelection") -> bool:
        """A parameter's inventory record and gradients: under a `scope` glob, named in part by
        a `list` item (a module path; an API name keeps none), inside a module `scope_range`
        (of the hooked `model`)."""
        if self.scope and not (_glob_any(path, self.scope)
                               or _glob_any(path, [p + ".*" for p in self.scope])):
            return False
        if self.api_list and not any(p in path for p in self.api_list) and \
                path.rpartition(".")[0] not in model.listed:
            return False
        if model.in_range is not None and path.rpartition(".")[0] not in model.in_range:
            return False
        return True

    # -- overflow task ------------------------------------------------------------------------
    def overflow_only(self, records: List[Record], kept_so_far: int, step: int
                      ) -> Tuple[List[Record], int]:
        """Keep every non-finite record, and every record of the entries whose outputs are
        non-finite (what led to them). `overflow_nums` counts those entries in the order their
        first non-finite output appeared; returns (kept records, entries counted so far). The
        batch (of step `step`) that reaches the count says so once: msprobe stops training
        there, precdbg never does."""
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
        if 0 <= limit <= kept_so_far and keep:
            log.warning("precdbg: step %d: overflow_nums %d reached: later non-finite values are "
                        "not recorded; training goes on (precdbg never stops it, where msprobe "
                        "would)", step, limit)
        full = limit < 0 or kept_so_far < limit
        return [r for r in records if r.entry in keep or (r.is_nonfinite and full)], kept_so_far

    # -- record level -------------------------------------------------------------------------
    def keeps_every_record(self) -> bool:
        """Whether `keep_record` is true whatever it is asked (the default data mode)."""
        return self.roles is None and self.directions == _BOTH_DIRECTIONS

    def keep_record(self, direction: str, role: str) -> bool:
        if direction != _NONE and direction not in self.directions:
            return False
        if self.roles is not None and role not in self.roles and direction != _NONE:
            return False
        return True


_BEFORE, _INSIDE, _AFTER = 0, 1, 2       # where a step stands in the config's scope_range


class RangePosition:
    """Where one step stands in the config's `scope_range` (made fresh per step)."""
    __slots__ = ("state",)

    def __init__(self, state: int) -> None:
        self.state = state


class ModelSelection:
    """What the config selects of one hooked model (made per capture window): the modules a
    `list` item names as entries (`listed`, their subtrees), and those a module `scope_range`
    spans (`in_range`; None: no such range)."""
    __slots__ = ("listed", "in_range")

    def __init__(self, listed: FrozenSet[str], in_range: Optional[FrozenSet[str]]) -> None:
        self.listed = listed
        self.in_range = in_range


NO_MODEL = ModelSelection(frozenset(), None)
