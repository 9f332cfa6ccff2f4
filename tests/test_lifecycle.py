"""start/stop/step/close: nothing left in torch after stop(), safe repetition, the context
manager, failures that never reach training, both call patterns, and a torch-free core."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import precdbg
from precdbg_pt import PrecisionDebugger
from precdbg_pt import tensors as precdbg_tensors

from conftest import DUMPING_TO, one_row, rows_where, run_python
from torch_support import (dump_once, loss_of, make_batch_list, make_model, make_optimizer,
                           run_steps, torch_hooks_left)


def test_nothing_left_in_torch_after_stop(tmp_path, gpt, optimizer, batch):
    assert torch_hooks_left(gpt) == []
    dbg = PrecisionDebugger(dump_path=str(tmp_path), include_optimizer=True)
    dbg.start(gpt)
    assert dbg.capturing
    # while capturing, the hooks and the mode are in place
    assert torch._C._len_torch_function_stack() == 1
    assert gpt.blocks[0].attn.qkv._forward_hooks or gpt.blocks[0].attn.qkv._forward_pre_hooks
    x, y = batch
    loss = loss_of(gpt, x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    dbg.stop()
    assert not dbg.capturing
    assert torch_hooks_left(gpt) == []
    assert torch.overrides._get_current_function_mode_stack() == []
    for p in gpt.parameters():
        assert not p._backward_hooks
    from torch.optim import optimizer as opt
    assert not opt._global_optimizer_pre_hooks and not opt._global_optimizer_post_hooks
    dbg.step()
    dbg.close()
    assert dbg.failures == 0
    assert torch_hooks_left(gpt) == []


class _UserMode(torch.overrides.TorchFunctionMode):
    """A user's own torch-function mode, counting the calls it sees."""
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def _mode_stack():
    return torch.overrides._get_current_function_mode_stack()


def test_capture_mode_is_off_the_stack_while_a_skipped_optimizer_runs(tmp_path, gpt, batch):
    """include_optimizer false: the optimizer's torch calls do not pass through the capture
    mode (it is off torch's stack for the step and back after it); with include_optimizer they
    do, and are recorded."""
    x, y = batch
    for include in (False, True):
        seen = []
        optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-3)
        optimizer.register_step_pre_hook(lambda *a: seen.append(len(_mode_stack())))
        dbg = PrecisionDebugger(dump_path=str(tmp_path / str(include)),
                                include_optimizer=include)
        dbg.start(gpt)
        loss_of(gpt, x, y).backward()
        optimizer.step()
        optimizer.zero_grad()
        assert len(_mode_stack()) == 1          # back after the step
        dbg.stop()
        assert _mode_stack() == []
        dbg.step()
        assert dbg.close() and dbg.failures == 0
        assert seen == [1 if include else 0]
        with precdbg.open_dump(str(tmp_path / str(include))) as dump:
            phases = set(dump.records(step=0)["phase"].tolist())
        assert ("optimizer" in phases) == include


def test_stop_takes_off_only_its_own_mode(tmp_path, gpt, batch):
    """User modes entered before start() and after it (even one still open at stop(), and a
    stop() inside a skipped optimizer step) stay on torch's stack, in their order."""
    x, y = batch
    outer, inner = _UserMode(), _UserMode()
    with outer:
        dbg = PrecisionDebugger(dump_path=str(tmp_path))
        dbg.start(gpt)
        inner.__enter__()
        loss_of(gpt, x, y).backward()
        dbg.stop()
        assert _mode_stack() == [outer, inner]
        inner.__exit__(None, None, None)
        assert inner.calls > 0
        dbg.step()
        optimizer = torch.optim.SGD(gpt.parameters(), lr=1e-3)
        optimizer.register_step_pre_hook(lambda *a: dbg.stop())
        dbg.start(gpt)
        loss_of(gpt, x, y).backward()
        optimizer.step()
        assert _mode_stack() == [outer]
        dbg.step()
        assert dbg.close() and dbg.failures == 0
    assert _mode_stack() == []


def test_stop_without_backward_leaves_no_graph_hooks(tmp_path, gpt, batch):
    """A graph built while capturing, backpropagated after stop(): nothing is recorded, nothing
    fails, the gradients are the ordinary ones."""
    x, y = batch
    reference = make_model()
    loss_of(reference, x, y).backward()
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start(gpt)
    loss = loss_of(gpt, x, y)
    dbg.stop()
    loss.backward()
    dbg.step()
    assert dbg.close()
    assert dbg.failures == 0
    t = precdbg.open_dump(str(tmp_path)).records(step=0)
    assert not np.any(t["direction"] == "backward")
    for (name, a), (_, b) in zip(gpt.named_parameters(), reference.named_parameters()):
        assert torch.equal(a.grad, b.grad), name


