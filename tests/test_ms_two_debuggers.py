"""Two MindSpore debuggers of one process capturing at the same time: each dumps exactly what it
dumps alone, in a fresh process.

What changes while a MindSpore adapter captures (its `MindSporeTensors`: whether host statistics
may wait for the batch, the in-place writes counted, the deferred statistics not read yet, the
facts of the tensor being recorded; its `CellHooks`; its recompute replay) belongs to that
debugger's adapter. Two networks (the tiny GPT, and a small cell whose training clips its
gradients in place) train under two debuggers whose capture windows overlap: start A, start B,
A's training step, B's, stop B, stop A, step both; two steps. Every record of each dump (entries,
roles, shapes, statistics, tensor ids, producers, ...: every column but the call-stack id, which
names where the script called from) must equal the same training's records under one debugger
alone, run as this file's `__main__` in a fresh process.

- `own threads`: A (the small cell at level module) captures in the main thread, B (the GPT at
  level mix) in a thread of its own: MindSpore's API wrappers are process-wide and record only
  the thread that called start() (precdbg_ms.adapter), so B's leave A's calls alone. A clips the
  gradients value_and_grad returns in place (`copy_`), which nothing at level module sees, so
  A's parameter gradients must be read when captured: with B's window making them wait for the
  batch (when that choice was one flag of the process) A recorded the clipped gradients.
- `one thread`: both at level module in the main thread (at level mix or api, a window records
  every API call of its thread, the other network's too).

In both, each adapter's patches of `asnumpy`/`set_data` see the other debugger's own reads of
its tensors: each counts a write there (a new version of that tensor for what it records), and
with one count per process that gave the other's tensors new ids and lost their producers.
"""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import as_tensors, make_batches, make_model, make_optimizer  # noqa: E402

from mindspore import nn, ops  # noqa: E402

import precdbg  # noqa: E402
from precdbg_examples import gpt_ms  # noqa: E402
from precdbg_ms import PrecisionDebugger  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
STEPS = 2
# every column but where the script called from (a thread's stack is not the main thread's)
NOT_COMPARED = {"stack_id"}


