# The backend front end (validation + dispatch), the registry that opens
# the backend modules, and one fragment per backend.
libpensieve_la_SOURCES += backends/backend.c backends/backend-run.c backends/registry.c backends/kernel-tuning.c backends/graph-trace.c
# Where the registry looks for modules after $PV_BACKEND_PATH: the build
# tree's (only while libpensieve runs from it), then the install directory.
libpensieve_la_CPPFLAGS += -DPV_BUILD_DIR='"$(abs_top_builddir)"' -DPV_MODULE_DIR='"$(pvmoduledir)"'
include backends/cpu/local.mk
include backends/opencl/local.mk
include backends/cuda/local.mk
# Launch choices for kernels/attention.cl shared by the OpenCL and CUDA
# backends, the kernels' build parameters with their candidate values, and
# the tuned ones per shape bucket; the registry and the modules' entry.
noinst_HEADERS += backends/attention-split.h backends/kernel-params.h backends/kernel-tuning.h \
	backends/registry.h backends/backend-module.h backends/graph-trace.h
