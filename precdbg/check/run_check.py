"""Running the check on two dumps: the step and rank checked, every rank merged, the text.

Most accuracy gaps between two runs are set-up differences: another learning rate, a parameter in
the wrong weight-decay group, a frozen layer, other initial weights, another first batch, no seed,
a different environment. The check reads two dumps' run manifests (run.json) and parameter
inventories, maps MindSpore names to PyTorch's (`gamma` -> `weight`, through each record's
`alias`), and lists every difference ranked by how likely it changes the numbers (high, medium,
low). Known semantic differences between the frameworks' APIs and optimizers live in
`precdbg/check/semantics.yaml`; an entry's one-line explanation is shown when it applies.

`precdbg compare` runs the same check first and reports its findings under "setup".
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..errors import DumpError
from ..storage.reader import Dump, open_dump
from .checker import Checker
from .values import _CONDITIONS, SEVERITIES, _KIND_ORDER, _Run, semantics  # noqa: F401

__all__ = ["check_dumps", "format_check", "check_main", "semantics", "step_optimizer_findings"]


def _choose(a: Dump, b: Dump, step: Optional[int], rank: Optional[int], labels: Tuple[str, str]
            ) -> Tuple[int, int, int, int, List[str]]:
    """The step and rank checked: the first (step, rank) in both dumps, within those asked."""
    la, lb = labels
    for dump in (a, b):
        if step is not None and step not in dump.steps:
            raise DumpError(f"{dump.path}: no step {step} (steps {dump.steps})")
        if rank is not None and rank not in dump.ranks:
            raise DumpError(f"{dump.path}: no rank {rank} (ranks {dump.ranks})")

    def wanted(dump: Dump) -> List[Tuple[int, int]]:
        return [(s, r) for s in dump.steps for r in dump.ranks if dump.files(s, r)
                and (step is None or s == step) and (rank is None or r == rank)]
    in_a, in_b = wanted(a), wanted(b)
    common = [pair for pair in in_a if pair in set(in_b)]
    notes: List[str] = []
    if common:
        (sa, ra), (sb, rb) = common[0], common[0]
        checked = [r for s, r in common if s == sa]
        if len(checked) > 1:
            notes.append(f"step {sa} checked on ranks {', '.join(map(str, checked))}; a "
                         "difference found on one rank only names it")
    else:
        if not in_a or not in_b:
            raise DumpError(f"no step {step if step is not None else '*'} rank "
                            f"{rank if rank is not None else '*'} in "
                            f"{a.path if not in_a else b.path}")
        (sa, ra), (sb, rb) = in_a[0], in_b[0]
        notes.append(f"no step and rank in both dumps: step {sa} rank {ra} of {la} checked "
                     f"against step {sb} rank {rb} of {lb}")
    return sa, sb, ra, rb, notes


def _other_ranks(a: Dump, b: Dump, step: int, rank: int) -> List[int]:
    """The ranks besides `rank` both dumps hold at `step`."""
    return [r for r in sorted(set(a.ranks) & set(b.ranks))
            if r != rank and a.files(step, r) and b.files(step, r)]


def _merge_rank(checker: Checker, other: Checker, rank: int) -> None:
    """The findings and layer-setting differences of another rank's check that the first
    rank's did not find, named by that rank."""
    other.run()
    known = {(f["kind"], f["message"]) for f in checker.findings}
    for finding in other.findings:
        if (finding["kind"], finding["message"]) not in known:
            known.add((finding["kind"], finding["message"]))
            checker.findings.append({**finding, "message": f"rank {rank}: {finding['message']}",
                                     "rank": rank})
    settings = {str(d.as_dict()) for d in checker.setting_diffs}
    checker.setting_diffs.extend(d for d in other.setting_diffs
                                 if str(d.as_dict()) not in settings)


def _open(path_or_dump: Any) -> Tuple[Dump, bool]:
    if isinstance(path_or_dump, Dump):
        return path_or_dump, False
    return open_dump(path_or_dump), True


def incomplete_findings(sides: Any) -> List[Dict[str, Any]]:
    """High findings for checked or compared steps that are not whole (`Dump.warnings`):
    `sides` is (label, dump, {(step, rank), ...}) per side."""
    return [{"severity": "high", "kind": "incomplete", "a": None, "b": None,
             "message": f"{label}: {warning}; only what it holds is compared"}
            for label, dump, pairs in sides for warning in dump.warnings(pairs)]


