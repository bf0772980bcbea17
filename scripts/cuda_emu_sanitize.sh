#!/usr/bin/env bash
# test-ops on the emulated CUDA device with cuda/*.cu built under AddressSanitizer and UBSan: every
# array a kernel receives is copied to an allocation of exactly its extent, so a read past a K/V
# view or a mask row is a report. Prints the test-ops summary and the number of sanitizer reports;
# exits non-zero on a failed case or any report.
#
#   scripts/cuda_emu_sanitize.sh [llm test-ops arguments, e.g. --quick -o FLASH_ATTN_EXT]
set -uo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
asan=$("$cxx" -print-file-name=libasan.so)
[ -f "$asan" ] || { echo "error: $cxx has no AddressSanitizer runtime (libasan.so)" >&2; exit 1; }
log=$(mktemp)
# Python's allocations through malloc, so ASan guards them too; leaks are the interpreter's, not ours
LD_PRELOAD="$asan" PYTHONMALLOC=malloc LLMSUITE_CUDA_EMU_SANITIZE=1 \
    ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "${PYTHON:-python3}" -m llmsuite.cli.main test-ops test -b cuda-emu "$@" >"$log" 2>&1
rc=$?
reports=$(grep -cE "ERROR: AddressSanitizer|runtime error:" "$log")
grep -E "tests passed|Backend cuda-emu" "$log"
grep -E -m 5 -A 12 "ERROR: AddressSanitizer|runtime error:" "$log"
echo "sanitizer reports: $reports"
rm -f "$log"
[ "$rc" -eq 0 ] && [ "$reports" -eq 0 ]
