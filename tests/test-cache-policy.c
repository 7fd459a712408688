/* Eviction policies: pensieve takes the leading chunks of the longest-idle
 * sessions first, lru whole sessions by recency; the order follows the
 * clock; every victim has the lowest retention value (brute-force oracle). */
#include "test-cache-util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define N_SESS 3

static pv_cache *three_sessions(pv_policy policy, double alpha, test_clock *clk)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.alpha = alpha;
    cfg.n_layers = 2;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = 24 * TEST_SLOT_BYTES;
    cfg.host_bytes = 24 * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, test_clock_read, clk) != PV_OK)
        return NULL;
    static const char *names[N_SESS] = {"A", "B", "C"};
    for (int s = 0; s < N_SESS; s++) {
        clk->now = 10.0 * s; /* A idle longest, C most recent */
        pv_cache_session_open(cache, names[s]);
        for (uint32_t c = 0; c < 4; c++)
            for (uint32_t l = 0; l < 2; l++)
                pv_cache_store_chunk(cache, names[s], c, l, PV_TIER_DEVICE, NULL);
    }
    clk->now = 30;
    return cache;
}

static int plan_is(const pv_cache *cache, const pv_cache_plan *plan, size_t from, const char *want)
{
    /* want: "A0.1 B0.0 ..." = session, chunk, layer of each move from `from` */
    char got[512] = "";
    size_t len = 0;
    for (size_t i = from; i < plan->n_moves && len < sizeof got - 16; i++)
        len += (size_t)snprintf(got + len, sizeof got - len, "%s%s%u.%u", i > from ? " " : "",
                                pv_cache_session_name(cache, plan->moves[i].session),
                                plan->moves[i].chunk, plan->moves[i].layer);
    if (strcmp(got, want) != 0)
        tap_diag("got  %s\n# want %s", got, want);
    return strcmp(got, want) == 0;
}

static void pensieve_leading_chunks_first(void)
{
    test_clock clk = {0};
    /* Steep cost in context: a leading chunk anywhere is cheaper than a
     * second chunk of the idlest session. */
    pv_cache *cache = three_sessions(PV_POLICY_PENSIEVE, 1e-3, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    ok(pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 8 * TEST_SLOT_BYTES, &plan) == PV_OK,
       "pensieve: free 8 slots");
    ok(plan_is(cache, &plan, 0, "A0.1 A0.0 B0.1 B0.0 C0.1 C0.0 A1.1 A1.0"),
       "leading chunks of the longest-idle sessions go first");
    check_ok(cache, "pensieve");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);

    /* Flat cost: idle time dominates, whole sessions go oldest first. */
    cache = three_sessions(PV_POLICY_PENSIEVE, 1e-9, &clk);
    pv_cache_plan_init(&plan);
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 10 * TEST_SLOT_BYTES, &plan);
    ok(plan_is(cache, &plan, 0, "A0.1 A0.0 A1.1 A1.0 A2.1 A2.0 A3.1 A3.0 B0.1 B0.0"),
       "with a flat cost the idlest session goes first, leading chunk first");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

static void lru_by_recency(void)
{
    test_clock clk = {0};
    pv_cache *cache = three_sessions(PV_POLICY_LRU, 1e-3, &clk);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    pv_cache_touch(cache, "A"); /* now A is the most recent: B, C, A */
    clk.now = 31;
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 18 * TEST_SLOT_BYTES, &plan);
    ok(plan_is(cache, &plan, 0,
               "B0.1 B0.0 B1.1 B1.0 B2.1 B2.0 B3.1 B3.0 C0.1 C0.0 C1.1 C1.0 C2.1 C2.0 C3.1 C3.0 A0.1 A0.0"),
       "lru: sessions by recency (B, C, then A), whatever the cost");
    check_ok(cache, "lru");
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
}

/* X (expensive frontier, idle since 0) against Y (cheap, active at 9): X
 * goes first just after 9, Y once its idle time has grown. Z, cheap and
 * idle since 0, is evicted at 9.001 so that the order is first decided
 * then and must be revised when the values cross (at 9.031). */
static uint32_t victim_at(double when)
{
    test_clock clk = {0};
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.alpha = 1e-3;
    cfg.n_layers = 1;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = 3 * TEST_SLOT_BYTES;
    cfg.host_bytes = 3 * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    pv_cache_init(&cache, &cfg, test_clock_read, &clk);
    pv_cache_session_open(cache, "X");
    pv_cache_store_chunk(cache, "X", 10, 0, PV_TIER_DEVICE, NULL);
    pv_cache_session_open(cache, "Z");
    pv_cache_store_chunk(cache, "Z", 0, 0, PV_TIER_DEVICE, NULL);
    clk.now = 9;
    pv_cache_session_open(cache, "Y");
    pv_cache_store_chunk(cache, "Y", 0, 0, PV_TIER_DEVICE, NULL);
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    clk.now = 9.001;
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, TEST_SLOT_BYTES, &plan);
    int z_first = plan.n_moves == 1 && strcmp(pv_cache_session_name(cache, plan.moves[0].session), "Z") == 0;
    clk.now = when;
    pv_cache_evict_to_free(cache, PV_TIER_DEVICE, 2 * TEST_SLOT_BYTES, &plan);
    uint32_t chunk = z_first && plan.n_moves == 2 ? plan.moves[1].chunk : PV_CACHE_MAX_CHUNKS;
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
    return chunk;
}

