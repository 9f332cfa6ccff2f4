"""`precdbg scan DUMP`: anomalies in one dump, read from the record statistics alone (no tensor
bytes, no framework import).

What is reported:

- the first non-finite value (`first_nonfinite`): the earliest entry (by step, then emission order
  `seq`) whose outputs (`output`, `grad_input`, `param_grad`) hold NaN/Inf that its inputs
  (`input`, `grad_output`) do not explain -- the op that *produced* them. Inputs explain outputs
  when they are non-finite themselves (NaN inputs explain anything; Inf inputs explain Inf, not a
  new NaN, so a softmax over a fully masked row is named). A backward entry's inputs include its
  forward call's tensors (backward reads what the forward saved). Scalar records (`py.*`) are not
  tensors and are ignored, except that a non-finite scalar argument marks an intended mask: an op
  told to write +-inf (`masked_fill(mask, -inf)`, `full(..., -inf)`) does not count as producing
  Inf (it still counts for NaN). When no op produced them, the first non-finite input that nothing
  earlier explains is named: "non-finite values arrive in the input data" (or in a parameter
  at the start of the step). Buffers holding only +-inf are masks, not anomalies.
- exploding / vanishing gradients: a parameter gradient whose norm is more than
  `EXPLODING_GRAD_RATIO` times, or (while nonzero) less than `VANISHING_GRAD_RATIO` times, the norm
  of the same parameter in the step's inventory (parameters of norm 0, e.g. zero-initialised
  biases, have no ratio and are not judged); under an AMP GradScaler (its scale in run.json) the
  gradients' norms are divided by the loss scale first.
- zero gradients: a trainable parameter's gradient that is all zero (min == max == 0).
- saturated activations: forward outputs of sigmoid (mean above `SIGMOID_SATURATED_HIGH` or below
  `SIGMOID_SATURATED_LOW`), tanh (|mean| above `TANH_SATURATED`) and softmax (the mean over rows of
  sum(p^2), from the norm, above `SOFTMAX_SATURATED`: rows are nearly one-hot).

`scan_dump()` returns plain data; `format_scan()` renders it; `scan_main()` is the CLI command.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DumpError
from ..storage.json_files import jsonable
from ..records.schema import (COMPUTED_ROLES, INVENTORY_ROLES, READ_ROLES, Direction,
                              RecordKind, Role, scalar_mask)
from .anomalies import (EXPLODING_GRAD_RATIO, SATURATING_OPS, SIGMOID_SATURATED_HIGH,  # noqa: F401
                        SIGMOID_SATURATED_LOW, SOFTMAX_SATURATED, TANH_SATURATED,
                        VANISHING_GRAD_RATIO, _finding, _metrics, gradient_findings,
                        loss_scale_of, saturation_findings)

__all__ = ["scan_dump", "format_scan", "scan_main", "EXPLODING_GRAD_RATIO",
           "VANISHING_GRAD_RATIO", "SIGMOID_SATURATED_LOW", "SIGMOID_SATURATED_HIGH",
           "TANH_SATURATED", "SOFTMAX_SATURATED", "SATURATING_OPS"]

# --------------------------------------------------------------------------- thresholds

OUTPUT_ROLES = tuple(sorted(COMPUTED_ROLES))
INPUT_ROLES = tuple(sorted(READ_ROLES))
_FORMAT_LIMIT = 20             # lines per finding kind in the terminal text


# --------------------------------------------------------------------------- helpers


def _counts(row: Dict[str, Any]) -> str:
    parts = []
    for key, word in (("nan_count", "NaN"), ("inf_count", "Inf")):
        n = int(row[key])
        if n:
            parts.append(f"{word} {'count unknown' if n < 0 else n}")
    return ", ".join(parts) or "finite"


def _fkey(row: Dict[str, Any]) -> Tuple[Any, ...]:
    """What links a backward entry to its forward call (`order` is the forward call's)."""
    return (row["kind"], row["prefix"], row["api"], row["module"], int(row["call_index"]),
            int(row["order"]))


class _Flags:
    """Non-finiteness seen in a set of records: NaN, Inf, unknown counts (-1)."""
    __slots__ = ("any", "nan", "inf", "unknown")

    def __init__(self) -> None:
        self.any = self.nan = self.inf = self.unknown = False

    def add(self, nan_count: int, inf_count: int) -> None:
        self.any = True
        if nan_count < 0 or inf_count < 0:
            self.unknown = True
        if nan_count != 0:
            self.nan = True
        if inf_count != 0:
            self.inf = True

    @property
    def bad(self) -> bool:
        return self.nan or self.inf or self.unknown


def _explained_by(inputs: Optional[_Flags], nan_count: int, inf_count: int) -> bool:
    """Whether non-finite inputs explain an output with these counts."""
    if inputs is None or not inputs.bad:
        return False
    if inputs.nan or inputs.unknown:
        return True
    return not nan_count > 0           # Inf inputs explain Inf (and unknown), not a new NaN


# --------------------------------------------------------------------------- non-finite
def _seen_before(seen: _Flags, nan_count: int, inf_count: int) -> bool:
    """Whether the same kind of non-finite value appeared earlier in the step."""
    return seen.any and (nan_count == 0 or seen.nan or seen.unknown) \
        and (inf_count == 0 or seen.inf or seen.nan or seen.unknown)


def _nonfinite_events(table: Any) -> Dict[str, Any]:
    """One step/rank: the producers and arrivals of non-finite values, in emission order, and
    how many non-finite records are not intended masks."""
    dtype = table["dtype"]
    scalar = scalar_mask(dtype)
    nan_c, inf_c = table["nan_count"], table["inf_count"]
    nonfinite = (nan_c != 0) | (inf_c != 0)
    roles, entries = table["role"], table["entry"]
    out: Dict[str, Any] = {"producers": [], "arrivals": [], "count": 0}
    if not nonfinite.any():
        return out

    # entries whose scalar arguments are +-inf: intended masks (they are told to write inf)
    intended_entries = set(entries[scalar & (inf_c != 0)].tolist())

    # per entry: the non-finiteness of its tensor inputs; per forward call: of all its tensors
    tensor_in = ~scalar & np.isin(roles, INPUT_ROLES)
    has_inputs = set(entries[tensor_in].tolist())
    entry_in: Dict[str, _Flags] = {}
    entry_in_ids: Dict[str, set] = {}
    fwd: Dict[Tuple[Any, ...], _Flags] = {}
    forward_rows = ~scalar & (table["direction"] == Direction.FORWARD) & nonfinite
    for i in np.nonzero((tensor_in & nonfinite) | forward_rows)[0]:
        row = table.row(int(i))
        if row["role"] in INPUT_ROLES:
            entry_in.setdefault(row["entry"], _Flags()).add(row["nan_count"], row["inf_count"])
            entry_in_ids.setdefault(row["entry"], set()).add(int(row["tensor_id"]))
        if row["direction"] == Direction.FORWARD:
            fwd.setdefault(_fkey(row), _Flags()).add(row["nan_count"], row["inf_count"])

    seen = _Flags()                    # non-finiteness of every earlier record of the step
    seen_ids: set = set()              # tensor ids of earlier non-finite records
    intended_ids: set = set()          # tensor ids of intended -inf masks
    done_entries: set = set()
    bad_idx = np.nonzero(nonfinite & ~scalar)[0]
    bad_idx = bad_idx[np.argsort(table["seq"][bad_idx], kind="stable")]
    for i in bad_idx:
        row = table.row(int(i))
        nan, inf = int(row["nan_count"]), int(row["inf_count"])
        role, tid = row["role"], int(row["tensor_id"])
        only_inf = nan == 0 and inf > 0
        intended = tid >= 0 and tid in intended_ids and only_inf
        if role in OUTPUT_ROLES:
            inputs = entry_in.get(row["entry"])
            if row["direction"] == Direction.BACKWARD:
                forward = fwd.get(_fkey(row))
                if forward is not None:
                    merged = _Flags()
                    for flags in (inputs, forward):
                        if flags is not None:
                            merged.any |= flags.any
                            merged.nan |= flags.nan
                            merged.inf |= flags.inf
                            merged.unknown |= flags.unknown
                    inputs = merged
            if intended:                           # the very tensor of an intended mask
                explained = True
            elif row["entry"] in intended_entries and only_inf and not (inputs and inputs.bad):
                explained = intended = True        # an op told to write +-inf: a mask
                if tid >= 0:
                    intended_ids.add(tid)
            elif _explained_by(inputs, nan, inf):
                explained = True
                # Inf that only flows on from intended masks is intended too
                if (only_inf and tid >= 0 and row["entry"] in entry_in_ids
                        and not entry_in[row["entry"]].nan
                        and not entry_in[row["entry"]].unknown
                        and entry_in_ids[row["entry"]] <= intended_ids):
                    intended = True
                    intended_ids.add(tid)
            elif row["kind"] == RecordKind.MODULE and _seen_before(seen, nan, inf):
                # a module's parameters are not among its recorded inputs: non-finite values
                # seen earlier in the step (inside it, e.g. a parameter) explain its outputs
                explained = True
            elif inputs is not None or row["entry"] in has_inputs:
                explained = False
                reason = ("produces NaN from inputs holding only Inf" if inputs is not None
                          and inputs.bad else "produces non-finite values from finite inputs")
            else:
                # no inputs recorded (a parameter's gradient, or inputs filtered out): judged
                # by whether the same kind of non-finite value appeared earlier in the step
                explained = _seen_before(seen, nan, inf)
                reason = "first non-finite value of the step (no inputs recorded)"
            if not explained and row["entry"] not in done_entries:
                done_entries.add(row["entry"])
                out["producers"].append((int(row["seq"]), row, reason))
        elif role in INPUT_ROLES or role in INVENTORY_ROLES:
            if role == Role.BUFFER and only_inf:
                intended = True        # a mask buffer
                if tid >= 0:
                    intended_ids.add(tid)
            elif not intended and not (tid >= 0 and tid in seen_ids):
                if not _seen_before(seen, nan, inf):
                    reason = ("non-finite values are already in the parameter at the start of "
                              "the step" if role == Role.PARAM else
                              "non-finite values arrive in the input data")
                    out["arrivals"].append((int(row["seq"]), row, reason))
        if not intended:
            out["count"] += 1
            seen.add(nan, inf)
        if tid >= 0:
            seen_ids.add(tid)
    return out


def _nonfinite_record(row: Dict[str, Any], reason: str) -> Dict[str, Any]:
    return {"step": int(row["step"]), "rank": int(row["rank"]), "direction": row["direction"],
            "kind": row["kind"], "module": row["module"], "op": row["op"], "role": row["role"],
            "name": row["entry"], "metrics": _metrics(row), "reason": reason}


# --------------------------------------------------------------------------- gradients
def scan_dump(path: str, step: Optional[int] = None, rank: Optional[int] = None
              ) -> Dict[str, Any]:
    """Scan a dump (root, step folder or step file) for anomalies; see the module docstring."""
    from ..storage.reader import open_dump

    dump = open_dump(path)
    try:
        if step is not None and step not in dump.steps:
            raise DumpError(f"{path}: no step {step} (steps {dump.steps})")
        if rank is not None and rank not in dump.ranks:
            raise DumpError(f"{path}: no rank {rank} (ranks {dump.ranks})")
        steps = [s for s in dump.steps if step is None or s == step]
        ranks = [r for r in dump.ranks if rank is None or r == rank]
        first: Optional[Dict[str, Any]] = None
        findings: List[Dict[str, Any]] = []
        loss_scale = loss_scale_of(dump.run)
        for s in steps:
            producers, arrivals = [], []
            for r in ranks:
                if not dump.files(s, r):
                    continue
                table = dump.records(s, r)
                if not len(table):
                    continue
                events = _nonfinite_events(table)
                event = (events["producers"] or events["arrivals"] or [None])[0]
                if event is not None:
                    seq, row, reason = event
                    (producers if events["producers"] else arrivals).append((seq, r, row, reason))
                    findings.append(_finding(
                        "nonfinite", row,
                        f"{reason} ({_counts(row)}; {events['count']} non-finite records in "
                        f"step {s} rank {r})", reason=reason, nonfinite_records=events["count"]))
                findings.extend(gradient_findings(table, loss_scale))
                findings.extend(saturation_findings(table))
            if first is None and (producers or arrivals):
                _, _, row, reason = min(producers or arrivals, key=lambda e: (e[0], e[1]))
                first = _nonfinite_record(row, reason)
        order = {"nonfinite": 0, "exploding_grad": 1, "vanishing_grad": 1, "zero_grad": 1,
                 "saturated": 2}
        findings.sort(key=lambda f: (f["step"], f["rank"], order.get(f["kind"], 3),
                                     f["metrics"].get("seq", 0)))
        return {"dump": str(path), "steps": steps, "ranks": ranks,
                "first_nonfinite": first, "findings": findings}
    finally:
        dump.close()


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def format_scan(result: Dict[str, Any]) -> str:
    """Terminal text of a `scan_dump()` result."""
    lines: List[str] = []
    if "dump" in result:
        lines.append(f"dump  {result['dump']}  steps {result.get('steps')}  "
                     f"ranks {result.get('ranks')}")
    first = result.get("first_nonfinite")
    if first is None:
        lines.append("first non-finite: none")
    else:
        m = first.get("metrics", {})
        lines.append(f"first non-finite: step {first['step']} rank {first['rank']} "
                     f"{first['direction']} {first['kind']} {first['name']}")
        lines.append(f"  op {first['op'] or '-'}  module {first['module'] or '<root>'}  "
                     f"role {first['role']} {m.get('arg_index', '')}  dtype {m.get('dtype', '')}"
                     f"  shape {tuple(m.get('shape', ()))}")
        lines.append(f"  {first['reason']}")
        lines.append("  " + "  ".join(f"{k} {_num(m[k])}" for k in
                                      ("nan_count", "inf_count", "min", "max", "mean", "norm")
                                      if k in m))
    findings = result.get("findings", [])
    if not findings:
        lines.append("no anomalies found")
        return "\n".join(lines) + "\n"
    by_kind: Dict[str, List[Dict[str, Any]]] = {}
    for f in findings:
        by_kind.setdefault(f["kind"], []).append(f)
    lines.append(f"findings: {len(findings)} (" + ", ".join(
        f"{kind} {len(items)}" for kind, items in by_kind.items()) + ")")
    for kind, items in by_kind.items():
        lines.append(f"  {kind}:")
        for f in items[:_FORMAT_LIMIT]:
            lines.append(f"    step {f['step']} rank {f['rank']}  {f['name']} {f['role']}: "
                         f"{f['detail']}")
        if len(items) > _FORMAT_LIMIT:
            lines.append(f"    ... and {len(items) - _FORMAT_LIMIT} more (see --json)")
    return "\n".join(lines) + "\n"


def write_json(result: Dict[str, Any], path: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(jsonable(result), handle, indent=1, allow_nan=False)
            handle.write("\n")
    except OSError as exc:
        raise DumpError(f"{path}: cannot write JSON ({exc.strerror or exc})") from None


def scan_main(args: argparse.Namespace) -> int:
    """`precdbg scan DUMP [--json F] [--step S] [--rank R]`: 0 no finding, 1 findings; raises
    DumpError for unusable input."""
    result = scan_dump(args.dump, getattr(args, "step", None), getattr(args, "rank", None))
    sys.stdout.write(format_scan(result))
    json_path = getattr(args, "json", None)
    if json_path:
        write_json(result, json_path)
    return 1 if result["findings"] or result["first_nonfinite"] else 0
