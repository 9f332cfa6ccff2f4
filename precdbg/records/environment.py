"""The numerics environment a run records: the allow-listed variables that are set
(`tables/environment.yaml`), with values that look like a token, key or password redacted. Read
by the capture (run.json's manifest) and by the check (which never prints a secret value)."""
from __future__ import annotations

import functools
import os
import re
from typing import Dict, Mapping, Optional

from .naming import name_table

__all__ = ["environment_allowlisted", "looks_secret"]

_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|PASSWD|CREDENTIAL|AUTH|API_?KEY|PRIVATE|_KEY\b",
                          re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"(?:^|[^A-Za-z0-9])(?:sk-|ghp_|gho_|github_pat_|xox[abprs]-|AKIA|ASIA|AIza|glpat-|hf_)"
    r"|[A-Za-z0-9+/_\-]{24,}")


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
    from ..records.naming import name_table
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
