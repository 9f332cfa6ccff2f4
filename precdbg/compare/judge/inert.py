"""Calls that change no number, left out of a module's call sequence (precdbg.compare.judge.structure):
results nothing reads, integer or boolean results, joins of one tensor with empty ones."""
from __future__ import annotations

from typing import Dict

import numpy as np

from ...storage.reader import RecordTable
from ...records.schema import Direction, RecordKind, Role, scalar_mask

__all__ = ["calls_changing_no_number"]

_API = RecordKind.API
_FORWARD, _INPUT, _OUTPUT = Direction.FORWARD, Role.INPUT, Role.OUTPUT

_INTEGER_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
                             "uint32", "uint64"})
_JOINS = frozenset({"cat", "concat", "concatenate", "stack"})
_CAST = "cast"                 # the canonical op of every dtype conversion (tables/ops.yaml)


def calls_changing_no_number(table: RecordTable) -> set:
    """The API calls (their `order`) left out of a module's call sequence although their op
    computes: calls whose results nothing reads (no later record names a forward output of
    theirs as its `producer` and no gradient came back to them; not in a dump without tensor
    identities, msprobe's); calls that compute only
    integers or booleans (positions, masks, indices: another way to the same positions changes
    no number, other positions change the numbers of the calls that read them); conversions to
    the dtype their input had (`x.to(x.device)`: PyTorch returns `x` itself, a torch shim over
    MindSpore a new tensor of the same values); and joins of
    one non-empty tensor with empty ones (a KV cache's first `cat`), which copy it."""
    if "producer" not in table:
        return set()
    kind, direction, role = table["kind"], table["direction"], table["role"]
    order, dtype = table["order"], table["dtype"]
    forward_api = (kind == _API) & (direction == _FORWARD)
    outputs = forward_api & (role == _OUTPUT) & ~scalar_mask(dtype)
    out_orders = order[outputs]
    read = np.isin(table["seq"][outputs], table["producer"])
    live = set(out_orders[read].tolist()) | \
        set(order[(kind == _API) & (direction != _FORWARD)].tolist())
    # a dump that knows no tensor's identity (msprobe's) cannot tell what nothing reads
    knows_reads = "tensor_id" not in table or bool((table["tensor_id"] >= 0).any())
    skip = set(out_orders.tolist()) - live if knows_reads else set()
    floating: set = set()
    for o, d in zip(out_orders.tolist(), dtype[outputs].tolist()):
        if str(d) not in _INTEGER_DTYPES:
            floating.add(o)
    skip |= set(out_orders.tolist()) - floating
    casts = outputs & (table["op"] == _CAST)
    if casts.any():      # a conversion to the dtype it had: a copy, whoever returns a new object
        first_inputs = forward_api & (role == _INPUT) & (table["arg_index"] == 0)
        had = dict(zip(order[first_inputs].tolist(), dtype[first_inputs].tolist()))
        skip |= {o for o, d in zip(order[casts].tolist(), dtype[casts].tolist())
                 if had.get(o) == d}
    joins = outputs & np.isin(table["op"], list(_JOINS))
    if joins.any():
        inputs = forward_api & (role == _INPUT) & ~scalar_mask(dtype)
        nonempty: Dict[int, int] = {}
        for o, n in zip(order[inputs].tolist(), table["numel"][inputs].tolist()):
            nonempty[o] = nonempty.get(o, 0) + (n > 0)
        skip |= {o for o in order[joins].tolist() if nonempty.get(o, 0) == 1}
    return skip
