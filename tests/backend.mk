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

# Queued ops with reused host index arrays, on every built backend: the
# check of the CUDA backend's staging ring (skips without a GPU), and of the
# same contract elsewhere; then backend.h's queue contract: a compute result
# reads back while a long copy chain is still in flight.
check_PROGRAMS += tests/test-backend-async
TESTS += tests/test-backend-async
tests_test_backend_async_SOURCES = tests/test-backend-async.c
tests_test_backend_async_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_async_LDADD = $(PV_LINK)

# The ops that take a step's host work in one call (slot_transfer,
# sample_batch) on every built backend against the CPU reference, with
# slot_transfer's queue rules; sample_batch into the device and with a
# logit bias, embed_gather of device ids, and the two chained (in a graph
# where the backend has graphs).
check_PROGRAMS += tests/test-backend-batch
TESTS += tests/test-backend-batch
tests_test_backend_batch_SOURCES = tests/test-backend-batch.c
tests_test_backend_batch_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_batch_LDADD = $(PV_LINK)

# Launch counts: a known sequence of ops on every built backend, each
# adding what its backend enqueues for it.
check_PROGRAMS += tests/test-backend-launches
TESTS += tests/test-backend-launches
tests_test_backend_launches_SOURCES = tests/test-backend-launches.c
tests_test_backend_launches_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_launches_LDADD = $(PV_LINK)

# Timing markers on every built backend: the device's time between two
# markers around a long GEMM chain against the host's wall time, an empty
# interval, the wrong order, records that never wait, misuse, and markers
# recorded into a graph.
check_PROGRAMS += tests/test-backend-timing
TESTS += tests/test-backend-timing
tests_test_backend_timing_SOURCES = tests/test-backend-timing.c
tests_test_backend_timing_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_timing_LDADD = $(PV_LINK)

# qmatmul and embed_gather over GGUF weight types on every built backend:
# every type x batch size against a double-precision product.
check_PROGRAMS += tests/test-backend-qmatmul
TESTS += tests/test-backend-qmatmul
tests_test_backend_qmatmul_SOURCES = tests/test-backend-qmatmul.c tests/llama-ref.c tests/llama-ref.h
tests_test_backend_qmatmul_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_qmatmul_LDADD = $(PV_LINK)

# A RMSNorm fused with its products (pv_add_rmsnorm_group, _swiglu) on
# every built backend: the same bits as the ops apart, one launch fewer
# where the norm rounds x for PV_ACT16 products.
check_PROGRAMS += tests/test-backend-fused-products
TESTS += tests/test-backend-fused-products
tests_test_backend_fused_products_SOURCES = tests/test-backend-fused-products.c
tests_test_backend_fused_products_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_backend_fused_products_LDADD = $(PV_LINK)

# Split-K of the CPU attention kernel: the front end's split count and
# forced counts (1 to more splits than blocks) against a double reference.
check_PROGRAMS += tests/test-attention-splitk
TESTS += tests/test-attention-splitk
tests_test_attention_splitk_SOURCES = tests/test-attention-splitk.c
tests_test_attention_splitk_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_attention_splitk_LDADD = $(PV_LINK)

# Kernel tuning: buckets and parameter sets as text, candidate lists, and
# on the tunable backends a stored set reaching its bucket's builds only.
check_PROGRAMS += tests/test-kernel-tuning
TESTS += tests/test-kernel-tuning
tests_test_kernel_tuning_SOURCES = tests/test-kernel-tuning.c
tests_test_kernel_tuning_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_kernel_tuning_LDADD = $(PV_LINK)

# The CPU backend's 16-bit activation rounding: AVX2 and portable agree bit
# for bit, and the portable one follows its definition.
check_PROGRAMS += tests/test-cpu-quantize-x
TESTS += tests/test-cpu-quantize-x
tests_test_cpu_quantize_x_SOURCES = tests/test-cpu-quantize-x.c
tests_test_cpu_quantize_x_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_cpu_quantize_x_LDADD = $(PV_LINK)

# kernels/qmatmul.cl's 16-bit GEMM operands on an OpenCL device, built from
# the embedded kernel text (no OpenCL launcher uses them: CUDA does).
check_PROGRAMS += tests/test-kernel-round16
TESTS += tests/test-kernel-round16
tests_test_kernel_round16_SOURCES = tests/test-kernel-round16.c
nodist_tests_test_kernel_round16_SOURCES = kernels/kernel-sources.c
tests_test_kernel_round16_CPPFLAGS = $(PV_TEST_INCLUDES) $(OPENCL_CFLAGS)
tests_test_kernel_round16_LDADD = $(PV_LINK) $(OPENCL_LIBS)

