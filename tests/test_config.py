"""Configuration as the PyTorch debugger takes it: keywords and files reach `PrecisionDebugger`, its
errors are the config's, and the config is recorded in run.json. The configuration itself
(keywords, JSON and YAML files, msprobe config.json, one-line errors naming the key or the file)
is tested without a framework in tests/core/test_core_config.py."""
from __future__ import annotations

import json

import pytest

import precdbg
from precdbg import ConfigError, PrecdbgError, load_config
from precdbg.records.schema import DataMode, Level, SummaryMode, Task
from precdbg_pt import PrecisionDebugger
from conftest import BAD_KEYWORDS
from conftest import config_error as _error, write_config_file as _write


# ----------------------------------------------------------------------------- keywords
def test_keyword_config_reaches_the_debugger(tmp_path):
    dbg = PrecisionDebugger(task="tensor", level="api", dump_path=str(tmp_path), step=[3, 1],
                            rank=0, scope=["blocks.0.*"], list=["linear"],
                            data_mode=["forward"], summary_mode="md5")
    cfg = dbg.config
    assert cfg.task is Task.TENSOR
    assert cfg.level is Level.API
    assert cfg.dump_path == str(tmp_path)
    assert cfg.step == [1, 3]
    assert cfg.rank == [0]
    assert cfg.scope == ["blocks.0.*"]
    assert cfg.api_list == ["linear"]
    assert cfg.data_mode == [DataMode.FORWARD]
    assert cfg.summary_mode is SummaryMode.CHECKSUM
    assert dbg.dump_path == str(tmp_path)
    dbg.close()


@pytest.mark.parametrize("settings,key", BAD_KEYWORDS)
def test_bad_keywords_name_the_key(settings, key):
    """The debugger raises load_config's error (tests/core) before touching torch."""
    assert key in _error(PrecisionDebugger, **settings)


# ----------------------------------------------------------------------------- files
def test_json_file(tmp_path):
    path = _write(tmp_path / "cfg.json", {"task": "tensor", "level": "L0", "step": ["1-3"],
                                          "dump_path": str(tmp_path / "d"), "scope": "blocks.*"})
    cfg = load_config(path)
    assert cfg.task is Task.TENSOR
    assert cfg.level is Level.MODULE
    assert cfg.step == [1, 2, 3]
    assert cfg.dump_path == str(tmp_path / "d")
    assert cfg.scope == ["blocks.*"]
    dbg = PrecisionDebugger(config_path=path)
    assert dbg.config == cfg
    dbg.close()


def test_keyword_overrides_file(tmp_path):
    path = _write(tmp_path / "cfg.json", {"task": "tensor", "level": "api", "step": [1],
                                          "dump_path": "from_file"})
    cfg = load_config(path, level="module", dump_path=str(tmp_path / "kw"), step=["5-6"])
    assert cfg.level is Level.MODULE
    assert cfg.dump_path == str(tmp_path / "kw")
    assert cfg.step == [5, 6]
    assert cfg.task is Task.TENSOR          # not overridden: the file's value stays
    dbg = PrecisionDebugger(config_path=path, level="L0")
    assert dbg.config.level is Level.MODULE and dbg.config.task is Task.TENSOR
    dbg.close()


def test_invalid_json_names_the_file(tmp_path):
    path = _write(tmp_path / "broken.json", '{"task": "tensor",, }')
    message = _error(load_config, path)
    assert path in message
    assert "JSON" in message
    assert path in _error(PrecisionDebugger, config_path=path)


def test_config_is_recorded_in_run_json(tmp_path):
    import torch
    dbg = PrecisionDebugger(task="statistics", level="L1", dump_path=str(tmp_path), step=[0],
                            list=["linear"])
    lin = torch.nn.Linear(3, 2)
    with dbg.capture(lin):
        lin(torch.ones(1, 3))
    dbg.close()
    run = precdbg.open_dump(str(tmp_path)).run
    assert run["config"]["level"] == "api"
    assert run["config"]["list"] == ["linear"]
    assert run["config"]["step"] == [0]
    assert run["framework"] == "pytorch"
    assert run["schema_version"] == precdbg.records.schema.SCHEMA_VERSION
