"""`precdbg.weights.compare_weights`: real checkpoints written by torch.save, mindspore.save_checkpoint,
safetensors.numpy.save_file and numpy.savez, compared by name across formats and frameworks."""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

from precdbg.weights.compare_weights import compare_weights, format_weights, load_weights, weights_main
from precdbg.errors import DumpError


class TorchNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 4)
        self.ln = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.fc(self.emb(x)))


def _torch_net(seed: int = 0) -> TorchNet:
    torch.manual_seed(seed)
    net = TorchNet()
    with torch.no_grad():                      # non-trivial LayerNorm parameters
        net.ln.weight.uniform_(0.5, 1.5)
        net.ln.bias.uniform_(-0.5, 0.5)
    return net


def _arrays(net: nn.Module) -> dict:
    return {k: v.detach().float().numpy().copy() for k, v in net.state_dict().items()}


def _args(a, b, json_path=None, rtol=1e-5, atol=0.0) -> argparse.Namespace:
    return argparse.Namespace(a=str(a), b=str(b), json=json_path, rtol=rtol, atol=atol)


def _strict_json(path) -> dict:
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    with open(path, "r", encoding="utf-8") as handle:
        return json.loads(handle.read(), parse_constant=refuse)


@pytest.fixture
def torch_files(tmp_path):
    """The same weights as .pt (plain state dict), .pth (a training checkpoint dict),
    .safetensors and .npz."""
    net = _torch_net()
    arrays = _arrays(net)
    pt = tmp_path / "model.pt"
    torch.save(net.state_dict(), pt)
    pth = tmp_path / "checkpoint.pth"
    torch.save({"state_dict": net.state_dict(), "epoch": 3,
                "optimizer": torch.optim.SGD(net.parameters(), lr=0.1).state_dict()}, pth)
    from safetensors.numpy import save_file
    st = tmp_path / "model.safetensors"
    save_file(arrays, str(st))
    npz = tmp_path / "model.npz"
    np.savez(npz, **arrays)
    return {"pt": pt, "pth": pth, "safetensors": st, "npz": npz, "arrays": arrays}


# --------------------------------------------------------------------------- same weights
def test_same_weights_match_across_formats(torch_files, tmp_path, capsys):
    names = sorted(torch_files["arrays"])
    assert names == ["emb.weight", "fc.bias", "fc.weight", "ln.bias", "ln.weight"]
    files = [torch_files[k] for k in ("pt", "pth", "safetensors", "npz")]
    for a in files:
        for b in files:
            result = compare_weights(str(a), str(b))
            assert result["verdict"] == "match", (a, b, format_weights(result))
            assert result["matched"] == 5
            assert result["only_in_a"] == result["only_in_b"] == []
            assert result["shape_mismatch"] == result["value_mismatch"] == []
    result = compare_weights(str(torch_files["pth"]), str(torch_files["npz"]))
    assert result["a"]["format"] == "pytorch" and result["a"]["count"] == 5
    assert result["b"]["format"] == "npz" and result["b"]["file"] == str(torch_files["npz"])
    out_json = tmp_path / "w.json"
    assert weights_main(_args(torch_files["pt"], torch_files["safetensors"], str(out_json))) == 0
    assert "verdict: match" in capsys.readouterr().out
    assert _strict_json(out_json)["verdict"] == "match"


def test_perturbed_weight_is_named(torch_files, tmp_path, capsys):
    arrays = {k: v.copy() for k, v in torch_files["arrays"].items()}
    arrays["fc.weight"][2, 3] += 0.01
    perturbed = tmp_path / "perturbed.npz"
    np.savez(perturbed, **arrays)
    result = compare_weights(str(torch_files["pt"]), str(perturbed))
    assert result["verdict"] == "diverged"
    assert [m["name"] for m in result["value_mismatch"]] == ["fc.weight"]
    m = result["value_mismatch"][0]
    assert m["max_abs"] == pytest.approx(0.01, rel=1e-4)
    assert 0.99 < m["cosine"] < 1.0
    assert m["max_rel"] > 1e-5
    assert result["matched"] == 4
    text = format_weights(result)
    assert "value mismatch: 1" in text and "fc.weight" in text and "verdict: diverged" in text
    out_json = tmp_path / "w.json"
    assert weights_main(_args(torch_files["pt"], perturbed, str(out_json))) == 1
    data = _strict_json(out_json)
    assert data["value_mismatch"][0]["name"] == "fc.weight"
    capsys.readouterr()
    # a tolerance that covers the change makes it match
    assert compare_weights(str(torch_files["pt"]), str(perturbed), atol=0.02)["verdict"] == "match"
    assert weights_main(_args(torch_files["pt"], perturbed, atol=0.02)) == 0