def check_dumps(a: Any, b: Any, step: Optional[int] = None, rank: Optional[int] = None,
                labels: Tuple[str, str] = ("A", "B")) -> Dict[str, Any]:
    """Set-up differences between two dumps (paths or open `Dump`s), ranked high first:
    `{"findings": [{"severity", "kind", "message", "a", "b", ...}], "notes", "unchecked"
    (the notes of checks that could not run), "counts", "a", "b"}`."""
    da, own_a = _open(a)
    try:
        db, own_b = _open(b)
    except Exception:
        if own_a:
            da.close()
        raise
    try:
        sa, sb, ra, rb, notes = _choose(da, db, step, rank, labels)
        ranks = [ra] + (_other_ranks(da, db, sa, ra) if rank is None and (sa, ra) == (sb, rb)
                        else [])
        unread: List[str] = []
        for k, first in enumerate(ranks):   # a rank whose file cannot be read: the next one
            try:
                run_a, run_b = _Run(da, labels[0], sa, first), \
                    _Run(db, labels[1], sb, first if k else rb)
                checker = Checker(run_a, run_b)
                checker.run()
                break
            except DumpError as exc:
                if k == len(ranks) - 1:
                    raise
                unread.append(f"step {sa} rank {first} not checked: {exc}")
        ra, rb = first, (first if k else rb)
        for other in ranks[k + 1:]:    # what differs on another rank only (its batch, a layer)
            try:
                _merge_rank(checker, Checker(_Run(da, labels[0], sa, other),
                                              _Run(db, labels[1], sb, other)), other)
            except DumpError as exc:
                unread.append(f"step {sa} rank {other} not checked: {exc}")
            finally:    # the files of many ranks are not held open (those keeping a copy are)
                da.release(sa, other, unless_kept=True, forget=True)
                db.release(sb, other, unless_kept=True, forget=True)
        checker.notes.extend(unread)    # a compare names them itself (step_unread)
        ranks = ranks[k:]
        checker.findings.extend(incomplete_findings(
            ((labels[0], da, {(sa, r) for r in ranks} | {(sa, ra)}),
             (labels[1], db, {(sb, r) for r in ranks} | {(sb, rb)}))))
        order = {kind: i for i, kind in enumerate(_KIND_ORDER)}
        findings = sorted(checker.findings, key=lambda f: (SEVERITIES.index(f["severity"])
                                                           if f["severity"] in SEVERITIES else 1,
                                                           order.get(f["kind"], len(order))))
        counts = {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITIES}
        return {"findings": findings, "notes": notes + checker.notes,
                "unchecked": checker.unchecked, "counts": counts,
                "layer_settings": [d.as_dict() for d in checker.setting_diffs],
                "a": {"path": da.path, "framework": run_a.framework, "step": sa, "rank": ra,
                      "label": labels[0], "manifest": run_a.manifest is not None},
                "b": {"path": db.path, "framework": run_b.framework, "step": sb, "rank": rb,
                      "label": labels[1], "manifest": run_b.manifest is not None}}
    finally:
        if own_a:
            da.close()
        if own_b:
            db.close()


def step_optimizer_findings(a: Dump, b: Dump, step: int, rank: int,
                            labels: Tuple[str, str] = ("A", "B")
                            ) -> Optional[List[Dict[str, Any]]]:
    """The optimizer findings of one step, from the settings that step used (its step files),
    or None when either dump does not hold them for that step (then only run.json's are
    known, which `check_dumps` compares)."""
    run_a, run_b = _Run(a, labels[0], step, rank), _Run(b, labels[1], step, rank)
    if run_a.step_optimizers is None or run_b.step_optimizers is None:
        return None
    checker = Checker(run_a, run_b)
    checker.optimizers()
    return checker.findings


def format_check(result: Dict[str, Any]) -> str:
    lines = []
    for side in ("a", "b"):
        info = result[side]
        lines.append(f"{info['label']}  {info['path']} ({info['framework'] or '?'}, step "
                     f"{info['step']} rank {info['rank']})")
    findings = result["findings"]
    if not findings:
        lines.append("no set-up difference found")
    else:
        counts = result["counts"]
        lines.append(f"{len(findings)} set-up difference(s): " +
                     ", ".join(f"{counts[s]} {s}" for s in SEVERITIES if counts.get(s)))
        for f in findings:
            lines.append(f"[{f['severity']}] {f['kind']}: {f['message']}")
    for note in result["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def check_main(args: Any) -> int:
    """`precdbg check A B [--json F]`: 0 no finding, 1 findings (2 via PrecdbgError)."""
    result = check_dumps(args.a, args.b, step=getattr(args, "step", None),
                         rank=getattr(args, "rank", None))
    sys.stdout.write(format_check(result))
    if getattr(args, "json", None):
        try:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(result, handle, indent=1, default=str)
        except OSError as exc:
            raise DumpError(f"{args.json}: cannot write JSON ({exc.strerror or exc})") from None
    return 1 if result["findings"] else 0
