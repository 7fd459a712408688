/* Launchers for the CUDA build of the portable kernels (kernels/), compiled
 * by nvcc in cuda_kernels.cu and called from the host code in
 * cuda_backend.c. Not installed.
 *
 * Every pointer is a device pointer already advanced to the op's offset;
 * index arrays (token_seq, token_pos, slot_table, slots, ids, pos, u) have
 * been uploaded to device memory by the caller. Scalars come from the
 * front end's validated argument structs. Each launcher enqueues on
 * `stream` and returns the launch's cudaError_t (cudaSuccess or the error
 * cudaGetLastError() reported), never blocking. */
#ifndef PV_BACKENDS_CUDA_KERNELS_H
#define PV_BACKENDS_CUDA_KERNELS_H

#include "backends/backend.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cudaSuccess if the current device can run this build's kernels;
 * cudaErrorNoKernelImageForDevice (or similar) if none was built for it. */
cudaError_t pv_cuda_kernels_loadable(void);

/* Blocks of at most max_group query heads (backends/attention-split.h);
 * splits > 1: partial rows go to part (pv_attention_split_floats floats),
 * then the combine kernel to out. */
cudaError_t pv_cuda_launch_attention(cudaStream_t stream, const pv_attention_args *a,
                                     const float *q, const void *kv_pool,
                                     const int32_t *token_seq, const int32_t *token_pos,
                                     const int32_t *slot_table, int max_group, int splits, float *part,
                                     float *out);

cudaError_t pv_cuda_launch_kv_write(cudaStream_t stream, const pv_kv_write_args *a,
                                    const float *k, const float *v, void *kv_pool,
                                    const int32_t *token_seq, const int32_t *token_pos,
                                    const int32_t *slot_table);

/* gather: staging[i] = pool[slots[i]]; scatter: pool[slots[i]] = staging[i]. */
cudaError_t pv_cuda_launch_slot_copy(cudaStream_t stream, const pv_slot_copy_args *a, int scatter,
                                     void *pool, void *staging, const int32_t *slots);

/* Whether kernels/qmatmul.cl is built here for weight type t. */
int pv_cuda_weights_supported(pv_wtype t);

/* The weight pointers (table, w) point at the op's offset. */
cudaError_t pv_cuda_launch_embed_gather(cudaStream_t stream, const pv_embed_gather_args *a,
                                        const void *table, const int32_t *ids, float *out);

/* T <= 16: y = x W^T in one pass over W. */
cudaError_t pv_cuda_launch_qmatmul_fused(cudaStream_t stream, const pv_qmatmul_args *a, const void *w,
                                         const float *x, float *y);

/* tile[n_rows][n_in] = rows row0.. of W widened to f32; n_rows <= 65535. */
cudaError_t pv_cuda_launch_qmatmul_widen(cudaStream_t stream, const pv_qmatmul_args *a, const void *w,
                                         long long row0, long long n_rows, float *tile);

cudaError_t pv_cuda_launch_rmsnorm(cudaStream_t stream, const pv_rmsnorm_args *a, const float *x,
                                   const float *weight, float *out);

cudaError_t pv_cuda_launch_rope(cudaStream_t stream, const pv_rope_args *a, float *x,
                                const int32_t *pos);

cudaError_t pv_cuda_launch_swiglu(cudaStream_t stream, const pv_swiglu_args *a, const float *gate,
                                  const float *up, float *out);

cudaError_t pv_cuda_launch_add(cudaStream_t stream, const pv_add_args *a, const float *x,
                               const float *y, float *out);

cudaError_t pv_cuda_launch_softmax(cudaStream_t stream, const pv_softmax_args *a, const float *x,
                                   float *out);

/* out[rows] (device) gets each row's argmax. */
cudaError_t pv_cuda_launch_argmax(cudaStream_t stream, const pv_argmax_args *a, const float *x,
                                  int32_t *out);

/* out[rows] (device) gets each row's top-p draw for u[rows] (device). */
cudaError_t pv_cuda_launch_sample_top_p(cudaStream_t stream, const pv_sample_args *a,
                                        const float *logits, const float *u, int32_t *out);

#ifdef __cplusplus
}
#endif
#endif
