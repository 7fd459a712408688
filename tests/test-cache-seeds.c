/* One test per scenario of seeds 000-004: the bugs they describe must not
 * come back. */
#include "test-cache-util.h"

#include <math.h>

/* Seed 000: evicting from HOST keeps the chunk in the session's index (as
 * DROPPED) and gives its bytes back. */
static void host_eviction_bookkeeping(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 4, 2, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "user_123");
    for (uint32_t c = 0; c < 2; c++)
        pv_cache_store_chunk(cache, "user_123", c, 0, PV_TIER_HOST, NULL);
    clk.now = 10;
    uint64_t dev, host;
    pv_cache_held_bytes(cache, NULL, &dev, &host);
    ok(host == 2 * TEST_SLOT_BYTES && dev == 0, "two host chunks held: %llu host bytes",
       (unsigned long long)host);
    ok(pv_cache_evict_to_free(cache, PV_TIER_HOST, 2 * TEST_SLOT_BYTES, &plan) == PV_OK,
       "evict both host chunks");
    ok(plan.n_moves == 2 && plan.moves[0].to == PV_TIER_DROPPED && plan.moves[0].chunk == 0,
       "plan drops the leading chunk first (%zu moves)", plan.n_moves);
    pv_cache_held_bytes(cache, NULL, &dev, &host);
    ok(host == 0, "host bytes back to 0 after the drop");
    ok(tier_of(cache, "user_123", 0, 0) == PV_TIER_DROPPED &&
           tier_of(cache, "user_123", 1, 0) == PV_TIER_DROPPED,
       "dropped chunks are still indexed");
    pv_session_view view;
    pv_cache_session_restore(cache, "user_123", &view);
    ok(view.records[PV_TIER_DROPPED] == 2 && view.records[PV_TIER_HOST] == 0,
       "session index lists 2 dropped, 0 host records");
    check_ok(cache, "after host eviction");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Seed 001: a device victim goes straight to DROPPED when HOST is full of
 * chunks that cannot (pinned) or should not (warmer) leave, and stays indexed. */
static void device_to_dropped_when_host_full(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 2, 2, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "busy");
    pv_cache_session_open(cache, "idle");
    pv_cache_store_chunk(cache, "busy", 0, 0, PV_TIER_HOST, NULL);
    pv_cache_store_chunk(cache, "busy", 1, 0, PV_TIER_HOST, NULL);
    pv_cache_pin(cache, "busy");
    pv_cache_store_chunk(cache, "idle", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "idle", 1, 0, PV_TIER_DEVICE, NULL);
    clk.now = 5;
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, TEST_SLOT_BYTES, &plan) == PV_OK,
       "evict one device chunk with host full of pinned chunks");
    ok(plan.n_moves == 1 && plan.moves[0].from == PV_TIER_DEVICE &&
           plan.moves[0].to == PV_TIER_DROPPED && plan.moves[0].chunk == 0,
       "victim idle/0 goes DEVICE -> DROPPED");
    ok(tier_of(cache, "idle", 0, 0) == PV_TIER_DROPPED, "dropped chunk is still indexed");
    ok(tier_of(cache, "busy", 0, 0) == PV_TIER_HOST, "pinned host chunk untouched");
    check_ok(cache, "after device -> dropped");

    /* Unpinned and colder than the victim: the host chunk is dropped and
     * the victim takes its host slot. */
    pv_cache_unpin(cache, "busy"); /* busy active at 5 */
    pv_cache_plan_clear(&plan);
    clk.now = 1000;
    pv_cache_touch(cache, "idle"); /* idle now warmer than busy */
    clk.now = 1001;
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan) == PV_OK,
       "evict the last device chunk with host full of colder chunks");
    ok(plan.n_moves == 2 && plan.moves[0].from == PV_TIER_HOST &&
           plan.moves[0].to == PV_TIER_DROPPED && plan.moves[1].from == PV_TIER_DEVICE &&
           plan.moves[1].to == PV_TIER_HOST && plan.moves[1].to_slot == plan.moves[0].from_slot,
       "plan: drop busy's host chunk, then copy the victim into that host slot");
    ok(tier_of(cache, "idle", 1, 0) == PV_TIER_HOST, "victim now in host");
    check_ok(cache, "after host drop + swap-out");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Seed 002: a recomputed chunk replaces its swapped-out copy; no duplicate. */
