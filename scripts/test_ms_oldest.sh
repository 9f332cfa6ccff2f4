#!/usr/bin/env bash
# The MindSpore tests (tests/test_ms_*.py) on the oldest MindSpore precdbg_ms supports, 2.7.1
# (scripts/test.sh runs them on the newest, the `mindspore` extra's 2.10). .ci/run calls this
# after scripts/test.sh. Extra arguments go to pytest:
#
#   bash scripts/test_ms_oldest.sh              # pytest -q tests/test_ms_*.py
#   bash scripts/test_ms_oldest.sh -k recompute
#
# Creates (if missing) a venv at <repo>/.venv-ms27 holding mindspore==2.7.1, numpy<2, pytest and
# precdbg's core dependencies (pyproject.toml's [project] dependencies), and no torch: the tests
# that compare with PyTorch skip there, saying so. precdbg is not installed into it: the tests
# import it from the checkout (PYTHONPATH), with any C extension scripts/test.sh built there.
#
# Environment:
#   PYTHON=/path/to/python3    interpreter for a new venv (default: the first of python3,
#                              python3.11, python3.10 on PATH that is 3.10 or 3.11: MindSpore
#                              2.7.1 has wheels up to 3.11, precdbg needs 3.10+)
#   PRECDBG_MS27_VENV=DIR      where the venv lives (default: <repo>/.venv-ms27)
# Re-running is cheap: the install is redone only when pyproject.toml or this script changed, or
# an import fails (a stamp in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="${PRECDBG_MS27_VENV:-$ROOT/.venv-ms27}"
MINDSPORE="mindspore==2.7.1"

if [ ! -x "$VENV/bin/python" ]; then
    # shellcheck source=scripts/find_python.sh
    source "$ROOT/scripts/find_python.sh"
    found="$(find_python 10 11)" || {
        if [ -n "${PYTHON:-}" ] && command -v "$PYTHON" >/dev/null 2>&1; then
            echo "ms-oldest: PYTHON=$PYTHON is $("$PYTHON" --version 2>&1); need 3.10 or 3.11" >&2
        else
            echo "ms-oldest: no python3.10 or python3.11 found (MindSpore 2.7.1 has wheels up to" \
                 "3.11); install one, or set PYTHON=/path/to/python3.11" >&2
        fi
        exit 1
    }
    echo "ms-oldest: creating $VENV with $found ($("$found" --version 2>&1))"
    "$found" -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.precdbg-ms27-install"
want="$(cat pyproject.toml scripts/test_ms_oldest.sh | "$PY" -c \
    'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ] || ! "$PY" -c 'import mindspore, numpy, h5py, pydantic, yaml, xxhash, ml_dtypes, pytest' \
        >/dev/null 2>&1; then
    # the core dependencies, read from pyproject.toml (tomllib is 3.11+: a plain reading of the
    # one list otherwise)
    mapfile -t core < <("$PY" - <<'PYEOF'
import re
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    deps = tomllib.loads(text)["project"]["dependencies"]
except ImportError:
    block = re.search(r"^\[project\].*?^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    deps = re.findall(r'^\s*"([^"]+)"', block, re.M)
print("\n".join(deps))
PYEOF
)
    if [ "${#core[@]}" -eq 0 ]; then
        echo "ms-oldest: no [project] dependencies read from pyproject.toml" >&2
        exit 1
    fi
    echo "ms-oldest: pip install $MINDSPORE numpy<2 pytest ${core[*]} into $VENV"
    began=$SECONDS
    "$PY" -m pip install --quiet --progress-bar off "$MINDSPORE" "numpy<2" "pytest>=7" "${core[@]}"
    echo "$want" > "$STAMP"
    echo "ms-oldest: installed in $((SECONDS - began)) s"
fi
echo "ms-oldest: $("$PY" -c 'import sys, mindspore, numpy; print("python", sys.version.split()[0], "| mindspore", mindspore.__version__, "| numpy", numpy.__version__)') ($VENV)"
began=$SECONDS
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_ms_*.py "$@"
echo "ms-oldest: tests passed in $((SECONDS - began)) s"
