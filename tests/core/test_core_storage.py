"""The dump on disk without a framework: records written by the core's writer (`DumpWriter`, as the
capture drives it) read back column for column by `open_dump`; stored tensors (bf16 through
ml_dtypes) and checksums; several capture windows of a step; `.partial` files; damaged files;
run.json; step and rank discovery; the layout's names; and a writer process killed mid-step."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import precdbg
from precdbg import DumpError
from precdbg.records.schema import MAX_NDIM, RECORD_COLUMNS, SCHEMA_VERSION
from precdbg.storage import layout
from precdbg.storage.writer import DumpWriter

import synthetic as S
from conftest import lines_until

CORE = os.path.dirname(os.path.abspath(__file__))
_STRINGS = {name for name, dtype in RECORD_COLUMNS if dtype is None}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _write(root, records, payloads=(), **kwargs) -> str:
    writer = DumpWriter(str(root))
    S.write_step(writer, 0, 0, [(records, list(payloads))], **kwargs)
    assert writer.flush(30) and writer.shutdown()
    assert writer.errors == 0, writer.last_error
    return str(root)


# --------------------------------------------------------------------------- round trip
def _every_column_records():
    """Records whose every field holds something other than its default: all ranks of shape,
    text that is not ASCII, NaN and Inf statistics, negative integers."""
    out = []
    for ndim in range(MAX_NDIM + 1):
        shape = tuple(range(2, 2 + ndim))
        out.append(S.make_record(
            entry=f"Functional.op{ndim}.{ndim}.forward", kind="api", prefix="Functional",
            api=f"op{ndim}", op=f"op{ndim}", module=f"blocks.{ndim}.ünïcode",
            direction="forward", role="output" if ndim % 2 else "input", phase="forward",
            arg_index=ndim, arg_key=f"{ndim}.weight", call_index=ndim, order=100 + ndim,
            seq=ndim + 1, dtype="float32", shape=shape, numel=int(np.prod(shape)),
            min=-1.5 * ndim, max=float("inf") if ndim == 3 else 2.5 * ndim,
            mean=float("nan") if ndim == 4 else 0.25 * ndim, norm=10.0 + ndim,
            nan_count=ndim, inf_count=int(ndim == 3), checksum=f"{ndim:016x}",
            text="日本語 текст" if ndim == 5 else "", alias=f"alias.{ndim}",
            trainable=bool(ndim % 2), stack_id=ndim - 1, data_offset=-1, data_nbytes=0,
            tensor_id=ndim, producer=ndim - 1 if ndim else -1, storage=40 + ndim,
            precision="bfloat16" if ndim % 3 == 0 else "float32"))
    out.append(S.make_record(                       # a non-tensor argument
        entry="Functional.gelu.0.forward", kind="api", prefix="Functional", api="gelu",
        op="gelu", module="act", direction="forward", role="input", phase="forward",
        arg_index=1, arg_key="approximate", call_index=0, order=5, seq=MAX_NDIM + 2,
        dtype="py.str", shape=(), numel=1, text="tanh"))
    return out


def test_every_column_of_every_record_reads_back(tmp_path):
    records = _every_column_records()
    expected = [{name: getattr(r, name) for name, _ in RECORD_COLUMNS} for r in records]
    shapes = [r.shape for r in records]
    dump = precdbg.open_dump(_write(tmp_path / "d", records))
    table = dump.records(step=0, rank=0)
    assert len(table) == len(records)
    for name, dtype in RECORD_COLUMNS:
        column = table[name]
        assert column.dtype.kind == "U" if dtype is None else column.dtype == dtype, name
    for i, want in enumerate(expected):
        row = table.row(i)
        for name, value in want.items():
            assert _same(row[name], value), (i, name, row[name], value)
        assert row["shape"] == shapes[i] and row["ndim"] == len(shapes[i])
        assert (row["step"], row["rank"], row["part"]) == (0, 0, 0)


def test_step_file_attributes_and_module_tree(tmp_path):
    root = S.write_dump(tmp_path / "d")
    dump = precdbg.open_dump(root)
    attrs = dump.files(0, 0)[0].attrs
    assert attrs["schema_version"] == SCHEMA_VERSION
    assert (attrs["step"], attrs["rank"], attrs["part"]) == (0, 0, 0)
    assert attrs["framework"] == "pytorch" and attrs["task"] == "statistics"
    assert attrs["complete"] is True or attrs["complete"] == 1
    assert attrs["interrupted"] in (False, 0) and attrs["failures"] == 0
    assert dump.modules(0) == list(S.MODULES)
    settings = dump.module_settings(0)
    assert settings["act"] == ("GELU", {"approximate": "none"})
    assert settings["fc1"] == ("Linear", {})
    assert dump.stacks(0) == list(S.STACKS)
    assert dump.warnings() == []


def test_records_read_back_as_the_model_step_made_them(tmp_path):
    """The synthetic step as a capture would have it: producers name the first writer of what
    they read; the inventory, forward, backward and dw all there."""
    v = S.Variant()
    built, _ = S.model_step(v, S.initial_params(v), 0, 0)
    table = precdbg.open_dump(S.write_dump(tmp_path / "d", v)).records(step=0)
    assert table["entry"].tolist() == [r.entry for r in built.records]
    assert table["seq"].tolist() == list(range(1, len(built.records) + 1))
    np.testing.assert_array_equal(table["norm"], [r.norm for r in built.records])
    kinds = set(zip(table["kind"].tolist(), table["direction"].tolist()))
    assert kinds == {("param", "none"), ("module", "forward"), ("api", "forward"),
                     ("module", "backward"), ("api", "backward"), ("param_grad", "backward")}
    seq_of = {(r.entry, r.role, r.arg_index): r.seq for r in built.records}
    row = lambda entry, role, k=0: table.row(  # noqa: E731
        int(np.nonzero(table["seq"] == seq_of[(entry, role, k)])[0][0]))
    # gelu reads what linear 0 computed; linear 0 reads fc1.weight from the inventory; the
    # model's input and the loss's gradient were produced by nothing captured
    assert row("Functional.gelu.0.forward", "input")["producer"] == \
        seq_of[("Functional.linear.0.forward", "output", 0)]
    assert row("Functional.linear.0.forward", "input", 1)["producer"] == \
        seq_of[("Param.fc1.weight", "param", 0)]
    assert row("Module.MLP.forward.0", "input")["producer"] == -1
    assert row("Tensor.mean.0.backward", "grad_output")["producer"] == -1
    assert row("Param.fc1.weight.grad", "param_grad")["producer"] == \
        seq_of[("Functional.linear.0.backward", "grad_input", 1)]
    assert row("Param.fc1.weight", "param")["phase"] == "setup"


# --------------------------------------------------------------------------- tensors
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
def test_tensor_task_payloads_read_back_bit_for_bit(tmp_path, dtype):
    import ml_dtypes
    v = S.Variant(task="tensor", dtype=dtype)
    built, _ = S.model_step(v, S.initial_params(v), 0, 0)
    dump = precdbg.open_dump(S.write_dump(tmp_path / "d", v))
    by_id = {p.tensor_id: p.array for p in built.payloads}
    gelu = next(r for r in built.records if r.entry == "Functional.gelu.0.forward"
                and r.role == "output")
    got = dump.tensor("Functional.gelu.0.forward.output.0", step=0)
    want = by_id[gelu.tensor_id]
    assert got.dtype == (np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype))
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    # by entry name alone where it holds one tensor, and by table row
    np.testing.assert_array_equal(dump.tensor("Param.fc1.weight.grad", step=0).astype(np.float64),
                                  by_id[next(r.tensor_id for r in built.records
                                             if r.entry == "Param.fc1.weight.grad")]
                                  .astype(np.float64))
    table = dump.records(step=0)
    stored = np.nonzero(table["data_offset"] >= 0)[0]
    tensors = np.nonzero(~np.char.startswith(table["dtype"], "py."))[0]
    assert stored.tolist() == tensors.tolist()          # every tensor record, no argument
    for i in stored.tolist():
        row = table.row(i)
        assert dump.tensor_at(table, i).tobytes() == by_id[row["tensor_id"]].tobytes()
        assert row["data_nbytes"] == by_id[row["tensor_id"]].nbytes
    # the same tensor read by several records is stored once
    offsets = {int(table["tensor_id"][i]): int(table["data_offset"][i]) for i in stored}
    assert len(set(offsets.values())) == len(by_id)


def test_statistics_task_has_no_tensor_to_read(tmp_path):
    dump = precdbg.open_dump(S.write_dump(tmp_path / "d"))
    with pytest.raises(DumpError) as info:
        dump.tensor("Functional.gelu.0.forward.output.0", step=0)
    assert dump.files(0)[0].path in str(info.value)
    with pytest.raises(DumpError):
        dump.tensor("Functional.nothing.0.forward.output.0", step=0)


def test_checksums_are_xxh3_of_the_bytes(tmp_path):
    import xxhash
    v = S.Variant(checksum=True)
    built, _ = S.model_step(v, S.initial_params(v), 0, 0)
    table = precdbg.open_dump(S.write_dump(tmp_path / "d", v)).records(step=0)
    by_id = {p.tensor_id: p.array for p in built.payloads}
    assert table["data_offset"].max() == -1            # hashed, not stored
    for i in range(len(table)):
        tid = int(table["tensor_id"][i])
        want = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(by_id[tid]).view(np.uint8)) \
            if tid >= 0 else ""
        assert table["checksum"][i] == want


# --------------------------------------------------------------------------- steps and parts
def test_two_capture_windows_of_one_step_are_two_parts(tmp_path):
    v = S.Variant()
    first, _ = S.model_step(v, S.initial_params(v), 0, 0)
    second, _ = S.model_step(S.Variant(seed=1), S.initial_params(v), 0, 0)
    root = str(tmp_path / "d")
    writer = DumpWriter(root)
    for built in (first, second):
        S.write_step(writer, 0, 0, [(built.records, [])], S.module_tree(v))
    assert writer.flush(30) and writer.shutdown()
    names = sorted(os.listdir(layout.step_folder(root, 0)))
    assert names == ["rank0.h5", "rank0.part1.h5"]
    dump = precdbg.open_dump(root)
    assert dump.steps == [0] and [f.part for f in dump.files(0, 0)] == [0, 1]
    table = dump.records(step=0)
    assert len(table) == len(first.records) + len(second.records)
    assert table["part"].tolist() == [0] * len(first.records) + [1] * len(second.records)
    np.testing.assert_array_equal(table["norm"][len(first.records):],
                                  [r.norm for r in second.records])


def test_steps_ranks_and_run_json_are_discovered(tmp_path):
    root = S.write_dump(tmp_path / "d", steps=(0, 1, 3), ranks=(0, 1), lr=0.05)
    dump = precdbg.open_dump(root)
    assert dump.steps == [0, 1, 3] and dump.ranks == [0, 1]
    assert dump.run["schema_version"] == SCHEMA_VERSION
    assert dump.run["world_size"] == 2 and sorted(dump.run["manifests"]) == ["0", "1"]
    assert dump.run["manifest"]["optimizers"][0]["param_groups"][0]["hyper"]["lr"] == 0.05
    assert dump.run["config"]["dump_path"] == root
    assert dump.setting("framework") == "pytorch" and dump.setting("level") == "mix"
    for step in (0, 1, 3):
        for rank in (0, 1):
            assert set(dump.records(step, rank)["rank"].tolist()) == {rank}
    with pytest.raises(DumpError):
        dump.records(step=2)
    with open(layout.run_json_path(root), encoding="utf-8") as handle:
        assert json.load(handle) == dump.run
    # a step folder, and one step file, are dumps too (run.json found above them)
    one = precdbg.open_dump(layout.step_folder(root, 1))
    assert one.steps == [1] and one.ranks == [0, 1] and one.run["world_size"] == 2
    single = precdbg.open_dump(layout.step_file_path(root, 3, 1))
    assert single.steps == [3] and single.ranks == [1]
    assert len(single.records()) == len(dump.records(3, 1))


def test_an_interrupted_step_says_so(tmp_path):
    dump = precdbg.open_dump(S.write_dump(tmp_path / "d", interrupted=True))
    assert len(dump.warnings()) == 1 and dump.warnings(only=[(5, 0)]) == []


# --------------------------------------------------------------------------- incomplete, damaged
def test_partial_files_are_skipped_and_listed(tmp_path):
    root = S.write_dump(tmp_path / "d", steps=(0, 1))
    final = layout.step_file_path(root, 1, 0)
    partial = layout.partial_path(final)
    os.replace(final, partial)                 # as a step left by a crash looks
    dump = precdbg.open_dump(root)
    assert dump.steps == [0] and dump.partial == [partial]
    assert len(dump.records()) == len(dump.records(step=0))
    with pytest.raises(DumpError) as info:
        precdbg.open_dump(partial)
    assert partial in str(info.value)
    os.replace(layout.step_file_path(root, 0, 0),
               layout.partial_path(layout.step_file_path(root, 0, 0)))
    with pytest.raises(DumpError) as info:          # nothing complete left
        precdbg.open_dump(root)
    assert root in str(info.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_a_step_file", "no_records"])
def test_a_damaged_step_file_names_itself_and_stops_only_its_step(tmp_path, damage):
    root = S.write_dump(tmp_path / "d", steps=(0, 1))
    path = layout.step_file_path(root, 1, 0)
    if damage == "garbage":
        with open(path, "wb") as handle:
            handle.write(b"\x89HDF\r\n\x1a\n" + os.urandom(4096))
    elif damage == "truncated":
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 3)
    elif damage == "not_a_step_file":
        os.remove(path)
        with h5py.File(path, "w") as handle:
            handle["x"] = np.arange(3)
    else:
        with h5py.File(path, "r+") as handle:
            del handle["records/entry"]
    dump = precdbg.open_dump(root)           # known by its name: opened when first read
    assert dump.steps == [0, 1]
    assert len(dump.records(step=0)) > 0
    with pytest.raises(DumpError) as info:
        dump.records(step=1)
    message = str(info.value)
    assert path in message and "\n" not in message


def test_an_unreadable_run_json_names_itself(tmp_path):
    root = S.write_dump(tmp_path / "d")
    for text in ("{not json", "[1, 2]"):
        with open(layout.run_json_path(root), "w", encoding="utf-8") as handle:
            handle.write(text)
        with pytest.raises(DumpError) as info:
            precdbg.open_dump(root)
        assert layout.run_json_path(root) in str(info.value)


def test_older_schema_reads_with_defaults_and_unknown_schema_is_refused(tmp_path):
    root = S.write_dump(tmp_path / "d")
    path = layout.step_file_path(root, 0, 0)
    with h5py.File(path, "r+") as handle:       # as schema 2 wrote it: no precision column
        del handle["records/precision"]
        handle.attrs["schema_version"] = 2
    table = precdbg.open_dump(root).records(step=0)
    assert set(table["precision"].tolist()) == {""}
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = 999
    with pytest.raises(DumpError) as info:
        precdbg.open_dump(root).records(step=0)
    assert path in str(info.value) and "999" in str(info.value)


def test_a_step_file_under_another_name_is_refused(tmp_path):
    """A step file holds its step, rank and part: a name that says otherwise is refused
    (naming the file), not read as another step."""
    root = S.write_dump(tmp_path / "d", steps=(0, 1))
    moved = layout.step_file_path(root, 7, 0)
    os.makedirs(os.path.dirname(moved))
    os.replace(layout.step_file_path(root, 1, 0), moved)
    os.rmdir(layout.step_folder(root, 1))
    dump = precdbg.open_dump(root)
    assert dump.steps == [0, 7]
    with pytest.raises(DumpError) as info:
        dump.records(step=7)
    assert moved in str(info.value)


# --------------------------------------------------------------------------- layout
def test_layout_names(tmp_path):
    root = str(tmp_path / "dump")
    assert layout.run_json_path(root) == os.path.join(root, "run.json")
    assert layout.step_folder(root, 12) == os.path.join(root, "step12")
    assert layout.step_file_path(root, 3, 1) == os.path.join(root, "step3", "rank1.h5")
    assert layout.step_file_path(root, 3, 1, 2) == os.path.join(root, "step3", "rank1.part2.h5")
    assert layout.partial_path("x/rank0.h5") == "x/rank0.h5.partial"
    assert layout.step_of_folder("step12") == 12
    assert layout.step_of_folder("step") is None and layout.step_of_folder("steps1") is None
    assert layout.parse_step_file("rank3.h5") == layout.StepFileName(3, 0, False)
    assert layout.parse_step_file("rank3.part2.h5.partial") == layout.StepFileName(3, 2, True)
    for name in ("rank.h5", "rank3.h6", "run.json", "rank3.part.h5", "xrank3.h5"):
        assert layout.parse_step_file(name) is None and not layout.is_step_file_name(name)
    written = S.write_dump(root, steps=(0, 2), ranks=(0, 1))
    assert layout.dump_root(layout.step_file_path(written, 2, 1)) == os.path.abspath(written)
    assert layout.dump_root(layout.step_folder(written, 2)) == os.path.abspath(written)
    assert layout.dump_root(written) == os.path.abspath(written)
    assert layout.step_folders(written) == [layout.step_folder(written, s) for s in (0, 2)]
    assert layout.rank_files(written, 1) == [layout.step_file_path(written, s, 1)
                                            for s in (0, 2)]
    files = layout.dump_files(written)
    assert files[0] == layout.run_json_path(written) and len(files) == 5
    assert layout.would_overwrite_dump(layout.run_json_path(written))
    assert layout.would_overwrite_dump(os.path.join(layout.step_folder(written, 0), "new.csv"))
    assert not layout.would_overwrite_dump(str(tmp_path / "report.json"))


# --------------------------------------------------------------------------- kill -9
_WRITER_SCRIPT = r"""
import sys, time
import numpy as np
sys.path.insert(0, CORE)
import synthetic as S
from precdbg.storage.step_file import Payload
from precdbg.storage.writer import DumpWriter

