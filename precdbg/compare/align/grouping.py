"""Keys of records as integer codes, and pairing the k-th occurrence of a key in one table with
the k-th of that key in the other (alignment), with numpy: one code per distinct value of a
column shared by both tables (`codes`), one per distinct tuple of codes (`group`), occurrence
numbers from a stable sort by key (`occurrences`), and pairs by (key, occurrence)
(`pair_by_key`). Sorts of codes are 16-bit radix sorts (numpy's stable sort of uint16)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["argsort", "codes", "first_at", "group", "in_seq_order", "occurrences",
           "pair_by_key", "split"]

_I64 = np.int64
_weights: List[np.ndarray] = [np.zeros(0, np.uint32)]
_CHUNK = 1 << 16        # bytes of strings compared at once: no large temporary arrays


def _weights_of(width: int) -> np.ndarray:
    if len(_weights[0]) < width:
        rng = np.random.default_rng(50)
        _weights[0] = rng.integers(1, 2 ** 32, size=max(width, 64), dtype=np.uint64
                                   ).astype(np.uint32) | 1
    return _weights[0][:width]


def _hashes(column: np.ndarray) -> Optional[np.ndarray]:
    """A 32-bit hash per string of a numpy str or bytes column (None for other columns): the
    same for equal strings whatever the column's width (its padding adds nothing)."""
    if column.dtype.kind not in "US":
        return None
    column = np.ascontiguousarray(column)
    unit = np.uint32 if column.dtype.kind == "U" else np.uint8
    width = column.dtype.itemsize // np.dtype(unit).itemsize
    if not width or not len(column):
        return np.zeros(len(column), np.uint32)
    units = column.view(unit).reshape(len(column), width)
    return units @ _weights_of(width)


def split(values: np.ndarray, sizes: Sequence[int]) -> List[np.ndarray]:
    return np.split(values, np.cumsum(sizes)[:-1])


