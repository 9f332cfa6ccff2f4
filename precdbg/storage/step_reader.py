"""One precdbg step file read: its attributes, record columns, strings and tensor bytes.

Everything is checked before it is read and against the step's seal once read
(`precdbg.storage.step_checks`): a crafted or damaged file gets one `DumpError` naming it and what
is wrong, and never allocates more than the file can back.

A file's record columns are read whole. A reader that knows another will follow asks that a
private copy of them be kept on the open file until the next read of its columns takes it
(`StepFile.columns(keep=True)`): `precdbg compare` runs the check first, which reads every
rank's table so, then reads each again to compare it; the second read is the first one's copy.
What is kept is bounded by `KEEP_BYTES` for the whole process (beyond it a file is read again,
as before), let go of when the file closes (or by `release_kept`), and never shared between two
`StepFile`s: it is the bytes this open handle read, sealed and checked as then. Other reads
(the compare's own, in worker processes too) keep nothing.
The module tree and stack strings (`strings`) are kept the same way, a fresh list handed out
each time.

Each dataset is opened once per read and read through h5py's low-level API (`_dataset`,
`bounded_id`, `_read_whole`: what `group[name]` and `ds[()]` do, without building the
high-level objects, 36 columns a file); a name that is not a dataset takes the plain path, whose
errors stay what they were. A file's attributes and seal are read when it is first opened and
again only when the file changed since (its inode, size, modification or status-change time):
a compare opens each step file of its check again.
"""
from __future__ import annotations

import bisect
import functools
import threading
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DumpError
from ..records.controls import escape_column, escape_controls, has_controls_utf8
from ..records.schema import ADDED_COLUMNS, MAX_NDIM, READ_SCHEMA_VERSIONS, RECORD_COLUMNS
from .step_checks import (bounded, bounded_id, check_seal, column_digest, int_attribute,
                          read_seal, regular_file_stat, strings_digest)

__all__ = ["StepFile", "as_array"]

_STRING_COLUMNS = {name for name, dtype in RECORD_COLUMNS if dtype is None}
# what h5py raises for a damaged file: a failed read (OSError), an object whose metadata does
# not check out (KeyError, RuntimeError), a dataset of the wrong kind (ValueError, TypeError),
# a count HDF5 cannot hold (OverflowError)
_DAMAGED = (OSError, KeyError, RuntimeError, ValueError, TypeError, OverflowError)
_KINDS = {"i": "iu", "u": "iu", "f": "f", "b": "b"}   # the dtype kinds read for each written
_MAX_DIM = 64                      # more dimensions than any framework's tensor has
# record columns kept for a next read, all open files together: at most what a few ranks' files
# hold, so a compare's memory does not grow with the ranks it checks before comparing them
KEEP_BYTES = 32 << 20
_keeping: "weakref.WeakSet[StepFile]" = weakref.WeakSet()    # files holding a kept copy
_keeping_lock = threading.Lock()


def _kept_bytes() -> int:
    return sum(f._kept_size for f in list(_keeping))


def _readable(method: Any) -> Any:
    """A step-file method whose h5py failures become one DumpError naming the file."""
    @functools.wraps(method)
    def reading(self: "StepFile", *args: Any) -> Any:
        try:
            return method(self, *args)
        except DumpError:
            raise
        except MemoryError:
            raise DumpError(f"{self.path}: too large to read in this machine's memory") \
                from None
        except _DAMAGED as exc:
            raise DumpError(f"{self.path}: not a readable HDF5 step file ({exc})") from None
    return reading


# the attributes that say whether a step file holds a whole step (Dump.warnings, the compare's
# incomplete parts): the process ended inside the step; records lost inside precdbg
STATUS_ATTRIBUTES = ("interrupted", "failures")


def step_status(sf: Any) -> Dict[str, Any]:
    """STATUS_ATTRIBUTES of a dump's step file (precdbg's or msprobe's)."""
    status = getattr(sf, "status", None)
    if status is not None:
        return status()
    return {k: sf.attrs.get(k) for k in STATUS_ATTRIBUTES}


