"""A rerun into the same dump folder keeps the earlier run (moved to `<dump>/previous/<when>/`)
and writes the new one; a move cut short leaves two readable dumps and is finished by the next
run; two jobs writing one folder at the same time are refused; the ranks of one job still share
one folder; and each process says once where its dump goes (docs/lifecycle.md)."""
from __future__ import annotations

import errno
import os
import subprocess
import time
from typing import Dict, List

import pytest

import precdbg
from precdbg.storage import dump_folder, earlier_run, rank_lock
from precdbg.storage.layout import PREVIOUS

from conftest import DUMPING_TO, PYTHON, REPO, run_python, run_ranks

# the guides' pattern, twice in one process (two debuggers, two steps each: steps 0 to 3);
# `hold`: the job goes on after dumping (its rank lock held) until a line comes on stdin
SCRIPT = """
import sys, torch
from precdbg_pt import PrecisionDebugger
dump_path, scale, hold = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "hold"
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
with torch.no_grad():
    model.weight.mul_(scale)
for _ in range(2):
    debugger = PrecisionDebugger(dump_path=dump_path, level="mix")
    for step in range(2):
        debugger.start(model)
        model(torch.ones(3, 4)).sum().backward()
        debugger.stop()
        debugger.step()
    debugger.close()
print("trained", flush=True)
if hold:
    sys.stdin.readline()
"""

RANKS = """
import torch, torch.distributed as dist
from precdbg_pt import PrecisionDebugger
dist.init_process_group("gloo")
model = torch.nn.Linear(4, 2)
debugger = PrecisionDebugger(dump_path=DUMP, level="mix")
debugger.start(model)
model(torch.ones(2, 4)).sum().backward()
dist.all_reduce(model.weight.grad)
debugger.stop()
debugger.step()
debugger.close()
dist.barrier()
dist.destroy_process_group()
"""


def _run(dump: str, scale: float = 1.0) -> subprocess.CompletedProcess:
    done = run_python(["-c", SCRIPT, dump, str(scale), "-"], timeout=300)
    assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
    return done


def _files(root: str) -> Dict[str, bytes]:
    """Every file of a dump (run.json, step files) by its path in the dump, with its bytes;
    earlier runs moved aside are not part of it."""
    out = {}
    for folder, names, files in os.walk(root):
        names[:] = [n for n in names if n != PREVIOUS]
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


def _lines(stderr: str, start: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith(start)]


def _after_the_last_write(dump: str) -> None:
    """Wait until a new process starts later than the dump's files by more than the mtime
    allowance of their file system (2 s where it keeps whole seconds)."""
    whole = os.stat(os.path.join(dump, "run.json")).st_mtime_ns % 1_000_000_000 == 0
    time.sleep(3.0 if whole else 0.1)


def test_a_rerun_keeps_the_earlier_run_and_writes_the_new_one(tmp_path):
    dump = str(tmp_path / "dump")
    first = _run(dump)
    said = _lines(first.stderr, DUMPING_TO)           # once, with two debuggers and 4 steps
    assert len(said) == 1 and said[0].startswith(f"{DUMPING_TO}{dump} ("), first.stderr
    assert not _lines(first.stderr, "precdbg: dump_path")
    earlier = _files(dump)
    assert "run.json" in earlier and len(earlier) == 5
    kept: List[str] = []
    for scale in (2.0, 3.0):
        _after_the_last_write(dump)
        again = _run(dump, scale)
        previous = sorted(os.listdir(os.path.join(dump, PREVIOUS)))
        assert len(previous) == len(kept) + 1, previous
        moved_to = os.path.join(dump, PREVIOUS, [p for p in previous if p not in kept][0])
        kept = previous
        # one line names the folder, where the earlier run went and where this one goes
        moved = _lines(again.stderr, "precdbg: dump_path")
        assert len(moved) == 1 and moved_to in moved[0] and moved[0].endswith(dump), moved
        assert len(_lines(again.stderr, DUMPING_TO)) == 1
        # the earlier run whole, byte for byte, in a dump of its own; the new run in `dump`
        assert _files(moved_to) == earlier
        earlier = _files(dump)
        assert sorted(earlier) == sorted(_files(moved_to))
        with precdbg.open_dump(dump) as new, precdbg.open_dump(moved_to) as old:
            assert new.steps == old.steps == [0, 1, 2, 3]
    # the commands take the folder itself (the latest run) and an earlier run alike
    inspected = run_python(["-m", "precdbg", "inspect", dump], timeout=120)
    assert inspected.returncode == 0, inspected.stderr
    compared = run_python(["-m", "precdbg", "compare", dump,
                           os.path.join(dump, PREVIOUS, kept[0])], timeout=300)
    assert compared.returncode == 1, compared.stdout[-2000:] + compared.stderr   # weights x3


