# Benchmark of the tiered KV cache core (issue 3); make check only checks
# that its default sizes fit the machine and that a small one runs.
noinst_PROGRAMS += bench/bench-cache
bench_bench_cache_SOURCES = bench/bench-cache.c
bench_bench_cache_LDADD = $(PV_LINK)
TESTS += tests/test-bench-cache.sh
EXTRA_DIST += tests/test-bench-cache.sh
