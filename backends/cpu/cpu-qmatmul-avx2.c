/* The fused quantized-matmul kernels for x86-64 CPUs with AVX2, FMA and
 * F16C (Haswell and Zen onwards), written with intrinsics under a target
 * attribute: the file builds without -mavx2 and cpu-qmatmul.c calls these
 * only after asking the CPU (__builtin_cpu_supports). The portable kernels
 * in cpu-qmatmul.c are the specification: each block of 32 weights is
 * widened to f32 in registers (Q4_1: d * q + m) and dotted with up to QTILE
 * rows of x at once, so a block is read from memory once per call. */
#include "config.h"

#include "backends/cpu/cpu-qmatmul.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE __m256 half_splat(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _mm256_set1_ps(_cvtsh_ss(h));
}

/* Sixteen 4-bit codes (low nibbles are elements 0-15, high 16-31) to four
 * vectors of 8 floats, each d * q + m. */
AVX2_INLINE void widen_nibbles(const uint8_t *qs, __m256 d, __m256 m, __m256 w[4])
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
}

AVX2_INLINE void decode_q4_1(const uint8_t *b, __m256 w[4])
{
    widen_nibbles(b + 4, half_splat(b), half_splat(b + 2), w);
}

AVX2_INLINE void decode_q4_0(const uint8_t *b, __m256 w[4])
{
    const __m256 d = half_splat(b); /* d * (q - 8) = d * q + (-8 d) */
    widen_nibbles(b + 2, d, _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)), w);
}

AVX2_INLINE void decode_q8_0(const uint8_t *b, __m256 w[4])
{
    const __m256 d = half_splat(b);
    const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + 2));
    const __m128i q1 = _mm_loadu_si128((const __m128i *)(b + 18));
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), d);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q0, 8))), d);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), d);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q1, 8))), d);
}

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

#define DEFINE_BLOCK_ROWS(name, DECODE, bb)                                                         \
    AVX2_INLINE void name##_tile(const uint8_t *wr, int64_t n_blocks, const float *xt, int64_t n_in,    \
                                 float *y, int64_t ldy, const int nt)                              \
    {                                                                                              \
        __m256 a0[PV_QTILE], a1[PV_QTILE];                                                         \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++)                                                               \
            a0[j] = a1[j] = _mm256_setzero_ps();                                                   \
        for (int64_t b = 0; b < n_blocks; b++) {                                                   \
            __m256 q[4];                                                                           \
            DECODE(wr + b * (bb), q);                                                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                         \
                const float *xb = xt + j * n_in + b * 32;                                          \
                a0[j] = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(xb), a0[j]);                         \
                a1[j] = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), a1[j]);                     \
                a0[j] = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), a0[j]);                    \
                a1[j] = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), a1[j]);                    \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++)                                                               \
            y[j * ldy] = hsum(_mm256_add_ps(a0[j], a1[j]));                                        \
    }                                                                                              \
    AVX2 static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x, int64_t T,   \
                          float *y, int64_t ldy)                                                   \
    {                                                                                              \
        const int64_t n_blocks = n_in / 32, row_bytes = n_blocks * (bb);                           \
        for (int64_t r = 0; r < n_rows; r++)                                                       \
            for (int64_t t0 = 0; t0 < T; t0 += PV_QTILE) {                                         \
                const int64_t nt = T - t0 < PV_QTILE ? T - t0 : PV_QTILE;                          \
                TILE_SWITCH(name##_tile, nt, w + r * row_bytes, n_blocks, x + t0 * n_in, n_in,     \
                            y + t0 * ldy + r, ldy)                                                 \
            }                                                                                      \
    }

DEFINE_BLOCK_ROWS(rows_q4_1, decode_q4_1, 20)
DEFINE_BLOCK_ROWS(rows_q4_0, decode_q4_0, 18)
DEFINE_BLOCK_ROWS(rows_q8_0, decode_q8_0, 34)

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
 * 16-bit integers and two madds multiply and pair-sum all 32: about half the
 * ops. Sums stay in range: |code| <= 128 times |x| <= 32767, four to an i32. */

AVX2_INLINE float half_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

