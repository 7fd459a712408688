# Model-file tests: the GGUF reader/writer and dequantisation, the tokenizer
# and chat template. They use the synthetic model; checks against the real
# SmolLM2 file skip when it is absent (scripts/get-model fetches it).
check_PROGRAMS += tests/test-gguf tests/test-tokenizer tests/test-synth
TESTS += tests/test-gguf tests/test-tokenizer tests/test-synth

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

# The real shapes of the synthetic models (llama3-8b, qwen2.5-1.5b,
# smollm2-135m) with one or two layers: hyperparameters, every weight type,
# the trained vocabulary, determinism across thread counts, a forward pass.
tests_test_synth_SOURCES = tests/test-synth.c
tests_test_synth_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_synth_LDADD = $(PV_LINK)

# pensieve-gguf synth's options (the command that writes these models where
# nothing can be downloaded).
TESTS += tests/test-synth-cli.sh
EXTRA_DIST += tests/test-synth-cli.sh
EXTRA_DIST += scripts/check-synth-llama-cpp.py
