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

/* dst[0..n) = the n elements (whole blocks) of a row of block type t. */
typedef void (*pv_cpu_widen_fn)(const uint8_t *src, float *dst, int64_t n);

/* The AVX2 + FMA + F16C widening of block type t, or NULL (also for the
 * unblocked types, which need no kernel of their own). */
pv_cpu_widen_fn pv_cpu_widen_avx2(pv_wtype t);

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
