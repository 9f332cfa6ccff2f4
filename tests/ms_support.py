"""Shared helpers of the MindSpore tests (a plain module, imported by tests/test_ms_*.py after
their `pytest.importorskip("mindspore")`): MindSpore set up once for CPU, PyNative, blocking
launches; a tiny seeded MindSpore GPT, its optimizer and numpy batches; training steps under a
`precdbg_ms.PrecisionDebugger`; table lookups; and inventories of every hook or patch precdbg
could leave behind in MindSpore.

Nothing here imports torch, so the MindSpore tests that do not compare with PyTorch run without it.
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import nn, ops

import precdbg
from precdbg_examples import gpt_ms
from precdbg_ms import PrecisionDebugger

# --------------------------------------------------------------------------- MindSpore, once
ms.set_device("CPU")
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.runtime.launch_blocking()

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_CONFIGS = os.path.join(REPO, "config_examples")

TINY = dict(n_layer=2, d_model=64, n_head=4, seq_len=16, vocab_size=128)
BATCH = 4
SEED = 1234

# every nn.Dense of the tiny GPT, in forward execution order
DENSE_PATHS = [f"blocks.{i}.{p}" for i in range(2)
               for p in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")] + ["lm_head"]
LAYER_NORM_PATHS = [f"blocks.{i}.{p}" for i in range(2) for p in ("ln_1", "ln_2")] + ["ln_f"]

_TENSOR_BASE = ms.Tensor.__mro__[1]          # mindspore._c_expression.TensorPy

# the namespaces precdbg_ms patches (see precdbg_ms/api_registry.py)
PATCHED_MODULES = ("mindspore.ops", "mindspore.mint", "mindspore.mint.nn.functional")

# the hook dictionaries of a MindSpore 2.10 Cell (nn/cell.py creates them lazily: None until used)
CELL_HOOK_ATTRS = ("_lazy_forward_pre_hook", "_lazy_forward_hook", "_lazy_backward_pre_hook",
                   "_lazy_backward_hook", "_lazy_forward_pre_hook_with_kwargs",
                   "_lazy_forward_hook_with_kwargs", "_lazy_forward_hook_always_called")


def tiny_config() -> gpt_ms.GPTConfig:
    return gpt_ms.GPTConfig(**TINY)


def make_model(seed: int = SEED) -> gpt_ms.GPT:
    ms.set_seed(seed)
    return gpt_ms.GPT(tiny_config())


def make_optimizer(model: nn.Cell, kind: str = "adamw") -> nn.Optimizer:
    if kind == "sgd":
        return nn.SGD(model.trainable_params(), learning_rate=0.1)
    return nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-3)


def make_batches(steps: int = 1, batch: int = BATCH, seed: int = 0
                 ) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Numpy int32 token batches (inputs, next-token targets)."""
    return list(gpt_ms.make_batches_numpy(tiny_config(), batch_size=batch, steps=steps, seed=seed))


def as_tensors(batch: Tuple[np.ndarray, np.ndarray]) -> Tuple[ms.Tensor, ms.Tensor]:
    x, y = batch
    return ms.Tensor(x), ms.Tensor(y)


def loss_fn(model: nn.Cell) -> Callable[[ms.Tensor, ms.Tensor], ms.Tensor]:
    def forward(x: ms.Tensor, y: ms.Tensor) -> ms.Tensor:
        logits = model(x)
        return ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    return forward


def grads_of(model: nn.Cell, batch: Tuple[np.ndarray, np.ndarray]
             ) -> Tuple[float, Dict[str, np.ndarray]]:
    """One forward + backward (no update): the loss and the gradient of every trainable
    parameter by its MindSpore name, as value_and_grad returns them."""
    params = model.trainable_params()
    loss, grads = ms.value_and_grad(loss_fn(model), None, params)(*as_tensors(batch))
    return float(loss.asnumpy()), {p.name: g.asnumpy().copy() for p, g in zip(params, grads)}


