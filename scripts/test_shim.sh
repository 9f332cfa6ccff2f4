#!/usr/bin/env bash
# The torch-shim tests (tests/test_shim.py, and tests/test_shim_benchmark.py: a short run of
# benchmarks/overhead_shim.py): PyTorch code on MindSpore through mindnlp's
# `mindtorch`, twinned with real torch. Builds (once, cached like scripts/setup_venv.sh) an
# environment from PyPI only:
#
#   .venv-shim/            MindSpore 2.7.0, mindnlp 0.5.1 and the minimal set it imports (a
#                          plain `pip install mindnlp` pulls a CUDA torch and ~8.5 GB; mindnlp
#                          needs none of it: its `torch` is the shim), precdbg from the checkout
#   .venv-shim/torch-side/ transformers 4.57.6 (the version mindnlp 0.5.1 patches) for the main
#                          .venv's torch: both sides run the same model code
#
#   bash scripts/test_shim.sh [pytest args]     (after scripts/setup_venv.sh made .venv)
#
# Environment: PRECDBG_SHIM_VENV=DIR (default <repo>/.venv-shim), PYTHON (a python3.11 or
# 3.10: MindSpore 2.7.0 has no wheels for newer ones).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="${PRECDBG_SHIM_VENV:-$ROOT/.venv-shim}"
TORCH_PY="$ROOT/.venv/bin/python"
# pinned: what was measured to work together (tests/test_shim.py's docstring)
SHIM_DEPS=(mindspore==2.7.0 "numpy<2" h5py pyyaml xxhash ml_dtypes "pydantic>=2" pytest
           safetensors==0.8.0 tokenizers==0.22.2 transformers==4.57.6 huggingface_hub==0.36.2
           regex tqdm requests addict psutil packaging sentencepiece pillow importlib_metadata
           zipp ftfy wcwidth filelock fsspec)
# imported by mindnlp but declaring a CUDA torch (accelerate) or more than it uses: no deps
NO_DEPS=(mindnlp==0.5.1 accelerate==1.15.0 diffusers==0.35.2)
TORCH_SIDE=(transformers==4.57.6 huggingface_hub==0.36.2 tokenizers==0.22.2 requests urllib3
            idna charset_normalizer certifi)
want="$(printf '%s\n' "${SHIM_DEPS[@]}" "${NO_DEPS[@]}" "${TORCH_SIDE[@]}" | sha256sum | cut -c1-16)"
stamp="$VENV/.precdbg-shim"

if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    began=$SECONDS
    rm -rf "$VENV"
    # shellcheck source=scripts/find_python.sh
    source "$ROOT/scripts/find_python.sh"
    found="$(find_python 10 11)" || {
        echo "shim: no python3.10 or 3.11 (MindSpore 2.7.0's wheels); skipping the shim tests" >&2
        exit 0
    }
    echo "shim: building $VENV (MindSpore 2.7.0, mindnlp 0.5.1) with $found"
    "$found" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --progress-bar off "${SHIM_DEPS[@]}"
    "$VENV/bin/python" -m pip install --quiet --progress-bar off --no-deps "${NO_DEPS[@]}"
    "$TORCH_PY" -m pip install --quiet --progress-bar off --no-deps --target \
        "$VENV/torch-side" "${TORCH_SIDE[@]}"
    echo "$want" > "$stamp"
    echo "shim: built in $((SECONDS - began)) s ($(du -sh "$VENV" | cut -f1))"
fi
# precdbg from the checkout (its C extensions are built in place by the main install)
began=$SECONDS
PYTHONPATH="$ROOT" PRECDBG_TORCH_PYTHON="$TORCH_PY" PRECDBG_TORCH_PATH="$VENV/torch-side" \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_shim.py tests/test_shim_benchmark.py "$@"
echo "shim: tests passed in $((SECONDS - began)) s"
