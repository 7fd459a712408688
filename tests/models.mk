# Model-file tests: the GGUF reader/writer and dequantisation, the tokenizer
# and chat template. They use the synthetic model; checks against the real
# SmolLM2 file skip when it is absent (scripts/get-model fetches it).
check_PROGRAMS += tests/test-gguf tests/test-tokenizer
TESTS += tests/test-gguf tests/test-tokenizer

tests_test_gguf_SOURCES = tests/test-gguf.c
tests_test_gguf_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_gguf_LDADD = $(PV_LINK)

tests_test_tokenizer_SOURCES = tests/test-tokenizer.c
tests_test_tokenizer_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_tokenizer_LDADD = $(PV_LINK)

# Releasing a mapped tensor's pages once the model holds its copy.
check_PROGRAMS += tests/test-gguf-release
TESTS += tests/test-gguf-release
tests_test_gguf_release_SOURCES = tests/test-gguf-release.c
tests_test_gguf_release_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_gguf_release_LDADD = $(PV_LINK)
