/* The tiered KV cache: slot pools, the session table, chunk records, session
 * save/restore and statistics. Eviction choices live in pvcore/cache_evict.c,
 * the invariant check in pvcore/cache_check.c. */
#include "pvcore/cache_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *pv_tier_name(pv_tier tier)
{
    switch (tier) {
    case PV_TIER_DEVICE: return "device";
    case PV_TIER_HOST: return "host";
    case PV_TIER_DROPPED: return "dropped";
    case PV_TIER_NONE: return "none";
    }
    return "unknown";
}

static double monotonic_seconds(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double pv_cache_now(pv_cache *cache)
{
    return cache->clock(cache->clock_ctx);
}

/* ---- slot pools ------------------------------------------------------------ */

/* Backs slots [n_backed, after) (after <= n_slots), all free: the lowest
 * on top, so that slots are handed out in increasing order at first. */
static void pool_extend(pv_pool *pool, uint32_t after)
{
    for (uint32_t slot = after; slot-- > pool->n_backed;)
        pool->free_stack[pool->n_free++] = slot;
    pool->n_backed = after;
}

static pv_status pool_init(pv_pool *pool, uint32_t n_slots, const char *name, int shadows)
{
    pool->n_slots = n_slots;
    pool->n_backed = pool->n_free = 0;
    /* An empty pool (no host tier) still gets valid, unused arrays. */
    size_t n = n_slots ? n_slots : 1;
    pool->free_stack = malloc(n * sizeof *pool->free_stack);
    pool->owner = calloc(n, sizeof *pool->owner);
    pool->shadow_of = shadows ? malloc(n * sizeof *pool->shadow_of) : NULL;
    if (!pool->free_stack || !pool->owner || (shadows && !pool->shadow_of))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for the %s pool's %u slot records",
                        name, n_slots);
    if (shadows)
        memset(pool->shadow_of, 0xff, (size_t)n_slots * sizeof *pool->shadow_of);
    pool_extend(pool, n_slots);
    return PV_OK;
}

static void pool_free(pv_pool *pool)
{
    free(pool->free_stack);
    free(pool->owner);
    free(pool->shadow_of);
    pool->free_stack = NULL;
    pool->owner = NULL;
    pool->shadow_of = NULL;
}

int pv_pool_room(pv_cache *cache, pv_tier t, uint64_t need)
{
    pv_pool *pool = &cache->pool[t];
    while (pool->n_free < need && t == PV_TIER_HOST && cache->grow_host && pool->n_backed < pool->n_slots) {
        uint32_t after = cache->grow_host(cache->grow_ctx, pool->n_backed);
        if (after <= pool->n_backed)
            break;
        pool_extend(pool, after < pool->n_slots ? after : pool->n_slots);
        cache->stats.host_backed_bytes = (uint64_t)pool->n_backed * cache->cfg.slot_bytes;
    }
    return pool->n_free >= need;
}

pv_status pv_cache_host_growth(pv_cache *cache, uint32_t n_backed, pv_cache_grow_fn grow, void *ctx)
{
    if (!cache || !grow)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_host_growth: cache and grow must not be NULL");
    pv_pool *pool = &cache->pool[PV_TIER_HOST];
    if (pool->n_free != pool->n_backed)
        return pv_error(PV_ERR_STATE, "pv_cache_host_growth: %u HOST slots are in use already",
                        pool->n_backed - pool->n_free);
    if (n_backed > pool->n_slots)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_host_growth: %u backed slots, beyond the %u of the budget",
                        n_backed, pool->n_slots);
    pool->n_backed = pool->n_free = 0;
    pool_extend(pool, n_backed);
    cache->grow_host = grow;
    cache->grow_ctx = ctx;
    cache->stats.host_backed_bytes = (uint64_t)n_backed * cache->cfg.slot_bytes;
    return PV_OK;
}

uint32_t pv_slot_take(pv_cache *cache, pv_session *s, pv_tier tier, uint32_t chunk, uint32_t layer,
                      uint8_t state)
{
    pv_pool *pool = &cache->pool[tier];
    uint32_t slot = pool->free_stack[--pool->n_free];
    pool->owner[slot] = (pv_slot_owner){handle_of(cache, s), chunk, (uint16_t)layer, state};
    s->held_slots[tier]++;
    cache->stats.used_bytes[tier] += cache->cfg.slot_bytes;
    if (s->refs > 1)
        cache->stats.shared_saved_bytes[tier] += (uint64_t)(s->refs - 1) * cache->cfg.slot_bytes;
    return slot;
}

void pv_slot_give(pv_cache *cache, pv_session *s, pv_tier tier, uint32_t slot)
{
    pv_pool *pool = &cache->pool[tier];
    pool->owner[slot].state = PV_SLOT_FREE;
    pool->free_stack[pool->n_free++] = slot;
    s->held_slots[tier]--;
    cache->stats.used_bytes[tier] -= cache->cfg.slot_bytes;
    if (s->refs > 1)
        cache->stats.shared_saved_bytes[tier] -= (uint64_t)(s->refs - 1) * cache->cfg.slot_bytes;
}

/* ---- session table: open addressing, linear probing, backward-shift delete - */

static uint32_t hash_id(const char *id)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h;
}

static uint32_t map_find(const pv_cache *cache, const char *id, uint32_t h)
{
    uint32_t mask = cache->map_cap - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t handle = cache->map[i];
        if (handle == PV_NONE32)
            return PV_NONE32;
        const pv_session *s = &cache->sessions[handle];
        if (s->hash == h && strcmp(s->id, id) == 0)
            return handle;
    }
}

