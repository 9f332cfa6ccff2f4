"""The benchmarks run as their READMEs say (timings are never asserted): cost_split.py's variants
each take their part out of a real dumped step of a transformers model, and a device that is not
there is a one-line error."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COST_SPLIT = os.path.join(ROOT, "benchmarks", "cost_split.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, COST_SPLIT, *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def test_cost_split_variants_take_their_part_out(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "split.json"
    done = _run("--model", "gpt2-tiny", "--level", "mix", "--repeats", "1", "--threads", "1",
                "--json", str(out))
    assert done.returncode == 0, done.stderr
    for part in ("statistics", "records", "backward watch", "API calls", "module calls", "rest"):
        assert any(line.startswith(part) for line in done.stdout.splitlines()), done.stdout
    found = json.loads(out.read_text())
    written = found["records_written"]
    # a dumped step of GPT-2's structure at level mix: API, module, parameter records
    assert written["full"] > 1000 and found["records"] == written["full"]
    # constant statistics change no record; from "no records" on nothing is written
    assert written["no statistics"] == written["full"]
    assert {written[v] for v in ("no records", "no backward watch", "no API bookkeeping",
                                 "no module hooks")} == {0}
    assert set(found["extra_ms"]) == set(written)


def test_cost_split_without_the_device_is_one_line():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is there")
    done = _run("--device", "cuda", "--repeats", "1")
    assert done.returncode == 2
    assert done.stderr.strip().startswith("cost_split: --device cuda: no CUDA device")
    assert len(done.stderr.strip().splitlines()) == 1
