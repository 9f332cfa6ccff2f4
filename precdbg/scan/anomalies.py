"""Gradient and activation anomalies of one dump: exploding, vanishing and all-zero parameter
gradients, saturated sigmoid/tanh/softmax outputs (thresholds below)."""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np

from ..records.schema import Direction, RecordKind, Role, scalar_mask

EXPLODING_GRAD_RATIO = 1e3     # ||grad|| / ||param|| above this: exploding gradient
VANISHING_GRAD_RATIO = 1e-10   # 0 < ||grad|| / ||param|| below this: vanishing gradient
SIGMOID_SATURATED_HIGH = 0.99  # sigmoid output mean above this: saturated at 1
SIGMOID_SATURATED_LOW = 0.01   # sigmoid output mean below this: saturated at 0
TANH_SATURATED = 0.99          # |tanh output mean| above this: saturated at +-1
SOFTMAX_SATURATED = 0.99       # mean over rows of sum(p^2) above this: rows nearly one-hot
SATURATING_OPS = ("sigmoid", "tanh", "softmax")

__all__ = ["gradient_findings", "saturation_findings", "loss_scale_of"]


_METRIC_FIELDS = ("dtype", "shape", "numel", "min", "max", "mean", "norm", "nan_count",
                  "inf_count", "arg_index", "seq")


def _metrics(row: Dict[str, Any], **extra: Any) -> Dict[str, Any]:
    out = {k: (list(row[k]) if k == "shape" else row[k]) for k in _METRIC_FIELDS if k in row}
    out.update(extra)
    return out



def _finding(kind: str, row: Dict[str, Any], detail: str, **extra: Any) -> Dict[str, Any]:
    return {"kind": kind, "step": int(row["step"]), "rank": int(row["rank"]),
            "name": row["entry"], "module": row["module"], "op": row["op"], "role": row["role"],
            "detail": detail, "metrics": _metrics(row, **extra)}


def loss_scale_of(run: Dict[str, Any]) -> float:
    """The loss scale an AMP GradScaler held in this run (run.json's manifest, as last noted
    after its update), else 1: the parameter gradients of a scaled backward are that many
    times the true ones until the scaler unscales them."""
    noted = (run.get("manifest") or {}).get("loss_scale")
    scale = noted.get("scale") if isinstance(noted, dict) else None
    return float(scale) if isinstance(scale, (int, float)) and scale > 0 \
        and math.isfinite(scale) else 1.0


def gradient_findings(table: Any, loss_scale: float = 1.0) -> List[Dict[str, Any]]:
    """Exploding, vanishing and all-zero parameter gradients; norms are judged divided by the
    run's `loss_scale` (the dw records of a scaled backward hold scaled gradients)."""
    kinds, roles = table["kind"], table["role"]
    inventory: Dict[str, Tuple[float, bool]] = {}
    for i in np.nonzero((kinds == RecordKind.PARAM) & (roles == Role.PARAM))[0]:
        inventory[str(table["api"][i])] = (float(table["norm"][i]), bool(table["trainable"][i]))
    findings = []
    grads = np.nonzero((kinds == RecordKind.PARAM_GRAD) & (roles == Role.PARAM_GRAD)
                       & ~scalar_mask(table["dtype"]))[0]
    for i in grads[np.argsort(table["seq"][grads], kind="stable")]:
        row = table.row(int(i))
        if row["nan_count"] != 0 or row["inf_count"] != 0 or row["numel"] <= 0:
            continue                   # non-finite gradients are the non-finite scan's
        path = row["api"]
        pnorm, trainable = inventory.get(path, (math.nan, True))
        gnorm = float(row["norm"])
        if row["min"] == 0 and row["max"] == 0:
            if trainable:
                findings.append(_finding(
                    "zero_grad", row, f"gradient of trainable parameter {path} is all zero",
                    param=path, param_norm=pnorm))
            continue
        if not (math.isfinite(pnorm) and pnorm > 0 and math.isfinite(gnorm)):
            continue
        ratio = gnorm / loss_scale / pnorm
        scaled = f" (loss scale {loss_scale:g}: {gnorm / loss_scale:.4g} unscaled)" \
            if loss_scale != 1.0 else ""
        for kind, beyond, threshold in (
                ("exploding_grad", ratio > EXPLODING_GRAD_RATIO, EXPLODING_GRAD_RATIO),
                ("vanishing_grad", 0 < gnorm and ratio < VANISHING_GRAD_RATIO,
                 VANISHING_GRAD_RATIO)):
            if beyond:
                findings.append(_finding(
                    kind, row, f"gradient norm {gnorm:.4g}{scaled} of {path} is {ratio:.3g} x "
                    f"its norm {pnorm:.4g} (threshold {threshold:g})", param=path,
                    param_norm=pnorm, ratio=ratio, loss_scale=loss_scale))
    return findings


