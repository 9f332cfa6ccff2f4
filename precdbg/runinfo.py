"""run.json: what the run is (framework, versions, config, schema) and its manifest (how it was
set up), written at the first dumped start() and rewritten when the manifest learns more."""
from __future__ import annotations

import os
import platform
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import __version__
from .config import DumpConfig
from .manifest import base_manifest, jsonable, seed_record
from .schema import SCHEMA_VERSION, Record
from .writer import write_json_atomic

__all__ = ["RunInfo"]


class RunInfo:
    """The run.json of one process: built once, updated in memory, written when changed."""

    def __init__(self, config: DumpConfig, framework: str) -> None:
        self.config = config
        self.framework = framework
        self.info: Optional[Dict[str, Any]] = None
        self.dirty = False
        self.first_batch_done = False
        self._written = False        # run.json written (a full disk may have refused it)

    @property
    def written(self) -> bool:
        return self._written

    @property
    def path(self) -> str:
        return os.path.join(self.config.dump_path, "run.json")

    def gone(self) -> bool:
        """run.json was written and is not there any more (the dump folder was deleted or
        emptied while the job ran): the steps written from now on need it to be read."""
        return self._written and not os.path.exists(self.path)

    def write(self, adapter: Any, rank: int, world_size: int) -> None:
        if self.info is None:
            info = {
                "schema_version": SCHEMA_VERSION, "precdbg_version": __version__,
                "framework": self.framework, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "python": platform.python_version(), "numpy": np.__version__,
                "platform": platform.platform(), "world_size": world_size,
                "config": self.config.public_dict(), "pid": os.getpid(),
            }
            info.update(adapter.environment())
            manifest = base_manifest(self.framework, rank, world_size)
            for key, value in adapter.manifest().items():
                if isinstance(value, dict) and isinstance(manifest.get(key), dict):
                    manifest[key].update(value)
                else:
                    manifest[key] = value
            info["manifest"] = manifest
            self.info = info
        self.info["manifest"]["seed_all"] = seed_record(self.framework)
        write_json_atomic(self.path, self.info)
        self.dirty = False
        self._written = True

    def note(self, section: str, item: Dict[str, Any]) -> None:
        """Add or update an item of a manifest section: a list of items told apart by "id"
        (optimizers, LR schedulers), or a single value (the loss scale, the first batch)."""
        if self.info is None:
            return
        manifest = self.info["manifest"]
        if "id" not in item:
            if manifest.get(section) != item:
                manifest[section] = item
                self.dirty = True
            return
        known = manifest.setdefault(section, [])
        for i, seen in enumerate(known):
            if seen.get("id") == item.get("id"):
                if seen != item:
                    known[i] = item
                    self.dirty = True
                return
        known.append(item)
        self.dirty = True

    def first_batch(self, step: int, parts: Sequence[Tuple[Record, Any]],
                    arrays: List[np.ndarray]) -> None:
        """The inputs of the model's first dumped forward call, once per run: shapes, dtypes,
        statistics and an xxh3 checksum of the bytes."""
        import xxhash
        self.first_batch_done = True
        tensors = [{"arg_key": rec.arg_key, "dtype": rec.dtype, "shape": list(rec.shape),
                    "min": rec.min, "max": rec.max, "mean": rec.mean, "norm": rec.norm,
                    "checksum": xxhash.xxh3_64_hexdigest(
                        np.ascontiguousarray(arr).reshape(-1).view(np.uint8))}
                   for (rec, _), arr in zip(parts, arrays)]
        self.note("first_batch", {"step": step, "tensors": jsonable(tensors)})
