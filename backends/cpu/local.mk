# The CPU backend: the reference and test oracle (OpenBLAS GEMM, OpenMP).
libpensieve_la_SOURCES += \
	backends/cpu/cpu-backend.c \
	backends/cpu/cpu-attention.c \
	backends/cpu/cpu-gather.c \
	backends/cpu/cpu-gemm-small.c \
	backends/cpu/cpu-qmatmul.c \
	backends/cpu/cpu-qmatmul-avx2.c \
	backends/cpu/cpu-recompute.c
noinst_HEADERS += backends/cpu/cpu.h backends/cpu/cpu-qmatmul.h
