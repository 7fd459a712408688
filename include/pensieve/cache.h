/* The tiered KV cache core: which (session, chunk, layer) lives in which slot
 * of which tier, and which chunks move when memory runs short.
 *
 * A chunk is `chunk_tokens` consecutive tokens of one session at one layer;
 * its K and V fill one fixed-size slot (`slot_bytes`) of a tier's pool. Tiers:
 * DEVICE and HOST hold slots; DROPPED holds no bytes (the tokens stay in the
 * session's history and are recomputed). The core never touches K/V bytes:
 * it returns plans (lists of slot moves) that the engine carries out with
 * its backend's copy interface.
 *
 * Eviction follows the retention value V = cost / idle time (lowest first),
 * the same rule for DEVICE -> HOST and HOST -> DROPPED. Policies:
 *   pensieve  cost = alpha * l + beta + c, l = tokens before the chunk
 *   weighted  cost = layer weight x position weight x (alpha * l + beta + c),
 *             layer weight (n_layers - layer) / n_layers, position weight
 *             (chunk + 1) / session chunks
 *   lru       cost = 1: whole sessions by recency
 * Ties: lower cost, then lower chunk index, then higher layer (later layers
 * are swapped in last under the layer pipeline); between sessions by id.
 *
 * Every call but the *_free ones (NULL: no-op) and the name lookups returns
 * a pv_status: a NULL pointer argument that is not documented as optional
 * is PV_ERR_INVALID_ARG. pv_last_error() names the argument, the value and
 * the limit at fault. Nothing here exits or aborts.
 * Not thread-safe: one engine thread owns a cache. */
#ifndef PENSIEVE_CACHE_H
#define PENSIEVE_CACHE_H

#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pv_tier {
    PV_TIER_DEVICE = 0,
    PV_TIER_HOST = 1,
    PV_TIER_DROPPED = 2,
    PV_TIER_NONE = 3 /* never stored (a lookup miss) */
} pv_tier;

/* DEVICE and HOST: the tiers that own slots. */
#define PV_SLOT_TIERS 2

const char *pv_tier_name(pv_tier tier);

typedef enum pv_policy {
    PV_POLICY_PENSIEVE = 0,
    PV_POLICY_WEIGHTED = 1,
    PV_POLICY_LRU = 2
} pv_policy;

const char *pv_policy_name(pv_policy policy);
/* "pensieve", "weighted" or "lru"; PV_ERR_INVALID_ARG otherwise. */
pv_status pv_policy_parse(const char *name, pv_policy *policy);

typedef struct pv_cache_config {
    pv_policy policy;
    double alpha;           /* seconds per context token (cost slope) */
    double beta;            /* seconds, context-independent attention cost */
    double c;               /* seconds, non-attention cost of a chunk */
    uint32_t chunk_tokens;  /* tokens per chunk */
    uint32_t n_layers;      /* from the model */
    uint64_t slot_bytes;    /* bytes of one slot (K and V of one chunk, one layer) */
    uint64_t device_bytes;  /* DEVICE pool budget */
    uint64_t host_bytes;    /* HOST pool budget; 0: no host tier (evictions drop) */
    double high_water;      /* device use above which swap-out is planned ahead */
    double reserve;         /* fraction of device slots kept for admission */
    int share_prefixes;     /* 1: sessions can share full chunks of a common
                             * prefix (pv_cache_share_prefix); 0: none is
                             * published for sharing */
    uint64_t device_limit_bytes; /* the device's memory, from the caller (the
                             * engine asks its backend; pvcore knows no
                             * backend): device_bytes above it is an error
                             * at init. 0: unknown, not checked. host_bytes
                             * is checked against physical memory (sysconf). */
} pv_cache_config;

/* Defaults: pensieve, alpha 1e-6, beta 1e-4, c 1e-3, 32 tokens, 32 layers,
 * 64 KiB slots, 1 GiB device, 4 GiB host, high water 0.75, reserve 0.10,
 * device limit 0 (unknown). */
pv_status pv_cache_config_defaults(pv_cache_config *cfg);

