/* Shared prefixes: one copy of a full chunk that sessions of one namespace
 * hold in common (issue 28; docs/design/shared-prefixes.md).
 *
 * A shared chunk lives in a holder: a hidden session (not in the id map)
 * that owns the chunk's records at its own index, so tiers, eviction,
 * copies and recovery handle it as any session's chunk, once for all the
 * sessions that link it. A session links chunks [0, n_shared); sharing
 * starts at position 0 and stops at the first difference, so the links
 * are a prefix and a holder's parent is the holder of the chunk before.
 *
 * A session's committed full chunks are published in the share map under
 * their chain hash (the previous chunk's hash and this chunk's tokens, from
 * the namespace's hash). A second session that matches one turns it into a
 * holder then (the first session's records move to the holder, no copy),
 * so a session nobody matches costs one map entry per chunk and nothing
 * else. Matches are confirmed token by token and by the parent holder, so
 * a hash collision shares nothing. */
#include "pvcore/cache_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t chain_next(uint64_t parent, const int32_t *tokens, uint32_t n)
{
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)tokens[i]) * 1099511628211ull;
    return mix64(h);
}

/* The namespaces of two ids agree: the bytes before the first ':', empty
 * for an id without one. */
static int same_namespace(const char *a, const char *b)
{
    const char *ca = strchr(a, ':'), *cb = strchr(b, ':');
    size_t na = ca ? (size_t)(ca - a) : 0, nb = cb ? (size_t)(cb - b) : 0;
    return na == nb && memcmp(a, b, na) == 0;
}

/* The chain hash through chunk n - 1 of session s (its namespace's for 0). */
static uint64_t chain_through(const pv_cache *cache, const pv_session *s, uint32_t n)
{
    if (n == 0)
        return s->ns;
    uint32_t c = n < s->n_shared ? n : s->n_shared;
    uint64_t h = c ? pv_holder_of(cache, s, c - 1)->chain : s->ns;
    for (; c < n; c++)
        h = chain_next(h, s->tokens + (size_t)c * cache->cfg.chunk_tokens, cache->cfg.chunk_tokens);
    return h;
}

/* ---- the share map: open addressing, linear probing, backward-shift delete ---- */

static uint32_t map_slot(const pv_cache *cache, uint64_t key)
{
    uint32_t mask = cache->share_cap - 1;
    uint32_t i = (uint32_t)key & mask;
    while (cache->share[i].handle != PV_NONE32 && cache->share[i].key != key)
        i = (i + 1) & mask;
    return i;
}

static const pv_share_entry *map_get(const pv_cache *cache, uint64_t key)
{
    if (!cache->share_cap)
        return NULL;
    const pv_share_entry *e = &cache->share[map_slot(cache, key)];
    return e->handle == PV_NONE32 ? NULL : e;
}

static int map_insert(pv_cache *cache, uint64_t key, uint32_t handle, uint32_t chunk)
{
    if ((cache->share_count + 1) * 2 > cache->share_cap) {
        uint32_t cap = cache->share_cap ? cache->share_cap * 2 : 64;
        pv_share_entry *grown = malloc((size_t)cap * sizeof *grown);
        if (!grown || cap < cache->share_cap) {
            free(grown);
            return 0;
        }
        for (uint32_t i = 0; i < cap; i++)
            grown[i].handle = PV_NONE32;
        pv_share_entry *old = cache->share;
        uint32_t old_cap = cache->share_cap;
        cache->share = grown;
        cache->share_cap = cap;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i].handle != PV_NONE32)
                cache->share[map_slot(cache, old[i].key)] = old[i];
        free(old);
    }
    cache->share[map_slot(cache, key)] = (pv_share_entry){key, handle, chunk};
    cache->share_count++;
    return 1;
}

/* Removes key's entry if it names (handle, chunk). */
static void map_erase(pv_cache *cache, uint64_t key, uint32_t handle, uint32_t chunk)
{
    if (!cache->share_cap)
        return;
    uint32_t mask = cache->share_cap - 1, i = map_slot(cache, key);
    pv_share_entry *e = cache->share;
    if (e[i].handle != handle || e[i].chunk != chunk)
        return;
    for (uint32_t j = (i + 1) & mask; e[j].handle != PV_NONE32; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)e[j].key & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            e[i] = e[j];
            i = j;
        }
    }
    e[i].handle = PV_NONE32;
    cache->share_count--;
}

