/* Causal multi-token attention over the paged KV pool, and the writes of new
 * K/V rows into it: the reference for every backend.
 *
 * A work item is up to QUERY_BLOCK query tokens of one sequence (with all
 * their heads, or a range of kv heads and the query heads that read them)
 * over a range of whole blocks of their context (one block = one chunk's
 * rows): all of it, or one split of it (split-K, below). It walks its blocks
 * front to back and keeps, per token and query head, an online softmax:
 * running max, running sum and an unnormalised output; each token takes the
 * rows up to its own position (causal). No T x context matrix exists; each
 * K/V row is read once per item, for all the item's tokens and heads.
 *
 * Split-K (flash-decoding): when items are too few for the threads (decode
 * of one or two long sequences), each item's context is cut into splits of
 * contiguous blocks run as separate items. A split leaves its running max
 * m, sum l and unnormalised output o per token and head in a partial; a
 * second pass combines them: with M = max_s m_s,
 *   out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s.
 * A split past a token's position leaves m = -inf, l = 0 and weighs 0. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <pensieve/half.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* Head dims are multiples of 16 (pv_attention_head_dim_supported), so the
 * inner loops run over fixed 16-wide lanes that the compiler vectorises
 * without reassociation flags. */
#define LANES 16

/* The hot loops also get AVX2 and AVX-512 clones, chosen at load time from
 * the CPU's features (function multiversioning): the code stays plain C and
 * the default clone runs on any x86-64. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PV_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef PV_CPU_CLONES
#define PV_CPU_CLONES
#endif

/* The small helpers must be inlined into each clone: a call from AVX code
 * into SSE code pays a state-transition penalty on every call. */
#if defined(__GNUC__)
#define PV_CPU_INLINE static inline __attribute__((always_inline))
#else
#define PV_CPU_INLINE static inline
#endif

/* Blocks of the contiguous layout match the pool's default chunk, so both
 * layouts run the same inner loop on the same block sizes. */
#define CONTIGUOUS_BLOCK_TOKENS 32

/* a . b with 16 independent partial sums, so the compiler keeps them in
 * vector registers without reassociating floating-point adds. */
PV_CPU_INLINE float dot_lanes(const float *restrict a, const float *restrict b, int n)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    float s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;
    for (int d = 0; d < n; d += LANES) {
        s0 += a[d + 0] * b[d + 0];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
        s4 += a[d + 4] * b[d + 4];
        s5 += a[d + 5] * b[d + 5];
        s6 += a[d + 6] * b[d + 6];
        s7 += a[d + 7] * b[d + 7];
        s8 += a[d + 8] * b[d + 8];
        s9 += a[d + 9] * b[d + 9];
        s10 += a[d + 10] * b[d + 10];
        s11 += a[d + 11] * b[d + 11];
        s12 += a[d + 12] * b[d + 12];
        s13 += a[d + 13] * b[d + 13];
        s14 += a[d + 14] * b[d + 14];
        s15 += a[d + 15] * b[d + 15];
    }
    return (((s0 + s8) + (s4 + s12)) + ((s2 + s10) + (s6 + s14))) +
           (((s1 + s9) + (s5 + s13)) + ((s3 + s11) + (s7 + s15)));
}

/* y[0..n) += alpha * x[0..n) */
PV_CPU_INLINE void axpy_lanes(float *restrict y, float alpha, const float *restrict x, int n)
{
    for (int d = 0; d < n; d += LANES)
        for (int j = 0; j < LANES; j++)
            y[d + j] += alpha * x[d + j];
}

PV_CPU_INLINE void scale_lanes(float *y, float s, int n)
{
    for (int d = 0; d < n; d += LANES)
        for (int j = 0; j < LANES; j++)
            y[d + j] *= s;
}

/* e^x for softmax weights (x = score - running max <= 0) in plain arithmetic,
 * so a loop of them vectorises where libm's expf is a call per element.
 * x = n ln2 + r with |r| <= ln2/2; e^r by its Taylor series to r^6
 * (relative error about 2e-7); 2^n goes straight into the exponent bits.
 * Weights under e^-87 (1.6e-38) are clamped there; NaN stays NaN. */
PV_CPU_INLINE float exp_weight(float x)
{
    float clamped = x >= -87.0f ? x : -87.0f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (clamped * 1.44269504f + shifter) - shifter;
    /* ln 2 split so that n * ln2_hi is exact for |n| < 128 */
    float r = (clamped - n * 0.693145752f) - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x == x ? p * two_n : x;
}

/* scores[0..n) = exp_weight(scores - max); n a multiple of LANES. */
PV_CPU_CLONES static void exp_weights_portable(float *scores, int32_t n, float max)
{
    for (int32_t t0 = 0; t0 < n; t0 += LANES)
        for (int32_t j = 0; j < LANES; j++)
            scores[t0 + j] = exp_weight(scores[t0 + j] - max);
}

