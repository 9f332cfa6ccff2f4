"""Configuration without a framework: keywords, JSON and YAML files, msprobe config.json, and
one-line `ConfigError`s that name the key (or the file). Moved from tests/test_config.py, which
keeps what needs the PyTorch debugger."""
from __future__ import annotations

import glob
import json
import os

import pytest

from precdbg import ConfigError, PrecdbgError, load_config
from precdbg.records.schema import DataMode, Level, SummaryMode, Task

from conftest import BAD_KEYWORDS, REPO
from conftest import config_error as _error, write_config_file as _write


MSPROBE = {
    "task": "statistics",
    "dump_path": "/tmp/msprobe_dump",
    "rank": [],
    "step": [0, 2],
    "level": "L1",
    "enable_dataloader": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    "tensor": {"scope": [], "list": [], "data_mode": ["all"], "file_format": "npy"},
    "overflow_check": {"overflow_nums": 1, "check_mode": "all"},
    "run_ut": {"white_list": [], "black_list": [], "error_data_path": "./"},
}


# ----------------------------------------------------------------------------- keywords
def test_defaults():
    cfg = load_config()
    assert cfg.task is Task.STATISTICS
    assert cfg.level is Level.MIX
    assert cfg.step == [] and cfg.rank == []
    assert cfg.data_mode == [DataMode.ALL]
    assert cfg.summary_mode is SummaryMode.STATISTICS
    assert cfg.include_optimizer is False


@pytest.mark.parametrize("alias,level", [("L0", Level.MODULE), ("l0", Level.MODULE),
                                         ("L1", Level.API), ("l1", Level.API),
                                         ("module", Level.MODULE), ("api", Level.API),
                                         ("mix", Level.MIX), ("MIX", Level.MIX)])
def test_level_aliases(alias, level):
    assert load_config(level=alias).level is level


def test_task_overflow_check_alias():
    assert load_config(task="overflow_check").task is Task.OVERFLOW


@pytest.mark.parametrize("value,expected", [
    (["2-4"], [2, 3, 4]),
    ([0, "2-4", 9], [0, 2, 3, 4, 9]),
    ("5-6", [5, 6]),
    (7, [7]),
    (["3", 1], [1, 3]),
    ([" 1 - 2 "], [1, 2]),
    ([4, "3-5"], [3, 4, 5]),
])
def test_step_ranges(value, expected):
    assert load_config(step=value).step == expected
    assert load_config(rank=value).rank == expected


@pytest.mark.parametrize("value", [["4-2"], [-1], ["a"], [True], [1.5], {"a": 1}])
def test_bad_step_names_the_key(value):
    message = _error(load_config, step=value)
    assert "step" in message


@pytest.mark.parametrize("key", ["step", "rank"])
def test_a_huge_range_is_a_one_line_error_not_a_list_of_billions(key):
    """A range of 10^12 steps was expanded into a list (10 GB for 10^8, MemoryError beyond)."""
    message = _error(load_config, **{key: ["0-999999999999"]})
    assert f"{key}: range '0-999999999999'" in message and "\n" not in message
    assert "an empty list ([]) selects every" in message
    assert len(load_config(**{key: ["1-100000"]}).model_dump()[key]) == 100_000


def test_level_l2_is_refused_with_a_reason():
    message = _error(load_config, level="L2")
    assert "level" in message and "L2" in message


# ----------------------------------------------------------------------------- files
def test_yaml_file(tmp_path):
    for name in ("cfg.yaml", "cfg.yml"):
        path = _write(tmp_path / name, "task: overflow\nlevel: L1\nstep: [0, '2-4']\n"
                                       "list: [linear, matmul]\ninclude_optimizer: true\n")
        cfg = load_config(path)
        assert cfg.task is Task.OVERFLOW
        assert cfg.level is Level.API
        assert cfg.step == [0, 2, 3, 4]
        assert cfg.api_list == ["linear", "matmul"]
        assert cfg.include_optimizer is True


def test_empty_yaml_file_gives_defaults(tmp_path):
    assert load_config(_write(tmp_path / "empty.yaml", "")) == load_config()


