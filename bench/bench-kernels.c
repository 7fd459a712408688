/* Kernel benchmark, per backend (the paper's Fig. 12 shape and the issue's
 * bandwidth targets):
 *   1. attention over paged KV (shuffled slots) vs the same data laid out
 *      contiguously, batch 32 sequences, 8 and 1 query tokens each, context
 *      256..4096;
 *   2. decode attention bandwidth (KV bytes read / time) against the
 *      memory's reference: on the CPU backend the host's all-core
 *      STREAM-style read bandwidth, on a device backend (OpenCL, CUDA) the
 *      device's own copy of 1 GiB buffers (bench-device.h); and against the
 *      backend's copy of the same bytes (one thread on the CPU backend);
 *      and single-stream
 *      decode (1 sequence x 1 query token at contexts 2048 and 8192), where
 *      only splitting the context (split-K) keeps every core reading, paged
 *      vs contiguous and against STREAM read, with the CPU's split count;
 *   3. swap gather (shuffled slots -> staging, one call) against the
 *      reference copy (STREAM's on the CPU, the device's own elsewhere), and
 *      the backend's copy of the same bytes;
 *   4. GEMM GFLOP/s through the vtable against OpenBLAS cblas_sgemm called
 *      directly (same shape), and against the GEMM peak: the best
 *      cblas_sgemm rate over square sizes 512..3072, beside the cores'
 *      nominal FMA rate (bench-util.h says how it is computed);
 *   5. with --profile FILE, on the backends that run the portable kernels:
 *      the attention and gather runs above with the backend's default
 *      kernel parameters against the device profile's tuned sets
 *      (pensieve-tune), alternating in the same run;
 *   6. the swap path (bench-swap.h): one layer's swap-in and swap-out of
 *      N chunks as one slot transfer, as a copy a chunk, and as one plain
 *      copy of the same bytes (the reference: on a GPU the pinned
 *      host-device copy), and a layer-pipelined swap-in against its
 *      copies and its attention alone. --section swap runs this section
 *      alone (a quick check of the swap path on a GPU machine).
 * The references are measured per backend in the same run, before and
 * after its kernels, keeping the higher of the two measurements of each
 * rate: on a shared machine either may land in a busy minute.
 * Every figure is a median of at least --reps timed runs after one warm-up
 * (more for short runs); compared pairs run alternately so machine load
 * hits both alike.
 * Bandwidth of a kernel is payload over time: the KV bytes a decode step
 * reads, the bytes a gather or copy moves. A gather or copy also writes each
 * byte, so it is compared with STREAM copy as traffic (2 x payload), the
 * way STREAM counts its copy.
 *
 * "Contiguous" is, on the CPU, K[seq][pos][head][dim] and V likewise, run by
 * pv_cpu_attention_contiguous (the paged kernel's inner loop on plain
 * arrays); on other backends it is the pool with each sequence's chunks in
 * consecutive slots.
 *
 * Usage: bench-kernels [--backend cpu|opencl|cuda|all] [--kv f16|f32]
 *                      [--heads 32] [--kv-heads 8] [--head-dim 128]
 *                      [--max-context 4096] [--reps 5] [--profile FILE]
 *                      [--section all|swap] [--quick] [--json]
 * --quick: the swap section's small sizes (a dry run's).
 * The default shape is one layer of Llama 3 8B (32 heads, 8 KV heads,
 * head_dim 128); SmolLM2-135M is --heads 9 --kv-heads 3 --head-dim 64. */
#include "config.h"

#include "backends/cpu/cpu.h"
#include "bench-device.h"
#include "bench-swap.h"
#include "bench-timing.h"
#include "bench-util.h"

#include <pensieve/half.h>
#include <pensieve/profile.h>

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 32
#define CHUNK 32
#define MAX_REPS BENCH_MAX_REPS
#define GATHER_SLOTS 1024
#define PEAK_SIZES 5

typedef struct options {
    const char *backend;
    pv_dtype kv_dtype;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t max_context;
    int reps;
    int json;
    const char *profile;
    int swap_only; /* --section swap */
    int quick;
} options;

typedef struct attention_row {
    int32_t context, query;
    double paged_ms, contiguous_ms;
} attention_row;

typedef struct bandwidth_row {
    int32_t context;
    double bytes, attention_ms, memcpy_ms;
} bandwidth_row;

/* One sequence, one query token. */
#define SINGLE_CONTEXTS 2
static const int32_t single_contexts[SINGLE_CONTEXTS] = {2048, 8192};

typedef struct single_row {
    int32_t context;
    int32_t splits; /* CPU kernel's context splits; 0 on other backends */
    double bytes, paged_ms, contiguous_ms;
} single_row;

/* One workload with the default kernel parameters and with the profile's. */
typedef struct tuned_row {
    char what[64];
    double default_ms, tuned_ms;
} tuned_row;

#define TUNED_ROWS 8

typedef struct gemm_row {
    int64_t m, n, k;
    double ms, blas_ms; /* through the vtable; cblas_sgemm directly */
} gemm_row;

typedef struct report {
    const char *backend;
    pv_device_info info;
    const char *contiguous_kind;
    attention_row attention[16];
    int n_attention;
    bandwidth_row decode[8];
    int n_decode;
    single_row single[SINGLE_CONTEXTS];
    int n_single;
    int32_t gather_slots;
    double gather_bytes, gather_ms, gather_memcpy_ms;
    gemm_row gemm[4];
    int n_gemm;
    bench_stream mem;                  /* host memory references */
    int on_device;                     /* not the CPU backend: dev is the reference */
    bench_device_copy dev;
    bench_cpu cpu;
    int64_t peak_n[PEAK_SIZES];        /* square sizes tried for the GEMM peak */
    double peak_size_gflops[PEAK_SIZES];
    double blas_peak_gflops;           /* the best of them */
    char tuned_note[256];              /* why there are no tuned rows, or the profile used */
    tuned_row tuned[TUNED_ROWS];
    int n_tuned;
    bench_swap_report swap;
} report;

/* A timed action: returns a status; the backend is finished inside. */
typedef bench_action_fn action_fn;

/* Median wall times of two actions run alternately (a b, b a, a b, ...):
 * bench_time_alternating. */
