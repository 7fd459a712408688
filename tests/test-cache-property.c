/* Randomized property test: >= 200,000 random operations over hundreds of
 * sessions with small budgets, so every path runs (evictions both ways,
 * drops, two-phase copies, pins, ends, errors, and the device shadows that
 * completed ahead-of-time copies leave: hit, reclaimed by evictions and
 * stores, invalidated by stores, drops and ends). After EVERY operation
 * pv_cache_check() must pass and the outcome must match a shadow model
 * (where each chunk should be, which device shadows are held, which calls
 * must fail and how).
 *
 * Usage: test-cache-property [seed [ops]]; or PV_CACHE_SEED / PV_CACHE_OPS.
 * The seed is printed first so a failure reproduces. */
#include "test-cache-util.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum {
    NAMES = 240,       /* session ids drawn from s000..s239 */
    CHUNKS = 4,
    LAYERS = 2,
    DEVICE_SLOTS = 48,
    HOST_SLOTS = 64,
    MAX_INFLIGHT = 256,
};

static uint64_t rng_state;

static uint64_t rng(void)
{
    /* xorshift64*: small, fast, the same on every platform */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint32_t pick(uint32_t n)
{
    return (uint32_t)(rng() % n);
}

typedef struct shadow_session {
    int live;
    uint32_t pins;
    uint64_t pin_seq;
    uint8_t tier[CHUNKS][LAYERS];
    uint8_t copying[CHUNKS][LAYERS];
    uint8_t dev_copy[CHUNKS][LAYERS]; /* a HOST chunk's device shadow is held */
    size_t n_tokens;
} shadow_session;

/* How device shadows came and went, so the run can show every path ran. */
static struct {
    uint64_t made, reclaimed_by_plan, reclaimed_by_store, replaced, dropped, ended;
} dev_copies;

static shadow_session shadow[NAMES];
static char names[NAMES][16];
static pv_cache_move inflight[MAX_INFLIGHT];
static size_t n_inflight;
static uint64_t pin_counter;
static int failures;

static int name_index(const pv_cache *cache, uint32_t handle)
{
    const char *id = pv_cache_session_name(cache, handle);
    return id ? atoi(id + 1) : -1;
}

static void fail(uint64_t op, const char *what)
{
    if (failures++ < 5)
        tap_diag("op %" PRIu64 ": %s (%s)", op, what, pv_last_error());
}

/* What a lookup must answer: a held device shadow is a DEVICE hit. */
static pv_tier model_tier(int s, uint32_t c, uint32_t l)
{
    return shadow[s].dev_copy[c][l] ? PV_TIER_DEVICE : (pv_tier)shadow[s].tier[c][l];
}

/* Shadows an eviction or a store may reclaim: those of unpinned sessions. */
static int reclaimable_dev_copies(void)
{
    int n = 0;
    for (int s = 0; s < NAMES; s++)
        for (int c = 0; c < CHUNKS; c++)
            for (int l = 0; l < LAYERS; l++)
                n += shadow[s].live && !shadow[s].pins && shadow[s].dev_copy[c][l];
    return n;
}

/* The lowest retention value over reclaimable shadows, now. */
static double lowest_dev_copy_value(pv_cache *cache)
{
    double best = INFINITY;
    for (int s = 0; s < NAMES; s++)
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++) {
                double v;
                if (shadow[s].live && !shadow[s].pins && shadow[s].dev_copy[c][l] &&
                    pv_cache_retention_value(cache, names[s], c, l, &v) == PV_OK && v < best)
                    best = v;
            }
    return best;
}

/* A live session holding a device shadow (scanning from a random one), or -1;
 * *c and *l get one of its shadowed chunks. */
static int find_dev_copy(uint32_t *c, uint32_t *l)
{
    uint32_t start = pick(NAMES);
    for (uint32_t k = 0; k < NAMES; k++) {
        int s = (int)((start + k) % NAMES);
        for (uint32_t cc = 0; cc < CHUNKS; cc++)
            for (uint32_t ll = 0; ll < LAYERS; ll++)
                if (shadow[s].live && shadow[s].dev_copy[cc][ll]) {
                    *c = cc;
                    *l = ll;
                    return s;
                }
    }
    return -1;
}

