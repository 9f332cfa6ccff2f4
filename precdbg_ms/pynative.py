"""MindSpore's PyNative executor, wherever this MindSpore version keeps it: `mindspore.graph.api`
from 2.9 (where `mindspore.common.api` is deprecated and warns), `mindspore.common.api` in 2.7
and 2.8 (whose `mindspore.graph` has no `api`)."""
from __future__ import annotations

try:
    from mindspore.graph.api import _PyNativeExecutor, _pynative_executor
except ImportError:          # MindSpore 2.7, 2.8
    from mindspore.common.api import _PyNativeExecutor, _pynative_executor

__all__ = ["_PyNativeExecutor", "_pynative_executor"]
