/* Quantized matmul family: y[T][n_out] = x[T][n_in] W^T with W[n_out][n_in]
 * in a GGUF weight type (block layouts in backends/backend.h), the
 * widening of W rows to f32 (or to f16/bf16 with the activations, for
 * tensor-core GEMMs), and embedding-row gather from such tables.
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

/* Element e of a row starting at word `row`, widened (the copy kernels:
 * one element per work-item keeps their f32 writes coalesced). */
PV_FUNC float pv_w_elem(const PV_GLOBAL pv_u16 *row, pv_long e)
{
#if PV_WTYPE == 0
    return PV_AS_FLOAT((pv_u32)row[2 * e] | ((pv_u32)row[2 * e + 1] << 16));
#elif PV_WTYPE == 1
    return PV_LOAD_HALF((const PV_GLOBAL pv_half *)row, e);
#elif PV_WTYPE == 30
    return PV_AS_FLOAT((pv_u32)row[e] << 16);
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

/* ---- Decode-sized products (T <= max_t <= PV_QMAX_T) ----------------------
 * A work-group takes `rows` consecutive rows of W (pv_qmv_rows below) for
 * each of its PV_QMV_LANES row lanes, and the work-items of a lane stride
 * together over those rows' octets: 8 weights a work-item decodes at a
 * time, a quarter of a block of 32 for the block types (its 4 bytes of
 * nibbles, or 8 of Q8_0's bytes), 8 consecutive elements for the float
 * types. Neighbouring work-items of a lane take neighbouring octets, so a
 * group's loads cover runs of each row (coalesced), and each work-item
 * loads the 8 x values of its octet once per token for all its rows: x,
 * which every row reads, costs rows times fewer loads than W bytes would
 * suggest, and rows x lanes times fewer from L2 where the lanes' loads of
 * an octet are one (a warp's). Each weight byte crosses the memory bus
 * once per call. At one token a work-item loads several octets of its
 * rows in a pass before it sums the pass before (PV_QMV_FLIGHT), so that
 * enough bytes are in flight to cover a GPU's memory latency. The
 * per-(row, token) sums are then reduced over each lane's work-items:
 * through warp shuffles and one exchange of the warps' sums on CUDA, a
 * tree in local memory on OpenCL. The token loops run to the constant
 * PV_QMAX_T and unroll; max_t and rows are literals in each kernel below,
 * so after inlining the iterations past them fold away and the sums stay
 * in registers.
 * groups {ceil(n_out / (rows PV_QMV_LANES)), 1}
 * w  [n_out][n_in] in PV_WTYPE, from word w_off
 * x  [T][n_in] f32 from x_off; x4 != 0 lets CUDA load x 16 bytes at a time
 *    (the host sets it where x + x_off is 16-byte aligned and n_in a
 *    multiple of 4)
 * y  [T][n_out] f32 from y_off
 * Local memory: max_t * rows floats per warp and lane on CUDA, per
 * work-item on OpenCL (PV_QMV_RED). */

#ifndef PV_QMV_ROWS
#define PV_QMV_ROWS 2 /* the one-token kernels' rows (kernel-params.h) */
#endif
#define PV_QMV_MAX_ROWS (PV_QMV_ROWS > 4 ? PV_QMV_ROWS : 4)
#ifndef PV_QMV_LANES
#define PV_QMV_LANES 1 /* row lanes of a work-group (kernel-params.h) */
#endif
/* A work-group's rows: `rows` for each of its PV_QMV_LANES row lanes.
 * Work-item i is in lane i % PV_QMV_LANES and takes the octets i /
 * PV_QMV_LANES, PV_QMV_STRIDE apart, of its lane's rows: the lanes of
 * one octet are neighbours in a warp, so that their loads of its x are one
 * load (a broadcast), and each x load serves rows x lanes rows where a
 * work-item's registers hold the sums of `rows`. */
#define PV_QMV_STRIDE (PV_WG / PV_QMV_LANES)
#define PV_QMV_GROUP_ROWS(rows) ((rows) * PV_QMV_LANES)
#if defined(__CUDACC__)
/* pv_qmv_reduce's warps: whole ones, its shuffles take all 32 lanes */
#if PV_WG % 32
#error "qmatmul on CUDA: PV_WG must be a multiple of 32"
#endif
#define PV_QMV_RED(max_t, rows) ((max_t) * (rows) * PV_QMV_LANES * (PV_WG / 32))
#else
#define PV_QMV_RED(max_t, rows) ((max_t) * (rows) * PV_WG)
#endif

#if PV_W_UNIT == 1
#define PV_OCTETS(n_in) (((n_in) + 7) / 8)
#else
#define PV_OCTETS(n_in) ((n_in) / PV_W_UNIT * 4)
#endif

/* The small integer n (0 <= n < 2^23) as a float, without an int-to-float
 * conversion (a quarter-rate instruction on GPUs): n's bits in the
 * mantissa of 2^23, less 2^23, and less `bias` in the same subtraction. */
PV_FUNC float pv_small_int(pv_u32 n, float bias)
{
    return PV_AS_FLOAT(0x4B000000u | n) - (8388608.0f + bias);
}

/* An octet's bits as loaded (pv_w_octet_load), PV_W_RAW words: the float
 * types' 8 elements (F32 one a word, F16 and BF16 two), the block types'
 * scale d (and Q4_1's minimum m) and quant bytes. Loading them apart from
 * widening them lets a pass load all its octets before it waits for any. */
#if PV_WTYPE == 0
#define PV_W_RAW 8
#elif PV_W_UNIT == 1
#define PV_W_RAW 4
#elif PV_WTYPE == 2 /* d, 4 bytes of nibbles */
#define PV_W_RAW 2
#else /* Q8_0: d, 8 bytes; Q4_1: d, m, 4 bytes of nibbles */
#define PV_W_RAW 3
#endif

/* The bits of octet o of the row starting at word `row` (elements past
 * n_in 0, which widen to 0). */
PV_FUNC void pv_w_octet_load(const PV_GLOBAL pv_u16 *row, int o, int n_in, pv_u32 raw[PV_W_RAW])
{
#if PV_W_UNIT == 1
    #pragma unroll
    for (int k = 0; k < 8; k++) {
        const int e = 8 * o + k;
#if PV_WTYPE == 0
        raw[k] = e < n_in ? (pv_u32)row[2 * e] | ((pv_u32)row[2 * e + 1] << 16) : 0u;
#else
        const pv_u32 h = e < n_in ? (pv_u32)row[e] : 0u;
        raw[k / 2] = k % 2 ? raw[k / 2] | (h << 16) : h;
#endif
    }
#else
    const int u = o >> 2, quarter = o & 3;
    const PV_GLOBAL pv_u16 *b = row + (pv_long)u * PV_W_UNIT_WORDS;
    raw[0] = b[0];
#if PV_WTYPE == 8 /* bytes 8 quarter .. + 7 */
    raw[1] = (pv_u32)b[1 + 4 * quarter] | ((pv_u32)b[2 + 4 * quarter] << 16);
    raw[2] = (pv_u32)b[3 + 4 * quarter] | ((pv_u32)b[4 + 4 * quarter] << 16);
#elif PV_WTYPE == 2 /* bytes 4 quarter .. + 3 */
    raw[1] = (pv_u32)b[1 + 2 * quarter] | ((pv_u32)b[2 + 2 * quarter] << 16);
#else
    raw[1] = b[1];
    raw[2] = (pv_u32)b[2 + 2 * quarter] | ((pv_u32)b[3 + 2 * quarter] << 16);
#endif
#endif
}

/* The loaded octet widened: weight k is d * q[k] + m, q[k] a small integer
 * (the block types) or the weight itself (the float types: d = 1, m = 0). */
PV_FUNC void pv_w_octet_widen(const pv_u32 raw[PV_W_RAW], float *q, float *d, float *m)
{
#if PV_W_UNIT == 1
    *d = 1.0f;
    *m = 0.0f;
    #pragma unroll
    for (int k = 0; k < 8; k++)
#if PV_WTYPE == 0
        q[k] = PV_AS_FLOAT(raw[k]);
#elif PV_WTYPE == 1
        q[k] = pv_half_bits(raw[k / 2] >> (16 * (k % 2)));
#else
        q[k] = PV_AS_FLOAT(k % 2 ? raw[k / 2] & 0xffff0000u : raw[k / 2] << 16);
#endif
#else
    *d = pv_half_bits(raw[0]);
#if PV_WTYPE == 8 /* elements 8 quarter .. + 7, signed */
    *m = 0.0f;
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        const pv_u32 word = ((raw[1 + k / 2] >> (16 * (k % 2))) & 0xffffu) ^ 0x8080u; /* byte + 128 */
        q[2 * k] = pv_small_int(word & 0xffu, 128.0f);
        q[2 * k + 1] = pv_small_int(word >> 8, 128.0f);
    }
#else /* Q4_0, Q4_1: low nibbles elements 4 quarter .., high 4 quarter + 16 .. */
#if PV_WTYPE == 2 /* d * (nibble - 8) */
    const float bias = 8.0f;
    const pv_u32 bits = raw[1];
    *m = 0.0f;
#else
    const float bias = 0.0f;
    const pv_u32 bits = raw[2];
    *m = pv_half_bits(raw[1]);
#endif
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        q[k] = pv_small_int((bits >> (8 * k)) & 15u, bias);
        q[k + 4] = pv_small_int((bits >> (8 * k + 4)) & 15u, bias);
    }
