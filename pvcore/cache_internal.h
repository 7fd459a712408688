/* Private structures of the tiered KV cache, shared by pvcore/cache*.c. */
#ifndef PV_CORE_CACHE_INTERNAL_H
#define PV_CORE_CACHE_INTERNAL_H

#include <pensieve/cache.h>

#include <stdint.h>

#define PV_NONE32 UINT32_MAX

/* One (chunk, layer) of a session: 8 bytes, so 19.2M records (10,000
 * sessions x 64 chunks x 30 layers) take 154 MB. */
typedef struct pv_chunk_rec {
    uint32_t slot;    /* slot in DEVICE or HOST; PV_REC_SHARED: the holder's handle */
    uint8_t tier;     /* pv_tier; PV_TIER_NONE when never stored; PV_REC_SHARED */
    uint8_t copying;  /* under a two-phase copy: not evictable, not freeable */
    uint8_t shadowed; /* HOST only: its DEVICE slot is still held as a clean
                       * copy after an ahead-of-time swap-out (the slot number
                       * is in the HOST pool's shadow_of, keeping this 8 bytes) */
    uint8_t filling;  /* a holder's record stored afresh for a recomputation
                       * that has not run yet: no KV to read */
} pv_chunk_rec;

/* The tier of a session's record for a chunk it shares: the bytes are the
 * record of the same (chunk, layer) in the holder session named by slot. */
#define PV_REC_SHARED 4

/* SHADOW: a DEVICE slot kept as a clean copy of a HOST chunk (lazy reclaim). */
enum pv_slot_state { PV_SLOT_FREE = 0, PV_SLOT_OWNED, PV_SLOT_RESERVED, PV_SLOT_SHADOW };

/* Eviction sets, each with its leads, frontiers and tree: the records of
 * DEVICE and HOST (indexed by tier) and the shadows, reclaimed first. */
#define PV_SET_SHADOW 2
#define PV_EVICT_SETS 3

/* Reverse map of a pool slot, for pv_cache_check and copy completion. */
typedef struct pv_slot_owner {
    uint32_t session;
    uint32_t chunk;
    uint16_t layer;
    uint8_t state;    /* pv_slot_state; RESERVED: destination of a copy */
} pv_slot_owner;

typedef struct pv_pool {
    uint32_t n_slots;
    uint32_t n_backed;      /* slots [0, n_backed) have memory behind them (all
                             * of them unless pv_cache_host_growth was called):
                             * only those are ever on the free list */
    uint32_t n_free;
    uint32_t *free_stack;   /* free slots; the top is handed out next */
    pv_slot_owner *owner;   /* [n_slots] */
    uint32_t *shadow_of;    /* HOST only, [n_slots]: the DEVICE shadow slot of
                             * the chunk in this slot, or PV_NONE32 */
} pv_pool;

/* A session's index: the records of PV_PAGE_CHUNKS chunks (all layers) make
 * a page, PV_BLOCK_PAGES pages a block, and a directory of blocks grows to
 * the highest block used; pages and blocks exist only where a chunk was
 * stored. Memory follows the chunks held, not the highest index: chunk
 * PV_CACHE_MAX_CHUNKS-1 alone costs a 4096-entry directory, one block and
 * one page (~34 KiB at 32 layers), where a flat table cost 256 MiB. Small
 * pages keep pv_cache_check's walk over a short session short. */
#define PV_PAGE_SHIFT 2
#define PV_PAGE_CHUNKS (1u << PV_PAGE_SHIFT)
#define PV_BLOCK_PAGES 64u
#define PV_BLOCK_SHIFT 8 /* chunks per block: PV_PAGE_CHUNKS * PV_BLOCK_PAGES */

