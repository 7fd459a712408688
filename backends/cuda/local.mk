# The CUDA backend: host code (runtime API, cuBLAS) is plain C built by gcc;
# the kernels from kernels/ and their launchers are CUDA C built by nvcc.
# A .cu.lo suffix rule runs nvcc through libtool like any compiler, so the
# object lands in libpensieve.la as a PIC .lo; nvcc-pic.sh turns libtool's
# -fPIC into -Xcompiler -fPIC.
EXTRA_DIST += \
	backends/cuda/cuda_kernels.cu \
	backends/cuda/nvcc-pic.sh \
	backends/cuda/README.md
noinst_HEADERS += backends/cuda/cuda_kernels.h

if HAVE_CUDA
libpensieve_la_SOURCES += backends/cuda/cuda_backend.c
libpensieve_la_CPPFLAGS += $(CUDA_CFLAGS)
# nvcc's host code needs the C++ runtime (static-init guards, unwinding).
libpensieve_la_LIBADD += backends/cuda/cuda_kernels.lo $(CUDA_LIBS) -lstdc++

# Host-compiler flags use nvcc's long form: libtool would eat -Xcompiler.
PV_NVCC_FLAGS = $(NVCC_ARCH_FLAGS) -std=c++17 -O3 -lineinfo \
	--compiler-options=-Wall,-Wextra,-Wno-unused-parameter \
	-I$(top_srcdir)/include -I$(top_srcdir) -I$(top_builddir) $(CUDA_CFLAGS)
PV_CUDA_KERNEL_DEPS = \
	$(srcdir)/backends/cuda/cuda_kernels.h \
	$(srcdir)/backends/backend.h \
	$(srcdir)/include/pensieve/status.h \
	$(srcdir)/kernels/dialect.h \
	$(srcdir)/backends/attention-split.h \
	$(srcdir)/kernels/attention.cl \
	$(srcdir)/kernels/gather.cl \
	$(srcdir)/kernels/qmatmul.cl \
	$(srcdir)/kernels/recompute.cl

pv_v_NVCC = $(pv_v_NVCC_@AM_V@)
pv_v_NVCC_ = $(pv_v_NVCC_@AM_DEFAULT_V@)
pv_v_NVCC_0 = @echo "  NVCC    " $@;
pv_v_NVCC_1 =

# The kernel files are included, not compiled: list them as prerequisites.
backends/cuda/cuda_kernels.lo: $(PV_CUDA_KERNEL_DEPS)
endif

# CUDA sources to libtool objects, for --with-cuda builds.
.cu.lo:
	$(pv_v_NVCC)$(MKDIR_P) $(@D) && \
	$(LIBTOOL) $(AM_V_lt) --tag=CC $(AM_LIBTOOLFLAGS) $(LIBTOOLFLAGS) --mode=compile \
	  $(SHELL) $(top_srcdir)/backends/cuda/nvcc-pic.sh $(NVCC) $(PV_NVCC_FLAGS) \
	  -c -o $@ $<
