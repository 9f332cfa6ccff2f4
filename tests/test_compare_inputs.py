"""What `precdbg compare` (and the other commands) do with the inputs users actually give them:
damaged files, dumps of other levels or tasks, steps or ranks only one dump holds, two named
files of different steps, outputs that would land on a dump, and the verdicts those cases used
to get wrong (a step that was never dumped called "matched", a loss scaled outside the model
named as the model's backward, a set-up difference blamed on the optimizer)."""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, Optional, Sequence

import h5py
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from precdbg.compare import compare_dumps
from precdbg_pt import PrecisionDebugger

from compare_support import run_cli


class _MLP(nn.Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU(approximate=approximate)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.act(self.fc1(x))))


class _Bf16Gelu(nn.Module):
    """A GELU computed in bfloat16 (cast, gelu, cast back): a port's precision slip."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x.to(torch.bfloat16)).float()


def _dump(path: Any, *, steps: int = 2, dumped: Optional[Sequence[int]] = None,
          level: str = "mix", task: str = "statistics", approximate: str = "none",
          data_change_at: Optional[int] = None, loss_scale: float = 1.0,
          bf16: bool = False, grad_scaler: bool = False, bf16_act: bool = False,
          perturb: Optional[str] = None) -> str:
    """A seeded MLP trained `steps` steps with AdamW, the guides' four lines dumping `dumped`;
    `grad_scaler`: the loss scaled by torch.amp.GradScaler (2^10); `bf16_act`: `act` computes
    in bfloat16."""
    torch.manual_seed(0)
    net = _MLP(approximate)
    if bf16_act:
        net.act = _Bf16Gelu()
    if perturb is not None:     # one weight 1e-3 off before training (a bad checkpoint load)
        with torch.no_grad():
            net.get_parameter(perturb).mul_(1 + 1e-3)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))
               for _ in range(steps)]
    dbg = PrecisionDebugger(dump_path=str(path), level=level, task=task,
                            step=list(range(steps)) if dumped is None else list(dumped))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if grad_scaler else None
    for step, (x, y) in enumerate(batches):
        if step == data_change_at:
            x = x * 1.05
        dbg.start(net)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), y)
        if grad_scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            (loss * loss_scale if loss_scale != 1.0 else loss).backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures
    return str(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return _dump(tmp_path_factory.mktemp("base") / "dump")


def _one_line_error(result: Any, *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("precdbg: "), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------- damaged input
def test_a_damaged_step_file_is_a_one_line_error_in_every_command(base, tmp_path):
    damaged = str(tmp_path / "damaged")
    shutil.copytree(base, damaged)
    target = os.path.join(damaged, "step0", "rank0.h5")
    size = os.path.getsize(target)
    with open(target, "r+b") as handle:          # metadata overwritten, the signature intact
        handle.seek(size // 3)
        handle.write(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    for command in (("compare", base, damaged), ("scan", damaged), ("check", base, damaged),
                    ("inspect", damaged)):      # inspect printed its header and exited 0
        _one_line_error(run_cli(*command), target)


def test_a_damaged_step_file_leaves_the_other_steps_to_commands_asked_for_them(base, tmp_path):
    """Step files are opened when read: a command asked for step 0 reads step 0, whatever became
    of step 1's file; the whole dump still fails in one line naming the damaged file."""
    damaged = str(tmp_path / "damaged")
    shutil.copytree(base, damaged)
    target = os.path.join(damaged, "step1", "rank0.h5")
    os.truncate(target, 2000)
    for command in (("inspect", damaged), ("scan", damaged), ("compare", base, damaged),
                    ("check", base, damaged)):
        result = run_cli(*command, "--step", "0")
        assert result.returncode in (0, 1), (command, result.stderr)
        assert "Traceback" not in result.stderr and target not in result.stderr, command
    assert "verdict: MATCH" in run_cli("compare", base, damaged, "--step", "0").stdout
    # the whole dump: step 0 compared, step 1 named as unreadable, incomplete (exit 3); step 1
    # alone has nothing to compare (exit 2)
    whole = run_cli("compare", base, damaged)
    assert whole.returncode == 3 and "Traceback" not in whole.stderr, whole.stderr
    named = [line for line in whole.stdout.splitlines() if target in line]
    assert named and all("truncated" in line for line in named), whole.stdout
    _one_line_error(run_cli("compare", base, damaged, "--step", "1"), target, "truncated")
    _one_line_error(run_cli("inspect", damaged, "--step", "1"), target)


