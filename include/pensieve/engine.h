/* The stateful serving engine: the one place that knows the tiered cache
 * (pvcore), the model and the backend. Each conversation (session) keeps its
 * KV between turns in the cache's tiers; a returning session's context is
 * [dropped | host | device | new prompt]: host chunks are swapped in layer by
 * layer while earlier layers compute, dropped chunks are recomputed by
 * prepending their tokens to the new prompt in the same batch.
 *
 * The scheduler works in iterations: each pv_engine_step() runs one forward
 * pass over a unified batch of decode tokens (one per running request) and
 * prefill pieces (recovered and new prompt tokens) under a token budget,
 * admits waiting turns first come first served while the cache's device
 * reserve allows, samples, streams tokens through callbacks, and plans
 * ahead-of-time swap-outs between iterations.
 *
 * Threading: an engine is driven by one thread; callbacks run on that thread
 * inside pv_engine_step(). No call blocks forever or exits. */
#ifndef PENSIEVE_ENGINE_H
#define PENSIEVE_ENGINE_H

#include <pensieve/backend.h>
#include <pensieve/cache.h>
#include <pensieve/llama.h>
#include <pensieve/profile.h>
#include <pensieve/status.h>
#include <pensieve/tokenizer.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pv_engine_mode {
    PV_MODE_PENSIEVE = 0,  /* device + host tiers, dropped chunks recovered */
    PV_MODE_GPU_ONLY = 1,  /* no host tier: evicted chunks are dropped and recomputed */
    PV_MODE_STATELESS = 2  /* every turn recomputes the whole history; KV freed after the turn */
} pv_engine_mode;

const char *pv_engine_mode_name(pv_engine_mode mode);
/* "pensieve", "gpu-only" or "stateless"; PV_ERR_INVALID_ARG otherwise. */
pv_status pv_engine_mode_parse(const char *name, pv_engine_mode *mode);

typedef struct pv_engine_config {
    pv_engine_mode mode;
    int32_t token_budget;     /* tokens per iteration, prefill and decode together;
                               * at most the model's max_batch_tokens (0 = that) */
    int32_t max_running;      /* requests in one batch; at most the model's
                               * max_logit_rows (0 = that) */
    uint32_t swap_out_chunks; /* chunks per ahead-of-time swap-out batch (one transfer) */
    double idle_timeout_s;    /* sessions idle this long are ended; 0 = never */
    int prefix_sharing;       /* 1: full chunks whose whole prefix equals a chunk
                               * already cached in the same namespace are shared,
                               * not stored and prefilled again (pensieve and
                               * gpu-only modes); 0: every session its own copy */
    /* Decode steps one pv_engine_step may run as a chain (1..64; 0: 1 on the
     * CPU backend, 4 elsewhere): when a step is all decodes and nobody
     * waits, each next step is enqueued with the tokens the device sampled
     * before the host reads them, and the host streams them, checks stops
     * and ends turns one step behind (a turn ended by a stop string or an
     * end token costs one step of work thrown away). The same tokens as 1. */
    int32_t decode_steps;
    /* The HOST tier's memory comes in segments of this many bytes (rounded
     * down to whole slots, at least one), each allocated when the cache
     * first needs a slot of it, so a host budget costs what is used, not
     * its size, and no buffer exceeds the backend's largest allocation
     * (OpenCL devices refuse buffers past CL_DEVICE_MAX_MEM_ALLOC_SIZE).
     * 0: 256 MiB, or the backend's largest allocation where that is less. */
    uint64_t host_segment_bytes;
    pv_clock_fn clock;        /* seconds, for idle times and eviction; NULL = monotonic */
    void *clock_ctx;
} pv_engine_config;

#define PV_ENGINE_MAX_DECODE_STEPS 64
#define PV_ENGINE_HOST_SEGMENT_BYTES (256ULL << 20) /* host_segment_bytes 0 */

/* pensieve mode, budget and running limit from the model, 256 swap-out
 * chunks per batch, no idle timeout, prefix sharing on. */
void pv_engine_config_defaults(pv_engine_config *cfg);

/* A turn's logit bias (OpenAI's logit_bias) holds at most this many
 * entries. OpenAI's API reference states no limit; 1024 bounds the copy a
 * request keeps and a step's sampling lists (max_running x 1024 entries). */
#define PV_SAMPLING_MAX_BIAS 1024
/* Bias values are in [-PV_SAMPLING_BIAS_RANGE, +PV_SAMPLING_BIAS_RANGE]
 * (OpenAI's range); -100 bans the token (PV_LOGIT_BIAS_BAN). */
#define PV_SAMPLING_BIAS_RANGE 100.0f

