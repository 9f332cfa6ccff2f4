"""The cross-framework "done when": the same GPT written twice (precdbg_examples.gpt_torch and
gpt_ms), the same weights (gpt_ms.load_torch_state), the same numpy batch, one SGD training step
dumped at level mix on each side. Every forward and backward API record, every module (Cell)
record and every dw record of the MindSpore dump has exactly one counterpart in the PyTorch dump,
matched by (owning module path, canonical op, role, argument position) and k-th occurrence, with
the same shape and statistics within float32 noise; and the parameter inventories agree name for
name (the MindSpore record's `alias` is the PyTorch name) and value for value.

Tolerance. Both sides compute in float32 with different kernels (oneDNN/ATen against MindSpore's
CPU kernels), so sums run in different orders: each element can differ by a few float32 ulps
(eps = 1.2e-7), and that difference grows a little through two transformer blocks and the
backward pass. Measured on this model the worst disagreement of any statistic was 8e-7 of the
tensor's scale. A statistic s of the MindSpore record is accepted against the PyTorch one t when

    |s - t| <= RTOL * (|t| + rms)        with RTOL = 1e-5, rms = norm / sqrt(numel) of t,

i.e. 1e-5 relative for a statistic of the tensor's own size (norm, min, max), and 1e-5 of the
element scale for the mean of zero-centred data (whose relative error means nothing). That is
about 12x the noise seen, and 100x tighter than a 0.1 % error anywhere in the model.
Non-finite statistics (the masked scores hold -inf) must be equal exactly, as must NaN/Inf counts.
Non-tensor arguments (dtype `py.*`) are left out: the two APIs spell them differently (`axis` vs
`dim`, a shape tuple vs varargs).
"""
from __future__ import annotations

import collections
import math
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import ms_support  # noqa: E402  (sets up MindSpore: CPU, PyNative, blocking)

import precdbg  # noqa: E402
import precdbg_ms  # noqa: E402
import precdbg_pt  # noqa: E402
from precdbg_examples import gpt_ms, gpt_torch  # noqa: E402

RTOL = 1e-5
STATS = ("min", "max", "mean", "norm")
Key = Tuple[str, str, str, int]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Dict[str, Any]:
    root = tmp_path_factory.mktemp("parity")
    torch.manual_seed(0)
    cfg_t = gpt_torch.GPTConfig(**ms_support.TINY)
    tm = gpt_torch.GPT(cfg_t)
    mm = gpt_ms.GPT(ms_support.tiny_config())
    gpt_ms.load_torch_state(mm, {k: v.detach().numpy() for k, v in tm.state_dict().items()})
    x, y = ms_support.make_batches(1)[0]
    # the inputs are made before start(): conversions are not part of the model
    xt, yt = torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))
    xm, ym = ms.Tensor(x), ms.Tensor(y)
    topt = torch.optim.SGD(tm.parameters(), lr=0.1)
    mopt = ms.nn.SGD(mm.trainable_params(), learning_rate=0.1)

    dpt = precdbg_pt.PrecisionDebugger(dump_path=str(root / "pt"), level="mix")
    dpt.start(tm)
    loss_t = float(gpt_torch.train_step(tm, topt, xt, yt))
    dpt.stop()
    assert dpt.close()

    step = gpt_ms.train_step_fn(mm, mopt)
    dms = precdbg_ms.PrecisionDebugger(dump_path=str(root / "ms"), level="mix")
    dms.start(mm)
    loss_m = float(step(xm, ym).asnumpy())
    dms.stop()
    assert dms.close()
    after_t = {k: v.detach().numpy().copy() for k, v in tm.state_dict().items()}
    after_m = {gpt_ms.ms_to_torch_name(p.name): p.asnumpy().copy() for p in mm.get_parameters()}
    return dict(pt=precdbg.open_dump(str(root / "pt")).records(step=0),
                ms=precdbg.open_dump(str(root / "ms")).records(step=0),
                failures=(dpt.failures, dms.failures), loss=(loss_t, loss_m),
                after=(after_t, after_m))


def groups(table: precdbg.RecordTable, kind: str, direction: str) -> Dict[Key, List[dict]]:
    """Tensor records of one kind and direction by (module, op, role, arg_index), each list in
    emission order (its k-th item is the k-th occurrence)."""
    mask = (table["kind"] == kind) & (table["direction"] == direction) & \
        ~np.char.startswith(table["dtype"], "py.")
    idx = np.nonzero(mask)[0]
    out: Dict[Key, List[dict]] = collections.defaultdict(list)
    for i in idx[np.argsort(table["seq"][idx], kind="stable")]:
        r = table.row(int(i))
        out[(r["module"], r["op"], r["role"], r["arg_index"])].append(r)
    return out


