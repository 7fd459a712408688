/* The CUDA backend's kernels: programs built at run time by NVRTC
 * (cuda_nvrtc.c), loaded through the runtime's library API
 * (cudaLibraryLoadData), launched with cudaLaunchKernel (cuda_launch.c).
 * Called from the host code in cuda_backend.c. Not installed.
 *
 * Programs are built lazily: the first launch of a family under a
 * parameter set compiles it (or reads it from the disk cache) and loads
 * it, so a process builds only the variants its ops use (its model's
 * weight types, head-dim class, KV dtype).
 *
 * Every pointer is a device pointer already advanced to the op's offset;
 * index arrays (token_seq, token_pos, slot_table, slots, ids, pos, u) have
 * been uploaded to device memory by the caller. Scalars come from the
 * front end's validated argument structs. Each launcher enqueues on
 * `stream` without blocking; a failure to build, load or launch is a
 * status naming the kernel. */
#ifndef PV_BACKENDS_CUDA_KERNELS_H
#define PV_BACKENDS_CUDA_KERNELS_H

#include "backends/backend.h"
#include "backends/cuda/cuda_nvrtc.h"
#include "backends/graph-trace.h"
#include "backends/kernel-tuning.h"

#include <cuda_runtime_api.h>

/* A failed runtime call as a status: "cuda: <call> (<context>) failed:
 * <error> (<name>)"; allocation failures are PV_ERR_OUT_OF_MEMORY, the
 * rest PV_ERR_BACKEND. Clears the runtime's last error. */
