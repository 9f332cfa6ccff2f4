"""`precdbg check A B`: the set-up differences between two runs, before any tensor is compared.

Most accuracy gaps between two runs are set-up differences: another learning rate, a parameter in
the wrong weight-decay group, a frozen layer, other initial weights, another first batch, no seed,
a different environment. `run_check` reads two dumps' run manifests (run.json) and parameter
inventories and lists every difference ranked by how likely it changes the numbers; `values` reads
the runs, `run_check.SetupCheck` runs the check in parts (a compare checks each rank where it reads
it), `checker` and `setup_checks` make the findings, `ops` reads the dtypes ops computed in;
`semantics.yaml` holds the known semantic differences between the frameworks' APIs and optimizers.
`precdbg compare` runs the same check first.

Imports: precdbg.errors, precdbg.records, precdbg.storage
"""
from __future__ import annotations

from .run_check import (RankChecked, SetupCheck, check_dumps, check_main, check_rank,
                        format_check, incomplete_findings, step_optimizer_findings)
from .values import semantics

__all__ = ["check_dumps", "format_check", "check_main", "incomplete_findings", "semantics",
           "step_optimizer_findings", "SetupCheck", "RankChecked", "check_rank"]
