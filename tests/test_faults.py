"""Failures inside precdbg, made to happen for real: each is counted in `debugger.failures`,
reported once on stderr in one line naming the step and the stage, leaves the debugger usable
for the next selected step, and never stops training, loses a written step or leaves a
`.partial` behind."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import textwrap
from typing import List

import pytest
import torch
from torch import nn

import precdbg

from conftest import DUMPING_TO, PYTHON, REPO, beyond_dumping_to
from torch_support import make_batch_list, make_model, make_optimizer, run_steps, torch_hooks_left
from precdbg_pt import PrecisionDebugger
from precdbg_pt import tensors as precdbg_tensors


def precdbg_lines(stderr: str) -> List[str]:
    return [line for line in beyond_dumping_to(stderr).splitlines()
            if line.startswith("precdbg: ")]


def reported(caplog) -> List[str]:
    """What precdbg reported (in-process; pytest routes the logger to caplog, a process
    without logging set up prints the same lines on stderr - the subprocess tests check that)."""
    return [r.getMessage() for r in caplog.records if r.name == "precdbg"
            and r.levelno >= logging.WARNING and not r.getMessage().startswith(DUMPING_TO)]


def partial_files(root: str) -> List[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.endswith(".partial")]


# --------------------------------------------------------------------------- statistics, hooks
class RaggedSideLM(nn.Module):
    """A real model that also packs some of its activations into a strided nested tensor
    (torch.nested's prototype layout) and scales it: precdbg records it as its values (176
    elements), whose statistics the test below makes fail, in every step."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.proj = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        self.ragged = torch.nested.nested_tensor([h[0, :3].detach(), h[1].detach()]) * 2
        return self.proj(h)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_capture_failure_is_contained(tmp_path, caplog, monkeypatch):
    real = precdbg_tensors.TorchTensors.summarize

    def failing(self, t):                     # statistics that fail inside a hook
        if t.dim() == 1 and t.numel() == 176:
            raise RuntimeError("statistics of the nested values failed (injected)")
        return real(self, t)
    monkeypatch.setattr(precdbg_tensors.TorchTensors, "summarize", failing)
    torch.manual_seed(0)
    model = RaggedSideLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path)
    losses = []
    for step in range(3):
        x = torch.randint(0, 64, (4, 8))
        dbg.start(model)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
        losses.append(float(loss.detach()))
    assert dbg.close()
    assert all(l == l for l in losses)
    assert dbg.failures >= 3                  # the nested tensor's call, in every step
    lines = reported(caplog)
    assert len(lines) == 1, lines             # reported once, in one line
    assert lines[0].startswith("precdbg: step 0: ") and "(injected)" in lines[0]
    assert "training continues" in lines[0]
    with precdbg.open_dump(dump_path) as dump:
        assert dump.steps == [0, 1, 2]
        for step in dump.steps:
            table = dump.records(step=step)
            grads = set(table["entry"][table["kind"] == "param_grad"].tolist())
            # every other record of the step is there, every dw included
            assert {"Param.proj.weight.grad", "Param.embed.weight.grad"} <= grads
            assert "Functional.linear.0.forward" in set(table["entry"].tolist())
        assert all("failure(s) inside precdbg" in w for w in dump.warnings())
        assert len(dump.warnings()) == 3
    assert not partial_files(dump_path)
    assert torch_hooks_left(model) == []


class FlakyModel(nn.Module):
    """A user's wrapper whose module walk fails the first time (as a half-built model can)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_model()
        self.fail_next_walk = False

    def named_modules(self, *args, **kwargs):
        if self.fail_next_walk:
            self.fail_next_walk = False
            raise RuntimeError("model is not ready")
        return super().named_modules(*args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_start_failure_is_contained_and_the_next_step_is_dumped(tmp_path, caplog):
    model = FlakyModel()
    opt = make_optimizer(model)
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path)
    model.fail_next_walk = True
    losses = run_steps(dbg, model, opt, make_batch_list(2), 2, close=False)
    assert dbg.close()
    assert len(losses) == 2 and all(torch.isfinite(l) for l in losses)
    assert dbg.failures == 1
    lines = reported(caplog)
    assert lines == ["precdbg: step 0: start() failed (RuntimeError: model is not ready); "
                     "training continues (counted in debugger.failures)"]
    with precdbg.open_dump(dump_path) as dump:
        assert dump.steps == [1]               # step 0 left nothing behind; step 1 is whole
        assert "param_grad" in set(dump.records(step=1)["kind"].tolist())
        assert dump.warnings() == []
    assert not partial_files(dump_path)
    assert torch_hooks_left(model) == []


# --------------------------------------------------------------------------- in subprocesses
UNIMPORTABLE = r"""
import json, sys
sys.modules["xxhash"] = None            # an optional module that cannot be imported
import torch
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

