"""JSON files of a dump and of its reports: strict-JSON values, and files published atomically
(written beside, fsynced, renamed), so a crash never leaves a half-written run.json."""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict

__all__ = ["jsonable", "write_json_atomic", "write_bytes_atomic", "fsync_dir"]


def jsonable(value: Any) -> Any:
    """Strict-JSON values: tuples to lists, NaN/Inf to "nan"/"inf"/"-inf", numpy scalars and
    0-d tensors to numbers, other objects to text."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        if value != value:
            return "nan"
        return value if abs(value) != float("inf") else ("inf" if value > 0 else "-inf")
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return jsonable(value.item())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    try:
        return float(value)          # 0-d tensors, numpy scalars
    except (TypeError, ValueError):
        return str(value)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    write_bytes_atomic(path, json.dumps(data, indent=2, sort_keys=True,
                                        default=str).encode("utf-8"))


def write_bytes_atomic(path: str, data: bytes) -> None:
    """`data` as the file `path`: written beside, fsynced, renamed (never half-written)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)         # a disk full half-way leaves no stray temporary file
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
