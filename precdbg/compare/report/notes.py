"""The notes and the additions to a verdict's reason that say what a compare left out or what
explains it: unobserved modules, levels that capture other calls, steps and ranks one dump
holds, calls only one run makes inside the culprit's module, what stops a gradient, a loss
scale that differs."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import DumpError
from ...storage.reader import Dump
from ...storage.step_reader import step_status
from ...records.schema import READ_ROLES, WRITE_ROLES, Direction, RecordKind, Role
from ..judge.rows import Note, NoteCode
from ..localize.step_causes import ENTERED_APART
from ..localize.verdict import Annotation, Verdict
from .wording import settings_text

__all__ = ["file_why", "incomplete_parts", "unobserved_modules", "unobserved_note", "level_note", "uncompared",
           "note_loss_scale", "note_extra_calls", "unused_mapping", "other_causes",
           "weights_agree_after"]

_FORWARD_ROLES = frozenset({Role.INPUT, Role.OUTPUT})


def unobserved_modules(dump: Dump) -> List[str]:
    """The module paths a run could not see inside (run.json's manifest `unobserved`: modules
    that ran compiled, TorchScript or ms.jit)."""
    section = (dump.run.get("manifest") or {}).get("unobserved") if isinstance(
        dump.run.get("manifest"), dict) else None
    return [str(p) for p in section.get("modules", [])] if isinstance(section, dict) else []


def unobserved_note(a: Dump, b: Dump) -> List[Note]:
    notes = []
    for label, dump in (("baseline", a), ("candidate", b)):
        paths = unobserved_modules(dump)
        if paths:
            compiler = str(((dump.run.get("manifest") or {}).get("unobserved") or {})
                           .get("compiler", "compiled"))
            shown = ", ".join(p or "(the model)" for p in paths[:5])
            notes.append(Note(NoteCode.UNOBSERVED,
                              f"the {label} ran module(s) {shown} compiled ({compiler}): the "
                              "calls inside them were not captured, and are not compared"))
    return notes


def unused_mapping(mapping: Optional[Dict[str, Dict[str, str]]], a: Dump, b: Dump
                   ) -> List[Note]:
    """Entries of a mapping file's `modules` that name a module path neither side has (a
    candidate path not in the candidate's module tree, a baseline path not in the
    baseline's): they rename nothing, most likely a typo. Said once, naming them."""
    modules = (mapping or {}).get("modules") or {}
    if not modules:
        return []
    missing = []
    for label, dump, names in (("candidate", b, list(modules)),
                               ("baseline", a, list(modules.values()))):
        paths = {path for s in dump.steps for r in dump.ranks
                 for path, _, _ in dump.modules(s, r)}
        if not paths:                  # no module tree recorded (start() without a model)
            continue
        missing += [f"'{name}' ({label})" for name in dict.fromkeys(names)
                    if name and name not in paths
                    and not any(path.startswith(name + ".") for path in paths)]
    if not missing:
        return []
    shown = ", ".join(missing[:5]) + (f", ... ({len(missing)} in all)" if len(missing) > 5 else "")
    return [Note(NoteCode.MAPPING_UNUSED,
                 f"the mapping file's modules name module path(s) the dumps do not hold: "
                 f"{shown}; those entries rename nothing (a typo, or a mapping written for "
                 "another model?)")]


# the kinds of call records each level captures (parameters and their gradients: every level)
_LEVEL_CALLS = {"mix": {"api", "module"}, "api": {"api"}, "module": {"module"}}


def level_note(a: Dump, b: Dump, unmatched: List[Dict[str, Any]]) -> List[Note]:
    """Where the levels differ, the records of calls the other dump's level never captures
    leave `unmatched` (they have no counterpart to miss), counted in the note instead."""
    la, lb = a.setting("level"), b.setting("level")
    if not la or not lb or la == lb or la not in _LEVEL_CALLS or lb not in _LEVEL_CALLS:
        return []
    other = {"a": _LEVEL_CALLS[lb], "b": _LEVEL_CALLS[la]}
    kinds = _LEVEL_CALLS[la] | _LEVEL_CALLS[lb]
    left: Dict[str, int] = {}
    kept = []
    for u in unmatched:
        if u["kind"] in kinds and u["kind"] not in other[u["side"]]:
            left[u["side"]] = left.get(u["side"], 0) + 1
        else:
            kept.append(u)
    unmatched[:] = kept
    said = [f"{left[side]} {' and '.join(sorted(_LEVEL_CALLS[level] - _LEVEL_CALLS[o]))}-call "
            f"record(s) of the {label}" for side, label, level, o in
            (("a", "baseline", la, lb), ("b", "candidate", lb, la)) if left.get(side)]
    return [Note(NoteCode.LEVELS_DIFFER,
                 f"levels differ (baseline {la}, candidate {lb}): only the calls both levels "
                 f"capture are compared" + (f"; left out: {', '.join(said)}, which the other "
                                            "level does not record" if said else ""))]


