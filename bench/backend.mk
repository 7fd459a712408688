# Kernel benchmark: paged vs contiguous attention, decode and swap-gather
# bandwidth against the machine's all-core STREAM read and copy (on a
# device backend: the device's own copy), GEMM against
# the best BLAS rate over several sizes, and the swap path (slot transfers
# against a copy a chunk and one plain copy of the same bytes; the
# layer-pipelined swap-in). Prints a table or --json; never run by make
# check.
noinst_PROGRAMS += bench/bench-kernels
bench_bench_kernels_SOURCES = bench/bench-kernels.c bench/bench-device.h bench/bench-swap.c bench/bench-swap.h \
	bench/bench-timing.h
bench_bench_kernels_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_kernels_LDADD = $(PV_LINK) $(OPENBLAS_LIBS)

# Quantized matrix products per weight type, shape and batch: weight GB/s
# against the all-core STREAM read (on a device backend: the device's own
# copy), GFLOP/s against the nominal FMA peak.
noinst_PROGRAMS += bench/bench-qmatmul
bench_bench_qmatmul_SOURCES = bench/bench-qmatmul.c bench/bench-device.h
bench_bench_qmatmul_LDADD = $(PV_LINK)
