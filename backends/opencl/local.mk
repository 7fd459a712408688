# The OpenCL backend: ICD loader + CLBlast; the kernels are the portable ones
# of kernels/, compiled at run time from text embedded by kernels/local.mk.
# A module, pensieve-opencl.so (Makefile.am: PV_MODULE_LDFLAGS), so that only
# a run that asks for OpenCL maps the loader and CLBlast.
noinst_HEADERS += backends/opencl/opencl.h

if HAVE_OPENCL
pvmodule_LTLIBRARIES += backends/pensieve-opencl.la
backends_pensieve_opencl_la_SOURCES = \
	backends/opencl/opencl-backend.c \
	backends/opencl/opencl-kernels.c
nodist_backends_pensieve_opencl_la_SOURCES = kernels/kernel-sources.c
backends_pensieve_opencl_la_CPPFLAGS = $(AM_CPPFLAGS) $(OPENCL_CFLAGS)
backends_pensieve_opencl_la_LDFLAGS = $(PV_MODULE_LDFLAGS)
backends_pensieve_opencl_la_LIBADD = $(PV_MODULE_LIBADD) $(OPENCL_LIBS)
endif