/* Overrides cfg with the keys present in section [cache] of an INI file:
 * policy, alpha, beta, c, chunk_tokens, device_bytes, host_bytes (integers
 * with an optional K/M/G/T suffix, powers of 1024), high_water, reserve.
 * Values may be quoted; ';' and '#' start comments. Absent keys keep their
 * value. PV_ERR_FORMAT, naming the file, line, key and reason, for: an
 * unknown key or section, a key outside [cache], a key set twice, a
 * malformed or out-of-range value, a NUL byte, a CR not followed by LF.
 * PV_ERR_IO for a path that is not a readable regular file. cfg is left
 * unchanged on failure. Safe to call from several threads at once. */
pv_status pv_cache_config_load(pv_cache_config *cfg, const char *path);

/* Range checks of every field (what pv_cache_init checks), budgets against
 * device_limit_bytes and the physical memory included. */
pv_status pv_cache_config_validate(const pv_cache_config *cfg);

/* The clock: seconds on any monotonic scale. Tests inject their own. */
typedef double (*pv_clock_fn)(void *ctx);

typedef struct pv_cache pv_cache;

/* clock may be NULL (CLOCK_MONOTONIC). */
pv_status pv_cache_init(pv_cache **cache, const pv_cache_config *cfg,
                        pv_clock_fn clock, void *clock_ctx);
void pv_cache_free(pv_cache *cache);

/* Memory for the HOST tier as it is used, not all at init: after this call
 * the cache hands out HOST slots [0, n_backed) only, and when it needs a
 * HOST slot and none of those is free it calls grow(ctx, n_backed), which
 * backs more slots with memory and returns their new count (more than
 * n_backed; above the budget's count is taken as the budget's), or returns
 * n_backed when it cannot: HOST then counts as full, and an eviction drops
 * what it would have copied there, as with a full tier. Slots are handed
 * out lowest first and reused last-freed first, so the backed count follows
 * the most HOST slots ever in use together. Only before any HOST slot is in
 * use; n_backed at most the budget's slots. */
typedef uint32_t (*pv_cache_grow_fn)(void *ctx, uint32_t n_backed);
pv_status pv_cache_host_growth(pv_cache *cache, uint32_t n_backed, pv_cache_grow_fn grow, void *ctx);

/* ---- sessions ------------------------------------------------------------ */

/* Creates the session if it is new (ids are non-empty strings up to
 * PV_SESSION_ID_MAX bytes); marks it active. */
#define PV_SESSION_ID_MAX 255
pv_status pv_cache_session_open(pv_cache *cache, const char *id);

/* Frees every slot of the session in every tier, its index and its history;
 * *bytes_freed (may be NULL) gets the DEVICE + HOST bytes it held.
 * PV_ERR_BUSY while the session is pinned or a chunk of it is under copy. */
pv_status pv_cache_end_session(pv_cache *cache, const char *id, uint64_t *bytes_freed);

/* Appends tokens to the session's history, the source for recomputing
 * dropped chunks. */
pv_status pv_cache_append_tokens(pv_cache *cache, const char *id,
                                 const int32_t *tokens, size_t n_tokens);

/* Marks the session active now (idle time restarts). */
pv_status pv_cache_touch(pv_cache *cache, const char *id);

/* Sets when the session was last active (on the cache's clock; at most
 * now): a session restored from disk keeps the idle time it had, so
 * eviction ranks it as it would have. */
pv_status pv_cache_session_set_active(pv_cache *cache, const char *id, double last_active);

/* A running request pins its session: no chunk of it is evicted until the
 * matching unpin. Pins nest. Both mark the session active. */
pv_status pv_cache_pin(pv_cache *cache, const char *id);
pv_status pv_cache_unpin(pv_cache *cache, const char *id);

/* End of a turn (seed 004's save): the first committed_tokens tokens of the
 * history are in the cache; counts a turn and marks the session active. */
pv_status pv_cache_session_save(pv_cache *cache, const char *id, uint32_t committed_tokens);