v = S.Variant(task="tensor")
params = S.initial_params(v)
writer = DumpWriter(DUMP)
for step in range(4):
    built, _ = S.model_step(v, params, step, 0)
    S.write_step(writer, step, 0, [(built.records, built.payloads)], S.module_tree(v),
                 task="tensor")
    assert writer.flush(60)
    print(f"done {step}", flush=True)
S.write_run_json(DUMP, S.run_info(DUMP, v, {0: S.manifest_of(v, 0, 1, None, None)}))
built, _ = S.model_step(v, params, 4, 0)
writer.open_step(4, 0, {"framework": "pytorch", "task": "tensor", "level": "mix",
                        "world_size": 1})
writer.submit(built.records, built.payloads)
print("running 4", flush=True)
block = np.ones(1 << 20, np.float32)             # 4 MB a payload: the .partial grows
for k in range(64):
    writer.submit([], [Payload(1000 + k, block, True, False)])
    time.sleep(0.02)
time.sleep(600)                                  # step 4 stays open until killed
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_kill_9_of_a_writer_loses_only_the_step_being_written(tmp_path):
    dump = str(tmp_path / "dump")
    script = tmp_path / "writer.py"
    script.write_text(f"CORE = {CORE!r}\nDUMP = {dump!r}\n" + _WRITER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    partial = layout.partial_path(layout.step_file_path(dump, 4, 0))
    try:
        lines = lines_until(proc, "running 4", "the writer")
        assert lines == ["done 0", "done 1", "done 2", "done 3", "running 4"]
        deadline = time.time() + 60
        while not (os.path.exists(partial) and os.path.getsize(partial) > (8 << 20)):
            assert time.time() < deadline, f"{partial} was never written"
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.02)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    opened = precdbg.open_dump(dump)
    assert opened.steps == [0, 1, 2, 3] and opened.partial == [partial]
    v = S.Variant(task="tensor")
    params = S.initial_params(v)
    for step in range(4):
        built, _ = S.model_step(v, params, step, 0)
        table = opened.records(step=step)
        assert table["entry"].tolist() == [r.entry for r in built.records]
        gelu = opened.tensor("Functional.gelu.0.forward.output.0", step=step)
        want = next(p.array for p in built.payloads if p.tensor_id == next(
            r.tensor_id for r in built.records
            if r.entry == "Functional.gelu.0.forward" and r.role == "output"))
        assert gelu.tobytes() == want.tobytes()
    assert opened.warnings() == []