class StepFile:
    """One step file, opened when first read: a dump's files are known by their names
    (`step<S>/rank<R>[.part<K>].h5`), so a damaged file stops only what reads it (a command
    asked for another step never opens it). A file outside that layout is opened at once and
    known by what it holds."""

    def __init__(self, path: str, step: Optional[int] = None, rank: Optional[int] = None,
                 part: int = 0) -> None:
        self.path = path
        self._file: Any = None
        self._size = 0
        self._attrs: Optional[Dict[str, Any]] = None
        self._status: Optional[Dict[str, Any]] = None
        self._seal: Optional[Dict[str, str]] = None
        self._blobs: Optional[List[Tuple[int, int, Any]]] = None
        self._kept: Optional[Dict[str, np.ndarray]] = None     # columns for the next read
        self._kept_size = 0
        self._strings: Dict[Tuple[str, str], List[str]] = {}
        self._groups: Dict[str, Any] = {}      # groups opened while the file is open
        self._known: Optional[Tuple[int, ...]] = None   # the file whose attributes were read
        self.step, self.rank, self.part = step if step is not None else -1, rank or 0, part
        self._held = (self.step, self.rank, self.part)   # and the step, rank, part read then
        self._named = step is not None and rank is not None
        self._label: Optional[Tuple[int, int]] = None
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
        info = regular_file_stat(self.path)
        self._size = int(info.st_size)
        try:
            handle = h5py.File(self.path, "r")
        except PermissionError:
            raise DumpError(f"{self.path}: permission denied") from None
        except OSError as exc:
            raise DumpError(f"{self.path}: not a readable HDF5 step file ({exc})") from None
        # the same file opened again (a compare reads a step its check read): its attributes
        # and seal as read and checked the first time; any change to the file (its inode,
        # size, modification or status-change time) reads them again
        known = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if self._attrs is None or known != self._known:
            self._known = None
            try:
                self._read_attrs(handle)
            except BaseException:
                handle.close()
                raise
            self._known, self._held = known, (self.step, self.rank, self.part)
        else:
            self.step, self.rank, self.part = self._held
        self._file = handle

    @_readable
    def _read_attrs(self, handle: Any) -> None:
        attrs = handle.attrs
        if "schema_version" not in attrs or "records" not in handle:
            raise DumpError(f"{self.path}: an HDF5 file, but not a precdbg step file")
        version = int_attribute(attrs, "schema_version", self.path)
        if version not in READ_SCHEMA_VERSIONS:
            raise DumpError(f"{self.path}: schema version {version}, this precdbg reads "
                            f"{', '.join(map(str, READ_SCHEMA_VERSIONS))}")
        try:
            raw = dict(attrs.items())       # each attribute read once
        except Exception:
            # one that cannot be read: what the step, rank and part say first, as before
            int_attribute(attrs, "step", self.path), int_attribute(attrs, "rank", self.path)
            int_attribute(attrs, "part", self.path, default=0)
            raise
        held = (int_attribute(raw, "step", self.path), int_attribute(raw, "rank", self.path),
                int_attribute(raw, "part", self.path, default=0))
        plain = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in raw.items()}
        self._seal = read_seal(plain, self.path, version)
        if self._named and held != (self.step, self.rank, self.part):
            raise DumpError(f"{self.path}: holds step {held[0]} rank {held[1]} part {held[2]}, "
                            "not the step, rank and part its name says")
        self.step, self.rank, self.part = held
        if self._label is not None:       # relabelled: read under the other run's numbers
            self.step, self.rank = self._label
        self._attrs, self._status = plain, None

    def _column(self, group: Any, name: str, rows: int, kinds: str,
                width: Optional[int] = None, dsid: Any = None) -> np.ndarray:
        """One record column, bounded before it is read and checked against the seal
        (`dsid`: the column opened already, by `_dataset`)."""
        where = f"records/{name}"
        if dsid is None:
            dsid = _dataset(group, name)
        if dsid is None:            # not a dataset: what the plain path says of it
            ds = group[name]
            bounded(ds, self.path, where, self._size, rows=rows, kinds=kinds, width=width)
            data = ds[()]
        else:
            data = _read_whole(dsid, bounded_id(dsid, self.path, where, self._size, rows=rows,
                                                kinds=kinds, width=width))
        check_seal(self._seal, where, lambda: column_digest(data), self.path)
        return data

    def _group(self, name: str) -> Any:
        """`self.file[name]`, opened once while the file is open."""
        found = self._groups.get(name)
        if found is None:
            found = self._groups[name] = self.file[name]
        return found

    def columns(self, keep: bool = False) -> Dict[str, np.ndarray]:
        """The record columns, plus `step`, `rank` and `part` of the file: what an earlier
        call with `keep` kept, or read now, a copy then kept for the next call when `keep`
        (the module's docstring)."""
        own = self._take_kept()
        if own is None:
            own = self._read_columns()
            if keep:
                self._keep(own)
        out = dict(own)
        count = len(own["entry"])
        out["step"] = np.full(count, self.step, dtype=np.int64)
        out["rank"] = np.full(count, self.rank, dtype=np.int64)
        out["part"] = np.full(count, self.part, dtype=np.int32)
        return out

    @property
    def keeps_columns(self) -> bool:
        """Whether a copy of its columns is kept for the next read."""
        return self._kept is not None

    def release_kept(self) -> None:
        """Let go of the columns kept for the next read (that read reads the file again)."""
        self._take_kept()

    def _take_kept(self) -> Optional[Dict[str, np.ndarray]]:
        with _keeping_lock:
            kept, self._kept, self._kept_size = self._kept, None, 0
            _keeping.discard(self)
        return kept

    def _keep(self, own: Dict[str, np.ndarray]) -> None:
        size = sum(v.nbytes for v in own.values())
        with _keeping_lock:
            if self._file is None or _kept_bytes() + size > KEEP_BYTES:
                return
            # a private copy: what the caller does with its arrays never reaches the next one
            self._kept, self._kept_size = {k: v.copy() for k, v in own.items()}, size
            _keeping.add(self)

    @_readable
    def _read_columns(self) -> Dict[str, np.ndarray]:
        group = self.file["records"]
        out: Dict[str, np.ndarray] = {}
        if "entry" not in group:
            raise DumpError(f"{self.path}: damaged: records/entry is missing")
        entry = _dataset(group, "entry")
        if entry is None:           # not a dataset: as the plain path fails on it
            count = group["entry"].shape[0] if group["entry"].shape else -1
        else:
            count = entry.shape[0] if entry.shape else -1
        if "count" in group.attrs:
            count = int_attribute(group.attrs, "count", self.path, high=1 << 31)
        present = set(group)
        for name, dtype in RECORD_COLUMNS:
            if name not in present:
                if name in ADDED_COLUMNS and self._seal is None:   # an older schema version
                    out[name] = np.full(count, ADDED_COLUMNS[name], dtype=dtype)
                    continue
                raise DumpError(f"{self.path}: damaged: records/{name} is missing")
            dsid = entry if name == "entry" else None
            if name in _STRING_COLUMNS:
                data = _text(self._column(group, name, count, "S", dsid=dsid))
            else:
                data = self._column(group, name, count, _KINDS[dtype.kind], dsid=dsid)
            out[name] = data
        shape_id = _dataset(group, "shape")
        held = (group["shape"] if shape_id is None else shape_id).shape
        shape = self._column(group, "shape", count, "iu", width=held[1]
                             if len(held or ()) == 2 else MAX_NDIM, dsid=shape_id)
        ndim = self._column(group, "ndim", count, "iu")
        if shape.shape[1] > _MAX_DIM or (ndim.size and (ndim.min() < 0 or ndim.max() > _MAX_DIM)):
            raise DumpError(f"{self.path}: damaged: records/shape or records/ndim holds more "
                            f"than {_MAX_DIM} dimensions")
        out["shape"], out["ndim"] = shape, ndim
        return out

    def _listed_blobs(self) -> List[Tuple[int, int, Any]]:
        """The tensor blobs: (start, size, dataset), bounded and checked against the seal."""
        if self._blobs is None:
            blobs: List[Tuple[int, int, Any]] = []
            named: List[Tuple[str, int, int]] = []
            for name, ds in (self.file["data"].items() if "data" in self.file else ()):
                bounded(ds, self.path, f"data/{name}", self._size, kinds="u")
                start = int_attribute(ds.attrs, "start", self.path, high=(1 << 62))
                blobs.append((start, int(ds.shape[0]), ds))
                named.append((name, start, int(ds.shape[0])))
            from .step_checks import blobs_digest
            check_seal(self._seal, "data", lambda: blobs_digest(named), self.path)
            self._blobs = sorted(blobs, key=lambda b: b[0])
        return self._blobs

    @_readable
    def read_bytes(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of the step's tensor byte space."""
        blobs = self._listed_blobs()
        k = bisect.bisect_right([start for start, _, _ in blobs], offset) - 1
        if k < 0 or nbytes < 0 or offset - blobs[k][0] + nbytes > blobs[k][1]:
            raise DumpError(f"{self.path}: damaged: no tensor bytes at {offset}..."
                            f"{offset + nbytes}")
        start, _, ds = blobs[k]
        return ds[offset - start:offset - start + nbytes]

    def tensor(self, row: Dict[str, Any]) -> np.ndarray:
        """The stored tensor of a record of this file (a row of `columns()`)."""
        if row["data_offset"] < 0:
            raise DumpError(f"{self.path}: {row['entry']} {row['role']} {row['arg_index']} has "
                            "statistics only (dump with task 'tensor' to keep tensors)")
        try:
            itemsize = _dtype_of(row["dtype"]).itemsize
        except (TypeError, ValueError, AttributeError):
            raise DumpError(f"{self.path}: {row['entry']}: unknown dtype "
                            f"{row['dtype']!r}") from None
        if int(np.prod(row["shape"], dtype=np.float64)) * itemsize != row["data_nbytes"]:
            raise DumpError(f"{self.path}: damaged: {row['entry']} {row['role']} "
                            f"{row['arg_index']}: {row['data_nbytes']} bytes stored for shape "
                            f"{tuple(row['shape'])} of {row['dtype']}")
        raw = self.read_bytes(row["data_offset"], row["data_nbytes"])
        return as_array(raw, row["dtype"], row["shape"])

    def notes(self) -> List[str]:
        return []

    def unrecorded(self) -> frozenset:
        return frozenset()

    @_readable
    def has(self, group: str, column: str) -> bool:
        return group in self.file and column in self._group(group)

    def strings(self, group: str, column: str) -> List[str]:
        """A column of the module tree or the stacks, read once per open file (a new list
        each call)."""
        found = self._strings.get((group, column))
        if found is None:
            found = self._strings[(group, column)] = self._read_strings(group, column)
        return list(found)

    @_readable
    def _read_strings(self, group: str, column: str) -> List[str]:
        if group not in self.file:
            if self._seal is not None:
                raise DumpError(f"{self.path}: damaged: {group} is missing")
            return []
        where = f"{group}/{column}"
        parent = self._group(group)
        dsid = _dataset(parent, column)
        if dsid is None:            # not a dataset (or not in a group): the plain path
            ds = parent[column]
            bounded(ds, self.path, where, self._size, kinds="OS")
            raw = ds[()].tolist()
        else:
            raw = _read_whole(dsid, bounded_id(dsid, self.path, where, self._size,
                                               kinds="OS")).tolist()
        check_seal(self._seal, where, lambda: strings_digest(raw), self.path)
        texts = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in raw]
        lines = group == "stacks"   # call sites: lines of `file:line in function`
        joined = "".join(texts)     # none holds a control character when all of them do not
        if escape_controls(joined, lines=lines) == joined:
            return texts
        return [escape_controls(t, lines=lines) for t in texts]

    def relabel(self, step: int, rank: int) -> None:
        """Read it as `step`, `rank` (compared with another run's other step or rank): opened
        again, it is checked against what it holds, not against its name."""
        self.step, self.rank, self._named, self._label = step, rank, False, (step, rank)
        self._known = None

    def status(self) -> Dict[str, Any]:
        """The attributes that say whether the file holds a whole step (STATUS_ATTRIBUTES),
        known without opening the file again once read, its other attributes let go of."""
        if self._status is None:
            attrs = self.attrs
            self._status = {k: attrs.get(k) for k in STATUS_ATTRIBUTES}
        return self._status

    def know_status(self, status: Dict[str, Any]) -> None:
        """`status()` as another process read it of this same file (a compare's worker, which
        read the file this process would otherwise open again to learn it)."""
        if self._status is None:
            self._status = {k: status.get(k) for k in STATUS_ATTRIBUTES}

    def close(self, forget: bool = False) -> None:
        """Close the file and let go of what was read of it (its attributes stay known, unless
        `forget`: a reader done with it, whose memory must not grow with the files it read;
        `status()` stays known); a later read opens it again."""
        if forget and self._attrs is not None:
            self.status()
            self._attrs = self._seal = self._known = None
        self._take_kept()
        self._strings.clear()
        self._groups.clear()            # opened through the handle closed here
        self._blobs = None              # its datasets belong to the handle closed here
        if self._file is not None:
            self._file.close()
            self._file = None


