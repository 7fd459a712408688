/* Plans the engine carries out: ahead-of-time swap-out (two-phase copies)
 * and the lazy reclaim of its device slots (shadows), swap-in and the delay
 * of swap-outs under it, admission with the reserve, and the choice of a
 * request to suspend. */
#include "test-cache-util.h"

static void ahead_of_time_swap_out(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 8, 8, &clk);
    pv_cache_plan plan, more;
    pv_cache_plan_init(&plan);
    pv_cache_plan_init(&more);
    pv_cache_session_open(cache, "a");
    for (uint32_t c = 0; c < 8; c++)
        pv_cache_store_chunk(cache, "a", c, 0, PV_TIER_DEVICE, NULL);
    clk.now = 1;
    pv_status st = pv_cache_plan_swap_out(cache, 100, &plan);
    ok(st == PV_OK && plan.n_moves == 2, "8 of 8 device slots used, high water 6: 2 copies planned (%zu)",
       plan.n_moves);
    ok(plan.moves[0].two_phase && plan.moves[0].chunk == 0 && plan.moves[1].chunk == 1 &&
           plan.moves[0].to == PV_TIER_HOST,
       "the leading chunks, two-phase, to host");
    ok(tier_of(cache, "a", 0, 0) == PV_TIER_DEVICE, "a chunk under copy is still read from device");
    check_ok(cache, "copies in flight");
    ok(pv_cache_plan_swap_out(cache, 100, &more) == PV_OK && more.n_moves == 0,
       "in-flight copies count as gone: nothing more planned");
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 8 * TEST_SLOT_BYTES, &more) ==
           PV_ERR_OUT_OF_MEMORY,
       "chunks under copy are not evictable: %s", pv_last_error());
    ok(pv_cache_store_chunk(cache, "a", 0, 0, PV_TIER_DEVICE, NULL) == PV_ERR_BUSY,
       "a chunk under copy cannot be replaced");
    ok(pv_cache_end_session(cache, "a", NULL) == PV_ERR_BUSY, "nor freed by end_session: %s",
       pv_last_error());
    ok(pv_cache_complete(cache, &plan.moves[0], 1) == PV_OK, "complete the first copy");
    pv_session_view view;
    pv_cache_session_restore(cache, "a", &view);
    ok(view.records[PV_TIER_HOST] == 1 && view.shadows == 1 && tier_of(cache, "a", 0, 0) == PV_TIER_DEVICE,
       "chunk 0 now in host, still read on device from its shadow");
    ok(pv_cache_abort(cache, &plan.moves[1], 1) == PV_OK, "abort the second copy");
    ok(tier_of(cache, "a", 1, 0) == PV_TIER_DEVICE, "chunk 1 stays on device");
    ok(pv_cache_complete(cache, &plan.moves[0], 1) == PV_ERR_STATE,
       "completing twice is refused: %s", pv_last_error());
    pv_cache_move twice[2] = {plan.moves[1], plan.moves[1]};
    ok(pv_cache_abort(cache, twice, 2) == PV_ERR_STATE, "a finished copy cannot be aborted");
    uint64_t dev, host;
    pv_cache_held_bytes(cache, "a", &dev, &host);
    ok(dev == 8 * TEST_SLOT_BYTES && host == TEST_SLOT_BYTES,
       "a holds 7 device + 1 shadow slots and 1 host slot");
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.swap_out_chunks == 1 && stats.swap_out_bytes == TEST_SLOT_BYTES &&
           stats.shadow_chunks == 1 && stats.shadow_bytes == TEST_SLOT_BYTES,
       "stats: 1 chunk swapped out, its device slot held as 1 shadow");
    check_ok(cache, "after complete and abort");
    ok(pv_cache_end_session(cache, "a", NULL) == PV_OK, "ends once no copy is in flight");
    check_ok(cache, "after end");
    pv_cache_plan_free(&plan);
    pv_cache_plan_free(&more);
    pv_cache_free(cache);
}

/* Lazy reclaim (Pensieve §4.3.2): a completed ahead-of-time copy keeps its
 * device slot as a clean shadow, read on lookup, reclaimed with no copy
 * before any real eviction. */
