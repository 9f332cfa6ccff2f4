"""pos_mean, the order-sensitive statistic (issue 45, item 3): the C pass over host memory
(contiguous, strided, two threads, every SIMD level) against numpy float64, the Triton kernel
(interpreter) and the torch-ops fallback against the C pass, its sensitivity to order and its
independence of memory layout, the statistics keys that now include the order, the step file's
column (old files read as NaN), compare and check judging it, and - in real processes - a CNN
whose candidate flips one image of the batch: compare names the input data."""
from __future__ import annotations

import json
import math
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

from precdbg.capture import fastats
from precdbg.records.schema import (ADDED_COLUMNS, READ_SCHEMA_VERSIONS, RECORD_COLUMNS,
                                    SCHEMA_VERSION)
from precdbg_pt import device_stats
from precdbg_pt import tensors as pt_tensors

from conftest import PYTHON, REPO
from test_fastats import position_weights

TENSORS = pt_tensors.TorchTensors()
HAS_TRITON = device_stats.triton_available()
try:
    TENSORS.device.summarize_with("triton", [torch.ones(3)])
    TRITON_ON_CPU = True
except (RuntimeError, ValueError):
    TRITON_ON_CPU = False
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
SPLIT = (1 << 20) + 4099          # past PAR_MIN (_fastats.c): two threads


def reference(t: torch.Tensor) -> float:
    """pos_mean in numpy float64 from the tensor's row-major values."""
    w = t.detach().contiguous().float().double().numpy().reshape(-1) \
        if t.dtype is torch.bfloat16 else t.detach().contiguous().double().numpy().reshape(-1)
    keep = np.isfinite(w)
    if not keep.any():
        return math.nan
    return float((w[keep] * position_weights(w.size)[keep]).sum() / keep.sum())


def c_row(t: torch.Tensor):
    with torch.no_grad():
        row = TENSORS.summarize(t)
    assert type(row) is tuple, "a host float tensor's row is computed by the C pass"
    return row


def device_row(t: torch.Tensor, backend: str) -> np.ndarray:
    handles = TENSORS.device.summarize_with(backend, [t])
    raw = TENSORS.device.resolve(handles)
    return device_stats.finish_rows(raw, [t.numel()])[0]


def close(a: float, b: float, rtol: float, scale: float = 0.0) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= rtol * max(abs(a), abs(b), scale)


