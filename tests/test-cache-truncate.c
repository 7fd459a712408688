/* pv_cache_session_truncate: an edited or regenerated turn keeps the
 * history's common prefix. Chunks past the cut leave every tier (shadows
 * included) and their slots are free at once; the chunk holding the last
 * kept token stays; the view, the stats and every invariant follow. */
#include "test-cache-util.h"

#include <inttypes.h>
#include <math.h>

#define CT 32u /* tokens per chunk (the default) */

/* device_slots + host_slots slots; a high-water mark so low that any
 * device chunk is copied out ahead of time when asked. */
static pv_cache *trunc_cache(pv_policy policy, uint32_t n_layers, uint32_t device_slots,
                             uint32_t host_slots, test_clock *clk)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.n_layers = n_layers;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = (uint64_t)device_slots * TEST_SLOT_BYTES;
    cfg.host_bytes = (uint64_t)host_slots * TEST_SLOT_BYTES;
    cfg.high_water = 0.05;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, test_clock_read, clk) != PV_OK)
        tap_diag("pv_cache_init: %s", pv_last_error());
    return cache;
}

static int32_t history[400];

/* What one session must show after a step. */
typedef struct expect {
    size_t n_tokens;
    uint32_t committed, n_chunks, records[3], shadows, recompute, device_slots, host_slots;
} expect;

/* The session's view and the cache's stats (one session: the totals are
 * its own) against e; diagnostics name what differs. */
static int view_is(pv_cache *cache, const char *id, const expect *e, const char *what)
{
    pv_session_view v;
    pv_cache_stats stats;
    if (pv_cache_session_restore(cache, id, &v) != PV_OK || pv_cache_stats_get(cache, &stats) != PV_OK)
        return ok(0, "%s: restore: %s", what, pv_last_error());
    int same = v.n_tokens == e->n_tokens && v.committed_tokens == e->committed &&
               v.n_chunks == e->n_chunks && v.records[0] == e->records[0] &&
               v.records[1] == e->records[1] && v.records[2] == e->records[2] &&
               v.shadows == e->shadows && v.recompute_tokens == e->recompute &&
               v.held_bytes[PV_TIER_DEVICE] == (uint64_t)e->device_slots * TEST_SLOT_BYTES &&
               v.held_bytes[PV_TIER_HOST] == (uint64_t)e->host_slots * TEST_SLOT_BYTES &&
               stats.used_bytes[PV_TIER_DEVICE] == v.held_bytes[PV_TIER_DEVICE] &&
               stats.used_bytes[PV_TIER_HOST] == v.held_bytes[PV_TIER_HOST] &&
               stats.records[0] == e->records[0] && stats.records[1] == e->records[1] &&
               stats.records[2] == e->records[2] && stats.shadow_chunks == e->shadows &&
               stats.shadow_bytes == (uint64_t)e->shadows * TEST_SLOT_BYTES && stats.sessions == 1 &&
               (e->n_tokens == 0 || memcmp(v.tokens, history, e->n_tokens * sizeof *history) == 0);
    if (!same)
        tap_diag("view: %zu tokens, %u committed, %u chunks, records %u/%u/%u, %u shadows, recompute "
                 "%u, held %llu/%llu; stats used %llu/%llu, shadows %llu",
                 v.n_tokens, v.committed_tokens, v.n_chunks, v.records[0], v.records[1], v.records[2],
                 v.shadows, v.recompute_tokens, (unsigned long long)v.held_bytes[0],
                 (unsigned long long)v.held_bytes[1], (unsigned long long)stats.used_bytes[0],
                 (unsigned long long)stats.used_bytes[1], (unsigned long long)stats.shadow_chunks);
    return ok(same, "%s: view and stats as expected", what);
}

/* Session "t", 200 tokens (chunks 0-6), 2 layers, every kind of record:
 *   chunk 0: L0 DEVICE, L1 DROPPED       chunk 3: L0 DEVICE, L1 HOST + shadow
 *   chunk 1: L0 HOST,   L1 HOST          chunk 4: L0 DROPPED, L1 DEVICE
 *   chunk 2: L0 HOST + shadow, L1 DEVICE chunk 5: never stored
 *                                        chunk 6: L0 DEVICE (tokens 192-199)
 * 5 DEVICE records + 2 shadows = 7 of 8 device slots; 4 of 8 host slots. */
