/* Engine internals shared by the engine sources: sessions, requests, the swap
 * executor's transfer lists and the scheduler's batch arrays. */
#ifndef PV_ENGINE_INTERNAL_H
#define PV_ENGINE_INTERNAL_H

#include <pensieve/engine.h>

#include <stddef.h>
#include <stdint.h>

/* A growable int32 vector: histories and token lists scale with use. */
typedef struct pv_ivec {
    int32_t *v;
    size_t n, cap;
} pv_ivec;

pv_status pv_ivec_reserve(pv_ivec *a, size_t cap);
pv_status pv_ivec_push(pv_ivec *a, int32_t x);
pv_status pv_ivec_append(pv_ivec *a, const int32_t *x, size_t n);
void pv_ivec_free(pv_ivec *a);

typedef struct pv_request pv_request;

/* What the engine keeps per conversation beyond the cache: the history
 * (tokens whose KV is computed, the source for recomputation and for the
 * stateless baseline) and the tokens decided but not yet run through the
 * model (the last sampled token of the previous turn). */
typedef struct pv_esession {
    char *id;
    pv_ivec history;
    pv_ivec pending;
    int opened;            /* the cache knows it (stateless mode closes it after each turn) */
    int turns;
    int anonymous;         /* a NULL-session turn's own: forgotten when it ends */
    double last_active;
    pv_request *request;   /* the turn queued or running, or NULL */
    struct pv_esession *next_in_bucket;
} pv_esession;

typedef enum pv_request_state {
    PV_REQ_WAITING = 0,    /* queued, or suspended for room */
    PV_REQ_RUNNING = 1     /* admitted: pinned, its context on DEVICE */
} pv_request_state;

/* A text buffer for the stop-string hold-back. */
typedef struct pv_text {
    char *s;
    size_t n, cap;
} pv_text;

struct pv_request {
    uint64_t id;
    pv_esession *session;
    pv_request_state state;
    pv_turn_callbacks cb;
    pv_sampling sampling;
    char **stop;            /* owned copies of the stop strings */
    int32_t *bias_tokens;   /* owned copy of the logit bias (sampling.n_bias entries) */
    float *bias_values;
    uint64_t rng;
    /* Tokens still to run through the model at positions from the
     * session's history length on: the turn's prompt, then each sampled
     * token in turn. */
    pv_ivec feed;
    size_t fed;             /* of feed, already forwarded */
    /* Recovery: history[0, recompute) run again at positions 0.. before
     * feed; recompute_done of them forwarded. */
    uint32_t recompute, recompute_done;
    /* DEVICE slots of this request's context: [n_layers][cap_chunks],
     * -1 = none yet. */
    int32_t *slots;
    uint32_t cap_chunks, n_chunks;
    /* Layer-pipelined swap-in in flight: one event per layer, and the
     * two-phase moves to complete once they landed. */
    pv_event **layer_ready;
    pv_cache_move *swap_in;
    size_t n_swap_in;
    pv_text held;           /* generated text held back for stop strings */
    int32_t generated;
    pv_turn_result result;
    double t_submit, t_admit, t_first, t_last;
    int in_batch;           /* scratch: index + 1 in the current batch, 0 if not */
    pv_request *next;       /* waiting queue */
};

/* Swap-out traffic: one transfer of device slots into the host pool's
 * slots on the copy queue. One batch in flight at a time. */
typedef struct pv_swap_out {
    pv_cache_plan plan;     /* two-phase moves in flight */
    pv_event *done;
    int in_flight;
} pv_swap_out;

struct pv_engine {
    pv_backend *be;
    uint64_t graph_runs0, graph_replays0; /* the backend's counts when the engine opened */
    pv_llama *model;
    const pv_tokenizer *tok;
    pv_engine_config cfg;
    pv_cache_config cache_cfg;
    pv_cache *cache;
    uint32_t n_layers, chunk_tokens, n_ctx, n_vocab;
    uint64_t slot_bytes;
    int64_t slot_elems;
    pv_dtype kv_dtype;
    pv_buffer *device_pool;  /* DEVICE tier: n_device_slots slots */
    int64_t n_device_slots, n_host_slots; /* n_host_slots 0: no HOST tier */
    /* The HOST tier (pinned): host_segs[i] holds slots [i * host_seg_slots,
     * (i + 1) * host_seg_slots), allocated when the cache first needs one
     * of them (pv_cache_host_growth); n_host_segs allocated so far. */
    pv_buffer **host_segs;
    int64_t host_seg_slots;
    size_t n_host_segs, max_host_segs;
    size_t *host_seg_fill;   /* [max_host_segs + 1], a transfer's entries per segment */
    int host_grow_refused;   /* a segment's allocation failed: no more are tried */
    /* Slot lists of the transfer being issued (engine_swap.c): its
     * destination and source slots, entry for entry. */
    pv_ivec xfer_dst, xfer_src;
    pv_ivec seg_dst, seg_src;  /* the same, grouped by HOST segment */
    pv_swap_out out;
    pv_cache_plan scratch;   /* eviction plans, reused */

