"""The MindSpore lifecycle: stop() puts every patched attribute back (the very same objects) and
removes every cell and parameter hook; start/stop/step are safe to repeat; GRAPH_MODE is refused
with a clear error; a failing hook never reaches training; the shared config files work."""
from __future__ import annotations

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import (RECOMPUTE_PATCHES, REPO_CONFIGS, as_tensors, hooks_left,  # noqa: E402
                        make_batches, make_model, make_optimizer, one_row, rows_where, run_steps,
                        snapshot, snapshot_differences)

from mindspore import nn, ops  # noqa: E402

import precdbg  # noqa: E402
from precdbg_examples import gpt_ms  # noqa: E402
from precdbg_ms import PrecisionDebugger  # noqa: E402
from precdbg_ms import tensors as ms_tensors  # noqa: E402


def _train_one(dbg, model, optimizer, batch):
    step = gpt_ms.train_step_fn(model, optimizer)
    x, y = as_tensors(batch)
    dbg.start(model)
    loss = step(x, y)
    dbg.stop()
    dbg.step()
    return float(loss.asnumpy())


# ----------------------------------------------------------------------------- restoration
@pytest.mark.parametrize("settings", [dict(level="mix"), dict(level="module"),
                                      dict(level="api", include_optimizer=True),
                                      dict(task="tensor", data_mode=["forward"])],
                         ids=["mix", "module", "api+optimizer", "tensor-forward"])
def test_stop_restores_every_patched_attribute(tmp_path, settings):
    model = make_model()
    optimizer = make_optimizer(model)
    batch = make_batches(1)[0]
    before = snapshot()                       # before the debugger exists
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), **settings)
    step = gpt_ms.train_step_fn(model, optimizer)
    x, y = as_tensors(batch)
    dbg.start(model)
    patched = snapshot_differences(before)
    step(x, y)
    dbg.stop()
    # the snapshot does see the patches while capturing (so this test can fail); at level
    # module no API call is kept, so nothing but the optimizer, the methods that write
    # outside any API (precdbg_ms.untracked_writes) and activation recompute's replays are wrapped
    assert any("Optimizer.__call__" in d for d in patched)
    if settings.get("level") == "module":
        names = {d.split(":")[0].split(".")[-2] + "." + d.split(":")[0].split(".")[-1]
                 for d in patched}
        # (MindSpore 2.7 has no non-reentrant recompute: no `_RecomputeHandle.recompute`)
        assert names == {"Optimizer.__call__", "Tensor.assign_value", "Tensor.asnumpy",
                         "Tensor.numpy", "recompute._detach_input"} | RECOMPUTE_PATCHES, \
            "\n".join(p[:90] for p in patched)
    else:
        assert len(patched) > 500, patched[:5]
        assert any(d.startswith("mindspore.ops.matmul:") for d in patched)
        assert any(".Tensor.__add__:" in d for d in patched)
    assert snapshot_differences(before) == []
    dbg.step()
    assert dbg.close()
    assert snapshot_differences(before) == []
    assert dbg.failures == 0


