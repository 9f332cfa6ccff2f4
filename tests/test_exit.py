"""The guides' four lines, no close(), in real processes that end every way a training script
ends: each stopped step is complete on disk, nothing hangs, and the exit code is the script's.

Each variant runs PRECDBG_EXIT_REPEATS times (default 20), two processes at a time, because the
failure it guards against (the writer thread racing the interpreter's shutdown) was a race.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

import pytest

import precdbg
from precdbg.storage import rank_lock

from conftest import PYTHON, REPO

GUIDE = os.path.join(REPO, "tests", "exit_guide.py")
REPEATS = int(os.environ.get("PRECDBG_EXIT_REPEATS", "20"))
TIMEOUT = 240                       # seconds one run may take before it counts as a hang
CRASH_MARKS = ("Segmentation fault", "Fatal Python error", "precdbg: writing",
               "dropped:", "Failed to extract", "Operation not defined")


class Run:
    def __init__(self, rc: int, stdout: str, stderr: str, dump: str) -> None:
        self.rc, self.stdout, self.stderr, self.dump = rc, stdout, stderr, dump

    def __repr__(self) -> str:
        return f"rc={self.rc}\nstdout:\n{self.stdout[-1500:]}\nstderr:\n{self.stderr[-3000:]}"


def _config(folder: str, task: str) -> str:
    path = os.path.join(folder, "config.json")
    with open(path, "w") as handle:
        json.dump({"task": task, "level": "mix", "dump_path": os.path.join(folder, "dump")},
                  handle)
    return path


def _env() -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                GLOG_v="3")          # MindSpore: errors only


def run_guide(folder: str, framework: str, variant: str, task: str = "statistics",
              command: Optional[List[str]] = None) -> Run:
    os.makedirs(folder, exist_ok=True)
    config = _config(folder, task)
    argv = (command or [PYTHON]) + [GUIDE, framework, variant, config]
    try:
        proc = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{framework} {variant}: hung (no exit in {TIMEOUT} s); stderr: "
                             f"{(exc.stderr or b'')[-2000:]!r}") from None
    return Run(proc.returncode, proc.stdout, proc.stderr, os.path.join(folder, "dump"))


def partial_files(dump: str) -> List[str]:
    found = []
    for root, _, files in os.walk(dump):
        found.extend(os.path.join(root, f) for f in files if f.endswith(".partial"))
    return found


def check_dump(run: Run, steps: Sequence[int], ranks: Sequence[int] = (0,),
               interrupted: Sequence[int] = ()) -> None:
    """Every expected step file is there, complete and readable; nothing else is."""
    assert not partial_files(run.dump), (partial_files(run.dump), run)
    for mark in CRASH_MARKS:
        assert mark not in run.stderr, (mark, run)
    with precdbg.open_dump(run.dump) as dump:
        assert dump.steps == list(steps), (dump.steps, run)
        assert dump.ranks == list(ranks), (dump.ranks, run)
        for step in steps:
            for rank in ranks:
                table = dump.records(step=step, rank=rank)
                assert len(table) > 100, (step, rank, len(table), run)
                if step not in interrupted:     # a whole step: forward, backward and dw
                    assert "param_grad" in set(table["kind"].tolist()), (step, run)
        warned = [w for w in dump.warnings()]
        assert len(warned) == len(interrupted) * len(ranks), (warned, run)
        assert all("interrupted" in w for w in warned), (warned, run)


def repeat(tmp_path, name: str, once) -> None:
    """Run `once(folder)` REPEATS times, two at a time; the first failure fails the test."""
    folders = [str(tmp_path / f"{name}{i}") for i in range(REPEATS)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(once, folder) for folder in folders]:
            future.result()


# --------------------------------------------------------------------------- variants
def _local(framework: str):
    def once(folder: str) -> None:
        run = run_guide(folder, framework, "local")
        assert run.rc == 0, run
        assert run.stdout.splitlines()[-1] == "main done", run
        check_dump(run, steps=[0, 1])
    return once


def _sys_exit(framework: str):
    def once(folder: str) -> None:
        run = run_guide(folder, framework, "sys_exit")
        assert run.rc == 3, run
        check_dump(run, steps=[0, 1, 2], interrupted=[2])
        assert "Traceback" not in run.stderr, run
    return once


def _exception(framework: str):
    def once(folder: str) -> None:
        run = run_guide(folder, framework, "exception")
        assert run.rc == 1, run
        # Python's own traceback, of the user's error
        assert "Traceback (most recent call last)" in run.stderr, run
        assert "RuntimeError: boom in forward" in run.stderr.splitlines(), run
        check_dump(run, steps=[0, 1, 2], interrupted=[2])
    return once


def check_killed(dump: str) -> List[int]:
    """A process ended by a signal that Python never saw: the steps written before it are
    complete and readable, from step 0 on; a .partial is listed as incomplete, never a step."""
    with precdbg.open_dump(dump) as opened:
        steps = opened.steps
        assert steps[0] == 0 and steps == list(range(len(steps))), steps
        for step in steps:
            table = opened.records(step=step, rank=0)
            assert "param_grad" in set(table["kind"].tolist())
        for path in opened.partial:
            assert path.endswith(".partial")
            assert int(os.path.basename(os.path.dirname(path))[4:]) not in steps
        assert not opened.warnings()
    return steps


def _keyboard_interrupt(framework: str):
    def once(folder: str) -> None:
        run = run_guide(folder, framework, "keyboard_interrupt")
        if framework == "mindspore":
            # MindSpore's runtime installs its own SIGINT handler (in C++), which ends the
            # process with SIGTERM: no Python code runs, as for a scheduler's SIGTERM
            assert run.rc == -signal.SIGTERM, run
            assert "stopped 1" in run.stdout.splitlines(), run
            assert check_killed(run.dump) in ([0], [0, 1]), run
            return
        # Python ends an uncaught KeyboardInterrupt by re-raising SIGINT
        assert run.rc in (-signal.SIGINT, 128 + signal.SIGINT), run
        assert "KeyboardInterrupt" in run.stderr, run
        check_dump(run, steps=[0, 1, 2], interrupted=[2])
    return once


def _every_step_written(variant: str, rc: int):
    """A variant that ends the process after its last stop() with `rc`: every step whole."""
    def variant_for(framework: str):
        def once(folder: str) -> None:
            run = run_guide(folder, framework, variant, task="tensor")
            assert run.rc == rc, run
            check_dump(run, steps=[0, 1, 2])
            # the rank's lock file goes with the process (os._exit runs no exit handler)
            assert not os.path.exists(rank_lock.lock_path(os.path.abspath(run.dump), 0)), run
        return once
    return variant_for


_gc_exit = _every_step_written("gc_exit", 0)
_os_exit = _every_step_written("os_exit", 5)     # os._exit(5) runs no shutdown hook


def _gc_retire(framework: str):
    def once(folder: str) -> None:
        run = run_guide(folder, framework, "gc_retire", task="tensor")
        assert run.rc == 0, run
        assert "writer alive after gc: False" in run.stdout, run
        check_dump(run, steps=[0, 1, 2])
    return once


VARIANTS = {"local": _local, "sys_exit": _sys_exit, "exception": _exception,
            "keyboard_interrupt": _keyboard_interrupt, "gc_exit": _gc_exit,
            "gc_retire": _gc_retire, "os_exit": _os_exit}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_torch_guide_pattern_exits_cleanly(tmp_path, variant):
    repeat(tmp_path, variant, VARIANTS[variant]("torch"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mindspore_guide_pattern_exits_cleanly(tmp_path, variant):
    pytest.importorskip("mindspore")
    repeat(tmp_path, variant, VARIANTS[variant]("mindspore"))


def _rank_logs(log_dir: str, limit: int = 4000) -> str:
    """The end of every rank's own stdout and stderr (torchrun's summary of a failed rank keeps
    little of them: how a rank died, e.g. a fatal error's stack, is in these files)."""
    parts = []
    for root, _, files in sorted(os.walk(log_dir)):
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, "r", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
            if text.strip():
                parts.append(f"--- {os.path.relpath(path, log_dir)}\n{text[-limit:]}")
    return "\n".join(parts)