/* An edited earlier turn or a regenerated answer: keeps the first n_tokens
 * tokens of the history. Chunks wholly past them are freed in every tier
 * (DEVICE and HOST slots, DROPPED records, DEVICE shadows), their slots free
 * at once; the chunk holding token n_tokens - 1 stays where it is (its rows
 * past the cut are stale and are overwritten as the history grows again).
 * committed_tokens is capped at n_tokens. The view then has n_chunks = the
 * highest chunk index still stored + 1 (0 when none is: n_tokens 0 empties
 * the session, which stays open) and a recompute_tokens found from the
 * records left (at most n_tokens); turns and idle time are unchanged.
 * n_tokens at or past the history length changes nothing (PV_OK, pinned or
 * not). PV_ERR_NOT_FOUND for an unknown session; PV_ERR_BUSY, changing
 * nothing, while the session is pinned or a chunk to be freed is under copy
 * (a two-phase move not yet completed or aborted). Costs the chunks freed
 * and the session's page table, not the cache. */
pv_status pv_cache_session_truncate(pv_cache *cache, const char *id, uint32_t n_tokens);

/* Frees the chunks stored past the history's last chunk: slots taken for
 * tokens that never ran (a turn that left the running set with its next
 * chunk stored but not run). Nothing else changes; PV_OK when there are
 * none. PV_ERR_NOT_FOUND and PV_ERR_BUSY as for pv_cache_session_truncate. */
pv_status pv_cache_session_trim(pv_cache *cache, const char *id);

typedef struct pv_session_view {
    const int32_t *tokens;      /* the history; valid until this session changes */
    size_t n_tokens;
    uint32_t committed_tokens;  /* from the last save */
    uint32_t turns;
    uint32_t n_chunks;          /* highest chunk index stored (any tier) + 1 */
    uint32_t records[3];        /* (chunk, layer) records per DEVICE, HOST, DROPPED */
    uint32_t recompute_tokens;  /* leading tokens to recompute: through the last
                                 * chunk with a dropped layer, capped at the history */
    uint32_t shadows;           /* HOST records whose DEVICE shadow is still held */
    uint64_t held_bytes[PV_SLOT_TIERS]; /* DEVICE includes shadow slots; the
                                 * session's own, shared chunks not included */
    uint32_t pins;
    double last_active;
    uint32_t shared_chunks;     /* chunks [0, shared_chunks) are shared */
    uint32_t shared_records[3]; /* their (chunk, layer) records per DEVICE, HOST, DROPPED */
    uint32_t shared_shadows;    /* of those in HOST, the ones with a DEVICE shadow */
    uint32_t shared_busy;       /* of those, records under copy or stored for a
                                 * recomputation that has not run (another
                                 * running session's): wait before reading */
} pv_session_view;

/* Seed 004's restore: describes the session's saved context. It changes
 * nothing, so a request that is rejected and retried restores again and
 * gets the same answer. */
pv_status pv_cache_session_restore(const pv_cache *cache, const char *id, pv_session_view *view);

/* Bytes held in DEVICE and HOST slots by one session (id) or by all (id NULL);
 * DEVICE includes shadow slots (they are held until reclaimed). */
pv_status pv_cache_held_bytes(const pv_cache *cache, const char *id,
                              uint64_t *device_bytes, uint64_t *host_bytes);

/* ---- shared prefixes -------------------------------------------------------- */