pv_status pv_cuda_fail(cudaError_t err, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Kernels looked up in one program at most (the qmatmul family's 23). */
#define PV_CUDA_PROGRAM_KERNELS 24

/* One loaded program: a family under one parameter set. */
typedef struct pv_cuda_program {
    pv_kernel_params params;
    /* Kept while the library is loaded: the runtime may load it into a
     * context only at the first launch, and does not promise a copy. */
    pv_cuda_image image;
    cudaLibrary_t library;
    int n_kernels;
    char names[PV_CUDA_PROGRAM_KERNELS][32];
    cudaKernel_t kernels[PV_CUDA_PROGRAM_KERNELS];
} pv_cuda_program;

typedef struct pv_cuda_kernels {
    pv_cuda_target target;
    char cache_dir[4096]; /* "" when there is none */
    /* The backend's tuned sets per bucket (pv_backend.tuning); launchers
     * copy their call's set and fill in the variants. */
    const pv_kernel_tuning *tuning;
    uint64_t *launches; /* the backend's count (pv_backend.launches): one per kernel launch */
    pv_cuda_program *programs;
    int n_programs, cap_programs;
    /* During a graph step (backends/graph-trace.h), each launch is
     * described to `trace` (its arguments' bytes, their sizes given by the
     * launcher); with `check`, it is compared with the recording's instead
     * of launched. NULL outside graph steps. */
    pv_graph_trace *trace;
    int check;
    /* Kernels looked up and not launched yet: the first launch of each
     * compares its arguments with the kernel's parameters (cuda_launch.c). */
    struct pv_cuda_unchecked {
        cudaKernel_t kernel;
        char name[32];
    } *unchecked;
    int n_unchecked, cap_unchecked;
} pv_cuda_kernels;

/* The target for a device of compute capability major.minor, the cache
 * directory, the backend's tuned sets and its launch count; builds nothing
 * yet. */
pv_status pv_cuda_kernels_init(pv_cuda_kernels *k, int major, int minor, const pv_kernel_tuning *tuning,
                               uint64_t *launches);

/* Unloads every program; the caller has drained the streams. */
void pv_cuda_kernels_free(pv_cuda_kernels *k);

/* x rounded to 16 bits per block of 32 (PV_ACT16, kernels/qmatmul.cl):
 * q [T][n_in / 4] pairs of 32-bit words (hi bytes, lo bytes), s [T][n_in
 * / 32] pairs of floats (scale, sum); both 8-byte aligned. */
typedef struct pv_cuda_xq16 {
    void *q;
    float *s;
} pv_cuda_xq16;

/* Bytes of a pv_cuda_xq16 of T tokens of n_in (a multiple of 32), q then s. */
static inline size_t pv_cuda_xq16_bytes(int64_t n_tokens, int64_t n_in)
{
    return (size_t)n_tokens * (size_t)n_in * 2 + (size_t)n_tokens * (size_t)(n_in / 32) * 2 * sizeof(float);
}

/* Blocks of at most max_group query heads (backends/attention-split.h);
 * splits > 1: partial rows go to part (pv_attention_split_floats floats),
 * then the combine kernel to out, and with xq (not NULL; head_dim a
 * multiple of 32) out rounded into it too, as
 * pv_cuda_launch_qmatmul_round16 would round it. */
pv_status pv_cuda_launch_attention(pv_cuda_kernels *k, cudaStream_t stream, const pv_attention_args *a,
                                   const float *q, const void *kv_pool, const int32_t *token_seq,
                                   const int32_t *token_pos, const int32_t *slot_table, int max_group, int splits,
                                   float *part, float *out, const pv_cuda_xq16 *xq);

pv_status pv_cuda_launch_kv_write(pv_cuda_kernels *k, cudaStream_t stream, const pv_kv_write_args *a,
                                  const float *kf, const float *vf, void *kv_pool, const int32_t *token_seq,
                                  const int32_t *token_pos, const int32_t *slot_table);

/* gather: staging[i] = pool[slots[i]]; scatter: pool[slots[i]] = staging[i]. */
pv_status pv_cuda_launch_slot_copy(pv_cuda_kernels *k, cudaStream_t stream, const pv_slot_copy_args *a,
                                   int scatter, void *pool, void *staging, const int32_t *slots);

/* dst[dst_slots[i]] = src[src_slots[i]], whole slots as 4-byte words;
 * dst and src may be mapped pinned host memory. */
pv_status pv_cuda_launch_slot_transfer(pv_cuda_kernels *k, cudaStream_t stream, const pv_slot_transfer_args *a,
                                       void *dst, const void *src, const int32_t *dst_slots,
                                       const int32_t *src_slots);

/* The weight pointers (table, w) point at the op's offset; ids_dev
 * (device ids, NULL without) at element ids_dev_off. */
pv_status pv_cuda_launch_embed_gather(pv_cuda_kernels *k, cudaStream_t stream, const pv_embed_gather_args *a,
                                      const void *table, const int32_t *ids, const int32_t *ids_dev, float *out);

/* xq = x [T][n_in] rounded, for the block types' fused kernels. */
pv_status pv_cuda_launch_qmatmul_round16(pv_cuda_kernels *k, cudaStream_t stream, pv_wtype t, const float *x,
                                         int64_t n_tokens, int64_t n_in, const pv_cuda_xq16 *xq);

/* T <= 16: y = x W^T in one pass over W, from x, or from xq (not NULL)
 * where the caller rounded x into it. */
pv_status pv_cuda_launch_qmatmul_fused(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                       const void *w, const float *x, const pv_cuda_xq16 *xq, float *y);

/* T <= 16: up to three products of one x and one weight type (n <= 3,
 * products[i].w_type all the same) in one launch, product i's weights at
 * w[i] and output at y[i]; from x or xq as pv_cuda_launch_qmatmul_fused. */
pv_status pv_cuda_launch_qmatmul_group(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *products,
                                       int n, const void *const *w, float *const *y, const float *x,
                                       const pv_cuda_xq16 *xq);

/* tile[n_rows][n_in] = rows row0.. of W in the GEMM's input type of
 * gemm_mode (pv_gemm_mode: f16 or bf16, else f32); n_rows <= 65535. */
pv_status pv_cuda_launch_qmatmul_widen(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                       const void *w, int64_t row0, int64_t n_rows, int gemm_mode, void *tile);

/* out[T][n_in] = x rounded as the tiles are (the GEMMs' other operand). */
pv_status pv_cuda_launch_qmatmul_narrow16(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                          const float *x, int bf16, void *out);

/* T <= 16: y = silu(x Wg^T) * (x Wu^T) in one pass over both matrices,
 * from x or xq as pv_cuda_launch_qmatmul_fused. */
pv_status pv_cuda_launch_qmatmul_swiglu_fused(pv_cuda_kernels *k, cudaStream_t stream,
                                              const pv_qmatmul_swiglu_args *a, const void *w_gate,
                                              const void *w_up, const float *x, const pv_cuda_xq16 *xq, float *y);

/* q rotated in place; k rotated into the pool beside v. */
pv_status pv_cuda_launch_rope_kv_write(pv_cuda_kernels *k, cudaStream_t stream, const pv_rope_kv_write_args *a,
                                       float *q, const float *kf, const float *vf, void *kv_pool,
                                       const int32_t *token_seq, const int32_t *token_pos,
                                       const int32_t *slot_table);

/* x += y, then out = rmsnorm(x) * weight; with xq (not NULL) out rounded
 * into it too (dim a multiple of 32), as pv_cuda_launch_qmatmul_round16
 * would round it. */
pv_status pv_cuda_launch_add_rmsnorm(pv_cuda_kernels *k, cudaStream_t stream, const pv_add_rmsnorm_args *a, float *x,
                                     const float *y, const float *weight, float *out, const pv_cuda_xq16 *xq);

pv_status pv_cuda_launch_rmsnorm(pv_cuda_kernels *k, cudaStream_t stream, const pv_rmsnorm_args *a,
                                 const float *x, const float *weight, float *out);

pv_status pv_cuda_launch_rope(pv_cuda_kernels *k, cudaStream_t stream, const pv_rope_args *a, float *x,
                              const int32_t *pos);

pv_status pv_cuda_launch_swiglu(pv_cuda_kernels *k, cudaStream_t stream, const pv_swiglu_args *a,
                                const float *gate, const float *up, float *out);

pv_status pv_cuda_launch_add(pv_cuda_kernels *k, cudaStream_t stream, const pv_add_args *a, const float *x,
                             const float *y, float *out);

pv_status pv_cuda_launch_softmax(pv_cuda_kernels *k, cudaStream_t stream, const pv_softmax_args *a,
                                 const float *x, float *out);

/* out[rows] (device) gets each row's argmax. */
pv_status pv_cuda_launch_argmax(pv_cuda_kernels *k, cudaStream_t stream, const pv_argmax_args *a,
                                const float *x, int32_t *out);

/* out[rows] (device) gets each row's top-p draw for u[rows] (device). */
pv_status pv_cuda_launch_sample_top_p(pv_cuda_kernels *k, cudaStream_t stream, const pv_sample_args *a,
                                      const float *logits, const float *u, int32_t *out);

/* The logit bias of sample_batch on the device: the lists as the op's
 * (bias_start NULL: no bias), and scratch for the rows with entries x cols
 * floats. */
typedef struct pv_cuda_logit_bias {
    const int32_t *start, *token;
    const float *value;
    float *biased;
} pv_cuda_logit_bias;

/* out[rows] (device) gets each row's token: argmax where temperature[r]
 * <= 0, else its top-p draw (temperature, top_p, u: [rows], device), from
 * the row's biased logits where it has bias entries. */
pv_status pv_cuda_launch_sample_batch(pv_cuda_kernels *k, cudaStream_t stream, const pv_sample_batch_args *a,
                                      const float *logits, const float *temperature, const float *top_p,
                                      const float *u, const pv_cuda_logit_bias *bias, int32_t *out);

#endif
