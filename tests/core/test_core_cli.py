"""The `precdbg` command as a user meets it, on synthetic dumps (tests/core/synthetic.py) and
through real subprocesses: `show` (one record in detail), the overview of bare `precdbg` and
`precdbg help`, the closest names for a mistyped command, dump or entry, every option's help,
one dump on both sides, a damaged step file, the tolerance beside every error, `inspect`'s
floating-point extremes, and a constructor's config error as one line. Assertions are on exit
codes and values, not on wording."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from precdbg.storage.reader import open_dump
from precdbg.storage.writer import DumpWriter

import synthetic as S
from test_core_compare import _cli, _one_line_error

GELU = "Functional.gelu.0.forward"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """A folder holding dump_clean (statistics), dump_tensor (tensors stored, steps 0 and 1)
    and dump_gelu (gelu's output 0.1% off)."""
    root = tmp_path_factory.mktemp("cli")
    S.write_dump(root / "dump_clean")
    S.write_dump(root / "dump_tensor", task="tensor", steps=(0, 1))
    S.write_dump(root / "dump_gelu", gelu_scale=1.001)
    return root


def _g(value: float) -> str:
    return f"{value:.6g}"


# --------------------------------------------------------------------------- show
def test_show_prints_statistics_producers_call_site_settings_and_tensors(dumps):
    proc = _cli("show", "dump_tensor", GELU, "--step", "1", cwd=str(dumps))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    with open_dump(str(dumps / "dump_tensor")) as dump:
        table = dump.records(1, 0)
        rows = np.nonzero(table["entry"] == GELU)[0]
        for i in rows:
            if table["dtype"][i].startswith("py."):
                continue
            line = next(x for x in out if x.split()[:2] == [table["role"][i],
                                                             str(table["arg_index"][i])])
            for column in ("min", "max", "mean", "norm"):
                assert _g(float(table[column][i])) in line.split(), (column, line)
            if table["role"][i] == "input":   # made by fc1's linear
                assert line.split()[-3:] == ["Functional.linear.0.forward", "output", "0"]
            stored = next(x for x in out if x.strip().startswith(
                f"{table['role'][i]} {table['arg_index'][i]} ") and "head [" in x)
            first = dump.tensor_at(table, int(i)).ravel()[0]
            assert stored.split("head [")[1].split(",")[0] == _g(float(first))
        settings = dump.module_settings(1, 0)["act"][1]
    assert all(line in out for line in ("  " + s for s in S.STACKS[1].splitlines()))
    assert any("layer settings" in x and f"approximate {settings['approximate']}" in x
               for x in out), out
    assert "step 1 rank 0" in proc.stdout


def test_show_of_an_unknown_entry_names_the_closest(dumps):
    line = _one_line_error(_cli("show", "dump_clean", "Functional.gleu.0.forward",
                                cwd=str(dumps)))
    assert GELU in line
    assert _cli("show", "dump_clean", GELU, "--step", "7", cwd=str(dumps)).returncode == 2


# --------------------------------------------------------------------------- the command line
def test_bare_precdbg_and_help_print_the_overview(dumps):
    from precdbg.cli.parser import COMMANDS
    bare, helped = _cli(cwd=str(dumps)), _cli("help", cwd=str(dumps))
    assert bare.returncode == helped.returncode == 0 and bare.stderr == ""
    assert bare.stdout == helped.stdout
    assert all(name in bare.stdout for name in COMMANDS)
    one = _cli("help", "compare", cwd=str(dumps))
    assert one.returncode == 0 and one.stdout == _cli("compare", "--help", cwd=str(dumps)).stdout


def test_a_mistyped_command_or_dump_gets_the_closest_name(tmp_path, dumps):
    line = _one_line_error(_cli("comapre", "a", "b", cwd=str(dumps)))
    assert line.endswith("compare?"), line
    shutil.copytree(dumps / "dump_clean", tmp_path / "dump_clean")
    for argv in (["inspect", "dump_nope"], ["compare", "dump_clean", "dump_nope"],
                 ["show", "dump_nope", GELU], ["scan", "dump_nope"]):
        line = _one_line_error(_cli(*argv, cwd=str(tmp_path)))
        assert line.startswith("precdbg: dump_nope:") and line.endswith("dump_clean?"), line


def test_every_option_has_help_and_every_command_an_example_and_exit_codes():
    import argparse

    from precdbg.cli import _RUN
    from precdbg.cli.parser import build_parser
    parser = build_parser(_RUN)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(_RUN)
    for name, command in sub.choices.items():
        assert command.description and f"precdbg {name} " in command.epilog
        assert re.search(r"\b0\b.*\b2\b", command.epilog, re.S), command.epilog
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"


def test_one_dump_on_both_sides_is_said_and_still_matches(dumps):
    proc = _cli("compare", "dump_clean", str(dumps / "dump_clean"), "--json", "r.json",
                cwd=str(dumps))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((dumps / "r.json").read_text())["verdict"] == "match"
    real = os.path.realpath(dumps / "dump_clean")
    assert [x for x in proc.stdout.splitlines() if real in x and x.startswith("note:")]
    other = _cli("compare", "dump_clean", "dump_gelu", cwd=str(dumps))
    assert other.returncode == 1 and real not in other.stdout


def test_a_truncated_step_file_is_said_without_hdf5_internals(tmp_path):
    root = S.write_dump(tmp_path / "dump", steps=(0, 1))
    damaged = os.path.join(root, "step1", "rank0.h5")
    os.truncate(damaged, os.path.getsize(damaged) // 3)
    # compare: the other step is compared, the damaged one named (exit 3: incomplete); a
    # compare of that step alone has nothing to compare (exit 2)
    for argv, code in ((["inspect", root], 2), (["compare", root, root], 3),
                       (["compare", root, root, "--step", "1"], 2),
                       (["show", root, GELU, "--step", "1"], 2)):
        proc = _cli(*argv, cwd=str(tmp_path))
        assert proc.returncode == code, (argv, proc.stderr)
        said = proc.stdout + proc.stderr
        assert damaged in said and "stored_eof" not in said and "sblock" not in said, said


# --------------------------------------------------------------------------- numbers
def test_every_error_in_the_text_verdict_has_its_tolerance(dumps):
    proc = _cli("compare", "dump_clean", "dump_gelu", "--json", "g.json", cwd=str(dumps))
    assert proc.returncode == 1, proc.stderr
    result = json.loads((dumps / "g.json").read_text())
    tols = {c["tol"] for c in result["consequences"]} | \
        {e["metrics"]["tol"] for e in result["first_divergence"]["evidence"]["outputs_bad"]}
    errs = [x for x in proc.stdout.splitlines() if re.search(r"\berr \d", x)]
    assert len(errs) >= 2
    for line in errs:
        found = re.findall(r"\berr [-\d.e+]+[ ,(]+tol ([-\d.e+]+)", line)
        assert len(found) == len(re.findall(r"\berr \d", line)), line
        assert all(float(t) in tols for t in found), (line, tols)


def test_inspect_lists_floating_point_extremes_only(tmp_path):
    b = S.StepBuilder()
    ids = b.tensor([50256, 7, 3], dtype="int64")
    for index, value in enumerate((ids, b.tensor([0.5, -2.0]), b.tensor([1.5]))):
        b.emit(entry=f"Save.t{index}.0", kind="saved", prefix="Save", api=f"t{index}",
               op="", module="", direction="forward", role="output", arg_index=0,
               arg_key="0", call_index=0, order=index, value=value)
    writer = DumpWriter(str(tmp_path / "dump"))
    S.write_step(writer, 0, 0, [(b.records, b.payloads)])
    assert writer.flush(60) and writer.shutdown() and writer.errors == 0
    proc = _cli("inspect", "dump", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("largest |values|:\n")[1].splitlines()
    assert [line.split()[1] for line in listed] == ["Save.t1.0", "Save.t2.0"]


# --------------------------------------------------------------------------- the constructor
_SCRIPT = textwrap.dedent("""\
    import sys
    from precdbg.capture import BaseDebugger
    if sys.argv[1] == "hook":          # the user's own hook: kept for everything else
        sys.excepthook = lambda kind, exc, tb: sys.stderr.write("mine " + kind.__name__ + "\\n")
    if sys.argv[1] == "caught":
        try:
            BaseDebugger(None, lambda: None, task="nope")
        except ValueError:
            print("caught")
        raise RuntimeError("later")
    if sys.argv[1] == "hook":
        try:
            BaseDebugger(None, lambda: None, task="nope")
        except ValueError:
            raise KeyError("other")
    BaseDebugger(None, lambda: None, task="nope")
""")


@pytest.mark.parametrize("mode", ["plain", "caught", "hook"])
def test_a_config_error_at_construction_is_one_line(tmp_path, mode):
    (tmp_path / "script.py").write_text(_SCRIPT)
    proc = subprocess.run([sys.executable, "script.py", mode], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    if mode == "plain":
        assert len(lines) == 1 and lines[0].startswith("precdbg: ") and "task" in lines[0]
    elif mode == "caught":        # caught by the script: the later error keeps its traceback
        assert proc.stdout == "caught\n" and lines[0].startswith("Traceback")
        assert lines[-1].startswith("RuntimeError")
    else:                         # another exception goes to the user's hook, as before
        assert lines == ["mine KeyError"]


def test_compare_in_process_leaves_the_collector_as_it_found_it(tmp_path, monkeypatch):
    """`precdbg compare` tunes the garbage collector for its many short-lived objects (frozen
    imports, a larger youngest generation) and gives it back as it was, also when it fails:
    a script that calls `precdbg.cli.main` goes on with its own settings."""
    import gc
    import precdbg.compare
    from precdbg.cli import main
    a = S.write_dump(tmp_path / "a")
    b = S.write_dump(tmp_path / "b", gelu_scale=1.01)
    during = []
    compare = precdbg.compare.compare_dumps

    def spy(*args, **kwargs):
        during.append((gc.get_threshold()[0], gc.get_freeze_count() > 0))
        return compare(*args, **kwargs)
    monkeypatch.setattr(precdbg.compare, "compare_dumps", spy)
    before = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        assert main(["compare", a, b, "--jobs", "1"]) == 1
        assert during == [(20000, True)]
        assert gc.get_threshold() == (1234, 5, 6) and gc.get_freeze_count() == 0
        assert main(["compare", a, str(tmp_path / "none")]) == 2
        assert gc.get_threshold() == (1234, 5, 6) and gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*before)
