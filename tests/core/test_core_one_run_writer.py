"""Judge `one_run_writer` (precdbg/compare/judge/one_run_writer.py) on record tables made by
hand: a call only one run makes that writes a read's memory in place, after its producer and
before the read, is found by storage; other storage, other positions and calls that do not
write are not."""
from __future__ import annotations

from precdbg.compare.judge.one_run_writer import WriterIndex, writer_of

from test_core_pair_judges import _table

# the candidate: the batch made by a captured call (seq 0), written in place by the script
# (seq 1, a call the baseline does not make), read by the model (seq 2)
_ROWS = [
    {"entry": "Torch.randint.0.forward", "role": "output", "storage": 7, "dtype": "int64"},
    {"entry": "Tensor.__setitem__.0.forward", "op": "__setitem__", "role": "input",
     "storage": 7, "dtype": "int64", "module": ""},
    {"entry": "Functional.embedding.0.forward", "op": "embedding", "role": "input",
     "storage": 7, "dtype": "int64", "producer": 0, "module": "wte"},
    {"entry": "Tensor.mul.0.forward", "op": "mul", "role": "input", "storage": 9},
]


def test_the_in_place_call_between_producer_and_read_is_the_writer():
    table = _table(_ROWS)
    index = WriterIndex(table, [1, 3], "candidate")
    found = writer_of(index, table, 2, 0)
    assert found is not None
    assert (found.side, found.name, found.seq) == ("candidate", "Tensor.__setitem__.0.forward", 1)


def test_not_before_the_producer_nor_on_other_memory_nor_a_call_that_does_not_write():
    table = _table(_ROWS)
    index = WriterIndex(table, [1, 3], "candidate")
    assert writer_of(index, table, 2, 1) is None          # the producer came after it
    other = _table([dict(r, storage=8) if k == 1 else r for k, r in enumerate(_ROWS)])
    assert writer_of(WriterIndex(other, [1, 3], "candidate"), other, 2, 0) is None
    assert writer_of(WriterIndex(table, [3], "candidate"), table, 2, 0) is None   # paired
    mul = _table([dict(r, entry="Tensor.mul.0.forward", op="mul") if k == 1 else r
                  for k, r in enumerate(_ROWS)])
    assert writer_of(WriterIndex(mul, [1], "candidate"), mul, 2, 0) is None   # mul: no write
