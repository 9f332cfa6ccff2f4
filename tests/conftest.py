"""Shared fixtures: a tiny seeded GPT, its optimizer and batches, and helpers to run training steps
under a PrecisionDebugger and read the dump back."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels (precdbg_pt.device_stats) run on CPU tensors only in Triton's interpreter,
    # which must be chosen before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch.nn.functional as F

import precdbg
from precdbg_examples.gpt_torch import GPT, GPTConfig, make_batches, train_step
from precdbg_pt import PrecisionDebugger
from ranks_support import launch_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable

TINY = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=128)
BATCH = 2
SEED = 1234

# every nn.Linear of the tiny GPT, in forward execution order
LINEAR_PATHS = [f"blocks.{i}.{p}" for i in range(2)
                for p in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")] + ["lm_head"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def tiny_config() -> GPTConfig:
    return GPTConfig(**TINY)


def make_model(seed: int = SEED, dtype: torch.dtype = torch.float32) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config())
    return model.to(dtype)


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_batch_list(steps: int = 4, batch: int = BATCH, seed: int = 0
                    ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return list(make_batches(tiny_config(), batch_size=batch, steps=steps, seed=seed))


@pytest.fixture
def gpt() -> GPT:
    return make_model()


@pytest.fixture
def optimizer(gpt: GPT) -> torch.optim.Optimizer:
    return make_optimizer(gpt)


@pytest.fixture
def batches() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    return make_batch_list(4)


@pytest.fixture
def batch(batches) -> Tuple[torch.Tensor, torch.Tensor]:
    return batches[0]


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def run_steps(dbg: Optional[PrecisionDebugger], model: torch.nn.Module,
              optimizer: torch.optim.Optimizer,
              batches: Sequence[Tuple[torch.Tensor, torch.Tensor]], n: Optional[int] = None,
              start_on: Optional[Sequence[int]] = None,
              close: bool = True) -> List[torch.Tensor]:
    """Train n steps. With `start_on` None, start/stop every iteration (the step filter selects);
    otherwise start only on the listed iterations. step() is called every iteration."""
    n = len(batches) if n is None else n
    losses = []
    for i in range(n):
        x, y = batches[i % len(batches)]
        capture = dbg is not None and (start_on is None or i in start_on)
        if capture:
            dbg.start(model)
        losses.append(train_step(model, optimizer, x, y))
        if capture:
            dbg.stop()
        if dbg is not None:
            dbg.step()
    if dbg is not None and close:
        assert dbg.close(), "the writer did not finish in time"
    return losses


def dump_once(tmp_path, steps: int = 1, model: Optional[torch.nn.Module] = None,
              **settings: Any) -> Tuple[precdbg.Dump, PrecisionDebugger]:
    """Train `steps` steps of a fresh tiny GPT with a debugger of `settings`; open the dump."""
    settings.setdefault("dump_path", str(tmp_path / "dump"))
    dbg = PrecisionDebugger(**settings)
    model = model if model is not None else make_model()
    run_steps(dbg, model, make_optimizer(model), make_batch_list(steps), steps)
    return precdbg.open_dump(settings["dump_path"]), dbg


def rows_where(table: precdbg.RecordTable, **conditions: Any) -> List[Dict[str, Any]]:
    mask = np.ones(len(table), dtype=bool)
    for key, value in conditions.items():
        mask &= table[key] == value
    return [table.row(int(i)) for i in np.nonzero(mask)[0]]


def one_row(table: precdbg.RecordTable, **conditions: Any) -> Dict[str, Any]:
    rows = rows_where(table, **conditions)
    assert len(rows) == 1, f"expected one record for {conditions}, found {len(rows)}"
    return rows[0]


def norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().double()))


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

def torch_hooks_left(model: torch.nn.Module) -> List[str]:
    """Every hook or mode precdbg could have left in torch, as readable strings."""
    left = []
    for path, module in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks", "_forward_hooks_with_kwargs",
                     "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs"):
            if getattr(module, attr, None):
                left.append(f"{path or '<root>'}.{attr}")
    for name, p in model.named_parameters():
        if p._backward_hooks:
            left.append(f"param {name}._backward_hooks")
        if getattr(p, "_post_accumulate_grad_hooks", None):
            left.append(f"param {name}._post_accumulate_grad_hooks")
    if torch._C._len_torch_function_stack() != 0:
        left.append("torch function mode stack")
    from torch.optim import optimizer as opt
    if opt._global_optimizer_pre_hooks:
        left.append("global optimizer pre hooks")
    if opt._global_optimizer_post_hooks:
        left.append("global optimizer post hooks")
    from torch.nn.modules import module as nn_module
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks"):
        if getattr(nn_module, attr, None):
            left.append(f"torch.nn.modules.module.{attr}")
    return left
