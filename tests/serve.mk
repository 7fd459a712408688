# pensieve-serve end to end in process (libcurl against the HTTP server over
# the synthetic model).
check_PROGRAMS += tests/test-serve
TESTS += tests/test-serve
tests_test_serve_SOURCES = tests/test-serve.c tests/delay-backend.c
tests_test_serve_CPPFLAGS = $(PV_TEST_INCLUDES) $(LIBCURL_CFLAGS) $(JANSSON_CFLAGS) $(MHD_CFLAGS)
tests_test_serve_LDADD = $(PV_SERVER_LINK) $(LIBCURL_LIBS) $(JANSSON_LIBS) $(PTHREAD_LIBS)

# --state-dir end to end: restart, DELETE, background saves and kill -9,
# a corrupt file.
TESTS += tests/test-serve-state.sh
EXTRA_DIST += tests/test-serve-state.sh

# pensieve-serve against a hostile or careless client (issue 29): bodies
# refused at their headers, imports under --max-sessions, keyed namespaces,
# NUL in ids, stalled clients, content types and Host names, a FIFO in
# --state-dir, half-closed clients.
TESTS += tests/test-serve-attack.sh
EXTRA_DIST += tests/test-serve-attack.sh tests/serve-attack-client.py
