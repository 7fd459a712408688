/* Bad input: a clear status and message, nothing leaked (ASan/valgrind),
 * invariants still hold. */
#include "test-cache-util.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int says(const char *needle)
{
    int found = strstr(pv_last_error(), needle) != NULL;
    if (!found)
        tap_diag("message \"%s\" lacks \"%s\"", pv_last_error(), needle);
    return found;
}

static void sessions_and_chunks(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 2, 2, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_tier tier;
    ok(pv_cache_lookup(cache, "ghost", 0, 0, &tier, NULL) == PV_ERR_NOT_FOUND && says("\"ghost\""),
       "lookup of an unknown session: %s", pv_last_error());
    ok(pv_cache_store_chunk(cache, "ghost", 0, 0, PV_TIER_DEVICE, NULL) == PV_ERR_NOT_FOUND,
       "store into an unknown session");
    ok(pv_cache_pin(cache, "ghost") == PV_ERR_NOT_FOUND && pv_cache_touch(cache, "ghost") == PV_ERR_NOT_FOUND,
       "pin/touch of an unknown session");
    ok(pv_cache_session_open(cache, "") == PV_ERR_INVALID_ARG && says("length 0"),
       "empty session id: %s", pv_last_error());
    ok(pv_cache_session_truncate(cache, "ghost", 0) == PV_ERR_NOT_FOUND && says("\"ghost\""),
       "truncating an unknown session: %s", pv_last_error());
    ok(pv_cache_session_truncate(cache, "", 0) == PV_ERR_NOT_FOUND && says("unknown session \"\""),
       "truncating the empty id (never a session): %s", pv_last_error());
    pv_cache_session_open(cache, "s");
    ok(pv_cache_store_chunk(cache, "s", 0, 2, PV_TIER_DEVICE, NULL) == PV_ERR_INVALID_ARG &&
           says("layer 2") && says("[0, 2)"),
       "layer out of range: %s", pv_last_error());
    ok(pv_cache_store_chunk(cache, "s", PV_CACHE_MAX_CHUNKS, 0, PV_TIER_DEVICE, NULL) ==
           PV_ERR_INVALID_ARG,
       "chunk index out of range: %s", pv_last_error());
    ok(pv_cache_store_chunk(cache, "s", 0, 0, PV_TIER_DROPPED, NULL) == PV_ERR_INVALID_ARG,
       "storing into DROPPED: %s", pv_last_error());
    pv_cache_store_chunk(cache, "s", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "s", 0, 1, PV_TIER_DEVICE, NULL);
    ok(pv_cache_store_chunk(cache, "s", 1, 0, PV_TIER_DEVICE, NULL) == PV_ERR_OUT_OF_MEMORY &&
           says("no free device slot"),
       "store into a full tier: %s", pv_last_error());
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 3 * TEST_SLOT_BYTES, &plan) == PV_ERR_INVALID_ARG,
       "evicting more than the pool holds: %s", pv_last_error());
    ok(pv_cache_unpin(cache, "s") == PV_ERR_STATE, "unpin without pin: %s", pv_last_error());
    ok(pv_cache_session_save(cache, "s", 10) == PV_ERR_INVALID_ARG,
       "saving more tokens than the history has: %s", pv_last_error());
    pv_cache_move fake = {0, 0, 0, PV_TIER_DEVICE, PV_TIER_HOST, 0, 0, 1};
    ok(pv_cache_complete(cache, &fake, 1) == PV_ERR_STATE, "completing a copy never planned: %s",
       pv_last_error());
    check_ok(cache, "after rejected calls");
    uint64_t freed = 0;
    ok(pv_cache_end_session(cache, "s", &freed) == PV_OK && freed == 2 * TEST_SLOT_BYTES,
       "end_session");
    ok(pv_cache_end_session(cache, "s", &freed) == PV_ERR_NOT_FOUND && says("unknown session"),
       "a second end_session: %s", pv_last_error());
    check_ok(cache, "after the second end_session");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

