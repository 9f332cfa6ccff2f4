"""Typed results of a compare: one `Row` per aligned record pair, the `Evidence` an entry keeps of
a tensor that differs, `ArgDiff` of a non-tensor argument that differs, and `Producer`, where a
tensor that a record reads came from. Each serialises to the keys of the JSON contract.
"""
from __future__ import annotations

import dataclasses
import enum
import operator
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .entries import Entry
    from .one_run_writer import OneRunWriter

__all__ = ["Row", "ROW_KEYS", "Evidence", "ArgDiff", "Producer", "Source", "finite_or_none", "Note",
           "NoteCode"]

EVIDENCE_METRICS = ("min_a", "min_b", "max_a", "max_b", "mean_a", "mean_b", "norm_a", "norm_b",
                    "err", "tol", "cosine", "max_abs", "max_rel", "rmse", "rel_rmse",
                    "update_share", "dw_agreed")


def finite_or_none(value: float) -> Optional[float]:
    """JSON-safe: NaN -> None, +-Inf -> +-1e308."""
    value = float(value)
    return None if np.isnan(value) else (value if np.isfinite(value) else
                                          (1e308 if value > 0 else -1e308))


@dataclasses.dataclass(slots=True)      # some fifty fields, a row per record pair: no __dict__
class Row:
    """One aligned record pair and how far apart its two tensors (or values) are."""
    step: int
    rank: int
    name_a: str
    name_b: str
    kind: str
    direction: str
    module: str
    op: str
    role: str
    arg_index: int
    dtype_a: str
    dtype_b: str
    shape_a: List[int]
    shape_b: List[int]
    order: int
    seq: int
    status: str
    judged_by: str = "statistics"  # the id of the pair judge that decided the status
    min_a: Optional[float] = None
    min_b: Optional[float] = None
    max_a: Optional[float] = None
    max_b: Optional[float] = None
    mean_a: Optional[float] = None
    mean_b: Optional[float] = None
    norm_a: Optional[float] = None
    norm_b: Optional[float] = None
    d_min: Optional[float] = None
    d_max: Optional[float] = None
    d_mean: Optional[float] = None
    d_norm: Optional[float] = None
    pos_mean_a: Optional[float] = None   # the order-sensitive mean (None: not in the dump)
    pos_mean_b: Optional[float] = None
    d_pos_mean: Optional[float] = None
    err: Optional[float] = None
    tol: Optional[float] = None
    nan_a: int = 0
    nan_b: int = 0
    inf_a: int = 0
    inf_b: int = 0
    checksum_equal: Optional[bool] = None    # None: not both records have a checksum
    producer_a: str = ""           # entry that produced the tensor this record reads ("" none)
    producer_b: str = ""
    module_b: str = ""             # the candidate's module path (the HTML tree shows it)
    phase: str = ""                # the baseline record's phase (forward, backward, optimizer, setup)
    # a parameter at step k >= 1 (see multistep.py): the share of its last update the runs
    # disagree on, and whether step k-1's weight gradient agreed (None: not judged that way)
    # a value far smaller than what it was reduced from (see floors.py): the norm its
    # differences were judged against instead of its own, where that turned its verdict
    floor: Optional[float] = None
    update_share: Optional[float] = None
    dw_agreed: Optional[bool] = None
    tensor: Optional[Dict[str, Optional[float]]] = None   # element-wise metrics (tensor task)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def as_json(self) -> Dict[str, Any]:
        out = dict(zip(_ROW_KEYS, _row_values(self)))
        if self.tensor is not None:
            out.update(self.tensor)
        return out

    def why_facts(self) -> Dict[str, Any]:
        """What says why the pair differs (report/wording.py writes it: `evidence_why`)."""
        out: Dict[str, Any] = {"shape_a": self.shape_a, "shape_b": self.shape_b,
                               "nan_a": self.nan_a, "inf_a": self.inf_a, "nan_b": self.nan_b,
                               "inf_b": self.inf_b, "err": self.err, "tol": self.tol}
        if self.tensor is not None and self.tensor.get("rel_rmse") is not None:
            out["rel_rmse"], out["cosine"] = self.tensor["rel_rmse"], self.tensor["cosine"]
        return out

    def metrics(self) -> Dict[str, Any]:
        """The EVIDENCE_METRICS of as_json(), in that order (without making as_json())."""
        tensor = self.tensor
        if tensor is None:
            return dict(zip(_METRIC_KEYS, _metric_values(self)))
        return {k: tensor[k] if k in tensor else getattr(self, k) for k in EVIDENCE_METRICS
                if k in tensor or k in _METRIC_KEYS}


# a row's JSON keys, in order (the element-wise metrics of `tensor` follow where it has them)
ROW_KEYS = _ROW_KEYS = tuple(f.name for f in dataclasses.fields(Row) if f.name != "tensor")
_row_values = operator.attrgetter(*_ROW_KEYS)      # every value at once, in C
_METRIC_KEYS = tuple(k for k in EVIDENCE_METRICS if k in _ROW_KEYS)
_metric_values = operator.attrgetter(*_METRIC_KEYS)