static pv_status time_pair(action_fn a, void *a_state, action_fn b, void *b_state, int reps, double *a_ms,
                           double *b_ms)
{
    const bench_action_fn fns[2] = {a, b};
    void *const states[2] = {a_state, b_state};
    double ms[2] = {0, 0};
    pv_status st = bench_time_alternating(fns, states, 2, reps, ms);
    *a_ms = ms[0];
    *b_ms = ms[1];
    return st;
}

/* ---- the data: BATCH sequences of max_context tokens ------------------------------ */

typedef struct kv_data {
    const options *opt;
    pv_backend *be;
    size_t elem;
    int64_t row_elems;  /* n_kv_heads * head_dim */
    int64_t slot_elems; /* 2 * CHUNK * row_elems */
    int32_t max_chunks;
    int64_t n_slots;    /* BATCH * max_chunks */
    int32_t *paged_table, *consecutive_table; /* [BATCH][max_chunks] */
    pv_buffer *paged_pool;       /* shuffled slots */
    pv_buffer *consecutive_pool; /* non-CPU backends: chunks in order */
    void *k, *v;                 /* CPU: [BATCH][max_context][n_kv_heads][head_dim] */
    pv_buffer *k_buf, *v_buf;
    pv_buffer *scratch;          /* memcpy / gather destination, pool-sized */
} kv_data;

static void fill_values(void *dst, size_t n, pv_dtype dtype, uint64_t *state)
{
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((int64_t)(*state >> 40) - (1 << 23)) / (float)(1 << 23);
        if (dtype == PV_F32)
            ((float *)dst)[i] = x;
        else
            ((pv_half *)dst)[i] = pv_float_to_half(x);
    }
}

/* Writes one chunk (K rows then V rows, CHUNK x row_elems each) of sequence
 * s into slot `slot` of pool, from the contiguous image when there is one. */
static pv_status write_slot(kv_data *d, pv_buffer *pool, int32_t slot, int32_t s, int32_t chunk, void *tmp,
                            uint64_t *state)
{
    size_t half_bytes = (size_t)(CHUNK * d->row_elems) * d->elem;
    if (d->k) {
        size_t at = ((size_t)s * (size_t)d->opt->max_context + (size_t)chunk * CHUNK) * (size_t)d->row_elems * d->elem;
        memcpy(tmp, (char *)d->k + at, half_bytes);
        memcpy((char *)tmp + half_bytes, (char *)d->v + at, half_bytes);
    } else {
        fill_values(tmp, (size_t)d->slot_elems, d->opt->kv_dtype, state);
    }
    return pv_buffer_write(pool, (uint64_t)slot * (uint64_t)d->slot_elems * d->elem, tmp, 2 * half_bytes);
}

static void kv_data_free(kv_data *d)
{
    free(d->paged_table);
    free(d->consecutive_table);
    pv_buffer_free(d->paged_pool);
    pv_buffer_free(d->consecutive_pool);
    pv_buffer_free(d->k_buf);
    pv_buffer_free(d->v_buf);
    pv_buffer_free(d->scratch);
    memset(d, 0, sizeof *d);
}

static pv_status kv_data_init(kv_data *d, const options *opt, pv_backend *be, int is_cpu)
{
    memset(d, 0, sizeof *d);
    d->opt = opt;
    d->be = be;
    d->elem = pv_dtype_size(opt->kv_dtype);
    d->row_elems = (int64_t)opt->n_kv_heads * opt->head_dim;
    d->slot_elems = 2 * CHUNK * d->row_elems;
    d->max_chunks = (opt->max_context + CHUNK - 1) / CHUNK;
    d->n_slots = (int64_t)BATCH * d->max_chunks;
    uint64_t pool_bytes = (uint64_t)d->n_slots * (uint64_t)d->slot_elems * d->elem;

    d->paged_table = malloc((size_t)d->n_slots * sizeof *d->paged_table);
    d->consecutive_table = malloc((size_t)d->n_slots * sizeof *d->consecutive_table);
    if (!d->paged_table || !d->consecutive_table)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate slot tables of %lld entries",
                        (long long)d->n_slots);
    uint64_t state = 42;
    for (int64_t i = 0; i < d->n_slots; i++) {
        d->paged_table[i] = (int32_t)i;
        d->consecutive_table[i] = (int32_t)i;
    }
    for (int64_t i = d->n_slots; i > 1; i--) { /* shuffle: chunks land anywhere */
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        int64_t j = (int64_t)((state >> 33) % (uint64_t)i);
        int32_t t = d->paged_table[i - 1];
        d->paged_table[i - 1] = d->paged_table[j];
        d->paged_table[j] = t;
    }

    pv_status st = pv_buffer_init(&d->paged_pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&d->scratch, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK && is_cpu) {
        uint64_t contiguous_bytes = (uint64_t)BATCH * (uint64_t)opt->max_context * (uint64_t)d->row_elems * d->elem;
        st = pv_buffer_init(&d->k_buf, be, PV_MEM_DEVICE, contiguous_bytes);
        if (st == PV_OK)
            st = pv_buffer_init(&d->v_buf, be, PV_MEM_DEVICE, contiguous_bytes);
        if (st == PV_OK) {
            d->k = d->k_buf->host_ptr;
            d->v = d->v_buf->host_ptr;
            fill_values(d->k, (size_t)(contiguous_bytes / d->elem), opt->kv_dtype, &state);
            fill_values(d->v, (size_t)(contiguous_bytes / d->elem), opt->kv_dtype, &state);
        }
    } else if (st == PV_OK) {
        st = pv_buffer_init(&d->consecutive_pool, be, PV_MEM_DEVICE, pool_bytes);
    }
    void *tmp = malloc((size_t)d->slot_elems * d->elem);
    if (!tmp && st == PV_OK)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate a slot of %lld elements",
                      (long long)d->slot_elems);
    for (int32_t s = 0; st == PV_OK && s < BATCH; s++)
        for (int32_t c = 0; st == PV_OK && c < d->max_chunks; c++) {
            size_t at = (size_t)s * d->max_chunks + c;
            /* The same seed per chunk makes both pools hold the same data. */
            uint64_t chunk_state = at + 1;
            st = write_slot(d, d->paged_pool, d->paged_table[at], s, c, tmp, &chunk_state);
            chunk_state = at + 1;
            if (st == PV_OK && d->consecutive_pool)
                st = write_slot(d, d->consecutive_pool, d->consecutive_table[at], s, c, tmp, &chunk_state);
        }
    free(tmp);
    return st;
}

