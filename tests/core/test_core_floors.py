"""Rounding floors (precdbg.compare.judge.floors) on synthetic record tables, no framework: which
backward gradients are judged against the rounding of the dy they were summed from (a conv
bias's (C,) from dy (N, C, H, W), a batch norm's weight, a linear bias), which are not (a
matmul's or a conv's dx and dw, however their shapes line up), that the floor follows the
values (the parameter's gradient record, a clipping norm's read and result), and that a real
change above the floor is still a divergence.

The step holds the backward calls of

    y = conv(x)             # Functional.conv2d.0: x (N, 1, H, W), 1x1 kernel w (C, 1, 1, 1), bias
    z = batch_norm(y)       # Functional.batch_norm.0: weight and bias (C,)
    u = h @ m               # Tensor.matmul.0: h (N, T, 1), m (1, K)
    v = linear(g)           # Functional.linear.0: bias (K,)
    clip_grad_norm_([conv.bias])   # Functional.norm.0 reads conv.bias.grad

with dy zero-mean per channel (as BatchNorm's dx is), so that the conv bias's gradient is only
its rounding, and tiny weights (1e-4), so that the conv's and the matmul's dx are far smaller
than their dy without being sums of it."""
from __future__ import annotations

import os
from typing import Any, Dict

import numpy as np
import pytest

from precdbg.compare import compare_dumps
from precdbg.compare.judge.floors import rounding_floors
from precdbg.compare.judge.metrics import TOLERANCE
from precdbg.storage.reader import open_dump
from precdbg.storage.writer import DumpWriter

import synthetic as S

N, C, H, W = 2, 4, 3, 5          # W != C: a bias does not line up with dy from the right
T, K = 3, 6
TINY = 1e-4                      # the 1x1 conv's and the matmul's weights


def _dy(rng: np.random.Generator) -> np.ndarray:
    """An incoming gradient (N, C, H, W) whose every channel sums to zero, as BatchNorm's dx."""
    g = rng.standard_normal((N, C, H, W)) * 0.1
    return g - g.mean(axis=(0, 2, 3), keepdims=True)


def _step(order: int = 0, bias_offset: float = 0.0, bias_scale: float = 1.0,
          dx_scale: float = 1.0, mm_dx_scale: float = 1.0, lin_bias_scale: float = 1.0,
          mean_dy: float = 0.0) -> S.StepBuilder:
    """The backward records of the step. `order` sums the conv bias's gradient in another
    order (another kernel's rounding); `bias_offset` adds that many times dy's norm to each of
    its elements (a real change); `bias_scale`, `dx_scale`, `mm_dx_scale` and `lin_bias_scale`
    scale it, the conv's dx, the matmul's dx and the linear's bias gradient; `mean_dy` adds
    that to dy (its channels no longer sum to 0: a bias gradient that does not cancel)."""
    rng = np.random.default_rng(7)
    b = S.StepBuilder("float32")
    f32 = lambda x: np.asarray(x, dtype=np.float32)  # noqa: E731

    orders = {"conv2d": 1, "batch_norm": 2, "matmul": 3, "linear": 4, "norm": 5}   # forward's

    def emit(name: str, prefix: str, op: str, module: str, role: str, arg: int, t: S.Tensor,
             direction: str = "backward") -> None:
        b.emit(entry=f"{prefix}.{name}.0.{direction}", kind="api", prefix=prefix, api=name,
               op=op, module=module, direction=direction, role=role, arg_index=arg,
               arg_key=str(arg), call_index=0, order=orders[name], value=t, phase="backward")

    def grad(path: str, t: S.Tensor) -> None:
        owner, _, leaf = path.rpartition(".")
        b.emit(entry=f"Param.{path}.grad", kind="param_grad", prefix="Param", api=path, op=leaf,
               module=owner, direction="backward", role="param_grad", arg_index=0, arg_key="",
               call_index=0, order=0, value=t, alias=path)

    # batch_norm: dz -> dy (zero-mean per channel), dgamma, dbeta
    dz = b.tensor(rng.standard_normal((N, C, H, W)) * 0.1)
    xhat = rng.standard_normal((N, C, H, W))
    dy_values = f32(_dy(rng) + mean_dy)
    emit("batch_norm", "Functional", "batch_norm", "bn", "grad_output", 0, dz)
    dy = b.tensor(dy_values)
    emit("batch_norm", "Functional", "batch_norm", "bn", "grad_input", 0, dy)
    dgamma = b.tensor((dz.values * xhat).sum(axis=(0, 2, 3)))
    emit("batch_norm", "Functional", "batch_norm", "bn", "grad_input", 3, dgamma)
    grad("bn.weight", dgamma)
    # conv2d: dy -> dx (N, 1, H, W), dw (C, 1, 1, 1), db (C,)
    x = rng.standard_normal((N, 1, H, W))
    w = np.full((C, 1, 1, 1), TINY)
    emit("conv2d", "Functional", "conv2d", "conv", "grad_output", 0, dy)
    dx = b.tensor((dy_values * w.reshape(1, C, 1, 1)).sum(axis=1, keepdims=True) * dx_scale)
    emit("conv2d", "Functional", "conv2d", "conv", "grad_input", 0, dx)
    emit("conv2d", "Functional", "conv2d", "conv", "grad_input", 1,
         b.tensor((dy_values * x).sum(axis=(0, 2, 3)).reshape(C, 1, 1, 1)))
    terms = np.moveaxis(dy_values, 1, 0).reshape(C, -1)            # float32, summed as float32
    summed = np.add.reduce(terms[:, ::-1] if order else terms, axis=1, dtype=np.float32)
    db = b.tensor((summed + bias_offset * np.linalg.norm(dy_values.astype(np.float64)))
                  * bias_scale)
    emit("conv2d", "Functional", "conv2d", "conv", "grad_input", 2, db)
    grad("conv.bias", db)
    # clip_grad_norm_ reads conv.bias.grad after backward (phase backward): a norm of it
    emit("norm", "Functional", "norm", "", "input", 0, db, "forward")
    emit("norm", "Functional", "norm", "", "output", 0,
         b.tensor(np.linalg.norm(db.values.astype(np.float64))), "forward")
    # matmul: h (N, T, 1) @ m (1, K): du -> dh (N, T, 1), dm (1, K)
    du_values = f32(rng.standard_normal((N, T, K)) * 0.1)
    du = b.tensor(du_values)
    m = np.full((1, K), TINY)
    h = rng.standard_normal((N, T, 1))
    emit("matmul", "Tensor", "matmul", "", "grad_output", 0, du)
    emit("matmul", "Tensor", "matmul", "", "grad_input", 0,
         b.tensor(du_values @ m.T * mm_dx_scale))
    emit("matmul", "Tensor", "matmul", "", "grad_input", 1,
         b.tensor((h * du_values).sum(axis=(0, 1)).reshape(1, K)))
    # linear: dv (N, T, K) -> its bias's gradient (K,)
    emit("linear", "Functional", "linear", "lin", "grad_output", 0, du)
    emit("linear", "Functional", "linear", "lin", "grad_input", 2,
         b.tensor(du_values.sum(axis=(0, 1)) * lin_bias_scale))
    return b


