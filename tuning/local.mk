# pensieve-tune (issue 12): fits the eviction cost model per device and
# writes the device profile file (include/pensieve/profile.h). Its
# measurements and the profile made of them are a convenience library,
# linked by pensieve-chat too (/tune).
noinst_LTLIBRARIES += tuning/libpvtune.la
tuning_libpvtune_la_SOURCES = tuning/tune-measure.c tuning/tune-kernels.c tuning/tune-profile.c
noinst_HEADERS += tuning/tune.h
PV_TUNE_LINK = tuning/libpvtune.la $(PV_LINK)
bin_PROGRAMS += tuning/pensieve-tune
tuning_pensieve_tune_SOURCES = tuning/pensieve-tune.c
tuning_pensieve_tune_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tuning_pensieve_tune_LDADD = $(PV_TUNE_LINK) $(JANSSON_LIBS)
