# pensieve-bench (issue 13): the multi-turn serving benchmark, conversations
# with the paper's statistics (bench/workload.c) run through the engine in
# each mode. Installed: it is a user's tool, like pensieve-tune.
bin_PROGRAMS += bench/pensieve-bench
bench_pensieve_bench_SOURCES = bench/pensieve-bench.c bench/workload.c apps/setup.c bench/bench-util.h
bench_pensieve_bench_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
bench_pensieve_bench_LDADD = $(PV_LINK) $(JANSSON_LIBS)

# A tiny run on the synthetic model in every mode: every request completes,
# and the counts add up.
TESTS += tests/test-bench.sh
EXTRA_DIST += tests/test-bench.sh