def test_keyword_overrides_msprobe_file(tmp_path):
    path = _write(tmp_path / "config.json", MSPROBE)
    cfg = load_config(path, level="mix", step=[7])
    assert cfg.level is Level.MIX
    assert cfg.step == [7]


def test_invalid_yaml_names_the_file(tmp_path):
    path = _write(tmp_path / "broken.yaml", "task: [tensor\nlevel: : :\n")
    message = _error(load_config, path)
    assert path in message


def test_missing_file_names_the_file(tmp_path):
    path = str(tmp_path / "nope.json")
    assert path in _error(load_config, path)


def test_file_that_is_not_a_mapping(tmp_path):
    path = _write(tmp_path / "list.json", [1, 2])
    assert path in _error(load_config, path)


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = _write(tmp_path / "cfg.json", {"task": "tensor", "levle": "api"})
    message = _error(load_config, path)
    assert path in message and "levle" in message


def test_bad_value_in_file_names_file_and_key(tmp_path):
    path = _write(tmp_path / "cfg.yaml", "level: L7\n")
    message = _error(load_config, path)
    assert path in message and "level" in message


# ----------------------------------------------------------------------------- msprobe
def test_msprobe_config_is_accepted(tmp_path):
    path = _write(tmp_path / "config.json", MSPROBE)
    cfg = load_config(path)
    assert cfg.task is Task.STATISTICS
    assert cfg.dump_path == "/tmp/msprobe_dump"
    assert cfg.rank == []
    assert cfg.step == [0, 2]
    assert cfg.level is Level.API
    assert cfg.summary_mode is SummaryMode.STATISTICS
    assert cfg.scope == [] and cfg.scope_range == []


def test_msprobe_tensor_section_is_read(tmp_path):
    data = dict(MSPROBE, task="tensor", level="L0")
    data["tensor"] = {"scope": [], "list": ["linear"], "data_mode": ["forward"],
                      "file_format": "npy"}
    cfg = load_config(_write(tmp_path / "config.json", data))
    assert cfg.task is Task.TENSOR
    assert cfg.level is Level.MODULE
    assert cfg.api_list == ["linear"]
    assert cfg.data_mode == [DataMode.FORWARD]


def test_msprobe_selection_in_another_tasks_section_is_refused(tmp_path):
    """task tensor with its scope and list under `statistics` (and no `tensor` section): msprobe
    reads only the task's section, so the selection silently did not apply, and every tensor
    of the step would be stored. A template that carries every section, empty ones included,
    stays accepted."""
    data = {k: v for k, v in MSPROBE.items() if k not in ("statistics", "tensor")}
    data.update(task="tensor", statistics={"scope": ["blocks.1"], "list": ["softmax"]})
    message = _error(load_config, _write(tmp_path / "config.json", data))
    assert "statistics.scope: set, but the task is 'tensor', whose settings go in a 'tensor' " \
        "section" in message, message
    data["tensor"] = {"scope": [], "list": []}
    assert load_config(_write(tmp_path / "template.json", data)).task is Task.TENSOR


def test_msprobe_data_mode_in_another_tasks_section_is_refused(tmp_path):
    """The same for a data_mode or summary_mode: a forward-only md5 wish under `statistics`
    with task tensor would otherwise store every tensor of both directions."""
    data = {k: v for k, v in MSPROBE.items() if k not in ("statistics", "tensor")}
    data.update(task="tensor", statistics={"data_mode": ["forward"], "summary_mode": "md5"})
    message = _error(load_config, _write(tmp_path / "config.json", data))
    assert "statistics.data_mode: set, but the task is 'tensor'" in message, message


def test_msprobe_task_given_as_argument_reads_its_own_section(tmp_path):
    """msprobe's PrecisionDebugger(config_path, task="tensor") on a file of several sections
    applies the tensor section, not the file's task's."""
    data = dict(MSPROBE, task="statistics")
    data["statistics"] = {"scope": [], "list": ["layer_norm"], "data_mode": ["all"]}
    data["tensor"] = {"scope": [], "list": ["gelu"], "data_mode": ["forward"]}
    cfg = load_config(_write(tmp_path / "config.json", data), task="tensor")
    assert cfg.task is Task.TENSOR
    assert cfg.api_list == ["gelu"] and cfg.data_mode == [DataMode.FORWARD]


