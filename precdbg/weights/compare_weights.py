"""`precdbg compare-weights A B`: compare two checkpoints tensor by tensor, across frameworks.

Formats (by extension, else by content): PyTorch `.pt`/`.pth`/`.bin` (`torch.load`, CPU,
`weights_only=True`; a state dict, or a dict holding one under "state_dict" or "model"),
MindSpore `.ckpt` (`mindspore.load_checkpoint`), safetensors (`safetensors.numpy.load_file`) and
numpy `.npz`. Each framework is imported only when a file of its format is read.

Names are brought to PyTorch's convention: MindSpore leaf names through the name table
(`gamma` -> `weight`, `beta` -> `bias`, `moving_mean` -> `running_mean`, `embedding_table` ->
`weight`, ...). A MindSpore checkpoint's optimizer state and training counters (`moment1.*`,
`adam_m.*`, `global_step`, `learning_rate`, ...) are set aside and counted, not compared. When
every name of a checkpoint starts with `module.` (DistributedDataParallel), that prefix is dropped.

Values are compared in float64 (bfloat16 and other float formats are cast first): a tensor differs
when any element has |a - b| > atol + rtol * max(|a|, |b|) (NaN equals NaN).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import ConfigError, DumpError
from ..storage.json_files import jsonable
from .checkpoints import checkpoint_format, read_checkpoint

__all__ = ["compare_weights", "format_weights", "weights_main", "load_weights",
           "MINDSPORE_OPTIMIZER_PREFIXES", "MINDSPORE_OPTIMIZER_NAMES"]

# names of a MindSpore checkpoint that are optimizer state or training counters, not weights
MINDSPORE_OPTIMIZER_PREFIXES = ("moment1.", "moment2.", "moments.", "adam_m.", "adam_v.",
                                "accum.")
MINDSPORE_OPTIMIZER_NAMES = ("global_step", "learning_rate", "beta1_power", "beta2_power",
                             "current_iterator_step", "last_overflow_iterator_step",
                             "epoch_num", "step_num", "scale_sense")

_LIST_LIMIT = 20


def load_weights(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """A checkpoint's tensors under PyTorch-convention names, and what was read: `file`,
    `format`, `count` (tensors compared), `optimizer_state` (set aside), `skipped` (non-tensor
    entries), `renamed` (names mapped to PyTorch's convention)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DumpError(f"{path}: is a directory, not a checkpoint file")
    fmt = checkpoint_format(path)
    tensors, skipped = read_checkpoint(path, fmt)
    set_aside = 0
    renamed = 0
    out: Dict[str, np.ndarray] = {}
    if fmt == "mindspore":
        from ..records.naming import torch_param_leaf
        for name, value in tensors.items():
            if name in MINDSPORE_OPTIMIZER_NAMES or name.startswith(MINDSPORE_OPTIMIZER_PREFIXES):
                set_aside += 1
                continue
            owner, _, leaf = name.rpartition(".")
            new_leaf = torch_param_leaf("mindspore", leaf)
            new = f"{owner}.{new_leaf}" if owner else new_leaf
            if new != name:
                renamed += 1
            if new in out:             # both spellings present: keep the original name
                new = name
            out[new] = value
    else:
        out = dict(tensors)
    if out and all(n.startswith("module.") for n in out):
        out = {n[len("module."):]: v for n, v in out.items()}
    info = {"file": path, "format": fmt, "count": len(out), "optimizer_state": set_aside,
            "skipped": skipped, "renamed": renamed}
    return out, info


# --------------------------------------------------------------------------- comparison
def _as_float64(value: np.ndarray) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype.kind not in "biufc":    # bfloat16 / float8 (ml_dtypes) and other extension types
        a = a.astype(np.float32)
    if a.dtype.kind == "c":
        return a.astype(np.complex128)
    return a.astype(np.float64)


def _diff(a: np.ndarray, b: np.ndarray, atol: float, rtol: float
          ) -> Tuple[bool, float, float, float]:
    """(differs, max_abs, max_rel, cosine) of two same-shape tensors."""
    x, y = _as_float64(a).ravel(), _as_float64(b).ravel()
    if x.size == 0:
        return False, 0.0, 0.0, 1.0
    both_nan = np.isnan(x) & np.isnan(y)
    same_inf = np.isinf(x) & (x == y)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(x - y)
        same = both_nan | same_inf
        scale = np.where(same, 0.0, np.maximum(np.abs(x), np.abs(y)))
        err = np.where(same, 0.0, err)
        bad = ~(err <= atol + rtol * scale)                  # a NaN error counts as bad
        max_abs = float(np.max(err)) if not np.isnan(err).any() else math.nan
        rel = np.where(scale > 0, err / np.where(scale > 0, scale, 1.0), 0.0)
        max_rel = float(np.max(rel)) if not np.isnan(rel).any() else math.nan
        finite = np.isfinite(x) & np.isfinite(y)
        xf, yf = x[finite], y[finite]
        nx, ny = float(np.linalg.norm(xf)), float(np.linalg.norm(yf))
        if nx == 0 and ny == 0:
            cosine = 1.0
        elif nx == 0 or ny == 0:
            cosine = 0.0
        else:
            cosine = float(np.real(np.vdot(xf, yf)) / (nx * ny))
    return bool(bad.any()), max_abs, max_rel, cosine


def compare_weights(a: str, b: str, atol: float = 0.0, rtol: float = 1e-5) -> Dict[str, Any]:
    """Compare two checkpoints by (PyTorch-convention) name; see the module docstring."""
    for name, value in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{name}: a tolerance is a finite number >= 0, got {value!r}")
    wa, info_a = load_weights(a)
    wb, info_b = load_weights(b)
    only_a = sorted(set(wa) - set(wb))
    only_b = sorted(set(wb) - set(wa))
    shape_mismatch: List[Dict[str, Any]] = []
    value_mismatch: List[Dict[str, Any]] = []
    dtype_mismatch: List[Dict[str, Any]] = []
    matched = 0
    for name in sorted(set(wa) & set(wb)):
        x, y = np.asarray(wa[name]), np.asarray(wb[name])
        if str(x.dtype) != str(y.dtype):     # by name: MindSpore's bfloat16 is its own type
            dtype_mismatch.append({"name": name, "dtype_a": str(x.dtype),
                                   "dtype_b": str(y.dtype)})
        if tuple(x.shape) != tuple(y.shape):
            shape_mismatch.append({"name": name, "shape_a": list(x.shape),
                                   "shape_b": list(y.shape)})
            continue
        differs, max_abs, max_rel, cosine = _diff(x, y, atol, rtol)
        if differs:
            value_mismatch.append({"name": name, "max_abs": max_abs, "max_rel": max_rel,
                                   "cosine": cosine, "dtype_a": str(x.dtype),
                                   "dtype_b": str(y.dtype)})
        else:
            matched += 1
    value_mismatch.sort(key=lambda m: -(m["max_abs"] if not math.isnan(m["max_abs"])
                                        else math.inf))
    verdict = "match" if not (only_a or only_b or shape_mismatch or value_mismatch) \
        else "diverged"
    return {"a": info_a, "b": info_b, "only_in_a": only_a, "only_in_b": only_b,
            "shape_mismatch": shape_mismatch, "value_mismatch": value_mismatch,
            "dtype_mismatch": dtype_mismatch, "matched": matched, "atol": atol, "rtol": rtol, "verdict": verdict}


# --------------------------------------------------------------------------- output
def _side(label: str, info: Mapping[str, Any]) -> str:
    extra = []
    if info.get("optimizer_state"):
        extra.append(f"{info['optimizer_state']} optimizer-state entries set aside")
    if info.get("skipped"):
        extra.append(f"{info['skipped']} non-tensor entries skipped")
    if info.get("renamed"):
        extra.append(f"{info['renamed']} names mapped to PyTorch's")
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"{label}  {info['file']}  [{info['format']}]  {info['count']} tensors{tail}"


def _names(lines: List[str], title: str, names: List[str]) -> None:
    if not names:
        return
    lines.append(f"{title}: {len(names)}")
    for name in names[:_LIST_LIMIT]:
        lines.append(f"  {name}")
    if len(names) > _LIST_LIMIT:
        lines.append(f"  ... and {len(names) - _LIST_LIMIT} more (see --json)")


def format_weights(result: Dict[str, Any]) -> str:
    """Terminal text of a `compare_weights()` result."""
    lines = [_side("A", result["a"]), _side("B", result["b"])]
    _names(lines, "only in A", result["only_in_a"])
    _names(lines, "only in B", result["only_in_b"])
    if result["shape_mismatch"]:
        lines.append(f"shape mismatch: {len(result['shape_mismatch'])}")
        for m in result["shape_mismatch"][:_LIST_LIMIT]:
            lines.append(f"  {m['name']}  {tuple(m['shape_a'])} vs {tuple(m['shape_b'])}")
    if result["value_mismatch"]:
        lines.append(f"value mismatch: {len(result['value_mismatch'])} "
                     f"(atol {result.get('atol', 0):g}, rtol {result.get('rtol', 0):g})")
        width = max(len(m["name"]) for m in result["value_mismatch"][:_LIST_LIMIT])
        for m in result["value_mismatch"][:_LIST_LIMIT]:
            lines.append(f"  {m['name']:<{width}}  max_abs {m['max_abs']:.4g}  "
                         f"max_rel {m['max_rel']:.4g}  cosine {m['cosine']:.6f}")
        if len(result["value_mismatch"]) > _LIST_LIMIT:
            lines.append(f"  ... and {len(result['value_mismatch']) - _LIST_LIMIT} more")
    if result.get("dtype_mismatch"):
        kinds = collections.Counter((m["dtype_a"], m["dtype_b"])
                                    for m in result["dtype_mismatch"])
        lines.append(f"dtype differs: {len(result['dtype_mismatch'])} tensors (" + ", ".join(
            f"{n} {a} in A, {b} in B" for (a, b), n in kinds.most_common()) +
            "; values compared in float64)")
    lines.append(f"matched: {result['matched']}")
    lines.append(f"verdict: {result['verdict']}")
    return "\n".join(lines) + "\n"



def weights_main(args: argparse.Namespace) -> int:
    """`precdbg compare-weights A B [--json F] [--rtol R] [--atol A]`: 0 match, 1 differences;
    raises DumpError for unreadable or unknown files."""
    rtol = getattr(args, "rtol", None)
    atol = getattr(args, "atol", None)
    result = compare_weights(args.a, args.b, atol=0.0 if atol is None else float(atol),
                             rtol=1e-5 if rtol is None else float(rtol))
    sys.stdout.write(format_weights(result))
    json_path = getattr(args, "json", None)
    if json_path:
        try:
            with open(json_path, "w", encoding="utf-8") as handle:
                json.dump(jsonable(result), handle, indent=1, allow_nan=False)
                handle.write("\n")
        except OSError as exc:
            raise DumpError(f"{json_path}: cannot write JSON ({exc.strerror or exc})") from None
    return 0 if result["verdict"] == "match" else 1
