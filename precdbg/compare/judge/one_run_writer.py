"""Judge `one_run_writer`: a call only one run makes that writes, in place, the memory a later
read finds changed is the cause of that read's difference.

A read that differs while the call that produced its tensor agrees was changed in between. When
nothing captured wrote it, something uncaptured did; but a captured in-place call (`add_`,
`__setitem__`, `copy_`, MindSpore's `assign`) that only one run makes, on the same storage,
after the producer and before the read, is that change: the user's own code writing into the
batch between micro-batches (seen: `ids[:, 0] = 0` inside the captured window was reported as
"something not captured changed it", with `Tensor.__setitem__` listed among the records without
counterpart). Storage ids are each run's own: the writer is looked for in the run whose read it
is, by the read's storage, between the producer's and the read's positions in that run's
timeline.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

from ...records.naming import in_place
from ...records.schema import Direction, RecordKind, Role
from ...storage.reader import RecordTable

__all__ = ["JUDGE_ID", "OneRunWriter", "WriterIndex"]

JUDGE_ID = "one_run_writer"


@dataclasses.dataclass(frozen=True)
class OneRunWriter:
    side: str            # "baseline" / "candidate": the run that makes the call
    name: str            # its entry
    module: str
    op: str
    seq: int


class WriterIndex:
    """The in-place API calls of one run that have no counterpart, by the storage their first
    tensor argument lives in."""

    def __init__(self, table: RecordTable, unpaired: Iterable[int], side: str) -> None:
        self.side = side
        self._by_storage: Dict[int, List[Tuple[int, int]]] = {}
        self._table = table
        if "storage" not in table:
            return
        kind, direction, role = table["kind"], table["direction"], table["role"]
        arg, storage, seq, api = table["arg_index"], table["storage"], table["seq"], \
            table["op"]
        for i in unpaired:
            if kind[i] != RecordKind.API or direction[i] != Direction.FORWARD \
                    or role[i] != Role.INPUT or arg[i] != 0 or storage[i] < 0:
                continue
            name = str(table["entry"][i]).split(".")
            if len(name) < 3 or not (in_place(name[-3]) or in_place(str(api[i]))):
                continue
            self._by_storage.setdefault(int(storage[i]), []).append((int(seq[i]), int(i)))

    def between(self, storage: int, after: int, before: int) -> Optional[OneRunWriter]:
        """The last such call on `storage` after position `after` and before `before`."""
        found = [(s, i) for s, i in self._by_storage.get(int(storage), ())
                 if after < s < before]
        if not found:
            return None
        _, i = max(found)
        t = self._table
        return OneRunWriter(self.side, str(t["entry"][i]), str(t["module"][i]), str(t["op"][i]),
                            int(t["seq"][i]))

    def __bool__(self) -> bool:
        return bool(self._by_storage)


def writer_of(index: WriterIndex, table: RecordTable, read: int, producer_seq: int
              ) -> Optional[OneRunWriter]:
    """The one-run in-place call that wrote the memory record `read` of `table` reads, after
    its producer (at `producer_seq`, -1: none captured) and before the read."""
    if not index or "storage" not in table:
        return None
    storage = int(table["storage"][read])
    if storage < 0:
        return None
    return index.between(storage, producer_seq, int(table["seq"][read]))
