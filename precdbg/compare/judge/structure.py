"""Structural differences: a module whose class, or whose sequence of calls, differs between the
two runs is a divergence of its own, whatever the numbers say.

Under bf16 a swapped layer (GPT-2's tanh GELU, seven elementwise calls, replaced by one exact
`gelu`) changes its output by less than the bf16 tolerance, and the first record that exceeds a
tolerance is a float32 residual add after it: numbers alone blame the wrong place. The calls a
module makes are in the dump (every API record names its innermost module), so the two runs'
structure is compared directly:

- a module's class: a layer the op table knows that became another (`NewGELUActivation`, a
  gelu, vs `Linear`), compared by canonical op so that `Linear` and `Dense` are the same layer;
  within one framework also another class name for a known layer, or for a user's class that
  also makes other calls (a class merely renamed, making the same calls, is not a difference);
- within one framework, the sequence of calls the module makes itself, in the order they ran:
  its API calls and the calls of its direct child modules (so a child that exists in one run
  only shows in its parent); calls that only re-address elements (views, reshapes, contiguous
  copies, detach) are left out, since an extra one changes no number; so are calls whose
  results nothing reads, calls computing only integers or booleans (positions, masks) and joins
  of one non-empty tensor with empty ones (what transformers models do differently when
  `use_cache` is on: a KV cache filled, cache positions; and when gradient checkpointing turns
  it off). A cast that returns its input (to the dtype it had) is no call either, and where
  the other run converts at the same place (the same line under autocast) the two count as
  the same call: what a cast changes shows in the dtypes and numbers of what reads it. Across
  frameworks the call sequences legitimately differ (fused ops, casts, leaf cells), so only
  classes are compared there.

Within one framework also a call's own settings: a keyword argument that is a number, a flag or
a word (`scaled_dot_product_attention(scale=)`, `cross_entropy(label_smoothing=)`,
`dropout(training=)`) and differs between the runs' same call is a setting of the module that
makes the call, as a layer's eps is (a call outside every module, the script's loss, counts for
the root module). Arguments that change no number (`inplace`) or say where and in which dtype
(`device`, `dtype`) are no setting; nor are integers (sizes and split counts legitimately differ
with the parallel layout), positional arguments (`x * scale` is often data-dependent) or the
calls that only re-address elements or make constants.

The verdict is the earliest such module in the baseline's timeline (`seq` of its first record);
`localize.locate` names it when it ran before the first numeric divergence.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...records.layers import SettingDifference, same_setting
from ...records.naming import is_known_op
from ...storage.reader import RecordTable
from ...records.schema import Direction, RecordKind, Role
from ..align.alignment import rename_module
from .call_columns import entry_codes, first_and_last, path_codes, running_calls, strings_of
from .inert import inert_orders
from .structural_diff import StructuralDiff

__all__ = ["StructuralDiff", "structural_differences", "argument_differences"]

# Calls that only change how elements are addressed (or nothing): an extra one of these - torch's
# backward-hook machinery adds a `view_as`, a port adds a `contiguous` - changes no number.
LAYOUT_OPS = frozenset({"view", "view_as", "reshape", "contiguous", "detach", "clone", "expand",
                        "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "permute",
                        "transpose", "t", "requires_grad", "size", "dim", "numel"})
# Calls that make a constant (no input's values read): what a constant changes shows in the
# calls that read it, which are compared; an extra one alone - Megatron's recompute makes zeros
# for the arguments it was given as None and a tensor of the mask type - changes no number.
CONSTANT_OPS = frozenset({"zeros", "ones", "empty", "full", "tensor", "as_tensor",
                          "scalar_tensor", "arange", "linspace", "eye", "zeros_like",
                          "ones_like", "empty_like", "full_like", "new_zeros", "new_ones",
                          "new_empty", "new_full", "new_tensor"})
_NOT_STRUCTURE = LAYOUT_OPS | CONSTANT_OPS
_NOT_STRUCTURE_LIST = sorted(_NOT_STRUCTURE)
# every column `_side` (with `inert_orders`) and `_call_arguments` read
_STRUCTURE_COLUMNS = ("kind", "direction", "seq", "order", "entry", "module", "api", "op",
                      "prefix", "role", "dtype", "arg_index", "numel", "producer", "tensor_id",
                      "arg_key", "text")
_API, _MODULE = RecordKind.API, RecordKind.MODULE
_CAST = "cast"                 # the canonical op of every dtype conversion (records/tables/ops.yaml)
_FORWARD, _OUTPUT = Direction.FORWARD, Role.OUTPUT
# keyword arguments of a call that decide no number it makes, or say only where and in which dtype
_NOT_SETTINGS = frozenset({"inplace", "out", "device", "dtype", "non_blocking", "copy",
                           "memory_format", "layout", "pin_memory", "requires_grad", "async_op",
                           "group", "generator", "name"})
_SETTING_TYPES = {"py.float": float, "py.bool": lambda text: text == "True",
                  "py.str": str}
# is_known_op per op once: the op table is read once per process (naming._alias_index)
_is_known_op = functools.lru_cache(maxsize=4096)(is_known_op)


@dataclasses.dataclass
class _Module:
    """One forward call of a module path and the calls it made, in order."""
    entry: str
    cls: str
    op: str
    seq: int
    order: int
    calls: List[Tuple[int, str]] = dataclasses.field(default_factory=list)
    finished: bool = True      # False: the process ended inside it (no output recorded)
    # `seq` of its casts that change no number (mostly: returned their input, to the dtype it
    # had): no call of its structure, but where the other run converts at that place, the same
    no_op_casts: set = dataclasses.field(default_factory=set)
    # labels_and_no_ops, once asked (the calls are complete by then: `_side` made them)
    _sorted: Optional[List[Tuple[str, bool]]] = dataclasses.field(default=None, repr=False,
                                                                   compare=False)

    @property
    def labels(self) -> List[str]:
        """Its calls, no-op casts left out."""
        return [label for label, no_op in self._labels_and_no_ops() if not no_op]

    def labels_and_no_ops(self) -> List[Tuple[str, bool]]:
        """Its calls with its no-op casts, each with whether it is one."""
        return list(self._labels_and_no_ops())

    def _labels_and_no_ops(self) -> List[Tuple[str, bool]]:
        if self._sorted is None:
            self._sorted = [(label, seq in self.no_op_casts) for seq, label in sorted(self.calls)]
        return self._sorted


def _module_calls(table: RecordTable, idx: np.ndarray, is_module: np.ndarray,
                  entry_code: np.ndarray, path_code: np.ndarray, entries: List[str]
                  ) -> Tuple[List[_Module], np.ndarray, np.ndarray, List[str]]:
    """The module calls among rows `idx` (in seq order), one per module path and entry, in the
    order they began: each with its first and last row (positions in idx) and its entry."""
    rows = np.nonzero(is_module)[0]
    first, last = first_and_last(entry_code[rows] * (int(path_code.max()) + 1)
                                  + path_code[rows])
    first, last = rows[first], rows[last]
    at = idx[first]
    keys = [entries[c] for c in entry_code[first].tolist()]
    calls = [_Module(entry, cls, op, seq, order) for entry, cls, op, seq, order in zip(
        keys, table["api"][at].tolist(), table["op"][at].tolist(), table["seq"][at].tolist(),
        table["order"][at].tolist())]
    return calls, first, last, keys


def _api_level_calls(table: RecordTable, idx: np.ndarray, path_code: np.ndarray,
                     paths: List[str]) -> Tuple[List[_Module], np.ndarray, np.ndarray, List[str]]:
    """Level api records no module calls, but each API record names its innermost module: the
    calls a module path made in the step count as one call of it, so a cast one run makes in
    a module (a softmax in bf16) is still a structural difference there. Not the root's path:
    at level api it also holds the loss, the clipping and the optimizer. Each call is named by
    its path's first call that counts as structure (no view, reshape), else by its first."""
    root = paths.index("") if "" in paths else -1
    rows = np.nonzero(path_code != root)[0]
    first, last = first_and_last(path_code[rows])
    first, last = rows[first], rows[last]
    named = rows[~np.isin(table["op"][idx[rows]], _NOT_STRUCTURE_LIST)][::-1]
    name_of = dict(zip(path_code[named].tolist(), named.tolist()))    # the first one wins
    name_row = [name_of.get(p, r) for p, r in zip(path_code[first].tolist(), first.tolist())]
    at = idx[first]
    calls = [_Module(entry, "", "", seq, order) for entry, seq, order in zip(
        table["entry"][idx[np.asarray(name_row, np.int64)]].tolist(), table["seq"][at].tolist(),
        table["order"][at].tolist())]
    return calls, first, last, [paths[p] for p in path_code[first].tolist()]


