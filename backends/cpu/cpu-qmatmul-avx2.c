/* The quantized-matmul kernels for x86-64 CPUs with AVX2, FMA and F16C
 * (Haswell and Zen onwards), written with intrinsics under a target
 * attribute: the file builds without -mavx2 and cpu-qmatmul.c calls these
 * only after asking the CPU. The portable kernels in cpu-qmatmul.c are the
 * specification. F32, F16 and BF16 rows are widened to f32 in registers and
 * dotted with up to PV_QTILE rows of x at once; the block types (Q8_0, Q4_0,
 * Q4_1) multiply their codes with x rounded to 16 bits in integers (below).
 * Either way a weight is read from memory once per call. */
#include "config.h"

#include "backends/cpu/cpu-qmatmul.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <float.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* Eight weights of the unblocked types. */
AVX2_INLINE __m256 load8_f32(const uint8_t *p)
{
    return _mm256_loadu_ps((const float *)p);
}

AVX2_INLINE __m256 load8_f16(const uint8_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2_INLINE __m256 load8_bf16(const uint8_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

AVX2_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The tile functions take NT, a constant once inlined (the row loops
 * switch over 1..QTILE), so the loops over the tile unroll and the
 * accumulators stay in registers. */
#define TILE_SWITCH(TILE, nt, ...)                                                                 \
    switch (nt) {                                                                                  \
    case 1: TILE(__VA_ARGS__, 1); break;                                                           \
    case 2: TILE(__VA_ARGS__, 2); break;                                                           \
    case 3: TILE(__VA_ARGS__, 3); break;                                                           \
    default: TILE(__VA_ARGS__, 4); break;                                                          \
    }

/* Unblocked types: any n_in, sixteen at a time, then eight, then the
 * portable scalar tail (the same products, so odd lengths agree). */
#define DEFINE_FLAT_ROWS(name, LOAD8, type, es)                                                     \
    AVX2_INLINE void name##_tile(const uint8_t *wr, int64_t n_in, const float *xt, float *y,        \
                                 int64_t ldy, const int nt)                                        \
    {                                                                                              \
        const int64_t n8 = n_in / 8 * 8;                                                           \
        __m256 a0[PV_QTILE], a1[PV_QTILE];                                                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++)                                                               \
            a0[j] = a1[j] = _mm256_setzero_ps();                                                   \
        int64_t k = 0;                                                                             \
        for (; k + 16 <= n8; k += 16) {                                                            \
            const __m256 q0 = LOAD8(wr + k * (es)), q1 = LOAD8(wr + (k + 8) * (es));               \
            _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                         \
                a0[j] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xt + j * n_in + k), a0[j]);            \
                a1[j] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xt + j * n_in + k + 8), a1[j]);        \
            }                                                                                      \
        }                                                                                          \
        if (k < n8) {                                                                              \
            const __m256 q0 = LOAD8(wr + k * (es));                                                \
            _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++)                                                           \
                a0[j] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xt + j * n_in + k), a0[j]);           \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                             \
            float s = hsum(_mm256_add_ps(a0[j], a1[j]));                                           \
            for (int64_t kk = n8; kk < n_in; kk++)                                                 \
                s += pv_cpu_weight_at(type, wr, kk) * xt[j * n_in + kk];                           \
            y[j * ldy] = s;                                                                        \
        }                                                                                          \
    }                                                                                              \
    AVX2 static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x, int64_t T,   \
                          float *y, int64_t ldy)                                                   \
    {                                                                                              \
        for (int64_t r = 0; r < n_rows; r++)                                                       \
            for (int64_t t0 = 0; t0 < T; t0 += PV_QTILE) {                                         \
                const int64_t nt = T - t0 < PV_QTILE ? T - t0 : PV_QTILE;                          \
                TILE_SWITCH(name##_tile, nt, w + r * n_in * (es), n_in, x + t0 * n_in,             \
                            y + t0 * ldy + r, ldy)                                                 \
            }                                                                                      \
    }

DEFINE_FLAT_ROWS(rows_f32, load8_f32, PV_W_F32, 4)
DEFINE_FLAT_ROWS(rows_f16, load8_f16, PV_W_F16, 2)
DEFINE_FLAT_ROWS(rows_bf16, load8_bf16, PV_W_BF16, 2)

