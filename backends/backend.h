/* The backend abstraction: one vtable per compute backend (cpu, opencl,
 * cuda), chosen at run time by name. Backends know buffers, queues and
 * kernels; they know nothing of sessions, tiers or eviction.
 *
 * Conventions
 * - Matrices and tensors are row-major and densely packed unless a leading
 *   dimension says otherwise. Offsets and sizes are 64-bit.
 * - Buffer offsets in op arguments are in ELEMENTS of the buffer's dtype for
 *   that argument; offsets in copies are in BYTES.
 * - Index arrays (token sequences, positions, slot tables, slot lists, token
 *   ids) are HOST memory, read during the call: the front end validates them
 *   before any work is enqueued, and the caller may reuse them as soon as the
 *   call returns.
 * - Ordering: see "Queues and ordering" below.
 * - The KV pool: slot s holds one chunk of one layer, K then V:
 *     pool[s][0][t][h][d]  K of token t (0..chunk_tokens-1), kv head h
 *     pool[s][1][t][h][d]  V
 *   slot stride = 2 * chunk_tokens * n_kv_heads * head_dim elements.
 * - Sequence s's token at absolute position p lives in slot
 *   slot_table[s * max_chunks + p / chunk_tokens], row p % chunk_tokens.
 *
 * Every call returns a pv_status; on failure pv_last_error() names the
 * argument, the value and the limit at fault. Nothing here exits or aborts.
 */
#ifndef PENSIEVE_BACKEND_H
#define PENSIEVE_BACKEND_H

#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PV_BACKEND_API_VERSION 17 /* 17: add_rmsnorm_group, add_rmsnorm_swiglu, attention_qmatmul; 16: pv_device_info.max_alloc_bytes; 15: qmatmul's PV_ACT16 (a kernel parameter more in pv_kernel_tuning); 14: qmatmul's PV_GEMM (pv_kernel_tuning.max_gemm); 13: graph replays; 12: sample_batch into a device buffer and with a logit bias, embed_gather of device ids; 11: timing markers; 10: slot_transfer, sample_batch, copy counts; 9: graphs; 8: launch counts, fused add_rmsnorm, rope_kv_write, qmatmul_swiglu; 7: kernel tuning; 6: qmatmul_group; 5: weights_write, activation_bits; 4: buffer_advise_streamed; 3: weight types, qmatmul; 2: event_query */

typedef enum pv_dtype {
    PV_F32 = 0,
    PV_F16 = 1
} pv_dtype;

size_t pv_dtype_size(pv_dtype dtype);
const char *pv_dtype_name(pv_dtype dtype);

/* Weight storage types: the model's tensors stay in their GGUF (ggml) block
 * format on the device, with ggml's type ids. A row of n elements is n /
 * block_elems blocks; a block is, little-endian, with f16 scales:
 *   F32   1 x f32                   F16 1 x f16      BF16 1 x bf16
 *   Q8_0  32 elems, 34 bytes: f16 d, int8 q[32];          x[j] = d * q[j]
 *   Q4_0  32 elems, 18 bytes: f16 d, uint8 qs[16];        x[j] = d * ((qs[j] & 15) - 8),
 *                                                         x[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  32 elems, 20 bytes: f16 d, f16 m, uint8 qs[16]; x[j] = d * (qs[j] & 15) + m,
 *                                                         x[j + 16] = d * (qs[j] >> 4) + m
 * PV_W_F32 and PV_W_F16 equal PV_F32 and PV_F16. */
typedef enum pv_wtype {
    PV_W_F32 = 0,
    PV_W_F16 = 1,
    PV_W_Q4_0 = 2,
    PV_W_Q4_1 = 3,
    PV_W_Q8_0 = 8,
    PV_W_BF16 = 30
} pv_wtype;

/* "F32", "Q4_1", ...; "unknown" for an id not listed above. */
const char *pv_wtype_name(pv_wtype type);
/* Elements and bytes of one block of `type`; 0 (and nothing written) for an
 * unknown type. */
int pv_wtype_block(pv_wtype type, uint32_t *block_elems, uint32_t *block_bytes);

typedef enum pv_mem_kind {
    PV_MEM_DEVICE = 0, /* device memory (the DEVICE tier's pool lives here) */
    PV_MEM_HOST = 1    /* host memory, pinned where the backend can; host_ptr is valid */
} pv_mem_kind;

/* Operations a backend may support; pv_backend_supports() asks. */
typedef enum pv_op {
    PV_OP_GEMM = 0,      /* C = alpha * op(A) op(B) + beta * C */
    PV_OP_ATTENTION,     /* causal multi-token attention over the paged KV pool */
    PV_OP_KV_WRITE,      /* write new K/V rows into their slots */
    PV_OP_SLOT_GATHER,   /* slots -> contiguous staging buffer (swap-out) */
    PV_OP_SLOT_SCATTER,  /* contiguous staging buffer -> slots (swap-in) */
    PV_OP_EMBED_GATHER,  /* embedding rows by token id */
    PV_OP_RMSNORM,
    PV_OP_ROPE,
    PV_OP_SWIGLU,
    PV_OP_ADD,
    PV_OP_SOFTMAX,
    PV_OP_ARGMAX,
    PV_OP_SAMPLE_TOP_P,
    PV_OP_QMATMUL,       /* y = x W^T with W in a weight type (pv_wtype) */
    /* Fused ops: each gives what its unfused sequence gives, in fewer
     * launches (a decode step on a GPU is bound by the host's launches). */
    PV_OP_ADD_RMSNORM,   /* residual add, then the next RMSNorm */
    PV_OP_ROPE_KV_WRITE, /* RoPE on q and k, and the K/V write */
    PV_OP_QMATMUL_SWIGLU, /* silu(x Wg^T) * (x Wu^T) */
    PV_OP_SLOT_TRANSFER, /* slots of one pool -> slots of another, on the copy queue */
    PV_OP_SAMPLE_BATCH,  /* a step's rows, greedy or top-p each, in one call */
    PV_OP_COUNT
} pv_op;

const char *pv_op_name(pv_op op);

typedef struct pv_device_info {
    char name[128];
    char vendor[128];
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes; /* the largest one buffer may be (OpenCL's
                               * CL_DEVICE_MAX_MEM_ALLOC_SIZE); global_mem_bytes
                               * where the backend sets no smaller limit */
    uint32_t compute_units;
    int has_f16; /* f16 arithmetic (GEMM) is available */
    /* qmatmul of the block types rounds x to this many bits per block of 32
     * (pv_qmatmul_args), 0 when it multiplies x in f32; set once the backend
     * is open, as it may depend on the CPU or environment */
    int activation_bits;
} pv_device_info;

