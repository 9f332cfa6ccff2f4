"""What one captured tensor is: the neutral record every adapter produces and every tool reads.

A `Record` is plain structured data (a slotted dataclass, cheap enough to create thousands of times
per step on the training thread). Names are derived from its fields by `precdbg.records.naming`, never
parsed back. The HDF5 layout of a step file is the column list `RECORD_COLUMNS`.
"""
from __future__ import annotations

import dataclasses
from enum import Enum
from typing import TYPE_CHECKING, Optional, Tuple

import numpy as np

if TYPE_CHECKING:
    from .call import Call

__all__ = [
    "SCHEMA_VERSION", "Task", "Level", "RecordKind", "Direction", "Role", "Phase", "DataMode",
    "SummaryMode", "Record", "RECORD_COLUMNS", "MAX_NDIM", "READ_SCHEMA_VERSIONS", "READ_ROLES",
    "COMPUTED_ROLES", "WRITE_ROLES", "INVENTORY_ROLES", "NO_PRODUCER", "ADDED_COLUMNS",
    "is_scalar_dtype", "scalar_mask", "scalar_dtype", "DtypeName", "DTYPE_VALUE", "ENUM_COLUMNS",
]

SCHEMA_VERSION = 5          # 2: `producer`, `storage` (dataflow provenance); 3: `precision`;
                            # 4: `pos_mean` (order-sensitive statistic); 5: the seal (attribute
                            # `integrity`, precdbg.storage.step_checks)
READ_SCHEMA_VERSIONS = (1, 2, 3, 4, 5)
NO_PRODUCER = -1            # `producer` of a tensor nothing captured in the step produced
UNKNOWN_COUNT = -1          # `nan_count`/`inf_count`: some, how many not known (msprobe's dumps)
MAX_NDIM = 8  # shapes are stored padded to this many dimensions (-1 = absent)


class _TextEnum(str, Enum):
    """An enum whose members are their text: `str()`, `format()` and f-strings give the value
    (`forward`, not `Direction.FORWARD`), members equal and hash as their value, and a step
    file's string columns store it as is. Records carry members; the reader gives back text.
    Hashing and equality are str's own (C): Enum's Python-level hash made a set lookup of a
    member 4x slower, and records are made thousands of times per step."""
    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__
    __eq__ = str.__eq__
    __ne__ = str.__ne__


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
READ_ROLES = frozenset({Role.INPUT, Role.GRAD_OUTPUT})
COMPUTED_ROLES = frozenset({Role.OUTPUT, Role.GRAD_INPUT, Role.PARAM_GRAD})
INVENTORY_ROLES = frozenset({Role.PARAM, Role.BUFFER})
WRITE_ROLES = COMPUTED_ROLES | INVENTORY_ROLES
_SCALAR_PREFIX = "py."      # dtype of a non-tensor argument: py.int, py.float, py.str, ...


def is_scalar_dtype(dtype: str) -> bool:
    """A record of a non-tensor argument (a number, a string, a dtype), not of a tensor."""
    return dtype.startswith(_SCALAR_PREFIX)


_PREFIX_CODES = np.array([ord(c) for c in _SCALAR_PREFIX], dtype=np.uint32)


def scalar_mask(dtypes: np.ndarray) -> np.ndarray:
    """`is_scalar_dtype` over a column of dtypes. A column of str (every table's) is read by
    its first code points in C; anything else as np.char reads it."""
    column = np.asarray(dtypes)
    if column.ndim == 1 and column.dtype.kind == "U" and column.dtype.isnative \
            and column.flags.c_contiguous:
        width = column.dtype.itemsize // 4
        if width < len(_SCALAR_PREFIX) or not len(column):
            return np.zeros(len(column), dtype=bool)
        codes = column.view(np.uint32).reshape(len(column), width)[:, :len(_SCALAR_PREFIX)]
        return (codes == _PREFIX_CODES).all(axis=1)
    # bytes against a bytes prefix: numpy 2 has no startswith of bytes by str
    return np.char.startswith(column, _SCALAR_PREFIX.encode() if column.dtype.kind == "S"
                              else _SCALAR_PREFIX)


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