static int no_higher(double v, double best)
{
    return v <= best * (1 + 1e-9) || (isinf(v) && isinf(best));
}

/* Applies a plan to the shadow; two-phase moves wait in `inflight`. */
static void apply_plan(const pv_cache *cache, const pv_cache_plan *plan, size_t from, uint64_t op)
{
    for (size_t i = from; i < plan->n_moves; i++) {
        const pv_cache_move *m = &plan->moves[i];
        int s = name_index(cache, m->session);
        if (m->to == PV_TIER_NONE) {
            /* A note: a shadow reclaimed, or freed ahead of its chunk's drop
             * (a reclaim may also be followed by that chunk's drop: the
             * counts below are only to show that both paths run). */
            if (s < 0 || !shadow[s].live || m->chunk >= CHUNKS || m->layer >= LAYERS ||
                m->from != PV_TIER_DEVICE || m->two_phase || shadow[s].pins ||
                !shadow[s].dev_copy[m->chunk][m->layer] ||
                shadow[s].tier[m->chunk][m->layer] != PV_TIER_HOST) {
                fail(op, "a shadow note names no reclaimable shadow");
                continue;
            }
            shadow[s].dev_copy[m->chunk][m->layer] = 0;
            int dropped_next = i + 1 < plan->n_moves && plan->moves[i + 1].to == PV_TIER_DROPPED &&
                               plan->moves[i + 1].session == m->session &&
                               plan->moves[i + 1].chunk == m->chunk &&
                               plan->moves[i + 1].layer == m->layer;
            if (dropped_next)
                dev_copies.dropped++;
            else
                dev_copies.reclaimed_by_plan++;
            continue;
        }
        /* Only a swap-in moves a pinned session's chunks (its own, in). */
        int swap_in = m->two_phase && m->from == PV_TIER_HOST;
        if (s < 0 || !shadow[s].live || m->chunk >= CHUNKS || m->layer >= LAYERS ||
            shadow[s].tier[m->chunk][m->layer] != m->from || (shadow[s].pins && !swap_in) ||
            shadow[s].copying[m->chunk][m->layer]) {
            fail(op, "a move takes a chunk that is pinned, under copy or not where it should be");
            continue;
        }
        if (shadow[s].dev_copy[m->chunk][m->layer]) {
            fail(op, "a chunk with a device shadow is copied in or dropped with its shadow held");
            continue;
        }
        if (m->two_phase) {
            shadow[s].copying[m->chunk][m->layer] = 1;
            if (n_inflight < MAX_INFLIGHT)
                inflight[n_inflight++] = *m;
        } else {
            shadow[s].tier[m->chunk][m->layer] = (uint8_t)m->to;
        }
    }
}

static uint32_t shadow_count(pv_tier tier, int with_reserved)
{
    uint32_t n = 0;
    for (int s = 0; s < NAMES; s++)
        for (int c = 0; c < CHUNKS; c++)
            for (int l = 0; l < LAYERS; l++)
                if (shadow[s].live) {
                    n += shadow[s].tier[c][l] == tier;
                    n += tier == PV_TIER_DEVICE && shadow[s].dev_copy[c][l];
                    /* a copy in flight also holds its destination slot */
                    n += with_reserved && shadow[s].copying[c][l] && shadow[s].tier[c][l] != tier;
                }
    return n;
}

