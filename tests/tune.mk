# pensieve-tune end to end (issue 12): --quick on the CPU backend writes a
# profile, and the profile reaches the cache.
check_PROGRAMS += tests/test-tune-apply
tests_test_tune_apply_SOURCES = tests/test-tune-apply.c
tests_test_tune_apply_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_tune_apply_LDADD = $(PV_LINK)
TESTS += tests/test-tune.sh
EXTRA_DIST += tests/test-tune.sh
# The kernel search on PoCL rejects the candidates a test-only define
# breaks, and its choices reach the backend through the profile.
TESTS += tests/test-tune-kernels.sh
EXTRA_DIST += tests/test-tune-kernels.sh tests/tap.sh
# qmatmul's two-stage kernel search picks its stages' candidates from the
# real candidate lists (tune_in_stage).
check_PROGRAMS += tests/test-tune-stages
TESTS += tests/test-tune-stages
tests_test_tune_stages_SOURCES = tests/test-tune-stages.c
tests_test_tune_stages_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_tune_stages_LDADD = $(PV_TUNE_LINK)
