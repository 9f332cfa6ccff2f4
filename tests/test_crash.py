"""kill -9 while a step is being written: every closed step stays readable, the unfinished one
is listed as partial and never opened."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest

import precdbg

from conftest import PYTHON, REPO, lines_until
from torch_support import TINY

SCRIPT = r"""
import sys, time
import torch
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

torch.manual_seed(0)
cfg = GPTConfig(**TINY)
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
batches = list(make_batches(cfg, batch_size=2, steps=5, seed=0))
dbg = PrecisionDebugger(task="tensor", dump_path=DUMP, step=[])
for i, (x, y) in enumerate(batches):
    dbg.start(model)
    if i == 4:
        print("running 4", flush=True)
        deadline = time.time() + 120
        while time.time() < deadline:       # keeps the step open (and writing) until killed
            train_step(model, opt, x, y)
        time.sleep(600)
    train_step(model, opt, x, y)
    dbg.stop()
    dbg.step()
    print(f"done {i}", flush=True)
"""


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_kill_9_loses_only_the_open_step(tmp_path):
    dump = str(tmp_path / "dump")
    script = tmp_path / "train.py"
    script.write_text(f"TINY = {TINY!r}\nDUMP = {dump!r}\n" + SCRIPT)
    proc = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        lines = lines_until(proc, "running 4", "training")
        assert lines == ["done 0", "done 1", "done 2", "done 3", "running 4"]
        # step 4 is open in the writer (its .partial exists): step 3 was closed before it
        partial = os.path.join(dump, "step4", "rank0.h5.partial")
        _wait_for(lambda: os.path.exists(partial), 30, partial)
        _wait_for(lambda: os.path.getsize(partial) > 0, 30, f"data in {partial}")
        time.sleep(0.3)                       # let step 4 write for a moment
        assert proc.poll() is None, "the training process is not running step 4 any more"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    d = precdbg.open_dump(dump)
    assert d.steps == [0, 1, 2, 3]
    assert d.ranks == [0]
    assert d.partial == [partial]
    assert all(not f.path.endswith(".partial") for f in d.files())
    assert d.run["config"]["task"] == "tensor"
    counts = []
    for step in range(4):
        t = d.records(step=step)
        assert len(t) > 0
        counts.append(len(t))
        n_params = np.count_nonzero(t["role"] == "param")
        assert n_params == 29
        assert np.count_nonzero(t["kind"] == "param_grad") == n_params
        logits = d.tensor("Module.GPT.forward.0.output.0", step=step)
        assert logits.shape == (2, 16, 128) and np.isfinite(logits).all()
    assert len(set(counts)) == 1              # every step the same calls
    with pytest.raises(precdbg.DumpError, match="incomplete"):
        precdbg.open_dump(partial)
    d.close()

    # the command line tool reports the same and names the skipped file
    result = subprocess.run([PYTHON, "-m", "precdbg", "inspect", dump], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "steps     [0, 1, 2, 3]" in result.stdout
    assert "incomplete (skipped)" in result.stdout and partial in result.stdout


EXIT_SCRIPT = r"""
import sys, torch
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

torch.manual_seed(0)
cfg = GPTConfig(**TINY)
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dbg = PrecisionDebugger(task="tensor", dump_path=DUMP)
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=3, seed=0)):
    dbg.start(model)
    train_step(model, opt, x, y)
    if i == 2 and MODE == "raise":
        raise RuntimeError("training failed in step 2")
    dbg.stop()
    dbg.step()
print("end", flush=True)      # no close(): the interpreter's exit must finish the files
"""


@pytest.mark.parametrize("mode", ["normal", "raise"])
def test_exit_without_close_writes_every_step(tmp_path, mode):
    dump = str(tmp_path / "dump")
    script = tmp_path / "train.py"
    script.write_text(f"TINY = {TINY!r}\nDUMP = {dump!r}\nMODE = {mode!r}\n" + EXIT_SCRIPT)
    result = subprocess.run([PYTHON, str(script)], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    if mode == "normal":
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert result.returncode == 1 and "training failed in step 2" in result.stderr
    d = precdbg.open_dump(dump)
    assert d.partial == []
    assert d.steps == [0, 1, 2]
    for step in d.steps:
        assert len(d.records(step=step)) > 0
        assert d.tensor("Module.GPT.forward.0.output.0", step=step).shape == (2, 16, 128)
