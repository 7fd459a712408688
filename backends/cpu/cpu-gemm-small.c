/* Decode-sized GEMMs: C[m][n] = alpha * A[m][k] B[n][k]^T + beta * C for a
 * few rows of A (one per sequence decoding, 2 <= m <= PV_CPU_SMALL_M)
 * against a weight matrix B stored [n][k], as the model's linear layers
 * call it.
 *
 * OpenBLAS packs all of B on every call; with a handful of rows the packing
 * costs about as much as the products (perf: 27% of a 16-session decode in
 * sgemm_incopy). Here each block of 4 rows of B is read from memory once and
 * dotted, from L1, with every row of A, two rows of A at a time: a 2 x 4
 * tile of 8-lane accumulators stays in registers. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <stdint.h>
#include <string.h>

#define BLOCK 4 /* rows of B per block */

#if defined(__GNUC__) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
/* x86-64-v3 is AVX2 + FMA; ISO C mode would not contract a*b+c by itself. */
#define PV_GEMM_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), \
                   optimize("fp-contract=fast")))
#endif
#endif
#ifndef PV_GEMM_CLONES
#define PV_GEMM_CLONES
#endif

#if defined(__GNUC__)
/* The vector helpers are always inlined, so no vector crosses a call and
 * GCC's note on the AVX calling convention does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"
/* GCC's vector extension: 8 floats, lowered to whatever the clone has. */
typedef float v8f __attribute__((vector_size(32)));
#define PV_INLINE static inline __attribute__((always_inline))

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

/* Two rows of A against 4 rows of B (k % 8 == 0): eight accumulators. */
PV_INLINE void tile2(const float *a0, const float *a1, const float *b, int64_t ldb, int64_t k,
                     float out[2][BLOCK])
{
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    v8f c00 = {0}, c01 = {0}, c02 = {0}, c03 = {0}, c10 = {0}, c11 = {0}, c12 = {0}, c13 = {0};
    for (int64_t kk = 0; kk < k; kk += 8) {
        v8f x0 = load8(a0 + kk), x1 = load8(a1 + kk), w;
        w = load8(b0 + kk);
        c00 += x0 * w;
        c10 += x1 * w;
        w = load8(b1 + kk);
        c01 += x0 * w;
        c11 += x1 * w;
        w = load8(b2 + kk);
        c02 += x0 * w;
        c12 += x1 * w;
        w = load8(b3 + kk);
        c03 += x0 * w;
        c13 += x1 * w;
    }
    out[0][0] = sum8(c00), out[0][1] = sum8(c01), out[0][2] = sum8(c02), out[0][3] = sum8(c03);
    out[1][0] = sum8(c10), out[1][1] = sum8(c11), out[1][2] = sum8(c12), out[1][3] = sum8(c13);
}

/* The last row of an odd m, summed exactly as tile2 sums each of its rows. */
PV_INLINE void tile1(const float *a0, const float *b, int64_t ldb, int64_t k, float out[BLOCK])
{
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    v8f c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
    for (int64_t kk = 0; kk < k; kk += 8) {
        v8f x0 = load8(a0 + kk);
        c0 += x0 * load8(b0 + kk);
        c1 += x0 * load8(b1 + kk);
        c2 += x0 * load8(b2 + kk);
        c3 += x0 * load8(b3 + kk);
    }
    out[0] = sum8(c0), out[1] = sum8(c1), out[2] = sum8(c2), out[3] = sum8(c3);
}

PV_INLINE void store_row(float *c, const float *out, float alpha, float beta)
{
    /* beta 0 never reads C, as BLAS does (it may hold NaN). */
    for (int j = 0; j < BLOCK; j++)
        c[j] = beta == 0.0f ? alpha * out[j] : alpha * out[j] + beta * c[j];
}

/* One block of 4 rows of B against every row of A, two rows at a time.
 * The clones live here, not in the OpenMP loop, whose outlined body would
 * not inherit them. */
PV_GEMM_CLONES
static void block_rows(int64_t m, int64_t k, float alpha, const float *A, int64_t lda, const float *b,
                       int64_t ldb, float beta, float *C, int64_t ldc)
{
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
        float out[2][BLOCK];
        tile2(A + i * lda, A + (i + 1) * lda, b, ldb, k, out);
        store_row(C + i * ldc, out[0], alpha, beta);
        store_row(C + (i + 1) * ldc, out[1], alpha, beta);
    }
    if (i < m) {
        float out[BLOCK];
        tile1(A + i * lda, b, ldb, k, out);
        store_row(C + i * ldc, out, alpha, beta);
    }
}

int pv_cpu_gemm_small(const pv_gemm_args *a, const float *A, const float *B, float *C)
{
    /* The shapes the linear layers use: weights [n][k], k and n multiples
     * of the tile; anything else goes to BLAS. */
    if (a->dtype != PV_F32 || a->trans_a || !a->trans_b || a->m < 2 || a->m > PV_CPU_SMALL_M ||
        a->k <= 0 || a->k % 8 || a->n % BLOCK)
        return 0;
    const int64_t m = a->m, k = a->k, blocks = a->n / BLOCK;
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t blk = 0; blk < blocks; blk++)
        block_rows(m, k, a->alpha, A, a->lda, B + blk * BLOCK * a->ldb, a->ldb, a->beta, C + blk * BLOCK,
                   a->ldc);
    return 1;
}
#else
int pv_cpu_gemm_small(const pv_gemm_args *a, const float *A, const float *B, float *C)
{
    (void)a, (void)A, (void)B, (void)C;
    return 0;
}
#endif