static void recovered_chunk_replaces_copy(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 2, 2, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "s1");
    pv_cache_store_chunk(cache, "s1", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "s1", 0, 1, PV_TIER_DEVICE, NULL);
    clk.now = 1;
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan);
    ok(tier_of(cache, "s1", 0, 0) == PV_TIER_HOST, "chunk 0 layer 0 swapped out to host");
    uint32_t slot = 99;
    pv_status st = pv_cache_store_chunk(cache, "s1", 0, 0, PV_TIER_DEVICE, &slot);
    ok(st == PV_OK && slot < 2, "store the recomputed chunk on device (slot %u)", slot);
    pv_session_view view;
    pv_cache_session_restore(cache, "s1", &view);
    ok(view.records[PV_TIER_DEVICE] == 1 && view.records[PV_TIER_HOST] == 1,
       "one device + one host record: the old host copy is gone");
    uint64_t dev, host;
    pv_cache_held_bytes(cache, NULL, &dev, &host);
    ok(dev == TEST_SLOT_BYTES && host == TEST_SLOT_BYTES, "counters: %llu device, %llu host bytes",
       (unsigned long long)dev, (unsigned long long)host);
    check_ok(cache, "after replacing a host copy");

    /* And a dropped record replaced by its recomputation. */
    pv_cache_plan_clear(&plan);
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 2 * TEST_SLOT_BYTES, &plan);
    ok(tier_of(cache, "s1", 0, 1) == PV_TIER_DROPPED, "layer 1 dropped");
    ok(pv_cache_store_chunk(cache, "s1", 0, 1, PV_TIER_DEVICE, NULL) == PV_OK,
       "store its recomputation");
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.records[PV_TIER_DROPPED] == 0 && stats.recomputed_chunks == 1 &&
           stats.recomputed_tokens == 32,
       "no dropped record left; 1 chunk, 32 tokens recomputed");
    check_ok(cache, "after replacing a dropped record");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Seeds 000-001: end_session with chunks in all three tiers frees all. */
static void end_session_all_tiers(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 4, 4, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "user_123");
    pv_cache_session_open(cache, "other");
    pv_cache_store_chunk(cache, "other", 0, 0, PV_TIER_DEVICE, NULL);
    for (uint32_t c = 0; c < 3; c++)
        pv_cache_store_chunk(cache, "user_123", c, 0, PV_TIER_DEVICE, NULL);
    clk.now = 3;
    pv_cache_touch(cache, "other");
    clk.now = 4;
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 1 * TEST_SLOT_BYTES, &plan); /* chunk 0 -> host */
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan); /* chunk 1 -> host */
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 3 * TEST_SLOT_BYTES, &plan);   /* chunk 0 dropped */
    ok(tier_of(cache, "user_123", 0, 0) == PV_TIER_DROPPED &&
           tier_of(cache, "user_123", 1, 0) == PV_TIER_HOST &&
           tier_of(cache, "user_123", 2, 0) == PV_TIER_DEVICE,
       "user_123 has chunks dropped, in host and on device");
    uint64_t freed = 0;
    ok(pv_cache_end_session(cache, "user_123", &freed) == PV_OK, "end_session");
    ok(freed == 2 * TEST_SLOT_BYTES, "returns the %llu bytes it held in device + host",
       (unsigned long long)freed);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.records[PV_TIER_DROPPED] == 0 && stats.records[PV_TIER_HOST] == 0 &&
           stats.records[PV_TIER_DEVICE] == 1 && stats.sessions == 1,
       "nothing of it left in any tier; the other session intact");
    pv_tier tier;
    ok(pv_cache_lookup(cache, "user_123", 2, 0, &tier, NULL) == PV_ERR_NOT_FOUND,
       "its chunks are no longer found");
    check_ok(cache, "after end_session");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Pinned chunks (a running request's) are never evicted. */
static void pinned_never_evicted(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 4, 8, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "running");
    pv_cache_session_open(cache, "waiting");
    for (uint32_t l = 0; l < 2; l++) {
        pv_cache_store_chunk(cache, "running", 0, l, PV_TIER_DEVICE, NULL);
        pv_cache_store_chunk(cache, "waiting", 0, l, PV_TIER_DEVICE, NULL);
    }
    pv_cache_pin(cache, "running");
    clk.now = 100; /* running is the longer idle one: only the pin protects it */
    pv_cache_touch(cache, "waiting");
    clk.now = 101;
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 3 * TEST_SLOT_BYTES, &plan) ==
           PV_ERR_OUT_OF_MEMORY,
       "freeing 3 slots with 2 pinned fails: %s", pv_last_error());
    ok(plan.n_moves == 0 && tier_of(cache, "waiting", 0, 0) == PV_TIER_DEVICE,
       "and changes nothing");
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan) == PV_OK &&
           plan.n_moves == 2,
       "freeing 2 slots evicts the unpinned session only");
    int pinned_moved = 0;
    for (size_t i = 0; i < plan.n_moves; i++)
        pinned_moved |= strcmp(pv_cache_session_name(cache, plan.moves[i].session), "running") == 0;
    ok(!pinned_moved && tier_of(cache, "running", 0, 0) == PV_TIER_DEVICE &&
           tier_of(cache, "running", 0, 1) == PV_TIER_DEVICE,
       "pinned chunks stay on device");
    ok(pv_cache_end_session(cache, "running", NULL) == PV_ERR_BUSY, "a pinned session cannot end");
    pv_cache_unpin(cache, "running");
    clk.now = 200;
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 4 * TEST_SLOT_BYTES, &plan) == PV_OK &&
           tier_of(cache, "running", 0, 0) == PV_TIER_HOST,
       "after unpin it can be evicted");
    check_ok(cache, "pin/unpin");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* Seed 003's worked example: 2 layers x 2 chunks of one session, weighted
 * policy, alpha 0.001, beta 0.01, c 0.005. The seed's costs are
 * L1C0 0.00375 < L0C0 0.0075 < L1C1 0.0235 < L0C1 0.047; the order it
 * printed (L1C0, L1C1, L0C1, L0C0) contradicts them: we evict by cost. */
