/* Randomized property test: 150,000 random operations over hundreds of
 * sessions with small budgets, so every path runs (evictions both ways,
 * drops, two-phase copies, pins, ends, errors, and the device shadows that
 * completed ahead-of-time copies leave: hit, reclaimed by evictions and
 * stores, invalidated by stores, drops, ends and truncations) and the
 * truncations of edited turns. After EVERY operation
 * pv_cache_check() must pass and the whole state must match a shadow model
 * (where each chunk should be, which device shadows are held, which calls
 * must fail and how). The model has its own copy of the eviction policy
 * (below): every plan is checked move by move against the victims it picks
 * by brute force, never replayed as given.
 * A fourth run grows the HOST pool with use (pv_cache_host_growth) by
 * random steps up to a cap that rises from 8 slots to the budget's over
 * three quarters of the run, growth refused at the cap (as when the host
 * has no memory to give): the model sees a HOST tier of the cap's size,
 * so evictions and stores meet both granted and refused growth, and each
 * call for growth must come when the backed slots cannot give what is
 * asked.
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
    CHUNK_TOKENS = 4,
    LAYERS = 2,
    DEVICE_SLOTS = 48,
    HOST_SLOTS = 64,
    MAX_INFLIGHT = 256,
};

typedef struct shadow_session {
    int live;
    uint32_t pins;
    uint64_t pin_seq;
    uint8_t tier[CHUNKS][LAYERS];
    uint8_t copying[CHUNKS][LAYERS];
    uint8_t dev_copy[CHUNKS][LAYERS]; /* a HOST chunk's device shadow is held */
    size_t n_tokens;
    uint32_t committed;   /* from the last save, capped by truncations */
    double last_active;   /* open, touch, pin, unpin and save set it */
    uint32_t n_chunks;    /* highest chunk index stored + 1 (weighted cost) */
} shadow_session;

/* How device shadows came and went, so the run can show every path ran. */
static struct {
    uint64_t made, reclaimed_by_plan, reclaimed_by_store, replaced, dropped, ended, truncated;
} dev_copies;

/* How truncations went: records freed, refusals by reason, no-ops. */
static struct {
    uint64_t records, emptied, busy_pinned, busy_copy, noop;
} cuts;

static shadow_session shadow[NAMES];
static uint8_t touched[NAMES]; /* sessions an operation changed, compared chunk by chunk */
static char names[NAMES][16];
static pv_cache_move inflight[MAX_INFLIGHT];
static size_t n_inflight;
static uint64_t pin_counter;
static int failures;

/* HOST as the model sees it: HOST_SLOTS, or the growth run's cap now. */
static uint32_t host_cap = HOST_SLOTS;
/* The growth run: its cache, the slots the current operation may ask of
 * HOST at once, and what growth did. */
static struct {
    pv_cache *cache;
    uint32_t need;
    uint64_t op, calls, refusals, early;
} growth;

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

/* ---- the independent model of the policy --------------------------------
 * Written from cache.h alone: cost per policy, retention value V = cost /
 * idle time (lowest goes first; compared as idle_a * cost_b > idle_b *
 * cost_a so an idle time of 0, V infinite, needs no special case), ties by
 * session id between sessions and by lower cost, lower chunk, higher layer
 * within one. Victims are found by brute force over every chunk, and each
 * plan is checked move by move against the model's own prediction. */
enum { SET_DEVICE = PV_TIER_DEVICE, SET_HOST = PV_TIER_HOST, SET_SHADOW = 2 };

typedef struct victim {
    int s;
    uint32_t c, l;
} victim;

static pv_cache_config model_cfg;
static test_clock *model_clock;
static double model_now;
static uint64_t near_ties;

static double model_cost(int s, uint32_t c, uint32_t l)
{
    double base = model_cfg.alpha * ((double)c * model_cfg.chunk_tokens) + model_cfg.beta + model_cfg.c;
    switch (model_cfg.policy) {
    case PV_POLICY_WEIGHTED:
        return ((double)(LAYERS - l) / LAYERS) * ((double)(c + 1) / shadow[s].n_chunks) * base;
    case PV_POLICY_LRU:
        return 1.0;
    default:
        return base;
    }
}

/* idle_a * cost_b and idle_b * cost_a: a goes first when the first is larger. */
static void model_scores(victim a, victim b, double *sa, double *sb)
{
    *sa = (model_now - shadow[a.s].last_active) * model_cost(b.s, b.c, b.l);
    *sb = (model_now - shadow[b.s].last_active) * model_cost(a.s, a.c, a.l);
}

