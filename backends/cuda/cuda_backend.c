/* The CUDA backend: device memory and pinned host memory through the CUDA
 * runtime, two streams (compute, copy) ordered only by events as backend.h
 * lays down, GEMM through cuBLAS, and the portable kernels of kernels/
 * built at run time by NVRTC (cuda_nvrtc.c; programs and launchers in
 * cuda_launch.c). The front end (backends/backend.c) has validated every
 * argument; what can still fail here is the runtime, the library, the
 * kernel compiler or the device, and each failure becomes a status naming
 * the call and its error.
 *
 * Host index arrays are only valid during a call, while the kernels that
 * read them run later on their stream. Each op therefore copies its index
 * arrays into a region of a pinned staging ring, allocated once at init
 * (cudaHostAlloc mid-pipeline would synchronise the device), and uploads
 * them on its stream into the same region of a device ring. A region is
 * reused only once the event recorded behind the op that read it has
 * completed; the host waits only when the ring is full. Each stream has a
 * ring of its own (the copy stream's serves pv_slot_transfer), so an op
 * waits at most for its own stream's work, never the other's. In a graph
 * step the compute stream's arrays go instead to the graph's own arena,
 * at the places its recording gave them (cuda_graph.c).
 *
 * The host pool (PV_MEM_HOST) is pinned and mapped: a slot transfer is one
 * kernel on the copy stream that reads or writes it through its device
 * address (zero-copy), with no staging and no host memcpy (docs/swap.md).
 *
 * Freeing never drains the streams: device buffers come from the
 * stream-ordered allocator and are freed on a release stream that waits
 * for events of both streams; pinned host buffers are freed once events
 * recorded on both streams at the free have completed. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/backend.h"
#include "backends/backend-module.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/attention-split.h"
#include "backends/cuda/cuda_impl.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ----------------------------------------------------------------- */

static pv_status blas_fail(cublasStatus_t st, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static pv_status blas_fail(cublasStatus_t st, const char *call, const char *fmt, ...)
{
    char context[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    pv_status code = st == CUBLAS_STATUS_ALLOC_FAILED ? PV_ERR_OUT_OF_MEMORY : PV_ERR_BACKEND;
    return pv_error(code, "cuda: %s (%s) failed: %s (%s)", call, context, cublasGetStatusString(st),
                    cublasGetStatusName(st));
}

#define BLAS_TRY(call, ...)                                                                        \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return blas_fail(st_, #call, __VA_ARGS__);                                             \
    } while (0)

/* ---- devices ---------------------------------------------------------------- */

static pv_status cuda_device_count(int *count)
{
    *count = 0;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        /* No GPU, or no driver (a machine without one answers "insufficient
         * driver"): the normal "not here" case. Any other error is a broken
         * driver or runtime, which must not pass for an absent device. */
        int absent = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
        return pv_error(absent ? PV_ERR_NO_DEVICE : PV_ERR_BACKEND, "cuda: %s: cudaGetDeviceCount failed: %s (%s)",
                        absent ? "no CUDA device" : "the CUDA runtime is broken", cudaGetErrorString(err),
                        cudaGetErrorName(err));
    }
    *count = n;
    return PV_OK;
}

static pv_status cuda_device_info(int device, pv_device_info *info)
{
    struct cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, device), "device %d", device);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    snprintf(info->vendor, sizeof info->vendor, "NVIDIA");
    info->global_mem_bytes = (uint64_t)prop.totalGlobalMem;
    info->max_alloc_bytes = info->global_mem_bytes;
    info->compute_units = (uint32_t)prop.multiProcessorCount;
    /* Half arithmetic arrived with sm_53. */
    info->has_f16 = prop.major > 5 || (prop.major == 5 && prop.minor >= 3);
    return PV_OK;
}

/* ---- backend lifetime --------------------------------------------------------- */

/* *done = 1 once ev has completed. "Not ready" is an answer, not an error:
 * it is cleared so the next launch check is not blamed for it. */
static cudaError_t event_done(cudaEvent_t ev, int *done)
{
    cudaError_t err = cudaEventQuery(ev);
    *done = err == cudaSuccess;
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return cudaSuccess;
    }
    return err;
}

/* Frees the pinned host buffers whose users have finished; with `all`, the
 * caller has synchronised both streams and every one goes. */
static void reap_host_releases(cuda_impl *cu, int all)
{
    host_release **link = &cu->host_releases;
    while (*link) {
        host_release *r = *link;
        int done0 = 1, done1 = 1;
        if (!all && (event_done(r->after[0], &done0) != cudaSuccess ||
                     event_done(r->after[1], &done1) != cudaSuccess))
            done0 = done1 = 0; /* a failing event: keep the memory; teardown frees it */
        if (!(done0 && done1)) {
            link = &r->next;
            continue;
        }
        cudaFreeHost(r->host);
        cudaEventDestroy(r->after[0]);
        cudaEventDestroy(r->after[1]);
        *link = r->next;
        free(r);
    }
}

static void cuda_free(pv_backend *be)
{
    cuda_impl *cu = impl_of(be);
    if (!cu)
        return;
    cudaSetDevice(cu->device);
    if (cu->capturing) {
        cudaGraph_t graph = NULL;
        if (cudaStreamEndCapture(cu->stream[PV_QUEUE_COMPUTE], &graph) == cudaSuccess && graph)
            cudaGraphDestroy(graph);
    }
    /* Nothing may still read the staging memory or use the streams. */
    cudaStream_t all[4] = {cu->stream[0], cu->stream[1], cu->alloc, cu->release};
    for (int q = 0; q < 4; q++)
        if (all[q])
            cudaStreamSynchronize(all[q]);
    for (int i = 0; i < GRAPH_EXECS; i++) {
        graph_slot *g = &cu->graphs[i];
        if (g->exec)
            cudaGraphExecDestroy(g->exec);
        if (g->arena_copied)
            cudaEventDestroy(g->arena_copied);
        if (g->arena_host)
            cudaFreeHost(g->arena_host);
        if (g->arena_dev)
            cudaFree(g->arena_dev);
        pv_graph_trace_free(&g->trace);
    }
    pv_cuda_release_graph_frees(cu); /* a step never ended */
    free(cu->graph_frees);
    reap_host_releases(cu, 1);
    pv_cuda_kernels_free(&cu->kernels);
    for (int q = 0; q < 2; q++) {
        staging_ring *ring = &cu->ring[q];
        for (int i = 0; i < STAGING_RECORDS; i++)
            if (ring->records[i].done)
                cudaEventDestroy(ring->records[i].done);
        if (ring->host)
            cudaFreeHost(ring->host);
        if (ring->dev)
            cudaFree(ring->dev);
        if (cu->release_after[q])
            cudaEventDestroy(cu->release_after[q]);
    }
    for (int i = 0; i < SCRATCH_COUNT; i++)
        if (cu->scratch[i])
            cudaFree(cu->scratch[i]); /* also takes stream-ordered memory */
    if (cu->blas)
        cublasDestroy(cu->blas);
    for (int q = 0; q < 4; q++)
        if (all[q])
            cudaStreamDestroy(all[q]);
    (void)cudaGetLastError();
    free(cu);
    be->impl = NULL;
}

/* What NVRTC compiles for on this device, and the kernel cache: fails
 * early, naming the architectures, on a GPU that NVRTC cannot serve. */
static pv_status init_kernels(cuda_impl *cu, pv_backend *be)
{
    int major = 0, minor = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device), "device %d",
             cu->device);
    CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cu->device), "device %d",
             cu->device);
    /* cuBLAS's tensor-core GEMMs: f16 from Volta, bf16 and TF32 from Ampere */
    be->tuning->max_gemm = major >= 8 ? PV_GEMM_TF32 : major >= 7 ? PV_GEMM_F16 : PV_GEMM_F32;
    return pv_cuda_kernels_init(&cu->kernels, major, minor, be->tuning, &be->launches);
}

/* Streams, events, the staging ring and cuBLAS: everything an op may need,
 * so that no op allocates. */