def stat_mismatches(a: dict, b: dict) -> List[str]:
    """Where record a (MindSpore) disagrees with b (PyTorch) beyond float32 noise."""
    bad = []
    if a["shape"] != b["shape"]:
        return [f"shape {a['shape']} vs {b['shape']}"]
    if a["dtype"].startswith("float") != b["dtype"].startswith("float"):
        bad.append(f"dtype {a['dtype']} vs {b['dtype']}")
    if (a["nan_count"], a["inf_count"]) != (b["nan_count"], b["inf_count"]):
        bad.append(f"nan/inf {a['nan_count']}/{a['inf_count']} vs "
                   f"{b['nan_count']}/{b['inf_count']}")
    scale = ms_support.rms(b) if math.isfinite(b["norm"]) else 0.0
    for f in STATS:
        s, t = a[f], b[f]
        if not (math.isfinite(s) and math.isfinite(t)):
            if not (s == t or (math.isnan(s) and math.isnan(t))):
                bad.append(f"{f} {s!r} vs {t!r}")
        elif abs(s - t) > RTOL * (abs(t) + scale):
            bad.append(f"{f} {s!r} vs {t!r} (|diff| {abs(s - t):.3g}, allowed "
                       f"{RTOL * (abs(t) + scale):.3g})")
    return bad


def compare(dumps, kind: str, direction: str, min_groups: int) -> None:
    gm, gp = groups(dumps["ms"], kind, direction), groups(dumps["pt"], kind, direction)
    assert len(gm) >= min_groups, f"only {len(gm)} {kind}/{direction} groups captured"
    problems = []
    for key, rows in gm.items():
        theirs = gp.get(key, [])
        if len(theirs) != len(rows):
            problems.append(f"{key}: {len(rows)} MindSpore records, {len(theirs)} PyTorch")
            continue
        for k, (a, b) in enumerate(zip(rows, theirs)):
            for why in stat_mismatches(a, b):
                problems.append(f"{key} #{k} {a['entry']} vs {b['entry']}: {why}")
    assert not problems, f"{len(problems)} {kind}/{direction} mismatches:\n" + \
        "\n".join(problems[:25])


def test_both_runs_clean_and_same_loss(dumps):
    assert dumps["failures"] == (0, 0)
    loss_t, loss_m = dumps["loss"]
    assert abs(loss_t - loss_m) <= RTOL * abs(loss_t), (loss_t, loss_m)
    # after the SGD step the weights still agree: the gradients that reached the optimizer agree
    after_t, after_m = dumps["after"]
    assert set(after_m) <= set(after_t)
    for name, value in after_m.items():
        np.testing.assert_allclose(value, after_t[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_forward_api_records_match(dumps):
    compare(dumps, "api", "forward", min_groups=100)


def test_forward_cell_records_match(dumps):
    compare(dumps, "module", "forward", min_groups=40)


def test_dw_records_match(dumps):
    compare(dumps, "param_grad", "backward", min_groups=29)


def test_backward_api_records_match(dumps):
    compare(dumps, "api", "backward", min_groups=80)


def test_backward_cell_records_match(dumps):
    compare(dumps, "module", "backward", min_groups=40)


def test_pytorch_records_have_mindspore_counterparts(dumps):
    """The other direction: every PyTorch module record, dw and parameter is in the MindSpore
    dump too; the only PyTorch API calls without a MindSpore twin are conversions the MindSpore
    step does not make (train_step's `loss.detach()`)."""
    for kind, direction in (("module", "forward"), ("module", "backward"),
                            ("param_grad", "backward")):
        gm, gp = groups(dumps["ms"], kind, direction), groups(dumps["pt"], kind, direction)
        missing = sorted(k for k, v in gp.items() if len(gm.get(k, [])) != len(v))
        assert not missing, f"{kind}/{direction}: PyTorch only: {missing[:10]}"
    for direction in ("forward", "backward"):
        gm, gp = groups(dumps["ms"], "api", direction), groups(dumps["pt"], "api", direction)
        extra = {k[1] for k, v in gp.items() if len(gm.get(k, [])) != len(v)}
        assert extra <= {"copy"}, f"api/{direction}: PyTorch-only ops {sorted(extra)}"


def test_parameter_inventory_names_and_values(dumps):
    t_ms, t_pt = dumps["ms"], dumps["pt"]
    pt = {r["api"]: r for r in ms_support.rows_where(t_pt, kind="param", role="param")}
    mine = ms_support.rows_where(t_ms, kind="param")
    assert len(mine) == len(pt) == 29
    seen = set()
    for r in mine:
        assert r["role"] == "param" and r["direction"] == "none" and r["phase"] == "setup"
        alias = r["alias"]
        assert alias == gpt_ms.ms_to_torch_name(r["api"]), r["api"]
        assert alias in pt, f"{r['api']}: alias {alias!r} is not a PyTorch parameter"
        seen.add(alias)
        other = pt[alias]
        assert r["op"] == alias.rpartition(".")[2] == other["op"], (r["api"], r["op"])
        assert r["module"] == other["module"]
        assert r["shape"] == other["shape"] and r["dtype"] == other["dtype"]
        assert r["trainable"] is other["trainable"] is True
        for f in STATS + ("nan_count", "inf_count"):
            assert r[f] == other[f], f"{r['api']} {f}: {r[f]!r} vs {other[f]!r}"
    assert seen == set(pt)


def test_dw_alias_is_the_pytorch_name(dumps):
    for r in ms_support.rows_where(dumps["ms"], kind="param_grad"):
        assert r["alias"] == gpt_ms.ms_to_torch_name(r["api"]), r["entry"]