typedef struct pv_backend pv_backend;
typedef struct pv_buffer pv_buffer;
typedef struct pv_event pv_event;
typedef struct pv_marker pv_marker;
typedef struct pv_kernel_tuning pv_kernel_tuning; /* backends/kernel-tuning.h */

struct pv_buffer {
    pv_backend *backend;
    pv_mem_kind kind;
    uint64_t bytes;
    void *host_ptr; /* host-visible memory, or NULL for device-only buffers */
    void *handle;   /* backend object: cl_mem, CUDA device pointer, ... */
};

struct pv_event {
    pv_backend *backend;
    void *handle;
};

/* A timing marker (pv_marker_init): the device's time when the compute
 * queue reached its latest record. */
struct pv_marker {
    pv_backend *backend;
    void *handle;  /* backend object: cudaEvent_t, cl_event, the CPU's time */
    int recorded;  /* pv_marker_record has succeeded at least once */
};

/* ---- Queues and ordering ---------------------------------------------------
 * A backend has two in-order queues (CUDA streams, OpenCL command queues).
 * Work on one queue runs in the order enqueued; the two queues run
 * independently of each other, and only events order them.
 *
 *   COMPUTE: every op but slot_transfer (gemm, attention, kv_write,
 *            slot_gather/scatter, embed_gather, rmsnorm, rope, swiglu, add,
 *            softmax, argmax, sample_top_p, sample_batch, qmatmul and the
 *            fused ops), pv_buffer_write, pv_buffer_read,
 *            pv_copy_async(PV_QUEUE_COMPUTE, ...) and pv_marker_record.
 *   COPY:    pv_copy_async(PV_QUEUE_COPY, ...) and pv_slot_transfer: swap
 *            traffic between the host pool and the device pool,
 *            overlapping compute.
 *
 * - Ops are asynchronous: they return once enqueued (argmax, sample_top_p
 *   and sample_batch into host out, which hand back host results, return
 *   when their rows are ready; they wait for earlier compute work, never
 *   for the copy queue).
 * - pv_buffer_write / pv_buffer_read are blocking and ordered on COMPUTE:
 *   they take effect after all compute work enqueued before them and return
 *   when their bytes have moved. They never wait for the COPY queue, so
 *   reading one step's logits does not wait for swap traffic in flight.
 *   Reading what a COPY-queue copy wrote therefore needs its event first:
 *   pv_event_wait(done), or pv_queue_wait(be, PV_QUEUE_COMPUTE, done) before
 *   the read. Writing a buffer that a COPY-queue copy still reads or writes
 *   is likewise the caller's to order with that copy's event.
 * - Crossing queues: pv_copy_async(q, ..., wait, &done) runs after `wait`
 *   and signals `done`; pv_event_record(q) marks everything enqueued on q so
 *   far; pv_queue_wait(q, ev) holds later work on q until ev, without
 *   blocking the host. Swap-out: slot_gather (COMPUTE), record, copy on COPY
 *   waiting for that event. Swap-in: copy on COPY, then
 *   pv_queue_wait(COMPUTE, done) before the slot_scatter or the layer's
 *   attention that needs it. pv_slot_transfer is the one op on COPY: it
 *   runs after `wait` and everything enqueued on COPY before it, and its
 *   `done` completes when every slot has landed; a transfer out of a pool
 *   that compute writes takes an event recorded on COMPUTE after those
 *   writes as its `wait`, and compute that reads what a transfer wrote
 *   waits for its `done` (pv_queue_wait). Nothing on COMPUTE waits for a
 *   transfer it was not told to wait for.
 * - pv_event_query tells without blocking whether an event has completed;
 *   pv_event_wait blocks the host until it has. pv_backend_finish waits for
 *   both queues.
 * - Host memory (PV_MEM_HOST) is touched through host_ptr only once the
 *   copies using it have completed (their events).
 * - pv_buffer_free does not wait: the memory is released once the work
 *   already enqueued on either queue is done with it, and neither queue is
 *   drained or made to wait for the other.
 * - A backend allocates its pinned staging (host index arrays of queued
 *   ops) once, at init; ops never allocate pinned memory, which would
 *   synchronise the device mid-pipeline.
 * - A backend serves one host thread at a time. */
typedef enum pv_queue {
    PV_QUEUE_COMPUTE = 0, /* every op, buffer reads and writes; in order */
    PV_QUEUE_COPY = 1     /* swap traffic, overlapping compute; in order */
} pv_queue;

/* ---- op arguments ------------------------------------------------------ */

typedef struct pv_gemm_args {
    pv_dtype dtype; /* of A, B and C; accumulation is in f32 */
    int trans_a, trans_b;
    int64_t m, n, k; /* C is m x n, op(A) m x k, op(B) k x n */
    float alpha, beta;
    const pv_buffer *a; uint64_t a_off; int64_t lda;
    const pv_buffer *b; uint64_t b_off; int64_t ldb;
    pv_buffer *c;       uint64_t c_off; int64_t ldc;
} pv_gemm_args;

/* Attention for T query tokens. Query token i belongs to sequence
 * token_seq[i], sits at absolute position token_pos[i] and attends causally
 * to that sequence's positions 0..token_pos[i] (their K/V must already be in
 * the pool). Queries may be in any order and at non-contiguous positions:
 * decode, prefill and recovery are all this one op. Softmax is online: no
 * T x context matrix exists anywhere. */
typedef struct pv_attention_args {
    pv_dtype kv_dtype;
    int32_t n_tokens;
    int32_t n_heads, n_kv_heads, head_dim; /* n_heads % n_kv_heads == 0 */
    int32_t chunk_tokens;
    float scale; /* usually 1/sqrt(head_dim) */
    const pv_buffer *q; uint64_t q_off; /* [T][n_heads][head_dim] f32 */
    const pv_buffer *kv_pool;           /* [n_slots][2][chunk_tokens][n_kv_heads][head_dim] */
    int64_t n_slots;
    const int32_t *token_seq;  /* [T] host */
    const int32_t *token_pos;  /* [T] host */
    const int32_t *slot_table; /* [n_seqs][max_chunks] host; -1 = no slot */
    int32_t n_seqs, max_chunks;
    pv_buffer *out; uint64_t out_off;   /* [T][n_heads][head_dim] f32 */
} pv_attention_args;

/* Write the K and V rows of T new tokens into the pool at the slots given by
 * (token_seq, token_pos, slot_table), converting f32 to kv_dtype. */
