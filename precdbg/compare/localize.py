"""Name the first divergence: the earliest entry whose inputs agree and whose outputs do not.

Order: step; within a step the parameter inventory first (values at start), then forward entries
in execution order, then backward entries in the order their gradients appeared, then dw. A module
whose inputs agree and outputs do not contains the culprit: the search descends into the calls
made inside it. Everything that diverges after the culprit is a consequence.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

__all__ = ["Entry", "locate"]

INPUT_ROLES = {"input", "grad_output"}
OUTPUT_ROLES = {"output", "grad_input", "param_grad", "param", "buffer"}


@dataclasses.dataclass
class Entry:
    """One entry (a call of an API or module, a parameter) of one step, with its verdicts."""
    step: int
    rank: int
    direction: str
    kind: str
    name_a: str
    name_b: str
    module: str
    op: str
    order: int
    seq: int
    inputs_bad: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    outputs_bad: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    args_bad: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    inputs_ok: int = 0
    outputs_ok: int = 0
    trainable_differs: bool = False

    @property
    def diverged(self) -> bool:
        return bool(self.inputs_bad or self.outputs_bad or self.args_bad)

    @property
    def is_candidate(self) -> bool:
        """Tensor inputs agree (or there are none); outputs, or a non-tensor argument, do not."""
        return bool(self.outputs_bad or self.args_bad) and not self.inputs_bad


def _descends(entry: Entry, parent: Entry) -> bool:
    if parent.kind != "module":
        return False
    if parent.module == "":
        return True
    return entry.module == parent.module and entry.kind != "module" or \
        entry.module.startswith(parent.module + ".")


def _innermost(first: Entry, entries: List[Entry], key: str) -> Entry:
    culprit = first
    while True:
        inner = [e for e in entries if e is not culprit and e.is_candidate
                 and getattr(e, key) > getattr(culprit, key) and _descends(e, culprit)]
        if not inner:
            return culprit
        culprit = min(inner, key=lambda e: getattr(e, key))


def _verdict(entry: Entry, reason: str, role: Optional[str] = None) -> Dict[str, Any]:
    evidence = entry.outputs_bad[0] if entry.outputs_bad else (
        entry.inputs_bad[0] if entry.inputs_bad else (entry.args_bad or [{}])[0])
    return {"step": entry.step, "rank": entry.rank,
            "direction": "backward" if entry.direction == "backward" else "forward",
            "kind": entry.kind, "name_a": entry.name_a, "name_b": entry.name_b,
            "module": entry.module, "op": entry.op, "role": role or evidence.get("role", ""),
            "metrics": evidence.get("metrics", {}), "reason": reason,
            "evidence": {"inputs_bad": entry.inputs_bad[:4], "outputs_bad": entry.outputs_bad[:4],
                         "arguments_bad": entry.args_bad[:4], "inputs_agreeing": entry.inputs_ok}}


def _output_reason(entry: Entry) -> str:
    if entry.args_bad:
        args = "; ".join(f"argument {a['key']!r}: {a['a']!r} vs {a['b']!r}"
                         for a in entry.args_bad[:3])
        if not entry.outputs_bad:
            return f"a non-tensor argument differs ({args})"
        ev = entry.outputs_bad[0]
        return (f"its tensor inputs agree but a non-tensor argument differs ({args}); its "
                f"{ev['role']} {ev['arg_index']} differs{ev.get('why', '')}")
    ev = entry.outputs_bad[0]
    what = {"output": "output", "grad_input": "gradient for input (dx)",
            "param_grad": "weight gradient (dw)"}.get(ev["role"], ev["role"])
    tail = ev.get("why", "")
    if entry.inputs_ok:
        return f"its inputs agree but its {what} {ev['arg_index']} differs{tail}"
    return f"its {what} {ev['arg_index']} differs{tail} (it has no compared inputs)"


def _inventory(entries: List[Entry], previous_matched: bool) -> Optional[Dict[str, Any]]:
    bad = [e for e in entries if e.diverged or e.trainable_differs]
    if not bad:
        return None
    e = min(bad, key=lambda x: x.seq)
    ev = (e.outputs_bad or [{}])[0]
    if e.trainable_differs:
        reason = "parameter is trainable in one run and frozen in the other"
    elif ev.get("why", "").startswith(" (only in"):
        reason = f"parameter inventory differs: {e.name_a or e.name_b}{ev['why']}"
    elif not ev.get("shape_ok", True):
        reason = "parameter shapes differ"
    elif previous_matched:
        reason = (f"parameters differ at the start of step {e.step} while step {e.step - 1} "
                  "matched: the optimizer update differs (optimizer type, hyperparameters, "
                  "param groups, loss scale)")
    else:
        reason = "parameter values differ at start"
    others = len(bad) - 1
    if others:
        reason += f" ({others} more parameter(s) differ)"
    return _verdict(e, reason)


def locate(steps: List[Dict[str, List[Entry]]], statistics_only: bool
           ) -> Optional[Dict[str, Any]]:
    """`steps`: per step (ascending) a dict of entry lists by phase: setup, forward, backward,
    param_grad. Returns the first divergence, or None."""
    previous_matched = False
    for phases in steps:
        found = _inventory(phases.get("setup", []), previous_matched)
        if found:
            return found
        forward = sorted(phases.get("forward", []), key=lambda e: e.order)
        first_bad = next((e for e in forward if e.diverged), None)
        if first_bad is not None:
            if first_bad.inputs_bad and not any(e.is_candidate for e in forward
                                                if e.order < first_bad.order):
                return _verdict(first_bad, "input data differs: the first op's inputs already "
                                "disagree", role=first_bad.inputs_bad[0]["role"])
            first = next((e for e in forward if e.is_candidate), None)
            if first is not None:
                culprit = _innermost(first, forward, "order")
                return _verdict(culprit, _output_reason(culprit))
            return _verdict(first_bad, "inputs differ (no op with agreeing inputs was found "
                            "before it: something not captured changed them)")
        backward = sorted(phases.get("backward", []), key=lambda e: e.seq)
        first = next((e for e in backward if e.is_candidate), None)
        if first is not None:
            culprit = _innermost(first, backward, "seq")
            return _verdict(culprit, "backward-only difference: the forward agrees; "
                            + _output_reason(culprit))
        bad_back = next((e for e in backward if e.diverged), None)
        if bad_back is not None:
            return _verdict(bad_back, "the gradient arriving here already differs (loss or an "
                            "uncaptured op)")
        dw = sorted((e for e in phases.get("param_grad", []) if e.diverged), key=lambda e: e.seq)
        if dw:
            return _verdict(dw[0], "dw-only difference: forward and dx agree, the weight "
                            f"gradient of {dw[0].name_a or dw[0].name_b} does not"
                            + (f" ({len(dw) - 1} more)" if len(dw) > 1 else ""))
        previous_matched = True
    return None
