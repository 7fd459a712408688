# Metrics and their Prometheus exposition (server/metrics.h).
noinst_HEADERS += server/metrics.h
server_libpvserver_la_SOURCES += server/metrics.c
