"""A training process ended at every stage boundary of a dumped step, each way it ends: SIGKILL,
SIGTERM, an exception (or Ctrl-C), and a peer rank's death under torchrun (issue 51, items 1-2).
Real processes, real signals, real step files (tests/stage_guide.py; the checks are
tests/stage_support.py's):

- after SIGTERM no user code runs beyond the statement in progress (no optimizer step, no next
  iteration), the process ends by SIGTERM, and every step stopped before it is complete;
- a step is said written only once it is renamed and fsynced, and every step stop() returned
  from is on disk, however the process ended (SIGKILL aside, which leaves only renamed steps,
  each readable);
- every precdbg line on stderr is true of the disk.

One run per kind and stage here (PRECDBG_STAGE_REPEATS runs more);
scripts/kill_stages.py measures 20 of each.
"""
from __future__ import annotations

import os
import signal

import pytest

from precdbg.storage import process_exit

import stage_support

REPEATS = int(os.environ.get("PRECDBG_STAGE_REPEATS", "1"))


def _check(tmp_path, kind: str, stage: str) -> None:
    problems = []
    for i in range(REPEATS):
        problems += stage_support.run_once(kind, stage, str(tmp_path / f"run{i}"))
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(process_exit._termguard is None or not hasattr(signal, "SIGTERM"),
                    reason="precdbg.storage._termguard is not built here")
@pytest.mark.parametrize("stage", stage_support.STAGES + stage_support.LOCKED_STAGES)
def test_sigterm_at_every_stage(tmp_path, stage):
    _check(tmp_path, "sigterm", stage)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("stage", stage_support.STAGES + stage_support.LOCKED_STAGES)
def test_sigkill_at_every_stage(tmp_path, stage):
    _check(tmp_path, "sigkill", stage)


@pytest.mark.parametrize("stage", stage_support.STAGES + stage_support.LOCKED_STAGES)
def test_exception_at_every_stage(tmp_path, stage):
    _check(tmp_path, "exception", stage)


@pytest.mark.parametrize("stage", stage_support.STAGES + stage_support.LOCKED_STAGES)
def test_peer_rank_killed_at_every_stage(tmp_path, stage):
    pytest.importorskip("torch.distributed")
    _check(tmp_path, "peer", stage)