static pv_cache *every_tier(test_clock *clk, pv_policy policy)
{
    pv_cache *cache = trunc_cache(policy, 2, 8, 8, clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "t");
    pv_cache_append_tokens(cache, "t", history, 200);
    pv_cache_session_save(cache, "t", 200);
    pv_cache_store_chunk(cache, "t", 0, 1, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "t", 4, 0, PV_TIER_HOST, NULL);
    clk->now += 1;
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 8 * TEST_SLOT_BYTES, &plan); /* both dropped */
    pv_cache_store_chunk(cache, "t", 2, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "t", 3, 1, PV_TIER_DEVICE, NULL);
    pv_cache_plan_clear(&plan);
    clk->now += 1;
    pv_cache_plan_swap_out(cache, 2, &plan); /* both copied out, shadows left */
    pv_cache_complete(cache, plan.moves, plan.n_moves);
    pv_cache_store_chunk(cache, "t", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "t", 1, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "t", 1, 1, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "t", 2, 1, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "t", 3, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "t", 4, 1, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "t", 6, 0, PV_TIER_DEVICE, NULL);
    pv_cache_plan_free(&plan);
    return cache;
}

static int tiers_are(pv_cache *cache, const char *id, uint32_t chunk, pv_tier l0, pv_tier l1)
{
    pv_tier t0, t1;
    return pv_cache_peek(cache, id, chunk, 0, &t0, NULL, NULL) == PV_OK &&
           pv_cache_peek(cache, id, chunk, 1, &t1, NULL, NULL) == PV_OK && t0 == l0 && t1 == l1;
}

