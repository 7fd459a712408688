/* Linear layers over weights kept in their GGUF type: y[T][n_out] =
 * x[T][n_in] W^T with W[n_out][n_in] in F32, F16, BF16, Q8_0, Q4_0 or Q4_1
 * (block layouts in backends/backend.h), and embedding rows of such tables.
 *
 * Decode is bound by the bytes of weights read per token, so each block of W
 * is read from memory once per call and used for every row of x from
 * registers (tiles of PV_QTILE rows of x): no f32 copy of W exists.
 *
 * On x86-64 CPUs with AVX2, FMA and F16C (cpu-qmatmul-avx2.c, chosen at run
 * time; the build needs no -march flag):
 * - the block types multiply x rounded to 16 bits per block of 32 with
 *   integer products (madd), at every batch size. One kernel for every size
 *   keeps a token's outputs the same bits in decode, prefill and recovery,
 *   which stateful serving needs: once activations are rounded, a last-bit
 *   difference between two kernels can move a rounding by a step, and a
 *   conversation would drift from its stateless recomputation;
 * - F16 and BF16 are widened to f32 in registers, at every batch size for
 *   the same reason (a model that mixes them with block types feeds their
 *   outputs to the rounding);
 * - F32 uses that fused kernel up to PV_CPU_QMATMUL_FUSED_MAX_T rows of x
 *   and sgemm above (all-F32 files round nothing).
 * Elsewhere the portable kernels here run: exact f32 products, the fused
 * loop for decode-sized batches and tiles widened into sgemm above. */
#include "config.h"

#include "backends/cpu/cpu.h"
#include "backends/cpu/cpu-qmatmul.h"

#include <cblas.h>
#include <float.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Rows of W per OpenMP work unit: enough work to amortise the schedule,
 * small enough that the 192-row projections still split over the cores. */
#define ROWS_PER_UNIT 16
/* Rows of W widened per sgemm call in the batched path: 256 x n_in floats
 * (at most 6 MB for n_in 6144) stay in the last-level cache. */
#define GEMM_TILE_ROWS 256

/* ---- portable kernels ----------------------------------------------------------- */

/* One block of 32 weights widened to f32 (the formulas of backend.h). */
static void widen_block(pv_wtype t, const uint8_t *b, float out[32])
{
    switch (t) {
    case PV_W_Q8_0: {
        const float d = pv_cpu_weight_at(PV_W_F16, b, 0);
        for (int j = 0; j < 32; j++)
            out[j] = d * (float)(int8_t)b[2 + j];
        return;
    }
    case PV_W_Q4_0:
    case PV_W_Q4_1: {
        const float d = pv_cpu_weight_at(PV_W_F16, b, 0);
        const float m = t == PV_W_Q4_1 ? pv_cpu_weight_at(PV_W_F16, b, 1) : -8.0f * d;
        const uint8_t *qs = b + (t == PV_W_Q4_1 ? 4 : 2);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)(qs[j] & 15) + m;
            out[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
        return;
    }
    default:
        return;
    }
}

static uint32_t block_bytes_of(pv_wtype t)
{
    uint32_t elems = 1, bytes = 4;
    pv_wtype_block(t, &elems, &bytes);
    return bytes;
}

/* Every type: rows of W widened a block (or 32 elements) at a time into a
 * small buffer, then dotted with a tile of up to PV_QTILE rows of x. */
static void rows_portable(pv_wtype t, const uint8_t *w, int64_t n_rows, int64_t n_in, const float *x,
                          int64_t T, float *y, int64_t ldy)
{
    uint32_t block_elems = 1, bb = 4;
    pv_wtype_block(t, &block_elems, &bb);
    const uint64_t row_bytes = (uint64_t)n_in / block_elems * bb;
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *wr = w + (uint64_t)r * row_bytes;
        for (int64_t t0 = 0; t0 < T; t0 += PV_QTILE) {
            const int64_t nt = T - t0 < PV_QTILE ? T - t0 : PV_QTILE;
            float acc[PV_QTILE] = {0};
            for (int64_t k0 = 0; k0 < n_in; k0 += 32) {
                float wb[32];
                const int64_t len = n_in - k0 < 32 ? n_in - k0 : 32;
                if (block_elems == 32)
                    widen_block(t, wr + (uint64_t)k0 / 32 * bb, wb);
                else
                    for (int64_t k = 0; k < len; k++)
                        wb[k] = pv_cpu_weight_at(t, wr, k0 + k);
                for (int64_t j = 0; j < nt; j++) {
                    const float *xr = x + (t0 + j) * n_in + k0;
                    float s = 0;
                    for (int64_t k = 0; k < len; k++)
                        s += wb[k] * xr[k];
                    acc[j] += s;
                }
            }
            for (int64_t j = 0; j < nt; j++)
                y[(t0 + j) * ldy + r] = acc[j];
        }
    }
}