/* The same operations, in the same order, eight lanes at a time: GCC does
 * not vectorise the loop above in its AVX2 clone (the NaN select), where it
 * was 9% of a decode's samples. Same bits as exp_weight (no FMA: the C is
 * compiled without contraction). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void exp_weights_avx2(float *scores, int32_t n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max), floor87 = _mm256_set1_ps(-87.0f);
    const __m256 shifter = _mm256_set1_ps(12582912.0f), log2e = _mm256_set1_ps(1.44269504f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693145752f), ln2_lo = _mm256_set1_ps(1.42860677e-6f);
    const __m256 one = _mm256_set1_ps(1.0f), c2 = _mm256_set1_ps(0.5f), c3 = _mm256_set1_ps(1.0f / 6);
    const __m256 c4 = _mm256_set1_ps(1.0f / 24), c5 = _mm256_set1_ps(1.0f / 120), c6 = _mm256_set1_ps(1.0f / 720);
    for (int32_t t = 0; t < n; t += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(scores + t), vmax);
        const __m256 clamped = _mm256_blendv_ps(floor87, x, _mm256_cmp_ps(x, floor87, _CMP_GE_OQ));
        const __m256 nn = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(clamped, log2e), shifter), shifter);
        const __m256 r = _mm256_sub_ps(_mm256_sub_ps(clamped, _mm256_mul_ps(nn, ln2_hi)), _mm256_mul_ps(nn, ln2_lo));
        __m256 p = _mm256_add_ps(c5, _mm256_mul_ps(r, c6));
        p = _mm256_add_ps(c4, _mm256_mul_ps(r, p));
        p = _mm256_add_ps(c3, _mm256_mul_ps(r, p));
        p = _mm256_add_ps(c2, _mm256_mul_ps(r, p));
        p = _mm256_add_ps(one, _mm256_mul_ps(r, p));
        p = _mm256_add_ps(one, _mm256_mul_ps(r, p));
        const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
        const __m256 w = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        _mm256_storeu_ps(scores + t, _mm256_blendv_ps(x, w, _mm256_cmp_ps(x, x, _CMP_ORD_Q)));
    }
}
#endif

typedef void (*exp_weights_fn)(float *scores, int32_t n, float max);

/* f16 -> f32 without branches so the lanes vectorise: shift exponent and
 * mantissa into place, rebias by multiplying by 2^112 (which also turns
 * half subnormals into normal floats), then restore inf/nan and the sign.
 * Exact for every half value, as pv_half_to_float. */