static void map_put(pv_cache *cache, uint32_t handle)
{
    uint32_t mask = cache->map_cap - 1;
    uint32_t i = cache->sessions[handle].hash & mask;
    while (cache->map[i] != PV_NONE32)
        i = (i + 1) & mask;
    cache->map[i] = handle;
}

static void map_remove(pv_cache *cache, uint32_t handle)
{
    uint32_t mask = cache->map_cap - 1;
    uint32_t i = cache->sessions[handle].hash & mask;
    while (cache->map[i] != handle)
        i = (i + 1) & mask;
    /* Shift later members of the probe run back so lookups need no tombstones. */
    for (uint32_t j = (i + 1) & mask; cache->map[j] != PV_NONE32; j = (j + 1) & mask) {
        uint32_t home = cache->sessions[cache->map[j]].hash & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            cache->map[i] = cache->map[j];
            i = j;
        }
    }
    cache->map[i] = PV_NONE32;
}

static pv_status map_grow(pv_cache *cache)
{
    uint32_t cap = cache->map_cap * 2;
    uint32_t *map = malloc((size_t)cap * sizeof *map);
    if (!map)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for a session table of %u entries", cap);
    memset(map, 0xff, (size_t)cap * sizeof *map);
    free(cache->map);
    cache->map = map;
    cache->map_cap = cap;
    for (uint32_t h = 0; h < cache->next_handle; h++)
        if (cache->sessions[h].id && !cache->sessions[h].holder)
            map_put(cache, h);
    return PV_OK;
}

uint32_t pv_session_find(const pv_cache *cache, const char *id)
{
    return map_find(cache, id, hash_id(id));
}

static pv_status find_session(const pv_cache *cache, const char *id, const char *fn,
                              uint32_t *handle)
{
    if (!cache)
        return pv_error(PV_ERR_INVALID_ARG, "%s: cache is NULL", fn);
    if (!id)
        return pv_error(PV_ERR_INVALID_ARG, "%s: session id is NULL", fn);
    uint32_t h = map_find(cache, id, hash_id(id));
    if (h == PV_NONE32)
        return pv_error(PV_ERR_NOT_FOUND, "%s: unknown session \"%.64s\"", fn, id);
    *handle = h;
    return PV_OK;
}

/* ---- init / free ------------------------------------------------------------- */

pv_status pv_cache_init(pv_cache **out, const pv_cache_config *cfg, pv_clock_fn clock,
                        void *clock_ctx)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_init: out is NULL");
    *out = NULL;
    pv_status st = pv_cache_config_validate(cfg);
    if (st != PV_OK)
        return st;
    pv_cache *cache = calloc(1, sizeof *cache);
    if (!cache)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for the cache (%zu bytes)", sizeof *cache);
    cache->cfg = *cfg;
    cache->clock = clock ? clock : monotonic_seconds;
    cache->clock_ctx = clock_ctx;
    cache->pin_head = cache->pin_tail = PV_NONE32;
    uint32_t n_device = (uint32_t)(cfg->device_bytes / cfg->slot_bytes);
    uint32_t n_host = (uint32_t)(cfg->host_bytes / cfg->slot_bytes);
    cache->reserve_slots = (uint32_t)(cfg->reserve * n_device);
    cache->map_cap = 64;
    cache->map = malloc(cache->map_cap * sizeof *cache->map);
    if (!cache->map) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for the session table");
        goto fail;
    }
    memset(cache->map, 0xff, cache->map_cap * sizeof *cache->map);
    if ((st = pool_init(&cache->pool[PV_TIER_DEVICE], n_device, "device", 0)) != PV_OK ||
        (st = pool_init(&cache->pool[PV_TIER_HOST], n_host, "host", 1)) != PV_OK ||
        (st = pv_ktree_resize(cache, 16)) != PV_OK)
        goto fail;
    cache->stats.capacity_bytes[PV_TIER_DEVICE] = (uint64_t)n_device * cfg->slot_bytes;
    cache->stats.capacity_bytes[PV_TIER_HOST] = (uint64_t)n_host * cfg->slot_bytes;
    cache->stats.host_backed_bytes = cache->stats.capacity_bytes[PV_TIER_HOST];
    *out = cache;
    return PV_OK;
fail:
    pv_cache_free(cache);
    return st;
}

static void session_release(pv_session *s)
{
    free(s->id);
    for (uint32_t b = 0; b < s->n_blocks; b++) {
        if (!s->index[b])
            continue;
        for (uint32_t p = 0; p < PV_BLOCK_PAGES; p++)
            free(s->index[b][p]);
        free(s->index[b]);
    }
    free(s->index);
    free(s->tokens);
    free(s->lead);
    memset(s, 0, sizeof *s);
}

void pv_cache_free(pv_cache *cache)
{
    if (!cache)
        return;
    for (uint32_t h = 0; h < cache->next_handle; h++)
        session_release(&cache->sessions[h]);
    pv_share_free(cache);
    free(cache->sessions);
    free(cache->free_handles);
    free(cache->map);
    for (int t = 0; t < PV_SLOT_TIERS; t++)
        pool_free(&cache->pool[t]);
    for (int t = 0; t < PV_EVICT_SETS; t++)
        pv_ktree_free(&cache->tree[t]);
    free(cache);
}

/* ---- sessions ---------------------------------------------------------------- */

static void pin_list_remove(pv_cache *cache, uint32_t h)
{
    pv_session *s = &cache->sessions[h];
    if (s->pin_prev != PV_NONE32)
        cache->sessions[s->pin_prev].pin_next = s->pin_next;
    else
        cache->pin_head = s->pin_next;
    if (s->pin_next != PV_NONE32)
        cache->sessions[s->pin_next].pin_prev = s->pin_prev;
    else
        cache->pin_tail = s->pin_prev;
    s->pin_prev = s->pin_next = PV_NONE32;
}

