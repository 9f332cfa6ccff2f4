"""The configuration: one pydantic model, read from JSON or YAML (precdbg's flat form or an msprobe
config.json as is), overridden by keyword arguments, validated once.

Every error is a `ConfigError` whose message names the file and the key, on one line.
"""
from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any, Dict, List, Mapping, Optional

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from .config_file import read_config_file
from .errors import ConfigError
from .schema import DataMode, Level, SummaryMode, Task

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


# ----------------------------------------------------------------------------- msprobe form
_MODULE_PREFIXES = ("Module.", "Cell.")
_MSPROBE_TASK_SECTIONS = {"statistics": "statistics", "tensor": "tensor",
                          "overflow_check": "overflow_check", "overflow": "overflow_check"}
_MSPROBE_UNSUPPORTED_TASKS = {"free_benchmark", "run_ut", "grad_probe", "structure",
                              "exception_dump", "acc_check", "diff_check", "nan_check"}
_MSPROBE_SECTIONS = set(_MSPROBE_TASK_SECTIONS.values()) | _MSPROBE_UNSUPPORTED_TASKS
# top-level msprobe keys that carry over unchanged, renamed, or are checked then dropped
_MSPROBE_TOP_KEEP = {"task", "dump_path", "rank", "step", "level",
                     # precdbg's own settings, which msprobe has no key for
                     "stack", "include_optimizer", "queue_mb", "compression", "deterministic"}
_MSPROBE_TOP_RENAMED = {"is_deterministic": "deterministic", "seed": "seed"}
_MSPROBE_SECTION_KEEP = {"list", "data_mode", "tensor_list", "overflow_nums"}
# msprobe names an entry Prefix.api.N.direction or Module|Cell.path.Class.direction.N
_ENTRY_NAME = re.compile(r"^[A-Za-z]+\..+\.(\d+\.(forward|backward)|(forward|backward)\.\d+)$")
# every key _from_msprobe understands, for "did you mean" on a typo
_MSPROBE_TOP_KNOWN = (_MSPROBE_TOP_KEEP | set(_MSPROBE_TOP_RENAMED) | _MSPROBE_SECTIONS
                      | {"enable_dataloader", "async_dump", "framework", "precision", "extra_info",
                         "risk_level", "load", "dump_enable", "acl_config",
                         "custom_op_namespaces"})
_MSPROBE_SECTION_KNOWN = _MSPROBE_SECTION_KEEP | {
    "scope", "summary_mode", "device", "bench_path", "diff_nums", "error_data_path",
    "white_list", "black_list", "is_online", "rank_list", "file_format", "check_mode",
    "online_run_ut", "online_run_ut_recompute", "nfs_path", "host", "port", "tls_path",
    "backward_input"}
_MS_STAT_ITEMS = {"max", "min", "mean", "l2norm", "norm", "nan count", "negative zero count",
                  "positive zero count", "zero count", "inf count", "-inf count", "hash", "md5"}


def unknown_key_message(key: str, known: Any, what: str = "key") -> str:
    """"unknown key — did you mean step?" (for "stpe"), or the known keys when none is close."""
    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown {what} — did you mean {close[0]}?"
    return f"unknown {what} (known: {', '.join(sorted(known))})"


def _is_msprobe(raw: Mapping[str, Any]) -> bool:
    return any(key in raw and isinstance(raw[key], dict) for key in _MSPROBE_SECTIONS) or any(
        key in raw for key in ("is_deterministic", "enable_dataloader", "async_dump", "framework"))


def _settings_in_another_section(raw: Mapping[str, Any], task: str, own: str, where: str
                                 ) -> None:
    """The task's own section is missing, but another task's section selects what to dump (a
    scope, a list, a data_mode, a summary_mode other than the defaults): msprobe reads only the
    task's section, so that selection would silently not apply (a whole, unscoped tensor
    dump). Refused, naming where it belongs."""
    for other in sorted(set(_MSPROBE_TASK_SECTIONS.values()) - {own}):
        section = raw.get(other)
        if not isinstance(section, dict):
            continue
        for key in ("scope", "list", "data_mode", "summary_mode"):
            if section.get(key) and section.get(key) not in (["all"], "all", "statistics"):
                raise ConfigError(f"{where}: {other}.{key}: set, but the task is {task!r}, "
                                  f"whose settings go in a {own!r} section (only the task's "
                                  "own section applies); move them there")


