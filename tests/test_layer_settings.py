"""Layer settings recorded by both adapters in one neutral vocabulary (precdbg/records/tables/layers.yaml),
read back with `Dump.module_settings`, and judged by `precdbg check`: a conv built with torch's
padding and a MindSpore cell built with pad_mode="pad" agree; MindSpore's default pad_mode="same"
is named at its first module; keep_prob, axis and the BatchNorm momentum convention are
normalised.
"""
from __future__ import annotations

from typing import Any, Dict

import pytest

torch = pytest.importorskip("torch")
ms = pytest.importorskip("mindspore")

import ms_support  # noqa: E402,F401  (MindSpore on CPU, PyNative)

import precdbg  # noqa: E402
import precdbg_ms  # noqa: E402
import precdbg_pt  # noqa: E402
from precdbg.check import check_dumps  # noqa: E402
from precdbg.records.layers import dump_setting_differences, setting_differences  # noqa: E402


def _torch_net() -> Any:
    from torch import nn
    net = nn.Module()
    net.conv = nn.Conv2d(3, 4, 3, padding=1)
    net.conv_same = nn.Conv2d(4, 4, 3, padding="same")
    net.bn = nn.BatchNorm2d(4)
    net.drop = nn.Dropout(0.25)
    net.soft = nn.Softmax(dim=1)
    net.ln = nn.LayerNorm(8, eps=1e-6)
    net.act = nn.GELU(approximate="tanh")
    net.emb = nn.Embedding(10, 4, padding_idx=0)
    net.conv_default = nn.Conv2d(4, 4, 3)
    return net


def _ms_net() -> Any:
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
            self.conv_same = nn.Conv2d(4, 4, 3, pad_mode="same")
            self.bn = nn.BatchNorm2d(4)                        # momentum=0.9: torch's 0.1
            self.drop = nn.Dropout(keep_prob=0.75)             # torch p=0.25
            self.soft = nn.Softmax(axis=1)
            self.ln = nn.LayerNorm((8,), epsilon=1e-6)
            self.act = nn.GELU()                               # approximate=True: tanh
            self.emb = nn.Embedding(10, 4, padding_idx=0)
            self.conv_default = nn.Conv2d(4, 4, 3)             # pad_mode="same" by default
    return Net()


def _dump(tmp_path, name: str, debugger: Any, model: Any) -> str:
    path = str(tmp_path / name)
    dbg = debugger(dump_path=path, level="module")
    dbg.start(model)
    dbg.stop()
    assert dbg.close() and not dbg.failures
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Dict[str, str]:
    root = tmp_path_factory.mktemp("layers")
    return {"pt": _dump(root, "pt", precdbg_pt.PrecisionDebugger, _torch_net()),
            "ms": _dump(root, "ms", precdbg_ms.PrecisionDebugger, _ms_net())}


def test_settings_read_back_in_one_vocabulary(dumps):
    pt = precdbg.open_dump(dumps["pt"]).module_settings(0)
    mst = precdbg.open_dump(dumps["ms"]).module_settings(0)
    expected = {"conv": {"padding": [1, 1, 1, 1]}, "conv_same": {"padding": "same"},
                "drop": {"p": 0.25}, "soft": {"dim": 1}, "ln": {"eps": 1e-6},
                "act": {"approximate": "tanh"}, "emb": {"padding_idx": 0}}
    for path, settings in expected.items():
        for key, value in settings.items():
            assert pt[path][1][key] == pytest.approx(value), (path, key, pt[path])
            assert mst[path][1][key] == pytest.approx(value), (path, key, mst[path])
    assert pt["bn"][1]["momentum"] == pytest.approx(0.1)
    assert mst["bn"][1]["momentum"] == pytest.approx(0.1)      # stored in torch's convention
    assert pt["conv_default"][1]["padding"] == "valid" and mst["conv_default"][1]["padding"] \
        == "same"
    assert pt[""] == ("Module", {}) and mst[""][1] == {}


def test_only_the_differing_setting_is_named(dumps):
    a = precdbg.open_dump(dumps["pt"]).module_settings(0)
    b = precdbg.open_dump(dumps["ms"]).module_settings(0)
    diffs = setting_differences(a, b)
    assert [(d.path_a, d.setting, d.a, d.b) for d in diffs] == \
        [("conv_default", "padding", "valid", "same")]
    with precdbg.open_dump(dumps["pt"]) as da, precdbg.open_dump(dumps["ms"]) as db:
        assert dump_setting_differences(da, db, 0, 0) == diffs
    result = check_dumps(dumps["pt"], dumps["ms"])
    notes = {f.get("id"): f["message"] for f in result["findings"] if f["kind"] == "semantics"}
    assert notes["mindspore-conv-pad-mode-default"].endswith(
        "[conv_default: padding valid vs same]"), notes
    for silent in ("mindspore-gelu-approximate-default", "layernorm-epsilon-default",
                   "batchnorm-momentum-convention", "dropout-probability-convention"):
        assert silent not in notes, notes