    /* sessions: chained hash table */
    pv_esession **buckets;
    size_t n_buckets, n_sessions;

    /* requests */
    pv_request *wait_head, *wait_tail;
    pv_request **running;
    size_t n_running, n_waiting;
    uint64_t next_request_id;

    /* batch arrays, sized for the token budget */
    int32_t *b_tokens, *b_seq, *b_pos, *b_logit_rows, *b_sampled;
    uint32_t *b_take;        /* tokens each batch sequence runs */
    pv_request **b_reqs;     /* requests in the batch, by sequence index */
    pv_request **b_logit_req;
    int32_t *b_tables;
    size_t b_tables_cap;
    /* Per logit row: the request's temperature (<= 0: greedy), top_p and
     * uniform draw, for the one sampling call of a step. */
    float *u, *b_temperature, *b_top_p;
    /* The step's logit bias as pv_sample_batch takes it: row i's entries
     * are b_bias_start[i] .. b_bias_start[i + 1] - 1 of the lists, its
     * request's (none for a request without). b_bias_start has
     * max_running + 1 entries; the lists grow to the largest step's. */
    int32_t *b_bias_start, *b_bias_token;
    float *b_bias_value;
    size_t b_bias_cap;
    /* Chained decode steps (cfg.decode_steps > 1; engine_sched.c run_chain):
     * the last step's tokens on the device, read by the next; two host
     * slots they are read back into; each chain step's requests by row, and
     * a step's row i's row in the next. NULL/unused when decode_steps is 1. */
    int32_t decode_steps;
    pv_buffer *sampled_dev, *sampled_host;
    pv_request **chain_reqs[2];
    int32_t *chain_next;

    double last_idle_scan;
    pv_engine_stats stats;
};

double pv_engine_now(pv_engine *e);
/* Ends sessions idle past the timeout (at most once a second). */
pv_status pv_engine_expire_idle(pv_engine *e);

/* engine_swap.c: carries out the cache's plans with the backend. */
/* After the cache: the HOST tier's segments (none allocated yet). */
pv_status pv_engine_swap_init(pv_engine *e);
void pv_engine_swap_free(pv_engine *e);
/* The segment holding HOST slot `slot` (allocated: the cache hands out
 * backed slots only) and the slot's byte offset in it. */
pv_buffer *pv_engine_host_slot(const pv_engine *e, uint32_t slot, uint64_t *offset);
/* Moves already applied by the cache (evictions): copies DEVICE -> HOST
 * bytes before the device slots are reused; drops and notes need nothing. */
pv_status pv_engine_run_plan(pv_engine *e, const pv_cache_plan *plan);
/* Evicts until `slots` DEVICE slots are free, carrying the moves out. */
pv_status pv_engine_make_room(pv_engine *e, uint64_t slots);
/* Ahead-of-time swap-out: finishes the batch in flight, plans the next. */
pv_status pv_engine_swap_out_reap(pv_engine *e);
pv_status pv_engine_swap_out_issue(pv_engine *e);
/* Layer-pipelined swap-in of a request's HOST chunks (cache plan with
 * evictions first): one transfer and one event per layer on the copy
 * queue. */
pv_status pv_engine_swap_in_issue(pv_engine *e, pv_request *r, const pv_cache_plan *plan);
/* After the forward that waited for them: the copies landed. */
pv_status pv_engine_swap_in_finish(pv_engine *e, pv_request *r);
/* Copies one slot DEVICE -> DEVICE or HOST -> DEVICE and waits. */
pv_status pv_engine_copy_slot(pv_engine *e, pv_tier from, uint32_t from_slot, uint32_t to_slot);

/* engine_text.c: chat rendering, stop strings, sampling. */
/* whole_conversation turns render as a first turn. */
pv_status pv_engine_render_turn(pv_engine *e, pv_esession *s, const pv_turn *turn, pv_ivec *out);
/* Streams a sampled token's text through the hold-back; *stopped when a
 * stop string completed. */
pv_status pv_engine_emit(pv_engine *e, pv_request *r, int32_t token, int *stopped);
/* Delivers what is still held back (end of turn without a stop string). */
void pv_engine_flush(pv_request *r);
float pv_engine_uniform(uint64_t *state);

/* engine_sched.c */
pv_status pv_engine_admit(pv_engine *e, pv_request *r, int *admitted);
/* Tokens whose KV the whole device pool holds: its chunks of every layer. */
uint64_t pv_engine_device_tokens(const pv_engine *e);
void pv_engine_request_free(pv_request *r);

pv_esession *pv_engine_find_session(const pv_engine *e, const char *id);
/* The session of that id, created (unopened, empty) if new. */
pv_status pv_engine_session_get(pv_engine *e, const char *id, pv_esession **out);
/* Frees a session's KV in every tier and forgets it (no turn may be queued
 * or running). */
pv_status pv_engine_forget_session(pv_engine *e, pv_esession *s);
/* Ends every queued and running turn: cancelled (status PV_OK) or failed
 * with status. */
void pv_engine_end_all(pv_engine *e, pv_status status);

#endif