/* How one turn samples and stops. */
typedef struct pv_sampling {
    float temperature;          /* 0: greedy (argmax, lowest id on ties) */
    float top_p;                /* nucleus mass in (0, 1] when sampling */
    uint64_t seed;              /* per request: the same seed gives the same draws */
    int32_t max_tokens;         /* tokens to generate; 0 = until the model's context
                                 * or the device pool is full (finish "length") */
    const char *const *stop;    /* stop strings (copied at submit); NULL if none */
    size_t n_stop;
    int ignore_eos;             /* 1: keep going past the model's end tokens */
    /* Logit bias, every token this turn samples (copied at submit; NULL
     * and 0 if none): bias_values[k] is added to the logit of token
     * bias_tokens[k] before greedy or sampled choice, as pv_sample_batch
     * documents (include/pensieve/backend.h); -100 bans the token, +100
     * all but forces it. pv_engine_submit refuses a token outside
     * [0, n_vocab), a token listed twice, a value that is not finite or
     * outside [-100, 100], more than PV_SAMPLING_MAX_BIAS entries, and a
     * list that bans every token of the vocabulary. */
    const int32_t *bias_tokens;
    const float *bias_values;
    size_t n_bias;
} pv_sampling;

void pv_sampling_defaults(pv_sampling *s); /* greedy, top_p 1, seed 1, no limit */

typedef enum pv_finish_reason {
    PV_FINISH_NONE = 0,
    PV_FINISH_STOP,    /* an end token of the model or a stop string */
    PV_FINISH_LENGTH,  /* max_tokens, or the model's context or the device pool is full */
    PV_FINISH_ERROR,   /* see the status handed to on_done */
    PV_FINISH_CANCELLED /* pv_engine_cancel (status PV_OK): what ran is history */
} pv_finish_reason;

const char *pv_finish_reason_name(pv_finish_reason r);

/* Where one turn's context came from, and what it cost. Token counts are
 * averaged over layers (a chunk whose layers sit in different tiers counts
 * fractionally in each), rounded to whole tokens, so reused_device +
 * reused_host + recomputed is context_tokens within one token. They are
 * the turn's first admission's: a request suspended for room and resumed
 * reads its context again, which counts in pv_engine_stats only. */
typedef struct pv_turn_result {
    uint64_t request_id;
    pv_finish_reason finish;
    uint32_t context_tokens;   /* history before the turn (whole_conversation:
                                * the common prefix kept) */
    uint32_t reused_device;    /* history tokens read from DEVICE as they were */
    uint32_t reused_host;      /* history tokens swapped in from HOST */
    uint32_t recomputed;       /* history tokens recomputed (dropped, or stateless) */
    uint32_t shared_tokens;    /* of reused_device + reused_host: tokens of chunks
                                * shared with other sessions (a common prefix) */
    uint32_t new_tokens;       /* prompt tokens of this turn */
    uint32_t generated;        /* tokens generated */
    uint32_t suspensions;      /* times the request was suspended for room */
    double queue_ms;           /* submit -> admission */
    double ttft_ms;            /* submit -> first generated token */
    double prefill_ms;         /* admission -> first generated token */
    double decode_ms;          /* first -> last generated token */
} pv_turn_result;

typedef struct pv_turn_callbacks {
    /* One generated token and its text (bytes; may end inside a UTF-8
     * character). Text that could begin a stop string is held back until it
     * cannot; the stop string itself is never delivered. */
    void (*on_token)(void *user, int32_t token, const char *text, size_t len);
    /* The turn ended: PV_OK, or the error (pv_last_error() on this thread
     * says why). Called exactly once per accepted submit. Callbacks run
     * inside pv_engine_step and must not call the engine (to cancel from
     * a callback, post the cancel: pv_engine_loop_post). */
    void (*on_done)(void *user, pv_status status, const pv_turn_result *result);
    void *user;
} pv_turn_callbacks;

/* A turn: either token ids (appended to the session's history as they are)
 * or chat messages (rendered with the model's chat template as the
 * continuation of the session's conversation: the first turn gets the
 * template's default system turn, later turns close the previous answer).
 *
 * With whole_conversation set, tokens or messages are the conversation from
 * its start (as OpenAI clients send it every turn; messages are rendered as
 * a first turn). The engine keeps the longest common prefix of the
 * session's history and runs the rest: a conversation that extends the
 * history prefills only the new part; one that diverges (an edited or
 * regenerated turn) drops the stored tokens from the first difference on,
 * in every tier, and recomputes from there. The last token is always run,
 * for its logits. */
typedef struct pv_turn {
    const int32_t *tokens;
    size_t n_tokens;
    const pv_chat_message *messages;
    size_t n_messages;
    pv_sampling sampling;
    int whole_conversation;
} pv_turn;

