#!/usr/bin/env bash
# The demo on a fresh machine: create .venv if missing, install precdbg (".[torch,mindspore,dev]"),
# then dump steps 0 and 1 of the bundled GPT and inspect the dump; with MindSpore installed, also
# dump its MindSpore twin and compare the two (python -m precdbg_examples.demo).
#
#   bash scripts/demo.sh [--out DIR]       # default DIR: ./precdbg_demo
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_venv.sh
"$PY" -m precdbg_examples.demo "$@"