#endif
#endif
}

/* The row elements that octet o's q[0..3] and q[4..7] weigh: *xa .. + 3
 * and *xb .. + 3. */
PV_FUNC void pv_w_octet_x(int o, int *xa, int *xb)
{
#if PV_W_UNIT == 1
    *xa = 8 * o;
    *xb = 8 * o + 4;
#elif PV_WTYPE == 8
    *xa = 8 * o;
    *xb = 8 * o + 4;
#else
    *xa = 32 * (o >> 2) + 4 * (o & 3);
    *xb = *xa + 16;
#endif
}

/* v[0..3] = p[0..3]. */
PV_FUNC void pv_x4(const PV_GLOBAL float *p, int x4, float *v)
{
#if defined(__CUDACC__)
    if (x4) {
        const float4 f = *(const float4 *)p;
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
        return;
    }
    #pragma unroll
    for (int k = 0; k < 4; k++)
        v[k] = p[k];
#else
    const float4 f = vload4(0, p);
    (void)x4;
    v[0] = f.x;
    v[1] = f.y;
    v[2] = f.z;
    v[3] = f.w;
#endif
}

/* The first of this work-item's rows in a group whose rows start at
 * group_row0: its lane's run of `rows`. */
PV_FUNC pv_long pv_qmv_item_row0(pv_long group_row0, const int rows)
{
    return group_row0 + (pv_long)(PV_LOCAL_ID() % PV_QMV_LANES) * rows;
}

/* w_rows[r] = the start of row row0 + r of W (rows past n_out: the last
 * row, whose sums are never stored), acc = 0. */
PV_FUNC void pv_qmv_begin(const PV_GLOBAL pv_u16 *w, pv_long w_off, pv_long row0, int n_in, int n_out,
                          const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS], float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    const pv_long row_words = (pv_long)(n_in / PV_W_UNIT) * PV_W_UNIT_WORDS;
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        const pv_long row = row0 + r < n_out ? row0 + r : n_out - 1;
        w_rows[r] = w + w_off + row * row_words;
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++)
            acc[r][t] = 0.0f;
    }
}