class Source(str, enum.Enum):
    """Where a tensor that a record reads came from."""
    NONE = "none"              # nothing captured in the step produced it (data, RNG, ...)
    ENTRY = "entry"            # an entry present in both runs
    ONE_RUN = "one_run"        # a record that only one of the runs has


@dataclasses.dataclass
class Producer:
    source: Source
    entry: Optional["Entry"] = None
    name_a: str = ""           # producing entries (ONE_RUN: the one-run records)
    name_b: str = ""
    module: str = ""
    kind: str = ""
    op: str = ""

    @property
    def name(self) -> str:
        return self.entry.name if self.entry is not None else (self.name_a or self.name_b)


@dataclasses.dataclass
class Evidence:
    """A tensor of an entry that differs between the runs."""
    role: str
    arg_index: int
    why: Dict[str, Any]        # what says why it differs (Row.why_facts), not words
    shape_ok: bool
    metrics: Dict[str, Any]
    only_in: str = ""          # "baseline" / "candidate": the record is in that run only
    producer: Optional[Producer] = None
    # for a read: the entries that wrote into the same memory before it, latest first
    same_memory: List["Entry"] = dataclasses.field(default_factory=list)
    # for a read: a call only one run makes that wrote its memory in place after its producer
    # (judge one_run_writer)
    writer: Optional["OneRunWriter"] = None

    @classmethod
    def of(cls, row: Row) -> "Evidence":
        return cls(row.role, row.arg_index, row.why_facts(), row.shape_a == row.shape_b, row.metrics())

    def as_json(self) -> Dict[str, Any]:
        # "why": its words, written by report/wording.py from "_why"
        out: Dict[str, Any] = {"role": self.role, "arg_index": self.arg_index, "why": "",
                               "shape_ok": self.shape_ok, "metrics": self.metrics,
                               "_why": self.why}
        if self.producer is not None and self.producer.source is not Source.NONE:
            out["producer"] = self.producer.name
        return out


@dataclasses.dataclass
class ArgDiff:
    """A non-tensor argument whose value differs (a cause, not data)."""
    role: str
    arg_index: int
    key: str
    a: str
    b: str

    def as_json(self) -> Dict[str, Any]:
        return {"role": self.role, "arg_index": self.arg_index, "key": self.key, "a": self.a,
                "b": self.b, "metrics": {}}


class NoteCode(str, enum.Enum):
    """What a compare's note is about (`notes[].code`)."""
    NOT_COMPARED = "not_compared"              # steps/ranks only one dump holds
    PARTIAL_FILES = "partial_files"            # incomplete step files, skipped
    LEVELS_DIFFER = "levels_differ"            # only calls both levels capture are compared
    UNOBSERVED = "unobserved_modules"          # modules that ran compiled
    MAPPING_UNUSED = "mapping_unused"          # mapping entries that name no module
    PREVIOUS_STEP_UNREAD = "previous_step_unread"   # the step before --step S is unreadable
    STEP_UNREAD = "step_unread"                # a compared step and rank cannot be read
    OTHER_CAUSES = "other_causes"              # what else differs where weights entered apart
    WEIGHTS_AGREE_AFTER = "weights_agree_after"     # every later step's parameters agree
    RELABELLED = "relabelled"                  # one step/rank each, compared with each other
    FRAMEWORKS_DIFFER = "frameworks_differ"    # aligned by module path, canonical op, order
    CALLS_UNDERNEATH = "calls_underneath"      # a torch shim's own calls inside a module
    UPDATE_OF_ROUNDING = "update_of_rounding"  # parameters updated from rounding noise
    JUDGED_BY_UPDATE = "judged_by_update"      # parameters judged by their last update
    JUDGED_BY_ROUNDING = "judged_by_rounding"  # parameters of step k judged by rounding
    PRECISION_ARGUMENTS = "precision_arguments"    # status 'precision'
    INTEGER_PLUMBING = "integer_plumbing"      # status 'integer'
    ROUNDING_FLOOR = "rounding_floor"          # records judged against a rounding floor
    STATISTICS_ONLY = "statistics_only"        # a match by statistics without pos_mean
    TOOLS_DIFFER = "tools_differ"              # a precdbg dump against an msprobe dump
    MSPROBE_DUMPS = "msprobe_dumps"            # a dump msprobe wrote: what it cannot show


@dataclasses.dataclass
class Note:
    """What a compare left out, or what explains its result: a code, and its words (`text`),
    or the facts report/wording.py writes them from."""
    code: NoteCode
    text: str = ""
    facts: Optional[Dict[str, Any]] = None

    def as_json(self) -> Dict[str, Any]:
        return {"code": self.code.value, "text": self.text}
