/* Eviction: retention values, per-session frontiers, the ordered structure
 * over sessions, and the plans built from them (evict_to_free, ahead-of-time
 * swap-out, swap-in, admission, suspension).
 *
 * How a victim is found without scanning chunks
 * ---------------------------------------------
 * Idle time is per session, so within one session and tier the cheapest
 * chunk has the lowest V. Every policy's cost grows with the chunk index at
 * a fixed layer, so the cheapest chunk of a layer is the lowest evictable
 * chunk index of that layer ("lead", kept per session, tier and layer), and
 * the session's frontier is the cheapest of its n_layers leads.
 *
 * Across sessions the order of V_s = cost_s / (now - t_s) changes with now
 * (two sessions' values cross when the cheaper one has been idle longer), so
 * a heap keyed once is wrong. Evicting the lowest V is taking the highest
 * score_s(now) = (now - t_s) / cost_s, a line in now with slope 1 / cost_s.
 * Each tier keeps a kinetic tournament over session handles: a complete
 * binary tree whose node holds the winner of its subtree at the last query
 * time plus the time its result may change (the earliest of its children's
 * and of the crossing of its two contenders' lines). A query at a later now
 * recomputes only the nodes whose certificate expired; a changed session
 * marks its leaf-to-root path for recomputation.
 *
 * Complexity, S sessions, L layers, C chunks per layer of one session:
 *   frontier refresh after a change to one session   O(L) (+ O(C) to move a
 *                                                     lead past a hole)
 *   tree update                                       O(log S)
 *   victim query                                      O(log S) per changed
 *                                                     path + O(log S) per
 *                                                     crossing of two
 *                                                     sessions' values
 * so one eviction is O(L + log S) plus crossings, independent of the total
 * number of chunks (S x L x C). LRU's lines are parallel and never cross.
 * Ties break by cost, chunk index (lower first), layer (higher first) and,
 * between sessions, by id.
 *
 * Shadows (lazy reclaim after an ahead-of-time swap-out) are a third
 * eviction set with the same machinery: per session and layer the lowest
 * chunk index holding a shadow, a frontier, and a tournament of their own.
 * Reclaiming the lowest-value shadow is therefore also O(L + log S) plus
 * crossings, and it comes before any real DEVICE eviction. */
#include "pvcore/cache_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double pv_cache_policy_cost(const pv_cache_config *cfg, uint32_t chunk, uint32_t layer,
                            uint32_t session_chunks)
{
    double context = (double)chunk * cfg->chunk_tokens;
    double base = cfg->alpha * context + cfg->beta + cfg->c;
    switch (cfg->policy) {
    case PV_POLICY_PENSIEVE:
        return base;
    case PV_POLICY_WEIGHTED: {
        /* Seed 003: later layers overlap earlier ones under the pipelined
         * swap-in, and leading chunks are cheap to recompute. */
        double layer_weight = (double)(cfg->n_layers - layer) / cfg->n_layers;
        double position_weight = (double)(chunk + 1) / (session_chunks ? session_chunks : 1);
        return layer_weight * position_weight * base;
    }
    case PV_POLICY_LRU:
        return 1.0;
    }
    return base;
}

double pv_chunk_cost(const pv_cache *cache, const pv_session *s, uint32_t chunk, uint32_t layer)
{
    return pv_cache_policy_cost(&cache->cfg, chunk, layer, s->n_chunks);
}

/* ---- leads and frontiers ------------------------------------------------------ */

void pv_lead_add(pv_cache *cache, pv_session *s, int t, uint32_t chunk, uint32_t layer)
{
    uint32_t *lead = &s->lead[(size_t)t * cache->cfg.n_layers + layer];
    if (*lead == PV_NONE32 || chunk < *lead)
        *lead = chunk;
}

/* 1 if the record belongs to eviction set t. */
static int in_set(const pv_chunk_rec *r, int t)
{
    if (t == PV_SET_SHADOW)
        return r->shadowed;
    return r->tier == t && !r->copying;
}

