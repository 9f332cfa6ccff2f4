#!/usr/bin/env bash
# The accelerator checks of precdbg, for a machine with one CUDA GPU (run from the repository
# root). Writes logs and benchmark results under $OUT (default /tmp/precdbg-gpu):
#   1. the CUDA-only tests (pytest -m cuda): fused statistics vs numpy per dtype, host syncs of a
#      dumped step (statistics and tensor task), peak memory against a plain step;
#   2. the overhead benchmark on GPT-2 small and the Llama-shaped 1.1B, fp32 and bf16 autocast,
#      statistics/mix and statistics/module (plus msprobe side by side when it is installed).
#
#   bash scripts/gpu_check.sh                 # tests + benchmarks (about 15 minutes on an H100)
#   bash scripts/gpu_check.sh tests           # only the CUDA tests
#   bash scripts/gpu_check.sh bench [REPEATS] # only the benchmarks
#
# Needs python3 with torch (CUDA build, triton), numpy, h5py, pyyaml, xxhash, pydantic,
# transformers, pytest. Without the C extension (precdbg/_fastats*.so built for this Python)
# host statistics use torch ops; `python3 -m pip install --no-deps --no-build-isolation -e .`
# builds it where setuptools and a C compiler are present.
set -uo pipefail
OUT="${OUT:-/tmp/precdbg-gpu}"
mkdir -p "$OUT"
what="${1:-all}"
repeats="${2:-5}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "gpu_check: $PY has no CUDA build of torch, or no GPU is visible" >&2; exit 2; }
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())'
status=0
if [ "$what" = all ] || [ "$what" = tests ]; then
    "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_device_stats.py \
        tests/test_hand_over.py 2>&1 | tee "$OUT/cuda_tests.log" || status=1
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
    for model in gpt2-small llama-1b; do
        for precision in "" "--bf16"; do
            name="results_cuda_${model}${precision:+_bf16}.md"
            "$PY" benchmarks/overhead_torch.py --device cuda --model "$model" $precision \
                --repeats "$repeats" --modes statistics/mix statistics/module --msprobe \
                --results "$OUT/$name" 2>&1 | tee -a "$OUT/bench.log" || status=1
        done
    done
fi
exit "$status"
