# The OpenAI request parser of pensieve-serve (server/request.h).
check_PROGRAMS += tests/test-serve-request
TESTS += tests/test-serve-request
tests_test_serve_request_SOURCES = tests/test-serve-request.c
tests_test_serve_request_CPPFLAGS = $(PV_TEST_INCLUDES) $(JANSSON_CFLAGS)
tests_test_serve_request_LDADD = $(PV_SERVER_LINK)