static pv_status init_resources(cuda_impl *cu)
{
    /* Non-blocking streams: they must not serialise with the legacy default
     * stream that other libraries in the process may use. */
    cudaStream_t *streams[4] = {&cu->stream[0], &cu->stream[1], &cu->alloc, &cu->release};
    static const char *const stream_names[4] = {"compute", "copy", "allocation", "release"};
    /* Each object is stored only once created, so cuda_free() releases
     * exactly what exists. */
    for (int q = 0; q < 4; q++) {
        cudaStream_t stream;
        CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "%s stream", stream_names[q]);
        *streams[q] = stream;
    }
    cudaEvent_t ev;
    for (int q = 0; q < 2; q++) {
        staging_ring *ring = &cu->ring[q];
        ring->stream = cu->stream[q];
        ring->bytes = q == PV_QUEUE_COPY ? COPY_STAGING_BYTES : STAGING_BYTES;
        ring->graph = q == PV_QUEUE_COMPUTE ? &cu->graph : NULL;
        for (int i = 0; i < STAGING_RECORDS; i++) {
            CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "staging event %d", i);
            ring->records[i].done = ev;
        }
        void *mem = NULL;
        CUDA_TRY(cudaHostAlloc(&mem, ring->bytes, cudaHostAllocDefault), "%zu bytes of pinned index staging",
                 ring->bytes);
        ring->host = mem;
        CUDA_TRY(cudaMalloc(&mem, ring->bytes), "%zu bytes of device index staging", ring->bytes);
        ring->dev = mem;
        CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "%s", "release event");
        cu->release_after[q] = ev;
    }
    int pools = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, cu->device), "device %d",
             cu->device);
    cu->pooled = pools != 0;
    cublasHandle_t blas;
    BLAS_TRY(cublasCreate(&blas), "device %d", cu->device);
    cu->blas = blas;
    BLAS_TRY(cublasSetStream(cu->blas, cu->stream[PV_QUEUE_COMPUTE]), "%s", "compute stream");
    return PV_OK;
}

static pv_status cuda_init(pv_backend *be)
{
    cuda_impl *cu = calloc(1, sizeof *cu);
    if (!cu)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot allocate the backend state");
    cu->device = be->device;
    cu->graph_replays = &be->graph_replays;
    be->impl = cu;
    pv_status st = pv_attention_env("cuda", "PV_ATTENTION_SPLITS", PV_ATTENTION_MAX_SPLITS, &cu->attention_splits);
    if (st == PV_OK)
        st = pv_attention_env("cuda", "PV_ATTENTION_GROUP", PV_ATTENTION_GROUP_MAX, &cu->attention_group);
    if (!cu->attention_group)
        cu->attention_group = PV_ATTENTION_GROUP_MAX;
    if (st == PV_OK)
        st = enter(cu);
    if (st == PV_OK)
        st = init_kernels(cu, be);
    if (st == PV_OK)
        st = init_resources(cu);
    if (st != PV_OK)
        cuda_free(be);
    return st;
}

/* Weight-reading ops: every type kernels/qmatmul.cl decodes, on both. */
static int cuda_supports_weights(const pv_backend *be, pv_op op, pv_wtype t)
{
    (void)be;
    /* every type kernels/qmatmul.cl is built for */
    return (op == PV_OP_QMATMUL || op == PV_OP_QMATMUL_SWIGLU || op == PV_OP_EMBED_GATHER) &&
           pv_kernel_builds_value(PV_KERNEL_QMATMUL, PV_KPARAM_WTYPE, (int)t);
}

static int cuda_supports(const pv_backend *be, pv_op op, pv_dtype dtype)
{
    switch (op) {
    case PV_OP_GEMM:
        return dtype == PV_F32 || (dtype == PV_F16 && be->info.has_f16);
    case PV_OP_ATTENTION:
    case PV_OP_KV_WRITE:
    case PV_OP_SLOT_GATHER:
    case PV_OP_SLOT_SCATTER:
    case PV_OP_EMBED_GATHER:
        return dtype == PV_F32 || dtype == PV_F16;
    case PV_OP_RMSNORM:
    case PV_OP_ROPE:
    case PV_OP_SWIGLU:
    case PV_OP_ADD:
    case PV_OP_SOFTMAX:
    case PV_OP_ARGMAX:
    case PV_OP_SAMPLE_TOP_P:
    case PV_OP_SAMPLE_BATCH:
        return dtype == PV_F32;
    case PV_OP_SLOT_TRANSFER:
        return dtype == PV_F32 || dtype == PV_F16;
    case PV_OP_ADD_RMSNORM:
        return dtype == PV_F32;
    case PV_OP_ROPE_KV_WRITE:
        return dtype == PV_F32 || dtype == PV_F16;
    case PV_OP_QMATMUL:        /* asked through supports_weights */
    case PV_OP_QMATMUL_SWIGLU: /* the same */
    case PV_OP_COUNT:
        break;
    }
    return 0;
}

/* ---- buffers -------------------------------------------------------------------- */

/* Device memory valid for every stream at once: from the pool on the
 * allocation stream, synchronised (so neither work stream waits for the
 * other), or from cudaMalloc. Nothing is enqueued on the work streams, so
 * it is also how memory is taken while a graph is recorded. */
static pv_status device_alloc(cuda_impl *cu, uint64_t bytes, const char *what, void **out)
{
    void *dev = NULL;
    if (cu->pooled) {
        CUDA_TRY(cudaMallocAsync(&dev, bytes, cu->alloc), "%" PRIu64 " bytes of %s", bytes, what);
        cudaError_t err = cudaStreamSynchronize(cu->alloc);
        if (err != cudaSuccess) {
            cudaFreeAsync(dev, cu->alloc);
            return pv_cuda_fail(err, "cudaStreamSynchronize", "allocation of %" PRIu64 " bytes of %s", bytes, what);
        }
    } else {
        CUDA_TRY(cudaMalloc(&dev, bytes), "%" PRIu64 " bytes of %s", bytes, what);
    }
    *out = dev;
    return PV_OK;
}

static pv_status cuda_buffer_alloc(pv_backend *be, pv_mem_kind kind, uint64_t bytes, pv_buffer *buf)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    reap_host_releases(cu, 0);
    if (kind == PV_MEM_HOST) {
        /* Pinned so copies are truly asynchronous; mapped so kernels may
         * also read it (at bus speed) like any buffer. */
        void *host = NULL;
        CUDA_TRY(cudaHostAlloc(&host, bytes, cudaHostAllocPortable | cudaHostAllocMapped),
                 "%" PRIu64 " bytes of pinned host memory", bytes);
        void *dev = NULL;
        cudaError_t err = cudaHostGetDevicePointer(&dev, host, 0);
        if (err != cudaSuccess) {
            cudaFreeHost(host);
            return pv_cuda_fail(err, "cudaHostGetDevicePointer", "%" PRIu64 " bytes", bytes);
        }
        buf->host_ptr = host;
        buf->handle = dev;
        return PV_OK;
    }
    void *dev = NULL;
    PV_TRY(device_alloc(cu, bytes, "device memory", &dev));
    buf->host_ptr = NULL;
    buf->handle = dev;
    return PV_OK;
}

/* Marks, in ev[0] and ev[1], all work enqueued so far on the compute and
 * copy streams. */
static cudaError_t record_both(cuda_impl *cu, cudaEvent_t ev[2])
{
    cudaError_t err = cudaSuccess;
    for (int q = 0; q < 2 && err == cudaSuccess; q++)
        err = cudaEventRecord(ev[q], cu->stream[q]);
    return err;
}

/* Device memory: a stream-ordered free on the release stream behind both
 * streams' work so far. Pinned host memory: queued until events recorded
 * now on both streams complete. Neither blocks the host or makes one work
 * stream wait for the other. Failures fall back to synchronising both
 * streams, so nothing in flight can touch freed memory. */
static void release_buffer(cuda_impl *cu, pv_buffer *buf)
{
    reap_host_releases(cu, 0);
    cudaError_t err = cudaErrorNotSupported;
    if (buf->kind == PV_MEM_HOST) {
        host_release *r = calloc(1, sizeof *r);
        if (r) {
            r->host = buf->host_ptr;
            err = cudaEventCreateWithFlags(&r->after[0], cudaEventDisableTiming);
            if (err == cudaSuccess)
                err = cudaEventCreateWithFlags(&r->after[1], cudaEventDisableTiming);
            if (err == cudaSuccess)
                err = record_both(cu, r->after);
            if (err == cudaSuccess) {
                r->next = cu->host_releases;
                cu->host_releases = r;
            } else {
                if (r->after[0])
                    cudaEventDestroy(r->after[0]);
                if (r->after[1])
                    cudaEventDestroy(r->after[1]);
                free(r);
            }
        }
        if (err != cudaSuccess) {
            cudaStreamSynchronize(cu->stream[PV_QUEUE_COPY]);
            cudaStreamSynchronize(cu->stream[PV_QUEUE_COMPUTE]);
            cudaFreeHost(buf->host_ptr);
        }
    } else {
        if (cu->pooled) {
            err = record_both(cu, cu->release_after);
            for (int q = 0; q < 2 && err == cudaSuccess; q++)
                err = cudaStreamWaitEvent(cu->release, cu->release_after[q], 0);
            if (err == cudaSuccess)
                err = cudaFreeAsync(buf->handle, cu->release);
        }
        if (err != cudaSuccess) { /* cudaFree also takes stream-ordered memory */
            cudaStreamSynchronize(cu->stream[PV_QUEUE_COPY]);
            cudaStreamSynchronize(cu->stream[PV_QUEUE_COMPUTE]);
            cudaFree(buf->handle);
        }
    }
    (void)cudaGetLastError();
}

