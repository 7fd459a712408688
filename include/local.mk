# Public headers, installed under $(includedir)/pensieve. The backend vtable
# lives in backends/ (next to its implementations); include/pensieve/backend.h
# is a link to it so that public headers can name <pensieve/backend.h>.
pkginclude_HEADERS += \
	include/pensieve/status.h \
	include/pensieve/half.h \
	include/pensieve/backend.h \
	include/pensieve/llama.h
noinst_HEADERS += backends/backend.h