/* ---- attention --------------------------------------------------------------------- */

/* The batch runs BATCH sequences of max_context tokens (tables
 * [BATCH][max_chunks]); single-stream decode runs one sequence over the
 * first max_chunks entries of the same tables (shuffled or consecutive
 * slots), and on the CPU over the contiguous arrays read as one sequence of
 * max_tokens. */
typedef struct attention_run {
    kv_data *d;
    int contiguous;
    int32_t n_tokens;
    int32_t *token_seq, *token_pos;
    pv_buffer *q, *out;
    int32_t n_seqs, max_chunks;
    int64_t max_tokens;
} attention_run;

static pv_attention_args paged_args(const attention_run *r)
{
    const options *opt = r->d->opt;
    return (pv_attention_args){
        .kv_dtype = opt->kv_dtype,
        .n_tokens = r->n_tokens,
        .n_heads = opt->n_heads,
        .n_kv_heads = opt->n_kv_heads,
        .head_dim = opt->head_dim,
        .chunk_tokens = CHUNK,
        .scale = 1.0f / sqrtf((float)opt->head_dim),
        .q = r->q,
        .kv_pool = r->contiguous ? r->d->consecutive_pool : r->d->paged_pool,
        .n_slots = r->d->n_slots,
        .token_seq = r->token_seq,
        .token_pos = r->token_pos,
        .slot_table = r->contiguous ? r->d->consecutive_table : r->d->paged_table,
        .n_seqs = r->n_seqs,
        .max_chunks = r->max_chunks,
        .out = r->out,
    };
}

static pv_status run_attention(void *state)
{
    attention_run *r = state;
    const options *opt = r->d->opt;
    float scale = 1.0f / sqrtf((float)opt->head_dim);
    if (r->contiguous && r->d->k) {
        pv_cpu_contiguous_attention_args a = {
            .kv_dtype = opt->kv_dtype,
            .n_tokens = r->n_tokens,
            .n_heads = opt->n_heads,
            .n_kv_heads = opt->n_kv_heads,
            .head_dim = opt->head_dim,
            .scale = scale,
            .q = r->q->host_ptr,
            .k = r->d->k,
            .v = r->d->v,
            .max_tokens = r->max_tokens,
            .token_seq = r->token_seq,
            .token_pos = r->token_pos,
            .out = r->out->host_ptr,
        };
        return pv_cpu_attention_contiguous(&a);
    }
    pv_attention_args a = paged_args(r);
    pv_status st = pv_attention(r->d->be, &a);
    return st == PV_OK ? pv_backend_finish(r->d->be) : st;
}

typedef struct copy_run {
    pv_backend *be;
    pv_buffer *dst, *src;
    uint64_t bytes;
    pv_slot_copy_args gather;
} copy_run;

static pv_status run_memcpy(void *state)
{
    copy_run *r = state;
    pv_status st = pv_copy_async(PV_QUEUE_COMPUTE, r->dst, 0, r->src, 0, r->bytes, NULL, NULL);
    return st == PV_OK ? pv_backend_finish(r->be) : st;
}

static pv_status run_gather(void *state)
{
    copy_run *r = state;
    pv_status st = pv_slot_gather(r->be, &r->gather);
    return st == PV_OK ? pv_backend_finish(r->be) : st;
}

/* Query tokens of the runs: up to BATCH sequences x MAX_QUERY. */
#define MAX_QUERY 8

static void attention_run_free(attention_run *r)
{
    pv_buffer_free(r->q);
    pv_buffer_free(r->out);
    free(r->token_seq);
    free(r->token_pos);
    memset(r, 0, sizeof *r);
}

/* Room for BATCH x MAX_QUERY query tokens, and their q. */
static pv_status attention_run_init(kv_data *d, attention_run *r)
{
    const options *opt = d->opt;
    const int32_t max_tokens = BATCH * MAX_QUERY;
    const uint64_t q_bytes = (uint64_t)max_tokens * opt->n_heads * opt->head_dim * sizeof(float);
    *r = (attention_run){.d = d};
    r->token_seq = malloc((size_t)max_tokens * sizeof *r->token_seq);
    r->token_pos = malloc((size_t)max_tokens * sizeof *r->token_pos);
    float *q_host = malloc((size_t)q_bytes);
    pv_status st = PV_OK;
    if (!r->token_seq || !r->token_pos || !q_host)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate %d query tokens", max_tokens);
    if (st == PV_OK)
        st = pv_buffer_init(&r->q, d->be, PV_MEM_DEVICE, q_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&r->out, d->be, PV_MEM_DEVICE, q_bytes);
    if (st == PV_OK) {
        uint64_t state = 7;
        fill_values(q_host, (size_t)(q_bytes / sizeof(float)), PV_F32, &state);
        st = pv_buffer_write(r->q, 0, q_host, q_bytes);
    }
    free(q_host);
    return st;
}

/* n_seqs sequences of `context` tokens, `query` queries each at the last
 * positions (sequence-major): the batch over the tables' BATCH rows, or one
 * sequence over the tables read as one row of up to BATCH x max_context
 * tokens. */
static void attention_run_shape(attention_run *r, int32_t n_seqs, int32_t query, int32_t context)
{
    r->n_seqs = n_seqs;
    r->n_tokens = n_seqs * query;
    r->max_chunks = n_seqs > 1 ? r->d->max_chunks : (context + CHUNK - 1) / CHUNK;
    r->max_tokens = n_seqs > 1 ? r->d->opt->max_context : context;
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t j = 0; j < query; j++) {
            r->token_seq[s * query + j] = s;
            r->token_pos[s * query + j] = context - query + j;
        }
}

/* Batch of BATCH sequences of `context` tokens, `query` queries each at the
 * last positions (sequence-major). */