static void compare_all(pv_cache *cache, uint64_t op)
{
    for (int s = 0; s < NAMES; s++) {
        if (!shadow[s].live)
            continue;
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++)
                if (tier_of(cache, names[s], c, l) != model_tier(s, c, l))
                    fail(op, "a chunk is not in the tier the shadow expects");
        uint64_t dev, host, want[PV_SLOT_TIERS] = {0, 0};
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++)
                for (int t = 0; t < PV_SLOT_TIERS; t++)
                    want[t] += (shadow[s].tier[c][l] == t ||
                                (shadow[s].copying[c][l] && shadow[s].tier[c][l] != t) ||
                                (t == PV_TIER_DEVICE && shadow[s].dev_copy[c][l])) *
                               (uint64_t)TEST_SLOT_BYTES;
        pv_cache_held_bytes(cache, names[s], &dev, &host);
        if (dev != want[PV_TIER_DEVICE] || host != want[PV_TIER_HOST])
            fail(op, "a session's held bytes differ from the shadow's");
    }
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    if (stats.used_bytes[PV_TIER_DEVICE] != (uint64_t)shadow_count(PV_TIER_DEVICE, 1) * TEST_SLOT_BYTES ||
        stats.used_bytes[PV_TIER_HOST] != (uint64_t)shadow_count(PV_TIER_HOST, 1) * TEST_SLOT_BYTES)
        fail(op, "used bytes differ from the shadow's");
    uint64_t held = 0;
    for (int s = 0; s < NAMES; s++)
        for (int c = 0; c < CHUNKS; c++)
            for (int l = 0; l < LAYERS; l++)
                held += shadow[s].live && shadow[s].dev_copy[c][l];
    if (stats.shadow_chunks != held || stats.shadow_bytes != held * TEST_SLOT_BYTES)
        fail(op, "device shadows differ from the model's");
}

/* Victim choice against brute force: a reclaimable shadow of min V first,
 * else min V over every unpinned device chunk. */
static void oracle_evict(pv_cache *cache, pv_cache_plan *plan, uint64_t op)
{
    if (reclaimable_dev_copies()) {
        double lowest = lowest_dev_copy_value(cache);
        pv_cache_stats stats;
        pv_cache_stats_get(cache, &stats);
        uint64_t free_bytes = DEVICE_SLOTS * (uint64_t)TEST_SLOT_BYTES - stats.used_bytes[PV_TIER_DEVICE];
        size_t before = plan->n_moves;
        double v;
        if (pv_cache_evict_to_free(cache, PV_TIER_DEVICE, free_bytes + TEST_SLOT_BYTES, plan) != PV_OK ||
            plan->n_moves != before + 1 || plan->moves[before].to != PV_TIER_NONE ||
            pv_cache_retention_value(cache, pv_cache_session_name(cache, plan->moves[before].session),
                                     plan->moves[before].chunk, plan->moves[before].layer,
                                     &v) != PV_OK ||
            !no_higher(v, lowest))
            fail(op, "device pressure did not reclaim the shadow of lowest retention value alone");
        apply_plan(cache, plan, before, op);
        return;
    }
    double best = INFINITY;
    int any = 0;
    for (int s = 0; s < NAMES; s++) {
        if (!shadow[s].live || shadow[s].pins)
            continue;
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++) {
                double v;
                if (shadow[s].tier[c][l] != PV_TIER_DEVICE || shadow[s].copying[c][l])
                    continue;
                any = 1;
                if (pv_cache_retention_value(cache, names[s], c, l, &v) == PV_OK && v < best)
                    best = v;
            }
    }
    if (!any)
        return;
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    uint64_t free_bytes = DEVICE_SLOTS * (uint64_t)TEST_SLOT_BYTES - stats.used_bytes[PV_TIER_DEVICE];
    size_t before = plan->n_moves;
    if (pv_cache_evict_to_free(cache, PV_TIER_DEVICE, free_bytes + TEST_SLOT_BYTES, plan) != PV_OK) {
        fail(op, "oracle eviction failed with an evictable chunk present");
        return;
    }
    const pv_cache_move *victim = NULL;
    for (size_t i = before; i < plan->n_moves; i++)
        if (plan->moves[i].from == PV_TIER_DEVICE)
            victim = &plan->moves[i];
    double v;
    if (!victim || pv_cache_retention_value(cache, pv_cache_session_name(cache, victim->session),
                                            victim->chunk, victim->layer, &v) != PV_OK ||
        !no_higher(v, best))
        fail(op, "the device victim is not of lowest retention value");
    apply_plan(cache, plan, before, op);
}