# --------------------------------------------------------------------------- saturation
def _softmax_dim(table: Any, entry: str, ndim: int) -> int:
    idx = np.nonzero((table["entry"] == entry) & (table["role"] == Role.INPUT)
                     & np.char.startswith(table["dtype"], "py.int"))[0]
    for i in idx:
        if str(table["arg_key"][i]) in ("dim", "axis", "1"):
            try:
                dim = int(str(table["text"][i]))
            except ValueError:
                continue
            return dim + ndim if dim < 0 else dim
    return ndim - 1


def saturation_findings(table: Any) -> List[Dict[str, Any]]:
    mask = (np.isin(table["op"], SATURATING_OPS) & (table["role"] == Role.OUTPUT)
            & (table["direction"] == Direction.FORWARD)
            & np.isin(table["kind"], (RecordKind.API, RecordKind.MODULE))
            & ~scalar_mask(table["dtype"]) & (table["nan_count"] == 0)
            & (table["inf_count"] == 0) & (table["numel"] > 0))
    idx = np.nonzero(mask)[0]
    if not len(idx):
        return []
    # a module (nn.Tanh) and the API it runs (torch.tanh) record the same tensor: judge it once
    api_ids = set(table["tensor_id"][idx][table["kind"][idx] == RecordKind.API].tolist()) - {-1}
    findings = []
    for i in idx[np.argsort(table["seq"][idx], kind="stable")]:
        row = table.row(int(i))
        if row["kind"] == RecordKind.MODULE and row["tensor_id"] in api_ids:
            continue
        op, mean = row["op"], float(row["mean"])
        if not math.isfinite(mean):
            continue
        if op == "sigmoid" and (mean > SIGMOID_SATURATED_HIGH or mean < SIGMOID_SATURATED_LOW):
            bound = 1 if mean > SIGMOID_SATURATED_HIGH else 0
            detail = f"sigmoid output mean {mean:.4g}: saturated at {bound}"
            findings.append(_finding("saturated", row, detail, saturation=mean))
        elif op == "tanh" and abs(mean) > TANH_SATURATED:
            detail = f"tanh output mean {mean:.4g}: saturated at {'+1' if mean > 0 else '-1'}"
            findings.append(_finding("saturated", row, detail, saturation=mean))
        elif op == "softmax":
            shape = row["shape"]
            if not shape:
                continue
            dim = _softmax_dim(table, row["entry"], len(shape))
            if not 0 <= dim < len(shape) or shape[dim] < 2:
                continue
            rows = row["numel"] / shape[dim]
            peak = float(row["norm"]) ** 2 / rows if rows else math.nan
            if peak > SOFTMAX_SATURATED:
                detail = (f"softmax rows nearly one-hot: mean sum(p^2) {peak:.4g} over "
                          f"{int(rows)} rows of {shape[dim]}")
                findings.append(_finding("saturated", row, detail, saturation=peak))
    return findings


# --------------------------------------------------------------------------- scan
