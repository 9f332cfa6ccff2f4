"""ClassPatch (precdbg.capture.instrumentor): what two debuggers of one process patching the
same attribute leave behind, whatever order they stop in."""
from __future__ import annotations

from precdbg.capture.instrumentor import ClassPatch


class _Owner:
    def run(self) -> str:
        return "original"


class _Child(_Owner):
    pass


def _wrap(tag):
    return lambda original: (lambda self: f"{tag}({original(self)})")


def test_patches_removed_in_the_order_applied_restore_the_original():
    """Debugger A patches, then B: A stops first (its windows opened first and closed first).
    B's wrapper keeps working until B stops; then the class is as it was."""
    original = vars(_Owner)["run"]
    a = ClassPatch(_Owner, "run", _wrap("a"))
    b = ClassPatch(_Owner, "run", _wrap("b"))
    assert _Owner().run() == "b(a(original))"
    a.remove()
    assert _Owner().run() == "b(a(original))"      # A's wrapper stays until B's is gone
    b.remove()
    assert vars(_Owner)["run"] is original         # the very same object
    a.remove()                                     # repeated: nothing changes
    b.remove()
    assert vars(_Owner)["run"] is original


def test_patches_removed_in_reverse_order_restore_at_each_step():
    a = ClassPatch(_Owner, "run", _wrap("a"))
    b = ClassPatch(_Owner, "run", _wrap("b"))
    b.remove()
    assert _Owner().run() == "a(original)"
    a.remove()
    assert _Owner().run() == "original"


def test_an_inherited_attribute_shows_through_again():
    a = ClassPatch(_Child, "run", _wrap("a"))
    b = ClassPatch(_Child, "run", _wrap("b"))
    assert "run" in vars(_Child)
    a.remove()
    b.remove()
    assert "run" not in vars(_Child) and _Child().run() == "original"
