#!/usr/bin/env bash
# Everything a session with an NVIDIA GPU should check, in one command and under 8 minutes, with a
# report in $OUT (or the folder given): the CUDA tests, test-ops on the device (every case, the
# sparse flash-attention ones included), flash-attention timings at the issue's sizes, and llm bench
# on a random-weight model of SmolLM2's shapes (generated there: same shapes, same speed) on cpu and
# cuda. Each step has its own time limit (500 s in all), so one slow step leaves the others' results.
#
#   scripts/gpu_check.sh [REPORT_DIR]
#
# The GPU machine reaches no package index. Python packages it lacks (gguf) travel as wheels in
# .whl/ (git-ignored): fetch them here first with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl gguf
set -uo pipefail
cd "$(dirname "$0")/.."
report=$(realpath -m "${1:-${OUT:-gpu-report}}")
mkdir -p "$report"
summary="$report/summary.txt"
site=/tmp/llmsuite-site
model=/tmp/smollm2-shaped.gguf
export PYTHONUNBUFFERED=1 PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS LOG COMMAND...: run with a time limit, record its exit status
    local name=$1 limit=$2 log=$3 t0=$SECONDS rc
    shift 3
    timeout "$limit" "$@" >>"$report/$log" 2>&1
    rc=$?
    printf '%-28s rc=%-3s %4ss  (%s)\n' "$name" "$rc" "$((SECONDS - t0))" "$log" | tee -a "$summary"
}
llm="python3 -m llmsuite.cli.main"  # a command line, not a function: `timeout` runs it

{
    echo "llmsuite GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    python3 -c 'import sys, cupy; print("python", sys.version.split()[0], "cupy", cupy.__version__)' 2>&1
} | tee "$summary"

# llmsuite itself by links (no build step); the carried wheels with pip, which needs no index for them
mkdir -p "$site/llmsuite" && for pkg in cli core cuda; do ln -sfn "$PWD/$pkg" "$site/llmsuite/$pkg"; done
if ls .whl/*.whl >/dev/null 2>&1; then
    step install-wheels 30 env.txt python3 -m pip install --no-index --no-deps --no-compile -q --target "$site" .whl/*.whl
fi
step pytest-cuda 90 pytest.txt python3 -m pytest -m cuda -q -rs -p no:cacheprovider tests/test_cuda.py
step test-ops 45 testops.txt $llm test-ops test -b cuda
step deepseek32-dsa 30 dsa.txt $llm generate -m tests/fixtures/tiny/tiny-deepseek32.gguf --backend cuda --attn sparse \
    -p "To be, or not to be" -n 16 --temp 0 -v
step test-ops-perf-fa 45 perf.txt $llm test-ops perf -b cuda -o FLASH_ATTN_EXT -p 'kv=32768.*type_K=f16'
step random-model 20 env.txt python3 scripts/random_model.py smollm2-135m "$model" --ctx 40960
step bench-cuda 45 bench.md $llm bench -m "$model" --backend cuda pp2048 tg32 tg128 pp2048@d32768 tg32@d32768 -r 3
step bench-cuda-sparse 60 bench.md $llm bench -m "$model" --backend cuda pp2048@d32768 tg32@d32768 --sparse-topk 0,1024,2048 -r 2
step bench-cpu-vs-cuda 45 bench.md $llm bench -m "$model" --backend cpu,cuda pp2048 tg32 -r 2
step bench-cpu-vs-cuda-depth 120 bench.md $llm bench -m "$model" --backend cpu,cuda pp2048@d32768 tg32@d32768 -r 2

grep -E 'tests passed|Backend .*: (OK|FAIL)|backends passed' "$report/testops.txt" | tee -a "$summary"
tail -n 3 "$report/pytest.txt" | tee -a "$summary"
echo "report: $report" | tee -a "$summary"