static pv_status new_handle(pv_cache *cache, uint32_t *handle)
{
    if (cache->n_free_handles > 0) {
        *handle = cache->free_handles[--cache->n_free_handles];
        return PV_OK;
    }
    if (cache->next_handle == cache->cap_sessions) {
        if (cache->cap_sessions >= (1u << 30))
            return pv_error(PV_ERR_OUT_OF_MEMORY, "session limit of %u reached", cache->cap_sessions);
        uint32_t cap = cache->cap_sessions ? cache->cap_sessions * 2 : 16;
        pv_session *sessions = realloc(cache->sessions, (size_t)cap * sizeof *sessions);
        if (!sessions)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for %u sessions", cap);
        cache->sessions = sessions;
        memset(sessions + cache->cap_sessions, 0, (size_t)(cap - cache->cap_sessions) * sizeof *sessions);
        uint32_t *handles = realloc(cache->free_handles, (size_t)cap * sizeof *handles);
        if (!handles)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for %u session handles", cap);
        cache->free_handles = handles;
        /* The trees must cover every handle before the capacity grows. */
        pv_status st = pv_ktree_resize(cache, cap);
        if (st != PV_OK)
            return st;
        cache->cap_sessions = cap;
    }
    *handle = cache->next_handle++;
    return PV_OK;
}

uint64_t pv_ns_hash(const char *id)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a, 64 bits */
    const char *colon = strchr(id, ':');
    for (const unsigned char *p = (const unsigned char *)id; colon && p < (const unsigned char *)colon; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h;
}

pv_status pv_session_create(pv_cache *cache, const char *id, size_t len, int holder, uint32_t *handle)
{
    pv_status st;
    if (!holder && (cache->n_sessions + 1) * 2 > cache->map_cap && (st = map_grow(cache)) != PV_OK)
        return st;
    char *copy = malloc(len + 1);
    uint32_t *lead = malloc((size_t)PV_EVICT_SETS * cache->cfg.n_layers * sizeof *lead);
    uint32_t h = PV_NONE32;
    if (!copy || !lead) {
        free(copy);
        free(lead);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for session \"%.64s\"", id);
    }
    if ((st = new_handle(cache, &h)) != PV_OK) {
        free(copy);
        free(lead);
        return st;
    }
    memcpy(copy, id, len);
    copy[len] = 0;
    memset(lead, 0xff, (size_t)PV_EVICT_SETS * cache->cfg.n_layers * sizeof *lead);
    pv_session *s = &cache->sessions[h];
    memset(s, 0, sizeof *s);
    s->id = copy;
    s->hash = hash_id(copy);
    s->lead = lead;
    s->pin_prev = s->pin_next = PV_NONE32;
    s->parent = s->filler = PV_NONE32;
    s->holder = (uint8_t)holder;
    s->ns = pv_ns_hash(copy);
    s->chain = s->ns;
    s->last_active = pv_cache_now(cache);
    if (holder) {
        cache->n_holders++;
    } else {
        map_put(cache, h);
        cache->n_sessions++;
    }
    *handle = h;
    return PV_OK;
}

/* Frees a session whose records are all gone. */
void pv_session_destroy(pv_cache *cache, uint32_t h)
{
    pv_session *s = &cache->sessions[h];
    if (s->holder)
        cache->n_holders--;
    else {
        map_remove(cache, h);
        cache->n_sessions--;
    }
    session_release(s);
    cache->free_handles[cache->n_free_handles++] = h;
}

pv_status pv_cache_session_open(pv_cache *cache, const char *id)
{
    if (!cache || !id)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_session_open: cache and id must not be NULL");
    size_t len = strlen(id);
    if (len == 0 || len > PV_SESSION_ID_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "session id \"%.64s\" has length %zu, allowed [1, %d]", id,
                        len, PV_SESSION_ID_MAX);
    uint32_t h = map_find(cache, id, hash_id(id));
    if (h != PV_NONE32) {
        cache->sessions[h].last_active = pv_cache_now(cache);
        pv_session_refresh(cache, &cache->sessions[h]);
        pv_share_sync(cache, &cache->sessions[h], 0);
        return PV_OK;
    }
    pv_status st = pv_session_create(cache, id, len, 0, &h);
    if (st == PV_OK)
        pv_session_refresh(cache, &cache->sessions[h]);
    return st;
}

void pv_shadow_release(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer)
{
    pv_chunk_rec *r = pv_rec(cache, s, chunk, layer);
    uint32_t *shadow = &cache->pool[PV_TIER_HOST].shadow_of[r->slot];
    pv_lead_remove(cache, s, PV_SET_SHADOW, chunk, layer);
    pv_slot_give(cache, s, PV_TIER_DEVICE, *shadow);
    *shadow = PV_NONE32;
    r->shadowed = 0;
    s->shadows--;
    cache->stats.shadow_chunks--;
    cache->stats.shadow_bytes -= cache->cfg.slot_bytes;
}

/* Removes one record from its tier, freeing its slot and shadow. */
void pv_rec_exit(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer)
{
    pv_chunk_rec *r = pv_rec(cache, s, chunk, layer);
    if (r->tier == PV_TIER_NONE)
        return;
    if (r->filling) {
        r->filling = 0;
        cache->filling--;
    }
    if (r->shadowed)
        pv_shadow_release(cache, s, chunk, layer);
    if (r->tier < PV_SLOT_TIERS) {
        if (!r->copying)
            pv_lead_remove(cache, s, r->tier, chunk, layer);
        pv_slot_give(cache, s, (pv_tier)r->tier, r->slot);
    }
    s->records[r->tier]--;
    cache->stats.records[r->tier]--;
    r->tier = PV_TIER_NONE;
    r->slot = PV_NONE32;
}

