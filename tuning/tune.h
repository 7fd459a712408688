/* pensieve-tune's measurements: the times the eviction cost model is fitted
 * to, taken through the real kernels on one backend device. */
#ifndef PENSIEVE_TUNING_TUNE_H
#define PENSIEVE_TUNING_TUNE_H

#include <pensieve/backend.h>
#include <pensieve/llama.h>
#include <pensieve/profile.h>

/* Repeats of one timing: median and spread ((q3 - q1) / median). */
typedef struct tune_timing {
    double median, spread;
} tune_timing;

typedef struct tune_setup {
    pv_backend *be;
    pv_llama *model;
    int32_t n_heads, n_kv_heads, head_dim, n_layers;
    int32_t chunk_tokens;
    pv_dtype kv_dtype;
    int warmup, repeats;
} tune_setup;

/* One chunk's attention at one layer: chunk_tokens query tokens at
 * positions context .. context + chunk_tokens - 1 of one sequence, over the
 * paged pool (every earlier position and the chunk itself), through
 * pv_attention; each repeat ends with pv_backend_finish. */
pv_status tune_attention(const tune_setup *s, int64_t context, tune_timing *out);

/* A monotonic clock in seconds, and the median of n times (sorted in place). */
double tune_now_s(void);
double tune_median(double *t, int n);

/* Runs fn(s, ctx) s->warmup + s->repeats times, each ending with
 * pv_backend_finish, and summarises the timed repeats. */
pv_status tune_time_runs(const tune_setup *s, pv_status (*fn)(const tune_setup *s, void *ctx), void *ctx,
                         tune_timing *out);

/* One chunk through the whole model (pv_llama_forward, chunk_tokens tokens
 * at positions 0 .., no logits) per layer: the chunk's other work (c) is
 * this minus the attention at context 0. */
pv_status tune_forward_per_layer(const tune_setup *s, tune_timing *out);

/* ---- kernel search (tune-kernels.c) ---- */

/* The kernel families, in the order of backend.h's kernel tuning. */
typedef enum tune_family { TUNE_ATTENTION, TUNE_GATHER, TUNE_QMATMUL, TUNE_RECOMPUTE, TUNE_FAMILY_COUNT } tune_family;
const char *tune_family_name(tune_family f);

#define TUNE_MAX_CANDIDATES 24 /* the most any bucket has: 20 */
#define TUNE_MAX_BUCKETS 8     /* 4 of attention, one of each other family */

typedef struct tune_candidate {
    char params[96];
    double error;   /* against the CPU backend, relative to the largest output */
    int rejected;   /* error above the limit: never timed */
    double seconds; /* median, when not rejected */
    double spread;
} tune_candidate;

typedef struct tune_bucket_result {
    char bucket[48];
    char what[96];            /* the workload */
    char default_params[96];  /* the backend's set before the search */
    double limit;             /* the error limit (0 for the copies: exact) */
    int n_candidates;
    tune_candidate candidates[TUNE_MAX_CANDIDATES];
    int best;                 /* index of the fastest correct one */
    /* The default set and the best one timed again, alternating (the
     * search's own times, one candidate after another, favour whichever
     * ran in a quiet moment, and the minimum of many favours the best);
     * default_s is NAN when the default set was rejected. */
    double default_s, best_s;
    /* The fastest was not TUNE_MIN_GAIN faster than the default in those
     * runs: best is the default, as a gain within the noise is none. */
    int kept_default;
} tune_bucket_result;

#define TUNE_MIN_GAIN 0.03

typedef void (*tune_progress_fn)(void *ctx, const char *what);

/* For each family in the mask (1 << tune_family), the buckets of s's shape
 * (attention: decode and prefill at a short and a long context; the
 * others one each): every candidate's workload result is compared with
 * ref's (the CPU backend) before it is timed, and the fastest correct one
 * is left set in s->be. A bucket with no correct candidate is an error.
 * quick: the long context at 1024 rather than 4096. */
pv_status tune_kernels(const tune_setup *s, pv_backend *ref, unsigned families, int quick,
                       tune_bucket_result *results, int *n_results, tune_progress_fn progress, void *progress_ctx);

#endif
