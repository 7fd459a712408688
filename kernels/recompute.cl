/* Recompute family: the rest of a transformer layer (RMSNorm, RoPE, SwiGLU,
 * residual add, the add fused with the next RMSNorm, softmax) and the
 * sampling helpers (argmax, top-p, and both over a step's rows). All f32;
 * offsets in elements. Row kernels run one work-group per row, work-item j
 * taking columns j, j + PV_WG, ... (coalesced), with tree reductions. */
#include "dialect.h"

/* out[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * weight[:], x and out
 * [rows][dim]; in place allowed (each element is read, then written, by one
 * work-item). groups {rows, 1}. */
PV_KERNEL pv_rmsnorm(const PV_GLOBAL float *x, pv_long x_off,
                     const PV_GLOBAL float *weight, pv_long weight_off,
                     PV_GLOBAL float *out, pv_long out_off, pv_long dim, float eps)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    const int lid = PV_LOCAL_ID();
    const pv_long r = PV_GROUP_ID(0);
    const PV_GLOBAL float *xr = x + x_off + r * dim;
    PV_GLOBAL float *outr = out + out_off + r * dim;

    float sum_sq = 0.0f;
    for (pv_long d = lid; d < dim; d += PV_WG)
        sum_sq += xr[d] * xr[d];
    sum_sq = pv_group_sum(scratch, sum_sq);
    const float inv_rms = 1.0f / PV_SQRT(sum_sq / (float)dim + eps);
    for (pv_long d = lid; d < dim; d += PV_WG)
        outr[d] = xr[d] * inv_rms * weight[weight_off + d];
}

/* x[r][:] += y[r][:], then out[r][:] = rmsnorm(x[r][:]) * weight[:] (as
 * pv_add then pv_rmsnorm: one f32 rounding for the sum, the same sum of
 * squares), for row r of the calling group. */
PV_FUNC void pv_add_rmsnorm_row(PV_LOCAL float *scratch, PV_GLOBAL float *xr, const PV_GLOBAL float *yr,
                                const PV_GLOBAL float *weight, PV_GLOBAL float *outr, pv_long dim, float eps)
{
    const int lid = PV_LOCAL_ID();
    float sum_sq = 0.0f;
    for (pv_long d = lid; d < dim; d += PV_WG) {
        const float sum = xr[d] + yr[d];
        xr[d] = sum;
        sum_sq += sum * sum;
    }
    sum_sq = pv_group_sum(scratch, sum_sq);
    const float inv_rms = 1.0f / PV_SQRT(sum_sq / (float)dim + eps);
    for (pv_long d = lid; d < dim; d += PV_WG) /* each work-item reads back what it wrote */
        outr[d] = xr[d] * inv_rms * weight[d];
}

/* pv_add_rmsnorm_row over x, y, out [rows][dim]. x, y, weight and out do
 * not overlap. groups {rows, 1}. */
PV_KERNEL pv_add_rmsnorm(PV_GLOBAL float *x, pv_long x_off, const PV_GLOBAL float *y, pv_long y_off,
                         const PV_GLOBAL float *weight, pv_long weight_off,
                         PV_GLOBAL float *out, pv_long out_off, pv_long dim, float eps)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    const pv_long r = PV_GROUP_ID(0);
    pv_add_rmsnorm_row(scratch, x + x_off + r * dim, y + y_off + r * dim, weight + weight_off,
                       out + out_off + r * dim, dim, eps);
}

/* pv_add_rmsnorm, and out rounded to 16 bits per block of 32 as qmatmul's
 * pv_qmatmul_round16 rounds it (the same bits: pv_round16_block over the
 * same values), for the PV_ACT16 products that read it next: the rounding
 * launch saved. xq and xs as kernels/qmatmul.cl lays them out, for the
 * rows x dim / 32 blocks of out (dim a multiple of 32). groups {rows, 1}. */
PV_KERNEL pv_add_rmsnorm16(PV_GLOBAL float *x, pv_long x_off, const PV_GLOBAL float *y, pv_long y_off,
                           const PV_GLOBAL float *weight, pv_long weight_off, PV_GLOBAL float *out, pv_long out_off,
                           pv_long dim, float eps, PV_GLOBAL pv_u32 *xq, pv_long xq_off, PV_GLOBAL float *xs,
                           pv_long xs_off)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    const pv_long r = PV_GROUP_ID(0);
    PV_GLOBAL float *outr = out + out_off + r * dim;
    pv_add_rmsnorm_row(scratch, x + x_off + r * dim, y + y_off + r * dim, weight + weight_off, outr, dim, eps);
    PV_BARRIER_GLOBAL(); /* a block's 32 values come from several work-items */
    const pv_long n_blocks = dim / 32, first = r * n_blocks;
    for (pv_long b = PV_LOCAL_ID(); b < n_blocks; b += PV_WG)
        pv_round16_block(outr + 32 * b, xq + xq_off + 16 * (first + b), xs + xs_off + 2 * (first + b));
}

