/* pensieve-tune's kernel search (tune.h): for each shape bucket of the
 * model's calls, every candidate parameter set of the bucket's family runs
 * one workload, its result is compared with the CPU backend's result of
 * the same workload, and the correct candidates are timed; the fastest
 * becomes the bucket's set. qmatmul's parameters are searched in two
 * stages (tune_in_stage), as each changes one kind of its products: the
 * decode kernels' parameters on the decode products at the default
 * PV_GEMM, then each PV_GEMM on the prefill product with the fastest of
 * those; on CUDA 48 + 4 candidates rather than their cross product's 192. */
#include "tuning/tune.h"

#include <pensieve/gguf.h>
#include <pensieve/half.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Error limits against the CPU backend, relative to the largest output:
 * f32 arithmetic in another order stays near 1e-6 (1e-5 for the sums of a
 * long context's attention); a wrong kernel is off by the outputs' own
 * size. The copies must be exact. */
#define ATTENTION_LIMIT 1e-4
#define ARITHMETIC_LIMIT 1e-4
/* qmatmul with a PV_GEMM that rounds its inputs (f16, bf16, TF32: 8 to
 * 11 significant bits) is off by some 1e-3; a wrong kernel still by the
 * outputs' size. */
#define REDUCED_LIMIT 1e-2
/* qmatmul's prefill product: a whole prefill batch (pv_llama_options'
 * default max_batch_tokens), where the GEMM's precision decides its speed;
 * the second stage runs it alone. */
#define QMATMUL_BATCH_TOKENS 512
/* Its decode products, which the first stage runs alone: one token's
 * product this many times, as decode steps follow a prefill (once, and
 * timed with the prefill product, its few microseconds on a GPU were a
 * few percent of the pass, within the timing's spread, so the decode
 * kernels' parameters, PV_ACT16 and PV_QMV_ROWS, were kept by chance)... */
#define QMATMUL_DECODE_STEPS 64
/* ... and a serving step's product, the decode of that many conversations
 * at once, this many times: the batched kernels (PV_QMV_LANES) weigh in
 * too, at some of a GPU's one-token products' time together. */
#define QMATMUL_BATCH_DECODE 8
#define QMATMUL_BATCH_STEPS 16
#define DECODE_STEPS_TEXT "64 one-token products, 16 of 8 tokens" /* the two above, for the workload's name */

#define MAX_BUFFERS 8

/* The KV pool the attention and gather workloads read: larger than the
 * last-level caches (32 MiB of L3 on the 2-core EPYC, 50 MiB of L2 on an
 * H100), with the chunks read spread over it, as a serving pool holds many
 * conversations. A pool that fits in cache times the kernels' arithmetic,
 * not their memory traffic, and picks other parameters. */
#define POOL_BYTES ((uint64_t)64 << 20)

/* One workload: what it runs, on which shape, with which inputs. */
typedef struct workload {
    tune_family family;
    char what[96];
    int32_t n_tokens;   /* attention's query tokens, the others' rows */
    int64_t context;    /* attention: tokens before the first query */
    uint64_t seed;
} workload;

/* Its buffers on one backend. */
typedef struct workload_buffers {
    pv_backend *be;
    pv_buffer *buf[MAX_BUFFERS];
    int n;
    pv_buffer *out[4]; /* the results, read back in order */
    uint64_t out_bytes[4];
    tune_products out_products[4]; /* the products that write each */
    int n_out;
    /* host index arrays the ops read */
    int32_t *seq, *pos, *slot_table, *slots;
    int64_t n_chunks;
    int32_t n_moved;
} workload_buffers;

static void buffers_free(workload_buffers *b)
{
    for (int i = 0; i < b->n; i++)
        pv_buffer_free(b->buf[i]);
    free(b->seq);
    free(b->pos);
    free(b->slot_table);
    free(b->slots);
    memset(b, 0, sizeof *b);
}

static uint64_t next_random(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

/* n elements of dtype at host, uniform in [-1, 1), from *state. */
static void fill_random(void *host, pv_dtype dtype, uint64_t n, uint64_t *state)
{
    for (uint64_t i = 0; i < n; i++) {
        const float x = (float)next_random(state) / 2147483648.0f * 2.0f - 1.0f;
        if (dtype == PV_F32)
            ((float *)host)[i] = x;
        else
            ((pv_half *)host)[i] = pv_float_to_half(x);
    }
}

/* A buffer of n random elements of dtype (fill_random). */
static pv_status random_buffer(workload_buffers *b, pv_dtype dtype, uint64_t n, uint64_t *state, pv_buffer **out)
{
    const size_t size = pv_dtype_size(dtype);
    void *host = malloc((size_t)n * size);
    if (!host)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %llu elements of input", (unsigned long long)n);
    fill_random(host, dtype, n, state);
    pv_status st = pv_buffer_init(out, b->be, PV_MEM_DEVICE, n * size);
    if (st == PV_OK) {
        b->buf[b->n++] = *out;
        st = pv_buffer_write(*out, 0, host, n * size);
    }
    free(host);
    return st;
}

/* n_out x n_in weights of type t (pv_weights_write's layout for b's
 * backend) from random values in [-1, 1). */
static pv_status random_weights(workload_buffers *b, pv_wtype t, uint64_t n_out, uint64_t n_in, uint64_t *state,
                                pv_buffer **out)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    const uint64_t n = n_out * n_in, bytes = n / block_elems * block_bytes;
    float *values = malloc((size_t)n * sizeof *values);
    void *coded = malloc((size_t)bytes);
    pv_status st = values && coded ? PV_OK
                                   : pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %llu weights",
                                              (unsigned long long)n);
    if (st == PV_OK) {
        fill_random(values, PV_F32, n, state);
        st = pv_ggml_quantize((uint32_t)t, values, n, coded, bytes);
    }
    if (st == PV_OK && (st = pv_buffer_init(out, b->be, PV_MEM_DEVICE, bytes)) == PV_OK) {
        b->buf[b->n++] = *out;
        st = pv_weights_write(*out, 0, t, (int64_t)n_out, (int64_t)n_in, coded);
    }
    free(values);
    free(coded);
    return st;
}

