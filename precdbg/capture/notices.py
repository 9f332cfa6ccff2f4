"""Everything precdbg says once: one facility per debugger, so a message that repeats on every
step or call (a model without hooks, training in another thread, a compiled module) is one line on
stderr, through the `precdbg` logger, however often its cause comes back.

A notice is known by a key (a short name, or a tuple naming what it is about: a module class, a
thread); `once(key, message, *args)` logs `message % args` at WARNING the first time the key is
seen and returns whether it did. Failures inside precdbg are counted and said through the same
object (`failures.FailureLog`)."""
from __future__ import annotations

import logging
from typing import Any, Hashable, Set

__all__ = ["Notices"]

log = logging.getLogger("precdbg")


class Notices:
    """The keys said so far by one debugger."""
    __slots__ = ("_said",)

    def __init__(self) -> None:
        self._said: Set[Hashable] = set()

    def once(self, key: Hashable, message: str, *args: Any) -> bool:
        """Say `message % args` (a WARNING of the `precdbg` logger) unless `key` was said."""
        if key in self._said:
            return False
        self._said.add(key)
        log.warning(message, *args)
        return True

    def said(self, key: Hashable) -> bool:
        return key in self._said

    def mark(self, key: Hashable) -> None:
        """Take `key` as said without saying anything (a notice another one made redundant)."""
        self._said.add(key)

    def __len__(self) -> int:
        return len(self._said)
