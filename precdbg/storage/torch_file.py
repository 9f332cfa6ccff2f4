"""Read one tensor saved by `torch.save` without importing torch: msprobe's tensor task writes
each captured tensor as such a file (`dump_tensor_data/<entry>.<role>.<index>.pt`).

`torch.save` writes a zip archive: `<name>/data.pkl` pickles the object, each storage referred to
by a persistent id `("storage", <dtype storage class>, <key>, <location>, <numel>)` whose bytes
are the archive member `<name>/data/<key>` (little-endian, or as `<name>/byteorder` says), and a
tensor is rebuilt by `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`. Only
those names are resolved here (a restricted unpickler): anything else in the pickle is refused,
so reading a file runs none of its code.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..errors import DumpError
from .step_checks import regular_file

__all__ = ["load_torch_tensor"]

# torch's typed storage classes (as pickled by torch.save) -> numpy dtype name
_STORAGES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}


class _StorageType:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


class _OrderedDict(dict):
    """collections.OrderedDict, as a tensor's (empty) backward hooks are pickled."""


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _rebuild_tensor(storage: np.ndarray, offset: int, size: Tuple[int, ...],
                    stride: Tuple[int, ...], *_: Any) -> np.ndarray:
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if not size:
        return storage[offset:offset + 1].reshape(()).copy()
    if any(s == 0 for s in size):
        return np.zeros(size, dtype=storage.dtype)
    span = offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1
    if span > storage.size or offset < 0 or any(s < 0 for s in stride):
        raise ValueError(f"a view of {span} elements over a storage of {storage.size}")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(s * item for s in stride))
    return np.ascontiguousarray(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, archive: zipfile.ZipFile, prefix: str,
                 little: bool, size: int) -> None:
        super().__init__(data)
        self._archive, self._prefix, self._little = archive, prefix, little
        self._size = size               # the file's: no member unpacks beyond what it backs
        self._storages: Dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _StorageType(_STORAGES[name])
        if module == "collections" and name == "OrderedDict":
            return _OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor's part")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        key = str(pid[2])
        if key not in self._storages:
            raw = _member(self._archive, f"{self._prefix}data/{key}", self._size)
            dtype = _numpy_dtype(pid[1].dtype)
            array = np.frombuffer(raw, dtype=dtype.newbyteorder("<" if self._little else ">"))
            self._storages[key] = array.astype(dtype, copy=False)
        return self._storages[key]


def _member(archive: zipfile.ZipFile, name: str, size: int) -> bytes:
    """A member's bytes, refused before they are read when what it declares unpacked cannot
    come from the file (torch.save stores members uncompressed; deflate stays within ~1,032:1)."""
    info = archive.getinfo(name)
    packed = min(info.compress_size, size)
    if info.file_size > (packed if info.compress_type == zipfile.ZIP_STORED else packed * 1100):
        raise ValueError(f"member {name} declares {info.file_size} bytes; the file holds "
                         f"{packed} for it")
    return archive.read(name)


def load_torch_tensor(path: str) -> np.ndarray:
    """The tensor in a `torch.save` file as a numpy array (bfloat16 as ml_dtypes.bfloat16); a
    DumpError naming the file when it is no such file."""
    size = regular_file(path)            # a FIFO is never opened
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            pickled: Optional[str] = next((n for n in names if n.endswith("data.pkl")), None)
            if pickled is None:
                raise DumpError(f"{path}: not a torch.save file (no data.pkl inside)")
            prefix = pickled[:-len("data.pkl")]
            order = f"{prefix}byteorder"
            little = order not in names or archive.read(order).strip() != b"big"
            loaded = _Unpickler(io.BytesIO(_member(archive, pickled, size)), archive, prefix,
                                little, size).load()
    except DumpError:
        raise
    except FileNotFoundError:
        raise DumpError(f"{path}: tensor file missing") from None
    except (OSError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError, KeyError,
            ValueError, TypeError, AttributeError) as exc:
        raise DumpError(f"{path}: not a readable torch.save tensor ({exc})") from None
    if not isinstance(loaded, np.ndarray):
        raise DumpError(f"{path}: holds a {type(loaded).__name__}, not one tensor")
    return loaded