static void finish_copies(pv_cache *cache, uint64_t op)
{
    if (n_inflight == 0)
        return;
    size_t n = 1 + pick((uint32_t)n_inflight);
    size_t first = pick((uint32_t)(n_inflight - n + 1));
    int complete = pick(3) != 0;
    pv_status st = complete ? pv_cache_complete(cache, inflight + first, n)
                            : pv_cache_abort(cache, inflight + first, n);
    if (st != PV_OK) {
        fail(op, "completing or aborting copies in flight failed");
        return;
    }
    for (size_t i = first; i < first + n; i++) {
        const pv_cache_move *m = &inflight[i];
        int s = name_index(cache, m->session);
        shadow[s].copying[m->chunk][m->layer] = 0;
        if (complete) {
            shadow[s].tier[m->chunk][m->layer] = (uint8_t)m->to;
            /* Lazy reclaim: a copy out leaves its device slot as a shadow. */
            if (m->from == PV_TIER_DEVICE) {
                shadow[s].dev_copy[m->chunk][m->layer] = 1;
                dev_copies.made++;
            }
        }
    }
    /* A copy finished twice is refused, changing nothing. */
    if (pv_cache_complete(cache, inflight + first, 1) != PV_ERR_STATE)
        fail(op, "a finished copy was accepted again");
    memmove(inflight + first, inflight + first + n, (n_inflight - first - n) * sizeof *inflight);
    n_inflight -= n;
}

static int session_busy(int s)
{
    if (shadow[s].pins)
        return 1;
    for (int c = 0; c < CHUNKS; c++)
        for (int l = 0; l < LAYERS; l++)
            if (shadow[s].copying[c][l])
                return 1;
    return 0;
}