class SmallNet(nn.Cell):
    """A small network unlike the GPT."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x: Any) -> Any:
        return self.fc2(self.act(self.fc1(x)))


def _cell_training() -> Tuple[nn.Cell, Callable[[int], float]]:
    ms.set_seed(7)
    net = SmallNet()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((4, 8)).astype(np.float32),
             rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(STEPS)]
    grad_fn = ms.value_and_grad(lambda x, y: ops.mse_loss(net(x), y), None,
                                net.trainable_params())

    def step(i: int) -> float:
        x, y = (ms.Tensor(a) for a in data[i])
        loss, grads = grad_fn(x, y)
        for grad in grads:       # clipped in place, where no hook of level module looks
            grad.copy_(ops.clamp(grad, -0.05, 0.05))
        optimizer(grads)
        return float(loss.asnumpy())
    return net, step


def _gpt_training() -> Tuple[nn.Cell, Callable[[int], float]]:
    model = make_model()
    train = gpt_ms.train_step_fn(model, make_optimizer(model))
    batches = make_batches(STEPS)

    def step(i: int) -> float:
        return float(train(*as_tensors(batches[i])).asnumpy())
    return model, step


TRAININGS = {"cell": _cell_training, "gpt": _gpt_training}


def _solo(name: str, level: str, path: str) -> None:
    """One debugger alone (this file run as a script, in a fresh process)."""
    model, step = TRAININGS[name]()
    dbg = PrecisionDebugger(dump_path=path, level=level, step=[])
    for i in range(STEPS):
        dbg.start(model)
        step(i)
        dbg.stop()
        dbg.step()
    assert dbg.close() and dbg.failures == 0, dbg.failures


class _Thread:
    """A thread that runs what it is handed, one call at a time, while the caller waits."""

    def __init__(self) -> None:
        self._tasks: "queue.Queue[Any]" = queue.Queue()
        threading.Thread(target=self._serve, name="second debugger", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, args, done = self._tasks.get()
            try:
                done.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller
                done.put((False, exc))

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        done: "queue.Queue[Tuple[bool, Any]]" = queue.Queue()
        self._tasks.put((fn, args, done))
        ok, value = done.get(timeout=600)
        if not ok:
            raise value
        return value


def _in_this_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _overlapped(root: str, second_level: str, second_runs: Callable[..., Any]
                ) -> Dict[str, str]:
    """A: the small cell at level module (main thread); B: the GPT at `second_level`, its
    calls made through `second_runs`. Their windows overlap in every step."""
    paths = {"cell": os.path.join(root, "cell"), "gpt": os.path.join(root, "gpt")}
    cell, cell_step = _cell_training()
    gpt, gpt_step = _gpt_training()
    first = PrecisionDebugger(dump_path=paths["cell"], level="module", step=[])
    second = second_runs(lambda: PrecisionDebugger(dump_path=paths["gpt"], level=second_level,
                                                   step=[]))
    for i in range(STEPS):
        assert first.start(cell)
        assert second_runs(second.start, gpt)
        cell_step(i)
        second_runs(gpt_step, i)
        second_runs(second.stop)
        first.stop()
        first.step()
        second_runs(second.step)
    assert first.close() and second_runs(second.close)
    assert first.failures == 0 and second.failures == 0, (first.failures, second.failures)
    return paths


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The dump of one training under one debugger alone in a fresh process, by (network,
    level), made once."""
    made: Dict[Tuple[str, str], str] = {}

    def dump(name: str, level: str) -> str:
        if (name, level) not in made:
            path = str(tmp_path_factory.mktemp(f"alone_{name}_{level}") / "dump")
            env = {**os.environ, "GLOG_v": "3",
                   "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO)
                                                 if p)}
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), name, level, path],
                                  capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
            assert proc.returncode == 0, proc.stderr[-4000:]
            made[(name, level)] = path
        return made[(name, level)]
    return dump


def _differences(expected: str, actual: str) -> List[str]:
    """Each column of each step whose records differ between two dumps."""
    with precdbg.open_dump(expected) as want, precdbg.open_dump(actual) as got:
        assert got.steps == want.steps == list(range(STEPS))
        out = []
        for step in want.steps:
            a, b = want.records(step=step), got.records(step=step)
            assert len(a) > 0 and sorted(a.columns) == sorted(b.columns)
            if len(a) != len(b):
                out.append(f"step {step}: {len(b)} records, {len(a)} alone")
                continue
            for column in sorted(set(a.columns) - NOT_COMPARED):
                x, y = a[column], b[column]
                same = np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" \
                    else np.array_equal(x, y)
                if not same:
                    rows = np.nonzero(~((x == y) | ((x != x) & (y != y))) if x.dtype.kind == "f"
                                      else np.any((x != y).reshape(len(x), -1), axis=1))[0]
                    out.append(f"step {step} column {column}: {len(rows)} records differ, e.g. "
                               f"{a['entry'][rows[0]]} {a['role'][rows[0]]}: "
                               f"{x[rows[0]]!r} alone, {y[rows[0]]!r} here")
        return out


@pytest.mark.parametrize("case", ["own threads", "one thread"])
def test_two_debuggers_capturing_at_once_dump_what_each_dumps_alone(tmp_path, alone, case):
    if case == "own threads":
        second_level, runs = "mix", _Thread()
    else:
        second_level, runs = "module", _in_this_thread
    paths = _overlapped(str(tmp_path), second_level, runs)
    differ = (_differences(alone("cell", "module"), paths["cell"])
              + _differences(alone("gpt", second_level), paths["gpt"]))
    assert differ == [], "\n".join(differ)


if __name__ == "__main__":         # one debugger alone: NAME LEVEL DUMP_PATH
    _solo(*sys.argv[1:4])
