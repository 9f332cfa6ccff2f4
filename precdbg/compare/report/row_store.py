"""The rows of a compare, kept per (step, rank) as they are judged (issue 50).

A compare's rows (one per record pair, some fifty values each) are most of its memory: 4.6 KB
a pair as objects, 22 GB for 1,024 ranks of a small model. `RowStore` takes each (step, rank)'s
rows as one `RowChunk` and keeps either their JSON dicts (`spool=False`: what
`compare_dumps` returns by default, a list in the result) or their text in the JSON file's
layout, compressed, in an unnamed temporary file (`spool=True`: what `precdbg compare` uses), so
a compare holds one (step, rank)'s rows at a time whatever the number of ranks. The chunks may
arrive in any order (ranks compared by workers); they are read back in (step, rank) order.

What the pipeline's notes need of all the rows (counts, the first row of a kind, whether any
has stored tensors) is kept per chunk as `RowFacts` and merged in that order, so the notes are
the ones made from the whole list.

A chunk is made where its rows are judged (`make_chunk`), in a worker process too: the JSON text
is then encoded on the workers, and what travels back is the compressed text.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import zlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ...records.schema import Role
from ..judge.pairs import PairTable
from ..judge.row_columns import RowColumns, status_column
from ..judge.rows import ROW_KEYS
from .json_out import encode_row_columns, encode_rows

__all__ = ["RowFacts", "RowChunk", "RowStore", "make_chunk", "row_counts"]

_First = Optional[Tuple[str, str, int]]      # (name_a, role, arg_index) of a row


@dataclasses.dataclass
class RowFacts:
    """What the notes need of a chunk's rows (or of all of them, merged in order)."""
    count: int = 0
    diverged: int = 0
    measured: bool = False        # a row with stored tensors or both checksums: not statistics only
    pos_a: bool = False           # a row whose baseline record has pos_mean
    pos_b: bool = False
    kinds: Tuple[str, ...] = ()
    explained: int = 0            # status 'precision'
    explained_first: str = ""
    plumbing: int = 0             # status 'integer'
    plumbing_first: _First = None
    floored: int = 0              # judged against a rounding floor
    floored_first: _First = None
    floored_grad_input: _First = None   # the first such row that is a grad_input

    @classmethod
    def of(cls, t: PairTable) -> "RowFacts":
        """The facts of the rows of every pair of a judged pair table, from its columns (what
        `pair_rows(t)` holds, without making the rows)."""
        n = len(t)
        if not n:
            return cls()
        a, b, ia, ib = t.a, t.b, t.ia, t.ib
        status = status_column(t)
        names = a["entry"][ia]
        role, arg_index = a["role"][ia], a["arg_index"][ia]

        def first(mask: np.ndarray, where: bool) -> Any:
            at = int(np.argmax(mask))
            if not where:
                return str(names[at])
            return (str(names[at]), str(role[at]), int(arg_index[at]))

        explained, plumbing = status == "precision", status == "integer"
        floored = np.asarray(t.floor_decided, dtype=bool)
        grad_input = floored & (role == Role.GRAD_INPUT.value)
        # a row's checksum_equal is True only where both records have a checksum
        sums = ((a["checksum"][ia] != "") & (b["checksum"][ib] != "")
                & np.asarray(t.checksum_equal, dtype=bool))
        f = cls(count=n, diverged=int(np.count_nonzero(status == "diverged")),
                measured=bool(sums.any()) or any(tm is not None for tm in t.tensors),
                pos_a="pos_mean" in a and bool((~np.isnan(a["pos_mean"][ia])).any()),
                pos_b="pos_mean" in b and bool((~np.isnan(b["pos_mean"][ib])).any()),
                kinds=tuple(sorted(str(k) for k in np.unique(a["kind"][ia]).tolist())),
                explained=int(np.count_nonzero(explained)),
                plumbing=int(np.count_nonzero(plumbing)),
                floored=int(np.count_nonzero(floored)))
        if f.explained:
            f.explained_first = first(explained, False)
        if f.plumbing:
            f.plumbing_first = first(plumbing, True)
        if f.floored:
            f.floored_first = first(floored, True)
        if grad_input.any():
            f.floored_grad_input = first(grad_input, True)
        return f

    def then(self, later: "RowFacts") -> "RowFacts":
        """These facts followed by those of rows that come after them."""
        return RowFacts(
            self.count + later.count, self.diverged + later.diverged,
            self.measured or later.measured, self.pos_a or later.pos_a,
            self.pos_b or later.pos_b, tuple(sorted(set(self.kinds) | set(later.kinds))),
            self.explained + later.explained,
            self.explained_first if self.explained else later.explained_first,
            self.plumbing + later.plumbing,
            self.plumbing_first if self.plumbing else later.plumbing_first,
            self.floored + later.floored,
            self.floored_first if self.floored else later.floored_first,
            self.floored_grad_input if self.floored_grad_input is not None
            else later.floored_grad_input)


