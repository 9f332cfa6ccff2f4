"""An msprobe config.json read as msprobe reads it: the top-level keys and the task's own
section, translated into precdbg's flat settings; what cannot apply is refused in one line."""
from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional

from .files import unknown_key_message
from ..errors import ConfigError

__all__ = ["is_msprobe", "from_msprobe"]

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


def is_msprobe(raw: Mapping[str, Any]) -> bool:
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


def from_msprobe(raw: Mapping[str, Any], where: str, task: Optional[str] = None
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
        elif key in ("enable_dataloader", "dump_enable", "async_dump") \
                and not isinstance(value, bool):
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
