"""A structural difference found by `structure.py` (a module whose class, calls or numeric
layer settings differ between the runs), and the words that say it."""
from __future__ import annotations

import dataclasses
import difflib
from typing import Dict, List, Optional, Tuple

from ...records.layers import SettingDifference

__all__ = ["StructuralDiff"]

_SHOWN_CALLS = 8


@dataclasses.dataclass
class StructuralDiff:
    """A module whose class or calls differ; `seq` is where it starts in the baseline."""
    step: int
    rank: int
    module: str
    name_a: str
    name_b: str
    class_a: str
    class_b: str
    op: str
    calls_a: List[str]
    calls_b: List[str]
    seq: int
    order: int
    settings: List[SettingDifference] = dataclasses.field(default_factory=list)
    # (baseline, candidate) calls of the module where each made the same calls: only how
    # many times it ran differs (None otherwise)
    times: Optional[Tuple[int, int]] = None

    @property
    def class_differs(self) -> bool:
        return self.class_a != self.class_b

    @property
    def calls_differ(self) -> bool:
        return self.class_differs or self.calls_a != self.calls_b

    def reason(self) -> str:
        where = f"module '{self.module}'" if self.module else "the root module"
        parts = []
        if self.class_differs:
            parts.append(f"class {self.class_a} vs {self.class_b}")
        if self.times is not None and not self.class_differs:
            parts.append(f"it runs {self.times[0]} time(s) in the baseline and {self.times[1]} "
                         "in the candidate, making the same calls each time (the micro-batches "
                         "of a gradient accumulation, or a module called again)")
        elif self.calls_a != self.calls_b:
            parts.append(_calls_apart(self.calls_a, self.calls_b))
        what = "calls differ"
        if self.settings:
            parts.append(self.settings_text())
            what = "calls and layer settings differ" if self.calls_differ else \
                "layer settings differ"
        return (f"{what} in {where}: " + "; ".join(parts)
                + " (a structural difference: it counts whether or not the numbers stay within "
                  "tolerance)")

    def settings_text(self) -> str:
        return ", ".join(f"{d.setting} {_value(d.a)} vs {_value(d.b)}" for d in self.settings)

    def as_json(self) -> Dict[str, object]:
        return {"class_a": self.class_a, "class_b": self.class_b,
                "calls_a": self.calls_a[:50], "calls_b": self.calls_b[:50],
                "settings": [d.as_dict() for d in self.settings]}


def _value(value: object) -> str:
    from ...records.layers import format_value
    return format_value(value)


def _shown(calls: List[str]) -> str:
    if not calls:
        return "nothing"
    text = ", ".join(calls[:_SHOWN_CALLS])
    return text + (f", ... ({len(calls)} calls)" if len(calls) > _SHOWN_CALLS else "")


def _calls_apart(calls_a: List[str], calls_b: List[str]) -> str:
    """Where two call lists part: the whole lists when short, otherwise the first place they
    differ (what one run calls in addition, or instead), counting the other places."""
    if len(calls_a) <= _SHOWN_CALLS and len(calls_b) <= _SHOWN_CALLS:
        return f"the baseline calls {_shown(calls_a)}, the candidate {_shown(calls_b)}"
    places = [op for op in difflib.SequenceMatcher(None, calls_a, calls_b, autojunk=False)
              .get_opcodes() if op[0] != "equal"]
    tag, i1, i2, j1, j2 = places[0]
    after = f"after {calls_a[i1 - 1]} (call {i1} of {len(calls_a)})" if i1 else "first"
    if tag == "insert":
        text = f"the candidate also calls {_shown(calls_b[j1:j2])} {after}"
    elif tag == "delete":
        text = f"the baseline also calls {_shown(calls_a[i1:i2])} {after}"
    else:
        text = (f"{after}, the baseline calls {_shown(calls_a[i1:i2])}, the candidate "
                f"{_shown(calls_b[j1:j2])}")
    more = len(places) - 1
    return text + (f"; they differ in {more} more place(s)" if more else "") + \
        f"; {len(calls_a)} vs {len(calls_b)} calls"
