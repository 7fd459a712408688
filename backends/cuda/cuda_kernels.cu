/* The CUDA build of the portable kernels in kernels/ and their launchers.
 *
 * The kernel text is the same that the OpenCL backend hands to its compiler
 * at run time (kernels/dialect.h maps it onto CUDA C), built with the same
 * defines:
 *   - the gather family is included twice, once per PV_STORE_F16 value,
 *     which gives its _f32 and _f16 kernels; the f32-only recompute family
 *     once. Both at the dialect's PV_WG (64) and PV_ITEM_ELEMS (8).
 *   - attention, like the OpenCL backend's, is built per head-dim class:
 *     PV_MAX_HEAD_DIM 64, 128 and 256 (each work-item holds
 *     PV_MAX_HEAD_DIM / PV_WG dims), each for f32 and f16, all at
 *     PV_ATT_MAX_GROUP = PV_ATTENTION_GROUP_MAX query heads per group (the
 *     OpenCL backend also builds smaller query-head classes; here one class
 *     keeps the build small). The classes are six inclusions of one file,
 *     so each goes in a namespace of its own.
 *   - the qmatmul family once per weight type (PV_WTYPE), each in a
 *     namespace of its own.
 *   These come after the other families so the dialect's include-once part
 *   is already read at file scope.
 *
 * Launch geometry follows each kernel's comment: gridDim = the kernel's
 * groups, blockDim = PV_WG. CUDA caps gridDim.y at 65535, so a launch with
 * more rows along dimension 1 (tokens, moved slots, ids) runs as several
 * launches, each shifted to its first row through the kernel's offset
 * arguments and the index-array pointers. */
#include "backends/cuda/cuda_kernels.h"
#include "backends/attention-split.h"

#define PV_STORE_F16 0
#include "kernels/gather.cl"
#undef PV_STORE_F16
#define PV_STORE_F16 1
#include "kernels/gather.cl"
#undef PV_STORE_F16
#include "kernels/recompute.cl"

#define PV_ATT_MAX_GROUP PV_ATTENTION_GROUP_MAX
#undef PV_MAX_HEAD_DIM
#define PV_MAX_HEAD_DIM 64
namespace head_dim_64 {
#define PV_STORE_F16 0
#include "kernels/attention.cl"
#undef PV_STORE_F16
#define PV_STORE_F16 1
#include "kernels/attention.cl"
#undef PV_STORE_F16
} // namespace head_dim_64

#undef PV_MAX_HEAD_DIM
#define PV_MAX_HEAD_DIM 128
namespace head_dim_128 {
#define PV_STORE_F16 0
#include "kernels/attention.cl"
#undef PV_STORE_F16
#define PV_STORE_F16 1
#include "kernels/attention.cl"
#undef PV_STORE_F16
} // namespace head_dim_128

#undef PV_MAX_HEAD_DIM
#define PV_MAX_HEAD_DIM 256
namespace head_dim_256 {
#define PV_STORE_F16 0
#include "kernels/attention.cl"
#undef PV_STORE_F16
#define PV_STORE_F16 1
#include "kernels/attention.cl"
#undef PV_STORE_F16
} // namespace head_dim_256

#define PV_WTYPE 0
namespace wtype_f32 {
#include "kernels/qmatmul.cl"
} // namespace wtype_f32
#undef PV_WTYPE
#define PV_WTYPE 1
namespace wtype_f16 {
#include "kernels/qmatmul.cl"
} // namespace wtype_f16
#undef PV_WTYPE
#define PV_WTYPE 30
namespace wtype_bf16 {
#include "kernels/qmatmul.cl"
} // namespace wtype_bf16
#undef PV_WTYPE
#define PV_WTYPE 8
namespace wtype_q8_0 {
#include "kernels/qmatmul.cl"
} // namespace wtype_q8_0
#undef PV_WTYPE
#define PV_WTYPE 2
namespace wtype_q4_0 {
#include "kernels/qmatmul.cl"
} // namespace wtype_q4_0
#undef PV_WTYPE
#define PV_WTYPE 3
namespace wtype_q4_1 {
#include "kernels/qmatmul.cl"
} // namespace wtype_q4_1
#undef PV_WTYPE

