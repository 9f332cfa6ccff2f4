"""precdbg.capture.call_stacks: the C walk (`_frames.key`) and the Python walk name the same user frames."""
from __future__ import annotations

import os
import sys

import pytest

from precdbg.capture import call_stacks as stacks
from precdbg.capture.call_stacks import StackCache, StackTable

_frames = pytest.importorskip("precdbg.capture._frames")
pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="the C walk needs 3.11")

_THIS = os.path.abspath(__file__)


def _inner(table: StackTable, depth: int):
    here = sys._getframe(0)
    return (_frames.key(depth, table._internal, stacks._DEPTH),
            table._walk(sys._getframe(depth))[1], table.current(depth), here)


def _outer(table: StackTable, depth: int):
    return _inner(table, depth)


def test_the_c_walk_returns_the_python_walks_key_once_every_code_is_known() -> None:
    table = StackCache(skip=(os.path.dirname(stacks.__file__) + os.sep,)).window()
    answers = [_outer(table, 0) for _ in range(2)]
    assert answers[0][0] is None         # _inner's and _outer's code were not classified yet
    key, walked, again, _ = answers[1]
    # the first frame (_inner) is at another instruction for each of the two walks
    assert key[0] == walked[0] and key[2:] == walked[2:] and len(key) == 2 * stacks._DEPTH
    assert again == answers[0][2]        # the same call site: the same stack id
    assert len(table.texts) == 1
    assert key[0] == id(_inner.__code__) and key[2] == id(_outer.__code__)


def test_internal_frames_are_skipped_and_depth_counts_from_the_caller() -> None:
    table = StackCache(skip=(_THIS,)).window()    # this file's frames are "framework" code
    _outer(table, 1)
    key, walked, sid, _ = _outer(table, 1)
    assert key == walked                 # the first user frame is the test's, at one instruction
    assert id(_inner.__code__) not in key[0::2] and id(_outer.__code__) not in key[0::2]
    assert "test_stack_table" not in table.texts[sid]


def test_call_sites_on_other_lines_get_other_ids() -> None:
    table = StackCache(skip=()).window()
    ids = set()
    for _ in range(2):
        ids.add(_outer(table, 0)[2])
        ids.add(_outer(table, 0)[2])
    assert len(ids) == 2                 # two lines in the loop, each seen twice
    assert len(table.texts) == 2


def test_bad_arguments_raise_instead_of_crashing() -> None:
    with pytest.raises(ValueError):
        _frames.key(0, {}, 1000)
    with pytest.raises(TypeError):
        _frames.key(0, [], 3)
    code = sys._getframe(0).f_code
    with pytest.raises(TypeError):
        _frames.key(0, {id(code): "not a pair"}, 3)


def test_a_new_window_numbers_stacks_again_without_walking_known_ones() -> None:
    cache = StackCache(skip=(os.path.dirname(stacks.__file__) + os.sep,))
    table = cache.window()

    def no_walk(frame):
        raise AssertionError("a stack met in an earlier window was walked in Python again")

    seen = []
    for window in range(2):
        if window:
            table = cache.window()
            assert table.texts == []
            table._walk = no_walk
        seen.append(([table.current(1) for _ in range(2)], list(table.texts)))
    assert seen[0] == seen[1] and seen[0][0] == [0, 0] and len(seen[0][1]) == 1