def test_missing_extra_and_reshaped_tensors(torch_files, tmp_path):
    arrays = {k: v.copy() for k, v in torch_files["arrays"].items()}
    del arrays["ln.bias"]
    arrays["head.weight"] = np.ones((2, 2), np.float32)
    arrays["fc.bias"] = np.zeros((5,), np.float32)
    other = tmp_path / "other.safetensors"
    from safetensors.numpy import save_file
    save_file(arrays, str(other))
    result = compare_weights(str(torch_files["pt"]), str(other))
    assert result["verdict"] == "diverged"
    assert result["only_in_a"] == ["ln.bias"]
    assert result["only_in_b"] == ["head.weight"]
    assert result["shape_mismatch"] == [{"name": "fc.bias", "shape_a": [4], "shape_b": [5]}]
    assert result["value_mismatch"] == [] and result["matched"] == 3
    text = format_weights(result)
    assert "only in A: 1" in text and "only in B: 1" in text and "(4,) vs (5,)" in text


def test_nan_values(torch_files, tmp_path):
    arrays = {k: v.copy() for k, v in torch_files["arrays"].items()}
    arrays["ln.weight"][0] = np.nan
    a = tmp_path / "a.npz"
    np.savez(a, **arrays)
    assert compare_weights(str(a), str(a))["verdict"] == "match"     # NaN equals NaN
    result = compare_weights(str(torch_files["npz"]), str(a))
    assert [m["name"] for m in result["value_mismatch"]] == ["ln.weight"]
    out_json = tmp_path / "w.json"
    assert weights_main(_args(torch_files["npz"], a, str(out_json))) == 1
    assert _strict_json(out_json)["value_mismatch"][0]["max_abs"] == "nan"


def test_bfloat16_is_compared_as_float32(tmp_path):
    net = _torch_net()
    fp32 = tmp_path / "fp32.pt"
    torch.save(net.state_dict(), fp32)
    bf16 = tmp_path / "bf16.pt"
    torch.save(net.to(torch.bfloat16).state_dict(), bf16)
    rounded = tmp_path / "rounded.npz"        # float32 holding the bf16 values exactly
    np.savez(rounded, **{k: v.float().numpy() for k, v in net.state_dict().items()})
    assert compare_weights(str(bf16), str(rounded))["verdict"] == "match"
    strict = compare_weights(str(fp32), str(bf16))
    assert strict["verdict"] == "diverged" and strict["value_mismatch"]
    assert all(m["cosine"] > 0.999 for m in strict["value_mismatch"])
    # each side's own dtype (a bf16 tensor was reported float32, the cast's), said in the text
    assert {(m["dtype_a"], m["dtype_b"]) for m in strict["value_mismatch"]} == \
        {("float32", "bfloat16")}
    assert len(strict["dtype_mismatch"]) == len(net.state_dict())
    assert f"dtype differs: {len(net.state_dict())} tensors ({len(net.state_dict())} float32 " \
        "in A, bfloat16 in B" in format_weights(strict)
    assert compare_weights(str(fp32), str(bf16), rtol=1e-2)["verdict"] == "match"
    # safetensors holding bfloat16 (ml_dtypes) arrays
    import ml_dtypes
    from safetensors.numpy import save_file
    st = tmp_path / "bf16.safetensors"
    save_file({k: v.float().numpy().astype(ml_dtypes.bfloat16)
               for k, v in net.state_dict().items()}, str(st))
    assert compare_weights(str(st), str(bf16))["verdict"] == "match"


def test_format_found_by_content_and_ddp_prefix(torch_files, tmp_path):
    net = _torch_net()
    odd = tmp_path / "weights.data"
    torch.save({f"module.{k}": v for k, v in net.state_dict().items()}, odd)
    weights, info = load_weights(str(odd))
    assert info["format"] == "pytorch"
    assert sorted(weights) == sorted(torch_files["arrays"])
    assert compare_weights(str(odd), str(torch_files["npz"]))["verdict"] == "match"
    npz_odd = tmp_path / "arrays.bundle"
    with open(npz_odd, "wb") as handle:
        np.savez(handle, **torch_files["arrays"])
    assert load_weights(str(npz_odd))[1]["format"] == "npz"


def test_unreadable_or_unknown_files_raise_dump_error(torch_files, tmp_path):
    good = str(torch_files["pt"])
    text = tmp_path / "notes.txt"
    text.write_text("not weights\n")
    with pytest.raises(DumpError, match=r"notes\.txt: unknown checkpoint format"):
        compare_weights(good, str(text))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DumpError, match=r"corrupt\.pt: not a PyTorch checkpoint"):
        compare_weights(str(corrupt), good)
    bad_st = tmp_path / "bad.safetensors"
    bad_st.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
    with pytest.raises(DumpError, match=r"bad\.safetensors"):
        weights_main(_args(bad_st, good))
    with pytest.raises(DumpError, match=r"missing\.npz: no such file"):
        compare_weights(good, str(tmp_path / "missing.npz"))
    with pytest.raises(DumpError, match="is a directory"):
        compare_weights(good, str(tmp_path))
    # weights_only=True refuses arbitrary pickled objects
    pickled = tmp_path / "object.pt"
    torch.save({"net": argparse.Namespace(x=1)}, pickled)
    with pytest.raises(DumpError, match=r"object\.pt: holds pickled Python objects, not only "
                       r"tensors \(Unsupported global: GLOBAL argparse\.Namespace\); "
                       r"compare-weights reads state dicts"):
        compare_weights(str(pickled), good)


