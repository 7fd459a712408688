# Metrics and their Prometheus exposition (server/metrics.h).
noinst_HEADERS += server/metrics.h