torch.manual_seed(0)
cfg = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=8, vocab_size=64)
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
debugger = PrecisionDebugger(config_path=CONFIG)
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=3, seed=0)):
    debugger.start(model)
    train_step(model, opt, x, y)
    if i == 0:
        debugger.step()                  # step() without stop(): step() runs the stop
    else:
        debugger.stop(); debugger.step()
    if i == 0:
        debugger.flush()                 # (the writer has met the missing module too)
        del sys.modules["xxhash"]        # the module is back (installed) for later steps
print(json.dumps({"failures": debugger.failures}))
"""


def _write_config(folder, **settings) -> str:
    path = os.path.join(folder, "config.json")
    with open(path, "w") as handle:
        json.dump(dict({"dump_path": os.path.join(folder, "dump")}, **settings), handle)
    return path


def _run_script(folder, code: str, config: str, timeout: float = 180
                ) -> subprocess.CompletedProcess:
    script = os.path.join(folder, "train.py")
    with open(script, "w") as handle:
        handle.write(f"CONFIG = {config!r}\n" + textwrap.dedent(code))
    return subprocess.run([PYTHON, script], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_unimportable_module_fails_step_and_writer_then_recovers(tmp_path):
    config = _write_config(str(tmp_path), summary_mode="checksum")
    proc = _run_script(str(tmp_path), UNIMPORTABLE, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.splitlines()[-1])["failures"]
    lines = precdbg_lines(proc.stderr)
    # the stop run by step() could not record the first batch; the writer could not hash
    assert any(l.startswith("precdbg: step 0: stop(): recording the first batch failed "
                            "(ModuleNotFoundError: import of xxhash halted")
               for l in lines), lines
    dropped = [l for l in lines if "dropped: writing" in l]
    assert len(dropped) == 1 and "step0" in dropped[0] and "xxhash" in dropped[0]
    assert "free on its disk" in dropped[0]
    assert failures == len(lines) == 2, (failures, lines)
    dump_path = str(tmp_path / "dump")
    assert not partial_files(dump_path)
    with precdbg.open_dump(dump_path) as dump:
        assert dump.steps == [1, 2]            # step 0 dropped whole; the next ones complete
        table = dump.records(step=1)
        assert "param_grad" in set(table["kind"].tolist())
        assert all(len(c) == 16 for c in table["checksum"][table["dtype"] == "float32"])


# a 2-layer GPT, AdamW and the debugger of the config: what the scripts below train
GPT_SETUP = r"""
import json, os, resource, shutil, signal
import torch
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger

torch.manual_seed(0)
cfg = GPTConfig(n_layer=2, d_model=64, n_head=2, seq_len=16, vocab_size=128)
model = GPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
debugger = PrecisionDebugger(config_path=CONFIG)
"""

DISK_FULL = GPT_SETUP + r"""
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a full quota: writes fail with EFBIG
losses = []
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=3, seed=0)):
    if i == 1:
        debugger.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))
    debugger.start(model)
    losses.append(float(train_step(model, opt, x, y)))
    debugger.stop(); debugger.step()
    if i == 1:
        debugger.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
