# The engine's benchmark: multi-turn time to first token (pensieve vs
# stateless), engine overhead per decode iteration, batched decode.
noinst_PROGRAMS += bench/bench-engine
bench_bench_engine_SOURCES = bench/bench-engine.c bench/bench-util.h bench/bench-load.h
bench_bench_engine_CFLAGS = $(AM_CFLAGS)
bench_bench_engine_LDADD = $(PV_LINK)

# Saving and restoring sessions (--state-dir) against a plain sequential
# write and read of the same bytes.
noinst_PROGRAMS += bench/bench-state
bench_bench_state_SOURCES = bench/bench-state.c bench/bench-util.h
bench_bench_state_CFLAGS = $(AM_CFLAGS)
bench_bench_state_LDADD = $(PV_LINK)

# Shared prefixes (issue 28): sessions with one system prompt, with and
# without sharing: time to first token and bytes held against one copy.
noinst_PROGRAMS += bench/bench-share
bench_bench_share_SOURCES = bench/bench-share.c bench/bench-util.h bench/bench-load.h
bench_bench_share_CFLAGS = $(AM_CFLAGS)
bench_bench_share_LDADD = $(PV_LINK)
