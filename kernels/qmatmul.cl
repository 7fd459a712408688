/* Quantized matmul family: y[T][n_out] = x[T][n_in] W^T with W[n_out][n_in]
 * in a GGUF weight type (block layouts in backends/backend.h), the
 * widening of W rows to f32, and embedding-row gather from such tables.
 *
 * Built once per weight type: PV_WTYPE is the type's ggml id (0 F32, 1 F16,
 * 2 Q4_0, 3 Q4_1, 8 Q8_0, 30 BF16), one program per type on OpenCL and
 * CUDA (NVRTC) alike.
 *
 * W is addressed in 16-bit words: every block of every type is a whole
 * number of them and starts 2-byte aligned (the front end accepts only
 * whole-block offsets), so the scales load as halves and the quants as
 * words without unaligned access. A "unit" is what one work-item widens at
 * a time: a block of 32 for the quantized types, one element for the float
 * types (whose rows need not be a multiple of anything). */
#include "dialect.h"

#ifndef PV_WTYPE
#error "kernels/qmatmul.cl: define PV_WTYPE (the weight type's ggml id)"
#endif

#undef PV_W_UNIT
#undef PV_W_UNIT_WORDS
#if PV_WTYPE == 0 /* F32 */
#define PV_W_UNIT 1
#define PV_W_UNIT_WORDS 2
#elif PV_WTYPE == 1 || PV_WTYPE == 30 /* F16, BF16 */
#define PV_W_UNIT 1
#define PV_W_UNIT_WORDS 1
#elif PV_WTYPE == 8 /* Q8_0: d, q[32] */
#define PV_W_UNIT 32
#define PV_W_UNIT_WORDS 17
#elif PV_WTYPE == 2 /* Q4_0: d, qs[16] */
#define PV_W_UNIT 32
#define PV_W_UNIT_WORDS 9
#elif PV_WTYPE == 3 /* Q4_1: d, m, qs[16] */
#define PV_W_UNIT 32
#define PV_W_UNIT_WORDS 10
#else
#error "kernels/qmatmul.cl: PV_WTYPE is not a supported weight type"
#endif

/* A signed byte from the low 8 bits of b (char's signedness differs
 * between the dialects' host compilers). */
PV_FUNC float pv_w_i8(pv_u32 b)
{
    return (float)((int)((b & 0xffu) ^ 0x80u) - 0x80);
}

/* Unit u of a row starting at word `row`, widened into out[PV_W_UNIT]. */
PV_FUNC void pv_w_unit(const PV_GLOBAL pv_u16 *row, pv_long u, float *out)
{
    const PV_GLOBAL pv_u16 *b = row + u * PV_W_UNIT_WORDS;
#if PV_WTYPE == 0
    out[0] = PV_AS_FLOAT((pv_u32)b[0] | ((pv_u32)b[1] << 16));
#elif PV_WTYPE == 1
    out[0] = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 0);
#elif PV_WTYPE == 30
    out[0] = PV_AS_FLOAT((pv_u32)b[0] << 16);
#elif PV_WTYPE == 8
    const float d = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 0);
    #pragma unroll
    for (int k = 0; k < 16; k++) {
        const pv_u32 word = b[1 + k];
        out[2 * k] = d * pv_w_i8(word);
        out[2 * k + 1] = d * pv_w_i8(word >> 8);
    }
#else /* Q4_0, Q4_1: byte j holds elements j (low nibble) and j + 16 */
#if PV_WTYPE == 2
    const float d = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 0);
    const float m = -8.0f * d;
    const PV_GLOBAL pv_u16 *qs = b + 1;
#else
    const float d = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 0);
    const float m = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 1);
    const PV_GLOBAL pv_u16 *qs = b + 2;
#endif
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        const pv_u32 word = qs[k];
        out[2 * k] = d * (float)(word & 15u) + m;
        out[2 * k + 1] = d * (float)((word >> 8) & 15u) + m;
        out[2 * k + 16] = d * (float)((word >> 4) & 15u) + m;
        out[2 * k + 17] = d * (float)((word >> 12) & 15u) + m;
    }
#endif
}

/* Element e of a row starting at word `row`, widened (the copy kernels:
 * one element per work-item keeps their f32 writes coalesced). */
PV_FUNC float pv_w_elem(const PV_GLOBAL pv_u16 *row, pv_long e)
{
#if PV_W_UNIT == 1
    float v[1];
    pv_w_unit(row, e, v);
    return v[0];
#else
    const PV_GLOBAL pv_u16 *b = row + (e / 32) * PV_W_UNIT_WORDS;
    const int j = (int)(e % 32);
    const float d = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 0);
#if PV_WTYPE == 8
    return d * pv_w_i8((pv_u32)b[1 + j / 2] >> (8 * (j % 2)));
#else
    const int byte = j % 16;
#if PV_WTYPE == 2
    const pv_u32 word = b[1 + byte / 2];
    const float m = -8.0f * d;
#else
    const pv_u32 word = b[2 + byte / 2];
    const float m = PV_LOAD_HALF((const PV_GLOBAL pv_half *)b, 1);
