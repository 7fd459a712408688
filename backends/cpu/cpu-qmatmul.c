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
 *   integer products, over rows kept interleaved in groups of 8
 *   (pv_weights_write; layout in cpu-qmatmul.h), at every batch size. One
 *   kernel for every size keeps a token's outputs the same bits in decode,
 *   prefill and recovery, which stateful serving needs: once activations
 *   are rounded, a last-bit difference between two kernels can move a
 *   rounding by a step, and a conversation would drift from its stateless
 *   recomputation;
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

uint64_t pv_cpu_xq16_bytes(int64_t T, int64_t n_in)
{
    return (uint64_t)T * (uint64_t)(n_in / 32) * (64 * sizeof(int8_t) + 32 * sizeof(int16_t) + 2 * sizeof(float));
}

void pv_cpu_xq16_view(pv_cpu_xq16 *xq, void *mem, int64_t T, int64_t n_in)
{
    xq->n_blocks = n_in / 32;
    const uint64_t blocks = (uint64_t)T * (uint64_t)xq->n_blocks;
    xq->d = mem;
    xq->s = xq->d + blocks;
    xq->q16 = (int16_t *)(xq->s + blocks);
    xq->q = (int8_t *)(xq->q16 + blocks * 32);
}

void pv_cpu_quantize_x(const float *x, int64_t T, int64_t n_in, pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t i = t * n_blocks + b;
            const float *xb = x + t * n_in + b * 32;
            int8_t *hi = xq->q + i * 64, *lo = hi + 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            /* Below 256 FLT_MIN, 256 / d1 would overflow: such a block counts as zero. */
            const float d1 = amax / 127.0f >= 256.0f * FLT_MIN ? amax / 127.0f : 0.0f;
            const float inv = d1 > 0.0f ? 1.0f / d1 : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                /* |x| inv <= amax / (amax / 127) rounds to at most 127; the
                 * remainder is at most half a step of d1, 128 of d1 / 256 */
                const int h = (int)lrintf(xb[j] * inv);
                const int l = (int)lrintf(fmaf(-d1, (float)h, xb[j]) * (inv * 256.0f));
                hi[j] = (int8_t)h;
                lo[j] = (int8_t)(l > 127 ? 127 : l < -127 ? -127 : l);
                xq->q16[i * 32 + j] = (int16_t)(256 * h + lo[j]);
                sum += 256 * h + lo[j];
            }
            xq->d[i] = d1 / 256.0f;
            xq->s[i] = xq->d[i] * (float)sum;
        }
}

/* ---- the interleaved layout (cpu-qmatmul.h) ------------------------------------ */

int pv_cpu_interleaves(pv_wtype t)
{
    return t == PV_W_Q8_0 || t == PV_W_Q4_0 || t == PV_W_Q4_1;
}

/* Bytes of a block's scales (d, and m for Q4_1) before its codes. */
static uint32_t scale_bytes(pv_wtype t)
{
    return t == PV_W_Q4_1 ? 4 : 2;
}

/* Where the piece of block b of row r (r < the grouped rows) that starts at
 * byte `at` of its GGUF block lies in an interleaved matrix; *len gets the
 * piece's bytes: 2 for a scale (arrays of 8 halves), 4 for codes. */
static uint64_t piece_at(uint32_t bb, uint32_t hb, int64_t n_in, int64_t r, int64_t b, uint32_t at, uint32_t *len)
{
    const uint64_t group_block =
        ((uint64_t)(r / PV_XROWS) * (uint64_t)(n_in / 32) + (uint64_t)b) * PV_XROWS * bb;
    const uint32_t lane = (uint32_t)(r % PV_XROWS);
    *len = at < hb ? 2 : 4;
    return at < hb ? group_block + at * PV_XROWS + lane * 2
                   : group_block + hb * PV_XROWS + (at - hb) * PV_XROWS + lane * 4;
}

void pv_cpu_interleave(pv_wtype t, const uint8_t *src, int64_t n_rows, int64_t n_in, uint8_t *dst)
{
    const uint32_t bb = block_bytes_of(t), hb = scale_bytes(t);
    const int64_t n_blocks = n_in / 32, grouped = n_rows / PV_XROWS * PV_XROWS;
    const uint64_t row_bytes = (uint64_t)n_blocks * bb;
    for (int64_t r = 0; r < grouped; r++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const uint8_t *block = src + (uint64_t)r * row_bytes + (uint64_t)b * bb;
            for (uint32_t at = 0, len = 0; at < bb; at += len) {
                const uint64_t to = piece_at(bb, hb, n_in, r, b, at, &len);
                memcpy(dst + to, block + at, len);
            }
        }
    memcpy(dst + (uint64_t)grouped * row_bytes, src + (uint64_t)grouped * row_bytes,
           (size_t)((uint64_t)(n_rows - grouped) * row_bytes));
}

