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
#include <math.h>
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

/* ---- integer products of the block types against 16-bit activations ------------
 * Rows are interleaved in groups of 8 (cpu-qmatmul.h): a 32-byte piece of a
 * group block holds 4 codes of each of 8 rows, and its product with 4
 * activation bytes broadcast to every lane (maddubs: unsigned codes times
 * signed bytes, pairs summed to 16 bits) leaves each row's sum in its own
 * lane. Eight pieces cover a block; the sums stay exact: the 16-bit lanes
 * add 8 products of pairs, at most 8 x 2 x 15 x 127 = 30480 < 2^15. The
 * activations' two bytes (hi, lo) take a pass each and combine as
 * 256 hi + lo in 32 bits: about half the integer work of 16-bit madd
 * products, and no horizontal sums, as a group's 8 results lie in 8 lanes.
 * Q8_0's codes are signed, which maddubs cannot take with signed
 * activations but at the price of sign operations on every pass: they are
 * widened to 16 bits and multiplied with the activations as 16-bit integers
 * (madd), two lanes a row, added by one hadd per block.
 *
 * Per row the float work is, block after block: acc = fma(isum, dw dx, acc)
 * and accm = fma(mw, sx, accm), then y = acc + accm (Q8_0: y = acc). The
 * rows past the last whole group (GGUF layout) run the same operations in
 * scalar code, and every batch size runs them in the same order, so a
 * token's outputs are the same bits whichever batch and tile it is in. */

/* Tokens per pass in batches: a group block's codes are unpacked once per
 * pass, and the pass's accumulators (1 KB) stay in L1. */
#define XQ_TOKENS 16
/* Decode asks for W this many bytes ahead of the block it reads: at one
 * token the hardware prefetcher alone does not run far enough ahead
 * (bench-qmatmul, one token, weights from memory). */
#define XQ_PREFETCH 2048

AVX2_INLINE __m256i broadcast4(const int8_t *x)
{
    int32_t v;
    memcpy(&v, x, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Codes of one group block, for the 4-bit types as unsigned bytes: a[k]
 * holds codes 4k..4k+3 of each row; for Q8_0 as 16-bit integers: a[k] the
 * codes 4k..4k+3 of rows 0-3, b[k] those of rows 4-7. */
typedef struct group_codes {
    __m256i a[8], b[8];
} group_codes;

AVX2_INLINE void unpack_q4(const uint8_t *codes, group_codes *g)
{
    const __m256i low = _mm256_set1_epi8(15);
    for (int p = 0; p < 4; p++) {
        /* byte 4 r + i of piece p is byte 4p + i of row r's qs: its low
         * nibble is code 4p + i, its high nibble code 16 + 4p + i */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + 32 * p));
        g->a[p] = _mm256_and_si256(v, low);
        g->a[p + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
}

AVX2_INLINE void unpack_q8(const uint8_t *codes, group_codes *g)
{
    for (int p = 0; p < 8; p++) {
        g->a[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * p)));
        g->b[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * p + 16)));
    }
}

/* The 8 rows' integer sums of one block against one byte (hi or lo) of
 * the token's 32 activations. */
AVX2_INLINE __m256i isum_q4_bytes(const group_codes *g, const int8_t *xb)
{
    __m256i s = _mm256_maddubs_epi16(g->a[0], broadcast4(xb));
    for (int k = 1; k < 8; k++)
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(g->a[k], broadcast4(xb + 4 * k)));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

/* The 8 rows' integer sums of block i of xq: 256 hi + lo. */
AVX2_INLINE __m256i isum_q4(const group_codes *g, const pv_cpu_xq16 *xq, int64_t i)
{
    const int8_t *hi = xq->q + i * 64, *lo = hi + 32;
    return _mm256_add_epi32(_mm256_slli_epi32(isum_q4_bytes(g, hi), 8), isum_q4_bytes(g, lo));
}

/* Q8_0's signed codes: 16-bit products (madd) with the activations as
 * 16-bit integers, half the operations of two maddubs passes with signs.
 * Each row's pairs of codes land in two lanes, which one hadd adds. */
