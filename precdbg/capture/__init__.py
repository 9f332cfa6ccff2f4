"""Capture: the four lines' debugger, and everything between a framework's hook and the writer.

A framework adapter (precdbg_pt, precdbg_ms) subclasses `BaseInstrumentor` and `BaseDebugger`
and only translates: its hooks tell the capture window a call begins (`begin_api`,
`begin_module`), hand it framework tensors (`capture`) and answer the tensor questions the core
cannot (`TensorOps`, an object the adapter owns). Everything else lives here once:

- `debugger` (`BaseDebugger`, the user's object) around a `session` (the debugger's lifetime:
  config, filters, writer, run.json, the step counter, `step_selection`: which steps and ranks
  dump), which makes a fresh `step_state` at every step and a fresh capture `window` at every
  `start()` that captures;
- `window`: what the adapter's hooks record into; its `calls` helper names and selects the
  calls (with `filters`), and it makes the records of their tensors: `batch`
  (distinct tensors, their statistics handles, when a batch crosses to the host), `provenance`
  (which record produced the tensor a record reads), `recompute` (activation recompute's
  replayed calls), `call_stacks`; which arguments are recorded is `records.arguments`;
- `instrumentor` (with `model_walk` and `contract`): the one shape of an adapter;
- `run_file` and `manifest`: run.json; `notices`: everything said once; `failures`: failures
  inside precdbg, counted; `uncaught`: a constructor's refusal said in one line when the
  script does not catch it; `gc_pause`: Python's collector during a dumped step;
  `_fastats.c`: host statistics in one pass.

The names below are the adapters' whole view of the core, with `precdbg.errors`,
`precdbg.records` and `precdbg.weights`.

Imports: precdbg.errors, precdbg.version, precdbg.records, precdbg.config, precdbg.storage
"""
from __future__ import annotations

from ..storage.json_files import jsonable
from ..records.arguments import call_arguments, tensor_arguments, tensor_results, value_arguments
from .contract import Recorder, TensorOps
from .debugger import BaseDebugger
from .instrumentor import (BaseInstrumentor, ClassPatch, GuardedHook, NamedTensor,
                           named_through)
from .manifest import record_seed_all

try:                     # one-pass host statistics in C (optional: needs a C compiler)
    from . import _fastats as fastats
except ImportError:      # pragma: no cover - depends on the build
    fastats = None

__all__ = ["BaseDebugger", "BaseInstrumentor", "ClassPatch", "GuardedHook", "NamedTensor",
           "named_through", "Recorder", "TensorOps", "call_arguments", "tensor_arguments",
           "tensor_results", "value_arguments", "record_seed_all", "jsonable", "fastats"]
