"""The lock that keeps two processes from writing one rank into one dump folder: held while
the process runs, its file gone once the process ended, never lost to a removal race."""
from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from conftest import PYTHON, REPO
from precdbg.storage import rank_lock

fcntl = pytest.importorskip("fcntl")

HOLD_AND_FORK = textwrap.dedent("""
    import os, sys, time
    from precdbg.storage import rank_lock
    folder, mode = sys.argv[1], sys.argv[2]
    assert rank_lock.lock_rank(folder, 0) is None
    if mode == "fork":
        child = os.fork()
        if child == 0:
            sys.exit(0)            # a forked child ending normally runs the exit handlers
        os.waitpid(child, 0)
        print("exists after child", os.path.exists(rank_lock.lock_path(folder, 0)), flush=True)
        sys.stdin.readline()       # held until told to end
    elif mode == "exit":
        os._exit(0) if len(sys.argv) > 3 else sys.exit(0)
""")


def _hold(tmp_path, folder: str, mode: str, *extra: str) -> subprocess.Popen:
    script = tmp_path / "hold.py"
    script.write_text(HOLD_AND_FORK)
    return subprocess.Popen([PYTHON, str(script), folder, mode, *extra], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_lock_file_is_removed_when_the_process_ends(tmp_path):
    folder = str(tmp_path / "dump")
    proc = _hold(tmp_path, folder, "exit")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not os.path.exists(rank_lock.lock_path(folder, 0))


def test_forked_child_leaves_the_parents_lock(tmp_path):
    folder = str(tmp_path / "dump")
    proc = _hold(tmp_path, folder, "fork")
    try:
        line = proc.stdout.readline()
        assert line.split() == ["exists", "after", "child", "True"], (line, proc.stderr.read())
        other = _hold(tmp_path, folder, "exit")         # a second process: refused
        _, err = other.communicate(timeout=120)
        assert other.returncode != 0 and "AssertionError" in err, err
    finally:
        proc.communicate("\n", timeout=120)
    assert proc.returncode == 0
    assert not os.path.exists(rank_lock.lock_path(folder, 0))


def test_a_lock_on_a_removed_file_is_taken_again(tmp_path, monkeypatch):
    """The last holder removes the file between this process's open and its flock: the lock
    then holds a file no name leads to, and would not keep out a third process that creates
    the name anew. It is taken again on the file the name gives."""
    folder = str(tmp_path / "dump")
    path = rank_lock.lock_path(folder, 0)
    real_flock, calls = fcntl.flock, []

    def flock_after_removal(fd: int, operation: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            os.unlink(path)            # what the previous holder does as it exits
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_removal)
    monkeypatch.setattr(rank_lock, "_held", {})
    try:
        assert rank_lock.lock_rank(folder, 0) is None
        fd = rank_lock._held[(folder, 0)][0]
        assert len(calls) == 2 and fd >= 0
        held, named = os.fstat(fd), os.stat(path)
        assert (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
        proc = _hold(tmp_path, folder, "exit")        # and it keeps another process out
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and "AssertionError" in err, err
    finally:
        rank_lock.release_all()
    assert not os.path.exists(path)
