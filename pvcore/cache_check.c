/* pv_cache_check: every invariant of the tiered cache, verified from the
 * raw structures (slots, records, counters, frontiers, trees, lists). */
#include "pvcore/cache_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Each violation names its invariant (the names are listed in cache.h). */
#define FAIL(invariant, ...) \
    return pv_error(PV_ERR_STATE, "pv_cache_check: invariant \"" invariant "\" violated: " __VA_ARGS__)

static const char *set_name(int t)
{
    return t == PV_SET_SHADOW ? "shadow" : pv_tier_name((pv_tier)t);
}

static pv_status check_pools(const pv_cache *cache, uint8_t *seen, size_t seen_size)
{
    for (int t = 0; t < PV_SLOT_TIERS; t++) {
        const pv_pool *pool = &cache->pool[t];
        const char *tn = pv_tier_name((pv_tier)t);
        if (pool->n_backed > pool->n_slots || pool->n_free > pool->n_backed)
            FAIL("free list", "%s pool has %u free of %u backed of %u slots", tn, pool->n_free, pool->n_backed,
                 pool->n_slots);
        if (t == PV_TIER_HOST && cache->stats.host_backed_bytes != (uint64_t)pool->n_backed * cache->cfg.slot_bytes)
            FAIL("byte counters", "host backed bytes counter %llu != %u backed slots of %llu bytes",
                 (unsigned long long)cache->stats.host_backed_bytes, pool->n_backed,
                 (unsigned long long)cache->cfg.slot_bytes);
        memset(seen, 0, seen_size);
        for (uint32_t i = 0; i < pool->n_free; i++) {
            uint32_t slot = pool->free_stack[i];
            if (slot >= pool->n_backed)
                FAIL("free list", "%s free list entry %u is slot %u, beyond %u backed slots", tn, i, slot,
                     pool->n_backed);
            if (seen[slot])
                FAIL("free list", "%s slot %u is twice on the free list", tn, slot);
            seen[slot] = 1;
            if (pool->owner[slot].state != PV_SLOT_FREE)
                FAIL("free list", "%s slot %u is on the free list but marked in use", tn, slot);
        }
        uint32_t in_use = 0;
        uint64_t held = 0;
        for (uint32_t slot = 0; slot < pool->n_slots; slot++) {
            const pv_slot_owner *o = &pool->owner[slot];
            if (slot >= pool->n_backed && o->state != PV_SLOT_FREE)
                FAIL("free list", "%s slot %u is in use but beyond the %u backed slots", tn, slot, pool->n_backed);
            if (o->state == PV_SLOT_FREE && slot >= pool->n_backed)
                continue;
            if (o->state == PV_SLOT_FREE) {
                if (!seen[slot])
                    FAIL("free list", "%s slot %u is free but not on the free list (leaked)", tn, slot);
                continue;
            }
            in_use++;
            if (o->session >= cache->next_handle || !cache->sessions[o->session].id)
                FAIL("ended session", "%s slot %u belongs to ended session handle %u", tn, slot, o->session);
            const pv_session *s = &cache->sessions[o->session];
            if (o->chunk >= s->n_chunks || o->layer >= cache->cfg.n_layers)
                FAIL("session index", "%s slot %u names chunk %u layer %u beyond session \"%s\"", tn, slot, o->chunk,
                     o->layer, s->id);
            const pv_chunk_rec *r = pv_rec(cache, s, o->chunk, o->layer);
            if (!r)
                FAIL("session index", "%s slot %u names chunk %u of \"%s\", which has no index page",
                     tn, slot, o->chunk, s->id);
            if (o->state == PV_SLOT_OWNED && (r->tier != t || r->slot != slot))
                FAIL("one tier", "%s slot %u is owned by \"%s\" chunk %u layer %u, which is in %s slot %u", tn,
                     slot, s->id, o->chunk, o->layer, pv_tier_name((pv_tier)r->tier), r->slot);
            if (o->state == PV_SLOT_RESERVED && (!r->copying || r->tier == t || r->tier >= PV_SLOT_TIERS))
                FAIL("copies", "%s slot %u is reserved for \"%s\" chunk %u layer %u, which is not under copy "
                     "from the other tier",
                     tn, slot, s->id, o->chunk, o->layer);
            /* A shadow belongs to exactly one HOST chunk of the same key. */
            if (o->state == PV_SLOT_SHADOW &&
                (t != PV_TIER_DEVICE || r->tier != PV_TIER_HOST || pv_rec_shadow(cache, r) != slot))
                FAIL("shadow", "%s slot %u is a shadow of \"%s\" chunk %u layer %u, which is in %s with "
                     "shadow %u",
                     tn, slot, s->id, o->chunk, o->layer, pv_tier_name((pv_tier)r->tier),
                     pv_rec_shadow(cache, r));
            if (pool->shadow_of && pool->shadow_of[slot] != PV_NONE32 &&
                (o->state != PV_SLOT_OWNED || !r->shadowed))
                FAIL("shadow", "%s slot %u names shadow %u but holds no shadowed chunk", tn, slot,
                     pool->shadow_of[slot]);
            held += cache->cfg.slot_bytes;
        }
        if (in_use + pool->n_free != pool->n_backed)
            FAIL("free list", "%s pool: %u in use + %u free != %u backed slots", tn, in_use, pool->n_free,
                 pool->n_backed);
        if (held != cache->stats.used_bytes[t])
            FAIL("byte counters", "%s used bytes counter %llu != %llu, the sum of slots in use", tn,
                 (unsigned long long)cache->stats.used_bytes[t], (unsigned long long)held);
    }
    return PV_OK;
}