static pv_status bench_attention(kv_data *d, report *rep, const int32_t *contexts, int n_contexts)
{
    const options *opt = d->opt;
    static const int32_t queries[2] = {MAX_QUERY, 1};
    attention_run r;
    pv_status st = attention_run_init(d, &r);
    for (int qi = 0; qi < 2 && st == PV_OK; qi++) {
        for (int ci = 0; ci < n_contexts && st == PV_OK; ci++) {
            int32_t query = queries[qi], context = contexts[ci];
            attention_run_shape(&r, BATCH, query, context);
            attention_row *row = &rep->attention[rep->n_attention++];
            row->context = context;
            row->query = query;
            attention_run contiguous = r;
            contiguous.contiguous = 1;
            st = time_pair(run_attention, &r, run_attention, &contiguous, opt->reps, &row->paged_ms,
                           &row->contiguous_ms);
            if (query == 1 && st == PV_OK) {
                /* Decode reads every KV byte of the context once. */
                bandwidth_row *bw = &rep->decode[rep->n_decode++];
                bw->context = context;
                bw->bytes = (double)BATCH * context * (double)d->row_elems * 2.0 * (double)d->elem;
                copy_run c = {.be = d->be, .dst = d->scratch, .src = d->paged_pool, .bytes = (uint64_t)bw->bytes};
                st = time_pair(run_attention, &r, run_memcpy, &c, opt->reps, &bw->attention_ms, &bw->memcpy_ms);
            }
        }
    }
    /* Single-stream decode: the tables hold BATCH x max_context >= 8192
     * tokens, read here as one sequence. */
    for (int ci = 0; ci < SINGLE_CONTEXTS && st == PV_OK; ci++) {
        int32_t context = single_contexts[ci];
        attention_run_shape(&r, 1, 1, context);
        single_row *row = &rep->single[rep->n_single++];
        row->context = context;
        row->bytes = (double)context * (double)d->row_elems * 2.0 * (double)d->elem;
        if (d->k) {
            pv_attention_args a = paged_args(&r);
            st = pv_cpu_attention_split_count(&a, &row->splits);
        }
        attention_run contiguous = r;
        contiguous.contiguous = 1;
        if (st == PV_OK)
            st = time_pair(run_attention, &r, run_attention, &contiguous, opt->reps, &row->paged_ms,
                           &row->contiguous_ms);
    }
    attention_run_free(&r);
    return st;
}

/* Up to GATHER_SLOTS shuffled slots -> staging in one call, vs memcpy of the bytes. */
static pv_status bench_gather(kv_data *d, report *rep)
{
    int32_t n = d->n_slots < GATHER_SLOTS ? (int32_t)d->n_slots : GATHER_SLOTS;
    copy_run c = {
        .be = d->be,
        .dst = d->scratch,
        .src = d->paged_pool,
        .bytes = (uint64_t)n * (uint64_t)d->slot_elems * d->elem,
        .gather = {
            .dtype = d->opt->kv_dtype,
            .slot_elems = d->slot_elems,
            .pool = d->paged_pool,
            .n_slots = d->n_slots,
            .staging = d->scratch,
            .staging_off = 0,
            .slots = d->paged_table, /* a shuffled permutation */
            .n_slots_moved = n,
        },
    };
    rep->gather_slots = n;
    rep->gather_bytes = (double)c.bytes;
    return time_pair(run_gather, &c, run_memcpy, &c, d->opt->reps, &rep->gather_ms, &rep->gather_memcpy_ms);
}

/* ---- default vs tuned kernel parameters ------------------------------------------------- */

/* An action run with the backend's default kernel parameters (tuned 0) or
 * with the profile's sets (tuned 1), switched before each run. */
typedef struct tuned_run {
    pv_backend *be;
    const pv_profile *profile;
    int tuned;
    action_fn fn;
    void *state;
} tuned_run;

static pv_status run_with_sets(void *state)
{
    tuned_run *t = state;
    for (uint32_t i = 0; i < t->profile->n_kernels; i++) {
        const struct pv_profile_kernel *k = &t->profile->kernels[i];
        pv_status st = pv_backend_kernel_set(t->be, k->bucket, t->tuned ? k->params : NULL);
        if (st != PV_OK)
            return st;
    }
    return t->fn(t->state);
}

static pv_status time_tuned(kv_data *d, report *rep, const pv_profile *profile, const char *what, action_fn fn,
                            void *state)
{
    tuned_row *row = &rep->tuned[rep->n_tuned++];
    snprintf(row->what, sizeof row->what, "%s", what);
    tuned_run with_defaults = {d->be, profile, 0, fn, state}, with_profile = {d->be, profile, 1, fn, state};
    return time_pair(run_with_sets, &with_defaults, run_with_sets, &with_profile, d->opt->reps, &row->default_ms,
                     &row->tuned_ms);
}

/* The attention and gather workloads of sections 1-3 both ways, when the
 * backend runs the portable kernels and the profile file has its device. */
static pv_status bench_tuned(kv_data *d, report *rep)
{
    const options *opt = d->opt;
    if (!opt->profile)
        return PV_OK;
    if (!pv_backend_kernels_tunable(d->be)) {
        snprintf(rep->tuned_note, sizeof rep->tuned_note, "the %s backend has no tunable kernels",
                 d->be->ops->name);
        return PV_OK;
    }
    pv_profile *profile = calloc(1, sizeof *profile);
    if (!profile)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench: no memory for the profile");
    pv_status st = pv_profile_load(opt->profile, d->be->ops->name, d->be->info.name, profile);
    if (st == PV_OK && !profile->n_kernels)
        st = pv_error(PV_ERR_NOT_FOUND, "%s: [%s: %s] has no kernel sets", opt->profile, profile->backend,
                      profile->device);
    if (st != PV_OK) {
        snprintf(rep->tuned_note, sizeof rep->tuned_note, "%s", pv_last_error());
        free(profile);
        return st == PV_ERR_NOT_FOUND ? PV_OK : st;
    }
    snprintf(rep->tuned_note, sizeof rep->tuned_note, "%.80s [%s: %.64s], %u kernel sets, tuned on shape %.32s",
             opt->profile, profile->backend, profile->device, profile->n_kernels, profile->shape);
    static const struct {
        int32_t n_seqs, query, context; /* context 0: max_context */
    } shapes[] = {{BATCH, MAX_QUERY, 0}, {BATCH, 1, 512}, {BATCH, 1, 0}, {1, 1, 512}, {1, 1, 2048}, {1, 1, 8192}};
    attention_run r;
    st = attention_run_init(d, &r);
    for (size_t i = 0; st == PV_OK && i < sizeof shapes / sizeof *shapes; i++) {
        const int32_t context = shapes[i].context ? shapes[i].context : opt->max_context;
        if (context > (shapes[i].n_seqs > 1 ? opt->max_context : BATCH * opt->max_context))
            continue;
        attention_run_shape(&r, shapes[i].n_seqs, shapes[i].query, context);
        char what[64];
        snprintf(what, sizeof what, "attention %dx%d at %d", shapes[i].n_seqs, shapes[i].query, context);
        st = time_tuned(d, rep, profile, what, run_attention, &r);
    }
    attention_run_free(&r);
    const int32_t n = d->n_slots < GATHER_SLOTS ? (int32_t)d->n_slots : GATHER_SLOTS;
    copy_run c = {.be = d->be,
                  .gather = {.dtype = opt->kv_dtype, .slot_elems = d->slot_elems, .pool = d->paged_pool,
                             .n_slots = d->n_slots, .staging = d->scratch, .slots = d->paged_table,
                             .n_slots_moved = n}};
    if (st == PV_OK)
        st = time_tuned(d, rep, profile, "swap gather", run_gather, &c);
    free(profile);
    return st;
}