/* A pool of n_slots slots of slot_elems elements of dtype, POOL_BYTES at
 * least; only the n_used slots listed get values (random, from *state). */
static pv_status pool_buffer(workload_buffers *b, pv_dtype dtype, uint64_t slot_elems, int64_t n_slots,
                             const int32_t *used, int64_t n_used, uint64_t *state, pv_buffer **out)
{
    const size_t size = pv_dtype_size(dtype);
    void *slot = malloc((size_t)slot_elems * size);
    if (!slot)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: a slot of %llu elements",
                        (unsigned long long)slot_elems);
    pv_status st = pv_buffer_init(out, b->be, PV_MEM_DEVICE, (uint64_t)n_slots * slot_elems * size);
    if (st == PV_OK)
        b->buf[b->n++] = *out;
    for (int64_t i = 0; st == PV_OK && i < n_used; i++) {
        fill_random(slot, dtype, slot_elems, state);
        st = pv_buffer_write(*out, (uint64_t)used[i] * slot_elems * size, slot, slot_elems * size);
    }
    free(slot);
    return st;
}

/* Slots in a pool of at least POOL_BYTES for at least `needed` of them. */
static int64_t pool_slots(uint64_t slot_bytes, int64_t needed)
{
    const int64_t fill = (int64_t)((POOL_BYTES + slot_bytes - 1) / slot_bytes);
    return fill > needed ? fill : needed;
}

/* An output of `bytes`, written by `products`. */
static pv_status output_buffer(workload_buffers *b, uint64_t bytes, tune_products products, pv_buffer **out)
{
    pv_status st = pv_buffer_init(out, b->be, PV_MEM_DEVICE, bytes);
    if (st != PV_OK)
        return st;
    b->buf[b->n++] = *out;
    b->out[b->n_out] = *out;
    b->out_bytes[b->n_out] = bytes;
    b->out_products[b->n_out++] = products;
    return PV_OK;
}

/* The ops of a workload, with every argument but the buffers fixed by its
 * shape: filled by setup, run by run. */
