/* Multi-turn conversation workloads for pensieve-bench (issue 13): either
 * generated from a dataset's published statistics or replayed from a JSONL
 * file of real conversations, with Poisson arrivals and think times between
 * turns. Bench-internal, hence the wl_ prefix and no public header.
 *
 * Generated distributions (all draws from a seeded splitmix64, no rand()):
 *   turns per conversation  1 + Geometric(p = 1/turns), failures before the
 *                           first success, so the mean is the dataset's
 *                           `turns` exactly (before the context cap);
 *   input, output tokens    lognormal, sigma 1.0, mu = ln(m) - sigma^2/2
 *                           with m = the dataset's mean * length_scale (so
 *                           its mean is m), rounded to the nearest integer,
 *                           at least 1, at most INT32_MAX;
 *   arrivals                cumulative sum of exponential gaps of mean
 *                           1/rate (the first conversation arrives after
 *                           the first gap), times time_scale;
 *   think times             exponential of mean think_mean_s, times
 *                           time_scale; 0 for a conversation's first turn.
 * The scales multiply after the draws, so two runs that differ only in
 * time_scale have the same draws, and two that differ only in length_scale
 * the same normal draws.
 *
 * Random streams: the arrival gaps come from one stream; conversation i
 * has its own stream for its turn count and lengths, another for its
 * think times and another for which preamble it starts with, all derived
 * from the seed. So conversation i does not depend on n_conversations or
 * the cap, a replay with the same seed and rate gets the same arrivals
 * (and think times, turn for turn) as a generated workload, and a
 * workload with preambles has the same turns as one without (up to the
 * cap).
 *
 * Shared preambles (issue 28): with system_prompt_tokens N > 0 every
 * generated conversation starts with one of system_prompts preambles of N
 * tokens, drawn uniformly, in front of its first turn and so in the
 * history of every later one. The workload holds only the choice; the
 * drivers build preamble k from (seed, k) alone (wl_system_prompt_ids,
 * bench-http.h's bh_system_words), so every conversation that drew k
 * sends the same tokens.
 *
 * Context cap: a conversation's context after turn k is its preamble (a
 * replayed conversation's system text) plus the sum of the inputs and
 * outputs of turns 1..k. The conversation ends
 * before the first turn that would take it past context_cap. A first turn
 * that alone is past what the preamble leaves of the cap (cap below) is
 * shortened instead, so every conversation keeps one turn: its output
 * keeps at most cap/2 (rounded down) tokens, its input is cut to what is
 * left of the cap, and the output is then cut to cap - input (so a short
 * input leaves the output more than half). In a replay the text is not
 * cut, only the counts (the caller decides what to do with it). */
#ifndef PV_BENCH_WORKLOAD_H
#define PV_BENCH_WORKLOAD_H

#include <pensieve/status.h>

#include <stdint.h>

typedef enum wl_dataset { WL_SHAREGPT, WL_ULTRACHAT } wl_dataset;

/* The paper's Table 2 means (Pensieve, EuroSys 2025): ShareGPT 5.56 turns
 * per conversation, 37.77 input and 204.58 output tokens per request;
 * UltraChat 3.86 turns, 51.78 input, 257.81 output. Context capped at
 * 16,384 tokens. */
typedef struct wl_dataset_stats {
    const char *name;
    double turns, input_tokens, output_tokens;
} wl_dataset_stats;

/* The dataset's means; NULL for a value outside the enum. */
const wl_dataset_stats *wl_dataset_stats_of(wl_dataset d);
/* "sharegpt", "ultrachat" (any case); 0 ok, -1 unknown or NULL. */
int wl_dataset_parse(const char *name, wl_dataset *out);

typedef struct wl_turn {
    int32_t input_tokens;  /* the user's message */
    int32_t output_tokens; /* the answer's length (max_tokens of the request) */
    double think_s;        /* wait after the previous answer ends before sending this turn
                              (0 for the first turn) */
    char *text;            /* replay only: the user's message text (malloc'd); NULL when generated */
} wl_turn;

typedef struct wl_conversation {
    double arrival_s;      /* when the first turn is sent, from the start of the run */
    int32_t system_tokens; /* the preamble's (or system_text's) length in tokens; 0: none */
    int32_t system_prompt; /* generated: which preamble, in [0, system_prompts), when system_tokens > 0 */
    char *system_text;     /* replay only: the conversation's system message text (malloc'd), sent as
                              its system prompt in place of a generated preamble; NULL: none */
    int32_t n_turns;       /* >= 1 */
    wl_turn *turns;
} wl_conversation;