/* ---- GEMM ----------------------------------------------------------------------------- */

typedef struct gemm_run {
    pv_backend *be;
    pv_gemm_args args;
} gemm_run;

static pv_status run_gemm(void *state)
{
    gemm_run *r = state;
    pv_status st = pv_gemm(r->be, &r->args);
    return st == PV_OK ? pv_backend_finish(r->be) : st;
}

/* The same product by OpenBLAS directly on host arrays: the library's rate. */
typedef struct blas_run {
    int64_t m, n, k;
    float *a, *b, *c;
} blas_run;

static pv_status run_blas(void *state)
{
    blas_run *r = state;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)r->m, (blasint)r->n, (blasint)r->k, 1.0f, r->a,
                (blasint)r->k, r->b, (blasint)r->n, 0.0f, r->c, (blasint)r->n);
    return PV_OK;
}

/* The GEMM peak: cblas_sgemm at square sizes, median of reps after a
 * warm-up each, and the best size's rate. One size alone under-states the
 * peak when its blocking or thread split fits the cores badly. Called again
 * later, it keeps the higher rate of each size. */
static pv_status bench_gemm_peak(const options *opt, report *rep)
{
    static const int64_t sizes[PEAK_SIZES] = {512, 1024, 1536, 2048, 3072};
    pv_status st = PV_OK;
    for (int i = 0; i < PEAK_SIZES && st == PV_OK; i++) {
        int64_t n = sizes[i];
        blas_run r = {.m = n, .n = n, .k = n};
        r.a = malloc((size_t)(n * n) * sizeof(float));
        r.b = malloc((size_t)(n * n) * sizeof(float));
        r.c = malloc((size_t)(n * n) * sizeof(float));
        if (!r.a || !r.b || !r.c) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate GEMM peak inputs of %lld^2", (long long)n);
        } else {
            uint64_t state = 5;
            fill_values(r.a, (size_t)(n * n), PV_F32, &state);
            fill_values(r.b, (size_t)(n * n), PV_F32, &state);
            double t[MAX_REPS];
            run_blas(&r);
            for (int k = 0; k < opt->reps; k++) {
                double t0 = bench_now_s();
                run_blas(&r);
                t[k] = bench_now_s() - t0;
            }
            double rate = 2.0 * (double)n * (double)n * (double)n / bench_median(t, opt->reps) / 1e9;
            rep->peak_n[i] = n;
            if (rate > rep->peak_size_gflops[i])
                rep->peak_size_gflops[i] = rate;
            if (rep->peak_size_gflops[i] > rep->blas_peak_gflops)
                rep->blas_peak_gflops = rep->peak_size_gflops[i];
        }
        free(r.a);
        free(r.b);
        free(r.c);
    }
    return st;
}

/* Each shape through the vtable, timed alternately with cblas_sgemm of the
 * same shape. */
static pv_status bench_gemm(pv_backend *be, const options *opt, report *rep)
{
    /* A large square one, a layer's projection for a 256-token batch, and a
     * mid-size square one. */
    static const int64_t shapes[][3] = {{2048, 2048, 2048}, {256, 4096, 4096}, {1024, 1024, 1024}};
    pv_status st = PV_OK;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && st == PV_OK; i++) {
        int64_t m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        gemm_run r = {.be = be};
        blas_run direct = {.m = m, .n = n, .k = k};
        pv_buffer *a = NULL, *b = NULL, *c = NULL;
        direct.a = malloc((size_t)(m * k) * sizeof(float));
        direct.b = malloc((size_t)(k * n) * sizeof(float));
        direct.c = malloc((size_t)(m * n) * sizeof(float));
        if (!direct.a || !direct.b || !direct.c)
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate GEMM inputs %lld x %lld x %lld", (long long)m,
                          (long long)n, (long long)k);
        if (st == PV_OK)
            st = pv_buffer_init(&a, be, PV_MEM_DEVICE, (uint64_t)(m * k) * sizeof(float));
        if (st == PV_OK)
            st = pv_buffer_init(&b, be, PV_MEM_DEVICE, (uint64_t)(k * n) * sizeof(float));
        if (st == PV_OK)
            st = pv_buffer_init(&c, be, PV_MEM_DEVICE, (uint64_t)(m * n) * sizeof(float));
        uint64_t state = 3;
        if (st == PV_OK) {
            fill_values(direct.a, (size_t)(m * k), PV_F32, &state);
            fill_values(direct.b, (size_t)(k * n), PV_F32, &state);
            st = pv_buffer_write(a, 0, direct.a, (uint64_t)(m * k) * sizeof(float));
        }
        if (st == PV_OK)
            st = pv_buffer_write(b, 0, direct.b, (uint64_t)(k * n) * sizeof(float));
        if (st == PV_OK) {
            r.args = (pv_gemm_args){.dtype = PV_F32, .m = m, .n = n, .k = k, .alpha = 1.0f, .beta = 0.0f,
                                    .a = a, .lda = k, .b = b, .ldb = n, .c = c, .ldc = n};
            gemm_row *row = &rep->gemm[rep->n_gemm++];
            row->m = m;
            row->n = n;
            row->k = k;
            st = time_pair(run_gemm, &r, run_blas, &direct, opt->reps, &row->ms, &row->blas_ms);
        }
        pv_buffer_free(a);
        pv_buffer_free(b);
        pv_buffer_free(c);
        free(direct.a);
        free(direct.b);
        free(direct.c);
    }
    return st;
}

