# Tests print TAP; Automake's tap-driver reads it. One fragment per area.
noinst_HEADERS += tests/tap.h tests/real-tokenizer.h
include tests/backend.mk
include tests/delay.mk
include tests/cache.mk
include tests/models.mk
include tests/integration.mk
include tests/engine.mk
include tests/fuzz/local.mk
include tests/chat.mk
include tests/tune.mk
include tests/serve-metrics.mk
include tests/serve-request.mk
include tests/serve-openai.mk
include tests/serve.mk
include tests/deploy.mk