static pv_status check_session(const pv_cache *cache, uint32_t h, uint64_t *records,
                               uint64_t *evictable, uint32_t *copies, uint64_t *all_shadows)
{
    const pv_session *s = &cache->sessions[h];
    uint32_t n_layers = cache->cfg.n_layers;
    if (!s->holder && pv_session_find(cache, s->id) != h)
        FAIL("session table", "session \"%s\" (handle %u) is not found under its id", s->id, h);
    uint32_t count[3] = {0, 0, 0}, copying[PV_SLOT_TIERS] = {0, 0}, reserved[PV_SLOT_TIERS] = {0, 0};
    uint32_t shadows = 0;
    /* Through the end of the last page: a record past n_chunks is a fault. */
    uint32_t end = s->n_chunks ? (((s->n_chunks - 1) >> PV_PAGE_SHIFT) + 1) * PV_PAGE_CHUNKS : 0;
    for (uint32_t c = pv_chunk_next(s, 0); c < end; c = c + 1 < s->n_chunks ? pv_chunk_next(s, c + 1) : c + 1) {
        for (uint32_t l = 0; l < n_layers; l++) {
            const pv_chunk_rec *r = pv_rec(cache, s, c, l);
            if (r->shadowed) {
                const pv_pool *dev = &cache->pool[PV_TIER_DEVICE];
                if (r->tier != PV_TIER_HOST || r->copying || r->slot >= cache->pool[PV_TIER_HOST].n_slots)
                    FAIL("shadow", "\"%s\" chunk %u layer %u has a shadow but is in %s slot %u (copying %u), "
                         "not settled in host",
                         s->id, c, l, pv_tier_name((pv_tier)r->tier), r->slot, r->copying);
                uint32_t sh = pv_rec_shadow(cache, r);
                if (sh >= dev->n_slots || dev->owner[sh].state != PV_SLOT_SHADOW ||
                    dev->owner[sh].session != h || dev->owner[sh].chunk != c || dev->owner[sh].layer != l)
                    FAIL("shadow", "\"%s\" chunk %u layer %u: shadow device slot %u (of %u) is not its shadow",
                         s->id, c, l, sh, dev->n_slots);
                shadows++;
            }
            if (r->tier == PV_REC_SHARED && c < s->n_chunks)
                continue; /* pv_share_check follows the link */
            if (r->tier == PV_TIER_NONE) {
                if (r->copying)
                    FAIL("copies", "\"%s\" chunk %u layer %u is under copy but stored nowhere", s->id, c, l);
                continue;
            }
            if (r->tier > PV_TIER_NONE || c >= s->n_chunks)
                FAIL("session index", "\"%s\" chunk %u layer %u has tier %u beyond the index (%u chunks)", s->id, c, l,
                     r->tier, s->n_chunks);
            count[r->tier]++;
            if (r->tier == PV_TIER_DROPPED) {
                if (r->copying)
                    FAIL("copies", "\"%s\" chunk %u layer %u is dropped but under copy", s->id, c, l);
                continue;
            }
            const pv_pool *pool = &cache->pool[r->tier];
            if (r->slot >= pool->n_slots)
                FAIL("session index", "\"%s\" chunk %u layer %u: %s slot %u beyond %u slots", s->id, c, l,
                     pv_tier_name((pv_tier)r->tier), r->slot, pool->n_slots);
            const pv_slot_owner *o = &pool->owner[r->slot];
            if (o->state != PV_SLOT_OWNED || o->session != h || o->chunk != c || o->layer != l)
                FAIL("one tier", "\"%s\" chunk %u layer %u: %s slot %u is not owned by it", s->id, c, l,
                     pv_tier_name((pv_tier)r->tier), r->slot);
            if (r->copying) {
                copying[r->tier]++;
                reserved[1 - r->tier]++;
            }
        }
    }
    /* n_chunks is the highest chunk holding a record + 1 (the view's count,
     * the weighted policy's position weight). */
    if (s->n_chunks) {
        const pv_chunk_rec *last = pv_rec(cache, s, s->n_chunks - 1, 0);
        uint32_t l = 0;
        while (last && l < n_layers && last[l].tier == PV_TIER_NONE)
            l++;
        if (!last || l == n_layers)
            FAIL("session index", "session \"%s\": n_chunks %u but chunk %u holds no record", s->id,
                 s->n_chunks, s->n_chunks - 1);
    }
    for (int t = 0; t < 3; t++) {
        if (count[t] != s->records[t])
            FAIL("record counters", "session \"%s\": %u %s records counted, counter says %u", s->id, count[t],
                 pv_tier_name((pv_tier)t), s->records[t]);
        records[t] += count[t];
    }
    if (shadows != s->shadows)
        FAIL("shadow", "session \"%s\": %u shadows counted, counter says %u", s->id, shadows, s->shadows);
    *all_shadows += shadows;
    for (int t = 0; t < PV_SLOT_TIERS; t++) {
        const char *tn = pv_tier_name((pv_tier)t);
        uint32_t own_shadows = t == PV_TIER_DEVICE ? shadows : 0;
        if (copying[t] != s->copy_src[t])
            FAIL("copies", "session \"%s\": %u %s records under copy, counter says %u", s->id, copying[t], tn,
                 s->copy_src[t]);
        if (count[t] + reserved[t] + own_shadows != s->held_slots[t])
            FAIL("byte counters", "session \"%s\": holds %u %s slots + %u reserved + %u shadows, counter says %u",
                 s->id, count[t], tn, reserved[t], own_shadows, s->held_slots[t]);
        copies[t] += copying[t];
    }
    for (int t = 0; t < PV_EVICT_SETS; t++) {
        const char *tn = set_name(t);
        for (uint32_t l = 0; l < n_layers; l++) {
            uint32_t lead = PV_NONE32;
            for (uint32_t c = pv_chunk_next(s, 0); c < s->n_chunks && lead == PV_NONE32;
                 c = pv_chunk_next(s, c + 1)) {
                const pv_chunk_rec *r = pv_rec(cache, s, c, l);
                if (t == PV_SET_SHADOW ? r->shadowed : r->tier == t && !r->copying)
                    lead = c;
            }
            if (s->lead[t * n_layers + l] != lead)
                FAIL("frontier", "session \"%s\": %s lead of layer %u is %u, expected %u", s->id, tn, l,
                     s->lead[t * n_layers + l], lead);
        }
        uint32_t fc, fl;
        double cost;
        pv_frontier_compute(cache, s, t, &fc, &fl, &cost);
        int candidate = !s->pins && fc != PV_NONE32;
        if (candidate != s->candidate[t] ||
            (candidate && (fc != s->front_chunk[t] || fl != s->front_layer[t] ||
                           cost != s->front_cost[t])))
            FAIL("frontier", "session \"%s\": %s frontier is chunk %u layer %u (candidate %d), expected chunk "
                 "%u layer %u (candidate %d)",
                 s->id, tn, s->front_chunk[t], s->front_layer[t], s->candidate[t], fc, fl, candidate);
        uint32_t members = t == PV_SET_SHADOW ? shadows : count[t] - copying[t];
        uint32_t share = s->pins ? 0 : members;
        if (share != s->evictable[t])
            FAIL("frontier", "session \"%s\": %u evictable %s records, counter says %u", s->id, share, tn,
                 s->evictable[t]);
        evictable[t] += share;
        const pv_ktree *tree = &cache->tree[t];
        if (tree->winner[tree->cap + h] != (candidate ? (int32_t)h : -1))
            FAIL("eviction tree", "session \"%s\": %s eviction tree leaf disagrees with candidate %d", s->id, tn,
                 candidate);
    }
    return PV_OK;
}