static void one_op(pv_cache *cache, test_clock *clk, pv_cache_plan *plan, uint64_t op)
{
    int s = (int)pick(NAMES);
    const char *id = names[s];
    uint32_t c = pick(CHUNKS), l = pick(LAYERS);
    pv_status st;
    clk->now += (double)pick(1000) / 1000.0;
    pv_cache_plan_clear(plan);
    int kind = (int)pick(22);
    if (kind >= 3 && kind <= 7 && pick(4) == 0) {
        /* Shadows are reclaimed soon: aim some stores and ends at them. */
        int with = find_dev_copy(&c, &l);
        if (with >= 0) {
            s = with;
            id = names[s];
        }
    }
    switch (kind) {
    case 0: case 1: case 2:
        if (pv_cache_session_open(cache, id) != PV_OK)
            fail(op, "open failed");
        shadow[s].live = 1;
        break;
    case 3: {
        uint64_t freed = 0;
        st = pv_cache_end_session(cache, id, &freed);
        pv_status want = !shadow[s].live ? PV_ERR_NOT_FOUND : session_busy(s) ? PV_ERR_BUSY : PV_OK;
        if (st != want)
            fail(op, "end_session status differs from the shadow's");
        if (st == PV_OK) {
            uint64_t held = 0;
            for (int cc = 0; cc < CHUNKS; cc++)
                for (int ll = 0; ll < LAYERS; ll++) {
                    held += shadow[s].tier[cc][ll] < PV_SLOT_TIERS ? TEST_SLOT_BYTES : 0;
                    held += shadow[s].dev_copy[cc][ll] ? TEST_SLOT_BYTES : 0;
                    dev_copies.ended += shadow[s].dev_copy[cc][ll];
                }
            if (freed != held)
                fail(op, "end_session freed bytes differ from what the session held");
            memset(&shadow[s], 0, sizeof shadow[s]);
            memset(shadow[s].tier, PV_TIER_NONE, sizeof shadow[s].tier);
        }
        break;
    }
    case 4: case 5: case 6: case 7: {
        pv_tier tier = pick(3) ? PV_TIER_DEVICE : PV_TIER_HOST;
        int full = shadow_count(tier, 1) == (tier == PV_TIER_DEVICE ? DEVICE_SLOTS : HOST_SLOTS);
        int frees_own = shadow[s].live && (shadow[s].tier[c][l] == tier ||
                                           (tier == PV_TIER_DEVICE && shadow[s].dev_copy[c][l]));
        /* A full device takes a shadow's slot: predict it and its value. */
        int reclaim = shadow[s].live && !shadow[s].copying[c][l] && full && !frees_own &&
                      tier == PV_TIER_DEVICE && reclaimable_dev_copies();
        double lowest = reclaim ? lowest_dev_copy_value(cache) : 0;
        double before[NAMES][CHUNKS][LAYERS];
        if (reclaim)
            for (int i = 0; i < NAMES; i++)
                for (uint32_t cc = 0; cc < CHUNKS; cc++)
                    for (uint32_t ll = 0; ll < LAYERS; ll++)
                        if (shadow[i].live && shadow[i].dev_copy[cc][ll])
                            pv_cache_retention_value(cache, names[i], cc, ll, &before[i][cc][ll]);
        st = pv_cache_store_chunk(cache, id, c, l, tier, NULL);
        pv_status want = PV_OK;
        if (!shadow[s].live)
            want = PV_ERR_NOT_FOUND;
        else if (shadow[s].copying[c][l])
            want = PV_ERR_BUSY;
        else if (full && !frees_own && !reclaim)
            want = PV_ERR_OUT_OF_MEMORY;
        if (st != want)
            fail(op, "store status differs from the shadow's");
        if (st == PV_OK && reclaim) {
            int gone = 0;
            for (int i = 0; i < NAMES; i++)
                for (uint32_t cc = 0; cc < CHUNKS; cc++)
                    for (uint32_t ll = 0; ll < LAYERS; ll++)
                        if (shadow[i].live && shadow[i].dev_copy[cc][ll] &&
                            tier_of(cache, names[i], cc, ll) == PV_TIER_HOST) {
                            gone++;
                            if (shadow[i].pins || !no_higher(before[i][cc][ll], lowest))
                                fail(op, "a store reclaimed a pinned shadow or not the coldest");
                            shadow[i].dev_copy[cc][ll] = 0;
                        }
            if (gone != 1)
                fail(op, "a store on a full device did not reclaim exactly one shadow");
            dev_copies.reclaimed_by_store++;
        }
        if (st == PV_ERR_OUT_OF_MEMORY && pick(4)) {
            /* The engine's path: make room, then store. */
            if (pv_cache_evict_to_free(cache, tier, TEST_SLOT_BYTES, plan) == PV_OK) {
                apply_plan(cache, plan, 0, op);
                if (shadow[s].copying[c][l])
                    break; /* cannot happen: a copy's chunk is never its own victim */
                st = pv_cache_store_chunk(cache, id, c, l, tier, NULL);
                if (st != PV_OK)
                    fail(op, "store after making room failed");
            }
        }
        if (st == PV_OK) {
            shadow[s].tier[c][l] = (uint8_t)tier;
            dev_copies.replaced += shadow[s].dev_copy[c][l];
            shadow[s].dev_copy[c][l] = 0;
        }
        break;
    }
    case 8: case 9: {
        pv_tier tier = pick(2) ? PV_TIER_DEVICE : PV_TIER_HOST;
        uint32_t cap = tier == PV_TIER_DEVICE ? DEVICE_SLOTS : HOST_SLOTS;
        uint64_t bytes = (uint64_t)pick(cap + 1) * TEST_SLOT_BYTES - (pick(2) ? pick(TEST_SLOT_BYTES) : 0);
        if (bytes > (uint64_t)cap * TEST_SLOT_BYTES)
            bytes = 0;
        st = pv_cache_evict_to_free(cache, tier, bytes, plan);
        if (st == PV_OK)
            apply_plan(cache, plan, 0, op);
        else if (st != PV_ERR_OUT_OF_MEMORY || plan->n_moves != 0)
            fail(op, "evict_to_free failed otherwise than for lack of evictable chunks");
        break;
    }
    case 10: {
        pv_tier tier;
        st = pv_cache_lookup(cache, id, c, l, &tier, NULL);
        if (st != (shadow[s].live ? PV_OK : PV_ERR_NOT_FOUND) ||
            (st == PV_OK && tier != model_tier(s, c, l)))
            fail(op, "lookup differs from the shadow");
        break;
    }
    case 11:
        st = pv_cache_pin(cache, id);
        if (st != (shadow[s].live ? PV_OK : PV_ERR_NOT_FOUND))
            fail(op, "pin status");
        if (st == PV_OK && shadow[s].pins++ == 0)
            shadow[s].pin_seq = ++pin_counter;
        break;
    case 12: case 20: case 21:
        st = pv_cache_unpin(cache, id);
        if (st != (!shadow[s].live ? PV_ERR_NOT_FOUND : shadow[s].pins ? PV_OK : PV_ERR_STATE))
            fail(op, "unpin status");
        if (st == PV_OK)
            shadow[s].pins--;
        break;
    case 13:
        st = pv_cache_plan_swap_out(cache, 1 + pick(8), plan);
        if (st != PV_OK)
            fail(op, "plan_swap_out failed");
        apply_plan(cache, plan, 0, op);
        break;
    case 14:
        st = pv_cache_plan_swap_in(cache, id, plan);
        if (st == PV_OK || st == PV_ERR_OUT_OF_MEMORY) {
            if (st != PV_OK && plan->n_moves)
                fail(op, "a failed swap-in left moves");
            apply_plan(cache, plan, 0, op);
        } else if (st != PV_ERR_NOT_FOUND || shadow[s].live) {
            fail(op, "plan_swap_in status");
        }
        break;
    case 15: case 16:
        finish_copies(cache, op);
        break;
    case 17: {
        int32_t tokens[8];
        for (int i = 0; i < 8; i++)
            tokens[i] = (int32_t)pick(32000);
        st = pv_cache_append_tokens(cache, id, tokens, 1 + pick(8));
        if (st != (shadow[s].live ? PV_OK : PV_ERR_NOT_FOUND))
            fail(op, "append status");
        if (st == PV_OK) {
            pv_session_view a, b;
            pv_cache_session_save(cache, id, (uint32_t)pick(4));
            pv_cache_session_restore(cache, id, &a);
            pv_cache_session_restore(cache, id, &b);
            if (!same_view(&a, &b))
                fail(op, "restore is not idempotent");
        }
        break;
    }
    case 18: {
        const char *newest = NULL;
        int want = -1;
        for (int i = 0; i < NAMES; i++)
            if (shadow[i].live && shadow[i].pins && (want < 0 || shadow[i].pin_seq > shadow[want].pin_seq))
                want = i;
        st = pv_cache_choose_suspend(cache, &newest);
        if ((want < 0) != (st == PV_ERR_NOT_FOUND) || (want >= 0 && strcmp(newest, names[want]) != 0))
            fail(op, "the session chosen for suspension is not the newest pinned one");
        pv_cache_admission adm;
        pv_cache_admit(cache, pick(DEVICE_SLOTS / 2), &adm);
        break;
    }
    default:
        if (op % 3 == 0)
            oracle_evict(cache, plan, op);
        else
            pv_cache_touch(cache, id);
        break;
    }
    if (pv_cache_check(cache) != PV_OK)
        fail(op, "pv_cache_check");
}

