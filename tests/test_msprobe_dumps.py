"""A precdbg dump against an msprobe dump of the same run, both ways (tests/data/msprobe: msprobe
26.2's dumps of make_dumps.py's model; here the same seeded run dumped by precdbg with msprobe's
own config file): the clean pair matches on what both tools record, the GELU defect is named at
`Functional.gelu.1.forward` whichever side msprobe wrote, and the note says what the tools cannot
compare. The same on MindSpore (tests/data/msprobe/mindspore: msprobe on MindSpore 2.7.1; here
precdbg_ms on the .venv's MindSpore, the same losses): compared on Cells, parameters and weight
gradients. msprobe's `.pt` tensor files read without torch (precdbg.storage.torch_file)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "msprobe")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the twins' common start: msprobe's own config file (argv[1]/configs/<argv[2]>.json) with the
# dump path argv[3], written beside it, for precdbg's PrecisionDebugger
_CONFIG = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
name, out = sys.argv[2], sys.argv[3]
with open(f"{sys.argv[1]}/configs/{name}.json") as handle:
    cfg = json.load(handle)
cfg["dump_path"] = out
with open(out + ".json", "w") as handle:
    json.dump(cfg, handle)
'''

_TWIN = _CONFIG + r'''
import make_dumps as md
import torch, torch.nn.functional as F
from precdbg_pt import PrecisionDebugger
torch.manual_seed(0)
model = md.build_model(md.VARIANTS[name][3])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, md.VOCAB, (md.BATCH, md.SEQ), generator=g)
tgt = torch.randint(0, md.VOCAB, (md.BATCH, md.SEQ), generator=g)
debugger = PrecisionDebugger(config_path=out + ".json")
for step in range(md.STEPS):
    debugger.start(model)
    opt.zero_grad()
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, md.VOCAB), tgt.reshape(-1))
    loss.backward()
    opt.step()
    debugger.stop()
    debugger.step()
'''


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precdbg", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    out = {}
    for name in ("stat_mix_clean", "stat_mix_gelu"):
        path = str(root / name)
        proc = subprocess.run([sys.executable, "-c", _TWIN, DATA, name, path],
                              capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[name] = path
    return out


def _compare(tmp_path, a: str, b: str, *extra: str):
    report = str(tmp_path / "r.json")
    proc = _cli("compare", a, b, "--json", report, *extra)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    with open(report, encoding="utf-8") as handle:
        return proc.returncode, json.load(handle)


def test_precdbg_against_msprobe_of_the_same_run_matches(twins, tmp_path):
    code, result = _compare(tmp_path, twins["stat_mix_clean"],
                            os.path.join(DATA, "stat_mix_clean"))
    assert code == 0 and result["verdict"] == "match", result["first_divergence"]
    assert not [f for f in result["setup"] if f.get("severity") == "high"], result["setup"]
    assert "tools_differ" in [n["code"] for n in result["notes"]]
    paired = {(r["name_a"], r["role"]) for r in result["rows"]}
    # forward calls, modules' backward and weight gradients pair; no API backward across tools
    assert {("Functional.gelu.1.forward", "output"), ("Tensor.add.0.forward", "output"),
            ("Module.blocks.1.fc1.Linear.backward.0", "grad_input"),
            ("Param.blocks.1.fc1.weight.grad", "param_grad")} <= paired
    assert not [r for r in result["rows"] if r["kind"] == "api" and r["direction"] == "backward"]
    assert result["unmatched_count"] <= 10, result["unmatched"]


@pytest.mark.parametrize("msprobe_side", ["candidate", "baseline"])
def test_the_gelu_defect_is_named_whichever_side_msprobe_wrote(twins, tmp_path, msprobe_side):
    if msprobe_side == "candidate":
        a, b = twins["stat_mix_clean"], os.path.join(DATA, "stat_mix_gelu")
    else:
        a, b = os.path.join(DATA, "stat_mix_clean"), twins["stat_mix_gelu"]
    code, result = _compare(tmp_path, a, b, "--step", "0")
    first = result["first_divergence"]
    assert code == 1 and (first["name_a"], first["module"], first["role"]) == \
        ("Functional.gelu.1.forward", "blocks.1.act", "output"), first


def test_torch_save_files_read_without_torch(tmp_path):
    import torch
    from precdbg.storage.torch_file import load_torch_tensor
    cases = {"f32": torch.randn(3, 4), "bf16": torch.randn(5, 6).to(torch.bfloat16).t()[1:],
             "i64": torch.arange(7), "scalar": torch.tensor(2.5), "empty": torch.zeros(2, 0),
             "bool": torch.rand(4) > 0.5, "f16": torch.randn(2, 3).half()}
    for name, tensor in cases.items():
        path = str(tmp_path / f"{name}.pt")
        torch.save(tensor, path)
        got = load_torch_tensor(path)
        want = tensor.float().numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
        assert got.shape == tuple(tensor.shape), name
        assert np.array_equal(got.astype(want.dtype), want), name
    # a pickle that is not a tensor's is refused, never run
    torch.save({"a": 1, "b": torch.nn.Linear(2, 2)}, str(tmp_path / "module.pt"))
    from precdbg.errors import DumpError
    with pytest.raises(DumpError, match="module.pt"):
        load_torch_tensor(str(tmp_path / "module.pt"))


_MS_TWIN = _CONFIG + r'''
import make_ms_dumps as md
import numpy as np
import mindspore as ms
from mindspore import nn, ops
from precdbg_ms import PrecisionDebugger
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
ms.set_seed(0)
model = md.build_model(md.VARIANTS[name][3])
opt = nn.SGD(model.trainable_params(), learning_rate=0.1)
rng = np.random.default_rng(1)
ids = ms.Tensor(rng.integers(0, md.VOCAB, (md.BATCH, md.SEQ)), ms.int32)
tgt = ms.Tensor(rng.integers(0, md.VOCAB, (md.BATCH, md.SEQ)), ms.int32)
def forward_fn(x, y):
    return ops.cross_entropy(model(x).reshape(-1, md.VOCAB), y.reshape(-1))
grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)
debugger = PrecisionDebugger(config_path=out + ".json")
for step in range(md.STEPS):
    debugger.start(model)
    loss, grads = grad_fn(ids, tgt)
    opt(grads)
    debugger.stop()
    debugger.step()
'''


def test_precdbg_mindspore_against_msprobe_mindspore(tmp_path):
    pytest.importorskip("mindspore")
    ms_data = os.path.join(DATA, "mindspore")
    path = str(tmp_path / "ms_clean")
    proc = subprocess.run([sys.executable, "-c", _MS_TWIN, ms_data, "ms_stat_mix_clean", path],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    code, result = _compare(tmp_path, path, os.path.join(ms_data, "ms_stat_mix_clean"),
                            "--step", "0")
    assert code == 0 and result["verdict"] == "match", result["first_divergence"]
    tools = [n for n in result["notes"] if n["code"] == "tools_differ"]
    assert tools and {r["kind"] for r in result["rows"]} == {"module", "param", "param_grad"}
    code, result = _compare(tmp_path, path, os.path.join(ms_data, "ms_stat_mix_gelu"),
                            "--step", "0")
    first = result["first_divergence"]
    assert code == 1 and (first["module"], first["kind"]) == ("blocks.1.act", "module"), first
