/* A paged-KV attention scenario for the backend tests: sequences of given
 * lengths whose chunks sit in shuffled slots of a pool with spare slots, the
 * same K/V also laid out contiguously (for the double-precision reference),
 * and a batch of query tokens shaped like decode, prefill or recovery.
 *
 * Pool memory that no query may read (rows past a sequence's length, spare
 * slots) holds large garbage, so a kernel reading it is caught. */
#ifndef PV_TESTS_KV_SCENARIO_H
#define PV_TESTS_KV_SCENARIO_H

#include "backend-check.h"

typedef enum query_shape {
    QUERY_DECODE,   /* each sequence: its last position */
    QUERY_PREFILL,  /* each sequence: its last n_query positions */
    QUERY_RECOVERY  /* each sequence: a dropped range [0, n_query/2) recomputed,
                       then a new prompt at its last n_query - n_query/2 positions */
} query_shape;

typedef struct kv_scenario {
    pv_dtype kv_dtype;
    int32_t n_seqs, max_chunks, chunk_tokens;
    int32_t n_heads, n_kv_heads, head_dim;
    int64_t n_slots;
    int32_t *seq_len;    /* [n_seqs] tokens in the pool */
    int32_t *slot_table; /* [n_seqs][max_chunks], -1 past the end */
    float *k, *v;        /* [n_seqs][max_tokens][n_kv_heads][head_dim], as stored (f16-rounded for f16) */
    int64_t max_tokens;  /* max_chunks * chunk_tokens */
    void *pool;          /* host image: [n_slots][2][chunk_tokens][n_kv_heads][head_dim] in kv_dtype */
    uint64_t pool_elems;
    int32_t n_tokens;
    int32_t *token_seq, *token_pos; /* [T] */
    float *q;                       /* [T][n_heads][head_dim] */
    float scale;
} kv_scenario;

static inline void pool_store(kv_scenario *sc, uint64_t at, float x)
{
    if (sc->kv_dtype == PV_F32)
        ((float *)sc->pool)[at] = x;
    else
        ((pv_half *)sc->pool)[at] = pv_float_to_half(x);
}

static inline int32_t query_count(query_shape shape, int32_t len, int32_t n_query)
{
    if (shape == QUERY_DECODE)
        return 1;
    return n_query < len ? n_query : len;
}

/* Position of the j-th query (j < query_count) of a sequence of length len. */
static inline int32_t query_position(query_shape shape, int32_t len, int32_t n_query, int32_t j)
{
    int32_t count = query_count(shape, len, n_query);
    if (shape == QUERY_RECOVERY) {
        int32_t dropped = count / 2;
        return j < dropped ? j : len - (count - j);
    }
    return len - count + j;
}