def test_start_twice_and_stop_twice(tmp_path, gpt, optimizer, batches):
    from precdbg_examples.gpt_torch import train_step
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.stop()                      # before any start: no-op
    dbg.step()                      # step 0 passes without capture
    for i in (1, 2):
        x, y = batches[i]
        assert dbg.start(gpt) is True
        assert dbg.start(gpt) is True       # repeat: no-op, no second set of hooks
        train_step(gpt, optimizer, x, y)
        dbg.stop()
        dbg.stop()
        assert torch_hooks_left(gpt) == []
        dbg.step()
        dbg.step() if i == 2 else None      # an extra step() only moves the counter
    assert dbg.current_step == 4
    assert dbg.close() and dbg.close()      # close twice
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [1, 2]
    a, b = dump.records(step=1), dump.records(step=2)
    # one record per tensor: nothing doubled by the repeated start
    assert len(rows_where(a, entry="Functional.linear.0.forward", role="output")) == 1
    assert len(rows_where(a, entry="Param.lm_head.weight.grad")) == 1
    assert list(a["entry"]) == list(b["entry"])
    assert list(a["role"]) == list(b["role"])
    assert torch_hooks_left(gpt) == []


def test_two_debuggers_in_sequence_same_model(tmp_path, gpt, optimizer, batches):
    for name in ("first", "second"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / name))
        run_steps(dbg, gpt, optimizer, batches, 1)
        assert dbg.failures == 0
        assert torch_hooks_left(gpt) == []
    a = precdbg.open_dump(str(tmp_path / "first")).records(step=0)
    b = precdbg.open_dump(str(tmp_path / "second")).records(step=0)
    assert list(a["entry"]) == list(b["entry"])


def test_capture_context_manager(tmp_path, gpt, optimizer, batch):
    from precdbg_examples.gpt_torch import train_step
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with dbg.capture(gpt) as d:
        assert d is dbg and dbg.capturing
        assert torch._C._len_torch_function_stack() == 1
        train_step(gpt, optimizer, *batch)
    assert not dbg.capturing
    assert torch_hooks_left(gpt) == []
    dbg.step()
    with pytest.raises(ZeroDivisionError):
        with dbg.capture(gpt):
            loss_of(gpt, *batch)
            raise ZeroDivisionError("training code failed")
    assert not dbg.capturing
    assert torch_hooks_left(gpt) == []
    dbg.step()
    with dbg:                                   # the debugger itself closes on exit
        pass
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0, 1]
    assert len(rows_where(dump.records(step=0), kind="param_grad")) == \
        len(list(gpt.parameters()))
    assert len(rows_where(dump.records(step=1), entry="Module.GPT.forward.0", role="output")) == 1


