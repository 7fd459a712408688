/* pensieve-serve's metrics: three latency histograms and the request
 * counters under one mutex, and their Prometheus text exposition together
 * with a snapshot of the engine's and the cache's counters. */
#include "server/metrics.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fixed bucket upper bounds in seconds ("le", inclusive); the +Inf bucket
 * is implicit. Time to first token and end to end span a cached turn of a
 * tiny model (milliseconds) to a long prompt on the CPU (a minute), as
 * vLLM's do; inter-token latency is one decode step, so its buckets are
 * finer and stop sooner. */
static const double ttft_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75,
                                     1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 60.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02,
                                    0.025, 0.03,   0.04,  0.05,   0.075, 0.1,  0.15,
                                    0.2,   0.3,    0.4,   0.5,    0.75, 1.0,  2.5};
static const double e2e_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1,  0.25, 0.5,  0.75, 1.0,  1.5,
                                    2.0,   2.5,  5.0,   10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

#define HIST_MAX_BOUNDS 21
#define BOUNDS(a) a, sizeof a / sizeof a[0]

typedef struct hist_def {
    const char *name, *help;
    const double *bounds;
    size_t n_bounds;
} hist_def;

static const hist_def hist_defs[PV_HIST_COUNT] = {
    [PV_HIST_TTFT] = {"pensieve_time_to_first_token_seconds",
                      "Time from a request's arrival to its first generated token.",
                      BOUNDS(ttft_bounds)},
    [PV_HIST_ITL] = {"pensieve_inter_token_latency_seconds",
                     "Time between consecutive generated tokens of a request.",
                     BOUNDS(itl_bounds)},
    [PV_HIST_E2E] = {"pensieve_request_duration_seconds",
                     "Time from a request's arrival to its last byte (end to end).",
                     BOUNDS(e2e_bounds)},
};

_Static_assert(sizeof ttft_bounds / sizeof ttft_bounds[0] <= HIST_MAX_BOUNDS, "ttft buckets");
_Static_assert(sizeof itl_bounds / sizeof itl_bounds[0] <= HIST_MAX_BOUNDS, "itl buckets");
_Static_assert(sizeof e2e_bounds / sizeof e2e_bounds[0] <= HIST_MAX_BOUNDS, "e2e buckets");

/* HTTP status codes counted, one slot each: [100, 600). */
#define CODE_MIN 100
#define CODE_END 600

typedef struct hist_state {
    uint64_t buckets[HIST_MAX_BOUNDS + 1]; /* per bucket, not cumulative; last: +Inf */
    uint64_t count;
    double sum;
} hist_state;

/* Everything recorded, copied whole under the lock at render time so the
 * formatting runs without holding it. */
typedef struct metrics_state {
    hist_state hist[PV_HIST_COUNT];
    uint64_t codes[CODE_END - CODE_MIN];
    uint64_t prompt_tokens, cached_tokens, generated_tokens;
} metrics_state;

struct pv_metrics {
    pthread_mutex_t lock;
    metrics_state s;
};

pv_status pv_metrics_init(pv_metrics **out)
{
    *out = NULL;
    pv_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_metrics_init: cannot allocate %zu bytes",
                        sizeof *m);
    int rc = pthread_mutex_init(&m->lock, NULL);
    if (rc != 0) {
        free(m);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_metrics_init: pthread_mutex_init: %s",
                        strerror(rc));
    }
    *out = m;
    return PV_OK;
}

