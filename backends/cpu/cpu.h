/* The CPU backend's internals, shared between its source files and the
 * kernel benchmark. Not installed: the public entry is pv_cpu_backend_ops,
 * reached through the front end (backends/backend.h). */
#ifndef PV_BACKENDS_CPU_H
#define PV_BACKENDS_CPU_H

#include "backends/backend.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* OpenMP directives that vanish (without -Wunknown-pragmas noise) when the
 * compiler has no OpenMP: the code is then plain serial C. */
#ifdef _OPENMP
#define PV_CPU_OMP(directive) _Pragma(directive)
static inline int pv_cpu_max_threads(void) { return omp_get_max_threads(); }
static inline int pv_cpu_thread_id(void) { return omp_get_thread_num(); }
#else
#define PV_CPU_OMP(directive)
static inline int pv_cpu_max_threads(void) { return 1; }
static inline int pv_cpu_thread_id(void) { return 0; }
#endif

extern const pv_backend_ops pv_cpu_backend_ops;

/* Element-wise ops on fewer elements than this run on the calling thread: a
 * decode step's norms, rotations and adds (a few thousand elements) take
 * less time than waking the team and meeting at its barrier. */
#define PV_CPU_PARALLEL_MIN 32768

/* C = alpha * A B^T + beta * C for 2..PV_CPU_SMALL_M rows of A against
 * weights B stored [n][k] (decode-sized linear layers; cpu-gemm-small.c).
 * Returns 0, doing nothing, for any other shape: the caller uses BLAS then. */
#define PV_CPU_SMALL_M 32
int pv_cpu_gemm_small(const pv_gemm_args *a, const float *A, const float *B, float *C);

/* Paged KV: attention over the slot pool and writes of new K/V rows
 * (cpu-attention.c). */
pv_status pv_cpu_attention(pv_backend *be, const pv_attention_args *a);
pv_status pv_cpu_kv_write(pv_backend *be, const pv_kv_write_args *a);

/* The same attention over K/V laid out contiguously per sequence:
 *   k[s][p][h][d], v[s][p][h][d] for sequence s, position p < max_tokens.
 * It shares the paged kernel's inner loop, so the kernel benchmark can
 * measure what paging alone costs. Arguments are trusted (benchmark only). */
typedef struct pv_cpu_contiguous_attention_args {
    pv_dtype kv_dtype;
    int32_t n_tokens, n_heads, n_kv_heads, head_dim;
    float scale;
    const float *q;           /* [T][n_heads][head_dim] */
    const void *k, *v;        /* [n_seqs][max_tokens][n_kv_heads][head_dim] */
    int64_t max_tokens;
    const int32_t *token_seq; /* [T] */
    const int32_t *token_pos; /* [T] */
    float *out;               /* [T][n_heads][head_dim] */
} pv_cpu_contiguous_attention_args;

pv_status pv_cpu_attention_contiguous(const pv_cpu_contiguous_attention_args *a);

/* Split-K: the most context splits pv_cpu_attention gives a work item for
 * these arguments on the threads OpenMP would use (1: none), for the
 * benchmark to print; and the paged attention with every item cut into
 * n_splits >= 1 splits, so tests reach the split path (and splits holding
 * no rows) whatever the thread count. Arguments are trusted (checked by the
 * front end for pv_attention). */
pv_status pv_cpu_attention_split_count(const pv_attention_args *a, int32_t *n_splits);
pv_status pv_cpu_attention_forced_splits(const pv_attention_args *a, int32_t n_splits);

/* Slot moves (cpu-gather.c). */
pv_status pv_cpu_slot_gather(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_cpu_slot_scatter(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_cpu_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a);

/* Linear layers over weights in their GGUF type, and embedding rows of such
 * tables (cpu-qmatmul.c). */
pv_status pv_cpu_qmatmul(pv_backend *be, const pv_qmatmul_args *a);
pv_status pv_cpu_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n);
pv_status pv_cpu_embed_gather(pv_backend *be, const pv_embed_gather_args *a);
/* pv_weights_write: the block types interleaved where the integer kernels run. */
pv_status pv_cpu_weights_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows,
                               int64_t n_cols, const void *src);
int pv_cpu_qmatmul_supports(pv_wtype t);
/* The bits qmatmul rounds the block types' activations to here (0: none). */
int pv_cpu_qmatmul_activation_bits(const pv_backend *be);

/* The backend's scratch buffer of at least `floats` floats, grown as
 * needed and kept until the backend is freed (cpu-backend.c). */
pv_status pv_cpu_scratch(pv_backend *be, uint64_t floats, float **out);
/* Whether this backend runs the AVX2 kernels: the CPU has them and the
 * environment did not ask for the portable ones (PV_CPU_KERNELS=portable);
 * decided when the backend opens. */
int pv_cpu_avx2_kernels(const pv_backend *be);
/* Whether the CPU runs the AVX2 + FMA + F16C kernels and they are built
 * (cpu-qmatmul.c). */
int pv_cpu_avx2_available(void);

/* The rest of a layer and the sampling helpers (cpu-recompute.c). */
pv_status pv_cpu_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a);
pv_status pv_cpu_rope(pv_backend *be, const pv_rope_args *a);
pv_status pv_cpu_swiglu(pv_backend *be, const pv_swiglu_args *a);
pv_status pv_cpu_add(pv_backend *be, const pv_add_args *a);
pv_status pv_cpu_softmax(pv_backend *be, const pv_softmax_args *a);
pv_status pv_cpu_argmax(pv_backend *be, const pv_argmax_args *a);
pv_status pv_cpu_sample_top_p(pv_backend *be, const pv_sample_args *a);
pv_status pv_cpu_sample_batch(pv_backend *be, const pv_sample_batch_args *a);
/* dst = src rotated (pv_rope) for n_tokens tokens of n_heads heads at
 * positions pos; dst may be src. */
void pv_cpu_rope_rows(const float *src, float *dst, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                      const int32_t *pos, float base, int neox);

/* The fused ops (backend.h), each written as the unfused ops it stands for,
 * so that it gives their values exactly: add then rmsnorm
 * (cpu-recompute.c); rope then kv_write (cpu-attention.c); the two
 * products as a group, then swiglu (cpu-qmatmul.c). */
pv_status pv_cpu_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a);
pv_status pv_cpu_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a);
pv_status pv_cpu_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a);

/* Element pointer into a CPU buffer: byte base + offset in elements. */
static inline void *pv_cpu_elem_ptr(const pv_buffer *buf, uint64_t off, size_t elem_size)
{
    return (char *)buf->host_ptr + off * elem_size;
}

#endif