PV_CPU_INLINE float half_bits_to_float(uint32_t h)
{
    uint32_t magnitude = (h & 0x7fffu) << 13;
    float f;
    memcpy(&f, &magnitude, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if (magnitude >= (0x1fu << 23)) /* half exponent all ones: inf or nan */
        bits |= 0x7f800000u;
    bits |= (h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* dst[0..n) = src[0..n) widened; n is a multiple of LANES */
PV_CPU_CLONES static void half_row_to_float(float *restrict dst, const uint16_t *restrict src, int n)
{
    for (int d = 0; d < n; d += LANES)
        for (int j = 0; j < LANES; j++)
            dst[d + j] = half_bits_to_float(src[d + j]);
}

/* The same with the F16C instruction, eight at a time: the portable loop
 * above costs as much as the attention arithmetic it feeds. Both are exact,
 * so the two give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) static void half_row_to_float_f16c(float *restrict dst,
                                                                     const uint16_t *restrict src, int n)
{
    for (int d = 0; d < n; d += 8)
        _mm256_storeu_ps(dst + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
}
#endif

typedef void (*widen_half_fn)(float *restrict dst, const uint16_t *restrict src, int n);

/* The attention's inner steps with AVX2 and F16C where the backend runs its
 * AVX2 kernels (which require both), else portable: the same bits either way. */
typedef struct attention_kernels {
    widen_half_fn widen_half;   /* f16 K/V rows to f32 */
    exp_weights_fn exp_weights; /* scores to softmax weights */
} attention_kernels;

static attention_kernels attention_kernels_for(int avx2_kernels)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2_kernels)
        return (attention_kernels){half_row_to_float_f16c, exp_weights_avx2};
#else
    (void)avx2_kernels;
#endif
    return (attention_kernels){half_row_to_float, exp_weights_portable};
}

/* Where the K/V rows of a sequence live: the paged pool (slot_table set) or
 * the contiguous layout k[s][p][h][d], v[s][p][h][d]. In both a block's rows
 * are n_kv_heads * head_dim elements apart. */
typedef struct kv_source {
    pv_dtype dtype;
    int32_t n_kv_heads, head_dim;
    int32_t block_tokens;
    /* paged */
    const char *pool;
    const int32_t *slot_table;
    int32_t max_chunks;
    /* contiguous */
    const char *k, *v;
    int64_t max_tokens;
} kv_source;

/* Pointers to the rows [first_pos, first_pos + block), at kv head g. */
static void kv_block(const kv_source *src, int32_t seq, int64_t first_pos, int32_t g, const void **k,
                     const void **v)
{
    size_t elem = pv_dtype_size(src->dtype);
    int64_t row_elems = (int64_t)src->n_kv_heads * src->head_dim;
    if (src->slot_table) {
        int64_t chunk = first_pos / src->block_tokens;
        int64_t row = first_pos % src->block_tokens;
        int64_t slot = src->slot_table[(int64_t)seq * src->max_chunks + chunk];
        int64_t slot_elems = 2 * (int64_t)src->block_tokens * row_elems;
        const char *slot_base = src->pool + (size_t)(slot * slot_elems) * elem;
        int64_t k_elem = row * row_elems + (int64_t)g * src->head_dim;
        int64_t v_elem = (int64_t)src->block_tokens * row_elems + k_elem;
        *k = slot_base + (size_t)k_elem * elem;
        *v = slot_base + (size_t)v_elem * elem;
    } else {
        int64_t elem_off = ((int64_t)seq * src->max_tokens + first_pos) * row_elems + (int64_t)g * src->head_dim;
        *k = src->k + (size_t)elem_off * elem;
        *v = src->v + (size_t)elem_off * elem;
    }
}

/* Query tokens of one sequence handled by one work item: they share every
 * K/V block the item reads (prefill and recovery read each row once per
 * QUERY_BLOCK tokens instead of once per token). */
#define QUERY_BLOCK 8

/* One work item: group `group`'s tokens, kv heads kv_head0 .. kv_head0 +
 * part_kv_heads - 1, blocks [first_block, end_block) of their context, as
 * split `split` of the group's n_splits. */
typedef struct attention_item {
    int32_t group, kv_head0, split, n_splits;
    int64_t first_block, end_block;
} attention_item;

typedef struct attention_problem {
    kv_source kv;
    int32_t n_tokens, n_heads;
    float scale;
    const float *q;           /* [T][n_heads][head_dim] */
    const int32_t *token_seq; /* [T] */
    const int32_t *token_pos; /* [T] */
    float *out;               /* [T][n_heads][head_dim] */
    int32_t part_kv_heads;    /* kv heads per work item */
    /* Token indices sorted by (sequence, position), cut into groups of up
     * to QUERY_BLOCK tokens of one sequence: group g is
     * order[group_start[g] .. group_start[g + 1]). */
    const int32_t *order, *group_start;
    int32_t n_groups;
    /* Split-K partials, for tokens whose group has more than one split:
     * token i, query head h, split s is entry (s * n_tokens + i) * n_heads
     * + h of part_max and part_sum, and row of head_dim floats of part_acc. */
    float *part_max, *part_sum, *part_acc;
    const int32_t *token_splits; /* [T] its group's split count */
    attention_kernels kernels;
} attention_problem;

/* One thread's working memory for an item of up to QUERY_BLOCK tokens and
 * n_h = part_kv_heads * group query heads each; every array (and each
 * token's slice) is a multiple of LANES floats. */
typedef struct attention_scratch {
    float *q;      /* [n_h][head_dim] query rows times scale */
    float *acc;    /* [n_h][head_dim] unnormalised outputs */
    float *max;    /* [n_h] running max score */
    float *sum;    /* [n_h] running sum of exp(score - max) */
    float *scores; /* [n_h][block_tokens rounded up to LANES] scores, then weights */
    float *k_rows; /* [block_tokens][part_kv_heads][head_dim] f16 rows widened */
    float *v_rows;
    /* per-token slices: token j's q is q + j * q_stride, and so on */
    size_t q_stride, head_stride, score_stride;
} attention_scratch;

static size_t round_lanes(size_t n)
{
    return (n + LANES - 1) / LANES * LANES;
}

/* Carves the scratch out of base, or (base NULL) just counts its floats. */
static size_t scratch_carve(float *base, const attention_problem *pb, attention_scratch *s)
{
    size_t n_h = (size_t)pb->part_kv_heads * (size_t)(pb->n_heads / pb->kv.n_kv_heads);
    size_t head_dim = (size_t)pb->kv.head_dim, block = (size_t)pb->kv.block_tokens;
    s->q_stride = round_lanes(n_h * head_dim);
    s->head_stride = round_lanes(n_h);
    s->score_stride = n_h * round_lanes(block);
    size_t sizes[7] = {
        QUERY_BLOCK * s->q_stride, QUERY_BLOCK * s->q_stride, QUERY_BLOCK * s->head_stride,
        QUERY_BLOCK * s->head_stride, QUERY_BLOCK * s->score_stride,
        round_lanes(block * (size_t)pb->part_kv_heads * head_dim),
        round_lanes(block * (size_t)pb->part_kv_heads * head_dim),
    };
    float **arrays[7] = {&s->q, &s->acc, &s->max, &s->sum, &s->scores, &s->k_rows, &s->v_rows};
    size_t total = 0;
    for (int i = 0; i < 7; i++) {
        if (base)
            *arrays[i] = base + total;
        total += sizes[i];
    }
    return total;
}

/* Token j's slice of the scratch (the f16 rows are shared). */
static attention_scratch token_slice(const attention_scratch *s, int32_t j)
{
    attention_scratch t = *s;
    t.q += (size_t)j * s->q_stride;
    t.acc += (size_t)j * s->q_stride;
    t.max += (size_t)j * s->head_stride;
    t.sum += (size_t)j * s->head_stride;
    t.scores += (size_t)j * s->score_stride;
    return t;
}

/* The block after the one being computed. Paged blocks lie anywhere in the
 * pool, so the hardware prefetcher alone would stall at every block (and
 * page) boundary: row t of the next block's K is prefetched while row t of
 * this block's K is used (V likewise), spreading the requests over the
 * block. The contiguous layout gets the same, so the two differ only in
 * addressing. rows = 0: nothing to prefetch. */
typedef struct next_block {
    const char *k, *v;
    int32_t rows;
    int64_t stride_bytes; /* between rows */
    size_t row_bytes;     /* of the item's kv heads */
} next_block;

/* Prefetch row t of the next block's K (or V) rows starting at `rows`. */
static inline void prefetch_row(const next_block *nb, const char *rows, int32_t t)
{
#if defined(__GNUC__)
    if (!nb || t >= nb->rows)
        return;
    for (size_t b = 0; b < nb->row_bytes; b += 64)
        __builtin_prefetch(rows + t * nb->stride_bytes + b);
#else
    (void)nb, (void)rows, (void)t;
#endif
}

/* Online-softmax update of an item's n_h query heads with one block of rows.
 *   s->q      [n_h][head_dim] (scaled); query head h reads kv head h / group
 *   k, v      rows x [part kv heads][head_dim], row_stride elements apart
 *   s->max, s->sum [n_h]; s->acc [n_h][head_dim]
 *   s->scores [n_h][block], block = chunk rows rounded up to whole LANES
 * Each K and V row is read once, front to back, for all the item's heads. */
PV_CPU_CLONES static void attend_block(attention_scratch *s, int32_t n_h, int32_t group, int32_t head_dim,
                                       int32_t block, const float *k, const float *v, int64_t row_stride,
                                       int32_t rows, const next_block *next, exp_weights_fn exp_weights)
{
    /* scores[h][t] = q_h . k_t */
    for (int32_t t = 0; t < rows; t++) {
        prefetch_row(next, next ? next->k : NULL, t);
        const float *k_row = k + t * row_stride;
        for (int32_t h = 0; h < n_h; h++)
            s->scores[h * block + t] =
                dot_lanes(s->q + (size_t)h * head_dim, k_row + (size_t)(h / group) * head_dim, head_dim);
    }
    /* Rescale what is accumulated to the new running max; scores -> weights. */
    for (int32_t h = 0; h < n_h; h++) {
        float *scores = s->scores + (size_t)h * block;
        float block_max = -INFINITY;
        for (int32_t t = 0; t < rows; t++)
            block_max = scores[t] > block_max ? scores[t] : block_max;
        float new_max = s->max[h] > block_max ? s->max[h] : block_max;
        /* exp(-inf) = 0 on the first block, when nothing is accumulated yet. */
        float rescale = expf(s->max[h] - new_max);
        if (rescale != 1.0f) {
            s->sum[h] *= rescale;
            scale_lanes(s->acc + (size_t)h * head_dim, rescale, head_dim);
        }
        /* Whole lanes; lanes past `rows` get weight 0 below. */
        exp_weights(scores, (rows + LANES - 1) / LANES * LANES, new_max);
        for (int32_t t = rows; t < block; t++)
            scores[t] = 0.0f;
        for (int32_t t = 0; t < rows; t++)
            s->sum[h] += scores[t];
        s->max[h] = new_max;
    }
    /* acc_h += weight[h][t] * v_t */
    for (int32_t t = 0; t < rows; t++) {
        prefetch_row(next, next ? next->v : NULL, t);
        const float *v_row = v + t * row_stride;
        for (int32_t h = 0; h < n_h; h++)
            axpy_lanes(s->acc + (size_t)h * head_dim, s->scores[h * block + t],
                       v_row + (size_t)(h / group) * head_dim, head_dim);
    }
}

/* Item it: its group's query tokens (one sequence, ascending positions),
 * its kv heads and the query heads that read them, over its blocks up to
 * the last token's position. Each K/V block is read (and widened) once;
 * every token then takes the rows up to its own position. The result is
 * the output, or with several splits the split's partial. */
static void attend_item(const attention_problem *pb, attention_scratch *s, const attention_item *it)
{
    int32_t gi = it->group, g0 = it->kv_head0;
    const kv_source *kv = &pb->kv;
    int32_t head_dim = kv->head_dim;
    int32_t group = pb->n_heads / kv->n_kv_heads;
    int32_t n_h = pb->part_kv_heads * group;
    int32_t part_elems = pb->part_kv_heads * head_dim;
    const int32_t *tokens = pb->order + pb->group_start[gi];
    int32_t n_tok = pb->group_start[gi + 1] - pb->group_start[gi];
    int32_t seq = pb->token_seq[tokens[0]];
    int64_t n_ctx = (int64_t)pb->token_pos[tokens[n_tok - 1]] + 1; /* the longest context */
    int64_t begin = it->first_block * kv->block_tokens;
    int64_t end = it->end_block * kv->block_tokens < n_ctx ? it->end_block * kv->block_tokens : n_ctx;
    int64_t row_stride = (int64_t)kv->n_kv_heads * head_dim;
    int32_t score_stride = (int32_t)round_lanes((size_t)kv->block_tokens);

    for (int32_t j = 0; j < n_tok; j++) {
        attention_scratch t = token_slice(s, j);
        const float *q = pb->q + ((size_t)tokens[j] * pb->n_heads + (size_t)g0 * group) * head_dim;
        for (size_t e = 0; e < (size_t)n_h * head_dim; e++)
            t.q[e] = q[e] * pb->scale;
        memset(t.acc, 0, (size_t)n_h * head_dim * sizeof(float));
        /* Score lanes past a short block's rows are read (then zeroed) by
         * the vectorised exp: give them defined values. */
        memset(t.scores, 0, (size_t)n_h * score_stride * sizeof(float));
        for (int32_t h = 0; h < n_h; h++) {
            t.max[h] = -INFINITY;
            t.sum[h] = 0.0f;
        }
    }

    size_t elem = pv_dtype_size(kv->dtype);
    for (int64_t first = begin; first < end; first += kv->block_tokens) {
        int32_t rows = (int32_t)(end - first < kv->block_tokens ? end - first : kv->block_tokens);
        const void *k, *v;
        kv_block(kv, seq, first, g0, &k, &v);
        next_block nb = {.rows = 0, .stride_bytes = row_stride * (int64_t)elem,
                         .row_bytes = (size_t)part_elems * elem};
        if (first + kv->block_tokens < end) {
            const void *next_k, *next_v;
            kv_block(kv, seq, first + kv->block_tokens, g0, &next_k, &next_v);
            nb.k = next_k;
            nb.v = next_v;
            int64_t left = end - first - kv->block_tokens;
            nb.rows = (int32_t)(left < kv->block_tokens ? left : kv->block_tokens);
        }
        const float *k_rows = k, *v_rows = v;
        int64_t stride = row_stride;
        if (kv->dtype == PV_F16) {
            for (int32_t t = 0; t < rows; t++) {
                prefetch_row(&nb, nb.k, t);
                prefetch_row(&nb, nb.v, t);
                const widen_half_fn widen = pb->kernels.widen_half;
                widen(s->k_rows + (size_t)t * part_elems, (const uint16_t *)k + t * row_stride, part_elems);
                widen(s->v_rows + (size_t)t * part_elems, (const uint16_t *)v + t * row_stride, part_elems);
            }
            k_rows = s->k_rows;
            v_rows = s->v_rows;
            stride = part_elems;
        }
        for (int32_t j = 0; j < n_tok; j++) {
            int64_t ctx_j = (int64_t)pb->token_pos[tokens[j]] + 1;
            if (ctx_j <= first)
                continue; /* this block is past token j's position */
            int32_t rows_j = (int32_t)(ctx_j - first < rows ? ctx_j - first : rows);
            attention_scratch t = token_slice(s, j);
            /* f32 rows are prefetched while the last (longest) token reads them */
            const next_block *prefetch = kv->dtype == PV_F32 && j == n_tok - 1 ? &nb : NULL;
            attend_block(&t, n_h, group, head_dim, score_stride, k_rows, v_rows, stride, rows_j, prefetch,
                         pb->kernels.exp_weights);
        }
    }

    for (int32_t j = 0; j < n_tok; j++) {
        attention_scratch t = token_slice(s, j);
        size_t head0 = (size_t)tokens[j] * pb->n_heads + (size_t)g0 * group;
        if (it->n_splits == 1) {
            float *out = pb->out + head0 * head_dim;
            for (int32_t h = 0; h < n_h; h++)
                for (int32_t d = 0; d < head_dim; d++)
                    out[(size_t)h * head_dim + d] = t.acc[(size_t)h * head_dim + d] / t.sum[h];
            continue;
        }
        /* A token this split does not reach keeps max -inf, sum 0, acc 0. */
        size_t at = (size_t)it->split * pb->n_tokens * pb->n_heads + head0;
        memcpy(pb->part_max + at, t.max, (size_t)n_h * sizeof(float));
        memcpy(pb->part_sum + at, t.sum, (size_t)n_h * sizeof(float));
        memcpy(pb->part_acc + at * head_dim, t.acc, (size_t)n_h * head_dim * sizeof(float));
    }
}

/* Token i's output from its n_splits partials (all its query heads). */
static void combine_splits(const attention_problem *pb, int32_t i, int32_t n_splits)
{
    int32_t head_dim = pb->kv.head_dim;
    size_t split_stride = (size_t)pb->n_tokens * pb->n_heads;
    for (int32_t h = 0; h < pb->n_heads; h++) {
        size_t at = (size_t)i * pb->n_heads + h;
        float top = -INFINITY;
        for (int32_t sp = 0; sp < n_splits; sp++) {
            float m = pb->part_max[sp * split_stride + at];
            top = m > top ? m : top;
        }
        float *out = pb->out + at * head_dim;
        memset(out, 0, (size_t)head_dim * sizeof(float));
        float sum = 0.0f;
        for (int32_t sp = 0; sp < n_splits; sp++) {
            float m = pb->part_max[sp * split_stride + at];
            if (m == -INFINITY)
                continue; /* no rows of this split reach the token */
            float w = expf(m - top);
            sum += w * pb->part_sum[sp * split_stride + at];
            axpy_lanes(out, w, pb->part_acc + (sp * split_stride + at) * head_dim, head_dim);
        }
        scale_lanes(out, 1.0f / sum, head_dim);
    }
}

typedef struct token_key {
    int64_t key; /* sequence << 32 | position */
    int32_t index;
} token_key;

static int by_key(const void *lhs, const void *rhs)
{
    const token_key *x = lhs, *y = rhs;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Fills order[T] (token indices by sequence, then position) and
 * group_start[T + 1]; returns the number of groups, or -1 when out of
 * memory. */
static int32_t group_tokens(const attention_problem *pb, int32_t *order, int32_t *group_start)
{
    token_key *keys = malloc((size_t)pb->n_tokens * sizeof *keys);
    if (!keys)
        return -1;
    for (int32_t i = 0; i < pb->n_tokens; i++) {
        keys[i].key = (int64_t)pb->token_seq[i] * ((int64_t)1 << 32) + pb->token_pos[i];
        keys[i].index = i;
    }
    qsort(keys, (size_t)pb->n_tokens, sizeof *keys, by_key);
    int32_t n_groups = 0;
    for (int32_t i = 0; i < pb->n_tokens; i++) {
        order[i] = keys[i].index;
        int new_group = i == 0 || pb->token_seq[order[i]] != pb->token_seq[order[i - 1]] ||
                        i - group_start[n_groups - 1] == QUERY_BLOCK;
        if (new_group)
            group_start[n_groups++] = i;
    }
    group_start[n_groups] = pb->n_tokens;
    free(keys);
    return n_groups;
}

/* Work items the planner aims for per thread: a few each, handed out
 * dynamically, even out a core that other processes slow down. */
#define ITEMS_PER_THREAD 4

/* Fewest blocks in a split (256 rows at 32-token chunks). A split's fixed
 * costs are scaling q, clearing its scratch, writing its partial (per token
 * n_h x head_dim floats: about a tenth of one f16 block's K and V for
 * SmolLM2 or Llama 3 heads) and its share of the combine; over 8 blocks of
 * reads they stay near 1%, and a 2048-token context still splits 8 ways. */
#define MIN_SPLIT_BLOCKS 8

/* The work plan: items (groups x kv-head parts x context splits) and each
 * token's split count. */
typedef struct attention_plan {
    int32_t *order, *group_start; /* see attention_problem */
    int32_t *token_splits;        /* [T] */
    attention_item *items;
    int64_t n_items;
    int32_t max_splits;
} attention_plan;

static void plan_free(attention_plan *plan)
{
    free(plan->order);
    free(plan->group_start);
    free(plan->token_splits);
    free(plan->items);
}

/* Context splits of a group of `blocks` blocks, when n_groups x parts items
 * are too few for n_threads: its share, by blocks, of ITEMS_PER_THREAD x
 * n_threads items (total_blocks over all groups), each split at least
 * MIN_SPLIT_BLOCKS long. One thread gains nothing from splits and would pay
 * the combine. */
static int32_t split_count(int64_t blocks, int64_t total_blocks, int64_t n_groups, int32_t parts, int n_threads)
{
    int64_t target = ITEMS_PER_THREAD * (int64_t)n_threads;
    if (n_threads < 2 || n_groups * parts >= target)
        return 1;
    int64_t share = parts * total_blocks;
    int64_t want = (target * blocks + share - 1) / share;
    int64_t fit = blocks / MIN_SPLIT_BLOCKS;
    int64_t n = want < fit ? want : fit;
    return n > 1 ? (int32_t)n : 1;
}

/* Groups the tokens and cuts the work into items; forced_splits > 0 gives
 * every group that many splits (then some may hold no block). Sets
 * pb->part_kv_heads, order, group_start, n_groups and token_splits. */
static pv_status plan_items(attention_problem *pb, int n_threads, int32_t forced_splits, attention_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    plan->order = malloc((size_t)pb->n_tokens * sizeof *plan->order);
    plan->group_start = malloc(((size_t)pb->n_tokens + 1) * sizeof *plan->group_start);
    plan->token_splits = malloc((size_t)pb->n_tokens * sizeof *plan->token_splits);
    int32_t n_groups = -1;
    if (plan->order && plan->group_start && plan->token_splits)
        n_groups = group_tokens(pb, plan->order, plan->group_start);
    if (n_groups < 0) {
        plan_free(plan);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu attention: cannot allocate the token order for n_tokens %d",
                        pb->n_tokens);
    }
    pb->order = plan->order;
    pb->group_start = plan->group_start;
    pb->n_groups = n_groups;
    pb->token_splits = plan->token_splits;

    /* A work item is a group of query tokens with all their heads, so K/V
     * rows stream front to back. Only when groups are too few to keep every
     * thread busy (long-context decode of a few sequences) are heads split,
     * and then the context (split_count). */
    /* Parts: the fewest that divide the KV heads and reach the target, else
     * one per KV head (SmolLM2's 3 heads: 3 items, not 1 on one thread). */
    int32_t parts = 1;
    while ((int64_t)n_groups * parts < ITEMS_PER_THREAD * (int64_t)n_threads && parts < pb->kv.n_kv_heads) {
        parts++;
        while (pb->kv.n_kv_heads % parts != 0)
            parts++;
    }
    pb->part_kv_heads = pb->kv.n_kv_heads / parts;

    int64_t block = pb->kv.block_tokens, total_blocks = 0;
    for (int32_t g = 0; g < n_groups; g++)
        total_blocks += (pb->token_pos[plan->order[plan->group_start[g + 1] - 1]] + block) / block;
    int64_t n_items = 0;
    plan->max_splits = 1;
    for (int32_t g = 0; g < n_groups; g++) {
        int64_t blocks = (pb->token_pos[plan->order[plan->group_start[g + 1] - 1]] + block) / block;
        int32_t splits = forced_splits > 0 ? forced_splits
                                           : split_count(blocks, total_blocks, n_groups, parts, n_threads);
        for (int32_t i = plan->group_start[g]; i < plan->group_start[g + 1]; i++)
            plan->token_splits[plan->order[i]] = splits;
        plan->max_splits = splits > plan->max_splits ? splits : plan->max_splits;
        n_items += (int64_t)parts * splits;
    }

    plan->items = malloc((size_t)n_items * sizeof *plan->items);
    if (!plan->items) {
        plan_free(plan);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu attention: cannot allocate %lld work items",
                        (long long)n_items);
    }
    attention_item *it = plan->items;
    for (int32_t g = 0; g < n_groups; g++) {
        int64_t blocks = (pb->token_pos[plan->order[plan->group_start[g + 1] - 1]] + block) / block;
        int32_t splits = plan->token_splits[plan->order[plan->group_start[g]]];
        for (int32_t sp = 0; sp < splits; sp++)
            for (int32_t p = 0; p < parts; p++)
                *it++ = (attention_item){
                    .group = g,
                    .kv_head0 = p * pb->part_kv_heads,
                    .split = sp,
                    .n_splits = splits,
                    .first_block = sp * blocks / splits,
                    .end_block = (sp + 1) * blocks / splits,
                };
    }
    plan->n_items = n_items;
    return PV_OK;
}

