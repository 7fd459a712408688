# The backend front end (validation + dispatch) and one fragment per backend.
libpensieve_la_SOURCES += backends/backend.c backends/kernel-tuning.c
include backends/cpu/local.mk
include backends/opencl/local.mk
include backends/cuda/local.mk
# Launch choices for kernels/attention.cl shared by the OpenCL and CUDA
# backends, the kernels' build parameters with their candidate values, and
# the tuned ones per shape bucket.
noinst_HEADERS += backends/attention-split.h backends/kernel-params.h backends/kernel-tuning.h