/* x as a product takes it: f32 (x from x_off; x4 as pv_qmv says) or,
 * under PV_ACT16, rounded to 16 bits (xq, xs: the section below). */
typedef struct pv_qmv_x {
    const PV_GLOBAL float *x;
    pv_long x_off;
    int x4;
    const PV_GLOBAL pv_u32 *xq;
    pv_long xq_off;
    const PV_GLOBAL float *xs;
    pv_long xs_off;
} pv_qmv_x;

/* v[0..7] = the x of a token's row xt that octet o weighs (past n_in: 0). */
PV_FUNC void pv_x_octet(const PV_GLOBAL float *xt, int o, const int x4, int n_in, float *v)
{
    int xa, xb;
    pv_w_octet_x(o, &xa, &xb);
#if PV_W_UNIT == 1 /* a row's last octet may be short */
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        v[k] = xa + k < n_in ? xt[xa + k] : 0.0f;
        v[k + 4] = xb + k < n_in ? xt[xb + k] : 0.0f;
    }
#else
    pv_x4(xt + xa, x4, v);
    pv_x4(xt + xb, x4, v + 4);
#endif
}

/* The loaded octets of the rows widened (wq, wd, wm; pv_w_octet_widen),
 * or under PV_ACT16 as pv_dot16 takes them: the 8 weights' signed bytes
 * (a Q4 nibble in each byte) in qa, qb; the scale in wd, Q4_1's minimum
 * in wm. */
typedef struct pv_qmv_w {
    float wq[PV_QMV_MAX_ROWS][8], wd[PV_QMV_MAX_ROWS], wm[PV_QMV_MAX_ROWS];
    pv_u32 qa[PV_QMV_MAX_ROWS], qb[PV_QMV_MAX_ROWS];
} pv_qmv_w;

PV_FUNC void pv_qmv_widen(const int rows, const int act16, pv_u32 raw[PV_QMV_MAX_ROWS][PV_W_RAW], pv_qmv_w *w)
{
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        if (r < rows) {
#if PV_W_UNIT == 32
            if (act16) {
                w->wd[r] = pv_half_bits(raw[r][0]);
#if PV_WTYPE == 8 /* elements 8 quarter .. + 7 */
                w->wm[r] = 0.0f;
                w->qa[r] = raw[r][1];
                w->qb[r] = raw[r][2];
#else /* low nibbles elements 4 quarter .., high + 16 */
#if PV_WTYPE == 2
                const pv_u32 bits = raw[r][1];
                w->wm[r] = 0.0f;
#else
                const pv_u32 bits = raw[r][2];
                w->wm[r] = pv_half_bits(raw[r][1]);
#endif
                w->qa[r] = bits & 0x0f0f0f0fu;
                w->qb[r] = (bits >> 4) & 0x0f0f0f0fu;
#endif
                continue;
            }
#endif
            pv_w_octet_widen(raw[r], w->wq[r], &w->wd[r], &w->wm[r]);
        }
    }
}

#if PV_W_UNIT == 32
/* *hi, *lo = pair `pair` of xq (8-byte aligned). */
PV_FUNC void pv_x16_pair(const PV_GLOBAL pv_u32 *xq, pv_long pair, pv_u32 *hi, pv_u32 *lo)
{
#if defined(__CUDACC__)
    const uint2 v = ((const uint2 *)xq)[pair];
#else
    const uint2 v = vload2((size_t)pair, xq);
#endif
    *hi = v.x;
    *lo = v.y;
}

/* 256 (q . hi) + (q . lo) over 8 weights' signed bytes qa, qb and their
 * activations' pairs (ha, la), (hb, lb): below 2^25 in magnitude. */
PV_FUNC int pv_dot16(pv_u32 qa, pv_u32 qb, pv_u32 ha, pv_u32 la, pv_u32 hb, pv_u32 lb)
{
    const int hi = PV_DP4A(qb, hb, PV_DP4A(qa, ha, 0));
    return PV_DP4A(qb, lb, PV_DP4A(qa, la, 256 * hi));
}

#endif

/* acc[r][t] += row r's octet o (w, widened) times token t's x, for r <
 * rows. */
PV_FUNC void pv_qmv_octet_sums(const int rows, const int act16, const pv_qmv_w *w, int o, const pv_qmv_x xr,
                               int n_in, float acc[PV_QMV_MAX_ROWS][PV_QMAX_T], const int t)
{
#if PV_W_UNIT == 32
    if (act16) {
        const int u = o >> 2, quarter = o & 3;
#if PV_WTYPE == 8
        const int pa = 8 * u + 2 * quarter, pb = pa + 1;
#else
        const int pa = 8 * u + quarter, pb = pa + 4;
#endif
        const PV_GLOBAL pv_u32 *xt = xr.xq + xr.xq_off + (pv_long)t * (n_in / 2);
        pv_u32 ha, la, hb, lb;
        pv_x16_pair(xt, pa, &ha, &la);
        pv_x16_pair(xt, pb, &hb, &lb);
        const pv_long at = xr.xs_off + 2 * ((pv_long)t * (n_in / 32) + u);
        const float xd = xr.xs[at], x_sum = xr.xs[at + 1];
        #pragma unroll
        for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
            if (r < rows) {
                const float dot = (float)pv_dot16(w->qa[r], w->qb[r], ha, la, hb, lb);
#if PV_WTYPE == 8
                acc[r][t] += w->wd[r] * (xd * dot);
#elif PV_WTYPE == 2 /* nibble - 8: a quarter's share of 8 S, exact */
                acc[r][t] += w->wd[r] * (xd * (dot - 2.0f * x_sum));
#else /* and the minimum times a quarter of the block's sum */
                acc[r][t] += w->wd[r] * (xd * dot) + w->wm[r] * (xd * (0.25f * x_sum));
#endif
            }
        }
        return;
    }
#endif
    float xv[8];
    pv_x_octet(xr.x + xr.x_off + (pv_long)t * n_in, o, xr.x4, n_in, xv);