/* ---- output ---------------------------------------------------------------------------------- */

static double gbps(double bytes, double ms)
{
    return bytes / (ms * 1e-3) / 1e9;
}

static double gflops(int64_t m, int64_t n, int64_t k, double ms)
{
    return 2.0 * (double)m * (double)n * (double)k / (ms * 1e-3) / 1e9;
}

/* The memory reference of a backend: STREAM's read and copy on the CPU,
 * the device's own copy on a device (which counts read + write as STREAM's
 * copy does, so one figure serves both). */
static double ref_read(const report *rep)
{
    return rep->on_device ? rep->dev.copy.best : rep->mem.read.best;
}

static double ref_copy(const report *rep)
{
    return rep->on_device ? rep->dev.copy.best : rep->mem.copy.best;
}

static const char *ref_key(const report *rep)
{
    return rep->on_device ? "device_copy" : "stream_read";
}

static void print_table(const report *rep, const options *opt)
{
    printf("\n== backend %s: %s (%s), %u compute units ==\n", rep->backend, rep->info.name, rep->info.vendor,
           rep->info.compute_units);
    if (opt->swap_only) {
        printf("shape: kv heads %d, head_dim %d, chunk %d, KV %s\n", opt->n_kv_heads, opt->head_dim, CHUNK,
               pv_dtype_name(opt->kv_dtype));
        bench_swap_print(&rep->swap);
        return;
    }
    bench_cpu_print(&rep->cpu);
    bench_stream_print(&rep->mem);
    if (rep->on_device)
        bench_device_copy_print(&rep->dev);
    printf("shape: batch %d, heads %d, kv heads %d, head_dim %d, chunk %d, KV %s, median of %d runs\n", BATCH,
           opt->n_heads, opt->n_kv_heads, opt->head_dim, CHUNK, pv_dtype_name(opt->kv_dtype), opt->reps);
    printf("\nattention: paged (shuffled slots) vs contiguous (%s)\n", rep->contiguous_kind);
    printf("%8s %6s %12s %14s %12s\n", "context", "query", "paged ms", "contiguous ms", "paged/contig");
    for (int i = 0; i < rep->n_attention; i++) {
        const attention_row *r = &rep->attention[i];
        printf("%8d %6d %12.3f %14.3f %12.3f\n", r->context, r->query, r->paged_ms, r->contiguous_ms,
               r->paged_ms / r->contiguous_ms);
    }
    const char *ref_name = rep->on_device ? "the device's own copy" : "the host's all-core STREAM read";
    printf("\ndecode attention bandwidth (KV bytes read / time) vs %s (best, %.2f GB/s)\n"
           "and vs the backend's copy of the same bytes (bytes / time; one thread on the CPU backend)\n",
           ref_name, ref_read(rep));
    printf("%8s %10s %12s %12s %10s %12s %8s\n", "context", "MiB", "attn ms", "attn GB/s", "of ref", "copy GB/s",
           "of copy");
    for (int i = 0; i < rep->n_decode; i++) {
        const bandwidth_row *r = &rep->decode[i];
        double attn = gbps(r->bytes, r->attention_ms), copy = gbps(r->bytes, r->memcpy_ms);
        printf("%8d %10.1f %12.3f %12.2f %10.2f %12.2f %8.2f\n", r->context, r->bytes / (1 << 20), r->attention_ms,
               attn, attn / ref_read(rep), copy, attn / copy);
    }
    printf("\nsingle-stream decode (1 sequence x 1 query token): KV bytes read / time vs %s\n"
           "(best, %.2f GB/s); splits: the CPU kernel's context splits (split-K)\n",
           ref_name, ref_read(rep));
    printf("%8s %8s %7s %10s %14s %12s %11s %8s\n", "context", "MiB", "splits", "paged ms", "contiguous ms",
           "paged/contig", "paged GB/s", "of ref");
    for (int i = 0; i < rep->n_single; i++) {
        const single_row *r = &rep->single[i];
        double attn = gbps(r->bytes, r->paged_ms);
        printf("%8d %8.1f %7d %10.3f %14.3f %12.3f %11.2f %8.2f\n", r->context, r->bytes / (1 << 20), r->splits,
               r->paged_ms, r->contiguous_ms, r->paged_ms / r->contiguous_ms, attn, attn / ref_read(rep));
    }
    double gather = gbps(rep->gather_bytes, rep->gather_ms);
    double gather_copy = gbps(rep->gather_bytes, rep->gather_memcpy_ms);
    printf("\nswap gather: %d shuffled slots, %.1f MiB, one call; traffic (2 x bytes) vs %s\n"
           "(best, %.2f GB/s), and payload vs the backend's copy of the same bytes\n",
           rep->gather_slots, rep->gather_bytes / (1 << 20),
           rep->on_device ? "the device's own copy" : "the host's all-core STREAM copy", ref_copy(rep));
    printf("%12s %12s %14s %10s %12s %8s\n", "gather ms", "gather GB/s", "traffic GB/s", "of copy", "copy GB/s",
           "of copy");
    printf("%12.3f %12.2f %14.2f %10.2f %12.2f %8.2f\n", rep->gather_ms, gather, 2 * gather,
           2 * gather / ref_copy(rep), gather_copy, gather / gather_copy);
    double peak = rep->blas_peak_gflops;
    printf("\nGEMM peak: cblas_sgemm, best of square sizes:");
    for (int i = 0; i < PEAK_SIZES; i++)
        printf(" %lld^3 %.1f", (long long)rep->peak_n[i], rep->peak_size_gflops[i]);
    printf(" -> %.1f GFLOP/s", peak);
    if (rep->cpu.peak_gflops > 0)
        printf(" (%.2f of the nominal FMA peak, %.1f)", peak / rep->cpu.peak_gflops, rep->cpu.peak_gflops);
    printf("\nGEMM f32 through the vtable vs cblas_sgemm called directly (same shape, alternating runs)\n");
    printf("%6s %6s %6s %10s %10s %12s %8s %8s\n", "m", "n", "k", "ms", "GFLOP/s", "BLAS GFLOP/s", "of BLAS",
           "of peak");
    for (int i = 0; i < rep->n_gemm; i++) {
        const gemm_row *r = &rep->gemm[i];
        double g = gflops(r->m, r->n, r->k, r->ms), blas = gflops(r->m, r->n, r->k, r->blas_ms);
        printf("%6lld %6lld %6lld %10.3f %10.1f %12.1f %8.2f %8.2f\n", (long long)r->m, (long long)r->n,
               (long long)r->k, r->ms, g, blas, g / blas, g / peak);
    }
    bench_swap_print(&rep->swap);
    if (!opt->profile)
        return;
    printf("\nkernel parameters: the backend's defaults vs the profile's (%s), alternating runs\n", rep->tuned_note);
    if (rep->n_tuned)
        printf("%-28s %12s %12s %9s\n", "workload", "default ms", "tuned ms", "speedup");
    for (int i = 0; i < rep->n_tuned; i++)
        printf("%-28s %12.3f %12.3f %8.2fx\n", rep->tuned[i].what, rep->tuned[i].default_ms, rep->tuned[i].tuned_ms,
               rep->tuned[i].default_ms / rep->tuned[i].tuned_ms);
}

