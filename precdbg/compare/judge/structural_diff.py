"""A structural difference found by `structure.py` (a module whose class, calls or numeric
layer settings differ between the runs), as facts (report/wording.py says it)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from ...records.layers import SettingDifference

__all__ = ["StructuralDiff"]


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

    def facts(self) -> Dict[str, object]:
        """What its words need (report/wording.py `structural_reason`): the classes, the
        calls, how many times it ran, the setting differences as (setting, a, b)."""
        return {"module": self.module, "class_a": self.class_a, "class_b": self.class_b,
                "calls_a": list(self.calls_a), "calls_b": list(self.calls_b),
                "times": self.times, "settings": self.setting_values()}

    def setting_values(self) -> List[Tuple[str, object, object]]:
        return [(d.setting, d.a, d.b) for d in self.settings]

    def as_json(self) -> Dict[str, object]:
        return {"class_a": self.class_a, "class_b": self.class_b,
                "calls_a": self.calls_a[:50], "calls_b": self.calls_b[:50],
                "settings": [d.as_dict() for d in self.settings]}