static pv_status attention_run(attention_problem *pb, int32_t forced_splits)
{
    int n_threads = pv_cpu_max_threads();
    attention_plan plan;
    pv_status st = plan_items(pb, n_threads, forced_splits, &plan);
    if (st != PV_OK)
        return st;

    attention_scratch counted;
    size_t per_thread = scratch_carve(NULL, pb, &counted);
    /* Split partials: max and sum per token, split and head, then the
     * unnormalised outputs. */
    size_t part_heads = plan.max_splits > 1 ? (size_t)plan.max_splits * pb->n_tokens * pb->n_heads : 0;
    size_t part_floats = part_heads * (2 + (size_t)pb->kv.head_dim);
    size_t floats = per_thread * (size_t)n_threads + part_floats;
    float *scratch = NULL;
    if (posix_memalign((void **)&scratch, 64, floats * sizeof(float)) != 0) {
        plan_free(&plan);
        return pv_error(PV_ERR_OUT_OF_MEMORY,
                        "cpu attention: cannot allocate %zu bytes of scratch for %d threads and %d splits "
                        "(n_tokens %d, n_heads %d, head_dim %d, chunk_tokens %d)",
                        floats * sizeof(float), n_threads, plan.max_splits, pb->n_tokens, pb->n_heads,
                        pb->kv.head_dim, pb->kv.block_tokens);
    }
    pb->part_max = scratch + per_thread * (size_t)n_threads;
    pb->part_sum = pb->part_max + part_heads;
    pb->part_acc = pb->part_sum + part_heads;

    int64_t n_items = plan.n_items;
    int split = plan.max_splits > 1;
    PV_CPU_OMP("omp parallel")
    {
        attention_scratch s;
        scratch_carve(scratch + per_thread * (size_t)pv_cpu_thread_id(), pb, &s);
        PV_CPU_OMP("omp for schedule(dynamic, 1)")
        for (int64_t item = 0; item < n_items; item++)
            attend_item(pb, &s, &plan.items[item]);
        /* after the loop's barrier: every partial is written */
        if (split) {
            PV_CPU_OMP("omp for schedule(static)")
            for (int32_t i = 0; i < pb->n_tokens; i++)
                if (pb->token_splits[i] > 1)
                    combine_splits(pb, i, pb->token_splits[i]);
        }
    }
    free(scratch);
    plan_free(&plan);
    return PV_OK;
}