typedef struct pv_engine pv_engine;

/* The engine over an initialised backend, model and tokenizer (it borrows
 * them; they must outlive it). cache_cfg gives the policy, cost constants
 * and tier budgets; its chunk_tokens, n_layers and slot_bytes are taken from
 * the model. The DEVICE tier is a pool on the backend (on the CPU backend, a
 * memory budget of its own); HOST is pinned host memory (absent in gpu-only
 * mode). A device budget smaller than one
 * chunk of every layer (n_layers slots) fails with PV_ERR_INVALID_ARG. A
 * turn's whole context must fit the device pool (pv_engine_submit checks
 * it before anything runs); a turn that fits runs, alone if need be. */
pv_status pv_engine_init(pv_engine **out, pv_backend *be, pv_llama *model, const pv_tokenizer *tok,
                         const pv_cache_config *cache_cfg, const pv_engine_config *cfg);

/* Which device profile an application's cache settings took. */
typedef struct pv_engine_profile_use {
    char path[4096];     /* the file looked in ("" when there is no default location) */
    int applied;         /* 1: profile's constants are in the config */
    int kernel_sets;     /* of them, the kernel parameter sets now in the backend */
    pv_profile profile;  /* when applied */
} pv_engine_profile_use;

/* Sets cfg's cost constants (alpha, beta, c) from the profile of be's
 * device (pensieve-tune; include/pensieve/profile.h) in the file at path,
 * or at pv_profile_default_path() when path is NULL, and gives be the
 * profile's kernel parameter sets (pv_backend_kernel_set) when it runs the
 * portable kernels. Returns PV_OK with use->applied = 0 and nothing changed
 * when the default file is absent or the file has no section for this
 * device (pv_last_error() then says which, for a warning); a named file
 * that is missing, a corrupt file, and a kernel set the backend refuses
 * (PV_ERR_FORMAT naming file, line and key) are errors. Call it after
 * pv_cache_config_defaults and before applying an INI file's own [cache]
 * keys, so those win over the profile. */
pv_status pv_engine_profile_apply(pv_backend *be, const char *path, pv_cache_config *cfg,
                                  pv_engine_profile_use *use);
void pv_engine_free(pv_engine *e);

/* Queue a turn for a session (created on first use). Fails at once, with no
 * callback, for: a session with a turn still running (PV_ERR_BUSY); a turn
 * that would not fit the model's context (PV_ERR_CAPACITY naming the
 * lengths and the limit); a turn whose KV would not fit the whole device
 * pool (PV_ERR_CAPACITY naming the chunks and slots it needs, the device
 * budget in MiB that would hold them as "--device-mem NM", and the largest
 * max_tokens that fits now); an empty turn, a bad token id, session id or
 * sampling (PV_ERR_INVALID_ARG). PV_ERR_CAPACITY is only these limits, so
 * a caller can tell "too long for this engine" from a malformed turn
 * (pensieve-serve's context_length_exceeded). A turn's KV is the history, the new prompt and, with
 * max_tokens set, max_tokens - 1 generated tokens (the last is sampled,
 * not run), capped at the model's context, in whole chunks of every
 * layer; with max_tokens 0 only the first generated token is counted and
 * generation stops with finish "length" when the pool is full, as a
 * llama.cpp slot stops at its context.
 * *request_id (may be NULL) identifies the turn in its result. A NULL
 * session runs the turn alone, statelessly: a session of its own, ended
 * when the turn ends (session ids starting with byte 0x1f are reserved for
 * these). */
pv_status pv_engine_submit(pv_engine *e, const char *session, const pv_turn *turn,
                           const pv_turn_callbacks *cb, uint64_t *request_id);

/* Ends a queued or running turn now: on_done gets PV_OK with finish
 * PV_FINISH_CANCELLED. Tokens already run stay in the session's history
 * (what a client saw of a cancelled answer is kept). PV_ERR_NOT_FOUND when
 * the turn is unknown or already ended. */
pv_status pv_engine_cancel(pv_engine *e, uint64_t request_id);

/* Cancels every queued and running turn (shutdown). */
void pv_engine_cancel_all(pv_engine *e);

/* One iteration: admit, run one forward pass, sample, stream, swap out
 * ahead of time. *worked (may be NULL) is 0 when there was nothing to do. An
 * error here is the engine's (a backend failure); turns that fail for their
 * own reasons end through on_done and the step still succeeds. */
pv_status pv_engine_step(pv_engine *e, int *worked);

/* Steps until no turn is queued or running. */
pv_status pv_engine_run(pv_engine *e);

/* Turns queued or running. */
size_t pv_engine_pending(const pv_engine *e);

