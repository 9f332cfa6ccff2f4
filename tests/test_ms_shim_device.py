"""A torch shim's device name survives the tensors precdbg hands to the model. mindnlp's current
`mindtorch` (0.6, its GitHub source) keeps a tensor's device name in MindSpore's own `init` slot
(a C attribute, not in the instance's dict, None on a tensor MindSpore makes) and reads it back
for `x.device` and for every op's dispatch; a cell output passed on through HookBackward, or an
API argument passed on as a view, is such a new tensor. Before `keep_attributes` carried `init`
over, Hugging Face GPT-2 stopped with `KeyError: None` at `inputs_embeds.device` in the first
captured step (measured on MindSpore 2.7.1 and 2.10). Native tensors only, no shim needed."""
from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from ms_support import capture  # noqa: E402  (sets MindSpore up: CPU, PyNative)

from mindspore import nn, ops  # noqa: E402


def test_a_device_name_in_init_is_carried_over_and_nothing_else_is_set():
    from precdbg_ms.cell_hooks import keep_attributes
    tagged = ms.Tensor(np.ones(3, np.float32))
    tagged.init = "cpu"
    assert keep_attributes(tagged, ms.Tensor(np.ones(3, np.float32))).init == "cpu"
    own = ms.Tensor(np.ones(3, np.float32))
    own.init = "npu"                    # the new tensor's own name is kept
    assert keep_attributes(tagged, own).init == "npu"
    plain = ms.Tensor(np.ones(3, np.float32))      # a native tensor: nothing to carry
    assert keep_attributes(plain, ms.Tensor(np.ones(3, np.float32))).init is None


class _Tag(nn.Cell):
    """Its output carries a device name in `init`, as every tensor of the shim's ops does."""

    def construct(self, x):
        y = x * 2.0
        y.init = "cpu"
        return y


class _Read(nn.Cell):
    """Reads the name, as the shim's `Tensor.device` and its ops' dispatch do."""

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def construct(self, x):
        self.seen.append(x.init)
        y = ops.mul(x, x)               # an API call: its argument reaches it as a view
        return y


class _Net(nn.Cell):
    def __init__(self, seen: list) -> None:
        super().__init__()
        self.tag, self.read = _Tag(), _Read(seen)

    def construct(self, x):
        return self.read(self.tag(x)).sum()


@pytest.fixture
def shim_asnumpy(monkeypatch):
    """`Tensor.asnumpy` as the shim has it: the memory, read without MindSpore's lazy
    initialisation (which would call a tensor's `init`, here a device name)."""
    from mindspore._c_expression import TensorPy
    monkeypatch.setattr(ms.Tensor, "asnumpy", lambda self: TensorPy.asnumpy(self))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_the_model_reads_the_device_name_through_precdbgs_hooks(tmp_path, level, shim_asnumpy):
    seen: list = []
    net = _Net(seen)
    x = ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    grad_fn = ms.value_and_grad(net, grad_position=0)

    table, _, (loss, grad) = capture(tmp_path, lambda: grad_fn(x), net, level=level,
                                     task="statistics")
    assert seen == ["cpu"]
    np.testing.assert_allclose(grad.asnumpy(), 8.0 * x.asnumpy())     # d(sum((2x)^2))/dx
    entries = {str(e) for e in table["entry"]}
    assert "Cell.read._Read.forward.0" in entries and "Cell.read._Read.backward.0" in entries
    if level == "mix":
        assert any(e.startswith("Functional.mul.0.") or e.startswith("Mint.mul.0.")
                   for e in entries), sorted(entries)