void pv_share_free(pv_cache *cache)
{
    free(cache->share);
    cache->share = NULL;
    cache->share_cap = cache->share_count = 0;
}

/* ---- holders ------------------------------------------------------------------ */

static uint32_t holder_chunk(const pv_session *h)
{
    return h->n_chunks - 1;
}

/* held_slots of a holder count once; each link past the first saves them. */
static void count_saved(pv_cache *cache, const pv_session *h, int sign)
{
    for (int t = 0; t < PV_SLOT_TIERS; t++) {
        uint64_t bytes = (uint64_t)h->held_slots[t] * cache->cfg.slot_bytes;
        if (sign > 0)
            cache->stats.shared_saved_bytes[t] += bytes;
        else
            cache->stats.shared_saved_bytes[t] -= bytes;
    }
}

/* Frees a holder no session links (after its copies, if any, are over). */
static void holder_release(pv_cache *cache, pv_session *h)
{
    if (h->refs || h->copy_src[PV_TIER_DEVICE] || h->copy_src[PV_TIER_HOST])
        return;
    uint32_t c = holder_chunk(h);
    map_erase(cache, h->chain, handle_of(cache, h), c);
    for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
        pv_rec_exit(cache, h, c, l);
    pv_session_refresh(cache, h);
    pv_session_destroy(cache, handle_of(cache, h));
}

void pv_share_collect(pv_cache *cache, uint32_t handle)
{
    if (handle < cache->next_handle && cache->sessions[handle].id && cache->sessions[handle].holder)
        holder_release(cache, &cache->sessions[handle]);
}

/* Moves session a's record of (c, l), not under copy, to d; a keeps a
 * link to d (link) or nothing. */
static void rec_transfer(pv_cache *cache, pv_session *a, pv_session *d, uint32_t c, uint32_t l, int link)
{
    pv_chunk_rec *ra = pv_rec(cache, a, c, l), *rd = pv_rec(cache, d, c, l);
    uint32_t dh = handle_of(cache, d);
    *rd = *ra;
    if (ra->tier < PV_SLOT_TIERS) {
        pv_lead_remove(cache, a, ra->tier, c, l);
        cache->pool[ra->tier].owner[ra->slot].session = dh;
        a->held_slots[ra->tier]--;
        d->held_slots[ra->tier]++;
        pv_lead_add(cache, d, ra->tier, c, l);
    }
    if (ra->shadowed) {
        pv_lead_remove(cache, a, PV_SET_SHADOW, c, l);
        cache->pool[PV_TIER_DEVICE].owner[pv_rec_shadow(cache, ra)].session = dh;
        a->held_slots[PV_TIER_DEVICE]--;
        d->held_slots[PV_TIER_DEVICE]++;
        a->shadows--;
        d->shadows++;
        pv_lead_add(cache, d, PV_SET_SHADOW, c, l);
    }
    a->records[ra->tier]--;
    d->records[ra->tier]++;
    *ra = link ? (pv_chunk_rec){dh, PV_REC_SHARED, 0, 0, 0} : (pv_chunk_rec){PV_NONE32, PV_TIER_NONE, 0, 0, 0};
}

/* Session a's published chunk c (its chunks before it shared, its own
 * chunk stored in every layer and not under copy) becomes a holder's. */