static attention_problem paged_problem(const pv_attention_args *a, int avx2_kernels)
{
    return (attention_problem){
        .kv = {
            .dtype = a->kv_dtype,
            .n_kv_heads = a->n_kv_heads,
            .head_dim = a->head_dim,
            .block_tokens = a->chunk_tokens,
            .pool = a->kv_pool->host_ptr,
            .slot_table = a->slot_table,
            .max_chunks = a->max_chunks,
        },
        .n_tokens = a->n_tokens,
        .n_heads = a->n_heads,
        .scale = a->scale,
        .q = pv_cpu_elem_ptr(a->q, a->q_off, sizeof(float)),
        .token_seq = a->token_seq,
        .token_pos = a->token_pos,
        .out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float)),
        .kernels = attention_kernels_for(avx2_kernels),
    };
}

pv_status pv_cpu_attention(pv_backend *be, const pv_attention_args *a)
{
    attention_problem pb = paged_problem(a, pv_cpu_avx2_kernels(be));
    return attention_run(&pb, 0);
}

pv_status pv_cpu_attention_forced_splits(const pv_attention_args *a, int32_t n_splits)
{
    if (n_splits < 1)
        return pv_error(PV_ERR_INVALID_ARG, "cpu attention: n_splits = %d must be >= 1", n_splits);
    attention_problem pb = paged_problem(a, pv_cpu_avx2_available());
    return attention_run(&pb, n_splits);
}

