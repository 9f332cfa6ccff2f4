"""The configuration: one pydantic model, read from JSON or YAML (precdbg's flat form or an msprobe
config.json as is), overridden by keyword arguments, validated once.

Every error is a `ConfigError` whose message names the file and the key, on one line.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from .files import read_config_file, unknown_key_message
from .msprobe import from_msprobe, is_msprobe
from ..errors import ConfigError
from ..records.schema import DataMode, Level, SummaryMode, Task

__all__ = ["DumpConfig", "load_config", "unknown_key_message"]

_LEVEL_ALIASES = {"l0": Level.MODULE, "l1": Level.API, "module": Level.MODULE, "api": Level.API,
                  "mix": Level.MIX}
_SUMMARY_ALIASES = {"statistics": SummaryMode.STATISTICS, "checksum": SummaryMode.CHECKSUM,
                    "md5": SummaryMode.CHECKSUM}
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


_MAX_LISTED = 100_000      # steps (ranks) one list may name: each is kept and written to run.json


def _expand_int_list(value: Any, key: str) -> List[int]:
    """[0, 2, "4-6"] -> [0, 2, 4, 5, 6]; an int alone is a one-element list."""
    if value is None:
        return []
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of integers, got {value!r}")
    out: List[int] = []
    for item in value:
        if isinstance(item, bool):
            raise ValueError(f"expected an integer, got {item!r}")
        if isinstance(item, int):
            out.append(item)
            continue
        if isinstance(item, str):
            match = _RANGE.match(item)
            if match:
                lo, hi = int(match.group(1)), int(match.group(2))
                if lo > hi:
                    raise ValueError(f"range {item!r} runs backwards")
                if hi - lo + 1 + len(out) > _MAX_LISTED:
                    raise ValueError(f"range {item!r} lists {hi - lo + 1:,} values, more than "
                                     f"the {_MAX_LISTED:,} a {key} list may hold; an empty "
                                     f"list ([]) selects every {key}")
                out.extend(range(lo, hi + 1))
                continue
            if item.strip().isdigit():
                out.append(int(item))
                continue
        raise ValueError(f"expected an integer or a range like '3-5', got {item!r}")
    if any(v < 0 for v in out):
        raise ValueError(f"{key} values must be >= 0, got {sorted(set(v for v in out if v < 0))}")
    return sorted(set(out))


class DumpConfig(BaseModel):
    """What to capture, where to write it. Field names follow msprobe where one exists."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    task: Task = Task.STATISTICS
    level: Level = Level.MIX
    dump_path: str = "./precdbg_dump"
    step: List[int] = Field(default_factory=list, description="iterations to dump; empty = all")
    rank: List[int] = Field(default_factory=list, description="ranks to dump; empty = all")
    scope: List[str] = Field(default_factory=list,
                             description="glob patterns on module path or entry/API name to keep")
    scope_range: List[str] = Field(default_factory=list,
                                   description="msprobe scope: [first entry, last entry], inclusive, "
                                               "in forward execution order")
    api_list: List[str] = Field(default_factory=list, alias="list",
                                description="API names (or substrings) to keep, e.g. 'linear'")
    tensor_list: List[str] = Field(default_factory=list,
                                   description="statistics task: also store full tensors of these")
    data_mode: List[DataMode] = Field(default_factory=lambda: [DataMode.ALL])
    summary_mode: SummaryMode = SummaryMode.STATISTICS
    # true or false only: a string ("yes", "false") is refused, as msprobe refuses it
    include_optimizer: bool = Field(default=False, strict=True)
    stack: bool = Field(default=True, strict=True)
    queue_mb: int = Field(default=256, ge=1, le=1 << 20, strict=True)
    overflow_nums: int = Field(default=-1, ge=-1, strict=True,
                               description="overflow task: keep the first N non-finite ops; -1 all")
    compression: Optional[str] = None
    seed: Optional[int] = Field(default=None, ge=0, le=2 ** 32 - 1,   # numpy's seed range
                                strict=True)
    deterministic: bool = Field(default=False, strict=True)

    @field_validator("dump_path", mode="after")
    @classmethod
    def _home(cls, value: str) -> str:
        return os.path.expanduser(value)     # "~/dumps" in a config file: the user's home

    @field_validator("level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.strip().lower()
            if key == "l2":
                raise ValueError("L2 (kernel-level dump) is not supported; use module (L0), "
                                 "api (L1) or mix")
            if key in _LEVEL_ALIASES:
                return _LEVEL_ALIASES[key]
            raise ValueError(f"{value!r} is not one of module, api, mix (or L0, L1)")
        return value

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.strip().lower()
            if key == "overflow_check":
                return Task.OVERFLOW
            if key not in {t.value for t in Task}:
                raise ValueError(f"{value!r} is not one of statistics, tensor, overflow")
            return key
        return value

    @field_validator("summary_mode", mode="before")
    @classmethod
    def _summary(cls, value: Any) -> Any:
        if isinstance(value, str):
            key = value.strip().lower()
            if key not in _SUMMARY_ALIASES:
                raise ValueError(f"{value!r} is not one of statistics, checksum (or md5)")
            return _SUMMARY_ALIASES[key]
        return value

    @field_validator("step", "rank", mode="before")
    @classmethod
    def _int_lists(cls, value: Any, info: Any) -> List[int]:
        return _expand_int_list(value, info.field_name)

    @field_validator("scope", "api_list", "tensor_list", mode="before")
    @classmethod
    def _str_lists(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value

    @field_validator("data_mode", mode="before")
    @classmethod
    def _data_mode(cls, value: Any) -> Any:
        if value is None or value == []:
            return [DataMode.ALL]
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and len(value) > 1 and "all" in value:
            raise ValueError("'all' must stand alone (or combine forward/backward with input/output)")
        return value

    @field_validator("scope_range")
    @classmethod
    def _scope_range(cls, value: List[str]) -> List[str]:
        if value and len(value) != 2:
            raise ValueError(f"expected [first entry, last entry], got {len(value)} names")
        return value

    @field_validator("compression")
    @classmethod
    def _compression(cls, value: Optional[str]) -> Optional[str]:
        if value in (None, "", "none"):
            return None
        if value not in ("lzf", "gzip"):
            raise ValueError(f"{value!r} is not one of none, lzf, gzip")
        return value

    @model_validator(mode="after")
    def _range_fits_level(self) -> "DumpConfig":
        """A range's ends must be calls the level records (msprobe refuses the others too): at
        level module two module entries, at level api two API entries."""
        if self.scope_range and self.level is not Level.MIX:
            modules = [n.startswith(_MODULE_PREFIXES) for n in self.scope_range]
            if self.level is Level.MODULE and not all(modules):
                raise ValueError(f"scope: {self.scope_range}: at level module (L0) both ends "
                                 "must be module entries (Module.<path>.<Class>.forward.<n>)")
            if self.level is Level.API and any(modules):
                raise ValueError(f"scope: {self.scope_range}: at level api (L1) both ends must "
                                 "be API entries (Functional.linear.0.forward); module entries "
                                 "need level module or mix")
        return self

    # ---- derived views (kept here so every adapter applies the same rules) ----
    @property
    def keeps_modules(self) -> bool:
        return self.level in (Level.MODULE, Level.MIX)

    @property
    def keeps_apis(self) -> bool:
        return self.level in (Level.API, Level.MIX)

    @property
    def checksums(self) -> bool:
        return self.summary_mode is SummaryMode.CHECKSUM

    def public_dict(self) -> Dict[str, Any]:
        """JSON-ready form, as recorded in run.json."""
        return json.loads(self.model_dump_json(by_alias=True))


_MODULE_PREFIXES = ("Module.", "Cell.")


# ----------------------------------------------------------------------------- loading
def _pydantic_message(exc: ValidationError, where: str) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err.get("loc", ())) or "config"
    if key == "api_list":
        key = "list"
    msg = err.get("msg", "invalid value")
    if err.get("type") == "extra_forbidden":
        msg = unknown_key_message(key, {f.alias or n for n, f in
                                         DumpConfig.model_fields.items()})
    elif err.get("type") in ("bool_type", "int_type"):
        given = err.get("input")
        kind = f" ({type(given).__module__}.{type(given).__name__})" \
            if type(given) not in (str, int, float, bool, type(None), list, dict) else ""
        msg = (f"expected {'true or false' if err['type'] == 'bool_type' else 'an integer'}, "
               f"got {given!r}{kind}")
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    elif err.get("type") == "enum":        # the value given, and the key it is an item of
        msg = f"{err.get('input')!r}: {msg}"
        key = re.sub(r"\.\d+$", "", key)
    extra = f" ({len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    if not err.get("loc"):             # a rule over several keys: its message names them
        return f"{where}: {msg}{extra}"
    return f"{where}: {key}: {msg}{extra}"


def load_config(config_path: Optional[str] = None, **overrides: Any) -> DumpConfig:
    """Read a config file (JSON/YAML, precdbg or msprobe form) and apply keyword overrides."""
    where = config_path or "arguments"
    raw: Dict[str, Any] = {}
    if config_path is not None:
        if not isinstance(config_path, (str, os.PathLike)):
            raise ConfigError(f"config_path: a path to a JSON or YAML file, got "
                              f"{type(config_path).__name__}")
        raw = read_config_file(os.fspath(config_path))
        if "list" in raw and "api_list" in raw:
            raise ConfigError(f"{where}: list and api_list name the same setting; keep one")
        if is_msprobe(raw):
            given = overrides.get("task")
            raw = from_msprobe(raw, where, given.value if hasattr(given, "value") else given)
    for key, value in overrides.items():
        if value is not None:
            raw["list" if key == "api_list" else key] = value
            where = f"{where}" if config_path else "arguments"
    try:
        return DumpConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_pydantic_message(exc, where)) from None
