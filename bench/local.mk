# Benchmarks: programs that print tables (and --json), never run by make check.
include bench/backend.mk
include bench/cache.mk
include bench/models.mk
include bench/engine.mk
include bench/serve.mk
include bench/workload.mk
include bench/pensieve-bench.mk
