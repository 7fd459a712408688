/* Test-only: breaks one invariant of a cache on purpose, so a test can show
 * that pv_cache_check() detects and names it. Linked into test programs
 * (tests/cache.mk), never into the library. */
#include "pvcore/cache_internal.h"

#include <string.h>

/* The first live session for which want(s) holds, or NULL. */
static pv_session *find_live(pv_cache *cache, int (*want)(const pv_cache *, const pv_session *))
{
    for (uint32_t h = 0; h < cache->next_handle; h++)
        if (cache->sessions[h].id && want(cache, &cache->sessions[h]))
            return &cache->sessions[h];
    return NULL;
}

static int has_device(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->records[PV_TIER_DEVICE] > s->copy_src[PV_TIER_DEVICE];
}

static int has_records(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->records[PV_TIER_DEVICE] + s->records[PV_TIER_HOST] + s->records[PV_TIER_DROPPED] > 0;
}

static int has_shadow(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->shadows > 0;
}

static int links(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->n_shared > 1;
}

static int is_holder(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->holder;
}

static int is_candidate(const pv_cache *cache, const pv_session *s)
{
    (void)cache;
    return s->candidate[PV_TIER_DEVICE];
}

/* A record of s in set t (a tier, or PV_SET_SHADOW for a shadowed one). */
static pv_chunk_rec *find_rec(pv_cache *cache, pv_session *s, int t, uint32_t *chunk,
                              uint32_t *layer)
{
    for (uint32_t c = pv_chunk_next(s, 0); c < s->n_chunks; c = pv_chunk_next(s, c + 1))
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++) {
            pv_chunk_rec *r = pv_rec(cache, s, c, l);
            if (t == PV_SET_SHADOW ? r->shadowed : (r->tier == t && !r->copying)) {
                *chunk = c;
                *layer = l;
                return r;
            }
        }
    return NULL;
}

pv_status pv_cache_test_corrupt(pv_cache *cache, const char *invariant)
{
    pv_session *s = NULL;
    uint32_t c, l;
    pv_chunk_rec *r;
    pv_pool *dev = &cache->pool[PV_TIER_DEVICE];
    if (strcmp(invariant, "one tier") == 0) {
        /* A free DEVICE slot claims a chunk that lives in HOST. */
        if (!(s = find_live(cache, has_shadow)) || dev->n_free == 0 ||
            !(r = find_rec(cache, s, PV_SET_SHADOW, &c, &l)))
            goto missing;
        uint32_t slot = dev->free_stack[--dev->n_free];
        dev->owner[slot] = (pv_slot_owner){handle_of(cache, s), c, (uint16_t)l, PV_SLOT_OWNED};
        s->held_slots[PV_TIER_DEVICE]++;
        cache->stats.used_bytes[PV_TIER_DEVICE] += cache->cfg.slot_bytes;
    } else if (strcmp(invariant, "byte counters") == 0) {
        cache->stats.used_bytes[PV_TIER_HOST] += cache->cfg.slot_bytes;
    } else if (strcmp(invariant, "record counters") == 0) {
        if (!(s = find_live(cache, has_records)))
            goto missing;
        s->records[PV_TIER_DROPPED]++;
    } else if (strcmp(invariant, "session index") == 0) {
        /* The index forgets its last chunk while the chunk keeps its slot. */
        if (!(s = find_live(cache, has_device)))
            goto missing;
        s->n_chunks--;
    } else if (strcmp(invariant, "ended session") == 0) {
        uint32_t h = 0;
        while (h < cache->next_handle && cache->sessions[h].id)
            h++;
        if (h == cache->next_handle)
            goto missing;
        cache->sessions[h].records[PV_TIER_DROPPED] = 1;
    } else if (strcmp(invariant, "free list") == 0) {
        /* A free slot falls off the free list (leaked). */
        if (dev->n_free == 0)
            goto missing;
        dev->n_free--;
    } else if (strcmp(invariant, "shadow") == 0) {
        if (!(s = find_live(cache, has_shadow)) || !(r = find_rec(cache, s, PV_SET_SHADOW, &c, &l)))
            goto missing;
        r->shadowed = 0;
    } else if (strcmp(invariant, "copies") == 0) {
        cache->pending_out++;
    } else if (strcmp(invariant, "frontier") == 0) {
        if (!(s = find_live(cache, has_device)) || !find_rec(cache, s, PV_TIER_DEVICE, &c, &l))
            goto missing;
        s->lead[(size_t)PV_TIER_DEVICE * cache->cfg.n_layers + l] = PV_NONE32;
    } else if (strcmp(invariant, "eviction tree") == 0) {
        if (!(s = find_live(cache, is_candidate)))
            goto missing;
        pv_ktree *tree = &cache->tree[PV_TIER_DEVICE];
        tree->winner[tree->cap + handle_of(cache, s)] = -1;
    } else if (strcmp(invariant, "pin list") == 0) {
        if (cache->pin_head == PV_NONE32)
            goto missing;
        cache->pin_head = cache->pin_tail = PV_NONE32;
    } else if (strcmp(invariant, "session table") == 0) {
        if (cache->n_sessions == 0)
            goto missing;
        for (uint32_t i = 0; i < cache->map_cap; i++)
            if (cache->map[i] != PV_NONE32) {
                cache->map[i] = PV_NONE32;
                break;
            }
    } else if (strcmp(invariant, "shared chunks") == 0) {
        /* A session's chunk 1 links chunk 0's holder. */
        if (!(s = find_live(cache, links)))
            goto missing;
        for (l = 0; l < cache->cfg.n_layers; l++)
            pv_rec(cache, s, 1, l)->slot = pv_rec(cache, s, 0, 0)->slot;
    } else if (strcmp(invariant, "reference counts") == 0) {
        /* A link counted that no session holds (the holders' own counts
         * feed their retention values: the frontier check sees those). */
        if (!find_live(cache, is_holder))
            goto missing;
        cache->stats.shared_links++;
    } else if (strcmp(invariant, "share map") == 0) {
        /* A holder is no longer findable: its entry names another chunk. */
        if (!(s = find_live(cache, is_holder)))
            goto missing;
        for (uint32_t i = 0; i < cache->share_cap; i++)
            if (cache->share[i].handle == handle_of(cache, s))
                cache->share[i].chunk++;
    } else {
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_test_corrupt: no invariant named \"%s\"",
                        invariant);
    }
    return PV_OK;
missing:
    return pv_error(PV_ERR_NOT_FOUND, "pv_cache_test_corrupt: the cache holds nothing to break \"%s\"",
                    invariant);
}