static void budgets(void)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.slot_bytes = 4096;
    cfg.device_bytes = 4095;
    pv_cache *cache = (pv_cache *)&cfg; /* must be set to NULL on failure */
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG && cache == NULL &&
           says("device budget 4095 bytes is smaller than one slot (4096 bytes)"),
       "device budget smaller than one slot: %s", pv_last_error());
    cfg.device_bytes = 1 << 20;
    cfg.host_bytes = 4095;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG && says("host budget 4095"),
       "host budget smaller than one slot: %s", pv_last_error());
    /* 0 is no host tier at all (gpu-only serving): a DEVICE victim is dropped. */
    uint32_t layers = cfg.n_layers;
    cfg.host_bytes = 0;
    cfg.device_bytes = 4 * 4096;
    cfg.n_layers = 1;
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_status hst = pv_cache_init(&cache, &cfg, NULL, NULL);
    if (hst == PV_OK) {
        uint32_t slot;
        pv_cache_session_open(cache, "s");
        for (uint32_t c = 0; c < 4; c++)
            pv_cache_store_chunk(cache, "s", c, 0, PV_TIER_DEVICE, &slot);
        hst = pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 4096, &plan);
    }
    ok(hst == PV_OK && plan.n_moves == 1 && plan.moves[0].to == PV_TIER_DROPPED &&
           pv_cache_check(cache) == PV_OK,
       "host budget 0: no host tier; eviction drops (%s)", hst == PV_OK ? "ok" : pv_last_error());
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
    cache = NULL;
    cfg.device_bytes = 1 << 20;
    cfg.n_layers = layers;
    pv_cache_config_defaults(&cfg);
    cfg.high_water = 1.5;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG && says("high_water 1.5"),
       "high water out of range: %s", pv_last_error());
    pv_cache_config_defaults(&cfg);
    cfg.beta = 0;
    cfg.c = 0;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG, "zero cost at context 0: %s",
       pv_last_error());
    /* 64T parses (a byte count) but no machine here holds it: refused at
     * init, before any pool is allocated. */
    pv_cache_config_defaults(&cfg);
    cfg.slot_bytes = 64ull << 20;
    cfg.host_bytes = 64ull << 40;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG &&
           says("host budget 70368744177664 bytes exceeds the physical memory of"),
       "host budget above physical memory: %s", pv_last_error());
    pv_cache_config_defaults(&cfg);
    cfg.device_limit_bytes = 512ull << 20;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_ERR_INVALID_ARG &&
           says("device budget 1073741824 bytes exceeds the device's memory of 536870912 bytes"),
       "device budget above the device's memory: %s", pv_last_error());
    cfg.device_limit_bytes = 1ull << 30;
    ok(pv_cache_init(&cache, &cfg, NULL, NULL) == PV_OK, "a device budget equal to the limit: %s",
       pv_last_error());
    pv_cache_free(cache);
}

/* Writes text to a fresh temporary INI file; returns its path in buf. */
static int write_ini(char *buf, size_t size, const char *text)
{
    snprintf(buf, size, "/tmp/pv-cache-ini-XXXXXX");
    int fd = mkstemp(buf);
    if (fd < 0)
        return 0;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        return 0;
    }
    fputs(text, f);
    fclose(f);
    return 1;
}

static int same_config(const pv_cache_config *a, const pv_cache_config *b)
{
    return a->policy == b->policy && a->alpha == b->alpha && a->beta == b->beta && a->c == b->c &&
           a->chunk_tokens == b->chunk_tokens && a->n_layers == b->n_layers &&
           a->slot_bytes == b->slot_bytes && a->device_bytes == b->device_bytes &&
           a->host_bytes == b->host_bytes && a->high_water == b->high_water && a->reserve == b->reserve;
}

static pv_status load_text(const char *text, pv_cache_config *cfg, char *path, size_t size)
{
    pv_cache_config_defaults(cfg);
    if (!write_ini(path, size, text))
        return PV_ERR_IO;
    pv_status st = pv_cache_config_load(cfg, path);
    unlink(path);
    return st;
}

