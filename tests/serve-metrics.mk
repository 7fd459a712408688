# pensieve-serve's metrics and their Prometheus exposition (server/metrics.h).
check_PROGRAMS += tests/test-serve-metrics
TESTS += tests/test-serve-metrics
tests_test_serve_metrics_SOURCES = tests/test-serve-metrics.c
tests_test_serve_metrics_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_serve_metrics_LDADD = $(PV_SERVER_LINK) $(PTHREAD_LIBS)
