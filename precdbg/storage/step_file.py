"""One step file being written: its HDF5 layout, the packing of stored tensors, the room check,
and the atomic publication (`.partial`, fsync, rename). Used by the writer's thread only.

Inside a step file:
  attrs           schema_version, step, rank, part, framework, task, level, ...
  records/<col>   one dataset per column of `schema.RECORD_COLUMNS`, plus `shape` (N x MAX_NDIM)
  data/<k>        contiguous byte blobs holding the stored tensors, packed; blob k has attribute
                  `start`, its offset in the step's byte space (records hold offset/nbytes there,
                  and a tensor never spans two blobs)
  modules/path, modules/cls, modules/parent   the module tree
  modules/settings  each module's numeric layer settings, JSON text ('' none; precdbg.records.layers)
  stacks/text     de-duplicated call stacks (records hold stack_id)
  attrs/integrity the seal: a checksum of each of the above and of the attributes, written when
                  the step closes and checked when read (precdbg.storage.step_checks)
"""
from __future__ import annotations

import json
import operator
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .json_files import fsync_dir
from .layout import partial_path
from .disk_room import check_room, free_space, margin_for, reserve, trim_to_hdf5_end
from .step_checks import column_digest, seal_parts, strings_digest
from ..records.schema import ENUM_COLUMNS, MAX_NDIM, RECORD_COLUMNS, Record

__all__ = ["Payload", "OpenStep", "free_space"]

_STAGE_BYTES = 32 << 20      # stored tensors are packed into contiguous blobs of about this size
_CHUNK_BYTES = 1 << 20
_RECORD_BYTES = 512           # upper estimate of one record's bytes in the record table


class Payload:
    """Host bytes of one distinct tensor: stored (tensor task) and/or hashed (checksum).
    `ready`: what the writer's thread waits on before reading `array` (a device-to-host copy
    still under way; None: the bytes are there)."""
    __slots__ = ("tensor_id", "array", "store", "checksum", "ready")

    def __init__(self, tensor_id: int, array: np.ndarray, store: bool, checksum: bool,
                 ready: Optional[Callable[[], None]] = None) -> None:
        self.tensor_id, self.array, self.store, self.checksum = tensor_id, array, store, checksum
        self.ready = ready


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


# The descriptors of the step files this process has open for writing. A child forked while
# one is open inherits HDF5's open file with it, and when the child ends, HDF5 closes that
# file: it flushes the child's copy of the file's state, taken at the fork, into the parent's
# file, over what the parent wrote since (a stopped step turned unreadable). A plain dict read
# in the child without a lock: a lock held by the parent's writer thread at the fork would
# never be released there.
_WRITING: Dict[int, str] = {}


def disown_after_fork() -> None:
    """In a forked child: point every inherited descriptor of a step file being written at
    /dev/null, so whatever the child's HDF5 flushes there when it ends goes nowhere. Only OS
    calls (HDF5's own lock may be held by the parent's writer thread at the fork)."""
    if not _WRITING:
        return
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in list(_WRITING):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)
    _WRITING.clear()