typedef struct workload_ops {
    pv_attention_args attention;
    pv_slot_copy_args gather;
    pv_qmatmul_args qmatmul[3]; /* one token, the larger batch, the decode batch */
    pv_rmsnorm_args rmsnorm;
    pv_swiglu_args swiglu;
    pv_add_args add;
} workload_ops;

static pv_status setup(const tune_setup *s, const workload *w, pv_backend *be, workload_buffers *b,
                       workload_ops *ops)
{
    memset(b, 0, sizeof *b);
    memset(ops, 0, sizeof *ops);
    b->be = be;
    uint64_t state = w->seed;
    const int32_t T = w->n_tokens, C = s->chunk_tokens;
    const uint64_t row = (uint64_t)s->n_kv_heads * (uint64_t)s->head_dim;
    const uint64_t embd = (uint64_t)s->n_heads * (uint64_t)s->head_dim;
    pv_buffer *in[5] = {NULL};
    pv_status st = PV_OK;
    switch (w->family) {
    case TUNE_ATTENTION: {
        const uint64_t slot_elems = 2 * (uint64_t)C * row;
        b->n_chunks = (w->context + T + C - 1) / C;
        const int64_t n_slots = pool_slots(slot_elems * pv_dtype_size(s->kv_dtype), b->n_chunks);
        if (n_slots > INT32_MAX)
            return pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: %lld slots", (long long)n_slots);
        b->seq = calloc((size_t)T, sizeof *b->seq);
        b->pos = malloc((size_t)T * sizeof *b->pos);
        b->slot_table = malloc((size_t)b->n_chunks * sizeof *b->slot_table);
        if (!b->seq || !b->pos || !b->slot_table)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: attention tables");
        /* spread over the pool, last first: a conversation's chunks are rarely adjacent */
        for (int64_t c = 0; c < b->n_chunks; c++)
            b->slot_table[c] = (int32_t)(n_slots - 1 - c * (n_slots / b->n_chunks));
        for (int32_t i = 0; i < T; i++)
            b->pos[i] = (int32_t)(w->context + i);
        st = pool_buffer(b, s->kv_dtype, slot_elems, n_slots, b->slot_table, b->n_chunks, &state, &in[0]);
        if (st == PV_OK)
            st = random_buffer(b, PV_F32, (uint64_t)T * embd, &state, &in[1]);
        if (st == PV_OK)
            st = output_buffer(b, (uint64_t)T * embd * sizeof(float), TUNE_ALL, &in[2]);
        ops->attention = (pv_attention_args){
            .kv_dtype = s->kv_dtype, .n_tokens = T, .n_heads = s->n_heads, .n_kv_heads = s->n_kv_heads,
            .head_dim = s->head_dim, .chunk_tokens = C, .scale = 1.0f / sqrtf((float)s->head_dim), .q = in[1],
            .kv_pool = in[0], .n_slots = n_slots, .token_seq = b->seq, .token_pos = b->pos,
            .slot_table = b->slot_table, .n_seqs = 1, .max_chunks = (int32_t)b->n_chunks, .out = in[2]};
        return st;
    }
    case TUNE_GATHER: {
        /* a swap-out: a quarter of the pool's slots, every fourth, last first */
        const uint64_t slot_elems = 2 * (uint64_t)C * row;
        const int64_t n_slots = pool_slots(slot_elems * pv_dtype_size(s->kv_dtype), 4);
        const int64_t moved = n_slots / 4;
        if (n_slots > INT32_MAX)
            return pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: %lld slots", (long long)n_slots);
        b->slots = malloc((size_t)moved * sizeof *b->slots);
        if (!b->slots)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: slot list");
        for (int64_t i = 0; i < moved; i++)
            b->slots[i] = (int32_t)(n_slots - 1 - 4 * i);
        st = pool_buffer(b, s->kv_dtype, slot_elems, n_slots, b->slots, moved, &state, &in[0]);
        if (st == PV_OK)
            st = output_buffer(b, (uint64_t)moved * slot_elems * pv_dtype_size(s->kv_dtype), TUNE_ALL, &in[1]);
        ops->gather = (pv_slot_copy_args){.dtype = s->kv_dtype, .slot_elems = (int64_t)slot_elems, .pool = in[0],
                                          .n_slots = n_slots, .staging = in[1], .slots = b->slots,
                                          .n_slots_moved = (int32_t)moved};
        return st;
    }
    case TUNE_QMATMUL: {
        /* a layer's up projection (4x wider) in Q4_0, the block types'
         * decode (PV_ACT16, PV_QMV_ROWS, PV_QMV_LANES) and prefill (PV_GEMM)
         * paths: one token, a prefill batch, a decode batch; F16 for rows
         * that are not whole blocks */
        const uint64_t n_out = 4 * embd;
        const pv_wtype wt = embd % 32 == 0 ? PV_W_Q4_0 : PV_W_F16;
        st = random_weights(b, wt, n_out, embd, &state, &in[0]);
        if (st == PV_OK)
            st = random_buffer(b, PV_F32, (uint64_t)T * embd, &state, &in[1]);
        if (st == PV_OK)
            st = output_buffer(b, n_out * sizeof(float), TUNE_DECODE, &in[2]);
        if (st == PV_OK)
            st = output_buffer(b, (uint64_t)T * n_out * sizeof(float), TUNE_PREFILL, &in[3]);
        if (st == PV_OK)
            st = output_buffer(b, (uint64_t)QMATMUL_BATCH_DECODE * n_out * sizeof(float), TUNE_DECODE, &in[4]);
        const int32_t tokens[3] = {1, T, QMATMUL_BATCH_DECODE};
        for (int k = 0; k < 3; k++)
            ops->qmatmul[k] = (pv_qmatmul_args){.w_type = wt, .n_tokens = tokens[k], .n_in = (int64_t)embd,
                                                .n_out = (int64_t)n_out, .w = in[0], .x = in[1], .y = in[2 + k]};
        return st;
    }
    case TUNE_RECOMPUTE: {
        /* a chunk's norm, SwiGLU and residual add */
        const uint64_t n = (uint64_t)T * embd, ff = 4 * n;
        pv_buffer *norm_w = NULL, *gate = NULL, *up = NULL, *normed = NULL, *glu = NULL, *sum = NULL;
        st = random_buffer(b, PV_F32, n, &state, &in[0]);
        if (st == PV_OK)
            st = random_buffer(b, PV_F32, embd, &state, &norm_w);
        if (st == PV_OK)
            st = random_buffer(b, PV_F32, ff, &state, &gate);
        if (st == PV_OK)
            st = random_buffer(b, PV_F32, ff, &state, &up);
        if (st == PV_OK)
            st = output_buffer(b, n * sizeof(float), TUNE_ALL, &normed);
        if (st == PV_OK)
            st = output_buffer(b, ff * sizeof(float), TUNE_ALL, &glu);
        if (st == PV_OK)
            st = output_buffer(b, n * sizeof(float), TUNE_ALL, &sum);
        ops->rmsnorm = (pv_rmsnorm_args){.rows = T, .dim = (int64_t)embd, .eps = 1e-5f, .x = in[0],
                                         .weight = norm_w, .out = normed};
        ops->swiglu = (pv_swiglu_args){.n = (int64_t)ff, .gate = gate, .up = up, .out = glu};
        ops->add = (pv_add_args){.n = (int64_t)n, .a = normed, .b = in[0], .out = sum};
        return st;
    }
    case TUNE_FAMILY_COUNT: break;
    }
    return pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: unknown workload");
}