void pv_cuda_release_graph_frees(cuda_impl *cu)
{
    for (size_t i = 0; i < cu->n_graph_frees; i++)
        release_buffer(cu, &cu->graph_frees[i]);
    cu->n_graph_frees = 0;
}

/* During a graph step the memory goes at graph_end (cuda_impl), since
 * events recorded now would precede the step's work: a replay enqueues it
 * all at graph_end, and a recording's events would be nodes of its graph.
 * (Where the list cannot grow, out of host memory, it goes at once.) */
static void release_after_step(cuda_impl *cu, pv_buffer *buf)
{
    if (cu->graph && cu->n_graph_frees == cu->cap_graph_frees) {
        const size_t cap = cu->cap_graph_frees ? 2 * cu->cap_graph_frees : 8;
        pv_buffer *grown = realloc(cu->graph_frees, cap * sizeof *grown);
        if (grown) {
            cu->graph_frees = grown;
            cu->cap_graph_frees = cap;
        }
    }
    if (cu->graph && cu->n_graph_frees < cu->cap_graph_frees)
        cu->graph_frees[cu->n_graph_frees++] = *buf;
    else
        release_buffer(cu, buf);
}

static void cuda_buffer_free(pv_backend *be, pv_buffer *buf)
{
    cuda_impl *cu = impl_of(be);
    cudaSetDevice(cu->device);
    release_after_step(cu, buf);
    buf->host_ptr = NULL;
    buf->handle = NULL;
}

/* Blocking transfers on the compute stream: they follow every earlier op
 * and never wait for the copy stream (backend.h). */
static pv_status cuda_buffer_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, const void *src,
                                   uint64_t bytes)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "a blocking write"));
    cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
    CUDA_TRY(cudaMemcpyAsync(dev_ptr(dst, dst_off, 1), src, bytes, cudaMemcpyDefault, s),
             "dst offset %" PRIu64 ", %" PRIu64 " bytes", dst_off, bytes);
    CUDA_TRY(cudaStreamSynchronize(s), "write of %" PRIu64 " bytes", bytes);
    return PV_OK;
}

static pv_status cuda_buffer_read(pv_backend *be, const pv_buffer *src, uint64_t src_off, void *dst,
                                  uint64_t bytes)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "a blocking read"));
    cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
    CUDA_TRY(cudaMemcpyAsync(dst, dev_ptr(src, src_off, 1), bytes, cudaMemcpyDefault, s),
             "src offset %" PRIu64 ", %" PRIu64 " bytes", src_off, bytes);
    CUDA_TRY(cudaStreamSynchronize(s), "read of %" PRIu64 " bytes", bytes);
    return PV_OK;
}

/* ---- events and copies ------------------------------------------------------------ */

static pv_status event_new(pv_backend *be, pv_event **out)
{
    pv_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot allocate an event record");
    cudaEvent_t e;
    cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        free(ev);
        return pv_cuda_fail(err, "cudaEventCreateWithFlags", "%s", "event");
    }
    ev->backend = be;
    ev->handle = e;
    *out = ev;
    return PV_OK;
}

static void cuda_event_free(pv_backend *be, pv_event *ev)
{
    pv_cuda_event_destroy(be, (cudaEvent_t)ev->handle);
    free(ev);
}

static pv_status cuda_event_record(pv_backend *be, pv_queue q, pv_event **out)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    if (q == PV_QUEUE_COMPUTE)
        PV_TRY(not_capturing(cu, "an event on the compute stream"));
    pv_event *ev = NULL;
    PV_TRY(event_new(be, &ev));
    cudaError_t err = cudaEventRecord((cudaEvent_t)ev->handle, cu->stream[q]);
    if (err != cudaSuccess) {
        cuda_event_free(be, ev);
        return pv_cuda_fail(err, "cudaEventRecord", "%s stream", q == PV_QUEUE_COPY ? "copy" : "compute");
    }
    *out = ev;
    return PV_OK;
}

static pv_status cuda_queue_wait(pv_backend *be, pv_queue q, pv_event *ev)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    /* Recorded into a graph, a wait for an event from outside it is an
     * external wait node: it waits, when the graph runs, for the event's
     * last record before then. */
    const unsigned int flags = cu->graph && q == PV_QUEUE_COMPUTE ? cudaEventWaitExternal : 0;
    if (flags)
        cu->graph->run_once = 1;
    const uint64_t item[2] = {(uint64_t)(uintptr_t)ev->handle, flags};
    if (q == PV_QUEUE_COMPUTE && graph_traced(cu, PV_TRACE_EVENT, item, sizeof item))
        return PV_OK;
    CUDA_TRY(cudaStreamWaitEvent(cu->stream[q], (cudaEvent_t)ev->handle, flags), "%s stream",
             q == PV_QUEUE_COPY ? "copy" : "compute");
    return PV_OK;
}

static pv_status cuda_event_wait(pv_backend *be, pv_event *ev)
{
    PV_TRY(enter(impl_of(be)));
    PV_TRY(not_capturing(impl_of(be), "a wait for an event"));
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev->handle), "%s", "event");
    return PV_OK;
}

static pv_status cuda_event_query(pv_backend *be, pv_event *ev, int *done)
{
    PV_TRY(enter(impl_of(be)));
    CUDA_TRY(event_done((cudaEvent_t)ev->handle, done), "%s", "event");
    return PV_OK;
}

static pv_status cuda_copy_async(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off,
                                 const pv_buffer *src, uint64_t src_off, uint64_t bytes,
                                 pv_event *wait, pv_event **done)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    cudaStream_t s = cu->stream[q];
    if (done && q == PV_QUEUE_COMPUTE)
        PV_TRY(not_capturing(cu, "an event on the compute stream"));
    be->copies++;
    const uint64_t item[4] = {(uint64_t)(uintptr_t)dev_ptr(dst, dst_off, 1),
                              (uint64_t)(uintptr_t)dev_ptr(src, src_off, 1), bytes,
                              (uint64_t)(uintptr_t)(wait ? wait->handle : NULL)};
    if (q == PV_QUEUE_COMPUTE && graph_traced(cu, PV_TRACE_COPY, item, sizeof item))
        return PV_OK;
    /* an event from outside a recording: external, as in cuda_queue_wait */
    const unsigned int wait_flags = cu->graph && q == PV_QUEUE_COMPUTE ? cudaEventWaitExternal : 0;
    if (wait)
        CUDA_TRY(cudaStreamWaitEvent(s, (cudaEvent_t)wait->handle, wait_flags), "%s", "wait event");
    /* Unified addressing tells the runtime which side each pointer is on. */
    CUDA_TRY(cudaMemcpyAsync(dev_ptr(dst, dst_off, 1), dev_ptr(src, src_off, 1), bytes,
                             cudaMemcpyDefault, s),
             "dst offset %" PRIu64 ", src offset %" PRIu64 ", %" PRIu64 " bytes", dst_off, src_off,
             bytes);
    if (done)
        PV_TRY(cuda_event_record(be, q, done));
    return PV_OK;
}

static pv_status cuda_finish(pv_backend *be)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "finish"));
    CUDA_TRY(cudaStreamSynchronize(cu->stream[PV_QUEUE_COPY]), "%s", "copy stream");
    CUDA_TRY(cudaStreamSynchronize(cu->stream[PV_QUEUE_COMPUTE]), "%s", "compute stream");
    reap_host_releases(cu, 0);
    return PV_OK;
}

/* ---- index arrays: the staging ring ---------------------------------------------------- */

static size_t align_up(size_t n)
{
    return (n + STAGING_ALIGN - 1) / STAGING_ALIGN * STAGING_ALIGN;
}

/* Forgets the oldest region once its op is done; blocks only with `wait`. */
static pv_status retire_oldest(staging_ring *ring, int wait, int *retired)
{
    staged *r = &ring->records[ring->first];
    int done = 0;
    if (wait)
        CUDA_TRY(cudaEventSynchronize(r->done), "%s", "staging event");
    else
        CUDA_TRY(event_done(r->done, &done), "%s", "staging event");
    *retired = wait || done;
    if (*retired) {
        ring->first = (ring->first + 1) % STAGING_RECORDS;
        ring->count--;
    }
    return PV_OK;
}

