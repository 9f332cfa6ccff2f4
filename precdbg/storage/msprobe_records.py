"""The records of one msprobe step (storage.msprobe_dump's `MsprobeStep`): each dump.json entry
turned into the records precdbg would have written for the call, with construct.json's modules and
stack.json's call sites (see msprobe_dump's text for the mapping)."""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..records.arguments import call_arguments, tensor_results
from ..records.controls import escape_column, escape_controls
from ..records.naming import canonical_op, framework_table, torch_param_leaf, vocabulary
from ..records.schema import (DTYPE_VALUE, MAX_NDIM, NO_PRODUCER, RECORD_COLUMNS, UNKNOWN_COUNT,
                              DtypeName, scalar_dtype)

__all__ = ["StepRecords", "CONSTRUCT_JSON", "STACK_JSON", "TENSOR_FOLDER", "entry_kind"]

CONSTRUCT_JSON, STACK_JSON = "construct.json", "stack.json"
TENSOR_FOLDER = "dump_tensor_data"

_MODULE = re.compile(r"^(?P<prefix>Module|Cell)\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)\."
                     r"(?P<what>forward|backward|parameters_grad)\.(?P<index>\d+)$")
_API = re.compile(r"^(?P<prefix>[A-Za-z_][A-Za-z0-9_]*)\.(?P<api>.+)\.(?P<index>\d+)\."
                  r"(?P<what>forward|backward)$")
_FRAME = re.compile(r"^File (?P<file>.+), line (?P<line>\d+), in (?P<func>[^,\n]+)")
# frames of the frameworks and of msprobe itself: not the user's line
_INTERNAL = re.compile(r"[/\\](site|dist)-packages[/\\](torch|mindspore|msprobe|mindtorch|"
                       r"msadapter|torch_npu)[/\\]")
_MS_DTYPES = {"Float64": "float64", "Float32": "float32", "Float16": "float16",
              "BFloat16": "bfloat16", "Int64": "int64", "Int32": "int32", "Int16": "int16",
              "Int8": "int8", "UInt8": "uint8", "Bool": "bool", "Complex64": "complex64",
              "Complex128": "complex128"}
_STRING_COLUMNS = [name for name, dtype in RECORD_COLUMNS if dtype is None]


def entry_kind(entry: str) -> Optional["re.Match[str]"]:
    """The name match of a module (`Module.<path>.<Class>.<what>.<n>`) or API entry, else None."""
    return _MODULE.match(entry) or _API.match(entry)


class _Tensor:
    """An msprobe tensor description standing in for the tensor (records.arguments finds it)."""
    __slots__ = ("d",)

    def __init__(self, d: Dict[str, Any]) -> None:
        self.d = d


def _is_tensor(value: Any) -> bool:
    return type(value) is _Tensor


def _dtype_value(value: Any) -> Optional[str]:
    return value if isinstance(value, DtypeName) else None


def _decode(value: Any) -> Any:
    """msprobe's encoding of an argument -> a stand-in: _Tensor, a number or string, a
    DtypeName, a list of those, None (nothing worth recording)."""
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return None if value == "..." else value
    kind = value.get("type")
    if kind is None:
        if not value:
            return None           # a type msprobe does not know (a dtype given by position)
        return {k: _decode(v) for k, v in value.items()}
    if "shape" in value and "dtype" in value and ("Tensor" in str(kind) or
                                                  kind == "numpy.ndarray"):
        return _Tensor(value)
    if kind in ("torch.dtype", "mindspore.dtype"):
        return DtypeName(_dtype_name(value.get("value")))
    if kind in ("int", "float", "bool", "str"):
        return value.get("value")
    if kind == "torch.Size":
        return list(value.get("value") or [])
    return None


def _dtype_name(text: Any) -> str:
    name = str(text or "")
    if name.startswith(("torch.", "mindspore.")):
        name = name.split(".", 1)[1]
    return _MS_DTYPES.get(name, name.lower())


def _number(value: Any) -> float:
    """A statistic as a float; NaN where msprobe wrote none (null) or something else."""
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            return float("inf") if value > 0 else float("-inf")
    return float("nan")


