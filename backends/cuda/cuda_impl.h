/* The CUDA backend's state, shared by its host code (cuda_backend.c) and
 * its graphs and timing markers (cuda_graph.c). Not installed. */
#ifndef PV_BACKENDS_CUDA_IMPL_H
#define PV_BACKENDS_CUDA_IMPL_H

#include "backends/backend.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/graph-trace.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

/* Bytes of the compute stream's staging ring (pinned host and device
 * each): a 256-sequence x 4096-chunk slot table is 4 MiB, so several such
 * ops fit in flight. */
#define STAGING_BYTES ((size_t)16 << 20)
/* The copy stream's: slot transfers of up to 256K slots each (two int32
 * lists). */
#define COPY_STAGING_BYTES ((size_t)4 << 20)
/* Ops in flight that hold a staging region; the host blocks only past this
 * or a full ring. */
#define STAGING_RECORDS 256
/* Arrays are packed at this alignment, so every device copy starts aligned
 * for any load width. */
#define STAGING_ALIGN 16

/* Instantiated graphs kept, each under its caller's key; the least
 * recently run makes room. A graph's host arrays live in its own arena,
 * pinned host and device memory at fixed addresses that its kernels read:
 * a step that matches the recording's trace (backends/graph-trace.h)
 * writes its arrays into the host side, and one copy before the launch
 * brings them to the device. */
#define GRAPH_EXECS 8
#define GRAPH_ARENA_MIN ((size_t)64 << 10)
typedef struct graph_slot {
    int used; /* key is set */
    uint64_t key;
    cudaGraphExec_t exec;
    uint64_t last_run; /* of the graph clock, at its last run or its taking */
    pv_graph_trace trace;
    char *arena_host, *arena_dev;
    size_t arena_bytes;
    cudaEvent_t arena_copied; /* after the last copy out of arena_host */
    int copy_pending;         /* arena_copied has been recorded */
    /* The step's recording runs once and is not kept to run again: it
     * waits for an event from outside the graph (a swap-in's layer, an
     * event the step owns and frees after it), or a marker it records was
     * freed during the step. */
    int run_once;
} graph_slot;

/* One op's staging region [start, end), busy until `done` completes;
 * in_arena: the arrays went to a graph's arena (no ring region). */
typedef struct staged {
    size_t start, end;
    cudaEvent_t done;
    int in_arena;
} staged;

/* One stream's staging ring: `bytes` of pinned host and of device memory,
 * its busy regions a FIFO (`first`, `count`) ending at `head`. graph: the
 * backend's graph step where the stream can be recorded into a graph (the
 * compute stream), NULL where it never is (the copy stream). */
typedef struct staging_ring {
    cudaStream_t stream;
    size_t bytes;
    char *host, *dev;
    staged records[STAGING_RECORDS];
    int first, count;
    size_t head;
    graph_slot *const *graph;
} staging_ring;

/* The scratch buffers: widened weight tiles of qmatmul, its activations
 * rounded to 16-bit floats (PV_GEMM f16, bf16) and to 16-bit integers
 * (PV_ACT16), split-K partials of attention, the biased rows of
 * sample_batch. */
#define SCRATCH_QMATMUL 0
#define SCRATCH_ATTENTION 1
#define SCRATCH_BIAS 2
#define SCRATCH_QMATMUL_X 3
#define SCRATCH_QMATMUL_XQ 4
#define SCRATCH_COUNT 5

/* A freed pinned host buffer, released once both streams pass `after`. */
typedef struct host_release {
    void *host;
    cudaEvent_t after[2];
    struct host_release *next;
} host_release;