AVX2_INLINE __m256i isum_q8(const group_codes *g, const pv_cpu_xq16 *xq, int64_t i)
{
    const int16_t *xw = xq->q16 + i * 32;
    __m256i lo_rows = _mm256_setzero_si256(), hi_rows = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        int64_t four;
        memcpy(&four, xw + 4 * k, sizeof four);
        const __m256i x = _mm256_set1_epi64x(four);
        lo_rows = _mm256_add_epi32(lo_rows, _mm256_madd_epi16(g->a[k], x));
        hi_rows = _mm256_add_epi32(hi_rows, _mm256_madd_epi16(g->b[k], x));
    }
    /* lanes 0 1 4 5 | 2 3 6 7 of rows after the hadd; the permute orders them */
    return _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo_rows, hi_rows), 0xd8);
}

/* A block's codes dotted with the token's 16-bit activations, one row in
 * GGUF layout (the tail rows): the same integers as the lanes above. */
static inline int isum_row_q4(const uint8_t *qs, const int16_t *xw)
{
    int s = 0;
    for (int j = 0; j < 16; j++)
        s += (qs[j] & 15) * xw[j] + (qs[j] >> 4) * xw[j + 16];
    return s;
}

static inline int isum_row_q8(const uint8_t *qs, const int16_t *xw)
{
    int s = 0;
    for (int j = 0; j < 32; j++)
        s += (int8_t)qs[j] * xw[j];
    return s;
}

/* KIND: 41 Q4_1 (m after d), 40 Q4_0 (m = -8 d), 8 Q8_0 (no m); bb: bytes
 * of a GGUF block; hb: its scale bytes. */
#define DEFINE_XQ_ROWS(name, KIND, bb, hb, UNPACK, ISUM, ISUM_ROW)                                 \
    /* Tokens t0 .. t0+nt-1 against one group of 8 rows (at gw). */                                \
    AVX2_INLINE void name##_group(const uint8_t *gw, int64_t n_blocks, const pv_cpu_xq16 *xq, int64_t t0, \
                                  const int nt, float *y, int64_t ldy)                             \
    {                                                                                              \
        __m256 acc[XQ_TOKENS], accm[XQ_TOKENS];                                                    \
        for (int j = 0; j < nt; j++)                                                               \
            acc[j] = accm[j] = _mm256_setzero_ps();                                                \
        for (int64_t b = 0; b < n_blocks; b++) {                                                   \
            const uint8_t *gb = gw + b * PV_XROWS * (bb);                                          \
            if (nt == 1) /* an address past W's end is fine for a prefetch */                     \
                for (int off = 0; off < PV_XROWS * (bb); off += 64)                                \
                    _mm_prefetch((const char *)((uintptr_t)gb + XQ_PREFETCH + (uintptr_t)off), _MM_HINT_T0); \
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb));               \
            const __m256 mw = KIND == 41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16))) \
                                         : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f)); /* d (q - 8) */ \
            group_codes g;                                                                         \
            UNPACK(gb + PV_XROWS * (hb), &g);                                                      \
            for (int j = 0; j < nt; j++) {                                                         \
                const int64_t i = (t0 + j) * n_blocks + b;                                         \
                const __m256 sums = _mm256_cvtepi32_ps(ISUM(&g, xq, i));                           \
                acc[j] = _mm256_fmadd_ps(sums, _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[i])), acc[j]); \
                if (KIND != 8)                                                                     \
                    accm[j] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->s[i]), accm[j]);              \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; j < nt; j++)                                                               \
            _mm256_storeu_ps(y + j * ldy, KIND == 8 ? acc[j] : _mm256_add_ps(acc[j], accm[j]));    \
    }                                                                                              \
    /* One row in GGUF layout, one token: the lanes' operations in scalar. */                     \
    AVX2_INLINE float name##_row(const uint8_t *wr, int64_t n_blocks, const pv_cpu_xq16 *xq, int64_t t) \
    {                                                                                              \
        float acc = 0.0f, accm = 0.0f;                                                             \
        for (int64_t b = 0; b < n_blocks; b++) {                                                   \
            const uint8_t *blk = wr + b * (bb);                                                    \
            const int64_t i = t * n_blocks + b;                                                    \
            const float dw = pv_cpu_weight_at(PV_W_F16, blk, 0);                                   \
            const float mw = KIND == 41 ? pv_cpu_weight_at(PV_W_F16, blk, 1) : dw * -8.0f;         \
            const int s = ISUM_ROW(blk + (hb), xq->q16 + i * 32);                                  \
            acc = fmaf((float)s, dw * xq->d[i], acc);                                              \
            if (KIND != 8)                                                                         \
                accm = fmaf(mw, xq->s[i], accm);                                                   \
        }                                                                                          \
        return KIND == 8 ? acc : acc + accm;                                                       \
    }                                                                                              \
    AVX2 static void name(const uint8_t *w, int64_t n_groups, int64_t n_tail, int64_t n_in,       \
                          const pv_cpu_xq16 *xq, int64_t T, float *y, int64_t ldy)                  \
    {                                                                                              \
        const int64_t n_blocks = n_in / 32, row_bytes = n_blocks * (bb);                           \
        if (T == 1)                                                                                \
            for (int64_t g = 0; g < n_groups; g++)                                                 \
                name##_group(w + g * PV_XROWS * row_bytes, n_blocks, xq, 0, 1, y + g * PV_XROWS, ldy); \
        /* passes outside: a pass's activations stay in L1 across the groups */                  \
        for (int64_t t0 = 0; T > 1 && t0 < T; t0 += XQ_TOKENS)                                     \
            for (int64_t g = 0; g < n_groups; g++)                                                 \
                name##_group(w + g * PV_XROWS * row_bytes, n_blocks, xq, t0,                       \
                             T - t0 < XQ_TOKENS ? (int)(T - t0) : XQ_TOKENS, y + t0 * ldy + g * PV_XROWS, ldy); \
        for (int64_t r = n_groups * PV_XROWS; r < n_groups * PV_XROWS + n_tail; r++)               \
            for (int64_t t = 0; t < T; t++)                                                        \
                y[t * ldy + r] = name##_row(w + r * row_bytes, n_blocks, xq, t);                   \
    }

