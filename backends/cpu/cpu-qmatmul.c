/* Linear layers over weights kept in their GGUF type: y[T][n_out] =
 * x[T][n_in] W^T with W[n_out][n_in] in F32, F16, BF16, Q8_0, Q4_0 or Q4_1
 * (block layouts in backends/backend.h), and embedding rows of such tables.
 *
 * Decode is bound by the bytes of weights read per token, so for
 * decode-sized batches (T <= PV_CPU_QMATMUL_FUSED_MAX_T) each block of W is
 * read once from memory, widened to f32 in registers and dotted with every
 * row of x (tiles of QTILE rows, the block staying in L1 between tiles):
 * W's bytes cross the memory bus once per call, not once per token, and no
 * f32 copy of W exists. Larger batches are compute-bound: tiles of W rows are
 * widened into a scratch buffer and OpenBLAS's sgemm takes them, because its
 * packed micro-kernels beat anything written here.
 *
 * The hot loops are plain C over GCC vector types, cloned for AVX-512, AVX2 +
 * FMA + F16C and baseline x86-64 (target_clones: the CPU picks the clone at
 * load time, so the build does not need -march=native); elsewhere the same
 * C compiles to the target's vectors. The results are the same sums of the
 * same f32 products as the f32 path, in another order. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <pensieve/half.h>

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PV_QCLONES                                                                                 \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),                   \
                   optimize("fp-contract=fast")))
#endif
#endif
#ifndef PV_QCLONES
#define PV_QCLONES
#endif

#if defined(__GNUC__)
/* The vector helpers are always inlined, so no vector crosses a call. */
#pragma GCC diagnostic ignored "-Wpsabi"
#define PV_INLINE static inline __attribute__((always_inline))
#else
#define PV_INLINE static inline
#endif

/* Rows of x per register tile: two accumulators per row, 4 decoded vectors
 * and the x operands fit the 16 AVX2 registers. */
#define QTILE 4
/* Rows of W per OpenMP work unit: enough work to amortise the schedule,
 * small enough that the 576-row projections still split over the cores. */
#define ROWS_PER_UNIT 16
/* Rows of W widened per sgemm call in the batched path: 256 x n_in floats
 * (at most 6 MB for n_in 6144) stay in the last-level cache. */
#define GEMM_TILE_ROWS 256

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
typedef uint8_t v8u8 __attribute__((vector_size(8)));
typedef int8_t v8i8 __attribute__((vector_size(8)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));

PV_INLINE v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