/* With cfg.share_prefixes, a full chunk whose whole prefix (the same tokens
 * from position 0) equals a chunk another session of the same namespace
 * holds is kept once: the sessions link one copy (a holder, invisible to
 * the id functions) instead of storing their own. A session's namespace is
 * its id's bytes before the first ':' (all of an id without one is not a
 * namespace: such ids share the empty namespace); sessions of different
 * namespaces never share. Chunks are found by a chain hash of (the previous
 * chunk's, this chunk's tokens) and compared token by token, so sharing
 * starts at position 0 and stops at the first difference.
 *
 * A session's full chunks become findable when a save commits them
 * (pv_cache_session_save), never before their KV is computed. A shared
 * chunk moves between tiers once for all its sessions; its retention value
 * is its cost times the number of sessions sharing it over the idle time of
 * the latest of them; it is pinned while any of them is; when dropped, one
 * recomputation (pv_cache_store_chunk through any of them) serves all.
 * Lookups, peeks and swap-in plans of a session see its shared chunks as
 * its own; its view and held bytes count them apart. A truncation through
 * a shared chunk, or pv_cache_mark_dropped on one, leaves the session its
 * own DROPPED record there (recomputed next turn).
 *
 * pv_cache_share_prefix links the session's next chunks to shared ones:
 * from its first chunk not yet shared, while the chunk was never stored in
 * the session, its tokens (tokens [0, n_head) = head, then tail) match a
 * findable chunk with the same prefix, and at least one token stays after
 * it (the next turn computes the logits). Tokens of linked chunks past the
 * session's history are appended to it; the history must be a prefix of
 * head + tail where they overlap (a chunk that disagrees is not linked).
 * *shared_tokens (may be NULL) gets shared_chunks x chunk_tokens. Shares
 * nothing (PV_OK) without cfg.share_prefixes. */
pv_status pv_cache_share_prefix(pv_cache *cache, const char *id, const int32_t *head, size_t n_head,
                                 const int32_t *tail, size_t n_tail, uint32_t *shared_tokens);

/* The first n_tokens tokens of the session's history have their KV now:
 * shared chunks it stored for a recomputation below that are readable by
 * the other sessions (until then, their views count them busy; if the
 * session is unpinned first, those chunks are dropped again). */
pv_status pv_cache_share_filled(pv_cache *cache, const char *id, uint32_t n_tokens);

/* ---- chunks --------------------------------------------------------------- */

/* Stores a new or recomputed chunk in tier (DEVICE or HOST) and returns its
 * slot. Any older copy in any tier, shadow included, is removed first (seed
 * 002). A DEVICE store with no free slot reclaims the shadow of lowest
 * retention value (no copy needed). Fails with PV_ERR_OUT_OF_MEMORY,
 * changing nothing, if the tier has no free slot (nor shadow to reclaim):
 * the engine runs pv_cache_evict_to_free first. PV_ERR_BUSY if the chunk is
 * under copy. */
#define PV_CACHE_MAX_CHUNKS (1u << 20)
pv_status pv_cache_store_chunk(pv_cache *cache, const char *id, uint32_t chunk,
                               uint32_t layer, pv_tier tier, uint32_t *slot);

/* Records the chunk as DROPPED: its tokens are in the history, its KV is
 * held nowhere (a restored session's chunk whose bytes were not kept), so
 * the next turn recomputes it. A copy in DEVICE or HOST is freed first.
 * Not counted as an eviction. PV_ERR_BUSY if the chunk is under copy. */
pv_status pv_cache_mark_dropped(pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer);

/* Where a chunk is: *tier is PV_TIER_NONE for a chunk never stored; *slot
 * (may be NULL) is its slot in DEVICE or HOST. A HOST chunk whose DEVICE
 * shadow is still held is a DEVICE hit at the shadow slot (the engine reads
 * it there); the chunk stays in HOST with both copies until the shadow is
 * reclaimed. Counts hits per tier (and shadow hits). */
pv_status pv_cache_lookup(pv_cache *cache, const char *id, uint32_t chunk,
                          uint32_t layer, pv_tier *tier, uint32_t *slot);

/* Where a chunk is, for views and checks: like pv_cache_lookup but
 * counting nothing. *tier is the chunk's own tier (HOST for a chunk whose
 * DEVICE shadow is still held), PV_TIER_NONE if never stored; *slot (may be
 * NULL) its slot in DEVICE or HOST, else UINT32_MAX; *shadow_slot (may be
 * NULL) the shadow's DEVICE slot, else UINT32_MAX. */
pv_status pv_cache_peek(const pv_cache *cache, const char *id, uint32_t chunk, uint32_t layer,
                        pv_tier *tier, uint32_t *slot, uint32_t *shadow_slot);

/* The chunk's retention value now (INFINITY when idle time is zero). */
pv_status pv_cache_retention_value(pv_cache *cache, const char *id, uint32_t chunk,
                                   uint32_t layer, double *value);