void pv_lead_remove(pv_cache *cache, pv_session *s, int t, uint32_t chunk, uint32_t layer)
{
    uint32_t *lead = &s->lead[(size_t)t * cache->cfg.n_layers + layer];
    if (*lead != chunk)
        return;
    *lead = PV_NONE32;
    for (uint32_t c = pv_chunk_next(s, chunk + 1); c < s->n_chunks; c = pv_chunk_next(s, c + 1)) {
        const pv_chunk_rec *r = pv_rec(cache, s, c, layer);
        if (in_set(r, t)) {
            *lead = c;
            return;
        }
    }
}

void pv_frontier_compute(const pv_cache *cache, const pv_session *s, int t, uint32_t *chunk,
                         uint32_t *layer, double *cost)
{
    uint32_t best_c = PV_NONE32, best_l = 0;
    double best = 0;
    for (uint32_t l = 0; l < cache->cfg.n_layers; l++) {
        uint32_t c = s->lead[(size_t)t * cache->cfg.n_layers + l];
        if (c == PV_NONE32)
            continue;
        double v = pv_chunk_cost(cache, s, c, l);
        if (best_c == PV_NONE32 || v < best || (v == best && (c < best_c || (c == best_c && l > best_l)))) {
            best = v;
            best_c = c;
            best_l = l;
        }
    }
    /* A shared chunk's loss counts once for every session that would
     * recompute it (docs/design/shared-prefixes.md). */
    if (s->holder && s->refs > 1)
        best *= s->refs;
    *chunk = best_c;
    *layer = best_l;
    *cost = best;
}

/* ---- kinetic tournament ------------------------------------------------------- */

/* 1 if session a's frontier in tier t goes before b's at time now. */
static int evicts_before(const pv_cache *cache, int t, uint32_t a, uint32_t b, double now)
{
    const pv_session *sa = &cache->sessions[a], *sb = &cache->sessions[b];
    double score_a = (now - sa->last_active) * sb->front_cost[t];
    double score_b = (now - sb->last_active) * sa->front_cost[t];
    if (score_a != score_b)
        return score_a > score_b;
    int order = strcmp(sa->id, sb->id); /* a holder's id may equal a session's */
    return order ? order < 0 : a < b;
}

/* When loser's score overtakes winner's; INFINITY if it never does. */
static double crossing(const pv_cache *cache, int t, uint32_t winner, uint32_t loser)
{
    const pv_session *w = &cache->sessions[winner], *o = &cache->sessions[loser];
    double cw = w->front_cost[t], co = o->front_cost[t];
    if (!(co < cw))
        return INFINITY;
    return (o->last_active * cw - w->last_active * co) / (cw - co);
}

static void combine(pv_cache *cache, int t, uint32_t i)
{
    pv_ktree *tree = &cache->tree[t];
    int32_t a = tree->winner[2 * i], b = tree->winner[2 * i + 1];
    double expiry = fmin(tree->expiry[2 * i], tree->expiry[2 * i + 1]);
    int32_t w = a;
    if (a < 0) {
        w = b;
    } else if (b >= 0) {
        int a_first = evicts_before(cache, t, (uint32_t)a, (uint32_t)b, tree->now);
        w = a_first ? a : b;
        expiry = fmin(expiry, crossing(cache, t, (uint32_t)w, (uint32_t)(a_first ? b : a)));
    }
    tree->winner[i] = w;
    tree->expiry[i] = expiry;
}

static void advance(pv_cache *cache, int t, uint32_t i)
{
    pv_ktree *tree = &cache->tree[t];
    if (i >= tree->cap || tree->expiry[i] > tree->now)
        return;
    advance(cache, t, 2 * i);
    advance(cache, t, 2 * i + 1);
    combine(cache, t, i);
}

static void mark_path(pv_ktree *tree, uint32_t leaf)
{
    /* A node marked for recomputation has all its ancestors marked too. */
    for (uint32_t i = leaf / 2; i >= 1 && tree->expiry[i] != -INFINITY; i /= 2)
        tree->expiry[i] = -INFINITY;
}

