"""Open a dump: records as numpy columns, tensors lazily.

`open_dump(path)` takes a dump root (with run.json and step<S>/ folders), one step folder, or one
step file; or an msprobe dump (its dump path, a step folder, a rank folder or its dump.json: read
by `msprobe_dump`, `Dump.source` "msprobe"). Incomplete files (`*.partial`, left by a crash)
are skipped and listed in `.partial`. A dump's step files are known by their names and opened
when first read (`step_reader.StepFile`, checked as `step_checks` says), so a damaged one stops
only what reads it (one line naming it), never a command asked for another step.
"""
from __future__ import annotations

import json
import os
from typing import Any, Collection, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DumpError
from .layout import PARTIAL, parse_step_file, run_json_path, step_folders, step_of_folder
from .msprobe_dump import MsprobeStep, msprobe_step_folders
from ..records.schema import scalar_mask
from .json_reading import check_run_json, read_json
from .step_checks import regular_file
from .step_reader import StepFile, step_status

__all__ = ["open_dump", "Dump", "RecordTable"]


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
            if name == "shape":
                ndim = int(self.columns["ndim"][i])
                value = tuple(int(d) for d in column[i][:ndim])
            elif isinstance(column, np.ndarray) and column.ndim == 1:
                value = column.item(i)         # the Python value, as column[i].item() gives
            else:
                value = column[i]
                if isinstance(value, np.generic):
                    value = value.item()
            out[name] = value
        return out

    def rows_of(self, indices: Any) -> List[Dict[str, Any]]:
        """`[self.row(i) for i in indices]`, each column read once for all of them."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(idx):
            return []
        names = list(self.columns)
        values: List[List[Any]] = []
        for name in names:
            column = self.columns[name]
            if name == "shape":
                ndims = self.columns["ndim"][idx].tolist()
                values.append([tuple(dims[:ndim]) for dims, ndim      # Python ints
                               in zip(column[idx].tolist(), ndims)])
            elif isinstance(column, np.ndarray) and column.ndim == 1:
                values.append(column[idx].tolist())
            else:
                values.append([self.row(int(i))[name] for i in idx.tolist()])
        return [dict(zip(names, found)) for found in zip(*values)]

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


class Dump:
    """A dump on disk: `run`, `steps`, `ranks`, `records()`, `tensor()`, `modules()`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.run: Dict[str, Any] = {}
        self.partial: List[str] = []
        self._files: Dict[Tuple[int, int], List[Any]] = {}    # StepFile or MsprobeStep
        # (step, rank) -> module_settings, while those files are open
        self._settings: Dict[Tuple[Optional[int], Optional[int]], Dict[str, Any]] = {}
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
                sf = StepFile(file_path, step, name.rank, name.part)
            else:                     # one file, or a name outside the layout: opened now
                sf = StepFile(file_path)
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
        if not os.path.isdir(path):
            regular_file(path)              # a FIFO or a device is never opened
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
        if os.path.lexists(run_json):
            self.run = check_run_json(read_json(run_json, "run.json"), run_json)

    def relabel(self, step: int, rank: int) -> None:
        """Read the one step and rank this dump holds as `step`, `rank` (two named files of
        different steps or ranks compared with each other)."""
        if len(self._files) != 1:
            raise DumpError(f"{self.path}: holds {len(self._files)} steps/ranks, not one")
        parts = next(iter(self._files.values()))
        self._settings.clear()
        for sf in parts:
            if isinstance(sf, StepFile):
                sf.relabel(step, rank)
            else:
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
                    status = step_status(sf)
                except DumpError:      # a damaged file: what reads it says so, in one line
                    continue
                if status.get("interrupted"):
                    out.append(f"{where}: interrupted (the process ended before stop()); "
                               "the step is incomplete")
                failures = int(status.get("failures", 0) or 0)
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
        if step is not None and rank is not None:      # one (step, rank): no walk of them all
            return list(self._files.get((step, rank), ()))
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

    def records(self, step: Optional[int] = None, rank: Optional[int] = None,
                keep: bool = False) -> RecordTable:
        """The records of a step and rank (every step and rank when None). `keep`: the step
        files keep a copy of what they read for the next read of them, which takes it
        (step_reader; the check, read again by the compare)."""
        files = self._asked(step, rank)
        return RecordTable(_concat([f.columns(keep=True) if keep and isinstance(f, StepFile)
                                    else f.columns() for f in files]))

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
        written before settings were recorded gives empty settings). Parsed once while the
        step's files stay open (the check and the compare each ask), a new outer dict each
        time; the settings themselves are shared: not to be changed."""
        key = (step, rank)
        known = self._settings.get(key)
        if known is None:
            known = self._settings[key] = self._read_module_settings(step, rank)
        return dict(known)

    def _read_module_settings(self, step: Optional[int], rank: Optional[int]
                              ) -> Dict[str, Tuple[str, Dict[str, Any]]]:
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

    def release_kept(self) -> None:
        """Let go of the record columns the step files keep for their next read
        (step_reader.StepFile.columns): for a caller that will not read them again in this
        process (the compare's ranks read in worker processes)."""
        for parts in self._files.values():
            for sf in parts:
                release = getattr(sf, "release_kept", None)
                if release is not None:
                    release()

    def release(self, step: int, rank: int, unless_kept: bool = False,
                forget: bool = False) -> None:
        """Close the step files of (step, rank) once read (a compare goes on with other ranks:
        one (step, rank) open at a time); reading them again opens them again. `unless_kept`:
        not those keeping a copy of their columns for the next read; `forget`: their
        attributes let go of too (read again if asked: a caller done with the files, some
        14 KB each as Python objects, 29 MB over 1,024 ranks of two dumps)."""
        self._settings.clear()
        for sf in self._files.get((step, rank), []):
            if isinstance(sf, StepFile) and not (unless_kept and sf.keeps_columns):
                sf.close(forget)

    def close(self) -> None:
        self._settings.clear()
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
