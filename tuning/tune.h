/* pensieve-tune's measurements: the times the eviction cost model is fitted
 * to, taken through the real kernels on one backend device, and the profile
 * made of them. A convenience library (libpvtune) linked by pensieve-tune
 * and by pensieve-chat's /tune. */
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

/* The setup of a model on be: its shape, and its chunk size and KV type
 * (the model's options); one warm-up run and `repeats` timed ones. */
void tune_setup_init(tune_setup *s, pv_backend *be, pv_llama *model, int repeats);

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

/* ---- the profile (tune-profile.c) ---- */

/* What a cost-model run measured besides the profile's points. */
typedef struct tune_cost_report {
    pv_cost_point held[PV_PROFILE_MAX_POINTS]; /* held out of the fit */
    int n_held;
    tune_timing forward;    /* one chunk's forward pass, per layer */
    tune_timing attention0; /* its attention at context 0 */
    pv_cost_fit fit;
} tune_cost_report;

/* Called before each measurement (done of total) and once at the end. */
typedef void (*tune_step_fn)(void *ctx, int done, int total, const char *what);

/* The cost model of s's device: one chunk's attention at one layer at
 * contexts of 2^k tokens from one chunk up to max_context (the fit) and at
 * three quarters of each power above the first (held out, to check it),
 * and one chunk's forward pass (c is it less its attention at context 0).
 * Fills p's backend, device, shape, alpha, beta, c, r2, heldout_error,
 * chunk_tokens, points, date and version; its kernel sets are left as they
 * are. step may be NULL. */
pv_status tune_cost_model(const tune_setup *s, int64_t max_context, pv_profile *p, tune_cost_report *rep,
                          tune_step_fn step, void *step_ctx);

/* The kernel sets of be's device in the profile file at path whose family
 * (1 << tune_family) is not in `families`: set in be, so what is measured
 * next runs with them, and appended to p->kernels, so saving p keeps them.
 * Nothing for a backend without tunable kernels, a missing file or no
 * section for the device. */
pv_status tune_keep_kernel_sets(const char *path, pv_backend *be, unsigned families, pv_profile *p);

/* ---- kernel search (tune-kernels.c) ---- */

/* The kernel families, in the order of backend.h's kernel tuning. */
typedef enum tune_family { TUNE_ATTENTION, TUNE_GATHER, TUNE_QMATMUL, TUNE_RECOMPUTE, TUNE_FAMILY_COUNT } tune_family;
const char *tune_family_name(tune_family f);

/* The most candidates a bucket tries: 52 (qmatmul where every PV_GEMM
 * runs: 48 sets at the default PV_GEMM, then 4 PV_GEMM modes). */
#define TUNE_MAX_CANDIDATES 64
#define TUNE_MAX_BUCKETS 8 /* 4 of attention, one of each other family */

/* Which of a workload's products run (bits). qmatmul's search is in two
 * stages, as its parameters are separable by product: PV_GEMM changes
 * only the prefill product (more than 16 tokens), the others choose and
 * shape the decode products' kernels. The other families' workloads are
 * one whole: TUNE_ALL. */
typedef enum tune_products {
    TUNE_DECODE = 1,  /* qmatmul's one-token and 8-token products */
    TUNE_PREFILL = 2, /* qmatmul's 512-token product */
    TUNE_ALL = TUNE_DECODE | TUNE_PREFILL
} tune_products;
const char *tune_products_name(tune_products p); /* "decode", "prefill", "all" */

/* Whether a candidate (its parameter string, as pv_kernel_candidate writes
 * it) is in a search stage: TUNE_ALL every one; TUNE_DECODE (qmatmul's
 * first stage) those whose PV_GEMM is default_params'; TUNE_PREFILL (its
 * second) those equal to decode_best, the first stage's fastest, in every
 * parameter but PV_GEMM. NAME=VALUE tokens compare whole, in any order. */
int tune_in_stage(tune_products stage, const char *params, const char *default_params, const char *decode_best);

typedef struct tune_candidate {
    char params[96];
    tune_products timed; /* the products it was checked and timed on */
    double error;        /* against the CPU backend, relative to the largest output compared */
    double limit;        /* the error it may have: its bucket's, or REDUCED_LIMIT for a tensor-core PV_GEMM */
    int rejected;        /* error above the limit: never timed */
    double seconds;      /* median, when not rejected */
    double spread;
} tune_candidate;

typedef struct tune_bucket_result {
    char bucket[48];
    char what[96];            /* the workload */
    char default_params[96];  /* the backend's set before the search */
    double limit;             /* the error limit (0 for the copies: exact) */
    int n_candidates;
    tune_candidate candidates[TUNE_MAX_CANDIDATES];
    int best;                 /* index of the fastest correct one (qmatmul: of its second stage) */
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
 * is left set in s->be (qmatmul: in two stages, tune_in_stage). A bucket
 * or stage with no correct candidate is an error. quick: the long context
 * at 1024 rather than 4096. */
pv_status tune_kernels(const tune_setup *s, pv_backend *ref, unsigned families, int quick,
                       tune_bucket_result *results, int *n_results, tune_progress_fn progress, void *progress_ctx);

#endif