static void ini_files(void)
{
    pv_cache_config cfg, defaults;
    pv_cache_config_defaults(&defaults);
    char path[64];
    ok(load_text("[cache]\npolicy = weighted\nalpha = 2.5e-6\nbeta = 0.001\nc = 0.002\n"
                 "chunk_tokens = 16\ndevice_bytes = 2G\nhost_bytes = 512MiB\nhigh_water = 0.8\n"
                 "reserve = 0.05 ; a comment\n",
                 &cfg, path, sizeof path) == PV_OK,
       "a full [cache] section loads: %s", pv_last_error());
    ok(cfg.policy == PV_POLICY_WEIGHTED && cfg.alpha == 2.5e-6 && cfg.beta == 0.001 && cfg.c == 0.002 &&
           cfg.chunk_tokens == 16 && cfg.device_bytes == (2ull << 30) &&
           cfg.host_bytes == (512ull << 20) && cfg.high_water == 0.8 && cfg.reserve == 0.05,
       "every value is read");
    ok(load_text("[cache]\nalpha = 3e-6\n", &cfg, path, sizeof path) == PV_OK && cfg.alpha == 3e-6 &&
           cfg.high_water == defaults.high_water && cfg.reserve == defaults.reserve &&
           cfg.policy == defaults.policy,
       "absent keys keep their defaults");

    static const struct {
        const char *text;
        const char *needle;
    } bad[] = {
        {"[cache]\nalpha = fast\n", "cache:alpha = \"fast\" is not a number in [0, 1e+06]"},
        {"[cache]\nhigh_water = 1.5\n", "cache:high_water = \"1.5\" is not a number in (0, 1]"},
        {"[cache]\nhigh_water = 0\n", "(0, 1]"},
        {"[cache]\nreserve = -0.1\n", "cache:reserve = \"-0.1\""},
        {"[cache]\nchunk_tokens = 32.5\n", "not an integer in [1, 4096]"},
        {"[cache]\nchunk_tokens = 0\n", "cache:chunk_tokens = \"0\""},
        {"[cache]\ndevice_bytes = 12Q\n", "cache:device_bytes = \"12Q\" is not a byte count"},
        {"[cache]\nhost_bytes = -5\n", "cache:host_bytes = \"-5\""},
        {"[cache]\npolicy = fifo\n", "cache:policy = \"fifo\" is not one of pensieve, weighted, lru"},
        {"[cache]\nalhpa = 1\n", "unknown key cache:alhpa"},
        {"[cache]\nbeta = 0\nc = 0\n", "beta + cache:c = 0 must be > 0"},
        {"[cache]\nalpha = 1e999\n", "cache:alpha = \"1e999\""},
        {"[cache\nalpha = 1\n", ":1: malformed section header \"[cache\""},
        {"[cache]\ndevice_bytes = \" -5\"\n", ":2: key cache:device_bytes = \" -5\" is not a byte count"},
        {"[cache]\nhost_bytes = +5\n", ":2: key cache:host_bytes = \"+5\""},
        {"[cahce]\nalpha = 1\n", ":1: unknown section [cahce]"},
        {"alpha = 1\n[cache]\n", ":1: \"alpha = 1\" comes before any section"},
        {"; comment\n[cache]\n\nalhpa = 1\n", ":4: unknown key cache:alhpa"},
        {"[cache]\ralpha = 1\r", ":1: a carriage return not followed by a newline"},
        {"[cache]\nalpha = 1\nalpha = 2\n", ":3: key cache:alpha is set again (first on line 2)"},
        {"[cache]\nreserve =\n", ":2: key cache:reserve has no value"},
        {"[cache]\nreserve\n", ":2: \"reserve\" is neither [section] nor key = value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pv_status st = load_text(bad[i].text, &cfg, path, sizeof path);
        ok(st == PV_ERR_FORMAT && says(path) && says(bad[i].needle) &&
               same_config(&cfg, &defaults),
           "bad INI %zu rejected, config unchanged: %s", i, pv_last_error());
    }
    ok(pv_cache_config_load(&cfg, "/nonexistent/pensieve.ini") == PV_ERR_IO &&
           says("/nonexistent/pensieve.ini"),
       "a missing file: %s", pv_last_error());
    ok(pv_cache_config_load(&cfg, "/tmp") == PV_ERR_IO && says("/tmp: cache config is a directory"),
       "a directory: %s", pv_last_error());
    ok(load_text("[cache]\r\nalpha = 4e-6\r\n", &cfg, path, sizeof path) == PV_OK && cfg.alpha == 4e-6,
       "CRLF line ends load: %s", pv_last_error());
    /* A file starting with NUL: fputs cannot write it. */
    static const char nul_file[] = "\0[cache]\nalpha = 1\n";
    snprintf(path, sizeof path, "/tmp/pv-cache-ini-XXXXXX");
    int fd = mkstemp(path);
    int wrote = fd >= 0 && write(fd, nul_file, sizeof nul_file - 1) == (ssize_t)(sizeof nul_file - 1);
    if (fd >= 0)
        close(fd);
    pv_cache_config_defaults(&cfg);
    ok(wrote && pv_cache_config_load(&cfg, path) == PV_ERR_FORMAT && says(":1: a NUL byte at offset 0") &&
           same_config(&cfg, &defaults),
       "a file starting with NUL: %s", pv_last_error());
    unlink(path);
}

/* Every public entry point with NULL for each pointer that is not optional:
 * a status, never a crash; the *_free calls take NULL as a no-op. */
static void null_arguments(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 4, 4, &clk);
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "s");
    pv_cache_stats stats;
    pv_session_view view;
    pv_cache_admission adm;
    pv_tier tier;
    double v;
    const char *id;
    pv_policy policy;
    pv_cache *none = (pv_cache *)&clk; /* must be set to NULL on failure */
    pv_cache_move move = {0, 0, 0, PV_TIER_DEVICE, PV_TIER_HOST, 0, 0, 1};
    int32_t token = 1;
    const pv_status E = PV_ERR_INVALID_ARG;
    int n = 0, good = 0;
