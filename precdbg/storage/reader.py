"""Open a dump: records as numpy columns, tensors lazily.

`open_dump(path)` takes a dump root (with run.json and step<S>/ folders), one step folder, or one
step file; or an msprobe dump (its dump path, a step folder, a rank folder or its dump.json: read
by `msprobe_dump`, `Dump.source` "msprobe"). Incomplete files (`*.partial`, left by a crash) are skipped and listed in `.partial`.
A dump's step files are known by their names and opened when first read, so a damaged one stops
only what reads it (one line naming it), never a command asked for another step.
"""
from __future__ import annotations

import bisect
import functools
import json
import os
from typing import Any, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DumpError
from .layout import PARTIAL, parse_step_file, run_json_path, step_folders, step_of_folder
from .msprobe_dump import MsprobeStep, msprobe_step_folders
from ..records.controls import escape_column, escape_controls, has_controls_utf8
from ..records.schema import ADDED_COLUMNS, READ_SCHEMA_VERSIONS, RECORD_COLUMNS, scalar_mask

__all__ = ["open_dump", "Dump", "RecordTable"]

_STRING_COLUMNS = {name for name, dtype in RECORD_COLUMNS if dtype is None}
# what h5py raises for a damaged file: a failed read (OSError), an object whose metadata does
# not check out (KeyError, RuntimeError), a dataset of the wrong kind (ValueError, TypeError)
_DAMAGED = (OSError, KeyError, RuntimeError, ValueError, TypeError)


def _readable(method: Any) -> Any:
    """A step-file method whose h5py failures become one DumpError naming the file."""
    @functools.wraps(method)
    def reading(self: "_StepFile", *args: Any) -> Any:
        try:
            return method(self, *args)
        except DumpError:
            raise
        except _DAMAGED as exc:
            raise DumpError(f"{self.path}: not a readable HDF5 step file ({exc})") from None
    return reading


class RecordTable:
    """Records as columns (numpy arrays of equal length), with `step` and `rank` added."""

    def __init__(self, columns: Dict[str, np.ndarray]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["entry"]) if "entry" in self.columns else 0

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"no record column {name!r}; columns: {sorted(self.columns)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def select(self, mask: Any) -> "RecordTable":
        return RecordTable({k: v[mask] for k, v in self.columns.items()})

    def row(self, i: int) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for name, column in self.columns.items():
            value = column[i]
            if name == "shape":
                ndim = int(self.columns["ndim"][i])
                value = tuple(int(d) for d in value[:ndim])
            elif isinstance(value, np.generic):
                value = value.item()
            out[name] = value
        return out

    def rows(self) -> Iterator[Dict[str, Any]]:
        for i in range(len(self)):
            yield self.row(i)

    @property
    def key(self) -> np.ndarray:
        """`<entry>.<role>.<arg_index>`: the name a tensor is fetched by."""
        return np.char.add(np.char.add(np.char.add(self["entry"], "."), self["role"]),
                           np.char.add(".", self["arg_index"].astype(str)))