static pv_session *promote(pv_cache *cache, uint32_t ah, uint32_t c, uint32_t parent)
{
    const uint32_t n_layers = cache->cfg.n_layers, ct = cache->cfg.chunk_tokens;
    pv_session *a = &cache->sessions[ah];
    for (uint32_t l = 0; l < n_layers; l++) {
        const pv_chunk_rec *r = pv_rec(cache, a, c, l);
        if (!r || r->tier >= PV_TIER_NONE || r->copying)
            return NULL;
    }
    /* ns:<1>shared#serial: its namespace by the id rule, unique. */
    const char *colon = strchr(a->id, ':');
    size_t ns_len = colon ? (size_t)(colon - a->id) : 0;
    char name[PV_SESSION_ID_MAX + 40];
    int len = snprintf(name, sizeof name, "%.*s:\001shared#%llu", (int)ns_len, a->id,
                       (unsigned long long)++cache->holder_serial);
    int32_t *tokens = malloc((size_t)ct * sizeof *tokens);
    uint32_t hh;
    if (!tokens || len < 0 || (size_t)len >= sizeof name ||
        pv_session_create(cache, name, (size_t)len, 1, &hh) != PV_OK) {
        free(tokens);
        return NULL;
    }
    a = &cache->sessions[ah]; /* the session table may have moved */
    pv_session *h = &cache->sessions[hh];
    if (pv_index_ensure(cache, h, c) != PV_OK) {
        free(tokens);
        pv_session_destroy(cache, hh);
        return NULL;
    }
    memcpy(tokens, a->tokens + (size_t)c * ct, (size_t)ct * sizeof *tokens);
    h->tokens = tokens;
    h->n_tokens = h->cap_tokens = ct;
    h->n_chunks = c + 1;
    h->parent = parent;
    h->chain = chain_through(cache, a, c + 1);
    for (uint32_t l = 0; l < n_layers; l++)
        rec_transfer(cache, a, h, c, l, 1);
    a->n_shared = c + 1;
    h->refs = 1;
    h->pins = a->pins;
    h->last_active = a->last_active;
    cache->stats.shared_links++;
    cache->share[map_slot(cache, h->chain)].handle = hh;
    pv_session_refresh(cache, a);
    pv_session_refresh(cache, h);
    return h;
}

/* Session s links holder h as its chunk c (= s->n_shared, never stored). */
static int link_chunk(pv_cache *cache, pv_session *s, pv_session *h, uint32_t c)
{
    if (pv_index_ensure(cache, s, c) != PV_OK)
        return 0;
    uint32_t hh = handle_of(cache, h);
    for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
        *pv_rec(cache, s, c, l) = (pv_chunk_rec){hh, PV_REC_SHARED, 0, 0, 0};
    s->n_shared = c + 1;
    if (s->n_chunks < c + 1)
        s->n_chunks = c + 1;
    if (h->refs >= 1)
        count_saved(cache, h, 1);
    h->refs++;
    h->pins += s->pins;
    if (s->last_active > h->last_active)
        h->last_active = s->last_active;
    cache->stats.shared_links++;
    pv_session_refresh(cache, h);
    return 1;
}

/* Session s lets go of its last shared chunk. */
static void unlink_last(pv_cache *cache, pv_session *s)
{
    uint32_t c = s->n_shared - 1;
    pv_session *h = pv_holder_of(cache, s, c);
    for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
        *pv_rec(cache, s, c, l) = (pv_chunk_rec){PV_NONE32, PV_TIER_NONE, 0, 0, 0};
    s->n_shared = c;
    if (h->refs >= 2)
        count_saved(cache, h, -1);
    h->refs--;
    h->pins -= s->pins;
    cache->stats.shared_links--;
    if (h->filler == handle_of(cache, s))
        h->filler = PV_NONE32;
    if (h->refs == 0)
        holder_release(cache, h);
    else
        pv_session_refresh(cache, h);
}

/* s's last shared chunk, which only s links (its other sessions are gone)
 * and which is not under copy nor being filled, becomes s's own again: the
 * records move back, no copy; 0 if it cannot. */
static int demote(pv_cache *cache, pv_session *s)
{
    uint32_t c = s->n_shared - 1;
    pv_session *h = pv_holder_of(cache, s, c);
    if (h->refs != 1 || h->copy_src[PV_TIER_DEVICE] || h->copy_src[PV_TIER_HOST] || h->filler != PV_NONE32)
        return 0;
    uint32_t hh = handle_of(cache, h);
    for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
        rec_transfer(cache, h, s, c, l, 0);
    s->n_shared = c;
    h->refs = 0;
    h->pins = 0;
    cache->stats.shared_links--;
    map_erase(cache, h->chain, hh, c);
    pv_session_refresh(cache, h);
    pv_session_refresh(cache, s);
    pv_session_destroy(cache, hh);
    return 1;
}

/* ---- what the rest of the cache calls ----------------------------------------- */

