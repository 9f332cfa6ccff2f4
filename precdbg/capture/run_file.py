"""run.json: what the run is (framework, versions, config, schema) and its manifest (how it was
set up), written at the first dumped start() and rewritten when the manifest learns more."""
from __future__ import annotations

import json
import logging
import os
import platform
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..version import __version__
from ..config.dump_config import DumpConfig
from .manifest import base_manifest, seed_record
from ..storage.json_files import jsonable, write_json_atomic
from ..records.schema import SCHEMA_VERSION, Record
from ..storage.dump_folder import check_writable, first_named, folder_locked
from ..storage.layout import run_json_path
from ..storage.writer import DumpWriter

__all__ = ["RunInfo"]

log = logging.getLogger("precdbg")


class RunInfo:
    """The run.json of one process: built once, updated in memory, written when changed."""

    def __init__(self, config: DumpConfig, framework: str) -> None:
        self.config = config
        self.framework = framework
        self.info: Optional[Dict[str, Any]] = None
        self.dirty = False
        self.first_batch_done = False
        self._written = False        # run.json written (a full disk may have refused it)
        self._refused = False        # start() found files of another run (said once)

    @property
    def refused(self) -> bool:
        """Whether start() found another run's files in the dump folder (nothing is dumped)."""
        return self._refused

    @property
    def written(self) -> bool:
        return self._written

    @property
    def path(self) -> str:
        return run_json_path(self.config.dump_path)

    def ready(self, writer: DumpWriter, adapter: Any, rank: int, world_size: int,
              step: int) -> bool:
        """Before a step is captured: run.json is on disk, written at the first dumped start()
        into a folder this process may write (False: another run's files or another job are
        there, said once, and nothing is dumped), and written again when it was deleted while
        the job ran (the folder cleaned up) or emptied, so the steps from this one on can be
        read."""
        first = not self._written
        if first:
            check_writable(self.config.dump_path)
            earlier = writer.existing_files(rank)
            taken = writer.claim(rank) if not earlier else None
            if earlier or taken:  # appeared since the constructor looked: never into training
                if not self._refused:
                    self._refused = True
                    log.error("precdbg: dump_path %s %s: nothing is dumped, so that nothing is "
                              "overwritten; choose an empty folder", self.config.dump_path,
                              taken or f"already holds a dump of rank {rank} "
                              f"({earlier[0]}) that this run did not write")
                return False
        else:
            try:
                if os.stat(self.path).st_size > 0:
                    return True
                what = "emptied"
            except OSError:
                what = "deleted"
            log.warning("precdbg: %s was %s while the job ran; it is written again at step "
                        "%d, so the steps written since can be read", self.path, what, step)
        self.write(adapter, rank, world_size)
        if first and first_named(self.config.dump_path):
            log.warning("precdbg: dumping to %s (%s)", self.config.dump_path,
                        self._what(rank, world_size))
        return True

    def _what(self, rank: int, world_size: int) -> str:
        """What the dump holds, in the words of the config: `steps [1], level mix, task
        statistics` (and the rank, where the job has several)."""
        config = self.config
        steps = f"steps {list(config.step)}" if config.step else "every step"
        ranks = f"rank {rank} of {world_size}, " if world_size > 1 else ""
        return f"{ranks}{steps}, level {config.level.value}, task {config.task.value}"

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
        if world_size > 1:
            self._write_with_other_ranks(rank)
        else:
            write_json_atomic(self.path, self.info)
        self.dirty = False
        self._written = True

    def _write_with_other_ranks(self, rank: int) -> None:
        """Every rank of a job writes run.json: each keeps its own manifest under
        `manifests[<rank>]` (a rank's optimizer, seeds or loss scale may differ from another's,
        and check compares them rank by rank), `manifest` is the lowest rank's. The ranks of
        one machine take turns (a lock on the folder); the last write used to win, so which
        rank's set-up a check saw changed from run to run."""
        with folder_locked(self.config.dump_path):
            manifests: Dict[str, Any] = {}
            try:
                with open(self.path, "r", encoding="utf-8") as handle:
                    found = json.load(handle).get("manifests")
                if isinstance(found, dict):
                    manifests.update(found)
            except (OSError, ValueError, AttributeError):    # none yet, or not ours
                pass
            manifests[str(rank)] = self.info["manifest"]
            lowest = min(manifests, key=lambda key: int(key) if key.isdigit() else 1 << 30)
            write_json_atomic(self.path, dict(self.info, manifest=manifests[lowest],
                                              manifests=manifests))

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
                    "pos_mean": rec.pos_mean, "checksum": xxhash.xxh3_64_hexdigest(
                        np.ascontiguousarray(arr).reshape(-1).view(np.uint8))}
                   for (rec, _), arr in zip(parts, arrays)]
        self.note("first_batch", {"step": step, "tensors": jsonable(tensors)})