def _dump(root: Any, **changes: Any) -> str:
    root = os.fspath(root)
    b = _step(**changes)
    writer = DumpWriter(root)
    S.write_step(writer, 0, 0, [(b.records, b.payloads)])
    assert writer.flush(30) and writer.shutdown(), writer.last_error
    assert writer.errors == 0, writer.last_error
    v = S.Variant()
    S.write_run_json(root, S.run_info(root, v, {0: S.manifest_of(v, 0, 1, None, None)}))
    return root


def _floors(root: str) -> Dict[str, float]:
    """Each record's floor (0: none), the run against itself: `<entry> <role> <arg_index>`."""
    t = open_dump(root).records(0, 0)
    idx = np.arange(len(t))
    floor = rounding_floors(t, t, idx, idx)
    return {f"{e} {r} {k}": float(f) for e, r, k, f in
            zip(t["entry"].tolist(), t["role"].tolist(), t["arg_index"].tolist(), floor)}


def _norms(root: str) -> Dict[str, float]:
    t = open_dump(root).records(0, 0)
    return {f"{e} {r} {k}": float(n) for e, r, k, n in
            zip(t["entry"].tolist(), t["role"].tolist(), t["arg_index"].tolist(), t["norm"])}


def _rows(result: Dict[str, Any], name: str, role: str, arg: int):
    return [r for r in result["rows"] if r["name_a"] == name and r["role"] == role
            and r["arg_index"] == arg]


CONV, BN = "Functional.conv2d.0.backward", "Functional.batch_norm.0.backward"
MATMUL, LINEAR, NORM = "Tensor.matmul.0.backward", "Functional.linear.0.backward", \
    "Functional.norm.0.forward"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> str:
    return _dump(tmp_path_factory.mktemp("floors") / "a")


def test_which_gradients_are_judged_against_the_dy_they_were_summed_from(baseline):
    floors, norms = _floors(baseline), _norms(baseline)
    dy = norms[f"{CONV} grad_output 0"]
    # the conv bias (C,) from dy (N, C, H, W), over N, H, W: the floor is dy's norm
    assert floors[f"{CONV} grad_input 2"] == pytest.approx(dy)
    assert norms[f"{CONV} grad_input 2"] < 1e-5 * dy           # only rounding
    # the batch norm's weight (C,) and the linear's bias (K,) from their dy, likewise
    assert floors[f"{BN} grad_input 3"] == pytest.approx(norms[f"{BN} grad_output 0"])
    assert floors[f"{LINEAR} grad_input 2"] == pytest.approx(norms[f"{LINEAR} grad_output 0"])
    # far smaller than their dy and shaped like a broadcast of it, but contractions with a
    # weight: the conv's dx (N, 1, H, W) and dw, the matmul's dx (N, T, 1) and dw (1, K)
    assert norms[f"{CONV} grad_input 0"] < 1e-3 * dy
    assert norms[f"{MATMUL} grad_input 0"] < 1e-3 * norms[f"{MATMUL} grad_output 0"]
    for key in (f"{CONV} grad_input 0", f"{CONV} grad_input 1", f"{MATMUL} grad_input 0",
                f"{MATMUL} grad_input 1"):
        assert floors[key] == 0.0, key