/* Cuts 200 -> past the end -> 192 -> 100 -> 64 -> 1 -> 0 tokens. */
static void cut_through_every_tier(void)
{
    test_clock clk = {0};
    pv_cache *cache = every_tier(&clk, PV_POLICY_PENSIEVE);
    expect e = {200, 200, 7, {5, 4, 2}, 2, 5 * CT, 7, 4};
    ok(tiers_are(cache, "t", 2, PV_TIER_HOST, PV_TIER_DEVICE) &&
           tiers_are(cache, "t", 3, PV_TIER_DEVICE, PV_TIER_HOST) &&
           tiers_are(cache, "t", 4, PV_TIER_DROPPED, PV_TIER_DEVICE) &&
           tiers_are(cache, "t", 5, PV_TIER_NONE, PV_TIER_NONE),
       "the fixture holds device, host, shadowed and dropped records");
    view_is(cache, "t", &e, "the fixture");
    check_ok(cache, "the fixture");

    pv_session_view before, after;
    pv_cache_session_restore(cache, "t", &before);
    ok(pv_cache_session_truncate(cache, "t", 200) == PV_OK &&
           pv_cache_session_truncate(cache, "t", 1000) == PV_OK,
       "a cut at or past the history's end succeeds");
    pv_cache_session_restore(cache, "t", &after);
    ok(same_view(&before, &after), "and changes nothing");

    /* Inside chunk 6 would keep it; at 192 (a boundary) chunk 6 goes and
     * chunk 5, never stored, is no chunk of the view: 5 chunks remain. */
    ok(pv_cache_session_truncate(cache, "t", 192) == PV_OK, "cut at 192 tokens, a chunk boundary");
    e = (expect){192, 192, 5, {4, 4, 2}, 2, 5 * CT, 6, 4};
    view_is(cache, "t", &e, "192 tokens: chunk 6 freed, n_chunks 5 (chunk 5 was never stored)");
    ok(tiers_are(cache, "t", 6, PV_TIER_NONE, PV_TIER_NONE), "chunk 6 is gone");
    check_ok(cache, "after the cut at 192");

    ok(pv_cache_session_truncate(cache, "t", 100) == PV_OK, "cut at 100 tokens, inside chunk 3");
    e = (expect){100, 100, 4, {3, 4, 1}, 2, CT, 5, 4};
    view_is(cache, "t", &e, "100 tokens: chunk 4 (device + dropped) freed");
    ok(tiers_are(cache, "t", 3, PV_TIER_DEVICE, PV_TIER_HOST) && tier_of(cache, "t", 3, 1) == PV_TIER_DEVICE &&
           tiers_are(cache, "t", 4, PV_TIER_NONE, PV_TIER_NONE),
       "chunk 3, holding token 99, stays where it was (its shadow too)");
    check_ok(cache, "after the cut at 100");

    ok(pv_cache_session_truncate(cache, "t", 64) == PV_OK, "cut at 64 tokens, a chunk boundary");
    e = (expect){64, 64, 2, {1, 2, 1}, 0, CT, 1, 2};
    view_is(cache, "t", &e, "64 tokens: chunks 2 and 3 freed with both shadows");
    ok(tiers_are(cache, "t", 2, PV_TIER_NONE, PV_TIER_NONE) &&
           tiers_are(cache, "t", 3, PV_TIER_NONE, PV_TIER_NONE) &&
           tiers_are(cache, "t", 1, PV_TIER_HOST, PV_TIER_HOST),
       "chunks 2-3 gone, chunk 1 still in host");
    check_ok(cache, "after the cut at 64");

    /* The freed device slots serve new stores at once, no eviction. */
    static const uint32_t fresh[7][2] = {{2, 0}, {2, 1}, {3, 0}, {3, 1}, {4, 0}, {4, 1}, {5, 0}};
    uint32_t stored = 0;
    for (int i = 0; i < 7; i++)
        stored += pv_cache_store_chunk(cache, "t", fresh[i][0], fresh[i][1], PV_TIER_DEVICE, NULL) == PV_OK;
    ok(stored == 7, "the 7 free device slots take 7 new chunks without eviction (%u)", stored);
    pv_cache_append_tokens(cache, "t", history + 64, 128);
    e = (expect){192, 64, 6, {8, 2, 1}, 0, CT, 8, 2};
    view_is(cache, "t", &e, "grown again to 192 tokens");
    ok(tier_of(cache, "t", 5, 0) == PV_TIER_DEVICE && tier_of(cache, "t", 5, 1) == PV_TIER_NONE &&
           tier_of(cache, "t", 0, 1) == PV_TIER_DROPPED,
       "lookups after the regrowth");
    check_ok(cache, "after the regrowth");
    ok(pv_cache_session_truncate(cache, "t", 64) == PV_OK, "cut at 64 again");

    ok(pv_cache_session_truncate(cache, "t", 1) == PV_OK, "cut at 1 token");
    e = (expect){1, 1, 1, {1, 0, 1}, 0, 1, 1, 0};
    view_is(cache, "t", &e, "1 token: chunk 0 only, recompute capped at the history");
    check_ok(cache, "after the cut at 1");

    ok(pv_cache_session_truncate(cache, "t", 0) == PV_OK, "cut at 0 tokens");
    e = (expect){0, 0, 0, {0, 0, 0}, 0, 0, 0, 0};
    view_is(cache, "t", &e, "0 tokens: nothing held, the session still open");
    check_ok(cache, "after the cut at 0");
    ok(pv_cache_session_truncate(cache, "t", 0) == PV_OK, "cutting an empty session is a no-op");

    /* Everything from scratch, a far chunk included (the index regrows). */
    pv_cache_append_tokens(cache, "t", history, 40);
    ok(pv_cache_store_chunk(cache, "t", 0, 0, PV_TIER_DEVICE, NULL) == PV_OK &&
           pv_cache_store_chunk(cache, "t", 1, 1, PV_TIER_HOST, NULL) == PV_OK &&
           pv_cache_store_chunk(cache, "t", 300, 0, PV_TIER_DEVICE, NULL) == PV_OK,
       "stores after emptying, chunk 300 included");
    ok(tier_of(cache, "t", 0, 0) == PV_TIER_DEVICE && tier_of(cache, "t", 1, 1) == PV_TIER_HOST &&
           tier_of(cache, "t", 300, 0) == PV_TIER_DEVICE && tier_of(cache, "t", 299, 0) == PV_TIER_NONE,
       "lookups of the new chunks");
    ok(pv_cache_session_truncate(cache, "t", 33) == PV_OK, "cut at 33 tokens: chunk 300 goes");
    e = (expect){33, 0, 2, {1, 1, 0}, 0, 0, 1, 1};
    view_is(cache, "t", &e, "33 tokens: chunks 0 and 1 left");
    check_ok(cache, "after the cut past the far chunk");
    uint64_t freed = 0;
    ok(pv_cache_end_session(cache, "t", &freed) == PV_OK && freed == 2 * TEST_SLOT_BYTES,
       "end_session frees the 2 slots left");
    check_ok(cache, "after end_session");
    pv_cache_free(cache);
}

