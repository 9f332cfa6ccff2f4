"""The optimizer settings of each dumped step: recorded with the step (its file's `optimizers`,
as the optimizer stepped in that step's window), read by `Dump.optimizers`, and what `check` and
`compare` quote for that step. run.json keeps only the last captured window's, which under a
schedule (LambdaLR warm-up) are another step's.

The runs are the guides' pattern in fresh processes (config.json, the debugger a local of
main(), start(model) / stop() / step() around each dumped iteration, no close()): a baseline and
a candidate whose warm-up differs from step 1 on (lr 2e-4 at step 0 in both; 4e-4 vs 5e-4 at
step 1; 6e-4 vs 8e-4 at step 2).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List

import pytest

import precdbg
from conftest import beyond_dumping_to, run_python, write_config_file
from precdbg.check import check_dumps
from precdbg.compare.pipeline import compare_dumps
from precdbg.storage.step_checks import reseal

GUIDE = r'''
import sys
import torch
from precdbg_pt import PrecisionDebugger

def main() -> None:
    config, ramp = sys.argv[1], float(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.2 + ramp * s)
    data = torch.Generator().manual_seed(1)
    debugger = PrecisionDebugger(config_path=config)
    for step in range(3):
        x = torch.randn(4, 8, generator=data)
        debugger.start(model)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        debugger.stop()
        debugger.step()

main()
'''


def _dump(tmp_path, name: str, ramp: float) -> str:
    dump = str(tmp_path / name)
    config = write_config_file(tmp_path / f"{name}.json", {
        "task": "statistics", "level": "mix", "dump_path": dump, "step": [0, 1, 2]})
    done = run_python(["-c", GUIDE, config, str(ramp)], timeout=300)
    assert done.returncode == 0, done.stderr
    assert "precdbg" not in beyond_dumping_to(done.stderr), done.stderr
    return dump


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Dict[str, str]:
    tmp = tmp_path_factory.mktemp("step_optimizers")
    return {"a": _dump(tmp, "a", 0.2), "b": _dump(tmp, "b", 0.3)}


def _lrs(optimizers: List[Dict[str, Any]]) -> List[float]:
    return [group["hyper"]["lr"] for opt in optimizers for group in opt["param_groups"]]


def test_each_step_file_holds_the_settings_that_step_used(runs):
    with precdbg.open_dump(runs["b"]) as dump:
        lrs = {step: _lrs(dump.optimizers(step, 0)) for step in dump.steps}
        manifest = dump.run["manifest"]["optimizers"]
    assert lrs == {0: [pytest.approx(2e-4)], 1: [pytest.approx(5e-4)],
                   2: [pytest.approx(8e-4)]}
    assert _lrs(manifest) == [pytest.approx(8e-4)]        # run.json: the last window's
    with precdbg.open_dump(runs["b"]) as dump:
        opt = dump.optimizers(1, 0)[0]
    assert opt["class"] == "AdamW"
    assert opt["param_groups"][0]["hyper"]["weight_decay"] == pytest.approx(0.01)
    assert opt["param_groups"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def _lr_findings(result: Dict[str, Any]) -> List[Any]:
    return [(f["a"], f["b"]) for f in result["findings"]
            if f["kind"] == "optimizer" and f.get("hyperparameter") == "lr"]


def test_check_compares_the_checked_steps_own_settings(runs):
    assert _lr_findings(check_dumps(runs["a"], runs["b"], step=0)) == []
    assert _lr_findings(check_dumps(runs["a"], runs["b"], step=1)) == [("0.0004", "0.0005")]
    assert _lr_findings(check_dumps(runs["a"], runs["b"], step=2)) == [("0.0006", "0.0008")]


def test_compare_quotes_the_settings_of_the_update_it_blames(runs):
    result = compare_dumps(runs["a"], runs["b"])
    first = result["first_divergence"]
    assert result["verdict"] == "diverged"
    assert (first["step"], first["kind"]) == (2, "param")
    # step 1's update moved the weights apart: its lrs are quoted, not run.json's (step 2's)
    assert "0.0004" in first["reason"] and "0.0005" in first["reason"]
    assert "0.0008" not in first["reason"]


def test_a_dump_without_step_settings_falls_back_to_the_run_manifest(runs, tmp_path):
    """A dump written before steps held their optimizers: check uses run.json's and says so."""
    import shutil
    import h5py
    old = str(tmp_path / "old")
    shutil.copytree(runs["a"], old)
    for root, _, files in os.walk(old):
        for name in files:
            if name.endswith(".h5"):
                with h5py.File(os.path.join(root, name), "a") as handle:
                    del handle.attrs["optimizers"]
                reseal(os.path.join(root, name))   # as a step without optimizers is written
    with precdbg.open_dump(old) as dump:
        assert dump.optimizers(0, 0) is None
    result = check_dumps(old, runs["a"], step=0)
    assert _lr_findings(result) == [("0.0006", "0.0002")]      # run.json's step 2 vs step 0
    assert any("run.json" in note for note in result["notes"])


def test_a_damaged_optimizers_attribute_is_one_line_error(runs, tmp_path):
    import shutil
    import h5py
    bad = str(tmp_path / "bad")
    shutil.copytree(runs["a"], bad)
    path = os.path.join(bad, "step0", "rank0.h5")
    with h5py.File(path, "a") as handle:
        handle.attrs["optimizers"] = "{not json"
    reseal(path)                       # a file precdbg could have written: sealed again
    with precdbg.open_dump(bad) as dump:
        with pytest.raises(precdbg.DumpError, match="optimizers"):
            dump.optimizers(0, 0)