def uncompared(a: Dump, b: Dump, step: Optional[int], rank: Optional[int],
                pairs: List[Tuple[int, int]]) -> List[Note]:
    """Notes on what the compare left out: the steps and ranks (of those asked) that only one
    dump holds, and incomplete files (`.partial`) skipped in either."""
    chosen = set(pairs)
    notes = []
    for label, have, other in (("baseline", a, "candidate"), ("candidate", b, "baseline")):
        left = [(s, r) for s in have.steps for r in have.ranks if have.files(s, r)
                and (s, r) not in chosen and (step is None or s == step)
                and (rank is None or r == rank)]
        if left:
            shown = ", ".join(f"step {s} rank {r}" for s, r in left[:6])
            more = f" and {len(left) - 6} more" if len(left) > 6 else ""
            notes.append(Note(NoteCode.NOT_COMPARED,
                              f"not compared: the {label}'s {shown}{more} (the {other} has no "
                              "such file)"))
        if have.partial:
            notes.append(Note(NoteCode.PARTIAL_FILES,
                              f"the {label} has {len(have.partial)} incomplete step file(s), "
                              f"skipped (the run stopped while writing them): "
                              f"{', '.join(have.partial[:3])}"))
    return notes


def file_why(sf: Any) -> str:
    """Why a step file leaves its step not whole: "interrupted" (the process ended inside the
    step), "failures" (records lost inside precdbg), "" (whole, or unreadable: said
    elsewhere)."""
    try:
        status = step_status(sf)
    except DumpError:
        return ""
    if status.get("interrupted"):
        return "interrupted"
    return "failures" if int(status.get("failures", 0) or 0) else ""


def incomplete_parts(a: Dump, b: Dump, step: Optional[int], rank: Optional[int],
                     pairs: List[Tuple[int, int]],
                     known: Optional[Dict[Tuple[str, int, int], List[str]]] = None
                     ) -> List[Dict[str, Any]]:
    """What keeps a compare from covering both runs (JSON `incomplete`): per side, the steps and
    ranks (of those asked) that only it holds (`only_here`), its compared steps that are not
    whole (`interrupted`: the process ended inside the step; `failures`: records lost inside
    precdbg) and its incomplete files (`partial`). `known`: (side, step, rank) -> file_why of
    each of its files, found while they were compared (not opened again here)."""
    chosen = set(pairs)
    out: List[Dict[str, Any]] = []
    for side, have in (("baseline", a), ("candidate", b)):
        for s in have.steps:
            for r in have.ranks:
                if not have.files(s, r) or (step is not None and s != step) or \
                        (rank is not None and r != rank):
                    continue
                if (s, r) not in chosen:
                    out.append({"side": side, "step": s, "rank": r, "why": "only_here"})
                    continue
                whys = (known or {}).get((side, s, r))
                if whys is None:
                    whys = [file_why(sf) for sf in have.files(s, r)]
                out.extend({"side": side, "step": s, "rank": r, "why": why}
                           for why in whys if why)
        out.extend({"side": side, "step": None, "rank": None, "why": "partial", "file": path}
                   for path in have.partial)
    return out


def note_loss_scale(first: Verdict, findings: List[Dict[str, Any]]) -> None:
    """A verdict in the root module's backward where the loss scale differs: the calls one
    run makes there are most likely its loss scaling, which scales every gradient after it."""
    scale = next((f for f in findings if f["kind"] == "loss_scale"), None)
    if scale is not None and first.module == "" and first.direction == Direction.BACKWARD:
        first.annotate(Annotation.LOSS_SCALE, message=scale["message"])


_GRADIENT_STOPS = frozenset({"detach", "stop_gradient"})


