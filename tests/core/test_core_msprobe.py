"""msprobe's dump folders read as dumps (precdbg.storage.msprobe_dump), from dumps msprobe itself
wrote (tests/data/msprobe, see its README): the records, module tree and call stacks; msprobe
against msprobe through the command (the GELU defect named, a clean pair matching); damaged or
partial folders said in one line naming the file, what is readable still read."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import precdbg

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                    "msprobe")
CLEAN, GELU = os.path.join(DATA, "stat_mix_clean"), os.path.join(DATA, "stat_mix_gelu")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300)


def test_an_msprobe_dump_reads_as_records_modules_and_stacks():
    with precdbg.open_dump(CLEAN) as dump:
        assert dump.source == "msprobe" and dump.steps == [0, 1] and dump.ranks == [0]
        assert (dump.setting("framework"), dump.setting("task"), dump.setting("level")) == \
            ("pytorch", "statistics", "mix")
        t = dump.records(0, 0)
        kinds = set(zip(t["kind"].tolist(), t["direction"].tolist(), t["role"].tolist()))
        assert {("api", "forward", "input"), ("api", "forward", "output"),
                ("module", "forward", "input"), ("module", "backward", "grad_input"),
                ("param", "none", "param"), ("param_grad", "backward", "param_grad")} <= kinds
        # entries keep msprobe's names; a Tensor operator reads under precdbg's (x + y: add)
        entries = set(t["entry"].tolist())
        assert {"Functional.gelu.1.forward", "Module.blocks.1.act.GELU.forward.0",
                "Param.blocks.1.fc1.weight", "Param.blocks.1.fc1.weight.grad",
                "Tensor.add.0.forward"} <= entries
        assert not [e for e in entries if "__add__" in e]
        # msprobe counts no NaN/Inf: finite extremes read as none; no order-sensitive mean
        tensors = t["dtype"] == "float32"
        assert (t["nan_count"][tensors] == 0).all() and (t["inf_count"][tensors] == 0).all()
        assert np.isnan(t["pos_mean"]).all()
        # a forward call: inputs, its non-tensor arguments as values, outputs; in its module
        gelu = t.select(t["entry"] == "Functional.gelu.1.forward")
        assert gelu["module"].tolist() == ["blocks.1.act"] * 3
        assert (gelu["role"].tolist(), gelu["dtype"].tolist(), gelu["text"][1]) == \
            (["input", "input", "output"], ["float32", "py.str", "float32"], "none")
        # a module's inputs are recorded before the calls inside it, its outputs after
        seq = {(e, r): s for e, r, s in zip(t["entry"].tolist(), t["role"].tolist(),
                                            t["seq"].tolist())}
        assert seq[("Module.blocks.1.act.GELU.forward.0", "input")] < \
            seq[("Functional.gelu.1.forward", "input")] < \
            seq[("Module.blocks.1.act.GELU.forward.0", "output")]
        modules = dump.modules(0, 0)
        assert ("blocks.1.act", "GELU", "blocks.1") in modules and ("blocks", "", "") in modules
        row = int(np.nonzero(t["entry"] == "Functional.gelu.1.forward")[0][0])
        stacks = dump.stacks(0, 0)
        assert "make_dumps.py:" in stacks[int(t["stack_id"][row])].split("\n")[0]
        # the calls msprobe's risk level skips are known as seen, not recorded
        assert "Tensor.reshape.0.forward" in dump.unrecorded(0, 0)


def test_msprobe_against_msprobe_names_the_gelu_defect(tmp_path):
    out = str(tmp_path / "r.json")
    proc = _cli("compare", CLEAN, GELU, "--json", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = json.loads(open(out, encoding="utf-8").read())["first_divergence"]
    assert (first["name_a"], first["module"], first["step"], first["role"]) == \
        ("Functional.gelu.1.forward", "blocks.1.act", 0, "output")
    proc = _cli("compare", CLEAN, CLEAN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for command in ("inspect", "scan"):
        proc = _cli(command, CLEAN)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)


def _copy(tmp_path, name: str) -> str:
    dest = str(tmp_path / name)
    shutil.copytree(CLEAN, dest)
    return dest


def _rank_folder(root: str, step: int = 0) -> str:
    step_dir = os.path.join(root, f"step{step}")
    return os.path.join(step_dir, os.listdir(step_dir)[0])


def test_a_dump_json_cut_short_is_one_line_naming_it(tmp_path):
    root = _copy(tmp_path, "cut")
    path = os.path.join(_rank_folder(root), "dump.json")
    text = open(path, encoding="utf-8").read()
    open(path, "w", encoding="utf-8").write(text[:len(text) // 2])
    proc = _cli("compare", root, CLEAN, "--step", "0")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert path in lines[0] and "cut short" in lines[0], lines
    # the other step is still read
    proc = _cli("compare", root, CLEAN, "--step", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_missing_construct_json_is_said_and_the_rest_read(tmp_path):
    root = _copy(tmp_path, "noconstruct")
    os.remove(os.path.join(_rank_folder(root), "construct.json"))
    with precdbg.open_dump(root) as dump:
        t = dump.records(0, 0)
        assert len(t) and "Functional.gelu.1.forward" in set(t["entry"].tolist())
        warned = dump.notes()
    assert [w for w in warned if "construct.json" in w and "missing" in w], warned
    proc = _cli("inspect", root)
    assert proc.returncode == 0 and "construct.json" in proc.stdout + proc.stderr, \
        proc.stdout + proc.stderr


def test_tensor_files_read_without_torch_and_absent_ones_are_said():
    # task tensor, 6 of 198 tensor files kept: those read (no torch: this is the core suite),
    # the others said once, their statistics still read
    with precdbg.open_dump(os.path.join(DATA, "tensor_mix_part")) as dump:
        assert dump.setting("task") == "tensor"
        out = dump.tensor("Functional.gelu.1.forward.output.0", 0, 0)
        t = dump.records(0, 0)
        row = t.row(int(np.nonzero((t["entry"] == "Functional.gelu.1.forward")
                                   & (t["role"] == "output"))[0][0]))
        assert out.shape == row["shape"] and out.dtype == np.float32
        assert (float(out.max()), float(out.min())) == pytest.approx((row["max"], row["min"]),
                                                                     rel=1e-7)
        weight = dump.tensor("Functional.linear.2.forward.input.1", 0, 0)
        assert weight.shape == (16, 8)
        warned = dump.notes()
        assert [w for w in warned if "192 tensor file(s)" in w and "absent" in w], warned
        with pytest.raises(precdbg.DumpError, match="statistics only"):
            dump.tensor("Functional.gelu.0.forward.output.0", 0, 0)


def test_msprobe_mindspore_dumps_read_and_name_the_gelu_setting():
    ms = os.path.join(DATA, "mindspore")
    clean, gelu = os.path.join(ms, "ms_stat_mix_clean"), os.path.join(ms, "ms_stat_mix_gelu")
    with precdbg.open_dump(clean) as dump:
        assert dump.setting("framework") == "mindspore"
        t = dump.records(0, 0)
        kinds = dict(zip(t["entry"].tolist(), t["kind"].tolist()))
        # Cells are modules; primitives and mint calls are API calls; MindSpore's dtypes read
        assert kinds["Cell.blocks.1.act.GELU.forward.0"] == "module"
        assert {e.split(".")[0] for e, k in kinds.items() if k == "api"} >= {"Functional",
                                                                               "Primitive"}
        assert set(t["dtype"].tolist()) >= {"float32", "int32"}
        assert "Param.blocks.0.ln1.gamma" in kinds
    with precdbg.open_dump(gelu) as dump:
        dump.records(0, 0)
        assert [w for w in dump.notes() if "stack.json" in w and "missing" in w]
    proc = _cli("compare", clean, gelu, "--json", os.devnull)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Functional.gelu.1.forward" in proc.stdout and "blocks.1.act" in proc.stdout


def test_checksums_without_statistics_decide_both_ways():
    # summary_mode xor: checksums only; a run matches itself, and two steps of one run (the
    # weights moved) differ by checksum, judged so
    xor = os.path.join(DATA, "xor_mix_clean")
    proc = _cli("compare", xor, xor)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from precdbg.compare import compare_dumps
    result = compare_dumps(os.path.join(xor, "step0"), os.path.join(xor, "step1"))
    assert result["verdict"] == "diverged"
    assert result["first_divergence"]["name_a"] == "Param.emb.weight"
    judged = {r["judged_by"] for r in result["rows"] if r["kind"] == "param"}
    assert judged == {"checksum"}, judged


def test_msprobe_mindtorch_dump_reads():
    # msprobe on mindnlp's mindtorch 0.5.1 (framework "mindtorch": PyTorch's names, MindSpore's
    # dtype names): read, and a run matches itself
    mt = os.path.join(DATA, "mindtorch", "mt_stat_mix_clean")
    with precdbg.open_dump(mt) as dump:
        assert dump.setting("framework") == "mindtorch" and not dump.notes()
        t = dump.records(0, 0)
        assert {"api", "module", "param", "param_grad"} == set(t["kind"].tolist())
        assert "float32" in set(t["dtype"].tolist())
    proc = _cli("compare", mt, mt)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_level_l1_against_mix_leaves_parameters_out(tmp_path):
    # an msprobe step without parameters (level L1): the other side's are left out (the note
    # msprobe_dumps says so)
    root = str(tmp_path / "l1")
    shutil.copytree(CLEAN, root)
    for step in ("step0", "step1"):
        folder = _rank_folder(root, int(step[4:]))
        path = os.path.join(folder, "dump.json")
        data = json.loads(open(path, encoding="utf-8").read())
        data["level"] = "L1"
        data["data"] = {k: v for k, v in data["data"].items() if not k.startswith("Module.")}
        open(path, "w", encoding="utf-8").write(json.dumps(data))
        open(os.path.join(folder, "construct.json"), "w", encoding="utf-8").write("{}")
    from precdbg.compare import compare_dumps
    result = compare_dumps(root, CLEAN)
    assert result["verdict"] == "match", result["first_divergence"]
    assert not [r for r in result["rows"] if r["kind"] in ("param", "param_grad", "module")]
    assert "msprobe_dumps" in [n["code"] for n in result["notes"]], result["notes"]


def test_entries_not_in_msprobes_format_are_left_out_and_said(tmp_path):
    # valid JSON, odd contents: a shape of text, an infinite dimension, arguments that are not
    # lists, a parameters_grad of text, a name outside msprobe's forms; never a traceback
    folder = tmp_path / "odd" / "step0" / "rank0"
    folder.mkdir(parents=True)
    tensor = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [3], "Max": 1,
              "Min": 0, "Mean": 0.5, "Norm": 1}
    data = {"task": "statistics", "level": "mix", "framework": "pytorch", "data": {
        "Functional.linear.0.forward": {"input_args": [dict(tensor, shape=[2, "x"])],
                                        "input_kwargs": [1], "output": {"a": 1}},
        "Functional.relu.0.forward": {"input_args": "oops", "input_kwargs": None,
                                      "output": [tensor]},
        "Functional.relu.0.backward": {"input": tensor, "output": "x"},
        "Module.a.Linear.parameters_grad.0": {"weight": "nope", "bias": [None]},
        "Module.a.Linear.forward.0": {"input_args": [], "input_kwargs": {}, "output": [],
                                      "parameters": {"weight": dict(tensor, shape=[1e400])}},
        "garbage": [1, 2]}}
    (folder / "dump.json").write_text(json.dumps(data), encoding="utf-8")
    (folder / "construct.json").write_text(json.dumps({"Functional.relu.0.forward": [1]}),
                                           encoding="utf-8")
    (folder / "stack.json").write_text(json.dumps({"0": "bad", "1": [[1], "x"]}),
                                       encoding="utf-8")
    root = str(tmp_path / "odd")
    with precdbg.open_dump(root) as dump:
        t = dump.records(0, 0)
        assert set(t["entry"].tolist()) == {"Functional.relu.0.forward",
                                            "Functional.relu.0.backward"}
        notes = dump.notes()
    assert [n for n in notes if "2 entries" in n], notes
    for args in (("inspect", root), ("scan", root), ("compare", root, root)):
        proc = _cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