/* Ends a session: frees its KV in every tier and its history.
 * PV_ERR_NOT_FOUND for an unknown session, PV_ERR_BUSY while a turn of it is
 * queued or running. */
pv_status pv_engine_end_session(pv_engine *e, const char *session);

/* Tokens of a session's history (KV computed or recomputable), or
 * PV_ERR_NOT_FOUND. */
pv_status pv_engine_session_tokens(const pv_engine *e, const char *session, size_t *n_tokens);

typedef struct pv_engine_stats {
    uint64_t iterations;
    uint64_t chained_iterations;  /* of which chained decode steps (decode_steps > 1) */
    uint64_t turns_done, turns_failed, turns_cancelled;
    uint64_t prefill_tokens;      /* tokens forwarded as prompt (new + recomputed) */
    uint64_t recomputed_tokens;   /* of which history recomputed */
    uint64_t decode_tokens;       /* tokens forwarded as decode steps */
    uint64_t discarded_tokens;    /* decode rows of chained steps thrown away: the
                                   * turn had ended at the step before (decode_steps) */
    uint64_t reused_device_tokens, reused_host_tokens; /* history tokens reused */
    uint64_t shared_prompt_tokens; /* prompt tokens not computed: another session's
                                    * chunks held them (shared prefixes) */
    uint64_t shared_chunks;       /* chunks held once for several sessions now */
    uint64_t shared_saved_bytes;  /* device + host bytes one copy per session would add */
    uint64_t swap_in_chunks, swap_out_chunks, dropped_chunks; /* (chunk, layer) records */
    uint64_t suspensions;
    uint64_t sessions_timed_out;
    uint64_t graph_runs;          /* forward passes the backend ran as one recorded graph */
    uint64_t graph_replays;       /* of which replayed an earlier recording without recording */
    uint64_t host_segments;       /* HOST tier segments allocated (host_segment_bytes) */
    uint64_t host_segments_refused; /* segment allocations that failed: HOST counts as
                                   * full from then on, evictions past it drop */
    double forward_s;             /* time inside the model's forward pass and sampling, and
                                   * waiting for the device to finish them */
    double schedule_s;            /* time in the engine around it: scheduling, cache
                                   * bookkeeping, swap planning and issue */
    uint32_t sessions, running, waiting;
} pv_engine_stats;

pv_status pv_engine_stats_get(const pv_engine *e, pv_engine_stats *stats);

/* The cache, for read-only views (pv_cache_stats_get, pv_cache_check,
 * pv_cache_lookup for a picture of the tiers). */
pv_cache *pv_engine_cache(pv_engine *e);

/* Checks the cache's invariants and the engine's own: every running
 * request's table has a DEVICE slot for each layer of each of its chunks,
 * no slot is in two tables, and outside a running turn the cache holds no
 * chunk past the session's history. PV_ERR_STATE naming the first
 * violation. */
pv_status pv_engine_check(pv_engine *e);

/* Session names, for listings: calls fn for each session the engine knows. */
void pv_engine_foreach_session(const pv_engine *e, void (*fn)(void *user, const char *session),
                               void *user);

/* ---- the engine on a thread of its own (servers) ---------------------------------- */

/* Runs an engine on a thread of its own: it steps while turns are pending
 * and sleeps otherwise (waking at least once a second for the idle
 * timeout). Other threads reach the engine only through
 * pv_engine_loop_call; turn callbacks run on the loop's thread. A step that
 * fails (a backend error) fails every pending turn with its status; the
 * loop goes on serving calls. */
typedef struct pv_engine_loop pv_engine_loop;

pv_status pv_engine_loop_start(pv_engine_loop **out, pv_engine *e);

/* Runs fn(e, arg) on the loop's thread between iterations and waits for
 * it; returns fn's status, with its message (pv_last_error) carried to the
 * calling thread. Calls run in the order made. PV_ERR_STATE after stop. */
pv_status pv_engine_loop_call(pv_engine_loop *loop, pv_status (*fn)(pv_engine *e, void *arg),
                              void *arg);

/* Queues fn(e, arg) to run on the loop's thread and returns at once (for
 * callers that must not block, such as an HTTP server's event threads); fn
 * reports its own outcome. Fails only when the loop is stopping or out of
 * memory, and then fn never runs. */
pv_status pv_engine_loop_post(pv_engine_loop *loop, pv_status (*fn)(pv_engine *e, void *arg),
                              void *arg);

/* Stops the thread: pending turns are cancelled (their on_done runs), then
 * the thread is joined and the loop freed. The engine stays the caller's.
 * NULL: no-op. */
void pv_engine_loop_stop(pv_engine_loop *loop);

#ifdef __cplusplus
}
#endif
#endif