static void lazy_reclaim(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 4, 8, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "cold");
    pv_cache_session_open(cache, "warm");
    pv_cache_store_chunk(cache, "cold", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "cold", 1, 0, PV_TIER_DEVICE, NULL);
    clk.now = 5;
    pv_cache_touch(cache, "warm");
    pv_cache_store_chunk(cache, "warm", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_store_chunk(cache, "warm", 1, 0, PV_TIER_DEVICE, NULL);
    clk.now = 10;
    ok(pv_cache_plan_swap_out(cache, 1, &plan) == PV_OK && plan.n_moves == 1 &&
           plan.moves[0].session == 0 && plan.moves[0].chunk == 0,
       "4 of 4 used, high water 3: the coldest chunk (cold 0) is copied ahead of time");
    pv_cache_move copy = plan.moves[0];
    ok(pv_cache_complete(cache, &copy, 1) == PV_OK, "the copy lands");
    pv_tier tier;
    uint32_t slot;
    pv_cache_lookup(cache, "cold", 0, 0, &tier, &slot);
    ok(tier == PV_TIER_DEVICE && slot == copy.from_slot,
       "lookup hits DEVICE at the shadow slot %u (its old slot)", slot);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.shadow_chunks == 1 && stats.shadow_hits == 1 && stats.hits[PV_TIER_DEVICE] == 1 &&
           stats.used_bytes[PV_TIER_DEVICE] == 4 * TEST_SLOT_BYTES &&
           stats.used_bytes[PV_TIER_HOST] == TEST_SLOT_BYTES && stats.records[PV_TIER_HOST] == 1 &&
           stats.records[PV_TIER_DEVICE] == 3,
       "one shadow: device used counts it (4 slots), the record is in host");
    check_ok(cache, "shadow held");
    pv_cache_plan_clear(&plan);
    ok(pv_cache_plan_swap_out(cache, 4, &plan) == PV_OK && plan.n_moves == 0,
       "a shadow does not count as device use: 3 of 4, nothing more to copy");
    pv_cache_admission adm;
    ok(pv_cache_admit(cache, 3, &adm) == PV_OK && adm.admit, "admission counts it as reclaimable");

    /* Device pressure: the shadow goes first, for free, before warmer cold 1. */
    clk.now = 11;
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, TEST_SLOT_BYTES, &plan) == PV_OK &&
           plan.n_moves == 1 && plan.moves[0].from == PV_TIER_DEVICE &&
           plan.moves[0].to == PV_TIER_NONE && plan.moves[0].from_slot == copy.from_slot &&
           !plan.moves[0].two_phase,
       "device pressure reclaims the shadow: one note, no copy");
    pv_cache_stats_get(cache, &stats);
    ok(tier_of(cache, "cold", 0, 0) == PV_TIER_HOST && tier_of(cache, "cold", 1, 0) == PV_TIER_DEVICE,
       "cold 0 now hits HOST; cold 1 was not evicted");
    ok(stats.shadow_chunks == 0 && stats.shadow_reclaimed == 1 && stats.swap_out_chunks == 1 &&
           stats.used_bytes[PV_TIER_DEVICE] == 3 * TEST_SLOT_BYTES,
       "no shadow left, 1 reclaimed, no further swap-out");
    check_ok(cache, "shadow reclaimed");

    /* A store with no free device slot takes a shadow's slot; a pinned
     * session's shadow stays; a recompute replaces both copies; a dropped
     * chunk's shadow goes with it. */
    pv_cache_store_chunk(cache, "warm", 2, 0, PV_TIER_DEVICE, NULL);
    pv_cache_plan_clear(&plan);
    pv_cache_plan_swap_out(cache, 1, &plan);
    ok(plan.n_moves == 1 && plan.moves[0].session == 0 && plan.moves[0].chunk == 1 &&
           pv_cache_complete(cache, plan.moves, 1) == PV_OK,
       "device full again: cold 1 copied out, shadowed");
    pv_cache_session_open(cache, "new");
    ok(pv_cache_store_chunk(cache, "new", 0, 0, PV_TIER_DEVICE, NULL) == PV_OK,
       "a store on a full device takes the shadow's slot");
    pv_cache_stats_get(cache, &stats);
    ok(stats.shadow_chunks == 0 && stats.shadow_reclaimed == 2 &&
           tier_of(cache, "cold", 1, 0) == PV_TIER_HOST,
       "cold 1 hits HOST now");
    check_ok(cache, "after a store reclaimed a shadow");
    clk.now = 20;
    pv_cache_plan_clear(&plan);
    pv_cache_plan_swap_out(cache, 1, &plan);
    ok(plan.n_moves == 1 && plan.moves[0].session == 1 && plan.moves[0].chunk == 0 &&
           pv_cache_complete(cache, plan.moves, 1) == PV_OK,
       "warm 0 copied out, shadowed");
    pv_cache_pin(cache, "warm");
    ok(pv_cache_store_chunk(cache, "new", 1, 0, PV_TIER_DEVICE, NULL) == PV_ERR_OUT_OF_MEMORY,
       "a pinned session's shadow is not reclaimed: %s", pv_last_error());
    ok(pv_cache_store_chunk(cache, "warm", 0, 0, PV_TIER_DEVICE, NULL) == PV_OK &&
           tier_of(cache, "warm", 0, 0) == PV_TIER_DEVICE,
       "recomputing warm 0 replaces its host copy and shadow");
    pv_cache_stats_get(cache, &stats);
    ok(stats.shadow_chunks == 0 && stats.records[PV_TIER_HOST] == 2, "no shadow, 2 host records");
    check_ok(cache, "after a store over a shadow");
    pv_cache_unpin(cache, "warm");
    pv_cache_plan_clear(&plan);
    pv_cache_plan_swap_out(cache, 1, &plan);
    pv_cache_move last = plan.moves[0];
    ok(plan.n_moves == 1 && pv_cache_complete(cache, plan.moves, 1) == PV_OK &&
           tier_of(cache, pv_cache_session_name(cache, last.session), last.chunk, 0) == PV_TIER_DEVICE,
       "new 0 copied out, shadowed");
    pv_cache_plan_clear(&plan);
    clk.now = 40;
    ok(pv_cache_evict_to_free(cache, PV_TIER_HOST, 8 * TEST_SLOT_BYTES, &plan) == PV_OK,
       "empty host: every host chunk is dropped");
    int noted = 0;
    for (size_t i = 0; i + 1 < plan.n_moves; i++)
        noted |= plan.moves[i].to == PV_TIER_NONE && plan.moves[i].from_slot == last.from_slot &&
                 plan.moves[i + 1].to == PV_TIER_DROPPED && plan.moves[i + 1].chunk == last.chunk &&
                 plan.moves[i + 1].session == last.session;
    ok(noted && plan.n_moves == 4 && tier_of(cache, "new", 0, 0) == PV_TIER_DROPPED,
       "the dropped chunk's shadow is noted and freed with it (%zu moves)", plan.n_moves);
    check_ok(cache, "after host drops");
    uint64_t freed = 0;
    ok(pv_cache_end_session(cache, "warm", &freed) == PV_OK, "end a session");
    check_ok(cache, "after end");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