#if PV_WTYPE == 3 /* the minimum times the sum of x, once for all rows */
    const float x_sum = ((xv[0] + xv[1]) + (xv[2] + xv[3])) + ((xv[4] + xv[5]) + (xv[6] + xv[7]));
#endif
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        if (r < rows) {
            float s = 0.0f;
            #pragma unroll
            for (int k = 0; k < 8; k++)
                s += w->wq[r][k] * xv[k];
#if PV_WTYPE == 3
            acc[r][t] += w->wd[r] * s + w->wm[r] * x_sum;
#elif PV_W_UNIT == 1
            acc[r][t] += s;
#else
            acc[r][t] += w->wd[r] * s;
#endif
        }
    }
}

/* acc[r][t] += octet o of row r (w_rows[r]) times token t's x, for r < rows
 * and t < max_t and n_tokens (one token at max_t 1: the host launches
 * nothing for none): the rows' octets widened once for all tokens. */
PV_FUNC void pv_qmv_octet(const int max_t, const int rows, const int act16,
                          const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS], int o, const pv_qmv_x xr, int n_tokens,
                          int n_in, float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    pv_u32 raw[PV_QMV_MAX_ROWS][PV_W_RAW];
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++)
        if (r < rows)
            pv_w_octet_load(w_rows[r], o, n_in, raw[r]);
    pv_qmv_w w;
    pv_qmv_widen(rows, act16, raw, &w);
    #pragma unroll
    for (int t = 0; t < PV_QMAX_T; t++)
        if (t < max_t && (max_t == 1 || t < n_tokens))
            pv_qmv_octet_sums(rows, act16, &w, o, xr, n_in, acc, t);
}

/* Row-octets a work-item of the one-token kernels loads in one pass:
 * PV_QMV_FLIGHT / rows octets of its rows, PV_QMV_STRIDE apart, 36 to 68
 * bytes of W, issued before the sums of the pass before. A pass of one
 * octet waited for its few bytes (4.5 of a Q4_0 row, 9 at 2 rows) and then
 * for x before it could load the next: at a GPU's memory latency, too few
 * bytes in flight to keep its memory busy (docs/PERFORMANCE.md, "Bytes in
 * flight"). F32 rows bring 64 bytes an octet at 2 rows: no passes. The
 * larger token classes need those registers for their sums. */
#if PV_W_UNIT == 32
#define PV_QMV_FLIGHT 8
#elif PV_WTYPE == 0
#define PV_QMV_FLIGHT 2
#else
#define PV_QMV_FLIGHT 4
#endif
PV_FUNC int pv_qmv_per_pass(const int max_t, const int rows)
{
    return max_t == 1 && rows < PV_QMV_FLIGHT ? PV_QMV_FLIGHT / rows : 1;
}

/* A one-token pass's weight loads: per_pass octets from o of the rows. */
PV_FUNC void pv_qmv_pass_load(const int rows, const int per_pass, const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS],
                              int o, int n_in, pv_u32 raw[PV_QMV_FLIGHT][PV_QMV_MAX_ROWS][PV_W_RAW])
{
    #pragma unroll
    for (int k = 0; k < PV_QMV_FLIGHT; k++) {
        if (k < per_pass) {
            #pragma unroll
            for (int r = 0; r < PV_QMV_MAX_ROWS; r++)
                if (r < rows)
                    pv_w_octet_load(w_rows[r], o + k * PV_QMV_STRIDE, n_in, raw[k][r]);
        }
    }
}

/* ... and its sums, with x (which every group reads, so mostly from cache). */
PV_FUNC void pv_qmv_pass_sums(const int rows, const int per_pass, const int act16,
                              pv_u32 raw[PV_QMV_FLIGHT][PV_QMV_MAX_ROWS][PV_W_RAW], int o, const pv_qmv_x xr,
                              int n_in, float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    #pragma unroll
    for (int k = 0; k < PV_QMV_FLIGHT; k++) {
        if (k < per_pass) {
            pv_qmv_w w;
            pv_qmv_widen(rows, act16, raw[k], &w);
            pv_qmv_octet_sums(rows, act16, &w, o + k * PV_QMV_STRIDE, xr, n_in, acc, 0);
        }
    }
}

/* The work-item's octets: whole passes of per_pass, each pass's loads
 * issued before the previous pass's sums (so that they wait together),
 * then the rest one at a time; per_pass, act16 and xr.x4 literals after
 * inlining where the caller makes them so. */
PV_FUNC void pv_qmv_octets(const int max_t, const int rows, const int per_pass,
                           const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS], const pv_qmv_x xr, const int act16,
                           int n_tokens, int n_in, float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    const int n_octets = PV_OCTETS(n_in), last = (per_pass - 1) * PV_QMV_STRIDE;
    int o = PV_LOCAL_ID() / PV_QMV_LANES;
    if (per_pass > 1 && o + last < n_octets) {
        pv_u32 raw[2][PV_QMV_FLIGHT][PV_QMV_MAX_ROWS][PV_W_RAW];
        pv_qmv_pass_load(rows, per_pass, w_rows, o, n_in, raw[0]);
        for (;;) { /* the two buffers in turn */
            const int step = per_pass * PV_QMV_STRIDE;
            int more = o + step + last < n_octets;
            if (more)
                pv_qmv_pass_load(rows, per_pass, w_rows, o + step, n_in, raw[1]);
            pv_qmv_pass_sums(rows, per_pass, act16, raw[0], o, xr, n_in, acc);
            o += step;
            if (!more)
                break;
            more = o + step + last < n_octets;
            if (more)
                pv_qmv_pass_load(rows, per_pass, w_rows, o + step, n_in, raw[0]);
            pv_qmv_pass_sums(rows, per_pass, act16, raw[1], o, xr, n_in, acc);
            o += step;
            if (!more)
                break;
        }
    }
    for (; o < n_octets; o += PV_QMV_STRIDE)
        pv_qmv_octet(max_t, rows, act16, w_rows, o, xr, n_tokens, n_in, acc);
}

