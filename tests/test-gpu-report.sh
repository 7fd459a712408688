#!/bin/sh
# scripts/gpu-report on a fixture (tests/gpu-report: figures of the H100
# runs and of PoCL dry runs and a PoCL pensieve-tune, trimmed; the llama-bench records and the
# PV_GEMM, PV_ACT16, PV_QMV_ROWS and PV_QMV_LANES tables are made up for
# the test): each target's figure, ratio and verdict computed from the JSON
# as docs/PERFORMANCE.md quotes them.
set -u
here=$(dirname "$0")
. "$here/tap.sh"
if ! command -v python3 >/dev/null 2>&1; then
    echo "1..0 # SKIP no python3"
    exit 0
fi
out=$(mktemp /tmp/pv-test-gpu-report-XXXXXX)
trap 'rm -f "$out"' EXIT
python3 "$here/../scripts/gpu-report" "$here/gpu-report" >"$out" 2>&1
check $? "gpu-report reads the fixture's summary.json and results.json"
has() { # has TEXT MESSAGE: the report holds the line TEXT
    grep -qxF -- "$1" "$out"
    check $? "$2: '$1'"
}
has "- 1K-8K: 9%-10% of the copy: not met" "attention: the share of the device copy over contexts 1K-8K"
has "- paged over contiguous: 0.989-1.015x: met" "attention: paged against contiguous, both ends"
has "- transfers at 72%-82% of the plain copy: not met" "swap: the transfers against one plain copy"
has "- layer-pipelined swap-in of 4 layers: copy 0.728 ms, compute 77.585 ms, both 78.340 ms: 1.01x the longer: met" \
    "swap: the pipelined turn against the longer of copy and compute"
has "- bench-model-smol-cuda: host/device 0.35 at batch 1: not met" "model: host time over device time"
has "- smol: prefill 2.00x, single-stream decode 0.50x llama.cpp's: not met" \
    "peer: both ratios against llama-bench on the same file"
has "| Q4_0 | 14336x4096 | 512 | 30065 | 240519 | f16 | 8.00x |" "PV_GEMM: GFLOP/s per mode, the fastest and its gain"
has "| Q4_0 | 14336x4096 | 1 | 25.8 | 16.0 | 43% | 69% | 1.61x |" "PV_ACT16: both modes' times, shares of the copy and the gain"
has "- Q4_0 at batch 1, the faster mode: 61%-69% of the copy: met" "PV_ACT16: the Q4 target from the faster mode"
has "- Q8_0 at batch 1, the faster mode: 67%-67% of the copy: met" "PV_ACT16: a type where f32 x is the faster"
has "| Q4_0 | 14336x4096 | 43% | 58% | 67% | 69% | 79% | 83% | act16 1, 8 rows | 1.95x |" \
    "PV_QMV_ROWS: each set's share of the copy, the fastest and its gain over f32 x at 2 rows"
has "- Q4_0 at batch 1, the fastest set: 83%-83% of the copy: met" "PV_QMV_ROWS: the Q4 target from the fastest set"
has "| Q4_0 | 14336x4096 | 8 | 102.0 | 34.0 | 11% | 32% | 3.00x |" \
    "PV_QMV_LANES: both lanes' times and shares of the copy, and the speedup"
has "- Q4_0 at 8 tokens, the faster lanes: 32%-32% of the copy" "PV_QMV_LANES: a decode batch's share from the faster"
has "- 276 of 276 parameter sets present for this GPU and NVRTC; 0 compiled on first use" \
    "kernel cache: the packed sets the GPU run found"
has "102 MB against a 86 MB file: 1.18x: met" "resident memory against the model file"
has "- pensieve-serve's forward passes: 2000, 75% as graphs, 80% of them replayed" \
    "serving: the server's graph runs and replays from /metrics"
grep -q "^| test-backend-async | rc=1 | 4.19 | 26 ok, 1 not ok, 1 skipped | not ok 16 - opencl" "$out"
check $? "steps: a failing test's counts and first failure"
has "- pensieve-bench-cpu: stateless at 2/s cut short at the step's time limit (not reported; the rates before it are)" \
    "serving: a run pensieve-bench's --time-limit cut short is named"
grep -qxF -- "- pensieve-bench-cpu: pensieve 1.00x stateless at the target: undecided (a mode met the target at every rate tried: higher rates needed)" "$out"
check $? "serving: a ratio of two lower bounds is not a verdict"
has "pensieve-tune-opencl (pthread-skylake-avx512-AMD EPYC): R^2 0.977, held-out error 17%, the step 65.6 s" \
    "tune: the fit and the step's time from summary.json"
has "| qmatmul | 49 (48 decode, 1 prefill) | 0 | PV_WG=64 PV_QMV_ROWS=2 PV_QMV_LANES=1 PV_GEMM=0 PV_ACT16=0 | PV_WG=32 PV_QMV_ROWS=8 PV_QMV_LANES=8 PV_GEMM=0 PV_ACT16=0 | 4.47x |" \
    "tune: qmatmul's candidates by stage"
has "| gather | 20 | 0 | PV_WG=64 PV_ITEM_ELEMS=8 | PV_WG=32 PV_ITEM_ELEMS=16 | 1.36x |" \
    "tune: a one-stage bucket's candidates"
python3 "$here/../scripts/gpu-report" /nonexistent-dir >/dev/null 2>&1
[ $? -eq 2 ]
check $? "a directory without the files: status 2"
tap_done
