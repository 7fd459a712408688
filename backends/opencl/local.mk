# The OpenCL backend: ICD loader + CLBlast; the kernels are the portable ones
# of kernels/, compiled at run time from text embedded by kernels/local.mk.
noinst_HEADERS += backends/opencl/opencl.h

if HAVE_OPENCL
libpensieve_la_SOURCES += \
	backends/opencl/opencl-backend.c \
	backends/opencl/opencl-kernels.c
libpensieve_la_CPPFLAGS += $(OPENCL_CFLAGS)
libpensieve_la_LIBADD += $(OPENCL_LIBS)
endif