typedef struct wl_options {
    wl_dataset dataset;
    uint64_t seed;
    int32_t n_conversations; /* generate: how many (>= 1); replay: at most this many lines, 0 all */
    double rate;             /* conversations per second, Poisson arrivals (exponential gaps,
                                mean 1/rate) */
    double think_mean_s;     /* exponential think time between turns, default 60 */
    double time_scale;       /* multiplies every arrival time and think time (0.01: a 60 s think
                                lasts 0.6 s), default 1 */
    double length_scale;     /* multiplies the mean input and output lengths (a small model on a
                                CPU), default 1; lengths stay >= 1 */
    int32_t context_cap;     /* see the context cap above; default 16384, >= 2 */
    int32_t system_prompt_tokens; /* each conversation's preamble, in tokens; default 0: none;
                                     at most context_cap - 2; generated workloads only */
    int32_t system_prompts;  /* distinct preambles to draw from, default 4, >= 1 */
} wl_options;

/* sharegpt, seed 1, 100 conversations, rate 1, think 60, scales 1, cap
 * 16384, no preamble (4 to draw from when one is asked for). */
void wl_options_default(wl_options *o);

/* The options' refusals, shared by generate and replay (replay allows
 * n_conversations 0 and refuses a preamble: a replayed file's
 * conversations are sent as recorded, their system messages included): PV_ERR_INVALID_ARG naming the
 * field, its value and the limit. rate, think_mean_s and the scales must
 * be finite. */
pv_status wl_options_check(const wl_options *o, int replay);

typedef struct wl_workload {
    wl_conversation *conv; /* in arrival order */
    int32_t n;
} wl_workload;

/* A generated workload of o->n_conversations conversations. On failure
 * *out is left empty (zeroed). */
pv_status wl_generate(const wl_options *o, wl_workload *out);

/* Replay: a JSONL file, one conversation a line, OpenAI messages format:
 * {"messages":[{"role":"user","content":"..."},{"role":"assistant",
 * "content":"..."},...]}. The "system" and "developer" messages (as
 * pensieve-serve reads them), wherever they are, joined with "\n" in file
 * order, are the conversation's system_text (its system_tokens counted as a
 * turn's text is), which the drivers send in front of its first turn, as a
 * generated preamble is; "tool" messages are skipped, as are assistant
 * messages before the first
 * user message; content is a string or an array of parts, whose
 * {"type":"text","text":...} parts are joined with "\n" (other parts
 * skipped). Each user message is a turn;
 * the assistant messages after it (until the next user message) give its
 * output_tokens; a turn with no answer gets round(dataset's mean output *
 * length_scale), at least 1. Token counts come from count(ctx, text) (the
 * caller's tokenizer; a negative count is refused), or with count NULL
 * ceil(bytes / 4); each at least 1. Arrivals and think times are drawn as
 * in wl_generate from o; o->n_conversations > 0 limits how many
 * conversations are read. Empty and whitespace-only lines are skipped.
 * Errors: PV_ERR_IO for a file that cannot be read; PV_ERR_FORMAT naming
 * "path:line" and what is wrong (not JSON, no messages array, a message
 * without role or content, an unknown role, no user message, system text
 * past context_cap - 2 tokens, no conversation in the file); PV_ERR_INVALID_ARG for bad options or a
 * negative count. On failure *out is left empty. */
pv_status wl_load_jsonl(const char *path, const wl_options *o,
                        int32_t (*count)(void *ctx, const char *text), void *ctx,
                        wl_workload *out);

/* splitmix64, the bench's random numbers (seeded; no rand()): wl_mix64 is
 * a bijection of 64-bit values (distinct keys give distinct states);
 * wl_splitmix64 steps *state and returns its next draw. */
#define WL_GAMMA UINT64_C(0x9E3779B97F4A7C15)
uint64_t wl_mix64(uint64_t z);
uint64_t wl_splitmix64(uint64_t *state);

/* Preamble k of a workload drawn with this seed: the splitmix64 state its
 * tokens or words are drawn from, in order (a state of its own for each
 * (seed, k)). */
uint64_t wl_system_prompt_state(uint64_t seed, int32_t k);

/* A generated token id from a draw: the vocabulary's middle half, so never
 * an end or control token (n_vocab >= 2). */
int32_t wl_token_id(uint64_t draw, uint32_t n_vocab);

/* Preamble k as n token ids (in process, where generated turns are ids):
 * ids[i] = wl_token_id of the i-th draw from wl_system_prompt_state. */
void wl_system_prompt_ids(uint64_t seed, int32_t k, int32_t n, uint32_t n_vocab, int32_t *ids);

/* Frees the turns, texts and conversations and zeroes *w; a no-op on a
 * zeroed workload or NULL. */
void wl_free(wl_workload *w);

typedef struct wl_summary {
    int64_t conversations, requests;
    double mean_turns;     /* requests / conversations */
    double mean_input;     /* per request */
    double mean_output;    /* per request */
    double mean_gap_s;     /* mean gap between arrivals, the first from 0: last arrival / n */
    double mean_think_s;   /* over the turns after the first; 0 when there are none */
    double last_arrival_s; /* the latest arrival */
} wl_summary;

/* Means over the workload; all zero for an empty one. */
void wl_summarise(const wl_workload *w, wl_summary *s);

#endif