typedef struct pv_kv_write_args {
    pv_dtype kv_dtype;
    int32_t n_tokens, n_kv_heads, head_dim, chunk_tokens;
    const pv_buffer *k; uint64_t k_off; /* [T][n_kv_heads][head_dim] f32 */
    const pv_buffer *v; uint64_t v_off; /* [T][n_kv_heads][head_dim] f32 */
    pv_buffer *kv_pool;
    int64_t n_slots;
    const int32_t *token_seq;  /* [T] host */
    const int32_t *token_pos;  /* [T] host */
    const int32_t *slot_table; /* [n_seqs][max_chunks] host */
    int32_t n_seqs, max_chunks;
} pv_kv_write_args;

/* Gather whole slots into a contiguous staging buffer (staging[i] = slot
 * slots[i]), or scatter them back (slot slots[i] = staging[i]), in one
 * launch for all n_slots_moved slots. slot_elems = elements per slot. */
typedef struct pv_slot_copy_args {
    pv_dtype dtype;
    int64_t slot_elems;
    pv_buffer *pool;      int64_t n_slots;
    pv_buffer *staging;   uint64_t staging_off; /* elements */
    const int32_t *slots; int32_t n_slots_moved; /* host */
} pv_slot_copy_args;

/* Whole slots from one pool to another, bit for bit, in one call whatever
 * their number: slot dst_slots[i] of dst gets slot src_slots[i] of src, for
 * i < n. Swap-in moves a layer's chunks HOST -> DEVICE, swap-out DEVICE ->
 * HOST; any two distinct buffers of the backend are allowed. A slot is
 * slot_elems elements of dtype, a whole number of 4-byte words; slot s of a
 * pool starts at byte s * slot_elems * dtype size. dst_slots holds no slot
 * twice (two writes of one slot would race). Runs on the COPY queue
 * ("Queues and ordering"). How (docs/swap.md): the CPU copies slot by slot;
 * CUDA runs one kernel that reads or writes the pinned host pool through
 * its device address (no staging, no host memcpy); OpenCL runs the same
 * kernel over both buffers on a device that shares the host's memory, and
 * one copy command per slot elsewhere. */
typedef struct pv_slot_transfer_args {
    pv_dtype dtype;
    int64_t slot_elems;
    pv_buffer *dst;       int64_t dst_n_slots;
    const pv_buffer *src; int64_t src_n_slots;
    const int32_t *dst_slots; /* [n] host */
    const int32_t *src_slots; /* [n] host */
    int32_t n;
} pv_slot_transfer_args;

/* out[i][:] = table[ids[i]][:] as f32; the table ([n_rows][dim], written by
 * pv_weights_write) is in any weight type the backend supports for this op
 * (pv_backend_supports_weights); dim is a multiple of the type's block, and
 * table_off (in elements) too.
 * Device ids: a negative ids[i] = -(j + 1) takes row i's id from element
 * ids_dev_off + j of ids_dev (0 <= j < n_ids_dev), read on the device when
 * the op runs: the token a pv_sample_batch into out_dev enqueued before it
 * on COMPUTE picked, with no host read between the two steps. The host
 * cannot check such an id: one outside [0, n_rows) writes row i of out as
 * zeros (nothing outside the table is read). ids_dev may not overlap out.
 * Legal while a graph is recorded, as every queued op. */
typedef struct pv_embed_gather_args {
    pv_wtype table_type;
    int64_t n_rows, dim;
    const pv_buffer *table; uint64_t table_off;
    const int32_t *ids; int32_t n_ids; /* host: a row id, or -(j + 1) for device id j */
    pv_buffer *out; uint64_t out_off;
    const pv_buffer *ids_dev; uint64_t ids_dev_off; /* int32 elements, or NULL: every id is a host id */
    int64_t n_ids_dev;                             /* device ids from ids_dev_off (0 without ids_dev) */
} pv_embed_gather_args;

/* y[T][n_out] = x[T][n_in] W^T: the model's linear layers, with the weight
 * matrix W[n_out][n_in] of weight type w_type written by pv_weights_write at
 * element offset w_off (n_in and w_off are multiples of the block; n_out and
 * n_in as written). Accumulation is in f32 over the dequantised weights;
 * decode-sized T reads each weight byte once per call. For the block types
 * (Q8_0, Q4_0, Q4_1) a backend may multiply by x rounded per block of 32 to
 * pv_device_info.activation_bits bits, for integer products: 16 on the CPU
 * (steps of max |x| / 32512; backends/cpu/cpu-qmatmul.h), about 1e-5
 * relative error; OpenCL and CUDA the same way at T <= 16 when their
 * kernel tuning says PV_ACT16=1 (kernel tuning, below). (llama.cpp rounds
 * to 8 bits, which on SmolLM2 changes 5% of the teacher-forced top-1
 * tokens against f32.) */
typedef struct pv_qmatmul_args {
    pv_wtype w_type;
    int64_t n_tokens, n_in, n_out;
    const pv_buffer *w; uint64_t w_off; /* [n_out][n_in] in w_type, elements */
    const pv_buffer *x; uint64_t x_off; /* [n_tokens][n_in] f32 */
    pv_buffer *y; uint64_t y_off;       /* [n_tokens][n_out] f32 */
} pv_qmatmul_args;

/* Most products in one pv_qmatmul_group call. */
#define PV_QMATMUL_GROUP_MAX 8

/* out[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * weight[:]; in place allowed. */
typedef struct pv_rmsnorm_args {
    int64_t rows, dim;
    float eps;
    const pv_buffer *x; uint64_t x_off;
    const pv_buffer *weight; uint64_t weight_off;
    pv_buffer *out; uint64_t out_off;
} pv_rmsnorm_args;

/* Rotary embedding in place on x[T][n_heads][head_dim] at positions pos[T].
 * Pair i (i < head_dim/2) rotates by pos * base^(-2i/head_dim); the pair is
 * (2i, 2i+1) ("normal", GGUF Llama) or (i, i + head_dim/2) with neox. */
typedef struct pv_rope_args {
    int32_t n_tokens, n_heads, head_dim;
    float base;
    int neox;
    pv_buffer *x; uint64_t x_off;
    const int32_t *pos; /* [T] host */
} pv_rope_args;

/* out[i] = silu(gate[i]) * up[i] over n elements. */
typedef struct pv_swiglu_args {
    int64_t n;
    const pv_buffer *gate; uint64_t gate_off;
    const pv_buffer *up; uint64_t up_off;
    pv_buffer *out; uint64_t out_off;
} pv_swiglu_args;

