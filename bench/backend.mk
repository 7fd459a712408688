# Kernel benchmark: paged vs contiguous attention, decode and swap-gather
# bandwidth against the machine's all-core STREAM read and copy, GEMM against
# the best BLAS rate over several sizes. Prints a table or --json; never run
# by make check.
noinst_PROGRAMS += bench/bench-kernels
bench_bench_kernels_SOURCES = bench/bench-kernels.c
bench_bench_kernels_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
bench_bench_kernels_LDADD = $(PV_LINK) $(OPENBLAS_LIBS)
