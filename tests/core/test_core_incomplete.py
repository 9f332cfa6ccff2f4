"""An incomplete comparison is not a match (issue: faults round two, item 6): when no divergence
is found but one dump holds steps or ranks the other lacks, or a compared step is not whole
(interrupted), the verdict is "incomplete" with exit code 3, naming what is missing (JSON
`incomplete`); `--allow-missing` makes it a match again (exit 0). A divergence stays the verdict."""
from __future__ import annotations

import json
import subprocess
import sys

import synthetic as S


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300)


def _result(tmp_path, *args: str):
    out = str(tmp_path / "r.json")
    proc = _cli("compare", *args, "--json", out)
    with open(out, encoding="utf-8") as handle:
        return proc, json.load(handle)


def test_a_rank_one_dump_lacks_is_incomplete_not_a_match(tmp_path):
    four = S.write_dump(tmp_path / "four", ranks=(0, 1, 2, 3))
    three = S.write_dump(tmp_path / "three", ranks=(0, 1, 3))     # rank 2 crashed
    proc, result = _result(tmp_path, four, three)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert result["verdict"] == "incomplete" and result["first_divergence"] is None
    assert result["incomplete"] == [{"side": "baseline", "step": 0, "rank": 2,
                                     "why": "only_here"}]
    proc, result = _result(tmp_path, four, three, "--allow-missing")
    assert proc.returncode == 0 and result["verdict"] == "match"
    assert result["incomplete"]                      # still said
    # both dumps whole: a match
    proc, result = _result(tmp_path, four, S.write_dump(tmp_path / "again", ranks=(0, 1, 2, 3)))
    assert proc.returncode == 0 and result["verdict"] == "match" and not result["incomplete"]


def test_an_interrupted_step_is_incomplete(tmp_path):
    whole = S.write_dump(tmp_path / "whole")
    cut = S.write_dump(tmp_path / "cut", interrupted=True)
    proc, result = _result(tmp_path, whole, cut)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert {(p["side"], p["why"]) for p in result["incomplete"]} == {("candidate", "interrupted")}


def test_a_divergence_stays_the_verdict_when_parts_are_missing(tmp_path):
    four = S.write_dump(tmp_path / "four", ranks=(0, 1, 2, 3))
    other = S.write_dump(tmp_path / "other", ranks=(0, 1, 3), gelu_scale=1.001)
    proc, result = _result(tmp_path, four, other)
    assert proc.returncode == 1 and result["verdict"] == "diverged"
    assert result["incomplete"] == [{"side": "baseline", "step": 0, "rank": 2,
                                     "why": "only_here"}]