typedef struct cuda_impl {
    int device;
    cudaStream_t stream[2]; /* indexed by pv_queue */
    cudaStream_t alloc;     /* stream-ordered allocations only; synchronised at once */
    cudaStream_t release;   /* stream-ordered frees, behind release_after */
    cudaEvent_t release_after[2];
    int pooled; /* the device has the stream-ordered allocator */
    cublasHandle_t blas;
    /* cuBLAS's workspace, ours: without one, a GEMM recorded into a graph
     * allocates its own inside the graph (cuBLAS 12.2 on), and each kept
     * graph holds such memory that nothing here counts. */
    void *blas_workspace;
    staging_ring ring[2]; /* indexed by pv_queue */
    host_release *host_releases;
    /* Device scratch of the ops that need some (SCRATCH_*), grown as
     * needed and kept. */
    void *scratch[SCRATCH_COUNT];
    size_t scratch_bytes[SCRATCH_COUNT];
    int attention_splits; /* PV_ATTENTION_SPLITS (backends/attention-split.h); 0: the default */
    int attention_group;  /* query heads per attention work-group at most (the same header) */
    pv_cuda_kernels kernels;
    /* Between graph_begin and graph_end: the step's slot, and whether the
     * stream is being captured (else the step is checked against the
     * slot's recording, launching nothing, and replays it). */
    graph_slot *graph;
    int capturing;
    /* Buffers freed during a graph step, released at graph_end: behind the
     * step's work, which a recording or a replay enqueues only then. */
    pv_buffer *graph_frees;
    size_t n_graph_frees, cap_graph_frees;
    uint64_t graph_clock;
    uint64_t *graph_replays; /* pv_backend.graph_replays */
    graph_slot graphs[GRAPH_EXECS];
} cuda_impl;


/* One host array to upload, and where its device copy ends up. */
typedef struct upload {
    const void *src;
    size_t bytes;
    void *dev;
} upload;

/* CUDA_TRY(call, context format, args...): return the failure's status. */
#define CUDA_TRY(call, ...)                                                                        \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess)                                                                   \
            return pv_cuda_fail(err_, #call, __VA_ARGS__);                                         \
    } while (0)

static inline cuda_impl *impl_of(pv_backend *be)
{
    return (cuda_impl *)be->impl;
}

/* The runtime's current device is per host thread: make it this backend's
 * before touching any of its objects. */
static inline pv_status enter(cuda_impl *cu)
{
    CUDA_TRY(cudaSetDevice(cu->device), "device %d", cu->device);
    return PV_OK;
}

/* What may not happen while a graph is recorded or replayed (backend.h,
 * "graphs"). */
static inline pv_status not_capturing(const cuda_impl *cu, const char *what)
{
    if (cu->graph)
        return pv_error(PV_ERR_UNSUPPORTED, "cuda: %s while a graph is being recorded", what);
    return PV_OK;
}

/* A command for the compute stream, described by `item`, in a graph step:
 * goes into the step's trace. Returns 1 when the step is checked against a
 * recording, whose graph makes the command: the caller then enqueues
 * nothing. 0 outside graph steps and while recording. */
static inline int graph_traced(const cuda_impl *cu, pv_trace_kind kind, const void *item, size_t n)
{
    if (!cu->graph)
        return 0;
    pv_graph_trace_item(&cu->graph->trace, kind, item, n);
    return !cu->capturing;
}

/* Device address of element `off` (of elem_size bytes) of a buffer. Host
 * buffers are mapped pinned memory, so their handle is a device address too. */
static inline void *dev_ptr(const pv_buffer *buf, uint64_t off, size_t elem_size)
{
    return (char *)buf->handle + off * elem_size;
}

/* Events and markers: a failure here has nothing left to report to. */
static inline void pv_cuda_event_destroy(pv_backend *be, cudaEvent_t e)
{
    cudaSetDevice(impl_of(be)->device);
    cudaEventDestroy(e);
    (void)cudaGetLastError();
}

/* cuda_backend.c: releases the buffers freed during a graph step */
void pv_cuda_release_graph_frees(cuda_impl *cu);

/* cuda_graph.c */
pv_status pv_cuda_graph_step_error(const graph_slot *g, const char *op);
pv_status pv_cuda_graph_begin(pv_backend *be, uint64_t key);
pv_status pv_cuda_graph_end(pv_backend *be, int run, int *ran);
pv_status pv_cuda_marker_init(pv_backend *be, pv_marker *m);
void pv_cuda_marker_free(pv_backend *be, pv_marker *m);
pv_status pv_cuda_marker_record(pv_backend *be, pv_marker *m);
pv_status pv_cuda_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds);

#endif