/* acc[r][t] += this work-item's share of row row0 + r's product with token
 * t, for r < rows and t < max_t and n_tokens. */
PV_FUNC void pv_qmv_partial(const int max_t, const int rows, const PV_GLOBAL pv_u16 *w, pv_long w_off,
                            const PV_GLOBAL float *x, pv_long x_off, int x4, pv_long row0, int n_tokens, int n_in,
                            int n_out, float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS];
    pv_qmv_begin(w, w_off, row0, n_in, n_out, w_rows, acc);
    const int per_pass = pv_qmv_per_pass(max_t, rows);
    /* x's 16-byte loads a literal in a one-token pass, so that no branch
     * parts its loads from the weights' */
    if (per_pass > 1 && x4) {
        const pv_qmv_x xr = {x, x_off, 1, 0, 0, 0, 0};
        pv_qmv_octets(max_t, rows, per_pass, w_rows, xr, 0, n_tokens, n_in, acc);
    } else {
        const pv_qmv_x xr = {x, x_off, x4, 0, 0, 0, 0};
        pv_qmv_octets(max_t, rows, per_pass, w_rows, xr, 0, n_tokens, n_in, acc);
    }
}

/* Sums acc[r][t] over the work-items of each row lane; work-item i <
 * PV_QMV_LANES gets lane i's totals in its acc. Every work-item calls it;
 * red (PV_QMV_RED floats) may be used again only after a barrier. */
PV_FUNC void pv_qmv_reduce(const int max_t, const int rows, PV_LOCAL float *red,
                           float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    const int lid = PV_LOCAL_ID();
#if defined(__CUDACC__)
    /* Within each warp by shuffles over the work-items of a lane (xor by
     * multiples of PV_QMV_LANES), then the first PV_QMV_LANES work-items
     * sum the warps' totals (PV_WG is a multiple of 32, above). */
    const int n_warps = PV_WG / 32, warp = lid / 32, lane = lid % 32;
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++) {
            if (r < rows && t < max_t) {
                float v = acc[r][t];
                #pragma unroll
                for (int step = 16; step >= PV_QMV_LANES; step >>= 1)
                    v += __shfl_xor_sync(0xffffffffu, v, step);
                if (lane < PV_QMV_LANES)
                    red[((r * max_t + t) * PV_QMV_LANES + lane) * n_warps + warp] = v;
            }
        }
    }
    PV_BARRIER();
    if (lid < PV_QMV_LANES) {
        #pragma unroll
        for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
            #pragma unroll
            for (int t = 0; t < PV_QMAX_T; t++) {
                if (r < rows && t < max_t) {
                    float v = 0.0f;
                    for (int k = 0; k < n_warps; k++)
                        v += red[((r * max_t + t) * PV_QMV_LANES + lid) * n_warps + k];
                    acc[r][t] = v;
                }
            }
        }
    }
#else
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++)
            if (r < rows && t < max_t)
                red[(r * max_t + t) * PV_WG + lid] = acc[r][t];
    }
    PV_BARRIER();
    for (int stride = PV_WG / 2; stride >= PV_QMV_LANES; stride >>= 1) {
        if (lid < stride) {
            #pragma unroll
            for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
                #pragma unroll
                for (int t = 0; t < PV_QMAX_T; t++)
                    if (r < rows && t < max_t)
                        red[(r * max_t + t) * PV_WG + lid] += red[(r * max_t + t) * PV_WG + lid + stride];
            }
        }
        PV_BARRIER();
    }
    #pragma unroll
    for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
        #pragma unroll
        for (int t = 0; t < PV_QMAX_T; t++)
            if (r < rows && t < max_t)
                acc[r][t] = red[(r * max_t + t) * PV_WG + lid];
    }
#endif
}

/* Reduces acc over the group and stores row row0 + r's sum for token t at
 * y[t][row0 + r], row0 this work-item's first row. */
PV_FUNC void pv_qmv_store(const int max_t, const int rows, PV_LOCAL float *red,
                          float acc[PV_QMV_MAX_ROWS][PV_QMAX_T], PV_GLOBAL float *y, pv_long y_off, pv_long row0,
                          int n_tokens, int n_out)
{
    pv_qmv_reduce(max_t, rows, red, acc);
    if (PV_LOCAL_ID() < PV_QMV_LANES) {
        #pragma unroll
        for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
            #pragma unroll
            for (int t = 0; t < PV_QMAX_T; t++)
                if (r < rows && row0 + r < n_out && t < max_t && t < n_tokens)
                    y[y_off + (pv_long)t * n_out + row0 + r] = acc[r][t];
        }
    }
}

/* y = silu(gate) * up, silu(g) = g / (1 + exp(-g)), from the two products'
 * per-work-item sums: the gate's totals stay in registers while the up
 * product's are reduced. */
PV_FUNC void pv_qmv_store_swiglu(const int max_t, const int rows, PV_LOCAL float *red,
                                 float gate[PV_QMV_MAX_ROWS][PV_QMAX_T], float up[PV_QMV_MAX_ROWS][PV_QMAX_T],
                                 PV_GLOBAL float *y, pv_long y_off, pv_long row0, int n_tokens, int n_out)
{
    pv_qmv_reduce(max_t, rows, red, gate);
    PV_BARRIER();
    pv_qmv_reduce(max_t, rows, red, up);
    if (PV_LOCAL_ID() < PV_QMV_LANES) {
        #pragma unroll
        for (int r = 0; r < PV_QMV_MAX_ROWS; r++) {
            #pragma unroll
            for (int t = 0; t < PV_QMAX_T; t++)
                if (r < rows && row0 + r < n_out && t < max_t && t < n_tokens)
                    y[y_off + (pv_long)t * n_out + row0 + r] =
                        gate[r][t] / (1.0f + PV_EXP(-gate[r][t])) * up[r][t];
        }
    }
}

