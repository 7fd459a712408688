# Tests of the tiered KV cache core (issue 3).
noinst_HEADERS += tests/test-cache-util.h
CACHE_TESTS = tests/test-cache-seeds tests/test-cache-plans tests/test-cache-policy \
	tests/test-cache-badinput tests/test-cache-property tests/test-cache-check \
	tests/test-cache-truncate tests/test-cache-share
check_PROGRAMS += $(CACHE_TESTS)
TESTS += $(CACHE_TESTS)
tests_test_cache_seeds_SOURCES = tests/test-cache-seeds.c
tests_test_cache_seeds_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_seeds_LDADD = $(PV_LINK)
tests_test_cache_plans_SOURCES = tests/test-cache-plans.c
tests_test_cache_plans_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_plans_LDADD = $(PV_LINK)
tests_test_cache_policy_SOURCES = tests/test-cache-policy.c
tests_test_cache_policy_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_policy_LDADD = $(PV_LINK)
tests_test_cache_badinput_SOURCES = tests/test-cache-badinput.c
tests_test_cache_badinput_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_badinput_LDADD = $(PV_LINK) $(PTHREAD_LIBS)
tests_test_cache_truncate_SOURCES = tests/test-cache-truncate.c
tests_test_cache_truncate_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_truncate_LDADD = $(PV_LINK)
tests_test_cache_share_SOURCES = tests/test-cache-share.c
tests_test_cache_share_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_share_LDADD = $(PV_LINK)
tests_test_cache_property_SOURCES = tests/test-cache-property.c
tests_test_cache_property_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_property_LDADD = $(PV_LINK)
# The corruption hook is linked into this test only, never into the library.
tests_test_cache_check_SOURCES = tests/test-cache-check.c pvcore/cache_testhook.c
tests_test_cache_check_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cache_check_LDADD = $(PV_LINK)
# Device profiles and the cost model's fit (issue 12).
check_PROGRAMS += tests/test-profile
TESTS += tests/test-profile
tests_test_profile_SOURCES = tests/test-profile.c
tests_test_profile_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_profile_LDADD = $(PV_LINK)