/* ---- integer dot products against 16-bit activations ------------------------------
 * Widening 4-bit codes to f32 costs 27 vector ops per 32 weights and bounds
 * decode. With the activations rounded to 16 bits (relative error 2^-16 of a
 * block's largest, far below the weights' own), the codes widen only to
 * 16-bit integers and two madds multiply and pair-sum all 32. Sums stay in
 * range: |code| <= 128 times |x| <= 32767, 32 to a block, < 2^28.
 *
 * Blocks go in groups of eight: their integer sums are reduced to one lane
 * each and scaled together (8 weight scales by 8 activation scales), so the
 * per-block float work of scaling and accumulating is paid once per eight
 * blocks; the scales come from one gather. The integer sums are exact, so a
 * token's result does not depend on the other tokens in its tile. */

/* Weight scales of blocks g .. g+n-1 (n <= 8) of a row: the f16 d at the start
 * of each block and, for Q4_1, the f16 m after it; lanes past n are 0. */
AVX2_INLINE void block_scales(const uint8_t *first, int bb, int n, __m256 *d, __m256 *m)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(bb));
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    /* Each dword holds d (low half) and the next two bytes (Q4_1's m). */
    const __m256i dm = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)first, idx, lanes, 1);
    const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9,
                                           12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    /* Per 128-bit lane: four d halves, then four m halves; then d of all
     * eight in the low lane, m in the high. */
    const __m256i h = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dm, split), 0xd8);
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *m = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* Codes of one block as 16-bit integers: elements 0-15 and 16-31. */
AVX2_INLINE void codes_q4(const uint8_t *qs, __m256i *lo, __m256i *hi)
{
    /* The 16 bytes in both lanes, zero-extended in place to 16 bits (bytes
     * 0-7 in the low lane, 8-15 in the high): no lane-crossing widening. */
    const __m256i spread = _mm256_setr_epi8(0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5, -1, 6, -1, 7, -1, 8, -1, 9, -1, 10,
                                            -1, 11, -1, 12, -1, 13, -1, 14, -1, 15, -1);
    const __m256i q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs)), spread);
    *lo = _mm256_and_si256(q, _mm256_set1_epi16(15));
    *hi = _mm256_srli_epi16(q, 4);
}

AVX2_INLINE void codes_q8(const uint8_t *qs, __m256i *lo, __m256i *hi)
{
    *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
    *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
}

/* Eight lanes of partial sums of one block, against its 32 activations. */
AVX2_INLINE __m256i block_dot(__m256i lo, __m256i hi, const int16_t *xq)
{
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 16))));
}

/* Tokens per pass in batches: a group's codes are unpacked once per pass,
 * and the pass's accumulators (2 KB) stay in L1. */
#define XQ_TOKENS 16
/* Decode asks for W this many bytes ahead of the group it reads: at one
 * token the kernel computes too slowly for the hardware prefetcher to run far
 * enough ahead on its own (bench-qmatmul, one token, weights from memory,
 * alternating: Q8_0 17-20 -> 24-27 GB/s, Q4_1 13-16 -> 15-17; 4096 bytes
 * gave the same; model decode +9%). */
#define XQ_PREFETCH 2048

/* A group's codes unpacked for reuse across the tokens of a batch. */
typedef struct xq_codes {
    __m256i lo[8], hi[8];
} xq_codes;

/* One group of n blocks (n = 8 except in a row's last group) against one
 * token's x. The blocks' partial sums are reduced in pairs as they come
 * (hadd): quad 0 holds blocks 0-3 (low lane: elements 0-3 of each, high:
 * 4-7), quad 1 blocks 4-7. Past a row's last block nothing is added (a pair
 * with one block left gets zero codes against x's zero padding). Decode
 * (codes straight from W) and batches (from an xq_codes) run the same integer
 * sums and the same float operations, so a token's result is the same bits
 * in either. CODES_OF(src, b, n, &lo, &hi) gives block b's codes, zero past n. */
#define XQ_GROUP_SUMS(CODES_OF, src)                                                               \
    __m256i quad[2], pair = _mm256_setzero_si256();                                                \
    _Pragma("GCC unroll 8") for (int b = 0; b < 8; b += 2) {                                       \
        __m256i s = _mm256_setzero_si256();                                                        \
        if (b < n) {                                                                               \
            __m256i lo0, hi0, lo1, hi1;                                                            \
            CODES_OF(src, b, n, &lo0, &hi0);                                                       \
            CODES_OF(src, b + 1, n, &lo1, &hi1);                                                   \
            s = _mm256_hadd_epi32(block_dot(lo0, hi0, xb + 32 * b), block_dot(lo1, hi1, xb + 32 * (b + 1))); \
        }                                                                                          \
        if (b % 4 == 0)                                                                            \
            pair = s;                                                                              \
        else                                                                                       \
            quad[b / 4] = _mm256_hadd_epi32(pair, s);                                              \
    }                                                                                              \
    const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(quad[0], quad[1], 0x20),       \
                                          _mm256_permute2x128_si256(quad[0], quad[1], 0x31))

