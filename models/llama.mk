# The transformer over paged KV (the lead's; models/local.mk holds the file readers).
libpensieve_la_SOURCES += models/llama.c