pv_status pv_cache_end_session(pv_cache *cache, const char *id, uint64_t *bytes_freed)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_end_session", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    if (s->pins)
        return pv_error(PV_ERR_BUSY, "pv_cache_end_session: session \"%.64s\" is pinned %u times",
                        id, s->pins);
    if (s->copy_src[PV_TIER_DEVICE] || s->copy_src[PV_TIER_HOST])
        return pv_error(PV_ERR_BUSY,
                        "pv_cache_end_session: session \"%.64s\" has %u chunks under copy; "
                        "complete or abort them first",
                        id, s->copy_src[PV_TIER_DEVICE] + s->copy_src[PV_TIER_HOST]);
    uint64_t freed = (uint64_t)(s->held_slots[PV_TIER_DEVICE] + s->held_slots[PV_TIER_HOST]) *
                     cache->cfg.slot_bytes;
    pv_share_cut(cache, s, 0, 0);
    for (uint32_t c = pv_chunk_next(s, 0); c < s->n_chunks; c = pv_chunk_next(s, c + 1))
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
            pv_rec_exit(cache, s, c, l);
    pv_session_refresh(cache, s);
    pv_session_destroy(cache, h);
    if (bytes_freed)
        *bytes_freed = freed;
    return PV_OK;
}

/* One past the highest chunk below end that holds a record in some tier,
 * or 0. Missing blocks and pages are skipped whole, so the walk costs the
 * session's page table, not the chunk indices. */
static uint32_t stored_end(const pv_cache *cache, const pv_session *s, uint32_t end)
{
    while (end > 0) {
        uint32_t c = end - 1, b = c >> PV_BLOCK_SHIFT;
        if (b >= s->n_blocks || !s->index[b]) {
            end = b << PV_BLOCK_SHIFT;
            continue;
        }
        const pv_chunk_rec *page = s->index[b][(c >> PV_PAGE_SHIFT) % PV_BLOCK_PAGES];
        if (!page) {
            end = c & ~(PV_PAGE_CHUNKS - 1);
            continue;
        }
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
            if (page[(size_t)(c % PV_PAGE_CHUNKS) * cache->cfg.n_layers + l].tier != PV_TIER_NONE)
                return end;
        end = c;
    }
    return 0;
}

/* Frees the index pages wholly at or past s->n_chunks (they hold no record
 * any more) and the blocks left without a page, so the index follows the
 * chunks held after a truncation too. */
static void index_trim(pv_session *s)
{
    uint32_t first_page = (s->n_chunks + PV_PAGE_CHUNKS - 1) >> PV_PAGE_SHIFT;
    uint32_t n_blocks = (first_page + PV_BLOCK_PAGES - 1) / PV_BLOCK_PAGES;
    for (uint32_t b = first_page / PV_BLOCK_PAGES; b < s->n_blocks; b++) {
        if (!s->index[b])
            continue;
        uint32_t p = b == first_page / PV_BLOCK_PAGES ? first_page % PV_BLOCK_PAGES : 0;
        for (; p < PV_BLOCK_PAGES; p++) {
            free(s->index[b][p]);
            s->index[b][p] = NULL;
        }
        if (b >= n_blocks) {
            free(s->index[b]);
            s->index[b] = NULL;
        }
    }
    if (n_blocks == 0) {
        free(s->index);
        s->index = NULL;
    } else if (n_blocks < s->n_blocks) {
        /* A shrink that fails keeps the longer directory, still valid;
         * pv_index_ensure regrows it and clears the new entries. */
        pv_chunk_rec ***index = realloc(s->index, (size_t)n_blocks * sizeof *index);
        if (index)
            s->index = index;
    }
    s->n_blocks = n_blocks;
}

/* Frees session s's chunks from `keep` on, for a cut at token n_tokens (fn
 * names the caller in messages). PV_ERR_BUSY, changing nothing, while the
 * session is pinned or one of those chunks is under copy. */
static pv_status cut_chunks(pv_cache *cache, pv_session *s, uint32_t keep, uint32_t n_tokens, const char *fn)
{
    const char *id = s->id;
    if (s->pins)
        return pv_error(PV_ERR_BUSY,
                        "%s: session \"%.64s\" is pinned %u times; freeing its chunks from %u on (a "
                        "cut at token %u of %zu) waits for the unpin",
                        fn, id, s->pins, keep, n_tokens, s->n_tokens);
    uint32_t old_end = s->n_chunks;
    if (keep > old_end)
        keep = old_end;
    /* Refuse before changing anything: a copy in flight holds both slots. */
    if (s->copy_src[PV_TIER_DEVICE] || s->copy_src[PV_TIER_HOST])
        for (uint32_t c = pv_chunk_next_below(s, keep, old_end); c < old_end;
             c = pv_chunk_next_below(s, c + 1, old_end))
            for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
                if (pv_rec(cache, s, c, l)->copying)
                    return pv_error(PV_ERR_BUSY,
                                    "%s: chunk %u layer %u of \"%.64s\" is under copy, past the cut "
                                    "at token %u (chunks from %u go); complete or abort the copy first",
                                    fn, c, l, id, n_tokens, keep);
    /* A shared chunk the cut goes through becomes the session's own (its
     * tokens past the cut change): from the last full chunk kept on. */
    pv_share_cut(cache, s, n_tokens / cache->cfg.chunk_tokens, n_tokens % cache->cfg.chunk_tokens != 0);
    /* Leads are found below n_chunks: lowered first, a freed lead finds no
     * successor in the chunks being freed (O(1) instead of a scan). */
    s->n_chunks = keep;
    for (uint32_t c = pv_chunk_next_below(s, keep, old_end); c < old_end;
         c = pv_chunk_next_below(s, c + 1, old_end))
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
            pv_rec_exit(cache, s, c, l);
    s->n_chunks = stored_end(cache, s, keep);
    index_trim(s);
    s->n_tokens = n_tokens;
    if (s->committed_tokens > n_tokens)
        s->committed_tokens = n_tokens;
    /* The weighted policy's costs follow n_chunks: frontiers are redone. */
    pv_session_refresh(cache, s);
    return PV_OK;
}

