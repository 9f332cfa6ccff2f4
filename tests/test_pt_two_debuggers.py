"""Two debuggers in one process share no state: each one's dump is what the same training dumps
with that debugger alone, in a fresh process, and each says its own notices.

Scenarios (the capture windows overlap: start A, start B, train, stop B, stop A, step both):
- `two-models`: A hooks the tiny GPT, B a small CNN (tests/cnn_support.py); both models train
  while both windows are open, so each debugger also records the other model's API calls (torch's
  function mode sees every call), as it does alone;
- `two-models-crossed`: the same, the windows stopped in the order they started (stop A, then
  B), after which nothing of either is left in torch;
- `same-model`: A and B hook the same GPT.
The reference of each debugger is the same script with that debugger alone, run as
`python tests/test_pt_two_debuggers.py SCENARIO NAME DUMP_PATH` in a fresh process. Records are
compared column by column (entries, roles, shapes, statistics, producers, storages, ...). The
device-statistics variant sends CPU tensors through the fused kernel in Triton's interpreter
(PRECDBG_DEVICE_STATS=triton): per debugger result buffers, queues and transfers.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch_support import (make_batch_list, make_model, make_optimizer,  # sets TRITON_INTERPRET
                           torch_hooks_left)

import cnn_support
import precdbg
from conftest import run_python
from precdbg_examples.gpt_torch import train_step
from precdbg_pt import PrecisionDebugger, device_stats
from precdbg_pt import tensors as pt_tensors

STEPS = 2
NAMES = ("A", "B")
SETTINGS = {"task": "statistics", "level": "mix"}
HERE = os.path.abspath(__file__)
# attributes of torch's classes each debugger patches while it captures (module_patches,
# training_state)
PATCHED = [(torch.nn.Module, "__getstate__"), (torch.nn.TransformerEncoderLayer, "forward"),
           (torch.optim.lr_scheduler.LRScheduler, "step")]

try:
    device_stats.DeviceStatistics().summarize_with("triton", [torch.ones(3)])
    INTERPRETED = device_stats.triton_available()
except (RuntimeError, ValueError):
    INTERPRETED = False


def _workload(scenario: str) -> Tuple[Dict[str, torch.nn.Module], List]:
    """The model each debugger hooks, and the training steps run while both capture."""
    gpt = make_model()
    gpt_opt = make_optimizer(gpt)
    gpt_batches = make_batch_list(STEPS)

    def gpt_step(i: int) -> None:
        train_step(gpt, gpt_opt, *gpt_batches[i])

    if scenario == "same-model":
        return {"A": gpt, "B": gpt}, [gpt_step]
    assert scenario.startswith("two-models"), scenario
    torch.manual_seed(cnn_support.SEED)
    cnn = cnn_support.torch_model()
    cnn_opt = torch.optim.SGD(cnn.parameters(), lr=cnn_support.LR)
    cnn_batches = cnn_support.batches(STEPS)

    def cnn_step(i: int) -> None:
        x, y = cnn_batches[i]
        F.cross_entropy(cnn(torch.from_numpy(x)), torch.from_numpy(y).long()).backward()
        cnn_opt.step()
        cnn_opt.zero_grad()

    return {"A": gpt, "B": cnn}, [gpt_step, cnn_step]


def train(scenario: str, folders: Dict[str, str]) -> Dict[str, int]:
    """Train `STEPS` steps with a debugger per entry of `folders` (A, B or both), their windows
    overlapping: start A, start B, train, stop B, stop A (`-crossed`: stop A, stop B), step
    both. Returns each one's failures."""
    models, steps = _workload(scenario)
    debuggers = {name: PrecisionDebugger(dump_path=folders[name], **SETTINGS)
                 for name in NAMES if name in folders}
    stopping = list(debuggers.values())
    if not scenario.endswith("-crossed"):
        stopping.reverse()
    for i in range(STEPS):
        for name, debugger in debuggers.items():
            debugger.start(models[name])
        for step in steps:
            step(i)
        for debugger in stopping:
            debugger.stop()
        for debugger in debuggers.values():
            debugger.step()
    for debugger in debuggers.values():
        assert debugger.close(), "the writer did not finish in time"
    for model in set(models.values()):
        assert not torch_hooks_left(model), torch_hooks_left(model)
    return {name: debugger.failures for name, debugger in debuggers.items()}