static int64_t xq_stride(int64_t n_in)
{
    return (n_in / 32 + PV_XQ_GROUP - 1) / PV_XQ_GROUP * PV_XQ_GROUP;
}

uint64_t pv_cpu_xq16_bytes(int64_t T, int64_t n_in)
{
    return (uint64_t)T * (uint64_t)xq_stride(n_in) * (32 * sizeof(int16_t) + 2 * sizeof(float));
}

void pv_cpu_xq16_view(pv_cpu_xq16 *xq, void *mem, int64_t T, int64_t n_in)
{
    xq->stride = xq_stride(n_in);
    const uint64_t blocks = (uint64_t)T * (uint64_t)xq->stride;
    xq->d = mem;
    xq->s = xq->d + blocks;
    xq->q = (int16_t *)(xq->s + blocks);
}

void pv_cpu_quantize_x(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < xq->stride; b++) {
            const int64_t i = t * xq->stride + b;
            int16_t *q = xq->q + i * 32;
            if (b >= n_blocks) {
                memset(q, 0, 32 * sizeof *q);
                xq->d[i] = xq->s[i] = 0.0f;
                continue;
            }
            const float *xb = x + t * n_in + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            /* Below FLT_MIN, 1 / d would overflow: such a block counts as zero. */
            const float d = amax / 32767.0f >= FLT_MIN ? amax / 32767.0f : 0.0f;
            const float inv = d > 0.0f ? 1.0f / d : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                const int v = (int)lrintf(xb[j] * inv);
                q[j] = (int16_t)v;
                sum += v;
            }
            xq->d[i] = d;
            xq->s[i] = d * (float)sum;
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
 * not know the name. */
static int cpu_has_f16c(void)
{
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
}
#endif

int pv_cpu_avx2_available(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
           pv_cpu_qrows_avx2(PV_W_F16) != NULL;
#else
    return 0;
#endif
}

/* The AVX2 kernel for t when this backend runs them, else NULL (portable). */
static pv_cpu_rows_fn fast_kernel(const pv_backend *be, pv_wtype t)
{
    return pv_cpu_avx2_kernels(be) ? pv_cpu_qrows_avx2(t) : NULL;
}

/* ---- widening rows to f32 (embedding rows, the batched path) ------------------- */

/* n elements (whole blocks) of type t from src into dst. */
static void widen_row(pv_wtype t, const uint8_t *src, float *dst, int64_t n)
{
    if (t == PV_W_F32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        return;
    }
    if (t == PV_W_F16 || t == PV_W_BF16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = pv_cpu_weight_at(t, src, i);
        return;
    }
    const uint32_t bb = block_bytes_of(t);
    for (int64_t b = 0; b < n / 32; b++)
        widen_block(t, src + (uint64_t)b * bb, dst + b * 32);
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

/* Batches of more rows of x than this go to sgemm where the type allows:
 * decode batches (up to 16 sequences) stay on the fused loop, which reads W
 * once, while sgemm packs all of W on every call, as costly as the products
 * at a few rows (cpu-gemm-small.c); prefill-sized batches amortise it. */
#define PV_CPU_QMATMUL_FUSED_MAX_T 16

/* Decode-sized batches of block types on AVX2: integer products within each
 * block against the 16-bit activations. */
static void qmatmul_xq(const pv_qmatmul_args *a, pv_cpu_rows_xq_fn kernel, const uint8_t *w,
                         const pv_cpu_xq16 *xq, float *y)
{
    const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
    const int64_t units = (a->n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t u = 0; u < units; u++) {
        const int64_t r0 = u * ROWS_PER_UNIT;
        const int64_t n_rows = a->n_out - r0 < ROWS_PER_UNIT ? a->n_out - r0 : ROWS_PER_UNIT;
        kernel(w + (uint64_t)r0 * row_bytes, n_rows, a->n_in, xq, a->n_tokens, y + r0, a->n_out);
    }
}

static void qmatmul_fused(pv_cpu_rows_fn fast, const pv_qmatmul_args *a, const uint8_t *w, const float *x,
                          float *y)
{
    const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
    const int64_t units = (a->n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t u = 0; u < units; u++) {
        const int64_t r0 = u * ROWS_PER_UNIT;
        const int64_t n_rows = a->n_out - r0 < ROWS_PER_UNIT ? a->n_out - r0 : ROWS_PER_UNIT;
        const uint8_t *wu = w + (uint64_t)r0 * row_bytes;
        if (fast)
            fast(wu, n_rows, a->n_in, x, a->n_tokens, y + r0, a->n_out);
        else
            rows_portable(a->w_type, wu, n_rows, a->n_in, x, a->n_tokens, y + r0, a->n_out);
    }
}

/* Tiles of W rows widened into `tile` (tile_rows x n_in floats), each
 * multiplied by x with sgemm. */
static void qmatmul_sgemm(const pv_qmatmul_args *a, const uint8_t *w, const float *x, float *tile,
                          int64_t tile_rows, float *y)
{
    const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
    for (int64_t r0 = 0; r0 < a->n_out; r0 += tile_rows) {
        const int64_t n_rows = a->n_out - r0 < tile_rows ? a->n_out - r0 : tile_rows;
        PV_CPU_OMP("omp parallel for schedule(static)")
        for (int64_t r = 0; r < n_rows; r++)
            widen_row(a->w_type, w + (uint64_t)(r0 + r) * row_bytes, tile + r * a->n_in, a->n_in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)a->n_tokens, (blasint)n_rows,
                    (blasint)a->n_in, 1.0f, x, (blasint)a->n_in, tile, (blasint)a->n_in, 0.0f, y + r0,
                    (blasint)a->n_out);
    }
}