def argsort(values: np.ndarray, top: Optional[int] = None) -> np.ndarray:
    """Stable argsort of non-negative integers (at most `top`), 16 bits at a time."""
    values = np.asarray(values)
    if not len(values):
        return np.zeros(0, _I64)
    top = int(values.max()) if top is None else top
    if top < 1 << 16:
        return np.argsort(values.astype(np.uint16), kind="stable")
    if top >= 1 << 48:
        return np.argsort(values, kind="stable")
    order = np.argsort((values & 0xFFFF).astype(np.uint16), kind="stable")
    shift = 16
    while top >> shift:
        digit = ((values[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order


def _ranks(ordered: np.ndarray, order: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(0-based rank of each item's value among the distinct values, where each run begins)
    from the items sorted (`ordered`) by `order`."""
    new = np.ones(len(ordered), bool)
    new[1:] = ordered[1:] != ordered[:-1]
    out = np.empty(len(ordered), _I64)
    out[order] = np.cumsum(new) - 1
    return out, new


def codes(*columns: Any, few: bool = False) -> List[np.ndarray]:
    """One int64 code per item of each column, equal for equal values across all the columns
    (0 .. number of distinct values - 1). `few`: the columns likely hold a few distinct
    strings (a kind, a role)."""
    arrays = [np.asarray(c) for c in columns]
    if len({c.dtype.kind for c in arrays}) != 1 or arrays[0].dtype.kind not in "US":
        return _dict_codes(columns)
    # a run of equal strings (a call's records share their module, API, kind) is one item
    runs, heads = [], []
    for column in arrays:
        new = np.ones(len(column), bool)
        new[1:] = column[1:] != column[:-1]
        runs.append(np.cumsum(new) - 1)
        heads.append(column[new])
    found = (_few_codes(heads) if few else None) or _hashed_codes(heads) or _dict_codes(heads)
    return [code[run] for code, run in zip(found, runs)]


def _dict_codes(columns: Sequence[Any]) -> List[np.ndarray]:
    seen: Dict[Any, int] = {}
    values = [seen.setdefault(v, len(seen)) for c in columns
              for v in (c.tolist() if isinstance(c, np.ndarray) else list(c))]
    return split(np.asarray(values, dtype=_I64), [len(c) for c in columns])


def _hashed_codes(arrays: List[np.ndarray]) -> Optional[List[np.ndarray]]:
    """`codes` of string columns by a hash of each string; None where two strings share one."""
    joint = np.concatenate([_hashes(c) for c in arrays])
    order = np.argsort(joint, kind="stable")
    inverse, new = _ranks(joint[order], order)
    out = split(inverse, [len(c) for c in arrays])
    # each code's string (its first item's); then no two strings share a hash where every
    # item is its code's string
    first, ends = order[new], np.cumsum([len(c) for c in arrays])
    where = np.searchsorted(ends, first, side="right")
    strings = np.empty(len(first), np.result_type(*arrays))
    for k, column in enumerate(arrays):
        strings[where == k] = column[first[where == k] - (ends[k] - len(column))]
    if all(_all_equal(c, strings, code) for c, code in zip(arrays, out)):
        return out
    return None


def _all_equal(column: np.ndarray, strings: np.ndarray, code: np.ndarray) -> bool:
    """Whether column == strings[code], a slice at a time."""
    step = max(1, _CHUNK // max(column.dtype.itemsize, strings.dtype.itemsize, 1))
    return all(np.array_equal(column[i:i + step], strings[code[i:i + step]])
               for i in range(0, len(column), step))


def _few_codes(columns: Sequence[Any], most: int = 16) -> Optional[List[np.ndarray]]:
    """`codes` of columns of a few distinct strings, value by value; None where they hold more
    than `most`."""
    if not all(isinstance(c, np.ndarray) and c.dtype.kind in "US" for c in columns):
        return None
    seen: Dict[Any, int] = {}
    out = []
    for column in columns:
        code = np.full(len(column), -1, _I64)
        at = 0
        while at < len(column):
            value = column[at]
            code[column == value] = seen.setdefault(value, len(seen))
            if len(seen) > most:
                return None
            left = np.flatnonzero(code[at:] < 0)
            at = at + int(left[0]) if len(left) else len(column)
        out.append(code)
    return out


def _compact(values: np.ndarray, bound: int) -> np.ndarray:
    """Values in [0, bound) renumbered 0 .. distinct values - 1, in their order."""
    if bound <= max(1 << 12, len(values)):          # a table of the values: no sort
        seen = np.zeros(bound, bool)
        seen[values] = True
        return (np.cumsum(seen) - 1)[values]
    order = argsort(values, bound - 1)
    return _ranks(values[order], order)[0]


def group(*columns: np.ndarray) -> np.ndarray:
    """One code per distinct tuple of the integer columns' values (0 .. distinct tuples - 1)."""
    n = len(columns[0])
    code = np.zeros(n, _I64)
    if not n:
        return code
    bound = 1
    for column in columns:
        column = np.asarray(column, dtype=_I64)
        low = int(column.min())
        span = int(column.max()) - low + 1
        if span > max(1 << 16, n):          # far apart values (a seq): their ranks
            column, low = _compact(column - low, span), 0
            span = int(column.max()) + 1
        if bound * span >= 1 << 48:         # a radix sort of 16 bits at a time: 3 at most
            code = _compact(code, bound)
            bound = int(code.max()) + 1
        code = code * span + (column - low)
        bound *= span
    return _compact(code, bound)


def in_seq_order(rows: Any, seq: np.ndarray) -> np.ndarray:
    """Rows (indices) in the order of their seq; rows of equal seq by index."""
    rows = np.sort(np.asarray(rows, dtype=_I64), kind="stable")
    return rows[np.argsort(seq[rows], kind="stable")]


def occurrences(keys: np.ndarray, nkeys: int
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For codes in [0, nkeys): (k where each item is the k-th of its key, the items in the
    order of their key (stable), where each key's items begin there, how many it has)."""
    count = np.bincount(keys, minlength=nkeys)
    start = np.cumsum(count) - count
    order = argsort(keys, nkeys - 1)
    occ = np.empty(len(keys), _I64)
    occ[order] = np.arange(len(keys)) - start[keys[order]]
    return occ, order, start, count


def first_at(keys: np.ndarray, nkeys: int) -> np.ndarray:
    """Per code in [0, nkeys), where it first occurs in keys (-1: nowhere)."""
    if not len(keys):
        return np.full(nkeys, -1, _I64)
    _, order, start, count = occurrences(keys, nkeys)
    return np.where(count > 0, order[np.minimum(start, len(keys) - 1)], -1)


def pair_by_key(key_a: np.ndarray, key_b: np.ndarray, rows_a: Any, rows_b: Any,
                seq_a: np.ndarray, seq_b: np.ndarray, nkeys: int,
                tensors: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                casts: Optional[np.ndarray] = None,
                by_shape: Optional[Callable[..., Tuple[List[int], ...]]] = None
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Among `rows_a` and `rows_b`, the k-th row (in seq order) of a key in a with the k-th of
    that key in b: (pairs a, pairs b, only a, only b). Pairs come key by key in the order the
    keys first occur in a, each key's in order; the rows left over in no particular order.
    `tensors` (each side's mask): only tensor rows pair, and the others are in neither list;
    `casts` (per key code): the rows of those keys pair by `by_shape(rows_a, rows_b)`."""
    ra, rb = in_seq_order(rows_a, seq_a), in_seq_order(rows_b, seq_b)
    first_a = first_at(key_a[ra], nkeys)     # before only tensors count: a key's place
    if tensors is not None:
        ra, rb = ra[tensors[0][ra]], rb[tensors[1][rb]]
    ka, kb = key_a[ra], key_b[rb]
    apart_a = np.zeros(len(ra), bool) if casts is None else casts[ka]
    apart_b = np.zeros(len(rb), bool) if casts is None else casts[kb] & (first_a[kb] >= 0)
    ra, ka, rest_ra = ra[~apart_a], ka[~apart_a], ra[apart_a]
    rb, kb, rest_rb = rb[~apart_b], kb[~apart_b], rb[apart_b]
    occ_a = occurrences(ka, nkeys)[0]
    _, order_b, start_b, count_b = occurrences(kb, nkeys)
    ia = np.nonzero(occ_a < count_b[ka])[0]
    ib = order_b[start_b[ka[ia]] + occ_a[ia]]
    matched_b = np.zeros(len(rb), bool)
    matched_b[ib] = True
    pa, pb, place = [ra[ia]], [rb[ib]], [first_a[ka[ia]]]
    oa, ob = [np.delete(ra, ia)], [rb[~matched_b]]
    if len(rest_ra) or len(rest_rb):        # few: the casts across frameworks, key by key
        by_key_a: Dict[int, List[int]] = {}
        by_key_b: Dict[int, List[int]] = {}
        for row, key in zip(rest_ra.tolist(), key_a[rest_ra].tolist()):
            by_key_a.setdefault(key, []).append(row)
        for row, key in zip(rest_rb.tolist(), key_b[rest_rb].tolist()):
            by_key_b.setdefault(key, []).append(row)
        for key in {**by_key_a, **by_key_b}:     # b's: of keys whose rows in a are scalars
            found = [np.asarray(part, dtype=_I64) for part in
                     by_shape(by_key_a.get(key, []), by_key_b.get(key, []))]  # type: ignore
            pa.append(found[0])
            pb.append(found[1])
            place.append(np.full(len(found[0]), first_a[key], _I64))
            oa.append(found[2])
            ob.append(found[3])
    # key by key; within a key its pairs are in order already
    order = argsort(np.concatenate(place), len(key_a))
    return (np.concatenate(pa)[order], np.concatenate(pb)[order], np.concatenate(oa),
            np.concatenate(ob))
