"""The dump on disk: its layout, writing it safely, reading it back.

Write side (used by capture): `layout` names every folder and file of a dump; `writer` is the one
background thread that owns every file, fed by a byte-bounded queue; `step_file` is one HDF5
step file being written (`.partial`, fsync, rename); `disk_room` reserves room before HDF5
writes; `rank_lock` keeps one process per folder and rank; `dump_folder` says whether a debugger
may dump into a folder; `json_files` writes run.json atomically; `process_exit` (with the C
`_termguard`) finishes every stopped step however the process ends. Read side: `reader` opens a
dump as numpy columns, tensors lazily; `msprobe_dump` (with `torch_file` for its `.pt` tensors)
reads msprobe's dump folders as the same records, and `common_records` narrows a precdbg dump and
an msprobe dump to what both tools record.

Imports: precdbg.errors, precdbg.records
"""
from __future__ import annotations

from .reader import Dump, RecordTable, open_dump

__all__ = ["open_dump", "Dump", "RecordTable"]
