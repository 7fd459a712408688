libpensieve_la_SOURCES += pvcore/status.c
# The tiered KV cache core (issue 3): no backend headers, slots and bytes only.
libpensieve_la_SOURCES += pvcore/cache.c pvcore/cache_evict.c pvcore/cache_config.c pvcore/ini.c \
	pvcore/profile.c pvcore/cost_fit.c \
	pvcore/cache_check.c pvcore/cache_share.c
noinst_HEADERS += pvcore/cache_internal.h pvcore/ini.h
pkginclude_HEADERS += include/pensieve/cache.h include/pensieve/profile.h
