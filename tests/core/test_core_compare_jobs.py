"""`compare --jobs N` (issue 50): ranks compared in worker processes give the result of one
process, byte for byte in JSON: multi-rank dumps that match, that diverge, over several steps,
and `--step S` judged against step S-1; Ctrl-C (a KeyboardInterrupt in the main process)
leaves no worker behind; `--jobs 0` is refused."""
from __future__ import annotations

import json
import multiprocessing

import pytest

import synthetic as S
from precdbg.cli import main
from precdbg.compare import compare_dumps, parallel
from precdbg.compare.report.json_out import dumps_indent1

RANKS = (0, 1, 2)


@pytest.fixture(autouse=True)
def small_dumps_in_parallel(monkeypatch):
    """The synthetic dumps are tiny: workers start whatever their size."""
    monkeypatch.setattr(parallel, "_MIN_PARALLEL_BYTES", 0)


def _same(a: str, b: str, **kwargs) -> dict:
    one = compare_dumps(a, b, jobs=1, **kwargs)
    two = compare_dumps(a, b, jobs=2, **kwargs)
    assert dumps_indent1(two) == dumps_indent1(one)
    return one


@pytest.mark.parametrize("changes", [dict(), dict(gelu_scale=1.01), dict(dw_scale=1.01),
                                     dict(input_scale=1.001)])
def test_jobs_give_one_process_result(tmp_path, changes):
    base = dict(ranks=RANKS, steps=(0, 1))
    result = _same(S.write_dump(tmp_path / "a", **base),
                   S.write_dump(tmp_path / "b", **dict(base, **changes)))
    assert {row["rank"] for row in result["rows"]} == set(RANKS)
    assert result["verdict"] == ("diverged" if changes else "match")


def test_jobs_with_step_judged_against_the_step_before(tmp_path):
    base = dict(ranks=RANKS, steps=(0, 1, 2))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, lr=0.1001))
    result = _same(a, b, step=2)
    assert {row["step"] for row in result["rows"]} == {2}


def test_ctrl_c_stops_every_worker(tmp_path):
    base = dict(ranks=RANKS)
    a, b = S.write_dump(tmp_path / "a", **base), S.write_dump(tmp_path / "b", **base)
    tasks = [parallel.RankTask(a, b, r, [0], [], True, False, None, True, [], []) for r in RANKS]

    def interrupted(found, count):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        parallel.compare_ranks(tasks, 2, interrupted)
    assert multiprocessing.active_children() == []


def test_jobs_zero_is_refused(tmp_path, capsys):
    a = S.write_dump(tmp_path / "a")
    assert main(["compare", a, a, "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


def _lr_on_rank_1(root: str, lr: float) -> None:
    """Rank 1's manifest in run.json says another learning rate (the check finds it on that
    rank only: its own optimizer settings)."""
    path = f"{root}/run.json"
    with open(path) as handle:
        run = json.load(handle)
    run["manifests"]["1"]["optimizers"][0]["param_groups"][0]["hyper"]["lr"] = lr
    with open(path, "w") as handle:
        json.dump(run, handle)


@pytest.mark.parametrize("other_lr", [False, True])
def test_another_ranks_optimizer_set_up_decides_how_every_rank_is_judged(tmp_path, other_lr):
    """The check of each rank after the first runs where the compare reads it; an optimizer
    difference found only there still decides the noise policy of every rank: step 1's
    parameters judged by their update where the optimizers are set up alike, by rounding
    where they are not, in one process and in workers alike."""
    base = dict(ranks=(0, 1), steps=(0, 1))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, gelu_ulps=1))
    if other_lr:
        _lr_on_rank_1(b, 0.2)
    result = _same(a, b)
    codes = [note["code"] for note in result["notes"]]
    optimizer = [f for f in result["setup"] if f["kind"] == "optimizer"]
    assert result["verdict"] == "match"
    if other_lr:
        assert "judged_by_rounding" in codes and "judged_by_update" not in codes
        assert [(f["rank"], f["hyperparameter"], f["a"], f["b"]) for f in optimizer] == \
            [(1, "lr", "0.1", "0.2")]
    else:
        assert "judged_by_update" in codes and "judged_by_rounding" not in codes
        assert optimizer == []


def test_a_ranks_step_optimizers_found_by_its_check_are_those_of_the_step(tmp_path):
    """Where a rank's check reads the optimizer settings its step files hold, the compare takes
    its findings for that step rather than reading them again: the same as
    `step_optimizer_findings` of that (step, rank), another lr on rank 1 included."""
    import h5py
    from precdbg.check import check_rank, step_optimizer_findings
    from precdbg.storage.reader import open_dump
    from precdbg.storage.step_checks import reseal
    base = dict(ranks=(0, 1), steps=(0, 1))
    roots = S.write_dump(tmp_path / "a", **base), S.write_dump(tmp_path / "b", **base)
    for root in roots:
        with open(f"{root}/run.json") as handle:
            optimizers = json.load(handle)["manifest"]["optimizers"]
        for step in (0, 1):
            for rank in (0, 1):
                lr = 0.2 if (root, step, rank) == (roots[1], 1, 1) else 0.1
                optimizers[0]["param_groups"][0]["hyper"]["lr"] = lr
                path = f"{root}/step{step}/rank{rank}.h5"
                with h5py.File(path, "r+") as handle:
                    handle.attrs["optimizers"] = json.dumps(optimizers)
                reseal(path)
    a, b = open_dump(roots[0]), open_dump(roots[1])
    labels = ("baseline", "candidate")
    try:
        for step in (0, 1):
            checked = check_rank(a, b, step, step, 1, labels)
            assert checked.step_optimizers == step_optimizer_findings(a, b, step, 1, labels)
            lrs = [(f["hyperparameter"], f["a"], f["b"]) for f in checked.step_optimizers]
            assert lrs == ([("lr", "0.1", "0.2")] if step == 1 else [])
    finally:
        a.close()
        b.close()
    # the compare of step 1 (rank 1 checked in its task) says so under "setup"
    found = [(f["kind"], f.get("rank"), f.get("hyperparameter"))
             for f in _same(*roots, step=1)["setup"]]
    assert ("optimizer", 1, "lr") in found


@pytest.mark.parametrize("interrupted", [False, True])
def test_workers_tell_the_main_process_what_it_would_open_files_again_for(
        tmp_path, monkeypatch, interrupted):
    """With workers, the main process reads the attributes of the check's first rank only:
    whether each other step file holds a whole step comes back with its rank's result, and
    the steps that are not whole are named as one process names them."""
    from precdbg.storage import step_reader
    opened = []
    read_attrs = step_reader.StepFile._read_attrs

    def attrs(self, handle):
        opened.append(self.path)
        return read_attrs(self, handle)
    monkeypatch.setattr(step_reader.StepFile, "_read_attrs", attrs)
    base = dict(ranks=RANKS, steps=(0, 1))
    a = S.write_dump(tmp_path / "a", **base)
    b = S.write_dump(tmp_path / "b", **dict(base, interrupted=interrupted))
    result = compare_dumps(a, b, jobs=2)
    assert sorted(opened) == [f"{a}/step0/rank0.h5", f"{b}/step0/rank0.h5"]
    incomplete = [f for f in result["setup"] if f["kind"] == "incomplete"]
    assert len(incomplete) == (len(RANKS) * 2 if interrupted else 0)
    assert dumps_indent1(compare_dumps(a, b, jobs=1)) == dumps_indent1(result)
