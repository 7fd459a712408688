# Applications: pensieve-generate (one completion), pensieve-chat.
bin_PROGRAMS += apps/pensieve-generate
apps_pensieve_generate_SOURCES = apps/pensieve-generate.c
apps_pensieve_generate_LDADD = $(PV_LINK)

# pensieve-chat: the reference chat demo over the engine (readline for input).
bin_PROGRAMS += apps/pensieve-chat
noinst_HEADERS += apps/chat.h apps/setup.h
apps_pensieve_chat_SOURCES = apps/pensieve-chat.c apps/chat-view.c apps/chat-tune.c apps/setup.c
apps_pensieve_chat_CPPFLAGS = $(AM_CPPFLAGS) $(READLINE_CFLAGS)
apps_pensieve_chat_LDADD = $(PV_TUNE_LINK) $(READLINE_LIBS)
# The quick start builds everything and ends in pensieve-chat.
EXTRA_DIST += scripts/quickstart

# pensieve-serve: the OpenAI-compatible HTTP server (server/).
bin_PROGRAMS += apps/pensieve-serve
apps_pensieve_serve_SOURCES = apps/pensieve-serve.c apps/setup.c
apps_pensieve_serve_CPPFLAGS = $(AM_CPPFLAGS) $(MHD_CFLAGS)
apps_pensieve_serve_LDADD = $(PV_SERVER_LINK)