def test_torchrun_two_ranks_without_close(tmp_path):
    def once(folder: str) -> None:
        log_dir = os.path.join(folder, "rank_logs")
        run = run_guide(folder, "torch", "torchrun", command=[
            PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "--log-dir", log_dir, "--tee", "3", "--no-python", PYTHON])
        assert run.rc == 0, f"{run}\nranks' own output:\n{_rank_logs(log_dir)}"
        check_dump(run, steps=[0, 1], ranks=[0, 1])
    repeat(tmp_path, "torchrun", once)


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs SIGTERM")
def test_sigterm_keeps_every_written_step_readable(tmp_path):
    """What a job scheduler sends first, at any moment of a loop that dumps every step: the
    process ends by SIGTERM (after the steps stopped before it are written: tests/
    test_sigterm.py); every step file is complete, a step being captured stays a .partial the
    reader skips."""
    def once(folder: str) -> None:
        os.makedirs(folder)
        config = _config(folder, "statistics")
        dump = os.path.join(folder, "dump")
        proc = subprocess.Popen([PYTHON, GUIDE, "torch", "sigterm", config], cwd=REPO,
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.time() + TIMEOUT
            while time.time() < deadline:
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError(f"ended early: {proc.wait()} {proc.stderr.read()}")
                iteration = int(line.split()[-1]) if line.startswith("stopped ") else -1
                if iteration >= 3 and os.path.exists(os.path.join(dump, "step0", "rank0.h5")):
                    break
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == -signal.SIGTERM
        assert check_killed(dump)
    repeat(tmp_path, "sigterm", once)


MP_CHILDREN = r"""
import multiprocessing as mp, sys

def work(path):
    import torch
    from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
    from precdbg_pt import PrecisionDebugger
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=8, vocab_size=64)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(task="tensor", dump_path=path)
    for x, y in make_batches(cfg, batch_size=2, steps=3, seed=0):
        debugger.start(model); train_step(model, opt, x, y); debugger.stop(); debugger.step()

if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    children = [ctx.Process(target=work, args=(f"{sys.argv[2]}/dump{r}",)) for r in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    sys.exit(max(child.exitcode for child in children))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_children_write_every_step(tmp_path, method):
    """Training in multiprocessing children (which end through multiprocessing's own exit
    path, `os._exit` after `threading._shutdown`): every child's steps are complete."""
    script = tmp_path / "mp_train.py"
    script.write_text(MP_CHILDREN)
    proc = subprocess.run([PYTHON, str(script), method, str(tmp_path)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for child in range(2):
        run = Run(proc.returncode, proc.stdout, proc.stderr, str(tmp_path / f"dump{child}"))
        check_dump(run, steps=[0, 1, 2])


FORKED_CHILDREN = """
import os, sys
import torch
from precdbg_pt import PrecisionDebugger

model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
debugger = PrecisionDebugger(task="tensor", dump_path=sys.argv[1], step=[])
for _ in range(3):
    debugger.start(model)
    model(torch.randn(128, 1024)).sum().backward()
    debugger.stop(); debugger.step()
    pid = os.fork()          # while the writer still writes the step (~30 MB): the child ends
    if pid == 0:             # normally, and HDF5 closes the file it inherited open
        sys.exit(0)
    os.waitpid(pid, 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_ending_normally_leaves_the_parents_steps_intact(tmp_path):
    """A child forked while a step file is being written ends through Python's normal exit,
    where HDF5 closes the file the child inherited open: what it flushes must not reach the
    parent's file (it did: a stopped step unreadable, one run in three)."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED_CHILDREN)
    for attempt in range(2):
        path = tmp_path / f"dump{attempt}"
        proc = subprocess.run([PYTHON, str(script), str(path)], cwd=REPO, env=_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not partial_files(str(path)), proc.stderr[-3000:]
        with precdbg.open_dump(str(path)) as dump:
            assert dump.steps == [0, 1, 2] and not dump.warnings(), proc.stderr[-3000:]
            for step in dump.steps:
                table = dump.records(step=step)
                assert "param_grad" in set(table["kind"].tolist()), (step, proc.stderr[-3000:])
                assert (table["data_offset"] >= 0).sum() > 10


TWO_JOBS = """
import sys, time
import torch
from precdbg_pt import PrecisionDebugger

width = int(sys.argv[2])                 # the two jobs train models of different widths
model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
debugger = PrecisionDebugger(dump_path=sys.argv[1], step=[])
while time.time() < float(sys.argv[3]):  # both constructed before either starts
    time.sleep(0.005)
for _ in range(3):
    debugger.start(model)
    model(torch.randn(4, 8)).sum().backward()
    debugger.stop(); debugger.step()
debugger.close()
print("failures", debugger.failures)
"""


def test_two_jobs_started_together_into_one_folder_never_mix_their_steps(tmp_path):
    """Two single-process runs writing rank 0 into one folder at the same moment, before either
    wrote a file the other could see: one dumps, the other dumps nothing and says why in one
    line; no step holds records of both models, nothing is corrupt."""
    script = tmp_path / "job.py"
    script.write_text(TWO_JOBS)
    folder = str(tmp_path / "shared")
    for attempt in range(3):
        shutil.rmtree(folder, ignore_errors=True)
        at = str(time.time() + 6.0)
        jobs = [subprocess.Popen([PYTHON, str(script), folder, width, at], cwd=REPO, env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for width in ("16", "32")]
        outs = [job.communicate(timeout=TIMEOUT) for job in jobs]
        assert [job.returncode for job in jobs] == [0, 0], outs
        refused = [err for _, err in outs if "another process is writing rank 0" in err]
        assert len(refused) == 1, outs
        assert not os.path.exists(rank_lock.lock_path(os.path.abspath(folder), 0))
        with precdbg.open_dump(folder) as dump:
            assert dump.steps == [0, 1, 2] and not dump.warnings()
            for step in dump.steps:
                assert len(dump.files(step=step)) == 1
                widths = {shape[0] for shape in dump.records(step=step)["shape"][:, :1].tolist()
                          if shape[0] in (16, 32)}
                assert len(widths) == 1, (step, widths)


NOTHING_DUMPED = """
import json, os, sys
import torch
from precdbg_pt import PrecisionDebugger

def main(folder, dump_step, config_steps):
    config = os.path.join(folder, "config.json")
    with open(config, "w") as handle:
        json.dump({"task": "statistics", "level": "mix", "dump_path": os.path.join(folder, "dump"),
                   "step": config_steps}, handle)
    debugger = PrecisionDebugger(config_path=config)     # a local of main(), no close()
    model = torch.nn.Linear(4, 4)
    for iteration in range(3):
        dumped = iteration in dump_step if isinstance(dump_step, list) else \
            dump_step < 0 or iteration == dump_step          # -1: every iteration
        if dumped:
            debugger.start(model)
        model(torch.ones(2, 4)).sum().backward()
        if dumped:
            debugger.stop()
            debugger.step()

main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]))
print("trained")
sys.exit(3)
"""


@pytest.mark.parametrize("dump_step, config_steps, ran", [
    (1, [1], "step 0"), (-1, [10], "3 steps (0 to 2)"), (1, [0], None), (1, [], None)])
def test_guide_pattern_that_dumps_nothing_says_why(tmp_path, dump_step, config_steps, ran):
    """The guides' pattern calls step() on the dumped iteration only, so the step counter
    counts dumped iterations: with config step [1] and the dump at iteration 1, start() runs
    on step 0 and nothing is written. The process says so in one line (and exits with its own
    code); when a step is written, or every step is selected, it says nothing."""
    script = tmp_path / "nothing.py"
    script.write_text(NOTHING_DUMPED)
    proc = subprocess.run([PYTHON, str(script), str(tmp_path), json.dumps(dump_step),
                           json.dumps(config_steps)],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 3 and "trained" in proc.stdout, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "nothing was dumped" in line]
    if ran:
        assert said == [f"precdbg: nothing was dumped: start() ran on {ran} only, and config "
                        f"step is {config_steps}; steps are counted by debugger.step() calls "
                        "from 0 (call step() after every training iteration, or list the steps "
                        "start() runs on)"], proc.stderr[-3000:]
        assert not os.path.exists(tmp_path / "dump" / "step0")
    else:
        assert said == [], proc.stderr[-3000:]
        assert os.path.exists(tmp_path / "dump" / "step0")
        assert "were not dumped" not in proc.stderr, proc.stderr[-3000:]


def test_guide_pattern_that_dumps_some_listed_steps_says_which_it_missed(tmp_path):
    """Config step [0, 2], the four lines on iterations 0 and 2 only: step() ran once before
    iteration 2, which is step 1 and not dumped. The step written is kept, and one line says
    which listed steps were not dumped and why."""
    script = tmp_path / "nothing.py"
    script.write_text(NOTHING_DUMPED)
    proc = subprocess.run([PYTHON, str(script), str(tmp_path), "[0, 2]", "[0, 2]"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 3 and "trained" in proc.stdout, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "were not dumped" in line]
    assert said == ["precdbg: config step is [0, 2], and steps [2] were not dumped: the step "
                    "count reached 1 (start() also ran on step 1, which the config leaves out); "
                    "if training went further, note that steps are counted by debugger.step() "
                    "calls from 0 (call step() after every training iteration, or list the "
                    "steps start() runs on)"], proc.stderr[-3000:]
    assert os.path.exists(tmp_path / "dump" / "step0")


def test_compare_names_the_compared_steps_that_are_incomplete(tmp_path):
    """A step the process ended in (an exception between start() and stop()) is written,
    marked interrupted: compare says so first, for each side, of the steps it compares (a
    verdict speaks only for what they hold), and says nothing of whole steps."""
    from precdbg.compare import compare_dumps
    from precdbg.compare.report.formats import summary_text

    run = run_guide(str(tmp_path / "run"), "torch", "exception")
    assert run.rc == 1, run
    result = compare_dumps(run.dump, run.dump)
    incomplete = [f for f in result["setup"] if f["kind"] == "incomplete"]
    assert [f["message"] for f in incomplete] == [
        f"{side}: step 2 rank 0: interrupted (the process ended before stop()); the step is "
        "incomplete; only what it holds is compared" for side in ("baseline", "candidate")]
    assert result["setup"][:2] == incomplete and f"setup: [high] {incomplete[0]['message']}" \
        in summary_text(result)
    whole = compare_dumps(run.dump, run.dump, step=1)
    assert not [f for f in whole["setup"] if f["kind"] == "incomplete"], whole["setup"]