def test_the_floor_follows_the_values(baseline):
    """The bias's gradient record and clip_grad_norm_'s read of it carry the floor; the norm it
    computes carries it scaled by the norm's gain (here 1)."""
    floors, norms = _floors(baseline), _norms(baseline)
    dy = norms[f"{CONV} grad_output 0"]
    assert floors["Param.conv.bias.grad param_grad 0"] == pytest.approx(dy)
    assert floors[f"{NORM} input 0"] == pytest.approx(dy)
    gain = norms[f"{NORM} output 0"] / norms[f"{NORM} input 0"]
    assert floors[f"{NORM} output 0"] == pytest.approx(dy * min(1.0, gain))


def test_a_conv_bias_gradient_at_its_rounding_matches(baseline, tmp_path):
    """The bias's gradient summed in another order: relative to itself the runs are far apart,
    against the rounding of its terms they agree."""
    other = _dump(tmp_path / "b", order=1)
    a, b = _norms(baseline), _norms(other)
    key = f"{CONV} grad_input 2"
    assert abs(a[key] - b[key]) > 100 * TOLERANCE["float32"] * max(a[key], b[key])
    result = compare_dumps(baseline, other)
    assert result["verdict"] == "match", result["first_divergence"]
    for name, role, arg in ((CONV, "grad_input", 2), ("Param.conv.bias.grad", "param_grad", 0),
                            (NORM, "input", 0)):
        (row,) = _rows(result, name, role, arg)
        assert row["status"] == "match", row
        assert row["floor"] == pytest.approx(a[f"{CONV} grad_output 0"]), row


@pytest.mark.parametrize("changes, name, role, arg", [
    # a real change of the bias's gradient: 1e-3 of the norm of its terms, on each element
    ({"order": 1, "bias_offset": 1e-3}, CONV, "grad_input", 2),
    # the same gradient where its terms do not cancel, 1e-3 of itself
    ({"mean_dy": 0.01, "bias_scale": 1.001}, CONV, "grad_input", 2),
    # a 1e-3 change of the conv's and the matmul's dx (no floor: judged against themselves)
    ({"dx_scale": 1.001}, CONV, "grad_input", 0),
    ({"mm_dx_scale": 1.001}, MATMUL, "grad_input", 0),
    # a 1e-3 change of a linear's bias gradient that is not rounding
    ({"lin_bias_scale": 1.001}, LINEAR, "grad_input", 2),
])
def test_a_real_change_above_the_floor_is_still_a_divergence(tmp_path, changes, name, role, arg):
    base = {"mean_dy": changes["mean_dy"]} if "mean_dy" in changes else {}
    a = _dump(tmp_path / "a", **base)
    b = _dump(tmp_path / "b", **changes)
    result = compare_dumps(a, b)
    assert result["verdict"] == "diverged", result["rows"][:3]
    first = result["first_divergence"]
    assert (first["step"], first["name_a"], first["role"]) == (0, name, role), first
    (row,) = _rows(result, name, role, arg)
    assert row["status"] == "diverged" and row["err"] > 10 * row["tol"], row


def test_carried_sums_of_a_small_call_are_numpys_to_the_last_bit(monkeypatch):
    """A small call's carried floors summed in Python floats are the doubles numpy gives
    (NaN, infinities, zeros of both signs, zero norms among the values)."""
    import math
    import random
    from precdbg.compare.judge import floors
    rng = random.Random(0)
    odd = [0.0, -0.0, 1.0, 1e-300, 1e300, float("inf"), float("nan"), 3.5, 1e-30, 0.5]
    cases = []
    for _ in range(3000):
        carried = [(rng.choice(odd + [rng.random()]), rng.choice(odd + [rng.random() * 10]))
                   for _ in range(rng.randint(1, 5))]
        cases.append((carried, [rng.choice(odd + [rng.random() * 10])
                                for _ in range(rng.randint(1, 5))]))
    small = [floors._carried_sums(c, n) for c, n in cases]
    monkeypatch.setattr(floors, "_SMALL_CALL", -1)
    with np.errstate(invalid="ignore"):
        large = [floors._carried_sums(c, n) for c, n in cases]
    same = [(x == y and math.copysign(1, x) == math.copysign(1, y)) or (x != x and y != y)
            for xs, ys in zip(small, large) for x, y in zip(xs, ys)]
    assert len(same) > 3000 and all(same)