/* Rotary embedding in place on x[T][n_heads][head_dim] at positions pos[T]:
 * pair i turns by pos * base^(-2i/head_dim); the pair is (2i, 2i+1), or
 * (i, i + head_dim/2) with neox. groups {n_heads, T}. */
PV_KERNEL pv_rope(PV_GLOBAL float *x, pv_long x_off, const PV_GLOBAL int *pos,
                  int n_heads, int head_dim, float base, int neox)
{
    const int h = (int)PV_GROUP_ID(0);
    const pv_long t = PV_GROUP_ID(1);
    const int half_dim = head_dim / 2;
    PV_GLOBAL float *head = x + x_off + (t * n_heads + h) * head_dim;
    for (int i = PV_LOCAL_ID(); i < half_dim; i += PV_WG) {
        int first, second;
        pv_precise c, s;
        pv_rope_pair(pos[t], i, head_dim, base, neox, &first, &second, &c, &s);
        const pv_precise x0 = head[first], x1 = head[second];
        head[first] = (float)(x0 * c - x1 * s);
        head[second] = (float)(x0 * s + x1 * c);
    }
}

/* Element-wise kernels: each group covers PV_WG * PV_ITEM_ELEMS elements,
 * work-item j the elements j, j + PV_WG, ...
 * groups {ceil(n / (PV_WG * PV_ITEM_ELEMS)), 1}. */

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) */
PV_KERNEL pv_swiglu(const PV_GLOBAL float *gate, pv_long gate_off,
                    const PV_GLOBAL float *up, pv_long up_off,
                    PV_GLOBAL float *out, pv_long out_off, pv_long n)
{
    const pv_long first = PV_GROUP_ID(0) * PV_WG * PV_ITEM_ELEMS + PV_LOCAL_ID();
#pragma unroll
    for (int k = 0; k < PV_ITEM_ELEMS; k++) {
        const pv_long e = first + (pv_long)k * PV_WG;
        if (e < n) {
            const float g = gate[gate_off + e];
            out[out_off + e] = g / (1.0f + PV_EXP(-g)) * up[up_off + e];
        }
    }
}

/* out[i] = a[i] + b[i]; in place allowed */
PV_KERNEL pv_add(const PV_GLOBAL float *a, pv_long a_off, const PV_GLOBAL float *b, pv_long b_off,
                 PV_GLOBAL float *out, pv_long out_off, pv_long n)
{
    const pv_long first = PV_GROUP_ID(0) * PV_WG * PV_ITEM_ELEMS + PV_LOCAL_ID();
#pragma unroll
    for (int k = 0; k < PV_ITEM_ELEMS; k++) {
        const pv_long e = first + (pv_long)k * PV_WG;
        if (e < n)
            out[out_off + e] = a[a_off + e] + b[b_off + e];
    }
}

/* out[r][:] = softmax(x[r][:] * scale), [rows][cols]; in place allowed.
 * The row max is subtracted first so exp never overflows. groups {rows, 1}. */
PV_KERNEL pv_softmax(const PV_GLOBAL float *x, pv_long x_off, PV_GLOBAL float *out, pv_long out_off,
                     pv_long cols, float scale)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    const int lid = PV_LOCAL_ID();
    const pv_long r = PV_GROUP_ID(0);
    const PV_GLOBAL float *xr = x + x_off + r * cols;
    PV_GLOBAL float *outr = out + out_off + r * cols;

    float max = -PV_INF;
    for (pv_long c = lid; c < cols; c += PV_WG)
        max = PV_FMAX(max, xr[c] * scale);
    max = pv_group_max(scratch, max);
    float sum = 0.0f;
    for (pv_long c = lid; c < cols; c += PV_WG) {
        const float e = PV_EXP(xr[c] * scale - max);
        outr[c] = e;
        sum += e;
    }
    const float inv_sum = 1.0f / pv_group_sum(scratch, sum);
    for (pv_long c = lid; c < cols; c += PV_WG)
        outr[c] *= inv_sum;
}

/* The lowest index of row xr's maximum, to every work-item of the group.
 * best_value and best_index hold PV_WG entries each. */
