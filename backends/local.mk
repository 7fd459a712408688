# The backend front end (validation + dispatch) and one fragment per backend.
libpensieve_la_SOURCES += backends/backend.c
include backends/cpu/local.mk
include backends/opencl/local.mk
include backends/cuda/local.mk
# Launch choices for kernels/attention.cl shared by the OpenCL and CUDA
# backends, and the kernels' build parameters with their candidate values.
noinst_HEADERS += backends/attention-split.h backends/kernel-params.h