void pv_cpu_interleaved_block(pv_wtype t, const uint8_t *w, int64_t n_rows, int64_t n_in, int64_t r, int64_t b,
                              uint8_t *out)
{
    const uint32_t bb = block_bytes_of(t), hb = scale_bytes(t);
    if (r >= n_rows / PV_XROWS * PV_XROWS) {
        memcpy(out, w + (uint64_t)r * (uint64_t)(n_in / 32) * bb + (uint64_t)b * bb, bb);
        return;
    }
    for (uint32_t at = 0, len = 0; at < bb; at += len) {
        const uint64_t from = piece_at(bb, hb, n_in, r, b, at, &len);
        memcpy(out + at, w + from, len);
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

/* Whether this backend keeps matrices of type t interleaved (cpu-qmatmul.h). */
static int interleaved(const pv_backend *be, pv_wtype t)
{
    return pv_cpu_avx2_kernels(be) && pv_cpu_interleaves(t) && pv_cpu_qrows_xq_avx2(t) != NULL;
}

pv_status pv_cpu_weights_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows,
                               int64_t n_cols, const void *src)
{
    uint8_t *to = (uint8_t *)dst->host_ptr + dst_off;
    if (interleaved(be, t))
        pv_cpu_interleave(t, src, n_rows, n_cols, to);
    else
        memcpy(to, src, (size_t)type_bytes(t, (uint64_t)n_rows * (uint64_t)n_cols));
    return PV_OK;
}

pv_status pv_cpu_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    const uint8_t *table = (const uint8_t *)a->table->host_ptr + type_bytes(a->table_type, a->table_off);
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    const uint64_t row_bytes = type_bytes(a->table_type, (uint64_t)a->dim);
    const int rows_interleaved = interleaved(be, a->table_type);
    const int32_t *ids_dev = a->ids_dev ? pv_cpu_elem_ptr(a->ids_dev, a->ids_dev_off, sizeof(int32_t)) : NULL;
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int32_t i = 0; i < a->n_ids; i++) {
        float *dst = out + (int64_t)i * a->dim;
        /* -(j + 1): device id j, which no host check has seen */
        const int32_t id = a->ids[i] >= 0 ? a->ids[i] : ids_dev[-(int64_t)a->ids[i] - 1];
        if (id < 0 || id >= a->n_rows) {
            memset(dst, 0, (size_t)a->dim * sizeof *dst);
            continue;
        }
        if (!rows_interleaved) {
            widen_row(a->table_type, table + (uint64_t)id * row_bytes, dst, a->dim);
            continue;
        }
        for (int64_t b = 0; b < a->dim / 32; b++) {
            uint8_t block[64]; /* the largest block type's bytes */
            pv_cpu_interleaved_block(a->table_type, table, a->n_rows, a->dim, id, b, block);
            widen_block(a->table_type, block, dst + b * 32);
        }
    }
    return PV_OK;
}

/* ---- the op -------------------------------------------------------------------- */

/* Batches of more rows of x than this go to sgemm where the type allows:
 * decode batches (up to 16 sequences) stay on the fused loop, which reads W
 * once, while sgemm packs all of W on every call, as costly as the products
 * at a few rows (cpu-gemm-small.c); prefill-sized batches amortise it. */
#define PV_CPU_QMATMUL_FUSED_MAX_T 16

/* Block types on AVX2: integer products within each block against the
 * 16-bit activations, over the interleaved layout; the rows of all n
 * products (one x) are cut into units and split over the threads together. */
