"""Judge `unfinished_step`: one run's step stopped early.

A step whose forward raised (an exception the training script caught, then `stop()`), or whose
process ended inside its window (the step file marked `interrupted`), holds a prefix of what the
other run's step holds: the pairs it has may all agree, and "0 beyond tolerance" would read as a
match. Measured on a three-block MLP whose second block raised after its first Linear at the
dumped iteration: 49 pairs compared, none beyond tolerance, 133 records of the baseline without
counterpart; the only verdict then was a structural difference of the root module whose calls
"differ" because the candidate's call never finished.

The decision: a module call (its path and its k-th forward call there) that began in both runs,
returned in one (an output record) and not in the other, with records of the other run left
without counterpart. Where that run stopped is the innermost such call (the deepest module
path) and its last record. A module that returns no floating-point tensor has no output record
in either run, so it never counts; a run whose step is marked interrupted is unfinished
whatever it returned.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ...records.schema import Direction, RecordKind, Role
from ...storage.reader import RecordTable

__all__ = ["UnfinishedStep", "unfinished_step", "JUDGE_ID"]

JUDGE_ID = "unfinished_step"
_FORWARD, _MODULE = Direction.FORWARD, RecordKind.MODULE
_INPUT, _OUTPUT = Role.INPUT, Role.OUTPUT
_SIDES = ("baseline", "candidate")

# (module path, k-th forward call of that path) -> (entry, first seq, returned)
_Calls = Dict[Tuple[str, int], Tuple[str, int, bool]]


@dataclasses.dataclass
class UnfinishedStep:
    """Where one run's step stopped: `side` ("baseline" or "candidate") stopped inside
    `module`'s call `entry` (the other run's call is `other_entry`), its last record being
    `last_record`; `seq` is where that is in the baseline's order (what ran before it is
    compared as usual); `records_after`: the other run's records without counterpart."""
    step: int
    rank: int
    side: str
    module: str
    entry: str
    other_entry: str
    last_record: str
    seq: int
    records_after: int
    interrupted: bool

    def as_json(self) -> Dict[str, object]:
        return {"judge": JUDGE_ID, "side": self.side, "module": self.module,
                "call": self.entry, "last_record": self.last_record,
                "records_after": self.records_after, "interrupted": self.interrupted}


def _module_calls(table: RecordTable, path_of: Callable[[str], str]) -> _Calls:
    """Each forward module call by (its path, k-th call of that path), in the order the paths
    were first called: its entry, the seq of its first record, whether it returned (an output
    record). Column by column; Python values only of each call's first record."""
    out: _Calls = {}
    if not len(table):
        return out
    idx = np.nonzero((table["kind"] == _MODULE) & (table["direction"] == _FORWARD))[0]
    idx = idx[np.argsort(table["seq"][idx], kind="stable")]
    if not len(idx):
        return out
    entry_col = table["entry"]
    seen: Dict[str, int] = {}           # entry -> its code, in the order entries first occur
    code = np.fromiter((seen.setdefault(str(e), len(seen)) for e in entry_col[idx].tolist()),
                       np.int64, len(idx))
    first = np.unique(code, return_index=True)[1]      # each entry's first record (code order)
    returned = np.zeros(len(seen), bool)
    returned[code[table["role"][idx] == _OUTPUT]] = True
    rows = idx[first]
    calls: Dict[str, List[int]] = {}     # path -> its calls (entry codes) in call order
    for c, module in enumerate(table["module"][rows].tolist()):
        calls.setdefault(path_of(str(module)), []).append(c)
    entries, seqs, done = list(seen), table["seq"][rows].tolist(), returned.tolist()
    for path, listed in calls.items():
        for k, c in enumerate(listed):
            out[(path, k)] = (entries[c], seqs[c], done[c])
    return out


def _last_record(table: RecordTable, rows: np.ndarray) -> Tuple[str, int]:
    """The entry and seq of the latest of `rows` (by seq)."""
    if not len(rows):
        return "", -1
    i = int(rows[np.argmax(table["seq"][rows])])
    return str(table["entry"][i]), int(table["seq"][i])


def unfinished_step(ta: RecordTable, tb: RecordTable, pairs_a: np.ndarray, pairs_b: np.ndarray,
                    only_a: np.ndarray, only_b: np.ndarray, step: int, rank: int,
                    interrupted: Tuple[bool, bool] = (False, False),
                    rename: Optional[Callable[[str], str]] = None) -> Optional[UnfinishedStep]:
    """The run whose step stopped early (see the module's text), or None. `pairs_a`/`pairs_b`:
    the aligned rows; `only_a`/`only_b`: the rows without counterpart; `rename` maps the
    candidate's module paths to the baseline's (a name mapping file)."""
    if not len(ta) or not len(tb):
        return None
    if not len(only_a) and not len(only_b):
        return None          # every record has its counterpart: neither run stopped early
    calls = (_module_calls(ta, lambda p: p), _module_calls(tb, rename or (lambda p: p)))
    tables, pairs, only = (ta, tb), (pairs_a, pairs_b), (only_a, only_b)
    for short in (0, 1):
        other = 1 - short
        left = only[other]          # what the other run holds and this one lacks
        if not len(left):
            continue
        mine, theirs = calls[short], calls[other]
        stopped = [(key, mine[key][0], theirs[key][0], mine[key][1]) for key in mine
                   if key in theirs and not mine[key][2] and theirs[key][2]]
        table = tables[short]
        last, last_seq = _last_record(table, np.concatenate([pairs[short], only[short]])
                                      .astype(np.int64))
        if stopped:
            # the innermost call it stopped in: the deepest path, the latest begun
            (path, _), entry, other_entry, _ = max(
                stopped, key=lambda s: (s[0][0].count(".") + (s[0][0] != ""), s[3]))
        elif interrupted[short]:     # ended after every forward call returned (in backward)
            path, entry, other_entry = "", last, ""
            rows = np.nonzero(table["entry"] == last)[0]
            if len(rows):
                path = str(table["module"][int(rows[0])])
        else:
            continue
        return UnfinishedStep(step, rank, _SIDES[short], path, entry, other_entry, last,
                              _baseline_seq(ta, tb, pairs_a, pairs_b, short, last_seq),
                              int(len(left)), bool(interrupted[short]))
    return None


def _baseline_seq(ta: RecordTable, tb: RecordTable, pairs_a: np.ndarray, pairs_b: np.ndarray,
                  short: int, last_seq: int) -> int:
    """Where the short run stopped, in the baseline's order: the baseline's own last record, or
    the baseline record paired with the candidate's last paired one."""
    if short == 0:
        return last_seq
    if not len(pairs_b):
        return 0
    k = int(np.argmax(tb["seq"][pairs_b]))
    return int(ta["seq"][pairs_a[k]])