def test_a_damaged_step_between_others_stops_neither_inspect_nor_compare_step(tmp_path):
    """Three steps, the middle one truncated: `inspect` shows steps 0 and 2, says which file it
    could not read and exits 2; `compare --step 2`, which judges step 2's parameters against
    step 1, compares step 2 and notes that step 1 could not be read."""
    clean = _dump(tmp_path / "clean", steps=3)
    damaged = str(tmp_path / "damaged")
    shutil.copytree(clean, damaged)
    target = os.path.join(damaged, "step1", "rank0.h5")
    os.truncate(target, 2000)
    shown = run_cli("inspect", damaged)
    _one_line_error(shown, target, "truncated")
    assert "step 0 rank 0: " in shown.stdout and "step 2 rank 0: " in shown.stdout
    said = [line for line in shown.stdout.splitlines() if line.startswith("step 1 rank 0: ")]
    assert len(said) == 1 and said[0].startswith("step 1 rank 0: unreadable: ") and \
        target in said[0] and "truncated" in said[0], shown.stdout
    compared = run_cli("compare", clean, damaged, "--step", "2")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "verdict: MATCH" in compared.stdout
    assert "step 1 rank 0, the step before the one compared, could not be read" in \
        compared.stdout, compared.stdout


def test_a_manifest_that_is_no_object_and_an_hdf5_file_of_another_tool(base, tmp_path):
    listed = str(tmp_path / "listed")
    shutil.copytree(base, listed)
    with open(os.path.join(listed, "run.json"), "w", encoding="utf-8") as handle:
        json.dump([1, 2], handle)
    _one_line_error(run_cli("compare", base, listed), "run.json", "not a precdbg manifest")
    other = tmp_path / "other" / "step0"
    other.mkdir(parents=True)
    with h5py.File(other / "rank0.h5", "w") as handle:
        handle["x"] = np.arange(3)
    _one_line_error(run_cli("inspect", str(tmp_path / "other")), "not a precdbg step file")


# --------------------------------------------------------------------------- outputs
def test_outputs_are_checked_before_the_compare_and_never_overwrite_a_dump(base, tmp_path):
    copy = str(tmp_path / "copy")
    shutil.copytree(base, copy)
    manifest = os.path.join(copy, "run.json")
    before = open(manifest, encoding="utf-8").read()
    result = run_cli("compare", base, copy, "--json", manifest)
    _one_line_error(result, "part of a dump being read")
    assert open(manifest, encoding="utf-8").read() == before
    step_file = os.path.join(copy, "step0", "rank0.h5")
    _one_line_error(run_cli("compare", base, copy, "--html", step_file), "part of a dump")
    result = run_cli("compare", base, copy, "--csv", str(tmp_path / "no_dir" / "rows.csv"))
    _one_line_error(result, "no such directory")
    assert result.stdout == ""                   # refused before comparing anything
    result = run_cli("compare", base, copy, "--json", str(tmp_path / "result.json"))
    assert result.returncode == 0, result.stderr
    assert json.load(open(tmp_path / "result.json", encoding="utf-8"))["verdict"] == "match"


def test_outputs_never_overwrite_another_dump_nor_each_other(base, tmp_path):
    """Not only the dumps being read: no output replaces another dump's run.json or step file,
    two outputs never share a file, and a failed write names its file."""
    other = str(tmp_path / "other")
    shutil.copytree(base, other)
    manifest, step_file = os.path.join(other, "run.json"), os.path.join(other, "step1", "rank0.h5")
    before = (open(manifest, "rb").read(), open(step_file, "rb").read())
    _one_line_error(run_cli("scan", base, "--json", manifest), "part of a dump")
    _one_line_error(run_cli("compare", base, base, "--csv", step_file), "part of a dump")
    assert (open(manifest, "rb").read(), open(step_file, "rb").read()) == before
    same = str(tmp_path / "same.json")
    _one_line_error(run_cli("compare", base, other, "--json", same, "--csv", same), "two outputs")
    if os.path.exists("/dev/full"):
        result = run_cli("compare", base, other, "--html", "/dev/full")
        assert result.returncode == 2 and result.stderr.startswith("precdbg: /dev/full: "), \
            result.stderr