/* The offset of a free region of `bytes` (aligned) in the ring. Regions are
 * handed out in order and retired in order, so the busy part is one span
 * from the oldest region's start to `head`, possibly wrapped past the end.
 * The host waits for the oldest op only when nothing fits. */
static pv_status staging_acquire(staging_ring *ring, size_t bytes, const char *op, size_t *at)
{
    if (bytes > ring->bytes)
        return pv_error(PV_ERR_UNSUPPORTED,
                        "cuda %s: the host index arrays need %zu bytes of staging, more than the %zu "
                        "allocated at init",
                        op, bytes, ring->bytes);
    int retired = 1;
    while (ring->count > 0 && retired)
        PV_TRY(retire_oldest(ring, 0, &retired));
    for (;;) {
        if (ring->count == 0) {
            *at = 0;
            return PV_OK;
        }
        if (ring->count < STAGING_RECORDS) {
            size_t tail = ring->records[ring->first].start;
            size_t newest = ring->records[(ring->first + ring->count - 1) % STAGING_RECORDS].start;
            if (newest >= tail) { /* busy: [tail, head) */
                if (ring->bytes - ring->head >= bytes) {
                    *at = ring->head;
                    return PV_OK;
                }
                if (tail >= bytes) {
                    *at = 0;
                    return PV_OK;
                }
            } else if (tail - ring->head >= bytes) { /* busy: [tail, end) and [0, head) */
                *at = ring->head;
                return PV_OK;
            }
        }
        PV_TRY(retire_oldest(ring, 1, &retired));
    }
}

/* Packs the host arrays into a region of the ring, uploads them on its
 * stream and sets each part's dev pointer. `extra` more bytes (for device
 * results of blocking ops) follow the arrays at *extra_off. The caller
 * launches its kernel and then calls staging_done() with *region. */
static pv_status staging_upload(staging_ring *ring, const char *op, upload *parts, int n_parts, size_t extra,
                                staged *region, size_t *extra_off)
{
    graph_slot *g = ring->graph ? *ring->graph : NULL;
    if (g) { /* a graph step: the arrays go to the graph's arena, copied in one go before it runs */
        if (extra)
            return pv_error(PV_ERR_UNSUPPORTED, "cuda %s: a device result for the host in a graph", op);
        for (int i = 0; i < n_parts; i++) {
            size_t at = 0;
            if (!pv_graph_trace_place(&g->trace, parts[i].bytes, STAGING_ALIGN, g->arena_bytes, &at))
                return pv_cuda_graph_step_error(g, op);
            memcpy(g->arena_host + at, parts[i].src, parts[i].bytes);
            parts[i].dev = g->arena_dev + at;
        }
        *region = (staged){.in_arena = 1};
        return PV_OK;
    }
    size_t total = 0;
    for (int i = 0; i < n_parts; i++)
        total += align_up(parts[i].bytes);
    size_t uploaded = total;
    total += align_up(extra);
    if (total == 0)
        total = STAGING_ALIGN; /* every region has a size, so the ring's spans stay unambiguous */
    size_t at = 0;
    PV_TRY(staging_acquire(ring, total, op, &at));
    size_t off = at;
    for (int i = 0; i < n_parts; i++) {
        memcpy(ring->host + off, parts[i].src, parts[i].bytes);
        parts[i].dev = ring->dev + off;
        off += align_up(parts[i].bytes);
    }
    *region = (staged){.start = at, .end = at + total}; /* in_arena 0: staging_done marks it busy */
    if (uploaded)
        CUDA_TRY(cudaMemcpyAsync(ring->dev + at, ring->host + at, uploaded, cudaMemcpyHostToDevice, ring->stream),
                 "%zu bytes of index arrays for %s", uploaded, op);
    if (extra_off)
        *extra_off = at + uploaded;
    return PV_OK;
}

/* Keeps a staging region busy until the ring's stream has passed the op
 * that reads it. Called whether or not the kernel launched (`launched`:
 * the launcher's status, returned unless it is PV_OK): the upload was
 * enqueued either way. Without an event to mark it, the stream is drained
 * instead, so the region is free when this returns. */
static pv_status staging_done(staging_ring *ring, const staged *region, pv_status launched)
{
    if (region->in_arena)
        return launched;
    staged *r = &ring->records[(ring->first + ring->count) % STAGING_RECORDS];
    cudaError_t err = cudaEventRecord(r->done, ring->stream);
    if (err == cudaSuccess) {
        r->start = region->start;
        r->end = region->end;
        ring->count++;
        ring->head = region->end;
        return launched;
    }
    cudaStreamSynchronize(ring->stream);
    if (launched == PV_OK)
        return pv_cuda_fail(err, "cudaEventRecord", "%s", "staging event");
    return launched;
}

/* ---- scratch ------------------------------------------------------------------------- */

/* Scratch buffer `which` with at least `bytes`, grown to twice its size
 * when short. With the stream-ordered allocator the old buffer is freed
 * and the new one allocated on the compute stream itself: ordered after the
 * kernels still using the old one and before the new user, with no
 * synchronisation. Without it, cudaMalloc synchronises the device; that
 * happens only while the scratch grows. While a graph is recorded, the
 * scratch grows outside the capture (below). */
static pv_status scratch_reserve(cuda_impl *cu, const char *op, int which, size_t bytes, void **out)
{
    if (cu->scratch_bytes[which] < bytes || !cu->scratch[which]) {
        /* A step checked against its recording launches with the recording's
         * scratch, so it cannot take another. */
        if (cu->graph && !cu->capturing)
            return pv_error(PV_ERR_UNSUPPORTED, "cuda %s: growing the scratch while a graph step is checked", op);
        size_t grown = bytes > 2 * cu->scratch_bytes[which] ? bytes : 2 * cu->scratch_bytes[which];
        cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
        void *mem = NULL;
        if (cu->capturing) {
            /* An allocation recorded into the graph would belong to it: the
             * new scratch comes from outside the capture, and the old one goes
             * at graph_end, behind the work that reads it. Kept graphs that
             * read the old one differ from their next step and record anew. */
            PV_TRY(device_alloc(cu, grown, "scratch", &mem));
            if (cu->scratch[which]) {
                pv_buffer old = {.kind = PV_MEM_DEVICE, .bytes = cu->scratch_bytes[which], .handle = cu->scratch[which]};
                release_after_step(cu, &old);
            }
        } else if (cu->pooled) {
            if (cu->scratch[which])
                CUDA_TRY(cudaFreeAsync(cu->scratch[which], s), "%s scratch", op);
            cu->scratch[which] = NULL;
            cu->scratch_bytes[which] = 0;
            CUDA_TRY(cudaMallocAsync(&mem, grown, s), "%zu bytes of %s scratch", grown, op);
        } else {
            if (cu->scratch[which])
                cudaFree(cu->scratch[which]);
            cu->scratch[which] = NULL;
            cu->scratch_bytes[which] = 0;
            CUDA_TRY(cudaMalloc(&mem, grown), "%zu bytes of %s scratch", grown, op);
        }
        cu->scratch[which] = mem;
        cu->scratch_bytes[which] = grown;
    }
    *out = cu->scratch[which];
    return PV_OK;
}

/* ---- GEMM ---------------------------------------------------------------------------- */

/* Describes a cuBLAS GEMM (column-major arguments) to the graph trace;
 * 1 when a graph step is checked against its recording, so the call is
 * the recording's to make. precision: cuda_gemm's pv_dtype, or
 * QMATMUL_PRECISION of qmatmul's pv_gemm_mode. */
static int blas_traced(cuda_impl *cu, uint64_t precision, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
                       int k, float alpha, float beta, const void *a, int lda, const void *b, int ldb, const void *c,
                       int ldc)
{
    uint64_t item[10] = {precision, (uint64_t)op_a | (uint64_t)op_b << 8, (uint64_t)(uint32_t)m,
                         (uint64_t)(uint32_t)n | (uint64_t)(uint32_t)k << 32,
                         (uint64_t)(uint32_t)lda | (uint64_t)(uint32_t)ldb << 32, (uint64_t)(uint32_t)ldc,
                         (uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)b, (uint64_t)(uintptr_t)c, 0};
    memcpy(&item[9], &alpha, sizeof alpha);
    memcpy((char *)&item[9] + sizeof alpha, &beta, sizeof beta);
    return graph_traced(cu, PV_TRACE_LIBRARY, item, sizeof item);
}

/* cuBLAS is column-major. A row-major matrix is its transpose read
 * column-major, so row-major C = op(A) op(B) is computed as column-major
 * C^T = op(B)^T op(A)^T: swap the operands and the m/n extents, keep the
 * transpose flags. */
