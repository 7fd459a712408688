/* pensieve-tune's timings (tune.h). */
#include "tuning/tune.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double tune_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tune_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, by_value);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Median and interquartile spread of n times (sorted in place). */
static tune_timing summarise(double *t, int n)
{
    const double median = tune_median(t, n);
    const double q1 = t[n / 4], q3 = t[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1];
    return (tune_timing){median, median > 0 ? (q3 - q1) / median : 0};
}

pv_status tune_time_runs(const tune_setup *s, pv_status (*fn)(const tune_setup *s, void *ctx), void *ctx,
                         tune_timing *out)
{
    double *t = malloc((size_t)s->repeats * sizeof *t);
    if (!t)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %d repeats", s->repeats);
    pv_status st = PV_OK;
    for (int i = 0; st == PV_OK && i < s->warmup + s->repeats; i++) {
        const double t0 = tune_now_s();
        st = fn(s, ctx);
        if (st == PV_OK)
            st = pv_backend_finish(s->be);
        if (i >= s->warmup)
            t[i - s->warmup] = tune_now_s() - t0;
    }
    if (st == PV_OK)
        *out = summarise(t, s->repeats);
    free(t);
    return st;
}

typedef struct attention_run {
    pv_attention_args args;
} attention_run;

static pv_status run_attention(const tune_setup *s, void *ctx)
{
    return pv_attention(s->be, &((attention_run *)ctx)->args);
}

/* Buffer of n floats of small random values (the kernels' times do not
 * depend on them; NaN-free input keeps the softmax on its common path). */
static pv_status random_buffer(pv_backend *be, uint64_t n, pv_buffer **out)
{
    float *host = malloc((size_t)n * sizeof *host);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %llu floats", (unsigned long long)n);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((double)(state >> 40) / 16777216.0 - 0.5);
    }
    pv_status st = pv_buffer_init(out, be, PV_MEM_DEVICE, n * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_write(*out, 0, host, n * sizeof(float));
    free(host);
    return st;
}

/* A pool of zeros: every K and V finite, whatever the dtype. */
static pv_status zero_buffer(pv_backend *be, uint64_t bytes, pv_buffer **out)
{
    void *host = calloc(1, (size_t)bytes);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: a pool of %llu bytes", (unsigned long long)bytes);
    pv_status st = pv_buffer_init(out, be, PV_MEM_DEVICE, bytes);
    if (st == PV_OK)
        st = pv_buffer_write(*out, 0, host, bytes);
    free(host);
    return st;
}

pv_status tune_attention(const tune_setup *s, int64_t context, tune_timing *out)
{
    const int32_t T = s->chunk_tokens;
    const int64_t n_chunks = (context + T + T - 1) / T;
    if (n_chunks > INT32_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: context %lld is too long", (long long)context);
    const uint64_t row = (uint64_t)s->n_kv_heads * (uint64_t)s->head_dim;
    const uint64_t slot_bytes = 2 * (uint64_t)T * row * pv_dtype_size(s->kv_dtype);
    const uint64_t q_elems = (uint64_t)T * (uint64_t)s->n_heads * (uint64_t)s->head_dim;
    int32_t *slot_table = malloc((size_t)n_chunks * sizeof *slot_table);
    int32_t *seq = calloc((size_t)T, sizeof *seq), *pos = malloc((size_t)T * sizeof *pos);
    pv_buffer *pool = NULL, *q = NULL, *o = NULL;
    pv_status st = slot_table && seq && pos ? PV_OK : pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: tables");
    if (st == PV_OK)
        st = zero_buffer(s->be, (uint64_t)n_chunks * slot_bytes, &pool);
    if (st == PV_OK)
        st = random_buffer(s->be, q_elems, &q);
    if (st == PV_OK)
        st = pv_buffer_init(&o, s->be, PV_MEM_DEVICE, q_elems * sizeof(float));
    if (st == PV_OK) {
        /* Slots in reverse order: a conversation's chunks are rarely
         * adjacent in the pool, and the kernels must not gain from it. */
        for (int64_t c = 0; c < n_chunks; c++)
            slot_table[c] = (int32_t)(n_chunks - 1 - c);
        for (int32_t i = 0; i < T; i++)
            pos[i] = (int32_t)(context + i);
        attention_run run = {.args = {
                                 .kv_dtype = s->kv_dtype, .n_tokens = T, .n_heads = s->n_heads,
                                 .n_kv_heads = s->n_kv_heads, .head_dim = s->head_dim, .chunk_tokens = T,
                                 .scale = 1.0f / sqrtf((float)s->head_dim), .q = q, .kv_pool = pool,
                                 .n_slots = n_chunks, .token_seq = seq, .token_pos = pos,
                                 .slot_table = slot_table, .n_seqs = 1, .max_chunks = (int32_t)n_chunks, .out = o,
                             }};
        st = tune_time_runs(s, run_attention, &run, out);
    }
    pv_buffer_free(pool);
    pv_buffer_free(q);
    pv_buffer_free(o);
    free(slot_table);
    free(seq);
    free(pos);
    return st;
}

typedef struct forward_run {
    pv_llama_batch batch;
} forward_run;

static pv_status run_forward(const tune_setup *s, void *ctx)
{
    return pv_llama_forward(s->model, &((forward_run *)ctx)->batch);
}

pv_status tune_forward_per_layer(const tune_setup *s, tune_timing *out)
{
    const int32_t T = s->chunk_tokens;
    const pv_llama_hparams *hp = pv_llama_hparams_of(s->model);
    int32_t *tokens = malloc((size_t)T * sizeof *tokens), *seq = calloc((size_t)T, sizeof *seq);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    int32_t *tables = malloc((size_t)s->n_layers * sizeof *tables);
    pv_buffer *pool = NULL;
    pv_status st = tokens && seq && pos && tables ? PV_OK
                                                  : pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: batch");
    if (st == PV_OK)
        st = pv_buffer_init(&pool, s->be, PV_MEM_DEVICE, (uint64_t)s->n_layers * pv_llama_slot_bytes(s->model));
    if (st == PV_OK) {
        for (int32_t i = 0; i < T; i++) {
            tokens[i] = (int32_t)((1000u + 7u * (uint32_t)i) % hp->n_vocab);
            pos[i] = i;
        }
        for (int32_t l = 0; l < s->n_layers; l++)
            tables[l] = l; /* one chunk per layer, a slot each */
        forward_run run = {.batch = {.n_tokens = T, .tokens = tokens, .token_seq = seq, .token_pos = pos,
                                     .n_seqs = 1, .max_chunks = 1, .slot_tables = tables, .kv_pool = pool,
                                     .n_slots = s->n_layers}};
        st = tune_time_runs(s, run_forward, &run, out);
        if (st == PV_OK)
            out->median /= s->n_layers;
    }
    pv_buffer_free(pool);
    free(tokens);
    free(seq);
    free(pos);
    free(tables);
    return st;
}