static void qmatmul_xq(const pv_qmatmul_args *products, int n, const pv_cpu_rows_xq_fn *kernels,
                       const uint8_t *const *ws, const pv_cpu_xq16 *xq, float *const *ys)
{
    int64_t first_unit[PV_QMATMUL_GROUP_MAX + 1];
    first_unit[0] = 0;
    for (int i = 0; i < n; i++)
        first_unit[i + 1] = first_unit[i] + (products[i].n_out + ROWS_PER_UNIT - 1) / ROWS_PER_UNIT;
    const int64_t units = first_unit[n];
    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t u = 0; u < units; u++) {
        int i = 0;
        while (u >= first_unit[i + 1])
            i++;
        const pv_qmatmul_args *a = &products[i];
        const uint64_t row_bytes = type_bytes(a->w_type, (uint64_t)a->n_in);
        const int64_t grouped = a->n_out / PV_XROWS * PV_XROWS;
        const int64_t r0 = (u - first_unit[i]) * ROWS_PER_UNIT;
        const int64_t r1 = a->n_out - r0 < ROWS_PER_UNIT ? a->n_out : r0 + ROWS_PER_UNIT;
        const int64_t g1 = r1 < grouped ? r1 : grouped; /* a unit's groups end here, then its tail rows */
        const int64_t n_groups = g1 > r0 ? (g1 - r0) / PV_XROWS : 0;
        kernels[i](ws[i] + (uint64_t)r0 * row_bytes, n_groups, r1 - r0 - n_groups * PV_XROWS, a->n_in, xq,
                   a->n_tokens, ys[i] + r0, a->n_out);
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

/* Products of interleaved types sharing x (pv_qmatmul_group): x rounded
 * once, then one parallel pass. One kernel for every batch size: a token's
 * outputs are then the same bits whichever batch it ran in (decode, prefill,
 * recovery), as stateful and stateless serving must agree (see the top). */
static pv_status qmatmul_interleaved(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    const int64_t T = products[0].n_tokens, n_in = products[0].n_in;
    float *mem = NULL;
    const uint64_t xq_bytes = pv_cpu_xq16_bytes(T, n_in);
    pv_status st = pv_cpu_scratch(be, (xq_bytes + sizeof(float) - 1) / sizeof(float), &mem);
    if (st != PV_OK)
        return st;
    pv_cpu_xq16 xq;
    pv_cpu_xq16_view(&xq, mem, T, n_in);
    pv_cpu_quantize_x_avx2(pv_cpu_elem_ptr(products[0].x, products[0].x_off, sizeof(float)), T, n_in, &xq);
    pv_cpu_rows_xq_fn kernels[PV_QMATMUL_GROUP_MAX];
    const uint8_t *ws[PV_QMATMUL_GROUP_MAX];
    float *ys[PV_QMATMUL_GROUP_MAX];
    for (int i = 0; i < n; i++) {
        const pv_qmatmul_args *a = &products[i];
        kernels[i] = pv_cpu_qrows_xq_avx2(a->w_type);
        ws[i] = (const uint8_t *)a->w->host_ptr + type_bytes(a->w_type, a->w_off);
        ys[i] = pv_cpu_elem_ptr(a->y, a->y_off, sizeof(float));
    }
    qmatmul_xq(products, n, kernels, ws, &xq, ys);
    return PV_OK;
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
    if (interleaved(be, a->w_type))
        return qmatmul_interleaved(be, a, 1);
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

pv_status pv_cpu_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    int all_interleaved = 1;
    for (int i = 0; i < n; i++)
        all_interleaved = all_interleaved && interleaved(be, products[i].w_type);
    if (all_interleaved)
        return qmatmul_interleaved(be, products, n);
    for (int i = 0; i < n; i++) {
        pv_status st = pv_cpu_qmatmul(be, &products[i]);
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}

/* The gate and up products as one group (gate into y, up into a->up), then
 * y = silu(y) * up element-wise. */
pv_status pv_cpu_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a)
{
    const pv_qmatmul_args products[2] = {
        {.w_type = a->w_type, .n_tokens = a->n_tokens, .n_in = a->n_in, .n_out = a->n_out, .w = a->w_gate,
         .w_off = a->w_gate_off, .x = a->x, .x_off = a->x_off, .y = a->y, .y_off = a->y_off},
        {.w_type = a->w_type, .n_tokens = a->n_tokens, .n_in = a->n_in, .n_out = a->n_out, .w = a->w_up,
         .w_off = a->w_up_off, .x = a->x, .x_off = a->x_off, .y = a->up, .y_off = a->up_off},
    };
    PV_TRY(pv_cpu_qmatmul_group(be, products, 2));
    const pv_swiglu_args s = {.n = a->n_tokens * a->n_out, .gate = a->y, .gate_off = a->y_off, .up = a->up,
                              .up_off = a->up_off, .out = a->y, .out_off = a->y_off};
    return pv_cpu_swiglu(be, &s);
}

int pv_cpu_qmatmul_activation_bits(const pv_backend *be)
{
    return pv_cpu_avx2_kernels(be) ? 16 : 0; /* the integer kernels come with the AVX2 ones */
}

int pv_cpu_qmatmul_supports(pv_wtype t)
{
    return pv_wtype_block(t, NULL, NULL);
}