def _nonfinite(d: Dict[str, Any]) -> Tuple[int, int]:
    """(nan_count, inf_count) of an msprobe tensor: 0, or UNKNOWN_COUNT where its statistics
    show some (msprobe counts none, but its Max and Min are torch's, which NaN propagates
    through: finite extremes mean no NaN and no Inf); 0 where it took no extremes."""
    lo, hi = d.get("Min"), d.get("Max")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or \
            isinstance(lo, bool) or isinstance(hi, bool):
        return 0, 0
    values = [float(lo), float(hi)] + [float(d[k]) for k in ("Mean", "Norm")
                                       if isinstance(d.get(k), (int, float))]
    nan = any(v != v for v in values)
    inf = any(v in (float("inf"), float("-inf")) for v in (float(lo), float(hi)))
    return (UNKNOWN_COUNT if nan else 0), (UNKNOWN_COUNT if inf else 0)


class StepRecords:
    """The record columns of one msprobe step (see the module's text)."""

    def __init__(self, step: Any) -> None:
        self.step = step
        data = step._load()
        self.entries: Dict[str, Any] = data["data"]
        # the tensor folder beside dump.json (a dump copied or moved keeps it), else where
        # dump.json says it was written (`dump_data_dir`, an absolute path)
        self.tensor_dir = os.path.join(step.folder, TENSOR_FOLDER)
        if not os.path.isdir(self.tensor_dir) and data.get("dump_data_dir"):
            self.tensor_dir = str(data["dump_data_dir"])
        construct = step._json(os.path.join(step.folder, CONSTRUCT_JSON))
        self.parents: Dict[str, Any] = construct if isinstance(construct, dict) else {}
        self.stack_of: Dict[str, int] = {}
        self._read_stacks(step._json(os.path.join(step.folder, STACK_JSON)))
        self.rows: Dict[str, List[Any]] = {name: [] for name, _ in RECORD_COLUMNS}
        self.shapes: List[Tuple[int, ...]] = []
        self.order_of: Dict[Tuple[str, str, str, int], int] = {}
        self.modules: Dict[str, str] = {}
        self.params_seen: set = set()
        self.seq = self.order = 0
        self.missing_files = 0
        self.framework = str(data.get("framework") or "pytorch").lower()
        self.api_names = self._operator_names(self.framework)

    def _operator_names(self, framework: str) -> Dict[str, str]:
        """entry -> the API name precdbg gives a Tensor operator (`Tensor.__add__` is precdbg's
        `Tensor.add`: the torch table's `operator_names`), where the renamed entry is not
        another call msprobe recorded (`x + y` and `x.add(y)` in one step keep msprobe's)."""
        if vocabulary(framework.lower()) != vocabulary("pytorch"):
            return {}
        names = framework_table("torch").get("operator_names") or {}
        out: Dict[str, str] = {}
        for entry in self.entries:
            m = _API.match(entry)
            if m and m.group("prefix") == "Tensor" and m.group("api") in names:
                api = str(names[m.group("api")])
                renamed = f"Tensor.{api}.{m.group('index')}.{m.group('what')}"
                if renamed not in self.entries:
                    out[entry] = api
        return out

    def _read_stacks(self, stacks: Any) -> None:
        if not isinstance(stacks, dict):
            return
        for value in stacks.values():
            if not (isinstance(value, list) and len(value) == 2):
                continue
            names, frames = value
            lines = []
            for frame in frames if isinstance(frames, list) else []:
                m = _FRAME.match(str(frame))
                if m and not _INTERNAL.search(m.group("file")):
                    lines.append(f"{m.group('file')}:{m.group('line')} in "
                                 f"{m.group('func').strip()}")
            sid = len(self.step._stacks)
            self.step._stacks.append(escape_controls("\n".join(lines), lines=True))
            for name in names if isinstance(names, list) else []:
                self.stack_of[str(name)] = sid

    def _module_of(self, entry: str) -> str:
        """The path of the module `entry` ran in (construct.json), '' outside every module."""
        parent = self.parents.get(entry)
        m = _MODULE.match(parent) if isinstance(parent, str) else None
        return (m.group("path") or "") if m else ""

    def build(self) -> Dict[str, np.ndarray]:
        malformed: List[str] = []
        for entry, m, part in self._events():
            mark = (len(self.shapes), self.seq, self.order, len(self.step._files))
            try:
                self._entry(entry, m, part, self.entries[entry])
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
                self._undo(mark)        # an entry not in msprobe's format: none of its records
                malformed.append(entry)
        if malformed:
            self.step._notes.append(f"{self.step.path}: {len(malformed)} entr"
                                    f"{'y' if len(malformed) == 1 else 'ies'} not in msprobe's "
                                    f"format (first: {malformed[0]}); read without them")
        if self.missing_files:
            self.step._notes.append(f"{self.tensor_dir}: {self.missing_files} tensor file(s) "
                                    "named in dump.json are absent; their statistics are read")
        self.step._modules = self._module_tree()
        self.step._unrecorded = frozenset(k for k in self.parents if k not in self.entries
                                          and (_API.match(k) or _MODULE.match(k)))
        return self._arrays()

    def _entry(self, entry: str, m: "re.Match[str]", part: str, value: Dict[str, Any]) -> None:
        if m.re is _MODULE:
            self._module_entry(entry, m, value, part)
        else:
            api = self.api_names.get(entry, m.group("api"))
            self._call(entry, "api", m.group("prefix"), api, api, self._module_of(entry),
                       int(m.group("index")), m.group("what"), value)

    def _undo(self, mark: Tuple[int, int, int, int]) -> None:
        """Drop what an entry that failed to read had added (its records, files, counters)."""
        count, self.seq, self.order, files = mark
        for column in self.rows.values():
            del column[count:]
        del self.shapes[count:]
        del self.step._files[files:]

    def _events(self) -> List[Tuple[str, "re.Match[str]", str]]:
        """(entry, name match, part) in the order precdbg records them: msprobe writes a
        module's forward entry when the call returns, after the calls inside it; its inputs
        (part "inputs") go before the first of those (outer modules first, as the calls
        began), its outputs (part "outputs") where msprobe wrote it."""
        names = [e for e, v in self.entries.items() if isinstance(v, dict)]
        position = {e: i for i, e in enumerate(names)}
        begins: Dict[str, int] = {}
        depth: Dict[str, int] = {}
        for i, entry in enumerate(names):
            parent, seen = self.parents.get(entry), 0
            while isinstance(parent, str) and parent in position and seen < 64:
                begins[parent] = min(begins.get(parent, position[parent]), i)
                parent, seen = self.parents.get(parent), seen + 1
        for entry in names:
            parent, d = self.parents.get(entry), 0
            while isinstance(parent, str) and parent in position and d < 64:
                parent, d = self.parents.get(parent), d + 1
            depth[entry] = d
        events: List[Tuple[Tuple[int, int], str, "re.Match[str]", str]] = []
        for i, entry in enumerate(names):
            m = _MODULE.match(entry) or _API.match(entry)
            if m is None:
                continue
            if m.re is _MODULE and m.group("what") == "forward":
                events.append(((begins.get(entry, i), depth.get(entry, 0)), entry, m, "inputs"))
                events.append(((i, 1 << 20), entry, m, "outputs"))
            else:
                events.append(((i, 1 << 20), entry, m, "all"))
        events.sort(key=lambda e: e[0])
        return [(entry, m, part) for _, entry, m, part in events]

    def _module_entry(self, entry: str, m: "re.Match[str]", value: Dict[str, Any],
                      part: str) -> None:
        path, cls, what = m.group("path") or "", m.group("cls"), m.group("what")
        self.modules.setdefault(path, cls)
        if what == "parameters_grad":
            for leaf, tensors in value.items():
                items = tensors if isinstance(tensors, list) else [tensors]
                for t in items[:1]:
                    if isinstance(t, dict) and "shape" in t:
                        full, op = self._param_name(path, leaf)
                        self._record(f"Param.{full}.grad", "param_grad", "Param", full, op,
                                     path, "backward", "param_grad", "backward", 0, "", 0, 0,
                                     -1, _Tensor(t))
                        self._alias(path, leaf)
            return
        self._call(entry, "module", m.group("prefix"), cls, cls, path, int(m.group("index")),
                   what, value, part)
        if what == "forward" and part == "inputs" and isinstance(value.get("parameters"), dict):
            for leaf, t in value["parameters"].items():
                full, op = self._param_name(path, leaf)
                if full in self.params_seen or not isinstance(t, dict) or "shape" not in t:
                    continue
                self._record(f"Param.{full}", "param", "Param", full, op, path, "none",
                             "param", "setup", 0, leaf, 0, 0, -1, _Tensor(t))
                self._alias(path, leaf)
                self.params_seen.add(full)

    def _param_name(self, path: str, leaf: str) -> Tuple[str, str]:
        """(full name, op) of a parameter as precdbg records it: the framework's own name, and
        PyTorch's leaf name as its op in every framework (MindSpore's `gamma` is `weight`)."""
        return (f"{path}.{leaf}" if path else leaf), torch_param_leaf(self.framework, leaf)

    def _alias(self, path: str, leaf: str) -> None:
        """The last record's alias: the parameter's name in PyTorch's convention where it
        differs (precdbg's param_alias: MindSpore `ln1.gamma` is `ln1.weight`)."""
        op = torch_param_leaf(self.framework, leaf)
        if op != leaf:
            self.rows["alias"][-1] = f"{path}.{op}" if path else op

    def _call(self, entry: str, kind: str, prefix: str, api: str, op_name: str, module: str,
              index: int, what: str, value: Dict[str, Any], part: str = "all") -> None:
        key = (kind, prefix, api if kind == "api" else f"{module}|{api}", index)
        op = canonical_op(op_name)
        stack = self.stack_of.get(entry, -1)
        if entry in self.api_names:               # read under precdbg's name of the operator
            entry = f"{prefix}.{api}.{index}.{what}"
        if what == "forward":
            phase = "optimizer" if self.parents.get(entry) == "optimizer" else "forward"
            if part == "outputs":
                for i, akey, t in tensor_results(_decode(value.get("output") or []),
                                                 _is_tensor):
                    self._record(entry, kind, prefix, api, op, module, "forward", "output",
                                 phase, i, akey, index, self.order_of.get(key, 0), stack, t)
                return
            self.order += 1
            order = self.order_of[key] = self.order
            args = _decode(value.get("input_args") or [])
            kwargs = _decode(value.get("input_kwargs") or {})
            inputs, values = call_arguments(tuple(args) if isinstance(args, list) else (),
                                            kwargs if isinstance(kwargs, dict) else {},
                                            _is_tensor, _dtype_value)
            for i, akey, t in inputs:
                self._record(entry, kind, prefix, api, op, module, "forward", "input", phase, i,
                             akey, index, order, stack, t)
            for i, (akey, v) in enumerate(values, len(inputs)):
                self._value(entry, kind, prefix, api, op, module, phase, i, akey, index, order,
                            stack, v)
            if part == "inputs":
                return
            for i, akey, t in tensor_results(_decode(value.get("output") or []), _is_tensor):
                self._record(entry, kind, prefix, api, op, module, "forward", "output", phase, i,
                             akey, index, order, stack, t)
            return
        order = self.order_of.get(key, 0)
        for field, role in (("input", "grad_output"), ("output", "grad_input")):
            items = value.get(field) or []
            for i, t in enumerate(items if isinstance(items, list) else [items]):
                if isinstance(t, dict) and "shape" in t:
                    self._record(entry, kind, prefix, api, op, module, "backward", role,
                                 "backward", i, str(i), index, order, -1, _Tensor(t))

    def _base(self, entry: str, kind: str, prefix: str, api: str, op: str, module: str,
              direction: str, role: str, phase: str, arg_index: int, arg_key: str,
              call_index: int, order: int, stack: int) -> None:
        self.seq += 1
        r = self.rows
        for name, v in (("entry", entry), ("kind", kind), ("prefix", prefix), ("api", api),
                        ("op", op), ("module", module), ("direction", direction),
                        ("role", role), ("phase", phase), ("arg_index", arg_index),
                        ("arg_key", arg_key), ("call_index", call_index), ("order", order),
                        ("seq", self.seq), ("alias", ""), ("trainable", role == "param"),
                        ("stack_id", stack), ("tensor_id", -1), ("producer", NO_PRODUCER),
                        ("storage", -1), ("precision", ""), ("pos_mean", float("nan"))):
            r[name].append(v)

    def _record(self, entry: str, kind: str, prefix: str, api: str, op: str, module: str,
                direction: str, role: str, phase: str, arg_index: int, arg_key: str,
                call_index: int, order: int, stack: int, t: _Tensor) -> None:
        self._base(entry, kind, prefix, api, op, module, direction, role, phase, arg_index,
                   arg_key, call_index, order, stack)
        d, r = t.d, self.rows
        shape = tuple(int(s) for s in (d.get("shape") or []))
        self.shapes.append(shape)
        r["dtype"].append(_dtype_name(d.get("dtype")))
        r["numel"].append(int(np.prod(shape)) if shape else 1)
        for name, key in (("min", "Min"), ("max", "Max"), ("mean", "Mean"), ("norm", "Norm")):
            r[name].append(_number(d.get(key)))
        nan, inf = _nonfinite(d)
        r["nan_count"].append(nan)
        r["inf_count"].append(inf)
        r["checksum"].append(str(d.get("md5") or ""))
        r["text"].append("")
        offset = -1
        name = d.get("data_name")
        if name:
            path = os.path.join(self.tensor_dir, str(name))
            if os.path.isfile(path):
                offset = len(self.step._files)
                self.step._files.append(path)
            else:
                self.missing_files += 1
        r["data_offset"].append(offset)
        r["data_nbytes"].append(0)

    def _value(self, entry: str, kind: str, prefix: str, api: str, op: str, module: str,
               phase: str, arg_index: int, arg_key: str, call_index: int, order: int,
               stack: int, value: Any) -> None:
        self._base(entry, kind, prefix, api, op, module, "forward", "input", phase, arg_index,
                   arg_key, call_index, order, stack)
        r = self.rows
        self.shapes.append(())
        r["dtype"].append(DTYPE_VALUE if isinstance(value, DtypeName) else scalar_dtype(value))
        r["numel"].append(1)
        number = float(value) if isinstance(value, (bool, int, float)) else float("nan")
        for name in ("min", "max", "mean"):
            r[name].append(number)
        r["norm"].append(abs(number))
        r["nan_count"].append(int(number != number) if isinstance(value, float) else 0)
        r["inf_count"].append(int(number in (float("inf"), float("-inf"))))
        r["checksum"].append("")
        r["text"].append(str(value) if isinstance(value, str) else repr(value))
        r["data_offset"].append(-1)
        r["data_nbytes"].append(0)

    def _module_tree(self) -> List[Tuple[str, str, str]]:
        """(path, class, parent path) of every module seen, with the containers msprobe does
        not record (the root, a ModuleList) as modules of unknown class."""
        tree = {"": ""}
        for path, cls in self.modules.items():
            tree[path] = cls
            parts = path.split(".")
            for k in range(1, len(parts)):
                tree.setdefault(".".join(parts[:k]), "")
        return [(escape_controls(p), escape_controls(tree[p]),
                 escape_controls(p.rpartition(".")[0] if p else "")) for p in
                sorted(tree, key=lambda p: (p.count("."), p))]

    def _arrays(self) -> Dict[str, np.ndarray]:
        out: Dict[str, np.ndarray] = {}
        count = len(self.rows["entry"])
        for name, dtype in RECORD_COLUMNS:
            values = self.rows[name]
            out[name] = np.array(values, dtype=dtype) if dtype is not None else \
                (escape_column(np.array(values, dtype=str)) if count
                 else np.array([], dtype="<U1"))
        shape = np.full((count, MAX_NDIM), -1, dtype=np.int64)
        for i, s in enumerate(self.shapes):
            shape[i, :len(s)] = s[:MAX_NDIM]
        out["shape"] = shape
        out["ndim"] = np.array([min(len(s), MAX_NDIM) for s in self.shapes], dtype=np.int32)
        out["step"] = np.full(count, self.step.step, dtype=np.int64)
        out["rank"] = np.full(count, self.step.rank, dtype=np.int64)
        out["part"] = np.zeros(count, dtype=np.int32)
        return out
