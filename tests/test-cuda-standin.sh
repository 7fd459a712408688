#!/bin/sh
# The CUDA backend's host code under the backend and model tests, with no
# GPU: tests/cuda-standin/pensieve-cuda.so is backends/cuda/ linked with a
# stand-in for the CUDA runtime and cuBLAS whose kernels run on the OpenCL
# CPU device (tests/cuda-standin.c). Each program runs with that module as
# its "cuda" backend (the CPU backend beside it as the reference; no
# OpenCL); a program passes when it exits 0 and its TAP has no failure.
# Prints TAP, a test per program; each program's own lines go to the log
# as comments. PV_CUDA_STANDIN_TESTS picks how many: quick, the backend
# tests (CI's sanitizer build); unset, those and the model, the fused
# products and the chained engine steps (make check); all, also every
# weight type and batch class of qmatmul and the engine's tiers (some 4
# minutes more on 2 cores, most of it PoCL compiling their sets).
set -u

. "$(dirname "$0")/tap.sh"
module_dir=./tests/cuda-standin/.libs
need_program "$module_dir/pensieve-cuda.so"
need_program ./tests/test-backend-errors

PV_BACKEND_PATH=$module_dir
PV_BACKEND_PATH_ONLY=1
export PV_BACKEND_PATH PV_BACKEND_PATH_ONLY

# The stand-in finds no device where OpenCL has no CPU device with
# fine-grained shared virtual memory: the backend says "no CUDA device".
probe=$(./tests/test-backend-errors --backend cuda 2>&1)
if ! printf '%s\n' "$probe" | grep -q '^ok .*cuda'; then
    echo "1..0 # SKIP the CUDA stand-in has no device: $(printf '%s\n' "$probe" | grep -m1 -i 'skip\|device')"
    exit 0
fi

run() { # run PROGRAM ARGS...: one TAP line for the whole program
    prog=$1
    shift
    if [ ! -x "./tests/$prog" ]; then
        skip "$prog" "not built"
        return
    fi
    t0=$(date +%s)
    out=$("./tests/$prog" "$@" 2>&1)
    st=$?
    t1=$(date +%s)
    printf '%s\n' "$out" | sed 's/^/# /'
    passed=$(printf '%s\n' "$out" | grep -c '^ok .*cuda')
    failed=$(printf '%s\n' "$out" | grep -c '^not ok')
    [ $st -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
    check $? "$prog $* on the CUDA stand-in: exit $st, $passed cuda checks passed, $failed checks failed ($((t1 - t0)) s)"
}

run test-backend-ops --backend cuda
run test-backend-batch --backend cuda
run test-backend-launches --backend cuda
run test-backend-errors --backend cuda
run test-backend-timing --backend cuda
run test-attention-ref --backend cuda
run test-backend-async
run test-engine-bias
level=${PV_CUDA_STANDIN_TESTS:-default}
if [ "$level" != quick ]; then
    run test-llama
    run test-backend-fused-products --backend cuda
    run test-engine-chain
fi
if [ "$level" = all ]; then
    run test-backend-qmatmul cuda
    run test-engine
fi
tap_done
