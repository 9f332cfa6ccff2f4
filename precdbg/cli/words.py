"""What the command says when the user's input is not what it expects: the closest names (a
subcommand, a dump folder, an entry) and a damaged step file in the user's words."""
from __future__ import annotations

import difflib
import os
import re
from typing import Iterable, List, Optional, Sequence

from ..errors import DumpError

__all__ = ["closest", "existing_dump", "user_words", "same_dump"]

# the reader's words for a step file h5py cannot read (storage/reader.py): the path, then
# HDF5's own message, which may hold one level of parentheses of its own
_UNREADABLE = re.compile(r"(\S+): not a readable HDF5 step file \(((?:[^()]|\([^()]*\))*)\)")


def closest(word: str, names: Iterable[str], n: int = 1, cutoff: float = 0.6) -> List[str]:
    """The names most like `word` (difflib), best first; none when nothing is close."""
    return difflib.get_close_matches(word, sorted(set(names)), n=n, cutoff=cutoff)


def existing_dump(path: str) -> None:
    """A DumpError naming the closest sibling of a dump path that does not exist
    (`dump_nope: no such dump; did you mean dump_clean?`)."""
    if os.path.exists(path):
        return
    folder, name = os.path.split(os.path.normpath(path))
    try:
        siblings = [entry for entry in os.listdir(folder or ".")
                    if os.path.isdir(os.path.join(folder or ".", entry))
                    or entry.endswith(".h5")]
    except OSError:
        siblings = []
    match = closest(name, siblings)
    hint = f"; did you mean {os.path.join(folder, match[0])}?" if match else ""
    raise DumpError(f"{path}: no such dump{hint}")


def user_words(text: str) -> str:
    """A message with HDF5's description of an unreadable step file (`sblock->base_addr`,
    `stored_eof`) replaced by what it means to the user."""
    def said(match: "re.Match[str]") -> str:
        path, detail = match.group(1), match.group(2)
        if "signature" in detail:
            return f"{path} is not an HDF5 file (not a step file precdbg wrote, or overwritten)"
        return (f"step file {path} is truncated or damaged (HDF5 could not read it): "
                "re-run the dump")
    return _UNREADABLE.sub(said, text)


def same_dump(paths: Sequence[str]) -> Optional[str]:
    """The real path both sides share when two inputs are one dump; None otherwise."""
    real = {os.path.realpath(p) for p in paths}
    return real.pop() if len(real) == 1 else None
