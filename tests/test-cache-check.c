/* pv_cache_check() must detect each invariant broken on purpose (through
 * the test-only hook pv_cache_test_corrupt) and name it: a check that
 * always answers PV_OK fails here. */
#include "test-cache-util.h"

#include "pvcore/cache_internal.h"

/* A cache holding every kind of state the invariants speak of: DEVICE,
 * HOST and DROPPED records, a device shadow, a pinned session and an
 * ended one (a free handle). */
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
        "pin list",   "session table",
    };
    test_clock clk = {0};
    pv_cache *cache = populated(&clk);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.records[PV_TIER_DEVICE] == 7 && stats.records[PV_TIER_HOST] == 2 &&
           stats.records[PV_TIER_DROPPED] == 2 && stats.shadow_chunks == 1 && stats.sessions == 3,
       "the fixture holds device, host, dropped records and a shadow (%llu/%llu/%llu, %llu)",
       (unsigned long long)stats.records[0], (unsigned long long)stats.records[1],
       (unsigned long long)stats.records[2], (unsigned long long)stats.shadow_chunks);
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
