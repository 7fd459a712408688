# Applications: pensieve-generate (one completion).
bin_PROGRAMS += apps/pensieve-generate
apps_pensieve_generate_SOURCES = apps/pensieve-generate.c
apps_pensieve_generate_LDADD = $(PV_LINK)
