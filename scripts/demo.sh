#!/usr/bin/env bash
# The demo on a fresh machine: create .venv if missing, install precdbg (".[torch,mindspore,dev]"), then
# train the bundled GPT for 3 steps with precdbg, dump step 1 and inspect the dump.
#
#   bash scripts/demo.sh [--out DIR]       # default DIR: ./precdbg_demo
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_venv.sh
"$PY" -m precdbg_examples.demo "$@"