typedef struct pv_session {
    char *id;               /* NULL: handle not in use */
    uint32_t hash;
    pv_chunk_rec ***index;  /* [n_blocks][PV_BLOCK_PAGES] pages of
                             * [PV_PAGE_CHUNKS][n_layers] records, or NULL */
    uint32_t n_blocks;
    uint32_t n_chunks;      /* highest stored chunk index + 1 */
    int32_t *tokens;
    size_t n_tokens, cap_tokens;
    uint32_t committed_tokens;
    uint32_t turns;
    double last_active;
    uint32_t pins;
    uint64_t pin_seq;           /* order of admission, for suspension */
    uint32_t pin_prev, pin_next; /* list of pinned sessions, oldest first */
    uint32_t records[3];        /* records per DEVICE, HOST, DROPPED */
    uint32_t copy_src[PV_SLOT_TIERS]; /* records under copy, by source tier */
    uint32_t held_slots[PV_SLOT_TIERS]; /* owned + reserved + shadow slots */
    uint32_t shadows;           /* DEVICE shadow slots of its HOST chunks */
    uint32_t *lead;             /* [PV_EVICT_SETS][n_layers]: lowest evictable chunk */
    /* Frontier: the session's cheapest evictable chunk per eviction set. */
    uint32_t front_chunk[PV_EVICT_SETS];
    uint32_t front_layer[PV_EVICT_SETS];
    double front_cost[PV_EVICT_SETS];
    uint8_t candidate[PV_EVICT_SETS]; /* unpinned with a frontier: in the tree */
    uint32_t evictable[PV_EVICT_SETS]; /* its share of cache->evictable */
    /* Shared prefixes (pvcore/cache_share.c). A holder is a hidden session
     * (not in the id map) that owns the records of one shared chunk, index
     * n_chunks - 1, its tokens in `tokens`; the sessions sharing it hold
     * PV_REC_SHARED records naming it. */
    uint8_t holder;
    uint32_t refs;          /* holder: sessions linking its chunk */
    uint32_t parent;        /* holder: the holder of the chunk before, or PV_NONE32 */
    uint32_t filler;        /* holder: the session whose recomputation fills its
                             * records marked filling, or PV_NONE32 */
    uint32_t n_shared;      /* session: chunks [0, n_shared) link holders */
    uint32_t n_published;   /* session: chunks [0, n_published) can be found by
                             * other sessions (the shared ones through their
                             * holders, the rest in the share map as its own) */
    uint64_t ns;            /* namespace hash: the id's bytes before its first ':' */
    uint64_t chain;         /* session: chain hash through chunk n_published - 1;
                             * holder: its chunk's */
} pv_session;

/* The share map: chain hash -> the holder of a shared chunk, or the session
 * that owns a published chunk nobody shares yet. */
typedef struct pv_share_entry {
    uint64_t key;
    uint32_t handle;        /* PV_NONE32: empty */
    uint32_t chunk;
} pv_share_entry;

/* Kinetic tournament over session handles: see pvcore/cache_evict.c. */
typedef struct pv_ktree {
    uint32_t cap;       /* leaves, a power of two */
    int32_t *winner;    /* [2 * cap]: session handle or -1 */
    double *expiry;     /* [2 * cap]: time the node's winner may change */
    double now;         /* time of the last query */
} pv_ktree;

struct pv_cache {
    pv_cache_config cfg;
    pv_clock_fn clock;
    void *clock_ctx;
    pv_pool pool[PV_SLOT_TIERS];
    pv_session *sessions;       /* [cap_sessions], indexed by handle */
    uint32_t cap_sessions;
    uint32_t n_sessions;
    uint32_t *free_handles;     /* handles of ended sessions, reused LIFO */
    uint32_t n_free_handles;
    uint32_t next_handle;       /* handles below this have been used */
    uint32_t *map;              /* open addressing id -> handle; PV_NONE32 empty */
    uint32_t map_cap;           /* power of two */
    pv_ktree tree[PV_EVICT_SETS];
    uint64_t evictable[PV_EVICT_SETS]; /* records (shadows) an eviction may take */
    uint32_t pending_out;       /* DEVICE -> HOST copies in flight */
    uint32_t pending_in;        /* HOST -> DEVICE copies in flight */
    uint32_t pin_head, pin_tail;
    uint64_t pin_counter;
    uint32_t reserve_slots;
    pv_cache_stats stats;
    pv_share_entry *share;      /* open addressing, power-of-two capacity */
    uint32_t share_cap, share_count;
    uint32_t n_holders;         /* live holders (not in n_sessions) */
    uint64_t holder_serial;     /* makes holder ids unique */
    uint64_t filling;           /* holder records with the filling mark */
    pv_cache_grow_fn grow_host; /* NULL: HOST is all backed from init */
    void *grow_ctx;
};