def test_a_later_start_reuses_the_wrappers_and_follows_a_replaced_original(tmp_path,
                                                                          monkeypatch):
    """The API wrappers are made once per debugger (start() runs every dumped step): a later
    start() puts back the very same wrapper; when something else replaced the API between the
    windows, the new start() wraps what is there now, not the original it wrapped before."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="api", step=[])
    original = ops.matmul
    dbg.start()
    first = ops.matmul
    assert first is not original and first.__precdbg_original__ is original
    dbg.stop()
    dbg.step()
    assert ops.matmul is original
    dbg.start()
    assert ops.matmul is first
    dbg.stop()
    dbg.step()

    calls = []

    def users_matmul(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(ops, "matmul", users_matmul)
    dbg.start()
    assert ops.matmul is not first and ops.matmul.__precdbg_original__ is users_matmul
    a = ms.Tensor(np.ones((2, 2), np.float32))
    ops.matmul(a, a)
    dbg.stop()
    dbg.step()
    assert ops.matmul is users_matmul and calls == [1]
    assert dbg.close() and dbg.failures == 0
    table = precdbg.open_dump(str(tmp_path / "dump")).records(step=2)
    assert one_row(table, entry="Functional.matmul.0.forward", role="output")["max"] == 2.0


def test_no_cell_or_parameter_hook_left(tmp_path):
    model = make_model()
    assert hooks_left(model) == []
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"))
    dbg.start(model)
    during = hooks_left(model)
    # while capturing: every cell has its hooks, every trainable parameter its gradient hook
    n_cells = len(list(model.cells_and_names()))
    assert sum(h.endswith("._lazy_forward_pre_hook") for h in during) == n_cells
    assert sum(h.startswith("param ") for h in during) == len(model.trainable_params())
    x, y = as_tensors(make_batches(1)[0])
    ms.value_and_grad(lambda x, y: ops.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)),
                      None, model.trainable_params())(x, y)
    dbg.stop()
    assert hooks_left(model) == []
    assert dbg.close() and dbg.failures == 0


def test_training_after_stop_is_untouched(tmp_path):
    """After stop(), training steps give bitwise the same results as a model never dumped, and
    nothing more is written."""
    batches = make_batches(3)
    ref = make_model()
    ref_losses = run_steps(None, ref, make_optimizer(ref), batches, 3)
    model = make_model()
    optimizer = make_optimizer(model)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), step=[0])
    losses = [_train_one(dbg, model, optimizer, batches[0])]
    losses += run_steps(None, model, optimizer, batches[1:], 2)
    assert losses == ref_losses
    for a, b in zip(model.get_parameters(), ref.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=a.name)
    assert dbg.close() and dbg.failures == 0
    assert precdbg.open_dump(str(tmp_path / "dump")).steps == [0]


# ----------------------------------------------------------------------------- repetition
def test_start_stop_step_repeated(tmp_path):
    model = make_model()
    optimizer = make_optimizer(model)
    step = gpt_ms.train_step_fn(model, optimizer)
    batches = make_batches(4)
    before = snapshot()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), step=[1, 2])
    dbg.stop()                                  # stop before any start: a no-op
    for i, batch in enumerate(batches):
        x, y = as_tensors(batch)
        assert dbg.start(model) is (i in (1, 2))
        assert dbg.start(model) is (i in (1, 2))      # a second start is a no-op
        step(x, y)
        dbg.stop()
        dbg.stop()
        dbg.step()
        if i == 2:
            dbg.step()                          # an extra step() only moves the counter
        assert hooks_left(model) == []
        assert snapshot_differences(before) == []
    assert dbg.current_step == 5
    assert dbg.close() and dbg.close()
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    assert dump.steps == [1, 2]
    a, b = dump.records(step=1), dump.records(step=2)
    assert len(rows_where(a, entry="Functional.dense.0.forward", role="output")) == 1
    assert len(rows_where(a, entry="Param.lm_head.weight.grad")) == 1
    assert list(a["entry"]) == list(b["entry"])
    assert list(a["role"]) == list(b["role"])


def test_two_debuggers_in_sequence_same_model(tmp_path):
    model = make_model()
    optimizer = make_optimizer(model)
    batch = make_batches(1)[0]
    for name in ("first", "second"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name))
        _train_one(dbg, model, optimizer, batch)
        assert dbg.close() and dbg.failures == 0
        assert hooks_left(model) == []
    a = precdbg.open_dump(str(tmp_path / "first")).records(step=0)
    b = precdbg.open_dump(str(tmp_path / "second")).records(step=0)
    assert list(a["entry"]) == list(b["entry"])


def test_exception_in_the_captured_step(tmp_path):
    class Exploding(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Dense(4, 4)

        def construct(self, x):
            self.inner(x)
            raise ZeroDivisionError("training code failed")

    model = Exploding()
    before = snapshot()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"))
    with pytest.raises(ZeroDivisionError):
        with dbg.capture(model):
            model(ms.Tensor(np.ones((2, 4), np.float32)))
    assert not dbg.capturing
    assert hooks_left(model) == []
    assert snapshot_differences(before) == []
    assert dbg.close()
    t = precdbg.open_dump(str(tmp_path / "dump")).records(step=0)
    assert rows_where(t, entry="Cell.inner.Dense.forward.0", role="output")


# ----------------------------------------------------------------------------- GRAPH_MODE
def test_graph_mode_is_refused(tmp_path):
    model = make_model()
    before = snapshot()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(precdbg.FrameworkError) as info:
            dbg.start(model)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    message = str(info.value)
    assert "GRAPH_MODE" in message and "PyNative" in message, message
    assert "\n" not in message
    assert not dbg.capturing
    assert hooks_left(model) == []
    assert snapshot_differences(before) == []
    # refused before anything is written: the corrected script may dump into the same folder
    # (a run.json written first made its next run take the folder for an earlier run's dump)
    assert not os.path.exists(tmp_path / "dump" / "run.json")
    # back in PyNative the same debugger dumps normally
    _train_one(dbg, model, make_optimizer(model), make_batches(1)[0])
    assert dbg.close() and dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path / "dump")).records()
    assert rows_where(t, entry="Cell.GPT.forward.0", role="output")
    assert hooks_left(model) == []


# ----------------------------------------------------------------------------- failures
def test_hook_failure_never_reaches_training(tmp_path, monkeypatch):
    """Fault injection into precdbg itself (not MindSpore): statistics of every tensor of the
    MLP's hidden shape raise. Training goes on bitwise as without the debugger, the failures are
    counted, and every other record is still right: same entries and owning modules as a clean
    dump, apart from the records of those tensors."""
    batch = make_batches(1)[0]
    ref = make_model()
    ref_loss = run_steps(None, ref, make_optimizer(ref), [batch], 1)

    clean_model = make_model()
    clean = PrecisionDebugger(dump_path=str(tmp_path / "clean"))
    _train_one(clean, clean_model, make_optimizer(clean_model), batch)
    assert clean.close() and clean.failures == 0

    model = make_model()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "broken"))
    original = ms_tensors.MindSporeTensors.summarize
    hidden = (4, 16, 256)

    def summarize(self, tensor):
        if tuple(tensor.shape) == hidden:
            raise RuntimeError("injected statistics failure")
        return original(self, tensor)
    monkeypatch.setattr(ms_tensors.MindSporeTensors, "summarize", summarize)
    loss = _train_one(dbg, model, make_optimizer(model), batch)
    monkeypatch.undo()
    assert [loss] == ref_loss
    for a, b in zip(model.get_parameters(), ref.get_parameters()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy(), err_msg=a.name)
    assert dbg.close()
    assert dbg.failures > 0, "the injected fault did not fire: MindSporeTensors.summarize " \
        "is no longer where the session computes statistics"
    assert hooks_left(model) == []

    good = precdbg.open_dump(str(tmp_path / "clean")).records(step=0)
    bad = precdbg.open_dump(str(tmp_path / "broken")).records(step=0)
    assert not np.any([tuple(s) == hidden for s in
                       (bad.row(i)["shape"] for i in range(len(bad)))])

    def keyed(t):
        return {(r["entry"], r["role"], r["arg_index"]): r for r in t.rows()
                if r["shape"] != hidden}
    g, b = keyed(good), keyed(bad)
    assert set(b) <= set(g)
    wrong = [(k, g[k]["module"], r["module"]) for k, r in b.items()
             if g[k]["module"] != r["module"]]
    assert not wrong, f"{len(wrong)} records with a different owning module, e.g. {wrong[:5]}"
    assert len(rows_where(bad, kind="param_grad")) == len(rows_where(good, kind="param_grad"))
    assert one_row(bad, entry="Param.lm_head.weight.grad")["norm"] == \
        one_row(good, entry="Param.lm_head.weight.grad")["norm"]


# ----------------------------------------------------------------------------- config files
def test_shared_config_file(tmp_path):
    """config_examples/statistics_mix.json (statistics, mix, step []: every started step) as
    is, for MindSpore."""
    path = os.path.join(REPO_CONFIGS, "statistics_mix.json")
    dbg = PrecisionDebugger(path, dump_path=str(tmp_path / "dump"))
    assert dbg.config.task.value == "statistics" and dbg.config.level.value == "mix"
    model = make_model()
    run_steps(dbg, model, make_optimizer(model), make_batches(2), 2)
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path / "dump"))
    assert dump.steps == [0, 1]
    assert dump.run["framework"] == "mindspore"
    assert dump.run["config"]["level"] == "mix" and dump.run["config"]["step"] == []
    kinds = set(np.unique(dump.records(step=1)["kind"]))
    assert kinds == {"api", "module", "param", "param_grad"}