PV_FUNC int pv_argmax_row(const PV_GLOBAL float *xr, pv_long cols, PV_LOCAL float *best_value,
                          PV_LOCAL int *best_index)
{
    const int lid = PV_LOCAL_ID();
    /* Work-item lid sees its columns in increasing order, so `>` keeps the
     * lowest index among its equals. index == cols marks a work-item that
     * saw no column (cols < PV_WG). */
    float value = -PV_INF;
    int index = (int)cols;
    for (pv_long c = lid; c < cols; c += PV_WG)
        if (index == (int)cols || xr[c] > value) {
            value = xr[c];
            index = (int)c;
        }
    best_value[lid] = value;
    best_index[lid] = index;
    PV_BARRIER();
    for (int stride = PV_WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) {
            const float other = best_value[lid + stride];
            const int other_index = best_index[lid + stride];
            if (other_index != (int)cols &&
                (best_index[lid] == (int)cols || other > best_value[lid] ||
                 (other == best_value[lid] && other_index < best_index[lid]))) {
                best_value[lid] = other;
                best_index[lid] = other_index;
            }
        }
        PV_BARRIER();
    }
    const int best = best_index[0];
    PV_BARRIER();
    return best;
}

/* out[r] = the lowest index of row r's maximum. groups {rows, 1}. */
PV_KERNEL pv_argmax(const PV_GLOBAL float *x, pv_long x_off, pv_long cols, PV_GLOBAL int *out)
{
    PV_LOCAL_ARRAY(float, best_value, PV_WG);
    PV_LOCAL_ARRAY(int, best_index, PV_WG);
    const pv_long r = PV_GROUP_ID(0);
    const int best = pv_argmax_row(x + x_off + r * cols, cols, best_value, best_index);
    if (PV_LOCAL_ID() == 0)
        out[r] = best;
}

/* p_c = softmax(logits / temperature)_c, recomputed identically wherever it
 * is needed (so no scratch row is needed). */
PV_FUNC float pv_top_p_prob(const PV_GLOBAL float *xr, pv_long c, float max, float temperature,
                            float total)
{
    return PV_EXP((xr[c] - max) / temperature) / total;
}

/* Top-p sampling of row xr, deterministic for a given u, to every
 * work-item of the group:
 *   p = softmax(logits / temperature);
 *   threshold = the largest t with sum_{p_c >= t} p_c >= top_p: found by
 *   bisection on the bit pattern of t (positive floats order like their
 *   bits), which lands exactly on the p of the token where the mass, highest
 *   first, reaches top_p; every token with p >= threshold and p > 0 is kept
 *   (the threshold may be 0; a banned token's p is);
 *   pick the first kept token, in index order, whose cumulative kept mass
 *   exceeds u * kept mass (the last kept token if rounding leaves none).
 * scratch and index_scratch hold PV_WG entries each. */
PV_FUNC int pv_top_p_row(const PV_GLOBAL float *xr, pv_long cols, float temperature, float top_p, float u,
                         PV_LOCAL float *scratch, PV_LOCAL int *index_scratch)
{
    const int lid = PV_LOCAL_ID();
    float max = -PV_INF;
    for (pv_long c = lid; c < cols; c += PV_WG)
        max = PV_FMAX(max, xr[c]);
    max = pv_group_max(scratch, max);
    float total = 0.0f;
    for (pv_long c = lid; c < cols; c += PV_WG)
        total += PV_EXP((xr[c] - max) / temperature);
    total = pv_group_sum(scratch, total);

    /* Invariant: mass(lo) >= top_p (or lo = 0, keeping everything) and
     * mass(hi) < top_p; hi starts just above the largest p, 1 / total. */
    pv_u32 lo = 0;
    pv_u32 hi = PV_AS_U32(1.0f / total) + 1;
    while (hi - lo > 1) {
        const pv_u32 mid = lo + (hi - lo) / 2;
        const float t = PV_AS_FLOAT(mid);
        float mass = 0.0f;
        for (pv_long c = lid; c < cols; c += PV_WG) {
            const float p = pv_top_p_prob(xr, c, max, temperature, total);
            if (p >= t)
                mass += p;
        }
        mass = pv_group_sum(scratch, mass);
        if (mass >= top_p)
            lo = mid;
        else
            hi = mid;
    }
    const float threshold = PV_AS_FLOAT(lo);

    /* Index order needs contiguous blocks: work-item lid scans
     * [lid * block, (lid + 1) * block). */
    const pv_long block = (cols + PV_WG - 1) / PV_WG;
    const pv_long begin = lid * block < cols ? lid * block : cols;
    const pv_long end = begin + block < cols ? begin + block : cols;
    float block_mass = 0.0f;
    int last_kept = -1;
    for (pv_long c = begin; c < end; c++) {
        const float p = pv_top_p_prob(xr, c, max, temperature, total);
        if (p >= threshold && p > 0.0f) {
            block_mass += p;
            last_kept = (int)c;
        }
    }
    scratch[lid] = block_mass;
    PV_BARRIER();
    float before = 0.0f;
    for (int j = 0; j < lid; j++)
        before += scratch[j];
    float kept = before;
    for (int j = lid; j < PV_WG; j++)
        kept += scratch[j];
    PV_BARRIER();

    const float target = u * kept;
    int pick = (int)cols;
    if (before + block_mass > target) {
        float cumulative = before;
        for (pv_long c = begin; c < end; c++) {
            const float p = pv_top_p_prob(xr, c, max, temperature, total);
            if (p >= threshold && p > 0.0f) {
                cumulative += p;
                if (cumulative > target) {
                    pick = (int)c;
                    break;
                }
            }
        }
    }
    pick = pv_group_min_max_int(index_scratch, pick, 0);
    last_kept = pv_group_min_max_int(index_scratch, last_kept, 1);
    return pick < (int)cols ? pick : last_kept;
}

