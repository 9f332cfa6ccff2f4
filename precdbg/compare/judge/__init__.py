"""Judge: whether each aligned pair of records differs, and how much that means.

`metrics`: errors and dtype-aware tolerances per pair; `floors`: the rounding floor a pair
inherits from what it reads; `multistep`: parameters at step k >= 1 judged by their update;
`structure` (with `structural_diff`, `inert`, `call_columns`): modules whose class, calls or
layer settings differ; `entries` and `rows`: the judged pairs grouped per entry, with their
evidence.

Imports: precdbg.errors, precdbg.records, precdbg.storage, precdbg.check, precdbg.compare.align
"""