def alone(scenario: str, name: str, folder: str, backend: str = "") -> None:
    """The reference: debugger `name` alone, in a fresh process."""
    env = {"PRECDBG_DEVICE_STATS": backend, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = run_python([HERE, scenario, name, folder], env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {name: 0}, done.stderr[-3000:]


def assert_same_dump(got: str, expected: str) -> None:
    """Every step's records equal, column by column (NaN equal to NaN)."""
    with precdbg.open_dump(got) as a, precdbg.open_dump(expected) as b:
        assert a.steps == b.steps == list(range(STEPS))
        for step in b.steps:
            x, y = a.records(step=step), b.records(step=step)
            assert len(x) == len(y) > 100, (step, len(x), len(y))
            for column in y.columns:
                if x[column].dtype.kind == "f":
                    np.testing.assert_array_equal(x[column], y[column],
                                                  err_msg=f"step {step}, {column}")
                else:
                    same = x[column] == y[column]
                    bad = np.nonzero(~np.all(same.reshape(len(x), -1), axis=1))[0]
                    assert bad.size == 0, (step, column, [(x["entry"][i], x[column][i],
                                                           y[column][i]) for i in bad[:3]])


@pytest.mark.parametrize("scenario", ["two-models", "two-models-crossed", "same-model"])
def test_two_debuggers_dump_what_each_dumps_alone(tmp_path, scenario):
    folders = {name: str(tmp_path / name) for name in NAMES}
    patched = {cls: vars(cls)[attr] for cls, attr in PATCHED}
    assert train(scenario, folders) == {"A": 0, "B": 0}
    assert all(vars(cls)[attr] is patched[cls] for cls, attr in PATCHED)    # put back
    for name in NAMES:
        alone(scenario, name, str(tmp_path / f"{name}-alone"))
        assert_same_dump(folders[name], str(tmp_path / f"{name}-alone"))
    with precdbg.open_dump(folders["A"]) as a, precdbg.open_dump(folders["B"]) as b:
        modules = [set(d.records(step=0)["module"][d.records(step=0)["kind"] == "module"])
                   for d in (a, b)]
    if scenario == "same-model":
        assert_same_dump(folders["A"], folders["B"])
    else:
        assert "blocks.0.attn" in modules[0] and "conv1" in modules[1]
        assert "conv1" not in modules[0] and "blocks.0.attn" not in modules[1]


@pytest.mark.skipif(not INTERPRETED, reason="triton (interpreter) not available")
def test_two_debuggers_keep_their_own_device_statistics(tmp_path, monkeypatch):
    """Device statistics (the fused kernel, in Triton's interpreter on CPU tensors): each
    debugger's tensors queue, launch and cross to the host in its own buffers."""
    monkeypatch.setattr(pt_tensors, "_FORCED_BACKEND", "triton")
    folders = {name: str(tmp_path / name) for name in NAMES}
    assert train("two-models", folders) == {"A": 0, "B": 0}
    for name in NAMES:
        alone("two-models", name, str(tmp_path / f"{name}-alone"), backend="triton")
        assert_same_dump(folders[name], str(tmp_path / f"{name}-alone"))


def test_two_debuggers_own_separate_tensor_objects(tmp_path):
    """Each adapter owns its TorchTensors and device statistics: rows one debugger resolves
    do not cross for the other (its handles stay where they are until it resolves them)."""
    a = PrecisionDebugger(dump_path=str(tmp_path / "a"))
    b = PrecisionDebugger(dump_path=str(tmp_path / "b"))
    ta, tb = a._session.adapter.tensors, b._session.adapter.tensors
    assert ta is not tb and ta.device is not tb.device
    x, y = torch.arange(6.0), torch.full((4,), 2.0)
    ha, hb = ta.device.summarize_with("torch", [x])[0], tb.device.summarize_with("torch", [y])[0]
    assert ta.resolve([ha])[0, 2] == 2.5 and ta.device.host_transfers() == 1
    assert hb.host is None and tb.device.host_transfers() == 0     # B's row still on B's side
    assert tb.resolve([hb])[0, 2] == 2.0 and tb.device.host_transfers() == 1
    a.close()
    b.close()


def test_each_debugger_says_its_own_notices(tmp_path, caplog):
    """What precdbg says once (an eval fast path run unobserved, a lazy module's parameters
    left out) is said once per debugger: a second debugger of the process says it too."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for name in NAMES:
            lazy = torch.nn.Sequential(torch.nn.LazyLinear(4))
            debugger = PrecisionDebugger(dump_path=str(tmp_path / name), level="mix")
            for _ in range(2):                            # said once, not at every step
                debugger.start([encoder, lazy])
                with torch.no_grad():
                    encoder(x)
                debugger.stop()
                debugger.step()
            lazy(x)
            assert debugger.close() and debugger.failures == 0
    said = [r.getMessage() for r in caplog.records]
    assert sum("fused fast path" in m for m in said) == 2, said
    assert sum("lazy module's parameters" in m for m in said) == 2, said


if __name__ == "__main__":        # the reference: one debugger alone, in this fresh process
    scenario_arg, name_arg, folder_arg = sys.argv[1:4]
    print(json.dumps(train(scenario_arg, {name_arg: folder_arg})))