static uint32_t chunks_for(const pv_cache *cache, uint64_t n_tokens)
{
    return (uint32_t)((n_tokens + cache->cfg.chunk_tokens - 1) / cache->cfg.chunk_tokens);
}

pv_status pv_cache_session_truncate(pv_cache *cache, const char *id, uint32_t n_tokens)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_session_truncate", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    if (n_tokens >= s->n_tokens)
        return PV_OK;
    /* Chunks from chunks_for(n_tokens) on hold no kept token. */
    return cut_chunks(cache, s, chunks_for(cache, n_tokens), n_tokens, "pv_cache_session_truncate");
}

pv_status pv_cache_session_trim(pv_cache *cache, const char *id)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_session_trim", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    const uint32_t keep = chunks_for(cache, s->n_tokens);
    if (keep >= s->n_chunks)
        return PV_OK;
    return cut_chunks(cache, s, keep, (uint32_t)s->n_tokens, "pv_cache_session_trim");
}

pv_status pv_cache_append_tokens(pv_cache *cache, const char *id, const int32_t *tokens,
                                 size_t n_tokens)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_append_tokens", &h);
    if (st != PV_OK)
        return st;
    if (n_tokens && !tokens)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_append_tokens: tokens is NULL for %zu tokens",
                        n_tokens);
    pv_session *s = &cache->sessions[h];
    if (n_tokens > (size_t)UINT32_MAX - s->n_tokens)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_append_tokens: history of %zu + %zu tokens exceeds %u", s->n_tokens,
                        n_tokens, UINT32_MAX);
    if (s->n_tokens + n_tokens > s->cap_tokens) {
        size_t cap = s->cap_tokens ? s->cap_tokens : 256;
        while (cap < s->n_tokens + n_tokens)
            cap *= 2;
        int32_t *grown = realloc(s->tokens, cap * sizeof *grown);
        if (!grown)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for a history of %zu tokens", cap);
        s->tokens = grown;
        s->cap_tokens = cap;
    }
    if (n_tokens)
        memcpy(s->tokens + s->n_tokens, tokens, n_tokens * sizeof *tokens);
    s->n_tokens += n_tokens;
    return PV_OK;
}

pv_status pv_cache_touch(pv_cache *cache, const char *id)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_touch", &h);
    if (st != PV_OK)
        return st;
    cache->sessions[h].last_active = pv_cache_now(cache);
    pv_session_refresh(cache, &cache->sessions[h]);
    pv_share_sync(cache, &cache->sessions[h], 0);
    return PV_OK;
}

pv_status pv_cache_session_set_active(pv_cache *cache, const char *id, double last_active)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_session_set_active", &h);
    if (st != PV_OK)
        return st;
    double now = pv_cache_now(cache);
    if (!(last_active <= now) || !isfinite(last_active))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_session_set_active: last_active %g is not a time up to now (%g)",
                        last_active, now);
    cache->sessions[h].last_active = last_active;
    pv_session_refresh(cache, &cache->sessions[h]);
    pv_share_sync(cache, &cache->sessions[h], 0);
    return PV_OK;
}

pv_status pv_cache_pin(pv_cache *cache, const char *id)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_pin", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    if (s->pins == UINT32_MAX)
        return pv_error(PV_ERR_STATE, "pv_cache_pin: session \"%.64s\" pinned %u times", id, s->pins);
    if (s->pins++ == 0) {
        s->pin_seq = ++cache->pin_counter;
        s->pin_prev = cache->pin_tail;
        s->pin_next = PV_NONE32;
        if (cache->pin_tail != PV_NONE32)
            cache->sessions[cache->pin_tail].pin_next = h;
        else
            cache->pin_head = h;
        cache->pin_tail = h;
    }
    s->last_active = pv_cache_now(cache);
    pv_session_refresh(cache, s);
    pv_share_sync(cache, s, 1);
    return PV_OK;
}

pv_status pv_cache_unpin(pv_cache *cache, const char *id)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_unpin", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    if (s->pins == 0)
        return pv_error(PV_ERR_STATE, "pv_cache_unpin: session \"%.64s\" is not pinned", id);
    if (--s->pins == 0)
        pin_list_remove(cache, h);
    s->last_active = pv_cache_now(cache);
    pv_session_refresh(cache, s);
    pv_share_sync(cache, s, -1);
    if (s->pins == 0)
        pv_share_unfill(cache, s);
    return PV_OK;
}

pv_status pv_cache_session_save(pv_cache *cache, const char *id, uint32_t committed_tokens)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_session_save", &h);
    if (st != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    if (committed_tokens > s->n_tokens)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_session_save: committed_tokens %u exceeds the history of \"%.64s\" "
                        "(%zu tokens)",
                        committed_tokens, id, s->n_tokens);
    s->committed_tokens = committed_tokens;
    s->turns++;
    s->last_active = pv_cache_now(cache);
    pv_session_refresh(cache, s);
    pv_share_sync(cache, s, 0);
    pv_share_publish(cache, s);
    return PV_OK;
}

