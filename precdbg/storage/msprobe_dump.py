"""Read msprobe's dump folders (mindstudio-probe, PyTorch, MindSpore and mindtorch) as precdbg
records, so `compare`, `inspect`, `scan` and `check` take them wherever they take a precdbg dump.

msprobe writes `dump_path/step<S>/rank<R>/` (`proc<pid>/` when not distributed) holding
`dump.json` (task, level, framework and per entry its `input_args`, `input_kwargs`, `output`;
a backward's `input`/`output`; a module forward's `parameters`; `<module>.parameters_grad.<n>`),
`construct.json` (entry -> the module entry it ran in) and `stack.json` (call stacks), and with
task tensor `dump_tensor_data/` (`.pt` or `.npy` per tensor). Its entry names are precdbg's
(`Functional.linear.0.forward`, `Module.blocks.0.ln1.LayerNorm.forward.0`), so records pair by
name. Each entry becomes the records precdbg would have written for the call: arguments keyed
and numbered by precdbg's rule (`records.arguments`), a backward's `input` as its grad_output
(dy) and `output` as its grad_input (dx), a module's `parameters` at its first forward call as
the parameter inventory, `parameters_grad` as the weight gradients (`Param.<path>.grad`).

What msprobe does not record reads as unknown, never as a value: NaN and Inf counts (-1, "some",
where its extremes show them; 0 where they are finite), the order-sensitive mean, producers and
tensor identities (storage.common_records compares a precdbg dump with an msprobe dump on what
both hold). The records are made by `msprobe_records.StepRecords`. Damaged or partial folders:
a `dump.json` that does not parse is one DumpError naming the file; a missing `construct.json` or
`stack.json`, or a tensor file that is absent, is said by `warnings()` and the rest is read.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DumpError
from .json_reading import NotJson, read_json
from .step_checks import regular_file
from .msprobe_records import StepRecords

__all__ = ["MsprobeStep", "msprobe_step_folders"]

DUMP_JSON = "dump.json"

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank|proc)(\d+)$")
_LEVELS = {"L0": "module", "L1": "api"}       # msprobe's levels as precdbg's ("mix" is both's)
_HEAD = re.compile(r'"(task|level|framework)":\s*"([^"]*)"')


def msprobe_step_folders(path: str) -> Optional[List[Tuple[int, int, str]]]:
    """(step, rank, folder) of every step and rank an msprobe dump at `path` holds (a dump
    path, one `step<S>` folder, one `rank<R>`/`proc<pid>` folder or its dump.json); None when
    `path` is no msprobe dump. Several `proc<pid>` folders in one step (reruns into one
    dump_path) give the newest."""
    path = os.path.abspath(path)
    if os.path.isfile(path):
        if os.path.basename(path) != DUMP_JSON:
            return None
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return None
    if os.path.lexists(os.path.join(path, DUMP_JSON)):
        step = _STEP.match(os.path.basename(os.path.dirname(path)))
        rank = _RANK.match(os.path.basename(path))
        return [(int(step.group(1)) if step else 0,
                 int(rank.group(2)) if rank and rank.group(1) == "rank" else 0, path)]
    name = os.path.basename(path)
    steps = [(int(_STEP.match(name).group(1)), path)] if _STEP.match(name) else sorted(
        (int(m.group(1)), os.path.join(path, d)) for d in _listdir(path)
        for m in [_STEP.match(d)] if m and os.path.isdir(os.path.join(path, d)))
    found: List[Tuple[int, int, str]] = []
    for step, folder in steps:
        procs: List[Tuple[float, str]] = []
        for d in _listdir(folder):
            m = _RANK.match(d)
            where = os.path.join(folder, d)
            if not m or not os.path.lexists(os.path.join(where, DUMP_JSON)):
                continue
            if m.group(1) == "rank":
                found.append((step, int(m.group(2)), where))
            else:
                procs.append((os.path.getmtime(os.path.join(where, DUMP_JSON)), where))
        if procs:
            found.append((step, 0, max(procs)[1]))
    return sorted(found) or None


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


class MsprobeStep:
    """One step and rank of an msprobe dump, read as a precdbg step file: `attrs`,
    `columns()`, `strings()`, `has()`, `tensor(row)`, `warnings()`."""

    source = "msprobe"

    def __init__(self, folder: str, step: int, rank: int) -> None:
        self.folder = folder
        self.path = os.path.join(folder, DUMP_JSON)
        self.step, self.rank, self.part = step, rank, 0
        self._data: Optional[Dict[str, Any]] = None
        self._columns: Optional[Dict[str, np.ndarray]] = None
        self._modules: List[Tuple[str, str, str]] = []
        self._stacks: List[str] = []
        self._files: List[str] = []
        self._notes: List[str] = []
        self._unrecorded: frozenset = frozenset()

    # ------------------------------------------------------------------ the files
    def _load(self) -> Dict[str, Any]:
        if self._data is None:
            data = self._json(self.path, required=True)
            if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
                raise DumpError(f"{self.path}: not an msprobe dump.json (no 'data' object)")
            self._data = data
        return self._data

    def _json(self, path: str, required: bool = False) -> Any:
        if not os.path.lexists(path):
            if required:
                raise DumpError(f"{path}: missing")
            self._notes.append(f"{path}: missing; read without it")
            return None
        try:
            return read_json(path, os.path.basename(path))   # bounded (json_reading)
        except NotJson as exc:
            if required:
                raise DumpError(f"{path}: cut short or not JSON ({exc.reason})") from None
            self._notes.append(f"{path}: cut short or not JSON ({exc.reason}); read without it")
        return None

    @property
    def attrs(self) -> Dict[str, Any]:
        """framework, task and level: from the head of dump.json (msprobe writes them before
        its data), so a file cut short further on still says what it is."""
        head: Dict[str, Any] = {}
        regular_file(self.path)          # a FIFO would block the read below
        try:
            with open(self.path, "r", encoding="utf-8", errors="replace") as handle:
                text = handle.read(4096)
            head = {k: v for k, v in _HEAD.findall(text)}
        except OSError:
            pass
        if not head:
            head = self._load()
        framework = str(head.get("framework") or "pytorch").lower()
        level = str(head.get("level") or "")
        return {"framework": framework, "task": str(head.get("task") or ""),
                "level": _LEVELS.get(level, level), "source": self.source,
                "step": self.step, "rank": self.rank}

    def notes(self) -> List[str]:
        self.columns()
        return list(self._notes)

    def unrecorded(self) -> frozenset:
        """The calls msprobe saw but did not write (construct.json lists them, dump.json does
        not: the APIs its risk level skips)."""
        self.columns()
        return self._unrecorded

    # ------------------------------------------------------------------ records
    def columns(self) -> Dict[str, np.ndarray]:
        if self._columns is None:
            self._columns = StepRecords(self).build()
        return {k: v.copy() for k, v in self._columns.items()}

    def has(self, group: str, column: str) -> bool:
        self.columns()
        return (group == "modules" and column in ("path", "cls", "parent")) or \
            (group == "stacks" and column == "text")

    def strings(self, group: str, column: str) -> List[str]:
        self.columns()
        if group == "modules":
            index = ("path", "cls", "parent").index(column) if column in (
                "path", "cls", "parent") else None
            return [] if index is None else [m[index] for m in self._modules]
        if group == "stacks" and column == "text":
            return list(self._stacks)
        return []

    def tensor(self, row: Dict[str, Any]) -> np.ndarray:
        offset = int(row["data_offset"])
        if offset < 0:
            raise DumpError(f"{self.path}: {row['entry']} {row['role']} {row['arg_index']} has "
                            "statistics only (msprobe task 'tensor' keeps tensors)")
        path = self._files[offset]
        if path.endswith(".npy"):
            try:
                return _load_npy(path)
            except FileNotFoundError:
                raise DumpError(f"{path}: tensor file missing") from None
            except (OSError, ValueError) as exc:
                raise DumpError(f"{path}: not a readable .npy tensor ({exc})") from None
        from .torch_file import load_torch_tensor
        return load_torch_tensor(path)

    def close(self) -> None:
        pass


def _load_npy(path: str) -> np.ndarray:
    """A .npy tensor file, mapped first: a header declaring more than the file holds is refused
    by the mapping before anything is allocated."""
    regular_file(path)
    return np.array(np.load(path, mmap_mode="r", allow_pickle=False))
