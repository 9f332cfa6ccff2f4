"""Align, judge, localize and report on synthetic dumps, without a framework: pairs of runs of the
synthetic MLP (tests/core/synthetic.py) that differ in one known place, compared by
`precdbg.compare.compare_dumps` and by the `precdbg compare` command (exit codes 0 match,
1 divergence, 2 unusable input; JSON, CSV and HTML reports). The assertions are on the JSON
contract's codes and values: `verdict`, `first_divergence` (`kind`, `name_a`, `name_b`,
`direction`, `role`, `module`, `op`, `evidence`, `structure`, `chain`), row `status`, `unmatched`,
and the `kind` of the set-up findings."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List

import pytest

from precdbg.compare import compare_dumps
from precdbg.compare.judge.metrics import PARAM_TOLERANCE, TOLERANCE
from precdbg.storage import layout

import synthetic as S

FIRST_KEYS = {"step", "rank", "direction", "kind", "name_a", "name_b", "module", "op", "role",
              "metrics", "reason", "evidence", "chain"}
RESULT_KEYS = {"verdict", "first_divergence", "consequences", "unmatched", "unmatched_count",
               "notes", "setup", "rows", "baseline", "candidate"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """The reference run: one step of the float32 MLP at level mix, statistics."""
    return S.write_dump(tmp_path_factory.mktemp("reference") / "dump")


def _pair(tmp_path, base: Dict[str, Any] = None, **changes: Any) -> Dict[str, Any]:
    base = base or {}
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, **changes))
    return compare_dumps(a, b)


def _diverged(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [row for row in result["rows"] if row["status"] == "diverged"]


def _first(result: Dict[str, Any], **expected: Any) -> Dict[str, Any]:
    assert result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert FIRST_KEYS <= set(first), sorted(FIRST_KEYS - set(first))
    got = {key: first[key] for key in expected}
    assert got == expected, first["reason"]
    assert first["chain"] and first["chain"][-1]["name_a"] in (first["name_a"], "")
    return first


def _setup_kinds(result: Dict[str, Any]) -> Dict[str, str]:
    return {f["kind"]: f["severity"] for f in result["setup"]}


# --------------------------------------------------------------------------- identical runs
@pytest.mark.parametrize("base", [
    {}, {"dtype": "bfloat16"}, {"dtype": "float16"}, {"task": "tensor"}, {"level": "module"},
    {"checksum": True}, {"steps": (0, 1, 2)}, {"ranks": (0, 1)}, {"extra_call": True},
], ids=lambda b: "-".join(f"{k}={v}" for k, v in b.items()) or "reference")
def test_identical_runs_match(tmp_path, base):
    result = _pair(tmp_path, base)
    assert RESULT_KEYS <= set(result)
    assert result["verdict"] == "match" and result["first_divergence"] is None
    assert result["consequences"] == [] and result["unmatched"] == []
    assert result["unmatched_count"] == 0 and result["setup"] == []
    statuses = {row["status"] for row in result["rows"]}
    assert statuses == {"match"}
    v = S.Variant(**base)
    built, _ = S.model_step(v, S.initial_params(v), 0, 0)
    assert len(result["rows"]) == len(built.records) * len(v.steps) * len(v.ranks)
    if base.get("checksum"):
        assert {row["checksum_equal"] for row in result["rows"] if row["dtype_a"]
                .startswith("float")} == {True}
    if base.get("task") == "tensor":
        assert all(row["cosine"] == pytest.approx(1.0) for row in result["rows"]
                   if row["dtype_a"] == "float32" and row["norm_a"])


# --------------------------------------------------------------------------- numeric culprits
def test_an_op_whose_output_differs_while_its_inputs_agree_is_named(tmp_path):
    result = _pair(tmp_path, gelu_scale=1.001)
    first = _first(result, step=0, rank=0, kind="api", name_a="Functional.gelu.0.forward",
                   name_b="Functional.gelu.0.forward", direction="forward", role="output",
                   module="act", op="gelu")
    assert first["metrics"]["err"] > first["metrics"]["tol"] == TOLERANCE["float32"]
    where = S.STACKS[1].splitlines()[0]                 # the call's own frame
    assert first["call_site"] == {"baseline": where, "candidate": where}
    assert first["evidence"]["inputs_bad"] == [] and first["evidence"]["inputs_agreeing"] >= 1
    assert [(x["role"], x["arg_index"]) for x in first["evidence"]["outputs_bad"]] == \
        [("output", 0)]
    rows = {(r["name_a"], r["role"], r["arg_index"]): r["status"] for r in result["rows"]}
    assert rows[("Functional.gelu.0.forward", "input", 0)] == "match"
    assert rows[("Functional.gelu.0.forward", "input", 1)] == "match"
    assert rows[("Functional.gelu.0.forward", "output", 0)] == "diverged"
    assert rows[("Functional.linear.0.forward", "output", 0)] == "match"     # upstream
    assert rows[("Functional.linear.1.forward", "output", 0)] == "diverged"  # downstream
    named = {c["name_a"] for c in result["consequences"]}
    assert "Functional.linear.1.forward" in named and "Functional.linear.0.forward" not in named
    assert "Functional.gelu.0.forward" not in named
    # the module holding it is no consequence of its own, nor a second culprit
    assert "Module.act.GELU.forward.0" not in named
    producers = {(r["name_a"], r["role"], r["arg_index"]): r["producer_a"]
                 for r in result["rows"]}
    assert producers[("Functional.linear.1.forward", "input", 0)] == "Functional.gelu.0.forward"
    assert producers[("Functional.gelu.0.forward", "input", 0)] == "Functional.linear.0.forward"


def test_data_that_nothing_captured_produced_is_an_input_data_verdict(tmp_path):
    result = _pair(tmp_path, input_scale=1.01)
    first = _first(result, kind="module", name_a="Module.MLP.forward.0", direction="forward",
                   role="input", module="")
    assert [x["role"] for x in first["evidence"]["inputs_bad"]] == ["input"]
    assert "producer" not in first["evidence"]["inputs_bad"][0]
    assert _setup_kinds(result).get("batch") == "high"


def test_a_backward_only_difference_is_named_in_the_backward(tmp_path):
    result = _pair(tmp_path, gelu_grad_scale=1.001)
    _first(result, kind="api", name_a="Functional.gelu.0.backward", direction="backward",
           role="grad_input", module="act", op="gelu")
    assert {r["direction"] for r in _diverged(result)} == {"backward"}
    assert all(r["status"] == "match" for r in result["rows"] if r["direction"] != "backward")


def test_a_dw_only_difference_is_named_at_the_weight_gradient(tmp_path):
    """Level module records no linear backward: only fc1.weight's gradient differs, while the
    forward and every dx agree."""
    result = _pair(tmp_path, {"level": "module"}, dw_scale=1.01)
    _first(result, kind="param_grad", name_a="Param.fc1.weight.grad", direction="backward",
           role="param_grad", module="fc1")
    assert [(r["name_a"], r["role"]) for r in _diverged(result)] == \
        [("Param.fc1.weight.grad", "param_grad")]


def test_a_dw_difference_at_level_mix_is_named_at_the_linear_backward(tmp_path):
    result = _pair(tmp_path, dw_scale=1.01)
    first = _first(result, kind="api", name_a="Functional.linear.0.backward",
                   direction="backward", role="grad_input", module="fc1")
    assert [x["arg_index"] for x in first["evidence"]["outputs_bad"]] == [1]
    assert {r["name_a"] for r in _diverged(result)} == {"Functional.linear.0.backward",
                                                        "Param.fc1.weight.grad"}


def test_a_nan_one_op_produced_is_named_at_that_op(tmp_path):
    result = _pair(tmp_path, nan_in_gelu=True)
    first = _first(result, kind="api", name_a="Functional.gelu.0.forward", role="output")
    metrics = first["evidence"]["outputs_bad"][0]["metrics"]
    assert "err" in metrics
    gelu_out = next(r for r in result["rows"] if r["name_a"] == "Functional.gelu.0.forward"
                    and r["role"] == "output")
    assert (gelu_out["nan_a"], gelu_out["nan_b"]) == (0, 1)


# --------------------------------------------------------------------------- parameters
def test_a_parameter_that_differs_at_the_start_is_an_inventory_verdict(tmp_path):
    result = _pair(tmp_path, weight_scale=1.01)
    first = _first(result, kind="param", name_a="Param.fc2.weight", role="param", module="fc2",
                   direction="forward")     # the contract's two directions; its chain says none
    assert first["chain"][0]["direction"] == "none"
    assert _setup_kinds(result).get("initial_values") == "high"
    assert result["consequences"]          # what the weight changed downstream


def test_another_learning_rate_shows_in_the_next_step_and_in_the_setup(tmp_path):
    result = _pair(tmp_path, {"steps": (0, 1)}, lr=0.2)
    first = _first(result, step=1, kind="param")
    assert all(r["status"] == "match" for r in result["rows"] if r["step"] == 0)
    lr = [f for f in result["setup"] if f["kind"] == "optimizer"]
    assert len(lr) == 1 and lr[0]["severity"] == "high" and lr[0]["hyperparameter"] == "lr"
    assert (float(lr[0]["a"]), float(lr[0]["b"])) == (0.1, 0.2)
    assert first["chain"][0]["step"] == 1


# --------------------------------------------------------------------------- structure
def test_an_extra_call_in_one_run_is_a_structural_difference(tmp_path):
    result = _pair(tmp_path, extra_call=True)
    first = _first(result, kind="module", name_a="Module.act.GELU.forward.0",
                   direction="forward", module="act")
    assert first["structure"]["calls_a"] == ["Functional.gelu"]
    assert first["structure"]["calls_b"] == ["Functional.gelu", "Tensor.mul"]
    assert first["structure"]["settings"] == []
    assert _diverged(result) == []           # x * 1.0 changes no number
    only = {(u["side"], u["name"], u["role"], u["arg_index"]) for u in result["unmatched"]}
    assert only == {("b", "Tensor.mul.0.forward", "input", 0),
                    ("b", "Tensor.mul.0.forward", "input", 1),
                    ("b", "Tensor.mul.0.forward", "output", 0),
                    ("b", "Tensor.mul.0.backward", "grad_output", 0),
                    ("b", "Tensor.mul.0.backward", "grad_input", 0)}
    assert result["unmatched_count"] == 5
    # every record the runs share is paired
    v = S.Variant()
    built, _ = S.model_step(v, S.initial_params(v), 0, 0)
    assert len(result["rows"]) == len(built.records)


def test_a_layer_setting_that_changes_the_numbers_names_the_call_with_the_setting(tmp_path):
    result = _pair(tmp_path, approximate="tanh")
    first = _first(result, kind="api", name_a="Functional.gelu.0.forward", role="output",
                   module="act")
    assert first["structure"]["settings"] == [{
        "path_a": "act", "path_b": "act", "cls_a": "GELU", "cls_b": "GELU", "op": "gelu",
        "setting": "approximate", "a": "none", "b": "tanh"}]
    argument = first["evidence"]["arguments_bad"]
    assert [(x["key"], x["a"], x["b"]) for x in argument] == [("approximate", "none", "tanh")]
    assert _setup_kinds(result).get("layer_settings") == "medium"


def test_a_layer_setting_alone_is_a_structural_verdict(tmp_path):
    """The module trees record other settings while every number agrees: a structural
    difference counts whether or not the numbers stay within tolerance."""
    result = _pair(tmp_path, settings_approximate="tanh")
    first = _first(result, kind="module", name_a="Module.act.GELU.forward.0", module="act")
    assert [(d["setting"], d["a"], d["b"]) for d in first["structure"]["settings"]] == \
        [("approximate", "none", "tanh")]
    assert first["structure"]["calls_a"] == first["structure"]["calls_b"] == []
    assert _diverged(result) == []


# --------------------------------------------------------------------------- tolerance by dtype
@pytest.mark.parametrize("dtype,change,verdict", [
    ("bfloat16", {"gelu_ulps": 2}, "match"),          # as another kernel rounds: within
    ("bfloat16", {"gelu_ulps": 4}, "match"),
    ("bfloat16", {"gelu_scale": 1.03}, "diverged"),   # ~8 bf16 ulps: beyond
    ("float16", {"gelu_ulps": 4}, "match"),
    ("float16", {"gelu_scale": 1.01}, "diverged"),
    ("float32", {"gelu_ulps": 4}, "match"),
    ("float32", {"gelu_scale": 1.001}, "diverged"),   # within bf16's tolerance, not float32's
])
def test_tolerance_follows_the_dtype(tmp_path, dtype, change, verdict):
    result = _pair(tmp_path, {"dtype": dtype}, **change)
    assert result["verdict"] == verdict, result["first_divergence"]
    tolerances = {r["tol"] for r in result["rows"] if r["dtype_a"] == dtype
                  and r["kind"] != "param"}
    assert tolerances == {TOLERANCE[dtype]}
    # parameters at the start of a step are loaded or updated, not computed: tighter
    assert {r["tol"] for r in result["rows"] if r["kind"] == "param"} == \
        {min(TOLERANCE[dtype], PARAM_TOLERANCE)}
    if verdict == "diverged":
        _first(result, kind="api", name_a="Functional.gelu.0.forward", role="output")
    else:
        gelu = next(r for r in result["rows"] if r["name_a"] == "Functional.gelu.0.forward"
                    and r["role"] == "output")
        assert 0 < gelu["err"] <= gelu["tol"]          # it differs, within tolerance


def test_below_float32_min_and_max_count_at_a_quarter(tmp_path):
    """One element is all min or max are: below float32 they may each round another way in
    another kernel, and are held against four times the tolerance (two units in the last
    place). The largest gelu output one bf16 ulp up (about 0.7 % of it) is within; at float32
    the same change is far beyond."""
    result = _pair(tmp_path / "bf16", {"dtype": "bfloat16", "batch": 64}, gelu_max_ulps=1)
    assert result["verdict"] == "match", result["first_divergence"]
    gelu = next(r for r in result["rows"] if r["name_a"] == "Functional.gelu.0.forward"
                and r["role"] == "output")
    assert gelu["tol"] < gelu["d_max"] <= 4 * gelu["tol"]
    assert gelu["d_max"] / 4 <= gelu["err"] < gelu["d_max"]
    wide = _pair(tmp_path / "f32", {"batch": 64}, gelu_max_ulps=1 << 16)   # 2^16 f32 ulps
    _first(wide, name_a="Functional.gelu.0.forward", role="output")


def test_tolerances_are_ordered_by_precision():
    assert TOLERANCE["float64"] < TOLERANCE["float32"] < TOLERANCE["float16"] \
        < TOLERANCE["bfloat16"]


def test_stored_tensors_see_what_statistics_cannot(tmp_path):
    """Two output elements swapped keep min, max, mean and norm: statistics see the first
    difference where it changes a statistic (the next linear's output); stored tensors see
    it at the op that made it."""
    stats = _pair(tmp_path / "stats", gelu_swap=True)
    gelu = next(r for r in stats["rows"] if r["name_a"] == "Functional.gelu.0.forward"
                and r["role"] == "output")
    assert gelu["status"] == "match"
    _first(stats, name_a="Functional.linear.1.forward", role="output")
    tensors = _pair(tmp_path / "tensors", {"task": "tensor"}, gelu_swap=True)
    first = _first(tensors, name_a="Functional.gelu.0.forward", role="output")
    assert first["metrics"]["rel_rmse"] > 0 and first["metrics"]["cosine"] < 1


# --------------------------------------------------------------------------- several ranks
def test_every_rank_and_step_is_compared(tmp_path):
    result = _pair(tmp_path, {"ranks": (0, 1), "steps": (0, 1)}, gelu_scale=1.001)
    _first(result, step=0, rank=0, name_a="Functional.gelu.0.forward")
    assert {(r["step"], r["rank"]) for r in result["rows"]} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    one = compare_dumps(str(tmp_path / "a"), str(tmp_path / "b"), step=1, rank=1)
    assert {(r["step"], r["rank"]) for r in one["rows"]} == {(1, 1)}


# --------------------------------------------------------------------------- the command
def _cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    """`python -m precdbg ARGS` from `cwd` (not the repository: the precdbg installed in this
    interpreter is the one tested)."""
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precdbg: "), proc.stderr
    return lines[0]


def test_compare_command_exit_codes_and_reports(tmp_path, reference):
    same = S.write_dump(tmp_path / "same")
    proc = _cli("compare", reference, same, "--json", str(tmp_path / "same.json"),
                cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "same.json").read_text())["verdict"] == "match"

    other = S.write_dump(tmp_path / "other", gelu_scale=1.001)
    out = {k: str(tmp_path / f"r.{k}") for k in ("json", "csv", "html")}
    proc = _cli("compare", reference, other, "--json", out["json"], "--csv", out["csv"],
                "--html", out["html"], cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(open(out["json"], encoding="utf-8").read())
    assert RESULT_KEYS <= set(report)
    assert report["verdict"] == "diverged"
    assert (report["first_divergence"]["name_a"], report["first_divergence"]["role"]) == \
        ("Functional.gelu.0.forward", "output")
    assert report == json.loads(json.dumps(compare_dumps(reference, other), default=str))
    with open(out["csv"], newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(report["rows"])
    assert {"name_a", "name_b", "role", "status", "err", "tol"} <= set(rows[0])
    assert [(r["name_a"], r["role"], r["status"]) for r in rows] == \
        [(r["name_a"], r["role"], r["status"]) for r in report["rows"]]
    page = open(out["html"], encoding="utf-8").read()
    match = re.search(r'<script type="application/json" id="precdbg-data">(.*?)</script>',
                      page, re.S)
    assert page.lstrip().lower().startswith("<!doctype html") and match
    data = json.loads(match.group(1))
    assert data["format"] == "precdbg-report" and data["verdict"] == "diverged"
    assert data["rows"]["count"] == len(report["rows"])
    assert data["first_divergence"]["name_a"] == "Functional.gelu.0.forward"
    # each row carries its record's phase (the page folds the optimizer's calls by it)
    phases = {(r["direction"], r["kind"], r["phase"]) for r in report["rows"]}
    assert {("forward", "api", "forward"), ("backward", "api", "backward"),
            ("none", "param", "setup")} <= phases, phases
    strings = data["strings"]
    assert sorted({strings[k] for k in data["rows"]["phase"]}) == \
        sorted({r["phase"] for r in report["rows"]})
    assert [tree["path"] for tree in data["trees"]][0] == [p for p, _, _ in S.MODULES]


def test_inspect_check_and_scan_commands_run_on_synthetic_dumps(tmp_path, reference):
    proc = _cli("inspect", reference, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert _cli("check", reference, reference, cwd=str(tmp_path)).returncode == 0
    assert _cli("scan", reference, cwd=str(tmp_path)).returncode == 0


def test_unusable_inputs_exit_2_with_one_line(tmp_path, reference):
    cwd = str(tmp_path)
    _one_line_error(_cli("compare", reference, str(tmp_path / "missing"), cwd=cwd))
    _one_line_error(_cli("compare", reference, reference, "--json",
                         layout.run_json_path(reference), cwd=cwd))       # part of a dump
    _one_line_error(_cli("compare", reference, reference, "--step", "9", cwd=cwd))
    _one_line_error(_cli("compare", reference, cwd=cwd))                 # usage
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(_cli("compare", reference, str(empty), cwd=cwd))
    partial = S.write_dump(tmp_path / "partial")
    final = layout.step_file_path(partial, 0, 0)
    os.replace(final, layout.partial_path(final))
    _one_line_error(_cli("compare", reference, partial, cwd=cwd))
    damaged = S.write_dump(tmp_path / "damaged")
    with open(layout.step_file_path(damaged, 0, 0), "r+b") as handle:
        handle.truncate(100)
    line = _one_line_error(_cli("compare", reference, damaged, cwd=cwd))
    assert layout.step_file_path(damaged, 0, 0) in line
    _one_line_error(_cli("inspect", str(tmp_path / "missing"), cwd=cwd))
    _one_line_error(_cli("scan", damaged, cwd=cwd))
    _one_line_error(_cli("check", reference, str(empty), cwd=cwd))


@pytest.mark.parametrize("a,b,same", [
    (float("-inf"), float("-inf"), True), (float("inf"), float("inf"), True),
    (float("inf"), float("-inf"), False), (float("inf"), 1e308, False),
    (float("nan"), float("nan"), True), (1e-5, 1e-5 * (1 + 1e-9), True), (1e-5, 1e-6, False),
    ([0.0, float("-inf")], [0.0, float("-inf")], True), (True, False, False),
    ("none", "tanh", False),
])
def test_equal_settings_agree_infinite_ones_too(a, b, same):
    """A setting both runs give as the same infinity (a bound `min=-inf`) is the same setting;
    infinities of the other sign, or a finite value, are not (`inf - inf` is NaN, and
    `inf - -inf` is within any relative tolerance of inf)."""
    from precdbg.records.layers import same_setting
    assert same_setting(a, b) is same
    assert same_setting(b, a) is same
