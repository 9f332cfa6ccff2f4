"""Calls that change no number, left out of a module's call sequence (precdbg.compare.judge.structure):
results nothing reads, integer or boolean results, joins of one tensor with empty ones."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ..align.grouping import group
from ...records.schema import DTYPE_VALUE, Direction, RecordKind, Role, scalar_mask

__all__ = ["calls_changing_no_number", "inert_orders"]

_API = RecordKind.API
_FORWARD, _INPUT, _OUTPUT = Direction.FORWARD, Role.INPUT, Role.OUTPUT

_INTEGER_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
                             "uint32", "uint64"})
_JOINS = frozenset({"cat", "concat", "concatenate", "stack"})
_CAST = "cast"                 # the canonical op of every dtype conversion (tables/ops.yaml)
_SCALAR_FIRST = ord(DTYPE_VALUE[0])           # "p": what every scalar's dtype begins with


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
    return set(inert_orders(table).tolist())


def inert_orders(table: RecordTable, api: Optional[np.ndarray] = None,
                 forward: Optional[np.ndarray] = None) -> np.ndarray:
    """`calls_changing_no_number` as a sorted array of distinct orders, column by column: each
    column read only where forward API calls are (`api`, `forward`: the masks of API records
    and of forward records, where the caller has them), each set of calls a mask over the
    orders' codes (`grouping.group`: 0 .. distinct orders - 1, in the orders' order)."""
    if "producer" not in table or not len(table["order"]):
        return np.zeros(0, np.int64)
    api = table["kind"] == _API if api is None else api
    forward = table["direction"] == _FORWARD if forward is None else forward
    order, dtype, op = table["order"], table["dtype"], table["op"]
    code, values = _order_codes(order)
    calls = np.nonzero(api & forward)[0]
    role, tensor = table["role"][calls], ~_scalar(dtype[calls])
    outputs = calls[(role == _OUTPUT) & tensor]
    is_output = _mask(code[outputs], len(values))
    live = _mask(code[outputs[_read(table["seq"][outputs], table["producer"])]], len(values))
    live[code[api & ~forward]] = True        # a gradient came back to it
    # a dump that knows no tensor's identity (msprobe's) cannot tell what nothing reads
    knows_reads = "tensor_id" not in table or bool((table["tensor_id"] >= 0).any())
    skip = is_output & ~live if knows_reads else np.zeros(len(values), bool)
    # calls with no output of another dtype than the integer ones
    skip |= is_output & ~_mask(code[outputs[~_integer(dtype[outputs])]], len(values))
    casts = outputs[op[outputs] == _CAST]
    if len(casts):       # a conversion to the dtype it had: a copy, whoever returns a new object
        first_inputs = calls[(role == _INPUT) & (table["arg_index"][calls] == 0)]
        # each order's dtype of its last first input (as a dict of them keeps it)
        had_codes, at = np.unique(code[first_inputs][::-1], return_index=True)
        had = np.full(len(values), -1, np.int64)
        had[had_codes] = first_inputs[::-1][at]
        cast_had = had[code[casts]]
        same = (cast_had >= 0) & (dtype[np.maximum(cast_had, 0)] == dtype[casts])
        skip[code[casts[same]]] = True
    joins = outputs[np.isin(op[outputs], list(_JOINS))]
    if len(joins):
        inputs = calls[(role == _INPUT) & tensor]
        nonempty = np.bincount(code[inputs[table["numel"][inputs] > 0]], minlength=len(values))
        skip[code[joins[nonempty[code[joins]] == 1]]] = True
    return values[skip]


def _order_codes(order: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A code per row for its order, and each code's order, in ascending order: the order less
    the least where they lie close together, else `grouping.group`'s."""
    low, high = int(order.min()), int(order.max())
    if high - low < max(1 << 16, 4 * len(order)):
        return order.astype(np.int64) - low, np.arange(low, high + 1, dtype=np.int64)
    code = group(order)
    values = np.empty(int(code.max()) + 1, np.int64)
    values[code] = order
    return code, values


def _scalar(dtypes: np.ndarray) -> np.ndarray:
    """`scalar_mask(dtypes)`, looked at only where a name begins with its prefix's first letter."""
    if dtypes.dtype.kind != "U" or not dtypes.dtype.itemsize or not len(dtypes):
        return scalar_mask(dtypes)
    first = np.ascontiguousarray(dtypes).view(np.uint32)[::dtypes.dtype.itemsize // 4]
    out = np.zeros(len(dtypes), bool)
    maybe = np.nonzero(first == _SCALAR_FIRST)[0]
    out[maybe] = scalar_mask(dtypes[maybe])
    return out


def _mask(codes: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, bool)
    out[codes] = True
    return out


def _read(seq: np.ndarray, producer: np.ndarray) -> np.ndarray:
    """Whether each seq is some record's producer (`np.isin(seq, producer)`), by a table of the
    seqs where they are few and not negative."""
    if not len(seq) or int(seq.min()) < 0 or int(seq.max()) > max(1 << 16, 4 * len(producer)):
        return np.isin(seq, producer)
    top = int(seq.max()) + 1
    named = producer[(producer >= 0) & (producer < top)]
    return _mask(named, top)[seq]


def _integer(dtypes: np.ndarray) -> np.ndarray:
    """Whether each dtype (a column of their names) is an integer or boolean one."""
    if dtypes.dtype.kind == "U" and dtypes.dtype.itemsize and len(dtypes):
        # every such name begins with b, i or u: only those rows are looked up
        first = np.ascontiguousarray(dtypes).view(np.uint32)[::dtypes.dtype.itemsize // 4]
        out = np.zeros(len(dtypes), bool)
        maybe = np.nonzero((first == ord("b")) | (first == ord("i")) | (first == ord("u")))[0]
        out[maybe] = np.isin(dtypes[maybe], sorted(_INTEGER_DTYPES))
        return out
    return np.array([str(d) in _INTEGER_DTYPES for d in dtypes.tolist()], bool)