# --------------------------------------------------------------------------- MindSpore
@pytest.fixture(scope="module")
def ms():
    ms = pytest.importorskip("mindspore")
    ms.set_device("CPU")
    return ms


def _ms_net(ms, torch_net: TorchNet):
    from mindspore import nn as msnn

    class MsNet(msnn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.emb = msnn.Embedding(10, 8)
            self.fc = msnn.Dense(8, 4)
            self.ln = msnn.LayerNorm((4,))

        def construct(self, x):
            return self.ln(self.fc(self.emb(x)))

    net = MsNet()
    sd = {k: v.detach().numpy() for k, v in torch_net.state_dict().items()}
    for name, value in (("emb.embedding_table", sd["emb.weight"]), ("fc.weight", sd["fc.weight"]),
                        ("fc.bias", sd["fc.bias"]), ("ln.gamma", sd["ln.weight"]),
                        ("ln.beta", sd["ln.bias"])):
        param = dict(net.parameters_and_names())[name]
        param.set_data(ms.Tensor(value.copy()))
    return net


def _save_ms_with_optimizer(ms, net, path) -> None:
    from mindspore import nn as msnn
    train = msnn.TrainOneStepCell(msnn.WithLossCell(net, msnn.MSELoss()),
                                  msnn.Adam(net.trainable_params(), learning_rate=1e-3))
    ms.save_checkpoint(train, str(path))


def test_mindspore_checkpoint_matches_torch_by_name(ms, tmp_path, capsys):
    torch_net = _torch_net()
    pt = tmp_path / "torch.pt"
    torch.save(torch_net.state_dict(), pt)
    net = _ms_net(ms, torch_net)
    ckpt = tmp_path / "ms.ckpt"
    _save_ms_with_optimizer(ms, net, ckpt)
    raw = ms.load_checkpoint(str(ckpt))
    assert "ln.gamma" in raw and "moment1.fc.weight" in raw and "global_step" in raw
    result = compare_weights(str(ckpt), str(pt))
    assert result["verdict"] == "match", format_weights(result)
    assert result["matched"] == 5
    assert result["a"]["format"] == "mindspore" and result["a"]["count"] == 5
    # moment1.* and moment2.* of 5 parameters, global_step, learning_rate, beta1/2_power
    assert result["a"]["optimizer_state"] == 14
    assert result["a"]["renamed"] == 3           # gamma, beta, embedding_table
    text = format_weights(result)
    assert "14 optimizer-state entries set aside" in text
    assert weights_main(_args(ckpt, pt)) == 0
    capsys.readouterr()

    # perturb the MindSpore LayerNorm gamma: named as PyTorch calls it
    params = dict(net.parameters_and_names())
    gamma = params["ln.gamma"].asnumpy().copy()
    gamma[1] += 0.05
    params["ln.gamma"].set_data(ms.Tensor(gamma))
    ckpt2 = tmp_path / "ms_perturbed.ckpt"
    ms.save_checkpoint(net, str(ckpt2))
    result = compare_weights(str(pt), str(ckpt2))
    assert result["verdict"] == "diverged"
    assert [m["name"] for m in result["value_mismatch"]] == ["ln.weight"]
    assert result["value_mismatch"][0]["max_abs"] == pytest.approx(0.05, rel=1e-4)
    assert result["b"]["optimizer_state"] == 0 and result["matched"] == 4
    assert weights_main(_args(pt, ckpt2)) == 1
    assert "ln.weight" in capsys.readouterr().out


def test_mindspore_bfloat16_and_bad_ckpt(ms, tmp_path):
    torch_net = _torch_net()
    bf16_pt = tmp_path / "bf16.pt"
    torch.save(torch_net.to(torch.bfloat16).state_dict(), bf16_pt)
    sd = {k: v.float().numpy() for k, v in torch_net.state_dict().items()}
    ms_names = {"emb.weight": "emb.embedding_table", "ln.weight": "ln.gamma",
                "ln.bias": "ln.beta"}
    params = [{"name": ms_names.get(k, k),
               "data": ms.Parameter(ms.Tensor(v, ms.float32).astype(ms.bfloat16),
                                    name=ms_names.get(k, k))}
              for k, v in sd.items()]
    ckpt = tmp_path / "bf16.ckpt"
    ms.save_checkpoint(params, str(ckpt))
    result = compare_weights(str(ckpt), str(bf16_pt))
    assert result["verdict"] == "match", format_weights(result)
    assert result["matched"] == 5 and not result["dtype_mismatch"], result["dtype_mismatch"]
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(os.urandom(64))
    with pytest.raises(DumpError, match=r"bad\.ckpt"):
        compare_weights(str(bad), str(bf16_pt))
