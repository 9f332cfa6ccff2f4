#!/usr/bin/env bash
# The accelerator checks of precdbg, for a machine with one CUDA GPU (run from the repository
# root). Writes logs and benchmark results under $OUT (default /tmp/precdbg-gpu):
#   tests     the CUDA-only tests (pytest -m cuda): fused statistics vs numpy per dtype, host syncs
#             of a dumped step (statistics and tensor task), peak memory against a plain step, and
#             Megatron-Core's GPTModel under Megatron's DistributedDataParallel on NCCL (dw from
#             main_grad, recompute runs MATCH; skipped without megatron-core), and a transformers
#             Llama loop under bf16 autocast (reruns and recompute MATCH, a defect named, the GPU
#             MATCHes the CPU in float32);
#   profile   benchmarks/profile_step.py on GPT-2 small fp32, levels mix and module: the dumped
#             step by phase (start, the step's own code, stop), cProfile and kernel tables;
#   bench     the overhead benchmark on GPT-2 small and the Llama-shaped 1.1B, fp32 and bf16
#             autocast, statistics/mix and statistics/module (msprobe beside it when installed);
#   split     benchmarks/cost_split.py on GPT-2 small fp32 and bf16, levels mix and module: the
#             dumped step's extra time by part (statistics, records, backward watch, API calls,
#             module calls, the rest): the tables into split.txt, the figures into
#             split_<precision>_<level>.json (few files: a lent machine returns a handful).
#
#   bash scripts/gpu_check.sh                  # tests, profile, bench (about 8 minutes on an H100)
#   bash scripts/gpu_check.sh tests bench      # some parts, in this order
#   REPEATS=3 DEADLINE=500 bash scripts/gpu_check.sh bench
#
# REPEATS: timed rounds per benchmark mode (default 5). DEADLINE: seconds from now after which no
# further part starts and a running one is stopped (default: none), so that a lent machine's
# time limit still returns what finished. MODELS: benchmark workloads (default "gpt2-small
# llama-1b"). Needs python3 with torch (CUDA build, triton), numpy, h5py, pyyaml, xxhash,
# pydantic, transformers, pytest. The optional C extensions are built in place with cc when they
# are not importable (a machine where precdbg is used from a copy of the tree, not installed).
set -uo pipefail
OUT="${OUT:-/tmp/precdbg-gpu}"
mkdir -p "$OUT"
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests profile bench)
for part in "${parts[@]}"; do      # every part named is known, before anything runs
    case "$part" in
    tests|profile|bench|split) ;;
    *) echo "gpu_check: unknown part '$part' (tests, profile, bench or split; REPEATS=N sets" \
            "the repeats)" >&2
       exit 2 ;;
    esac
done
repeats="${REPEATS:-5}"
models="${MODELS:-gpt2-small llama-1b}"
began=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "gpu_check: $PY has no CUDA build of torch, or no GPU is visible" >&2; exit 2; }
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name())'

build_extensions() {
    local include suffix module flags
    include="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    suffix="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    for module in precdbg.capture._fastats precdbg.capture._frames precdbg.storage._termguard precdbg_pt._graphwalk; do
        "$PY" -c "import $module" 2>/dev/null && continue
        flags="-O2"
        [ "$module" = precdbg.storage._termguard ] && flags="-O2 -pthread"
        [ "$module" = precdbg.capture._fastats ] && flags="-O3 -pthread -fno-trapping-math \
-fno-math-errno -fassociative-math -fno-signed-zeros -ffinite-math-only -ffp-contract=off"
        # shellcheck disable=SC2086
        cc $flags -shared -fPIC -I"$include" "${module//.//}.c" -o "${module//.//}$suffix" \
            || echo "gpu_check: $module not built (the Python fallback is used)"
    done
}

left() {   # seconds left before DEADLINE (a large number without one)
    if [ -z "${DEADLINE:-}" ]; then echo 100000; else echo $((DEADLINE - (SECONDS - began))); fi
}

limited() {   # run "$@" for at most the time left; 124 when it was stopped
    local seconds
    seconds="$(left)"
    if [ "$seconds" -le 5 ]; then
        echo "gpu_check: deadline reached, skipped: $*" >&2
        return 124
    fi
    timeout -k 5 "$seconds" "$@"
}

build_extensions
status=0
for part in "${parts[@]}"; do
    case "$part" in
    tests)
        limited "$PY" -m pytest -q -m cuda -p no:cacheprovider tests/test_device_stats.py \
            tests/test_hand_over.py tests/test_megatron_cuda.py tests/test_cuda_realloop.py \
            2>&1 | tee "$OUT/cuda_tests.log" || status=1 ;;
    profile)
        for level in mix module; do
            limited "$PY" benchmarks/profile_step.py --device cuda --model gpt2-small \
                --level "$level" --repeats "$repeats" --top 25 --out "$OUT" \
                > /dev/null 2>>"$OUT/profile.log" || status=1
        done ;;
    bench)
        for model in $models; do
            for precision in "" "--bf16"; do
                name="results_cuda_${model}${precision:+_bf16}.md"
                limited "$PY" benchmarks/overhead_torch.py --device cuda --model "$model" \
                    $precision --repeats "$repeats" --modes statistics/mix statistics/module \
                    --msprobe --results "$OUT/$name" || status=1
            done
        done ;;
    split)
        for precision in fp32 bf16; do
            for level in mix module; do
                flag=""; [ "$precision" = bf16 ] && flag="--bf16"
                # shellcheck disable=SC2086
                limited "$PY" benchmarks/cost_split.py --device cuda --model gpt2-small $flag \
                    --level "$level" --repeats "$repeats" \
                    --json "$OUT/split_${precision}_${level}.json" \
                    >> "$OUT/split.txt" 2>&1 || status=1
            done
        done ;;
    esac
done
exit "$status"
