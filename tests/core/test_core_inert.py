"""judge.inert `calls_changing_no_number` on record tables made by hand: a call whose result
nothing reads is left out of a module's call sequence where the dump knows tensor identities
(producers), and kept where it knows none (msprobe's dumps: every tensor_id -1)."""
from __future__ import annotations

import numpy as np

from precdbg.compare.judge.inert import calls_changing_no_number
from precdbg.records.schema import NO_PRODUCER
from precdbg.storage.reader import RecordTable


def _table(tensor_id: int, producer_of_second: int) -> RecordTable:
    # two API calls, order 1 and 2: call 1's output (seq 1) read by call 2's input or not
    rows = [("forward", "input", 1, 0), ("forward", "output", 1, 1),
            ("forward", "input", 2, 2), ("forward", "output", 2, 3)]
    n = len(rows)
    producer = [NO_PRODUCER, NO_PRODUCER, producer_of_second, NO_PRODUCER]
    return RecordTable({
        "kind": np.array(["api"] * n), "direction": np.array([r[0] for r in rows]),
        "role": np.array([r[1] for r in rows]), "order": np.array([r[2] for r in rows]),
        "seq": np.array([r[3] for r in rows]), "producer": np.array(producer),
        "dtype": np.array(["float32"] * n), "op": np.array(["linear"] * n),
        "arg_index": np.zeros(n, dtype=np.int64), "numel": np.full(n, 4),
        "tensor_id": np.full(n, tensor_id)})


def test_unread_results_are_inert_only_where_reads_are_known():
    assert calls_changing_no_number(_table(0, NO_PRODUCER)) == {1, 2}
    assert calls_changing_no_number(_table(0, 1)) == {2}      # call 1's output is read
    assert calls_changing_no_number(_table(-1, NO_PRODUCER)) == set()