pv_status pv_cpu_attention_split_count(const pv_attention_args *a, int32_t *n_splits)
{
    attention_problem pb = paged_problem(a, pv_cpu_avx2_available());
    attention_plan plan;
    pv_status st = plan_items(&pb, pv_cpu_max_threads(), 0, &plan);
    if (st != PV_OK)
        return st;
    *n_splits = plan.max_splits;
    plan_free(&plan);
    return PV_OK;
}

pv_status pv_cpu_attention_contiguous(const pv_cpu_contiguous_attention_args *a)
{
    attention_problem pb = {
        .kv = {
            .dtype = a->kv_dtype,
            .n_kv_heads = a->n_kv_heads,
            .head_dim = a->head_dim,
            .block_tokens = CONTIGUOUS_BLOCK_TOKENS,
            .k = a->k,
            .v = a->v,
            .max_tokens = a->max_tokens,
        },
        .n_tokens = a->n_tokens,
        .n_heads = a->n_heads,
        .scale = a->scale,
        .q = a->q,
        .token_seq = a->token_seq,
        .token_pos = a->token_pos,
        .out = a->out,
        .kernels = attention_kernels_for(pv_cpu_avx2_available()),
    };
    return attention_run(&pb, 0);
}

/* Token i's K and V rows (k, v: [T][n_kv_heads][head_dim]) go to row
 * token_pos[i] % chunk_tokens of its chunk's slot, as kv_dtype; the rest
 * of a comes from the caller's checked arguments. */