class Exploding(nn.Module):
    """Raises in the middle of its forward, inside a nested module."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.fail = True

    def forward(self, x):
        h = self.inner(x)
        if self.fail:
            raise RuntimeError("boom")
        return F.relu(h)


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.body = Exploding()
        self.post = nn.Linear(4, 2)

    def forward(self, x):
        return self.post(self.body(self.pre(x)))


def test_exception_inside_the_model_still_cleans_up(tmp_path):
    torch.manual_seed(0)
    model = Wrapper()
    x = torch.randn(3, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start(model)
    with pytest.raises(RuntimeError, match="boom"):
        model(x)
    dbg.stop()
    assert torch_hooks_left(model) == []
    dbg.step()
    # the next step is captured normally: module attribution not confused by the failed call
    model.body.fail = False
    dbg.start(model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    assert dbg.close()
    assert dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0, 1]
    t0 = dump.records(step=0)
    assert len(rows_where(t0, entry="Module.pre.Linear.forward.0", role="output")) == 1
    assert one_row(t0, entry="Functional.linear.1.forward", role="output")["module"] == \
        "body.inner"
    t = dump.records(step=1)
    assert one_row(t, entry="Functional.linear.0.forward", role="output")["module"] == "pre"
    assert one_row(t, entry="Functional.relu.0.forward", role="output")["module"] == "body"
    assert one_row(t, entry="Functional.linear.2.forward", role="output")["module"] == "post"
    assert one_row(t, entry="Module.Wrapper.forward.0", role="output")["module"] == ""
    assert rows_where(t, entry="Param.body.inner.weight.grad")


class RaggedOut(nn.Module):
    """Also returns a strided nested tensor (torch.nested's prototype layout), whose shape torch
    itself cannot give (precdbg records its values)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)

    def forward(self, idx):
        dense = self.emb(idx)
        return dense.sum(), torch.nested.nested_tensor([dense[:1].detach(), dense[1:].detach()])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_hook_failures_never_reach_training(tmp_path, caplog, monkeypatch):
    """Statistics that fail inside a hook (injected here for the nested output's values, 12
    elements) are counted and reported; training goes on and everything else is captured."""
    real = precdbg_tensors.TorchTensors.summarize

    def failing(self, t):
        if t.dim() == 1 and t.numel() == 12:
            raise RuntimeError("statistics failed (injected)")
        return real(self, t)
    monkeypatch.setattr(precdbg_tensors.TorchTensors, "summarize", failing)
    torch.manual_seed(0)
    model = RaggedOut()
    ref = RaggedOut()
    ref.load_state_dict(model.state_dict())
    idx = torch.tensor([1, 2, 2, 7])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for _ in range(2):
            dbg.start(model)
            total, ragged = model(idx)          # a nested output of the module
            total.backward()
            opt.step()
            opt.zero_grad()
            dbg.stop()
            dbg.step()
    assert dbg.close()
    for _ in range(2):
        total_ref, ragged_ref = ref(idx)
        total_ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert torch.equal(model.emb.weight, ref.emb.weight)
    assert all(torch.equal(a, b) for a, b in zip(ragged.unbind(), ragged_ref.unbind()))
    assert dbg.failures > 0
    assert any("training continues" in r.getMessage() for r in caplog.records)
    assert torch_hooks_left(model) == []
    # what could be captured was captured
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0, 1]
    t = dump.records(step=0)
    assert one_row(t, entry="Functional.embedding.0.forward", role="output")["shape"] == (4, 3)