/* out[i] = a[i] + b[i] over n elements (the residual add); in place allowed. */
typedef struct pv_add_args {
    int64_t n;
    const pv_buffer *a; uint64_t a_off;
    const pv_buffer *b; uint64_t b_off;
    pv_buffer *out; uint64_t out_off;
} pv_add_args;

/* x[r][:] += y[r][:], then out[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) *
 * weight[:]: a residual add and the RMSNorm after it, the same values as
 * pv_add then pv_rmsnorm. x, y, weight and out do not overlap. */
typedef struct pv_add_rmsnorm_args {
    int64_t rows, dim;
    float eps;
    pv_buffer *x; uint64_t x_off;                 /* [rows][dim], updated */
    const pv_buffer *y; uint64_t y_off;           /* [rows][dim] */
    const pv_buffer *weight; uint64_t weight_off; /* [dim] */
    pv_buffer *out; uint64_t out_off;             /* [rows][dim] */
} pv_add_rmsnorm_args;

/* pv_rope on q and on k at positions token_pos, then pv_kv_write of the
 * rotated k and of v, in one op: q is rotated in place; the rotated k goes
 * to the pool only (k itself is read, not changed). Checked as those ops
 * are; q overlaps none of k, v and the pool, nor k or v the pool. */
typedef struct pv_rope_kv_write_args {
    pv_dtype kv_dtype;
    int32_t n_tokens, n_heads, n_kv_heads, head_dim, chunk_tokens;
    float base;
    int neox;
    pv_buffer *q; uint64_t q_off;       /* [T][n_heads][head_dim] f32 */
    const pv_buffer *k; uint64_t k_off; /* [T][n_kv_heads][head_dim] f32 */
    const pv_buffer *v; uint64_t v_off; /* [T][n_kv_heads][head_dim] f32 */
    pv_buffer *kv_pool;
    int64_t n_slots;
    const int32_t *token_seq;  /* [T] host */
    const int32_t *token_pos;  /* [T] host: the rotation's positions too */
    const int32_t *slot_table; /* [n_seqs][max_chunks] host */
    int32_t n_seqs, max_chunks;
} pv_rope_kv_write_args;

/* y[T][n_out] = silu(x Wg^T) * (x Wu^T): a SwiGLU feed-forward's gate and
 * up products and their product, the values pv_qmatmul_group and pv_swiglu
 * give. Wg and Wu are [n_out][n_in] of the one weight type w_type, each as
 * pv_qmatmul takes W (the op is supported for the types
 * pv_backend_supports_weights(be, PV_OP_QMATMUL_SWIGLU, t) names). A
 * backend that runs the two products apart (the CPU; larger batches on the
 * GPUs) leaves x Wu^T in `up`, whose contents are otherwise unspecified
 * after the call. y, up, x and the weights do not overlap. */
typedef struct pv_qmatmul_swiglu_args {
    pv_wtype w_type;
    int64_t n_tokens, n_in, n_out;
    const pv_buffer *w_gate; uint64_t w_gate_off; /* [n_out][n_in] in w_type, elements */
    const pv_buffer *w_up; uint64_t w_up_off;     /* [n_out][n_in] in w_type, elements */
    const pv_buffer *x; uint64_t x_off;           /* [n_tokens][n_in] f32 */
    pv_buffer *y; uint64_t y_off;                 /* [n_tokens][n_out] f32 */
    pv_buffer *up; uint64_t up_off;               /* [n_tokens][n_out] f32 scratch */
} pv_qmatmul_swiglu_args;

/* Row-wise softmax of x * scale over rows x cols; in place allowed. */
typedef struct pv_softmax_args {
    int64_t rows, cols;
    float scale;
    const pv_buffer *x; uint64_t x_off;
    pv_buffer *out; uint64_t out_off;
} pv_softmax_args;

/* Row-wise argmax (lowest index on ties) into host out[rows]. Blocking. */
typedef struct pv_argmax_args {
    int64_t rows, cols;
    const pv_buffer *x; uint64_t x_off;
    int32_t *out; /* host */
} pv_argmax_args;

/* Top-p (nucleus) sampling per row, blocking, into host out[rows]:
 * p = softmax(logits / temperature); keep the smallest set of highest-p
 * tokens whose mass reaches top_p (ties at the threshold kept); renormalise;
 * pick the first token, in index order, whose cumulative kept mass exceeds
 * u[r] * kept mass. u[r] in [0,1) comes from the caller's RNG, so every
 * backend draws the same token for the same u. */
typedef struct pv_sample_args {
    int64_t rows, cols;
    float temperature, top_p;
    const pv_buffer *logits; uint64_t logits_off;
    const float *u; /* [rows] host */
    int32_t *out;   /* [rows] host */
} pv_sample_args;

/* One token for each of a step's rows in one call. Row r is greedy when
 * temperature[r] <= 0: the lowest index of its maximum, as pv_argmax; else
 * it is drawn as pv_sample_top_p draws a row with temperature[r],
 * top_p[r] and u[r]. So every backend gives the token pv_argmax and
 * pv_sample_top_p give, and the CPU backend the very tokens they give on
 * it. top_p[r] and u[r] of a greedy row are not read.
 *
 * Where the tokens go: exactly one of out and out_dev.
 *   out      host [rows], blocking like sample_top_p: returns when the rows
 *            are ready. Not while a graph is recorded.
 *   out_dev  int32 elements out_dev_off .. out_dev_off + rows - 1 of a
 *            buffer of the backend, not overlapping the logits:
 *            asynchronous like every op (enqueued on COMPUTE, returns at
 *            once; legal while a graph is recorded). Later compute reads
 *            the tokens in order (pv_embed_gather's device ids), the host
 *            through pv_copy_async into a PV_MEM_HOST buffer and its
 *            event, or pv_buffer_read. The tokens are the ones out would
 *            get (the CPU backend computes them in the call).
 *
 * Logit bias (OpenAI's logit_bias), optional: row r's entries are
 * k = bias_start[r] .. bias_start[r + 1] - 1, each a token bias_token[k] in
 * [0, cols), at most once a row, and a finite bias_value[k]. The row is
 * sampled from its biased logits (the logits buffer is not changed):
 *   biased[c] = logits[r][c] + bias_value[k]  (f32 addition) for c = bias_token[k]
 *   biased[c] = -infinity                     when bias_value[k] <= PV_LOGIT_BIAS_BAN
 *   biased[c] = logits[r][c]                  for the tokens without an entry.
 * A greedy row takes the lowest index of the maximum of biased; a sampled
 * row p = softmax(biased / temperature[r]) and top-p as above, where a
 * token is kept only with p > 0. So a banned token (-100 and below, what
 * OpenAI's API calls a ban) is never picked, greedy or sampled, and +100
 * all but forces one. A row whose every token is banned is refused, and so
 * are more than PV_LOGIT_BIAS_MAX entries in all. bias_start NULL (or all
 * its entries 0) is no bias: the same tokens as without. The lists are
 * host arrays, read during the call as every index array. A backend may
 * keep the biased rows in device scratch of its own (rows with entries x
 * cols floats), grown at the first call that needs more: while a graph is
 * recorded such growth is refused (PV_ERR_UNSUPPORTED, see "graphs"). */