/* The session to take from in tier t at time now, or -1. */
static int32_t tree_top(pv_cache *cache, int t, double now)
{
    pv_ktree *tree = &cache->tree[t];
    if (now < tree->now) {
        /* A clock that went back invalidates every certificate. */
        for (uint32_t i = 1; i < tree->cap; i++)
            tree->expiry[i] = -INFINITY;
    }
    tree->now = now;
    advance(cache, t, 1);
    return tree->winner[1];
}

pv_status pv_ktree_resize(pv_cache *cache, uint32_t sessions)
{
    uint32_t cap = 1;
    while (cap < sessions)
        cap *= 2;
    /* Allocate every tree before replacing any, so a failure leaves the
     * old ones whole. */
    int32_t *winner[PV_EVICT_SETS] = {NULL, NULL, NULL};
    double *expiry[PV_EVICT_SETS] = {NULL, NULL, NULL};
    int missing = 0;
    for (int t = 0; t < PV_EVICT_SETS; t++) {
        winner[t] = malloc(2 * (size_t)cap * sizeof *winner[t]);
        expiry[t] = malloc(2 * (size_t)cap * sizeof *expiry[t]);
        missing |= !winner[t] || !expiry[t];
    }
    if (missing) {
        for (int t = 0; t < PV_EVICT_SETS; t++) {
            free(winner[t]);
            free(expiry[t]);
        }
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for eviction trees of %u sessions", cap);
    }
    for (int t = 0; t < PV_EVICT_SETS; t++) {
        pv_ktree *tree = &cache->tree[t];
        for (uint32_t i = 0; i < 2 * cap; i++) {
            winner[t][i] = -1;
            expiry[t][i] = i < cap ? -INFINITY : INFINITY;
        }
        for (uint32_t h = 0; h < cache->next_handle && h < cap; h++)
            if (cache->sessions[h].id && cache->sessions[h].candidate[t])
                winner[t][cap + h] = (int32_t)h;
        pv_ktree_free(tree);
        tree->cap = cap;
        tree->winner = winner[t];
        tree->expiry = expiry[t];
    }
    return PV_OK;
}

void pv_ktree_free(pv_ktree *tree)
{
    free(tree->winner);
    free(tree->expiry);
    tree->winner = NULL;
    tree->expiry = NULL;
    tree->cap = 0;
}

void pv_session_refresh(pv_cache *cache, pv_session *s)
{
    uint32_t h = handle_of(cache, s);
    for (int t = 0; t < PV_EVICT_SETS; t++) {
        uint32_t members = t == PV_SET_SHADOW ? s->shadows : s->records[t] - s->copy_src[t];
        /* Empty before and after: no frontier, no leaf, nothing to redo
         * (most sessions hold no shadow, many nothing in HOST). */
        if (members == 0 && !s->candidate[t] && s->evictable[t] == 0)
            continue;
        uint32_t c = PV_NONE32, l = 0;
        double cost = 0;
        if (s->id)
            pv_frontier_compute(cache, s, t, &c, &l, &cost);
        int active = s->id && !s->pins;
        uint32_t share = active ? members : 0;
        cache->evictable[t] = cache->evictable[t] - s->evictable[t] + share;
        s->evictable[t] = share;
        s->front_chunk[t] = c;
        s->front_layer[t] = l;
        s->front_cost[t] = cost;
        s->candidate[t] = (uint8_t)(active && c != PV_NONE32);
        pv_ktree *tree = &cache->tree[t];
        /* Cost or idle time may have changed even if the winner did not. */
        tree->winner[tree->cap + h] = s->candidate[t] ? (int32_t)h : -1;
        mark_path(tree, tree->cap + h);
    }
}

/* ---- moves ------------------------------------------------------------------------ */

static pv_status plan_reserve(pv_cache_plan *plan, size_t more)
{
    if (!plan)
        return pv_error(PV_ERR_INVALID_ARG, "plan is NULL");
    if (plan->n_moves + more <= plan->capacity)
        return PV_OK;
    size_t cap = plan->capacity ? plan->capacity : 16;
    while (cap < plan->n_moves + more)
        cap *= 2;
    pv_cache_move *moves = realloc(plan->moves, cap * sizeof *moves);
    if (!moves)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for a plan of %zu moves", cap);
    plan->moves = moves;
    plan->capacity = cap;
    return PV_OK;
}