static pv_status cuda_gemm(pv_backend *be, const pv_gemm_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    if (a->m > INT32_MAX || a->n > INT32_MAX || a->k > INT32_MAX || a->lda > INT32_MAX ||
        a->ldb > INT32_MAX || a->ldc > INT32_MAX)
        return pv_error(PV_ERR_UNSUPPORTED,
                        "cuda: gemm m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " lda=%" PRId64
                        " ldb=%" PRId64 " ldc=%" PRId64 ": cuBLAS takes at most %d",
                        a->m, a->n, a->k, a->lda, a->ldb, a->ldc, INT32_MAX);
    cublasOperation_t op_a = a->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = a->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    int m = (int)a->m, n = (int)a->n, k = (int)a->k;
    int lda = (int)a->lda, ldb = (int)a->ldb, ldc = (int)a->ldc;
    size_t es = pv_dtype_size(a->dtype);
    void *pc = dev_ptr(a->c, a->c_off, es);
    /* With k = 0 (C = beta C) A and B may be absent and are never read;
     * cuBLAS still gets valid addresses. */
    const void *pa = a->k ? dev_ptr(a->a, a->a_off, es) : pc;
    const void *pb = a->k ? dev_ptr(a->b, a->b_off, es) : pc;
    if (blas_traced(cu, (uint64_t)a->dtype, op_b, op_a, n, m, k, a->alpha, a->beta, pb, ldb, pa, lda, pc, ldc)) {
        be->launches++;
        return PV_OK;
    }
    if (a->dtype == PV_F32)
        BLAS_TRY(cublasSgemm(cu->blas, op_b, op_a, n, m, k, &a->alpha, (const float *)pb, ldb,
                             (const float *)pa, lda, &a->beta, (float *)pc, ldc),
                 "f32 m=%d n=%d k=%d", m, n, k);
    else /* f16 storage; f32 accumulation and f32 alpha, beta */
        BLAS_TRY(cublasGemmEx(cu->blas, op_b, op_a, n, m, k, &a->alpha, pb, CUDA_R_16F, ldb, pa,
                              CUDA_R_16F, lda, &a->beta, pc, CUDA_R_16F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "f16 m=%d n=%d k=%d", m, n, k);
    be->launches++;
    return PV_OK;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* The paged index arrays of attention, kv_write and rope_kv_write. */
static void paging_uploads(upload up[3], int32_t n_tokens, const int32_t *token_seq, const int32_t *token_pos,
                           const int32_t *slot_table, int32_t n_seqs, int32_t max_chunks)
{
    up[0] = (upload){token_seq, (size_t)n_tokens * sizeof(int32_t), NULL};
    up[1] = (upload){token_pos, (size_t)n_tokens * sizeof(int32_t), NULL};
    up[2] = (upload){slot_table, (size_t)n_seqs * (size_t)max_chunks * sizeof(int32_t), NULL};
}

/* cuda_attention; with xq (not NULL) and the call split, the combine
 * kernel also rounds the output into xq (head_dim a multiple of 32), and
 * *rounded says it did. */
static pv_status attention_of(pv_backend *be, const pv_attention_args *a, const pv_cuda_xq16 *xq, int *rounded)
{
    cuda_impl *cu = impl_of(be);
    upload up[3];
    paging_uploads(up, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs, a->max_chunks);
    pv_kernel_bucket bucket;
    pv_kernel_bucket_of_attention(a, &bucket);
    const int tuned_splits = pv_kernel_tuned(be->tuning, &bucket).value[PV_KPARAM_SPLITS];
    const int splits =
        pv_attention_splits(cu->attention_splits, tuned_splits, be->info.compute_units, cu->attention_group, a);
    void *part = NULL;
    if (splits > 1)
        PV_TRY(scratch_reserve(cu, "attention", SCRATCH_ATTENTION,
                            (size_t)pv_attention_split_floats(splits, a) * sizeof(float), &part));
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "attention", up, 3, 0, &region, NULL));
    pv_status st = pv_cuda_launch_attention(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                            (const float *)dev_ptr(a->q, a->q_off, 4), dev_ptr(a->kv_pool, 0, 1),
                                            up[0].dev, up[1].dev, up[2].dev, cu->attention_group, splits,
                                            (float *)part, (float *)dev_ptr(a->out, a->out_off, 4),
                                            splits > 1 ? xq : NULL);
    *rounded = st == PV_OK && splits > 1 && xq;
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static pv_status cuda_attention(pv_backend *be, const pv_attention_args *a)
{
    PV_TRY(enter(impl_of(be)));
    int rounded = 0;
    return attention_of(be, a, NULL, &rounded);
}

static pv_status cuda_kv_write(pv_backend *be, const pv_kv_write_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    upload up[3];
    paging_uploads(up, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs, a->max_chunks);
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "kv_write", up, 3, 0, &region, NULL));
    pv_status st = pv_cuda_launch_kv_write(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                           (const float *)dev_ptr(a->k, a->k_off, 4),
                                           (const float *)dev_ptr(a->v, a->v_off, 4), dev_ptr(a->kv_pool, 0, 1),
                                           up[0].dev, up[1].dev, up[2].dev);
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static pv_status slot_copy(pv_backend *be, const pv_slot_copy_args *a, int scatter)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    upload up[1] = {{a->slots, (size_t)a->n_slots_moved * sizeof(int32_t), NULL}};
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], scatter ? "slot_scatter" : "slot_gather", up, 1, 0, &region, NULL));
    size_t es = pv_dtype_size(a->dtype);
    pv_status st = pv_cuda_launch_slot_copy(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a, scatter,
                                            dev_ptr(a->pool, 0, es), dev_ptr(a->staging, a->staging_off, es),
                                            up[0].dev);
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static pv_status cuda_slot_gather(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, 0);
}

static pv_status cuda_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, 1);
}

/* One kernel on the copy stream over both pools: a host pool's handle is
 * the device address of its mapped pinned memory, so the kernel reads it
 * (swap-in) or writes it (swap-out) over the bus itself, with neither
 * staging nor a host memcpy. The slot lists travel in the copy stream's
 * own staging ring. */
static pv_status cuda_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    /* Its kernel runs on the copy stream, outside the recorded graph, and
     * a step checked against the recording would skip the launch. */
    PV_TRY(not_capturing(cu, "slot_transfer"));
    staging_ring *ring = &cu->ring[PV_QUEUE_COPY];
    if (wait)
        CUDA_TRY(cudaStreamWaitEvent(ring->stream, (cudaEvent_t)wait->handle, 0), "%s", "slot_transfer wait event");
    if (a->n > 0) {
        upload up[2] = {{a->dst_slots, (size_t)a->n * sizeof(int32_t), NULL},
                        {a->src_slots, (size_t)a->n * sizeof(int32_t), NULL}};
        staged region;
        PV_TRY(staging_upload(ring, "slot_transfer", up, 2, 0, &region, NULL));
        pv_status st = pv_cuda_launch_slot_transfer(&cu->kernels, ring->stream, a, dev_ptr(a->dst, 0, 1),
                                                    dev_ptr(a->src, 0, 1), up[0].dev, up[1].dev);
        PV_TRY(staging_done(ring, &region, st));
    }
    return done ? cuda_event_record(be, PV_QUEUE_COPY, done) : PV_OK;
}

/* Device address of element `off` (whole blocks) of weights of type t. */
static void *weight_ptr(const pv_buffer *buf, pv_wtype t, uint64_t off)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    return (char *)buf->handle + off / block_elems * block_bytes;
}

static pv_status cuda_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    upload up[1] = {{a->ids, (size_t)a->n_ids * sizeof(int32_t), NULL}};
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "embed_gather", up, 1, 0, &region, NULL));
    const int32_t *ids_dev = a->ids_dev ? (const int32_t *)dev_ptr(a->ids_dev, a->ids_dev_off, 4) : NULL;
    pv_status st = pv_cuda_launch_embed_gather(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                               weight_ptr(a->table, a->table_type, a->table_off), up[0].dev,
                                               ids_dev, (float *)dev_ptr(a->out, a->out_off, 4));
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static pv_status cuda_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    return pv_cuda_launch_rmsnorm(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                  (const float *)dev_ptr(a->x, a->x_off, 4),
                                  (const float *)dev_ptr(a->weight, a->weight_off, 4),
                                  (float *)dev_ptr(a->out, a->out_off, 4));
}