def _side(table: RecordTable, by_name: bool, modules: Optional[Mapping[str, str]],
          apis: bool = True, interrupted: bool = False, api_level: bool = False
          ) -> Dict[str, List[_Module]]:
    """The forward calls of each module path, in order, each with the calls it made (`apis`:
    API calls among them, else child modules only). A call counts for a module's call only
    between that call's first and last record: the root's path ("") also owns what runs
    outside the model (the loss, hooks in backward, clipping, the optimizer), which is no part
    of its structure. In a step the process ended inside (`interrupted`), a call with no
    output recorded had not returned: it runs to the end of what was recorded, unfinished.
    Column by column; Python values only of each call's first record."""
    forward, kind = table["direction"] == _FORWARD, table["kind"]
    api, module = kind == _API, kind == _MODULE
    idx = np.nonzero(forward & ((api & apis) | module))[0]
    idx = idx[np.argsort(table["seq"][idx], kind="stable")]
    if not len(idx):
        return {}
    seq, is_module = table["seq"][idx], module[idx]
    entry_code, entries, first = entry_codes(table, idx)
    path_code, paths = path_codes(table, idx, modules)
    calls, begin, end, keys = (_api_level_calls(table, idx, path_code, paths) if api_level else
                               _module_calls(table, idx, is_module, entry_code, path_code,
                                             entries))
    call_path, lo, hi = path_code[begin], seq[begin], seq[end]
    if interrupted:
        returned = {entries[c] for c in
                    entry_code[is_module & (table["role"][idx] == _OUTPUT)].tolist()}
        unfinished = np.array([key not in returned for key in keys], bool)
        for k in np.nonzero(unfinished)[0].tolist():
            calls[k].finished = False
        hi = np.where(unfinished, seq.max(), hi)
    # each entry's first record: a module's call counts for its parent, an API call for its own
    rows = idx[first]
    inert = np.isin(table["order"][rows], inert_orders(table, api, forward))
    # of the API calls that may count, their ops (layout, constants and no-op casts do not)
    maybe = np.nonzero(~is_module[first])[0]
    ops = strings_of(table["op"], rows[maybe])
    counted = np.zeros(len(rows), bool)
    counted[maybe] = [op not in _NOT_STRUCTURE and (not no_op or op == _CAST)
                      for op, no_op in zip(ops, inert[maybe].tolist())]
    ids = {path: code for code, path in enumerate(paths)}
    parent = np.array([ids.get(path.rpartition(".")[0], -1) if path else -1 for path in paths],
                      np.int64)
    child = is_module[first] & (parent[path_code[first]] >= 0)
    ask = np.nonzero(child | counted)[0]
    caller = running_calls(call_path, lo, hi, np.where(child[ask], parent[path_code[first[ask]]],
                                                  path_code[first[ask]]), seq[first[ask]])
    hit = ask[caller >= 0]
    rows = rows[hit]
    classes = table["api"][rows].tolist()
    labels = [f"{p}.{a}" for p, a in zip(table["prefix"][rows].tolist(), classes)] \
        if by_name else table["op"][rows].tolist()
    names = [path.rpartition(".")[2] for path in paths]
    for c, s, is_child, p, cls, label, no_op in zip(
            caller[caller >= 0].tolist(), seq[first[hit]].tolist(), child[hit].tolist(),
            path_code[first[hit]].tolist(), classes, labels, inert[hit].tolist()):
        if is_child:
            calls[c].calls.append((s, f"{names[p]}:{cls}"))
        else:
            calls[c].calls.append((s, label))
            if no_op:                            # changes no number: its input returned,
                calls[c].no_op_casts.add(s)      # an integer result, or one nothing reads
    found: Dict[str, List[_Module]] = {}
    for p, call in zip(call_path.tolist(), calls):
        found.setdefault(paths[p], []).append(call)
    return found