PV_FUNC void pv_qmv(const int max_t, const int rows, PV_LOCAL float *red, const PV_GLOBAL pv_u16 *w, pv_long w_off,
                    const PV_GLOBAL float *x, pv_long x_off, int x4, PV_GLOBAL float *y, pv_long y_off,
                    int n_tokens, int n_in, int n_out)
{
    const pv_long row0 = pv_qmv_item_row0(PV_GROUP_ID(0) * PV_QMV_GROUP_ROWS(rows), rows);
    float acc[PV_QMV_MAX_ROWS][PV_QMAX_T];
    pv_qmv_partial(max_t, rows, w, w_off, x, x_off, x4, row0, n_tokens, n_in, n_out, acc);
    pv_qmv_store(max_t, rows, red, acc, y, y_off, row0, n_tokens, n_out);
}

/* The SwiGLU product in one pass for decode-sized batches, each product
 * summed as pv_qmv sums it. Wg and Wu [n_out][n_in] in PV_WTYPE from words
 * wg_off and wu_off; the groups and local memory of pv_qmv. */
PV_FUNC void pv_qmv_swiglu(const int max_t, const int rows, PV_LOCAL float *red, const PV_GLOBAL pv_u16 *wg,
                           pv_long wg_off, const PV_GLOBAL pv_u16 *wu, pv_long wu_off, const PV_GLOBAL float *x,
                           pv_long x_off, int x4, PV_GLOBAL float *y, pv_long y_off, int n_tokens, int n_in,
                           int n_out)
{
    const pv_long row0 = pv_qmv_item_row0(PV_GROUP_ID(0) * PV_QMV_GROUP_ROWS(rows), rows);
    float gate[PV_QMV_MAX_ROWS][PV_QMAX_T], up[PV_QMV_MAX_ROWS][PV_QMAX_T];
    pv_qmv_partial(max_t, rows, wg, wg_off, x, x_off, x4, row0, n_tokens, n_in, n_out, gate);
    pv_qmv_partial(max_t, rows, wu, wu_off, x, x_off, x4, row0, n_tokens, n_in, n_out, up);
    pv_qmv_store_swiglu(max_t, rows, red, gate, up, y, y_off, row0, n_tokens, n_out);
}

/* Up to three products of one x in one launch (pv_qmatmul_group: Q, K
 * and V): groups [0, g0) take product 0's rows, [g0, g0 + g1) product 1's,
 * the rest product 2's (n_out2 0: none), g_i = ceil(n_out_i / (rows PV_QMV_LANES)); each
 * row is summed as its product's own kernel sums it. A small product (K
 * and V of a grouped-query model) so shares one launch with a large one
 * instead of leaving most of the device idle in a launch of its own.
 * Declares w, w_off, y, y_off, n_out and row0 for this group. */
#define PV_QMV_PICK3(rows)                                                                                 \
    const pv_long g_ = PV_GROUP_ID(0), g0_ = (n_out0 + PV_QMV_GROUP_ROWS(rows) - 1) / PV_QMV_GROUP_ROWS(rows), \
                  g1_ = (n_out1 + PV_QMV_GROUP_ROWS(rows) - 1) / PV_QMV_GROUP_ROWS(rows);               \
    const int p_ = g_ < g0_ ? 0 : g_ < g0_ + g1_ ? 1 : 2;                                                \
    const PV_GLOBAL pv_u16 *w = p_ == 0 ? w0 : p_ == 1 ? w1 : w2;                                        \
    const pv_long w_off = p_ == 0 ? w0_off : p_ == 1 ? w1_off : w2_off;                                  \
    PV_GLOBAL float *y = p_ == 0 ? y0 : p_ == 1 ? y1 : y2;                                               \
    const pv_long y_off = p_ == 0 ? y0_off : p_ == 1 ? y1_off : y2_off;                                  \
    const int n_out = p_ == 0 ? n_out0 : p_ == 1 ? n_out1 : n_out2;                                      \
    const pv_long row0 = pv_qmv_item_row0((g_ - (p_ == 0 ? 0 : p_ == 1 ? g0_ : g0_ + g1_)) * PV_QMV_GROUP_ROWS(rows), \
                                          rows)
/* The three products' arguments, as the launchers pass them. */
#define PV_QMV_GROUP_ARGS                                                                                  \
    const PV_GLOBAL pv_u16 *w0, pv_long w0_off, PV_GLOBAL float *y0, pv_long y0_off, int n_out0,          \
        const PV_GLOBAL pv_u16 *w1, pv_long w1_off, PV_GLOBAL float *y1, pv_long y1_off, int n_out1,      \
        const PV_GLOBAL pv_u16 *w2, pv_long w2_off, PV_GLOBAL float *y2, pv_long y2_off, int n_out2

/* One kernel per token class: the host picks the smallest max_t >= T and
 * launches ceil(n_out / (rows PV_QMV_LANES)) groups, as pv_qmv_rows says. */
