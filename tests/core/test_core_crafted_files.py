"""Crafted and damaged input under a memory cap (issue: reading is bounded and strict; a flipped
bit is reported as damage, never compared).

Every case runs the real `precdbg` commands (compare, inspect, scan, check) in a forked child
whose address space is capped at what the interpreter already holds plus `_CAP_BYTES`, with its
stdout and stderr captured and a timeout (a FIFO must not hang a read). What must hold: exit 2,
one line on stderr starting `precdbg: ` and naming the file, no traceback, within the cap. A
flip of any bit of a record column, a module-tree string or an attribute is refused as damage;
a flip anywhere else is refused or read as it was written (exit 0), never compared as other data.
"""
from __future__ import annotations

import json
import os
import random
import resource
import shutil
import signal
import sys
import time
from typing import List, Tuple

import h5py
import numpy as np
import pytest

import synthetic as S

_CAP_BYTES = 768 << 20        # beyond what the interpreter holds when the child starts
_TIMEOUT = 60.0
COMMANDS = ("compare", "inspect", "scan", "check")


def _vm_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _precdbg(tmp: str, *args: str) -> Tuple[int, str, str]:
    """`precdbg <args>` in a forked child under the memory cap: (exit code, stdout, stderr);
    -signal for a child killed (the cap exceeded, a crash), 'timeout' in stderr for a hang."""
    out, err = os.path.join(tmp, "out.txt"), os.path.join(tmp, "err.txt")
    cap = _vm_bytes() + _CAP_BYTES
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:                                             # the child: never returns
        code = 70
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            for fd, path in ((1, out), (2, err)):
                handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(handle, fd)
                os.close(handle)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
            from precdbg.cli import main
            code = main(list(args))
        except BaseException:  # noqa: BLE001 - what escaped main: the parent sees exit 70
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + _TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9, "", "timeout"
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    with open(out, encoding="utf-8", errors="replace") as handle:
        stdout = handle.read()
    with open(err, encoding="utf-8", errors="replace") as handle:
        stderr = handle.read()
    return code, stdout, stderr


