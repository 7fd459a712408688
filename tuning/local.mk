# pensieve-tune (issue 12): fits the eviction cost model per device and
# writes the device profile file (include/pensieve/profile.h).
bin_PROGRAMS += tuning/pensieve-tune
noinst_HEADERS += tuning/tune.h
tuning_pensieve_tune_SOURCES = tuning/pensieve-tune.c tuning/tune-measure.c tuning/tune-kernels.c
tuning_pensieve_tune_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
tuning_pensieve_tune_LDADD = $(PV_LINK) $(JANSSON_LIBS)
