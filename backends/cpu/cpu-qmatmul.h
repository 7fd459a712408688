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
 * products of the block types, as two signed bytes that maddubs multiplies:
 * with d1 = max |x| / 127 (0 below 256 FLT_MIN, where 256 / d1 would overflow),
 * hi = round(x / d1) and lo = round(fma(-d1, hi, x) * 256 / d1) clamped to
 * [-127, 127], x[t][32 b + j] ~= d[t][b] * (256 hi + lo) with d = d1 / 256:
 * steps of max |x| / 32512, the precision of a 16-bit integer. s[t][b] =
 * d[t][b] * sum_j (256 hi + lo), the term Q4_1's minimum and Q4_0's offset
 * multiply. (8 bits alone, llama.cpp's choice, cost 5% of teacher-forced
 * top-1 agreement with the f32 path on SmolLM2; docs/models.md.) */
typedef struct pv_cpu_xq16 {
    int64_t n_blocks; /* per token */
    int8_t *q;        /* [T][n_blocks][2][32]: hi, then lo */
    int16_t *q16;     /* [T][n_blocks][32]: 256 hi + lo */
    float *d, *s;     /* [T][n_blocks] */
} pv_cpu_xq16;

/* Bytes that pv_cpu_xq16_view needs for T tokens of n_in (a multiple of 32). */
uint64_t pv_cpu_xq16_bytes(int64_t T, int64_t n_in);

/* Lays xq out in mem (pv_cpu_xq16_bytes, float-aligned). */
void pv_cpu_xq16_view(pv_cpu_xq16 *xq, void *mem, int64_t T, int64_t n_in);

/* x[T][n_in] (n_in a multiple of 32) into xq. */
void pv_cpu_quantize_x(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq);
/* The same, bit for bit, with AVX2 (only where pv_cpu_qrows_xq_avx2 has kernels). */
void pv_cpu_quantize_x_avx2(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq);

/* ---- the interleaved layout of the block types (Q8_0, Q4_0, Q4_1) ----------
 * Where the integer kernels run, pv_weights_write keeps a matrix's rows in
 * groups of PV_XROWS: for each block index b, one group block holds block b
 * of the group's 8 rows: their 8 f16 scales d, for Q4_1 their 8 f16 minima
 * m, then their codes in pieces of 32 bytes, piece p holding bytes 4p..4p+3
 * of each row's codes, row after row. A piece is then one vector in which
 * each row has a 32-bit lane: the kernels multiply it with 4 activations
 * broadcast to every lane and sum each row in its own lane, with no
 * horizontal reductions. The n_rows % 8 last rows follow in the GGUF layout;
 * the matrix has the GGUF's bytes, row r of the groups starting its group at
 * byte (r - r % 8) x row bytes. */
#define PV_XROWS 8

/* Whether type t is kept interleaved where the integer kernels run. */
int pv_cpu_interleaves(pv_wtype t);

/* src (GGUF layout, n_rows x n_in of t) into dst in the interleaved layout. */
void pv_cpu_interleave(pv_wtype t, const uint8_t *src, int64_t n_rows, int64_t n_in, uint8_t *dst);

/* Block b of row r of an interleaved matrix w, back in the GGUF layout. */
void pv_cpu_interleaved_block(pv_wtype t, const uint8_t *w, int64_t n_rows, int64_t n_in, int64_t r, int64_t b,
                              uint8_t *out);

/* y[t * ldy + r] = sum over blocks of W row r . xq[t] for the block types,
 * with integer products inside each block: W is n_groups interleaved groups
 * of PV_XROWS rows followed by n_tail rows in the GGUF layout. */
typedef void (*pv_cpu_rows_xq_fn)(const uint8_t *w, int64_t n_groups, int64_t n_tail, int64_t n_in,
                                  const pv_cpu_xq16 *xq, int64_t T, float *y, int64_t ldy);

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