static void seed003_order(void)
{
    test_clock clk = {0};
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = PV_POLICY_WEIGHTED;
    cfg.alpha = 0.001;
    cfg.beta = 0.01;
    cfg.c = 0.005;
    cfg.chunk_tokens = 32;
    cfg.n_layers = 2;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = 4 * TEST_SLOT_BYTES;
    cfg.host_bytes = 4 * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    pv_cache_init(&cache, &cfg, test_clock_read, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "user_1");
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "user_1", c, l, PV_TIER_DEVICE, NULL);
    clk.now = 2;
    static const double want_cost[2][2] = {{0.0075, 0.00375}, {0.047, 0.0235}}; /* [chunk][layer] */
    int costs_ok = 1;
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++) {
            double v;
            pv_cache_retention_value(cache, "user_1", c, l, &v);
            costs_ok &= fabs(v * 2 - want_cost[c][l]) < 1e-12;
        }
    ok(costs_ok, "retention values are the seed's costs over idle time 2");
    static const uint32_t want[4][2] = {{0, 1}, {0, 0}, {1, 1}, {1, 0}}; /* {chunk, layer} */
    int order_ok = 1;
    for (uint32_t i = 0; i < 4; i++) {
        pv_cache_evict_to_free(cache, PV_TIER_DEVICE, (i + 1) * TEST_SLOT_BYTES, &plan);
        order_ok &= plan.n_moves == i + 1 && plan.moves[i].chunk == want[i][0] &&
                    plan.moves[i].layer == want[i][1];
        if (plan.n_moves == i + 1)
            tap_diag("eviction %u: chunk %u layer %u", i + 1, plan.moves[i].chunk, plan.moves[i].layer);
    }
    ok(order_ok, "eviction order L1C0, L0C0, L1C1, L0C1");
    check_ok(cache, "after the worked example");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* What restore must say of a session, worked out from lookups alone. */
typedef struct expected_view {
    uint32_t records[3], shadows, recompute_tokens;
} expected_view;