def test_unwritable_dump_path_is_one_clear_error_before_training(tmp_path, gpt, optimizer,
                                                                 batches):
    """A dump folder that cannot be made is refused when the debugger is made, not at the
    first dumped step hours into training; one that becomes unusable later is refused at
    start(), which then installs nothing."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    for path, words in ((blocker / "dump", f"{blocker} is a file, so"),
                        (blocker, f"{blocker} is a file, not a folder")):
        with pytest.raises(precdbg.ConfigError) as info:
            PrecisionDebugger(dump_path=str(path))
        message = str(info.value)
        assert message.startswith(f"dump_path: {path}: ") and words in message, message
        assert "\n" not in message
    later = tmp_path / "later"
    dbg = PrecisionDebugger(dump_path=str(later / "dump"))
    later.write_text("made a file after the debugger")
    with pytest.raises(precdbg.ConfigError) as info:
        dbg.start(gpt)
    message = str(info.value)
    assert message.startswith("dump_path: ") and str(later / "dump") in message
    assert "\n" not in message and "Not a directory" in message
    assert not dbg.capturing and torch_hooks_left(gpt) == []
    # the refused start installed nothing: training goes on as if no debugger were there
    losses = run_steps(None, gpt, optimizer, batches[:1], 1)
    assert len(losses) == 1 and torch.isfinite(losses[0]) and dbg.close()


def test_start_rejects_what_is_not_a_model(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    linear = nn.Linear(2, 2)
    for given, words in (("not a model", "nn.Module"), ([], "an empty list"),
                         ([linear, linear], "item 1 is item 0 again"),
                         ((linear, 3), "item 1 is int")):
        with pytest.raises(precdbg.PrecdbgError, match=words):
            dbg.start(given)
    assert not dbg.capturing
    # nothing written before the refusal: a rerun in another process finds no earlier dump
    assert not os.listdir(tmp_path)
    assert torch._C._len_torch_function_stack() == 0
    dbg.close()
    # the refused start left nothing behind: the corrected script can use the same folder
    model = nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with dbg.capture(model):
        model(torch.ones(1, 2))
    assert dbg.close() and dbg.failures == 0
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0]
    assert len(dump.files(step=0)) == 1
    assert one_row(dump.records(step=0), entry="Functional.linear.0.forward", role="output")


def test_start_without_a_model_at_level_module_is_refused_and_at_mix_said_once(tmp_path,
                                                                              caplog):
    """Level module records the calls of the model given to start(model): without one it
    would record nothing, so start() refuses with the config key and the fix (msprobe's L0
    needs the model too), leaving nothing behind. Level mix without one records API calls only,
    and says so once."""
    model = nn.Linear(2, 2)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "module"), level="module")
    with pytest.raises(precdbg.ConfigError, match=r"level: 'module'.*start\(model\)"):
        dbg.start()
    assert not dbg.capturing and torch._C._len_torch_function_stack() == 0
    dbg.start(model)                        # the corrected call, same debugger and folder
    model(torch.ones(1, 2))
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    assert precdbg.open_dump(str(tmp_path / "module")).steps == [0]

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "mix"), level="mix")
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for _ in range(2):
            dbg.start()
            model(torch.ones(1, 2))
            dbg.stop()
            dbg.step()
    said = [r.getMessage() for r in caplog.records if "without a model" in r.getMessage()]
    assert len(said) == 1 and "start(model)" in said[0], said
    assert dbg.close() and dbg.failures == 0
    records = precdbg.open_dump(str(tmp_path / "mix")).records(step=1)
    assert set(records["kind"].tolist()) == {"api"}


def test_both_call_patterns_give_the_same_dump(tmp_path, batches):
    """start/stop every iteration with step=[1] == start/stop only on iteration 1."""
    model_a = make_model()
    dbg_a = PrecisionDebugger(dump_path=str(tmp_path / "a"), step=[1])
    losses_a = run_steps(dbg_a, model_a, make_optimizer(model_a), batches, 3)
    model_b = make_model()
    dbg_b = PrecisionDebugger(dump_path=str(tmp_path / "b"))
    losses_b = run_steps(dbg_b, model_b, make_optimizer(model_b), batches, 3, start_on=[1])
    assert [float(l) for l in losses_a] == [float(l) for l in losses_b]
    assert dbg_a.failures == dbg_b.failures == 0
    dump_a, dump_b = precdbg.open_dump(str(tmp_path / "a")), precdbg.open_dump(str(tmp_path / "b"))
    assert dump_a.steps == dump_b.steps == [1]
    a, b = dump_a.records(step=1), dump_b.records(step=1)
    assert len(a) == len(b) > 0
    for column in ("entry", "kind", "role", "arg_index", "module", "op", "phase", "direction",
                   "order", "seq", "dtype", "shape", "tensor_id", "trainable", "nan_count",
                   "inf_count", "text"):
        assert np.array_equal(a[column], b[column]), column
    for column in ("min", "max", "mean", "norm"):
        assert np.array_equal(a[column], b[column], equal_nan=True), column
    assert dump_a.modules(step=1) == dump_b.modules(step=1)


def test_core_does_not_import_torch():
    result = run_python("import precdbg, sys; import precdbg.cli, precdbg.storage.reader, "
                        "precdbg.capture.session, precdbg.storage.writer, precdbg.capture.filters, precdbg.records.naming, "
                        "precdbg.capture.debugger; assert 'torch' not in sys.modules, 'torch imported'; "
                        "assert not any(m.startswith('mindspore') for m in sys.modules); "
                        "print('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_reading_a_dump_does_not_import_torch(tmp_path):
    dump_once(tmp_path)
    path = str(tmp_path / "dump")
    result = run_python(
        "import sys, precdbg; d = precdbg.open_dump(sys.argv[1]); t = d.records(step=0); "
        "assert len(t) > 0; t.row(0); assert 'torch' not in sys.modules; print(len(t))"
        .replace("sys.argv[1]", repr(path)))
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(precdbg.open_dump(path).records(step=0))


def test_unselected_step_installs_nothing(tmp_path, gpt, optimizer, batch):
    from precdbg_examples.gpt_torch import train_step
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[1])
    assert dbg.start(gpt) is False
    assert not dbg.capturing
    assert torch_hooks_left(gpt) == []
    train_step(gpt, optimizer, *batch)
    dbg.stop()
    dbg.step()
    assert dbg.start(gpt) is True
    dbg.stop()
    dbg.close()


def test_step_or_close_without_stop(tmp_path, gpt, optimizer, batches):
    """Forgetting stop(): step() and close() stop the capture and write the step."""
    from precdbg_examples.gpt_torch import train_step
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.start(gpt)
    train_step(gpt, optimizer, *batches[0])
    dbg.step()
    assert not dbg.capturing and torch_hooks_left(gpt) == []
    dbg.start(gpt)
    train_step(gpt, optimizer, *batches[1])
    assert dbg.close()
    assert not dbg.capturing and torch_hooks_left(gpt) == []
    dump = precdbg.open_dump(str(tmp_path))
    assert dump.steps == [0, 1]
    assert len(dump.records(step=0)) == len(dump.records(step=1)) > 0


def test_step_file_is_created_when_written_not_at_start(tmp_path, gpt, batch):
    """start() only queues the step's opening: the writer creates the .partial file when
    something is written to it (stored tensors, or the records at stop()), so opening it
    never competes with start() hooking the model. The step is complete once stopped."""
    import os
    dump = tmp_path / "dump"
    dbg = PrecisionDebugger(task="statistics", level="mix", dump_path=str(dump))
    dbg.start(gpt)
    dbg.flush()                               # the writer has handled the opening
    assert not (dump / "step0").exists()
    x, y = batch
    loss_of(gpt, x, y).backward()
    dbg.stop()
    dbg.step()
    dbg.flush()
    assert sorted(os.listdir(dump / "step0")) == ["rank0.h5"]
    assert len(precdbg.open_dump(str(dump)).records(step=0)) > 0
    dbg.close()


# --------------------------------------------------------------------------- the dump folder
# (a rerun into the same folder: tests/test_rerun.py)
def test_debuggers_of_one_process_share_a_folder_and_never_overwrite(tmp_path, caplog):
    """A debugger made per dumped step (a local of a function) writes into the folder the
    first one started, and counts on from the steps it counted: another iteration is another
    step, never a second part of the first one's. Files that appear in the folder from
    elsewhere after the constructor looked make start() dump nothing, in one line, without
    raising into training or touching them."""
    dump = str(tmp_path / "dump")
    model = make_model()
    for _ in range(2):
        dbg = PrecisionDebugger(dump_path=dump, level="module")
        run_steps(dbg, model, make_optimizer(model), make_batch_list(1), 1)
        assert dbg.close() and not dbg.failures
    opened = precdbg.open_dump(dump)
    assert opened.steps == [0, 1]
    assert [len(parts) for parts in opened._files.values()] == [1, 1]
    assert len(opened.records(step=0)) == len(opened.records(step=1)) > 0
    opened.close()

    other = str(tmp_path / "other")
    dbg = PrecisionDebugger(dump_path=other, level="module")
    (tmp_path / "other" / "step0").mkdir(parents=True)
    foreign = tmp_path / "other" / "step0" / "rank0.h5"
    foreign.write_bytes(b"another job's file")
    with caplog.at_level(logging.ERROR, logger="precdbg"):
        assert dbg.start(model) is False
        assert dbg.start(model) is False
    assert torch_hooks_left(model) == []
    said = [r.getMessage() for r in caplog.records if "already holds a dump" in r.getMessage()]
    assert len(said) == 1 and "nothing is dumped" in said[0], said
    dbg.stop()
    dbg.step()
    assert dbg.close()
    assert foreign.read_bytes() == b"another job's file"


@pytest.mark.parametrize("first, said_words", [(None, "start(model) first"),
                                              ("generator", "start([model_a, model_b])")])
def test_a_later_start_with_another_model_says_how_to_hook_it(tmp_path, caplog, first,
                                                              said_words):
    """start() then start(model), or a GAN loop's start(G); start(D): the later model was not
    hooked in this step. It is said once, with how to hook it; the same model again says
    nothing."""
    generator, discriminator = make_model(), make_model()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for model in (generator if first else None, generator if first else None,
                      discriminator, discriminator):
            assert dbg.start(model) is True
    said = [r.getMessage() for r in caplog.records if "already being captured" in r.getMessage()]
    assert len(said) == 1 and said_words in said[0], said
    dbg.stop()
    dbg.step()
    assert dbg.close()


def test_a_capture_left_open_by_an_exception_is_said_once(tmp_path, caplog, batches):
    """An exception caught by the training loop skipped stop(): the capture goes on through
    the next iterations; after three optimizer steps precdbg says so once, without raising."""
    model = make_model()
    optimizer = make_optimizer(model)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="mix")
    with caplog.at_level(logging.WARNING, logger="precdbg"):
        for iteration in range(5):
            try:
                if iteration == 0:
                    dbg.start(model)
                loss_of(model, *batches[0]).backward()
                optimizer.step()
                optimizer.zero_grad()
                if iteration == 0:
                    raise RuntimeError("a bad batch")
            except RuntimeError:
                continue
    said = [r.getMessage() for r in caplog.records if "stop() did not run" in r.getMessage()]
    assert len(said) == 1 and "through 3 steps of AdamW" in said[0], said
    dbg.stop()
    dbg.step()
    assert dbg.close() and not dbg.failures


def test_two_debuggers_capturing_into_one_folder_at_once_write_a_part_each(tmp_path):
    """Windows of two debuggers over the same folder that overlap: each writes a part of its
    own (the step file is created by the writer thread, after both windows opened), no file is
    written twice and nothing is dropped."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    first = PrecisionDebugger(dump_path=str(tmp_path), step=[], level="module")
    second = PrecisionDebugger(dump_path=str(tmp_path), step=[], level="api")
    first.start(model)
    second.start(model)
    model(torch.randn(3, 4)).sum().backward()
    first.stop(); first.step()
    second.stop(); second.step()
    assert first.close() and second.close() and first.failures == second.failures == 0
    assert sorted(os.listdir(tmp_path / "step0")) == ["rank0.h5", "rank0.part1.h5"]
    kinds = set(precdbg.open_dump(str(tmp_path)).records(step=0)["kind"].tolist())
    assert {"module", "api"} <= kinds


