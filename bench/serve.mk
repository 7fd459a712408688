# bench-serve: pensieve-serve over HTTP in process (libcurl client threads)
# against the same engine without HTTP: throughput at 1-32 clients, the
# server's share of time to first token, a session's next turn against a
# stateless one. Reuses the apps' option parsing and stack set-up.
noinst_PROGRAMS += bench/bench-serve
bench_bench_serve_SOURCES = bench/bench-serve.c apps/setup.c
bench_bench_serve_CPPFLAGS = $(AM_CPPFLAGS) $(LIBCURL_CFLAGS) $(JANSSON_CFLAGS)
bench_bench_serve_LDADD = $(PV_SERVER_LINK) $(LIBCURL_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS)
