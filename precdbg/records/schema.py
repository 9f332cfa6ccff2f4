"""What one captured tensor is: the neutral record every adapter produces and every tool reads.

A `Record` is plain structured data (a slotted dataclass, cheap enough to create thousands of times
per step on the training thread). Names are derived from its fields by `precdbg.records.naming`, never
parsed back. The HDF5 layout of a step file is the column list `RECORD_COLUMNS`.
"""
from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Optional, Tuple

import numpy as np

__all__ = [
    "SCHEMA_VERSION", "Task", "Level", "RecordKind", "Direction", "Role", "Phase", "DataMode",
    "SummaryMode", "Record", "RECORD_COLUMNS", "MAX_NDIM", "READ_SCHEMA_VERSIONS", "READ_ROLES",
    "COMPUTED_ROLES", "WRITE_ROLES", "INVENTORY_ROLES", "NO_PRODUCER", "ADDED_COLUMNS",
    "is_scalar_dtype", "scalar_mask", "scalar_dtype", "DtypeName", "DTYPE_VALUE",
]

SCHEMA_VERSION = 3          # 2: `producer`, `storage` (dataflow provenance); 3: `precision`
READ_SCHEMA_VERSIONS = (1, 2, 3)
NO_PRODUCER = -1            # `producer` of a tensor nothing captured in the step produced
MAX_NDIM = 8  # shapes are stored padded to this many dimensions (-1 = absent)


class _TextEnum(str, Enum):
    """An enum whose members are their text: `str()`, `format()` and f-strings give the value
    (`forward`, not `Direction.FORWARD`), members equal and hash as their value, and a step
    file's string columns store it as is. Records carry members; the reader gives back text."""
    __str__ = str.__str__
    __format__ = str.__format__


class Task(_TextEnum):
    STATISTICS = "statistics"
    TENSOR = "tensor"
    OVERFLOW = "overflow"


class Level(_TextEnum):
    MODULE = "module"
    API = "api"
    MIX = "mix"


class RecordKind(_TextEnum):
    API = "api"
    MODULE = "module"
    PARAM_GRAD = "param_grad"
    PARAM = "param"
    SAVED = "saved"                # debugger.save(name, obj)