def test_training_in_another_thread_than_start_is_said_once(tmp_path, caplog):
    """torch's function-mode stack is per thread: with start() in the main thread and the
    step run in a worker thread (an app that trains in a thread of its own), the module
    records are there and the API records are not. That is said once, in one line naming the
    module and both threads, not left for the user to find in a thinner dump; a step run in
    start()'s own thread says nothing."""
    import threading
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path, level="mix", step=[])

    def train() -> None:
        model(torch.randn(3, 4)).sum().backward()

    for step in range(3):
        dbg.start(model)
        if step < 2:
            worker = threading.Thread(target=train, name="trainer")
            worker.start()
            worker.join()
        else:
            train()
        dbg.stop()
        dbg.step()
    dbg.close()
    said = [r.getMessage() for r in caplog.records if r.name == "precdbg"
            and not r.getMessage().startswith(DUMPING_TO)]
    assert said == [f"precdbg: step 0: Sequential ran in thread 'trainer', not in "
                    f"'{threading.current_thread().name}' where start() was called: its module "
                    "calls are recorded, the API calls of that thread are not (call start() "
                    "and stop() in the thread that trains)"], said
    with precdbg.open_dump(dump_path) as dump:
        assert "api" not in set(dump.records(step=1)["kind"].tolist())
        assert {"api", "module"} <= set(dump.records(step=2)["kind"].tolist())