/* Pinned, or a chunk past the cut under copy: PV_ERR_BUSY, nothing changed. */
static void busy(void)
{
    test_clock clk = {0};
    pv_cache *cache = trunc_cache(PV_POLICY_PENSIEVE, 2, 8, 8, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "b");
    pv_cache_append_tokens(cache, "b", history, 96);
    for (uint32_t c = 0; c < 3; c++)
        pv_cache_store_chunk(cache, "b", c, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "b", 2, 1, PV_TIER_HOST, NULL);
    pv_session_view before, after;
    pv_cache_stats s0, s1;
    pv_cache_pin(cache, "b");
    pv_cache_session_restore(cache, "b", &before);
    pv_cache_stats_get(cache, &s0);
    ok(pv_cache_session_truncate(cache, "b", 40) == PV_ERR_BUSY && strstr(pv_last_error(), "pinned 1 times"),
       "pinned: busy (%s)", pv_last_error());
    ok(pv_cache_session_truncate(cache, "b", 96) == PV_OK, "a no-op cut succeeds while pinned");
    pv_cache_session_restore(cache, "b", &after);
    pv_cache_stats_get(cache, &s1);
    ok(same_view(&before, &after) && memcmp(&s0, &s1, sizeof s0) == 0, "nothing changed");
    pv_cache_unpin(cache, "b");

    /* Chunk 0 and then chunk 1 are copied out ahead of time (layer 0). */
    clk.now = 1;
    ok(pv_cache_plan_swap_out(cache, 2, &plan) == PV_OK && plan.n_moves == 2 && plan.moves[0].chunk == 0 &&
           plan.moves[1].chunk == 1,
       "chunks 0 and 1 under copy to host");
    pv_cache_session_restore(cache, "b", &before);
    pv_cache_stats_get(cache, &s0);
    ok(pv_cache_session_truncate(cache, "b", 10) == PV_ERR_BUSY &&
           strstr(pv_last_error(), "chunk 1 layer 0") && strstr(pv_last_error(), "under copy"),
       "a swap-out past the cut: busy (%s)", pv_last_error());
    pv_cache_session_restore(cache, "b", &after);
    pv_cache_stats_get(cache, &s1);
    ok(same_view(&before, &after) && memcmp(&s0, &s1, sizeof s0) == 0, "nothing changed");
    check_ok(cache, "after the refused cut");
    ok(pv_cache_session_truncate(cache, "b", 64) == PV_OK, "a cut sparing the copies goes ahead (64 tokens)");
    ok(tier_of(cache, "b", 2, 0) == PV_TIER_NONE && tier_of(cache, "b", 2, 1) == PV_TIER_NONE, "chunk 2 freed");
    ok(pv_cache_complete(cache, plan.moves, 2) == PV_OK, "the copies kept land afterwards");
    check_ok(cache, "after the copies landed");
    ok(pv_cache_session_truncate(cache, "b", 10) == PV_OK, "now the cut at 10 goes ahead");
    expect e = {10, 0, 1, {0, 1, 0}, 1, 0, 1, 1};
    view_is(cache, "b", &e, "10 tokens: chunk 1 and its shadow freed");
    check_ok(cache, "after the cut at 10");

    /* A swap-in past the cut: busy until aborted. */
    pv_cache_append_tokens(cache, "b", history + 10, 54);
    pv_cache_store_chunk(cache, "b", 1, 0, PV_TIER_HOST, NULL);
    pv_cache_plan_clear(&plan);
    ok(pv_cache_plan_swap_in(cache, "b", &plan) == PV_OK && plan.n_moves == 1 && plan.moves[0].chunk == 1,
       "chunk 1 under copy to device");
    pv_cache_session_restore(cache, "b", &before);
    ok(pv_cache_session_truncate(cache, "b", 32) == PV_ERR_BUSY && strstr(pv_last_error(), "chunk 1 layer 0"),
       "a swap-in past the cut: busy (%s)", pv_last_error());
    pv_cache_session_restore(cache, "b", &after);
    ok(same_view(&before, &after), "nothing changed");
    ok(pv_cache_abort(cache, plan.moves, 1) == PV_OK && pv_cache_session_truncate(cache, "b", 32) == PV_OK,
       "after the abort the cut goes ahead");
    e = (expect){32, 0, 1, {0, 1, 0}, 1, 0, 1, 1};
    view_is(cache, "b", &e, "32 tokens: chunk 0 in host with its shadow");
    check_ok(cache, "after the cut at 32");
    ok(pv_cache_session_truncate(cache, "ghost", 0) == PV_ERR_NOT_FOUND && strstr(pv_last_error(), "\"ghost\""),
       "an unknown session: %s", pv_last_error());
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Several layers, weighted policy: the position weight follows the new
 * n_chunks, and the eviction order after a cut is the one over what is left. */
static void layers_and_weights(void)
{
    test_clock clk = {0};
    pv_cache *cache = trunc_cache(PV_POLICY_WEIGHTED, 4, 32, 32, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "w");
    pv_cache_append_tokens(cache, "w", history, 8 * CT);
    for (uint32_t c = 0; c < 8; c++)
        for (uint32_t l = 0; l < 4; l++)
            pv_cache_store_chunk(cache, "w", c, l, c % 2 ? PV_TIER_HOST : PV_TIER_DEVICE, NULL);
    clk.now = 2;
    double v8 = 0, v3 = 0;
    pv_cache_retention_value(cache, "w", 1, 2, &v8);
    ok(pv_cache_session_truncate(cache, "w", 3 * CT - 5) == PV_OK, "cut 4 layers x 8 chunks to 3 chunks");
    pv_cache_retention_value(cache, "w", 1, 2, &v3);
    ok(v3 > 2.66 * v8 && v3 < 2.67 * v8, "the position weight of chunk 1 is now 2/3, was 2/8 (%g -> %g)", v8, v3);
    expect e = {3 * CT - 5, 0, 3, {8, 4, 0}, 0, 0, 8, 4};
    view_is(cache, "w", &e, "3 chunks x 4 layers left");
    check_ok(cache, "after the cut");
    /* Device holds chunks 0 and 2: evicting all 8 starts with the cheapest,
     * chunk 0 layer 3 (weights 1/4 x 1/3), and ends with chunk 2 layer 0
     * (weights 1 x 3/3). */
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 32 * TEST_SLOT_BYTES, &plan) == PV_OK && plan.n_moves == 8 &&
           plan.moves[0].chunk == 0 && plan.moves[0].layer == 3 && plan.moves[7].chunk == 2 &&
           plan.moves[7].layer == 0,
       "evictions after the cut take the chunks left, cheapest first");
    check_ok(cache, "after evicting what is left");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* pv_cache_session_trim: chunks stored ahead of the history (for tokens
 * that never ran) go; the history's own chunks, its last partial one
 * included, stay. */
