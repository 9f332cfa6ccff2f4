"""The columns of a step's calls as integer codes, for judge.structure: a code per row for its
entry and for its module path (from the integer `order` where the rows bear it out, else from
the strings, read a slice at a time: no large temporary copy of a str column), where each call
begins and ends, and which call of a path runs at a seq (a sorted search; the ties by a scan).

Imports: numpy, precdbg.storage, precdbg.compare.align
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ..align.alignment import rename_module

__all__ = ["entry_codes", "path_codes", "first_and_last", "running_calls", "equal_rows",
           "strings_of"]

_CHUNK = 256         # rows of a str column copied at once: small temporaries, kept in cache


def equal_rows(column: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """column[a] == column[b], pair by pair: a str column compared as bytes (numpy pads each
    string with zeros: equal strings, equal bytes), neighbours in place, the other pairs a
    slice at a time (no large temporary copy of the strings)."""
    if column.dtype.kind in "US" and column.dtype.itemsize:
        column = column.view(f"V{column.dtype.itemsize}")
    out = np.empty(len(a), bool)
    near = b == a + 1
    if near.any():
        out[near] = (column[1:] == column[:-1])[a[near]]
    far = np.nonzero(~near)[0]
    for i in range(0, len(far), _CHUNK):
        at = far[i:i + _CHUNK]
        out[at] = column[a[at]] == column[b[at]]
    return out


def strings_of(column: np.ndarray, rows: np.ndarray) -> List[str]:
    """column[rows].tolist(), a slice at a time."""
    out: List[str] = []
    for i in range(0, len(rows), _CHUNK):
        out += column[rows[i:i + _CHUNK]].tolist()
    return out


def entry_codes(table: RecordTable, idx: np.ndarray
                 ) -> Tuple[np.ndarray, List[str], np.ndarray]:
    """Of rows `idx` (in seq order): a code per row for its entry, 0, 1, ... in the order the
    entries first occur, each code's entry, and each code's first row (position in idx). A
    call's records share its entry and its `order`, so the codes come from the integer orders
    where the rows bear that out (each order one entry, each entry one order), else from the
    strings themselves."""
    n, column = len(idx), table["entry"]
    orders = table["order"][idx]
    by_order = np.argsort(orders, kind="stable")
    new = np.ones(n, bool)
    new[1:] = orders[by_order[1:]] != orders[by_order[:-1]]
    rows = idx[by_order]
    heads = strings_of(column, rows[new])
    if equal_rows(column, rows[:-1][~new[1:]], rows[1:][~new[1:]]).all() \
            and len(set(heads)) == len(heads):
        starts = by_order[new]                  # each order's first row (a stable sort)
        by_start = np.argsort(starts, kind="stable")
        rank = np.empty(len(starts), np.int64)
        rank[by_start] = np.arange(len(starts))
        code = np.empty(n, np.int64)
        code[by_order] = rank[np.cumsum(new) - 1]
        return code, [heads[i] for i in by_start.tolist()], starts[by_start]
    seen: Dict[str, int] = {}
    code = np.fromiter((seen.setdefault(e, len(seen)) for e in strings_of(column, idx)),
                       np.int64, n)
    return code, list(seen), np.unique(code, return_index=True)[1]


def path_codes(table: RecordTable, idx: np.ndarray, modules: Optional[Mapping[str, str]]
                ) -> Tuple[np.ndarray, List[str]]:
    """A code per row of `idx` for its module path (renamed by `modules`, a mapping of b's
    paths to a's), and each code's path. A call's records share their module: it is read run
    by run."""
    column = table["module"]
    new = np.ones(len(idx), bool)
    new[1:] = ~equal_rows(column, idx[:-1], idx[1:])
    ids: Dict[str, int] = {}
    renamed: Dict[str, int] = {}
    heads = strings_of(column, idx[new])
    for name in heads:
        if name not in renamed:
            renamed[name] = ids.setdefault(rename_module(name, modules) if modules else name,
                                           len(ids))
    code = np.fromiter((renamed[name] for name in heads), np.int64, len(heads))
    return code[np.cumsum(new) - 1], list(ids)


def first_and_last(keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Where each distinct key first and last occurs, in the order of their first occurrence."""
    _, first = np.unique(keys, return_index=True)
    _, last = np.unique(keys[::-1], return_index=True)
    by_first = np.argsort(first, kind="stable")
    return first[by_first], (len(keys) - 1 - last)[by_first]


def running_calls(path: np.ndarray, lo: np.ndarray, hi: np.ndarray, q_path: np.ndarray,
             q_seq: np.ndarray) -> np.ndarray:
    """Per query (a path's code, a seq), the call of that path running at that seq, -1 for none
    (calls: each one's path and the first and last seq it spans, in the order they began): of
    those running, the latest begun; of those begun at one seq, the first. Among each path's
    calls sorted by where they began, the latest begun at or before seq is the one where it
    alone began there and still runs; the other queries (it had returned, and an outer call of
    that path may still run) look at each call of the path."""
    out = np.full(len(q_path), -1, np.int64)
    if not len(path) or not len(q_path):
        return out
    values, ranks = np.unique(np.concatenate([lo, q_seq]), return_inverse=True)
    width = len(values) + 1
    key = path * width + ranks[:len(lo)]
    by_key = np.argsort(key, kind="stable")
    keys = key[by_key]
    tied = np.zeros(len(keys), bool)
    tied[1:] = keys[1:] == keys[:-1]
    tied[:-1] |= tied[1:]
    at = np.searchsorted(keys, q_path * width + ranks[len(lo):], side="right") - 1
    begun = at >= 0
    at = np.maximum(at, 0)
    call = by_key[at]
    begun &= path[call] == q_path
    alone = begun & ~tied[at] & (hi[call] >= q_seq)
    out[alone] = call[alone]
    rest = np.nonzero(begun & ~alone)[0]
    if len(rest):
        of_path: Dict[int, List[int]] = {}
        for c, p in enumerate(path.tolist()):
            of_path.setdefault(p, []).append(c)
        los, his = lo.tolist(), hi.tolist()
        for q, p, s in zip(rest.tolist(), q_path[rest].tolist(), q_seq[rest].tolist()):
            best = -1
            for c in of_path[p]:
                if los[c] <= s <= his[c] and (best < 0 or los[c] > los[best]):
                    best = c
            out[q] = best
    return out