/* Codes of one block as 16-bit integers: elements 0-15 and 16-31. */
#define DEFINE_XQ_ROWS(name, KIND, bb)                                                             \
    AVX2_INLINE void name##_block(const uint8_t *wb, __m256i *lo, __m256i *hi, __m256 *dwv,        \
                                  float *mw)                                                       \
    {                                                                                              \
        const float dw = half_at(wb);                                                              \
        *dwv = _mm256_set1_ps(dw);                                                                 \
        if (KIND == 8) {                                                                           \
            *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 2)));                \
            *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wb + 18)));               \
            *mw = 0.0f;                                                                            \
        } else {                                                                                   \
            *mw = KIND == 41 ? half_at(wb + 2) : -8.0f * dw;                                       \
            const __m128i q = _mm_loadu_si128((const __m128i *)(wb + (KIND == 41 ? 4 : 2)));        \
            const __m128i mask = _mm_set1_epi8(15);                                                \
            *lo = _mm256_cvtepu8_epi16(_mm_and_si128(q, mask));                                    \
            *hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), mask));                 \
        }                                                                                          \
    }                                                                                              \
    AVX2_INLINE __m256 name##_dot(__m256i lo, __m256i hi, const int16_t *xq)                       \
    {                                                                                              \
        const __m256i s = _mm256_add_epi32(                                                        \
            _mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)),                        \
            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 16))));                \
        return _mm256_cvtepi32_ps(s);                                                              \
    }                                                                                              \
    AVX2_INLINE void name##_tile(const uint8_t *w0, const uint8_t *w1, int64_t n_blocks,           \
                                 const pv_cpu_xq16 *xt, int64_t x_stride, float *y0, float *y1,     \
                                 int64_t ldy, const int nt)                                        \
    {                                                                                              \
        __m256 acc0[PV_QTILE], acc1[PV_QTILE];                                                     \
        float m0[PV_QTILE], m1[PV_QTILE];                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                             \
            acc0[j] = acc1[j] = _mm256_setzero_ps();                                               \
            m0[j] = m1[j] = 0.0f;                                                                  \
        }                                                                                          \
        for (int64_t b = 0; b < n_blocks; b++) {                                                   \
            __m256i lo0, hi0, lo1, hi1;                                                            \
            __m256 d0, d1;                                                                         \
            float mw0, mw1;                                                                        \
            name##_block(w0 + b * (bb), &lo0, &hi0, &d0, &mw0);                                    \
            name##_block(w1 + b * (bb), &lo1, &hi1, &d1, &mw1);                                    \
            _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                         \
                const pv_cpu_xq16 *xb = xt + j * x_stride + b;                                      \
                const __m256 dx = _mm256_broadcast_ss(&xb->d);                                     \
                acc0[j] = _mm256_fmadd_ps(name##_dot(lo0, hi0, xb->q), _mm256_mul_ps(d0, dx), acc0[j]); \
                acc1[j] = _mm256_fmadd_ps(name##_dot(lo1, hi1, xb->q), _mm256_mul_ps(d1, dx), acc1[j]); \
                if (KIND != 8) {                                                                   \
                    m0[j] += mw0 * xb->s;                                                          \
                    m1[j] += mw1 * xb->s;                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < nt; j++) {                                                             \
            y0[j * ldy] = hsum(acc0[j]) + m0[j];                                                   \
            y1[j * ldy] = hsum(acc1[j]) + m1[j];                                                   \
        }                                                                                          \
    }                                                                                              \
    AVX2 static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const pv_cpu_xq16 *xq,        \
                          int64_t T, float *y, int64_t ldy)                                        \
    {                                                                                              \
        const int64_t n_blocks = n_in / 32, row_bytes = n_blocks * (bb);                           \
        for (int64_t r = 0; r < n_rows; r += 2) {                                                  \
            /* An odd last row is computed twice into the same output. */                          \
            const int64_t r1 = r + 1 < n_rows ? r + 1 : r;                                         \
            for (int64_t t0 = 0; t0 < T; t0 += PV_QTILE) {                                         \
                const int64_t nt = T - t0 < PV_QTILE ? T - t0 : PV_QTILE;                          \
                TILE_SWITCH(name##_tile, nt, w + r * row_bytes, w + r1 * row_bytes, n_blocks,      \
                            xq + t0 * n_blocks, n_blocks, y + t0 * ldy + r, y + t0 * ldy + r1, ldy) \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_XQ_ROWS(xqrows_q4_1, 41, 20)
DEFINE_XQ_ROWS(xqrows_q4_0, 40, 18)
DEFINE_XQ_ROWS(xqrows_q8_0, 8, 34)

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
    case PV_W_Q8_0: return rows_q8_0;
    case PV_W_Q4_0: return rows_q4_0;
    case PV_W_Q4_1: return rows_q4_1;
    }
    return NULL;
}

#else

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