def _from_msprobe(raw: Mapping[str, Any], where: str, task: Optional[str] = None
                  ) -> Dict[str, Any]:
    """Translate an msprobe config.json into precdbg's flat form; refuse what cannot apply.
    `task`: the task given as an argument, whose section applies (as in msprobe)."""
    task = str(task or raw.get("task", "statistics")).strip().lower()
    if task in _MSPROBE_UNSUPPORTED_TASKS:
        raise ConfigError(f"{where}: task: msprobe task {task!r} is not a dump task; precdbg "
                          "supports statistics, tensor and overflow_check")
    flat: Dict[str, Any] = {}
    for key, value in raw.items():
        if key in _MSPROBE_SECTIONS:
            continue
        if key in _MSPROBE_TOP_KEEP:
            flat[key] = value
        elif key in _MSPROBE_TOP_RENAMED:
            flat[_MSPROBE_TOP_RENAMED[key]] = value
        elif key in ("enable_dataloader", "dump_enable") and not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: expected true or false, got {value!r}")
        elif key == "enable_dataloader":
            if value:
                raise ConfigError(f"{where}: enable_dataloader: dataloader-driven steps are not "
                                  "supported; call debugger.step() once per iteration")
        elif key in ("async_dump", "framework", "precision", "extra_info", "risk_level", "load"):
            continue  # precdbg always writes in the background, always in float64 statistics
        elif key == "dump_enable":
            if value is False:
                raise ConfigError(f"{where}: dump_enable: false would dump nothing; remove the "
                                  "debugger or set it to true")
        elif key == "acl_config":
            continue  # only used by L2, which is refused through `level`
        elif key == "custom_op_namespaces":
            if value:
                raise ConfigError(f"{where}: custom_op_namespaces: not supported; custom ops are "
                                  "captured when they dispatch through torch")
        else:
            raise ConfigError(f"{where}: {key}: "
                              + unknown_key_message(key, _MSPROBE_TOP_KNOWN, "msprobe key"))
    section_name = _MSPROBE_TASK_SECTIONS.get(task)
    if section_name and section_name not in raw:
        _settings_in_another_section(raw, task, section_name, where)
    section = raw.get(section_name, {}) if section_name else {}
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {section_name}: expected an object, got {type(section).__name__}")
    for key, value in section.items():
        path = f"{section_name}.{key}"
        if key in _MSPROBE_SECTION_KEEP:
            flat[key] = value
        elif key == "scope":
            _msprobe_scope(value, flat, where, path)
        elif key == "summary_mode":
            flat[key] = _msprobe_summary(value, where, path)
        elif key in ("device", "bench_path", "diff_nums", "error_data_path", "white_list",
                     "black_list", "is_online", "rank_list"):
            continue  # host/device statistics placement and acc_check settings: nothing to do
        elif key == "file_format":
            if str(value).lower() not in ("npy", "hdf5", "h5"):
                raise ConfigError(f"{where}: {path}: {value!r} does not apply; precdbg stores "
                                  "tensors in the step's HDF5 file (use 'npy' or omit it)")
        elif key == "check_mode":
            if str(value).lower() != "all":
                raise ConfigError(f"{where}: {path}: {value!r} is an Ascend kernel overflow mode; "
                                  "precdbg checks every captured tensor ('all')")
        elif key in ("online_run_ut", "online_run_ut_recompute"):
            if value:
                raise ConfigError(f"{where}: {path}: online run_ut is not supported")
        elif key in ("nfs_path", "host", "port", "tls_path", "backward_input"):
            if value not in (None, "", [], 0, -1):
                raise ConfigError(f"{where}: {path}: remote/online dumping is not supported")
        else:
            raise ConfigError(f"{where}: {path}: "
                              + unknown_key_message(key, _MSPROBE_SECTION_KNOWN)
                              + f" (task {task!r})")
    return flat


def _msprobe_scope(value: Any, flat: Dict[str, Any], where: str, path: str) -> None:
    """msprobe's scope is [first, last] full entry names; precdbg also takes glob patterns."""
    if not value:
        return
    if not isinstance(value, (str, list, tuple)):
        raise ConfigError(f"{where}: {path}: a scope is a list of names or patterns, got "
                          f"{type(value).__name__}")
    names = [value] if isinstance(value, str) else list(value)
    if all(isinstance(n, str) and _ENTRY_NAME.match(n) for n in names):
        if len(names) == 1:
            names = names * 2
        if len(names) != 2:
            raise ConfigError(f"{where}: {path}: a scope of entry names must be [first, last]")
        flat["scope_range"] = names
    else:
        flat["scope"] = names


def _msprobe_summary(value: Any, where: str, path: str) -> str:
    if isinstance(value, list):
        unknown = [v for v in value if str(v).lower() not in _MS_STAT_ITEMS]
        if unknown:
            raise ConfigError(f"{where}: {path}: {unknown[0]!r}: "
                              + unknown_key_message(unknown[0], _MS_STAT_ITEMS, "statistic"))
        return "checksum" if any(str(v).lower() in ("hash", "md5") for v in value) \
            else "statistics"
    if str(value).lower() == "xor":
        return "checksum"
    return value


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
        if _is_msprobe(raw):
            given = overrides.get("task")
            raw = _from_msprobe(raw, where, given.value if hasattr(given, "value") else given)
    for key, value in overrides.items():
        if value is not None:
            raw["list" if key == "api_list" else key] = value
            where = f"{where}" if config_path else "arguments"
    try:
        return DumpConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_pydantic_message(exc, where)) from None