/* Top-p sampling of every row with one temperature and top_p, u[r] per
 * row (pv_top_p_row). groups {rows, 1}; out[r] in device memory. */
PV_KERNEL pv_sample_top_p(const PV_GLOBAL float *logits, pv_long logits_off, pv_long cols,
                          float temperature, float top_p, const PV_GLOBAL float *u,
                          PV_GLOBAL int *out)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    PV_LOCAL_ARRAY(int, index_scratch, PV_WG);
    const pv_long r = PV_GROUP_ID(0);
    const int pick = pv_top_p_row(logits + logits_off + r * cols, cols, temperature, top_p, u[r], scratch,
                                  index_scratch);
    if (PV_LOCAL_ID() == 0)
        out[r] = pick;
}

/* Row r's logits with its bias (pv_sample_batch_args) in the scratch row
 * `biased`, for every work-item of the group: a copy of the row, then each
 * entry (a token at most once, so no two work-items write one element)
 * added in f32, a banned token -infinity. */
PV_FUNC void pv_bias_row(const PV_GLOBAL float *xr, pv_long cols, int first, int last,
                         const PV_GLOBAL int *bias_token, const PV_GLOBAL float *bias_value,
                         PV_GLOBAL float *biased)
{
    const int lid = PV_LOCAL_ID();
    for (pv_long c = lid; c < cols; c += PV_WG)
        biased[c] = xr[c];
    PV_BARRIER_GLOBAL();
    for (int k = first + lid; k < last; k += PV_WG) {
        const int c = bias_token[k];
        const float v = bias_value[k];
        biased[c] = v <= -100.0f ? -PV_INF : xr[c] + v; /* -100: PV_LOGIT_BIAS_BAN */
    }
    PV_BARRIER_GLOBAL();
}

/* A step's rows at once, one work-group a row, each its own way: row r
 * with temperature[r] <= 0 takes pv_argmax_row, the others pv_top_p_row
 * with temperature[r], top_p[r] and u[r]; out[out_off + r] gets the token.
 * With `biased_rows` (a logit bias), a row with entries
 * bias_start[r] .. bias_start[r + 1] - 1 is first written with them into
 * its row of the scratch `biased`, the rows with entries packed in order
 * (the count before r is the group's sum), and sampled from there. The
 * branches are the whole group's (one row), so the barriers inside stay
 * uniform. groups {rows, 1}; the arrays are in device memory. */
PV_KERNEL pv_sample_batch(const PV_GLOBAL float *logits, pv_long logits_off, pv_long cols,
                          const PV_GLOBAL float *temperature, const PV_GLOBAL float *top_p,
                          const PV_GLOBAL float *u, int biased_rows, const PV_GLOBAL int *bias_start,
                          const PV_GLOBAL int *bias_token, const PV_GLOBAL float *bias_value,
                          PV_GLOBAL float *biased, PV_GLOBAL int *out, pv_long out_off)
{
    PV_LOCAL_ARRAY(float, scratch, PV_WG);
    PV_LOCAL_ARRAY(int, index_scratch, PV_WG);
    const int lid = PV_LOCAL_ID();
    const pv_long r = PV_GROUP_ID(0);
    const PV_GLOBAL float *xr = logits + logits_off + r * cols;
    if (biased_rows && bias_start[r + 1] > bias_start[r]) {
        float before = 0.0f; /* rows with entries before r: exact in f32 below 2^24 rows */
        for (pv_long j = lid; j < r; j += PV_WG)
            before += bias_start[j + 1] > bias_start[j] ? 1.0f : 0.0f;
        PV_GLOBAL float *row = biased + (pv_long)pv_group_sum(scratch, before) * cols;
        pv_bias_row(xr, cols, bias_start[r], bias_start[r + 1], bias_token, bias_value, row);
        xr = row;
    }
    const float t = temperature[r];
    const int pick = t <= 0.0f ? pv_argmax_row(xr, cols, scratch, index_scratch)
                               : pv_top_p_row(xr, cols, t, top_p[r], u[r], scratch, index_scratch);
    if (lid == 0)
        out[out_off + r] = pick;
}
