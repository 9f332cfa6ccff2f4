"""`precdbg compare-weights A B`: two checkpoints compared tensor by tensor, across frameworks.

`compare_weights`: names brought to PyTorch's convention, values compared in float64; formats
read by readers registered per format (`checkpoints`): safetensors and numpy here, PyTorch and
MindSpore by their adapters.

Imports: precdbg.errors, precdbg.records, precdbg.storage
"""
from __future__ import annotations

from .checkpoints import as_float_format, register_checkpoint_reader
from .compare_weights import compare_weights, format_weights, load_weights, weights_main

__all__ = ["compare_weights", "format_weights", "load_weights", "weights_main",
           "as_float_format", "register_checkpoint_reader"]