PV_INLINE float sum8(v8f v)
{
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

PV_INLINE float read_half(const uint8_t *p)
{
    pv_half h;
    memcpy(&h, p, sizeof h);
    return pv_half_to_float(h);
}

PV_INLINE v8f splat(float f)
{
    return (v8f){f, f, f, f, f, f, f, f};
}

/* ---- block decoders: 32 weights into four vectors of 8 ---------------------- */

PV_INLINE v8f nibbles_to_f32(v8u8 q)
{
    return __builtin_convertvector(q, v8f);
}

PV_INLINE void decode_q4_1(const uint8_t *b, v8f w[4])
{
    const v8f d = splat(read_half(b)), m = splat(read_half(b + 2));
    v16u8 qs;
    memcpy(&qs, b + 4, sizeof qs);
    const v16u8 lo = qs & 15, hi = qs >> 4;
    w[0] = nibbles_to_f32(__builtin_shufflevector(lo, lo, 0, 1, 2, 3, 4, 5, 6, 7)) * d + m;
    w[1] = nibbles_to_f32(__builtin_shufflevector(lo, lo, 8, 9, 10, 11, 12, 13, 14, 15)) * d + m;
    w[2] = nibbles_to_f32(__builtin_shufflevector(hi, hi, 0, 1, 2, 3, 4, 5, 6, 7)) * d + m;
    w[3] = nibbles_to_f32(__builtin_shufflevector(hi, hi, 8, 9, 10, 11, 12, 13, 14, 15)) * d + m;
}

PV_INLINE void decode_q4_0(const uint8_t *b, v8f w[4])
{
    /* d * (q - 8) = d * q + (-8 d): the Q4_1 form with m = -8 d. */
    const float df = read_half(b);
    const v8f d = splat(df), m = splat(-8.0f * df);
    v16u8 qs;
    memcpy(&qs, b + 2, sizeof qs);
    const v16u8 lo = qs & 15, hi = qs >> 4;
    w[0] = nibbles_to_f32(__builtin_shufflevector(lo, lo, 0, 1, 2, 3, 4, 5, 6, 7)) * d + m;
    w[1] = nibbles_to_f32(__builtin_shufflevector(lo, lo, 8, 9, 10, 11, 12, 13, 14, 15)) * d + m;
    w[2] = nibbles_to_f32(__builtin_shufflevector(hi, hi, 0, 1, 2, 3, 4, 5, 6, 7)) * d + m;
    w[3] = nibbles_to_f32(__builtin_shufflevector(hi, hi, 8, 9, 10, 11, 12, 13, 14, 15)) * d + m;
}

PV_INLINE void decode_q8_0(const uint8_t *b, v8f w[4])
{
    const v8f d = splat(read_half(b));
    for (int i = 0; i < 4; i++) {
        v8i8 q;
        memcpy(&q, b + 2 + 8 * i, sizeof q);
        w[i] = __builtin_convertvector(q, v8f) * d;
    }
}

/* Eight consecutive weights of the unblocked types. */
PV_INLINE v8f load8_f16(const uint8_t *p)
{
#if defined(__FLT16_MAX__)
    typedef _Float16 v8h __attribute__((vector_size(16)));
    v8h h;
    memcpy(&h, p, sizeof h);
    return __builtin_convertvector(h, v8f);
#else
    v8f v;
    for (int i = 0; i < 8; i++)
        v[i] = read_half(p + 2 * i);
    return v;
#endif
}

PV_INLINE v8f load8_bf16(const uint8_t *p)
{
    v8u16 h;
    memcpy(&h, p, sizeof h);
    v8u bits = __builtin_convertvector(h, v8u) << 16;
    v8f v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

PV_INLINE float load1(pv_wtype t, const uint8_t *p)
{
    if (t == PV_W_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    if (t == PV_W_F16)
        return read_half(p);
    uint16_t h;
    memcpy(&h, p, sizeof h);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ---- fused kernels: rows [0, n_rows) of W against T rows of x ------------------ */

/* Block types: a row is n_in / 32 blocks of `bb` bytes. The DECODE macro
 * argument names one of the decoders above, so each type gets its own
 * inlined loop. */
#define DEFINE_BLOCK_ROWS(name, DECODE, bb)                                                         \
    PV_QCLONES static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x,        \
                                int64_t T, float *y, int64_t ldy)                                  \
    {                                                                                              \
        const int64_t n_blocks = n_in / 32, row_bytes = n_blocks * (bb);                           \
        for (int64_t r = 0; r < n_rows; r++) {                                                     \
            const uint8_t *wr = w + r * row_bytes;                                                 \
            for (int64_t t0 = 0; t0 < T; t0 += QTILE) {                                            \
                const int nt = T - t0 < QTILE ? (int)(T - t0) : QTILE;                             \
                const float *xt = x + t0 * n_in;                                                   \
                v8f a0[QTILE] = {{0}}, a1[QTILE] = {{0}};                                          \
                for (int64_t b = 0; b < n_blocks; b++) {                                           \
                    v8f q[4];                                                                      \
                    DECODE(wr + b * (bb), q);                                                      \
                    for (int j = 0; j < QTILE; j++) {                                              \
                        if (j < nt) {                                                              \
                            const float *xb = xt + j * n_in + b * 32;                              \
                            a0[j] += q[0] * load8(xb) + q[2] * load8(xb + 16);                     \
                            a1[j] += q[1] * load8(xb + 8) + q[3] * load8(xb + 24);                 \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                for (int j = 0; j < nt; j++)                                                       \
                    y[(t0 + j) * ldy + r] = sum8(a0[j] + a1[j]);                                   \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_BLOCK_ROWS(rows_q4_1, decode_q4_1, 20)
DEFINE_BLOCK_ROWS(rows_q4_0, decode_q4_0, 18)
DEFINE_BLOCK_ROWS(rows_q8_0, decode_q8_0, 34)

PV_INLINE v8f load8_f32_bytes(const uint8_t *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Unblocked types: any n_in, eight at a time and a scalar tail. */
#define DEFINE_FLAT_ROWS(name, LOAD8, type, es)                                                     \
    PV_QCLONES static void name(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x,        \
                                int64_t T, float *y, int64_t ldy)                                  \
    {                                                                                              \
        const int64_t n8 = n_in / 8 * 8;                                                           \
        for (int64_t r = 0; r < n_rows; r++) {                                                     \
            const uint8_t *wr = w + r * n_in * (es);                                               \
            for (int64_t t0 = 0; t0 < T; t0 += QTILE) {                                            \
                const int nt = T - t0 < QTILE ? (int)(T - t0) : QTILE;                             \
                const float *xt = x + t0 * n_in;                                                   \
                v8f a0[QTILE] = {{0}}, a1[QTILE] = {{0}};                                          \
                int64_t k = 0;                                                                     \
                for (; k + 16 <= n8; k += 16) {                                                    \
                    const v8f q0 = LOAD8(wr + k * (es)), q1 = LOAD8(wr + (k + 8) * (es));          \
                    for (int j = 0; j < QTILE; j++)                                                \
                        if (j < nt) {                                                              \
                            a0[j] += q0 * load8(xt + j * n_in + k);                                \
                            a1[j] += q1 * load8(xt + j * n_in + k + 8);                            \
                        }                                                                          \
                }                                                                                  \
                for (; k < n8; k += 8) {                                                           \
                    const v8f q0 = LOAD8(wr + k * (es));                                           \
                    for (int j = 0; j < nt; j++)                                                   \
                        a0[j] += q0 * load8(xt + j * n_in + k);                                    \
                }                                                                                  \
                for (int j = 0; j < nt; j++) {                                                     \
                    float s = sum8(a0[j] + a1[j]);                                                 \
                    for (int64_t kk = n8; kk < n_in; kk++)                                         \
                        s += load1(type, wr + kk * (es)) * xt[j * n_in + kk];                      \
                    y[(t0 + j) * ldy + r] = s;                                                     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_FLAT_ROWS(rows_f32, load8_f32_bytes, PV_W_F32, 4)
DEFINE_FLAT_ROWS(rows_f16, load8_f16, PV_W_F16, 2)
DEFINE_FLAT_ROWS(rows_bf16, load8_bf16, PV_W_BF16, 2)

typedef void (*rows_fn)(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x, int64_t T, float *y,
                        int64_t ldy);

static rows_fn rows_kernel(pv_wtype t)
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

/* ---- widening rows to f32 (embedding rows, the batched path) ------------------- */

/* n elements (whole blocks) of type t from src into dst. */
PV_QCLONES static void widen_row(pv_wtype t, const uint8_t *src, float *dst, int64_t n)
{
    switch (t) {
    case PV_W_F32:
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    case PV_W_F16:
    case PV_W_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = load1(t, src + 2 * i);
        return;
    case PV_W_Q8_0:
    case PV_W_Q4_0:
    case PV_W_Q4_1:
        for (int64_t b = 0; b < n / 32; b++) {
            v8f q[4];
            if (t == PV_W_Q8_0)
                decode_q8_0(src + b * 34, q);
            else if (t == PV_W_Q4_0)
                decode_q4_0(src + b * 18, q);
            else
                decode_q4_1(src + b * 20, q);
            memcpy(dst + b * 32, q, sizeof q);
        }
        return;
    }
}

/* Bytes of n elements of t (whole blocks: the front end checked). */
static uint64_t type_bytes(pv_wtype t, uint64_t n)
{
    uint32_t elems = 1, bytes = 4;
    pv_wtype_block(t, &elems, &bytes);
    return n / elems * bytes;
}

pv_status pv_cpu_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    (void)be;
    const uint8_t *table = (const uint8_t *)a->table->host_ptr + type_bytes(a->table_type, a->table_off);
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    const uint64_t row_bytes = type_bytes(a->table_type, (uint64_t)a->dim);
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int32_t i = 0; i < a->n_ids; i++)
        widen_row(a->table_type, table + (uint64_t)a->ids[i] * row_bytes, out + (int64_t)i * a->dim, a->dim);
    return PV_OK;
}

/* ---- the op -------------------------------------------------------------------- */

/* Batches of more rows of x than this widen W for sgemm instead (measured
 * with bench-kernels' qmatmul table: the fused loop's cost per row of x is
 * flat while sgemm's falls with T; they cross between 16 and 32 rows on AVX2). */
#define PV_CPU_QMATMUL_FUSED_MAX_T 16

static pv_status qmatmul_fused(const pv_qmatmul_args *a, const uint8_t *w, const float *x, float *y)
{
    const rows_fn kernel = rows_kernel(a->w_type);
    const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
    const int64_t units = (a->n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t u = 0; u < units; u++) {
        const int64_t r0 = u * ROWS_PER_UNIT;
        const int64_t n_rows = a->n_out - r0 < ROWS_PER_UNIT ? a->n_out - r0 : ROWS_PER_UNIT;
        kernel(w + (uint64_t)r0 * row_bytes, n_rows, a->n_in, x, a->n_tokens, y + r0, a->n_out);
    }
    return PV_OK;
}

static pv_status qmatmul_sgemm(pv_backend *be, const pv_qmatmul_args *a, const uint8_t *w, const float *x,
                               float *y)
{
    const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
    const int64_t tile_rows = a->n_out < GEMM_TILE_ROWS ? a->n_out : GEMM_TILE_ROWS;
    float *tile = NULL;
    pv_status st = pv_cpu_scratch(be, (uint64_t)tile_rows * (uint64_t)a->n_in, &tile);
    if (st != PV_OK)
        return st;
    for (int64_t r0 = 0; r0 < a->n_out; r0 += tile_rows) {
        const int64_t n_rows = a->n_out - r0 < tile_rows ? a->n_out - r0 : tile_rows;
        PV_CPU_OMP("omp parallel for schedule(static)")
        for (int64_t r = 0; r < n_rows; r++)
            widen_row(a->w_type, w + (uint64_t)(r0 + r) * row_bytes, tile + r * a->n_in, a->n_in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)a->n_tokens, (blasint)n_rows,
                    (blasint)a->n_in, 1.0f, x, (blasint)a->n_in, tile, (blasint)a->n_in, 0.0f, y + r0,
                    (blasint)a->n_out);
    }
    return PV_OK;
}

pv_status pv_cpu_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    const uint8_t *w = (const uint8_t *)a->w->host_ptr + type_bytes(a->w_type, a->w_off);
    const float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    float *y = pv_cpu_elem_ptr(a->y, a->y_off, sizeof(float));
    /* f32 weights need no widening: sgemm reads them in place. */
    if (a->w_type == PV_W_F32 && a->n_tokens > PV_CPU_QMATMUL_FUSED_MAX_T) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)a->n_tokens, (blasint)a->n_out,
                    (blasint)a->n_in, 1.0f, x, (blasint)a->n_in, (const float *)w, (blasint)a->n_in, 0.0f,
                    y, (blasint)a->n_out);
        return PV_OK;
    }
    if (a->n_tokens <= PV_CPU_QMATMUL_FUSED_MAX_T)
        return qmatmul_fused(a, w, x, y);
    return qmatmul_sgemm(be, a, w, x, y);
}

int pv_cpu_qmatmul_supports(pv_wtype t)
{
    return rows_kernel(t) != NULL;
}