class OpenStep:
    """State of the step file being written (owned by the writer thread)."""

    def __init__(self, final_path: str, attrs: Dict[str, Any], compression: Optional[str]) -> None:
        self.final_path = final_path
        self.partial_path = partial_path(final_path)
        self.attrs = attrs
        self._file: Any = None
        self._fd = -1
        self.compression = compression
        self.records: List[Record] = []
        self.data = None
        self.data_size = 0
        self.stage: List[np.ndarray] = []
        self.stage_bytes = 0
        self.stage_start = 0
        self.offsets: Dict[int, Tuple[int, int]] = {}
        self.checksums: Dict[int, str] = {}

    @property
    def file(self) -> Any:
        """The `.partial` HDF5 file, created when first written to (a stage of stored tensors,
        or the step's end), not when the step opens: creating it holds the interpreter lock
        for ~1.3 ms, which `start()` would otherwise wait for while it hooks the model."""
        if self._file is None:
            import h5py
            os.makedirs(os.path.dirname(self.final_path), exist_ok=True)
            try:
                self._file = h5py.File(self.partial_path, "w", libver="latest")
            except BaseException:
                # HDF5 made the file before its first write failed (a full disk): a step is
                # complete or absent, never an empty `.partial`
                _remove_quietly(self.partial_path)
                raise
            try:
                self._fd = self._file.id.get_vfd_handle()
                _WRITING[self._fd] = self.partial_path
                for key, value in self.attrs.items():
                    self._file.attrs[key] = value if not isinstance(value, (dict, list)) \
                        else json.dumps(value)
            except Exception:
                self.abandon()
                raise
        return self._file

    # -- tensor bytes ------------------------------------------------------------------------
    def add_bytes(self, tensor_id: int, flat: np.ndarray) -> None:
        """Pack a tensor's bytes; a full stage becomes one contiguous blob dataset."""
        nbytes = flat.nbytes
        if self.stage and self.stage_bytes + nbytes > _STAGE_BYTES:
            self.flush_stage()
        if not self.stage:
            self.stage_start = self.data_size
        self.offsets[tensor_id] = (self.data_size, nbytes)
        self.data_size += nbytes
        self.stage.append(flat)
        self.stage_bytes += nbytes

    def flush_stage(self) -> None:
        """Write the staged tensors as one contiguous blob dataset: piece by piece through the
        low-level API (no concatenated copy), or concatenated into chunks when compressing."""
        if not self.stage:
            return
        self.check_room(self.stage_bytes)
        group = self.data if self.data is not None else self.file.create_group("data")
        self.data = group
        name, total = str(len(group)), self.stage_bytes
        if self.compression and total:
            blob = self.stage[0] if len(self.stage) == 1 else np.concatenate(self.stage)
            ds = group.create_dataset(name, data=blob, compression=self.compression,
                                      chunks=(min(_CHUNK_BYTES, total),))
        else:
            from h5py import h5s
            ds = group.create_dataset(name, shape=(total,), dtype=np.uint8)
            file_space = ds.id.get_space()
            offset = 0
            for piece in self.stage:
                if piece.nbytes:
                    file_space.select_hyperslab((offset,), (piece.nbytes,))
                    ds.id.write(h5s.create_simple((piece.nbytes,)), file_space, piece)
                    offset += piece.nbytes
        ds.attrs["start"] = self.stage_start
        self.stage, self.stage_bytes = [], 0

    # -- close ---------------------------------------------------------------------------------
    def finish(self, modules: Sequence[Tuple[str, ...]], stacks: Sequence[str],
               attrs: Optional[Dict[str, Any]] = None) -> str:
        import h5py
        for key, value in (attrs or {}).items():
            self.file.attrs[key] = value
        self.flush_stage()
        records = self.records
        for rec in records if self.offsets or self.checksums else ():
            if rec.tensor_id >= 0:
                where = self.offsets.get(rec.tensor_id)
                if where is not None:
                    rec.data_offset, rec.data_nbytes = where
                digest = self.checksums.get(rec.tensor_id)
                if digest is not None:
                    rec.checksum = digest
        self.check_room(len(records) * _RECORD_BYTES + sum(len(t) for t in stacks))
        group = self.file.create_group("records")
        group.attrs["count"] = len(records)
        seal: Dict[str, str] = {}       # each part's checksum (precdbg.storage.step_checks)
        for (column, dtype), values in zip(RECORD_COLUMNS, _columns(records)):
            if column in ENUM_COLUMNS and values:
                values = _enum_text(values)
            array = _text_column(values) if dtype is None \
                else np.fromiter(values, dtype=dtype, count=len(values))
            group.create_dataset(column, data=array)
            seal[f"records/{column}"] = column_digest(array)
        shapes, ndims = _shape_columns([rec.shape for rec in records])
        group.create_dataset("shape", data=shapes)
        group.create_dataset("ndim", data=ndims)
        seal["records/shape"], seal["records/ndim"] = column_digest(shapes), column_digest(ndims)
        mod = self.file.create_group("modules")
        str_dt = h5py.string_dtype("utf-8")
        for i, column in enumerate(("path", "cls", "parent", "settings")):
            texts = [m[i] if len(m) > i else "" for m in modules]
            mod.create_dataset(column, data=np.array(texts, dtype=object), dtype=str_dt)
            seal[f"modules/{column}"] = strings_digest(texts)
        self.file.create_group("stacks").create_dataset(
            "text", data=np.array(list(stacks), dtype=object), dtype=str_dt)
        seal["stacks/text"] = strings_digest(list(stacks))
        self.file.attrs["complete"] = True
        seal_parts(self.file, seal)       # last: it covers the attributes and the blob list
        self.file.flush()
        fd = self.file.id.get_vfd_handle()
        os.fsync(fd)
        _WRITING.pop(self._fd, None)       # before the close, whose descriptor may be reused
        self.file.close()
        trim_to_hdf5_end(self.partial_path)   # the blocks reserved past HDF5's data
        os.replace(self.partial_path, self.final_path)
        fsync_dir(os.path.dirname(self.final_path))
        return self.final_path

    def check_room(self, nbytes: int) -> None:
        """Make sure `nbytes` more (and room for HDF5's metadata) can be written before HDF5
        writes them: refused when they cannot fit, else the file's blocks are reserved up to
        there (precdbg.storage.disk_room: HDF5 does not survive a full disk met half-way)."""
        written = self._file.id.get_filesize() if self._file is not None else 0
        check_room(self.partial_path, written, nbytes)
        end = written + nbytes + margin_for(nbytes)
        reserve(self._fd_of(self.file), end)

    @staticmethod
    def _fd_of(file: Any) -> int:
        try:
            return int(file.id.get_vfd_handle())
        except Exception:  # noqa: BLE001 - a driver without a descriptor: no reservation
            return -1

    def abandon(self) -> None:
        """Close and delete the unfinished file: a step is either complete or absent."""
        if self._file is None:
            return                    # never written to: nothing on disk
        _WRITING.pop(self._fd, None)
        try:
            self._file.close()
        except Exception:  # noqa: BLE001 - already failing
            pass
        _remove_quietly(self.partial_path)


