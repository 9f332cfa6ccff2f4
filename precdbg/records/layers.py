"""The constructor settings that decide a layer's numerics (LayerNorm eps, GELU approximate,
BatchNorm momentum, Dropout p, Conv padding, Softmax dim, Embedding padding_idx), in one neutral
vocabulary for every framework.

What to read and how to normalise it is data (`precdbg/records/tables/layers.yaml`) and the rules below;
an adapter only hands over the raw attribute values of each module/cell (`raw_settings`, plain
`getattr`, no framework import). The session stores `settings_text(...)` per module in the step
file's module tree; `setting_differences` lists the modules whose settings differ between two runs.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .naming import canonical_op, name_table

__all__ = ["attributes_to_read", "raw_settings", "layer_settings", "settings_text",
           "parse_settings", "SettingDifference", "setting_differences", "format_value",
           "same_setting", "dump_setting_differences"]

_MISSING = object()
_RTOL = 1e-6           # settings are constants: two equal ones agree far better than this


def _table() -> Dict[str, Dict[str, Dict[str, Any]]]:
    return name_table("layers.yaml").get("layers", {}) or {}


@functools.lru_cache(maxsize=1024)
def attributes_to_read(framework: str, cls: str) -> Tuple[str, ...]:
    """The attributes of a module/cell of class `cls` whose raw values the adapter hands over."""
    specs = _table().get(canonical_op(cls))
    if not specs:
        return ()
    names: List[str] = []
    for spec in specs.values():
        for name in (spec.get("read") or {}).get(framework, ()):
            if name not in names:
                names.append(str(name))
    return tuple(names)


def _plain(value: Any) -> Any:
    """A JSON-able copy of an attribute value (numbers, strings, bools, None, sequences)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    item = getattr(value, "item", None)          # numpy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        return _plain(item())
    return str(value)


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def raw_settings(framework: str, cls: str, obj: Any) -> Dict[str, Any]:
    """What an adapter hands over for one module/cell: the raw values of the attributes the
    table names for its class (absent ones left out). Never raises."""
    out: Dict[str, Any] = {}
    for name in attributes_to_read(framework, cls):
        try:
            value = _get(obj, name)
        except Exception:  # noqa: BLE001 - a property that fails is a setting not recorded
            continue
        if value is not _MISSING and not callable(value):
            out[name] = _plain(value)
    return out


# --------------------------------------------------------------------------- normalisation
def _first(raw: Mapping[str, Any], names: Sequence[str]) -> Tuple[Optional[str], Any]:
    for name in names:                  # None: not set (MindSpore Dropout(keep_prob=) has p=None)
        if raw.get(name) is not None:
            return name, raw[name]
    return None, _MISSING


def _as_is(raw: Mapping[str, Any], names: Sequence[str]) -> Any:
    return _first(raw, names)[1]


def _gelu_approximate(raw: Mapping[str, Any], names: Sequence[str]) -> Any:
    value = _first(raw, names)[1]
    if isinstance(value, bool):                  # older MindSpore: approximate=True is tanh
        return "tanh" if value else "none"
    return value if value is _MISSING else str(value).lower()


def _drop_probability(raw: Mapping[str, Any], names: Sequence[str]) -> Any:
    name, value = _first(raw, names)
    if name == "keep_prob" and isinstance(value, (int, float)):
        return 1.0 - float(value)
    return value


def _conv_padding(raw: Mapping[str, Any], names: Sequence[str]) -> Any:
    kernel = raw.get("kernel_size")
    dims = len(kernel) if isinstance(kernel, list) else 1
    mode = str(raw.get("pad_mode", "pad")).lower()
    if mode in ("same", "valid"):
        return mode
    padding = raw.get("padding", _MISSING)
    if padding is _MISSING:
        return _MISSING
    if isinstance(padding, str):
        return padding.lower()
    if isinstance(padding, (int, float)):
        pads = [int(padding)] * (2 * dims)
    elif isinstance(padding, list) and len(padding) == dims and "pad_mode" not in raw:
        pads = [int(p) for p in padding for _ in (0, 1)]     # torch: one pad per dim, both sides
    elif isinstance(padding, list):
        pads = [int(p) for p in padding]                     # MindSpore: (before, after) per dim
    else:
        return str(padding)
    return "valid" if not any(pads) else pads