pv_status pv_cpu_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    const uint8_t *w = (const uint8_t *)a->w->host_ptr + type_bytes(a->w_type, a->w_off);
    const float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    float *y = pv_cpu_elem_ptr(a->y, a->y_off, sizeof(float));
    const int64_t T = a->n_tokens, n_in = a->n_in;
    const int small = T <= PV_CPU_QMATMUL_FUSED_MAX_T;
    /* f32 weights need no widening: sgemm reads them in place. */
    if (a->w_type == PV_W_F32 && !small) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)T, (blasint)a->n_out, (blasint)n_in,
                    1.0f, x, (blasint)n_in, (const float *)w, (blasint)n_in, 0.0f, y, (blasint)a->n_out);
        return PV_OK;
    }
    const pv_cpu_rows_fn fast = fast_kernel(be, a->w_type);
    const pv_cpu_rows_xq_fn xq_kernel = pv_cpu_avx2_kernels(be) ? pv_cpu_qrows_xq_avx2(a->w_type) : NULL;
    if (xq_kernel) {
        /* One kernel for every batch size: a token's outputs are then the
         * same bits whichever batch it ran in (decode, prefill, recovery),
         * as stateful and stateless serving must agree (see the top). */
        float *mem = NULL;
        const uint64_t xq_bytes = pv_cpu_xq16_bytes(T, n_in);
        pv_status st = pv_cpu_scratch(be, (xq_bytes + sizeof(float) - 1) / sizeof(float), &mem);
        if (st != PV_OK)
            return st;
        pv_cpu_xq16 xq;
        pv_cpu_xq16_view(&xq, mem, T, n_in);
        pv_cpu_quantize_x_avx2(x, T, n_in, &xq);
        qmatmul_xq(a, xq_kernel, w, &xq, y);
        return PV_OK;
    }
    /* F16 and BF16 stay on the fused kernel at every batch size too: in a
     * model that mixes them with block types (F16 value projections, say),
     * their last bits feed the rounding of the next layer. F32 is left
     * to sgemm above 16 rows: files hold it for norms, or for every matrix. */
    if (small || (pv_cpu_avx2_kernels(be) && a->w_type != PV_W_F32)) {
        qmatmul_fused(fast, a, w, x, y);
        return PV_OK;
    }
    const int64_t tile_rows = a->n_out < GEMM_TILE_ROWS ? a->n_out : GEMM_TILE_ROWS;
    float *scratch = NULL;
    pv_status st = pv_cpu_scratch(be, (uint64_t)tile_rows * (uint64_t)n_in, &scratch);
    if (st != PV_OK)
        return st;
    qmatmul_sgemm(a, w, x, scratch, tile_rows, y);
    return PV_OK;
}

int pv_cpu_qmatmul_xq(const pv_backend *be)
{
    return pv_cpu_avx2_kernels(be); /* the integer kernels come with the AVX2 ones */
}

int pv_cpu_qmatmul_supports(pv_wtype t)
{
    return pv_wtype_block(t, NULL, NULL);
}