pv_status pv_cache_session_restore(const pv_cache *cache, const char *id, pv_session_view *view)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_session_restore", &h);
    if (st != PV_OK)
        return st;
    if (!view)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_session_restore: view is NULL");
    const pv_session *s = &cache->sessions[h];
    memset(view, 0, sizeof *view);
    view->tokens = s->tokens;
    view->n_tokens = s->n_tokens;
    view->committed_tokens = s->committed_tokens;
    view->turns = s->turns;
    view->n_chunks = s->n_chunks;
    for (int t = 0; t < 3; t++)
        view->records[t] = s->records[t];
    for (int t = 0; t < PV_SLOT_TIERS; t++)
        view->held_bytes[t] = (uint64_t)s->held_slots[t] * cache->cfg.slot_bytes;
    view->shadows = s->shadows;
    view->pins = s->pins;
    view->last_active = s->last_active;
    view->shared_chunks = s->n_shared;
    /* Recovery recomputes the prefix through the last chunk with any dropped
     * layer (attention at that chunk needs every earlier position); a
     * shared chunk counts with its holder's layers. */
    uint32_t last_dropped = PV_NONE32;
    for (uint32_t c = 0; c < s->n_shared; c++) {
        const pv_session *o = pv_holder_of(cache, s, c);
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++) {
            const pv_chunk_rec *r = pv_rec(cache, o, c, l);
            view->shared_records[r->tier]++;
            view->shared_shadows += r->shadowed;
            view->shared_busy += r->copying || r->filling;
            if (r->tier == PV_TIER_DROPPED)
                last_dropped = c;
        }
    }
    if (s->records[PV_TIER_DROPPED]) {
        for (uint32_t c = pv_chunk_next(s, s->n_shared); c < s->n_chunks; c = pv_chunk_next(s, c + 1))
            for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
                if (pv_rec(cache, s, c, l)->tier == PV_TIER_DROPPED) {
                    last_dropped = c;
                    break;
                }
    }
    if (last_dropped != PV_NONE32) {
        uint64_t tokens = (uint64_t)(last_dropped + 1) * cache->cfg.chunk_tokens;
        view->recompute_tokens = (uint32_t)(tokens < s->n_tokens ? tokens : s->n_tokens);
    }
    return PV_OK;
}

pv_status pv_cache_held_bytes(const pv_cache *cache, const char *id, uint64_t *device_bytes,
                              uint64_t *host_bytes)
{
    if (!cache)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_held_bytes: cache is NULL");
    uint64_t held[PV_SLOT_TIERS];
    if (!id) {
        for (int t = 0; t < PV_SLOT_TIERS; t++)
            held[t] = cache->stats.used_bytes[t];
    } else {
        uint32_t h;
        pv_status st = find_session(cache, id, "pv_cache_held_bytes", &h);
        if (st != PV_OK)
            return st;
        for (int t = 0; t < PV_SLOT_TIERS; t++)
            held[t] = (uint64_t)cache->sessions[h].held_slots[t] * cache->cfg.slot_bytes;
    }
    if (device_bytes)
        *device_bytes = held[PV_TIER_DEVICE];
    if (host_bytes)
        *host_bytes = held[PV_TIER_HOST];
    return PV_OK;
}

const char *pv_cache_session_name(const pv_cache *cache, uint32_t session)
{
    if (!cache || session >= cache->next_handle)
        return NULL;
    return cache->sessions[session].id;
}

/* ---- chunks ------------------------------------------------------------------ */

static pv_status check_chunk_args(const pv_cache *cache, const char *fn, uint32_t chunk,
                                  uint32_t layer)
{
    if (chunk >= PV_CACHE_MAX_CHUNKS)
        return pv_error(PV_ERR_INVALID_ARG, "%s: chunk %u out of range [0, %u)", fn, chunk,
                        PV_CACHE_MAX_CHUNKS);
    if (layer >= cache->cfg.n_layers)
        return pv_error(PV_ERR_INVALID_ARG, "%s: layer %u out of range [0, %u)", fn, layer,
                        cache->cfg.n_layers);
    return PV_OK;
}

pv_status pv_index_ensure(pv_cache *cache, pv_session *s, uint32_t chunk)
{
    uint32_t b = chunk >> PV_BLOCK_SHIFT, p = (chunk >> PV_PAGE_SHIFT) % PV_BLOCK_PAGES;
    size_t per_page = (size_t)PV_PAGE_CHUNKS * cache->cfg.n_layers;
    if (b >= s->n_blocks) {
        pv_chunk_rec ***index = realloc(s->index, (size_t)(b + 1) * sizeof *index);
        if (!index)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for the index of \"%.64s\" up to "
                            "chunk %u", s->id, chunk);
        memset(index + s->n_blocks, 0, (size_t)(b + 1 - s->n_blocks) * sizeof *index);
        s->index = index;
        s->n_blocks = b + 1;
    }
    if (!s->index[b] && !(s->index[b] = calloc(PV_BLOCK_PAGES, sizeof *s->index[b])))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "no host memory for the index of \"%.64s\" at chunk %u",
                        s->id, chunk);
    if (!s->index[b][p]) {
        pv_chunk_rec *page = malloc(per_page * sizeof *page);
        if (!page)
            return pv_error(PV_ERR_OUT_OF_MEMORY,
                            "no host memory for %u chunks x %u layers of \"%.64s\"", PV_PAGE_CHUNKS,
                            cache->cfg.n_layers, s->id);
        for (size_t i = 0; i < per_page; i++)
            page[i] = (pv_chunk_rec){PV_NONE32, PV_TIER_NONE, 0, 0, 0};
        s->index[b][p] = page;
    }
    return PV_OK;
}

void pv_rec_enter(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer, pv_tier tier,
                  uint32_t slot)
{
    pv_chunk_rec *r = pv_rec(cache, s, chunk, layer);
    r->tier = (uint8_t)tier;
    r->slot = tier < PV_SLOT_TIERS ? slot : PV_NONE32;
    s->records[tier]++;
    cache->stats.records[tier]++;
    if (tier < PV_SLOT_TIERS && !r->copying)
        pv_lead_add(cache, s, tier, chunk, layer);
}