static void plan_push(pv_cache_plan *plan, uint32_t session, uint32_t chunk, uint32_t layer,
                      pv_tier from, uint32_t from_slot, pv_tier to, uint32_t to_slot, int two_phase)
{
    plan->moves[plan->n_moves++] =
        (pv_cache_move){session, chunk, layer, from, to, from_slot, to_slot, two_phase};
}

/* 1 if HOST's coldest chunk (session host_h) has a retention value no
 * higher than DEVICE's (session dev_h): scores compared by
 * cross-multiplication, costs being > 0. */
static int host_victim_is_colder(const pv_cache *cache, uint32_t host_h, uint32_t dev_h, double now)
{
    const pv_session *hs = &cache->sessions[host_h], *ds = &cache->sessions[dev_h];
    return (now - hs->last_active) * ds->front_cost[PV_TIER_DEVICE] >=
           (now - ds->last_active) * hs->front_cost[PV_TIER_HOST];
}

/* Moves session h's frontier chunk in `from` down one step (applied now). */
static void move_down(pv_cache *cache, uint32_t h, pv_tier from, pv_tier to, pv_cache_plan *plan)
{
    pv_session *s = &cache->sessions[h];
    uint32_t c = s->front_chunk[from], l = s->front_layer[from];
    const pv_chunk_rec *r = pv_rec(cache, s, c, l);
    uint32_t from_slot = r->slot;
    /* A shadow belongs to a HOST chunk: it goes with it. */
    if (r->shadowed)
        plan_push(plan, h, c, l, PV_TIER_DEVICE, pv_rec_shadow(cache, r), PV_TIER_NONE, PV_NONE32, 0);
    pv_rec_exit(cache, s, c, l);
    uint32_t to_slot = PV_NONE32;
    if (to == PV_TIER_HOST) {
        to_slot = pv_slot_take(cache, s, PV_TIER_HOST, c, l, PV_SLOT_OWNED);
        cache->stats.swap_out_chunks++;
        cache->stats.swap_out_bytes += cache->cfg.slot_bytes;
    } else {
        cache->stats.dropped_chunks++;
    }
    pv_rec_enter(cache, s, c, l, to, to_slot);
    plan_push(plan, h, c, l, from, from_slot, to, to_slot, 0);
    pv_session_refresh(cache, s);
}

/* Frees one HOST slot if a HOST chunk is colder than device victim dev_h. */
static int drop_colder_host_chunk(pv_cache *cache, uint32_t dev_h, double now, pv_cache_plan *plan)
{
    int32_t host_h = tree_top(cache, PV_TIER_HOST, now);
    if (host_h < 0 || !host_victim_is_colder(cache, (uint32_t)host_h, dev_h, now))
        return 0;
    move_down(cache, (uint32_t)host_h, PV_TIER_HOST, PV_TIER_DROPPED, plan);
    return 1;
}

int pv_shadow_reclaim(pv_cache *cache, double now, pv_cache_plan *plan)
{
    if (cache->evictable[PV_SET_SHADOW] == 0)
        return 0;
    uint32_t h = (uint32_t)tree_top(cache, PV_SET_SHADOW, now);
    pv_session *s = &cache->sessions[h];
    uint32_t c = s->front_chunk[PV_SET_SHADOW], l = s->front_layer[PV_SET_SHADOW];
    if (plan)
        plan_push(plan, h, c, l, PV_TIER_DEVICE, pv_rec_shadow(cache, pv_rec(cache, s, c, l)),
                  PV_TIER_NONE, PV_NONE32, 0);
    pv_shadow_release(cache, s, c, l);
    cache->stats.shadow_reclaimed++;
    pv_session_refresh(cache, s);
    return 1;
}

/* One eviction from tier t; the caller checked that a candidate exists.
 * On DEVICE a shadow, when one is reclaimable, is the free first choice. */