/* The policy's cost of (chunk, layer) in a session of session_chunks chunks
 * (the numerator of its retention value), for ranking chunks held outside
 * a cache the same way (saved session state). */
double pv_cache_policy_cost(const pv_cache_config *cfg, uint32_t chunk, uint32_t layer,
                            uint32_t session_chunks);

/* ---- plans: the engine carries out what the core decides --------------------- */

typedef struct pv_cache_move {
    uint32_t session;   /* handle: pv_cache_session_name() gives the id */
    uint32_t chunk;
    uint32_t layer;
    pv_tier from, to;   /* DEVICE->HOST, HOST->DEVICE, DEVICE/HOST->DROPPED;
                         * DEVICE->NONE is a note: the chunk's shadow at
                         * from_slot was reclaimed (nothing to copy; the
                         * chunk stays in HOST, or is dropped by the next move) */
    uint32_t from_slot; /* slot in `from` (unused when from is DROPPED) */
    uint32_t to_slot;   /* slot in `to` (unused when to is DROPPED or NONE) */
    int two_phase;      /* 1: both slots stay held until pv_cache_complete()
                         * or pv_cache_abort(); 0: already applied, the engine
                         * copies from_slot -> to_slot before reusing from_slot */
} pv_cache_move;

typedef struct pv_cache_plan {
    pv_cache_move *moves;
    size_t n_moves;
    size_t capacity;
} pv_cache_plan;

pv_status pv_cache_plan_init(pv_cache_plan *plan);
pv_status pv_cache_plan_clear(pv_cache_plan *plan); /* keeps the capacity */
void pv_cache_plan_free(pv_cache_plan *plan);         /* NULL: no-op */

/* The id of a session handle found in a move; NULL for a handle not in use. */
const char *pv_cache_session_name(const pv_cache *cache, uint32_t session);

/* Makes at least `bytes` free in tier (DEVICE or HOST). On DEVICE, shadows
 * of unpinned sessions are reclaimed first, lowest retention value first,
 * with a note each and no copy. Then the chunks of lowest retention value
 * move down: DEVICE -> HOST (dropping a HOST chunk of lower value when HOST
 * is full, or the victim itself when none is lower) and HOST -> DROPPED (a
 * dropped chunk's shadow goes with it, noted first). Appends the moves to
 * plan, in the order the engine must perform them. If not enough unpinned
 * chunks exist, fails with PV_ERR_OUT_OF_MEMORY and changes nothing. */
pv_status pv_cache_evict_to_free(pv_cache *cache, pv_tier tier, uint64_t bytes,
                                 pv_cache_plan *plan);

/* Ahead-of-time swap-out: while DEVICE use (not counting chunks already
 * being copied out, nor shadows) is above the high-water mark, plans up to
 * max_chunks two-phase DEVICE -> HOST copies of the coldest chunks (dropping
 * colder HOST chunks for room). A chunk under copy is neither evicted nor
 * freed. Plans nothing while a swap-in is in flight (swap-outs are
 * delayed). When such a copy completes, the DEVICE slot is reclaimed lazily:
 * it stays held as the chunk's shadow. */
pv_status pv_cache_plan_swap_out(pv_cache *cache, uint32_t max_chunks, pv_cache_plan *plan);

/* Swap-in of a returning session: two-phase HOST -> DEVICE copies of all its
 * HOST chunks that have no shadow (those are read on DEVICE already), after
 * making room on DEVICE (moves of other sessions' chunks come first in the
 * plan). PV_ERR_OUT_OF_MEMORY, changing nothing, if the device cannot make
 * room. */
pv_status pv_cache_plan_swap_in(pv_cache *cache, const char *id, pv_cache_plan *plan);

/* The engine's copy of two-phase moves landed: the chunks now live in their
 * destination. A HOST -> DEVICE source slot is free; a DEVICE -> HOST
 * source slot stays held as the chunk's shadow (Pensieve §4.3.2). */