/* Stores (chunk, layer) of session s (a holder for a shared chunk). */
static pv_status store_on(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer, pv_tier tier,
                          uint32_t *slot)
{
    pv_status st;
    /* No page: the chunk was never stored. */
    const pv_chunk_rec *old_rec = pv_rec(cache, s, chunk, layer);
    pv_chunk_rec never = {PV_NONE32, PV_TIER_NONE, 0, 0, 0};
    if (!old_rec)
        old_rec = &never;
    if (old_rec->copying)
        return pv_error(PV_ERR_BUSY,
                        "pv_cache_store_chunk: chunk %u layer %u of \"%.64s\" is under copy", chunk,
                        layer, s->id);
    pv_pool *pool = &cache->pool[tier];
    /* Check before removing the old copy, so a failure changes nothing. The
     * old copy (or its shadow) frees a slot of the tier; so does reclaiming
     * a shadow on DEVICE. */
    int frees_own = old_rec->tier == tier || (tier == PV_TIER_DEVICE && old_rec->shadowed);
    int shadow_room = tier == PV_TIER_DEVICE && cache->evictable[PV_SET_SHADOW] > 0;
    if (!frees_own && !shadow_room && !pv_pool_room(cache, tier, 1))
        return pv_error(PV_ERR_OUT_OF_MEMORY,
                        "pv_cache_store_chunk: no free %s slot (%u slots in use, no shadow to "
                        "reclaim); evict first",
                        pv_tier_name(tier), pool->n_backed);
    pv_tier old = (pv_tier)old_rec->tier;
    /* A refused store allocates nothing. */
    if ((st = pv_index_ensure(cache, s, chunk)) != PV_OK)
        return st;
    /* Seed 002: a recomputed or rewritten chunk replaces its older copy in
     * whatever tier it is, shadow included, so it never lives in two tiers. */
    pv_rec_exit(cache, s, chunk, layer);
    if (pool->n_free == 0)
        pv_shadow_reclaim(cache, pv_cache_now(cache), NULL);
    uint32_t got = pv_slot_take(cache, s, tier, chunk, layer, PV_SLOT_OWNED);
    if (chunk >= s->n_chunks)
        s->n_chunks = chunk + 1;
    pv_rec_enter(cache, s, chunk, layer, tier, got);
    if (s->holder) {
        /* Other sessions must not read it before the recomputation runs. */
        pv_rec(cache, s, chunk, layer)->filling = 1;
        cache->filling++;
    }
    if (old == PV_TIER_DROPPED) {
        cache->stats.recomputed_chunks++;
        int still_dropped = 0;
        for (uint32_t l = 0; l < cache->cfg.n_layers && !still_dropped; l++)
            still_dropped = pv_rec(cache, s, chunk, l)->tier == PV_TIER_DROPPED;
        if (!still_dropped)
            cache->stats.recomputed_tokens += cache->cfg.chunk_tokens;
    }
    pv_session_refresh(cache, s);
    if (slot)
        *slot = got;
    return PV_OK;
}

pv_status pv_cache_store_chunk(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                               pv_tier tier, uint32_t *slot)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_store_chunk", &h);
    if (st != PV_OK)
        return st;
    if ((st = check_chunk_args(cache, "pv_cache_store_chunk", chunk, layer)) != PV_OK)
        return st;
    if (tier != PV_TIER_DEVICE && tier != PV_TIER_HOST)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_store_chunk: tier %s cannot hold bytes (use device or host)",
                        pv_tier_name(tier));
    pv_session *s = &cache->sessions[h];
    const pv_chunk_rec *own = pv_rec(cache, s, chunk, layer);
    if (!own || own->tier != PV_REC_SHARED)
        return store_on(cache, s, chunk, layer, tier, slot);
    /* A shared chunk: other sessions may be reading its DEVICE copy. The
     * recomputation writes the same KV into it; a copy elsewhere is
     * replaced by a fresh slot, which stays unreadable to them until the
     * recomputation has run. */
    pv_session *o = &cache->sessions[own->slot];
    const pv_chunk_rec *r = pv_rec(cache, o, chunk, layer);
    if (r->copying)
        return pv_error(PV_ERR_BUSY,
                        "pv_cache_store_chunk: shared chunk %u layer %u of \"%.64s\" is under copy", chunk,
                        layer, id);
    int on_device = r->tier == PV_TIER_DEVICE || r->shadowed;
    if (tier == PV_TIER_DEVICE && on_device) {
        if (slot)
            *slot = r->shadowed ? pv_rec_shadow(cache, r) : r->slot;
        return PV_OK;
    }
    if ((on_device && o->pins > s->pins) || (o->filler != PV_NONE32 && o->filler != h))
        return pv_error(PV_ERR_BUSY,
                        "pv_cache_store_chunk: shared chunk %u layer %u of \"%.64s\" is read on device or "
                        "being recomputed by another running session; it cannot move to %s",
                        chunk, layer, id, pv_tier_name(tier));
    if ((st = store_on(cache, o, chunk, layer, tier, slot)) == PV_OK)
        o->filler = h;
    return st;
}

