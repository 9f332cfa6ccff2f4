"""The entries of one compared step: each call (of an API or module, a parameter) of both runs
with what of it differs, built from the step's aligned record pairs, and where each differing
read came from (the record of the step that produced it, a record of one run only, or nothing
captured). `localize.py` walks them to the first divergence."""
from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...storage.reader import RecordTable
from ...records.schema import (NO_PRODUCER, READ_ROLES, WRITE_ROLES, Direction, RecordKind,
                               scalar_mask)
from ..align.alignment import Alignment
from .one_run_writer import WriterIndex, writer_of
from .pairs import PairTable
from .rows import ArgDiff, Evidence, Producer, Row, Source

__all__ = ["Entry", "StepEntries", "StepCompare", "all_zero_side", "call_codes",
           "scalar_records", "string_hashes"]

_BACKWARD, _NONE = Direction.BACKWARD, Direction.NONE
_PARAM, _MODULE = RecordKind.PARAM, RecordKind.MODULE
_PARAM_GRAD = RecordKind.PARAM_GRAD
_READ_ROLES = sorted(r.value for r in READ_ROLES)
_BIG = 1e308


def call_codes(t: RecordTable, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows` (of `t`), the code of its call, the key of its entry (its direction and
    name): 0, 1, ... in the order the calls first occur in `rows`, as numbering each new
    (direction, entry) met in a walk of the rows would, without reading the names into Python
    (`_table_call_codes`). Kept for the last rows asked (the floors', then the entries')."""
    table_codes = _table_call_codes(t)
    cached = _last_pair_codes[0]
    if cached is not None and cached[0] is table_codes and cached[1]() is rows:
        return cached[2]
    asked = rows
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if not len(rows):
        return np.zeros(0, dtype=np.int64)
    code = table_codes[rows]
    first = np.full(int(code.max()) + 1, len(rows), dtype=np.int64)
    np.minimum.at(first, code, np.arange(len(rows), dtype=np.int64))
    met = np.flatnonzero(first < len(rows))
    rank = np.zeros(len(first), dtype=np.int64)
    rank[met[np.argsort(first[met], kind="stable")]] = np.arange(len(met), dtype=np.int64)
    code = rank[code]
    code.flags.writeable = False
    if isinstance(asked, np.ndarray):
        _last_pair_codes[0] = (table_codes, weakref.ref(asked), code)
    return code


def _table_call_codes(t: RecordTable) -> np.ndarray:
    """Per record of `t`, a code of its (direction, entry), equal for equal keys: a run of equal
    keys (a call's records are together) counts once, the runs' keys are told apart by a hash
    of their code points, and each run is checked against its code's first run (where two keys
    share a hash, the names are read instead). Computed once per table (the rounding floors and
    the entries ask for the same); no large temporary arrays of strings."""
    direction, entry = t["direction"], t["entry"]
    cached = _last_codes[0]
    if cached is not None and cached[0]() is direction and cached[1]() is entry:
        return cached[2]
    code = _hashed_keys(direction, entry)
    if code is None:
        found: Dict[Tuple[str, str], int] = {}
        code = np.asarray([found.setdefault(key, len(found)) for key in
                           zip(direction.tolist(), entry.tolist())], dtype=np.int64).reshape(-1)
    _last_codes[0] = (weakref.ref(direction), weakref.ref(entry), code)
    return code


_last_codes: List[Optional[Tuple[Any, Any, np.ndarray]]] = [None]
_last_pair_codes: List[Optional[Tuple[np.ndarray, Any, np.ndarray]]] = [None]


def scalar_records(t: RecordTable) -> np.ndarray:
    """`scalar_mask(t["dtype"])`: per record of `t`, whether it is a non-tensor argument's.
    Computed once for the last table asked (the statistics, the rounding floors and the
    entries ask of the candidate's)."""
    dtype = t["dtype"]
    cached = _last_scalar[0]
    if cached is not None and cached[0]() is dtype:
        return cached[1]
    found = scalar_mask(dtype)
    found.flags.writeable = False
    _last_scalar[0] = (weakref.ref(dtype), found)
    return found


_last_scalar: List[Optional[Tuple[Any, np.ndarray]]] = [None]
_HASH_WEIGHTS = np.random.default_rng(50).random(1024) + 0.5
_CHUNK = 256        # rows of strings compared at once


def string_hashes(column: np.ndarray, shift: int = 0) -> Optional[np.ndarray]:
    """A float per string of a numpy str column (None for another column): a weighted sum of
    its code points, equal for equal strings (padding adds 0)."""
    if column.dtype.kind != "U" or not column.dtype.isnative or column.ndim != 1:
        return None
    width = column.dtype.itemsize // 4
    if not width or not len(column):
        return np.zeros(len(column), np.float64)
    units = np.ascontiguousarray(column).view(np.uint32).reshape(len(column), width)
    return np.einsum("ij,j->i", units, np.resize(_HASH_WEIGHTS[shift:], width))


def _hashed_keys(direction: np.ndarray, entry: np.ndarray) -> Optional[np.ndarray]:
    """_table_call_codes by hashes; None where two keys share one (or a column is not of str)."""
    n = len(entry)
    if not n:
        return np.zeros(0, dtype=np.int64)
    hash_entry, hash_direction = string_hashes(entry, 0), string_hashes(direction, 512)
    if hash_entry is None or hash_direction is None:
        return None
    new = np.ones(n, dtype=bool)
    new[1:] = (entry[1:] != entry[:-1]) | (direction[1:] != direction[:-1])
    heads = np.flatnonzero(new)
    _, first, inverse = np.unique(hash_entry[heads] * 3.0 + hash_direction[heads],
                                  return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    again = np.flatnonzero(first[inverse] != np.arange(len(heads)))   # not its code's first
    mine, theirs = heads[again], heads[first[inverse[again]]]
    for at in range(0, len(again), _CHUNK):
        part = slice(at, at + _CHUNK)
        if not (np.array_equal(entry[mine[part]], entry[theirs[part]]) and
                np.array_equal(direction[mine[part]], direction[theirs[part]])):
            return None
    return inverse[np.cumsum(new) - 1]


@dataclasses.dataclass(eq=False)
class Entry:
    """One entry (a call of an API or module, a parameter) of one step and rank, with what of
    it differs between the runs."""
    step: int
    rank: int
    direction: str
    kind: str
    name_a: str
    name_b: str
    module: str
    op: str
    order: int
    seq: int                       # position in the step's timeline (first record emitted)
    first_bad: int = 1 << 62       # when it was first seen to differ (its first differing record)
    inputs_bad: List[Evidence] = dataclasses.field(default_factory=list)
    outputs_bad: List[Evidence] = dataclasses.field(default_factory=list)
    args_bad: List[ArgDiff] = dataclasses.field(default_factory=list)
    inputs_ok: int = 0
    outputs_ok: int = 0
    inputs_ok_err: float = 0.0     # the largest relative error among the agreeing inputs
    # the agreeing tensor reads: (role, arg_index, checksums equal (None: not both dumped),
    # judged by statistics only (no stored tensors))
    reads_agreeing: List[Tuple[str, int, Optional[bool], bool]] = \
        dataclasses.field(default_factory=list)
    trainable_differs: bool = False

    @property
    def name(self) -> str:
        return self.name_a or self.name_b

    @property
    def diverged(self) -> bool:
        return bool(self.inputs_bad or self.outputs_bad or self.args_bad)

    @property
    def is_candidate(self) -> bool:
        """Tensor inputs agree (or there are none); outputs, or a non-tensor argument, do not."""
        return bool(self.outputs_bad or self.args_bad) and not self.inputs_bad

    @property
    def is_inventory(self) -> bool:
        return self.direction == _NONE


def all_zero_side(e: Entry) -> str:
    """"baseline" / "candidate" where every differing output of `e` is all zero in that run
    only (a norm of exactly 0 against a non-zero one), else ""."""
    sides = set()
    for x in e.outputs_bad:
        na, nb = x.metrics.get("norm_a"), x.metrics.get("norm_b")
        if not isinstance(na, float) or not isinstance(nb, float):
            return ""
        if (na == 0.0) == (nb == 0.0):
            return ""
        sides.add("baseline" if na == 0.0 else "candidate")
    return sides.pop() if len(sides) == 1 else ""


@dataclasses.dataclass
class StepEntries:
    """Every entry of one step, all ranks. `compared`: the ranks compared at this step, those
    whose entries were let go of because nothing of them differs included."""
    step: int
    entries: List[Entry]
    compared: Sequence[int] = ()

    def __post_init__(self) -> None:
        self._ranks = sorted({e.rank for e in self.entries} | set(self.compared))
        self._forward = {(e.rank, e.kind, e.order): e for e in self.entries
                         if e.direction == Direction.FORWARD and e.order > 0}

    def forward_of(self, entry: Entry) -> Optional[Entry]:
        """The forward call whose backward `entry` is (its saved tensors feed the backward)."""
        return self._forward.get((entry.rank, entry.kind, entry.order)) \
            if entry.direction == _BACKWARD else None

    def ranks(self) -> List[int]:
        return self._ranks

    def timeline(self, rank: int) -> List[Entry]:
        return sorted((e for e in self.entries if e.rank == rank and not e.is_inventory),
                      key=lambda e: e.seq)

    def counterparts(self, entry: Entry) -> List[Entry]:
        """The same entry on the other ranks, lowest rank first."""
        return sorted((e for e in self.entries if e.rank != entry.rank
                       and e.direction == entry.direction and e.name_a == entry.name_a),
                      key=lambda e: e.rank)



class StepCompare:
    """One step and rank of both dumps: entries, and where each differing read came from."""

    def __init__(self, ta: RecordTable, tb: RecordTable, al: Alignment) -> None:
        self.ta, self.tb, self.al = ta, tb, al
        self.entries: Dict[Tuple[str, str], Entry] = {}
        # the paired rows of a and b, each pair's entry (its index in the list)
        self._paired: Tuple[np.ndarray, np.ndarray, np.ndarray, List[Entry]] = \
            (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), [])
        self._entry_of: Optional[Tuple[Dict[int, Entry], Dict[int, Entry]]] = None
        self.unpaired = (set(al.only_a.tolist()), set(al.only_b.tolist()))
        self.reads: List[Tuple[Evidence, int, int]] = []

    @functools.cached_property
    def row_of_seq(self) -> Tuple[Dict[int, int], Dict[int, int]]:
        """Per side, a record's seq -> its row (provenance only)."""
        return (dict(zip(self.ta["seq"].tolist(), range(len(self.ta["seq"])))),
                dict(zip(self.tb["seq"].tolist(), range(len(self.tb["seq"])))))

    @property
    def entry_of_a(self) -> Dict[int, Entry]:
        """Paired record of a -> its entry (made when first asked: provenance only)."""
        return self._entry_maps()[0]

    @property
    def entry_of_b(self) -> Dict[int, Entry]:
        return self._entry_maps()[1]

    def _entry_maps(self) -> Tuple[Dict[int, Entry], Dict[int, Entry]]:
        if self._entry_of is None:
            rows_a, rows_b, code, entries = self._paired
            paired = [entries[g] for g in code.tolist()] if len(code) else []
            self._entry_of = (dict(zip(rows_a.tolist(), paired)),
                              dict(zip(rows_b.tolist(), paired)))
        return self._entry_of

    def add_pairs(self, t: PairTable, bad_rows: Sequence[Row]) -> None:
        """Every pair of the judged table `t` (of this step's tables and alignment) into its
        entry, from the columns: an entry per (direction, baseline name), what agrees counted,
        what differs kept as evidence from `bad_rows`, the rows of the pairs that differ in
        pair order (row_columns.pair_rows(t, np.nonzero(t.diverged)[0]))."""
        ta, tb, ia, ib = self.ta, self.tb, t.ia, t.ib
        n = len(ia)
        if not n:
            return
        code = call_codes(ta, ia)           # 0, 1, ... as the entries first occur
        ngroups = int(code.max()) + 1
        by_group = np.argsort(code, kind="stable")
        starts = np.searchsorted(code[by_group], np.arange(ngroups))
        first = by_group[starts]            # each entry's first pair
        seq = ta["seq"][ia].astype(np.int64)
        diverged = np.asarray(t.diverged, dtype=bool)
        seq_min = np.minimum.reduceat(seq[by_group], starts).tolist()
        bad_seq = np.minimum.reduceat(np.where(diverged, seq, 1 << 62)[by_group], starts).tolist()
        differs = (ta["kind"] == _PARAM.value)[ia] & (ta["trainable"][ia].astype(bool)
                                                     != tb["trainable"][ib].astype(bool))
        trainable = np.maximum.reduceat(differs[by_group], starts).tolist()
        scalar = scalar_records(tb)[ib]
        read = np.zeros(len(ta["role"]), dtype=bool)
        for r in _READ_ROLES:
            read |= ta["role"] == r
        read = read[ia]
        tensor_ok = ~scalar & ~diverged
        # what agrees: counted, and each agreeing read's checksum verdict kept, entry by entry
        outputs_ok = np.bincount(code[tensor_ok & ~read], minlength=ngroups).tolist()
        reads_ok = np.nonzero(tensor_ok & read)[0]
        reads_ok = reads_ok[np.argsort(code[reads_ok], kind="stable")]   # by entry, in order
        err = np.asarray(t.err, dtype=np.float64)[reads_ok]
        err = np.where(np.isnan(err), 0.0, np.clip(err, -_BIG, _BIG))
        # the largest error above 0 of each entry's agreeing reads (0.0: none)
        worst = np.zeros(ngroups, dtype=np.float64)
        np.maximum.at(worst, code[reads_ok], np.where(err > 0.0, err, 0.0))
        worst = worst.tolist()
        reads_of = np.bincount(code[reads_ok], minlength=ngroups)
        reads_end = np.cumsum(reads_of).tolist()
        reads_of = reads_of.tolist()
        read_a = ia[reads_ok]
        both = (ta["checksum"] != "")[read_a] & (tb["checksum"] != "")[ib[reads_ok]]
        equal = np.asarray(t.checksum_equal, dtype=bool)[reads_ok]
        sums = np.where(both, equal, None).tolist()    # None where not both have one
        tensors = t.tensors
        agreeing = list(zip(ta["role"][read_a].tolist(), ta["arg_index"][read_a].tolist(), sums,
                            [tensors[p] is None for p in reads_ok.tolist()]))
        at_a = ia[first]
        fields = [ta[c][at_a].tolist() for c in ("step", "rank", "direction", "kind", "entry")]
        fields.append(tb["entry"][ib[first]].tolist())
        fields += [ta[c][at_a].tolist() for c in ("module", "op", "order")]
        parts = [agreeing[end - count:end] for end, count in zip(reads_end, reads_of)]
        # every field in order, by position (a call with keywords costs twice as much)
        entries: List[Entry] = list(map(
            Entry, *fields, seq_min, bad_seq, [[] for _ in range(ngroups)],
            [[] for _ in range(ngroups)], [[] for _ in range(ngroups)], reads_of, outputs_ok,
            worst, parts, trainable))
        self.entries.update(zip(zip(fields[2], fields[4]), entries))
        self._paired = (ia, ib, code, entries)
        self._entry_of = None
        # what differs: evidence, from the rows of the pairs that differ
        bad = np.nonzero(diverged)[0]
        for p, g, i, j, is_scalar, is_read, row in zip(
                bad.tolist(), code[bad].tolist(), ia[bad].tolist(), ib[bad].tolist(),
                scalar[bad].tolist(), read[bad].tolist(), bad_rows):
            e = entries[g]
            if is_scalar:                       # a non-tensor argument: a cause, not data
                e.args_bad.append(ArgDiff(row.role, row.arg_index, str(ta["arg_key"][i]),
                                          str(ta["text"][i]), str(tb["text"][j])))
                continue
            ev = Evidence.of(row)
            (e.inputs_bad if is_read else e.outputs_bad).append(ev)
            if is_read or row.kind == _PARAM_GRAD:     # a dw may pass a dx on unchanged
                self.reads.append((ev, i, j))

    def one_run_param(self, side: str, r: Dict[str, Any], step: int, rank: int) -> None:
        """A parameter present in one run only is an inventory difference (buffers are
        framework plumbing: MindSpore has none where PyTorch has some)."""
        key = ("none", r["entry"])
        e = self.entries.setdefault(key, Entry(step, rank, "none", _PARAM,
                                               r["entry"] if side == "a" else "",
                                               r["entry"] if side == "b" else "",
                                               r["module"], r["op"], 0, int(r["seq"])))
        e.first_bad = min(e.first_bad, int(r["seq"]))
        e.outputs_bad.append(Evidence(r["role"], 0, "", True, {},
                                      only_in="baseline" if side == "a" else "candidate"))

    # ------------------------------------------------------------------ provenance
    def _producer_row(self, side: int, i: int) -> Optional[int]:
        table = self.ta if side == 0 else self.tb
        seq = int(table["producer"][i])
        return None if seq == NO_PRODUCER else self.row_of_seq[side].get(seq)

    def _writers(self) -> Dict[int, List[Tuple[int, int]]]:
        """Per storage of the baseline: (seq, row) of the paired records that wrote into it."""
        ta = self.ta
        out: Dict[int, List[Tuple[int, int]]] = {}
        storage, seq, role = ta["storage"], ta["seq"], ta["role"]
        for i in self.entry_of_a:
            if storage[i] >= 0 and role[i] in WRITE_ROLES:
                out.setdefault(int(storage[i]), []).append((int(seq[i]), i))
        for rows in out.values():
            rows.sort(reverse=True)
        return out

    def resolve_reads(self) -> None:
        """Each differing read learns its producer: an entry of both runs, a record of one run
        only, or nothing captured; and what else wrote into the same memory before it."""
        if not self.reads:
            return
        writers = self._writers()
        one_run = (WriterIndex(self.ta, self.unpaired[0], "baseline"),
                   WriterIndex(self.tb, self.unpaired[1], "candidate"))
        # the columns read per read, as Python values once; producers without counterpart
        # named once per pair of producing records (many reads share one)
        seq_a, storage_a = self.ta["seq"].tolist(), self.ta["storage"].tolist()
        producer_a, producer_b = self.ta["producer"].tolist(), self.tb["producer"].tolist()
        named: Dict[Tuple[Optional[int], Optional[int]], Producer] = {}
        for ev, i, j in self.reads:
            seq, store = seq_a[i], storage_a[i]
            seen = set()
            for s, k in writers.get(store, ()):
                e = self.entry_of_a[k]
                if s < seq and e.diverged and id(e) not in seen:
                    seen.add(id(e))
                    ev.same_memory.append(e)
            ka, kb = self._producer_row(0, i), self._producer_row(1, j)
            entry = (self.entry_of_a.get(ka) if ka is not None else None) or \
                (self.entry_of_b.get(kb) if kb is not None else None)
            if entry is not None:
                ev.producer = Producer(Source.ENTRY, entry)
            elif (ka is not None and ka in self.unpaired[0]) or \
                    (kb is not None and kb in self.unpaired[1]):
                key = (ka if ka in self.unpaired[0] else None,
                       kb if kb in self.unpaired[1] else None)
                found = named.get(key)
                if found is None:
                    found = named[key] = self._one_run(*key)
                ev.producer = found
            else:
                ev.producer = Producer(Source.NONE)
            ev.writer = writer_of(one_run[1], self.tb, j, producer_b[j]) \
                or writer_of(one_run[0], self.ta, i, producer_a[i])

    def _one_run(self, ka: Optional[int], kb: Optional[int]) -> Producer:
        """Producers without counterpart: named by the innermost module holding both, through
        that module's own entries when it has some in either run."""
        paths = [str(t["module"][k]) for t, k in ((self.ta, ka), (self.tb, kb)) if k is not None]
        module = paths[0]
        for other in paths[1:]:
            parts = []
            for x, y in zip(module.split("."), other.split(".")):
                if x != y:
                    break
                parts.append(x)
            module = ".".join(parts)
        names, kind, op = ["", ""], "", ""
        for side, table, k in ((0, self.ta, ka), (1, self.tb, kb)):
            if k is None:
                continue
            # the root's path ("") also owns what runs outside the model (a loss scaled
            # before backward): a call there is named itself, not by the model's entry
            rows = np.nonzero((table["kind"] == _MODULE) & (table["module"] == module)
                              & (table["direction"] == table["direction"][k]))[0] \
                if module else ()
            pick = int(rows[0]) if len(rows) else k
            names[side] = str(table["entry"][pick])
            kind, op = kind or str(table["kind"][pick]), op or str(table["op"][pick])
        return Producer(Source.ONE_RUN, None, names[0], names[1], module, kind, op)