void pv_share_sync(pv_cache *cache, pv_session *s, int32_t pin_delta)
{
    for (uint32_t c = 0; c < s->n_shared; c++) {
        pv_session *h = pv_holder_of(cache, s, c);
        h->pins = (uint32_t)((int64_t)h->pins + pin_delta);
        if (s->last_active > h->last_active)
            h->last_active = s->last_active;
        pv_session_refresh(cache, h);
    }
}

void pv_share_cut(pv_cache *cache, pv_session *s, uint32_t keep, int keep_partial)
{
    const uint32_t ct = cache->cfg.chunk_tokens, sh = handle_of(cache, s);
    if (s->n_published > keep && s->n_published > s->n_shared) {
        uint64_t h = chain_through(cache, s, s->n_shared);
        for (uint32_t c = s->n_shared; c < s->n_published; c++) {
            h = chain_next(h, s->tokens + (size_t)c * ct, ct);
            if (c >= keep)
                map_erase(cache, h, sh, c);
        }
    }
    int own_partial = keep_partial && keep < s->n_shared;
    while (s->n_shared > keep + (own_partial ? 1 : 0))
        unlink_last(cache, s);
    if (own_partial && !demote(cache, s)) {
        /* Others still read it: the session's rows past the cut change, so
         * it recomputes its own copy. */
        unlink_last(cache, s);
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
            pv_rec_enter(cache, s, keep, l, PV_TIER_DROPPED, PV_NONE32);
    }
    if (s->n_published > keep)
        s->n_published = keep;
    s->chain = chain_through(cache, s, s->n_published);
}

void pv_share_publish(pv_cache *cache, pv_session *s)
{
    if (!cache->cfg.share_prefixes)
        return;
    const uint32_t ct = cache->cfg.chunk_tokens;
    uint32_t c = s->n_published;
    uint64_t h = s->chain;
    while ((uint64_t)(c + 1) * ct <= s->committed_tokens) {
        int stored = 1;
        for (uint32_t l = 0; l < cache->cfg.n_layers && stored; l++) {
            const pv_chunk_rec *r = pv_rec(cache, s, c, l);
            stored = r && r->tier < PV_TIER_NONE;
        }
        uint64_t key = chain_next(h, s->tokens + (size_t)c * ct, ct);
        /* A chunk another session published first stays this session's
         * own: one entry per prefix. */
        if (!stored || map_get(cache, key) || !map_insert(cache, key, handle_of(cache, s), c))
            break;
        h = key;
        c++;
    }
    s->n_published = c;
    s->chain = h;
}

void pv_share_unfill(pv_cache *cache, pv_session *s)
{
    uint32_t sh = handle_of(cache, s);
    for (uint32_t c = 0; c < s->n_shared && cache->filling; c++) {
        pv_session *h = pv_holder_of(cache, s, c);
        if (h->filler != sh)
            continue;
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++)
            if (pv_rec(cache, h, c, l)->filling) {
                pv_rec_exit(cache, h, c, l);
                pv_rec_enter(cache, h, c, l, PV_TIER_DROPPED, PV_NONE32);
            }
        h->filler = PV_NONE32;
        pv_session_refresh(cache, h);
    }
}

/* ---- the public calls ------------------------------------------------------------ */

static int32_t token_at(const int32_t *head, size_t n_head, const int32_t *tail, size_t i)
{
    return i < n_head ? head[i] : tail[i - n_head];
}

/* The findable chunk c whose parent is holder `parent` and whose tokens
 * are seq[c * ct, (c + 1) * ct), as a holder (promoted if it was a
 * session's own), or NULL. */
static pv_session *find_shared(pv_cache *cache, const pv_session *s, uint32_t c, uint32_t parent,
                               const int32_t *seq)
{
    const uint32_t ct = cache->cfg.chunk_tokens;
    uint64_t key = chain_next(parent == PV_NONE32 ? s->ns : cache->sessions[parent].chain, seq, ct);
    const pv_share_entry *e = map_get(cache, key);
    if (!e || e->chunk != c)
        return NULL;
    pv_session *o = &cache->sessions[e->handle];
    if (o == s || !same_namespace(o->id, s->id))
        return NULL;
    if (o->holder) {
        if (holder_chunk(o) != c || o->parent != parent ||
            memcmp(o->tokens, seq, (size_t)ct * sizeof *seq) != 0)
            return NULL;
        return o;
    }
    /* A session's own chunk: its chunks before must link the same parent. */
    if (o->n_shared != c || o->n_published <= c || o->n_tokens < (size_t)(c + 1) * ct ||
        (c > 0 && handle_of(cache, pv_holder_of(cache, o, c - 1)) != parent) ||
        memcmp(o->tokens + (size_t)c * ct, seq, (size_t)ct * sizeof *seq) != 0)
        return NULL;
    return promote(cache, e->handle, c, parent);
}