static void print_json(const report *reps, int n_reports, const options *opt)
{
    printf("{\"batch\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"chunk_tokens\": %d, \"kv_dtype\": \"%s\", "
           "\"reps\": %d, \"backends\": [",
           BATCH, opt->n_heads, opt->n_kv_heads, opt->head_dim, CHUNK, pv_dtype_name(opt->kv_dtype), opt->reps);
    for (int b = 0; b < n_reports; b++) {
        const report *rep = &reps[b];
        printf("%s\n  {\"backend\": \"%s\", \"device\": \"%s\",\n   \"swap\": ", b ? "," : "", rep->backend,
               rep->info.name);
        bench_swap_json(&rep->swap);
        if (opt->swap_only) {
            printf("}");
            continue;
        }
        printf(",\n   \"contiguous\": \"%s\",\n   \"cpu\": ", rep->contiguous_kind);
        bench_cpu_json(&rep->cpu);
        printf(",\n   \"stream\": ");
        bench_stream_json(&rep->mem);
        if (rep->on_device) {
            printf(",\n   \"device_copy\": ");
            bench_device_copy_json(&rep->dev);
        }
        printf(",\n   \"attention\": [");
        for (int i = 0; i < rep->n_attention; i++) {
            const attention_row *r = &rep->attention[i];
            printf("%s{\"context\": %d, \"query\": %d, \"paged_ms\": %.4f, \"contiguous_ms\": %.4f}", i ? ", " : "",
                   r->context, r->query, r->paged_ms, r->contiguous_ms);
        }
        printf("],\n   \"decode_bandwidth\": [");
        for (int i = 0; i < rep->n_decode; i++) {
            const bandwidth_row *r = &rep->decode[i];
            printf("%s{\"context\": %d, \"bytes\": %.0f, \"attention_gbps\": %.3f, \"of_%s\": %.4f, "
                   "\"memcpy_gbps\": %.3f}",
                   i ? ", " : "", r->context, r->bytes, gbps(r->bytes, r->attention_ms), ref_key(rep),
                   gbps(r->bytes, r->attention_ms) / ref_read(rep), gbps(r->bytes, r->memcpy_ms));
        }
        printf("],\n   \"single_stream_decode\": [");
        for (int i = 0; i < rep->n_single; i++) {
            const single_row *r = &rep->single[i];
            printf("%s{\"context\": %d, \"bytes\": %.0f, \"splits\": %d, \"paged_ms\": %.4f, "
                   "\"contiguous_ms\": %.4f, \"attention_gbps\": %.3f, \"of_%s\": %.4f}",
                   i ? ", " : "", r->context, r->bytes, r->splits, r->paged_ms, r->contiguous_ms,
                   gbps(r->bytes, r->paged_ms), ref_key(rep), gbps(r->bytes, r->paged_ms) / ref_read(rep));
        }
        double gather = gbps(rep->gather_bytes, rep->gather_ms);
        printf("],\n   \"gather\": {\"slots\": %d, \"bytes\": %.0f, \"gather_gbps\": %.3f, "
               "\"traffic_of_%s\": %.4f, \"memcpy_gbps\": %.3f},\n",
               rep->gather_slots, rep->gather_bytes, gather, rep->on_device ? "device_copy" : "stream_copy",
               2 * gather / ref_copy(rep), gbps(rep->gather_bytes, rep->gather_memcpy_ms));
        printf("   \"gemm_peak\": {\"sizes\": [");
        for (int i = 0; i < PEAK_SIZES; i++)
            printf("%s{\"n\": %lld, \"gflops\": %.2f}", i ? ", " : "", (long long)rep->peak_n[i],
                   rep->peak_size_gflops[i]);
        printf("], \"best_gflops\": %.2f},\n   \"tuned\": [", rep->blas_peak_gflops);
        for (int i = 0; i < rep->n_tuned; i++)
            printf("%s{\"workload\": \"%s\", \"default_ms\": %.4f, \"tuned_ms\": %.4f, \"speedup\": %.4f}",
                   i ? ", " : "", rep->tuned[i].what, rep->tuned[i].default_ms, rep->tuned[i].tuned_ms,
                   rep->tuned[i].default_ms / rep->tuned[i].tuned_ms);
        printf("],\n   \"gemm\": [");
        for (int i = 0; i < rep->n_gemm; i++) {
            const gemm_row *r = &rep->gemm[i];
            printf("%s{\"m\": %lld, \"n\": %lld, \"k\": %lld, \"gflops\": %.2f, \"blas_gflops\": %.2f, "
                   "\"of_peak\": %.4f}",
                   i ? ", " : "", (long long)r->m, (long long)r->n, (long long)r->k, gflops(r->m, r->n, r->k, r->ms),
                   gflops(r->m, r->n, r->k, r->blas_ms), gflops(r->m, r->n, r->k, r->ms) / rep->blas_peak_gflops);
        }
        printf("]}");
    }
    printf("\n]}\n");
}