static void evict_one(pv_cache *cache, int t, double now, pv_cache_plan *plan)
{
    if (t == PV_TIER_DEVICE && pv_shadow_reclaim(cache, now, plan))
        return;
    uint32_t h = (uint32_t)tree_top(cache, t, now);
    if (t == PV_TIER_HOST) {
        move_down(cache, h, PV_TIER_HOST, PV_TIER_DROPPED, plan);
        return;
    }
    /* Same rule on both tiers: the victim goes to HOST unless HOST is full
     * of chunks worth more than it, in which case it is dropped (seed 001). */
    if (pv_pool_room(cache, PV_TIER_HOST, 1) || drop_colder_host_chunk(cache, h, now, plan))
        move_down(cache, h, PV_TIER_DEVICE, PV_TIER_HOST, plan);
    else
        move_down(cache, h, PV_TIER_DEVICE, PV_TIER_DROPPED, plan);
}

static pv_status check_slot_tier(const char *fn, pv_tier tier)
{
    if (tier != PV_TIER_DEVICE && tier != PV_TIER_HOST)
        return pv_error(PV_ERR_INVALID_ARG, "%s: tier %s holds no slots (use device or host)", fn,
                        pv_tier_name(tier));
    return PV_OK;
}

pv_status pv_cache_evict_to_free(pv_cache *cache, pv_tier tier, uint64_t bytes, pv_cache_plan *plan)
{
    if (!cache || !plan)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_evict_to_free: cache and plan must not be NULL");
    pv_status st = check_slot_tier("pv_cache_evict_to_free", tier);
    if (st != PV_OK)
        return st;
    pv_pool *pool = &cache->pool[tier];
    uint64_t slot_bytes = cache->cfg.slot_bytes;
    uint64_t need = bytes / slot_bytes + (bytes % slot_bytes != 0);
    if (need > pool->n_slots)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_evict_to_free: %llu bytes exceed the %s pool (%u slots of %llu bytes)",
                        (unsigned long long)bytes, pv_tier_name(tier), pool->n_slots,
                        (unsigned long long)slot_bytes);
    if (pv_pool_room(cache, tier, need))
        return PV_OK;
    uint64_t shortfall = need - pool->n_free;
    uint64_t reclaimable = cache->evictable[tier] +
                           (tier == PV_TIER_DEVICE ? cache->evictable[PV_SET_SHADOW] : 0);
    if (reclaimable < shortfall)
        return pv_error(PV_ERR_OUT_OF_MEMORY,
                        "pv_cache_evict_to_free: %s needs %llu more free slots but only %llu chunks "
                        "or shadows are evictable (the rest are pinned or under copy)",
                        pv_tier_name(tier), (unsigned long long)shortfall,
                        (unsigned long long)reclaimable);
    /* Up to 3 moves an eviction: a shadow note and a drop for room on HOST,
     * then the victim's own move. */
    if ((st = plan_reserve(plan, 3 * shortfall)) != PV_OK)
        return st;
    double now = pv_cache_now(cache);
    for (uint64_t i = 0; i < shortfall; i++)
        evict_one(cache, tier, now, plan);
    return PV_OK;
}