#define PV_LOGIT_BIAS_BAN (-100.0f)
#define PV_LOGIT_BIAS_MAX (1 << 20)
typedef struct pv_sample_batch_args {
    int64_t rows, cols;
    const pv_buffer *logits; uint64_t logits_off; /* [rows][cols] f32 */
    const float *temperature; /* [rows] host */
    const float *top_p;       /* [rows] host: in (0, 1] for a sampled row */
    const float *u;           /* [rows] host: in [0, 1) for a sampled row */
    int32_t *out;             /* [rows] host, blocking; or NULL with out_dev */
    pv_buffer *out_dev; uint64_t out_dev_off; /* [rows] int32 on the device, asynchronous; or NULL with out */
    const int32_t *bias_start; /* [rows + 1] host, bias_start[0] = 0, non-decreasing; or NULL: no bias */
    const int32_t *bias_token; /* [bias_start[rows]] host: token ids in [0, cols), none twice in a row */
    const float *bias_value;   /* [bias_start[rows]] host: finite; <= PV_LOGIT_BIAS_BAN bans the token */
} pv_sample_batch_args;

/* ---- the vtable ---------------------------------------------------------- */

typedef struct pv_backend_ops {
    int api_version; /* PV_BACKEND_API_VERSION */
    const char *name;

    pv_status (*device_count)(int *count);
    pv_status (*device_info)(int device, pv_device_info *info);
    /* Fills be->impl; be->ops, be->device are set by the front end. */
    pv_status (*init)(pv_backend *be);
    void (*free)(pv_backend *be);
    int (*supports)(const pv_backend *be, pv_op op, pv_dtype dtype);
    /* For the ops that read weights (PV_OP_QMATMUL, PV_OP_EMBED_GATHER):
     * whether weight type t is supported. */
    int (*supports_weights)(const pv_backend *be, pv_op op, pv_wtype t);

    pv_status (*buffer_alloc)(pv_backend *be, pv_mem_kind kind, uint64_t bytes, pv_buffer *buf);
    void (*buffer_free)(pv_backend *be, pv_buffer *buf);
    /* Optional (NULL: nothing to do): buf will be read front to back over
     * and over, as weights are; called before its first write. */
    pv_status (*buffer_advise_streamed)(pv_backend *be, pv_buffer *buf);
    /* Blocking transfers between host memory and a buffer (bytes), ordered
     * on the compute queue only. */
    pv_status (*buffer_write)(pv_backend *be, pv_buffer *dst, uint64_t dst_off, const void *src, uint64_t bytes);
    /* Optional (NULL: buffer_write of the GGUF bytes): a weight matrix in the
     * layout this backend's qmatmul and embed_gather read, the same bytes. */
    pv_status (*weights_write)(pv_backend *be, pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows,
                               int64_t n_cols, const void *src);
    pv_status (*buffer_read)(pv_backend *be, const pv_buffer *src, uint64_t src_off, void *dst, uint64_t bytes);
    /* Asynchronous buffer -> buffer copy (host<->device, device<->device) on
     * queue q, after `wait` (may be NULL); *done (if non-NULL) gets an event
     * that completes with the copy. */
    pv_status (*copy_async)(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off,
                            const pv_buffer *src, uint64_t src_off, uint64_t bytes,
                            pv_event *wait, pv_event **done);
    /* An event completing when all work enqueued so far on q is done. */
    pv_status (*event_record)(pv_backend *be, pv_queue q, pv_event **out);
    /* Make later work on q wait for ev, without blocking the host. */
    pv_status (*queue_wait)(pv_backend *be, pv_queue q, pv_event *ev);
    pv_status (*event_wait)(pv_backend *be, pv_event *ev);
    /* *done = 1 when ev has completed, else 0; never blocks. */
    pv_status (*event_query)(pv_backend *be, pv_event *ev, int *done);
    void (*event_free)(pv_backend *be, pv_event *ev);
    pv_status (*finish)(pv_backend *be);

    pv_status (*gemm)(pv_backend *be, const pv_gemm_args *a);
    pv_status (*attention)(pv_backend *be, const pv_attention_args *a);
    pv_status (*kv_write)(pv_backend *be, const pv_kv_write_args *a);
    pv_status (*slot_gather)(pv_backend *be, const pv_slot_copy_args *a);
    pv_status (*slot_scatter)(pv_backend *be, const pv_slot_copy_args *a);
    pv_status (*embed_gather)(pv_backend *be, const pv_embed_gather_args *a);
    pv_status (*rmsnorm)(pv_backend *be, const pv_rmsnorm_args *a);
    pv_status (*rope)(pv_backend *be, const pv_rope_args *a);
    pv_status (*swiglu)(pv_backend *be, const pv_swiglu_args *a);
    pv_status (*add)(pv_backend *be, const pv_add_args *a);
    pv_status (*softmax)(pv_backend *be, const pv_softmax_args *a);
    pv_status (*argmax)(pv_backend *be, const pv_argmax_args *a);
    pv_status (*sample_top_p)(pv_backend *be, const pv_sample_args *a);
    pv_status (*qmatmul)(pv_backend *be, const pv_qmatmul_args *a);
    /* Optional (NULL: qmatmul on each in turn): products sharing x, as one
     * dispatch (pv_qmatmul_group). */
    pv_status (*qmatmul_group)(pv_backend *be, const pv_qmatmul_args *products, int n);
    pv_status (*add_rmsnorm)(pv_backend *be, const pv_add_rmsnorm_args *a);
    pv_status (*rope_kv_write)(pv_backend *be, const pv_rope_kv_write_args *a);
    pv_status (*qmatmul_swiglu)(pv_backend *be, const pv_qmatmul_swiglu_args *a);
    /* Optional (NULL: add_rmsnorm, then qmatmul_group or qmatmul_swiglu):
     * pv_add_rmsnorm_group and pv_add_rmsnorm_swiglu, checked. */
    pv_status (*add_rmsnorm_group)(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                                   int n);
    pv_status (*add_rmsnorm_swiglu)(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                    const pv_qmatmul_swiglu_args *swiglu);
    /* Optional (NULL: attention, then qmatmul): pv_attention_qmatmul,
     * checked. */
    pv_status (*attention_qmatmul)(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product);
    /* On the copy queue after `wait` (may be NULL); *done (if non-NULL)
     * gets an event that completes with the last slot. n may be 0. */
    pv_status (*slot_transfer)(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done);
    pv_status (*sample_batch)(pv_backend *be, const pv_sample_batch_args *a);
    /* Optional (NULL: no graphs): pv_backend_graph_begin / _end. */
    pv_status (*graph_begin)(pv_backend *be, uint64_t key);
    pv_status (*graph_end)(pv_backend *be, int run, int *ran);
    /* Timing markers (pv_marker_*): marker_init fills m->handle;
     * marker_record takes the compute queue's time without waiting, also
     * while a graph is recorded; marker_elapsed waits for both markers'
     * latest records (never called while a graph is recorded on a
     * backend with graphs: it returns PV_ERR_UNSUPPORTED there). */
    pv_status (*marker_init)(pv_backend *be, pv_marker *m);
    void (*marker_free)(pv_backend *be, pv_marker *m);
    pv_status (*marker_record)(pv_backend *be, pv_marker *m);
    pv_status (*marker_elapsed)(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds);
    /* 1: the ops run the portable kernels (kernels/) with the parameters
     * of be->tuning, which init may give its own defaults. */
    int tunable_kernels;
} pv_backend_ops;

