"""What a file must be before precdbg reads it, and the seal that says a step file is unchanged.

Reading is bounded and strict: a crafted or damaged file gets one line naming it and what is
wrong (a `DumpError`, exit 2), never an allocation the file cannot back, a hang, or a traceback.

- Only regular files are opened (`regular_file`): a FIFO named `rank0.h5` would block the read.
- A dataset's declared size is checked against what the file holds before it is read
  (`bounded`): its storage, and the file's size. HDF5 reads a dataset whose storage was never
  written as fill values, so a 437 KB file declaring 10^8 rows would otherwise allocate them.
  Compressed datasets (tensor blobs under `compression`) may declare up to `_INFLATE` times
  their storage: deflate's own limit is about 1,032 to 1.
- Attributes are integers where numbers are expected, in range (`int_attribute`).
- The seal (`seal_parts`, `check_seal`): when a step closes, the writer stores in attribute
  `integrity` an xxh3-64 digest of every record column, every module-tree and stack column, the
  file's other attributes and the list of tensor blobs. The reader recomputes each part as it
  reads it and refuses a part that differs ("damaged"): of 15 single-bit flips in a step file
  HDF5's own metadata checksums caught 2; the others were read and compared as data (a class
  `LayerNorm` read as `Layer^orm`, an `arg_index` 0 as 268435456). Files of schema version 5 on
  are sealed; older ones are read unchecked. The tensor bytes themselves are not in the seal
  (task `tensor` with `summary_mode: md5` checksums each tensor).
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..errors import DumpError

__all__ = ["regular_file", "regular_file_stat", "bounded", "bounded_id", "int_attribute",
           "seal_parts", "read_seal", "check_seal", "column_digest", "strings_digest",
           "attrs_digest", "blobs_digest", "reseal", "INTEGRITY", "SEALED_FROM"]

INTEGRITY = "integrity"          # the attribute holding the seal (JSON)
SEALED_FROM = 5                  # the first schema version whose step files carry one
_ALGORITHM = "xxh3_64"
_INFLATE = 1100                  # a compressed dataset's largest declared size / its storage
_MAX_ROWS = 1 << 31              # more records than any step holds (and than int32 indexes)


def regular_file(path: str) -> int:
    """The size of `path`, a regular file; a DumpError for anything else (a FIFO, a device, a
    folder where a file is expected)."""
    return int(regular_file_stat(path).st_size)


def regular_file_stat(path: str) -> os.stat_result:
    """`os.stat(path)` of a regular file; a DumpError as `regular_file` says otherwise."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise DumpError(f"{path}: no such file") from None
    except PermissionError:
        raise DumpError(f"{path}: permission denied") from None
    except OSError as exc:
        raise DumpError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a folder"
                if stat.S_ISDIR(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "not a regular file")
        raise DumpError(f"{path}: {kind}, not a regular file; not read")
    return info


def bounded(ds: Any, path: str, name: str, file_size: int, rows: Optional[int] = None,
            kinds: str = "", width: Optional[int] = None) -> None:
    """Refuse a dataset before it is read when what it declares cannot be what it holds:
    `rows` (its length), `kinds` (numpy dtype kinds allowed), `width` (its second dimension,
    a 2-D table), and its bytes against its storage and the file's size."""
    import h5py
    if not isinstance(ds, h5py.Dataset):
        raise DumpError(f"{path}: damaged: {name} is not a dataset")
    bounded_id(ds.id, path, name, file_size, rows=rows, kinds=kinds, width=width)


def bounded_id(dsid: Any, path: str, name: str, file_size: int, rows: Optional[int] = None,
               kinds: str = "", width: Optional[int] = None) -> Any:
    """`bounded` of a dataset opened through h5py's low-level API (an `h5d.DatasetID`): the
    same checks in the same order, without building the high-level object per column. Its
    shape and, when `kinds` are checked, its dtype (`dsid.dtype`), once allowed."""
    shape = dsid.shape
    if shape is None or len(shape) != (1 if width is None else 2):
        raise DumpError(f"{path}: damaged: {name} has shape {shape}, "
                        f"{'one' if width is None else 'two'} dimension(s) expected")
    if rows is not None and shape[0] != rows:
        raise DumpError(f"{path}: damaged: {name} holds {shape[0]} rows, the table "
                        f"{rows}")
    if width is not None and shape[1] != width:
        raise DumpError(f"{path}: damaged: {name} is {shape[1]} wide, {width} expected")
    if shape[0] > _MAX_ROWS:
        raise DumpError(f"{path}: damaged: {name} declares {shape[0]} rows")
    stored = dsid.get_type()        # its type, read once: `dsid.dtype` is this type's dtype
    dtype = stored.dtype if kinds else None
    if kinds and dtype.kind not in kinds:
        raise DumpError(f"{path}: damaged: {name} is stored as {dtype}, which is not "
                        "what precdbg writes there")
    declared = int(_product(shape) * stored.get_size())
    storage = min(int(dsid.get_storage_size()), file_size)
    if declared <= storage:       # within its storage: allowed whatever its filters
        return shape, dtype
    import h5py
    ds = h5py.Dataset(dsid, readonly=True)
    allowed = storage * _INFLATE if ds.compression or dsid.get_create_plist().get_nfilters() \
        else storage
    if declared > allowed:
        raise DumpError(f"{path}: damaged: {name} declares {declared} bytes and the file "
                        f"holds {storage} for it; not read")
    return shape, dtype