print(json.dumps({"failures": debugger.failures, "losses": losses}))
"""


def _check_dropped_step_1(proc: subprocess.CompletedProcess, dump_path: str) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert len(result["losses"]) == 3 and result["failures"] == 1
    lines = precdbg_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("precdbg: step 1 rank 0 dropped: writing ")
    assert os.path.join(dump_path, "step1", "rank0.h5") in lines[0]
    assert "free on its disk" in lines[0] and "training continues" in lines[0]
    assert not partial_files(dump_path)
    with precdbg.open_dump(dump_path) as dump:
        assert dump.steps == [0, 2]
        for step in (0, 2):
            assert "param_grad" in set(dump.records(step=step)["kind"].tolist())
            assert dump.tensor("Functional.linear.0.forward.output.0", step=step).size > 0


def test_file_size_limit_drops_one_step_and_training_continues(tmp_path):
    config = _write_config(str(tmp_path), task="tensor")
    proc = _run_script(str(tmp_path), f"LIMIT = {1 << 20}\n" + DISK_FULL, config)
    _check_dropped_step_1(proc, str(tmp_path / "dump"))


def test_a_step_that_fits_under_the_file_size_limit_is_written(tmp_path):
    """The room kept for HDF5's metadata is a small share of the file, not a fixed MiB: with a
    limit a quarter above a step file's size, every step is written."""
    config = _write_config(str(tmp_path), task="tensor")
    first = os.path.join(str(tmp_path), "dump", "step0", "rank0.h5")
    code = DISK_FULL.replace("(LIMIT, resource.RLIM_INFINITY)",
                             "(os.path.getsize(FIRST) * 5 // 4, resource.RLIM_INFINITY)")
    proc = _run_script(str(tmp_path), f"import os\nFIRST = {first!r}\n" + code, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["failures"] == 0 and not precdbg_lines(proc.stderr), proc.stderr[-2000:]
    assert os.path.getsize(first) > 256 << 10          # large enough for the margin to matter
    with precdbg.open_dump(str(tmp_path / "dump")) as dump:
        assert dump.steps == [0, 1, 2]


def _mount_tmpfs(path: str, options: str) -> bool:
    os.makedirs(path, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _unmount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True, timeout=30)


def test_full_tmpfs_drops_one_step_and_training_continues(tmp_path):
    mount = str(tmp_path / "small")
    if not _mount_tmpfs(mount, "size=6m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
    try:
        folder = os.path.join(mount, "run")
        os.makedirs(folder)
        config = _write_config(folder, task="tensor")
        # fill the disk after step 0 so that step 1 cannot fit; free it again for step 2
        code = DISK_FULL.replace(
            "resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))",
            "open(FILLER, 'wb').write(b'0' * (FREE() - (256 << 10)))").replace(
            "resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)",
            "os.remove(FILLER)")
        prelude = (f"import os, shutil\nFILLER = {os.path.join(mount, 'filler')!r}\n"
                   f"FREE = lambda: shutil.disk_usage({mount!r}).free\n")
        proc = _run_script(folder, prelude + code, config)
        _check_dropped_step_1(proc, os.path.join(folder, "dump"))
    finally:
        _unmount(mount)


FULL_FROM_THE_START = GPT_SETUP + r"""
losses = []
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=3, seed=0)):
    if i == 2:
        debugger.flush()
        LEFT.append(sorted(os.path.relpath(os.path.join(d, f), DUMP)
                           for d, _, files in os.walk(DUMP) for f in files))
        os.remove(FILLER)                 # room again for the last step
    debugger.start(model)
    losses.append(float(train_step(model, opt, x, y)))
    debugger.stop(); debugger.step()
print(json.dumps({"failures": debugger.failures, "losses": losses, "left": LEFT[0]}))
"""


@pytest.mark.parametrize("level", ["mix", "api"])
def test_a_disk_full_from_the_first_start_leaves_no_stray_file(tmp_path, level):
    """The disk is full before the first start(): neither run.json's temporary file nor an
    empty `.partial` stays behind (HDF5 makes its file before the first write fails), every
    line says why in words, and the step after room is made again is written whole, with its
    run.json (at level api nothing else rewrites run.json later)."""
    mount = str(tmp_path / "full")
    if not _mount_tmpfs(mount, "size=2m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
    try:
        filler = os.path.join(mount, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"0" * 4096):
                pass
        except OSError:                     # ENOSPC: full
            pass
        finally:
            os.close(fd)
        dump_path = os.path.join(mount, "dump")
        config = _write_config(str(tmp_path), task="statistics", level=level,
                               dump_path=dump_path)
        prelude = f"FILLER, DUMP, LEFT = {filler!r}, {dump_path!r}, []\n"
        proc = _run_script(str(tmp_path), prelude + FULL_FROM_THE_START, config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.splitlines()[-1])
        assert len(result["losses"]) == 3 and result["failures"] >= 2
        assert result["left"] == [], result["left"]        # nothing while the disk was full
        lines = precdbg_lines(proc.stderr)
        assert lines and all("No space left on device" in line for line in lines), lines
        assert not any("buf = 0x" in line or "time = " in line for line in lines), lines
        assert not partial_files(dump_path)
        assert not [f for f in os.listdir(dump_path) if f.endswith(".tmp")]
        with precdbg.open_dump(dump_path) as dump:
            assert dump.steps == [2]
            assert len(dump.records(step=2)) > 100
    finally:
        _unmount(mount)


FILLED_WHILE_WRITING = GPT_SETUP + r"""
import precdbg.storage.step_file as stepfile
real_reserve = stepfile.reserve


def reserve_then_fill(fd, end):
    # another process fills the disk right after the room for a write phase was taken: the
    # worst moment, which a check of the free space alone cannot see
    real_reserve(fd, end)
    handle = os.open(FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while os.write(handle, b"0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(handle)


stepfile.reserve = reserve_then_fill
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=3, seed=0)):
    debugger.start(model)
    train_step(model, opt, x, y)
    debugger.stop(); debugger.step()
    debugger.flush()
    if os.path.exists(FILLER):
        os.remove(FILLER)
print(json.dumps({"failures": debugger.failures}))
"""


DELETED_MID_RUN = GPT_SETUP + r"""
for i, (x, y) in enumerate(make_batches(cfg, batch_size=2, steps=5, seed=0)):
    if i == 4:
        open(os.path.join(DUMP, "run.json"), "w").close()     # emptied, not deleted
    if i == 2:
        debugger.flush()
        shutil.rmtree(DUMP)              # someone cleans up the folder while the job runs
    debugger.start(model)
    train_step(model, opt, x, y)
    if i == 3:
        debugger.flush()                 # (step 2 on disk: the writer is not in the folder)
        shutil.rmtree(DUMP)              # ... and again during the last step
    debugger.stop(); debugger.step()
print(json.dumps({"failures": debugger.failures}))
"""


def test_a_disk_filled_right_after_the_room_check_cannot_fail_the_write(tmp_path):
    """Another process fills the disk between the room check and HDF5's writes of a step (a
    checkpoint saved beside the dump): HDF5 met that full disk half-way and crashed the
    training process (SIGSEGV, 2 runs in 15 before the fix). The room a write phase needs is
    now reserved on disk before HDF5 writes, so every step is written whole, and the blocks
    reserved past HDF5's data are given back: the files are as small as on an empty disk."""
    mount = str(tmp_path / "filled")
    if not _mount_tmpfs(mount, "size=4m"):
        pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
    try:
        dump_path = os.path.join(mount, "dump")
        config = _write_config(str(tmp_path), task="statistics", dump_path=dump_path)
        prelude = f"FILLER = {os.path.join(mount, 'filler')!r}\n"
        proc = _run_script(str(tmp_path), prelude + FILLED_WHILE_WRITING, config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.splitlines()[-1])["failures"] == 0
        assert not precdbg_lines(proc.stderr), proc.stderr[-2000:]
        assert not partial_files(dump_path)
        with precdbg.open_dump(dump_path) as dump:
            assert dump.steps == [0, 1, 2]
            sizes = [os.path.getsize(os.path.join(dump_path, f"step{step}", "rank0.h5"))
                     for step in dump.steps]
            for step in dump.steps:
                assert "param_grad" in set(dump.records(step=step)["kind"].tolist())
        reference = str(tmp_path / "reference")
        config = _write_config(str(tmp_path), task="statistics", dump_path=reference)
        plain = FILLED_WHILE_WRITING.replace("stepfile.reserve = reserve_then_fill", "")
        proc = _run_script(str(tmp_path), prelude + plain, config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert sizes == [os.path.getsize(os.path.join(reference, f"step{step}", "rank0.h5"))
                         for step in range(3)]
    finally:
        _unmount(mount)


def test_a_dump_folder_deleted_while_the_job_runs_is_readable_again(tmp_path):
    """The folder (run.json and the steps so far) deleted between two steps, and again during
    the last one, then run.json emptied: start() (or stop()) writes run.json again, says so
    in one line, and the later steps are a readable dump."""
    dump_path = str(tmp_path / "dump")
    config = _write_config(str(tmp_path), task="statistics", level="api")
    proc = _run_script(str(tmp_path), f"DUMP = {dump_path!r}\n" + DELETED_MID_RUN, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["failures"] == 0
    lines = precdbg_lines(proc.stderr)
    assert lines == [f"precdbg: {os.path.join(dump_path, 'run.json')} was "
                     f"{what} while the job ran; it is written again at step {step}, so the "
                     "steps written since can be read"
                     for what, step in (("deleted", 2), ("deleted", 3), ("emptied", 4))]
    with precdbg.open_dump(dump_path) as dump:
        assert dump.steps == [3, 4]
        assert len(dump.records(step=3)) > 100


def test_read_only_dump_path_is_one_clear_error_before_training(tmp_path):
    target = str(tmp_path / "readonly")
    if os.geteuid() != 0:
        os.makedirs(target)
        os.chmod(target, 0o555)
    elif not _mount_tmpfs(target, "size=1m,ro"):
        pytest.skip("as root, a read-only folder needs a read-only mount, which failed here")
    try:
        dump_path = os.path.join(target, "dump")
        config = _write_config(str(tmp_path), task="statistics", dump_path=dump_path)
        proc = _run_script(str(tmp_path), UNIMPORTABLE.replace(
            'sys.modules["xxhash"] = None', "").replace('del sys.modules["xxhash"]', "pass"),
            config)
        assert proc.returncode == 1
        last = proc.stderr.rstrip().splitlines()[-1]
        # refused when the debugger is made, before the training it would have stopped
        assert last == (f"precdbg: dump_path: {dump_path}: {target} is not "
                        "writable (or on a read-only file system); choose a folder this "
                        "process can write"), last
        # one line, no traceback; nothing failed later: it never started
        assert "Traceback" not in proc.stderr and proc.stderr.count("precdbg: ") == 1
    finally:
        if os.geteuid() == 0:
            _unmount(target)
        else:
            os.chmod(target, 0o755)
