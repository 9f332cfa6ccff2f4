"""What the core suite runs on: the core imports no framework at run time, and where .ci/run
runs this suite in its environment of the core dependencies only (PRECDBG_CORE_ONLY=1), no
framework is installed there and the precdbg tested is the one installed, not the checkout."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import precdbg

from conftest import REPO

FRAMEWORKS = ("torch", "torch_npu", "mindspore", "triton", "precdbg_pt", "precdbg_ms",
              "precdbg_examples")
CORE_ONLY = os.environ.get("PRECDBG_CORE_ONLY") == "1"


def test_reading_comparing_checking_and_scanning_import_no_framework(tmp_path):
    code = (
        "import json, sys\n"
        "import precdbg, precdbg.cli, precdbg.config, precdbg.storage, precdbg.compare\n"
        "import precdbg.check, precdbg.scan, precdbg.weights, precdbg.capture\n"
        "from precdbg.storage.writer import DumpWriter\n"
        "from precdbg.compare.report import formats, html\n"
        f"found = sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r})\n"
        "print(json.dumps(found))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.skipif(not CORE_ONLY, reason="only in .ci/run's environment of the core "
                    "dependencies (PRECDBG_CORE_ONLY=1)")
def test_the_core_environment_holds_no_framework_and_the_installed_precdbg():
    for name in ("torch", "mindspore", "transformers"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed here"
    installed = os.path.realpath(os.path.dirname(precdbg.__file__))
    assert not installed.startswith(os.path.realpath(REPO) + os.sep), \
        f"precdbg imported from the checkout ({installed}), not from the installed package"
    assert installed.startswith(os.path.realpath(sys.prefix) + os.sep), installed