struct pv_backend {
    const pv_backend_ops *ops;
    int device;
    pv_device_info info;
    void *impl;
    pv_kernel_tuning *tuning; /* owned by the front end */
    /* Launches since the backend opened (pv_backend_launches): the backend
     * adds one per device work item it enqueues. */
    uint64_t launches;
    /* Copy commands since the backend opened (pv_backend_copies): the
     * backend adds one per copy it enqueues. */
    uint64_t copies;
    /* Graphs run since the backend opened (pv_backend_graph_runs), and of
     * those, the ones run again without being recorded
     * (pv_backend_graph_replays; the backend adds one per replay). */
    uint64_t graph_runs, graph_replays;
};

/* ---- front end: validation, then dispatch ---------------------------------
 * These check every argument (shapes, buffer sizes, index ranges, dtype
 * support) before calling the backend, so a backend sees only valid input. */

/* ---- where backends come from ----------------------------------------------
 * "cpu" is built into libpensieve. "opencl" and "cuda" are modules, shared
 * objects named pensieve-opencl.so and pensieve-cuda.so (installed in
 * $(libdir)/pensieve), opened with dlopen the first time the backend is
 * asked for (pv_backend_init, pv_backend_device_count, pv_backend_names)
 * and kept open; a run that never asks for them maps neither their
 * runtimes nor the modules. A module is looked for, first found wins, in:
 *   1. each directory of $PV_BACKEND_PATH (colon-separated), in order;
 *   2. the build tree's module directory (<builddir>/backends/.libs), only
 *      while the libpensieve running is the build tree's (its .libs, or a
 *      program there linked with the static library), so that tests and
 *      uninstalled programs find the modules built with them;
 *   3. the install directory, $(libdir)/pensieve.
 * $PV_BACKEND_PATH_ONLY set to anything but "" or "0" skips 2 and 3. A
 * module found but not loadable (dlopen fails, or it is built for another
 * PV_BACKEND_API_VERSION) is not looked for further. A failed search or
 * load is tried again at the next request; a loaded module stays. */

/* The backends that can load here, NULL-terminated, in the order cpu,
 * opencl, cuda: "cpu" always, and each module that is found and loads (a
 * listed backend may still have no device: pv_backend_init then fails with
 * PV_ERR_NO_DEVICE). Listing loads every module found, mapping its
 * runtime. The array is this thread's, valid until its next call. */
const char *const *pv_backend_names(void);

/* Open backend `name` ("cpu", "opencl", "cuda") on device index `device`.
 * Fails with PV_ERR_NOT_FOUND for an unknown name or a module found in
 * none of the directories above (the message lists them),
 * PV_ERR_BACKEND for a module that does not load (its path and dlerror()'s
 * text), PV_ERR_UNSUPPORTED for a module of another API version; each
 * message ends with the backends that can load here. A backend that loads
 * but has no device fails with PV_ERR_NO_DEVICE. */
pv_status pv_backend_init(pv_backend **out, const char *name, int device);
void pv_backend_free(pv_backend *be);

pv_status pv_backend_device_count(const char *name, int *count);
int pv_backend_supports(const pv_backend *be, pv_op op, pv_dtype dtype);
/* Whether op (PV_OP_QMATMUL, PV_OP_QMATMUL_SWIGLU or PV_OP_EMBED_GATHER)
 * reads weights of type t. */
int pv_backend_supports_weights(const pv_backend *be, pv_op op, pv_wtype t);

pv_status pv_buffer_init(pv_buffer **out, pv_backend *be, pv_mem_kind kind, uint64_t bytes);
void pv_buffer_free(pv_buffer *buf);
/* Tells the backend that buf will be streamed front to back over and over
 * (weights), before anything is written to it: the CPU backend then backs a
 * large buffer with 2 MiB pages. Advice only: PV_OK whether or not it acts. */
pv_status pv_buffer_advise_streamed(pv_buffer *buf);
pv_status pv_buffer_write(pv_buffer *dst, uint64_t dst_off, const void *src, uint64_t bytes);
/* Writes the weight matrix src ([n_rows][n_cols] of type t, GGUF block
 * layout, n_rows * n_cols / block elements * block bytes) at byte dst_off of
 * dst, in the layout the backend's qmatmul and embed_gather read: the same
 * number of bytes, possibly reordered (the CPU backend interleaves rows of the
 * block types for its integer kernels). The ops then take the matrix whole:
 * w_off or table_off at its first element, its n_rows and n_cols. */
pv_status pv_weights_write(pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows, int64_t n_cols,
                           const void *src);
pv_status pv_buffer_read(const pv_buffer *src, uint64_t src_off, void *dst, uint64_t bytes);
pv_status pv_copy_async(pv_queue q, pv_buffer *dst, uint64_t dst_off, const pv_buffer *src,
                        uint64_t src_off, uint64_t bytes, pv_event *wait, pv_event **done);