#define NULL_CASE(call)                                                  \
    do {                                                                 \
        n++;                                                             \
        pv_status st_ = (call);                                          \
        if (st_ == E && strstr(pv_last_error(), "NULL"))                 \
            good++;                                                      \
        else                                                             \
            tap_diag("%s gave %s: %s", #call, pv_status_str(st_), pv_last_error()); \
    } while (0)
    NULL_CASE(pv_policy_parse(NULL, &policy));
    NULL_CASE(pv_policy_parse("lru", NULL));
    NULL_CASE(pv_cache_config_defaults(NULL));
    NULL_CASE(pv_cache_config_load(NULL, "x.ini"));
    NULL_CASE(pv_cache_config_load(&cfg, NULL));
    NULL_CASE(pv_cache_config_validate(NULL));
    NULL_CASE(pv_cache_init(NULL, &cfg, NULL, NULL));
    NULL_CASE(pv_cache_init(&none, NULL, NULL, NULL));
    NULL_CASE(pv_cache_session_open(NULL, "s"));
    NULL_CASE(pv_cache_session_open(cache, NULL));
    NULL_CASE(pv_cache_end_session(NULL, "s", NULL));
    NULL_CASE(pv_cache_end_session(cache, NULL, NULL));
    NULL_CASE(pv_cache_append_tokens(NULL, "s", &token, 1));
    NULL_CASE(pv_cache_append_tokens(cache, NULL, &token, 1));
    NULL_CASE(pv_cache_append_tokens(cache, "s", NULL, 1));
    NULL_CASE(pv_cache_touch(NULL, "s"));
    NULL_CASE(pv_cache_touch(cache, NULL));
    NULL_CASE(pv_cache_pin(NULL, "s"));
    NULL_CASE(pv_cache_pin(cache, NULL));
    NULL_CASE(pv_cache_unpin(NULL, "s"));
    NULL_CASE(pv_cache_unpin(cache, NULL));
    NULL_CASE(pv_cache_session_save(NULL, "s", 0));
    NULL_CASE(pv_cache_session_save(cache, NULL, 0));
    NULL_CASE(pv_cache_session_truncate(NULL, "s", 0));
    NULL_CASE(pv_cache_session_truncate(cache, NULL, 0));
    NULL_CASE(pv_cache_session_trim(NULL, "s"));
    NULL_CASE(pv_cache_session_trim(cache, NULL));
    NULL_CASE(pv_cache_mark_dropped(NULL, "s", 0, 0));
    NULL_CASE(pv_cache_mark_dropped(cache, NULL, 0, 0));
    NULL_CASE(pv_cache_session_set_active(NULL, "s", 0));
    NULL_CASE(pv_cache_session_set_active(cache, NULL, 0));
    NULL_CASE(pv_cache_session_restore(NULL, "s", &view));
    NULL_CASE(pv_cache_session_restore(cache, NULL, &view));
    NULL_CASE(pv_cache_session_restore(cache, "s", NULL));
    NULL_CASE(pv_cache_held_bytes(NULL, "s", NULL, NULL));
    NULL_CASE(pv_cache_store_chunk(NULL, "s", 0, 0, PV_TIER_DEVICE, NULL));
    NULL_CASE(pv_cache_store_chunk(cache, NULL, 0, 0, PV_TIER_DEVICE, NULL));
    NULL_CASE(pv_cache_lookup(NULL, "s", 0, 0, &tier, NULL));
    NULL_CASE(pv_cache_lookup(cache, NULL, 0, 0, &tier, NULL));
    NULL_CASE(pv_cache_lookup(cache, "s", 0, 0, NULL, NULL));
    NULL_CASE(pv_cache_peek(NULL, "s", 0, 0, &tier, NULL, NULL));
    NULL_CASE(pv_cache_peek(cache, NULL, 0, 0, &tier, NULL, NULL));
    NULL_CASE(pv_cache_peek(cache, "s", 0, 0, NULL, NULL, NULL));
    NULL_CASE(pv_cache_retention_value(NULL, "s", 0, 0, &v));
    NULL_CASE(pv_cache_retention_value(cache, NULL, 0, 0, &v));
    NULL_CASE(pv_cache_retention_value(cache, "s", 0, 0, NULL));
    NULL_CASE(pv_cache_plan_init(NULL));
    NULL_CASE(pv_cache_plan_clear(NULL));
    NULL_CASE(pv_cache_evict_to_free(NULL, PV_TIER_DEVICE, 1, &plan));
    NULL_CASE(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 1, NULL));
    NULL_CASE(pv_cache_plan_swap_out(NULL, 1, &plan));
    NULL_CASE(pv_cache_plan_swap_out(cache, 1, NULL));
    NULL_CASE(pv_cache_plan_swap_in(NULL, "s", &plan));
    NULL_CASE(pv_cache_plan_swap_in(cache, NULL, &plan));
    NULL_CASE(pv_cache_plan_swap_in(cache, "s", NULL));
    NULL_CASE(pv_cache_complete(NULL, &move, 1));
    NULL_CASE(pv_cache_complete(cache, NULL, 1));
    NULL_CASE(pv_cache_abort(NULL, &move, 1));
    NULL_CASE(pv_cache_abort(cache, NULL, 1));
    NULL_CASE(pv_cache_admit(NULL, 1, &adm));
    NULL_CASE(pv_cache_admit(cache, 1, NULL));
    NULL_CASE(pv_cache_choose_suspend(NULL, &id));
    NULL_CASE(pv_cache_choose_suspend(cache, NULL));
    NULL_CASE(pv_cache_stats_get(NULL, &stats));
    NULL_CASE(pv_cache_stats_get(cache, NULL));
    NULL_CASE(pv_cache_check(NULL));