static int model_before(victim a, victim b)
{
    double sa, sb;
    model_scores(a, b, &sa, &sb);
    if (sa != sb)
        return sa > sb;
    if (a.s != b.s)
        return strcmp(names[a.s], names[b.s]) < 0;
    double ca = model_cost(a.s, a.c, a.l), cb = model_cost(b.s, b.c, b.l);
    if (ca != cb)
        return ca < cb;
    if (a.c != b.c)
        return a.c < b.c;
    return a.l > b.l;
}

/* Values equal but for rounding (not exactly): the cache's tournament may
 * take either. Exact ties must follow the documented order. */
static int near_tie(victim a, victim b)
{
    double sa, sb;
    model_scores(a, b, &sa, &sb);
    return sa != sb && fabs(sa - sb) <= 1e-9 * fmax(fabs(sa), fabs(sb));
}

/* Unpinned chunks an eviction from set may take; `excluded` is a session
 * pinned for the duration of a call (swap-in), or -1. */
static int in_set(int set, int s, uint32_t c, uint32_t l, int excluded)
{
    if (s < 0 || s >= NAMES || c >= CHUNKS || l >= LAYERS || !shadow[s].live || shadow[s].pins ||
        s == excluded)
        return 0;
    if (set == SET_SHADOW)
        return shadow[s].dev_copy[c][l];
    return shadow[s].tier[c][l] == set && !shadow[s].copying[c][l];
}

static uint32_t set_size(int set, int excluded)
{
    uint32_t n = 0;
    for (int s = 0; s < NAMES; s++)
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++)
                n += (uint32_t)in_set(set, s, c, l, excluded);
    return n;
}

static int model_pick(int set, int excluded, victim *out)
{
    int found = 0;
    for (int s = 0; s < NAMES; s++)
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++) {
                victim v = {s, c, l};
                if (in_set(set, s, c, l, excluded) && (!found || model_before(v, *out))) {
                    *out = v;
                    found = 1;
                }
            }
    return found;
}

static uint32_t shadow_count(pv_tier tier, int with_reserved);

