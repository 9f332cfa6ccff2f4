"""Names that cannot take over a terminal: control characters (C0, DEL, C1) and the Unicode
marks that reorder text (bidirectional overrides and isolates) in a name read from a dump are
shown escaped (`\\x1b`, `\\n`, `\\u202e`), so a module called "a\\x1b]0;title\\x07" or
"a\\nprecdbg: verdict: MATCH" can neither send escape sequences to a terminal nor forge a line of
a report. Applied where names are read (storage.reader, storage.msprobe_records) and, for
everything else a command prints, by the command line's output streams (precdbg.cli).
"""
from __future__ import annotations

import re

import numpy as np

__all__ = ["escape_controls", "escape_column", "has_controls_utf8"]

# what is escaped in a name; in text of several lines, the same but for newline and tab
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e"
                               "\u2066-\u2069]")
# the same characters in UTF-8 bytes, NUL (HDF5's padding of fixed-width strings) excepted
_CONTROL_UTF8 = re.compile(rb"[\x01-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xaa-\xae]"
                           rb"|\xe2\x81[\xa6-\xa9]")


def _escaped(match: "re.Match[str]") -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str, lines: bool = False) -> str:
    """`text` with every control character shown escaped; `lines`: text of several lines,
    whose newlines and tabs stay."""
    pattern = _CONTROL_IN_LINES if lines else _CONTROL
    return pattern.sub(_escaped, text) if pattern.search(text) else text


def has_controls_utf8(raw: bytes) -> bool:
    """Whether UTF-8 bytes (fixed-width strings padded with NUL) hold a control character."""
    return _CONTROL_UTF8.search(raw) is not None


def escape_column(values: np.ndarray) -> np.ndarray:
    """A column of strings with control characters escaped (the same array when none)."""
    if not values.size or not any(_CONTROL.search(v) for v in np.unique(values).tolist()):
        return values
    return np.array([escape_controls(v) for v in values.tolist()], dtype=str)
