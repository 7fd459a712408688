/* What the portable and the x86 quantized-matmul kernels share
 * (cpu-qmatmul.c, cpu-qmatmul-avx2.c). */
#ifndef PV_BACKENDS_CPU_QMATMUL_H
#define PV_BACKENDS_CPU_QMATMUL_H

#include "backends/backend.h"

#include <pensieve/half.h>

#include <stdint.h>
#include <string.h>

/* Rows of x per register tile: two accumulators per row, 4 widened vectors
 * and the x operands fit the 16 AVX2 registers. */
#define PV_QTILE 4

/* y[t * ldy + r] = sum_k W[r][k] x[t][k] for rows r < n_rows of W (at w)
 * and t < T rows of x ([T][n_in]). */
typedef void (*pv_cpu_rows_fn)(const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x, int64_t T,
                               float *y, int64_t ldy);

/* Activations rounded to 16 bits per block of 32 for the integer dot
 * products of the block types: x[t][32 b + j] ~= d[t][b] * q[t][b][j], and
 * s[t][b] = d[t][b] * sum_j q[t][b][j] (the term Q4_1's minimum and Q4_0's
 * offset multiply). Each token's blocks are padded with zeros to a whole
 * group of PV_XQ_GROUP, so the kernels read eight scales at once. */
#define PV_XQ_GROUP 8
typedef struct pv_cpu_xq16 {
    int64_t stride; /* blocks per token, padded */
    int16_t *q;     /* [T][stride][32] */
    float *d, *s;   /* [T][stride] */
} pv_cpu_xq16;

/* Bytes that pv_cpu_xq16_view needs for T tokens of n_in (a multiple of 32). */
uint64_t pv_cpu_xq16_bytes(int64_t T, int64_t n_in);

/* Lays xq out in mem (pv_cpu_xq16_bytes, float-aligned). */
void pv_cpu_xq16_view(pv_cpu_xq16 *xq, void *mem, int64_t T, int64_t n_in);

/* x[T][n_in] (n_in a multiple of 32) into xq, padding included. */
void pv_cpu_quantize_x(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq);
/* The same, bit for bit, with AVX2 (only where pv_cpu_qrows_xq_avx2 has kernels). */
void pv_cpu_quantize_x_avx2(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq);

/* y[t * ldy + r] = sum over blocks of W row r . xq[t] for the block types
 * (Q8_0, Q4_0, Q4_1), with integer products inside each block. */
typedef void (*pv_cpu_rows_xq_fn)(const uint8_t *w, int64_t n_rows, int64_t n_in, const pv_cpu_xq16 *xq,
                                  int64_t T, float *y, int64_t ldy);

/* The AVX2 integer kernel for block type t, or NULL. */
pv_cpu_rows_xq_fn pv_cpu_qrows_xq_avx2(pv_wtype t);

/* The AVX2 + FMA + F16C kernel for type t, or NULL where not built (not
 * x86-64, or not GCC-compatible). The caller checks the CPU. */
pv_cpu_rows_fn pv_cpu_qrows_avx2(pv_wtype t);

/* Element k of a row of an unblocked weight type (F32, F16, BF16). */
static inline float pv_cpu_weight_at(pv_wtype t, const uint8_t *row, int64_t k)
{
    if (t == PV_W_F32) {
        float f;
        memcpy(&f, row + 4 * k, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * k, sizeof h);
    if (t == PV_W_F16)
        return pv_half_to_float(h);
    const uint32_t bits = (uint32_t)h << 16; /* bf16 is the top half of an f32 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