static void order_follows_the_clock(void)
{
    ok(victim_at(9.002) == 10, "just after Y's activity, X (cost 0.32, idle 9) goes first");
    ok(victim_at(10) == 0, "a second later, Y (cost 0.0011, idle 1) goes first");
}

/* Random sessions and times; every victim must have the lowest V. */
static int oracle_round(pv_policy policy, unsigned seed)
{
    enum { SESSIONS = 60, CHUNKS = 6, LAYERS = 3 };
    test_clock clk = {0};
    srand(seed);
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.alpha = 1e-4;
    cfg.n_layers = LAYERS;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = (uint64_t)SESSIONS * CHUNKS * LAYERS * TEST_SLOT_BYTES;
    cfg.host_bytes = cfg.device_bytes;
    pv_cache *cache = NULL;
    pv_cache_init(&cache, &cfg, test_clock_read, &clk);
    char name[SESSIONS][16];
    for (int s = 0; s < SESSIONS; s++) {
        snprintf(name[s], sizeof name[s], "s%02d", s);
        clk.now += (double)(rand() % 100) / 10;
        pv_cache_session_open(cache, name[s]);
        uint32_t n = 1 + (uint32_t)(rand() % CHUNKS);
        for (uint32_t c = 0; c < n; c++)
            for (uint32_t l = 0; l < LAYERS; l++)
                pv_cache_store_chunk(cache, name[s], c, l, PV_TIER_DEVICE, NULL);
    }
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    int bad = 0;
    pv_cache_stats stats;
    for (int round = 0; round < 300; round++) {
        clk.now += (double)(rand() % 50) / 10;
        if (rand() % 4 == 0)
            pv_cache_touch(cache, name[rand() % SESSIONS]);
        pv_cache_stats_get(cache, &stats);
        if (stats.records[PV_TIER_DEVICE] == 0)
            break;
        double best = INFINITY;
        for (int s = 0; s < SESSIONS; s++)
            for (uint32_t c = 0; c < CHUNKS; c++)
                for (uint32_t l = 0; l < LAYERS; l++) {
                    double v;
                    if (tier_of(cache, name[s], c, l) == PV_TIER_DEVICE &&
                        pv_cache_retention_value(cache, name[s], c, l, &v) == PV_OK && v < best)
                        best = v;
                }
        pv_cache_plan_clear(&plan);
        uint64_t used = stats.used_bytes[PV_TIER_DEVICE];
        pv_status st = pv_cache_evict_to_free(cache, PV_TIER_DEVICE,
                                              cfg.device_bytes - used + TEST_SLOT_BYTES, &plan);
        /* A failed call plans nothing: there is no victim to read. */
        if (st != PV_OK || plan.n_moves == 0) {
            if (bad++ < 5)
                tap_diag("%s round %d: evict_to_free gave %s with %zu moves (%s)",
                         pv_policy_name(policy), round, pv_status_str(st), plan.n_moves,
                         pv_last_error());
            break;
        }
        const pv_cache_move *m = &plan.moves[plan.n_moves - 1];
        double v;
        pv_cache_retention_value(cache, pv_cache_session_name(cache, m->session), m->chunk, m->layer, &v);
        /* v is read after the move, at the same clock: the same value. */
        if (!(v <= best * (1 + 1e-9)) && !(isinf(v) && isinf(best)) && bad++ < 5) {
            tap_diag("%s round %d: victim %s chunk %u layer %u has V %.9g, minimum %.9g",
                     pv_policy_name(policy), round, pv_cache_session_name(cache, m->session), m->chunk,
                     m->layer, v, best);
        }
    }
    if (pv_cache_check(cache) != PV_OK) {
        tap_diag("%s", pv_last_error());
        bad++;
    }
    pv_cache_plan_free(&plan);
    pv_cache_free(cache);
    return bad;
}

int main(void)
{
    pensieve_leading_chunks_first();
    lru_by_recency();
    order_follows_the_clock();
    for (int p = PV_POLICY_PENSIEVE; p <= PV_POLICY_LRU; p++)
        ok(oracle_round((pv_policy)p, 1234u + (unsigned)p) == 0,
           "%s: 300 victims each of lowest retention value (brute force over all chunks)",
           pv_policy_name((pv_policy)p));
    return tap_done();
}
