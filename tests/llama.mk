# The paged forward pass against the contiguous host reference (synthetic model).
check_PROGRAMS += tests/test-llama
TESTS += tests/test-llama
tests_test_llama_SOURCES = tests/test-llama.c tests/llama-ref.c tests/llama-ref.h
tests_test_llama_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_llama_LDADD = $(PV_LINK)
