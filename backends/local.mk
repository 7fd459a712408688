# The backend front end (validation + dispatch) and one fragment per backend.
libpensieve_la_SOURCES += backends/backend.c
include backends/cpu/local.mk
include backends/opencl/local.mk
include backends/cuda/local.mk
# Launch choices for kernels/attention.cl shared by the OpenCL and CUDA backends.
noinst_HEADERS += backends/attention-split.h
