#!/usr/bin/env bash
# Create (if missing) the project's virtualenv and install precdbg into it with the torch and dev
# extras: `pip install -e ".[torch,mindspore,dev]"` (torch==2.13.0 is pinned in pyproject.toml).
# Needs only python3 (3.10+: torch 2.13 has no wheels for older Pythons) with pip and venv.
#
#   bash scripts/setup_venv.sh            # create/update .venv
#   source scripts/setup_venv.sh          # the same, then $PY is the venv's python
#
# Environment:
#   PYTHON=/path/to/python3   interpreter to create the venv with (default: the first of python3,
#                             python3.13 .. python3.10 on PATH that is 3.10 or newer)
#   PRECDBG_VENV=DIR          where the venv lives (default: <repo>/.venv)
# Re-running is cheap: the install is redone only when pyproject.toml or a C source changed, or
# an import fails (the install is editable, so Python source changes need no reinstall).
# pip's output (and the build backend's warnings) is shown only when the install fails.

# Run a command with its output kept aside: shown (and its file named) only when it fails.
_precdbg_quietly() {
    local what=$1 log
    shift
    log="$(mktemp "${TMPDIR:-/tmp}/precdbg-setup.XXXXXX")" || return 1
    if "$@" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    cat "$log" >&2
    echo "setup: $what failed (its output above, kept in $log)" >&2
    return 1
}

_precdbg_setup() {
    local root venv stamp want have found="" version
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="${PRECDBG_VENV:-$root/.venv}"

    if [ ! -x "$venv/bin/python" ]; then
        if [ -n "${PYTHON:-}" ] && ! command -v "$PYTHON" >/dev/null 2>&1; then
            echo "setup: PYTHON=$PYTHON: no such interpreter" >&2
            return 1
        fi
        # shellcheck source=scripts/find_python.sh
        source "$root/scripts/find_python.sh"
        found="$(find_python 10 99)" || {
            if [ -n "${PYTHON:-}" ] && command -v "$PYTHON" >/dev/null 2>&1; then
                echo "setup: PYTHON=$PYTHON is $("$PYTHON" --version 2>&1); need 3.10 or newer" >&2
            else
                echo "setup: no python3 of version 3.10 or newer found (torch 2.13 needs 3.10+);" \
                     "install one, or set PYTHON=/path/to/python3" >&2
            fi
            return 1
        }
        echo "setup: creating $venv with $found ($("$found" --version 2>&1))"
        if ! "$found" -m venv "$venv"; then
            echo "setup: '$found -m venv' failed; on Debian/Ubuntu install the python3-venv" \
                 "package (apt-get install python3-venv)" >&2
            rm -rf "$venv"
            return 1
        fi
        # an old bundled pip cannot do editable installs from pyproject.toml (PEP 660)
        if ! _precdbg_quietly "upgrading pip" "$venv/bin/python" -m pip install --quiet \
                --upgrade "pip>=23"; then
            rm -rf "$venv"
            return 1
        fi
    fi

    PY="$venv/bin/python"
    stamp="$venv/.precdbg-install"
    # what the install depends on: pyproject.toml and any C sources of optional extensions
    want="$("$PY" - "$root" <<'PYEOF'
import glob, hashlib, os, sys
root = sys.argv[1]
digest = hashlib.sha256()
for path in ["pyproject.toml"] + sorted(glob.glob("precdbg*/**/*.c", root_dir=root, recursive=True)):
    digest.update(path.encode())
    with open(os.path.join(root, path), "rb") as handle:
        digest.update(handle.read())
print(digest.hexdigest())
PYEOF
)"
    have="$(cat "$stamp" 2>/dev/null || true)"
    if [ "$want" != "$have" ] || ! "$PY" -c 'import precdbg, precdbg_pt, precdbg_ms, torch, mindspore, pytest' \
            >/dev/null 2>&1; then
        echo "setup: pip install -e \".[torch,mindspore,dev]\" into $venv (first time: a few minutes)"
        local began=$SECONDS
        (cd "$root" && _precdbg_quietly "pip install" "$PY" -m pip install --quiet \
            --progress-bar off -e ".[torch,mindspore,dev]") || return 1
        echo "$want" > "$stamp"
        echo "setup: installed in $((SECONDS - began)) s"
    fi
    version="$("$PY" -c 'import sys, torch, precdbg; print("python", sys.version.split()[0], "| torch", torch.__version__, "| precdbg", precdbg.__version__)')" || return 1
    echo "setup: $version ($venv)"
    export PY
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    _precdbg_setup
else
    _precdbg_setup || return 1
fi
