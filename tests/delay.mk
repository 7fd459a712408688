# The delay backend: the CPU backend with a slow asynchronous copy queue and
# a timeline of reads against copies, for tests of the engine's pipelining.
# Test-only, linked into the tests that need it; its own test shows that
# the queue overlaps compute and that the order check can fail.
noinst_HEADERS += tests/delay-backend.h

check_PROGRAMS += tests/test-delay-backend
TESTS += tests/test-delay-backend
tests_test_delay_backend_SOURCES = tests/test-delay-backend.c tests/delay-backend.c
tests_test_delay_backend_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_delay_backend_LDADD = $(PV_LINK) $(PTHREAD_LIBS)