#define PV_QMV_KERNELS(max_t, rows)                                                                       \
    PV_KERNEL pv_qmatmul_fused_##max_t(const PV_GLOBAL pv_u16 *w, pv_long w_off, const PV_GLOBAL float *x, \
                                       pv_long x_off, int x4, PV_GLOBAL float *y, pv_long y_off,           \
                                       int n_tokens, int n_in, int n_out)                                  \
    {                                                                                                      \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                  \
        pv_qmv(max_t, rows, red, w, w_off, x, x_off, x4, y, y_off, n_tokens, n_in, n_out);                 \
    }                                                                                                      \
    PV_KERNEL pv_qmatmul_swiglu_##max_t(const PV_GLOBAL pv_u16 *wg, pv_long wg_off,                       \
                                        const PV_GLOBAL pv_u16 *wu, pv_long wu_off,                       \
                                        const PV_GLOBAL float *x, pv_long x_off, int x4,                  \
                                        PV_GLOBAL float *y, pv_long y_off, int n_tokens, int n_in,        \
                                        int n_out)                                                         \
    {                                                                                                      \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                  \
        pv_qmv_swiglu(max_t, rows, red, wg, wg_off, wu, wu_off, x, x_off, x4, y, y_off, n_tokens, n_in,    \
                      n_out);                                                                              \
    }                                                                                                      \
    PV_KERNEL pv_qmatmul_group_##max_t(PV_QMV_GROUP_ARGS, const PV_GLOBAL float *x, pv_long x_off, int x4, \
                                       int n_tokens, int n_in)                                             \
    {                                                                                                      \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                  \
        PV_QMV_PICK3(rows);                                                                                \
        float acc[PV_QMV_MAX_ROWS][PV_QMAX_T];                                                             \
        pv_qmv_partial(max_t, rows, w, w_off, x, x_off, x4, row0, n_tokens, n_in, n_out, acc);             \
        pv_qmv_store(max_t, rows, red, acc, y, y_off, row0, n_tokens, n_out);                              \
    }
/* Rows a group takes in each class (the host's pv_qmv_rows must agree):
 * more rows share each x load, fewer leave registers for the tokens' sums
 * and more groups to fill the device. At one token the sums are few, and
 * x's loads can outweigh the weights' (PV_QMV_ROWS, tuned). */
PV_QMV_KERNELS(1, PV_QMV_ROWS)
PV_QMV_KERNELS(4, 4)
PV_QMV_KERNELS(16, 2) /* PV_QMAX_T */
#undef PV_QMV_KERNELS

/* ---- Decode-sized products of 16-bit activations (PV_ACT16) --------------
 * The block types' products as the CPU backend's integer kernels compute
 * them (backends/cpu/cpu-qmatmul.h): x rounded per block of 32 to two
 * signed bytes, x ~= d (256 hi + lo), steps of max |x| / 32512, so that an
 * octet of weights meets its activations in four 4-byte integer dot
 * products (dp4a on CUDA) instead of eight conversions and multiply-adds
 * in float: decoding a Q4 byte is a mask and a shift. pv_qmatmul_round16
 * rounds x once per call into scratch (or recompute's pv_add_rmsnorm16 as
 * it writes the norm that x is), then pv_qmatmul_fused16_<class> or
 * pv_qmatmul_swiglu16_<class> run with pv_qmv's groups and local memory;
 * the rounding itself is dialect.h's pv_round16_block.
 * xq [T][n_in / 4] pairs of words from word xq_off (even): pair j holds the
 *    hi bytes of elements 4j .. 4j + 3, then their lo bytes;
 * xs [T][n_in / 32] pairs (d, S) from float xs_off (even): S the sum of the
 *    block's 256 hi + lo, an integer below 2^21 in magnitude, exact as a
 *    float; d is NaN for a block holding a NaN, so that it reaches y. */
#if PV_W_UNIT == 32

/* groups {ceil(n_blocks / PV_WG)}: a work-item a block of x [T][n_in],
 * n_blocks = T * n_in / 32. */
PV_KERNEL pv_qmatmul_round16(const PV_GLOBAL float *x, pv_long x_off, pv_long n_blocks, PV_GLOBAL pv_u32 *xq,
                             pv_long xq_off, PV_GLOBAL float *xs, pv_long xs_off)
{
    const pv_long b = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    if (b >= n_blocks)
        return;
    pv_round16_block(x + x_off + 32 * b, xq + xq_off + 16 * b, xs + xs_off + 2 * b);
}

/* pv_qmv_partial's sums from the rounded activations (xq, xs), each
 * work-item an octet of a block at a time and passes at one token, as
 * there. */
PV_FUNC void pv_qmv16_partial(const int max_t, const int rows, const PV_GLOBAL pv_u16 *w, pv_long w_off,
                              const PV_GLOBAL pv_u32 *xq, pv_long xq_off, const PV_GLOBAL float *xs,
                              pv_long xs_off, pv_long row0, int n_tokens, int n_in, int n_out,
                              float acc[PV_QMV_MAX_ROWS][PV_QMAX_T])
{
    const PV_GLOBAL pv_u16 *w_rows[PV_QMV_MAX_ROWS];
    pv_qmv_begin(w, w_off, row0, n_in, n_out, w_rows, acc);
    const pv_qmv_x xr = {0, 0, 0, xq, xq_off, xs, xs_off};
    pv_qmv_octets(max_t, rows, pv_qmv_per_pass(max_t, rows), w_rows, xr, 1, n_tokens, n_in, acc);
}

