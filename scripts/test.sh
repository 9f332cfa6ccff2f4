#!/usr/bin/env bash
# The test suite on a fresh machine: create .venv if missing, install precdbg (".[torch,mindspore,dev]"),
# then run pytest. Extra arguments go to pytest:
#
#   bash scripts/test.sh                    # python -m pytest -q
#   bash scripts/test.sh -k config -x       # python -m pytest -q -k config -x
#   bash scripts/test.sh tests/core         # the core suite alone (needs no framework)
#
# Everything under tests/ runs, the core suite (tests/core) included; .ci/run also runs the core
# suite in a fresh venv holding only the core dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_venv.sh
"$PY" -m pytest -q "$@"