pv_status pv_cache_plan_swap_out(pv_cache *cache, uint32_t max_chunks, pv_cache_plan *plan)
{
    if (!cache || !plan)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_plan_swap_out: cache and plan must not be NULL");
    if (cache->pending_in > 0) {
        /* Paper §5: swapping both ways at once slows both by 18-20%. */
        cache->stats.swap_out_delayed++;
        return PV_OK;
    }
    const pv_pool *dev = &cache->pool[PV_TIER_DEVICE];
    /* Shadows are copied out already and reclaimed for free: not "used". */
    uint64_t used = dev->n_slots - dev->n_free - cache->pending_out - cache->stats.shadow_chunks;
    uint64_t limit = (uint64_t)(cache->cfg.high_water * dev->n_slots);
    if (used <= limit)
        return PV_OK;
    uint64_t want = used - limit;
    if (want > max_chunks)
        want = max_chunks;
    pv_status st = plan_reserve(plan, 3 * want);
    if (st != PV_OK)
        return st;
    double now = pv_cache_now(cache);
    for (uint64_t k = 0; k < want && cache->evictable[PV_TIER_DEVICE] > 0; k++) {
        uint32_t h = (uint32_t)tree_top(cache, PV_TIER_DEVICE, now);
        if (!pv_pool_room(cache, PV_TIER_HOST, 1) && !drop_colder_host_chunk(cache, h, now, plan))
            break; /* HOST holds only warmer chunks: not worth a background copy */
        pv_session *s = &cache->sessions[h];
        uint32_t c = s->front_chunk[PV_TIER_DEVICE], l = s->front_layer[PV_TIER_DEVICE];
        pv_chunk_rec *r = pv_rec(cache, s, c, l);
        uint32_t to = pv_slot_take(cache, s, PV_TIER_HOST, c, l, PV_SLOT_RESERVED);
        pv_lead_remove(cache, s, PV_TIER_DEVICE, c, l);
        r->copying = 1;
        s->copy_src[PV_TIER_DEVICE]++;
        cache->pending_out++;
        plan_push(plan, h, c, l, PV_TIER_DEVICE, r->slot, PV_TIER_HOST, to, 1);
        pv_session_refresh(cache, s);
    }
    return PV_OK;
}

pv_status pv_cache_plan_swap_in(pv_cache *cache, const char *id, pv_cache_plan *plan)
{
    if (!cache || !id || !plan)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_plan_swap_in: cache, id and plan must not be NULL");
    uint32_t h = pv_session_find(cache, id);
    if (h == PV_NONE32)
        return pv_error(PV_ERR_NOT_FOUND, "pv_cache_plan_swap_in: unknown session \"%.64s\"", id);
    pv_session *s = &cache->sessions[h];
    /* Shadowed chunks are read on DEVICE already: nothing to copy. Shared
     * chunks come from their holders, once whoever asks first. */
    uint64_t k = s->records[PV_TIER_HOST] - s->copy_src[PV_TIER_HOST] - s->shadows;
    for (uint32_t c = 0; c < s->n_shared; c++) {
        const pv_session *o = pv_holder_of(cache, s, c);
        k += o->records[PV_TIER_HOST] - o->copy_src[PV_TIER_HOST] - o->shadows;
    }
    if (k == 0)
        return PV_OK;
    const pv_pool *dev = &cache->pool[PV_TIER_DEVICE];
    uint64_t shortfall = k > dev->n_free ? k - dev->n_free : 0;
    /* Pinned while planning, so making room takes nothing of its own. */
    s->pins++;
    pv_session_refresh(cache, s);
    pv_share_sync(cache, s, 1);
    pv_status st = PV_OK;
    uint64_t reclaimable = cache->evictable[PV_TIER_DEVICE] + cache->evictable[PV_SET_SHADOW];
    if (k > dev->n_slots || reclaimable < shortfall)
        st = pv_error(PV_ERR_OUT_OF_MEMORY,
                      "pv_cache_plan_swap_in: \"%.64s\" has %llu host chunks to copy; device has "
                      "%u free slots and %llu evictable chunks or shadows of other sessions",
                      id, (unsigned long long)k, dev->n_free, (unsigned long long)reclaimable);
    if (st == PV_OK)
        st = plan_reserve(plan, 3 * shortfall + k);
    if (st == PV_OK) {
        double now = pv_cache_now(cache);
        for (uint64_t i = 0; i < shortfall; i++)
            evict_one(cache, PV_TIER_DEVICE, now, plan);
        for (uint32_t c = pv_chunk_next(s, 0); c < s->n_chunks; c = pv_chunk_next(s, c + 1)) {
            pv_session *o = c < s->n_shared ? pv_holder_of(cache, s, c) : s;
            uint32_t oh = handle_of(cache, o);
            for (uint32_t l = 0; l < cache->cfg.n_layers; l++) {
                pv_chunk_rec *r = pv_rec(cache, o, c, l);
                if (r->tier != PV_TIER_HOST || r->copying || r->shadowed)
                    continue;
                uint32_t to = pv_slot_take(cache, o, PV_TIER_DEVICE, c, l, PV_SLOT_RESERVED);
                pv_lead_remove(cache, o, PV_TIER_HOST, c, l);
                r->copying = 1;
                o->copy_src[PV_TIER_HOST]++;
                cache->pending_in++;
                plan_push(plan, oh, c, l, PV_TIER_HOST, r->slot, PV_TIER_DEVICE, to, 1);
            }
            if (o != s)
                pv_session_refresh(cache, o);
        }
    }
    s->pins--;
    pv_session_refresh(cache, s);
    pv_share_sync(cache, s, -1);
    return st;
}