static void write_rows(const pv_kv_write_args *a, const float *k, const float *v)
{
    int64_t row_elems = (int64_t)a->n_kv_heads * a->head_dim;
    int64_t slot_elems = 2 * (int64_t)a->chunk_tokens * row_elems;
    size_t elem = pv_dtype_size(a->kv_dtype);

    PV_CPU_OMP("omp parallel for schedule(static) if ((int64_t)a->n_tokens * row_elems >= PV_CPU_PARALLEL_MIN)")
    for (int32_t i = 0; i < a->n_tokens; i++) {
        int64_t pos = a->token_pos[i];
        int64_t slot = a->slot_table[(int64_t)a->token_seq[i] * a->max_chunks + pos / a->chunk_tokens];
        int64_t k_elem = slot * slot_elems + (pos % a->chunk_tokens) * row_elems;
        int64_t v_elem = k_elem + (int64_t)a->chunk_tokens * row_elems;
        const float *k_src = k + (size_t)i * row_elems;
        const float *v_src = v + (size_t)i * row_elems;
        if (a->kv_dtype == PV_F32) {
            memcpy((float *)a->kv_pool->host_ptr + k_elem, k_src, (size_t)row_elems * elem);
            memcpy((float *)a->kv_pool->host_ptr + v_elem, v_src, (size_t)row_elems * elem);
        } else {
            pv_half *k_dst = (pv_half *)a->kv_pool->host_ptr + k_elem;
            pv_half *v_dst = (pv_half *)a->kv_pool->host_ptr + v_elem;
            for (int64_t e = 0; e < row_elems; e++) {
                k_dst[e] = pv_float_to_half(k_src[e]);
                v_dst[e] = pv_float_to_half(v_src[e]);
            }
        }
    }
}

