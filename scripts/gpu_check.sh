#!/usr/bin/env bash
# Everything a session with an NVIDIA GPU should check, in one command and under 10 minutes, with a
# report in $OUT (or the folder given): the CUDA tests, test-ops on the device (every case, the
# sparse flash-attention ones included), the tiny models on the device against the emulated device's
# answers (cuda-emu: the same kernels built for the host, so any difference is the device's), and
# llm bench on a random-weight model of SmolLM2's shapes (generated there: same shapes, same speed):
# pp512 and tg128 at depth 0 and 8192, dense against block top-k sparse, and flash-attention timings.
# Each step has its own time limit (540 s in all), so one slow step leaves the others' results; the
# kernels' arithmetic was checked beforehand on the host (llm test-ops -b cuda-emu), so these minutes
# go to the device's answers and speed.
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
step test-ops 60 testops.txt $llm test-ops test -b cuda
step tiny-vs-emulated 150 fidelity.md python3 scripts/cuda_emu_fidelity.py --reference cuda --smollm2
step random-model 20 env.txt python3 scripts/random_model.py smollm2-135m "$model" --ctx 16384
step bench-dense-sparse 150 bench.md $llm bench -m "$model" --backend cuda pp512 tg128 pp512@d8192 tg128@d8192 \
    --sparse-topk 0,1024 -r 3
step bench-cpu-vs-cuda 40 bench.md $llm bench -m "$model" --backend cpu,cuda pp512 tg128 -r 2
step test-ops-perf-fa 30 perf.txt $llm test-ops perf -b cuda -o FLASH_ATTN_EXT -p 'kv=32768.*type_K=f16'

grep -E 'tests passed|Backend .*: (OK|FAIL)|backends passed' "$report/testops.txt" | tee -a "$summary"
cat "$report/fidelity.md" "$report/bench.md" 2>/dev/null | tee -a "$summary"
tail -n 3 "$report/pytest.txt" | tee -a "$summary"
echo "report: $report" | tee -a "$summary"