static inline void kv_scenario_init(kv_scenario *sc, uint64_t *rng, pv_dtype kv_dtype, int32_t n_heads,
                                    int32_t n_kv_heads, int32_t head_dim, int32_t chunk_tokens,
                                    const int32_t *seq_len, int32_t n_seqs, query_shape shape,
                                    int32_t n_query)
{
    memset(sc, 0, sizeof *sc);
    sc->kv_dtype = kv_dtype;
    sc->n_seqs = n_seqs;
    sc->chunk_tokens = chunk_tokens;
    sc->n_heads = n_heads;
    sc->n_kv_heads = n_kv_heads;
    sc->head_dim = head_dim;
    sc->scale = 1.0f / sqrtf((float)head_dim);

    int32_t longest = 1, needed = 0;
    sc->seq_len = xmalloc((size_t)n_seqs * sizeof *sc->seq_len);
    for (int32_t s = 0; s < n_seqs; s++) {
        sc->seq_len[s] = seq_len[s];
        if (seq_len[s] > longest)
            longest = seq_len[s];
        needed += (seq_len[s] + chunk_tokens - 1) / chunk_tokens;
    }
    /* One spare chunk per table row, so -1 entries are exercised. */
    sc->max_chunks = (longest + chunk_tokens - 1) / chunk_tokens + 1;
    sc->max_tokens = (int64_t)sc->max_chunks * chunk_tokens;
    sc->n_slots = needed + 3 + needed / 4; /* spare slots that nobody owns */

    size_t row = (size_t)n_kv_heads * head_dim;
    size_t contiguous = (size_t)n_seqs * (size_t)sc->max_tokens * row;
    sc->k = xmalloc(contiguous * sizeof(float));
    sc->v = xmalloc(contiguous * sizeof(float));
    sc->pool_elems = (uint64_t)sc->n_slots * 2 * (uint64_t)chunk_tokens * row;
    sc->pool = xmalloc((size_t)sc->pool_elems * pv_dtype_size(kv_dtype));
    for (uint64_t e = 0; e < sc->pool_elems; e++)
        pool_store(sc, e, rng_range(rng, -3.0e4f, 3.0e4f));

    int32_t *free_slots = xmalloc((size_t)sc->n_slots * sizeof *free_slots);
    for (int32_t i = 0; i < sc->n_slots; i++)
        free_slots[i] = i;
    rng_shuffle(rng, free_slots, (size_t)sc->n_slots);
    sc->slot_table = xmalloc((size_t)n_seqs * (size_t)sc->max_chunks * sizeof *sc->slot_table);
    int32_t next_free = 0;
    size_t slot_elems = 2 * (size_t)chunk_tokens * row;
    for (int32_t s = 0; s < n_seqs; s++) {
        for (int32_t c = 0; c < sc->max_chunks; c++)
            sc->slot_table[(size_t)s * sc->max_chunks + c] =
                (int64_t)c * chunk_tokens < seq_len[s] ? free_slots[next_free++] : -1;
        for (int64_t p = 0; p < sc->max_tokens; p++) {
            float *k = sc->k + ((size_t)s * sc->max_tokens + p) * row;
            float *v = sc->v + ((size_t)s * sc->max_tokens + p) * row;
            rng_fill(rng, k, row, -1.0f, 1.0f);
            rng_fill(rng, v, row, -1.0f, 1.0f);
            if (kv_dtype == PV_F16) {
                round_to_half(k, row);
                round_to_half(v, row);
            }
            if (p >= seq_len[s])
                continue;
            int32_t slot = sc->slot_table[(size_t)s * sc->max_chunks + p / chunk_tokens];
            uint64_t k_at = (uint64_t)slot * slot_elems + (uint64_t)(p % chunk_tokens) * row;
            uint64_t v_at = k_at + (uint64_t)chunk_tokens * row;
            for (size_t e = 0; e < row; e++) {
                pool_store(sc, k_at + e, k[e]);
                pool_store(sc, v_at + e, v[e]);
            }
        }
    }
    free(free_slots);

    int32_t total = 0;
    for (int32_t s = 0; s < n_seqs; s++)
        total += query_count(shape, seq_len[s], n_query);
    sc->n_tokens = total;
    sc->token_seq = xmalloc((size_t)total * sizeof *sc->token_seq);
    sc->token_pos = xmalloc((size_t)total * sizeof *sc->token_pos);
    int32_t *order = xmalloc((size_t)total * sizeof *order);
    for (int32_t i = 0; i < total; i++)
        order[i] = i;
    rng_shuffle(rng, order, (size_t)total); /* queries in any order */
    int32_t i = 0;
    for (int32_t s = 0; s < n_seqs; s++)
        for (int32_t j = 0; j < query_count(shape, seq_len[s], n_query); j++, i++) {
            sc->token_seq[order[i]] = s;
            sc->token_pos[order[i]] = query_position(shape, seq_len[s], n_query, j);
        }
    free(order);
    size_t q_elems = (size_t)total * n_heads * head_dim;
    sc->q = xmalloc(q_elems * sizeof(float));
    rng_fill(rng, sc->q, q_elems, -2.0f, 2.0f);
}

static inline void kv_scenario_free(kv_scenario *sc)
{
    free(sc->seq_len);
    free(sc->slot_table);
    free(sc->k);
    free(sc->v);
    free(sc->pool);
    free(sc->token_seq);
    free(sc->token_pos);
    free(sc->q);
    memset(sc, 0, sizeof *sc);
}

/* The reference in double over the contiguous K/V:
 * out[i][h][:] = sum_j softmax_j(q . k_j * scale) v_j over positions
 * j <= token_pos[i] of the query's sequence, kv head h / group. */
