"""Reading a config file: JSON or YAML text into a mapping, or a one-line `ConfigError` naming
the file (missing, a folder, not UTF-8, not parseable, a key given twice, not a mapping)."""
from __future__ import annotations

import difflib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from ..errors import ConfigError

__all__ = ["read_config_file", "unknown_key_message"]


class _RepeatedKey(ValueError):
    """A key given twice in one mapping of a config file (JSON and YAML parsers keep the last
    silently: the setting a user reads first would not be the one used)."""

    def __init__(self, key: Any, line: Optional[int] = None) -> None:
        where = f" (line {line})" if line is not None else ""
        super().__init__(f"{key}: key given twice in one mapping{where}; keep one")


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _load_yaml(text: str) -> Any:
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":    # `<<: *defaults`
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    repeated = key in seen
                except TypeError:            # an unhashable key: yaml's own error follows
                    break
                if repeated:
                    raise _RepeatedKey(key, key_node.start_mark.line + 1)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_config_file(path: str) -> Dict[str, Any]:
    if os.path.isdir(path):
        raise ConfigError(f"{path}: is a directory, not a config file")
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found")
    try:
        with open(path, "r", encoding="utf-8-sig") as handle:    # a BOM (Windows editors)
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})"
                          ) from None
    lower = path.lower()
    yaml_file = lower.endswith((".yaml", ".yml"))
    if not text.strip() and not yaml_file:
        raise ConfigError(f"{path}: the file is empty (write {{}} for every default)")
    try:
        if yaml_file:
            data = _load_yaml(text)
        else:
            data = json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                          f"{exc.msg}") from None
    except Exception as exc:  # yaml.YAMLError and friends
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: invalid YAML: {reason}") from None
    if data is None and yaml_file:       # a YAML file of comments only: every default
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def unknown_key_message(key: str, known: Any, what: str = "key") -> str:
    """"unknown key — did you mean step?" (for "stpe"), or the known keys when none is close."""
    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    if close:
        return f"unknown {what} — did you mean {close[0]}?"
    return f"unknown {what} (known: {', '.join(sorted(known))})"
