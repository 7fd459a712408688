# The request parser (server/request.h).
noinst_HEADERS += server/request.h
server_libpvserver_la_SOURCES += server/request.c
