"""`compare --engine dask ADDRESS` (issue 50): a local Dask cluster of worker processes on this
machine compares the ranks of synthetic multi-rank dumps, one task per rank, and the result is
the one-process result byte for byte in JSON; the command line gives the same verdict and exit
code, with the address given or in DASK_SCHEDULER_ADDRESS. Skipped without dask's distributed
(the optional extra `precdbg[dask]`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

distributed = pytest.importorskip("distributed")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "core"))
import synthetic as S  # noqa: E402

from precdbg.compare import compare_dumps  # noqa: E402
from precdbg.compare.report.json_out import dumps_indent1  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = (0, 1, 2, 3)


@pytest.fixture(scope="module")
def cluster():
    # Dask's nanny writes its workers' environment into this process's (OMP_NUM_THREADS=1,
    # MKL_NUM_THREADS=1, ...): every later test's subprocess would train on one thread, and
    # the tests that compare a dump with one made in-process on two threads see float noise
    environ = dict(os.environ)
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as local:
            yield local.scheduler_address
    finally:
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    base = dict(ranks=RANKS, steps=(0, 1))
    return (S.write_dump(root / "a", **base),
            S.write_dump(root / "b", **dict(base, gelu_scale=1.01)),
            S.write_dump(root / "c", **base))


@pytest.mark.parametrize("other", [1, 2])
def test_engine_gives_one_process_result(cluster, dumps, other):
    a, b = dumps[0], dumps[other]
    one = compare_dumps(a, b, jobs=1)
    on_engine = compare_dumps(a, b, engine=("dask", cluster))
    assert dumps_indent1(on_engine) == dumps_indent1(one)
    assert one["verdict"] == ("diverged" if other == 1 else "match")


def test_engine_on_the_command_line(cluster, dumps, tmp_path):
    a, b = dumps[0], dumps[1]
    env = dict(os.environ, PYTHONPATH=ROOT, DASK_SCHEDULER_ADDRESS=cluster)
    outs = []
    for extra in (["--jobs", "1"], ["--engine", "dask"], ["--engine", "dask", cluster]):
        out = tmp_path / f"r{len(outs)}.json"
        proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", a, b, "--json",
                               str(out)] + extra, capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 1, proc.stderr
        outs.append(json.loads(out.read_text()))
    assert outs[1] == outs[0] and outs[2] == outs[0]


def test_engine_without_address_is_one_line(dumps):
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run([sys.executable, "-m", "precdbg", "compare", dumps[0], dumps[1],
                           "--engine", "dask"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("precdbg: --engine dask: give the scheduler's address")
