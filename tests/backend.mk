# Backend tests: every op on every backend against the CPU reference, paged
# attention against a double-precision reference, and bad input through the
# front end.
noinst_HEADERS += tests/backend-check.h tests/kv-scenario.h

check_PROGRAMS += tests/test-backend-ops tests/test-attention-ref tests/test-backend-errors
TESTS += tests/test-backend-ops tests/test-attention-ref tests/test-backend-errors

tests_test_backend_ops_SOURCES = tests/test-backend-ops.c
tests_test_backend_ops_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_ops_LDADD = $(PV_LINK)

tests_test_attention_ref_SOURCES = tests/test-attention-ref.c
tests_test_attention_ref_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_attention_ref_LDADD = $(PV_LINK)

tests_test_backend_errors_SOURCES = tests/test-backend-errors.c
tests_test_backend_errors_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_errors_LDADD = $(PV_LINK)
