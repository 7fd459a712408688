# The multi-turn workload of pensieve-bench (issue 13): generated
# conversations match the dataset means, the same seed gives the same
# workload, the context cap holds, and JSONL replay reads good files and
# refuses bad ones naming path:line; shared preambles leave the old
# workloads as they were, and the in-process driver's prompts start with
# the same ids wherever a conversation drew the same preamble.
noinst_HEADERS += bench/workload.h
check_PROGRAMS += tests/test-workload
TESTS += tests/test-workload
tests_test_workload_SOURCES = tests/test-workload.c bench/workload.c bench/bench-inproc.c bench/bench-run.c
tests_test_workload_CPPFLAGS = $(PV_TEST_INCLUDES) $(JANSSON_CFLAGS)
tests_test_workload_LDADD = $(PV_LINK) $(JANSSON_LIBS)