static void swap_in_delays_swap_out(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 2, 4, 8, &clk);
    pv_cache_plan plan, out;
    pv_cache_plan_init(&plan);
    pv_cache_plan_init(&out);
    pv_cache_session_open(cache, "back");
    pv_cache_session_open(cache, "hot");
    for (uint32_t l = 0; l < 2; l++)
        pv_cache_store_chunk(cache, "back", 0, l, PV_TIER_HOST, NULL);
    for (uint32_t c = 0; c < 2; c++)
        for (uint32_t l = 0; l < 2; l++)
            pv_cache_store_chunk(cache, "hot", c, l, PV_TIER_DEVICE, NULL);
    clk.now = 5;
    ok(pv_cache_plan_swap_in(cache, "back", &plan) == PV_OK, "plan swap-in of a returning session");
    int evictions_first = plan.n_moves == 4 && plan.moves[0].from == PV_TIER_DEVICE &&
                          !plan.moves[0].two_phase && plan.moves[1].from == PV_TIER_DEVICE &&
                          plan.moves[2].from == PV_TIER_HOST && plan.moves[2].two_phase &&
                          plan.moves[3].two_phase;
    ok(evictions_first, "device full: 2 evictions of hot first, then 2 two-phase copies in");
    check_ok(cache, "swap-in in flight");
    pv_cache_stats stats;
    ok(pv_cache_plan_swap_out(cache, 100, &out) == PV_OK && out.n_moves == 0,
       "swap-out planning is delayed during a swap-in");
    pv_cache_stats_get(cache, &stats);
    ok(stats.swap_out_delayed == 1, "counted as delayed");
    ok(pv_cache_complete(cache, &plan.moves[2], 2) == PV_OK, "swap-in copies land");
    ok(tier_of(cache, "back", 0, 0) == PV_TIER_DEVICE && tier_of(cache, "back", 0, 1) == PV_TIER_DEVICE,
       "the session is on device");
    pv_cache_stats_get(cache, &stats);
    ok(stats.swap_in_chunks == 2, "stats: 2 chunks swapped in");
    ok(pv_cache_plan_swap_out(cache, 100, &out) == PV_OK && out.n_moves == 1,
       "after the swap-in, 4 of 4 used > high water 3: one copy planned");
    check_ok(cache, "after swap-in");
    ok(pv_cache_abort(cache, out.moves, out.n_moves) == PV_OK, "abort it");
    check_ok(cache, "after abort");
    pv_cache_plan_free(&plan);
    pv_cache_plan_free(&out);
    pv_cache_free(cache);
}

