"""SIGTERM (or MindSpore's Ctrl-C, which its runtime turns into SIGTERM) while a stopped step is
still being written: training stops, the step is finished first, then the process ends by
SIGTERM with the status it would have had without precdbg. A second SIGTERM, or a writer that makes no progress,
ends it at once; a handler of the script's own and forked children are left alone. Real
processes, real signals, real step files (tests/sigterm_guide.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, Optional

import pytest

import precdbg
from precdbg.storage import process_exit as lifetime

from conftest import PYTHON, REPO, beyond_dumping_to

GUIDE = os.path.join(REPO, "tests", "sigterm_guide.py")
TIMEOUT = 240
WAITING = "precdbg: SIGTERM: training does not go on; writing the stopped steps"
GAVE_UP = "precdbg: SIGTERM: the writer made no progress"

pytestmark = pytest.mark.skipif(lifetime._termguard is None or not hasattr(signal, "SIGTERM"),
                                reason="precdbg.storage._termguard is not built here")


def _env(**extra: str) -> Dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOG_v="3", **extra)


def _run(tmp_path, framework: str, variant: str) -> subprocess.CompletedProcess:
    dump = str(tmp_path / "dump")
    try:
        return subprocess.run([PYTHON, GUIDE, framework, variant, dump], cwd=REPO, env=_env(),
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{variant}: hung; stderr: {exc.stderr!r}") from None


def _files(dump: str) -> List[str]:
    return sorted(os.path.relpath(os.path.join(root, name), dump)
                  for root, _, names in os.walk(dump) for name in names)


def _complete_step(dump: str) -> None:
    """The stopped step is on disk, whole: its tensors read back, no .partial anywhere."""
    assert _files(dump) == ["run.json", os.path.join("step0", "rank0.h5")], _files(dump)
    with precdbg.open_dump(dump) as opened:
        assert opened.steps == [0] and not opened.partial
        table = opened.records(step=0, rank=0)
        assert "param_grad" in set(table["kind"].tolist())
        assert not opened.warnings()


def _only_partial(dump: str) -> None:
    """The step that could not be finished stays a .partial, which is never read as a step."""
    assert _files(dump) == ["run.json", os.path.join("step0", "rank0.h5.partial")], _files(dump)
    with pytest.raises(precdbg.DumpError, match="no complete step files found"):
        precdbg.open_dump(dump)


@pytest.mark.parametrize("framework", ["torch", "mindspore"])
def test_sigterm_right_after_stop_waits_for_the_step(tmp_path, framework):
    """Without precdbg's handler the process died at once and left step0/rank0.h5.partial."""
    if framework == "mindspore":
        pytest.importorskip("mindspore")
    run = _run(tmp_path, framework, "self")
    assert run.returncode == -signal.SIGTERM, run.stderr[-2000:]
    assert "main done" not in run.stdout           # it did end: training did not go on
    assert WAITING in run.stderr, run.stderr[-2000:]
    _complete_step(str(tmp_path / "dump"))


def test_mindspore_ctrl_c_right_after_stop_keeps_the_step(tmp_path):
    """MindSpore's runtime answers SIGINT with SIGTERM: the stopped step is written first."""
    pytest.importorskip("mindspore")
    run = _run(tmp_path, "mindspore", "ctrl_c")
    assert run.returncode == -signal.SIGTERM, run.stderr[-2000:]
    _complete_step(str(tmp_path / "dump"))


def _start_hog(tmp_path, stall: Optional[float] = None) -> subprocess.Popen:
    extra = {} if stall is None else {"STALL": str(stall)}
    proc = subprocess.Popen([PYTHON, GUIDE, "torch", "hog", str(tmp_path / "dump")], cwd=REPO,
                            env=_env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "stopped", proc.stderr.read()
    # into the regex first: a SIGTERM while Python still runs parks the main thread, and the
    # writer then finishes the step (what the other tests check)
    time.sleep(0.3)
    return proc


def _finish(proc: subprocess.Popen, seconds: float) -> str:
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("still running: SIGTERM was deferred without end") from None
    return proc.stderr.read()


def test_second_sigterm_ends_the_process_at_once(tmp_path):
    """The main thread holds the GIL in C, so the writer cannot finish: the first SIGTERM
    waits (the process is still there a second later), the second ends it."""
    proc = _start_hog(tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    began = time.monotonic()
    stderr = _finish(proc, 30)
    assert alive and proc.returncode == -signal.SIGTERM, stderr
    assert time.monotonic() - began < 10
    assert WAITING in stderr and GAVE_UP not in stderr, stderr
    _only_partial(str(tmp_path / "dump"))


def test_sigterm_gives_up_on_a_writer_that_makes_no_progress(tmp_path):
    """A stalled writer (here: no GIL for it) cannot keep the process from ending: after the
    stall time without progress SIGTERM acts, and says so."""
    proc = _start_hog(tmp_path, stall=2.0)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stderr = _finish(proc, 60)
    assert proc.returncode == -signal.SIGTERM, stderr
    assert 1.5 < time.monotonic() - began < 30
    assert WAITING in stderr and GAVE_UP in stderr, stderr
    _only_partial(str(tmp_path / "dump"))


def test_a_scripts_own_sigterm_handler_is_left_alone(tmp_path):
    """The script's handler runs (sys.exit(7)): its exit code, the step written at exit."""
    run = _run(tmp_path, "torch", "handler")
    assert run.returncode == 7, run.stderr[-2000:]
    assert WAITING not in run.stderr
    _complete_step(str(tmp_path / "dump"))


def test_a_forked_child_takes_sigterm_as_default(tmp_path):
    """A child forked while the parent writes (a DataLoader worker) inherits the handler but
    not the watcher: SIGTERM ends it at once; the parent goes on and writes its step."""
    run = _run(tmp_path, "torch", "fork")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"child ended by signal {int(signal.SIGTERM)}" in run.stdout, run.stdout
    assert "main done" in run.stdout and WAITING not in run.stderr, run.stderr[-2000:]
    _complete_step(str(tmp_path / "dump"))


def test_sigterm_inside_a_capture_window_says_that_step_is_not_written(tmp_path):
    """A SIGTERM between start() and stop() parks training inside the capture and ends the
    process (nothing stopped waits; nothing runs to stop the capture): one line says that
    step is not written. (Every stage boundary, every way to end: tests/test_kill_stages.py.)"""
    run = _run(tmp_path, "torch", "inside")
    assert run.returncode == -signal.SIGTERM, run.stderr[-2000:]
    said = [line for line in beyond_dumping_to(run.stderr).splitlines()
            if line.startswith("precdbg:")]
    assert said == ["precdbg: SIGTERM while step 0 was being captured (start() ran, stop() "
                    "had not): it is not written (what was written of it stays a .partial, "
                    "which is never read as a step); the steps stopped before it are "
                    "written"], said