@pytest.mark.parametrize("level,ends", [
    ("L0", ["Functional.layer_norm.1.forward", "Torch.addmm.3.forward"]),
    ("L1", ["Module.blocks.0.Block.forward.0", "Module.blocks.1.Block.forward.0"]),
])
def test_msprobe_range_of_calls_the_level_does_not_record_is_refused(tmp_path, level, ends):
    data = dict(MSPROBE, level=level)
    data["statistics"] = {"scope": ends, "list": [], "data_mode": ["all"]}
    message = _error(load_config, _write(tmp_path / "config.json", data))
    assert message.startswith(f"{tmp_path / 'config.json'}: scope: {ends}: at level "), message
    assert "\n" not in message


def test_msprobe_overflow_check_section_is_read(tmp_path):
    data = dict(MSPROBE, task="overflow_check", level="L1")
    data["overflow_check"] = {"overflow_nums": 3, "check_mode": "all"}
    cfg = load_config(_write(tmp_path / "config.json", data))
    assert cfg.task is Task.OVERFLOW
    assert cfg.overflow_nums == 3


def test_msprobe_md5_summary_mode_means_checksum(tmp_path):
    data = dict(MSPROBE)
    data["statistics"] = {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "md5"}
    assert load_config(_write(tmp_path / "config.json", data)).summary_mode is \
        SummaryMode.CHECKSUM


def test_msprobe_scope_of_two_entry_names_is_a_range(tmp_path):
    first, last = "Module.blocks.0.Block.forward.0", "Functional.linear.3.forward"
    data = dict(MSPROBE, level="mix")
    data["statistics"] = {"scope": [first, last], "list": [], "data_mode": ["all"]}
    cfg = load_config(_write(tmp_path / "config.json", data))
    assert cfg.scope_range == [first, last]
    assert cfg.scope == []


def test_msprobe_scope_of_patterns_is_a_scope(tmp_path):
    data = dict(MSPROBE)
    data["statistics"] = {"scope": ["blocks.0.*"], "list": [], "data_mode": ["all"]}
    cfg = load_config(_write(tmp_path / "config.json", data))
    assert cfg.scope == ["blocks.0.*"]
    assert cfg.scope_range == []


@pytest.mark.parametrize("change,key", [
    ({"task": "free_benchmark"}, "task"),
    ({"task": "run_ut"}, "task"),
    ({"level": "L2"}, "level"),
    ({"task": "tensor", "tensor": {"file_format": "bin"}}, "file_format"),
    ({"unknown_option": 1}, "unknown_option"),
    ({"dump_pth": "/x"}, "dump_pth"),
    ({"statistics": {"scope": [], "lits": ["linear"]}}, "lits"),
    ({"statistics": {"data_mode": ["sideways"]}}, "data_mode"),
    ({"enable_dataloader": True}, "enable_dataloader"),
    ({"overflow_check": {"check_mode": "aicore"}, "task": "overflow_check"}, "check_mode"),
])
def test_msprobe_refusals_name_the_key(tmp_path, change, key):
    data = dict(MSPROBE)
    data.update(change)
    path = _write(tmp_path / "config.json", data)
    message = _error(load_config, path)
    assert key in message
    assert path in message


EXAMPLES = sorted(glob.glob(os.path.join(REPO, "config_examples", "*.*")))


@pytest.mark.skipif(not EXAMPLES, reason="no config_examples folder")
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.rsplit("/", 1)[-1])
def test_shipped_config_examples_load(path):
    cfg = load_config(path)
    assert cfg.dump_path


# ----------------------------------------------------------------------------- did you mean
@pytest.mark.parametrize("settings,expected", [
    ({"stpe": [0]}, "stpe: unknown key — did you mean step?"),
    ({"levle": "api"}, "levle: unknown key — did you mean level?"),
    ({"dump_pth": "/x"}, "dump_pth: unknown key — did you mean dump_path?"),
])
def test_unknown_key_suggests_the_closest(tmp_path, settings, expected):
    path = _write(tmp_path / "cfg.yaml", settings)
    message = _error(load_config, path)
    assert message == f"{path}: {expected}", message


def test_unknown_keyword_suggests_the_closest():
    message = _error(load_config, None, summery_mode="checksum")
    assert message == "arguments: summery_mode: unknown key — did you mean summary_mode?", message


