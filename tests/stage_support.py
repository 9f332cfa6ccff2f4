"""Run tests/stage_guide.py once (a process, or torchrun's ranks) and say what it did wrong:
steps announced or stopped that are not complete on disk, a stderr line that is not true, user
code that ran after a SIGTERM, a wrong exit. Used by tests/test_kill_stages.py (a sample) and
scripts/kill_stages.py (the measurement, >= 20 runs per kind and stage)."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
from typing import Dict, List, Tuple

import precdbg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
GUIDE = os.path.join(REPO, "tests", "stage_guide.py")
KINDS = ("sigterm", "sigkill", "exception", "peer")
STAGES = ("start", "capture", "stop_before", "stop_after", "writing", "renaming", "after_step")
LOCKED_STAGES = ("queue",)          # inside the writer's lock: SIGTERM must not park there
AT = 1                              # the guide's iteration (and step) of the stage
WRITER_STAGES = ("writing", "renaming")
HANDED_OVER = ("stop_before", "stop_after", "writing", "renaming", "after_step")
TIMEOUT = 180

WRITTEN = re.compile(r"^precdbg: step (\d+) \(interrupted\) is written: (.+)$")
CAPTURED = re.compile(r"^precdbg: SIGTERM while step (\d+) was being captured")
STOPPED_WRITTEN = "the steps stopped before it are written"
BAD = ("made no progress", "dropped: writing", "failed (", "Fatal Python error",
       "Segmentation fault")


def _env() -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO, PYTHONFAULTHANDLER="1")


def run_once(kind: str, stage: str, folder: str) -> List[str]:
    """Run the guide once in `folder`; the problems found (empty: every claim held)."""
    os.makedirs(folder, exist_ok=True)
    dump = os.path.join(folder, "dump")
    if kind == "peer":
        logs = os.path.join(folder, "logs")
        argv = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--log-dir", logs, "--redirects", "3", "--no-python", PYTHON, GUIDE, kind,
                stage, dump]
    else:
        argv = [PYTHON, GUIDE, kind, stage, dump]
    try:
        proc = subprocess.run(argv, cwd=folder, env=_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return [f"hung: no end in {TIMEOUT} s"]
    if kind == "peer":
        ranks = {rank: _rank_output(logs, rank) for rank in (0, 1)}
        problems = _check_peer(ranks, dump)
    else:
        problems = _check_single(kind, stage, proc.returncode, proc.stdout, proc.stderr, dump)
    return [f"{kind} {stage}: {p}" for p in problems] + (
        [f"  stdout: {proc.stdout[-600:]!r}\n  stderr: {proc.stderr[-1500:]!r}"]
        if problems else [])


def _rank_output(logs: str, rank: int) -> Tuple[str, str]:
    texts = []
    for name in ("stdout.log", "stderr.log"):
        found = glob.glob(os.path.join(logs, "**", str(rank), name), recursive=True)
        texts.append(open(found[0], encoding="utf-8", errors="replace").read()
                     if found else "")
    return texts[0], texts[1]


def _events(stdout: str) -> List[str]:
    return [line.strip() for line in stdout.splitlines() if line.strip()]


def _stopped(events: List[str]) -> List[int]:
    return [int(e.split()[1]) for e in events if e.startswith("stopped ")]


def _step_file(dump: str, step: int, rank: int) -> str:
    return os.path.join(dump, f"step{step}", f"rank{rank}.h5")


def _readable(dump: str) -> Tuple[List[str], Dict[Tuple[int, int], bool]]:
    """Every complete step file reads; (problems, {(step, rank): has its dw})."""
    finals = glob.glob(os.path.join(dump, "step*", "rank*.h5"))
    if not finals:
        return [], {}
    problems, whole = [], {}
    try:
        with precdbg.open_dump(dump) as opened:
            for step in opened.steps:
                for rank in opened.ranks:
                    if not os.path.exists(_step_file(dump, step, rank)):
                        continue
                    table = opened.records(step=step, rank=rank)
                    # (a Ctrl-C inside start() may leave an interrupted step with no records)
                    if len(table) == 0 and not any(f"step {step}" in w and "interrupted" in w
                                                   for w in opened.warnings()):
                        problems.append(f"step {step} rank {rank}: no records")
                    whole[(step, rank)] = "param_grad" in set(table["kind"].tolist())
    except Exception as exc:  # noqa: BLE001 - any failure to read is what is measured
        problems.append(f"the dump does not read: {type(exc).__name__}: {exc}")
    return problems, whole


def _lines_true(stderr: str, events: List[str], dump: str, rank: int) -> List[str]:
    """Each precdbg line of this rank against the disk."""
    problems = []
    lines = [line for line in stderr.splitlines() if line.startswith("precdbg: ")]
    for line in lines:
        said = WRITTEN.match(line)
        if said and not os.path.exists(said.group(2)):
            problems.append(f"said written, missing: {line}")
        if any(word in line for word in BAD):
            problems.append(f"unexpected: {line}")
        captured = CAPTURED.match(line)
        if captured:
            if os.path.exists(_step_file(dump, int(captured.group(1)), rank)):
                problems.append(f"said not written, but it is: {line}")
            if STOPPED_WRITTEN in line:
                missing = [s for s in _stopped(events)
                           if not os.path.exists(_step_file(dump, s, rank))]
                if missing:
                    problems.append(f"said stopped steps written, missing {missing}")
    for stopped in _stopped(events):       # a step stop() returned from is never lost
        if not os.path.exists(_step_file(dump, stopped, rank)):
            problems.append(f"step {stopped} was stopped and is not on disk")
    return problems


def _check_single(kind: str, stage: str, rc: int, stdout: str, stderr: str,
                  dump: str) -> List[str]:
    events = _events(stdout)
    problems: List[str] = []
    if f"fired {stage}" not in events:
        return [f"the stage was never reached (rc {rc})"]
    expected = {"sigkill": (-signal.SIGKILL,), "sigterm": (-signal.SIGTERM,),
                "exception": (1, -signal.SIGINT)}[kind]
    if rc not in expected:
        problems.append(f"exit {rc}, expected one of {expected}")
    unreadable, whole = _readable(dump)
    problems += unreadable
    if kind == "sigkill":
        return problems + [f"line after SIGKILL: {line}" for line in stderr.splitlines()
                           if line.startswith("precdbg: ") and "dumping to" not in line]
    problems += _lines_true(stderr, events, dump, 0)
    after = events[events.index(f"fired {stage}") + 1:]
    if kind == "sigterm":
        ran = [e for e in after if e.split()[0] in ("iter", "optimizer", "stopped")]
        if len(ran) > (1 if stage in WRITER_STAGES else 0):   # the writer's: one in progress
            problems.append(f"user code ran after SIGTERM: {ran}")
        step_at = os.path.exists(_step_file(dump, AT, 0))
        if stage in HANDED_OVER and not step_at:
            problems.append(f"step {AT} was handed over before SIGTERM and is not written")
        if stage in ("start", "capture"):
            if step_at:
                problems.append(f"step {AT} was being captured and is written")
            if not any(CAPTURED.match(line) and int(CAPTURED.match(line).group(1)) == AT
                       for line in stderr.splitlines()):
                problems.append("no line says the captured step is not written")
    if kind == "exception":
        for step in range(AT):
            if not whole.get((step, 0)):
                problems.append(f"step {step} is not whole on disk")
        if stage != "start" and not os.path.exists(_step_file(dump, AT, 0)):
            problems.append(f"step {AT} is not on disk after the exception")
    return problems


def _check_peer(ranks: Dict[int, Tuple[str, str]], dump: str) -> List[str]:
    """Rank 1 killed itself; rank 0 ended as torchrun or the dead peer made it."""
    stdout1 = ranks[1][0]
    if not any(e.startswith("fired ") for e in _events(stdout1)):
        return ["rank 1 never reached the stage"]
    problems, _ = _readable(dump)
    stdout0, stderr0 = ranks[0]
    problems += _lines_true(stderr0, _events(stdout0), dump, 0)
    return problems


def run_many(kind: str, stage: str, repeats: int, root: str,
             workers: int = 1) -> Tuple[int, List[str]]:
    """`repeats` runs, `workers` at a time: (runs with a problem, their problems)."""
    import concurrent.futures
    folders = [os.path.join(root, f"{kind}-{stage}-{i}") for i in range(repeats)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda f: run_once(kind, stage, f), folders))
    failed = [r for r in results if r]
    return len(failed), [line for r in failed for line in r]