pv_status pv_cache_mark_dropped(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_mark_dropped", &h);
    if (st != PV_OK)
        return st;
    if ((st = check_chunk_args(cache, "pv_cache_mark_dropped", chunk, layer)) != PV_OK)
        return st;
    pv_session *s = &cache->sessions[h];
    const pv_chunk_rec *old_rec = pv_rec(cache, s, chunk, layer);
    /* The session's copy is not kept: it stops sharing from this chunk on
     * and keeps those chunks as DROPPED records of its own. */
    if (old_rec && old_rec->tier == PV_REC_SHARED) {
        uint32_t n = s->n_shared;
        pv_share_cut(cache, s, chunk, 0);
        for (uint32_t c = chunk; c < n; c++)
            for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
                pv_rec_enter(cache, s, c, l, PV_TIER_DROPPED, PV_NONE32);
        pv_session_refresh(cache, s);
        return PV_OK;
    }
    if (old_rec && old_rec->copying)
        return pv_error(PV_ERR_BUSY,
                        "pv_cache_mark_dropped: chunk %u layer %u of \"%.64s\" is under copy", chunk,
                        layer, id);
    if (old_rec && old_rec->tier == PV_TIER_DROPPED)
        return PV_OK;
    if ((st = pv_index_ensure(cache, s, chunk)) != PV_OK)
        return st;
    pv_rec_exit(cache, s, chunk, layer);
    if (chunk >= s->n_chunks)
        s->n_chunks = chunk + 1;
    pv_rec_enter(cache, s, chunk, layer, PV_TIER_DROPPED, PV_NONE32);
    pv_session_refresh(cache, s);
    return PV_OK;
}

/* The record of (chunk, layer), or NULL for a chunk never stored. */
static pv_status find_record(const pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                             const char *fn, const pv_chunk_rec **rec)
{
    uint32_t h;
    pv_status st = find_session(cache, id, fn, &h);
    if (st != PV_OK)
        return st;
    if ((st = check_chunk_args(cache, fn, chunk, layer)) != PV_OK)
        return st;
    const pv_session *s = &cache->sessions[h];
    *rec = chunk < s->n_chunks ? pv_rec_resolved(cache, s, chunk, layer, NULL) : NULL;
    return PV_OK;
}

pv_status pv_cache_lookup(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                          pv_tier *tier, uint32_t *slot)
{
    const pv_chunk_rec *r;
    pv_status st = find_record(cache, id, chunk, layer, "pv_cache_lookup", &r);
    if (st != PV_OK)
        return st;
    if (!tier)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_lookup: tier is NULL");
    pv_tier where = PV_TIER_NONE;
    uint32_t at = PV_NONE32;
    if (r) {
        where = (pv_tier)r->tier;
        at = r->slot;
        if (r->shadowed) {
            /* Both copies are valid; the device one is read directly. */
            where = PV_TIER_DEVICE;
            at = pv_rec_shadow(cache, r);
            cache->stats.shadow_hits++;
        }
    }
    if (where == PV_TIER_NONE)
        cache->stats.misses++;
    else
        cache->stats.hits[where]++;
    *tier = where;
    if (slot)
        *slot = at;
    return PV_OK;
}

pv_status pv_cache_peek(const pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                        pv_tier *tier, uint32_t *slot, uint32_t *shadow_slot)
{
    const pv_chunk_rec *r;
    pv_status st = find_record(cache, id, chunk, layer, "pv_cache_peek", &r);
    if (st != PV_OK)
        return st;
    if (!tier)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_peek: tier is NULL");
    *tier = r ? (pv_tier)r->tier : PV_TIER_NONE;
    if (slot)
        *slot = r && r->tier < PV_SLOT_TIERS ? r->slot : UINT32_MAX;
    if (shadow_slot)
        *shadow_slot = r && r->shadowed ? pv_rec_shadow(cache, r) : UINT32_MAX;
    return PV_OK;
}

pv_status pv_cache_retention_value(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                                   double *value)
{
    uint32_t h;
    pv_status st = find_session(cache, id, "pv_cache_retention_value", &h);
    if (st != PV_OK)
        return st;
    if ((st = check_chunk_args(cache, "pv_cache_retention_value", chunk, layer)) != PV_OK)
        return st;
    if (!value)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_retention_value: value is NULL");
    pv_session *s = &cache->sessions[h];
    const pv_chunk_rec *r = chunk < s->n_chunks ? pv_rec_resolved(cache, s, chunk, layer, &s) : NULL;
    if (!r || r->tier == PV_TIER_NONE)
        return pv_error(PV_ERR_NOT_FOUND,
                        "pv_cache_retention_value: chunk %u layer %u of \"%.64s\" was never stored",
                        chunk, layer, id);
    /* A shared chunk: its holder's idle time and cost, the cost counted for
     * every session sharing it (docs/design/shared-prefixes.md). */
    double idle = pv_cache_now(cache) - s->last_active;
    double cost = pv_chunk_cost(cache, s, chunk, layer) * (s->holder && s->refs > 1 ? s->refs : 1);
    *value = idle > 0 ? cost / idle : INFINITY;
    return PV_OK;
}

/* ---- plans ---------------------------------------------------------------------- */

pv_status pv_cache_plan_init(pv_cache_plan *plan)
{
    if (!plan)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_plan_init: plan is NULL");
    plan->moves = NULL;
    plan->n_moves = 0;
    plan->capacity = 0;
    return PV_OK;
}

pv_status pv_cache_plan_clear(pv_cache_plan *plan)
{
    if (!plan)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_plan_clear: plan is NULL");
    plan->n_moves = 0;
    return PV_OK;
}

void pv_cache_plan_free(pv_cache_plan *plan)
{
    if (!plan)
        return;
    free(plan->moves);
    pv_cache_plan_init(plan);
}

/* ---- statistics -------------------------------------------------------------------- */

pv_status pv_cache_stats_get(const pv_cache *cache, pv_cache_stats *stats)
{
    if (!cache || !stats)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_stats_get: cache and stats must not be NULL");
    *stats = cache->stats;
    stats->sessions = cache->n_sessions;
    stats->shared_chunks = cache->n_holders;
    return PV_OK;
}
