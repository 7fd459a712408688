# pensieve-serve's library (issue 10): the OpenAI request parser, metrics and
# the HTTP server over the engine. A convenience library linked by the app,
# its tests and the request fuzz target; HTTP and JSON stay out of
# libpensieve.
noinst_LTLIBRARIES = server/libpvserver.la
server_libpvserver_la_SOURCES =
server_libpvserver_la_CPPFLAGS = $(AM_CPPFLAGS) $(MHD_CFLAGS) $(JANSSON_CFLAGS) $(NETTLE_CFLAGS)
server_libpvserver_la_LIBADD = $(MHD_LIBS) $(JANSSON_LIBS) $(NETTLE_LIBS) $(PTHREAD_LIBS)
PV_SERVER_LINK = server/libpvserver.la $(PV_LINK)
include server/request.mk
include server/metrics.mk
noinst_HEADERS += server/server.h server/server_internal.h server/buf.h
server_libpvserver_la_SOURCES += server/server.c server/server_turn.c server/server_state.c
