"""Reading checkpoint files into numpy arrays, one reader per format.

A format is known by its file's extension, else by its first bytes (`checkpoint_format`). The core
reads safetensors and numpy `.npz` itself; a framework's own formats (PyTorch's `torch.save`,
MindSpore's `.ckpt`) are read by the adapter package that knows the framework, registered in the
`precdbg.checkpoint_readers` entry-point group of its distribution (pyproject.toml), or at run
time with `register_checkpoint_reader`. The core names no adapter: an entry point is looked up
only when a file of its format is read, so a missing framework fails that file alone.

A reader takes a path and returns `(tensors, skipped)`: the checkpoint's tensors as numpy arrays
by name (bfloat16 and other formats numpy lacks as ml_dtypes arrays: `as_float_format`), and how
many non-tensor entries it left out; a file it cannot read is a `DumpError` naming the file.
"""
from __future__ import annotations

import os
import zipfile
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from ..errors import DumpError

__all__ = ["Reader", "ENTRY_POINT_GROUP", "register_checkpoint_reader", "checkpoint_format",
           "read_checkpoint", "as_float_format"]

Reader = Callable[[str], Tuple[Dict[str, np.ndarray], int]]
ENTRY_POINT_GROUP = "precdbg.checkpoint_readers"
_NAMES = {"pytorch": "PyTorch", "mindspore": "MindSpore", "safetensors": "safetensors",
          "npz": "numpy .npz"}
_REGISTERED: Dict[str, Reader] = {}

_FORMATS = {".pt": "pytorch", ".pth": "pytorch", ".bin": "pytorch", ".ckpt": "mindspore",
            ".safetensors": "safetensors", ".npz": "npz"}


def _sniff(path: str) -> Optional[str]:
    """The format of a file without a known extension, from its first bytes."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError as exc:
        raise DumpError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return None
        if any(n.endswith("data.pkl") for n in names):
            return "pytorch"
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return None
    if len(head) >= 9:
        header_len = int.from_bytes(head[:8], "little")
        if 0 < header_len < (100 << 20) and head[8:9] == b"{":
            return "safetensors"
    if head[:1] in (b"\x80",):     # legacy (non-zip) torch.save pickle
        return "pytorch"
    return None


def _load_safetensors(path: str) -> Tuple[Dict[str, np.ndarray], int]:
    from safetensors.numpy import load_file
    try:
        return dict(load_file(path)), 0
    except Exception as exc:  # noqa: BLE001
        raise DumpError(f"{path}: not a loadable safetensors file "
                        f"({type(exc).__name__}: {exc})") from None


def _load_npz(path: str) -> Tuple[Dict[str, np.ndarray], int]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                return {"": np.asarray(data)}, 0
            return {name: data[name] for name in data.files}, 0
    except Exception as exc:  # noqa: BLE001
        raise DumpError(f"{path}: not a loadable .npz file ({type(exc).__name__}: {exc})"
                        ) from None


_BUILT_IN: Dict[str, Reader] = {"safetensors": _load_safetensors, "npz": _load_npz}


def register_checkpoint_reader(fmt: str, reader: Reader) -> None:
    """Read checkpoints of format `fmt` (`pytorch`, `mindspore`, ...) with `reader` from now
    on in this process (an entry point of the same format is then not looked up)."""
    _REGISTERED[fmt] = reader


def checkpoint_format(path: str) -> str:
    """The format of the checkpoint file at `path`, by extension or content."""
    fmt = _FORMATS.get(os.path.splitext(path)[1].lower()) or _sniff(path)
    if fmt is None:
        raise DumpError(f"{path}: unknown checkpoint format (expected .pt/.pth, .ckpt, "
                        ".safetensors or .npz)")
    return fmt


def read_checkpoint(path: str, fmt: str) -> Tuple[Dict[str, np.ndarray], int]:
    """A checkpoint's tensors by name, and how many non-tensor entries were left out."""
    return _reader(fmt, path)(path)


def _reader(fmt: str, path: str) -> Reader:
    reader = _REGISTERED.get(fmt) or _BUILT_IN.get(fmt)
    if reader is not None:
        return reader
    from importlib.metadata import entry_points
    found = [point for point in entry_points(group=ENTRY_POINT_GROUP) if point.name == fmt]
    what = _NAMES.get(fmt, fmt)
    if not found:
        raise DumpError(f"{path}: no reader of {what} checkpoints is installed (install precdbg "
                        f"with the extra of that framework)")
    try:
        reader = found[0].load()
    except ImportError as exc:
        raise DumpError(f"{path}: reading a {what} checkpoint needs "
                        f"{found[0].value.split('.')[0]} and its framework installed "
                        f"({exc})") from None
    _REGISTERED[fmt] = reader
    return reader


def as_float_format(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """float32 `values` of a tensor whose own format numpy lacks (bfloat16, float8_*), as an
    ml_dtypes array of that format (exact: the values came from it); float32 where ml_dtypes
    does not know the name."""
    import ml_dtypes
    fmt = getattr(ml_dtypes, dtype_name, None)
    return values.astype(fmt) if fmt is not None else values