pv_status pv_cache_share_prefix(pv_cache *cache, const char *id, const int32_t *head, size_t n_head,
                                 const int32_t *tail, size_t n_tail, uint32_t *shared_tokens)
{
    if (!cache || !id || (n_head && !head) || (n_tail && !tail))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_cache_share_prefix: cache, id and non-empty token arrays must not be NULL");
    uint32_t h = pv_session_find(cache, id);
    if (h == PV_NONE32)
        return pv_error(PV_ERR_NOT_FOUND, "pv_cache_share_prefix: unknown session \"%.64s\"", id);
    const uint32_t ct = cache->cfg.chunk_tokens, n_layers = cache->cfg.n_layers;
    pv_session *s = &cache->sessions[h];
    size_t total = n_head + n_tail;
    int32_t *seq = malloc((size_t)ct * sizeof *seq);
    if (!seq)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_cache_share_prefix: no host memory for %u tokens", ct);
    uint32_t linked = 0;
    while (cache->cfg.share_prefixes && s->n_shared < PV_CACHE_MAX_CHUNKS &&
           (uint64_t)(s->n_shared + 1) * ct < total) {
        uint32_t c = s->n_shared;
        /* A chunk the session stored is its own (it was computed here). */
        int never = 1;
        for (uint32_t l = 0; l < n_layers && never; l++) {
            const pv_chunk_rec *r = c < s->n_chunks ? pv_rec(cache, s, c, l) : NULL;
            never = !r || r->tier == PV_TIER_NONE;
        }
        if (!never)
            break;
        size_t base = (size_t)c * ct;
        for (uint32_t i = 0; i < ct; i++)
            seq[i] = token_at(head, n_head, tail, base + i);
        /* The history it has must agree. */
        size_t known = s->n_tokens > base ? s->n_tokens - base : 0;
        if (known > ct)
            known = ct;
        if (known && memcmp(s->tokens + base, seq, known * sizeof *seq) != 0)
            break;
        uint32_t parent = c ? handle_of(cache, pv_holder_of(cache, s, c - 1)) : PV_NONE32;
        pv_session *o = find_shared(cache, s, c, parent, seq);
        s = &cache->sessions[h]; /* a promotion may move the session table */
        if (!o || !link_chunk(cache, s, o, c))
            break;
        if (known < ct && pv_cache_append_tokens(cache, id, seq + known, ct - known) != PV_OK) {
            unlink_last(cache, s);
            break;
        }
        linked++;
    }
    free(seq);
    if (linked) {
        s->n_published = s->n_shared;
        s->chain = chain_through(cache, s, s->n_shared);
        pv_session_refresh(cache, s);
    }
    if (shared_tokens)
        *shared_tokens = s->n_shared * ct;
    return PV_OK;
}

pv_status pv_cache_share_filled(pv_cache *cache, const char *id, uint32_t n_tokens)
{
    if (!cache || !id)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cache_share_filled: cache and id must not be NULL");
    uint32_t h = pv_session_find(cache, id);
    if (h == PV_NONE32)
        return pv_error(PV_ERR_NOT_FOUND, "pv_cache_share_filled: unknown session \"%.64s\"", id);
    pv_session *s = &cache->sessions[h];
    uint32_t full = n_tokens / cache->cfg.chunk_tokens;
    for (uint32_t c = 0; c < s->n_shared && c < full && cache->filling; c++) {
        pv_session *o = pv_holder_of(cache, s, c);
        if (o->filler != h)
            continue;
        for (uint32_t l = 0; l < cache->cfg.n_layers; l++) {
            pv_chunk_rec *r = pv_rec(cache, o, c, l);
            if (r->filling) {
                r->filling = 0;
                cache->filling--;
            }
        }
        o->filler = PV_NONE32;
    }
    return PV_OK;
}

/* ---- invariants ------------------------------------------------------------------ */

