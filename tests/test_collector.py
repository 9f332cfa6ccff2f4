"""The garbage-collector pause of a dumped step: frozen during the window, restored at stop()."""
from __future__ import annotations

import gc

import pytest
import torch

from precdbg_pt import PrecisionDebugger


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def _train(model: torch.nn.Module) -> None:
    model(torch.randn(2, 4)).sum().backward()


@pytest.fixture(autouse=True)
def _clean_collector():
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_window_freezes_and_stop_restores(tmp_path):
    before = gc.get_threshold()
    model = _model()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    debugger.start(model)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] > before[0]
    _train(model)
    debugger.stop()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    debugger.step()
    debugger.stop()                      # repeated: nothing left to restore
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_garbage_cycle_made_in_window_is_collected_after_stop(tmp_path):
    model = _model()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))

    class Node:
        pass
    debugger.start(model)
    _train(model)
    a, b = Node(), Node()
    a.other, b.other = b, a
    import weakref
    probe = weakref.ref(a)
    del a, b
    debugger.stop()
    debugger.step()
    gc.collect()
    assert probe() is None


def test_program_that_froze_or_disabled_the_collector_is_left_alone(tmp_path):
    model = _model()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    gc.freeze()
    frozen = gc.get_freeze_count()
    threshold = gc.get_threshold()
    debugger.start(model)
    _train(model)
    assert gc.get_threshold() == threshold
    debugger.stop()
    debugger.step()
    assert gc.get_freeze_count() > frozen // 2      # still the program's own freeze
    gc.unfreeze()
    gc.disable()
    debugger.start(model)
    _train(model)
    assert gc.get_freeze_count() == 0 and not gc.isenabled()
    debugger.stop()
    assert not gc.isenabled()


def test_threshold_changed_by_the_program_during_the_window_is_kept(tmp_path):
    model = _model()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    debugger.start(model)
    gc.set_threshold(1234, 5, 5)
    _train(model)
    debugger.stop()
    assert gc.get_threshold() == (1234, 5, 5)
    assert gc.get_freeze_count() == 0


def test_failed_start_restores_the_collector(tmp_path):
    before = gc.get_threshold()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    with pytest.raises(Exception):
        debugger.start("not a model")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_window_leaves_no_garbage_cycles_behind(tmp_path):
    """Training loops that turn the collector off (Megatron's --manual-gc) collect only now
    and then: a dumped step's bookkeeping must be freed by reference counting when its window
    ends, not pile up until a collection."""
    from precdbg.capture import batch
    model = _model()
    debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=str(tmp_path))
    gc.collect()
    gc.disable()
    for _ in range(3):
        debugger.start(model)
        _train(model)
        debugger.stop()
        debugger.step()
    debugger.flush()
    alive = [o for o in gc.get_objects() if type(o) in (batch.Seen, batch._Stats)]
    assert alive == []