def test_unknown_key_far_from_any_lists_the_known_ones(tmp_path):
    message = _error(load_config, _write(tmp_path / "cfg.json", {"zzzz": 1}))
    assert "did you mean" not in message and "known: " in message and "step" in message
    assert "\n" not in message


@pytest.mark.parametrize("change,expected", [
    ({"dump_pth": "/x"}, "dump_pth: unknown msprobe key — did you mean dump_path?"),
    ({"statistics": {"scope": [], "lits": ["linear"]}},
     "statistics.lits: unknown key — did you mean list? (task 'statistics')"),
])
def test_msprobe_unknown_key_suggests_the_closest(tmp_path, change, expected):
    data = dict(MSPROBE)
    data.update(change)
    path = _write(tmp_path / "config.json", data)
    assert _error(load_config, path) == f"{path}: {expected}"


def test_msprobe_unknown_statistic_suggests_the_closest(tmp_path):
    data = dict(MSPROBE)
    data["statistics"] = {"summary_mode": ["max", "mn"]}
    path = _write(tmp_path / "config.json", data)
    assert _error(load_config, path) == \
        f"{path}: statistics.summary_mode: 'mn': unknown statistic — did you mean min?"


def test_a_rank_filter_no_rank_of_the_run_passes_is_what_the_notice_names():
    """rank [1] in a one-process run: start() ran on the listed steps, the rank filter left them
    out. The notice names the rank filter (not step counting); where another rank of the run
    is listed, this rank says nothing."""
    from precdbg.capture.step_selection import StepSelection
    alone = StepSelection(load_config(step=[1, 3], rank=[1]))
    for step in range(5):
        assert not alone.selects(step, 0, 1)
    assert alone.nothing_dumped_notice(False) == (
        "precdbg: nothing was dumped: config rank is [1], and this run has rank(s) 0 to 0 only "
        "(this process is rank 0)")
    two = StepSelection(load_config(step=[1, 3], rank=[1]))
    for step in range(5):
        assert not two.selects(step, 0, 2)
    assert two.nothing_dumped_notice(False) is None
    assert two.selects(1, 1, 2)


def test_values_python_would_reject_later_are_one_line_config_errors(tmp_path):
    """Refused while the config is read, naming the key or the file, not deep inside numpy or
    the file reader: a seed outside numpy's range, a file that is no UTF-8 text, a config path
    that is no path, an msprobe scope that is no list."""
    undecodable = tmp_path / "bad.json"
    undecodable.write_bytes(b"\xff\xfe{")
    scoped = tmp_path / "msprobe.json"
    scoped.write_text(json.dumps({"task": "statistics", "level": "L1",
                                  "statistics": {"scope": 5}}))
    for kwargs, words in ((dict(seed=-1), "seed"), (dict(seed=2 ** 40), "seed"),
                          (dict(config_path=str(undecodable)), "bad.json: not a UTF-8"),
                          (dict(config_path=5), "config_path"),
                          (dict(config_path=str(scoped)), "scope")):
        with pytest.raises(ConfigError, match=words) as caught:
            load_config(**kwargs)
        assert "\n" not in str(caught.value)
    assert load_config(seed=2 ** 32 - 1).seed == 2 ** 32 - 1
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(config_path=str(tmp_path))
    assert load_config(dump_path="~/dumps").dump_path == os.path.expanduser("~/dumps")


