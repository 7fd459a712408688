# The CUDA backend: plain C built by the C compiler. Host code uses the
# runtime API and cuBLAS; the kernels of kernels/ are compiled at run time
# by NVRTC from the text embedded in kernels/kernel-sources.c (see
# backends/cuda/README.md), so no CUDA compiler runs at build time.
EXTRA_DIST += backends/cuda/README.md
noinst_HEADERS += backends/cuda/cuda_kernels.h backends/cuda/cuda_nvrtc.h

if HAVE_CUDA
libpensieve_la_SOURCES += \
	backends/cuda/cuda_backend.c \
	backends/cuda/cuda_launch.c \
	backends/cuda/cuda_nvrtc.c
libpensieve_la_CPPFLAGS += $(CUDA_CFLAGS)
libpensieve_la_LIBADD += $(CUDA_LIBS)
endif