if HAVE_CUDA
# Every CUDA kernel family compiled by NVRTC with the parameter sets of
# backends/kernel-params.h for the --with-cuda-arch architectures, planted
# compile errors, and the on-disk kernel cache: no GPU needed.
check_PROGRAMS += tests/test-cuda-nvrtc
TESTS += tests/test-cuda-nvrtc
# It builds the module's NVRTC part in, with the kernels' text.
tests_test_cuda_nvrtc_SOURCES = tests/test-cuda-nvrtc.c backends/cuda/cuda_nvrtc.c
nodist_tests_test_cuda_nvrtc_SOURCES = kernels/kernel-sources.c
tests_test_cuda_nvrtc_CPPFLAGS = $(PV_TEST_INCLUDES) $(CUDA_CFLAGS)
tests_test_cuda_nvrtc_LDADD = $(PV_LINK) $(CUDA_LIBS) $(PTHREAD_LIBS)
# Every launcher's arguments against its kernel's parameters as NVRTC
# compiled them: cuda_launch.c over a stand-in for the runtime that reads
# the cubins' parameter records.
check_PROGRAMS += tests/test-cuda-launch
TESTS += tests/test-cuda-launch
tests_test_cuda_launch_SOURCES = tests/test-cuda-launch.c backends/cuda/cuda_launch.c backends/cuda/cuda_nvrtc.c
nodist_tests_test_cuda_launch_SOURCES = kernels/kernel-sources.c
tests_test_cuda_launch_CPPFLAGS = $(PV_TEST_INCLUDES) $(CUDA_CFLAGS)
tests_test_cuda_launch_LDADD = $(PV_LINK) $(CUDA_LIBS)
# The CUDA backend over a stand-in for the runtime and cuBLAS that runs its
# kernels on the OpenCL CPU device (tests/cuda-standin.c): the backend's
# host code under the backend tests, with work deferred as on a GPU.
if HAVE_OPENCL
check_LTLIBRARIES += tests/cuda-standin/pensieve-cuda.la
tests_cuda_standin_pensieve_cuda_la_SOURCES = tests/cuda-standin.c \
	backends/cuda/cuda_backend.c backends/cuda/cuda_graph.c backends/cuda/cuda_launch.c backends/cuda/cuda_nvrtc.c
nodist_tests_cuda_standin_pensieve_cuda_la_SOURCES = kernels/kernel-sources.c
tests_cuda_standin_pensieve_cuda_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS) $(OPENCL_CFLAGS) $(OPENBLAS_CFLAGS)
tests_cuda_standin_pensieve_cuda_la_LDFLAGS = $(PV_MODULE_LDFLAGS) -rpath /nowhere -Wl,--wrap=pv_cuda_program_image
tests_cuda_standin_pensieve_cuda_la_LIBADD = $(PV_MODULE_LIBADD) $(CUDA_NVRTC_LIBS) $(OPENCL_LIBS) $(OPENBLAS_LIBS)
TESTS += tests/test-cuda-standin.sh
endif
# pensieve-cuda-warm fills and checks a kernel cache.
TESTS += tests/test-cuda-warm.sh
endif
EXTRA_DIST += tests/test-cuda-warm.sh tests/test-cuda-standin.sh

# The backend modules: a CPU run maps no GPU runtime; the registry's search
# and its failures, with a module that must not load (tests/fake-module.c,
# built as a pensieve-cuda.so that make check alone builds).
check_PROGRAMS += tests/test-backend-modules
TESTS += tests/test-backend-modules
tests_test_backend_modules_SOURCES = tests/test-backend-modules.c
tests_test_backend_modules_CPPFLAGS = $(PV_TEST_INCLUDES) \
	-DPV_TEST_FAKE_MODULE_DIR='"$(abs_top_builddir)/tests/fake-module/.libs"'
tests_test_backend_modules_LDADD = $(PV_LINK)
check_LTLIBRARIES += tests/fake-module/pensieve-cuda.la
tests_fake_module_pensieve_cuda_la_SOURCES = tests/fake-module.c
tests_fake_module_pensieve_cuda_la_LDFLAGS = $(PV_MODULE_LDFLAGS) -rpath /nowhere

# The trace that lets a recorded graph run again (backends/graph-trace.h):
# every kind of difference between a step and the recording is caught.
check_PROGRAMS += tests/test-graph-trace
TESTS += tests/test-graph-trace
tests_test_graph_trace_SOURCES = tests/test-graph-trace.c
tests_test_graph_trace_CPPFLAGS = $(PV_TEST_INCLUDES)
tests_test_graph_trace_LDADD = $(PV_LINK)
