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

import dataclasses
import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import DumpError
from ..storage.reader import Dump, RecordTable, open_dump
from .checker import Checker
from .values import _CONDITIONS, SEVERITIES, _KIND_ORDER, _Run, semantics  # noqa: F401

__all__ = ["check_dumps", "format_check", "check_main", "semantics", "step_optimizer_findings",
           "SetupCheck", "RankChecked", "check_rank"]


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


@dataclasses.dataclass
class RankChecked:
    """Another rank's check, besides the first rank's (`SetupCheck`): its findings and
    layer-setting differences, or why its files could not be read (`unread`)."""
    rank: int
    findings: List[Dict[str, Any]]
    setting_diffs: List[Any]
    unread: str = ""
    # `step_optimizer_findings` of the checked step, where the check found them on the way
    step_optimizers: Optional[List[Dict[str, Any]]] = None


def check_rank(da: Dump, db: Dump, step_a: int, step_b: int, rank: int,
               labels: Tuple[str, str], tables: Optional[Tuple[RecordTable, RecordTable]] = None
               ) -> RankChecked:
    """The check of one more rank (`SetupCheck.others`): what a compare runs where it reads
    that rank's files, so that they are read once (`tables`: both sides' records, read by the
    compare; the check only reads them)."""
    ta, tb = tables if tables is not None else (None, None)
    try:
        other = Checker(_Run(da, labels[0], step_a, rank, ta),
                        _Run(db, labels[1], step_b, rank, tb))
        other.run()
    except DumpError as exc:
        return RankChecked(rank, [], [], f"step {step_a} rank {rank} not checked: {exc}")
    return RankChecked(rank, other.findings, other.setting_diffs,
                       step_optimizers=other.step_optimizer_findings)


def _merge_rank(findings: List[Dict[str, Any]], setting_diffs: List[Any],
                other: RankChecked) -> None:
    """The findings and layer-setting differences of another rank's check that the ranks
    merged before did not find, named by that rank."""
    known = {(f["kind"], f["message"]) for f in findings}
    for finding in other.findings:
        if (finding["kind"], finding["message"]) not in known:
            known.add((finding["kind"], finding["message"]))
            findings.append({**finding, "message": f"rank {other.rank}: {finding['message']}",
                             "rank": other.rank})
    settings = {str(d.as_dict()) for d in setting_diffs}
    setting_diffs.extend(d for d in other.setting_diffs if str(d.as_dict()) not in settings)


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


class SetupCheck:
    """The check of two open dumps in the parts a compare runs apart: the first (step, rank)
    both hold, checked when this is made (a rank whose files cannot be read: the next one);
    each other rank of that step (`others`: `check_rank`, where a compare reads that rank);
    and `result`, every rank merged in rank order."""

    def __init__(self, da: Dump, db: Dump, step: Optional[int], rank: Optional[int],
                 labels: Tuple[str, str]) -> None:
        self.da, self.db, self.labels = da, db, labels
        sa, sb, ra, rb, self.choice_notes = _choose(da, db, step, rank, labels)
        ranks = [ra] + (_other_ranks(da, db, sa, ra) if rank is None and (sa, ra) == (sb, rb)
                        else [])
        self.unread: List[str] = []
        for k, first in enumerate(ranks):   # a rank whose file cannot be read: the next one
            try:
                self.run_a, self.run_b = _Run(da, labels[0], sa, first), \
                    _Run(db, labels[1], sb, first if k else rb)
                self.checker = Checker(self.run_a, self.run_b)
                self.checker.run()
                break
            except DumpError as exc:
                if k == len(ranks) - 1:
                    raise
                self.unread.append(f"step {sa} rank {first} not checked: {exc}")
        for run in (self.run_a, self.run_b):   # its records: the compare's (the files keep
            vars(run).pop("table", None)        # a copy for it), not held through every rank
        self.step_a, self.step_b = sa, sb
        self.rank_a, self.rank_b = first, (first if k else rb)
        self.others: List[int] = ranks[k + 1:]

    def check_others(self) -> List[RankChecked]:
        """`check_rank` of every other rank, here and now (`precdbg check`)."""
        checked = []
        for other in self.others:
            try:
                checked.append(check_rank(self.da, self.db, self.step_a, self.step_b, other,
                                          self.labels))
            finally:    # the files of many ranks are not held open (those keeping a copy are)
                self.da.release(self.step_a, other, unless_kept=True, forget=True)
                self.db.release(self.step_b, other, unless_kept=True, forget=True)
        return checked

    def result(self, checked: Sequence[RankChecked]) -> Dict[str, Any]:
        """The check's result, the other ranks' checks (`checked`, in rank order) merged:
        `{"findings": [{"severity", "kind", "message", "a", "b", ...}], "notes", "unchecked"
        (the notes of checks that could not run), "counts", "layer_settings", "a", "b"}`."""
        checker, labels = self.checker, self.labels
        findings, setting_diffs = list(checker.findings), list(checker.setting_diffs)
        for other in checked:      # what differs on another rank only (its batch, a layer)
            _merge_rank(findings, setting_diffs, other)
        unread = self.unread + [other.unread for other in checked if other.unread]
        sa, sb, ra, rb = self.step_a, self.step_b, self.rank_a, self.rank_b
        ranks = [ra] + list(self.others)
        findings.extend(incomplete_findings(
            ((labels[0], self.da, {(sa, r) for r in ranks}),
             (labels[1], self.db, {(sb, r) for r in ranks} | {(sb, rb)}))))
        order = {kind: i for i, kind in enumerate(_KIND_ORDER)}
        findings = sorted(findings, key=lambda f: (SEVERITIES.index(f["severity"])
                                                   if f["severity"] in SEVERITIES else 1,
                                                   order.get(f["kind"], len(order))))
        counts = {s: sum(1 for f in findings if f["severity"] == s) for s in SEVERITIES}
        # the notes of the checks that could not read a rank: a compare names them itself
        return {"findings": findings, "notes": self.choice_notes + checker.notes + unread,
                "unchecked": checker.unchecked, "counts": counts,
                "layer_settings": [d.as_dict() for d in setting_diffs],
                "a": {"path": self.da.path, "framework": self.run_a.framework, "step": sa,
                      "rank": ra, "label": labels[0],
                      "manifest": self.run_a.manifest is not None},
                "b": {"path": self.db.path, "framework": self.run_b.framework, "step": sb,
                      "rank": rb, "label": labels[1],
                      "manifest": self.run_b.manifest is not None}}


def check_dumps(a: Any, b: Any, step: Optional[int] = None, rank: Optional[int] = None,
                labels: Tuple[str, str] = ("A", "B")) -> Dict[str, Any]:
    """Set-up differences between two dumps (paths or open `Dump`s), ranked high first
    (`SetupCheck.result`), every rank of the checked step checked."""
    da, own_a = _open(a)
    try:
        db, own_b = _open(b)
    except Exception:
        if own_a:
            da.close()
        raise
    try:
        check = SetupCheck(da, db, step, rank, labels)
        return check.result(check.check_others())
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