/* The record of (chunk, layer); NULL where no chunk of its page was ever
 * stored (such a record is PV_TIER_NONE). */
static inline pv_chunk_rec *pv_rec(const pv_cache *cache, const pv_session *s,
                                   uint32_t chunk, uint32_t layer)
{
    uint32_t b = chunk >> PV_BLOCK_SHIFT;
    if (b >= s->n_blocks || !s->index[b])
        return NULL;
    pv_chunk_rec *page = s->index[b][(chunk >> PV_PAGE_SHIFT) % PV_BLOCK_PAGES];
    if (!page)
        return NULL;
    return &page[(size_t)(chunk % PV_PAGE_CHUNKS) * cache->cfg.n_layers + layer];
}

/* The first chunk index >= chunk below end whose page exists, or end. */
static inline uint32_t pv_chunk_next_below(const pv_session *s, uint32_t chunk, uint32_t end)
{
    while (chunk < end) {
        uint32_t b = chunk >> PV_BLOCK_SHIFT;
        if (b >= s->n_blocks)
            break;
        if (!s->index[b])
            chunk = (b + 1) << PV_BLOCK_SHIFT;
        else if (!s->index[b][(chunk >> PV_PAGE_SHIFT) % PV_BLOCK_PAGES])
            chunk = (chunk | (PV_PAGE_CHUNKS - 1)) + 1;
        else
            return chunk;
    }
    return end;
}

/* The first chunk index >= chunk below s->n_chunks whose page exists, or
 * s->n_chunks: loops over a session's chunks skip the holes with
 *   for (c = pv_chunk_next(s, 0); c < s->n_chunks; c = pv_chunk_next(s, c + 1)) */
static inline uint32_t pv_chunk_next(const pv_session *s, uint32_t chunk)
{
    return pv_chunk_next_below(s, chunk, s->n_chunks);
}

/* The DEVICE shadow slot of a record, or PV_NONE32. */
static inline uint32_t pv_rec_shadow(const pv_cache *cache, const pv_chunk_rec *r)
{
    return r->shadowed ? cache->pool[PV_TIER_HOST].shadow_of[r->slot] : PV_NONE32;
}

static inline uint32_t handle_of(const pv_cache *cache, const pv_session *s)
{
    return (uint32_t)(s - cache->sessions);
}

/* The handle of a live session, or PV_NONE32. */
uint32_t pv_session_find(const pv_cache *cache, const char *id);
double pv_cache_now(pv_cache *cache);
double pv_chunk_cost(const pv_cache *cache, const pv_session *s, uint32_t chunk, uint32_t layer);

/* Frontier and tree maintenance (pvcore/cache_evict.c). */
pv_status pv_ktree_resize(pv_cache *cache, uint32_t cap);
void pv_ktree_free(pv_ktree *tree);
/* A record of s entered eviction set t, or left it. */
void pv_lead_add(pv_cache *cache, pv_session *s, int t, uint32_t chunk, uint32_t layer);
void pv_lead_remove(pv_cache *cache, pv_session *s, int t, uint32_t chunk, uint32_t layer);
/* Recomputes s's frontiers and tree leaves after any change to it. */
void pv_session_refresh(pv_cache *cache, pv_session *s);
/* Recomputes the frontier of set t without touching the tree (for checks). */
void pv_frontier_compute(const pv_cache *cache, const pv_session *s, int t,
                         uint32_t *chunk, uint32_t *layer, double *cost);

/* Slot pools and records (pvcore/cache.c). Taking and giving a slot keep the
 * session's and the cache's byte counters; entering and leaving a tier keep
 * the record counters and the eviction leads (not the tree: callers run
 * pv_session_refresh when done with a session). */