static inline void kv_scenario_reference(const kv_scenario *sc, double *out)
{
    int32_t group = sc->n_heads / sc->n_kv_heads;
    size_t row = (size_t)sc->n_kv_heads * sc->head_dim;
    double *scores = xmalloc((size_t)sc->max_tokens * sizeof *scores);
    for (int32_t i = 0; i < sc->n_tokens; i++) {
        int32_t s = sc->token_seq[i];
        int32_t n_ctx = sc->token_pos[i] + 1;
        for (int32_t h = 0; h < sc->n_heads; h++) {
            const float *q = sc->q + ((size_t)i * sc->n_heads + h) * sc->head_dim;
            size_t head_off = (size_t)(h / group) * sc->head_dim;
            double max = -INFINITY;
            for (int32_t j = 0; j < n_ctx; j++) {
                const float *k = sc->k + ((size_t)s * sc->max_tokens + j) * row + head_off;
                double dot = 0.0;
                for (int32_t d = 0; d < sc->head_dim; d++)
                    dot += (double)q[d] * k[d];
                scores[j] = dot * sc->scale;
                if (scores[j] > max)
                    max = scores[j];
            }
            double sum = 0.0;
            for (int32_t j = 0; j < n_ctx; j++) {
                scores[j] = exp(scores[j] - max);
                sum += scores[j];
            }
            double *o = out + ((size_t)i * sc->n_heads + h) * sc->head_dim;
            for (int32_t d = 0; d < sc->head_dim; d++)
                o[d] = 0.0;
            for (int32_t j = 0; j < n_ctx; j++) {
                const float *v = sc->v + ((size_t)s * sc->max_tokens + j) * row + head_off;
                for (int32_t d = 0; d < sc->head_dim; d++)
                    o[d] += scores[j] / sum * v[d];
            }
        }
    }
    free(scores);
}

/* The scenario's attention over q, the pool (from byte 0 of its buffer)
 * and out. */
static inline pv_attention_args kv_scenario_args(const kv_scenario *sc, const tensor *q, pv_buffer *pool,
                                                 const tensor *out)
{
    return (pv_attention_args){
        .kv_dtype = sc->kv_dtype,
        .n_tokens = sc->n_tokens,
        .n_heads = sc->n_heads,
        .n_kv_heads = sc->n_kv_heads,
        .head_dim = sc->head_dim,
        .chunk_tokens = sc->chunk_tokens,
        .scale = sc->scale,
        .q = q->buf,
        .q_off = q->off,
        .kv_pool = pool,
        .n_slots = sc->n_slots,
        .token_seq = sc->token_seq,
        .token_pos = sc->token_pos,
        .slot_table = sc->slot_table,
        .n_seqs = sc->n_seqs,
        .max_chunks = sc->max_chunks,
        .out = out->buf,
        .out_off = out->off,
    };
}

/* Runs the scenario's attention on `be` with guarded q/out tensors, into
 * out[T][n_heads][head_dim]. *guards_ok is 0 when anything outside out's
 * region or in the pool changed. */
static inline pv_status kv_scenario_run(const kv_scenario *sc, pv_backend *be, float *out, int *guards_ok)
{
    size_t q_elems = (size_t)sc->n_tokens * sc->n_heads * sc->head_dim;
    size_t pool_bytes = (size_t)sc->pool_elems * pv_dtype_size(sc->kv_dtype);
    tensor q, o, pool;
    memset(&o, 0, sizeof o);
    memset(&pool, 0, sizeof pool);
    *guards_ok = 0;
    pv_status st = tensor_init(&q, be, PV_MEM_DEVICE, sizeof(float), q_elems, sc->q);
    if (st == PV_OK)
        st = tensor_init(&o, be, PV_MEM_DEVICE, sizeof(float), q_elems, NULL);
    /* The pool has no offset argument: it starts at byte 0 of its buffer. */
    if (st == PV_OK)
        st = pv_buffer_init(&pool.buf, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool.buf, 0, sc->pool, pool_bytes);
    if (st == PV_OK) {
        const pv_attention_args a = kv_scenario_args(sc, &q, pool.buf, &o);
        st = pv_attention(be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&o, out);
    if (st == PV_OK) {
        unsigned char *after = xmalloc(pool_bytes);
        st = pv_buffer_read(pool.buf, 0, after, pool_bytes);
        *guards_ok = st == PV_OK && guards_intact(&o) && guards_intact(&q) &&
                     memcmp(after, sc->pool, pool_bytes) == 0;
        free(after);
    }
    pv_buffer_free(pool.buf);
    tensor_free(&o);
    tensor_free(&q);
    return st;
}

#endif