/* Checks that move i is a two-phase copy still in flight. */
static pv_status check_copy(const pv_cache *cache, const char *fn, size_t i, const pv_cache_move *m)
{
    if (!m->two_phase || m->session >= cache->next_handle || !cache->sessions[m->session].id ||
        m->layer >= cache->cfg.n_layers || m->from > PV_TIER_HOST || m->to > PV_TIER_HOST ||
        m->from == m->to)
        return pv_error(PV_ERR_INVALID_ARG, "%s: move %zu (session %u chunk %u layer %u %s -> %s) is "
                        "not a two-phase copy of a live session",
                        fn, i, m->session, m->chunk, m->layer, pv_tier_name(m->from),
                        pv_tier_name(m->to));
    const pv_session *s = &cache->sessions[m->session];
    const pv_pool *to = &cache->pool[m->to];
    if (m->chunk >= s->n_chunks || m->to_slot >= to->n_slots)
        return pv_error(PV_ERR_INVALID_ARG, "%s: move %zu names chunk %u (of %u) or slot %u (of %u)",
                        fn, i, m->chunk, s->n_chunks, m->to_slot, to->n_slots);
    const pv_chunk_rec *r = pv_rec(cache, s, m->chunk, m->layer);
    const pv_slot_owner *o = &to->owner[m->to_slot];
    if (!r || r->copying != 1 || r->tier != m->from || r->slot != m->from_slot ||
        o->state != PV_SLOT_RESERVED || o->session != m->session || o->chunk != m->chunk ||
        o->layer != m->layer)
        return pv_error(PV_ERR_STATE,
                        "%s: move %zu (\"%.64s\" chunk %u layer %u) is not in flight (completed, "
                        "aborted or listed twice)",
                        fn, i, s->id, m->chunk, m->layer);
    return PV_OK;
}

/* Validates every move before applying any, so a bad list changes nothing;
 * copying = 2 marks moves seen, to catch one listed twice. */
static pv_status check_copies(pv_cache *cache, const char *fn, const pv_cache_move *moves,
                              size_t n_moves)
{
    if (!cache || (n_moves && !moves))
        return pv_error(PV_ERR_INVALID_ARG, "%s: cache and moves must not be NULL", fn);
    pv_status st = PV_OK;
    size_t i;
    for (i = 0; i < n_moves && st == PV_OK; i++) {
        st = check_copy(cache, fn, i, &moves[i]);
        if (st == PV_OK)
            pv_rec(cache, &cache->sessions[moves[i].session], moves[i].chunk, moves[i].layer)->copying = 2;
    }
    size_t marked = st == PV_OK ? n_moves : i - 1;
    for (size_t j = 0; j < marked; j++)
        pv_rec(cache, &cache->sessions[moves[j].session], moves[j].chunk, moves[j].layer)->copying = 1;
    return st;
}

/* A checked two-phase copy is over (completed or abandoned): the chunk is
 * no longer under copy and the pending count of its direction drops. */
static pv_chunk_rec *end_copy(pv_cache *cache, const pv_cache_move *m)
{
    pv_session *s = &cache->sessions[m->session];
    pv_chunk_rec *r = pv_rec(cache, s, m->chunk, m->layer);
    r->copying = 0;
    s->copy_src[m->from]--;
    if (m->from == PV_TIER_DEVICE)
        cache->pending_out--;
    else
        cache->pending_in--;
    return r;
}

