"""MindSpore activation recompute in the guides' pattern: a run with `Cell.recompute()`
(reentrant and non-reentrant) or `mindspore.recompute(cell, ...)` is recorded like the same run
without it, in real processes.

Before, the recompute cell MindSpore attaches was a module of its own (`_recompute_cell`), the
reentrant forward's calls had no backward records (they run without gradients; the replay in
`_RecomputeCell.bprop` gets them), the non-reentrant replay was recorded as second forward calls,
and the random generator's state calls around every recomputed cell were API calls: `compare`
found the runs DIVERGED where nothing differed in value. Now a replay records nothing of its
forward and its backward under the names of the calls it replays, and gradients the replay
computes only because MindSpore asks for them of every input of the recomputed cell (a data
batch, a constant table) are not recorded, as the run without recompute has none.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Dict

import pytest

ms = pytest.importorskip("mindspore")

import precdbg  # noqa: E402
from precdbg.compare import compare_dumps  # noqa: E402

from conftest import REPO, assert_same_run, run_variant  # noqa: E402

GUIDE = os.path.join(REPO, "tests", "recompute_guide_ms.py")


def _run(root: Any, how: str, *extra: str, level: str = "mix") -> Dict[str, Any]:
    return run_variant(root, GUIDE, how, *extra, level=level)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: Any) -> Dict[str, Any]:
    return _run(tmp_path_factory.mktemp("plain"), "none")


# MindSpore 2.7's `Cell.recompute()` takes no `use_reentrant` and has no `_RecomputeHandle`:
# its recompute is the reentrant one only
_NON_REENTRANT = pytest.mark.skipif(
    "use_reentrant" not in inspect.signature(ms.nn.Cell.recompute).parameters,
    reason=f"MindSpore {ms.__version__} has no non-reentrant recompute (Cell.recompute takes "
           "no use_reentrant; it came in 2.8)")


@pytest.mark.parametrize("how", ["reentrant", pytest.param("nonreentrant", marks=_NON_REENTRANT),
                                 "functional"])
def test_recompute_run_pairs_with_the_run_without(tmp_path: Any, how: str,
                                                  plain: Dict[str, Any]) -> None:
    run = _run(tmp_path, how)
    assert_same_run(plain, run)
    table = precdbg.open_dump(run["dump"]).records()
    entries = set(table["entry"])
    assert len(table) == len(precdbg.open_dump(plain["dump"]).records())
    assert not any("_recompute_cell" in e or "Generator" in e or "stop_gradient" in e
                   for e in entries), sorted(entries)[:20]
    # the recomputed blocks' own calls have their backward records
    backward = set(table["entry"][table["direction"] == "backward"])
    for name in ("Mint.tanh.1.backward", "Functional.layer_norm.2.backward",
                 "Cell.blocks.1.fc.Dense.backward.0", "Tensor.__mul__.3.backward"):
        assert name in backward, name


def test_a_real_difference_under_recompute_is_found_where_it_is(tmp_path: Any,
                                                                plain: Dict[str, Any]) -> None:
    run = _run(tmp_path, "reentrant", "perturb")
    result = compare_dumps(plain["dump"], run["dump"])
    assert result["verdict"] == "diverged"
    assert not result["unmatched"], result["unmatched"][:5]
    first = result["first_divergence"]
    assert (first["name_a"], first["name_b"]) == ("Param.blocks.1.fc.weight",) * 2, first
    # the first block's forward still agrees; the backward of every block differs (the
    # gradients flow through the scaled weight), recorded under the replayed calls' names
    rows = result["rows"]
    first_block = [r for r in rows if r["module"].startswith("blocks.0")
                   and r["direction"] == "forward"]
    assert first_block and all(r["status"] == "match" for r in first_block)
    assert any(r["status"] != "match" and r["direction"] == "backward"
               and r["name_a"] == "Mint.tanh.0.backward" for r in rows)


@pytest.mark.parametrize("how", ["reentrant", "functional"])
def test_level_module_pairs_too(tmp_path: Any, how: str) -> None:
    """Only cells are hooked: the replay is still known (and a cell's output is never taken for
    its input because an input copy MindSpore made is gone and its id reused: the head's
    backward went missing that way)."""
    plain = _run(tmp_path, "none", level="module")
    run = _run(tmp_path, how, level="module")
    assert_same_run(plain, run)
    backward = precdbg.open_dump(run["dump"]).records()
    assert "Cell.head.Dense.backward.0" in set(backward["entry"])