static pv_status cuda_rope(pv_backend *be, const pv_rope_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    upload up[1] = {{a->pos, (size_t)a->n_tokens * sizeof(int32_t), NULL}};
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "rope", up, 1, 0, &region, NULL));
    pv_status st = pv_cuda_launch_rope(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                       (float *)dev_ptr(a->x, a->x_off, 4), up[0].dev);
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static pv_status cuda_swiglu(pv_backend *be, const pv_swiglu_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    return pv_cuda_launch_swiglu(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                 (const float *)dev_ptr(a->gate, a->gate_off, 4),
                                 (const float *)dev_ptr(a->up, a->up_off, 4), (float *)dev_ptr(a->out, a->out_off, 4));
}

static pv_status cuda_add(pv_backend *be, const pv_add_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    return pv_cuda_launch_add(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a, (const float *)dev_ptr(a->a, a->a_off, 4),
                              (const float *)dev_ptr(a->b, a->b_off, 4), (float *)dev_ptr(a->out, a->out_off, 4));
}

static pv_status cuda_softmax(pv_backend *be, const pv_softmax_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    return pv_cuda_launch_softmax(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                  (const float *)dev_ptr(a->x, a->x_off, 4), (float *)dev_ptr(a->out, a->out_off, 4));
}

/* The blocking ops' tail: once op's kernel has written one int32 per row
 * at `result_off` of the staging ring, copy the rows back, wait for the
 * compute stream (never the copy stream), and hand them to the caller. */
static pv_status fetch_rows(cuda_impl *cu, const staged *region, const char *op, pv_status launched,
                            size_t result_off, int64_t rows, int64_t cols, int32_t *out)
{
    staging_ring *ring = &cu->ring[PV_QUEUE_COMPUTE];
    cudaStream_t stream = ring->stream;
    size_t bytes = (size_t)rows * sizeof(int32_t);
    cudaError_t err = cudaSuccess;
    if (launched == PV_OK)
        err = cudaMemcpyAsync(ring->host + result_off, ring->dev + result_off, bytes, cudaMemcpyDeviceToHost,
                              stream);
    PV_TRY(staging_done(&cu->ring[PV_QUEUE_COMPUTE], region, launched));
    if (err != cudaSuccess)
        return pv_cuda_fail(err, "cudaMemcpyAsync", "%s of %" PRId64 " rows of %" PRId64, op, rows, cols);
    CUDA_TRY(cudaStreamSynchronize(stream), "%s of %" PRId64 " rows of %" PRId64, op, rows, cols);
    memcpy(out, ring->host + result_off, bytes);
    return PV_OK;
}

static pv_status cuda_argmax(pv_backend *be, const pv_argmax_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "argmax"));
    staged region;
    size_t result_off = 0;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "argmax", NULL, 0, (size_t)a->rows * sizeof(int32_t), &region, &result_off));
    pv_status st = pv_cuda_launch_argmax(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                         (const float *)dev_ptr(a->x, a->x_off, 4),
                                         (int32_t *)(cu->ring[PV_QUEUE_COMPUTE].dev + result_off));
    return fetch_rows(cu, &region, "argmax", st, result_off, a->rows, a->cols, a->out);
}

static pv_status cuda_sample_top_p(pv_backend *be, const pv_sample_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    PV_TRY(not_capturing(cu, "sample_top_p"));
    upload up[1] = {{a->u, (size_t)a->rows * sizeof(float), NULL}};
    staged region;
    size_t result_off = 0;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "sample_top_p", up, 1, (size_t)a->rows * sizeof(int32_t), &region, &result_off));
    pv_status st = pv_cuda_launch_sample_top_p(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                               (const float *)dev_ptr(a->logits, a->logits_off, 4), up[0].dev,
                                               (int32_t *)(cu->ring[PV_QUEUE_COMPUTE].dev + result_off));
    return fetch_rows(cu, &region, "sample_top_p", st, result_off, a->rows, a->cols, a->out);
}

/* Every row's parameters and bias lists in one upload, one kernel; into
 * host out one wait (never while a graph is recorded), into out_dev none:
 * the tokens stay on the device for the next step's ops, and the op may
 * be recorded. */
static pv_status cuda_sample_batch(pv_backend *be, const pv_sample_batch_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    if (a->out)
        PV_TRY(not_capturing(cu, "sample_batch into host out"));
    staging_ring *ring = &cu->ring[PV_QUEUE_COMPUTE];
    int64_t biased_rows = 0;
    for (int64_t r = 0; a->bias_start && r < a->rows; r++)
        biased_rows += a->bias_start[r + 1] > a->bias_start[r];
    const size_t row_bytes = (size_t)a->rows * sizeof(float);
    const size_t entry_bytes = biased_rows ? (size_t)a->bias_start[a->rows] * 4 : 0;
    upload up[6] = {{a->temperature, row_bytes, NULL}, {a->top_p, row_bytes, NULL},
                    {a->u, row_bytes, NULL},           {a->bias_start, row_bytes + 4, NULL},
                    {a->bias_token, entry_bytes, NULL}, {a->bias_value, entry_bytes, NULL}};
    pv_cuda_logit_bias bias = {NULL, NULL, NULL, NULL};
    if (biased_rows)
        PV_TRY(scratch_reserve(cu, "sample_batch", SCRATCH_BIAS, (size_t)biased_rows * (size_t)a->cols * sizeof(float),
                               (void **)&bias.biased));
    staged region;
    size_t result_off = 0;
    PV_TRY(staging_upload(ring, "sample_batch", up, biased_rows ? 6 : 3, a->out ? (size_t)a->rows * sizeof(int32_t) : 0,
                          &region, &result_off));
    if (biased_rows) {
        bias.start = up[3].dev;
        bias.token = up[4].dev;
        bias.value = up[5].dev;
    }
    int32_t *out = a->out ? (int32_t *)(ring->dev + result_off) : (int32_t *)dev_ptr(a->out_dev, a->out_dev_off, 4);
    pv_status st = pv_cuda_launch_sample_batch(&cu->kernels, ring->stream, a,
                                               (const float *)dev_ptr(a->logits, a->logits_off, 4), up[0].dev,
                                               up[1].dev, up[2].dev, &bias, out);
    if (a->out)
        return fetch_rows(cu, &region, "sample_batch", st, result_off, a->rows, a->cols, a->out);
    return staging_done(ring, &region, st);
}

/* Decode-sized batches (T up to this) take the fused dequantize-and-dot
 * kernel, which reads W once per call; larger ones widen W into scratch
 * tiles for cuBLAS, whose work per weight grows with T. */
#define QMATMUL_FUSED_MAX_T 16
/* Largest widened tile of W: 64 MiB, and at most gridDim.y rows. */
#define QMATMUL_TILE_BYTES ((size_t)64 << 20)
#define QMATMUL_TILE_ROWS_MAX 65535
/* blas_traced's precision of a qmatmul GEMM: above every pv_dtype. */
#define QMATMUL_PRECISION(mode) ((uint64_t)0x100 | (uint64_t)(mode))

/* The PV_GEMM of qmatmul's larger batches: the tuned one (kernel-params.h). */
static int gemm_mode(const pv_backend *be)
{
    const pv_kernel_bucket b = {.family = PV_KERNEL_QMATMUL};
    return pv_kernel_tuned(be->tuning, &b).value[PV_KPARAM_GEMM];
}

/* Whether qmatmul's decode-sized products of type t take x rounded to 16
 * bits (PV_ACT16, kernel-params.h). */
static int act16(const pv_backend *be, pv_wtype t)
{
    const pv_kernel_bucket b = {.family = PV_KERNEL_QMATMUL};
    const pv_kernel_params p = pv_kernel_tuned(be->tuning, &b);
    return pv_qmatmul_act16(&p, (int)t);
}

/* *xq = the PV_ACT16 scratch for x [T][n_in] rounded. */
static pv_status xq16_reserve(pv_backend *be, int64_t n_tokens, int64_t n_in, pv_cuda_xq16 *xq)
{
    void *mem = NULL;
    PV_TRY(scratch_reserve(impl_of(be), "qmatmul", SCRATCH_QMATMUL_XQ, pv_cuda_xq16_bytes(n_tokens, n_in), &mem));
    xq->q = mem;
    xq->s = (float *)((char *)mem + (size_t)n_tokens * (size_t)n_in * 2);
    return PV_OK;
}

/* x [T][n_in] rounded into the PV_ACT16 scratch for the fused kernels. */
static pv_status round_x16(pv_backend *be, pv_wtype t, const float *x, int64_t n_tokens, int64_t n_in,
                           pv_cuda_xq16 *xq)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(xq16_reserve(be, n_tokens, n_in, xq));
    return pv_cuda_launch_qmatmul_round16(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], t, x, n_tokens, n_in, xq);
}

/* *used = xq with x rounded into it where PV_ACT16 applies to type t,
 * else NULL (the kernels take x itself). */