#undef NULL_CASE
    ok(good == n, "%d of %d calls with a NULL argument return invalid argument naming NULL", good, n);
    ok(none == NULL, "pv_cache_init with a NULL config sets *cache to NULL");
    ok(pv_cache_session_name(NULL, 0) == NULL, "pv_cache_session_name(NULL) is NULL");
    pv_cache_free(NULL);
    pv_cache_plan_free(NULL);
    ok(1, "pv_cache_free(NULL) and pv_cache_plan_free(NULL) are no-ops");
    check_ok(cache, "after calls with NULL arguments");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Bytes the C library's allocator holds now (small blocks + mmapped ones). */
static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* A session's index grows with the chunks it holds, not with the highest
 * chunk index: chunk PV_CACHE_MAX_CHUNKS-1 alone must not cost 256 MiB. */
static void sparse_index(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_WEIGHTED, 32, 4, 4, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    const uint32_t last = PV_CACHE_MAX_CHUNKS - 1;
    pv_cache_session_open(cache, "far");
    /* Whether mallinfo2 sees this allocator (not under ASan, which has its own). */
    size_t probe_before = heap_bytes();
    char *volatile probe = malloc(4 << 20); /* volatile: not elided */
    int counted = probe && heap_bytes() - probe_before >= (4u << 20);
    free(probe);
    size_t before = heap_bytes();
    pv_status st = pv_cache_store_chunk(cache, "far", last, 31, PV_TIER_DEVICE, NULL);
    size_t grown = heap_bytes() - before;
    ok(st == PV_OK, "chunk %u stores", last);
    if (counted)
        ok(grown < (256u << 10), "storing chunk %u of 32 layers takes %zu bytes of index (< 256 KiB)",
           last, grown);
    else
        tap_skip("mallinfo2 does not count this allocator's blocks (sanitizer build)");
    pv_cache_store_chunk(cache, "far", 5, 0, PV_TIER_HOST, NULL);
    int32_t history[300] = {0};
    pv_cache_append_tokens(cache, "far", history, 300);
    pv_session_view view;
    pv_cache_session_restore(cache, "far", &view);
    double v;
    ok(tier_of(cache, "far", last, 31) == PV_TIER_DEVICE && tier_of(cache, "far", last, 30) == PV_TIER_NONE &&
           tier_of(cache, "far", last - 1, 31) == PV_TIER_NONE &&
           tier_of(cache, "far", 5, 0) == PV_TIER_HOST && tier_of(cache, "far", 0, 0) == PV_TIER_NONE &&
           tier_of(cache, "far", 70000, 3) == PV_TIER_NONE,
       "lookups in and around the held chunks");
    ok(view.n_chunks == PV_CACHE_MAX_CHUNKS && view.records[PV_TIER_DEVICE] == 1 &&
           view.records[PV_TIER_HOST] == 1,
       "restore: %u chunk indices, 1 device + 1 host record", view.n_chunks);
    ok(pv_cache_retention_value(cache, "far", 6, 0, &v) == PV_ERR_NOT_FOUND,
       "no retention value for an unstored chunk between held ones");
    clk.now = 1;
    ok(pv_cache_evict_to_free(cache, PV_TIER_HOST, 4 * TEST_SLOT_BYTES, &plan) == PV_OK &&
           plan.n_moves == 1 && plan.moves[0].chunk == 5 && plan.moves[0].to == PV_TIER_DROPPED,
       "the host chunk is dropped");
    pv_cache_session_restore(cache, "far", &view);
    ok(view.recompute_tokens == 6 * 32, "recompute through chunk 5: %u tokens",
       view.recompute_tokens);
    check_ok(cache, "with chunks 5 and PV_CACHE_MAX_CHUNKS-1 held");
    /* A cut past chunk 5 gives back the far chunk's slot and its index. */
    size_t held_before = heap_bytes();
    uint64_t dev = 1;
    ok(pv_cache_session_truncate(cache, "far", 6 * 32) == PV_OK &&
           pv_cache_held_bytes(cache, "far", &dev, NULL) == PV_OK && dev == 0 &&
           tier_of(cache, "far", last, 31) == PV_TIER_NONE && tier_of(cache, "far", 5, 0) == PV_TIER_DROPPED,
       "truncating to 6 chunks frees chunk %u, keeps the dropped chunk 5", last);
    pv_cache_session_restore(cache, "far", &view);
    ok(view.n_chunks == 6 && view.recompute_tokens == 6 * 32 && view.n_tokens == 6 * 32,
       "restore after the cut: %u chunk indices, recompute %u tokens", view.n_chunks, view.recompute_tokens);
    size_t held_after = heap_bytes();
    if (counted)
        ok(held_after + (16u << 10) <= held_before, "the cut gives back index memory: %zu -> %zu bytes held",
           held_before, held_after);
    else
        tap_skip("mallinfo2 does not count this allocator's blocks (sanitizer build)");
    check_ok(cache, "after the cut");
    uint64_t freed = 0;
    ok(pv_cache_end_session(cache, "far", &freed) == PV_OK && freed == 0,
       "end_session: the device slot went with the cut");
    check_ok(cache, "after the sparse session ended");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Two threads load different bad files at once: each must get its own
 * message (the last error is per thread) and nothing may reach stderr (a
 * loader that swaps a process-wide error callback prints there when the
 * other thread restores it mid-load). */
typedef struct loader {
    char path[64];
    const char *needle;
    int rounds, right;
} loader;

static void *load_many(void *arg)
{
    loader *ld = arg;
    for (int i = 0; i < ld->rounds; i++) {
        pv_cache_config cfg;
        pv_cache_config_defaults(&cfg);
        if (pv_cache_config_load(&cfg, ld->path) == PV_ERR_FORMAT &&
            strstr(pv_last_error(), ld->path) && strstr(pv_last_error(), ld->needle))
            ld->right++;
    }
    return NULL;
}

static void concurrent_loads(void)
{
    loader ld[2] = {{.needle = ":2: malformed section header", .rounds = 2000},
                    {.needle = ":1: malformed section header", .rounds = 2000}};
    int written = write_ini(ld[0].path, sizeof ld[0].path, "; first\n[cache\nalpha = 1\n") &&
                  write_ini(ld[1].path, sizeof ld[1].path, "[cache\nbeta = x\n");
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *err = tmpfile();
    dup2(fileno(err), STDERR_FILENO);
    pthread_t th[2];
    int started = 0;
    for (int i = 0; i < 2; i++)
        started += pthread_create(&th[i], NULL, load_many, &ld[i]) == 0;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    long printed = ftell(err) < 0 ? -1 : (fseek(err, 0, SEEK_END), ftell(err));
    fclose(err);
    ok(written && started == 2 && ld[0].right == ld[0].rounds && ld[1].right == ld[1].rounds,
       "two threads loading bad files at once each get their own message (%d and %d of %d)",
       ld[0].right, ld[1].right, ld[0].rounds);
    ok(printed == 0, "concurrent loads print nothing to stderr (%ld bytes)", printed);
    unlink(ld[0].path);
    unlink(ld[1].path);
}

/* pv_cache_peek tells a shadowed chunk from a device one and counts no hit. */
static void peek(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 4, 4, &clk);
    uint32_t slot;
    pv_tier tier;
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "s");
    for (uint32_t c = 0; c < 4; c++)
        pv_cache_store_chunk(cache, "s", c, 0, PV_TIER_DEVICE, &slot);
    clk.now = 10;
    /* 4 of 4 device slots used, above the high-water mark: chunk 0 copies out. */
    pv_status st = pv_cache_plan_swap_out(cache, 1, &plan);
    if (st == PV_OK && plan.n_moves == 1)
        st = pv_cache_complete(cache, plan.moves, 1);
    pv_cache_stats before, after;
    pv_cache_stats_get(cache, &before);
    pv_tier t0 = PV_TIER_NONE, t1 = PV_TIER_NONE, t9 = PV_TIER_DEVICE;
    uint32_t s0 = 0, sh0 = 0, s1 = 0, sh1 = 0;
    if (st == PV_OK)
        st = pv_cache_peek(cache, "s", 0, 0, &t0, &s0, &sh0);
    if (st == PV_OK)
        st = pv_cache_peek(cache, "s", 1, 0, &t1, &s1, &sh1);
    if (st == PV_OK)
        st = pv_cache_peek(cache, "s", 9, 0, &t9, NULL, NULL);
    pv_cache_stats_get(cache, &after);
    ok(st == PV_OK && plan.n_moves == 1 && t0 == PV_TIER_HOST && s0 != UINT32_MAX && sh0 != UINT32_MAX &&
           t1 == PV_TIER_DEVICE && sh1 == UINT32_MAX && t9 == PV_TIER_NONE,
       "peek: a shadowed chunk is HOST with its shadow slot, a device chunk DEVICE, a missing one NONE "
       "(%s; %zu moves; chunk 0 %s slot %u shadow %u, chunk 1 %s, chunk 9 %s)", st == PV_OK ? "ok" : pv_last_error(),
       plan.n_moves, pv_tier_name(t0), s0, sh0, pv_tier_name(t1), pv_tier_name(t9));
    ok(memcmp(&before, &after, sizeof before) == 0, "peek counts no hit or miss");
    st = pv_cache_lookup(cache, "s", 0, 0, &tier, &slot);
    ok(st == PV_OK && tier == PV_TIER_DEVICE && slot == sh0, "lookup reads the same chunk at its shadow");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

int main(void)
{
    peek();
    concurrent_loads();
    sparse_index();
    null_arguments();
    sessions_and_chunks();
    budgets();
    ini_files();
    return tap_done();
}
