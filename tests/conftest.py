"""What every test shares, needing no framework: the repository's paths, subprocess helpers
(run_python, guide scripts, ranks), record-table lookups, and the `cuda` marker.

torch is optional here: where it is installed, its fixtures (`gpt`, `optimizer`, `batches`,
`batch`: a tiny seeded GPT, tests/torch_support.py) are available to every test, and Triton runs
in its interpreter without CUDA. Where it is not, the core suite (tests/core) still collects
and runs. Torch helpers are imported from torch_support by the tests that use them."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

try:
    import torch
except ImportError:          # the core suite without frameworks (tests/core)
    torch = None

if torch is not None and not torch.cuda.is_available():
    # Triton kernels (precdbg_pt.device_stats) run on CPU tensors only in Triton's interpreter,
    # which must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

if torch is not None:
    from torch_support import batch, batches, gpt, optimizer  # noqa: E402,F401 - fixtures

import precdbg  # noqa: E402
from ranks_support import launch_ranks  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
# the one line a process says when it first dumps: where the dump goes (docs/lifecycle.md)
DUMPING_TO = "precdbg: dumping to "


def beyond_dumping_to(text: str) -> str:
    """What a dumping process printed, less its "precdbg: dumping to ..." line: a test that a
    run said nothing else of precdbg (no failure, no notice) looks here."""
    return "\n".join(line for line in text.splitlines() if not line.startswith(DUMPING_TO))


def cuda_available() -> bool:
    """Whether a CUDA device can run the tests marked `cuda` (never without torch)."""
    return torch is not None and torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def rows_where(table: precdbg.RecordTable, **conditions: Any) -> List[Dict[str, Any]]:
    mask = np.ones(len(table), dtype=bool)
    for key, value in conditions.items():
        mask &= table[key] == value
    return [table.row(int(i)) for i in np.nonzero(mask)[0]]


def one_row(table: precdbg.RecordTable, **conditions: Any) -> Dict[str, Any]:
    rows = rows_where(table, **conditions)
    assert len(rows) == 1, f"expected one record for {conditions}, found {len(rows)}"
    return rows[0]


def assert_rel(actual: float, expected: float, rtol: float = 1e-6, what: str = "") -> None:
    assert abs(actual - expected) <= rtol * max(abs(expected), 1e-30), \
        f"{what}: {actual!r} != {expected!r} (rtol {rtol})"


def run_python(code_or_args: Any, *, env: Optional[Dict[str, str]] = None, timeout: float = 120,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run `python -c CODE` (str) or `python ARGS...` (list) in a real subprocess."""
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else list(code_or_args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd or REPO)


def run_guide(folder: Any, args: Sequence[str], env: Optional[Dict[str, str]] = None,
              timeout: float = 300, level: str = "mix") -> Dict[str, Any]:
    """Run a guide script (`python ARGS... CONFIG`) in a fresh process with a statistics
    config at `level` dumping into FOLDER/dump; it must exit 0 and print one JSON line last.
    Returns that object with `dump` (the dump folder) and `stderr` added."""
    import json
    config = os.path.join(str(folder), "config.json")
    dump = os.path.join(str(folder), "dump")
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({"task": "statistics", "level": level, "dump_path": dump}, handle)
    proc = run_python([*args, config], timeout=timeout, env=env)
    assert proc.returncode == 0, f"{args}: rc {proc.returncode}\n{proc.stderr[-4000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["stderr"], out["dump"] = proc.stderr, dump
    return out


def run_variant(root: Any, script: str, *args: str, level: str = "mix",
                env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """`run_guide` of one variant of a guide script (`script ARGS...`) into its own folder
    under ROOT, on one torch thread; it must report no precdbg failures."""
    folder = root / "-".join(args + (level,)).replace(":", "_")
    folder.mkdir()
    out = run_guide(folder, [script, *args], env={"OMP_NUM_THREADS": "1", **(env or {})},
                    level=level)
    assert out["failures"] == 0, out["stderr"][-3000:]
    return out


def assert_same_run(plain: Dict[str, Any], run: Dict[str, Any]) -> Dict[str, Any]:
    """Two `run_guide` results of one training, differently run (with activation recompute and
    without): the same losses, and dumps that pair record for record with no difference.
    Returns the comparison."""
    from precdbg.compare import compare_dumps
    assert run["losses"] == plain["losses"]
    result = compare_dumps(plain["dump"], run["dump"])
    assert result["verdict"] == "match", result["first_divergence"]
    assert not result["unmatched"], result["unmatched"][:5]
    return result


def run_ranks(script: str, world: int = 2, timeout: float = 180) -> List[Tuple[str, str]]:
    """Run `python SCRIPT` as `world` ranks of one torch.distributed job (tests/ranks_support);
    every rank must exit 0. Returns (stdout, stderr) per rank."""
    results = launch_ranks([PYTHON, script], world, REPO, timeout)
    for rank, (code, _, stderr) in enumerate(results):
        assert code == 0, f"rank {rank}: exit {code}\n{stderr[-3000:]}"
    return [(out, err) for _, out, err in results]


def write_config_file(path: Any, data: Any) -> str:
    """A config file at `path`: `data` as JSON, or as given when it is text."""
    import json
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return str(path)


def guide_dumps(tmp: Any, guide: str, variants: Dict[str, str]) -> Dict[str, str]:
    """One statistics dump (level mix) per name in `variants` (name -> the guide's variant),
    each written by `python GUIDE CONFIG VARIANT` in a fresh process that must exit 0 and say
    nothing of precdbg on stderr."""
    out = {}
    for name, variant in variants.items():
        dump = str(tmp / name)
        config = write_config_file(tmp / f"{name}.json", {"task": "statistics", "level": "mix",
                                                          "dump_path": dump, "step": [0]})
        done = run_python([guide, config, variant], timeout=300)
        assert done.returncode == 0, done.stderr
        assert "precdbg" not in beyond_dumping_to(done.stderr), done.stderr
        out[name] = dump
    return out


def config_error(fn: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the ConfigError `fn(*args, **kwargs)` raises: one line, a PrecdbgError."""
    with pytest.raises(precdbg.ConfigError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, f"error message is not one line: {message!r}"
    assert isinstance(info.value, precdbg.PrecdbgError)
    return message


def lines_until(proc: subprocess.Popen, last: str, what: str) -> List[str]:
    """The lines a child process prints on stdout, up to and with `last` (it must not end
    before: `what` says what it was doing)."""
    lines: List[str] = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"{what} ended early: {lines} {proc.stderr.read()}")
        lines.append(line.strip())
        if lines[-1] == last:
            return lines


# keyword settings a config refuses, and the key its one-line error names
BAD_KEYWORDS: List[Tuple[Dict[str, Any], str]] = [
    (dict(level="L3"), "level"),
    (dict(task="free_benchmark"), "task"),
    (dict(summary_mode="sha1"), "summary_mode"),
    (dict(data_mode=["sideways"]), "data_mode"),
    (dict(data_mode=["all", "forward"]), "data_mode"),
    (dict(compression="zstd"), "compression"),
    (dict(queue_mb=0), "queue_mb"),
    (dict(overflow_nums=-2), "overflow_nums"),
    (dict(scope_range=["Functional.linear.0.forward"]), "scope_range"),
    (dict(stepp=[1]), "stepp"),
    (dict(dump_pth="x"), "dump_pth"),
    (dict(step=["9-1"]), "step"),
    (dict(stack="yes"), "stack"),
    (dict(queue_mb="x"), "queue_mb"),
]