/* The workload's products in `products` (the families but qmatmul: all). */
static pv_status run(const workload *w, pv_backend *be, const workload_ops *ops, tune_products products)
{
    pv_status st = PV_OK;
    switch (w->family) {
    case TUNE_ATTENTION: return pv_attention(be, &ops->attention);
    case TUNE_GATHER: return pv_slot_gather(be, &ops->gather);
    case TUNE_QMATMUL:
        for (int i = 0; products & TUNE_DECODE && i < QMATMUL_DECODE_STEPS && st == PV_OK; i++)
            st = pv_qmatmul(be, &ops->qmatmul[0]);
        for (int i = 0; products & TUNE_DECODE && i < QMATMUL_BATCH_STEPS && st == PV_OK; i++)
            st = pv_qmatmul(be, &ops->qmatmul[2]);
        return st == PV_OK && products & TUNE_PREFILL ? pv_qmatmul(be, &ops->qmatmul[1]) : st;
    case TUNE_RECOMPUTE:
        st = pv_rmsnorm(be, &ops->rmsnorm);
        if (st == PV_OK)
            st = pv_swiglu(be, &ops->swiglu);
        return st == PV_OK ? pv_add(be, &ops->add) : st;
    case TUNE_FAMILY_COUNT: break;
    }
    return pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: unknown workload");
}

