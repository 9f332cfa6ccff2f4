"""benchmarks/overhead_shim.py runs as benchmarks/README.md says (timings are never asserted):
a short run writes the results file with a ratio per mode, of dumps precdbg wrote in torch-shim
mode (framework mindtorch), and says what became of msprobe.

Runs where mindnlp imports (scripts/test_shim.sh builds that environment and runs this file);
skipped elsewhere.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


pytestmark = pytest.mark.skipif(
    not (_importable("mindspore") and _importable("mindnlp")),
    reason="MindSpore and mindnlp (the torch shim) are not both installed here; "
           "scripts/test_shim.sh builds their environment")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "overhead_shim.py")


def test_a_short_run_writes_the_ratio_of_each_mode(tmp_path):
    results, data = tmp_path / "results_shim.md", tmp_path / "results_shim.json"
    env = {**os.environ, "GLOG_v": "3",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, BENCH, "--repeats", "2", "--warmup", "0", "--retries", "0",
         "--modes", "statistics/mix", "statistics/module", "--msprobe",
         "--results", str(results), "--json", str(data)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = results.read_text(encoding="utf-8")
    assert "mindnlp" in text and "mindspore" in text and "transformers" in text
    for mode in ("statistics / mix", "statistics / module"):
        row = next((line for line in text.splitlines() if line.startswith(f"| {mode} |")
                    or line.startswith(f"| precdbg | {mode} |")), None)
        assert row is not None and re.search(r"\| \d+\.\d\d× \|", row), text
    found = json.loads(data.read_text(encoding="utf-8"))
    mine = [r for r in found["rows"] if r["tool"] == "precdbg"]
    assert [(r["task"], r["level"]) for r in mine] == [("statistics", "mix"),
                                                        ("statistics", "module")]
    for row in mine:
        assert row["framework"] == "mindtorch"       # the shim mode's dumps
        assert row["ratio"] > 0 and row["records_per_step"] > 0
        assert len(row["plain_ms_all"]) == len(row["dumped_ms_all"]) == 2
    # msprobe: measured, or each mode said not measured (and why), or said not installed
    if _importable("msprobe"):
        said = {(r["task"], r["level"]) for r in found["rows"] if r["tool"] == "msprobe"}
        said |= {tuple(f["mode"].split("/")) for f in found["msprobe_failures"]}
        assert said == {("statistics", "mix"), ("statistics", "module")}
        assert all(f["error"] and f["stage"] for f in found["msprobe_failures"])
    else:
        assert "msprobe (mindstudio-probe) is not installed" in text