pv_status pv_event_record(pv_backend *be, pv_queue q, pv_event **out);
pv_status pv_queue_wait(pv_backend *be, pv_queue q, pv_event *ev);
pv_status pv_event_wait(pv_event *ev);
pv_status pv_event_query(pv_event *ev, int *done);
void pv_event_free(pv_event *ev);
pv_status pv_backend_finish(pv_backend *be);

pv_status pv_gemm(pv_backend *be, const pv_gemm_args *a);
pv_status pv_attention(pv_backend *be, const pv_attention_args *a);
pv_status pv_kv_write(pv_backend *be, const pv_kv_write_args *a);
pv_status pv_slot_gather(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_slot_scatter(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_embed_gather(pv_backend *be, const pv_embed_gather_args *a);
pv_status pv_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a);
pv_status pv_rope(pv_backend *be, const pv_rope_args *a);
pv_status pv_swiglu(pv_backend *be, const pv_swiglu_args *a);
pv_status pv_add(pv_backend *be, const pv_add_args *a);
pv_status pv_softmax(pv_backend *be, const pv_softmax_args *a);
pv_status pv_argmax(pv_backend *be, const pv_argmax_args *a);
pv_status pv_sample_top_p(pv_backend *be, const pv_sample_args *a);
pv_status pv_qmatmul(pv_backend *be, const pv_qmatmul_args *a);
/* n (1 to PV_QMATMUL_GROUP_MAX) products that read the same x (buffer,
 * x_off, n_tokens and n_in; each its own weights and y) as one dispatch: a
 * backend may prepare x once and run all their rows in one parallel pass
 * (the CPU rounds x once and splits the rows of all of them over its
 * threads together, where a layer's Q, K and V projections alone would each
 * be too small to keep the cores busy). Each y gets the same values as
 * pv_qmatmul would give it. Each product is checked as pv_qmatmul checks
 * it, and no y may overlap another. */
pv_status pv_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n);

pv_status pv_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a);
pv_status pv_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a);
pv_status pv_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a);
/* A RMSNorm fused with what consumes it: pv_add_rmsnorm(norm), then
 * pv_qmatmul_group(products, n) or pv_qmatmul_swiglu(swiglu) reading the
 * norm's out as x (each product's x is norm->out at norm->out_off, its
 * n_tokens norm->rows and its n_in norm->dim). The same values as the two
 * ops one after the other, each checked as that op checks it. A backend
 * whose decode-sized products take x rounded to 16 bits (PV_ACT16) rounds
 * the norm in the norm's kernel: one launch fewer. */
pv_status pv_add_rmsnorm_group(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                               int n);
pv_status pv_add_rmsnorm_swiglu(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                const pv_qmatmul_swiglu_args *swiglu);
/* pv_attention(att), then pv_qmatmul(product) of its output (a layer's
 * attention output projection: product->x is att->out at att->out_off,
 * its n_tokens att->n_tokens and its n_in n_heads x head_dim). The same
 * values as the two ops one after the other, each checked as that op
 * checks it. Where the product takes x rounded (PV_ACT16) and the
 * attention runs split (split-K), its combining kernel rounds the output
 * as it writes it: one launch fewer. */
pv_status pv_attention_qmatmul(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product);
/* See pv_slot_transfer_args: on the copy queue, after `wait` (may be NULL);
 * *done (if non-NULL) completes when every slot has landed. Checked: both
 * pools hold their n_slots slots, every slot number is in range, dst_slots
 * repeats none, src and dst are distinct buffers of be. n = 0 moves
 * nothing and still orders `done` after `wait`. */
pv_status pv_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done);
/* See pv_sample_batch_args; a sampled row's top_p must be in (0, 1] and
 * its u in [0, 1), as pv_sample_top_p checks them; out_dev's extent and
 * every bias entry are checked as documented there. */
pv_status pv_sample_batch(pv_backend *be, const pv_sample_batch_args *a);

/* Kernel launches be has enqueued since it opened (0 for NULL): what a
 * step costs the host, where each launch is a driver call of a few
 * microseconds. A launch is one device work item: on OpenCL each
 * clEnqueueNDRangeKernel and each CLBlast call; on CUDA each kernel launch
 * and each cuBLAS call; the CPU backend counts one per op call. Copies,
 * index-array uploads and waits are not launches. A pv_slot_transfer
 * that runs as a kernel (CUDA; OpenCL on a device sharing host memory) is
 * one launch; on the CPU it is one launch, as every op is. */
uint64_t pv_backend_launches(const pv_backend *be);
/* Copy commands be has enqueued since it opened (0 for NULL): each
 * pv_copy_async is one, and a pv_slot_transfer that a backend carries out
 * as copy commands (OpenCL on a device with memory of its own) one per
 * slot. Blocking reads and writes, index-array uploads and kernels are
 * not. With launches, what the swap path costs the host: O(layers) calls
 * for a swap-in, whatever its number of chunks. */
uint64_t pv_backend_copies(const pv_backend *be);

/* ---- graphs -------------------------------------------------------------------
 * A decode step is hundreds of small launches, each a driver call of a few
 * microseconds: on a GPU the host, not the device, sets the pace. Between
 * pv_backend_graph_begin and pv_backend_graph_end, the ops enqueued on
 * COMPUTE are recorded instead of launched (a CUDA stream capture);
 * pv_backend_graph_end then runs the recording as one unit, kept
 * instantiated under `key` (the caller's name for the step's shape), so
 * the device runs the kernels back to back. A later step of the same key
 * is not recorded again when its ops would launch exactly what the kept
 * graph launches with only their host arrays (token ids, positions, slot
 * tables, sampling parameters) differing: the ops then launch nothing,
 * the backend checks each against the recording and writes the arrays
 * into fixed buffers the graph reads, and pv_backend_graph_end copies
 * those in one transfer and runs the graph again (a replay: no recording,
 * no launch per op). A step that differs in anything else (a launch
 * parameter, a buffer, a size) does not run (*ran = 0, the caller runs
 * the ops) and the key's next step is recorded again. What runs and in
 * which order is exactly what the ops would have run.
 * Between the two calls only ops on COMPUTE, pv_copy_async on COMPUTE,
 * pv_queue_wait and pv_marker_record belong (a step that waits for an
 * event runs once: its graph is not kept, since such events are the
 * step's own), and pv_buffer_free, whose memory goes at
 * pv_backend_graph_end behind the step's work: pv_slot_transfer (COPY),
 * blocking reads and writes,
 * pv_backend_finish, pv_event_wait, pv_event_record on COMPUTE,
 * pv_marker_elapsed, argmax, sample_top_p and sample_batch into host out
 * return PV_ERR_UNSUPPORTED (sample_batch into out_dev belongs), and so
 * may an op that would have to wait for the host (its staging full) or
 * grow its device scratch (a qmatmul or attention larger than any before,
 * sample_batch with more biased rows x cols than before).
 * pv_backend_graph_end always ends the recording, and runs it when `run`
 * (the caller's ops all succeeded);
 * *ran = 1 when the work ran (is enqueued), 0 when nothing ran (run = 0,
 * or something could not be recorded): the caller then enqueues the same
 * work again without a graph, or reports its op's failure. Backends without graphs:
 * pv_backend_graphs is 0 and _begin returns PV_ERR_UNSUPPORTED. */