_ALL_COLUMNS = operator.attrgetter(*(column for column, _ in RECORD_COLUMNS))


def _columns(records: Sequence[Record]) -> List[Sequence[Any]]:
    """The records' values column by column, in `RECORD_COLUMNS` order (one C-level read of
    every field per record, then one transpose)."""
    if not records:
        return [() for _ in RECORD_COLUMNS]
    return list(zip(*map(_ALL_COLUMNS, records)))


def _enum_text(values: Sequence[str]) -> List[str]:
    """An enum column's members as plain strings, in C: numpy encodes a str subclass (an enum
    member) 2.4x slower than a str; joined and split again, they cost nothing extra. An enum's
    values hold no NUL."""
    return "\0".join(values).split("\0")


def _text_column(values: Sequence[str]) -> np.ndarray:
    """UTF-8 strings as one fixed-width bytes array. ASCII text (nearly every name) is encoded
    by numpy in one C pass; other text is encoded string by string, its width given."""
    try:
        return np.array(values, dtype="S")
    except UnicodeEncodeError:
        pass
    raw = [value.encode("utf-8") for value in values]
    return np.array(raw, dtype=f"S{max(max(map(len, raw), default=1), 1)}")


def _shape_columns(shapes: Sequence[Tuple[int, ...]]) -> Tuple[np.ndarray, np.ndarray]:
    """Shapes as rows padded with -1 to MAX_NDIM (the longest kept), and their true ndim."""
    ndims = np.fromiter(map(len, shapes), dtype=np.int8, count=len(shapes))
    rows = np.full((len(shapes), MAX_NDIM), -1, dtype=np.int64)
    for ndim in np.unique(ndims).tolist():
        if ndim == 0:
            continue
        keep = min(ndim, MAX_NDIM)
        at = np.flatnonzero(ndims == ndim)
        rows[at, :keep] = np.array([tuple(shapes[i])[:keep] for i in at.tolist()],
                                   dtype=np.int64).reshape(len(at), keep)
    return rows, ndims