#endif
    return d * (float)((word >> (8 * (byte % 2) + 4 * (j / 16))) & 15u) + m;
#endif
#endif
}

#define PV_QMAX_T 16 /* the largest token class */

/* Fused dequantize-and-dot for decode-sized batches (T <= max_t <= PV_QMAX_T).
 * A group takes rows_per_group rows of W (a power of two dividing PV_WG);
 * the PV_WG / rows_per_group work-items of a row stride over its units, so
 * neighbouring work-items read neighbouring units (coalesced). Each unit is
 * read once, widened once and dotted with all T rows of x, so each weight
 * byte crosses the memory bus once per call. The per-token sums are then
 * reduced within each row's work-items in local memory (one tree for all
 * tokens). The token loops run to the constant PV_QMAX_T and unroll;
 * max_t is a literal in each kernel below, so after inlining the
 * iterations past it fold away and acc stays in registers.
 * groups {ceil(n_out / rows_per_group), 1}
 * w  [n_out][n_in] in PV_WTYPE, from word w_off
 * x  [T][n_in] f32 from x_off; y [T][n_out] f32 from y_off
 * Local memory: max_t * PV_WG floats. */

/* acc[t] = this work-item's share of row `row`'s dot product with token t
 * (t < max_t and n_tokens; 0 past them, and for rows past n_out). */
PV_FUNC void pv_qmatmul_partial(const int max_t, const PV_GLOBAL pv_u16 *w, pv_long w_off,
                                const PV_GLOBAL float *x, pv_long x_off, pv_long row, int lane, int per_row,
                                int n_tokens, int n_in, int n_out, float *acc)
{
    const int n_units = n_in / PV_W_UNIT;
    #pragma unroll
    for (int t = 0; t < PV_QMAX_T; t++)
        acc[t] = 0.0f;
    if (row >= n_out)
        return;
    const PV_GLOBAL pv_u16 *w_row = w + w_off + row * ((pv_long)n_units * PV_W_UNIT_WORDS);
    for (int u = lane; u < n_units; u += per_row) {
        float wv[PV_W_UNIT];
        pv_w_unit(w_row, u, wv);
        const PV_GLOBAL float *xu = x + x_off + (pv_long)u * PV_W_UNIT;
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++) {
            if (t < max_t && t < n_tokens) {
                const PV_GLOBAL float *xt = xu + (pv_long)t * n_in;
                float s = 0.0f;
                #pragma unroll
                for (int k = 0; k < PV_W_UNIT; k++)
                    s += wv[k] * xt[k];
                acc[t] += s;
            }
        }
    }
}

/* Sums acc[t] over the per_row work-items of each row (lane 0 of the row
 * gets the totals in its acc) through red; every work-item calls it, and
 * red may be used again only after a barrier. */
PV_FUNC void pv_qmatmul_reduce(const int max_t, PV_LOCAL float *red, int lane, int per_row, float *acc)
{
    const int lid = PV_LOCAL_ID();
    #pragma unroll
    for (int t = 0; t < PV_QMAX_T; t++)
        if (t < max_t)
            red[t * PV_WG + lid] = acc[t];
    PV_BARRIER();
    for (int stride = per_row / 2; stride > 0; stride >>= 1) {
        if (lane < stride) {
            #pragma unroll
            for (int t = 0; t < PV_QMAX_T; t++)
                if (t < max_t)
                    red[t * PV_WG + lid] += red[t * PV_WG + lid + stride];
        }
        PV_BARRIER();
    }
    #pragma unroll
    for (int t = 0; t < PV_QMAX_T; t++)
        if (t < max_t)
            acc[t] = red[t * PV_WG + lid];
}

PV_FUNC void pv_qmatmul_fused(const int max_t, PV_LOCAL float *red, const PV_GLOBAL pv_u16 *w, pv_long w_off,
                              const PV_GLOBAL float *x, pv_long x_off, PV_GLOBAL float *y, pv_long y_off,
                              int n_tokens, int n_in, int n_out, int rows_per_group)
{
    const int per_row = PV_WG / rows_per_group;
    const int lane = PV_LOCAL_ID() % per_row;
    const pv_long row = PV_GROUP_ID(0) * rows_per_group + PV_LOCAL_ID() / per_row;
    float acc[PV_QMAX_T];
    pv_qmatmul_partial(max_t, w, w_off, x, x_off, row, lane, per_row, n_tokens, n_in, n_out, acc);
    pv_qmatmul_reduce(max_t, red, lane, per_row, acc);
    if (lane == 0 && row < n_out) {
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++)
            if (t < max_t && t < n_tokens)
                y[y_off + (pv_long)t * n_out + row] = acc[t];
    }
}

/* y = silu(x Wg^T) * (x Wu^T), silu(g) = g / (1 + exp(-g)): the SwiGLU
 * product in one pass for decode-sized batches, row for row as
 * pv_qmatmul_fused runs each product (the same sums, the same order), with
 * the gate's totals kept in registers while the up product's are reduced.
 * Wg and Wu [n_out][n_in] in PV_WTYPE from words wg_off and wu_off; the
 * groups and local memory of pv_qmatmul_fused. */
