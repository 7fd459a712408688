/* pv_cache_check() must detect each invariant broken on purpose (through
 * the test-only hook pv_cache_test_corrupt) and name it: a check that
 * always answers PV_OK fails here. */
#include "test-cache-util.h"

#include "pvcore/cache_internal.h"

/* A cache holding every kind of state the invariants speak of: DEVICE,
 * HOST and DROPPED records, a device shadow, a pinned session, an ended
 * one (a free handle), and two sessions sharing two chunks (in HOST). */
static pv_cache *populated(test_clock *clk)
{
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 10, 8, clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    clk->now = 0;
    pv_cache_session_open(cache, "b");
    pv_cache_store_chunk(cache, "b", 0, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "b", 1, 0, PV_TIER_HOST, NULL);
    clk->now = 1;
    pv_cache_session_open(cache, "a");
    for (uint32_t c = 0; c < 4; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "a", c, l, PV_TIER_DEVICE, NULL);
    clk->now = 2;
    /* 8 of 10 device slots in use, above the 0.75 high water: one copy out. */
    pv_cache_plan_swap_out(cache, 1, &plan);
    pv_cache_complete(cache, plan.moves, plan.n_moves);
    clk->now = 3;
    pv_cache_touch(cache, "a");
    pv_cache_plan_clear(&plan);
    /* b is the coldest: both its host chunks are dropped. */
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 7 * TEST_SLOT_BYTES, &plan);
    pv_cache_session_open(cache, "p");
    pv_cache_store_chunk(cache, "p", 0, 0, PV_TIER_HOST, NULL);
    pv_cache_pin(cache, "p");
    cache->cfg.share_prefixes = 1;
    const uint32_t ct = cache->cfg.chunk_tokens;
    int32_t tokens[2 * 32 + 1];
    for (uint32_t i = 0; i < 2 * ct + 1; i++)
        tokens[i] = (int32_t)(100 + i);
    pv_cache_session_open(cache, "s1");
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "s1", c, l, PV_TIER_HOST, NULL);
    pv_cache_append_tokens(cache, "s1", tokens, 2 * ct + 1);
    pv_cache_session_save(cache, "s1", 2 * ct + 1);
    pv_cache_session_open(cache, "s2");
    pv_cache_share_prefix(cache, "s2", NULL, 0, tokens, 2 * ct + 1, NULL);
    pv_cache_session_open(cache, "e");
    pv_cache_end_session(cache, "e", NULL);
    pv_cache_plan_free(&plan);
    return cache;
}

int main(void)
{
    static const char *const invariants[] = {
        "one tier",   "byte counters", "record counters", "session index", "ended session",
        "free list",  "shadow",        "copies",          "frontier",      "eviction tree",
        "pin list",   "session table", "shared chunks",   "reference counts", "share map",
    };
    test_clock clk = {0};
    pv_cache *cache = populated(&clk);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.records[PV_TIER_DEVICE] == 7 && stats.records[PV_TIER_HOST] == 6 &&
           stats.records[PV_TIER_DROPPED] == 2 && stats.shadow_chunks == 1 && stats.sessions == 5 &&
           stats.shared_chunks == 2 && stats.shared_links == 4,
       "the fixture holds device, host, dropped records, a shadow and two shared chunks (%llu/%llu/%llu, %llu, "
       "%llu shared, %llu links)",
       (unsigned long long)stats.records[0], (unsigned long long)stats.records[1],
       (unsigned long long)stats.records[2], (unsigned long long)stats.shadow_chunks,
       (unsigned long long)stats.shared_chunks, (unsigned long long)stats.shared_links);
    check_ok(cache, "the fixture before any corruption");
    pv_cache_free(cache);
    for (size_t i = 0; i < sizeof invariants / sizeof invariants[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "invariant \"%s\" violated", invariants[i]);
        cache = populated(&clk);
        pv_status corrupt = pv_cache_test_corrupt(cache, invariants[i]);
        pv_status st = pv_cache_check(cache);
        ok(corrupt == PV_OK && st == PV_ERR_STATE && strstr(pv_last_error(), want),
           "\"%s\" broken: %s", invariants[i], pv_last_error());
        /* The corrupted cache is only freed: nothing else may touch it. */
        pv_cache_free(cache);
    }
    return tap_done();
}
