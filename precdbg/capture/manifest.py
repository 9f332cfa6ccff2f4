"""The run manifest: what a run was set up with, recorded beside its tensors in run.json.

Framework-neutral parts live here (versions, the numerics environment, seeding); the adapters
add their determinism flags and every optimizer they see.
"""
from __future__ import annotations

import platform
from typing import Any, Dict, Optional

from ..records.environment import environment_allowlisted

__all__ = ["base_manifest", "record_seed_all", "seed_record"]

_SEED: Dict[str, Any] = {}


def record_seed_all(framework: str, seed: int, deterministic: bool) -> None:
    """Remember a seed_all() call of this process (written into the next run.json)."""
    _SEED[framework] = {"seed": int(seed), "deterministic": bool(deterministic)}


def seed_record(framework: str) -> Optional[Dict[str, Any]]:
    return _SEED.get(framework)


def base_manifest(framework: str, rank: int, world_size: int) -> Dict[str, Any]:
    import numpy as np
    return {"versions": {"python": platform.python_version(), "numpy": np.__version__},
            "rank": rank, "world_size": world_size, "seed_all": seed_record(framework),
            "environment": environment_allowlisted(), "optimizers": [], "lr_schedulers": [],
            "loss_scale": None}