static uint32_t model_free(pv_tier tier)
{
    return (tier == PV_TIER_DEVICE ? DEVICE_SLOTS : host_cap) - shadow_count(tier, 1);
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

/* The plan being checked (filled by the cache's call, the model then runs
 * on its own state from before the call) and the next move to compare. */
static struct {
    const pv_cache *cache;
    const pv_cache_plan *plan;
    size_t next;
    uint64_t op;
    int bad;
} cur;

/* The next move must move v from -> to; a float near-tie may name another
 * member of set instead, which the model then follows. Returns the chunk
 * moved, or s = -1 after a mismatch. */
static victim expect_move(int set, victim v, pv_tier from, pv_tier to, int two_phase, int excluded)
{
    victim none = {-1, 0, 0};
    if (cur.bad)
        return none;
    if (cur.next >= cur.plan->n_moves) {
        fail(cur.op, "the plan has fewer moves than the model predicts");
        cur.bad = 1;
        return none;
    }
    const pv_cache_move *m = &cur.plan->moves[cur.next++];
    victim got = {name_index(cur.cache, m->session), m->chunk, m->layer};
    touched[v.s] = 1;
    if (got.s >= 0 && got.s < NAMES)
        touched[got.s] = 1;
    if (m->from != from || m->to != to || m->two_phase != two_phase ||
        (got.s != v.s || got.c != v.c || got.l != v.l)) {
        if (m->from == from && m->to == to && m->two_phase == two_phase &&
            in_set(set, got.s, got.c, got.l, excluded) && near_tie(got, v)) {
            near_ties++;
            return got;
        }
        if (failures < 5)
            tap_diag("op %" PRIu64 ": move %zu is %s chunk %u layer %u %s -> %s%s; the model "
                     "predicts %s chunk %u layer %u %s -> %s%s",
                     cur.op, cur.next - 1, got.s >= 0 ? names[got.s] : "?", got.c, got.l,
                     pv_tier_name(m->from), pv_tier_name(m->to), m->two_phase ? " (copy)" : "",
                     names[v.s], v.c, v.l, pv_tier_name(from), pv_tier_name(to),
                     two_phase ? " (copy)" : "");
        fail(cur.op, "a move differs from the model's");
        cur.bad = 1;
        return none;
    }
    return v;
}

/* HOST -> DROPPED of h, its shadow noted first. */
static void model_drop(victim h, int excluded)
{
    if (shadow[h.s].dev_copy[h.c][h.l]) {
        h = expect_move(SET_HOST, h, PV_TIER_DEVICE, PV_TIER_NONE, 0, excluded);
        if (h.s < 0)
            return;
        shadow[h.s].dev_copy[h.c][h.l] = 0;
        dev_copies.dropped++;
    }
    h = expect_move(SET_HOST, h, PV_TIER_HOST, PV_TIER_DROPPED, 0, excluded);
    if (h.s >= 0)
        shadow[h.s].tier[h.c][h.l] = PV_TIER_DROPPED;
}

/* 1 if HOST's victim h is no warmer than DEVICE's victim d (cache.h). */
static int host_colder(victim h, victim d)
{
    return (model_now - shadow[h.s].last_active) * model_cost(d.s, d.c, d.l) >=
           (model_now - shadow[d.s].last_active) * model_cost(h.s, h.c, h.l);
}

/* One eviction from tier (a candidate exists). */
static void model_evict_one(pv_tier tier, int excluded)
{
    victim v, h;
    if (tier == PV_TIER_DEVICE && model_pick(SET_SHADOW, excluded, &v)) {
        v = expect_move(SET_SHADOW, v, PV_TIER_DEVICE, PV_TIER_NONE, 0, excluded);
        if (v.s >= 0) {
            shadow[v.s].dev_copy[v.c][v.l] = 0;
            dev_copies.reclaimed_by_plan++;
        }
        return;
    }
    model_pick((int)tier, excluded, &v);
    if (tier == PV_TIER_HOST) {
        model_drop(v, excluded);
        return;
    }
    pv_tier to = PV_TIER_HOST;
    if (model_free(PV_TIER_HOST) == 0) {
        if (model_pick(SET_HOST, excluded, &h) && host_colder(h, v))
            model_drop(h, excluded);
        else
            to = PV_TIER_DROPPED;
    }
    v = expect_move(SET_DEVICE, v, PV_TIER_DEVICE, to, 0, excluded);
    if (v.s >= 0)
        shadow[v.s].tier[v.c][v.l] = (uint8_t)to;
}

static void plan_begin(const pv_cache *cache, const pv_cache_plan *plan, uint64_t op)
{
    cur.cache = cache;
    cur.plan = plan;
    cur.next = 0;
    cur.op = op;
    cur.bad = 0;
    model_now = model_clock->now;
}

static void plan_end(void)
{
    if (!cur.bad && cur.next != cur.plan->n_moves)
        fail(cur.op, "the plan has more moves than the model predicts");
}

/* pv_cache_evict_to_free as the model sees it: the status it must return;
 * the moves are compared with the plan set by plan_begin. */
static pv_status model_evict_to_free(pv_tier tier, uint64_t bytes)
{
    uint32_t n_slots = tier == PV_TIER_DEVICE ? DEVICE_SLOTS : HOST_SLOTS;
    uint64_t need = bytes / TEST_SLOT_BYTES + (bytes % TEST_SLOT_BYTES != 0);
    if (need > n_slots)
        return PV_ERR_INVALID_ARG;
    uint32_t free_slots = model_free(tier);
    if (need <= free_slots)
        return PV_OK;
    uint64_t shortfall = need - free_slots;
    uint64_t reclaimable = set_size((int)tier, -1) + (tier == PV_TIER_DEVICE ? set_size(SET_SHADOW, -1) : 0);
    if (reclaimable < shortfall)
        return PV_ERR_OUT_OF_MEMORY;
    for (uint64_t i = 0; i < shortfall && !cur.bad; i++)
        model_evict_one(tier, -1);
    return PV_OK;
}

/* Two-phase copies wait in `inflight` until completed or aborted. */
static void model_copy(victim v)
{
    shadow[v.s].copying[v.c][v.l] = 1;
    if (n_inflight < MAX_INFLIGHT)
        inflight[n_inflight++] = cur.plan->moves[cur.next - 1];
}

static void model_swap_out(uint32_t max_chunks)
{
    int swap_in_running = 0, copying_out = 0, dev_shadows = 0;
    for (int s = 0; s < NAMES; s++)
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++) {
                if (!shadow[s].live)
                    continue;
                swap_in_running |= shadow[s].copying[c][l] && shadow[s].tier[c][l] == PV_TIER_HOST;
                copying_out += shadow[s].copying[c][l] && shadow[s].tier[c][l] == PV_TIER_DEVICE;
                dev_shadows += shadow[s].dev_copy[c][l];
            }
    if (swap_in_running)
        return; /* delayed while a swap-in runs */
    uint64_t used = shadow_count(PV_TIER_DEVICE, 1) - (uint64_t)copying_out - (uint64_t)dev_shadows;
    uint64_t limit = (uint64_t)(model_cfg.high_water * DEVICE_SLOTS);
    if (used <= limit)
        return;
    uint64_t want = used - limit < max_chunks ? used - limit : max_chunks;
    victim v, h;
    for (uint64_t k = 0; k < want && !cur.bad && model_pick(SET_DEVICE, -1, &v); k++) {
        if (model_free(PV_TIER_HOST) == 0) {
            if (!model_pick(SET_HOST, -1, &h) || !host_colder(h, v))
                break;
            model_drop(h, -1);
        }
        v = expect_move(SET_DEVICE, v, PV_TIER_DEVICE, PV_TIER_HOST, 1, -1);
        if (v.s >= 0)
            model_copy(v);
    }
}