PV_FUNC void pv_qmatmul_swiglu_fused(const int max_t, PV_LOCAL float *red, const PV_GLOBAL pv_u16 *wg,
                                     pv_long wg_off, const PV_GLOBAL pv_u16 *wu, pv_long wu_off,
                                     const PV_GLOBAL float *x, pv_long x_off, PV_GLOBAL float *y, pv_long y_off,
                                     int n_tokens, int n_in, int n_out, int rows_per_group)
{
    const int per_row = PV_WG / rows_per_group;
    const int lane = PV_LOCAL_ID() % per_row;
    const pv_long row = PV_GROUP_ID(0) * rows_per_group + PV_LOCAL_ID() / per_row;
    float gate[PV_QMAX_T], up[PV_QMAX_T];
    pv_qmatmul_partial(max_t, wg, wg_off, x, x_off, row, lane, per_row, n_tokens, n_in, n_out, gate);
    pv_qmatmul_partial(max_t, wu, wu_off, x, x_off, row, lane, per_row, n_tokens, n_in, n_out, up);
    pv_qmatmul_reduce(max_t, red, lane, per_row, gate);
    PV_BARRIER();
    pv_qmatmul_reduce(max_t, red, lane, per_row, up);
    if (lane == 0 && row < n_out) {
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++)
            if (t < max_t && t < n_tokens)
                y[y_off + (pv_long)t * n_out + row] = gate[t] / (1.0f + PV_EXP(-gate[t])) * up[t];
    }
}

/* One kernel per token class: the host picks the smallest max_t >= T. */
#define PV_QMATMUL_FUSED_KERNEL(max_t)                                                             \
    PV_KERNEL pv_qmatmul_fused_##max_t(const PV_GLOBAL pv_u16 *w, pv_long w_off,                  \
                                       const PV_GLOBAL float *x, pv_long x_off,                   \
                                       PV_GLOBAL float *y, pv_long y_off, int n_tokens, int n_in, \
                                       int n_out, int rows_per_group)                             \
    {                                                                                              \
        PV_LOCAL_ARRAY(float, red, max_t * PV_WG);                                                 \
        pv_qmatmul_fused(max_t, red, w, w_off, x, x_off, y, y_off, n_tokens, n_in, n_out,         \
                         rows_per_group);                                                          \
    }                                                                                              \
    PV_KERNEL pv_qmatmul_swiglu_##max_t(const PV_GLOBAL pv_u16 *wg, pv_long wg_off,               \
                                        const PV_GLOBAL pv_u16 *wu, pv_long wu_off,               \
                                        const PV_GLOBAL float *x, pv_long x_off,                  \
                                        PV_GLOBAL float *y, pv_long y_off, int n_tokens,          \
                                        int n_in, int n_out, int rows_per_group)                  \
    {                                                                                              \
        PV_LOCAL_ARRAY(float, red, max_t * PV_WG);                                                 \
        pv_qmatmul_swiglu_fused(max_t, red, wg, wg_off, wu, wu_off, x, x_off, y, y_off, n_tokens, \
                                n_in, n_out, rows_per_group);                                      \
    }
PV_QMATMUL_FUSED_KERNEL(1)
PV_QMATMUL_FUSED_KERNEL(4)
PV_QMATMUL_FUSED_KERNEL(16) /* PV_QMAX_T */
#undef PV_QMATMUL_FUSED_KERNEL

/* out[r][e] = W[row0 + r][e] as f32 for the larger batches, whose product
 * the backend's BLAS GEMM then takes from this scratch tile.
 * groups {ceil(n_in / PV_WG), n_rows}; out [n_rows][n_in] f32. */
PV_KERNEL pv_qmatmul_widen(const PV_GLOBAL pv_u16 *w, pv_long w_off, int n_in, pv_long row0,
                           PV_GLOBAL float *out)
{
    const pv_long e = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    const pv_long r = PV_GROUP_ID(1);
    if (e >= n_in)
        return;
    const pv_long row_words = (pv_long)(n_in / PV_W_UNIT) * PV_W_UNIT_WORDS;
    out[r * n_in + e] = pv_w_elem(w + w_off + (row0 + r) * row_words, e);
}

/* out[out_off + i * dim + e] = table[ids[i]][e] as f32, the table from
 * word table_off. groups {ceil(dim / PV_WG), n_ids}. */
PV_KERNEL pv_embed_gather(const PV_GLOBAL pv_u16 *table, pv_long table_off, const PV_GLOBAL int *ids,
                          pv_long dim, PV_GLOBAL float *out, pv_long out_off)
{
    const pv_long e = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    const pv_long i = PV_GROUP_ID(1);
    if (e >= dim)
        return;
    const pv_long row_words = dim / PV_W_UNIT * PV_W_UNIT_WORDS;
    out[out_off + i * dim + e] = pv_w_elem(table + table_off + (pv_long)ids[i] * row_words, e);
}
