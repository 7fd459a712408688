# The CUDA backend: plain C built by the C compiler. Host code uses the
# runtime API and cuBLAS; the kernels of kernels/ are compiled at run time
# by NVRTC from the text embedded in kernels/kernel-sources.c (see
# backends/cuda/README.md), so no CUDA compiler runs at build time. A
# module, pensieve-cuda.so (Makefile.am: PV_MODULE_LDFLAGS), so that only a
# run that asks for CUDA maps the runtime, cuBLAS and NVRTC.
EXTRA_DIST += backends/cuda/README.md
noinst_HEADERS += backends/cuda/cuda_kernels.h backends/cuda/cuda_nvrtc.h backends/cuda/cuda_impl.h

if HAVE_CUDA
pvmodule_LTLIBRARIES += backends/pensieve-cuda.la
backends_pensieve_cuda_la_SOURCES = \
	backends/cuda/cuda_backend.c \
	backends/cuda/cuda_graph.c \
	backends/cuda/cuda_launch.c \
	backends/cuda/cuda_nvrtc.c
nodist_backends_pensieve_cuda_la_SOURCES = kernels/kernel-sources.c
backends_pensieve_cuda_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
backends_pensieve_cuda_la_LDFLAGS = $(PV_MODULE_LDFLAGS)
backends_pensieve_cuda_la_LIBADD = $(PV_MODULE_LIBADD) $(CUDA_LIBS)
# pensieve-cuda-warm: the kernel cache filled ahead of a run (NVRTC only,
# no GPU needed), as scripts/gpu-pack does for a GPU machine.
bin_PROGRAMS += backends/cuda/pensieve-cuda-warm
backends_cuda_pensieve_cuda_warm_SOURCES = backends/cuda/pensieve-cuda-warm.c backends/cuda/cuda_nvrtc.c
nodist_backends_cuda_pensieve_cuda_warm_SOURCES = kernels/kernel-sources.c
backends_cuda_pensieve_cuda_warm_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CFLAGS)
backends_cuda_pensieve_cuda_warm_LDADD = $(PV_LINK) $(CUDA_LIBS) $(PTHREAD_LIBS)
endif