class _H5:
    """h5py and its low-level modules, imported when a file is first read (not each column)."""
    h5py: Any = None

    @classmethod
    def load(cls) -> Any:
        if cls.h5py is None:
            import h5py
            from h5py import h5d, h5o, h5s, h5t  # noqa: F401 - attributes of h5py from here
            cls.h5py = h5py
        return cls.h5py


def _dataset(group: Any, name: str) -> Any:
    """`group[name]` as h5py opens it (`h5o.open`, same link access: the same errors for a
    missing or dangling name), as a low-level `h5d.DatasetID`; None when `group` is not a group
    or `name` is not a dataset (the high-level path then says what it says of it)."""
    h5py = _H5.load()
    if not isinstance(group, h5py.Group):
        return None
    oid = h5py.h5o.open(group.id, name.encode("utf-8"), lapl=group._lapl)
    # h5o.open gives a DatasetID exactly for what HDF5 says is a dataset (h5i.get_type)
    return oid if isinstance(oid, h5py.h5d.DatasetID) else None


def _read_whole(dsid: Any, held: Tuple[Tuple[int, ...], Optional[np.dtype]]) -> np.ndarray:
    """A whole 1-D or 2-D dataset (bounded already: `held`, its shape and dtype as `bounded_id`
    gives them) as `ds[()]` reads it: an array of its own dtype, zeros when it is empty."""
    h5py = _H5.load()
    shape, dtype = held
    if dtype is None:
        dtype = dsid.dtype
    data = np.zeros(shape, dtype=dtype, order="C")
    if data.size:
        dsid.read(h5py.h5s.ALL, h5py.h5s.ALL, data, _memory_type(dtype))
    return data