static pv_status round_x16_if(pv_backend *be, pv_wtype t, const float *x, int64_t n_tokens, int64_t n_in,
                              pv_cuda_xq16 *xq, const pv_cuda_xq16 **used)
{
    *used = NULL;
    if (!act16(be, t))
        return PV_OK;
    PV_TRY(round_x16(be, t, x, n_tokens, n_in, xq));
    *used = xq;
    return PV_OK;
}

static int gemm_narrows(int mode)
{
    return mode == PV_GEMM_F16 || mode == PV_GEMM_BF16;
}

/* y[:, r0 : r0 + n_rows] = x W_tile^T for W_tile [n_rows][n_in] (the
 * row-major product as its column-major transpose, as cuda_gemm does),
 * tile and x in the mode's precision: f16 or bf16 for those modes, else
 * f32; f32 accumulation and output in every mode. */
static pv_status qmatmul_gemm(pv_backend *be, const pv_qmatmul_args *a, int mode, int64_t r0, int64_t n_rows,
                              const void *tile, const void *x)
{
    static const cudaDataType_t input[PV_GEMM_MODES] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F};
    static const cublasComputeType_t compute[PV_GEMM_MODES] = {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F,
                                                               CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    cuda_impl *cu = impl_of(be);
    const float one = 1.0f, zero = 0.0f;
    const int n_in = (int)a->n_in;
    float *y = dev_ptr(a->y, a->y_off + (uint64_t)r0, 4);
    if (!blas_traced(cu, QMATMUL_PRECISION(mode), CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, (int)a->n_tokens, n_in,
                     one, zero, tile, n_in, x, n_in, y, (int)a->n_out))
        BLAS_TRY(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n_rows, (int)a->n_tokens, n_in, &one, tile,
                              input[mode], n_in, x, input[mode], n_in, &zero, y, CUDA_R_32F, (int)a->n_out,
                              compute[mode], CUBLAS_GEMM_DEFAULT),
                 "qmatmul %s T=%" PRId64 " rows=%" PRId64 " n_in=%d", pv_gemm_mode_name(mode), a->n_tokens, n_rows,
                 n_in);
    be->launches++;
    return PV_OK;
}

/* *x = x as the large-batch GEMMs read it: rounded to the mode's 16 bits
 * into SCRATCH_QMATMUL_X where the mode narrows (once for every product
 * of one x), else x itself. */
static pv_status gemm_input(pv_backend *be, const pv_qmatmul_args *a, int mode, const void **x)
{
    cuda_impl *cu = impl_of(be);
    *x = dev_ptr(a->x, a->x_off, 4);
    if (!gemm_narrows(mode))
        return PV_OK;
    void *x16 = NULL;
    PV_TRY(scratch_reserve(cu, "qmatmul", SCRATCH_QMATMUL_X, (size_t)a->n_tokens * (size_t)a->n_in * 2, &x16));
    PV_TRY(pv_cuda_launch_qmatmul_narrow16(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a, (const float *)*x,
                                           mode == PV_GEMM_BF16, x16));
    *x = x16;
    return PV_OK;
}

/* Batches past the fused kernels: cuBLAS on weights read in place where
 * stored in the GEMM's input type, else widened tile by tile; x from
 * gemm_input. */
static pv_status qmatmul_large(pv_backend *be, const pv_qmatmul_args *a, int mode, const void *x)
{
    cuda_impl *cu = impl_of(be);
    const int narrow = gemm_narrows(mode);
    const void *w = weight_ptr(a->w, a->w_type, a->w_off);
    /* weights stored in the GEMM's input type are read in place */
    if ((a->w_type == PV_W_F32 && !narrow) || (a->w_type == PV_W_F16 && mode == PV_GEMM_F16) ||
        (a->w_type == PV_W_BF16 && mode == PV_GEMM_BF16))
        return qmatmul_gemm(be, a, mode, 0, a->n_out, w, x);

    const size_t elem = narrow ? 2 : sizeof(float);
    int64_t tile_rows = (int64_t)(QMATMUL_TILE_BYTES / elem) / a->n_in;
    tile_rows = tile_rows < 1 ? 1 : tile_rows > a->n_out ? a->n_out : tile_rows;
    tile_rows = tile_rows > QMATMUL_TILE_ROWS_MAX ? QMATMUL_TILE_ROWS_MAX : tile_rows;
    void *tile = NULL;
    PV_TRY(scratch_reserve(cu, "qmatmul", SCRATCH_QMATMUL, (size_t)tile_rows * (size_t)a->n_in * elem, &tile));
    for (int64_t r0 = 0; r0 < a->n_out; r0 += tile_rows) {
        const int64_t n_rows = a->n_out - r0 < tile_rows ? a->n_out - r0 : tile_rows;
        PV_TRY(pv_cuda_launch_qmatmul_widen(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a, w, r0, n_rows, mode, tile));
        PV_TRY(qmatmul_gemm(be, a, mode, r0, n_rows, tile, x));
    }
    return PV_OK;
}

static pv_status cuda_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    if (a->n_tokens <= QMATMUL_FUSED_MAX_T) {
        const float *x = dev_ptr(a->x, a->x_off, 4);
        pv_cuda_xq16 xq;
        const pv_cuda_xq16 *rounded;
        PV_TRY(round_x16_if(be, a->w_type, x, a->n_tokens, a->n_in, &xq, &rounded));
        return pv_cuda_launch_qmatmul_fused(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                            weight_ptr(a->w, a->w_type, a->w_off), x, rounded,
                                            (float *)dev_ptr(a->y, a->y_off, 4));
    }
    const int mode = gemm_mode(be);
    const void *x = NULL;
    PV_TRY(gemm_input(be, a, mode, &x));
    return qmatmul_large(be, a, mode, x);
}

/* Products of one x (Q, K and V). At decode sizes, products of one weight
 * type go three to a launch (pv_cuda_launch_qmatmul_group: K and V's few
 * rows beside Q's instead of launches that leave most SMs idle), x rounded
 * once first where PV_ACT16 says so; products of mixed types one by one, x
 * still rounded once for all the block-type ones. Larger batches one by
 * one, x narrowed once for all in PV_GEMM's 16-bit modes. `rounded` (not
 * NULL) holds x rounded already where pv_qmatmul_group_rounds says the
 * group takes it so. */
static pv_status group_of(pv_backend *be, const pv_qmatmul_args *products, int n, const pv_cuda_xq16 *rounded)
{
    cuda_impl *cu = impl_of(be);
    cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
    const pv_qmatmul_args *first = &products[0];
    if (first->n_tokens > QMATMUL_FUSED_MAX_T) {
        const int mode = gemm_mode(be);
        const void *x = NULL;
        PV_TRY(gemm_input(be, first, mode, &x));
        for (int i = 0; i < n; i++)
            PV_TRY(qmatmul_large(be, &products[i], mode, x));
        return PV_OK;
    }
    int one_type = 1;
    for (int i = 1; i < n; i++)
        one_type &= products[i].w_type == first->w_type;
    const int shared = pv_qmatmul_group_rounds(be->tuning, products, n, QMATMUL_FUSED_MAX_T);
    pv_cuda_xq16 xq = rounded ? *rounded : (pv_cuda_xq16){0};
    const float *x = dev_ptr(first->x, first->x_off, 4);
    if (shared >= 0 && !rounded)
        PV_TRY(round_x16(be, products[shared].w_type, x, first->n_tokens, first->n_in, &xq));
    if (one_type && n > 1) {
        for (int i = 0; i < n; i += 3) {
            const void *w[3];
            float *y[3];
            const int m = n - i < 3 ? n - i : 3;
            for (int j = 0; j < m; j++) {
                w[j] = weight_ptr(products[i + j].w, products[i + j].w_type, products[i + j].w_off);
                y[j] = (float *)dev_ptr(products[i + j].y, products[i + j].y_off, 4);
            }
            PV_TRY(pv_cuda_launch_qmatmul_group(&cu->kernels, s, products + i, m, w, y, x,
                                                shared >= 0 ? &xq : NULL));
        }
        return PV_OK;
    }
    for (int i = 0; i < n; i++) {
        const pv_qmatmul_args *a = &products[i];
        if (shared >= 0 && act16(be, a->w_type))
            PV_TRY(pv_cuda_launch_qmatmul_fused(&cu->kernels, s, a, weight_ptr(a->w, a->w_type, a->w_off), x, &xq,
                                                (float *)dev_ptr(a->y, a->y_off, 4)));
        else
            PV_TRY(cuda_qmatmul(be, a));
    }
    return PV_OK;
}

static pv_status cuda_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    PV_TRY(enter(impl_of(be)));
    return group_of(be, products, n, NULL);
}