/* A host buffer for all the outputs, concatenated (malloc'd). */
static pv_status outputs_alloc(const workload_buffers *b, unsigned char **out)
{
    uint64_t bytes = 0;
    for (int i = 0; i < b->n_out; i++)
        bytes += b->out_bytes[i];
    *out = malloc((size_t)bytes);
    return *out ? PV_OK
                : pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %llu bytes of results", (unsigned long long)bytes);
}

/* The outputs that `products` write, each at its place in the
 * concatenation (outputs_alloc); the other places are left as they are. */
static pv_status read_outputs(const workload_buffers *b, tune_products products, unsigned char *out)
{
    pv_status st = PV_OK;
    uint64_t at = 0;
    for (int i = 0; st == PV_OK && i < b->n_out; i++) {
        if (b->out_products[i] & products)
            st = pv_buffer_read(b->out[i], 0, out + at, b->out_bytes[i]);
        at += b->out_bytes[i];
    }
    return st;
}

/* Every byte of the outputs that `products` write 0xff: NaN as f32 and as
 * f16. */
static pv_status poison_outputs(const workload_buffers *b, tune_products products)
{
    pv_status st = PV_OK;
    for (int i = 0; st == PV_OK && i < b->n_out; i++) {
        if (!(b->out_products[i] & products))
            continue;
        void *nan_bytes = malloc((size_t)b->out_bytes[i]);
        if (!nan_bytes)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %llu bytes", (unsigned long long)b->out_bytes[i]);
        memset(nan_bytes, 0xff, (size_t)b->out_bytes[i]);
        st = pv_buffer_write(b->out[i], 0, nan_bytes, b->out_bytes[i]);
        free(nan_bytes);
    }
    return st;
}

/* Max |got - want| / max |want| over the f32 outputs that `products`
 * write (concatenations, outputs_alloc); the copies compare bytes (0 or
 * infinity). NaN anywhere is infinity. */