def test_a_second_job_writing_the_folder_is_refused(tmp_path):
    """A job still running (its rank lock held) wrote the folder: a second one is refused
    when its debugger is made, in one line naming the lock, and moves nothing; once the first
    job has ended, the same command just works."""
    dump = str(tmp_path / "dump")
    holder = subprocess.Popen([PYTHON, "-c", SCRIPT, dump, "1.0", "hold"], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "trained", holder.stderr.read()
        written = _files(dump)
        _after_the_last_write(dump)
        second = run_python(["-c", SCRIPT, dump, "2.0", "-"], timeout=300)
        assert second.returncode == 1 and "trained" not in second.stdout, second.stderr
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith("precdbg: dump_path: ") and "Traceback" not in second.stderr and \
            rank_lock.lock_path(dump, 0) in last, second.stderr
        assert _files(dump) == written and not os.path.exists(os.path.join(dump, PREVIOUS))
    finally:
        holder.communicate("\n", timeout=120)
    assert holder.returncode == 0
    _run(dump, 2.0)
    assert [_files(p) for p in (os.path.join(dump, PREVIOUS, n)
                                for n in os.listdir(os.path.join(dump, PREVIOUS)))] == [written]


def test_a_move_cut_short_leaves_two_readable_dumps_and_the_next_run_finishes_it(
        tmp_path, monkeypatch):
    dump = str(tmp_path / "dump")
    _run(dump)
    earlier = _files(dump)
    # the dump is an earlier run's for this process too
    monkeypatch.setattr(dump_folder, "_process_started", lambda: time.time() + 60)
    real_rename, renamed = os.rename, []

    def cut_short(source: str, target: str) -> None:
        if len(renamed) == 2:
            raise OSError(errno.EIO, "cut short")
        renamed.append(source)
        real_rename(source, target)

    monkeypatch.setattr(earlier_run.os, "rename", cut_short)
    with pytest.raises(precdbg.ConfigError):
        earlier_run.move_earlier_run(dump)
    monkeypatch.setattr(earlier_run.os, "rename", real_rename)
    (target,) = [os.path.join(dump, PREVIOUS, n) for n in os.listdir(os.path.join(dump,
                                                                                 PREVIOUS))]
    # two readable dumps, each with run.json, each step whole in one of them, nothing lost
    here, there = _files(dump), _files(target)
    assert here["run.json"] == there["run.json"] == earlier["run.json"]
    assert {**here, **there} == earlier and len(here) + len(there) == len(earlier) + 1
    with precdbg.open_dump(dump) as rest, precdbg.open_dump(target) as moved:
        assert rest.steps == [2, 3] and moved.steps == [0, 1]
        assert len(rest.records(step=2)) == len(moved.records(step=0)) > 0
    # the next run finishes the move into the same folder
    assert earlier_run.move_earlier_run(dump) == target
    assert _files(target) == earlier and _files(dump) == {}


def test_the_ranks_of_one_job_share_the_folder_on_a_rerun(tmp_path):
    """Two ranks over gloo, run twice into one folder: the second job's ranks move the first
    job's dump once (one of them says so) and both write their files beside each other."""
    dump = str(tmp_path / "dump")
    script = tmp_path / "ranks.py"
    script.write_text(f"DUMP = {dump!r}\n" + RANKS)
    first = run_ranks(str(script))
    earlier = _files(dump)
    assert sorted(earlier) == ["run.json", os.path.join("step0", "rank0.h5"),
                               os.path.join("step0", "rank1.h5")]
    assert all(len(_lines(err, DUMPING_TO)) == 1 for _, err in first)
    _after_the_last_write(dump)
    second = run_ranks(str(script))
    assert sum(len(_lines(err, "precdbg: dump_path")) for _, err in second) == 1, second
    (moved,) = os.listdir(os.path.join(dump, PREVIOUS))
    assert _files(os.path.join(dump, PREVIOUS, moved)) == earlier
    with precdbg.open_dump(dump) as new:
        assert new.steps == [0] and new.ranks == [0, 1]
