"""Bad input in torch-shim mode (tests/test_shim.py): `graph` (MindSpore in GRAPH_MODE: start
refuses in one line before anything is written) or `no_hook` (a shim whose nn.Module lacks
register_forward_pre_hook: one line naming it, the step still runs and is written).

    python tests/shim_bad_input_guide.py DUMP_DIR graph|no_hook
"""
from __future__ import annotations

import sys

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401  - `torch` is the shim from here on
import torch  # noqa: E402

from precdbg_ms import PrecisionDebugger  # noqa: E402

model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
if sys.argv[2] == "graph":
    ms.set_context(mode=ms.GRAPH_MODE)
else:
    torch.nn.Module.register_forward_pre_hook = None      # a shim without this hook
debugger = PrecisionDebugger(task="statistics", level="mix", dump_path=sys.argv[1], step=[0])
debugger.start(model)
out = model(torch.ones(3, 2)).sum()
debugger.stop()
debugger.step()
print("trained on:", float(out))