pv_status pv_cpu_kv_write(pv_backend *be, const pv_kv_write_args *a)
{
    write_rows(a, pv_cpu_elem_ptr(a->k, a->k_off, sizeof(float)), pv_cpu_elem_ptr(a->v, a->v_off, sizeof(float)));
    return PV_OK;
}

/* pv_cpu_rope on q, then on a copy of k, which pv_cpu_kv_write stores with v. */
pv_status pv_cpu_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a)
{
    float *q = pv_cpu_elem_ptr(a->q, a->q_off, sizeof(float));
    const size_t k_elems = (size_t)a->n_tokens * (size_t)a->n_kv_heads * (size_t)a->head_dim;
    float *k_turned = malloc(k_elems * sizeof *k_turned);
    if (!k_turned)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu rope_kv_write: cannot allocate %zu floats for the rotated k",
                        k_elems);
    pv_cpu_rope_rows(q, q, a->n_tokens, a->n_heads, a->head_dim, a->token_pos, a->base, a->neox);
    pv_cpu_rope_rows(pv_cpu_elem_ptr(a->k, a->k_off, sizeof(float)), k_turned, a->n_tokens, a->n_kv_heads,
                     a->head_dim, a->token_pos, a->base, a->neox);
    const pv_kv_write_args rows = {
        .kv_dtype = a->kv_dtype, .n_tokens = a->n_tokens, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .chunk_tokens = a->chunk_tokens, .kv_pool = a->kv_pool, .n_slots = a->n_slots,
        .token_seq = a->token_seq, .token_pos = a->token_pos, .slot_table = a->slot_table, .n_seqs = a->n_seqs,
        .max_chunks = a->max_chunks,
    };
    write_rows(&rows, k_turned, pv_cpu_elem_ptr(a->v, a->v_off, sizeof(float)));
    free(k_turned);
    return PV_OK;
}
