# The request parser (server/request.h).
noinst_HEADERS += server/request.h