def _calls_compared(calls_a: List[_Module], calls_b: List[_Module]
                    ) -> Tuple[_Module, _Module, List[str], List[str]]:
    """The calls of a module to compare: call by call when both runs called it as often (the
    first call whose calls differ: a weight-shared layer's fourth call, a second micro-batch),
    otherwise all its calls together, named by the first. Calls that differ only where one
    run's cast returned its input (see `_apart`) count as the same."""
    if len(calls_a) == len(calls_b):
        for ma, mb in zip(calls_a, calls_b):
            # the same calls (nearly always): not apart, and no need to ask
            calls, other = ma._labels_and_no_ops(), mb._labels_and_no_ops()
            if calls != other and _apart(calls, other):
                return ma, mb, ma.labels, mb.labels
        return calls_a[0], calls_b[0], calls_a[0].labels, calls_a[0].labels
    la = [c for m in calls_a for c in m.labels_and_no_ops()]
    lb = [c for m in calls_b for c in m.labels_and_no_ops()]
    if not _apart(la, lb):
        la = lb = []
    return (calls_a[0], calls_b[0], [label for label, no_op in la if not no_op],
            [label for label, no_op in lb if not no_op])


def _apart(calls_a: List[Tuple[str, bool]], calls_b: List[Tuple[str, bool]]) -> bool:
    """Whether two runs' calls of a module differ by more than casts that returned their input
    (to the dtype it had). Such a cast is no call of its own (a port's extra `.float()` of a
    float32 tensor changes no number), and in a run of other precision the same line converts:
    an HF loss's `.float()` of float32 logits, and of bf16 logits under autocast; GPT-2
    attention's `.type(value.dtype)`. A cast one run makes where the other has none at all
    (`x.to(bfloat16)` before a softmax) stays a difference."""
    labels_a, labels_b = [label for label, _ in calls_a], [label for label, _ in calls_b]
    if labels_a == labels_b:
        return False
    matcher = difflib.SequenceMatcher(None, labels_a, labels_b, autojunk=False)
    return any(not all(no_op for _, no_op in calls_a[i1:i2] + calls_b[j1:j2])
               for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def _call_arguments(table: RecordTable, path_of: Callable[[str], str]
                    ) -> Dict[Tuple[str, str, str], Tuple[str, str, object]]:
    """(module path, entry, keyword) -> (API, canonical op, value) of each forward API call's
    keyword arguments that can be a setting of it (see the module's text)."""
    idx = np.nonzero(np.isin(table["dtype"], list(_SETTING_TYPES)))[0]
    idx = idx[(table["kind"][idx] == _API) & (table["direction"][idx] == _FORWARD)
              & (table["role"][idx] == Role.INPUT)]
    out: Dict[Tuple[str, str, str], Tuple[str, str, object]] = {}
    keys, ops, types, texts = (table[name][idx].tolist() for name in ("arg_key", "op", "dtype",
                                                                       "text"))
    modules, entries, apis = (table[name][idx].tolist() for name in ("module", "entry", "api"))
    for key, op, kind_of, text, module, entry, api in zip(keys, ops, types, texts, modules,
                                                         entries, apis):
        if not key or key.isdigit() or key in _NOT_SETTINGS or op in _NOT_STRUCTURE \
                or op == _CAST:
            continue
        try:
            value = _SETTING_TYPES[kind_of](text)
        except ValueError:
            continue
        out[(path_of(module), entry, key)] = (api, op, value)
    return out


def argument_differences(ta: RecordTable, tb: RecordTable,
                         modules: Optional[Mapping[str, str]] = None, same_columns: bool = False
                         ) -> List[SettingDifference]:
    """The settings of calls (keyword arguments, see the module's text) that differ between the
    same call of two runs of one framework, by the path of the module that makes the call
    (`modules` maps a path of b to a's), each (module, API, argument, values) once, in the
    baseline's order. `same_columns`: b's structure columns are a's (`_same_structure`), and
    no `modules`: b's arguments are a's, read once."""
    if not len(ta) or not len(tb):
        return []
    args_a = _call_arguments(ta, lambda p: p)
    args_b = args_a if same_columns and not modules else _call_arguments(
        tb, (lambda p: rename_module(p, modules)) if modules else (lambda p: p))
    out: List[SettingDifference] = []
    seen = set()
    for (path, entry, key), (api, op, va) in args_a.items():
        other = args_b.get((path, entry, key))
        if other is None or same_setting(va, other[2]):
            continue
        setting = f"{api}({key}=)"
        if (path, setting, va, other[2]) in seen:
            continue
        seen.add((path, setting, va, other[2]))
        out.append(SettingDifference(path, path, api, other[0], op, setting, va, other[2],
                                     call=True))
    return out


def structural_differences(ta: RecordTable, tb: RecordTable, step: int, rank: int,
                           same_framework: bool,
                           mapping: Optional[Mapping[str, Mapping[str, str]]] = None,
                           settings: Sequence[SettingDifference] = (),
                           unobserved: Sequence[str] = (),
                           interrupted: Tuple[bool, bool] = (False, False)
                           ) -> List[StructuralDiff]:
    """Modules present in both runs whose class (or, within one framework, calls) or numeric
    layer settings (`settings`, from `precdbg.records.layers.dump_setting_differences`; within
    one framework also the settings of their calls, `argument_differences`) differ, in the
    baseline's execution order. `unobserved`: module paths whose inside either run could not
    see (compiled: TorchScript, ms.jit); their calls are not compared. `interrupted`: whether
    each run's step ended inside its forward: a call it had not finished is compared as far
    as it got."""
    if not len(ta) or not len(tb):
        return []
    modules = (mapping or {}).get("modules") or None
    by_module: Dict[str, List[SettingDifference]] = {}
    # b's structure is a's (nearly always, within one framework): b's calls are a's, read once
    same = modules is None and _same_structure(ta, tb)
    calls = argument_differences(ta, tb, modules, same) if same_framework else []
    # a module's call passing on its own setting (BatchNorm's eps to batch_norm) says it again
    calls = [c for c in calls if not any(
        s.path_a == c.path_a and same_setting(s.a, c.a) and same_setting(s.b, c.b)
        for s in settings)]
    for difference in list(settings) + calls:
        by_module.setdefault(difference.path_a, []).append(difference)
    if same and interrupted[0] == interrupted[1] and not by_module:
        return []         # the same modules making the same calls, no setting apart
    # API calls count among a module's calls only where both runs captured them (a dump of
    # level module against one of level mix: the calls one run did not record are no change)
    apis = bool((ta["kind"] == _API).any()) and bool((tb["kind"] == _API).any())
    # two dumps of level api: each module path's API calls stand for its calls
    api_level = apis and not (ta["kind"] == _MODULE).any() and not (tb["kind"] == _MODULE).any()
    mods_a = _side(ta, same_framework, None, apis, interrupted[0], api_level)
    mods_b = mods_a if same and interrupted[0] == interrupted[1] else \
        _side(tb, same_framework, modules, apis, interrupted[1], api_level)
    out: List[StructuralDiff] = []
    for path, calls_a in mods_a.items():
        calls_b = mods_b.get(path)
        if not calls_b:
            continue
        # calls a run ended before reaching (a second micro-batch's) are no difference
        if interrupted[1] and len(calls_b) < len(calls_a):
            calls_a = calls_a[:len(calls_b)]
        if interrupted[0] and len(calls_a) < len(calls_b):
            calls_b = calls_b[:len(calls_a)]
        ma, mb, seq_a, seq_b = _calls_compared(calls_a, calls_b)
        hidden = any(path == u or path.startswith(u + ".") or u == "" for u in unobserved)
        if not all(m.finished for m in calls_a + calls_b):     # as far as both got
            seq_a = seq_a[:len(seq_b)] if not calls_b[-1].finished else seq_a
            seq_b = seq_b[:len(seq_a)] if not calls_a[-1].finished else seq_b
        calls_differ = same_framework and seq_a != seq_b and not hidden
        # a layer the op table knows (Linear, GELU, LayerNorm, ...) that became another is a
        # difference by itself; a user's class under another name (GPT2Block vs Block, a
        # subclass) only when it also calls something else
        known = _is_known_op(ma.op) and _is_known_op(mb.op)
        class_differs = (ma.op != mb.op and known) or \
            (same_framework and ma.cls != mb.cls and (calls_differ or known))
        changed = by_module.get(path, [])
        if class_differs or calls_differ or changed:
            first = calls_a[0].labels_and_no_ops()
            repeated = len(calls_a) != len(calls_b) and \
                not any(_apart(first, m.labels_and_no_ops()) for m in calls_a + calls_b)
            out.append(StructuralDiff(step, rank, path, ma.entry, mb.entry, ma.cls, mb.cls,
                                      ma.op, seq_a if calls_differ else [],
                                      seq_b if calls_differ else [], ma.seq, ma.order,
                                      list(changed),
                                      (len(calls_a), len(calls_b)) if repeated else None))
    out.sort(key=lambda d: d.seq)
    return _outermost_first_only(out)


def _same_structure(ta: RecordTable, tb: RecordTable) -> bool:
    """Whether the columns `_side` and `_call_arguments` read are the same in both tables, value
    for value (and dtype for dtype)."""
    if len(ta) != len(tb):
        return False
    for name in _STRUCTURE_COLUMNS:
        if (name in ta) != (name in tb):
            return False
        if name not in ta:
            continue
        a, b = ta[name], tb[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind in "US" and a.dtype.itemsize:      # as bytes: memcmp, not str by str
            a, b = a.view(f"V{a.dtype.itemsize}"), b.view(f"V{b.dtype.itemsize}")
        if not bool((a == b).all()):
            return False
    return True


def _outermost_first_only(diffs: List[StructuralDiff]) -> List[StructuralDiff]:
    """A parent lists its child's class among its calls; when the child itself differs, the
    child (which runs inside the parent) is the one to name."""
    classes_changed = {d.module for d in diffs if d.class_differs}
    keep = []
    for d in diffs:
        if not d.class_differs and not d.settings and any(c.rpartition(".")[0] == d.module
                                       for c in classes_changed) and \
                _only_child_classes_differ(d, classes_changed):
            continue
        keep.append(d)
    return keep


def _only_child_classes_differ(d: StructuralDiff, changed: set) -> bool:
    """The parent's call lists differ only where a changed child's `name:Class` appears."""
    names = {c.rpartition(".")[2] for c in changed if c.rpartition(".")[0] == d.module}
    strip = lambda calls: [c for c in calls if c.partition(":")[0] not in names  # noqa: E731
                           or ":" not in c]
    return strip(d.calls_a) == strip(d.calls_b)