static pv_status bench_backend(const char *name, const options *opt, report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->backend = name;
    pv_backend *be = NULL;
    pv_status st = pv_backend_init(&be, name, 0);
    if (st != PV_OK)
        return st;
    rep->info = be->info;
    const bench_swap_options swap = {.kv_dtype = opt->kv_dtype, .n_heads = opt->n_heads, .n_kv_heads = opt->n_kv_heads,
                                     .head_dim = opt->head_dim, .chunk_tokens = CHUNK, .reps = opt->reps,
                                     .quick = opt->quick};
    if (opt->swap_only) {
        st = bench_swap_run(be, &swap, &rep->swap);
        pv_backend_free(be);
        return st;
    }
    /* The references, measured again after the kernels. */
    bench_cpu_detect(&rep->cpu);
    if (bench_stream_measure(&rep->mem, 10) != 0) {
        pv_backend_free(be);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench: cannot allocate the STREAM arrays");
    }
    st = bench_gemm_peak(opt, rep);
    int is_cpu = strcmp(name, "cpu") == 0;
    rep->on_device = !is_cpu;
    if (st == PV_OK && rep->on_device)
        st = bench_device_copy_measure(be, 10, &rep->dev);
    if (st != PV_OK) {
        pv_backend_free(be);
        return st;
    }
    rep->contiguous_kind = is_cpu ? "K/V arrays [seq][pos][head][dim]" : "consecutive slots";
    int32_t contexts[8];
    int n_contexts = 0;
    for (int32_t c = 256; c <= opt->max_context && n_contexts < 8; c *= 2)
        contexts[n_contexts++] = c;
    kv_data d;
    st = kv_data_init(&d, opt, be, is_cpu);
    if (st == PV_OK)
        st = bench_attention(&d, rep, contexts, n_contexts);
    if (st == PV_OK)
        st = bench_gather(&d, rep);
    if (st == PV_OK)
        st = bench_tuned(&d, rep);
    kv_data_free(&d);
    if (st == PV_OK)
        st = bench_gemm(be, opt, rep);
    if (st == PV_OK)
        st = bench_swap_run(be, &swap, &rep->swap);
    bench_device_copy again;
    if (st == PV_OK && rep->on_device && (st = bench_device_copy_measure(be, 10, &again)) == PV_OK)
        bench_device_copy_merge(&rep->dev, &again);
    pv_backend_free(be);
    bench_stream after;
    if (st == PV_OK && bench_stream_measure(&after, 10) == 0)
        bench_stream_merge(&rep->mem, &after);
    if (st == PV_OK)
        st = bench_gemm_peak(opt, rep);
    return st;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--backend cpu|opencl|cuda|all] [--kv f16|f32] [--heads N] [--kv-heads N]\n"
            "          [--head-dim N] [--max-context N] [--reps N] [--profile FILE] [--section all|swap]\n"
            "          [--quick] [--json]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    options opt = {.backend = "all", .kv_dtype = PV_F16, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128,
                   .max_context = 4096, .reps = 5};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--json") == 0)
            opt.json = 1;
        else if (strcmp(arg, "--quick") == 0)
            opt.quick = 1;
        else if (!value)
            return usage(argv[0]);
        else if (strcmp(arg, "--backend") == 0)
            opt.backend = argv[++i];
        else if (strcmp(arg, "--kv") == 0 && (strcmp(value, "f16") == 0 || strcmp(value, "f32") == 0))
            opt.kv_dtype = strcmp(argv[++i], "f16") == 0 ? PV_F16 : PV_F32;
        else if (strcmp(arg, "--heads") == 0)
            opt.n_heads = atoi(argv[++i]);
        else if (strcmp(arg, "--kv-heads") == 0)
            opt.n_kv_heads = atoi(argv[++i]);
        else if (strcmp(arg, "--head-dim") == 0)
            opt.head_dim = atoi(argv[++i]);
        else if (strcmp(arg, "--max-context") == 0)
            opt.max_context = atoi(argv[++i]);
        else if (strcmp(arg, "--reps") == 0)
            opt.reps = atoi(argv[++i]);
        else if (strcmp(arg, "--profile") == 0)
            opt.profile = argv[++i];
        else if (strcmp(arg, "--section") == 0 && (strcmp(value, "all") == 0 || strcmp(value, "swap") == 0))
            opt.swap_only = strcmp(argv[++i], "swap") == 0;
        else
            return usage(argv[0]);
    }
    if (opt.reps < 1 || opt.reps > MAX_REPS || opt.max_context < 256 || opt.n_heads < 1 || opt.n_kv_heads < 1 ||
        opt.n_heads % opt.n_kv_heads != 0 || !pv_attention_head_dim_supported(opt.head_dim)) {
        fprintf(stderr, "bench-kernels: need 1 <= reps <= %d, max-context >= 256, heads a multiple of kv-heads, "
                        "head-dim a multiple of 16 up to 256\n", MAX_REPS);
        return 2;
    }

    report reports[4];
    int n_reports = 0, failed = 0;
    for (const char *const *name = pv_backend_names(); *name; name++) {
        if (strcmp(opt.backend, "all") != 0 && strcmp(opt.backend, *name) != 0)
            continue;
        pv_status st = bench_backend(*name, &opt, &reports[n_reports]);
        if (st == PV_OK) {
            if (!opt.json)
                print_table(&reports[n_reports], &opt);
            n_reports++;
        } else {
            fprintf(stderr, "bench-kernels: backend %s: %s\n", *name, pv_last_error());
            failed |= st != PV_ERR_NO_DEVICE;
        }
    }
    if (opt.json)
        print_json(reports, n_reports, &opt);
    if (n_reports == 0 && strcmp(opt.backend, "all") != 0)
        fprintf(stderr, "bench-kernels: backend '%s' did not run\n", opt.backend);
    return failed || n_reports == 0 ? 1 : 0;
}