static expected_view expect_from_lookups(pv_cache *cache, const char *id, uint32_t n_chunks,
                                         uint32_t n_layers, uint32_t chunk_tokens, size_t n_tokens)
{
    expected_view e = {{0, 0, 0}, 0, 0};
    for (uint32_t c = 0; c < n_chunks; c++)
        for (uint32_t l = 0; l < n_layers; l++) {
            pv_tier t = tier_of(cache, id, c, l);
            /* A device hit is a device record or a shadowed host one. */
            if (t < PV_TIER_NONE)
                e.records[t]++;
            if (t == PV_TIER_DROPPED) {
                uint64_t through = (uint64_t)(c + 1) * chunk_tokens;
                e.recompute_tokens = (uint32_t)(through < n_tokens ? through : n_tokens);
            }
        }
    return e;
}

/* Seed 004: a request that is rejected (no room) and retried later restores
 * the session as it is then: the rejected attempt changed nothing (history,
 * turns, pins, copies), and the chunks other sessions moved meanwhile (to
 * host, dropped, copied out ahead of time) show in the retry's view. */
static void restore_after_reject(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 6, 4, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    int32_t tokens[120];
    for (int i = 0; i < 120; i++)
        tokens[i] = 1000 + i;
    /* Turn 1: 80 tokens, chunks 0-2 of both layers on the device. */
    pv_cache_session_open(cache, "stream");
    pv_cache_append_tokens(cache, "stream", tokens, 80);
    for (uint32_t c = 0; c < 3; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "stream", c, l, PV_TIER_DEVICE, NULL);
    ok(pv_cache_session_save(cache, "stream", 80) == PV_OK, "save after turn 1");
    /* Another session takes four device slots: stream's coldest four go to
     * host, then one of them is dropped for room on host. */
    clk.now = 10;
    pv_cache_session_open(cache, "other");
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 4 * TEST_SLOT_BYTES, &plan);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "other", c, l, PV_TIER_DEVICE, NULL);
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 1 * TEST_SLOT_BYTES, &plan);
    pv_session_view before, view;
    pv_cache_session_restore(cache, "stream", &before);
    expected_view e = expect_from_lookups(cache, "stream", 3, 2, 32, 80);
    ok(before.records[PV_TIER_DEVICE] == e.records[PV_TIER_DEVICE] &&
           before.records[PV_TIER_HOST] == e.records[PV_TIER_HOST] &&
           before.records[PV_TIER_DROPPED] == e.records[PV_TIER_DROPPED] &&
           before.recompute_tokens == e.recompute_tokens && e.records[PV_TIER_DROPPED] == 1 &&
           e.records[PV_TIER_HOST] == 3,
       "first restore: %u device, %u host, %u dropped, recompute %u (lookups: %u, %u, %u, %u)",
       before.records[0], before.records[1], before.records[2], before.recompute_tokens,
       e.records[0], e.records[1], e.records[2], e.recompute_tokens);
    /* Turn 2 is tried while "other" runs (pinned): swapping stream in finds
     * no room, and the scheduler rejects the request. */
    pv_cache_pin(cache, "other");
    pv_cache_pin(cache, "stream");
    pv_cache_plan_clear(&plan);
    ok(pv_cache_plan_swap_in(cache, "stream", &plan) == PV_ERR_OUT_OF_MEMORY && plan.n_moves == 0,
       "the swap-in is refused with no moves: %s", pv_last_error());
    pv_cache_unpin(cache, "stream");
    /* Meanwhile "other" ends its turn, two more of stream's host chunks are
     * dropped for room, and stream's two device chunks go out ahead of
     * time: one copy lands (leaving a device shadow), one is abandoned. */
    clk.now = 20;
    pv_cache_unpin(cache, "other");
    pv_cache_plan_clear(&plan);
    pv_cache_evict_to_free(cache, PV_TIER_HOST, 3 * TEST_SLOT_BYTES, &plan);
    pv_cache_plan_clear(&plan);
    pv_cache_plan_swap_out(cache, 2, &plan);
    int stream_copies = 0;
    for (size_t i = 0; i < plan.n_moves; i++)
        stream_copies += plan.moves[i].two_phase &&
                         strcmp(pv_cache_session_name(cache, plan.moves[i].session), "stream") == 0;
    ok(plan.n_moves == 2 && stream_copies == 2 && plan.moves[0].two_phase && plan.moves[1].two_phase,
       "stream's two device chunks are copied out ahead of time (%zu moves)", plan.n_moves);
    if (plan.n_moves == 2) {
        pv_cache_complete(cache, &plan.moves[0], 1);
        pv_cache_abort(cache, &plan.moves[1], 1);
    }
    /* The retry restores what is there now. */
    ok(pv_cache_session_restore(cache, "stream", &view) == PV_OK, "restore for the retry");
    e = expect_from_lookups(cache, "stream", 3, 2, 32, 80);
    uint64_t dev, host;
    pv_cache_held_bytes(cache, "stream", &dev, &host);
    ok(view.committed_tokens == 80 && view.turns == 1 && view.n_tokens == 80 &&
           memcmp(view.tokens, tokens, 80 * sizeof *tokens) == 0 && view.pins == 0,
       "the rejected request changed no history, turn or pin");
    /* A shadowed chunk is a host record read on the device. */
    ok(view.shadows == 1 && view.records[PV_TIER_DEVICE] + view.shadows == e.records[PV_TIER_DEVICE] &&
           view.records[PV_TIER_HOST] == e.records[PV_TIER_HOST] + view.shadows &&
           view.records[PV_TIER_DROPPED] == e.records[PV_TIER_DROPPED] &&
           view.recompute_tokens == e.recompute_tokens,
       "retry: %u device, %u host (%u shadowed), %u dropped, recompute %u; lookups %u, %u, %u, %u",
       view.records[0], view.records[1], view.shadows, view.records[2], view.recompute_tokens,
       e.records[0], e.records[1], e.records[2], e.recompute_tokens);
    ok(view.records[PV_TIER_DROPPED] > before.records[PV_TIER_DROPPED] &&
           view.recompute_tokens > before.recompute_tokens,
       "the retry sees the chunks dropped since the first restore (recompute %u -> %u)",
       before.recompute_tokens, view.recompute_tokens);
    ok(view.held_bytes[PV_TIER_DEVICE] == dev && view.held_bytes[PV_TIER_HOST] == host,
       "held bytes agree with pv_cache_held_bytes");
    pv_session_view again;
    pv_cache_session_restore(cache, "stream", &again);
    ok(same_view(&view, &again), "a second restore gives the same view");
    /* The retry runs: swap in, recompute the dropped chunks, new prompt, save. */
    pv_cache_pin(cache, "stream");
    pv_cache_plan_clear(&plan);
    pv_status st = pv_cache_plan_swap_in(cache, "stream", &plan);
    ok(st == PV_OK, "the retry's swap-in: %s", st == PV_OK ? "planned" : pv_last_error());
    for (size_t i = 0; i < plan.n_moves; i++)
        if (plan.moves[i].two_phase)
            pv_cache_complete(cache, &plan.moves[i], 1);
    for (uint32_t c = 0; c < 3; c++)
        for (uint32_t l = 0; l < 2; l++)
            if (tier_of(cache, "stream", c, l) != PV_TIER_DEVICE) {
                pv_cache_plan_clear(&plan);
                pv_cache_evict_to_free(cache, PV_TIER_DEVICE, TEST_SLOT_BYTES, &plan);
                pv_cache_store_chunk(cache, "stream", c, l, PV_TIER_DEVICE, NULL);
            }
    pv_cache_append_tokens(cache, "stream", tokens + 80, 40);
    pv_cache_session_save(cache, "stream", 120);
    pv_cache_unpin(cache, "stream");
    pv_cache_session_restore(cache, "stream", &view);
    e = expect_from_lookups(cache, "stream", 3, 2, 32, 120);
    ok(view.turns == 2 && view.committed_tokens == 120 && view.n_tokens == 120 &&
           view.recompute_tokens == 0 && view.records[PV_TIER_DROPPED] == 0 &&
           view.records[PV_TIER_DEVICE] + view.shadows == 6 && e.records[PV_TIER_DEVICE] == 6,
       "after the retried turn: turn 2, 120 tokens, every chunk on the device");
    check_ok(cache, "after the retried turn");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

int main(void)
{
    host_eviction_bookkeeping();
    device_to_dropped_when_host_full();
    recovered_chunk_replaces_copy();
    end_session_all_tiers();
    pinned_never_evicted();
    seed003_order();
    restore_after_reject();
    return tap_done();
}
