/* Randomized property test: >= 200,000 random operations over hundreds of
 * sessions with small budgets, so every path runs (evictions both ways,
 * drops, two-phase copies, pins, ends, errors). After EVERY operation
 * pv_cache_check() must pass and the outcome must match a shadow model
 * (where each chunk should be, which calls must fail and how).
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
    size_t n_tokens;
} shadow_session;

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

/* Applies a plan to the shadow; two-phase moves wait in `inflight`. */
static void apply_plan(const pv_cache *cache, const pv_cache_plan *plan, size_t from, uint64_t op)
{
    for (size_t i = from; i < plan->n_moves; i++) {
        const pv_cache_move *m = &plan->moves[i];
        int s = name_index(cache, m->session);
        /* Only a swap-in moves a pinned session's chunks (its own, in). */
        int swap_in = m->two_phase && m->from == PV_TIER_HOST;
        if (s < 0 || !shadow[s].live || m->chunk >= CHUNKS || m->layer >= LAYERS ||
            shadow[s].tier[m->chunk][m->layer] != m->from || (shadow[s].pins && !swap_in) ||
            shadow[s].copying[m->chunk][m->layer]) {
            fail(op, "a move takes a chunk that is pinned, under copy or not where it should be");
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
                if (tier_of(cache, names[s], c, l) != shadow[s].tier[c][l])
                    fail(op, "a chunk is not in the tier the shadow expects");
        uint64_t dev, host, want[PV_SLOT_TIERS] = {0, 0};
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++)
                for (int t = 0; t < PV_SLOT_TIERS; t++)
                    want[t] += (shadow[s].tier[c][l] == t ||
                                (shadow[s].copying[c][l] && shadow[s].tier[c][l] != t)) *
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
}

/* Victim choice against brute force: min V over every unpinned device chunk. */
static void oracle_evict(pv_cache *cache, pv_cache_plan *plan, uint64_t op)
{
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
        (!(v <= best * (1 + 1e-9)) && !(isinf(v) && isinf(best))))
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
        if (complete)
            shadow[s].tier[m->chunk][m->layer] = (uint8_t)m->to;
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
    switch (pick(22)) {
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
                for (int ll = 0; ll < LAYERS; ll++)
                    held += shadow[s].tier[cc][ll] < PV_SLOT_TIERS ? TEST_SLOT_BYTES : 0;
            if (freed != held)
                fail(op, "end_session freed bytes differ from what the session held");
            memset(&shadow[s], 0, sizeof shadow[s]);
            memset(shadow[s].tier, PV_TIER_NONE, sizeof shadow[s].tier);
        }
        break;
    }
    case 4: case 5: case 6: case 7: {
        pv_tier tier = pick(3) ? PV_TIER_DEVICE : PV_TIER_HOST;
        st = pv_cache_store_chunk(cache, id, c, l, tier, NULL);
        pv_status want = PV_OK;
        if (!shadow[s].live)
            want = PV_ERR_NOT_FOUND;
        else if (shadow[s].copying[c][l])
            want = PV_ERR_BUSY;
        else if (shadow_count(tier, 1) == (tier == PV_TIER_DEVICE ? DEVICE_SLOTS : HOST_SLOTS) &&
                 shadow[s].tier[c][l] != tier)
            want = PV_ERR_OUT_OF_MEMORY;
        if (st != want)
            fail(op, "store status differs from the shadow's");
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
        if (st == PV_OK)
            shadow[s].tier[c][l] = (uint8_t)tier;
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
            (st == PV_OK && tier != shadow[s].tier[c][l]))
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
    int every_path = stats.swap_out_chunks && stats.swap_in_chunks && stats.dropped_chunks &&
                     stats.recomputed_chunks && stats.swap_out_delayed;
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