DEFINE_XQ_ROWS(xqrows_q4_1, 41, 20, 4, unpack_q4, isum_q4, isum_row_q4)
DEFINE_XQ_ROWS(xqrows_q4_0, 40, 18, 2, unpack_q4, isum_q4, isum_row_q4)
DEFINE_XQ_ROWS(xqrows_q8_0, 8, 34, 2, unpack_q8, isum_q8, isum_row_q8)

/* Eight 32-bit lanes of codes to bytes, in order: the packs work per
 * 128-bit lane and leave dwords of four in the order 0 2 4 6 1 3 5 7. */
AVX2_INLINE void store_bytes(int8_t *out, const __m256i q[4])
{
    const __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* pv_cpu_quantize_x for one block, with the same operations in vectors:
 * the same bits (cvtps rounds to nearest even, as lrintf does; fnmadd is
 * fmaf's single rounding). */
AVX2_INLINE void quantize_block(const float *xb, int8_t *q, int16_t *q16, float *d_out, float *s_out)
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
    const float dm = _mm_cvtss_f32(m) / 127.0f, d1 = dm >= 256.0f * FLT_MIN ? dm : 0.0f;
    const float inv = d1 > 0.0f ? 1.0f / d1 : 0.0f;
    const __m256 scale = _mm256_set1_ps(inv), scale_lo = _mm256_set1_ps(inv * 256.0f);
    const __m256 neg_d1 = _mm256_set1_ps(-d1);
    __m256i hi[4], lo[4], word[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        hi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], scale));
        const __m256 rest = _mm256_fmadd_ps(neg_d1, _mm256_cvtepi32_ps(hi[i]), v[i]);
        lo[i] = _mm256_cvtps_epi32(_mm256_mul_ps(rest, scale_lo));
        lo[i] = _mm256_max_epi32(_mm256_min_epi32(lo[i], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
        word[i] = _mm256_add_epi32(_mm256_slli_epi32(hi[i], 8), lo[i]);
        sum = _mm256_add_epi32(sum, word[i]);
    }
    for (int i = 0; i < 2; i++) /* packs per 128-bit lane; the permute restores the order */
        _mm256_storeu_si256((__m256i *)(q16 + 16 * i),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(word[2 * i], word[2 * i + 1]), 0xd8));
    store_bytes(q, hi);
    store_bytes(q + 32, lo);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    *d_out = d1 / 256.0f;
    *s_out = *d_out * (float)_mm_cvtsi128_si32(s4);
}

AVX2 void pv_cpu_quantize_x_avx2(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t i = t * n_blocks + b;
            quantize_block(x + t * n_in + b * 32, xq->q + i * 64, xq->q16 + i * 32, &xq->d[i], &xq->s[i]);
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