def test_a_key_given_twice_or_a_switch_that_is_no_boolean_is_refused(tmp_path):
    """JSON and YAML parsers keep the last of two equal keys silently, so the setting a user
    reads first in the file would not be the one used; and "stack": "yes" (or "false", which
    Python reads as true) is not a switch. Both are one-line errors naming the key."""
    twice = _write(tmp_path / "twice.json", '{"task": "statistics", "step": [1], "step": [2]}')
    assert _error(load_config, twice) == f"{twice}: step: key given twice in one mapping; keep one"
    nested = _write(tmp_path / "msprobe.json", '{"task": "statistics", "level": "L1", '
                    '"statistics": {"scope": [], "list": ["linear"], "list": []}}')
    assert "list: key given twice" in _error(load_config, nested)
    yaml_twice = _write(tmp_path / "twice.yaml", "task: statistics\nlevel: mix\nlevel: api\n")
    assert _error(load_config, yaml_twice) == (
        f"{yaml_twice}: level: key given twice in one mapping (line 3); keep one")
    for key in ("stack", "include_optimizer", "deterministic"):
        for value in ("yes", "false", 1):
            path = _write(tmp_path / f"{key}.json", {key: value})
            assert _error(load_config, path) == (
                f"{path}: {key}: expected true or false, got {value!r}")
    msprobe = _write(tmp_path / "deterministic.json", dict(MSPROBE, is_deterministic="true"))
    assert "deterministic: expected true or false" in _error(load_config, msprobe)
    both = _write(tmp_path / "both.json", {"list": ["linear"], "api_list": ["gelu"]})
    assert _error(load_config, both) == f"{both}: list and api_list name the same setting; keep one"
    for key, value in (("seed", True), ("queue_mb", False), ("overflow_nums", "3")):
        path = _write(tmp_path / f"{key}.json", {key: value})
        assert _error(load_config, path) == f"{path}: {key}: expected an integer, got {value!r}"
    for key in ("dump_enable", "enable_dataloader"):
        path = _write(tmp_path / f"{key}.json", dict(MSPROBE, **{key: "false"}))
        assert _error(load_config, path) == f"{path}: {key}: expected true or false, got 'false'"
    import numpy as np
    # numpy 1 says "True (numpy.bool_)", numpy 2 "np.True_ (numpy.bool)"
    assert _error(load_config, stack=np.True_) == (
        f"arguments: stack: expected true or false, got {np.True_!r} "
        f"({type(np.True_).__module__}.{type(np.True_).__name__})")
    merged = _write(tmp_path / "merged.yaml",       # YAML merge keys still merge
                    "<<: {task: tensor, level: api}\nlevel: mix\n")
    config = load_config(merged)
    assert config.task == Task.TENSOR and config.level == Level.MIX
    yes = _write(tmp_path / "yes.yaml", "stack: no\ninclude_optimizer: yes\n")   # YAML booleans
    config = load_config(yes)
    assert config.stack is False and config.include_optimizer is True


def test_precdbg_settings_in_an_msprobe_file(tmp_path):
    """precdbg's own keys, which msprobe has none for, may sit at the top of an msprobe file."""
    data = dict(MSPROBE, stack=False, include_optimizer=True, queue_mb=64)
    cfg = load_config(_write(tmp_path / "config.json", data))
    assert cfg.stack is False and cfg.include_optimizer is True and cfg.queue_mb == 64


@pytest.mark.parametrize("text,words", [
    ("", "the file is empty"),
    ("null", "expected a mapping of settings, got NoneType"),
    ('{"data_mode": ["forwards"]}', "data_mode: 'forwards': Input should be 'all'"),
    ('{"task": "statistics", "async_dump": "yes", "statistics": {}}',
     "async_dump: expected true or false, got 'yes'"),
])
def test_config_file_mistakes_are_one_line_naming_them(tmp_path, text, words):
    path = tmp_path / "config.json"
    path.write_text(text)
    message = _error(load_config, str(path))
    assert message.startswith(f"{path}: ") and words in message, message


def test_config_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'\xef\xbb\xbf{"task": "tensor"}')     # as some Windows editors save
    assert load_config(str(path)).task is Task.TENSOR


# ----------------------------------------------------------------------------- core halves
# (tests/test_config.py checks the same through the PyTorch debugger)
def _named(message: str, where: str) -> str:
    """The key a one-line config error names: `<where>: <key>: <why>`."""
    assert message.startswith(f"{where}: "), message
    return message[len(where) + 2:].split(": ", 1)[0]


@pytest.mark.parametrize("settings,key", BAD_KEYWORDS)
def test_bad_keywords_are_config_errors_naming_the_key(settings, key):
    assert _named(_error(load_config, **settings), "arguments") == key