static int run(pv_policy policy, uint64_t seed, uint64_t ops)
{
    test_clock clk = {0};
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.alpha = 1e-4;
    cfg.chunk_tokens = 4;
    cfg.n_layers = LAYERS;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = DEVICE_SLOTS * TEST_SLOT_BYTES;
    cfg.host_bytes = HOST_SLOTS * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, test_clock_read, &clk) != PV_OK)
        return 1;
    rng_state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)policy + 1;
    memset(shadow, 0, sizeof shadow);
    for (int s = 0; s < NAMES; s++)
        memset(shadow[s].tier, PV_TIER_NONE, sizeof shadow[s].tier);
    n_inflight = 0;
    pin_counter = 0;
    memset(&dev_copies, 0, sizeof dev_copies);
    failures = 0;
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    for (uint64_t op = 0; op < ops && failures == 0; op++) {
        one_op(cache, &clk, &plan, op);
        if (op % 4096 == 0)
            compare_all(cache, op);
    }
    compare_all(cache, ops);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    tap_diag("%s: %u sessions live; swapped out %" PRIu64 ", in %" PRIu64 ", dropped %" PRIu64
             ", recomputed %" PRIu64 ", delayed %" PRIu64,
             pv_policy_name(policy), stats.sessions, stats.swap_out_chunks, stats.swap_in_chunks,
             stats.dropped_chunks, stats.recomputed_chunks, stats.swap_out_delayed);
    tap_diag("%s: device shadows made %" PRIu64 ", hit %" PRIu64 ", reclaimed by evictions %" PRIu64
             " and stores %" PRIu64 ", replaced by stores %" PRIu64 ", dropped %" PRIu64
             ", ended %" PRIu64,
             pv_policy_name(policy), dev_copies.made, stats.shadow_hits, dev_copies.reclaimed_by_plan,
             dev_copies.reclaimed_by_store, dev_copies.replaced, dev_copies.dropped, dev_copies.ended);
    int every_path = stats.swap_out_chunks && stats.swap_in_chunks && stats.dropped_chunks &&
                     stats.recomputed_chunks && stats.swap_out_delayed && stats.shadow_hits &&
                     dev_copies.reclaimed_by_plan && dev_copies.reclaimed_by_store &&
                     dev_copies.replaced && dev_copies.dropped && dev_copies.ended;
    if (!every_path)
        tap_diag("some path never ran");
    /* End every session the shadow can end, then nothing may remain. */
    for (size_t i = n_inflight; i-- > 0;)
        pv_cache_abort(cache, &inflight[i], 1);
    for (int s = 0; s < NAMES; s++) {
        for (; shadow[s].live && shadow[s].pins > 0; shadow[s].pins--)
            pv_cache_unpin(cache, names[s]);
        if (shadow[s].live && pv_cache_end_session(cache, names[s], NULL) != PV_OK)
            fail(ops, "final end_session");
    }
    uint64_t dev = 1, host = 1;
    pv_cache_held_bytes(cache, NULL, &dev, &host);
    if (dev || host || pv_cache_check(cache) != PV_OK)
        fail(ops, "bytes or records left after every session ended");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
    return failures == 0 && every_path;
}

int main(int argc, char **argv)
{
    uint64_t seed = 20261122, ops = 210000;
    const char *env_seed = getenv("PV_CACHE_SEED"), *env_ops = getenv("PV_CACHE_OPS");
    if (argc > 1)
        seed = strtoull(argv[1], NULL, 10);
    else if (env_seed)
        seed = strtoull(env_seed, NULL, 10);
    if (argc > 2)
        ops = strtoull(argv[2], NULL, 10);
    else if (env_ops)
        ops = strtoull(env_ops, NULL, 10);
    for (int s = 0; s < NAMES; s++)
        snprintf(names[s], sizeof names[s], "s%03d", s);
    tap_diag("seed %" PRIu64 ", %" PRIu64 " operations (rerun: test-cache-property %" PRIu64 " %" PRIu64 ")",
             seed, ops, seed, ops);
    uint64_t per = ops / 3 + 1;
    for (int p = PV_POLICY_PENSIEVE; p <= PV_POLICY_LRU; p++)
        ok(run((pv_policy)p, seed, per),
           "%s: %" PRIu64 " random operations, invariants and shadow model hold after each (seed %" PRIu64 ")",
           pv_policy_name((pv_policy)p), per, seed);
    return tap_done();
}
