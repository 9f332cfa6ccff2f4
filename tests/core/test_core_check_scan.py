"""`precdbg check` and `precdbg scan` on synthetic dumps, without a framework: set-up differences
found from run.json's manifest and the records (finding `kind` and `severity`), and the anomalies
of one dump (the first non-finite value, zero, exploding and vanishing gradients), through the
functions and the command (exit codes 0, 1, 2; strict JSON)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Tuple

import pytest

from precdbg import DumpError
from precdbg.check import check_dumps
from precdbg.scan import scan_dump
from precdbg.storage import layout

import synthetic as S


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    return S.write_dump(tmp_path_factory.mktemp("reference") / "dump")


def _kinds(result: Dict[str, Any]) -> List[Tuple[str, str]]:
    return sorted((f["kind"], f["severity"]) for f in result["findings"])


def _cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def _strict_json(path: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"{path}: {token} is not JSON")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle, parse_constant=refuse)


# --------------------------------------------------------------------------- check
def test_identical_runs_have_no_setup_difference(tmp_path, reference):
    result = check_dumps(reference, S.write_dump(tmp_path / "same"))
    assert result["findings"] == [] and result["unchecked"] == []
    assert result["counts"] == {"high": 0, "medium": 0, "low": 0}
    assert (result["a"]["step"], result["a"]["rank"], result["a"]["manifest"]) == (0, 0, True)
    assert result["a"]["framework"] == result["b"]["framework"] == "pytorch"


def test_another_learning_rate_in_the_manifest_is_a_high_finding(tmp_path, reference):
    result = check_dumps(reference, S.write_dump(tmp_path / "lr", lr=0.3))
    assert _kinds(result) == [("optimizer", "high")]
    finding = result["findings"][0]
    assert finding["hyperparameter"] == "lr" and (float(finding["a"]), float(finding["b"])) == \
        (0.1, 0.3)


@pytest.mark.parametrize("change,kinds", [
    ({"input_scale": 1.01}, [("batch", "high")]),
    ({"weight_scale": 1.01}, [("initial_values", "high")]),
    ({"approximate": "tanh"}, [("layer_settings", "medium")]),
    ({"interrupted": True}, [("incomplete", "high")]),
    ({"dtype": "bfloat16"}, [("batch", "high"), ("compute_dtype", "high"),
                             ("inventory", "high")]),
    ({"gelu_scale": 1.001}, []),          # a numeric difference is no set-up difference
    ({"extra_call": True}, []),
])
def test_each_setup_difference_is_found_alone(tmp_path, reference, change, kinds):
    result = check_dumps(reference, S.write_dump(tmp_path / "b", **change))
    assert _kinds(result) == kinds
    if "approximate" in change:
        assert [(d["path_a"], d["setting"], d["a"], d["b"]) for d in result["layer_settings"]] \
            == [("act", "approximate", "none", "tanh")]


def test_a_changed_manifest_entry_is_found(tmp_path, reference):
    """run.json is read as written: an environment variable that changes numerics, recorded in
    one run's manifest only."""
    other = S.write_dump(tmp_path / "env")
    path = layout.run_json_path(other)
    with open(path, encoding="utf-8") as handle:
        run = json.load(handle)
    run["manifest"]["environment"] = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(run, handle)
    assert [kind for kind, _ in _kinds(check_dumps(reference, other))] == ["environment"]


def test_without_run_json_the_manifest_checks_are_said_unchecked(tmp_path, reference):
    other = S.write_dump(tmp_path / "bare", lr=0.3)
    os.remove(layout.run_json_path(other))
    result = check_dumps(reference, other)
    assert result["b"]["manifest"] is False and len(result["unchecked"]) == 1
    assert [f for f in result["findings"] if f["kind"] == "optimizer"] == []


def test_check_command_exit_codes_and_json(tmp_path, reference):
    cwd = str(tmp_path)
    assert _cli("check", reference, S.write_dump(tmp_path / "same"), cwd=cwd).returncode == 0
    out = str(tmp_path / "check.json")
    proc = _cli("check", reference, S.write_dump(tmp_path / "lr", lr=0.3), "--json", out,
                cwd=cwd)
    assert proc.returncode == 1, proc.stderr
    assert [(f["kind"], f["severity"]) for f in _strict_json(out)["findings"]] == \
        [("optimizer", "high")]
    proc = _cli("check", reference, str(tmp_path / "missing"), cwd=cwd)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- scan
def test_a_clean_run_has_no_anomaly(reference):
    result = scan_dump(reference)
    assert result["first_nonfinite"] is None and result["findings"] == []
    assert (result["steps"], result["ranks"]) == ([0], [0])


@pytest.mark.parametrize("change,first", [
    ({"nan_in_gelu": True}, ("Functional.gelu.0.forward", "output", "api", "forward")),
    ({"nan_in_input": True}, ("Module.MLP.forward.0", "input", "module", "forward")),
    ({"nan_in_weight": True}, ("Param.fc2.weight", "param", "param", "none")),
    ({"nan_in_gelu": True, "level": "module"},
     ("Module.act.GELU.forward.0", "output", "module", "forward")),
])
def test_the_first_nonfinite_value_is_where_it_was_made(tmp_path, change, first):
    result = scan_dump(S.write_dump(tmp_path / "d", **change))
    found = result["first_nonfinite"]
    assert (found["name"], found["role"], found["kind"], found["direction"]) == first
    assert (found["step"], found["rank"]) == (0, 0)
    assert found["metrics"]["nan_count"] == 1
    nonfinite = [f for f in result["findings"] if f["kind"] == "nonfinite"]
    assert [(f["name"], f["role"]) for f in nonfinite] == [first[:2]]
    assert nonfinite[0]["metrics"]["nonfinite_records"] > 1     # what it led to is counted


@pytest.mark.parametrize("scale,kind", [(0.0, "zero_grad"), (1e6, "exploding_grad"),
                                        (1e-12, "vanishing_grad")])
def test_gradient_anomalies_name_the_parameter(tmp_path, scale, kind):
    result = scan_dump(S.write_dump(tmp_path / "d", dw_scale=scale))
    assert result["first_nonfinite"] is None
    assert [(f["kind"], f["name"], f["role"]) for f in result["findings"]] == \
        [(kind, "Param.fc1.weight.grad", "param_grad")]


def test_scan_of_one_step_and_rank(tmp_path):
    root = S.write_dump(tmp_path / "d", steps=(0, 1), ranks=(0, 1), nan_in_gelu=True)
    result = scan_dump(root, step=1, rank=1)
    assert (result["steps"], result["ranks"]) == ([1], [1])
    assert (result["first_nonfinite"]["step"], result["first_nonfinite"]["rank"]) == (1, 1)
    with pytest.raises(DumpError):
        scan_dump(root, step=5)


def test_scan_command_exit_codes_and_strict_json(tmp_path, reference):
    cwd = str(tmp_path)
    assert _cli("scan", reference, cwd=cwd).returncode == 0
    out = str(tmp_path / "scan.json")
    proc = _cli("scan", S.write_dump(tmp_path / "nan", nan_in_gelu=True), "--json", out,
                cwd=cwd)
    assert proc.returncode == 1, proc.stderr
    data = _strict_json(out)           # NaN statistics written as JSON strings, not NaN
    assert data["first_nonfinite"]["name"] == "Functional.gelu.0.forward"
    proc = _cli("scan", str(tmp_path / "missing"), cwd=cwd)
    assert proc.returncode == 2 and proc.stderr.startswith("precdbg: ")
