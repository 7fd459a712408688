# libFuzzer targets (issue 8, "keep it fixed"): built only by
# ./configure --enable-fuzz, which compiles the whole tree with clang and
# -fsanitize=fuzzer-no-link,address,undefined; the targets alone link
# libFuzzer's main. tests/fuzz/run-fuzz runs them (.ci/run does, 30 s each);
# docs/fuzzing.md says how to run them longer and reproduce a crash. The
# seed corpora under tests/fuzz/corpus/ are written by make-corpus.
FUZZ_TARGETS = tests/fuzz/fuzz-gguf tests/fuzz/fuzz-ini tests/fuzz/fuzz-tokenizer tests/fuzz/fuzz-cache \
	tests/fuzz/fuzz-request tests/fuzz/fuzz-profile tests/fuzz/fuzz-workload tests/fuzz/fuzz-state
EXTRA_DIST += tests/fuzz/run-fuzz tests/fuzz/large-inputs tests/fuzz/corpus tests/fuzz/fuzz-file.h

if ENABLE_FUZZ
noinst_PROGRAMS += $(FUZZ_TARGETS) tests/fuzz/make-corpus
tests_fuzz_fuzz_gguf_SOURCES = tests/fuzz/fuzz-gguf.c
tests_fuzz_fuzz_gguf_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_gguf_LDADD = $(PV_LINK)
tests_fuzz_fuzz_ini_SOURCES = tests/fuzz/fuzz-ini.c
tests_fuzz_fuzz_ini_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_ini_LDADD = $(PV_LINK)
tests_fuzz_fuzz_tokenizer_SOURCES = tests/fuzz/fuzz-tokenizer.c
tests_fuzz_fuzz_tokenizer_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_tokenizer_LDADD = $(PV_LINK)
tests_fuzz_fuzz_cache_SOURCES = tests/fuzz/fuzz-cache.c
tests_fuzz_fuzz_cache_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_cache_LDADD = $(PV_LINK)
tests_fuzz_fuzz_request_SOURCES = tests/fuzz/fuzz-request.c
tests_fuzz_fuzz_request_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_fuzz_fuzz_request_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_request_LDADD = $(PV_SERVER_LINK)
tests_fuzz_fuzz_profile_SOURCES = tests/fuzz/fuzz-profile.c
tests_fuzz_fuzz_profile_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_profile_LDADD = $(PV_LINK)
tests_fuzz_fuzz_workload_SOURCES = tests/fuzz/fuzz-workload.c bench/workload.c
tests_fuzz_fuzz_workload_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tests_fuzz_fuzz_workload_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_workload_LDADD = $(PV_LINK) $(JANSSON_LIBS)
tests_fuzz_fuzz_state_SOURCES = tests/fuzz/fuzz-state.c
tests_fuzz_fuzz_state_LDFLAGS = $(AM_LDFLAGS) $(FUZZ_LDFLAGS)
tests_fuzz_fuzz_state_CPPFLAGS = $(AM_CPPFLAGS) $(ZLIB_CFLAGS)
tests_fuzz_fuzz_state_LDADD = $(PV_LINK) $(ZLIB_LIBS)
tests_fuzz_make_corpus_SOURCES = tests/fuzz/make-corpus.c
tests_fuzz_make_corpus_LDADD = $(PV_LINK)

# Build just the targets (and the library), not the whole tree.
fuzz-targets: $(FUZZ_TARGETS)
.PHONY: fuzz-targets
endif