int pv_backend_graphs(const pv_backend *be);
pv_status pv_backend_graph_begin(pv_backend *be, uint64_t key);
pv_status pv_backend_graph_end(pv_backend *be, int run, int *ran);
/* Graphs that ran (*ran = 1) since be opened (0 for NULL), and of those
 * the replays (run again without recording). */
uint64_t pv_backend_graph_runs(const pv_backend *be);
uint64_t pv_backend_graph_replays(const pv_backend *be);

/* ---- timing markers -----------------------------------------------------------
 * The host's clock around a step that is waited for says how long the step
 * took, not how long the device worked on it. A marker takes the device's
 * own time when the COMPUTE queue reaches it; the time between two markers
 * is the device's time between them, the kernels' and any gap where the
 * device waited for the host's next launch:
 *   CUDA    a timing event recorded on the compute stream (cudaEventRecord;
 *           cudaEventElapsedTime, about 0.5 us resolution)
 *   OpenCL  a marker command's CL_PROFILING_COMMAND_END (the compute queue
 *           is created with profiling on)
 *   CPU     the host's monotonic clock when pv_marker_record is called:
 *           every op has run when its call returns, so that is when the
 *           queue reaches the marker, and the time between two markers is
 *           the host's time between the two calls.
 * pv_marker_record enqueues and returns: it never waits for the device.
 * It may be called between pv_backend_graph_begin and _end: the marker
 * then takes its time when the graph runs (CUDA: an event record node of
 * the graph), and keeps its earlier record when the graph does not run
 * (*ran = 0; the caller, who enqueues the work again, records it again;
 * a marker whose only record was in such a graph reads as an error).
 * A marker may be recorded again and again; its latest record counts.
 * pv_marker_elapsed blocks the host until the queue has reached both
 * markers' latest records, then *seconds = time(end) - time(start): zero
 * or more when end was recorded after start, negative when before. Not
 * between graph_begin and graph_end (PV_ERR_UNSUPPORTED on a backend with
 * graphs). NULL arguments, a marker never recorded, and a marker or
 * backend that is not the other's are PV_ERR_INVALID_ARG. A marker is
 * freed with pv_marker_free, without waiting; graphs kept by then are
 * recorded anew at their next step (a kept graph would record the freed
 * marker again). */
pv_status pv_marker_init(pv_marker **out, pv_backend *be);
void pv_marker_free(pv_marker *m);
pv_status pv_marker_record(pv_backend *be, pv_marker *m);
pv_status pv_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds);

/* Head dims the attention kernels are built for. */
int pv_attention_head_dim_supported(int32_t head_dim);

/* ---- kernel tuning -----------------------------------------------------------
 * The OpenCL and CUDA backends run the portable kernels (kernels/), built
 * with parameters that change their speed: the work-group size PV_WG, the
 * elements per work-item PV_ITEM_ELEMS and attention's split-K count
 * PV_SPLITS (0: a rule that grows it with the context), which leave the
 * results as they are (up to f32 summation order), and qmatmul's PV_GEMM,
 * the precision of the matrix products of batches over 16 tokens: 0 f32,
 * 1 f16, 2 bf16, 3 TF32 (the last three on tensor cores, their inputs
 * rounded: errors of some 1e-3 of the largest output; a backend runs the
 * modes its device has, CUDA all four from compute capability 8.0, OpenCL
 * f32 only), and qmatmul's PV_ACT16: 1 has the decode-sized products
 * (T <= 16) of the block types take x rounded to 16 bits per block as the
 * CPU backend does (pv_qmatmul_args), for integer dot products (some 1e-5
 * of the largest output), 0 f32 x. A set of them, written "PV_WG=16
 * PV_SPLITS=4", applies to the calls of one shape bucket:
 *   attention.hd<64|128|256>.g<1|2|4|8>.<decode|prefill>.<short|long>
 *     head_dim up to 64, 128 or 256; query heads per KV head rounded up to
 *     a power of two (g8: 8 or more); decode: at most 8 query tokens;
 *     long: the longest context (last position + 1) 1024 or more;
 *   gather (kv_write, rope_kv_write, slot_gather, slot_scatter), qmatmul
 *   (qmatmul, qmatmul_swiglu, embed_gather), recompute (the element-wise
 *   ops, add_rmsnorm): one bucket each.
 * Buckets without a set use the backend's defaults. The CPU backend has no
 * such kernels: the calls below that need them return PV_ERR_UNSUPPORTED.
 * pensieve-tune searches the candidates, checking each against the CPU
 * backend, and keeps the fastest in the device's profile. */

/* Whether be runs the portable kernels. */
int pv_backend_kernels_tunable(const pv_backend *be);
/* The bucket name of an attention call. */
pv_status pv_attention_bucket(const pv_attention_args *a, char *buf, size_t size);
/* *count (if non-NULL) = the candidate sets of bucket (those within be's
 * work-group limit and GEMM modes; be may be NULL: all of them); with buf,
 * candidate `index` (0 .. count - 1) as text. */
pv_status pv_kernel_candidate(const pv_backend *be, const char *bucket, int index, char *buf, size_t size,
                              int *count);
/* Calls of bucket use these parameters from now on (the ones not named
 * keep their current values); NULL or "" returns the bucket to the
 * defaults. A value outside the candidates is PV_ERR_INVALID_ARG; a PV_WG
 * above the device's limit or a PV_GEMM mode it does not run,
 * PV_ERR_UNSUPPORTED. */
pv_status pv_backend_kernel_set(pv_backend *be, const char *bucket, const char *params);
/* The set calls of bucket use now, every tuned parameter named. */
pv_status pv_backend_kernel_get(const pv_backend *be, const char *bucket, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif
