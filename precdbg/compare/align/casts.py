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


def casts(table: RecordTable, rows: List[int]) -> List[int]:
    """The forward records (`rows` among them) of cast calls, where the dump has provenance."""
    if "producer" not in table:
        return []
    cast = table["op"] == CAST
    return [i for i in rows if cast[i]]


def pair_casts_by_input(a: RecordTable, b: RecordTable, casts_a: List[int], casts_b: List[int],
                        calls_a: List[Tuple], calls_b: List[Tuple], pa: List[int],
                        pb: List[int]) -> Tuple[List[int], List[int], List[int], List[int]]:
    """Within one framework, a cast pairs with the other run's cast of the counterpart of its
    input (the tensor's producer records paired): an extra cast in one run (a softmax's scores
    put into bf16) then shifts no other cast of its module, which counting k-th occurrences
    did (the baseline's cast of the softmax output paired with the candidate's cast of the
    scores). Casts of casts follow in order. Returns (pairs a, pairs b, rest a, rest b): the
    rest (inputs nothing captured produced, or no counterpart) pair by their keys."""
    seq_a, seq_b = a["seq"], b["seq"]
    counterpart = {int(seq_a[i]): int(seq_b[j]) for i, j in zip(pa, pb)}
    role_a, role_b = a["role"].tolist(), b["role"].tolist()
    arg_a, arg_b = a["arg_index"].tolist(), b["arg_index"].tolist()
    producer_a, producer_b = a["producer"], b["producer"]
    rows_of_b: Dict[Tuple, List[int]] = {}
    by_input_b: Dict[int, List[Tuple]] = {}           # producer seq -> cast calls reading it
    for j in sorted(casts_b, key=lambda r: seq_b[r]):
        rows_of_b.setdefault(calls_b[j], []).append(j)
        if role_b[j] == _INPUT and arg_b[j] == 0 and int(producer_b[j]) >= 0:
            by_input_b.setdefault(int(producer_b[j]), []).append(calls_b[j])
    rows_of_a: Dict[Tuple, List[int]] = {}
    for i in sorted(casts_a, key=lambda r: seq_a[r]):
        rows_of_a.setdefault(calls_a[i], []).append(i)
    out_a: List[int] = []
    out_b: List[int] = []
    taken = set()
    for call, rows in rows_of_a.items():           # in a's order: casts of casts follow
        source = next((int(producer_a[i]) for i in rows if role_a[i] == _INPUT
                       and arg_a[i] == 0 and int(producer_a[i]) >= 0), None)
        target = counterpart.get(source) if source is not None else None
        other = next((c for c in by_input_b.get(target, []) if c not in taken), None) \
            if target is not None else None
        if other is None:
            continue
        slots = {(role_b[j], arg_b[j]): j for j in rows_of_b[other]}
        matched = [(i, slots.get((role_a[i], arg_a[i]))) for i in rows]
        if any(j is None for _, j in matched):
            continue
        taken.add(other)
        for i, j in matched:
            out_a.append(i)
            out_b.append(j)
            counterpart[int(seq_a[i])] = int(seq_b[j])
    paired_a, paired_b = set(out_a), set(out_b)
    return (out_a, out_b, [i for i in casts_a if i not in paired_a],
            [j for j in casts_b if j not in paired_b])