/* 1 when tier t has `need` free slots, growing HOST's backed part for
 * them where pv_cache_host_growth allows; 0 otherwise. */
int pv_pool_room(pv_cache *cache, pv_tier t, uint64_t need);
uint32_t pv_slot_take(pv_cache *cache, pv_session *s, pv_tier tier, uint32_t chunk, uint32_t layer,
                      uint8_t state);
void pv_slot_give(pv_cache *cache, pv_session *s, pv_tier tier, uint32_t slot);
/* Places a record in tier at slot (a slot already taken as OWNED). */
void pv_rec_enter(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer, pv_tier tier,
                  uint32_t slot);
/* Removes a record from its tier and frees its slot and shadow (not under copy). */
void pv_rec_exit(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer);
/* Allocates the page holding chunk (and its block and directory room). */
pv_status pv_index_ensure(pv_cache *cache, pv_session *s, uint32_t chunk);
/* Frees the record's shadow slot; the record stays in HOST. */
void pv_shadow_release(pv_cache *cache, pv_session *s, uint32_t chunk, uint32_t layer);
/* Reclaims the reclaimable shadow of lowest retention value, noting it in
 * plan (may be NULL); 0 if none is reclaimable. */
int pv_shadow_reclaim(pv_cache *cache, double now, pv_cache_plan *plan);

/* Shared prefixes (pvcore/cache_share.c). */
/* The holder a session's shared chunk links. */
static inline pv_session *pv_holder_of(const pv_cache *cache, const pv_session *s, uint32_t chunk)
{
    return &cache->sessions[pv_rec(cache, s, chunk, 0)->slot];
}
/* A session's record or, for a shared chunk, its holder's (NULL if none). */
static inline pv_chunk_rec *pv_rec_resolved(const pv_cache *cache, const pv_session *s, uint32_t chunk,
                                            uint32_t layer, pv_session **owner)
{
    pv_chunk_rec *r = pv_rec(cache, s, chunk, layer);
    pv_session *o = (pv_session *)s;
    if (r && r->tier == PV_REC_SHARED) {
        o = &cache->sessions[r->slot];
        r = pv_rec(cache, o, chunk, layer);
    }
    if (owner)
        *owner = o;
    return r;
}
/* A session's pins or idle time changed (pin_delta: pins added): its
 * holders follow (a holder is pinned by every pin of its sessions and
 * active when the latest of them was). */
void pv_share_sync(pv_cache *cache, pv_session *s, int32_t pin_delta);
/* Ends s's sharing from full chunk `keep` on, for a truncation or the end
 * of the session: its published chunks from there leave the share map and
 * its links from there go (the chunk at `keep`, if it stays partly, keeps
 * its tokens as a DROPPED record of its own when it was shared). */
void pv_share_cut(pv_cache *cache, pv_session *s, uint32_t keep, int keep_partial);
/* After a save: s's committed full chunks become findable. */
void pv_share_publish(pv_cache *cache, pv_session *s);
/* A holder whose last session went while a copy of it was in flight is
 * freed when its copies are over. */
void pv_share_collect(pv_cache *cache, uint32_t handle);
/* s is no longer running: recomputations it left unrun mark nothing
 * filling (such records are dropped again). */
void pv_share_unfill(pv_cache *cache, pv_session *s);
pv_status pv_share_check(const pv_cache *cache);
void pv_share_free(pv_cache *cache);
/* Allocates a session at a new handle: in the id map or a holder. */
pv_status pv_session_create(pv_cache *cache, const char *id, size_t len, int holder, uint32_t *handle);
void pv_session_destroy(pv_cache *cache, uint32_t handle);
uint64_t pv_ns_hash(const char *id);

/* Test-only (pvcore/cache_testhook.c, linked into tests, not the library):
 * breaks the named invariant (a name pv_cache_check() uses) on purpose. */
pv_status pv_cache_test_corrupt(pv_cache *cache, const char *invariant);

#endif