def _refused(tmp: str, args: List[str], *words: str) -> str:
    code, stdout, stderr = _precdbg(tmp, *args)
    lines = stderr.splitlines()
    assert code == 2, (args, code, stdout[-400:], stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("precdbg: "), (args, stderr[-1500:])
    for word in words:
        assert word in lines[0], (args, lines[0])
    return lines[0]


def _every_command(tmp: str, base: str, crafted: str, *words: str) -> List[str]:
    """Each command on the crafted dump: one line naming it, exit 2."""
    return [_refused(tmp, [command] + ([base, crafted] if command in ("compare", "check")
                                       else [crafted]), *words) for command in COMMANDS]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return S.write_dump(tmp_path_factory.mktemp("base") / "dump")


def _copy(base: str, tmp_path, name: str = "crafted") -> Tuple[str, str]:
    root = str(tmp_path / name)
    shutil.copytree(base, root)
    return root, os.path.join(root, "step0", "rank0.h5")


def _unsealed(path: str) -> None:
    """As an older schema wrote it (no seal): the bounds alone must refuse what follows."""
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = 4


def _replace(path: str, column: str, **dataset) -> None:
    with h5py.File(path, "r+") as handle:
        del handle["records"][column]
        handle["records"].create_dataset(column, **dataset)


# ------------------------------------------------------------------------ crafted step files
@pytest.mark.parametrize("rows", [10 ** 8, 10 ** 12])
def test_rows_declared_beyond_the_file_are_refused_before_they_are_allocated(base, tmp_path,
                                                                            rows):
    root, path = _copy(base, tmp_path)
    _unsealed(path)
    with h5py.File(path, "r+") as handle:
        count = handle["records"]["entry"].shape[0]
        for column in list(handle["records"]):
            ds = handle["records"][column]
            shape = (rows,) + ds.shape[1:]
            del handle["records"][column]
            handle["records"].create_dataset(column, shape=shape, dtype=ds.dtype)
        handle["records"].attrs["count"] = rows
    assert count < rows
    _every_command(str(tmp_path), base, root, path)


def test_a_shape_column_a_million_wide_is_refused(base, tmp_path):
    root, path = _copy(base, tmp_path)
    _unsealed(path)
    with h5py.File(path, "r+") as handle:
        count = handle["records"]["entry"].shape[0]
    _replace(path, "shape", shape=(count, 10 ** 6), dtype=np.int64)
    _every_command(str(tmp_path), base, root, path, "records/shape")


def test_columns_of_different_lengths_and_numbers_stored_as_text_are_refused(base, tmp_path):
    root, path = _copy(base, tmp_path)
    _unsealed(path)
    with h5py.File(path, "r+") as handle:
        short = handle["records"]["seq"][()][:-1]
    _replace(path, "seq", data=short)
    _every_command(str(tmp_path), base, root, path, "records/seq")
    root, path = _copy(base, tmp_path, "text")
    _unsealed(path)
    with h5py.File(path, "r+") as handle:
        text = np.array([b"%r" % v for v in handle["records"]["min"][()].tolist()])
    _replace(path, "min", data=text)
    _every_command(str(tmp_path), base, root, path, "records/min")


@pytest.mark.parametrize("value", [1e30, "abc", 2 ** 40, -1])
def test_a_step_attribute_that_is_no_step_number_is_refused(base, tmp_path, value):
    root, path = _copy(base, tmp_path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["step"] = value
    _every_command(str(tmp_path), base, root, path, "'step'")


# ------------------------------------------------------------------------ hostile run.json
def _run_json(base: str, tmp_path, name: str, text: str) -> str:
    root, _ = _copy(base, tmp_path, name)
    with open(os.path.join(root, "run.json"), "w", encoding="utf-8") as handle:
        handle.write(text)
    return root


def test_hostile_run_json_gets_one_line(base, tmp_path):
    with open(os.path.join(base, "run.json"), encoding="utf-8") as handle:
        good = json.load(handle)
    cases = {"deep": ("[" * 100_000 + "]" * 100_000, "nested deeper"),
             "config": (json.dumps(dict(good, config=[1, 2])), "'config'"),
             "manifest": (json.dumps(dict(good, manifest="x")), "'manifest'"),
             "manifests": (json.dumps(dict(good, manifests={"0": [1]})), "'manifests.0'"),
             "world": (json.dumps(dict(good, world_size="8")), "'world_size'"),
             "dense": ("[" + "[]," * (12 << 20) + "[]]", "to parse")}
    for name, (text, words) in cases.items():
        root = _run_json(base, tmp_path, name, text)
        _every_command(str(tmp_path), base, root, "run.json", words)


def test_fifos_are_never_opened(base, tmp_path):
    root, fifo = _copy(base, tmp_path)
    os.remove(fifo)
    os.mkfifo(fifo)                    # a FIFO named rank0.h5: opening it would block
    _every_command(str(tmp_path), base, root, "rank0.h5", "FIFO")
    root, _ = _copy(base, tmp_path, "fifo_run")
    os.remove(os.path.join(root, "run.json"))
    os.mkfifo(os.path.join(root, "run.json"))
    _every_command(str(tmp_path), base, root, "run.json", "FIFO")
    _refused(str(tmp_path), ["inspect", fifo], "FIFO")


# ------------------------------------------------------------------------ truncations and flips
def test_truncated_step_files_get_one_line(base, tmp_path):
    _, path = _copy(base, tmp_path)
    size = os.path.getsize(path)
    for k, cut in enumerate(np.linspace(64, size - 1, 8).astype(int).tolist()):
        root, path = _copy(base, tmp_path, f"cut{k}")
        with open(path, "r+b") as handle:
            handle.truncate(cut)
        for command in ("inspect", "compare"):
            _refused(str(tmp_path), [command] + ([base, root] if command == "compare"
                                                 else [root]), "rank0.h5")


def _sealed_spans(path: str) -> List[Tuple[str, int, int]]:
    """(what, offset, length) of every record column's bytes and of some module and attribute
    strings in the file, where a flip must be caught by the seal."""
    spans: List[Tuple[str, int, int]] = []
    with h5py.File(path, "r") as handle:
        for name, ds in handle["records"].items():
            offset = ds.id.get_offset()
            if offset is not None and ds.id.get_storage_size():
                spans.append((f"records/{name}", offset, ds.id.get_storage_size()))
        cls = [c.decode() for c in handle["modules"]["cls"][()] if c]
        framework = handle.attrs["framework"]
    raw = open(path, "rb").read()
    for what, text in (("modules/cls", max(cls, key=len)), ("attrs", str(framework))):
        at = raw.find(text.encode())
        if at >= 0:
            spans.append((what, at, len(text)))
    return spans


def test_a_flipped_bit_in_what_is_sealed_is_damage_never_data(base, tmp_path):
    _, path = _copy(base, tmp_path)
    spans = _sealed_spans(path)
    assert len(spans) > 30 and {"modules/cls", "attrs"} <= {w for w, _, _ in spans}
    rng = random.Random(51)
    for k, (what, offset, length) in enumerate(spans):
        root, path = _copy(base, tmp_path, f"flip{k}")
        at = offset + rng.randrange(length)
        with open(path, "r+b") as handle:
            handle.seek(at)
            byte = handle.read(1)[0]
            handle.seek(at)
            handle.write(bytes([byte ^ (1 << rng.randrange(8))]))
        line = _refused(str(tmp_path), ["compare", base, root], "rank0.h5")
        assert "damaged" in line or "not a readable" in line, (what, line)
        shutil.rmtree(root)


def test_a_flipped_bit_anywhere_is_refused_or_reads_as_written(base, tmp_path):
    _, path = _copy(base, tmp_path)
    size = os.path.getsize(path)
    rng = random.Random(7)
    codes = []
    for k in range(24):
        root, path = _copy(base, tmp_path, f"any{k}")
        at = rng.randrange(size)
        with open(path, "r+b") as handle:
            handle.seek(at)
            byte = handle.read(1)[0]
            handle.seek(at)
            handle.write(bytes([byte ^ (1 << rng.randrange(8))]))
        code, stdout, stderr = _precdbg(str(tmp_path), "compare", base, root)
        assert code in (0, 2) and "Traceback" not in stderr, (at, code, stderr[-1500:])
        if code == 2:
            assert len(stderr.splitlines()) == 1, stderr
        codes.append(code)
        shutil.rmtree(root)
    assert 2 in codes


# ------------------------------------------------------------------------ msprobe's files
_MSPROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                        "msprobe", "stat_mix_clean")


def test_hostile_msprobe_files_get_one_line(tmp_path):
    for name, text in (("deep", "[" * 100_000 + "]" * 100_000),
                       ("dense", '{"data": [' + "[]," * (12 << 20) + "[]]}")):
        root = str(tmp_path / name)
        shutil.copytree(_MSPROBE, root)
        dump_json = next(os.path.join(folder, "dump.json") for folder, _, files in
                         sorted(os.walk(root)) if "dump.json" in files)
        with open(dump_json, "w", encoding="utf-8") as handle:
            handle.write(text)
        for command in ("inspect", "compare"):
            _refused(str(tmp_path), [command] + ([_MSPROBE, root] if command == "compare"
                                                 else [root]), "dump.json")
    root = str(tmp_path / "fifo")
    shutil.copytree(_MSPROBE, root)
    dump_json = next(os.path.join(folder, "dump.json") for folder, _, files in
                     sorted(os.walk(root)) if "dump.json" in files)
    os.remove(dump_json)
    os.mkfifo(dump_json)
    _refused(str(tmp_path), ["compare", _MSPROBE, root], "dump.json", "FIFO")