pv_status pv_cache_complete(pv_cache *cache, const pv_cache_move *moves, size_t n_moves)
{
    pv_status st = check_copies(cache, "pv_cache_complete", moves, n_moves);
    if (st != PV_OK)
        return st;
    for (size_t i = 0; i < n_moves; i++) {
        const pv_cache_move *m = &moves[i];
        pv_session *s = &cache->sessions[m->session];
        pv_chunk_rec *r = end_copy(cache, m);
        if (m->from == PV_TIER_DEVICE) {
            cache->stats.swap_out_chunks++;
            cache->stats.swap_out_bytes += cache->cfg.slot_bytes;
        } else {
            cache->stats.swap_in_chunks++;
            cache->stats.swap_in_bytes += cache->cfg.slot_bytes;
        }
        /* The record leaves its source (lead untouched: it was under copy)
         * and takes the reserved slot as its own. A DEVICE source is
         * reclaimed lazily (Pensieve §4.3.2): it stays held as a clean
         * shadow, read on lookup and freed for free when room is needed. */
        s->records[m->from]--;
        cache->stats.records[m->from]--;
        if (m->from == PV_TIER_DEVICE) {
            cache->pool[PV_TIER_DEVICE].owner[m->from_slot].state = PV_SLOT_SHADOW;
            r->shadowed = 1;
            cache->pool[PV_TIER_HOST].shadow_of[m->to_slot] = m->from_slot;
            s->shadows++;
            cache->stats.shadow_chunks++;
            cache->stats.shadow_bytes += cache->cfg.slot_bytes;
            pv_lead_add(cache, s, PV_SET_SHADOW, m->chunk, m->layer);
        } else {
            pv_slot_give(cache, s, m->from, m->from_slot);
        }
        cache->pool[m->to].owner[m->to_slot].state = PV_SLOT_OWNED;
        pv_rec_enter(cache, s, m->chunk, m->layer, m->to, m->to_slot);
        pv_session_refresh(cache, s);
    }
    for (size_t i = 0; i < n_moves; i++)
        pv_share_collect(cache, moves[i].session);
    return PV_OK;
}

pv_status pv_cache_abort(pv_cache *cache, const pv_cache_move *moves, size_t n_moves)
{
    pv_status st = check_copies(cache, "pv_cache_abort", moves, n_moves);
    if (st != PV_OK)
        return st;
    for (size_t i = 0; i < n_moves; i++) {
        const pv_cache_move *m = &moves[i];
        pv_session *s = &cache->sessions[m->session];
        end_copy(cache, m);
        pv_slot_give(cache, s, m->to, m->to_slot);
        pv_lead_add(cache, s, m->from, m->chunk, m->layer);
        pv_session_refresh(cache, s);
    }
    for (size_t i = 0; i < n_moves; i++)
        pv_share_collect(cache, moves[i].session);
    return PV_OK;
}

pv_status pv_cache_admit(pv_cache *cache, uint64_t need_slots, pv_cache_admission *out)
{
    if (!cache || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_admit: cache and out must not be NULL");
    const pv_pool *dev = &cache->pool[PV_TIER_DEVICE];
    uint64_t want = need_slots + cache->reserve_slots;
    if (need_slots > dev->n_slots || want > dev->n_slots)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_admit: %llu slots plus the %u-slot reserve exceed the device pool "
                        "(%u slots); the request can never be admitted",
                        (unsigned long long)need_slots, cache->reserve_slots, dev->n_slots);
    out->admit = want <= dev->n_free + cache->evictable[PV_TIER_DEVICE] +
                             cache->evictable[PV_SET_SHADOW];
    out->free_bytes = out->admit && want > dev->n_free ? want * cache->cfg.slot_bytes : 0;
    return PV_OK;
}

pv_status pv_cache_choose_suspend(const pv_cache *cache, const char **id)
{
    if (!cache || !id)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_choose_suspend: cache and id must not be NULL");
    if (cache->pin_tail == PV_NONE32)
        return pv_error(PV_ERR_NOT_FOUND, "pv_cache_choose_suspend: no running (pinned) session");
    *id = cache->sessions[cache->pin_tail].id;
    return PV_OK;
}
