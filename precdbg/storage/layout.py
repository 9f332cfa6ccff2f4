"""The layout of a dump on disk, defined once: every folder and file name is made and recognised
here, and nowhere else.

```
<dump>/run.json                          what the run is, and its manifest
<dump>/step<S>/rank<R>.h5                one step of one rank (schema: precdbg.records.schema)
<dump>/step<S>/rank<R>.part<K>.h5        a second capture window of that step and rank (K >= 1)
<dump>/step<S>/rank<R>[.part<K>].h5.partial   being written (renamed when complete)
<dump>/previous/<when>/                  an earlier run's dump, moved aside by a rerun (a dump
                                         of the same layout; <when>: its first file's time)
```
"""
from __future__ import annotations

import dataclasses
import glob
import os
import re
from typing import List, Optional

__all__ = ["RUN_JSON", "PARTIAL", "StepFileName", "run_json_path", "step_folder",
           "step_file_path", "partial_path", "step_of_folder", "parse_step_file",
           "is_step_file_name", "step_folders", "rank_files", "dump_files", "dump_root",
           "would_overwrite_dump", "PREVIOUS", "previous_runs"]

RUN_JSON = "run.json"
PARTIAL = ".partial"            # suffix of a step file being written
PREVIOUS = "previous"           # <dump>/previous/<when>/: earlier runs, moved aside by a rerun

_STEP_FOLDER = re.compile(r"^step(\d+)$")
_STEP_FILE = re.compile(r"^rank(\d+)(?:\.part(\d+))?\.h5(\.partial)?$")


@dataclasses.dataclass(frozen=True)
class StepFileName:
    """What a step file's name says: its rank, its part, whether it is still being written."""
    rank: int
    part: int
    partial: bool


def run_json_path(root: str) -> str:
    return os.path.join(root, RUN_JSON)


def step_folder(root: str, step: int) -> str:
    return os.path.join(root, f"step{step}")


def step_file_path(root: str, step: int, rank: int, part: int = 0) -> str:
    """The final name of a step file (`partial_path` while it is written)."""
    name = f"rank{rank}.h5" if part == 0 else f"rank{rank}.part{part}.h5"
    return os.path.join(step_folder(root, step), name)


def partial_path(final_path: str) -> str:
    return final_path + PARTIAL


def step_of_folder(name: str) -> Optional[int]:
    """The step a folder's base name stands for (`step12` -> 12), or None."""
    match = _STEP_FOLDER.match(name)
    return int(match.group(1)) if match else None


def parse_step_file(name: str) -> Optional[StepFileName]:
    """What a file's base name says, when it is a step file's (being written or complete)."""
    match = _STEP_FILE.match(name)
    if match is None:
        return None
    return StepFileName(int(match.group(1)), int(match.group(2) or 0), bool(match.group(3)))


def is_step_file_name(name: str) -> bool:
    return _STEP_FILE.match(name) is not None


def step_folders(root: str) -> List[str]:
    """The step folders of a dump root, in name order."""
    return sorted(d for d in glob.glob(os.path.join(root, "step*"))
                  if os.path.isdir(d) and step_of_folder(os.path.basename(d)) is not None)


def rank_files(root: str, rank: int) -> List[str]:
    """Every step file of one rank in a dump root (complete or being written)."""
    found = glob.glob(os.path.join(root, "step*", f"rank{rank}.*h5*"))
    return sorted(path for path in found
                  if step_of_folder(os.path.basename(os.path.dirname(path))) is not None
                  and (parsed := parse_step_file(os.path.basename(path))) is not None
                  and parsed.rank == rank)


def dump_files(root: str) -> List[str]:
    """Every file of a dump root: run.json (where present) and its step files."""
    found = glob.glob(os.path.join(root, "step*", "rank*.h5*"))
    steps = sorted(path for path in found
                   if step_of_folder(os.path.basename(os.path.dirname(path))) is not None
                   and is_step_file_name(os.path.basename(path)))
    return [run_json_path(root)] + steps


def dump_root(path: str) -> str:
    """The root folder of the dump that `path` (a root, a step folder or a step file) is in."""
    path = os.path.abspath(path)
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if step_of_folder(os.path.basename(path)) is not None:
        path = os.path.dirname(path)
    return path


def previous_runs(root: str) -> List[str]:
    """The earlier runs moved aside in a dump root (`<dump>/previous/<when>/`), oldest first."""
    folder = os.path.join(root, PREVIOUS)
    return [os.path.join(folder, name) for name in sorted(_names(folder))
            if os.path.isdir(os.path.join(folder, name))]


def would_overwrite_dump(target: str) -> bool:
    """Whether writing the file `target` would overwrite part of a dump: a dump's run.json
    (beside its step folders), or anything in a step folder that holds step files."""
    folder = os.path.dirname(target)
    if step_of_folder(os.path.basename(folder)) is not None:
        return any(is_step_file_name(name) for name in _names(folder))
    return os.path.basename(target) == RUN_JSON and any(
        step_of_folder(name) is not None for name in _names(folder))


def _names(folder: str) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