@dataclasses.dataclass(slots=True, init=False)
class Record:
    """One captured tensor (or non-tensor argument) of one call.

    Made from its call (`precdbg.records.call.Call`) and what is the tensor's own: the fields
    every record of a call shares (kind, prefix, API, canonical op, owning module, call index,
    execution order, call stack, alias) are the call's, read by name from it; the entry name
    and the phase follow from the call and the record's direction. The statistics are filled
    in when the batch crosses to the host, `producer`, `storage` and `precision` from the
    step's dataflow, `data_offset`/`data_nbytes` where the tensor is stored. Flat fields, so
    the writer reads every column in C."""
    entry: str                     # derived entry name, e.g. Functional.linear.3.forward
    kind: RecordKind
    prefix: str                    # Functional, Tensor, Torch, Module, Param, ...
    api: str                       # framework API name, module class, or parameter path
    op: str                        # canonical op (same vocabulary in every framework)
    module: str                    # owning module path ('' = root / outside any module)
    direction: Direction
    role: Role
    phase: Phase
    arg_index: int                 # ordinal of this tensor within its role
    arg_key: str                   # where it came from: "0", "0.1", "weight", ...
    call_index: int
    order: int                     # execution order of the forward call of the entry
    seq: int                       # emission order within the step (backward order for grads)
    dtype: str                     # neutral dtype name, or py.<type> of a non-tensor argument
    shape: Tuple[int, ...]
    numel: int
    min: float
    max: float
    mean: float
    norm: float
    nan_count: int
    inf_count: int
    pos_mean: float                # finite values' mean weighted by (2 i + 1) / n, i row-major
    checksum: str
    text: str                      # value of a non-tensor argument
    alias: str                     # a parameter's name in the other framework (gamma <-> weight)
    trainable: bool                # inventory: a parameter that requires gradients
    stack_id: int
    data_offset: int               # byte offset in the step file's data blob (tensor task)
    data_nbytes: int
    tensor_id: int                 # distinct-tensor identity within the step (dedup key)
    producer: int                  # seq of the record of this step that produced the tensor read
    storage: int                   # which memory (storage) of the step the tensor lies in
    precision: str                 # lowest float dtype its values went through ('' unknown/int)

    def __init__(self, call: "Call", direction: Direction, role: Role, arg_index: int,
                 arg_key: str, seq: int, dtype: str, shape: Tuple[int, ...], numel: int,
                 tensor_id: int = -1) -> None:
        self.kind = call.kind
        self.prefix = call.prefix
        self.api = call.api
        self.op = call.op
        self.module = call.module
        self.call_index = call.call_index
        self.order = call.order
        self.stack_id = call.stack_id
        self.alias = call.alias
        if direction == _BACKWARD:
            self.entry = call.backward_entry
            self.phase = _BACKWARD_PHASE
        else:
            self.entry = call.forward_entry
            self.phase = _SETUP_PHASE if direction == _NONE else call.phase
        self.direction = direction
        self.role = role
        self.arg_index = arg_index
        self.arg_key = arg_key
        self.seq = seq
        self.dtype = dtype
        self.shape = shape
        self.numel = numel
        self.tensor_id = tensor_id
        self.min = self.max = self.mean = self.norm = self.pos_mean = _NAN
        self.nan_count = self.inf_count = 0
        self.checksum = self.text = self.precision = ""
        self.trainable = False
        self.data_offset = -1
        self.data_nbytes = 0
        self.producer = NO_PRODUCER
        self.storage = -1

    @property
    def is_nonfinite(self) -> bool:
        return self.nan_count != 0 or self.inf_count != 0


_BACKWARD, _NONE = Direction.BACKWARD, Direction.NONE
_BACKWARD_PHASE, _SETUP_PHASE = Phase.BACKWARD, Phase.SETUP
_NAN = float("nan")

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
    ("storage", np.dtype(np.int64)), ("precision", None), ("pos_mean", np.dtype(np.float64)),
)
# the string columns whose values are enum members while captured (plain text once read)
ENUM_COLUMNS = frozenset({"kind", "direction", "role", "phase"})
# columns a file of an older schema version lacks, and the value they read as
ADDED_COLUMNS = {"producer": NO_PRODUCER, "storage": -1, "precision": "", "pos_mean": _NAN}
