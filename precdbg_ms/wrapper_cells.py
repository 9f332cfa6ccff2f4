"""Cells a MindSpore network is named through: the cells `ms.amp.auto_mixed_precision` (and
`build_train_network`) wraps the network and its float32 cells in at level O2/O3, whose
construct only hands the call to the cell they hold (`_backbone`) and casts its output; and the
training wrappers of `mindspore.nn` (`WithLossCell` around the network and its loss,
`TrainOneStepCell` and `TrainOneStepWithLossScaleCell` around that and the optimizer), so that
`start(WithLossCell(net))` or `start(TrainOneStepCell(...))` names the network as `start(net)`
does. Without this a wrapped network's paths read `network._backbone.blocks.0.ln_1._backbone`
and none of its parameters pairs with a PyTorch run's. The calls the wrappers make themselves
(casts, the loss, the gradient and the optimizer) are still captured, outside the model.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["held_as"]

# module, classes, attribute holding the wrapped cell (looked up in sys.modules: nothing imported)
_HANDING_OVER = (("mindspore.train.amp", ("_OutputTo16", "_OutputTo32"), "_backbone"),
                 ("mindspore.nn.wrap.cell_wrapper", ("WithLossCell",), "_backbone"),
                 ("mindspore.nn.wrap.cell_wrapper", ("TrainOneStepCell",), "network"),
                 ("mindspore.nn.wrap.loss_scale", ("TrainOneStepWithLossScaleCell",),
                  "network"))


def held_as(cell: Any) -> Optional[str]:
    """The attribute a hand-over wrapper cell holds its cell under; None for any other cell."""
    for module_name, class_names, attribute in _HANDING_OVER:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name in class_names:
            cls = getattr(module, name, None)
            if isinstance(cls, type) and type(cell) is cls:
                return attribute
    return None
