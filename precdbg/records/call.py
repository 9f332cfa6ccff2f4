"""One captured call (an API call, a module call, a parameter's gradient or inventory entry, a
saved item): its forward identity, which every record of the call reads (`schema.Record.call`),
and its backward entry name, made on first use."""
from __future__ import annotations

from typing import Optional

from .naming import api_entry, module_entry
from .precision import UNKNOWN
from .schema import Phase, RecordKind

__all__ = ["Call"]

_API, _MODULE = RecordKind.API, RecordKind.MODULE
_BACKWARD = Phase.BACKWARD


class Call:
    """One entry occurrence (an API call or a module call) with its forward identity. The
    backward entry's name is made when a backward record first asks for it (most calls never
    see one captured)."""
    __slots__ = ("kind", "prefix", "api", "op", "module", "call_index", "order", "phase",
                 "stack_id", "store", "forward_entry", "_backward_entry", "alias", "precision")

    def __init__(self, kind: RecordKind, prefix: str, api: str, op: str, module: str,
                 call_index: int, order: int, phase: Phase, stack_id: int, store: bool,
                 forward_entry: str,
                 backward_entry: Optional[str] = None, alias: str = "") -> None:
        self.kind, self.prefix, self.api, self.op, self.module = kind, prefix, api, op, module
        self.call_index, self.order, self.phase = call_index, order, phase
        self.stack_id, self.store, self.forward_entry = stack_id, store, forward_entry
        self._backward_entry = backward_entry
        self.alias = alias
        self.precision = UNKNOWN     # the lowest precision its forward inputs carried (a rank)

    @property
    def backward_entry(self) -> str:
        name = self._backward_entry
        if name is None:
            if self.kind == _API:
                name = api_entry(self.prefix, self.api, self.call_index, _BACKWARD)
            elif self.kind == _MODULE:
                name = module_entry(self.prefix, self.module, self.api, _BACKWARD,
                                    self.call_index)
            else:
                name = self.forward_entry
            self._backward_entry = name
        return name