_MEMORY_TYPES: Dict[Tuple[np.dtype, str], Any] = {}


def _memory_type(dtype: np.dtype) -> Any:
    """`h5t.py_create(dtype)`, the HDF5 type `ds[()]` reads into, made once per dtype (with
    its h5py metadata: text, variable-length strings) rather than once per column."""
    key = (dtype, repr(dtype.metadata))
    found = _MEMORY_TYPES.get(key)
    if found is None:
        if len(_MEMORY_TYPES) >= 256:       # as many widths of text as files hold: bounded
            _MEMORY_TYPES.clear()
        found = _MEMORY_TYPES[key] = _H5.load().h5t.py_create(dtype)
    return found


def _text(data: np.ndarray) -> np.ndarray:
    """A fixed-width UTF-8 column as str, names that would drive a terminal shown escaped. ASCII
    (nearly every name) is decoded and checked by numpy in C; other text string by string."""
    if not data.size:
        return data.astype(str)
    raw = data.view(np.uint8)
    if int(raw.max()) < 0x7f:                     # ASCII: a control is a byte 1..31
        # each byte widened to its code point: the same array as astype(str), 20x quicker
        text = raw.astype(np.uint32).view(np.dtype(f"U{data.dtype.itemsize}"))
        text = text.reshape(data.shape)
        return escape_column(text) if bool(((raw - np.uint8(1)) < 0x1f).any()) else text
    controls = has_controls_utf8(data.tobytes())
    text = np.char.decode(data, "utf-8")
    return escape_column(text) if controls else text


def _dtype_of(dtype: str) -> np.dtype:
    if dtype == "bfloat16" or dtype.startswith("float8"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def as_array(raw: np.ndarray, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """Stored bytes as the tensor they hold (bf16 and float8 through ml_dtypes)."""
    return raw.view(_dtype_of(dtype)).reshape(shape)
