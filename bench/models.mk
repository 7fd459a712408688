# bench-model: prefill and decode tokens/s of a GGUF model beside the GEMM
# peak and STREAM read bandwidth bounds measured in the same run.
noinst_HEADERS += bench/bench-util.h
noinst_PROGRAMS += bench/bench-model
bench_bench_model_SOURCES = bench/bench-model.c
bench_bench_model_LDADD = $(PV_LINK)
