#!/usr/bin/env bash
# The torch-shim tests (tests/test_shim.py) on mindnlp's current source (a checkout of its GitHub
# repository, mindspore-lab/mindnlp: 0.6, not on PyPI) with `loss.backward()` and the shim's
# `torch.optim.SGD` (PRECDBG_SHIM_GRADS=backward), on MindSpore 2.7.1 and 2.10. Not part of
# .ci/run (CI has no checkout of GitHub); scripts/test_shim.sh is the PyPI one (mindnlp 0.5.1).
#
#   bash scripts/test_shim_source.sh [MINDNLP_CHECKOUT] [pytest args]
#
# The checkout is the first argument, or PRECDBG_MINDNLP_SRC; with neither, or one that holds
# no src/mindnlp and src/mindtorch, the tests are skipped (exit 0) saying so. Builds (once,
# cached by a stamp like scripts/test_shim.sh) from PyPI only, with no torch:
#
#   <prefix>271/  <prefix>210/   MindSpore 2.7.1 / 2.10.0, transformers 4.57.6 and the rest of
#                                what the checkout imports; a .pth puts the checkout's src/ on
#                                sys.path (rewritten each run: the venv follows the checkout)
#   <prefix>-torch-side/         transformers 4.57.6 for the main .venv's torch (the twin)
#
# <prefix> is PRECDBG_SHIMSRC_VENV (default <repo>/.venv-shimsrc). PYTHON picks a python3.10 or
# 3.11 for new venvs; PRECDBG_TORCH_PYTHON the torch side's python (default <repo>/.venv's).
#
# Measured with mindnlp 7dd3e355 (master, 2026-03-08). On MindSpore 2.10 that source needs a
# one-line fix in the checkout: mindtorch's Generator._step (src/mindtorch/_C/__init__.py)
# hands the step to MindSpore's Generator as a Python int, which 2.10's GeneratorImpl refuses
# ("Invalid tensor input: Step"; 2.7.1's Generator ignores the step). The fix (not ours to
# ship, so this script does not apply it) is that line as
#     outs = self._generator_call(STEP, (self._seed, self._offset,
#                                        mindspore.Tensor(step, mindspore.int64),))[:2]
# (one line in the file). Without it the 2.10 run is skipped, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
SRC="${1:-${PRECDBG_MINDNLP_SRC:-}}"
[ $# -gt 0 ] && shift
if [ -z "$SRC" ]; then
    echo "shim-source: no mindnlp checkout given (argument or PRECDBG_MINDNLP_SRC); skipped"
    exit 0
fi
if [ ! -f "$SRC/src/mindnlp/__init__.py" ] || [ ! -f "$SRC/src/mindtorch/__init__.py" ]; then
    echo "shim-source: $SRC is no mindnlp checkout (no src/mindnlp, src/mindtorch); skipped"
    exit 0
fi
SRC="$(cd "$SRC" && pwd)"
COMMIT="not a git checkout"
if [ -e "$SRC/.git" ]; then
    COMMIT="$(git -C "$SRC" rev-parse HEAD)$(git -C "$SRC" diff --quiet || echo ' (with local changes)')"
fi
PREFIX="${PRECDBG_SHIMSRC_VENV:-$ROOT/.venv-shimsrc}"
TORCH_PY="${PRECDBG_TORCH_PYTHON:-$ROOT/.venv/bin/python}"
TORCH_SIDE_DIR="$PREFIX-torch-side"
# what the checkout imports (`import mindnlp` patches transformers, accelerate and diffusers);
# transformers 4.57.6: the newest its patches name (">=4.56.0"), the one 0.5.1 runs too
DEPS=("numpy<2" h5py pyyaml xxhash ml_dtypes "pydantic>=2" pytest safetensors==0.8.0
      tokenizers==0.22.2 transformers==4.57.6 huggingface_hub==0.36.2 regex tqdm requests addict
      psutil packaging sentencepiece pillow importlib_metadata zipp ftfy wcwidth filelock fsspec)
NO_DEPS=(accelerate==1.15.0 diffusers==0.35.2)      # they declare a (CUDA) torch: none wanted
TORCH_SIDE=(transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2 requests urllib3
            idna charset_normalizer certifi)

# shellcheck source=scripts/find_python.sh
source "$ROOT/scripts/find_python.sh"

build() {   # build VENV MINDSPORE_PIN
    local venv="$1" pin="$2" want py
    want="$(printf '%s\n' "$pin" "${DEPS[@]}" "${NO_DEPS[@]}" | sha256sum | cut -c1-16)"
    if [ "$(cat "$venv/.precdbg-shimsrc" 2>/dev/null || true)" = "$want" ]; then
        return 0
    fi
    py="$(find_python 10 11)" || { echo "shim-source: no python3.10 or 3.11; skipped" >&2; exit 0; }
    echo "shim-source: building $venv ($pin) with $py"
    local began=$SECONDS
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --progress-bar off "$pin" "${DEPS[@]}"
    "$venv/bin/python" -m pip install --quiet --progress-bar off --no-deps "${NO_DEPS[@]}"
    echo "$want" > "$venv/.precdbg-shimsrc"
    echo "shim-source: built in $((SECONDS - began)) s"
}

# the twin's torch side: the main .venv's torch with the same transformers
TWIN=()
if [ -x "$TORCH_PY" ] && "$TORCH_PY" -c 'import torch' >/dev/null 2>&1; then
    want="$(printf '%s\n' "${TORCH_SIDE[@]}" | sha256sum | cut -c1-16)"
    if [ "$(cat "$TORCH_SIDE_DIR/.precdbg-shimsrc" 2>/dev/null || true)" != "$want" ]; then
        rm -rf "$TORCH_SIDE_DIR"
        "$TORCH_PY" -m pip install --quiet --progress-bar off --no-deps --target \
            "$TORCH_SIDE_DIR" "${TORCH_SIDE[@]}"
        echo "$want" > "$TORCH_SIDE_DIR/.precdbg-shimsrc"
    fi
    TWIN=(PRECDBG_TORCH_PYTHON="$TORCH_PY" PRECDBG_TORCH_PATH="$TORCH_SIDE_DIR")
else
    echo "shim-source: no torch in $TORCH_PY (scripts/setup_venv.sh makes it); the twin is skipped"
fi

echo "shim-source: mindnlp source $SRC at $COMMIT"
status=0
for pair in 2.7.1:271 2.10.0:210; do
    version="${pair%%:*}"
    venv="$PREFIX${pair##*:}"
    build "$venv" "mindspore==$version"
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
    echo "$SRC/src" > "$site/mindnlp-source.pth"
    # the one thing that differs by version: 2.10's Generator wants its step as a tensor
    if ! probe="$(cd /tmp && GLOG_v=3 "$venv/bin/python" -c '
import mindspore as ms
ms.set_context(mode=ms.PYNATIVE_MODE); ms.set_device("CPU")
import mindnlp, torch
torch.empty(4).uniform_()' 2>&1)"; then
        if grep -q "Invalid tensor input: Step" <<<"$probe"; then
            echo "shim-source: MindSpore $version: SKIPPED: this checkout needs the one-line" \
                 "Generator fix (src/mindtorch/_C/__init__.py, Generator._step: pass" \
                 "mindspore.Tensor(step, mindspore.int64), not the int; see this script's header)"
            continue
        fi
        echo "shim-source: MindSpore $version: \`import mindnlp\` and a random op failed:" >&2
        echo "$probe" | tail -20 >&2
        status=1
        continue
    fi
    echo "shim-source: MindSpore $version ($venv), loss.backward() + torch.optim.SGD"
    began=$SECONDS
    if env PYTHONPATH="$ROOT" PRECDBG_SHIM_GRADS=backward "${TWIN[@]}" \
            "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_shim.py "$@"; then
        echo "shim-source: MindSpore $version: passed in $((SECONDS - began)) s"
    else
        status=$?
        echo "shim-source: MindSpore $version: FAILED" >&2
    fi
done
exit $status