class Direction(_TextEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    NONE = "none"          # parameter inventory, taken outside any pass


class Role(_TextEnum):
    INPUT = "input"
    OUTPUT = "output"
    GRAD_INPUT = "grad_input"      # gradient produced for an input (dx)
    GRAD_OUTPUT = "grad_output"    # gradient arriving at an output (dy)
    PARAM_GRAD = "param_grad"      # dw of this backward pass
    PARAM = "param"                # inventory: a parameter at start()
    BUFFER = "buffer"              # inventory: a buffer at start()


# The roles that read a tensor (a call's inputs, the gradient arriving at its outputs), and those
# that write one (what a call produces; a dw, which is also what later reads of .grad see).
READ_ROLES = frozenset({Role.INPUT.value, Role.GRAD_OUTPUT.value})
COMPUTED_ROLES = frozenset({Role.OUTPUT.value, Role.GRAD_INPUT.value, Role.PARAM_GRAD.value})
INVENTORY_ROLES = frozenset({Role.PARAM.value, Role.BUFFER.value})
WRITE_ROLES = COMPUTED_ROLES | INVENTORY_ROLES
_SCALAR_PREFIX = "py."      # dtype of a non-tensor argument: py.int, py.float, py.str, ...


def is_scalar_dtype(dtype: str) -> bool:
    """A record of a non-tensor argument (a number, a string, a dtype), not of a tensor."""
    return dtype.startswith(_SCALAR_PREFIX)


def scalar_mask(dtypes: np.ndarray) -> np.ndarray:
    """`is_scalar_dtype` over a column of dtypes."""
    return np.char.startswith(dtypes, _SCALAR_PREFIX)


DTYPE_VALUE = _SCALAR_PREFIX + "dtype"     # dtype of an argument that is itself a dtype


class DtypeName(str):
    """A framework dtype passed as an argument (`torch.tensor(x, dtype=torch.bfloat16)`), by its
    neutral name ('bfloat16'): recorded as a value of dtype `DTYPE_VALUE`, so the read side
    knows the text names a dtype."""
    __slots__ = ()


def scalar_dtype(value: object) -> str:
    """The dtype recorded for a non-tensor argument."""
    return DTYPE_VALUE if isinstance(value, DtypeName) else _SCALAR_PREFIX + type(value).__name__


class Phase(_TextEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    SETUP = "setup"                # inventory at start()


class DataMode(_TextEnum):
    ALL = "all"
    FORWARD = "forward"
    BACKWARD = "backward"
    INPUT = "input"        # forward inputs and the gradients flowing into a backward (grad_output)
    OUTPUT = "output"      # forward outputs and the gradients a backward produces (grad_input)


class SummaryMode(_TextEnum):
    STATISTICS = "statistics"
    CHECKSUM = "checksum"


@dataclasses.dataclass(slots=True)
class Record:
    """One captured tensor (or non-tensor argument) of one entry."""
    entry: str                     # derived entry name, e.g. Functional.linear.3.forward
    kind: str                      # RecordKind value
    prefix: str                    # Functional, Tensor, Torch, Module, Param, ...
    api: str                       # framework API name, module class, or parameter path
    op: str                        # canonical op (same vocabulary in every framework)
    module: str                    # owning module path ('' = root / outside any module)
    direction: str
    role: str
    phase: str
    arg_index: int                 # ordinal of this tensor within its role
    arg_key: str                   # where it came from: "0", "0.1", "weight", ...
    call_index: int
    order: int                     # execution order of the forward call of the entry
    seq: int = 0                   # emission order within the step (backward order for grads)
    dtype: str = ""
    shape: Tuple[int, ...] = ()
    numel: int = 0
    min: float = float("nan")
    max: float = float("nan")
    mean: float = float("nan")
    norm: float = float("nan")
    nan_count: int = 0
    inf_count: int = 0
    checksum: str = ""
    text: str = ""                 # value of a non-tensor argument
    alias: str = ""                # a parameter's name in the other framework (gamma <-> weight)
    trainable: bool = False
    stack_id: int = -1
    data_offset: int = -1          # byte offset in the step file's data blob (tensor task)
    data_nbytes: int = 0
    tensor_id: int = -1            # distinct-tensor identity within the step (dedup key)
    producer: int = NO_PRODUCER    # seq of the record of this step that produced the tensor read
    storage: int = -1              # which memory (storage) of the step the tensor lies in
    precision: str = ""            # lowest float dtype its values went through ('' unknown/int)

    @property
    def is_nonfinite(self) -> bool:
        return self.nan_count != 0 or self.inf_count != 0


# (column, numpy dtype or None for utf-8 strings) in storage order
RECORD_COLUMNS: Tuple[Tuple[str, Optional[np.dtype]], ...] = (
    ("entry", None), ("kind", None), ("prefix", None), ("api", None), ("op", None),
    ("module", None), ("direction", None), ("role", None), ("phase", None),
    ("arg_index", np.dtype(np.int32)), ("arg_key", None), ("call_index", np.dtype(np.int32)),
    ("order", np.dtype(np.int64)), ("seq", np.dtype(np.int64)), ("dtype", None),
    ("numel", np.dtype(np.int64)), ("min", np.dtype(np.float64)), ("max", np.dtype(np.float64)),
    ("mean", np.dtype(np.float64)), ("norm", np.dtype(np.float64)),
    ("nan_count", np.dtype(np.int64)), ("inf_count", np.dtype(np.int64)), ("checksum", None),
    ("text", None), ("alias", None), ("trainable", np.dtype(np.bool_)), ("stack_id", np.dtype(np.int32)),
    ("data_offset", np.dtype(np.int64)), ("data_nbytes", np.dtype(np.int64)),
    ("tensor_id", np.dtype(np.int64)), ("producer", np.dtype(np.int64)),
    ("storage", np.dtype(np.int64)), ("precision", None),
)
# columns a file of an older schema version lacks, and the value they read as
ADDED_COLUMNS = {"producer": NO_PRODUCER, "storage": -1, "precision": ""}