namespace {

const long long max_grid_rows = 65535;      /* gridDim.y limit */
const long long max_grid_x = 2147483647LL;  /* gridDim.x limit */

unsigned int groups_of(long long n, long long per_group)
{
    return (unsigned int)((n + per_group - 1) / per_group);
}

/* Rows of dimension 1 in the launch that starts at row `first`. */
long long rows_in_launch(long long total, long long first)
{
    return total - first < max_grid_rows ? total - first : max_grid_rows;
}

/* Groups of dimension 0 in the launch that starts at group `first`. */
long long rows_in_grid_x(long long total, long long first)
{
    return total - first < max_grid_x ? total - first : max_grid_x;
}

} // namespace

/* Whether this build holds code the current device can run: the kernels
 * are built for the SM versions of --with-cuda-arch only. */
extern "C" cudaError_t pv_cuda_kernels_loadable(void)
{
    cudaFuncAttributes attributes;
    return cudaFuncGetAttributes(&attributes, pv_slot_gather_f32);
}

/* ---- attention: groups {n_kv_heads * blocks * splits, T}, combine {n_heads, T} ---- */

template <typename store_t> struct attention_kernels {
    void (*attention)(const float *, pv_long, const store_t *, const int *, const int *, const int *, int, int,
                      int, int, int, float, int, int, float *, pv_long, float *, pv_long, pv_long);
    void (*combine)(const float *, pv_long, pv_long, int, int, int, float *, pv_long);
};

/* The smallest head-dim class that holds head_dim (at most 256, checked by
 * the front end). */
static attention_kernels<float> attention_f32_for(int head_dim)
{
    if (head_dim <= 64)
        return {head_dim_64::pv_attention_f32, head_dim_64::pv_attention_combine_f32};
    if (head_dim <= 128)
        return {head_dim_128::pv_attention_f32, head_dim_128::pv_attention_combine_f32};
    return {head_dim_256::pv_attention_f32, head_dim_256::pv_attention_combine_f32};
}

static attention_kernels<pv_half> attention_f16_for(int head_dim)
{
    if (head_dim <= 64)
        return {head_dim_64::pv_attention_f16, head_dim_64::pv_attention_combine_f16};
    if (head_dim <= 128)
        return {head_dim_128::pv_attention_f16, head_dim_128::pv_attention_combine_f16};
    return {head_dim_256::pv_attention_f16, head_dim_256::pv_attention_combine_f16};
}