def _concat(tables: Sequence[Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    if not tables:
        return {}
    if len(tables) == 1:
        return tables[0]
    return {name: np.concatenate([t[name] for t in tables]) for name in tables[0]}


class _StepFile:
    """One step file, opened when first read: a dump's files are known by their names
    (`step<S>/rank<R>[.part<K>].h5`), so a damaged file stops only what reads it (a command
    asked for another step never opens it). A file outside that layout is opened at once and
    known by what it holds."""

    def __init__(self, path: str, step: Optional[int] = None, rank: Optional[int] = None,
                 part: int = 0) -> None:
        self.path = path
        self._file: Any = None
        self._attrs: Optional[Dict[str, Any]] = None
        self._blobs: Optional[List[Tuple[int, Any]]] = None
        self.step, self.rank, self.part = step if step is not None else -1, rank or 0, part
        self._named = step is not None and rank is not None
        if not self._named:
            self._open()

    @property
    def file(self) -> Any:
        if self._file is None:
            self._open()
        return self._file

    @property
    def attrs(self) -> Dict[str, Any]:
        if self._attrs is None:
            self._open()
        return self._attrs  # type: ignore[return-value]

    def _open(self) -> None:
        import h5py
        try:
            handle = h5py.File(self.path, "r")
        except PermissionError:
            raise DumpError(f"{self.path}: permission denied") from None
        except OSError as exc:
            raise DumpError(f"{self.path}: not a readable HDF5 step file ({exc})") from None
        try:
            self._read_attrs(handle)
        except BaseException:
            handle.close()
            raise
        self._file = handle

    @_readable
    def _read_attrs(self, handle: Any) -> None:
        attrs = handle.attrs
        if "schema_version" not in attrs or "records" not in handle:
            raise DumpError(f"{self.path}: an HDF5 file, but not a precdbg step file")
        version = int(attrs["schema_version"])
        if version not in READ_SCHEMA_VERSIONS:
            raise DumpError(f"{self.path}: schema version {version}, this precdbg reads "
                            f"{', '.join(map(str, READ_SCHEMA_VERSIONS))}")
        held = (int(attrs["step"]), int(attrs["rank"]), int(attrs.get("part", 0)))
        if self._named and held != (self.step, self.rank, self.part):
            raise DumpError(f"{self.path}: holds step {held[0]} rank {held[1]} part {held[2]}, "
                            "not the step, rank and part its name says")
        self.step, self.rank, self.part = held
        self._attrs = {k: (v.item() if isinstance(v, np.generic) else v)
                       for k, v in attrs.items()}

    @_readable
    def columns(self) -> Dict[str, np.ndarray]:
        group = self.file["records"]
        out: Dict[str, np.ndarray] = {}
        count = int(group["entry"].shape[0])
        for name, dtype in RECORD_COLUMNS:
            if name not in group and name in ADDED_COLUMNS:   # an older schema version
                out[name] = np.full(count, ADDED_COLUMNS[name], dtype=dtype)
                continue
            data = group[name][()]
            if name in _STRING_COLUMNS:
                controls = data.size and has_controls_utf8(data.tobytes())
                data = np.char.decode(data, "utf-8") if data.size else data.astype(str)
                if controls:         # names that would drive a terminal: shown escaped
                    data = escape_column(data)
            out[name] = data
        out["shape"] = group["shape"][()]
        out["ndim"] = group["ndim"][()]
        out["step"] = np.full(count, self.step, dtype=np.int64)
        out["rank"] = np.full(count, self.rank, dtype=np.int64)
        out["part"] = np.full(count, self.part, dtype=np.int32)
        return out

    @_readable
    def read_bytes(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of the step's tensor byte space."""
        if self._blobs is None:
            blobs = [(int(ds.attrs["start"]), ds) for ds in self.file["data"].values()] \
                if "data" in self.file else []
            self._blobs = sorted(blobs, key=lambda b: b[0])
        starts = [start for start, _ in self._blobs]
        k = bisect.bisect_right(starts, offset) - 1
        if k < 0:
            raise DumpError(f"{self.path}: no tensor bytes at offset {offset}")
        start, ds = self._blobs[k]
        return ds[offset - start:offset - start + nbytes]

    def tensor(self, row: Dict[str, Any]) -> np.ndarray:
        """The stored tensor of a record of this file (a row of `columns()`)."""
        if row["data_offset"] < 0:
            raise DumpError(f"{self.path}: {row['entry']} {row['role']} {row['arg_index']} has "
                            "statistics only (dump with task 'tensor' to keep tensors)")
        raw = self.read_bytes(row["data_offset"], row["data_nbytes"])
        return _as_array(raw, row["dtype"], row["shape"])

    def notes(self) -> List[str]:
        return []

    def unrecorded(self) -> frozenset:
        return frozenset()

    @_readable
    def has(self, group: str, column: str) -> bool:
        return group in self.file and column in self.file[group]

    @_readable
    def strings(self, group: str, column: str) -> List[str]:
        if group not in self.file:
            return []
        texts = [s.decode("utf-8") if isinstance(s, bytes) else s
                 for s in self.file[group][column][()]]
        if group == "stacks":       # call sites: lines of `file:line in function`
            return [escape_controls(t, lines=True) for t in texts]
        return [escape_controls(t) for t in texts]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _as_array(raw: np.ndarray, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    if dtype == "bfloat16" or dtype.startswith("float8"):
        import ml_dtypes
        np_dtype = np.dtype(getattr(ml_dtypes, dtype))
    else:
        np_dtype = np.dtype(dtype)
    return raw.view(np_dtype).reshape(shape)


class Dump:
    """A dump on disk: `run`, `steps`, `ranks`, `records()`, `tensor()`, `modules()`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.run: Dict[str, Any] = {}
        self.partial: List[str] = []
        self._files: Dict[Tuple[int, int], List[Any]] = {}    # _StepFile or MsprobeStep
        self.source = "precdbg"          # or "msprobe": a dump msprobe wrote
        msprobe = msprobe_step_folders(path) if os.path.exists(path) else None
        if msprobe:
            self.source = MsprobeStep.source
            for step, rank, folder in msprobe:
                self._files[(step, rank)] = [MsprobeStep(folder, step, rank)]
            return
        paths = self._discover(path)
        for file_path in paths:
            step = step_of_folder(os.path.basename(os.path.dirname(file_path)))
            name = parse_step_file(os.path.basename(file_path))
            if len(paths) > 1 and step is not None and name is not None and not name.partial:
                sf = _StepFile(file_path, step, name.rank, name.part)
            else:                     # one file, or a name outside the layout: opened now
                sf = _StepFile(file_path)
            self._files.setdefault((sf.step, sf.rank), []).append(sf)
        for parts in self._files.values():
            parts.sort(key=lambda f: f.part)
        if not self._files:
            extra = f" ({len(self.partial)} incomplete .partial file(s))" if self.partial else ""
            raise DumpError(f"{path}: no complete step files found{extra}")

    def _discover(self, path: str) -> List[str]:
        if not os.path.exists(path):
            raise DumpError(f"{path}: no such dump")
        if not os.access(path, os.R_OK | (os.X_OK if os.path.isdir(path) else 0)):
            raise DumpError(f"{path}: permission denied")
        if os.path.isfile(path):
            if path.endswith(PARTIAL):
                raise DumpError(f"{path}: incomplete step file (the run stopped while writing it)")
            self._load_run(os.path.dirname(os.path.dirname(os.path.abspath(path))))
            return [path]
        step_dirs = [path] if step_of_folder(os.path.basename(os.path.normpath(path))) is not None \
            else step_folders(path)
        self._load_run(path if len(step_dirs) != 1 or step_dirs[0] != path
                       else os.path.dirname(os.path.abspath(path)))
        files: List[str] = []
        for step_dir in step_dirs:
            for name in sorted(os.listdir(step_dir)):
                parsed = parse_step_file(name)
                if name.endswith(PARTIAL):
                    self.partial.append(os.path.join(step_dir, name))
                elif parsed is not None:
                    files.append(os.path.join(step_dir, name))
        return files

    def _load_run(self, root: str) -> None:
        run_json = run_json_path(root)
        if os.path.isfile(run_json):
            try:
                with open(run_json, "r", encoding="utf-8") as handle:
                    run = json.load(handle)
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DumpError(f"{run_json}: unreadable ({exc})") from None
            if not isinstance(run, dict):
                raise DumpError(f"{run_json}: not a precdbg manifest (a JSON object is expected,"
                                f" found {type(run).__name__})")
            self.run = run

    def relabel(self, step: int, rank: int) -> None:
        """Read the one step and rank this dump holds as `step`, `rank` (two named files of
        different steps or ranks compared with each other)."""
        if len(self._files) != 1:
            raise DumpError(f"{self.path}: holds {len(self._files)} steps/ranks, not one")
        parts = next(iter(self._files.values()))
        for sf in parts:
            sf.step, sf.rank = step, rank
        self._files = {(step, rank): parts}

    def setting(self, key: str) -> str:
        """A run-wide setting (`framework`, `task`, `level`): from run.json, or, where it is
        missing, from the step files, which repeat it."""
        value = self.run.get(key)
        if not value and isinstance(self.run.get("config"), dict):
            value = self.run["config"].get(key)
        if not value:
            value = next((parts[0].attrs.get(key) for parts in self._files.values()
                          if parts[0].attrs.get(key)), "")
        return str(value or "")

    @property
    def steps(self) -> List[int]:
        return sorted({s for s, _ in self._files})

    def warnings(self, only: Optional[Collection[Tuple[int, int]]] = None) -> List[str]:
        """Step files that are complete on disk but not a whole step: captured while the
        process ended (no stop() ran), or with failures inside precdbg while capturing.
        `only`: the (step, rank) pairs to look at (default: all)."""
        out: List[str] = []
        for (step, rank), parts in sorted(self._files.items()):
            if only is not None and (step, rank) not in only:
                continue
            for sf in parts:
                where = f"step {step} rank {rank}" + (f" part {sf.part}" if sf.part else "")
                try:
                    sf.attrs
                except DumpError:      # a damaged file: what reads it says so, in one line
                    continue
                if sf.attrs.get("interrupted"):
                    out.append(f"{where}: interrupted (the process ended before stop()); "
                               "the step is incomplete")
                failures = int(sf.attrs.get("failures", 0) or 0)
                if failures:
                    out.append(f"{where}: {failures} failure(s) inside precdbg while capturing; "
                               "some records may be missing")
        return out

    def notes(self, only: Optional[Collection[Tuple[int, int]]] = None) -> List[str]:
        """What the tool that wrote the dump left out of a step that is still read (msprobe: a
        missing construct.json or stack.json, absent tensor files), one line each naming the
        file. `only`: the (step, rank) pairs to look at (default: all)."""
        out: List[str] = []
        for (step, rank), parts in sorted(self._files.items()):
            if only is not None and (step, rank) not in only:
                continue
            for sf in parts:
                try:
                    out.extend(sf.notes())
                except DumpError:      # a damaged file: what reads it says so, in one line
                    continue
        return out

    @property
    def ranks(self) -> List[int]:
        return sorted({r for _, r in self._files})

    def files(self, step: Optional[int] = None, rank: Optional[int] = None) -> List[Any]:
        out = []
        for (s, r), parts in sorted(self._files.items()):
            if (step is None or s == step) and (rank is None or r == rank):
                out.extend(parts)
        return out

    def _asked(self, step: Optional[int], rank: Optional[int]) -> List[Any]:
        """The files of a step and rank asked for by number: a DumpError when there are none."""
        files = self.files(step, rank)
        if not files and (step is not None or rank is not None):
            raise DumpError(f"{self.path}: no step {step if step is not None else '*'} rank "
                            f"{rank if rank is not None else '*'} (steps {self.steps}, "
                            f"ranks {self.ranks})")
        return files

    def records(self, step: Optional[int] = None, rank: Optional[int] = None) -> RecordTable:
        files = self._asked(step, rank)
        return RecordTable(_concat([f.columns() for f in files]))

    def tensor(self, key: str, step: Optional[int] = None, rank: Optional[int] = None
               ) -> np.ndarray:
        """A stored tensor by `<entry>.<role>.<arg_index>`, e.g.
        `Functional.linear.0.forward.output.0`, or by entry name alone when the entry holds one
        tensor (`Param.fc.weight.grad`); bf16 comes back as ml_dtypes.bfloat16."""
        for sf in self.files(step, rank):
            table = RecordTable(sf.columns())
            hits = np.nonzero(table.key == key)[0]
            if len(hits) > 1:       # the same call's backward ran twice (retain_graph, a
                raise DumpError(   # gradient penalty): its records share their key
                    f"{self.path}: {key!r} names {len(hits)} records (a backward that ran "
                    "more than once over one graph); read them with records() and "
                    "tensor_at(table, row), in the order of their `seq`")
            if not len(hits):
                hits = np.nonzero((table["entry"] == key)
                                  & ~scalar_mask(table["dtype"]))[0]
                if len(hits) > 1:
                    choices = ", ".join(sorted(set(table.key[hits].tolist()))[:6])
                    raise DumpError(f"{self.path}: {key!r} holds {len(hits)} tensors; name one "
                                    f"of {choices}")
            if len(hits):
                return self._tensor_of(sf, table.row(int(hits[0])))
        raise DumpError(f"{self.path}: no record {key!r}" +
                        (f" in step {step}" if step is not None else ""))

    def tensor_at(self, table: RecordTable, i: int) -> np.ndarray:
        """The stored tensor of row i of a table returned by `records()`."""
        row = table.row(i)
        for sf in self._files.get((row["step"], row["rank"]), []):
            if sf.part == row["part"]:
                return self._tensor_of(sf, row)
        raise DumpError(f"{self.path}: step {row['step']} rank {row['rank']} is not open")

    @staticmethod
    def _tensor_of(sf: Any, row: Dict[str, Any]) -> np.ndarray:
        return sf.tensor(row)

    def modules(self, step: Optional[int] = None, rank: Optional[int] = None
                ) -> List[Tuple[str, str, str]]:
        for sf in self._asked(step, rank):
            paths = sf.strings("modules", "path")
            if paths:
                return list(zip(paths, sf.strings("modules", "cls"), sf.strings("modules", "parent")))
        return []

    def module_settings(self, step: Optional[int] = None, rank: Optional[int] = None
                        ) -> Dict[str, Tuple[str, Dict[str, Any]]]:
        """path -> (class, numeric layer settings) of every module of the step's module tree,
        e.g. `{"blocks.0.ln_1": ("LayerNorm", {"eps": 1e-05})}` (see precdbg.records.layers; a file
        written before settings were recorded gives empty settings)."""
        from ..records.layers import parse_settings
        for sf in self._asked(step, rank):
            paths = sf.strings("modules", "path")
            if paths:
                texts = sf.strings("modules", "settings") if sf.has("modules", "settings") \
                    else [""] * len(paths)
                return {p: (c, parse_settings(t)) for p, c, t in
                        zip(paths, sf.strings("modules", "cls"), texts)}
        return {}

    def optimizers(self, step: int, rank: int) -> Optional[List[Dict[str, Any]]]:
        """The optimizers that stepped while this step was captured, with the settings the
        step used (class, per param group its hyperparameters and parameter names), in the
        order they first stepped; None when the step's files do not say (written before they
        did, or no optimizer stepped inside a window of this step)."""
        found: Optional[List[Dict[str, Any]]] = None
        for sf in self.files(step, rank):
            text = sf.attrs.get("optimizers")
            if not text:
                continue
            try:
                listed = json.loads(text)
            except ValueError:
                raise DumpError(f"{sf.path}: attribute 'optimizers' is not JSON") from None
            if not isinstance(listed, list):
                raise DumpError(f"{sf.path}: attribute 'optimizers' is not a list")
            found = found or []
            known = {opt.get("id") for opt in found if isinstance(opt, dict)}
            found.extend(opt for opt in listed if isinstance(opt, dict)
                         and opt.get("id") not in known)
        return found

    def unrecorded(self, step: int, rank: int) -> frozenset:
        """Entries the tool that wrote the dump saw but did not record (msprobe: the calls its
        risk level skips); empty for precdbg's dumps."""
        out: frozenset = frozenset()
        for sf in self.files(step, rank):
            out |= sf.unrecorded()
        return out

    def stacks(self, step: int, rank: int = 0, part: int = 0) -> List[str]:
        for sf in self._files.get((step, rank), []):
            if sf.part == part:
                return sf.strings("stacks", "text")
        return []

    def close(self) -> None:
        for parts in self._files.values():
            for sf in parts:
                sf.close()

    def __enter__(self) -> "Dump":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_dump(path: str) -> Dump:
    """Open a dump root, a step folder or one step file."""
    return Dump(os.fspath(path))