def run_steps(dbg: Optional[PrecisionDebugger], model: nn.Cell, optimizer: nn.Optimizer,
              batches: Sequence[Tuple[np.ndarray, np.ndarray]], n: Optional[int] = None,
              close: bool = True) -> List[float]:
    """Train n steps with gpt_ms.train_step_fn; start/stop/step every iteration."""
    n = len(batches) if n is None else n
    step = gpt_ms.train_step_fn(model, optimizer)
    losses = []
    for i in range(n):
        x, y = as_tensors(batches[i % len(batches)])
        if dbg is not None:
            dbg.start(model)
        losses.append(float(step(x, y).asnumpy()))
        if dbg is not None:
            dbg.stop()
            dbg.step()
    if dbg is not None and close:
        assert dbg.close(), "the writer did not finish in time"
    return losses


def dump_once(tmp_path, steps: int = 1, model: Optional[nn.Cell] = None, optimizer: str = "adamw",
              **settings: Any) -> Tuple[precdbg.Dump, PrecisionDebugger]:
    """Train `steps` steps of a tiny GPT under a debugger of `settings`; open the dump."""
    settings.setdefault("dump_path", str(tmp_path / "dump"))
    dbg = PrecisionDebugger(**settings)
    model = model if model is not None else make_model()
    run_steps(dbg, model, make_optimizer(model, optimizer), make_batches(steps), steps)
    return precdbg.open_dump(settings["dump_path"]), dbg


def capture(tmp_path, body: Callable[[], Any], model: Any = None, **settings: Any
            ) -> Tuple[precdbg.RecordTable, PrecisionDebugger, Any]:
    """Run `body()` in one captured window; return the step-0 table, the debugger, body's result."""
    settings.setdefault("dump_path", str(tmp_path / "dump"))
    dbg = PrecisionDebugger(**settings)
    dbg.start(model)
    try:
        result = body()
    finally:
        dbg.stop()
        assert dbg.close(), "the writer did not finish in time"
    return precdbg.open_dump(settings["dump_path"]).records(step=0), dbg, result


# --------------------------------------------------------------------------- tables
def rows_where(table: precdbg.RecordTable, **conditions: Any) -> List[Dict[str, Any]]:
    mask = np.ones(len(table), dtype=bool)
    for key, value in conditions.items():
        mask &= table[key] == value
    return [table.row(int(i)) for i in np.nonzero(mask)[0]]


def one_row(table: precdbg.RecordTable, **conditions: Any) -> Dict[str, Any]:
    rows = rows_where(table, **conditions)
    assert len(rows) == 1, f"expected one record for {conditions}, found {len(rows)}"
    return rows[0]


def norm64(a: Any) -> float:
    a = a.asnumpy() if isinstance(a, ms.Tensor) else np.asarray(a)
    return float(np.linalg.norm(a.astype(np.float64).ravel()))


def assert_rel(actual: float, expected: float, rtol: float = 1e-6, what: str = "") -> None:
    assert abs(actual - expected) <= rtol * max(abs(expected), 1e-30), \
        f"{what}: {actual!r} != {expected!r} (rtol {rtol})"


# --------------------------------------------------------------------------- what may be left
def primitive_classes() -> List[type]:
    """Every subclass of mindspore.ops.Primitive that exists now."""
    seen: Dict[int, type] = {}
    stack = [ms.ops.Primitive]
    while stack:
        cls = stack.pop()
        if id(cls) not in seen:
            seen[id(cls)] = cls
            stack.extend(cls.__subclasses__())
    return list(seen.values())


def _recompute_classes() -> Tuple[str, ...]:
    """The classes of `mindspore.common.recompute` that precdbg_ms wraps, where this MindSpore
    has them: `_RecomputeCell` (reentrant recompute, 2.7+) and `_RecomputeHandle`
    (non-reentrant, 2.8+; 2.7's `Cell.recompute()` has no `use_reentrant`)."""
    recompute = importlib.import_module("mindspore.common.recompute")
    return tuple(name for name in ("_RecomputeCell", "_RecomputeHandle")
                 if hasattr(recompute, name))


