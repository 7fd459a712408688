libpensieve_la_SOURCES += core/status.c
# The tiered KV cache core (issue 3): no backend headers, slots and bytes only.
libpensieve_la_SOURCES += core/cache.c core/cache_evict.c core/cache_config.c
noinst_HEADERS += core/cache_internal.h
pkginclude_HEADERS += include/pensieve/cache.h