pv_status pv_cache_check(const pv_cache *cache)
{
    if (!cache)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_check: cache is NULL");
    uint32_t biggest = cache->pool[0].n_slots > cache->pool[1].n_slots ? cache->pool[0].n_slots
                                                                       : cache->pool[1].n_slots;
    uint8_t *seen = malloc(biggest);
    if (!seen)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_cache_check: no memory for %u slot marks", biggest);
    pv_status st = check_pools(cache, seen, biggest);
    free(seen);
    if (st != PV_OK)
        return st;

    uint64_t records[3] = {0, 0, 0}, evictable[PV_EVICT_SETS] = {0, 0, 0}, shadows = 0;
    uint32_t copies[PV_SLOT_TIERS] = {0, 0}, live = 0, pinned = 0, holders = 0;
    for (uint32_t h = 0; h < cache->next_handle; h++) {
        const pv_session *s = &cache->sessions[h];
        if (!s->id) {
            /* Invariant 4: an ended session leaves nothing behind. */
            if (s->index || s->n_blocks || s->tokens || s->lead || s->held_slots[0] || s->held_slots[1] ||
                s->records[0] || s->records[1] || s->records[2] || s->shadows || s->pins)
                FAIL("ended session", "ended session handle %u still holds records, shadows, history or slots", h);
            for (int t = 0; t < PV_EVICT_SETS; t++)
                if (cache->tree[t].winner[cache->tree[t].cap + h] != -1)
                    FAIL("ended session", "ended session handle %u is still an eviction candidate", h);
            continue;
        }
        live++;
        holders += s->holder;
        if (s->pins && !s->holder)
            pinned++;
        if ((st = check_session(cache, h, records, evictable, copies, &shadows)) != PV_OK)
            return st;
    }
    if (live != cache->n_sessions + cache->n_holders || holders != cache->n_holders)
        FAIL("session table", "%u live sessions (%u holders), counters say %u sessions and %u holders", live,
             holders, cache->n_sessions, cache->n_holders);
    if (live + cache->n_free_handles != cache->next_handle)
        FAIL("session table", "%u live + %u free handles != %u handles used", live, cache->n_free_handles,
             cache->next_handle);
    uint32_t mapped = 0;
    for (uint32_t i = 0; i < cache->map_cap; i++)
        if (cache->map[i] != PV_NONE32)
            mapped++;
    if (mapped != live - holders)
        FAIL("session table", "session table holds %u ids for %u live sessions", mapped, live - holders);
    for (int t = 0; t < 3; t++)
        if (records[t] != cache->stats.records[t])
            FAIL("record counters", "%llu %s records, counter says %llu", (unsigned long long)records[t],
                 pv_tier_name((pv_tier)t), (unsigned long long)cache->stats.records[t]);
    for (int t = 0; t < PV_EVICT_SETS; t++)
        if (evictable[t] != cache->evictable[t])
            FAIL("frontier", "%llu evictable %s records, counter says %llu", (unsigned long long)evictable[t],
                 set_name(t),
                 (unsigned long long)cache->evictable[t]);
    if (shadows != cache->stats.shadow_chunks ||
        shadows * cache->cfg.slot_bytes != cache->stats.shadow_bytes)
        FAIL("shadow", "%llu shadows, counters say %llu chunks and %llu bytes", (unsigned long long)shadows,
             (unsigned long long)cache->stats.shadow_chunks,
             (unsigned long long)cache->stats.shadow_bytes);
    if (copies[PV_TIER_DEVICE] != cache->pending_out || copies[PV_TIER_HOST] != cache->pending_in)
        FAIL("copies", "%u swap-outs and %u swap-ins under copy, counters say %u and %u", copies[0], copies[1],
             cache->pending_out, cache->pending_in);
    for (int t = 0; t < PV_EVICT_SETS; t++) {
        /* A node not marked for recomputation holds one of its children's
         * winners; a marked node's parent is marked too. */
        const pv_ktree *tree = &cache->tree[t];
        for (uint32_t i = 1; i < tree->cap; i++) {
            int32_t w = tree->winner[i], a = tree->winner[2 * i], b = tree->winner[2 * i + 1];
            if (tree->expiry[i] == -INFINITY) {
                if (i > 1 && tree->expiry[i / 2] != -INFINITY)
                    FAIL("eviction tree", "%s eviction tree node %u is stale under a current parent", set_name(t), i);
            } else if ((w != a && w != b) || (w < 0 && (a >= 0 || b >= 0))) {
                FAIL("eviction tree", "%s eviction tree node %u holds %d, its children %d and %d", set_name(t), i, w,
                     a, b);
            }
        }
    }
    uint32_t listed = 0;
    uint64_t last_seq = 0;
    for (uint32_t h = cache->pin_head; h != PV_NONE32; h = cache->sessions[h].pin_next) {
        const pv_session *s = &cache->sessions[h];
        if (!s->id || s->holder || !s->pins || s->pin_seq <= last_seq || ++listed > live)
            FAIL("pin list", "pinned-session list is broken at handle %u", h);
        last_seq = s->pin_seq;
    }
    if (listed != pinned)
        FAIL("pin list", "%u sessions pinned, %u on the pinned list", pinned, listed);
    return pv_share_check(cache);
}