AVX2_INLINE void codes_of_buffer(const xq_codes *c, int b, int n, __m256i *lo, __m256i *hi)
{
    (void)n; /* the buffer holds zeros past n */
    *lo = c->lo[b];
    *hi = c->hi[b];
}

#define DEFINE_XQ_ROWS(name, CODES, KIND, bb, qoff)                                                \
    AVX2_INLINE void name##_scales(const uint8_t *wg, const int n, __m256 *dw, __m256 *mw)         \
    {                                                                                              \
        block_scales(wg, bb, n, dw, mw);                                                           \
        if (KIND == 40)                                                                            \
            *mw = _mm256_mul_ps(*dw, _mm256_set1_ps(-8.0f)); /* d (q - 8) = d q - 8 d */            \
    }                                                                                              \
    AVX2_INLINE void name##_accumulate(__m256i sums, __m256 dw, __m256 mw, const pv_cpu_xq16 *xq,  \
                                       int64_t at, __m256 *acc, __m256 *accm)                      \
    {                                                                                              \
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, _mm256_loadu_ps(xq->d + at)), *acc); \
        if (KIND != 8)                                                                             \
            *accm = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xq->s + at), *accm);                       \
    }                                                                                              \
    AVX2_INLINE void name##_codes_w(const uint8_t *wg, int b, int n, __m256i *lo, __m256i *hi)     \
    {                                                                                              \
        if (b < n)                                                                                 \
            CODES(wg + b * (bb) + (qoff), lo, hi);                                                 \
        else                                                                                       \
            *lo = *hi = _mm256_setzero_si256();                                                    \
    }                                                                                              \
    /* Decode: one token, codes unpacked straight from W. */                                      \
    AVX2_INLINE void name##_row1(const uint8_t *wr, int64_t n_blocks, const pv_cpu_xq16 *xq, int64_t t, \
                                 float *y)                                                         \
    {                                                                                              \
        __m256 acc = _mm256_setzero_ps(), accm = acc;                                              \
        for (int64_t g = 0; g < n_blocks; g += 8) {                                                \
            const int n = n_blocks - g < 8 ? (int)(n_blocks - g) : 8;                             \
            const uint8_t *wg = wr + g * (bb);                                                     \
            const int16_t *xb = xq->q + (t * xq->stride + g) * 32;                                 \
            for (int off = 0; off < 8 * (bb); off += 64)                                           \
                /* an address past W's end is fine for a prefetch; computed as an integer */     \
                _mm_prefetch((const char *)((uintptr_t)wg + XQ_PREFETCH + (uintptr_t)off), _MM_HINT_T0); \
            __m256 dw, mw;                                                                         \
            name##_scales(wg, n, &dw, &mw);                                                        \
            XQ_GROUP_SUMS(name##_codes_w, wg);                                                     \
            name##_accumulate(sums, dw, mw, xq, t * xq->stride + g, &acc, &accm);                  \
        }                                                                                          \
        *y = hsum(_mm256_add_ps(acc, accm));                                                       \
    }                                                                                              \
    /* Batches: each group's codes unpacked once for XQ_TOKENS tokens. */                         \
    AVX2_INLINE void name##_rows_batch(const uint8_t *wr, int64_t n_blocks, const pv_cpu_xq16 *xq, \
                                       int64_t t0, int64_t nt, float *y, int64_t ldy)              \
    {                                                                                              \
        __m256 acc[XQ_TOKENS], accm[XQ_TOKENS];                                                    \
        for (int64_t g = 0; g < n_blocks; g += 8) {                                                \
            const int n = n_blocks - g < 8 ? (int)(n_blocks - g) : 8;                             \
            const uint8_t *wg = wr + g * (bb);                                                     \
            __m256 dw, mw;                                                                         \
            name##_scales(wg, n, &dw, &mw);                                                        \
            xq_codes c;                                                                            \
            _Pragma("GCC unroll 8") for (int b = 0; b < 8; b++)                                    \
                name##_codes_w(wg, b, n, &c.lo[b], &c.hi[b]);                                      \
            for (int64_t j = 0; j < nt; j++) {                                                     \
                const int64_t t = t0 + j;                                                          \
                const int16_t *xb = xq->q + (t * xq->stride + g) * 32;                             \
                XQ_GROUP_SUMS(codes_of_buffer, &c);                                                \
                if (g == 0) /* here, not in a loop of its own that GCC makes a memset */          \
                    acc[j] = accm[j] = _mm256_setzero_ps();                                        \
                name##_accumulate(sums, dw, mw, xq, t * xq->stride + g, &acc[j], &accm[j]);        \
            }                                                                                      \
        }                                                                                          \
        for (int64_t j = 0; j < nt; j++)                                                           \
            y[j * ldy] = hsum(_mm256_add_ps(acc[j], accm[j]));                                     \
    }                                                                                              \
    AVX2 static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const pv_cpu_xq16 *xq, int64_t T, \
                          float *y, int64_t ldy)                                                   \
    {                                                                                              \
        const int64_t n_blocks = n_in / 32, row_bytes = n_blocks * (bb);                           \
        for (int64_t r = 0; r < n_rows; r++) {                                                     \
            if (T == 1) {                                                                          \
                name##_row1(w + r * row_bytes, n_blocks, xq, 0, y + r);                            \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t t0 = 0; t0 < T; t0 += XQ_TOKENS)                                          \
                name##_rows_batch(w + r * row_bytes, n_blocks, xq, t0,                             \
                                  T - t0 < XQ_TOKENS ? T - t0 : XQ_TOKENS, y + t0 * ldy + r, ldy);  \
        }                                                                                          \
    }