def note_extra_calls(first: Verdict, unmatched: List[Dict[str, Any]]) -> None:
    """Calls inside the culprit's module that only one run made are part of the evidence:
    `unmatched`, the records without counterpart that are no paired call's missing record (a
    gradient that never arrived is not another call; rank_compare.StepFound.one_run)."""
    if first.kind not in (RecordKind.MODULE, RecordKind.API):
        return
    inside = lambda m: first.module == "" or m == first.module or \
        m.startswith(first.module + ".")  # noqa: E731
    # a forward verdict: the calls made in one run only (their forward records); a backward
    # only in one run (a cast that is an identity in the other) is no other call
    roles = READ_ROLES | WRITE_ROLES if first.direction == Direction.BACKWARD \
        else _FORWARD_ROLES
    extra = {}
    for u in unmatched:
        if u["step"] == first.step and u["kind"] == RecordKind.API and inside(u["module"]) \
                and u["role"] in roles:
            extra.setdefault(u["side"], []).append(u["name"])
    zero = first.evidence.get("all_zero_in")
    if zero:                  # what stops the gradient in that run only
        side = "a" if zero == "baseline" else "b"
        stops = sorted({f"{u['name']} (module '{u['module']}')" for u in unmatched
                        if u["side"] == side and u["step"] == first.step
                        and u["rank"] == first.rank and u["op"] in _GRADIENT_STOPS
                        and u["role"] in _FORWARD_ROLES})
        if stops:
            first.evidence["gradient_stopped_by"] = stops[:10]
            first.annotate(Annotation.GRADIENT_STOPPED, side=zero, stops=stops[:3])
    if extra:
        first.evidence["calls_in_one_run_only"] = {
            ("baseline" if side == "a" else "candidate"): sorted(set(names))[:10]
            for side, names in extra.items()}
        for side, names in extra.items():
            who = "baseline" if side == "a" else "candidate"
            first.annotate(Annotation.CALLS_IN_ONE_RUN_ONLY, who=who,
                           names=sorted(set(names))[:4])


_OTHER_CAUSES_SHOWN = 4


def other_causes(steps: Sequence[Any], structural: Sequence[Any],
                 first: Optional[Verdict]) -> List[Note]:
    """When the runs entered the step with different weights (so every number after it
    differs: a parameter verdict, or the cause the step shows headed over it), the causes a compare still sees in the compared steps:
    non-tensor arguments that differ (a loss's reduction, a clipping norm, an eps) and modules
    whose calls or class differ, which the numbers cannot single out any more (a dump from
    the first training step shows which came first)."""
    if first is None or (first.kind != RecordKind.PARAM
                         and ENTERED_APART not in first.annotations):
        return []
    found: List[str] = []
    for step in steps:
        for e in sorted(step.entries, key=lambda x: (x.rank, x.seq)):
            if e.args_bad:
                arg = e.args_bad[0]
                found.append(f"step {e.step}: {e.name} argument '{arg.key or arg.arg_index}' "
                             f"{arg.a!r} vs {arg.b!r}")
    for diff in structural:
        where = f"module '{diff.module}'" if diff.module else "the root module"
        what = "calls differ" if diff.calls_differ else "class differs" if \
            diff.class_differs else \
            f"layer settings differ ({settings_text(diff.setting_values())})"
        found.append(f"step {diff.step}: {what} in {where}")
    if not found:
        return []
    more = f" (+{len(found) - _OTHER_CAUSES_SHOWN} more)" if len(found) > _OTHER_CAUSES_SHOWN \
        else ""
    return [Note(NoteCode.OTHER_CAUSES, "also differing in the compared step(s), whatever the "
                 "numbers: " + "; ".join(found[:_OTHER_CAUSES_SHOWN]) + more)]


def weights_agree_after(params_agree: Dict[Tuple[int, int], Optional[bool]],
                        first: Optional[Verdict]) -> List[Note]:
    """When every parameter agrees at the start of each compared step after the verdict's step
    (on its rank): what differs there did not reach the weights beyond tolerance (micro-batches
    against one batch, a clipping bound neither run reached, an equivalent computation).
    `params_agree`: per compared (step, rank), whether its parameters all agree (None: it has
    none; rank_compare.params_agree)."""
    if first is None:
        return []
    later = []
    for step in sorted({s for s, _ in params_agree}):
        if step <= first.step:
            continue
        if not params_agree.get((step, first.rank)):
            return []
        later.append(step)
    if not later:
        return []
    return [Note(NoteCode.WEIGHTS_AGREE_AFTER,
                 f"every parameter agrees at the start of step(s) {', '.join(map(str, later))} "
            f"(rank {first.rank}): the difference of step {first.step} did not reach "
            "the weights beyond tolerance (an equivalent computation, such as micro-batches "
            "against one batch, or a clipping bound neither run reached)")]