#define PV_QMV16_KERNELS(max_t, rows)                                                                       \
    PV_KERNEL pv_qmatmul_fused16_##max_t(const PV_GLOBAL pv_u16 *w, pv_long w_off, const PV_GLOBAL pv_u32 *xq, \
                                         pv_long xq_off, const PV_GLOBAL float *xs, pv_long xs_off,           \
                                         PV_GLOBAL float *y, pv_long y_off, int n_tokens, int n_in, int n_out)  \
    {                                                                                                        \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                 \
        const pv_long row0 = pv_qmv_item_row0(PV_GROUP_ID(0) * PV_QMV_GROUP_ROWS(rows), rows);              \
        float acc[PV_QMV_MAX_ROWS][PV_QMAX_T];                                                               \
        pv_qmv16_partial(max_t, rows, w, w_off, xq, xq_off, xs, xs_off, row0, n_tokens, n_in, n_out, acc);   \
        pv_qmv_store(max_t, rows, red, acc, y, y_off, row0, n_tokens, n_out);                                \
    }                                                                                                        \
    PV_KERNEL pv_qmatmul_swiglu16_##max_t(const PV_GLOBAL pv_u16 *wg, pv_long wg_off,                         \
                                          const PV_GLOBAL pv_u16 *wu, pv_long wu_off,                         \
                                          const PV_GLOBAL pv_u32 *xq, pv_long xq_off,                         \
                                          const PV_GLOBAL float *xs, pv_long xs_off, PV_GLOBAL float *y,      \
                                          pv_long y_off, int n_tokens, int n_in, int n_out)                   \
    {                                                                                                        \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                 \
        const pv_long row0 = pv_qmv_item_row0(PV_GROUP_ID(0) * PV_QMV_GROUP_ROWS(rows), rows);              \
        float gate[PV_QMV_MAX_ROWS][PV_QMAX_T], up[PV_QMV_MAX_ROWS][PV_QMAX_T];                              \
        pv_qmv16_partial(max_t, rows, wg, wg_off, xq, xq_off, xs, xs_off, row0, n_tokens, n_in, n_out, gate); \
        pv_qmv16_partial(max_t, rows, wu, wu_off, xq, xq_off, xs, xs_off, row0, n_tokens, n_in, n_out, up);   \
        pv_qmv_store_swiglu(max_t, rows, red, gate, up, y, y_off, row0, n_tokens, n_out);                    \
    }                                                                                                        \
    PV_KERNEL pv_qmatmul_group16_##max_t(PV_QMV_GROUP_ARGS, const PV_GLOBAL pv_u32 *xq, pv_long xq_off,       \
                                         const PV_GLOBAL float *xs, pv_long xs_off, int n_tokens, int n_in)   \
    {                                                                                                        \
        PV_LOCAL_ARRAY(float, red, PV_QMV_RED(max_t, rows));                                                 \
        PV_QMV_PICK3(rows);                                                                                  \
        float acc[PV_QMV_MAX_ROWS][PV_QMAX_T];                                                               \
        pv_qmv16_partial(max_t, rows, w, w_off, xq, xq_off, xs, xs_off, row0, n_tokens, n_in, n_out, acc);   \
        pv_qmv_store(max_t, rows, red, acc, y, y_off, row0, n_tokens, n_out);                                \
    }
/* the token classes and rows of PV_QMV_KERNELS */
PV_QMV16_KERNELS(1, PV_QMV_ROWS)
PV_QMV16_KERNELS(4, 4)
PV_QMV16_KERNELS(16, 2)
#undef PV_QMV16_KERNELS

#endif /* PV_W_UNIT == 32 */
#undef PV_QMV_PICK3
#undef PV_QMV_GROUP_ARGS

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

/* v rounded to 16 bits at out[i]: bfloat16 (bf16 != 0: round to nearest
 * even, NaN kept a NaN) or IEEE half. */
PV_FUNC void pv_store16(float v, int bf16, PV_GLOBAL pv_u16 *out, pv_long i)
{
    if (bf16) {
        const pv_u32 u = PV_AS_U32(v);
        out[i] = (u & 0x7fffffffu) > 0x7f800000u ? (pv_u16)((u >> 16) | 0x40u)
                                                 : (pv_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    } else {
        PV_STORE_HALF(v, (PV_GLOBAL pv_half *)out, i);
    }
}

/* pv_qmatmul_widen into 16-bit tiles for the tensor-core GEMMs (PV_GEMM
 * f16 and bf16, backends/kernel-params.h): out [n_rows][n_in].
 * groups {ceil(n_in / PV_WG), n_rows}. */
PV_KERNEL pv_qmatmul_widen16(const PV_GLOBAL pv_u16 *w, pv_long w_off, int n_in, pv_long row0, int bf16,
                             PV_GLOBAL pv_u16 *out)
{
    const pv_long e = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    const pv_long r = PV_GROUP_ID(1);
    if (e >= n_in)
        return;
    const pv_long row_words = (pv_long)(n_in / PV_W_UNIT) * PV_W_UNIT_WORDS;
    pv_store16(pv_w_elem(w + w_off + (row0 + r) * row_words, e), bf16, out, r * n_in + e);
}

/* out[i] = x[x_off + i] rounded to 16 bits as pv_store16 does: the
 * activations of those GEMMs. groups {ceil(n / PV_WG)}. */
PV_KERNEL pv_qmatmul_narrow16(const PV_GLOBAL float *x, pv_long x_off, pv_long n, int bf16, PV_GLOBAL pv_u16 *out)
{
    const pv_long i = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    if (i < n)
        pv_store16(x[x_off + i], bf16, out, i);
}

/* out[out_off + i * dim + e] = table[id][e] as f32, the table from word
 * table_off, where id = ids[i], or for ids[i] = -(j + 1) the device id
 * ids_dev[ids_dev_off + j] (pv_embed_gather_args): one outside [0, n_rows)
 * writes zeros and reads nothing. groups {ceil(dim / PV_WG), n_ids}. */
PV_KERNEL pv_embed_gather(const PV_GLOBAL pv_u16 *table, pv_long table_off, pv_long n_rows,
                          const PV_GLOBAL int *ids, const PV_GLOBAL int *ids_dev, pv_long ids_dev_off,
                          pv_long dim, PV_GLOBAL float *out, pv_long out_off)
{
    const pv_long e = PV_GROUP_ID(0) * PV_WG + PV_LOCAL_ID();
    const pv_long i = PV_GROUP_ID(1);
    if (e >= dim)
        return;
    const int host_id = ids[i];
    const pv_long id = host_id >= 0 ? (pv_long)host_id : (pv_long)ids_dev[ids_dev_off - 1 - (pv_long)host_id];
    const pv_long row_words = dim / PV_W_UNIT * PV_W_UNIT_WORDS;
    out[out_off + i * dim + e] = id >= 0 && id < n_rows ? pv_w_elem(table + table_off + id * row_words, e) : 0.0f;
}
