"""Two dumps written by different tools (precdbg and msprobe), read as what both hold: each record
that only one tool writes is left out of both sides, and what one tool does not measure is
unknown on both, so a compare pairs like with like and never reports a tool's blind spot as a
difference between the runs.

msprobe against precdbg (mindstudio-probe 26.2, seen on PyTorch runs):
- msprobe records no root module, no buffers, and leaves out the calls its risk level skips
  (`reshape`, `to`, `view`, ...: listed in its construct.json but not in dump.json, `Dump.
  unrecorded`); precdbg's records of those are left out;
- an API's backward in msprobe holds the gradients of the autograd node behind its first output
  (`linear` on a 3-D input: the [8, 16] gradient of the view inside it), not the gradients for
  the call's inputs that precdbg records: API backward records are left out on both sides;
  modules' backward records and weight gradients stay;
- calls inside `optimizer.step()`: msprobe records them, precdbg only with include_optimizer:
  kept where both dumps hold some;
- on MindSpore msprobe records the primitives a Cell runs (`Primitive.gather.Gather`), precdbg
  the functional calls (`Functional.embedding`): API records are left out on both sides, Cells,
  parameters and weight gradients compared (MINDSPORE_API_CALLS);
- msprobe counts no NaN/Inf values (its extremes show whether there are some), measures no
  order-sensitive mean, no mean or norm of integer,
  boolean and float64 tensors, knows no producers (which record made the tensor another reads),
  and its checksums (CRC32) are not precdbg's: unknown on both sides.

`LIMITS` names these for the verdict's note (said once).
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

from ..records.schema import NO_PRODUCER, UNKNOWN_COUNT, Direction, Phase, RecordKind, Role
from .reader import Dump, RecordTable

__all__ = ["common_records", "LIMITS", "MINDSPORE_API_CALLS"]

# what a compare of a precdbg dump with an msprobe dump cannot see (note facts, in this order)
LIMITS = ("nan_counts", "order_sensitive_mean", "producers", "api_backward", "root_module",
          "skipped_calls", "buffers", "checksums")
MINDSPORE_API_CALLS = "mindspore_api_calls"    # a further limit on MindSpore (see below)
_NO_MEAN = ("int", "uint", "bool", "float64")


def common_records(a: Dump, ta: RecordTable, b: Dump, tb: RecordTable, step: int, rank: int
                   ) -> Tuple[RecordTable, RecordTable, List[str]]:
    """(ta, tb) as both tools record them, and the LIMITS that applied (empty: one tool)."""
    ta, tb = _parameters_both_hold(ta, a.source, tb, b.source)
    if a.source == b.source:
        return ta, tb, []
    msprobe_a = a.source == "msprobe"
    skipped = (a if msprobe_a else b).unrecorded(step, rank)
    keep_a, keep_b = _both_record(ta, tb), _both_record(tb, ta)
    if msprobe_a:
        keep_b &= _msprobe_records(tb, skipped)
    else:
        keep_a &= _msprobe_records(ta, skipped)
    limits = list(LIMITS)
    if "mindspore" in (a.setting("framework"), b.setting("framework")):
        # MindSpore: msprobe records the primitives a Cell runs (Primitive.gather.Gather),
        # precdbg the functional calls (Functional.embedding): no API record pairs by name
        keep_a &= ta["kind"] != RecordKind.API
        keep_b &= tb["kind"] != RecordKind.API
        limits.append(MINDSPORE_API_CALLS)
    ta, tb = ta.select(keep_a), tb.select(keep_b)
    if msprobe_a:
        tb = _unknown_as_msprobe(tb)
        ta = _keys_of(ta, tb)
    else:
        ta = _unknown_as_msprobe(ta)
        tb = _keys_of(tb, ta)
    ta, tb = _without_mean(ta), _without_mean(tb)
    return ta, tb, limits


def _keys_of(msprobe: RecordTable, precdbg: RecordTable) -> RecordTable:
    """msprobe's table with precdbg's argument keys: msprobe keys an argument by its position
    where precdbg (PyTorch's function mode) may see it by name (`F.embedding`'s `norm_type` is
    msprobe's "4"); both number a call's arguments alike (`records.arguments`)."""
    where = {k: key for k, key in zip(zip(precdbg["entry"].tolist(),
                                          precdbg["role"].tolist(),
                                          precdbg["arg_index"].tolist()),
                                      precdbg["arg_key"].tolist())}
    keys = [where.get(k, key) for k, key in zip(zip(msprobe["entry"].tolist(),
                                                    msprobe["role"].tolist(),
                                                    msprobe["arg_index"].tolist()),
                                                msprobe["arg_key"].tolist())]
    cols = dict(msprobe.columns)
    cols["arg_key"] = np.array(keys, dtype=str) if keys else msprobe["arg_key"]
    return RecordTable(cols)


def _parameters_both_hold(ta: RecordTable, source_a: str, tb: RecordTable, source_b: str
                          ) -> Tuple[RecordTable, RecordTable]:
    """msprobe at level L1 (api) records no parameters, no weight gradients and no module an
    API call ran in (its construct.json is empty): where an msprobe step holds none of a kind,
    the other side's records of that kind are left out too, and where it knows no module, the
    other side's API calls are read outside every module as well (they pair by name)."""
    out = [ta, tb]
    for mine, source, other in ((0, source_a, 1), (1, source_b, 0)):
        if source != "msprobe" or not len(out[mine]):
            continue
        for kind in (RecordKind.PARAM, RecordKind.PARAM_GRAD):
            if not (out[mine]["kind"] == kind).any() and (out[other]["kind"] == kind).any():
                out[other] = out[other].select(out[other]["kind"] != kind)
        if not (out[mine]["kind"] == RecordKind.MODULE).any() and \
                not (out[mine]["module"] != "").any():
            cols = dict(out[other].columns)
            cols["module"] = np.where(cols["kind"] == RecordKind.API, "", cols["module"])
            out[other] = RecordTable(cols)
    return out[0], out[1]


def _both_record(t: RecordTable, other: RecordTable) -> np.ndarray:
    """Records either tool writes: no API backward; optimizer calls where both dumps hold some."""
    keep = ~((t["kind"] == RecordKind.API) & (t["direction"] == Direction.BACKWARD))
    if not (other["phase"] == Phase.OPTIMIZER).any():
        keep &= t["phase"] != Phase.OPTIMIZER
    return keep


def _msprobe_records(t: RecordTable, skipped: frozenset) -> np.ndarray:
    """Of a precdbg table, the records msprobe writes too."""
    keep = ~((t["kind"] == RecordKind.MODULE) & (t["module"] == ""))
    keep &= t["role"] != Role.BUFFER
    if skipped:
        keep &= ~np.isin(t["entry"], list(skipped))
    return keep


def _unknown_as_msprobe(t: RecordTable) -> RecordTable:
    """A precdbg table with what msprobe does not measure made unknown."""
    cols = dict(t.columns)
    count = len(t)
    for name in ("nan_count", "inf_count"):       # whether there are some, not how many
        cols[name] = np.where(t[name] != 0, UNKNOWN_COUNT, 0).astype(np.int64)
    cols["pos_mean"] = np.full(count, np.nan)
    cols["checksum"] = np.full(count, "", dtype="<U1")
    cols["producer"] = np.full(count, NO_PRODUCER, dtype=np.int64)
    cols["tensor_id"] = np.full(count, -1, dtype=np.int64)
    return RecordTable(cols)


def _without_mean(t: RecordTable) -> RecordTable:
    """No mean and norm of integer, boolean and float64 tensors (msprobe's PyTorch dumps take
    none; its MindSpore dumps take them of a float32 copy): on both sides alike."""
    dtypes = t["dtype"].astype(str)
    no_mean = np.zeros(len(t), dtype=bool)
    for prefix in _NO_MEAN:
        no_mean |= np.char.startswith(dtypes, prefix)
    if not no_mean.any():
        return t
    cols = dict(t.columns)
    for stat in ("mean", "norm"):
        cols[stat] = np.where(no_mean, np.nan, t[stat])
    return RecordTable(cols)
