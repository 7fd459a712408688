# The paged forward pass against the contiguous host reference (synthetic model,
# and SmolLM2 when present).
check_PROGRAMS += tests/test-llama
TESTS += tests/test-llama
tests_test_llama_SOURCES = tests/test-llama.c tests/llama-ref.c tests/llama-ref.h
tests_test_llama_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_llama_LDADD = $(PV_LINK)

# The OpenCL backend without any platform.
check_PROGRAMS += tests/test-opencl-nodevice
TESTS += tests/test-opencl-nodevice
tests_test_opencl_nodevice_SOURCES = tests/test-opencl-nodevice.c
tests_test_opencl_nodevice_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_opencl_nodevice_LDADD = $(PV_LINK)

# pensieve-generate run as a program with bad input.
check_PROGRAMS += tests/test-generate
TESTS += tests/test-generate
tests_test_generate_SOURCES = tests/test-generate.c
tests_test_generate_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_generate_LDADD = $(PV_LINK)

# scripts/gpu-report on a fixture: each GPU target's figure and verdict.
TESTS += tests/test-gpu-report.sh
EXTRA_DIST += tests/test-gpu-report.sh tests/gpu-report/summary.json tests/gpu-report/results.json