static pv_status model_swap_in(int s)
{
    if (!shadow[s].live)
        return PV_ERR_NOT_FOUND;
    uint32_t k = 0;
    for (uint32_t c = 0; c < CHUNKS; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            k += shadow[s].tier[c][l] == PV_TIER_HOST && !shadow[s].copying[c][l] &&
                 !shadow[s].dev_copy[c][l];
    if (k == 0)
        return PV_OK;
    uint32_t free_slots = model_free(PV_TIER_DEVICE);
    uint32_t shortfall = k > free_slots ? k - free_slots : 0;
    /* The session is pinned while its swap-in is planned. */
    if (set_size(SET_DEVICE, s) + set_size(SET_SHADOW, s) < shortfall)
        return PV_ERR_OUT_OF_MEMORY;
    for (uint32_t i = 0; i < shortfall && !cur.bad; i++)
        model_evict_one(PV_TIER_DEVICE, s);
    for (uint32_t c = 0; c < CHUNKS; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if (!cur.bad && shadow[s].tier[c][l] == PV_TIER_HOST && !shadow[s].copying[c][l] &&
                !shadow[s].dev_copy[c][l]) {
                victim v = {s, c, l};
                v = expect_move(SET_HOST, v, PV_TIER_HOST, PV_TIER_DEVICE, 1, -2);
                if (v.s >= 0)
                    model_copy(v);
            }
    return PV_OK;
}

/* pv_cache_session_truncate as cache.h states it: the status it must
 * return, and the model's state after it. Chunk c keeps its records iff it
 * holds a kept token (c * chunk_tokens < n). */
static pv_status model_truncate(int s, uint32_t n)
{
    shadow_session *m = &shadow[s];
    if (!m->live)
        return PV_ERR_NOT_FOUND;
    if (n >= m->n_tokens) {
        cuts.noop++;
        return PV_OK;
    }
    if (m->pins) {
        cuts.busy_pinned++;
        return PV_ERR_BUSY;
    }
    for (uint32_t c = 0; c < CHUNKS; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if ((uint64_t)c * model_cfg.chunk_tokens >= n && m->copying[c][l]) {
                cuts.busy_copy++;
                return PV_ERR_BUSY;
            }
    m->n_chunks = 0;
    for (uint32_t c = 0; c < CHUNKS; c++)
        for (uint32_t l = 0; l < LAYERS; l++) {
            if ((uint64_t)c * model_cfg.chunk_tokens >= n) {
                cuts.records += m->tier[c][l] != PV_TIER_NONE;
                dev_copies.truncated += m->dev_copy[c][l];
                m->tier[c][l] = PV_TIER_NONE;
                m->dev_copy[c][l] = 0;
            } else if (m->tier[c][l] != PV_TIER_NONE) {
                m->n_chunks = c + 1;
            }
        }
    cuts.emptied += n == 0;
    m->n_tokens = n;
    if (m->committed > n)
        m->committed = n;
    return PV_OK;
}

/* The view's recompute_tokens: through the last chunk with a dropped
 * layer, capped at the history. */
static uint32_t model_recompute(int s)
{
    uint64_t through = 0;
    for (uint32_t c = 0; c < CHUNKS; c++)
        for (uint32_t l = 0; l < LAYERS; l++)
            if (shadow[s].tier[c][l] == PV_TIER_DROPPED)
                through = (uint64_t)(c + 1) * model_cfg.chunk_tokens;
    return (uint32_t)(through < shadow[s].n_tokens ? through : shadow[s].n_tokens);
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

/* After every operation: every live session's records per tier, shadows
 * and held bytes (one restore each), and chunk by chunk the sessions the
 * operation touched (its own, those its plan moved); every session chunk by
 * chunk when `full`. */
static void compare_all(pv_cache *cache, uint64_t op, int full)
{
    uint64_t used[PV_SLOT_TIERS] = {0, 0}, held = 0;
    for (int s = 0; s < NAMES; s++) {
        if (!shadow[s].live)
            continue;
        if (full || touched[s])
            for (uint32_t c = 0; c < CHUNKS; c++)
                for (uint32_t l = 0; l < LAYERS; l++)
                    if (tier_of(cache, names[s], c, l) != model_tier(s, c, l))
                        fail(op, "a chunk is not in the tier the shadow expects");
        touched[s] = 0;
        uint64_t want[PV_SLOT_TIERS] = {0, 0};
        uint32_t records[3] = {0, 0, 0}, shadows = 0;
        for (uint32_t c = 0; c < CHUNKS; c++)
            for (uint32_t l = 0; l < LAYERS; l++) {
                for (int t = 0; t < PV_SLOT_TIERS; t++)
                    want[t] += (shadow[s].tier[c][l] == t ||
                                (shadow[s].copying[c][l] && shadow[s].tier[c][l] != t) ||
                                (t == PV_TIER_DEVICE && shadow[s].dev_copy[c][l])) *
                               (uint64_t)TEST_SLOT_BYTES;
                if (shadow[s].tier[c][l] < PV_TIER_NONE)
                    records[shadow[s].tier[c][l]]++;
                shadows += shadow[s].dev_copy[c][l];
            }
        pv_session_view view;
        if (pv_cache_session_restore(cache, names[s], &view) != PV_OK ||
            view.held_bytes[PV_TIER_DEVICE] != want[PV_TIER_DEVICE] ||
            view.held_bytes[PV_TIER_HOST] != want[PV_TIER_HOST] || view.shadows != shadows ||
            memcmp(view.records, records, sizeof records) != 0 || view.pins != shadow[s].pins ||
            view.last_active != shadow[s].last_active)
            fail(op, "a session's records, shadows, bytes, pins or activity differ from the model's");
        else if (view.n_tokens != shadow[s].n_tokens || view.committed_tokens != shadow[s].committed ||
                 view.n_chunks != shadow[s].n_chunks || view.recompute_tokens != model_recompute(s))
            fail(op, "a session's history, committed tokens, chunk count or recompute differ from the model's");
        used[PV_TIER_DEVICE] += want[PV_TIER_DEVICE];
        used[PV_TIER_HOST] += want[PV_TIER_HOST];
        held += shadows;
    }
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    if (stats.used_bytes[PV_TIER_DEVICE] != used[PV_TIER_DEVICE] ||
        stats.used_bytes[PV_TIER_HOST] != used[PV_TIER_HOST])
        fail(op, "used bytes differ from the shadow's");
    if (stats.shadow_chunks != held || stats.shadow_bytes != held * TEST_SLOT_BYTES)
        fail(op, "device shadows differ from the model's");
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
        touched[s] = 1;
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
    /* A quarter of the operations take no time: sessions then share idle
     * times, and exact ties between sessions (broken by id) happen. */
    if (pick(4))
        clk->now += (double)(1 + pick(1000)) / 1000.0;
    pv_cache_plan_clear(plan);
    int kind = (int)pick(24);
    if (((kind >= 3 && kind <= 7) || kind >= 22) && pick(4) == 0) {
        /* Shadows are reclaimed soon: aim some stores, ends and cuts at them. */
        int with = find_dev_copy(&c, &l);
        if (with >= 0) {
            s = with;
            id = names[s];
        }
    }
    if (kind >= 22 && n_inflight > 0 && pick(4) == 0) {
        /* A cut through a copy in flight must be refused: aim some there. */
        s = name_index(cache, inflight[pick((uint32_t)n_inflight)].session);
        id = names[s];
    }
    touched[s] = 1;
    switch (kind) {
    case 0: case 1: case 2:
        if (pv_cache_session_open(cache, id) != PV_OK)
            fail(op, "open failed");
        shadow[s].live = 1;
        shadow[s].last_active = clk->now;
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
        int full = shadow_count(tier, 1) == (tier == PV_TIER_DEVICE ? DEVICE_SLOTS : host_cap);
        int frees_own = shadow[s].live && (shadow[s].tier[c][l] == tier ||
                                           (tier == PV_TIER_DEVICE && shadow[s].dev_copy[c][l]));
        /* A full device takes the slot of the shadow the model picks. */
        victim gone = {-1, 0, 0};
        model_now = clk->now;
        int reclaim = shadow[s].live && !shadow[s].copying[c][l] && full && !frees_own &&
                      tier == PV_TIER_DEVICE && model_pick(SET_SHADOW, -1, &gone);
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
            /* Exactly one shadow went: the model's, or one tied with it. */
            int n_gone = 0;
            for (int i = 0; i < NAMES; i++)
                for (uint32_t cc = 0; cc < CHUNKS; cc++)
                    for (uint32_t ll = 0; ll < LAYERS; ll++)
                        if (shadow[i].live && shadow[i].dev_copy[cc][ll] &&
                            tier_of(cache, names[i], cc, ll) == PV_TIER_HOST) {
                            victim v = {i, cc, ll};
                            n_gone++;
                            touched[i] = 1;
                            if (v.s != gone.s || v.c != gone.c || v.l != gone.l) {
                                if (in_set(SET_SHADOW, i, cc, ll, -1) && near_tie(v, gone))
                                    near_ties++;
                                else
                                    fail(op, "a store reclaimed another shadow than the model's");
                            }
                            shadow[i].dev_copy[cc][ll] = 0;
                        }
            if (n_gone != 1)
                fail(op, "a store on a full device did not reclaim exactly one shadow");
            dev_copies.reclaimed_by_store++;
        }
        if (st == PV_ERR_OUT_OF_MEMORY && pick(4)) {
            /* The engine's path: make room, then store. */
            st = pv_cache_evict_to_free(cache, tier, TEST_SLOT_BYTES, plan);
            plan_begin(cache, plan, op);
            pv_status want_evict = model_evict_to_free(tier, TEST_SLOT_BYTES);
            if (st != want_evict)
                fail(op, "evict_to_free status differs from the model's");
            plan_end();
            if (st == PV_OK) {
                if (shadow[s].copying[c][l])
                    break; /* cannot happen: a copy's chunk is never its own victim */
                st = pv_cache_store_chunk(cache, id, c, l, tier, NULL);
                if (st != PV_OK)
                    fail(op, "store after making room failed");
            }
        }
        if (st == PV_OK) {
            shadow[s].tier[c][l] = (uint8_t)tier;
            if (c + 1 > shadow[s].n_chunks)
                shadow[s].n_chunks = c + 1;
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
        growth.need = tier == PV_TIER_HOST ? (uint32_t)(bytes / TEST_SLOT_BYTES + (bytes % TEST_SLOT_BYTES != 0)) : 1;
        st = pv_cache_evict_to_free(cache, tier, bytes, plan);
        growth.need = 1;
        plan_begin(cache, plan, op);
        pv_status want = model_evict_to_free(tier, bytes);
        if (st != want || (st != PV_OK && plan->n_moves != 0))
            fail(op, "evict_to_free status differs from the model's, or a failure left moves");
        plan_end();
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
        if (st == PV_OK)
            shadow[s].last_active = clk->now;
        break;
    case 12: case 20: case 21:
        st = pv_cache_unpin(cache, id);
        if (st != (!shadow[s].live ? PV_ERR_NOT_FOUND : shadow[s].pins ? PV_OK : PV_ERR_STATE))
            fail(op, "unpin status");
        if (st == PV_OK) {
            shadow[s].pins--;
            shadow[s].last_active = clk->now;
        }
        break;
    case 13: {
        uint32_t max_chunks = 1 + pick(8);
        st = pv_cache_plan_swap_out(cache, max_chunks, plan);
        plan_begin(cache, plan, op);
        model_swap_out(max_chunks);
        if (st != PV_OK)
            fail(op, "plan_swap_out failed");
        plan_end();
        break;
    }
    case 14: {
        st = pv_cache_plan_swap_in(cache, id, plan);
        plan_begin(cache, plan, op);
        pv_status want = model_swap_in(s);
        if (st != want || (st != PV_OK && plan->n_moves))
            fail(op, "plan_swap_in status differs from the model's, or a failure left moves");
        plan_end();
        break;
    }
    case 15: case 16:
        finish_copies(cache, op);
        break;
    case 17: {
        int32_t tokens[8];
        for (int i = 0; i < 8; i++)
            tokens[i] = (int32_t)pick(32000);
        size_t n = 1 + pick(8);
        st = pv_cache_append_tokens(cache, id, tokens, n);
        if (st != (shadow[s].live ? PV_OK : PV_ERR_NOT_FOUND))
            fail(op, "append status");
        if (st == PV_OK) {
            pv_session_view a, b;
            uint32_t committed = pick(4);
            shadow[s].n_tokens += n;
            st = pv_cache_session_save(cache, id, committed);
            if (st != (committed <= shadow[s].n_tokens ? PV_OK : PV_ERR_INVALID_ARG))
                fail(op, "save status");
            if (st == PV_OK) {
                shadow[s].last_active = clk->now;
                shadow[s].committed = committed;
            }
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
    case 22: case 23: {
        /* An edited turn: half the time the history first grows to cover
         * every chunk the model tracks, so most cuts free something; a
         * quarter of the cuts fall at or past the history's end. */
        uint32_t span = CHUNKS * CHUNK_TOKENS;
        if (shadow[s].live && shadow[s].n_tokens < span && pick(2)) {
            int32_t tokens[CHUNKS * CHUNK_TOKENS] = {0};
            size_t n = span - shadow[s].n_tokens;
            if (pv_cache_append_tokens(cache, id, tokens, n) != PV_OK)
                fail(op, "append before a cut failed");
            else
                shadow[s].n_tokens += n;
        }
        uint32_t n = pick(4) ? pick(span + 1) : (uint32_t)shadow[s].n_tokens + pick(3);
        st = pv_cache_session_truncate(cache, id, n);
        if (st != model_truncate(s, n))
            fail(op, "truncate status differs from the model's");
        break;
    }
    default:
        if (op % 3 == 0) {
            /* Device pressure of one slot: the model's victim must go. */
            pv_cache_stats stats;
            pv_cache_stats_get(cache, &stats);
            uint64_t bytes = DEVICE_SLOTS * (uint64_t)TEST_SLOT_BYTES - stats.used_bytes[PV_TIER_DEVICE] +
                             TEST_SLOT_BYTES;
            if (bytes > DEVICE_SLOTS * (uint64_t)TEST_SLOT_BYTES)
                break;
            st = pv_cache_evict_to_free(cache, PV_TIER_DEVICE, bytes, plan);
            plan_begin(cache, plan, op);
            pv_status want = model_evict_to_free(PV_TIER_DEVICE, bytes);
            if (st != want)
                fail(op, "evict_to_free status differs from the model's");
            plan_end();
        } else if (pv_cache_touch(cache, id) == PV_OK) {
            shadow[s].last_active = clk->now;
        }
        break;
    }
    if (pv_cache_check(cache) != PV_OK)
        fail(op, "pv_cache_check");
}

/* Grows HOST by 1..7 slots up to host_cap, refusing there; called only
 * when the backed free slots cannot give what the operation asks. */
static uint32_t grow_host(void *ctx, uint32_t n_backed)
{
    (void)ctx;
    growth.calls++;
    pv_cache_stats st;
    pv_cache_stats_get(growth.cache, &st);
    uint64_t free_slots = n_backed - st.used_bytes[PV_TIER_HOST] / TEST_SLOT_BYTES;
    if (free_slots >= growth.need && growth.early++ < 5)
        tap_diag("op %" PRIu64 ": growth asked with %" PRIu64 " of %u backed slots free for %u wanted",
                 growth.op, free_slots, n_backed, growth.need);
    if (n_backed >= host_cap) {
        growth.refusals++;
        return n_backed;
    }
    uint32_t after = n_backed + 1 + pick(7);
    return after < host_cap ? after : host_cap;
}

static int run(pv_policy policy, uint64_t seed, uint64_t ops, int grow)
{
    test_clock clk = {0};
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    cfg.policy = policy;
    cfg.alpha = 1e-4;
    cfg.chunk_tokens = CHUNK_TOKENS;
    cfg.n_layers = LAYERS;
    cfg.slot_bytes = TEST_SLOT_BYTES;
    cfg.device_bytes = DEVICE_SLOTS * TEST_SLOT_BYTES;
    cfg.host_bytes = HOST_SLOTS * TEST_SLOT_BYTES;
    pv_cache *cache = NULL;
    if (pv_cache_init(&cache, &cfg, test_clock_read, &clk) != PV_OK)
        return 0;
    memset(&growth, 0, sizeof growth);
    growth.cache = cache;
    growth.need = 1;
    host_cap = grow ? 8 : HOST_SLOTS;
    if (grow && pv_cache_host_growth(cache, 0, grow_host, NULL) != PV_OK) {
        pv_cache_free(cache);
        return 0;
    }
    rng_state = seed * 0x9E3779B97F4A7C15ull + (uint64_t)policy + 1;
    memset(shadow, 0, sizeof shadow);
    memset(touched, 0, sizeof touched);
    for (int s = 0; s < NAMES; s++)
        memset(shadow[s].tier, PV_TIER_NONE, sizeof shadow[s].tier);
    n_inflight = 0;
    pin_counter = 0;
    near_ties = 0;
    model_cfg = cfg;
    model_clock = &clk;
    memset(&dev_copies, 0, sizeof dev_copies);
    memset(&cuts, 0, sizeof cuts);
    failures = 0;
    pv_cache_plan plan;
    pv_cache_plan_init(&plan);
    uint64_t most_backed = 0;
    for (uint64_t op = 0; op < ops && failures == 0; op++) {
        growth.op = op;
        if (grow) {
            uint64_t cap = 8 + op * (HOST_SLOTS - 8) * 4 / (3 * ops);
            host_cap = cap < HOST_SLOTS ? (uint32_t)cap : HOST_SLOTS;
        }
        one_op(cache, &clk, &plan, op);
        compare_all(cache, op, op % 64 == 0);
        pv_cache_stats gs;
        pv_cache_stats_get(cache, &gs);
        if (gs.host_backed_bytes > (uint64_t)host_cap * TEST_SLOT_BYTES)
            fail(op, "HOST backed past the growth cap");
        if (gs.host_backed_bytes < most_backed)
            fail(op, "HOST backed slots shrank");
        most_backed = gs.host_backed_bytes;
    }
    if (growth.early)
        fail(ops, "growth asked for while backed slots were free");
    compare_all(cache, ops, 1);
    pv_cache_stats stats;
    pv_cache_stats_get(cache, &stats);
    tap_diag("%s: %u sessions live; swapped out %" PRIu64 ", in %" PRIu64 ", dropped %" PRIu64
             ", recomputed %" PRIu64 ", delayed %" PRIu64,
             pv_policy_name(policy), stats.sessions, stats.swap_out_chunks, stats.swap_in_chunks,
             stats.dropped_chunks, stats.recomputed_chunks, stats.swap_out_delayed);
    tap_diag("%s: device shadows made %" PRIu64 ", hit %" PRIu64 ", reclaimed by evictions %" PRIu64
             " and stores %" PRIu64 ", replaced by stores %" PRIu64 ", dropped %" PRIu64
             ", ended %" PRIu64 ", truncated %" PRIu64,
             pv_policy_name(policy), dev_copies.made, stats.shadow_hits, dev_copies.reclaimed_by_plan,
             dev_copies.reclaimed_by_store, dev_copies.replaced, dev_copies.dropped, dev_copies.ended,
             dev_copies.truncated);
    tap_diag("%s: truncations freed %" PRIu64 " records, emptied %" PRIu64 " sessions; busy %" PRIu64
             " pinned, %" PRIu64 " under copy; %" PRIu64 " no-ops",
             pv_policy_name(policy), cuts.records, cuts.emptied, cuts.busy_pinned, cuts.busy_copy, cuts.noop);
    tap_diag("%s: %" PRIu64 " victims differed from the model's by a rounding-level near-tie",
             pv_policy_name(policy), near_ties);
    int every_path = stats.swap_out_chunks && stats.swap_in_chunks && stats.dropped_chunks &&
                     stats.recomputed_chunks && stats.swap_out_delayed && stats.shadow_hits &&
                     dev_copies.reclaimed_by_plan && dev_copies.reclaimed_by_store &&
                     dev_copies.replaced && dev_copies.dropped && dev_copies.ended &&
                     dev_copies.truncated && cuts.records && cuts.emptied && cuts.busy_pinned &&
                     cuts.busy_copy && cuts.noop;
    if (grow) {
        tap_diag("%s with HOST growth: %" PRIu64 " growth calls, %" PRIu64 " refused; %" PRIu64 " of %u slots "
                 "backed at the end",
                 pv_policy_name(policy), growth.calls, growth.refusals, most_backed / TEST_SLOT_BYTES, HOST_SLOTS);
        every_path = every_path && growth.calls > growth.refusals && growth.refusals > 0;
    }
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
    uint64_t seed = 20261122, ops = 150000;
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
    uint64_t per = ops / 4 + 1;
    for (int p = PV_POLICY_PENSIEVE; p <= PV_POLICY_LRU; p++)
        ok(run((pv_policy)p, seed, per, 0),
           "%s: %" PRIu64 " random operations, invariants and shadow model hold after each (seed %" PRIu64 ")",
           pv_policy_name((pv_policy)p), per, seed);
    ok(run(PV_POLICY_PENSIEVE, seed, per, 1),
       "pensieve, HOST grown with use, growth refused at a rising cap: %" PRIu64 " random operations, "
       "invariants and shadow model hold after each (seed %" PRIu64 ")",
       per, seed);
    return tap_done();
}
