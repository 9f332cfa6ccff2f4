"""The run manifest: what a run was set up with, recorded beside its tensors in run.json.

Framework-neutral parts live here (versions, the environment allow-list with secret redaction,
seeding); the adapters add their determinism flags and every optimizer they see.
"""
from __future__ import annotations

import functools
import os
import platform
import re
from typing import Any, Dict, Mapping, Optional

__all__ = ["base_manifest", "environment_allowlisted", "looks_secret", "jsonable",
           "record_seed_all", "seed_record"]

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSWD|CREDENTIAL|AUTH|API_?KEY|PRIVATE|_KEY\b",
                          re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"(?:^|[^A-Za-z0-9])(?:sk-|ghp_|gho_|github_pat_|xox[abprs]-|AKIA|ASIA|AIza|glpat-|hf_)"
    r"|[A-Za-z0-9+/_\-]{24,}")
_SEED: Dict[str, Any] = {}


def looks_secret(name: str, value: str) -> bool:
    """A name or value that looks like a token, key or password."""
    if _SECRET_NAME.search(name):
        return True
    if _SECRET_VALUE.search(value):
        compact = re.sub(r"[^A-Za-z0-9]", "", value)
        return any(c.isdigit() for c in compact) and any(c.isalpha() for c in compact) or \
            bool(re.search(r"sk-|ghp_|AKIA|xox|hf_|glpat-", value))
    return False


@functools.lru_cache(maxsize=1)
def _allow_list() -> tuple:
    from .naming import name_table
    return tuple(name_table("environment.yaml").get("names", ()))


def environment_allowlisted(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The allow-listed numerics variables that are set; secret-looking values redacted."""
    environ = os.environ if environ is None else environ
    out = {}
    for name in _allow_list():
        if name in environ:
            value = environ[name]
            out[name] = "<redacted>" if looks_secret(name, value) else value
    return out


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