static void admission_reserve(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 10, 10, &clk);
    pv_cache_admission adm;
    ok(pv_cache_admit(cache, 9, &adm) == PV_OK && adm.admit && adm.free_bytes == 0,
       "empty device: 9 slots + 1 reserve fit");
    ok(pv_cache_admit(cache, 10, &adm) == PV_ERR_INVALID_ARG, "10 slots never fit with the reserve: %s",
       pv_last_error());
    pv_cache_session_open(cache, "run");
    for (uint32_t c = 0; c < 8; c++)
        pv_cache_store_chunk(cache, "run", c, 0, PV_TIER_DEVICE, NULL);
    pv_cache_pin(cache, "run");
    ok(pv_cache_admit(cache, 1, &adm) == PV_OK && adm.admit, "2 free: 1 slot + reserve admitted");
    ok(pv_cache_admit(cache, 2, &adm) == PV_OK && !adm.admit,
       "2 free, all else pinned: 2 slots would eat the reserve, wait");
    pv_cache_unpin(cache, "run");
    ok(pv_cache_admit(cache, 5, &adm) == PV_OK && adm.admit && adm.free_bytes == 6 * TEST_SLOT_BYTES,
       "unpinned chunks are reclaimable: admit 5 after making 6 slots free");
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, adm.free_bytes, &plan) == PV_OK &&
           plan.n_moves == 4,
       "evict_to_free carries it out (4 moves)");
    check_ok(cache, "after admission");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

static void suspension_choice(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 4, 4, &clk);
    const char *id = NULL;
    ok(pv_cache_choose_suspend(cache, &id) == PV_ERR_NOT_FOUND, "nothing running: nothing to suspend");
    pv_cache_session_open(cache, "first");
    pv_cache_session_open(cache, "second");
    pv_cache_session_open(cache, "third");
    pv_cache_pin(cache, "first");
    clk.now = 1;
    pv_cache_pin(cache, "second");
    clk.now = 2;
    pv_cache_pin(cache, "third");
    pv_cache_pin(cache, "first"); /* a nested pin does not make it newer */
    ok(pv_cache_choose_suspend(cache, &id) == PV_OK && strcmp(id, "third") == 0,
       "the newest request is chosen: %s", id ? id : "(null)");
    pv_cache_unpin(cache, "third");
    ok(pv_cache_choose_suspend(cache, &id) == PV_OK && strcmp(id, "second") == 0,
       "after it is suspended, the next newest: %s", id ? id : "(null)");
    check_ok(cache, "pinned list");
    pv_cache_free(cache);
}

static void statistics(void)
{
    test_clock clk = {0};
    pv_cache *cache = test_cache(PV_POLICY_PENSIEVE, 1, 2, 1, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_session_open(cache, "s");
    for (uint32_t c = 0; c < 2; c++)
        pv_cache_store_chunk(cache, "s", c, 0, PV_TIER_DEVICE, NULL);
    clk.now = 1;
    /* 0 goes to host; then 1 takes its host slot, 0 (cheaper) being dropped */
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan);
    pv_tier tier;
    uint32_t slot;
    for (uint32_t c = 0; c < 4; c++)
        pv_cache_lookup(cache, "s", c, 0, &tier, &slot);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    ok(stats.hits[PV_TIER_DEVICE] == 0 && stats.hits[PV_TIER_HOST] == 1 &&
           stats.hits[PV_TIER_DROPPED] == 1 && stats.misses == 2,
       "hits per tier: 0 device, 1 host, 1 dropped; 2 misses");
    ok(stats.swap_out_chunks == 2 && stats.dropped_chunks == 1 && stats.records[PV_TIER_HOST] == 1 &&
           stats.records[PV_TIER_DROPPED] == 1 && stats.used_bytes[PV_TIER_HOST] == TEST_SLOT_BYTES &&
           stats.capacity_bytes[PV_TIER_DEVICE] == 2 * TEST_SLOT_BYTES && stats.sessions == 1,
       "moves, records, bytes and capacity counted");
    uint64_t dev, host;
    pv_cache_held_bytes(cache, "s", &dev, &host);
    ok(dev == 0 && host == TEST_SLOT_BYTES, "held bytes of the session: 0 device, 1 slot host");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

int main(void)
{
    ahead_of_time_swap_out();
    lazy_reclaim();
    swap_in_delays_swap_out();
    admission_reserve();
    suspension_choice();
    statistics();
    return tap_done();
}