def _product(shape: Sequence[int]) -> float:
    """`np.prod(shape, dtype=np.float64)` of a short shape, in Python: the same float64
    products, left to right, without numpy's per-call cost."""
    if not shape:
        return 1.0
    out = float(shape[0])
    for dim in shape[1:]:
        out *= float(dim)
    return out


def int_attribute(attrs: Mapping[str, Any], key: str, path: str, default: Optional[int] = None,
                  low: int = 0, high: int = (1 << 31) - 1) -> int:
    """An attribute that must be an integer in [low, high] (step, rank, part, schema
    version): one line naming it otherwise."""
    if key not in attrs:
        if default is not None:
            return default
        raise DumpError(f"{path}: attribute '{key}' is missing")
    value = attrs[key]
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise DumpError(f"{path}: attribute '{key}' is {_shown(value)}, an integer is "
                        "expected")
    if not low <= int(value) <= high:
        raise DumpError(f"{path}: attribute '{key}' is {int(value)}, outside {low}..{high}")
    return int(value)


def _shown(value: Any) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------------------------ the seal
def _digest(*chunks: bytes) -> str:
    import xxhash
    h = xxhash.xxh3_64()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def column_digest(array: np.ndarray) -> str:
    """A numeric or fixed-width text column: its kind, width, shape and bytes."""
    array = np.ascontiguousarray(array)
    head = f"{array.dtype.kind}{array.dtype.itemsize}{array.shape}".encode()
    return _digest(head, array.view(np.uint8).reshape(-1) if array.size else b"")


def strings_digest(values: Sequence[Any]) -> str:
    """A column of variable-length UTF-8 strings (str as written, bytes as read)."""
    raw = [v if isinstance(v, bytes) else str(v).encode("utf-8", "surrogateescape")
           for v in values]
    return _digest(str(len(raw)).encode(), b"\0".join(raw))


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:
        return "nan"
    return value


def attrs_digest(attrs: Mapping[str, Any]) -> str:
    """The file's attributes but the seal itself, in a canonical JSON."""
    plain = {str(k): _plain(v) for k, v in attrs.items() if k != INTEGRITY}
    return _digest(json.dumps(plain, sort_keys=True, default=repr).encode())


def blobs_digest(blobs: Iterable[Any]) -> str:
    """The tensor blobs: (name, start, size) of each, in name order."""
    listed = sorted((str(name), int(start), int(size)) for name, start, size in blobs)
    return _digest(json.dumps(listed).encode())


def seal_parts(handle: Any, parts: Dict[str, str]) -> None:
    """Write the seal: `parts` (records/<column>, modules/<column>, stacks/text, computed from
    what was written) plus the blob list and the attributes, computed here last."""
    parts = dict(parts)
    data = handle.get("data")
    parts["data"] = blobs_digest((name, ds.attrs["start"], ds.shape[0])
                                 for name, ds in data.items()) if data is not None \
        else blobs_digest(())
    parts["attrs"] = attrs_digest({k: v for k, v in handle.attrs.items()})
    handle.attrs[INTEGRITY] = json.dumps({"algorithm": _ALGORITHM, "parts": parts},
                                         sort_keys=True)


def read_seal(attrs: Mapping[str, Any], path: str, version: int) -> Optional[Dict[str, str]]:
    """The seal's parts (None for a file older than seals); a file that should carry one and
    does not, or whose seal is not one, is damaged."""
    if version < SEALED_FROM:
        return None
    text = _plain(attrs.get(INTEGRITY))
    try:
        seal = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        seal = None
    parts = seal.get("parts") if isinstance(seal, dict) else None
    if not isinstance(parts, dict) or seal.get("algorithm") != _ALGORITHM \
            or not all(isinstance(v, str) for v in parts.values()):
        raise DumpError(f"{path}: damaged: its seal (attribute '{INTEGRITY}') is missing or "
                        "unreadable; not compared")
    if parts.get("attrs") != attrs_digest(attrs):
        raise DumpError(f"{path}: damaged: its attributes do not match the checksum written "
                        "when the step closed; not compared")
    return parts


def check_seal(parts: Optional[Dict[str, str]], part: str, digest: Any, path: str) -> None:
    """Refuse `part` when it differs from the seal (`digest`: a callable computing it, run only
    for a sealed file)."""
    if parts is None:
        return
    if part not in parts or parts[part] != digest():
        raise DumpError(f"{path}: damaged: {part} does not match the checksum written when "
                        "the step closed (a flipped bit, or an edit); not compared")


def reseal(path: str) -> None:
    """Seal a step file again after editing it on purpose (tests that craft files; a repair
    tool): every part is recomputed from what the file now holds."""
    import h5py
    with h5py.File(path, "r+") as handle:
        parts: Dict[str, str] = {}
        for group in ("records", "modules", "stacks"):
            if group not in handle:
                continue
            for name, ds in handle[group].items():
                data = ds[()]
                parts[f"{group}/{name}"] = column_digest(data) if group == "records" \
                    else strings_digest(data.tolist())
        seal_parts(handle, parts)
