"""JSON a dump holds (run.json, msprobe's dump.json, construct.json, stack.json), read bounded.

Python's parser turns a dense file into many objects: a 90 MB run.json of nested empty lists
took 2.4 GB, and one nested 100k deep raised RecursionError. Here a file is refused, in one line
naming it, before it is parsed when the objects it would make are estimated (from its bytes of
each structural kind, one numpy pass) to need more than `_MEMORY_FACTOR` times its size plus
`_MEMORY_FLOOR`; after parsing, nesting deeper than `_MAX_DEPTH` is refused; and run.json's
known keys must have the types precdbg writes (`check_run_json`), so no command meets a list
where it reads an object.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Tuple

import numpy as np

from ..errors import DumpError
from .step_checks import regular_file

__all__ = ["read_json", "check_run_json", "NotJson"]


class NotJson(DumpError):
    """The file is cut short or is not JSON (`reason`: the parser's words)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: unreadable ({reason})")
        self.reason = reason

_MAX_DEPTH = 100
# ordinary files parse into 2-3x their size (msprobe dump.json, run.json; estimated here at
# 2-5.5x), a dense file of empty lists into 21x (estimated 35x)
_MEMORY_FACTOR = 16
_MEMORY_FLOOR = 256 << 20
# bytes one structural character costs once parsed (CPython 3.11, 64-bit): '[' a list, '{' a
# dict, ',' another element (its pointer and a small object), ':' a key (a str) and its slot
_COST = {ord("["): 64, ord("{"): 240, ord(","): 40, ord(":"): 64}


def _estimated_bytes(raw: bytes) -> int:
    counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
    return 2 * len(raw) + sum(int(counts[byte]) * cost for byte, cost in _COST.items())


def _depth(value: Any) -> int:
    """The nesting depth of parsed JSON, walked without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth > _MAX_DEPTH:
                return depth
            todo.extend((child, depth + 1) for child in item
                        if isinstance(child, (dict, list)))
    return deepest


def read_json(path: str, what: str = "JSON") -> Any:
    """A JSON file of a dump: a regular file, parsed within bounded memory, at most
    `_MAX_DEPTH` deep; a DumpError naming the file otherwise."""
    size = regular_file(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(size + 1)
    except PermissionError:
        raise DumpError(f"{path}: permission denied") from None
    except OSError as exc:
        raise DumpError(f"{path}: unreadable ({exc.strerror or exc})") from None
    needed = _estimated_bytes(raw)
    if needed > _MEMORY_FACTOR * len(raw) + _MEMORY_FLOOR:
        raise DumpError(f"{path}: not read: this {what} of {len(raw) >> 20} MB would take "
                        f"about {needed >> 20} MB to parse (it is not what precdbg or msprobe "
                        "writes)")
    try:
        value = json.loads(raw)
    except RecursionError:
        raise DumpError(f"{path}: not read: nested deeper than JSON is read here "
                        f"({_MAX_DEPTH} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise NotJson(path, str(exc)) from None
    except MemoryError:
        raise DumpError(f"{path}: too large to read in this machine's memory") from None
    if _depth(value) > _MAX_DEPTH:
        raise DumpError(f"{path}: not read: nested deeper than JSON is read here "
                        f"({_MAX_DEPTH} levels)")
    return value


_NUMBER = (int, float)
_NONE = type(None)
# run.json's keys as precdbg writes them (precdbg.capture.run_file, manifest), and the types
# each may hold; keys not listed (an adapter's environment) may hold anything
_RUN_KEYS: Dict[str, Tuple[type, ...]] = {
    "schema_version": (int,), "precdbg_version": (str,), "framework": (str,),
    "created": (str,), "python": (str,), "numpy": (str,), "platform": (str,),
    "world_size": (int,), "config": (dict,), "pid": (int,), "mode": (str, _NONE),
    "manifest": (dict,), "manifests": (dict,)}
_CONFIG_KEYS: Dict[str, Tuple[type, ...]] = {
    "framework": (str, _NONE), "task": (str,), "level": (str,), "dump_path": (str,),
    "step": (list,), "rank": (list,), "scope": (list,), "list": (list,)}
_MANIFEST_KEYS: Dict[str, Tuple[type, ...]] = {
    "versions": (dict,), "rank": (int,), "world_size": (int,), "seed_all": (dict, _NONE),
    "environment": (dict,), "optimizers": (list,), "lr_schedulers": (list,),
    "loss_scale": (dict, _NONE) + _NUMBER, "determinism": (dict,), "unobserved": (dict,)}


def _check_keys(obj: Dict[str, Any], known: Dict[str, Tuple[type, ...]], where: str,
                path: str) -> None:
    for key, types in known.items():
        if key in obj and not (isinstance(obj[key], types)
                               and not (isinstance(obj[key], bool) and bool not in types)):
            wanted = " or ".join("null" if t is _NONE else {"dict": "an object", "list": "a list",
                                                             "str": "a string"}.get(
                t.__name__, "a number") for t in types)
            raise DumpError(f"{path}: not a precdbg manifest: '{where}{key}' is "
                            f"{_kind(obj[key])}, {wanted} is expected")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false",
            type(None): "null"}.get(type(value), "a number")


def check_run_json(run: Any, path: str) -> Dict[str, Any]:
    """run.json as the commands read it: an object whose known keys (and the config's and each
    manifest's) hold the types precdbg writes; one line naming the key otherwise."""
    if not isinstance(run, dict):
        raise DumpError(f"{path}: not a precdbg manifest (a JSON object is expected, found "
                        f"{_kind(run)})")
    _check_keys(run, _RUN_KEYS, "", path)
    if "config" in run:
        _check_keys(run["config"], _CONFIG_KEYS, "config.", path)
    if "manifest" in run:
        _check_keys(run["manifest"], _MANIFEST_KEYS, "manifest.", path)
    for rank, manifest in (run.get("manifests") or {}).items():
        if not isinstance(manifest, dict):
            raise DumpError(f"{path}: not a precdbg manifest: 'manifests.{rank}' is "
                            f"{_kind(manifest)}, an object is expected")
        _check_keys(manifest, _MANIFEST_KEYS, f"manifests.{rank}.", path)
    return run