def test_model_given_to_the_constructor_is_what_start_hooks(tmp_path):
    """msprobe's signature, PrecisionDebugger(config_path, model=model), then start() without
    a model: the modules are hooked as with start(model). The debugger holds the model weakly:
    a script that drops its model gets the memory back."""
    import gc
    import weakref
    model = make_model()
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(model=model, dump_path=path, step=[])
    dbg.start()
    loss_of(model, *make_batch_list(1)[0]).backward()
    dbg.stop()
    dbg.step()
    assert dbg.close() and dbg.failures == 0
    kinds = set(precdbg.open_dump(path).records(step=0)["kind"].tolist())
    assert {"module", "api", "param", "param_grad"} <= kinds, kinds
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    dbg.start()                      # the model is gone: a window without module hooks
    dbg.stop()
    assert dbg.failures == 0


def test_a_debugger_made_again_for_the_same_folder_goes_on_counting(tmp_path):
    """A debugger that is a local of a function called once per epoch, made again with the
    same config: msprobe's one debugger per process counts on, so each epoch's dumped
    iteration is a step of its own, not a second part of step 0 holding another iteration."""
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    path = str(tmp_path / "dump")

    def train_epoch() -> None:
        dbg = PrecisionDebugger(dump_path=path, step=[1, 4], level="mix")
        for iteration in range(3):
            dbg.start(model)
            model(torch.randn(3, 4)).sum().backward()
            dbg.stop()
            dbg.step()
        assert dbg.close() and dbg.failures == 0

    train_epoch()
    train_epoch()
    dump = precdbg.open_dump(path)
    assert dump.steps == [1, 4] and not dump.warnings()
    assert sorted(os.listdir(os.path.join(path, "step4"))) == ["rank0.h5"]
