"""`compare --engine dask|ray ADDRESS` (issue 50): a local cluster of each engine on this machine
(Dask's worker processes; Ray's, started in this process with `ray.init`) compares the ranks of
synthetic multi-rank dumps, one task per rank, and the result is the one-process result byte
for byte in JSON; the command line gives the same verdict and exit code, with the address given
or in the engine's variable (DASK_SCHEDULER_ADDRESS, RAY_ADDRESS), and says in one line what is
missing: an address, the engine's package, a cluster at the address. Each engine's tests are
skipped without its package (the optional extras `precdbg[dask]`, `precdbg[ray]`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "core"))
import synthetic as S  # noqa: E402

from precdbg.compare import compare_dumps  # noqa: E402
from precdbg.compare.report.json_out import dumps_indent1  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = (0, 1, 2, 3)
VARIABLE = {"dask": "DASK_SCHEDULER_ADDRESS", "ray": "RAY_ADDRESS"}


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
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
def ray_cluster():
    ray = pytest.importorskip("ray")
    # a RAY_ADDRESS of the caller's would connect instead of starting a cluster; and Ray, like
    # Dask's nanny, may write into this process's environment: put it back afterwards
    environ = dict(os.environ)
    os.environ.pop("RAY_ADDRESS", None)
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                           object_store_memory=100 << 20)
        # the command line's process connects to this cluster as a second driver
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture(params=["dask", "ray"])
def engine(request):
    """(engine, the address of a local cluster of it)."""
    return request.param, request.getfixturevalue(f"{request.param}_cluster")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    base = dict(ranks=RANKS, steps=(0, 1))
    return (S.write_dump(root / "a", **base),
            S.write_dump(root / "b", **dict(base, gelu_scale=1.01)),
            S.write_dump(root / "c", **base))


def _compare(a, b, extra, env, timeout=300):
    return subprocess.run([sys.executable, "-m", "precdbg", "compare", a, b] + extra,
                          capture_output=True, text=True, env=env, timeout=timeout)


def _without_addresses(**more):
    env = {k: v for k, v in os.environ.items() if k not in VARIABLE.values()}
    env["PYTHONPATH"] = ROOT
    env.update(more)
    return env


@pytest.mark.parametrize("other", [1, 2])
def test_engine_gives_one_process_result(engine, dumps, other):
    a, b = dumps[0], dumps[other]
    one = compare_dumps(a, b, jobs=1)
    on_engine = compare_dumps(a, b, engine=engine)
    assert dumps_indent1(on_engine) == dumps_indent1(one)
    assert one["verdict"] == ("diverged" if other == 1 else "match")


def test_engine_on_the_command_line(engine, dumps, tmp_path):
    name, address = engine
    a, b = dumps[0], dumps[1]
    env = _without_addresses(**{VARIABLE[name]: address})
    outs = []
    for extra in (["--jobs", "1"], ["--engine", name], ["--engine", name, address]):
        out = tmp_path / f"r{len(outs)}.json"
        proc = _compare(a, b, ["--json", str(out)] + extra, env)
        assert proc.returncode == 1, proc.stderr
        outs.append(json.loads(out.read_text()))
    assert outs[1] == outs[0] and outs[2] == outs[0]


@pytest.mark.parametrize("name,says", [
    ("dask", "give the scheduler's address (--engine dask tcp://HOST:8786) or set "
             "DASK_SCHEDULER_ADDRESS"),
    ("ray", "give the cluster's address (--engine ray HOST:6379, or auto) or set RAY_ADDRESS")])
def test_engine_without_address_is_one_line(dumps, name, says):
    proc = _compare(dumps[0], dumps[1], ["--engine", name], _without_addresses(), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == f"precdbg: --engine {name}: {says}\n"


def test_ray_not_installed_is_one_line(dumps, tmp_path):
    # a `ray` package that cannot be imported, first on the path: as if none were installed
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = _without_addresses(PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    proc = _compare(dumps[0], dumps[1], ["--engine", "ray", "127.0.0.1:6379"], env,
                    timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("precdbg: --engine ray: ray is not installed "
                           "(pip install \"precdbg[ray]\")\n")


def test_ray_unreachable_is_one_line(dumps):
    pytest.importorskip("ray")
    proc = _compare(dumps[0], dumps[1], ["--engine", "ray", "127.0.0.1:1"],
                    _without_addresses(), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("precdbg: --engine ray: cannot reach the cluster at "
                                  "127.0.0.1:1 (")
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_engine_error_cancels_every_task(engine, monkeypatch):
    # tasks a worker cannot run: the first error reaches the caller, after every task was
    # cancelled (the same path as Ctrl-C's KeyboardInterrupt)
    from precdbg.compare import engine as engines
    name, address = engine
    runner = engines._ENGINES[name]
    cancelled = []

    def cancel(self, handles):
        cancelled.append(len(handles))
        original(self, handles)
    original = runner.cancel
    monkeypatch.setattr(runner, "cancel", cancel)
    arrived = []
    with pytest.raises(AttributeError):
        engines.run_on_engine(name, address, [None] * 4, lambda found, count: arrived.append(1))
    assert cancelled == [4] and arrived == []