#define FAIL(invariant, ...) \
    return pv_error(PV_ERR_STATE, "pv_cache_check: invariant \"" invariant "\" violated: " __VA_ARGS__)

static pv_status check_links(const pv_cache *cache, uint32_t sh, uint32_t *refs, uint32_t *pins)
{
    const uint32_t ct = cache->cfg.chunk_tokens, n_layers = cache->cfg.n_layers;
    const pv_session *s = &cache->sessions[sh];
    for (uint32_t c = pv_chunk_next(s, 0); c < s->n_chunks; c = pv_chunk_next(s, c + 1))
        for (uint32_t l = 0; l < n_layers; l++) {
            const pv_chunk_rec *r = pv_rec(cache, s, c, l);
            if ((r->tier == PV_REC_SHARED) != (c < s->n_shared))
                FAIL("shared chunks", "\"%s\" chunk %u layer %u is %s, but its shared chunks are [0, %u)", s->id, c,
                     l, r->tier == PV_REC_SHARED ? "shared" : pv_tier_name((pv_tier)r->tier), s->n_shared);
            if (r->tier == PV_REC_SHARED && r->slot != pv_rec(cache, s, c, 0)->slot)
                FAIL("shared chunks", "\"%s\" chunk %u: layer %u links holder %u, layer 0 holder %u", s->id, c, l,
                     r->slot, pv_rec(cache, s, c, 0)->slot);
            if (r->filling)
                FAIL("shared chunks", "\"%s\" chunk %u layer %u of its own is marked filling", s->id, c, l);
        }
    if (s->n_shared > s->n_chunks || s->n_published < s->n_shared ||
        (uint64_t)s->n_published * ct > s->n_tokens)
        FAIL("shared chunks", "\"%s\": %u shared, %u published chunks of %u (history %zu tokens)", s->id,
             s->n_shared, s->n_published, s->n_chunks, s->n_tokens);
    uint32_t parent = PV_NONE32;
    for (uint32_t c = 0; c < s->n_shared; c++) {
        uint32_t hh = pv_rec(cache, s, c, 0)->slot;
        if (hh >= cache->next_handle || !cache->sessions[hh].id || !cache->sessions[hh].holder)
            FAIL("shared chunks", "\"%s\" chunk %u links handle %u, not a live holder", s->id, c, hh);
        const pv_session *h = &cache->sessions[hh];
        if (holder_chunk(h) != c || h->parent != parent || !same_namespace(h->id, s->id) ||
            memcmp(h->tokens, s->tokens + (size_t)c * ct, (size_t)ct * sizeof *h->tokens) != 0)
            FAIL("shared chunks", "\"%s\" chunk %u links holder \"%s\" of chunk %u (parent %u, expected %u) "
                 "whose namespace or tokens differ",
                 s->id, c, h->id, holder_chunk(h), h->parent, parent);
        if (h->last_active < s->last_active)
            FAIL("shared chunks", "holder \"%s\" was last active before \"%s\", which links it", h->id, s->id);
        refs[hh]++;
        pins[hh] += s->pins;
        parent = hh;
    }
    if (s->chain != chain_through(cache, s, s->n_published))
        FAIL("share map", "\"%s\": chain hash through %u published chunks is stale", s->id, s->n_published);
    uint64_t key = chain_through(cache, s, s->n_shared);
    for (uint32_t c = s->n_shared; c < s->n_published; c++) {
        key = chain_next(key, s->tokens + (size_t)c * ct, ct);
        const pv_share_entry *e = map_get(cache, key);
        if (!e || e->handle != sh || e->chunk != c)
            FAIL("share map", "\"%s\" published chunk %u is not in the share map under its chain hash", s->id, c);
        for (uint32_t l = 0; l < n_layers; l++)
            if (pv_rec(cache, s, c, l)->tier >= PV_TIER_NONE)
                FAIL("share map", "\"%s\" published chunk %u layer %u is not stored", s->id, c, l);
    }
    return PV_OK;
}