void pv_metrics_free(pv_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

void pv_metrics_observe(pv_metrics *m, pv_metric_hist which, double seconds)
{
    /* +Inf is dropped too: it would turn the sum into +Inf for good. */
    if ((unsigned)which >= PV_HIST_COUNT || !isfinite(seconds) || seconds < 0)
        return;
    const hist_def *d = &hist_defs[which];
    size_t b = 0;
    while (b < d->n_bounds && seconds > d->bounds[b])
        b++;
    pthread_mutex_lock(&m->lock);
    hist_state *h = &m->s.hist[which];
    h->buckets[b]++;
    h->count++;
    h->sum += seconds;
    pthread_mutex_unlock(&m->lock);
}

void pv_metrics_request_done(pv_metrics *m, int http_status, uint64_t prompt_tokens,
                             uint64_t cached_tokens, uint64_t generated_tokens)
{
    pthread_mutex_lock(&m->lock);
    if (http_status >= CODE_MIN && http_status < CODE_END)
        m->s.codes[http_status - CODE_MIN]++;
    m->s.prompt_tokens += prompt_tokens;
    m->s.cached_tokens += cached_tokens;
    m->s.generated_tokens += generated_tokens;
    pthread_mutex_unlock(&m->lock);
}

/* ---- the exposition -------------------------------------------------------- */

typedef struct out_buf {
    char *p;
    size_t len, cap;
    int failed; /* an allocation failed: later appends do nothing */
} out_buf;

static void put(out_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out_buf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2;
        while (cap - b->len <= (size_t)n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* A double as the shortest of %.15g and %.17g that reads back exactly, so
 * sums stay exact without printing 0.1 as 0.10000000000000001. */
static void put_double(out_buf *b, double v)
{
    char s[32];
    snprintf(s, sizeof s, "%.15g", v);
    if (strtod(s, NULL) != v)
        snprintf(s, sizeof s, "%.17g", v);
    put(b, "%s", s);
}

static void family(out_buf *b, const char *name, const char *type, const char *help)
{
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one unlabelled sample. */
static void scalar(out_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    put(b, "%s %" PRIu64 "\n", name, v);
}

static void scalar_double(out_buf *b, const char *name, const char *type, const char *help,
                          double v)
{
    family(b, name, type, help);
    put(b, "%s ", name);
    put_double(b, v);
    put(b, "\n");
}

/* A family with one sample per tier; n is 2 (device, host) or 3 (and
 * dropped), the order of pv_tier. */
static void per_tier(out_buf *b, const char *name, const char *type, const char *help,
                     const uint64_t *v, int n)
{
    family(b, name, type, help);
    for (int t = 0; t < n; t++)
        put(b, "%s{tier=\"%s\"} %" PRIu64 "\n", name, pv_tier_name((pv_tier)t), v[t]);
}

static void histogram(out_buf *b, const hist_def *d, const hist_state *h)
{
    family(b, d->name, "histogram", d->help);
    uint64_t cum = 0;
    for (size_t i = 0; i < d->n_bounds; i++) {
        cum += h->buckets[i];
        put(b, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", d->name, d->bounds[i], cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", d->name, h->count);
    put(b, "%s_sum ", d->name);
    put_double(b, h->sum);
    put(b, "\n%s_count %" PRIu64 "\n", d->name, h->count);
}

static void snapshot(out_buf *b, const pv_metrics_snapshot *snap)
{
    const pv_engine_stats *e = &snap->engine;
    const pv_cache_stats *c = &snap->cache;

    scalar(b, "pensieve_requests_running", "gauge",
           "Requests in the engine's running batch.", e->running);
    scalar(b, "pensieve_requests_waiting", "gauge",
           "Requests queued for admission to the engine.", e->waiting);
    scalar(b, "pensieve_sessions", "gauge", "Sessions the engine holds state for.",
           e->sessions);
    scalar(b, "pensieve_engine_iterations_total", "counter", "Engine iterations run.",
           e->iterations);
    family(b, "pensieve_engine_turns_total", "counter", "Turns finished, by result.");
    put(b, "pensieve_engine_turns_total{result=\"done\"} %" PRIu64 "\n", e->turns_done);
    put(b, "pensieve_engine_turns_total{result=\"failed\"} %" PRIu64 "\n", e->turns_failed);
    scalar(b, "pensieve_engine_prefill_tokens_total", "counter",
           "Tokens forwarded as prompt, new and recomputed history.", e->prefill_tokens);
    scalar(b, "pensieve_engine_recomputed_tokens_total", "counter",
           "History tokens forwarded again because their KV was dropped.",
           e->recomputed_tokens);
    scalar(b, "pensieve_engine_decode_tokens_total", "counter",
           "Tokens forwarded as decode steps (generated).", e->decode_tokens);
    scalar(b, "pensieve_engine_chained_iterations_total", "counter",
           "Forward passes run as chained decode steps, enqueued before the host read their tokens.",
           e->chained_iterations);
    scalar(b, "pensieve_engine_graph_runs_total", "counter",
           "Forward passes run as one recorded device graph (decode steps on CUDA).", e->graph_runs);
    scalar(b, "pensieve_engine_graph_replays_total", "counter",
           "Of those, replays of an earlier recording, nothing recorded anew.", e->graph_replays);
    scalar(b, "pensieve_engine_host_segments_refused_total", "counter",
           "Host tier segments the host would not allocate (the tier stays full at its size).",
           e->host_segments_refused);
    scalar(b, "pensieve_engine_discarded_tokens_total", "counter",
           "Decode rows of chained steps thrown away (the turn had ended a step before).", e->discarded_tokens);
    uint64_t reused[2] = {e->reused_device_tokens, e->reused_host_tokens};
    per_tier(b, "pensieve_engine_reused_tokens_total", "counter",
             "History tokens whose KV was reused instead of recomputed, by tier.", reused, 2);
    scalar(b, "pensieve_engine_suspensions_total", "counter",
           "Running requests suspended to make room on the device.", e->suspensions);
    scalar(b, "pensieve_engine_sessions_timed_out_total", "counter",
           "Sessions ended by the idle timeout.", e->sessions_timed_out);
    scalar_double(b, "pensieve_engine_forward_seconds_total", "counter",
                  "Time in the model's forward pass and sampling.", e->forward_s);
    scalar_double(b, "pensieve_engine_schedule_seconds_total", "counter",
                  "Time in the engine around the forward pass: scheduling, cache "
                  "bookkeeping, swap planning.",
                  e->schedule_s);

    per_tier(b, "pensieve_cache_used_bytes", "gauge",
             "Bytes of KV slots in use per tier (device includes shadow copies).",
             c->used_bytes, PV_SLOT_TIERS);
    per_tier(b, "pensieve_cache_capacity_bytes", "gauge", "KV pool budget per tier.",
             c->capacity_bytes, PV_SLOT_TIERS);
    scalar(b, "pensieve_cache_host_backed_bytes", "gauge",
           "Host tier memory allocated so far (whole segments, as the tier fills).", c->host_backed_bytes);
    per_tier(b, "pensieve_cache_hits_total", "counter",
             "Chunk lookups found, by the tier they were in.", c->hits, 3);
    scalar(b, "pensieve_cache_misses_total", "counter", "Chunk lookups of chunks never stored.",
           c->misses);
    scalar(b, "pensieve_cache_swap_in_chunks_total", "counter",
           "Chunk records copied from host to device.", c->swap_in_chunks);
    scalar(b, "pensieve_cache_swap_in_bytes_total", "counter",
           "Bytes copied from host to device.", c->swap_in_bytes);
    scalar(b, "pensieve_cache_swap_out_chunks_total", "counter",
           "Chunk records copied from device to host.", c->swap_out_chunks);
    scalar(b, "pensieve_cache_swap_out_bytes_total", "counter",
           "Bytes copied from device to host.", c->swap_out_bytes);
    scalar(b, "pensieve_cache_dropped_chunks_total", "counter",
           "Chunk records dropped (to be recomputed when needed).", c->dropped_chunks);
    scalar(b, "pensieve_cache_shared_chunks", "gauge",
           "Chunks held once for several sessions of one API key (a common prefix).", c->shared_chunks);
    scalar(b, "pensieve_cache_shared_links", "gauge",
           "Sessions' links to shared chunks (a chunk three sessions share: three).", c->shared_links);
    per_tier(b, "pensieve_cache_shared_saved_bytes", "gauge",
             "Bytes one copy per session of the shared chunks would add, per tier.",
             c->shared_saved_bytes, PV_SLOT_TIERS);
    scalar(b, "pensieve_engine_shared_prompt_tokens_total", "counter",
           "Prompt tokens not computed because a shared chunk held them.", e->shared_prompt_tokens);
}

/* snap NULL: the server's own metrics only (no engine to ask yet). */
pv_status pv_metrics_render(pv_metrics *m, const pv_metrics_snapshot *snap, char **out,
                            size_t *len)
{
    *out = NULL;
    if (len)
        *len = 0;
    metrics_state s;
    pthread_mutex_lock(&m->lock);
    s = m->s;
    pthread_mutex_unlock(&m->lock);

    out_buf b = {malloc(4096), 0, 4096, 0};
    if (!b.p)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_metrics_render: cannot allocate 4096 bytes");
    b.p[0] = '\0';

    for (int i = 0; i < PV_HIST_COUNT; i++)
        histogram(&b, &hist_defs[i], &s.hist[i]);
    family(&b, "pensieve_http_requests_total", "counter", "HTTP requests answered, by status code.");
    for (int c = 0; c < CODE_END - CODE_MIN; c++)
        if (s.codes[c])
            put(&b, "pensieve_http_requests_total{code=\"%d\"} %" PRIu64 "\n", c + CODE_MIN,
                s.codes[c]);
    scalar(&b, "pensieve_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           s.prompt_tokens);
    scalar(&b, "pensieve_prompt_tokens_cached_total", "counter",
           "Prompt tokens of finished requests served from cached KV.", s.cached_tokens);
    scalar(&b, "pensieve_generation_tokens_total", "counter",
           "Tokens generated for finished requests.", s.generated_tokens);
    if (snap)
        snapshot(&b, snap);

    if (b.failed) {
        free(b.p);
        return pv_error(PV_ERR_OUT_OF_MEMORY,
                        "pv_metrics_render: cannot grow the exposition beyond %zu bytes", b.cap);
    }
    *out = b.p;
    if (len)
        *len = b.len;
    return PV_OK;
}