DEFINE_XQ_ROWS(xqrows_q4_1, codes_q4, 41, 20, 4)
DEFINE_XQ_ROWS(xqrows_q4_0, codes_q4, 40, 18, 2)
DEFINE_XQ_ROWS(xqrows_q8_0, codes_q8, 8, 34, 2)

/* pv_cpu_quantize_x for one block, with the same operations in vectors:
 * the same bits (cvtps rounds to nearest even, as lrintf does). */
AVX2_INLINE void quantize_block(const float *xb, int16_t *q, float *d_out, float *s_out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax); /* a NaN is skipped, as there */
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float dm = _mm_cvtss_f32(m) / 32767.0f, d = dm >= FLT_MIN ? dm : 0.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 scale = _mm256_set1_ps(inv);
    __m256i qi[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
        sum = _mm256_add_epi32(sum, qi[i]);
    }
    /* packs works per 128-bit lane; the permute puts the elements back in order */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[0], qi[1]), 0xd8));
    _mm256_storeu_si256((__m256i *)(q + 16), _mm256_permute4x64_epi64(_mm256_packs_epi32(qi[2], qi[3]), 0xd8));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d;
    *s_out = d * (float)_mm_cvtsi128_si32(s4);
}

AVX2 void pv_cpu_quantize_x_avx2(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < xq->stride; b++) {
            const int64_t i = t * xq->stride + b;
            if (b < n_blocks) {
                quantize_block(x + t * n_in + b * 32, xq->q + i * 32, &xq->d[i], &xq->s[i]);
            } else {
                memset(xq->q + i * 32, 0, 32 * sizeof(int16_t));
                xq->d[i] = xq->s[i] = 0.0f;
            }
        }
}

pv_cpu_rows_xq_fn pv_cpu_qrows_xq_avx2(pv_wtype t)
{
    switch (t) {
    case PV_W_Q8_0: return xqrows_q8_0;
    case PV_W_Q4_0: return xqrows_q4_0;
    case PV_W_Q4_1: return xqrows_q4_1;
    default: return NULL;
    }
}

pv_cpu_rows_fn pv_cpu_qrows_avx2(pv_wtype t)
{
    switch (t) {
    case PV_W_F32: return rows_f32;
    case PV_W_F16: return rows_f16;
    case PV_W_BF16: return rows_bf16;
    default: return NULL; /* the block types: the integer kernels */
    }
}

#else

void pv_cpu_quantize_x_avx2(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq)
{
    pv_cpu_quantize_x(x, T, n_in, xq);
}

pv_cpu_rows_fn pv_cpu_qrows_avx2(pv_wtype t)
{
    (void)t;
    return NULL;
}

pv_cpu_rows_xq_fn pv_cpu_qrows_xq_avx2(pv_wtype t)
{
    (void)t;
    return NULL;
}

#endif