def test_a_step_or_rank_the_dump_lacks_is_refused_by_every_reader_call(base):
    import precdbg
    with precdbg.open_dump(base) as dump:
        assert dump.modules(step=0) and dump.module_settings(step=0)
        for call in (dump.records, dump.modules, dump.module_settings):
            with pytest.raises(precdbg.PrecdbgError, match="no step 42"):
                call(42)
            with pytest.raises(precdbg.PrecdbgError, match="rank 7"):
                call(0, 7)


def test_compare_weights_refuses_a_tolerance_that_is_no_tolerance(tmp_path):
    weights = str(tmp_path / "w.pt")
    torch.save({"w": torch.ones(3)}, weights)
    for flag, value in (("--rtol", "-1"), ("--atol", "nan"), ("--atol", "inf")):
        _one_line_error(run_cli("compare-weights", weights, weights, flag, value), flag)
    assert run_cli("compare-weights", weights, weights).returncode == 0


def test_inspect_refuses_a_step_the_dump_lacks_and_a_negative_top(base):
    _one_line_error(run_cli("inspect", base, "--step", "7"), "no step 7", "[0, 1]")
    result = run_cli("inspect", base, "--top", "-1")
    assert result.returncode == 2 and "--top" in result.stderr


# --------------------------------------------------------------------------- what is compared
def test_a_step_that_was_not_dumped_is_not_called_matched(tmp_path):
    """Steps 0 and 2 dumped, the data changed at step 1: step 2's weights differ, and the
    verdict must say step 1 was not compared, not that it matched (and blame the optimizer)."""
    a = _dump(tmp_path / "a", steps=3, dumped=[0, 2])
    b = _dump(tmp_path / "b", steps=3, dumped=[0, 2], data_change_at=1)
    result = compare_dumps(a, b)
    first = result["first_divergence"]
    assert first is not None and first["step"] == 2 and first["kind"] == "param", first
    assert first["code"] == "parameters_differ", first
    assert "step_not_compared" in first["annotations"], first


def test_steps_only_one_dump_holds_and_incomplete_files_are_noted(base, tmp_path):
    short = str(tmp_path / "short")
    shutil.copytree(base, short)
    shutil.rmtree(os.path.join(short, "step1"))
    os.makedirs(os.path.join(short, "step2"))
    with open(os.path.join(short, "step2", "rank0.h5.partial"), "wb") as handle:
        handle.write(b"\0" * 64)
    notes = compare_dumps(base, short)["notes"]
    assert [n["code"] for n in notes] == ["not_compared", "partial_files"], notes


def test_two_named_files_of_different_steps_are_compared_with_each_other(base):
    one = os.path.join(base, "step0", "rank0.h5")
    other = os.path.join(base, "step1", "rank0.h5")
    result = compare_dumps(one, other)
    assert result["rows"], "nothing was compared"
    assert result["notes"][0]["code"] == "relabelled", result["notes"]
    assert result["verdict"] == "diverged"       # another batch, other weights


def test_a_module_level_dump_against_a_mix_one(base, tmp_path):
    """The API calls a module-level dump never recorded are no structural difference: the
    same run matches, and a changed GELU is named in `act`, not as 'calls differ' in fc1."""
    module = _dump(tmp_path / "module", level="module")
    result = compare_dumps(base, module)
    assert result["verdict"] == "match", result["first_divergence"]
    assert "levels_differ" in [n["code"] for n in result["notes"]], result["notes"]
    # the baseline's API records have no counterpart to miss: counted in the note, not listed
    assert not [u for u in result["unmatched"] if u["kind"] == "api"], result["unmatched"][:3]
    tanh = _dump(tmp_path / "module_tanh", level="module", approximate="tanh")
    first = compare_dumps(base, tanh)["first_divergence"]
    assert first is not None and (first["module"], first["op"]) == ("act", "gelu"), first
    assert first["code"] not in ("structure", "calls_differ"), first


def test_a_mix_dump_against_an_api_one(base, tmp_path):
    """Records of API calls pair whether or not the other dump counted its module calls (they
    were all left without counterpart: 650 of a BERT step); a changed GELU is named."""
    api = _dump(tmp_path / "api", level="api")
    result = compare_dumps(base, api)
    assert result["verdict"] == "match", result["first_divergence"]
    assert not [u for u in result["unmatched"] if u["kind"] == "api"], result["unmatched"][:3]
    assert "levels_differ" in [n["code"] for n in result["notes"]], result["notes"]
    tanh = _dump(tmp_path / "api_tanh", level="api", approximate="tanh")
    first = compare_dumps(base, tanh)["first_divergence"]
    assert first is not None and (first["kind"], first["module"], first["op"]) == \
        ("api", "act", "gelu"), first


