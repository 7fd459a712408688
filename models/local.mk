# Model files: GGUF reader and writer, dequantisation, Llama hyperparameters,
# the byte-level BPE tokenizer and ChatML template, the synthetic test model.
pkginclude_HEADERS += \
	include/pensieve/gguf.h \
	include/pensieve/tokenizer.h
noinst_HEADERS += models/byte-level.h
libpensieve_la_SOURCES += \
	models/gguf.c \
	models/gguf-write.c \
	models/quant.c \
	models/hparams.c \
	models/byte-level.c \
	models/tokenizer.c \
	models/chat.c \
	models/synth.c \
	models/model-path.c

# pensieve-gguf: list a GGUF file's metadata and tensors with our reader,
# write the synthetic model, tokenize or render chats for
# scripts/compare-tokenizer.py, and time the reader and tokenizer (bench).
noinst_PROGRAMS += models/pensieve-gguf
models_pensieve_gguf_SOURCES = models/pensieve-gguf.c
models_pensieve_gguf_LDADD = $(PV_LINK)

EXTRA_DIST += scripts/compare-tokenizer.py