static pv_status check_holder(const pv_cache *cache, uint32_t hh, uint32_t refs, uint32_t pins,
                              uint64_t *saved, uint64_t *filling)
{
    const pv_session *h = &cache->sessions[hh];
    uint32_t c = holder_chunk(h), n_layers = cache->cfg.n_layers;
    if (h->refs != refs)
        FAIL("reference counts", "holder \"%s\" counts %u sessions, %u link it", h->id, h->refs, refs);
    if (h->pins != pins)
        FAIL("reference counts", "holder \"%s\" is pinned %u times, its sessions %u", h->id, h->pins, pins);
    if (!refs && !h->copy_src[PV_TIER_DEVICE] && !h->copy_src[PV_TIER_HOST])
        FAIL("reference counts", "holder \"%s\" is linked by no session and has no copy in flight", h->id);
    if (h->n_tokens != cache->cfg.chunk_tokens || h->n_shared || h->n_published ||
        h->records[0] + h->records[1] + h->records[2] != n_layers)
        FAIL("shared chunks", "holder \"%s\" of chunk %u holds %u records, %zu tokens", h->id, c,
             h->records[0] + h->records[1] + h->records[2], h->n_tokens);
    const pv_share_entry *e = map_get(cache, h->chain);
    if (!e || e->handle != hh || e->chunk != c)
        FAIL("share map", "holder \"%s\" is not in the share map under its chain hash", h->id);
    int marked = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        const pv_chunk_rec *r = pv_rec(cache, h, c, l);
        if (r->filling) {
            marked = 1;
            (*filling)++;
            if (r->tier != PV_TIER_DEVICE)
                FAIL("shared chunks", "holder \"%s\" layer %u is filling in %s", h->id, l,
                     pv_tier_name((pv_tier)r->tier));
        }
    }
    if (marked && (h->filler >= cache->next_handle || !cache->sessions[h->filler].id ||
                   !cache->sessions[h->filler].pins))
        FAIL("shared chunks", "holder \"%s\" is being filled by handle %u, not a running session", h->id,
             h->filler);
    if (refs > 1)
        for (int t = 0; t < PV_SLOT_TIERS; t++)
            saved[t] += (uint64_t)(refs - 1) * h->held_slots[t] * cache->cfg.slot_bytes;
    return PV_OK;
}

pv_status pv_share_check(const pv_cache *cache)
{
    uint32_t n = cache->next_handle ? cache->next_handle : 1;
    uint32_t *refs = calloc(n, sizeof *refs), *pins = calloc(n, sizeof *pins);
    pv_status st = PV_OK;
    if (!refs || !pins) {
        free(refs);
        free(pins);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_cache_check: no memory for %u reference counts", n);
    }
    uint64_t saved[PV_SLOT_TIERS] = {0, 0}, filling = 0, links = 0, entries = 0;
    uint32_t holders = 0;
    for (uint32_t h = 0; h < cache->next_handle && st == PV_OK; h++)
        if (cache->sessions[h].id && !cache->sessions[h].holder) {
            st = check_links(cache, h, refs, pins);
            links += cache->sessions[h].n_shared;
            entries += cache->sessions[h].n_published - cache->sessions[h].n_shared;
        }
    for (uint32_t h = 0; h < cache->next_handle && st == PV_OK; h++)
        if (cache->sessions[h].id && cache->sessions[h].holder) {
            holders++;
            entries++;
            st = check_holder(cache, h, refs[h], pins[h], saved, &filling);
        }
    free(refs);
    free(pins);
    if (st != PV_OK)
        return st;
    if (holders != cache->n_holders ||
        links != cache->stats.shared_links)
        FAIL("reference counts", "%u holders and %llu links, counters say %u, %llu", holders,
             (unsigned long long)links, cache->n_holders, (unsigned long long)cache->stats.shared_links);
    if (entries != cache->share_count)
        FAIL("share map", "%llu chunks findable, the map holds %u entries", (unsigned long long)entries,
             cache->share_count);
    if (filling != cache->filling)
        FAIL("shared chunks", "%llu records filling, counter says %llu", (unsigned long long)filling,
             (unsigned long long)cache->filling);
    for (int t = 0; t < PV_SLOT_TIERS; t++)
        if (saved[t] != cache->stats.shared_saved_bytes[t])
            FAIL("byte counters", "%s bytes saved by sharing: %llu, counter says %llu",
                 pv_tier_name((pv_tier)t), (unsigned long long)saved[t],
                 (unsigned long long)cache->stats.shared_saved_bytes[t]);
    return PV_OK;
}