static double result_error(const workload *w, const workload_buffers *b, tune_products products,
                           const unsigned char *got, const unsigned char *want)
{
    double worst = 0, scale = 0;
    uint64_t at = 0;
    for (int k = 0; k < b->n_out; at += b->out_bytes[k++]) {
        if (!(b->out_products[k] & products))
            continue;
        if (w->family == TUNE_GATHER) {
            if (memcmp(got + at, want + at, (size_t)b->out_bytes[k]) != 0)
                return INFINITY;
            continue;
        }
        const float *g = (const float *)(got + at), *r = (const float *)(want + at);
        for (uint64_t i = 0; i < b->out_bytes[k] / sizeof(float); i++) {
            const double d = fabs((double)g[i] - (double)r[i]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
            scale = fmax(scale, fabs((double)r[i]));
        }
    }
    return scale > 0 ? worst / scale : worst;
}

typedef struct timed_ctx {
    const workload *w;
    const workload_ops *ops;
    tune_products products;
} timed_ctx;

static pv_status timed_run(const tune_setup *s, void *ctx)
{
    const timed_ctx *t = ctx;
    return run(t->w, s->be, t->ops, t->products);
}

const char *tune_family_name(tune_family f)
{
    static const char *const names[TUNE_FAMILY_COUNT] = {"attention", "gather", "qmatmul", "recompute"};
    return (unsigned)f < TUNE_FAMILY_COUNT ? names[f] : "?";
}

const char *tune_products_name(tune_products p)
{
    return p == TUNE_DECODE ? "decode" : p == TUNE_PREFILL ? "prefill" : p == TUNE_ALL ? "all" : "?";
}

/* The token NAME=VALUE of params whose NAME is the name_len characters at
 * name, and its length in *len; NULL when there is none. */
static const char *find_token(const char *params, const char *name, size_t name_len, size_t *len)
{
    for (const char *at = params + strspn(params, " "); *at; at += strspn(at, " ")) {
        const size_t n = strcspn(at, " ");
        const char *eq = memchr(at, '=', n);
        if (eq && (size_t)(eq - at) == name_len && strncmp(at, name, name_len) == 0) {
            *len = n;
            return at;
        }
        at += n;
    }
    return NULL;
}

/* Whether b holds every token of a whole, but the one named `except`. */
static int tokens_in(const char *a, const char *b, const char *except)
{
    for (const char *at = a + strspn(a, " "); *at; at += strspn(at, " ")) {
        const size_t n = strcspn(at, " ");
        const char *eq = memchr(at, '=', n);
        const size_t name_len = eq ? (size_t)(eq - at) : n;
        size_t len = 0;
        const char *other = find_token(b, at, name_len, &len);
        const int excepted = strlen(except) == name_len && strncmp(at, except, name_len) == 0;
        if (!excepted && !(other && len == n && strncmp(other, at, n) == 0))
            return 0;
        at += n;
    }
    return 1;
}

static const char gemm[] = "PV_GEMM";

/* The PV_GEMM mode params name: a tensor-core one (non-zero) rounds. */
static int gemm_mode(const char *params)
{
    size_t len = 0;
    const char *token = find_token(params, gemm, strlen(gemm), &len);
    return token ? atoi(token + strlen(gemm) + 1) : 0;
}

int tune_in_stage(tune_products stage, const char *params, const char *default_params, const char *decode_best)
{
    size_t len = 0, default_len = 0;
    const char *mode = find_token(params, gemm, strlen(gemm), &len);
    const char *default_mode = find_token(default_params, gemm, strlen(gemm), &default_len);
    switch (stage) {
    case TUNE_DECODE: return mode && default_mode && len == default_len && strncmp(mode, default_mode, len) == 0;
    case TUNE_PREFILL: return tokens_in(params, decode_best, gemm) && tokens_in(decode_best, params, gemm);
    case TUNE_ALL: return 1;
    }
    return 0;
}

/* r->default_s and r->best_s: s->repeats runs of each, alternating (a b,
 * b a, ...) after a warm-up of each, so load hits both alike; on all the
 * workload's products, whatever the stage the best was chosen in. */
static pv_status time_default_and_best(const tune_setup *s, const workload *w, const workload_ops *ops,
                                       tune_bucket_result *r)
{
    r->default_s = r->best_s = NAN;
    int default_rejected = 0;
    for (int i = 0; i < r->n_candidates; i++)
        default_rejected |= strcmp(r->candidates[i].params, r->default_params) == 0 && r->candidates[i].rejected;
    const char *sets[2] = {r->default_params, r->candidates[r->best].params};
    const int first = default_rejected ? 1 : 0;
    double *t[2] = {malloc((size_t)s->repeats * sizeof(double)), malloc((size_t)s->repeats * sizeof(double))};
    pv_status st = t[0] && t[1] ? PV_OK : pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-tune: %d repeats", s->repeats);
    for (int k = -1; st == PV_OK && k < s->repeats; k++)
        for (int turn = 0; st == PV_OK && turn < 2; turn++) {
            const int which = (turn == 0) == (k % 2 == 0) ? 0 : 1;
            if (which < first)
                continue;
            st = pv_backend_kernel_set(s->be, r->bucket, sets[which]);
            const double t0 = tune_now_s();
            if (st == PV_OK)
                st = run(w, s->be, ops, TUNE_ALL);
            if (st == PV_OK)
                st = pv_backend_finish(s->be);
            if (k >= 0) /* k = -1: the warm-up */
                t[which][k] = tune_now_s() - t0;
        }
    if (st == PV_OK) {
        r->best_s = tune_median(t[1], s->repeats);
        if (!first)
            r->default_s = tune_median(t[0], s->repeats);
    }
    /* the default is by string: qmatmul's two stages may both try it */
    const int keep = st == PV_OK && !first && strcmp(sets[1], r->default_params) != 0 &&
                     r->best_s > (1 - TUNE_MIN_GAIN) * r->default_s;
    for (int i = 0; keep && i < r->n_candidates; i++)
        if (strcmp(r->candidates[i].params, r->default_params) == 0) {
            r->best = i;
            r->best_s = r->default_s;
            r->kept_default = 1;
        }
    free(t[0]);
    free(t[1]);
    return st;
}

/* Searches one workload's bucket on s->be against ref; the fastest correct
 * candidate is left set in s->be. */
static pv_status search(const tune_setup *s, pv_backend *ref, const workload *w, tune_bucket_result *r,
                        tune_progress_fn progress, void *progress_ctx)
{
    memset(r, 0, sizeof *r);
    snprintf(r->what, sizeof r->what, "%s", w->what);
    workload_buffers on_ref, on_dev;
    workload_ops ref_ops, dev_ops;
    unsigned char *want = NULL, *got = NULL;
    pv_status st = setup(s, w, ref, &on_ref, &ref_ops);
    if (st == PV_OK)
        st = run(w, ref, &ref_ops, TUNE_ALL);
    if (st == PV_OK)
        st = outputs_alloc(&on_ref, &want);
    if (st == PV_OK)
        st = read_outputs(&on_ref, TUNE_ALL, want);
    buffers_free(&on_ref);
    if (st == PV_OK)
        st = setup(s, w, s->be, &on_dev, &dev_ops);
    if (st == PV_OK)
        st = outputs_alloc(&on_dev, &got);
    if (st == PV_OK && w->family == TUNE_ATTENTION)
        st = pv_attention_bucket(&dev_ops.attention, r->bucket, sizeof r->bucket);
    else if (st == PV_OK)
        snprintf(r->bucket, sizeof r->bucket, "%s", tune_family_name(w->family));
    if (st == PV_OK)
        st = pv_backend_kernel_get(s->be, r->bucket, r->default_params, sizeof r->default_params);
    int count = 0;
    if (st == PV_OK)
        st = pv_kernel_candidate(s->be, r->bucket, 0, NULL, 0, &count);
    r->best = -1;
    const double limit = w->family == TUNE_GATHER ? 0.0 : w->family == TUNE_ATTENTION ? ATTENTION_LIMIT
                                                                                       : ARITHMETIC_LIMIT;
    /* qmatmul: its decode kernels' parameters on the decode products, then
     * PV_GEMM on the prefill product (PV_WG also sets the work-group of
     * the kernels that widen the weights into tiles there, a minor part of
     * it: the first stage chooses PV_WG for the decode products alone) */
    static const tune_products qmatmul_stages[] = {TUNE_DECODE, TUNE_PREFILL}, one_stage[] = {TUNE_ALL};
    const tune_products *stages = w->family == TUNE_QMATMUL ? qmatmul_stages : one_stage;
    const int n_stages = w->family == TUNE_QMATMUL ? 2 : 1;
    for (int k = 0; st == PV_OK && k < n_stages; k++) {
        const tune_products stage = stages[k];
        const char *decode_best = r->best >= 0 ? r->candidates[r->best].params : "";
        const int first = r->n_candidates;
        r->best = -1;
        for (int i = 0; st == PV_OK && i < count; i++) {
            char params[sizeof r->candidates->params];
            st = pv_kernel_candidate(s->be, r->bucket, i, params, sizeof params, NULL);
            if (st != PV_OK || !tune_in_stage(stage, params, r->default_params, decode_best))
                continue;
            if (r->n_candidates == TUNE_MAX_CANDIDATES) {
                st = pv_error(PV_ERR_INVALID_ARG, "pensieve-tune: bucket %s tries more than %d candidates",
                              r->bucket, TUNE_MAX_CANDIDATES);
                break;
            }
            tune_candidate *c = &r->candidates[r->n_candidates++];
            memcpy(c->params, params, sizeof c->params);
            c->timed = stage;
            /* the GEMM's rounding shows in the prefill product only */
            c->limit = stage & TUNE_PREFILL && gemm_mode(c->params) != 0 ? REDUCED_LIMIT : limit;
            st = pv_backend_kernel_set(s->be, r->bucket, c->params);
            if (progress) {
                char what[160];
                snprintf(what, sizeof what, "%s%s%s: %s", r->bucket, stage == TUNE_ALL ? "" : " ",
                         stage == TUNE_ALL ? "" : tune_products_name(stage), c->params);
                progress(progress_ctx, what);
            }
            /* checked before it is timed, on outputs poisoned first: a
             * candidate that writes nothing must not pass on its
             * predecessor's results */
            if (st == PV_OK)
                st = poison_outputs(&on_dev, stage);
            if (st == PV_OK)
                st = run(w, s->be, &dev_ops, stage);
            if (st == PV_OK)
                st = read_outputs(&on_dev, stage, got);
            if (st != PV_OK)
                break;
            c->error = result_error(w, &on_dev, stage, got, want);
            c->rejected = !(c->error <= c->limit);
            if (c->rejected)
                continue;
            timed_ctx t = {w, &dev_ops, stage};
            tune_timing timing;
            st = tune_time_runs(s, timed_run, &t, &timing);
            c->seconds = timing.median;
            c->spread = timing.spread;
            if (st == PV_OK && (r->best < 0 || c->seconds < r->candidates[r->best].seconds))
                r->best = r->n_candidates - 1;
        }
        if (st == PV_OK && r->best < 0)
            st = pv_error(PV_ERR_BACKEND, "pensieve-tune: every candidate of %s%s%s was wrong (the first: error "
                          "%.3g, limit %g)",
                          r->bucket, stage == TUNE_ALL ? "" : ", stage ",
                          stage == TUNE_ALL ? "" : tune_products_name(stage),
                          r->n_candidates > first ? r->candidates[first].error : 0.0,
                          r->n_candidates > first ? r->candidates[first].limit : limit);
    }
    r->limit = limit;
    if (st == PV_OK)
        st = time_default_and_best(s, w, &dev_ops, r);
    if (st == PV_OK)
        st = pv_backend_kernel_set(s->be, r->bucket, r->candidates[r->best].params);
    buffers_free(&on_dev);
    free(want);
    free(got);
    return st;
}

pv_status tune_kernels(const tune_setup *s, pv_backend *ref, unsigned families, int quick,
                       tune_bucket_result *results, int *n_results, tune_progress_fn progress, void *progress_ctx)
{
    /* Attention: decode (one token) and prefill (one chunk), each at a short
     * and a long context, the buckets' two sides of 1024; one workload for
     * each other family, at a chunk's rows (qmatmul: at one token and at a
     * prefill batch). */
    workload list[TUNE_MAX_BUCKETS];
    int n = 0;
    const int64_t contexts[2] = {512, quick ? 1024 : 4096};
    if (families & (1u << TUNE_ATTENTION))
        for (int prefill = 0; prefill < 2; prefill++)
            for (int c = 0; c < 2; c++) {
                workload *w = &list[n++];
                *w = (workload){.family = TUNE_ATTENTION, .n_tokens = prefill ? s->chunk_tokens : 1,
                                .context = contexts[c], .seed = 17u + (unsigned)n};
                snprintf(w->what, sizeof w->what, "%d query token%s at context %lld", w->n_tokens,
                         w->n_tokens == 1 ? "" : "s", (long long)w->context);
            }
    for (int f = TUNE_GATHER; f <= TUNE_RECOMPUTE; f++)
        if (families & (1u << f)) {
            workload *w = &list[n++];
            *w = (workload){.family = (tune_family)f,
                            .n_tokens = f == TUNE_QMATMUL ? QMATMUL_BATCH_TOKENS : s->chunk_tokens,
                            .seed = 17u + (unsigned)n};
            snprintf(w->what, sizeof w->what,
                     f == TUNE_GATHER    ? "slot_gather, a quarter of a 64 MiB pool"
                     : f == TUNE_QMATMUL ? "qmatmul Q4_0: " DECODE_STEPS_TEXT ", one of %d tokens"
                                         : "rmsnorm, swiglu, add of %d tokens",
                     w->n_tokens);
        }
    *n_results = 0;
    for (int i = 0; i < n; i++) {
        pv_status st = search(s, ref, &list[i], &results[i], progress, progress_ctx);
        if (st != PV_OK)
            return st;
        *n_results = i + 1;
    }
    return PV_OK;
}
