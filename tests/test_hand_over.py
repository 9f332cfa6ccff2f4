"""Host copies of the tensor task are handed to the writer before they have landed: the writer's
thread waits for them (`Payload.ready`), never the training thread."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import precdbg
from precdbg.records.call import Call
from precdbg.records.schema import Direction, Phase, Record, RecordKind, Role
from precdbg.storage.step_file import Payload
from precdbg.storage.writer import DumpWriter
from precdbg_pt import PrecisionDebugger


def test_writer_waits_for_a_payload_before_reading_it(tmp_path):
    """The bytes arrive only when `ready()` runs (as a device copy lands): what is written is
    what arrived, and `ready()` ran on the writer's thread."""
    values = np.arange(12, dtype=np.float32)
    landing = np.zeros_like(values)
    threads = []

    def ready() -> None:
        threads.append(threading.current_thread().name)
        landing[:] = values
    writer = DumpWriter(str(tmp_path))
    writer.open_step(0, 0, {"framework": "pytorch", "task": "tensor", "level": "mix"})
    call = Call(RecordKind.API, "Functional", "relu", "relu", "", 0, 1, Phase.FORWARD, -1, True,
                "Functional.relu.0.forward")
    rec = Record(call, Direction.FORWARD, Role.OUTPUT, 0, "0", 1, "float32", (12,), 12, 0)
    writer.submit([rec], [Payload(0, landing, True, False, ready)])
    writer.close_step([], [])
    assert writer.flush(30) and writer.shutdown()
    assert threads == ["precdbg-writer"]
    np.testing.assert_array_equal(precdbg.open_dump(str(tmp_path)).tensor(
        "Functional.relu.0.forward.output.0", step=0), values)


@pytest.mark.cuda
def test_cuda_tensor_task_training_thread_does_not_wait_for_copies(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 16)).cuda()
    x = torch.randn(64, 256, device="cuda")
    dbg = PrecisionDebugger(task="tensor", level="mix", dump_path=str(tmp_path / "d"))
    for _ in range(2):                     # the second step is the measured one
        dbg.start(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = model(x).square().mean()
                out.backward()
                dbg.stop()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        dbg.step()
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert dbg.close() and dbg.failures == 0
    assert len(syncs) <= 2, syncs
    dump = precdbg.open_dump(str(tmp_path / "d"))
    weight = dump.tensor("Param.0.weight", step=1)
    np.testing.assert_array_equal(weight, model[0].weight.detach().cpu().numpy())