template <typename store_t>
static cudaError_t launch_attention(cudaStream_t stream, const pv_attention_args *a, attention_kernels<store_t> k,
                                    const float *q, const store_t *kv, const int32_t *token_seq,
                                    const int32_t *token_pos, const int32_t *slot_table, int max_group,
                                    int splits, float *part, float *out)
{
    const int blocks = pv_attention_head_blocks(a->n_heads, a->n_kv_heads, max_group);
    const int heads_per_block = pv_attention_heads_per_block(a->n_heads, a->n_kv_heads, max_group);
    const long long token_elems = (long long)a->n_heads * a->head_dim;
    /* part: [T][splits][n_heads][head_dim], then [T][splits][n_heads][2] */
    const long long ml_base = (long long)a->n_tokens * splits * token_elems;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += max_grid_rows) {
        const unsigned int rows = (unsigned int)rows_in_launch(a->n_tokens, i0);
        const dim3 grid((unsigned int)(a->n_kv_heads * blocks * splits), rows);
        const long long off = i0 * token_elems;
        const long long part_off = i0 * splits * token_elems;
        const long long ml_off = ml_base + i0 * splits * a->n_heads * 2;
        k.attention<<<grid, PV_WG, 0, stream>>>(q, off, kv, token_seq + i0, token_pos + i0, slot_table,
                                                a->max_chunks, a->n_heads, a->n_kv_heads, a->head_dim,
                                                a->chunk_tokens, a->scale, heads_per_block, splits, out, off,
                                                part, part_off, ml_off);
        cudaError_t err = cudaGetLastError();
        if (err == cudaSuccess && splits > 1) {
            k.combine<<<dim3((unsigned int)a->n_heads, rows), PV_WG, 0, stream>>>(
                part, part_off, ml_off, splits, a->n_heads, a->head_dim, out, off);
            err = cudaGetLastError();
        }
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

extern "C" cudaError_t pv_cuda_launch_attention(cudaStream_t stream, const pv_attention_args *a,
                                                const float *q, const void *kv_pool,
                                                const int32_t *token_seq, const int32_t *token_pos,
                                                const int32_t *slot_table, int max_group, int splits,
                                                float *part, float *out)
{
    if (a->kv_dtype == PV_F16)
        return launch_attention(stream, a, attention_f16_for(a->head_dim), q, (const pv_half *)kv_pool,
                                token_seq, token_pos, slot_table, max_group, splits, part, out);
    return launch_attention(stream, a, attention_f32_for(a->head_dim), q, (const float *)kv_pool, token_seq,
                            token_pos, slot_table, max_group, splits, part, out);
}

/* ---- gather family ---------------------------------------------------------------- */

/* groups {ceil(row_elems / PV_WG), T} */
extern "C" cudaError_t pv_cuda_launch_kv_write(cudaStream_t stream, const pv_kv_write_args *a,
                                               const float *k, const float *v, void *kv_pool,
                                               const int32_t *token_seq, const int32_t *token_pos,
                                               const int32_t *slot_table)
{
    const long long row_elems = (long long)a->n_kv_heads * a->head_dim;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += max_grid_rows) {
        const dim3 grid(groups_of(row_elems, PV_WG), (unsigned int)rows_in_launch(a->n_tokens, i0));
        const long long off = i0 * row_elems;
        if (a->kv_dtype == PV_F16)
            pv_kv_write_f16<<<grid, PV_WG, 0, stream>>>(k, off, v, off, (pv_half *)kv_pool,
                                                        token_seq + i0, token_pos + i0, slot_table,
                                                        a->max_chunks, a->chunk_tokens, row_elems);
        else
            pv_kv_write_f32<<<grid, PV_WG, 0, stream>>>(k, off, v, off, (float *)kv_pool,
                                                        token_seq + i0, token_pos + i0, slot_table,
                                                        a->max_chunks, a->chunk_tokens, row_elems);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {ceil(slot_elems / (PV_WG * PV_ITEM_ELEMS)), n_moved}; the words
 * are moved bit-exactly, so f16 slots travel as 16-bit words. */
extern "C" cudaError_t pv_cuda_launch_slot_copy(cudaStream_t stream, const pv_slot_copy_args *a,
                                                int scatter, void *pool, void *staging,
                                                const int32_t *slots)
{
    const long long slot_elems = a->slot_elems;
    for (long long i0 = 0; i0 < a->n_slots_moved; i0 += max_grid_rows) {
        const dim3 grid(groups_of(slot_elems, (long long)PV_WG * PV_ITEM_ELEMS),
                        (unsigned int)rows_in_launch(a->n_slots_moved, i0));
        const long long off = i0 * slot_elems;
        const int32_t *ids = slots + i0;
        if (a->dtype == PV_F16) {
            pv_u16 *p = (pv_u16 *)pool, *s = (pv_u16 *)staging;
            if (scatter)
                pv_slot_scatter_f16<<<grid, PV_WG, 0, stream>>>(p, s, off, ids, slot_elems);
            else
                pv_slot_gather_f16<<<grid, PV_WG, 0, stream>>>(p, s, off, ids, slot_elems);
        } else {
            pv_u32 *p = (pv_u32 *)pool, *s = (pv_u32 *)staging;
            if (scatter)
                pv_slot_scatter_f32<<<grid, PV_WG, 0, stream>>>(p, s, off, ids, slot_elems);
            else
                pv_slot_gather_f32<<<grid, PV_WG, 0, stream>>>(p, s, off, ids, slot_elems);
        }
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* ---- qmatmul family ---------------------------------------------------------------- */

/* One weight type's kernels. */
struct weight_kernels {
    void (*fused[3])(const pv_u16 *, pv_long, const float *, pv_long, float *, pv_long, int, int, int, int);
    void (*widen)(const pv_u16 *, pv_long, int, pv_long, float *);
    void (*embed)(const pv_u16 *, pv_long, const int *, pv_long, float *, pv_long);
};

#define PV_WEIGHT_KERNELS(ns)                                                                      \
    weight_kernels                                                                                 \
    {                                                                                              \
        {ns::pv_qmatmul_fused_1, ns::pv_qmatmul_fused_4, ns::pv_qmatmul_fused_16},                 \
            ns::pv_qmatmul_widen, ns::pv_embed_gather                                              \
    }

/* The front end admits only the types of pv_cuda_weights_supported. */
static weight_kernels weight_kernels_for(pv_wtype t)
{
    switch (t) {
    case PV_W_F16: return PV_WEIGHT_KERNELS(wtype_f16);
    case PV_W_BF16: return PV_WEIGHT_KERNELS(wtype_bf16);
    case PV_W_Q8_0: return PV_WEIGHT_KERNELS(wtype_q8_0);
    case PV_W_Q4_0: return PV_WEIGHT_KERNELS(wtype_q4_0);
    case PV_W_Q4_1: return PV_WEIGHT_KERNELS(wtype_q4_1);
    case PV_W_F32: break;
    }
    return PV_WEIGHT_KERNELS(wtype_f32);
}

extern "C" int pv_cuda_weights_supported(pv_wtype t)
{
    switch (t) {
    case PV_W_F32:
    case PV_W_F16:
    case PV_W_BF16:
    case PV_W_Q8_0:
    case PV_W_Q4_0:
    case PV_W_Q4_1:
        return 1;
    }
    return 0;
}

/* groups {ceil(dim / PV_WG), n_ids} */
extern "C" cudaError_t pv_cuda_launch_embed_gather(cudaStream_t stream, const pv_embed_gather_args *a,
                                                   const void *table, const int32_t *ids, float *out)
{
    const weight_kernels k = weight_kernels_for(a->table_type);
    for (long long i0 = 0; i0 < a->n_ids; i0 += max_grid_rows) {
        const dim3 grid(groups_of(a->dim, PV_WG), (unsigned int)rows_in_launch(a->n_ids, i0));
        k.embed<<<grid, PV_WG, 0, stream>>>((const pv_u16 *)table, 0, ids + i0, a->dim, out, i0 * a->dim);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {ceil(n_out / rows_per_group), 1}: the work-items of a row take its
 * units (blocks, or elements of the float types), as many as there are
 * units up to the group, the rest of the group other rows. */
extern "C" cudaError_t pv_cuda_launch_qmatmul_fused(cudaStream_t stream, const pv_qmatmul_args *a,
                                                    const void *w, const float *x, float *y)
{
    const weight_kernels k = weight_kernels_for(a->w_type);
    const int cls = a->n_tokens <= 1 ? 0 : a->n_tokens <= 4 ? 1 : 2;
    uint32_t block_elems = 1;
    pv_wtype_block(a->w_type, &block_elems, NULL);
    const long long units = a->n_in / block_elems;
    int per_row = 1;
    while (per_row < units && per_row < PV_WG)
        per_row *= 2;
    const int rows_per_group = PV_WG / per_row;
    k.fused[cls]<<<groups_of(a->n_out, rows_per_group), PV_WG, 0, stream>>>(
        (const pv_u16 *)w, 0, x, 0, y, 0, (int)a->n_tokens, (int)a->n_in, (int)a->n_out, rows_per_group);
    return cudaGetLastError();
}

/* groups {ceil(n_in / PV_WG), n_rows}, n_rows <= 65535 (the caller's tiles) */
extern "C" cudaError_t pv_cuda_launch_qmatmul_widen(cudaStream_t stream, const pv_qmatmul_args *a,
                                                    const void *w, long long row0, long long n_rows,
                                                    float *tile)
{
    const weight_kernels k = weight_kernels_for(a->w_type);
    const dim3 grid(groups_of(a->n_in, PV_WG), (unsigned int)n_rows);
    k.widen<<<grid, PV_WG, 0, stream>>>((const pv_u16 *)w, 0, (int)a->n_in, row0, tile);
    return cudaGetLastError();
}

/* ---- recompute family ------------------------------------------------------------ */

/* groups {rows, 1} */
extern "C" cudaError_t pv_cuda_launch_rmsnorm(cudaStream_t stream, const pv_rmsnorm_args *a,
                                              const float *x, const float *weight, float *out)
{
    for (long long r0 = 0; r0 < a->rows; r0 += max_grid_x) {
        const long long off = r0 * a->dim;
        pv_rmsnorm<<<(unsigned int)rows_in_grid_x(a->rows, r0), PV_WG, 0, stream>>>(
            x, off, weight, 0, out, off, a->dim, a->eps);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {n_heads, T} */
extern "C" cudaError_t pv_cuda_launch_rope(cudaStream_t stream, const pv_rope_args *a, float *x,
                                           const int32_t *pos)
{
    const long long token_elems = (long long)a->n_heads * a->head_dim;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += max_grid_rows) {
        const dim3 grid((unsigned int)a->n_heads, (unsigned int)rows_in_launch(a->n_tokens, i0));
        pv_rope<<<grid, PV_WG, 0, stream>>>(x, i0 * token_elems, pos + i0, a->n_heads, a->head_dim,
                                            a->base, a->neox);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* Element-wise: groups {ceil(n / (PV_WG * PV_ITEM_ELEMS)), 1}. */
extern "C" cudaError_t pv_cuda_launch_swiglu(cudaStream_t stream, const pv_swiglu_args *a,
                                             const float *gate, const float *up, float *out)
{
    const long long per_launch = max_grid_x * PV_WG * PV_ITEM_ELEMS;
    for (long long e0 = 0; e0 < a->n; e0 += per_launch) {
        const long long n = a->n - e0 < per_launch ? a->n - e0 : per_launch;
        pv_swiglu<<<groups_of(n, (long long)PV_WG * PV_ITEM_ELEMS), PV_WG, 0, stream>>>(
            gate + e0, 0, up + e0, 0, out + e0, 0, n);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

extern "C" cudaError_t pv_cuda_launch_add(cudaStream_t stream, const pv_add_args *a, const float *x,
                                          const float *y, float *out)
{
    const long long per_launch = max_grid_x * PV_WG * PV_ITEM_ELEMS;
    for (long long e0 = 0; e0 < a->n; e0 += per_launch) {
        const long long n = a->n - e0 < per_launch ? a->n - e0 : per_launch;
        pv_add<<<groups_of(n, (long long)PV_WG * PV_ITEM_ELEMS), PV_WG, 0, stream>>>(
            x + e0, 0, y + e0, 0, out + e0, 0, n);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {rows, 1} */
extern "C" cudaError_t pv_cuda_launch_softmax(cudaStream_t stream, const pv_softmax_args *a,
                                              const float *x, float *out)
{
    for (long long r0 = 0; r0 < a->rows; r0 += max_grid_x) {
        const long long off = r0 * a->cols;
        pv_softmax<<<(unsigned int)rows_in_grid_x(a->rows, r0), PV_WG, 0, stream>>>(
            x, off, out, off, a->cols, a->scale);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {rows, 1} */
extern "C" cudaError_t pv_cuda_launch_argmax(cudaStream_t stream, const pv_argmax_args *a,
                                             const float *x, int32_t *out)
{
    for (long long r0 = 0; r0 < a->rows; r0 += max_grid_x) {
        pv_argmax<<<(unsigned int)rows_in_grid_x(a->rows, r0), PV_WG, 0, stream>>>(
            x, r0 * a->cols, a->cols, out + r0);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}

/* groups {rows, 1} */
extern "C" cudaError_t pv_cuda_launch_sample_top_p(cudaStream_t stream, const pv_sample_args *a,
                                                   const float *logits, const float *u, int32_t *out)
{
    for (long long r0 = 0; r0 < a->rows; r0 += max_grid_x) {
        pv_sample_top_p<<<(unsigned int)rows_in_grid_x(a->rows, r0), PV_WG, 0, stream>>>(
            logits, r0 * a->cols, a->cols, a->temperature, a->top_p, u + r0, out + r0);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            return err;
    }
    return cudaSuccess;
}