/* Decode-sized batches: one pass over both matrices. Larger ones: the two
 * products as cuda_qmatmul runs them (gate into y, up into a->up), then
 * pv_swiglu: 2 x (widen + GEMM) + 1 launches per tile pair, 3 for F32,
 * and x narrowed once for both in PV_GEMM's 16-bit modes. */
static pv_status swiglu_of(pv_backend *be, const pv_qmatmul_swiglu_args *a, const pv_cuda_xq16 *rounded)
{
    cuda_impl *cu = impl_of(be);
    cudaStream_t s = cu->stream[PV_QUEUE_COMPUTE];
    float *y = dev_ptr(a->y, a->y_off, 4);
    if (a->n_tokens <= QMATMUL_FUSED_MAX_T) {
        const float *x = dev_ptr(a->x, a->x_off, 4);
        pv_cuda_xq16 xq;
        if (!rounded)
            PV_TRY(round_x16_if(be, a->w_type, x, a->n_tokens, a->n_in, &xq, &rounded));
        return pv_cuda_launch_qmatmul_swiglu_fused(&cu->kernels, s, a, weight_ptr(a->w_gate, a->w_type, a->w_gate_off),
                                                   weight_ptr(a->w_up, a->w_type, a->w_up_off), x, rounded, y);
    }
    pv_qmatmul_args product = {.w_type = a->w_type, .n_tokens = a->n_tokens, .n_in = a->n_in, .n_out = a->n_out,
                               .w = a->w_gate, .w_off = a->w_gate_off, .x = a->x, .x_off = a->x_off, .y = a->y,
                               .y_off = a->y_off};
    const int mode = gemm_mode(be);
    const void *x = NULL;
    PV_TRY(gemm_input(be, &product, mode, &x));
    PV_TRY(qmatmul_large(be, &product, mode, x));
    product.w = a->w_up;
    product.w_off = a->w_up_off;
    product.y = a->up;
    product.y_off = a->up_off;
    PV_TRY(qmatmul_large(be, &product, mode, x));
    const pv_swiglu_args swiglu = {.n = a->n_tokens * a->n_out};
    return pv_cuda_launch_swiglu(&cu->kernels, s, &swiglu, y, (const float *)dev_ptr(a->up, a->up_off, 4), y);
}

static pv_status cuda_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a)
{
    PV_TRY(enter(impl_of(be)));
    return swiglu_of(be, a, NULL);
}

/* pv_add_rmsnorm, with the norm also rounded into xq (not NULL) for the
 * PV_ACT16 products that read it next. */
static pv_status add_rmsnorm_of(pv_backend *be, const pv_add_rmsnorm_args *a, const pv_cuda_xq16 *xq)
{
    cuda_impl *cu = impl_of(be);
    return pv_cuda_launch_add_rmsnorm(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a, (float *)dev_ptr(a->x, a->x_off, 4),
                                      (const float *)dev_ptr(a->y, a->y_off, 4),
                                      (const float *)dev_ptr(a->weight, a->weight_off, 4),
                                      (float *)dev_ptr(a->out, a->out_off, 4), xq);
}

static pv_status cuda_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a)
{
    PV_TRY(enter(impl_of(be)));
    return add_rmsnorm_of(be, a, NULL);
}

/* The norm's kernel rounds its output for the products where they take x
 * rounded (PV_ACT16): the rounding launch saved. */
static pv_status cuda_add_rmsnorm_group(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                                        int n)
{
    PV_TRY(enter(impl_of(be)));
    pv_cuda_xq16 xq;
    const int rounds = pv_qmatmul_group_rounds(be->tuning, products, n, QMATMUL_FUSED_MAX_T) >= 0;
    if (rounds)
        PV_TRY(xq16_reserve(be, norm->rows, norm->dim, &xq));
    PV_TRY(add_rmsnorm_of(be, norm, rounds ? &xq : NULL));
    return group_of(be, products, n, rounds ? &xq : NULL);
}

/* The combine kernel of a split attention rounds its output for the
 * product where it takes x rounded (PV_ACT16): the rounding launch saved;
 * unsplit, the product rounds it. */
static pv_status cuda_attention_qmatmul(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    pv_cuda_xq16 xq;
    int rounded = 0;
    const int decode = product->n_tokens <= QMATMUL_FUSED_MAX_T;
    const int rounds = decode && act16(be, product->w_type) && att->head_dim % 32 == 0;
    if (rounds)
        PV_TRY(xq16_reserve(be, product->n_tokens, product->n_in, &xq));
    PV_TRY(attention_of(be, att, rounds ? &xq : NULL, &rounded));
    if (!rounded)
        return cuda_qmatmul(be, product);
    return pv_cuda_launch_qmatmul_fused(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], product,
                                        weight_ptr(product->w, product->w_type, product->w_off),
                                        (const float *)dev_ptr(product->x, product->x_off, 4), &xq,
                                        (float *)dev_ptr(product->y, product->y_off, 4));
}

static pv_status cuda_add_rmsnorm_swiglu(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                         const pv_qmatmul_swiglu_args *swiglu)
{
    PV_TRY(enter(impl_of(be)));
    pv_cuda_xq16 xq;
    const int rounds = swiglu->n_tokens <= QMATMUL_FUSED_MAX_T && act16(be, swiglu->w_type);
    if (rounds)
        PV_TRY(xq16_reserve(be, norm->rows, norm->dim, &xq));
    PV_TRY(add_rmsnorm_of(be, norm, rounds ? &xq : NULL));
    return swiglu_of(be, swiglu, rounds ? &xq : NULL);
}

static pv_status cuda_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a)
{
    cuda_impl *cu = impl_of(be);
    PV_TRY(enter(cu));
    upload up[3];
    paging_uploads(up, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs, a->max_chunks);
    staged region;
    PV_TRY(staging_upload(&cu->ring[PV_QUEUE_COMPUTE], "rope_kv_write", up, 3, 0, &region, NULL));
    pv_status st = pv_cuda_launch_rope_kv_write(&cu->kernels, cu->stream[PV_QUEUE_COMPUTE], a,
                                                (float *)dev_ptr(a->q, a->q_off, 4),
                                                (const float *)dev_ptr(a->k, a->k_off, 4),
                                                (const float *)dev_ptr(a->v, a->v_off, 4), dev_ptr(a->kv_pool, 0, 1),
                                                up[0].dev, up[1].dev, up[2].dev);
    return staging_done(&cu->ring[PV_QUEUE_COMPUTE], &region, st);
}

static const pv_backend_ops cuda_backend_ops = {
    .api_version = PV_BACKEND_API_VERSION,
    .name = "cuda",
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .init = cuda_init,
    .free = cuda_free,
    .supports = cuda_supports,
    .supports_weights = cuda_supports_weights,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_write = cuda_buffer_write,
    .buffer_read = cuda_buffer_read,
    .copy_async = cuda_copy_async,
    .event_record = cuda_event_record,
    .queue_wait = cuda_queue_wait,
    .event_wait = cuda_event_wait,
    .event_query = cuda_event_query,
    .event_free = cuda_event_free,
    .finish = cuda_finish,
    .gemm = cuda_gemm,
    .attention = cuda_attention,
    .kv_write = cuda_kv_write,
    .slot_gather = cuda_slot_gather,
    .slot_scatter = cuda_slot_scatter,
    .embed_gather = cuda_embed_gather,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .swiglu = cuda_swiglu,
    .add = cuda_add,
    .softmax = cuda_softmax,
    .argmax = cuda_argmax,
    .sample_top_p = cuda_sample_top_p,
    .qmatmul = cuda_qmatmul,
    .qmatmul_group = cuda_qmatmul_group,
    .add_rmsnorm = cuda_add_rmsnorm,
    .rope_kv_write = cuda_rope_kv_write,
    .qmatmul_swiglu = cuda_qmatmul_swiglu,
    .add_rmsnorm_group = cuda_add_rmsnorm_group,
    .add_rmsnorm_swiglu = cuda_add_rmsnorm_swiglu,
    .attention_qmatmul = cuda_attention_qmatmul,
    .slot_transfer = cuda_slot_transfer,
    .sample_batch = cuda_sample_batch,
    .graph_begin = pv_cuda_graph_begin,
    .graph_end = pv_cuda_graph_end,
    .marker_init = pv_cuda_marker_init,
    .marker_free = pv_cuda_marker_free,
    .marker_record = pv_cuda_marker_record,
    .marker_elapsed = pv_cuda_marker_elapsed,
    .tunable_kernels = 1,
};

/* The module's one exported symbol (backends/backend-module.h). */
const pv_backend_ops *pv_backend_module_ops(void)
{
    return &cuda_backend_ops;
}
