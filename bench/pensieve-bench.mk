# pensieve-bench (issue 13): the multi-turn serving benchmark, conversations
# with the paper's statistics (bench/workload.c) run through the engine in
# each mode (bench/bench-inproc.c) or against a server over HTTP
# (bench/bench-http.c, libcurl). Installed: it is a user's tool, like
# pensieve-tune.
bin_PROGRAMS += bench/pensieve-bench
bench_pensieve_bench_SOURCES = bench/pensieve-bench.c bench/workload.c bench/bench-inproc.c bench/bench-http.c \
    bench/bench-run.c bench/bench-sweep.c apps/setup.c bench/bench-util.h bench/bench-run.h bench/bench-inproc.h \
    bench/bench-http.h bench/bench-sweep.h
bench_pensieve_bench_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS) $(LIBCURL_CFLAGS)
bench_pensieve_bench_LDADD = $(PV_LINK) $(JANSSON_LIBS) $(LIBCURL_LIBS)

# A tiny run on the synthetic model in every mode: every request completes,
# and the counts add up; a sweep and the policies side by side.
TESTS += tests/test-bench.sh
EXTRA_DIST += tests/test-bench.sh

# Reading the throughput at the latency target off a sweep.
check_PROGRAMS += tests/test-bench-sweep
TESTS += tests/test-bench-sweep
tests_test_bench_sweep_SOURCES = tests/test-bench-sweep.c bench/bench-sweep.c
tests_test_bench_sweep_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_bench_sweep_LDADD = -lm

# The HTTP driver: its SSE reader, request bodies and /metrics parser on
# split and damaged input; a whole run against a fake server in a thread
# (timing, sessions, every failure kind); and a run against pensieve-serve.
check_PROGRAMS += tests/test-bench-sse tests/test-bench-http-fake
TESTS += tests/test-bench-sse tests/test-bench-http-fake tests/test-bench-http.sh
EXTRA_DIST += tests/test-bench-http.sh tests/serve-start.sh
tests_test_bench_sse_SOURCES = tests/test-bench-sse.c bench/bench-http.c bench/bench-run.c bench/workload.c
tests_test_bench_sse_CPPFLAGS = $(PV_TEST_INCLUDES) $(JANSSON_CFLAGS) $(LIBCURL_CFLAGS)
tests_test_bench_sse_LDADD = $(PV_LINK) $(JANSSON_LIBS) $(LIBCURL_LIBS)
tests_test_bench_http_fake_SOURCES = tests/test-bench-http-fake.c bench/bench-http.c bench/bench-run.c \
    bench/workload.c
tests_test_bench_http_fake_CPPFLAGS = $(PV_TEST_INCLUDES) $(JANSSON_CFLAGS) $(LIBCURL_CFLAGS)
tests_test_bench_http_fake_LDADD = $(PV_LINK) $(JANSSON_LIBS) $(LIBCURL_LIBS) $(PTHREAD_LIBS)