def _single_axis(raw: Mapping[str, Any], names: Sequence[str]) -> Any:
    value = _first(raw, names)[1]
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


_RULES: Dict[str, Callable[[Mapping[str, Any], Sequence[str]], Any]] = {
    "gelu_approximate": _gelu_approximate, "drop_probability": _drop_probability,
    "conv_padding": _conv_padding, "single_axis": _single_axis,
}


def layer_settings(framework: str, cls: str, raw: Mapping[str, Any]) -> Dict[str, Any]:
    """The neutral settings of one module/cell from the raw values its adapter handed over."""
    specs = _table().get(canonical_op(cls))
    if not specs or not raw:
        return {}
    out: Dict[str, Any] = {}
    for setting, spec in specs.items():
        names = [str(n) for n in (spec.get("read") or {}).get(framework, ())]
        if not names:
            continue
        try:
            value = _RULES.get(str(spec.get("normalise", "")), _as_is)(raw, names)
        except (TypeError, ValueError):
            continue
        if value is not _MISSING:
            out[str(setting)] = value
    return out


def settings_text(framework: str, cls: str, raw: Mapping[str, Any]) -> str:
    """`layer_settings` as the JSON text stored per module ('' when there is none)."""
    settings = layer_settings(framework, cls, raw)
    return json.dumps(settings, sort_keys=True) if settings else ""


def parse_settings(text: str) -> Dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --------------------------------------------------------------------------- differences
@dataclasses.dataclass(frozen=True)
class SettingDifference:
    """One setting of one module that differs between two runs (a is the baseline)."""
    path_a: str
    path_b: str
    cls_a: str
    cls_b: str
    op: str
    setting: str
    a: Any
    b: Any
    call: bool = False      # an argument of a call the module makes, not the layer's own

    @property
    def text(self) -> str:
        where = self.path_a if self.path_a == self.path_b else f"{self.path_a} / {self.path_b}"
        return f"{where or '<root>'}: {self.setting} {format_value(self.a)} vs " \
               f"{format_value(self.b)}"

    def as_dict(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["call"]         # said by `setting` (`api(key=)`) where it is a call's
        return out


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def same_setting(va: Any, vb: Any) -> bool:
    if isinstance(va, bool) or isinstance(vb, bool):
        return va == vb
    if isinstance(va, (int, float)) and isinstance(vb, (int, float)):
        if math.isnan(va) or math.isnan(vb):
            return math.isnan(va) and math.isnan(vb)
        if math.isinf(va) or math.isinf(vb):    # an infinite bound (`min=-inf`): equal or not
            return va == vb
        return abs(va - vb) <= _RTOL * max(abs(va), abs(vb))
    if isinstance(va, list) and isinstance(vb, list):
        return len(va) == len(vb) and all(same_setting(x, y) for x, y in zip(va, vb))
    return va == vb


ModuleSettings = Mapping[str, Tuple[str, Mapping[str, Any]]]   # path -> (class, settings)


def setting_differences(a: ModuleSettings, b: ModuleSettings,
                        paths: Optional[Mapping[str, str]] = None) -> List[SettingDifference]:
    """Modules (paired by path; `paths` maps a path of b to a's) of the same canonical op whose
    settings recorded in both runs differ, in a's module order."""
    by_path = {(paths or {}).get(p, p): (p, cls, s) for p, (cls, s) in b.items()}
    out: List[SettingDifference] = []
    for path, (cls_a, sa) in a.items():
        if path not in by_path or not sa:
            continue
        path_b, cls_b, sb = by_path[path]
        op = canonical_op(cls_a)
        if not sb or canonical_op(cls_b) != op:
            continue
        for key in sorted(set(sa) & set(sb)):
            if not same_setting(sa[key], sb[key]):
                out.append(SettingDifference(path, path_b, cls_a, cls_b, op, key, sa[key],
                                             sb[key]))
    return out


def dump_setting_differences(a: Any, b: Any, step: Optional[int] = None,
                             rank: Optional[int] = None,
                             paths: Optional[Mapping[str, str]] = None) -> List[SettingDifference]:
    """`setting_differences` of two open dumps (`precdbg.open_dump`) at one step and rank: the
    modules a localization can treat as divergences of their own, even below tolerance."""
    return setting_differences(a.module_settings(step, rank), b.module_settings(step, rank),
                               paths)
