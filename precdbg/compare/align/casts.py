"""Pairing the casts of two runs (dtype conversions: `Tensor.to`, `.float()`, MindSpore's
`astype`), which one run may make more of than the other without anything else changing:
within one framework by what they convert, across frameworks by shape."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from ...records.schema import Role
from ...storage.reader import RecordTable

_INPUT = Role.INPUT

__all__ = ["CAST", "casts", "pair_casts_by_input", "casts_by_shape"]

CAST = "cast"                    # the canonical op of every dtype conversion (records/tables/ops.yaml)


def casts_by_shape(rows_a: List[int], rows_b: List[int], shape_a: Any, shape_b: Any
                   ) -> Tuple[List[int], List[int], List[int], List[int]]:
    """Casts across frameworks, in order, each with the next one of the same shape: the casts
    an AMP level puts around cells (MindSpore O2) have no counterpart in the other run, and
    pairing them k-th with k-th pairs a cast of the logits with one of a hidden state."""
    pa, pb, oa = [], [], []
    at = 0
    for i in rows_a:
        j = next((k for k in range(at, len(rows_b))
                  if np.array_equal(shape_a(i), shape_b(rows_b[k]))), None)
        if j is None:
            oa.append(i)
            continue
        pa.append(i)
        pb.append(rows_b[j])
        at = j + 1
    used = set(pb)
    return pa, pb, oa, [r for r in rows_b if r not in used]


def casts(table: RecordTable, rows: Any) -> List[int]:
    """The forward records (`rows` among them) of cast calls, where the dump has provenance."""
    if "producer" not in table:
        return []
    rows = np.asarray(rows, dtype=np.int64)
    return rows[(table["op"] == CAST)[rows]].tolist()


def _facts(table: RecordTable, rows: List[int], calls: Any
           ) -> Dict[int, Tuple[Tuple[str, int], int, int, Any]]:
    """row -> ((role, argument position), producer, seq, call) of the rows, in seq order."""
    rows = np.asarray(rows, dtype=np.int64)
    rows = rows[np.argsort(table["seq"][rows], kind="stable")]
    slots = zip(table["role"][rows].tolist(), table["arg_index"][rows].tolist())
    found = zip(slots, table["producer"][rows].tolist(), table["seq"][rows].tolist(),
                np.asarray(calls)[rows].tolist())
    return dict(zip(rows.tolist(), found))


def pair_casts_by_input(a: RecordTable, b: RecordTable, casts_a: List[int], casts_b: List[int],
                        calls_a: Any, calls_b: Any, pa: Any, pb: Any
                        ) -> Tuple[List[int], List[int], List[int], List[int]]:
    """Within one framework, a cast pairs with the other run's cast of the counterpart of its
    input (the tensor's producer records paired): an extra cast in one run (a softmax's scores
    put into bf16) then shifts no other cast of its module, which counting k-th occurrences
    did (the baseline's cast of the softmax output paired with the candidate's cast of the
    scores). Casts of casts follow in order. `calls_*`: per row the call it belongs to (what
    every record of one captured call shares). Returns (pairs a, pairs b, rest a, rest b):
    the rest (inputs nothing captured produced, or no counterpart) pair by their keys."""
    facts_a, facts_b = _facts(a, casts_a, calls_a), _facts(b, casts_b, calls_b)
    # the seq in b of the record paired with a's record of each seq (the casts' inputs')
    seq_a = a["seq"][np.asarray(pa, dtype=np.int64)]
    seq_b = b["seq"][np.asarray(pb, dtype=np.int64)]
    asked = np.isin(seq_a, np.asarray([f[1] for f in facts_a.values()], dtype=np.int64))
    counterpart = dict(zip(seq_a[asked].tolist(), seq_b[asked].tolist()))
    rows_of_b: Dict[Any, List[int]] = {}
    by_input_b: Dict[int, List[Any]] = {}             # producer seq -> cast calls reading it
    for j, (slot, producer, _, call) in facts_b.items():
        rows_of_b.setdefault(call, []).append(j)
        if slot == (_INPUT, 0) and producer >= 0:
            by_input_b.setdefault(producer, []).append(call)
    rows_of_a: Dict[Any, List[int]] = {}
    source_of: Dict[Any, int] = {}     # call -> what its first input with one was produced by
    for i, (slot, producer, _, call) in facts_a.items():
        rows_of_a.setdefault(call, []).append(i)
        if slot == (_INPUT, 0) and producer >= 0:
            source_of.setdefault(call, producer)
    out_a: List[int] = []
    out_b: List[int] = []
    taken = set()
    for call, rows in rows_of_a.items():           # in a's order: casts of casts follow
        source = source_of.get(call)
        target = counterpart.get(source) if source is not None else None
        other = next((c for c in by_input_b.get(target, ()) if c not in taken), None) \
            if target is not None else None
        if other is None:
            continue
        slots = {facts_b[j][0]: j for j in rows_of_b[other]}
        matched = [slots.get(facts_a[i][0]) for i in rows]
        if None in matched:
            continue
        taken.add(other)
        out_a += rows
        out_b += matched
        for i, j in zip(rows, matched):
            counterpart[facts_a[i][2]] = facts_b[j][2]
    paired_a, paired_b = set(out_a), set(out_b)
    return (out_a, out_b, [i for i in casts_a if i not in paired_a],
            [j for j in casts_b if j not in paired_b])