def test_json_file_and_keyword_overrides(tmp_path):
    path = _write(tmp_path / "cfg.json", {"task": "tensor", "level": "L0", "step": ["1-3"],
                                          "dump_path": str(tmp_path / "d"), "scope": "blocks.*"})
    cfg = load_config(path)
    assert (cfg.task, cfg.level, cfg.step, cfg.scope) == \
        (Task.TENSOR, Level.MODULE, [1, 2, 3], ["blocks.*"])
    assert cfg.dump_path == str(tmp_path / "d")
    over = load_config(path, level="mix", step=[7], dump_path=str(tmp_path / "kw"))
    assert (over.task, over.level, over.step, over.dump_path) == \
        (Task.TENSOR, Level.MIX, [7], str(tmp_path / "kw"))
    assert _named(_error(load_config, _write(tmp_path / "broken.json", '{"task": "t",, }')),
                  str(tmp_path / "broken.json"))


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_a_config_written_as_run_json_records_it_reads_back_equal(tmp_path, suffix):
    """`DumpConfig.public_dict()` (what run.json records) is itself a valid flat config, in JSON
    and in YAML, and reads back as the same configuration."""
    import yaml
    cfg = load_config(task="tensor", level="api", step=["1-3"], rank=[0], scope=["fc*"],
                      list=["linear"], data_mode=["forward"], summary_mode="md5",
                      dump_path=str(tmp_path / "dump"), seed=7, include_optimizer=True)
    public = cfg.public_dict()
    assert public["list"] == ["linear"] and public["summary_mode"] == "checksum"
    text = json.dumps(public) if suffix == "json" else yaml.safe_dump(public)
    assert load_config(_write(tmp_path / f"cfg.{suffix}", text)) == cfg


MSPROBE_KEYS = dict(MSPROBE, dump_path="/tmp/x")


@pytest.mark.parametrize("form,text,key", [
    # unknown key (a suggestion named after it), in each form
    ("json", '{"stpe": [0]}', "stpe"),
    ("yaml", "levle: api\n", "levle"),
    # a value outside the enum
    ("json", '{"task": "free_benchmark"}', "task"),
    ("yaml", "summary_mode: sha1\n", "summary_mode"),
    # a key given twice
    ("json", '{"step": [1], "step": [2]}', "step"),
    ("yaml", "level: mix\nlevel: api\n", "level"),
    # a switch that is no boolean, a count that is no integer
    ("json", '{"include_optimizer": "false"}', "include_optimizer"),
    ("yaml", "queue_mb: lots\n", "queue_mb"),
    # msprobe: another task's section holds the selection; a key of no section
    ("json", json.dumps({k: v for k, v in MSPROBE_KEYS.items() if k != "tensor"}
                        | {"task": "tensor", "statistics": {"scope": ["fc1"]}}),
     "statistics.scope"),
    ("json", json.dumps(MSPROBE_KEYS | {"statistics": {"lits": ["linear"]}}), "statistics.lits"),
    ("json", json.dumps(MSPROBE_KEYS | {"is_deterministic": "yes"}), "deterministic"),
])
def test_each_kind_of_file_mistake_is_a_config_error_naming_the_key(tmp_path, form, text, key):
    path = _write(tmp_path / f"config.{form}", text)
    message = _error(load_config, path)
    assert _named(message, path) == key


def test_an_unknown_key_names_the_closest_known_one(tmp_path):
    for given, closest in (("stpe", "step"), ("dump_pth", "dump_path"), ("levle", "level"),
                           ("summery_mode", "summary_mode")):
        message = _error(load_config, _write(tmp_path / "c.json", {given: 1}))
        words = message.replace("?", " ").split()
        assert closest in words, message


def test_json_yaml_and_msprobe_forms_of_one_setting_agree(tmp_path):
    flat = {"task": "statistics", "level": "api", "step": [0, 2], "dump_path": "/tmp/x",
            "list": ["linear"], "data_mode": ["forward"], "summary_mode": "checksum"}
    import yaml
    msprobe = dict(MSPROBE_KEYS, level="L1", step=[0, 2],
                   statistics={"scope": [], "list": ["linear"], "data_mode": ["forward"],
                               "summary_mode": "md5"})
    configs = [load_config(_write(tmp_path / "a.json", flat)),
               load_config(_write(tmp_path / "b.yaml", yaml.safe_dump(flat))),
               load_config(_write(tmp_path / "c.json", msprobe))]
    assert configs[0] == configs[1] == configs[2]