static void trim_ahead(void)
{
    test_clock clk = {0};
    pv_cache *cache = trunc_cache(PV_POLICY_PENSIEVE, 2, 8, 8, &clk);
    pv_cache_session_open(cache, "a");
    pv_cache_append_tokens(cache, "a", history, 40); /* chunks 0 and 1 (tokens 32-39) */
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "a", c, l, PV_TIER_DEVICE, NULL);
    pv_session_view before, after;
    pv_cache_session_restore(cache, "a", &before);
    ok(pv_cache_session_trim(cache, "a") == PV_OK, "trim with nothing ahead of the history");
    pv_cache_session_restore(cache, "a", &after);
    ok(same_view(&before, &after), "changes nothing");
    /* Chunk 2 on DEVICE and chunk 3 on HOST, ahead of the 40 tokens. */
    pv_cache_store_chunk(cache, "a", 2, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "a", 2, 1, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "a", 3, 1, PV_TIER_HOST, NULL);
    pv_cache_pin(cache, "a");
    ok(pv_cache_session_trim(cache, "a") == PV_ERR_BUSY && strstr(pv_last_error(), "pv_cache_session_trim") &&
           strstr(pv_last_error(), "pinned 1 times"),
       "pinned: busy (%s)", pv_last_error());
    pv_cache_unpin(cache, "a");
    ok(pv_cache_session_trim(cache, "a") == PV_OK, "trim with chunks 2 and 3 ahead of a 40-token history");
    expect e = {40, 0, 2, {4, 0, 0}, 0, 0, 4, 0};
    view_is(cache, "a", &e, "chunks 0 and 1 left, every slot of 2 and 3 free");
    ok(tiers_are(cache, "a", 1, PV_TIER_DEVICE, PV_TIER_DEVICE) && tiers_are(cache, "a", 2, PV_TIER_NONE, PV_TIER_NONE) &&
           tiers_are(cache, "a", 3, PV_TIER_NONE, PV_TIER_NONE),
       "the partial chunk 1 stays; chunks 2 and 3 are gone");
    check_ok(cache, "after the trim");
    /* An empty history: every chunk is ahead of it. */
    pv_cache_session_open(cache, "empty");
    pv_cache_store_chunk(cache, "empty", 0, 0, PV_TIER_DEVICE, NULL);
    uint64_t dev = 1;
    ok(pv_cache_session_trim(cache, "empty") == PV_OK && pv_cache_held_bytes(cache, "empty", &dev, NULL) == PV_OK &&
           dev == 0,
       "a session with no history keeps no chunk");
    ok(pv_cache_session_trim(cache, "ghost") == PV_ERR_NOT_FOUND && strstr(pv_last_error(), "\"ghost\""),
       "an unknown session: %s", pv_last_error());
    check_ok(cache, "after trimming the empty session");
    pv_cache_free(cache);
}

