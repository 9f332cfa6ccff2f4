"""torch.compile in the guides' pattern: a compiled model (whole, per block, or compiled in place)
is captured like the uncompiled one, in real processes.

Before, Dynamo tried to trace precdbg's torch-function mode and the step raised an internal
Dynamo error into training. Now the captured step runs compiled code eagerly, the dump matches
an uncompiled run record for record (same names: no `_orig_mod.`), the stance comes back after
stop(), and the dumped step compiles nothing new. Backends `eager` and `aot_eager` go through
Dynamo's full tracing without needing a C compiler (inductor does the same, only slower).
"""
from __future__ import annotations

import os
from typing import Any, Dict

import pytest

import precdbg
from precdbg.compare import compare_dumps

from conftest import REPO, run_variant

GUIDE = os.path.join(REPO, "tests", "compiled_guide.py")


def _run(tmp_path: Any, how: str) -> Dict[str, Any]:
    return run_variant(tmp_path, GUIDE, how, env={"PYTHONFAULTHANDLER": "1"})


@pytest.fixture(scope="module")
def uncompiled(tmp_path_factory: Any) -> Dict[str, Any]:
    return _run(tmp_path_factory.mktemp("uncompiled"), "none")


@pytest.mark.parametrize("how", ["model:eager", "blocks:aot_eager", "inplace:eager"])
def test_compiled_model_is_captured_like_the_uncompiled_one(tmp_path: Any, how: str,
                                                            uncompiled: Dict[str, Any]) -> None:
    run = _run(tmp_path, how)
    assert "Traceback" not in run["stderr"], run["stderr"][-3000:]
    assert run["losses"] == uncompiled["losses"]
    # the stance is back after stop(), and the dumped step compiled nothing new
    assert run["stance"] == "default"
    before, after_dump, end = run["graphs"]
    assert before > 0 and after_dump == before and end == before, run["graphs"]
    assert "compiled with torch.compile" in run["stderr"]

    dump = precdbg.open_dump(run["dump"])
    paths = [path for path, _, _ in dump.modules(step=0)]
    assert paths == [path for path, _, _ in precdbg.open_dump(uncompiled["dump"]).modules(step=0)]
    assert not [p for p in paths if "_orig_mod" in p]
    table = dump.records(step=0)
    assert len(table) == len(precdbg.open_dump(uncompiled["dump"]).records(step=0))
    assert {"Module", "Torch", "Tensor", "Functional"} <= set(table["prefix"].tolist())
    compiled = dump.run["manifest"]["compiled"]
    expected = {"model": [""], "blocks": ["blocks.0", "blocks.1"], "inplace": [""]}
    assert compiled["modules"] == expected[how.partition(":")[0]]

    result = compare_dumps(uncompiled["dump"], run["dump"])
    assert result["verdict"] == "match", result["first_divergence"]
    assert not result["unmatched"]


def test_code_compiled_inside_the_captured_step_runs_eagerly(tmp_path: Any) -> None:
    """TorchDynamo imported only inside the captured step (a function compiled on its first
    use): before, nothing set the stance and Dynamo's internal error reached training."""
    uncompiled = _run(tmp_path, "sgd")
    assert uncompiled["dynamo_at_start"] is False and uncompiled["graphs"] == [0, 0, 0]
    run = _run(tmp_path, "loss:eager")
    assert run["dynamo_at_start"] is False
    assert "Traceback" not in run["stderr"], run["stderr"][-3000:]
    assert run["failures"] == 0
    assert run["losses"] == uncompiled["losses"]
    assert run["stance"] == "default"                  # back after stop()
    before, after_dump, end = run["graphs"]
    assert before == 0 and after_dump == 0 and end > 0, run["graphs"]   # compiled afterwards
    result = compare_dumps(uncompiled["dump"], run["dump"])
    assert result["verdict"] == "match", result["first_divergence"]
    assert not result["unmatched"]


def test_uncompiled_run_says_nothing_about_compiling(uncompiled: Dict[str, Any]) -> None:
    assert uncompiled["stance"] in (None, "default") and uncompiled["graphs"] == [0, 0, 0]
    assert "compiled with torch.compile" not in uncompiled["stderr"]
    assert "compiled" not in precdbg.open_dump(uncompiled["dump"]).run["manifest"]