def test_a_cast_in_one_run_only_is_named_at_level_api(tmp_path):
    """Level api records no module calls, but each API record names its module: a GELU
    computed in bfloat16 in one run (within bf16's tolerance, so no number exceeds one) is
    a structural difference of module `act` there too (it was MATCH, exit 0)."""
    for level in ("api", "mix"):
        base = _dump(tmp_path / f"{level}_base", level=level, steps=1)
        cast = _dump(tmp_path / f"{level}_cast", level=level, steps=1, bf16_act=True)
        result = compare_dumps(base, cast)
        first = result["first_divergence"]
        assert result["verdict"] == "diverged" and first is not None, level
        assert (first["kind"], first["module"]) == ("module", "act"), (level, first)
        assert first["code"] == "structure", (level, first)
    same = compare_dumps(_dump(tmp_path / "api_again", level="api", steps=1),
                         str(tmp_path / "api_base"))
    assert same["verdict"] == "match", same["first_divergence"]


def test_weights_that_entered_apart_name_the_farthest_apart_first(tmp_path):
    """Dumped three steps late: a weight changed before training differs most, the others the
    training steps moved apart from it less. The verdict and `check` name it first (they named
    the first parameter in the model's order, fc1's, though fc2.weight had moved 1e-3)."""
    base = _dump(tmp_path / "base", steps=4, dumped=[3])
    moved = _dump(tmp_path / "moved", steps=4, dumped=[3], perturb="fc2.weight")
    result = compare_dumps(base, moved)
    first = result["first_divergence"]
    assert first is not None and first["name_a"] == "Param.fc2.weight", first
    assert "more_parameters" in first["annotations"], first
    values = [f for f in result["setup"] if f["kind"] == "initial_values"]
    assert values and "the most first: fc2.weight (" in values[0]["message"], values


def test_overflow_dumps_are_refused_with_the_command_that_reads_them(base, tmp_path):
    overflow = _dump(tmp_path / "overflow", task="overflow")
    _one_line_error(run_cli("compare", base, overflow), "task 'overflow'", "precdbg scan")


def test_a_manifest_missing_leaves_the_framework_to_the_step_files(base, tmp_path):
    bare = str(tmp_path / "bare")
    shutil.copytree(base, bare)
    os.remove(os.path.join(bare, "run.json"))
    result = compare_dumps(base, bare)
    assert result["candidate"]["framework"] == "pytorch"
    full = compare_dumps(base, base)
    assert len(result["rows"]) == len(full["rows"])      # scalar arguments paired by name
    assert not any("frameworks differ" in n for n in result["notes"])


def test_a_mapping_keeps_the_non_tensor_arguments_paired(base, tmp_path):
    tanh = _dump(tmp_path / "tanh", approximate="tanh")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules: {nothing_here: fc1}\n")
    first = compare_dumps(base, tanh, mapping_file=str(mapping))["first_divergence"]
    assert first is not None and first["op"] == "gelu", first
    assert [(a["key"], a["a"], a["b"]) for a in first["evidence"]["arguments_bad"]] == \
        [("approximate", "none", "tanh")], first


# --------------------------------------------------------------------------- verdicts
def test_a_loss_scaled_outside_the_model_is_named_itself(base, tmp_path):
    scaled = _dump(tmp_path / "scaled", loss_scale=2.0)
    first = compare_dumps(base, scaled)["first_divergence"]
    assert first is not None and first["step"] == 0 and first["direction"] == "backward"
    assert first["name_b"] == "Tensor.mul.0.backward" and first["name_a"] == "", first


def test_a_grad_scaler_in_one_run_is_named_as_the_loss_scale(base, tmp_path):
    """GradScaler in the candidate only: the verdict is its scaling in the root module's
    backward, and says it is the loss scale check finds, which scales every gradient after."""
    scaled = _dump(tmp_path / "scaled", grad_scaler=True)
    first = compare_dumps(base, scaled)["first_divergence"]
    assert first is not None and first["step"] == 0 and first["direction"] == "backward"
    assert first["module"] == "" and "loss_scale" in first["annotations"], first