RECOMPUTE_CLASSES = _recompute_classes()
# the replays precdbg_ms wraps in this MindSpore (its `patch_recompute`)
RECOMPUTE_PATCHES = frozenset(name + {"_RecomputeCell": ".bprop",
                                       "_RecomputeHandle": ".recompute"}[name]
                              for name in RECOMPUTE_CLASSES)
# `Cell.recompute(use_reentrant=False)`: non-reentrant recompute, where this MindSpore has it
NON_REENTRANT_RECOMPUTE = "use_reentrant" in inspect.signature(nn.Cell.recompute).parameters


def patch_targets() -> Dict[str, Any]:
    """Every object whose attributes precdbg_ms may replace, by a readable name."""
    out: Dict[str, Any] = {name: importlib.import_module(name) for name in PATCHED_MODULES}
    for cls in ms.Tensor.__mro__[:-1]:                    # Tensor and its C base, not object
        out[f"class {cls.__module__}.{cls.__qualname__}"] = cls
    out["class mindspore.nn.Optimizer"] = nn.Optimizer
    recompute = importlib.import_module("mindspore.common.recompute")   # activation recompute
    out["mindspore.common.recompute"] = recompute
    for name in RECOMPUTE_CLASSES:
        out[f"class mindspore.common.recompute.{name}"] = getattr(recompute, name)
    for cls in primitive_classes():
        out[f"class {cls.__module__}.{cls.__qualname__}@{id(cls):x}"] = cls
    return out


def snapshot() -> Dict[str, Dict[str, Any]]:
    """A copy of `vars()` of every patch target (values kept, compared by identity later)."""
    return {name: dict(vars(obj)) for name, obj in patch_targets().items()}


def _is_submodule(owner: Any, attr: str, value: Any) -> bool:
    return isinstance(value, types.ModuleType) and isinstance(owner, types.ModuleType) and \
        value.__name__ == f"{owner.__name__}.{attr}"


def snapshot_differences(before: Dict[str, Dict[str, Any]]) -> List[str]:
    """What differs from `before` now: attributes replaced (not the same object), added or
    removed, on every target of the snapshot; and precdbg wrappers on any target at all."""
    now = patch_targets()
    diffs = []
    for name, old in before.items():
        current = vars(now[name]) if name in now else None
        if current is None:
            diffs.append(f"{name}: gone")
            continue
        for attr in sorted(set(old) | set(current)):
            if attr not in current:
                diffs.append(f"{name}.{attr}: removed")
            elif attr not in old:
                if _is_submodule(now[name], attr, current[attr]):
                    continue        # a submodule imported meanwhile: the import system's doing
                diffs.append(f"{name}.{attr}: added ({current[attr]!r})")
            elif current[attr] is not old[attr]:
                diffs.append(f"{name}.{attr}: replaced ({old[attr]!r} -> {current[attr]!r})")
    for name, obj in now.items():
        for attr, value in vars(obj).items():
            if hasattr(value, "__precdbg_original__"):
                diffs.append(f"{name}.{attr}: a precdbg wrapper")
    return diffs


def hooks_left(model: nn.Cell) -> List[str]:
    """Every cell or parameter hook left on the model, as readable strings."""
    left = []
    for path, cell in model.cells_and_names():
        for attr in CELL_HOOK_ATTRS:
            if getattr(cell, attr, None):
                left.append(f"{path or '<root>'}.{attr}")
    for param in model.get_parameters():
        hooks = _TENSOR_BASE.hooks(param)     # the C method: never patched, never captured
        if hooks:
            left.append(f"param {param.name}: {len(hooks)} hooks")
    return left


def rms(row: Dict[str, Any]) -> float:
    """Root mean square of a record's tensor, from its norm."""
    return row["norm"] / math.sqrt(max(row["numel"], 1))