@dataclasses.dataclass
class RowChunk:
    """One (step, rank)'s rows: their facts, and their JSON dicts or compressed JSON text."""
    step: int
    rank: int
    facts: RowFacts
    dicts: Optional[List[Dict[str, Any]]] = None
    text: Optional[bytes] = None      # zlib of the rows' text at the JSON file's indent


def make_chunk(step: int, rank: int, facts: RowFacts, rows: Optional[RowColumns],
               spool: bool, keep: bool = True) -> RowChunk:
    """The chunk of a judged (step, rank)'s rows (`facts`: theirs, RowFacts.of its pair
    table; `rows`: their values column by column, row_columns of the table); `keep` False:
    their facts only (a compare that writes no rows: none are made, none are encoded)."""
    if not keep or rows is None:
        return RowChunk(step, rank, facts, dicts=[])
    if not spool:
        return RowChunk(step, rank, facts, dicts=rows.dicts())
    text = encode_row_columns(ROW_KEYS, rows.values, rows.tensors, 2).encode("utf-8")
    return RowChunk(step, rank, facts, text=zlib.compress(text, 1))


class RowStore:
    """The rows of a compare by (step, rank): in memory, or spooled to an unnamed temporary
    file (removed when the store is closed or collected); `keep` False: their facts only (it
    iterates over nothing; `len` and `facts` count them)."""

    def __init__(self, spool: bool = False, keep: bool = True) -> None:
        self.spool, self.keep = spool, keep
        self._chunks: Dict[Tuple[int, int], RowChunk] = {}
        self._where: Dict[Tuple[int, int], Tuple[int, int]] = {}   # offset, size in the file
        self._file: Any = tempfile.TemporaryFile(prefix="precdbg_rows_") \
            if spool and keep else None
        self._facts: Optional[RowFacts] = None

    def add(self, chunk: RowChunk) -> None:
        key = (chunk.step, chunk.rank)
        if chunk.text is not None and self._file is not None:
            self._file.seek(0, 2)
            self._where[key] = (self._file.tell(), len(chunk.text))
            self._file.write(chunk.text)
            chunk = dataclasses.replace(chunk, text=None)
        elif chunk.text is not None:       # spooled by a worker, kept in memory here
            chunk = dataclasses.replace(chunk, dicts=_decode(chunk.text), text=None)
        self._chunks[key] = chunk
        self._facts = None

    def facts(self) -> RowFacts:
        """The facts of all rows, merged in (step, rank) order."""
        if self._facts is None:
            merged = RowFacts()
            for key in sorted(self._chunks):
                merged = merged.then(self._chunks[key].facts)
            self._facts = merged
        return self._facts

    def __len__(self) -> int:
        return self.facts().count

    def texts(self) -> Iterator[str]:
        """Each non-empty chunk's rows as the JSON file's text, in (step, rank) order."""
        if not self.keep:
            return
        for key in sorted(self._chunks):
            chunk = self._chunks[key]
            if not chunk.facts.count:
                continue
            if key in self._where:
                offset, size = self._where[key]
                self._file.seek(offset)
                yield zlib.decompress(self._file.read(size)).decode("utf-8")
            else:
                yield encode_rows(chunk.dicts or [], 2)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for key in sorted(self._chunks):
            chunk = self._chunks[key]
            if key in self._where:
                offset, size = self._where[key]
                self._file.seek(offset)
                yield from _decode(self._file.read(size))
            else:
                yield from chunk.dicts or []

    def as_list(self) -> List[Dict[str, Any]]:
        """Every row's dict, in (step, rank) order (the store is emptied)."""
        out: List[Dict[str, Any]] = []
        for row in self:
            out.append(row)
        self._chunks.clear()
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()


def _decode(text: bytes) -> List[Dict[str, Any]]:
    return json.loads("[" + zlib.decompress(text).decode("utf-8") + "]")


def row_counts(rows: Any) -> Tuple[int, int]:
    """(rows, rows diverged) of a result's rows: a list of dicts or a RowStore."""
    if isinstance(rows, RowStore):
        facts = rows.facts()
        return facts.count, facts.diverged
    return len(rows), sum(1 for r in rows if r["status"] == "diverged")