/* A restored session: chunks whose bytes were not kept are marked DROPPED
 * (recomputed through them on the next turn), its idle time carries over
 * and ranks its chunks in eviction. */
static void restore_marks(void)
{
    test_clock clk = {100};
    pv_cache *cache = trunc_cache(PV_POLICY_PENSIEVE, 2, 8, 8, &clk);
    pv_cache_session_open(cache, "a");
    pv_cache_append_tokens(cache, "a", history, 70); /* chunks 0, 1, 2 */
    pv_cache_store_chunk(cache, "a", 0, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "a", 2, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "a", 2, 1, PV_TIER_HOST, NULL);
    ok(pv_cache_mark_dropped(cache, "a", 0, 0) == PV_OK && pv_cache_mark_dropped(cache, "a", 0, 1) == PV_OK &&
           pv_cache_mark_dropped(cache, "a", 1, 0) == PV_OK && pv_cache_mark_dropped(cache, "a", 1, 1) == PV_OK,
       "mark_dropped: chunk 0 (one layer on HOST) and chunk 1 (never stored)");
    expect e = {70, 0, 3, {0, 2, 4}, 0, 64, 0, 2};
    view_is(cache, "a", &e, "chunk 0's HOST slot is free; 64 tokens to recompute, chunk 2 kept");
    ok(pv_cache_mark_dropped(cache, "a", 1, 1) == PV_OK, "marking a dropped chunk again is a no-op");
    view_is(cache, "a", &e, "the same view after it");
    check_ok(cache, "after the marks");
    pv_cache_stats st;
    pv_cache_stats_get(cache, &st);
    ok(st.dropped_chunks == 0, "marks are not counted as evictions (%" PRIu64 ")", st.dropped_chunks);
    ok(pv_cache_mark_dropped(cache, "a", 0, 2) == PV_ERR_INVALID_ARG && pv_cache_mark_dropped(cache, "b", 0, 0) ==
                                                                             PV_ERR_NOT_FOUND,
       "a layer out of range, an unknown session");
    /* Two sessions' HOST chunks, same costs: the one idle longer goes first. */
    pv_cache_session_open(cache, "b");
    pv_cache_append_tokens(cache, "b", history, 70);
    pv_cache_store_chunk(cache, "b", 2, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "b", 2, 1, PV_TIER_HOST, NULL);
    clk.now = 200;
    ok(pv_cache_session_set_active(cache, "b", 150) == PV_OK && pv_cache_session_set_active(cache, "a", 50) == PV_OK,
       "set_active: b last active at 150, a at 50");
    ok(pv_cache_session_set_active(cache, "a", 201) == PV_ERR_INVALID_ARG &&
           pv_cache_session_set_active(cache, "a", NAN) == PV_ERR_INVALID_ARG,
       "set_active: a time after now, NaN refused");
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    ok(pv_cache_evict_to_free(cache, PV_TIER_HOST, 5 * TEST_SLOT_BYTES, &plan) == PV_OK && plan.n_moves == 1 &&
           strcmp(pv_cache_session_name(cache, plan.moves[0].session), "a") == 0,
       "evicting one HOST slot takes the longer-idle session's chunk");
    check_ok(cache, "after set_active and the eviction");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

int main(void)
{
    for (int i = 0; i < 400; i++)
        history[i] = 7000 + i;
    cut_through_every_tier();
    busy();
    layers_and_weights();
    trim_ahead();
    restore_marks();
    return tap_done();
}