def sample(shape, dtype, seed=0, specials=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 0.5
    if specials:
        flat = t.view(-1)
        flat[7], flat[flat.numel() // 2], flat[-3] = math.nan, math.inf, -math.inf
    return t.to(dtype)


def views(dtype, n_rows=48, n_cols=40, specials=False):
    base = sample((n_rows, n_cols), dtype, specials=specials)
    cube = sample((6, 10, 12), dtype, seed=1, specials=specials)
    return {
        "contiguous": base,
        "transposed": base.t(),
        "sliced": base[:, 3:29],
        "strided-rows": base[::2, 1:],
        "permuted": cube.permute(2, 0, 1),
        "split-transposed": cube[:, :, :8].transpose(0, 1),
        "broadcast": cube[:, :1, :].expand(6, 9, 12),
        "column": base[:, 5],
    }


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("level", [2, 1, 0], ids=["avx512", "avx2", "plain"])
def test_c_pass_matches_numpy(dtype, specials, level):
    """The C pass (row, row_layout) gives pos_mean as numpy float64 computes it from the
    tensor's contiguous copy, for every layout, dtype and SIMD pass, NaN and Inf left out."""
    old = fastats.simd()
    try:
        fastats.simd(level)
        for name, v in views(dtype, specials=specials).items():
            got = c_row(v)[6]
            want = reference(v)
            assert close(got, want, 1e-12), (name, got, want)
    finally:
        fastats.simd({"avx512": 2, "avx2": 1, "plain": 0}[old])


@pytest.mark.parametrize("dtype", FLOATS)
def test_two_thread_split_matches_numpy(dtype):
    """From PAR_MIN elements the pass splits in two threads: the second half's weights are
    those of its own indices; a strided view of that size too."""
    t = sample((SPLIT,), dtype, seed=3)
    assert close(c_row(t)[6], reference(t), 1e-12)
    with_specials = sample((SPLIT,), dtype, seed=4, specials=True)
    assert close(c_row(with_specials)[6], reference(with_specials), 1e-12)
    m = sample((1100, 1000), dtype, seed=5)
    for v in (m.t(), m[:, 1:]):
        assert close(c_row(v)[6], reference(v), 1e-12)


BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not (HAS_TRITON and TRITON_ON_CPU), reason="triton (interpreter) not available"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_device_backends_agree_with_the_c_pass(backend, dtype):
    """The Triton kernel and the torch-ops fallback give the C pass's pos_mean to 1e-6
    relative (of it or of the tensor's RMS), for every layout, NaN and Inf included."""
    for specials in (False, True):
        for name, v in views(dtype, specials=specials).items():
            c = c_row(v)
            got = device_row(v, backend)
            rms = c[3] / math.sqrt(v.numel())
            assert close(got[6], c[6], 1e-6, rms), (name, got[6], c[6])
            assert close(got[2], c[2], 1e-6, rms)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_backends_over_pieces_and_programs(backend):
    """A tensor read by several programs (Triton) or in pieces (torch ops: `_PIECE` lowered)
    weighs each element by its own index."""
    t = sample((3, 70001), torch.float32, seed=9)
    from precdbg_pt import torch_stats
    old = torch_stats._PIECE
    torch_stats._PIECE = 50000
    try:
        got = device_row(t, backend)[6]
    finally:
        torch_stats._PIECE = old
    assert close(got, c_row(t)[6], 1e-6, 1.0 / math.sqrt(t.numel()))


def test_reordering_changes_pos_mean_and_nothing_else():
    """A flip of one image, a permutation, a transpose, a swap of two values: min, max, mean and
    norm stay (to rounding), pos_mean moves well beyond the float32 tolerance."""
    batch = sample((4, 3, 16, 16), torch.float32, seed=11)
    flipped = batch.clone()
    flipped[2] = torch.flip(flipped[2], dims=[-1])
    square = sample((32, 32), torch.float32, seed=12)
    flat = sample((4096,), torch.float32, seed=13)
    swapped = flat.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    perm = torch.randperm(4096, generator=torch.Generator().manual_seed(0))
    cases = [(batch, flipped), (square, square.t()), (flat, flat[perm]), (flat, swapped)]
    for a, b in cases:
        ra, rb = c_row(a), c_row(b)
        rms = ra[3] / math.sqrt(a.numel())
        for k in (0, 1, 4, 5):
            assert ra[k] == rb[k]
        for k in (2, 3):
            assert close(ra[k], rb[k], 1e-6, rms)
        assert abs(ra[6] - rb[6]) > 2e-5 * max(rms, abs(ra[6])), (ra[6], rb[6])


def test_the_same_tensor_has_the_same_pos_mean_in_every_layout():
    """The same logical tensor held contiguous, as a transposed copy's transpose, as a slice of a
    larger buffer, or broadcast from one row: one pos_mean, whichever path computes it."""
    x = sample((24, 36), torch.float32, seed=21)
    via_transpose = x.t().contiguous().t()
    bigger = torch.zeros(30, 40)
    bigger[3:27, 2:38] = x
    via_slice = bigger[3:27, 2:38]
    row = x[:1]
    expanded = row.expand(24, 36)
    layouts = [x, via_transpose, via_slice]
    assert not via_transpose.is_contiguous() and not via_slice.is_contiguous()
    want = c_row(x)[6]
    for v in layouts:
        assert close(c_row(v)[6], want, 1e-12)
    assert close(c_row(expanded)[6], c_row(expanded.contiguous())[6], 1e-12)


def test_statistics_keys_include_the_order():
    """A transpose or a strided view no longer shares its base's statistics key; a contiguous
    view of another shape over the same elements still does."""
    x = torch.randn(8, 6)
    key = lambda t: TENSORS.facts(t)[3][0]  # noqa: E731
    assert key(x) == key(x.view(48)) == key(x.view(4, 12))
    assert key(x.t()) != key(x)
    assert key(x.t()) == TENSORS.identity(x.t())[0]
    assert key(x.t()) == key(x.t().unsqueeze(0))          # size-1 dimension: the same order
    y = torch.randn(4, 5, 6)
    assert key(y.transpose(0, 1)) != key(y.transpose(1, 2)) != key(y)


def test_schema_has_the_column():
    assert SCHEMA_VERSION >= 4 and 4 in READ_SCHEMA_VERSIONS
    assert "pos_mean" in dict(RECORD_COLUMNS)
    assert math.isnan(ADDED_COLUMNS["pos_mean"])


# ------------------------------------------------------------------ end to end
GUIDE = os.path.join(REPO, "tests", "flip_guide.py")


def _dump(folder, variant: str) -> str:
    os.makedirs(folder, exist_ok=True)
    config = os.path.join(folder, "config.json")
    dump = os.path.join(folder, "dump")
    with open(config, "w") as handle:
        json.dump({"task": "statistics", "level": "mix", "dump_path": dump}, handle)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([PYTHON, GUIDE, config, variant], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dump


def _compare(a: str, b: str, folder) -> dict:
    out = os.path.join(folder, "compare.json")
    proc = subprocess.run([PYTHON, "-c", "import sys; from precdbg.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "compare", a, b, "--json", out],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    with open(out) as handle:
        return json.load(handle)


def _drop_column(dump: str) -> None:
    """Make a dump look written before schema 4: no pos_mean dataset."""
    for root, _, files in os.walk(dump):
        for name in files:
            if name.endswith(".h5"):
                with h5py.File(os.path.join(root, name), "r+") as f:
                    if "records" in f and "pos_mean" in f["records"]:
                        del f["records"]["pos_mean"]
                        f.attrs["schema_version"] = 3      # as schema 3 wrote it (no seal)


@pytest.fixture(scope="module")
def cnn_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("flip")
    return {v: _dump(str(root / v), v.rstrip("2")) for v in ("clean", "clean2", "flip")}, root


def test_a_flipped_image_is_named_as_the_input_data(cnn_dumps):
    """One image of the candidate's batch flipped horizontally: compare's first divergence is
    the input record of the first module (the data), not conv1's output."""
    dumps, root = cnn_dumps
    result = _compare(dumps["clean"], dumps["flip"], str(root))
    assert result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert (first["name_a"], first["name_b"]) == ("Module.CNN.forward.0",) * 2, first
    assert (first["direction"], first["role"], first["step"]) == ("forward", "input", 0), first


def test_a_clean_rerun_matches_and_old_dumps_still_compare(cnn_dumps, tmp_path):
    dumps, root = cnn_dumps
    result = _compare(dumps["clean"], dumps["clean2"], str(root))
    assert result["verdict"] == "match"
    new_notes = list(result["notes"])
    # the same dumps as schema 3 wrote them (no pos_mean): they read and compare as before
    import shutil
    old = {}
    for name in ("clean", "clean2", "flip"):
        old[name] = str(tmp_path / name)
        shutil.copytree(dumps[name], old[name])
        _drop_column(old[name])
    rerun = _compare(old["clean"], old["clean2"], str(tmp_path))
    assert rerun["verdict"] == "match"
    # the statistics-only note (a permutation is invisible) is said for old dumps only
    codes = [n["code"] for n in rerun["notes"]]
    assert codes == [n["code"] for n in new_notes] + ["statistics_only"], rerun["notes"]
    # without the column the flip shows only where it changes numbers: past the input data
    flipped = _compare(old["clean"], old["flip"], str(tmp_path))
    assert flipped["verdict"] == "diverged"
    first = flipped["first_divergence"]
    assert (first["name_a"], first["role"]) != ("Module.CNN.forward.0", "input"), first
    # ... where the verdict says what the statistics cannot see (judge unseen_inputs)
    assert (first["code"], first["annotations"]) == ("inputs_unseen", ["statistics_blind"]), \
        first
    # one side old, one side new: the column is not compared, no error
    mixed = _compare(old["clean"], dumps["clean2"], str(tmp_path))
    assert mixed["verdict"] == "match"
