# Benchmark of the tiered KV cache core (issue 3); not run by make check.
noinst_PROGRAMS += bench/bench-cache
bench_bench_cache_SOURCES = bench/bench-cache.c
bench_bench_cache_LDADD = $(PV_LINK)