pv_status pv_cache_complete(pv_cache *cache, const pv_cache_move *moves, size_t n_moves);
/* The copies were abandoned: the chunks stay where they were and the
 * destination slots are free. */
pv_status pv_cache_abort(pv_cache *cache, const pv_cache_move *moves, size_t n_moves);

typedef struct pv_cache_admission {
    int admit;              /* 1: admit now (after freeing free_bytes) */
    uint64_t free_bytes;    /* DEVICE bytes to make free with evict_to_free */
} pv_cache_admission;

/* Admission with the reserve: a request needing need_slots new DEVICE slots
 * is admitted only if, after it, `reserve` of the device slots can still be
 * free (counting unpinned chunks and shadows as reclaimable). */
pv_status pv_cache_admit(pv_cache *cache, uint64_t need_slots, pv_cache_admission *out);

/* When decode runs out of DEVICE slots: the newest pinned session (the most
 * recently admitted running request), for the engine to suspend (unpin, swap
 * out, requeue). PV_ERR_NOT_FOUND if none is pinned. */
pv_status pv_cache_choose_suspend(const pv_cache *cache, const char **id);

/* ---- statistics and invariants ------------------------------------------- */

typedef struct pv_cache_stats {
    uint64_t hits[3];              /* lookups found in DEVICE, HOST, DROPPED */
    uint64_t shadow_hits;          /* of hits[DEVICE]: read from a shadow */
    uint64_t misses;               /* lookups of chunks never stored */
    uint64_t swap_out_chunks, swap_out_bytes; /* DEVICE -> HOST, landed */
    uint64_t swap_in_chunks, swap_in_bytes;   /* HOST -> DEVICE, landed */
    uint64_t dropped_chunks;       /* records moved to DROPPED */
    uint64_t recomputed_chunks;    /* DROPPED records stored again */
    uint64_t recomputed_tokens;    /* tokens of chunk indices fully recovered */
    uint64_t swap_out_delayed;     /* swap-out plans deferred by a swap-in */
    uint64_t shadow_reclaimed;     /* shadows freed for room (no copy) */
    uint64_t used_bytes[PV_SLOT_TIERS]; /* DEVICE includes shadow slots */
    uint64_t shadow_chunks, shadow_bytes; /* shadows held now */
    uint64_t capacity_bytes[PV_SLOT_TIERS];
    uint64_t host_backed_bytes;    /* of capacity_bytes[HOST]: slots with memory
                                    * behind them (pv_cache_host_growth) */
    uint64_t records[3];           /* (chunk, layer) records per tier */
    uint32_t sessions;
    uint64_t shared_chunks;        /* chunks shared by sessions (each one copy) */
    uint64_t shared_links;         /* sessions' links to them (a chunk shared by
                                    * three sessions: three links) */
    uint64_t shared_saved_bytes[PV_SLOT_TIERS]; /* bytes one copy per session would add */
} pv_cache_stats;

pv_status pv_cache_stats_get(const pv_cache *cache, pv_cache_stats *stats);

/* Verifies the invariants: no chunk in two tiers (its authoritative copy),
 * and a shadow belongs to exactly one HOST chunk of the same key; used bytes
 * equal the sum of slot sizes per tier, shadows included; every indexed
 * chunk lives in one tier and every slot in use belongs to an indexed
 * chunk; ended sessions leave nothing, no shadow either; free lists are
 * consistent; eviction frontiers match the chunks. Returns PV_ERR_STATE
 * with the first violation in pv_last_error(), as
 *   pv_cache_check: invariant "<name>" violated: <details>
 * where <name> is one of: one tier, byte counters, record counters, session
 * index, ended session, free list, shadow, copies, frontier, eviction tree,
 * pin list, session table, shared chunks (a session links holders of its
 * chunks [0, shared) with the same namespace, tokens and parent), reference
 * counts (a holder's count and pins equal its sessions' links and pins; no
 * holder without one, unless a copy of it is in flight), share map (every
 * findable chunk is in it under its chain hash, nothing else). */
pv_status pv_cache_check(const pv_cache *cache);

#ifdef __cplusplus
}
#endif
#endif