def test_a_set_up_difference_is_named_where_parameters_part():
    """Step k-1 matched and its dw agreed within tolerance, yet the weights part at step k:
    with compute dtypes or world size differing, the verdict names them, not the optimizer
    (and does not claim the same gradient gave a different update)."""
    from precdbg.compare.judge.multistep import other_setup
    from precdbg.compare.report.wording import param_reason
    findings = [{"severity": "high", "kind": "compute_dtype",
                 "message": "3 op(s) compute in other dtypes"},
                {"severity": "medium", "kind": "world_size", "message": "world size differs"},
                {"severity": "low", "kind": "threads", "message": "thread counts differ"}]
    others = other_setup(findings, [])
    assert others == ["3 op(s) compute in other dtypes", "world size differs"]
    metrics = {"update_share": 0.21, "dw_agreed": True}
    reason = param_reason(1, metrics, True, [], others)
    assert "the update differs" in reason and "compute in other dtypes" in reason
    assert "world size differs" in reason
    assert "optimizer update differs" not in reason and "optimizer type" not in reason
    assert "same gradient gave a different update" not in reason
    alone = param_reason(1, metrics, True, [], [])
    assert "the optimizer update differs" in alone and "same gradient" in alone
    with_optimizer = param_reason(1, metrics, True, ["lr differs"], others)
    assert "the optimizer update differs" in with_optimizer and "lr differs" in with_optimizer


_ENDS_IN_FORWARD = r"""
import sys, torch, torch.nn as nn
from precdbg_pt import PrecisionDebugger

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.relu(self.a(x)) * 2
        if sys.argv[2] == "exit":
            sys.exit(3)                       # the process ends inside the model's forward
        return self.b(h)

torch.manual_seed(0)
net = Net()
debugger = PrecisionDebugger(dump_path=sys.argv[1], level="mix")
debugger.start(net)
for micro_batch in range(2):              # gradient accumulation: two forwards, one step
    net(torch.ones(2, 8)).sum().backward()
    if sys.argv[2] == "between":
        sys.exit(3)                       # the process ends before the second micro-batch
debugger.stop(); debugger.step()
"""


def _whole_against_cut(tmp_path, how: str) -> Dict[str, Any]:
    """_ENDS_IN_FORWARD run whole and ended `how` (exit code 3), compared; the cut step
    matches as far as it got, and the set-up names it interrupted."""
    import subprocess
    import sys
    for name, mode in (("whole", "run"), ("cut", how)):
        proc = subprocess.run([sys.executable, "-c", _ENDS_IN_FORWARD, str(tmp_path / name),
                               mode], capture_output=True, text=True, timeout=300)
        assert proc.returncode == (3 if mode == how else 0), proc.stderr
    result = compare_dumps(str(tmp_path / "whole"), str(tmp_path / "cut"))
    # never a match (issue 45): the verdict is where the candidate stopped, and what ran
    # before is compared as far as both got (no "calls differ" of the root, no number apart)
    assert result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert "structure" not in first, first
    assert (first["unfinished"]["side"], first["unfinished"]["interrupted"]) == \
        ("candidate", True), first
    assert not [row for row in result["rows"] if row["status"] == "diverged"]
    assert any(f["kind"] == "incomplete" for f in result["setup"]), result["setup"]
    return result


def test_a_step_the_process_ended_inside_is_compared_as_far_as_it_got(tmp_path):
    """The candidate's step ended inside the model's forward (sys.exit): the root's calls up to
    there are those of the complete run, so the verdict is where it stopped (the root module's
    call, which never returned; the set-up names the interrupted step) instead of "the
    candidate calls nothing" in the root module."""
    result = _whole_against_cut(tmp_path, "exit")
    assert result["rows"] and result["unmatched_count"] > 0
    assert result["first_divergence"]["unfinished"]["module"] == ""


def test_a_step_that_ended_between_micro_batches_is_compared_as_far_as_it_got(tmp_path):
    """The candidate's process ended after the first of two micro-batches: the model's second
    forward call never began. Calls the process never reached are no structural difference
    (the root module was named: "calls differ ... 2 vs 1 calls")."""
    _whole_against_cut(tmp_path, "between")
