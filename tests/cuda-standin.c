/* A stand-in for the CUDA runtime and cuBLAS that runs the CUDA backend's
 * kernels on the OpenCL CPU device (PoCL), so that the backend's host code
 * (launchers, staging ring, graphs, swap, sampling on the device) runs
 * under make check on a machine without a GPU, against the CPU reference.
 * tests/cuda-standin/pensieve-cuda.so is backends/cuda/ linked with this
 * file instead of libcudart and libcublas (tests/backend.mk).
 *
 * What it runs: the kernels of kernels/, built by PoCL from the same text
 * and the same defines as the program NVRTC would build (the program
 * image carries the set, not a cubin: pv_cuda_program_image is wrapped
 * at link time). The CUDA-only code of the kernels (shuffles, dp4a) is
 * therefore not run: test-cuda-nvrtc and test-cuda-launch cover it.
 *
 * What it checks, beyond the results the tests compare:
 *   - work is deferred as on a GPU: a stream's commands run only when
 *     the host waits for them (a stream or event synchronisation, an
 *     event query, which first answers "not ready"), a command after a
 *     wait only once the awaited record has run, so a result read
 *     before its wait is stale;
 *   - a pinned host source changed between a copy's enqueue and its run,
 *     a kernel's pointer argument outside live device or pinned memory,
 *     a copy's device range outside one allocation: each is a sticky
 *     error (cudaErrorLaunchFailure, its message on stderr), as a fault
 *     is on a GPU;
 *   - graph capture as the runtime has it in relaxed mode: a kernel's
 *     arguments are taken at capture, a synchronisation of the capturing
 *     stream invalidates it, a copy there needs pinned or device memory,
 *     a wait there for an event recorded outside needs
 *     cudaEventWaitExternal, an event last recorded in a capture cannot
 *     be waited for or queried.
 * Device memory and pinned host memory are both fine-grained SVM, so one
 * address serves the host and the kernels (unified addressing). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backends/cuda/cuda_nvrtc.h"
#include "backends/kernel-params.h"
#include "kernels/kernel-sources.h"
#include "pensieve/half.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PARAMS 32

/* ---- state ----------------------------------------------------------------------- */

typedef struct standin_kernel {
    cl_kernel kernel;
    char name[64];
    int n_params;
    size_t size[MAX_PARAMS]; /* bytes of each parameter */
    int pointer[MAX_PARAMS];
    size_t offset[MAX_PARAMS]; /* in a command's packed argument bytes */
    size_t arg_bytes;
    struct standin_kernel *next;
} standin_kernel;

struct standin_library {
    cl_program program;
    char options[384];
    standin_kernel *kernels;
};

enum command_kind { CMD_KERNEL, CMD_COPY, CMD_RECORD, CMD_WAIT, CMD_GEMM, CMD_FREE };

typedef struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const void *a, *b;
    void *c;
    cudaDataType at, bt, ct;
} gemm_args;

typedef struct command {
    enum command_kind kind;
    standin_kernel *kernel;
    dim3 grid, block;
    unsigned char *args; /* CMD_KERNEL: the argument bytes, packed */
    void *dst;
    const void *src;
    size_t bytes;
    unsigned char *snapshot; /* CMD_COPY from pageable memory: its bytes at the enqueue */
    uint64_t src_sum;        /* CMD_COPY from pinned memory: its bytes' hash at the enqueue */
    int src_pinned;
    struct CUevent_st *event;
    uint64_t seq; /* CMD_RECORD: this record's number; CMD_WAIT: the record awaited (in a graph, 0:
                   * the event's last record when the graph is launched) */
    gemm_args gemm;
} command;

typedef struct command_list {
    command *c;
    size_t head, n, cap;
} command_list;

struct CUgraph_st {
    command_list list;
};

struct CUgraphExec_st {
    command_list list;
};

struct CUstream_st {
    command_list queue;
    struct CUgraph_st *capture; /* while capturing */
    int invalidated;
};

struct CUevent_st {
    unsigned int flags;
    uint64_t last_seq, done_seq; /* the last record enqueued, and run */
    struct CUstream_st *stream;  /* of the last record */
    struct CUgraph_st *captured; /* the capture that made the last record */
    double time;
    int queries; /* of the last record, unanswered */
};

struct cublasContext {
    cudaStream_t stream;
};

typedef struct allocation {
    char *base;
    size_t bytes;
    int pinned;
} allocation;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int probed, present;
    cl_context context;
    cl_command_queue queue;
    cl_device_id device;
    allocation *allocs;
    size_t n_allocs, cap_allocs;
    uint64_t seq;
    struct CUstream_st legacy;
    struct CUstream_st **streams; /* created and not destroyed */
    size_t n_streams;
    cudaError_t last_error;
    char fault[512]; /* the sticky error's story */
    int eager;       /* PV_CUDA_STANDIN_EAGER=1: every command runs at its enqueue */
} rt;

static cudaError_t fail(cudaError_t err)
{
    rt.last_error = err;
    return err;
}

/* A fault a GPU would report at a later call: every call fails from now on. */
static void fault(const char *fmt, ...)
{
    if (rt.fault[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt.fault, sizeof rt.fault, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuda stand-in: %s\n", rt.fault);
}

#define ENTER()                                                                                                        \
    pthread_mutex_lock(&lock);                                                                                         \
    if (rt.fault[0]) {                                                                                                 \
        pthread_mutex_unlock(&lock);                                                                                   \
        return fail(cudaErrorLaunchFailure);                                                                           \
    }
#define LEAVE(err)                                                                                                     \
    do {                                                                                                               \
        cudaError_t e_ = (err);                                                                                        \
        pthread_mutex_unlock(&lock);                                                                                   \
        return e_ == cudaSuccess ? e_ : fail(e_);                                                                      \
    } while (0)

/* A call that breaks the capture of stream s: said on stderr, as the
 * reason a graph was not kept is otherwise lost. */
static cudaError_t invalidate(struct CUstream_st *s, const char *call, cudaError_t err)
{
    s->invalidated = 1;
    fprintf(stderr, "cuda stand-in: %s during a capture invalidates it\n", call);
    return err;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* The first CPU device with fine-grained buffer SVM. */
static int probe(void)
{
    if (rt.probed)
        return rt.present;
    rt.probed = 1;
    const char *eager = getenv("PV_CUDA_STANDIN_EAGER");
    rt.eager = eager && strcmp(eager, "1") == 0;
    cl_platform_id platforms[8];
    cl_uint n_platforms = 0;
    if (clGetPlatformIDs(8, platforms, &n_platforms) != CL_SUCCESS)
        return 0;
    for (cl_uint p = 0; p < n_platforms && p < 8 && !rt.present; p++) {
        cl_device_id dev;
        cl_uint n = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_CPU, 1, &dev, &n) != CL_SUCCESS || n == 0)
            continue;
        cl_device_svm_capabilities svm = 0;
        if (clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL) != CL_SUCCESS ||
            !(svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER))
            continue;
        cl_int err;
        rt.context = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
        if (err != CL_SUCCESS)
            continue;
        rt.queue = clCreateCommandQueueWithProperties(rt.context, dev, NULL, &err);
        if (err != CL_SUCCESS) {
            clReleaseContext(rt.context);
            continue;
        }
        rt.device = dev;
        rt.present = 1;
    }
    return rt.present;
}

/* ---- memory ------------------------------------------------------------------------ */

static allocation *allocation_of(const void *p)
{
    const char *c = p;
    for (size_t i = 0; i < rt.n_allocs; i++)
        if (c >= rt.allocs[i].base && c < rt.allocs[i].base + rt.allocs[i].bytes)
            return &rt.allocs[i];
    return NULL;
}

static cudaError_t allocate(void **out, size_t bytes, int pinned)
{
    if (!probe())
        return cudaErrorNoDevice;
    if (rt.n_allocs == rt.cap_allocs) {
        size_t cap = rt.cap_allocs ? 2 * rt.cap_allocs : 64;
        allocation *grown = realloc(rt.allocs, cap * sizeof *grown);
        if (!grown)
            return cudaErrorMemoryAllocation;
        rt.allocs = grown;
        rt.cap_allocs = cap;
    }
    void *mem = clSVMAlloc(rt.context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, bytes ? bytes : 1, 128);
    if (!mem)
        return cudaErrorMemoryAllocation;
    rt.allocs[rt.n_allocs++] = (allocation){mem, bytes ? bytes : 1, pinned};
    *out = mem;
    return cudaSuccess;
}

static cudaError_t release(void *p, int pinned)
{
    if (!p)
        return cudaSuccess;
    for (size_t i = 0; i < rt.n_allocs; i++)
        if (rt.allocs[i].base == p && rt.allocs[i].pinned == pinned) {
            clSVMFree(rt.context, p);
            rt.allocs[i] = rt.allocs[--rt.n_allocs];
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}

/* A device-side range of a copy or GEMM: within one live allocation. */
static int range_ok(const void *p, size_t bytes, const char *what)
{
    const allocation *a = allocation_of(p);
    if (a && (const char *)p + bytes <= a->base + a->bytes)
        return 1;
    fault("%s: %zu bytes at %p are not within one allocation%s", what, bytes, p, a ? " (they run past its end)" : "");
    return 0;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ---- commands ---------------------------------------------------------------------- */

static void command_clear(command *c)
{
    free(c->args);
    free(c->snapshot);
    c->args = c->snapshot = NULL;
}

static int list_push(command_list *l, const command *c)
{
    if (l->n == l->cap) {
        if (l->head > 0) { /* reuse the run part */
            memmove(l->c, l->c + l->head, (l->n - l->head) * sizeof *l->c);
            l->n -= l->head;
            l->head = 0;
        }
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 64;
            command *grown = realloc(l->c, cap * sizeof *grown);
            if (!grown)
                return 0;
            l->c = grown;
            l->cap = cap;
        }
    }
    l->c[l->n++] = *c;
    return 1;
}

static void list_free(command_list *l)
{
    for (size_t i = l->head; i < l->n; i++)
        command_clear(&l->c[i]);
    free(l->c);
    memset(l, 0, sizeof *l);
}

/* A deep copy (a graph's command into a stream, a graph into its exec). */
static int command_copy(command *to, const command *from)
{
    *to = *from;
    to->args = NULL;
    to->snapshot = NULL;
    if (from->args) {
        to->args = malloc(from->kernel->arg_bytes);
        if (!to->args)
            return 0;
        memcpy(to->args, from->args, from->kernel->arg_bytes);
    }
    return 1;
}

static void run_kernel(const command *c)
{
    const standin_kernel *k = c->kernel;
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < k->n_params && err == CL_SUCCESS; i++) {
        const unsigned char *v = c->args + k->offset[i];
        if (!k->pointer[i]) {
            err = clSetKernelArg(k->kernel, (cl_uint)i, k->size[i], v);
            continue;
        }
        void *p;
        memcpy(&p, v, sizeof p);
        if (!p) {
            err = clSetKernelArg(k->kernel, (cl_uint)i, sizeof(cl_mem), NULL);
            continue;
        }
        const allocation *a = allocation_of(p);
        if (!a) {
            fault("kernel %s: argument %d (%p) is neither device nor pinned host memory, or was freed", k->name, i,
                  p);
            return;
        }
        err = clSetKernelArgSVMPointer(k->kernel, (cl_uint)i, p);
    }
    if (err != CL_SUCCESS) {
        fault("kernel %s: clSetKernelArg failed (%d)", k->name, (int)err);
        return;
    }
    const size_t global[2] = {(size_t)c->grid.x * c->block.x, c->grid.y}, local[2] = {c->block.x, 1};
    err = clEnqueueNDRangeKernel(rt.queue, k->kernel, 2, NULL, global, local, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clFinish(rt.queue);
    if (err != CL_SUCCESS)
        fault("kernel %s: %u x %u groups of %u failed on the OpenCL device (%d)", k->name, c->grid.x, c->grid.y,
              c->block.x, (int)err);
}

static float load_elem(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16F)
        return pv_half_to_float(h);
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static size_t elem_size(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

/* A column-major matrix of `rows` x `cols` (ld >= rows) widened to f32. */
static float *widen(const void *p, cudaDataType t, int rows, int cols, int ld)
{
    const size_t n = cols > 0 ? (size_t)ld * (size_t)(cols - 1) + (size_t)rows : 0;
    float *w = malloc((n ? n : 1) * sizeof *w);
    for (size_t i = 0; w && i < n; i++)
        w[i] = load_elem(p, t, i);
    return w;
}

static void run_gemm(const gemm_args *g)
{
    const int a_rows = g->ta == CUBLAS_OP_N ? g->m : g->k, a_cols = g->ta == CUBLAS_OP_N ? g->k : g->m;
    const int b_rows = g->tb == CUBLAS_OP_N ? g->k : g->n, b_cols = g->tb == CUBLAS_OP_N ? g->n : g->k;
    const size_t c_n = (size_t)g->ldc * (size_t)(g->n - 1) + (size_t)g->m;
    if (!range_ok(g->c, c_n * elem_size(g->ct), "GEMM's C") ||
        (g->k > 0 && (!range_ok(g->a, ((size_t)g->lda * (a_cols - 1) + a_rows) * elem_size(g->at), "GEMM's A") ||
                      !range_ok(g->b, ((size_t)g->ldb * (b_cols - 1) + b_rows) * elem_size(g->bt), "GEMM's B"))))
        return;
    float *a = g->k > 0 ? widen(g->a, g->at, a_rows, a_cols, g->lda) : NULL;
    float *b = g->k > 0 ? widen(g->b, g->bt, b_rows, b_cols, g->ldb) : NULL;
    float *c = widen(g->c, g->ct, g->m, g->n, g->ldc);
    if ((g->k > 0 && (!a || !b)) || !c) {
        fault("GEMM m=%d n=%d k=%d: out of host memory", g->m, g->n, g->k);
    } else if (g->k > 0) {
        cblas_sgemm(CblasColMajor, g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g->m, g->n, g->k, g->alpha, a, g->lda, b,
                    g->ldb, g->beta, c, g->ldc);
    } else {
        for (size_t i = 0; i < c_n; i++)
            c[i] *= g->beta;
    }
    for (size_t i = 0; c && i < c_n && !rt.fault[0]; i++) {
        if (g->ct == CUDA_R_32F)
            ((float *)g->c)[i] = c[i];
        else if (g->ct == CUDA_R_16F)
            ((uint16_t *)g->c)[i] = pv_float_to_half(c[i]);
        else {
            uint32_t bits;
            memcpy(&bits, &c[i], 4);
            ((uint16_t *)g->c)[i] = (uint16_t)((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
        }
    }
    free(a);
    free(b);
    free(c);
}

static void run_command(command *c)
{
    switch (c->kind) {
    case CMD_KERNEL:
        run_kernel(c);
        break;
    case CMD_COPY:
        if (c->src_pinned && hash_bytes(c->src, c->bytes) != c->src_sum) {
            const allocation *a = allocation_of(c->src);
            fault("a copy of %zu bytes from pinned host memory (offset %td of %zu bytes): its source changed "
                  "between the copy's enqueue and its run",
                  c->bytes, a ? (const char *)c->src - a->base : 0, a ? a->bytes : 0);
            break;
        }
        memcpy(c->dst, c->snapshot ? c->snapshot : c->src, c->bytes);
        break;
    case CMD_RECORD:
        if (c->event->done_seq < c->seq)
            c->event->done_seq = c->seq;
        c->event->time = now();
        break;
    case CMD_WAIT:
        break;
    case CMD_GEMM:
        run_gemm(&c->gemm);
        break;
    case CMD_FREE:
        if (release(c->dst, 0) != cudaSuccess)
            fault("cudaFreeAsync of %p: not device memory, or freed twice", c->dst);
        break;
    }
}

static int stream_run_one(struct CUstream_st *s, int depth);

/* Runs the stream whose record `seq` of ev is, until that record has run.
 * A record that is not queued, or waits that nest deeper than any chain of
 * streams can (a cycle), would hang a GPU: here they are faults. */
static int run_until_recorded(struct CUevent_st *ev, uint64_t seq, int depth)
{
    while (ev->done_seq < seq && !rt.fault[0])
        if (!ev->stream || !stream_run_one(ev->stream, depth + 1)) {
            fault("a wait for an event record that never runs (%s)",
                  depth > 64 ? "waits in a cycle" : "the record is not queued");
            return 0;
        }
    return !rt.fault[0];
}

/* Runs the stream's first command; 0 when it has none. */
static int stream_run_one(struct CUstream_st *s, int depth)
{
    command_list *q = &s->queue;
    if (q->head == q->n || depth > 64)
        return 0;
    command *c = &q->c[q->head];
    if (c->kind == CMD_WAIT && !run_until_recorded(c->event, c->seq, depth))
        return 0;
    run_command(c);
    command_clear(c);
    q->head++;
    if (q->head == q->n)
        q->head = q->n = 0;
    return 1;
}

static void stream_run_all(struct CUstream_st *s)
{
    while (!rt.fault[0] && stream_run_one(s, 0))
        ;
}

/* Whether a command queued on s records or awaits ev. */
static int stream_uses(const struct CUstream_st *s, const struct CUevent_st *ev)
{
    for (size_t i = s->queue.head; i < s->queue.n; i++)
        if (s->queue.c[i].event == ev)
            return 1;
    return 0;
}

static struct CUstream_st *stream_of(cudaStream_t s)
{
    return s ? s : &rt.legacy;
}

/* What a device-wide synchronisation (cudaFree, cudaFreeHost) does. */
static void device_run_all(void)
{
    for (size_t i = 0; i < rt.n_streams; i++)
        stream_run_all(rt.streams[i]);
    stream_run_all(&rt.legacy);
}

/* A command for stream s: into its capture, or its queue. */
static cudaError_t enqueue(struct CUstream_st *s, command *c)
{
    command_list *l = s->capture ? &s->capture->list : &s->queue;
    if (!list_push(l, c)) {
        command_clear(c);
        return cudaErrorMemoryAllocation;
    }
    if (rt.eager && !s->capture)
        stream_run_all(s);
    return cudaSuccess;
}

/* ---- devices ----------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    pthread_mutex_lock(&lock);
    *count = probe();
    LEAVE(*count ? cudaSuccess : cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    ENTER();
    LEAVE(probe() && device == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    ENTER();
    if (!probe() || device != 0)
        LEAVE(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CUDA stand-in on PoCL");
    prop->major = 9;
    prop->minor = 0;
    prop->totalGlobalMem = (size_t)4 << 30;
    prop->multiProcessorCount = 16;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    LEAVE(cudaSuccess);
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    ENTER();
    if (!probe() || device != 0)
        LEAVE(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
        *value = 9;
        break;
    case cudaDevAttrComputeCapabilityMinor:
        *value = 0;
        break;
    case cudaDevAttrMemoryPoolsSupported:
        *value = 1;
        break;
    case cudaDevAttrMultiProcessorCount:
        *value = 16;
        break;
    default:
        LEAVE(cudaErrorInvalidValue);
    }
    LEAVE(cudaSuccess);
}

cudaError_t cudaGetLastError(void)
{
    pthread_mutex_lock(&lock);
    const cudaError_t err = rt.fault[0] ? cudaErrorLaunchFailure : rt.last_error;
    rt.last_error = cudaSuccess;
    pthread_mutex_unlock(&lock);
    return err;
}

const char *cudaGetErrorString(cudaError_t error)
{
    if (error == cudaErrorLaunchFailure && rt.fault[0])
        return rt.fault;
    return error == cudaSuccess ? "no error" : "an error of the CUDA stand-in (see its name)";
}

const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorGraphExecUpdateFailure: return "cudaErrorGraphExecUpdateFailure";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorInvalidKernelImage: return "cudaErrorInvalidKernelImage";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
    }
}

/* ---- memory calls ------------------------------------------------------------------ */

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    ENTER();
    LEAVE(allocate(p, bytes, 0));
}

cudaError_t cudaFree(void *p)
{
    ENTER();
    device_run_all(); /* cudaFree waits for the device first */
    LEAVE(release(p, 0));
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags)
{
    (void)flags;
    ENTER();
    LEAVE(allocate(p, bytes, 1));
}

cudaError_t cudaFreeHost(void *p)
{
    ENTER();
    device_run_all(); /* as cudaFree */
    LEAVE(release(p, 1));
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    ENTER();
    const allocation *a = allocation_of(host);
    if (flags || !a || !a->pinned)
        LEAVE(cudaErrorInvalidValue);
    *dev = host; /* unified addressing */
    LEAVE(cudaSuccess);
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t stream)
{
    ENTER();
    if (stream_of(stream)->capture) /* the backend records no allocation */
        LEAVE(invalidate(stream_of(stream), "cudaMallocAsync", cudaErrorStreamCaptureUnsupported));
    LEAVE(allocate(p, bytes, 0));
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t stream)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    if (s->capture)
        LEAVE(invalidate(s, "cudaFreeAsync", cudaErrorStreamCaptureUnsupported));
    command c = {.kind = CMD_FREE, .dst = p};
    LEAVE(enqueue(s, &c));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    ENTER();
    (void)kind;
    struct CUstream_st *s = stream_of(stream);
    const allocation *da = allocation_of(dst), *sa = allocation_of(src);
    if ((da && !range_ok(dst, bytes, "cudaMemcpyAsync's destination")) ||
        (sa && !range_ok(src, bytes, "cudaMemcpyAsync's source")))
        LEAVE(cudaErrorInvalidValue);
    if (!bytes)
        LEAVE(cudaSuccess);
    command c = {.kind = CMD_COPY, .dst = dst, .src = src, .bytes = bytes};
    if (s->capture && (!da || !sa)) /* a graph copies between pinned and device memory only */
        LEAVE(invalidate(s, "cudaMemcpyAsync with pageable memory", cudaErrorStreamCaptureUnsupported));
    if (!sa) { /* pageable: the runtime has taken the bytes when the call returns */
        c.snapshot = malloc(bytes);
        if (!c.snapshot)
            LEAVE(cudaErrorMemoryAllocation);
        memcpy(c.snapshot, src, bytes);
    } else if (sa->pinned) {
        c.src_pinned = 1;
        c.src_sum = hash_bytes(src, bytes);
    }
    cudaError_t err = enqueue(s, &c);
    if (err == cudaSuccess && !da && !s->capture) /* to pageable memory: returns when the bytes are there */
        stream_run_all(s);
    LEAVE(err);
}

/* ---- streams and events ------------------------------------------------------------ */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    ENTER();
    struct CUstream_st *s = calloc(1, sizeof *s);
    struct CUstream_st **grown = realloc(rt.streams, (rt.n_streams + 1) * sizeof *grown);
    if (grown)
        rt.streams = grown;
    if (!s || !grown) {
        free(s);
        LEAVE(cudaErrorMemoryAllocation);
    }
    rt.streams[rt.n_streams++] = s;
    *stream = s;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    ENTER();
    if (!stream || stream->capture)
        LEAVE(cudaErrorInvalidResourceHandle);
    stream_run_all(stream); /* its work completes, as the runtime's does */
    list_free(&stream->queue);
    for (size_t i = 0; i < rt.n_streams; i++)
        if (rt.streams[i] == stream)
            rt.streams[i] = rt.streams[--rt.n_streams];
    if (!rt.n_streams) {
        free(rt.streams);
        rt.streams = NULL;
    }
    free(stream);
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    if (s->capture)
        LEAVE(invalidate(s, "cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported));
    stream_run_all(s);
    LEAVE(rt.fault[0] ? cudaErrorLaunchFailure : cudaSuccess);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    ENTER();
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev)
        LEAVE(cudaErrorMemoryAllocation);
    ev->flags = flags;
    *event = ev;
    LEAVE(cudaSuccess);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    ENTER();
    if (!event)
        LEAVE(cudaErrorInvalidResourceHandle);
    /* The runtime keeps an event alive while queued work records or awaits
     * it; here that work runs first. */
    for (size_t i = 0; i <= rt.n_streams; i++) {
        struct CUstream_st *s = i < rt.n_streams ? rt.streams[i] : &rt.legacy;
        while (!rt.fault[0] && stream_uses(s, event))
            stream_run_one(s, 0);
    }
    free(event);
    LEAVE(cudaSuccess);
}

static cudaError_t record(cudaEvent_t event, cudaStream_t stream, int external)
{
    struct CUstream_st *s = stream_of(stream);
    command c = {.kind = CMD_RECORD, .event = event, .seq = ++rt.seq};
    if (s->capture && !external) { /* a dependency of the capture, not a record */
        event->captured = s->capture;
        event->stream = s;
        return cudaSuccess;
    }
    if (!s->capture) {
        event->queries = 0;
        event->last_seq = c.seq;
        event->stream = s;
        event->captured = NULL;
    }
    return enqueue(s, &c);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    ENTER();
    LEAVE(record(event, stream, 0));
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    ENTER();
    if (flags & cudaEventRecordExternal && !stream_of(stream)->capture)
        LEAVE(cudaErrorIllegalState);
    LEAVE(record(event, stream, (flags & cudaEventRecordExternal) != 0));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    if (s->capture) {
        if (flags & cudaEventWaitExternal) {
            command c = {.kind = CMD_WAIT, .event = event};
            LEAVE(enqueue(s, &c));
        }
        if (event->captured == s->capture)
            LEAVE(cudaSuccess); /* within the capture: one stream, in order */
        LEAVE(invalidate(s, "cudaStreamWaitEvent for an event recorded outside it, not external",
                         cudaErrorStreamCaptureIsolation));
    }
    if (event->captured)
        LEAVE(cudaErrorCapturedEvent);
    if (event->done_seq >= event->last_seq)
        LEAVE(cudaSuccess);
    command c = {.kind = CMD_WAIT, .event = event, .seq = event->last_seq};
    LEAVE(enqueue(s, &c));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    ENTER();
    if (event->captured)
        LEAVE(cudaErrorCapturedEvent);
    run_until_recorded(event, event->last_seq, 0);
    LEAVE(rt.fault[0] ? cudaErrorLaunchFailure : cudaSuccess);
}

/* "Not ready" while the last record has not run; asked a second time,
 * the record runs (and the answer is still "not ready"), as a device makes
 * progress of its own, so a host that polls without waiting goes on. */
cudaError_t cudaEventQuery(cudaEvent_t event)
{
    ENTER();
    if (event->captured)
        LEAVE(cudaErrorCapturedEvent);
    if (event->done_seq >= event->last_seq)
        LEAVE(cudaSuccess);
    if (++event->queries > 1)
        run_until_recorded(event, event->last_seq, 0);
    LEAVE(cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    ENTER();
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        LEAVE(cudaErrorInvalidResourceHandle);
    if (!start->last_seq || !end->last_seq || start->done_seq < start->last_seq || end->done_seq < end->last_seq)
        LEAVE(cudaErrorNotReady);
    *ms = (float)((end->time - start->time) * 1e3);
    LEAVE(cudaSuccess);
}

/* ---- graphs ------------------------------------------------------------------------ */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    if (!stream || s->capture || mode != cudaStreamCaptureModeRelaxed)
        LEAVE(cudaErrorIllegalState);
    s->capture = calloc(1, sizeof *s->capture);
    s->invalidated = 0;
    LEAVE(s->capture ? cudaSuccess : cudaErrorMemoryAllocation);
}

static void graph_free(struct CUgraph_st *g)
{
    if (g) {
        list_free(&g->list);
        free(g);
    }
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    *graph = NULL;
    if (!s->capture)
        LEAVE(cudaErrorIllegalState);
    struct CUgraph_st *g = s->capture;
    s->capture = NULL;
    if (s->invalidated) {
        graph_free(g);
        LEAVE(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    LEAVE(cudaSuccess);
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    ENTER();
    graph_free(graph);
    LEAVE(cudaSuccess);
}

static int list_copy(command_list *to, const command_list *from)
{
    memset(to, 0, sizeof *to);
    for (size_t i = from->head; i < from->n; i++) {
        command c;
        if (!command_copy(&c, &from->c[i]) || !list_push(to, &c)) {
            command_clear(&c);
            list_free(to);
            return 0;
        }
    }
    return 1;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    ENTER();
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (flags || !e || !list_copy(&e->list, &graph->list)) {
        free(e);
        LEAVE(flags ? cudaErrorInvalidValue : cudaErrorMemoryAllocation);
    }
    *exec = e;
    LEAVE(cudaSuccess);
}

/* The runtime updates a graph of the same nodes in place: the same kinds
 * in the same order, a kernel node keeping its function. */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph, cudaGraphExecUpdateResultInfo *info)
{
    ENTER();
    memset(info, 0, sizeof *info);
    const command_list *a = &exec->list, *b = &graph->list;
    int same = a->n - a->head == b->n - b->head;
    for (size_t i = 0; same && i < b->n - b->head; i++) {
        const command *x = &a->c[a->head + i], *y = &b->c[b->head + i];
        same = x->kind == y->kind && x->kernel == y->kernel && x->event == y->event;
    }
    if (!same) {
        info->result = cudaGraphExecUpdateErrorTopologyChanged;
        LEAVE(cudaErrorGraphExecUpdateFailure);
    }
    command_list fresh;
    if (!list_copy(&fresh, b))
        LEAVE(cudaErrorMemoryAllocation);
    list_free(&exec->list);
    exec->list = fresh;
    info->result = cudaGraphExecUpdateSuccess;
    LEAVE(cudaSuccess);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    ENTER();
    if (exec) {
        list_free(&exec->list);
        free(exec);
    }
    LEAVE(cudaSuccess);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    ENTER();
    struct CUstream_st *s = stream_of(stream);
    if (s->capture)
        LEAVE(cudaErrorStreamCaptureUnsupported);
    for (size_t i = exec->list.head; i < exec->list.n; i++) {
        command c;
        if (!command_copy(&c, &exec->list.c[i]))
            LEAVE(cudaErrorMemoryAllocation);
        if (c.kind == CMD_RECORD) { /* an external record node: the event's new record */
            c.seq = ++rt.seq;
            c.event->queries = 0;
            c.event->last_seq = c.seq;
            c.event->stream = s;
            c.event->captured = NULL;
        } else if (c.kind == CMD_WAIT) { /* an external wait node: the record before this launch */
            if (c.event->done_seq >= c.event->last_seq) {
                command_clear(&c);
                continue;
            }
            c.seq = c.event->last_seq;
        } else if (c.kind == CMD_COPY && c.src_pinned) {
            c.src_sum = hash_bytes(c.src, c.bytes);
        }
        cudaError_t err = enqueue(s, &c);
        if (err != cudaSuccess)
            LEAVE(err);
    }
    LEAVE(cudaSuccess);
}

/* ---- programs and launches --------------------------------------------------------- */

/* The program image: the family and its defines, for PoCL to build. */
#define IMAGE_MAGIC "pv-cuda-standin"
typedef struct standin_image {
    char magic[16];
    int family;
    char defines[256];
} standin_image;

pv_status __wrap_pv_cuda_program_image(const char *dir, const pv_kernel_params *params, pv_cuda_target target,
                                       pv_cuda_image *out);
pv_status __wrap_pv_cuda_program_image(const char *dir, const pv_kernel_params *params, pv_cuda_target target,
                                       pv_cuda_image *out)
{
    (void)dir, (void)target;
    standin_image *im = calloc(1, sizeof *im);
    if (!im)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda stand-in: a program image");
    snprintf(im->magic, sizeof im->magic, "%s", IMAGE_MAGIC);
    im->family = (int)params->family;
    if (pv_kernel_params_defines(params, im->defines, sizeof im->defines) >= (int)sizeof im->defines) {
        free(im);
        return pv_error(PV_ERR_INVALID_ARG, "cuda stand-in: the defines of a set do not fit in %zu bytes",
                        sizeof im->defines);
    }
    out->data = im;
    out->size = sizeof *im;
    return PV_OK;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, enum cudaJitOption *jitOptions,
                                void **jitOptionsValues, unsigned int numJitOptions,
                                enum cudaLibraryOption *libraryOptions, void **libraryOptionValues,
                                unsigned int numLibraryOptions)
{
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    ENTER();
    const standin_image *im = code;
    if (!probe() || strcmp(im->magic, IMAGE_MAGIC) != 0)
        LEAVE(cudaErrorInvalidKernelImage);
    struct standin_library *lib = calloc(1, sizeof *lib);
    if (!lib)
        LEAVE(cudaErrorMemoryAllocation);
    /* the OpenCL backend's options (opencl-kernels.c), so PoCL's cache
     * serves both; they keep the parameters' types for the launches */
    snprintf(lib->options, sizeof lib->options, "-cl-std=CL1.2 -cl-kernel-arg-info %s ", im->defines);
    const char *sources[2] = {pv_kernel_source_dialect, pv_kernel_family_source((pv_kernel_family)im->family)};
    cl_int err;
    lib->program = clCreateProgramWithSource(rt.context, 2, sources, NULL, &err);
    if (err == CL_SUCCESS)
        err = clBuildProgram(lib->program, 1, &rt.device, lib->options, NULL, NULL);
    if (err != CL_SUCCESS) {
        char log[2048] = "";
        if (lib->program)
            clGetProgramBuildInfo(lib->program, rt.device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        fprintf(stderr, "cuda stand-in: building kernels/%s.cl with \"%s\" failed (%d): %s\n",
                pv_kernel_family_spec_of((pv_kernel_family)im->family)->name, lib->options, (int)err, log);
        if (lib->program)
            clReleaseProgram(lib->program);
        free(lib);
        LEAVE(cudaErrorInvalidKernelImage);
    }
    *library = (cudaLibrary_t)lib;
    LEAVE(cudaSuccess);
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
    ENTER();
    struct standin_library *lib = (struct standin_library *)library;
    if (lib) {
        while (lib->kernels) {
            standin_kernel *k = lib->kernels;
            lib->kernels = k->next;
            clReleaseKernel(k->kernel);
            free(k);
        }
        clReleaseProgram(lib->program);
        free(lib);
    }
    LEAVE(cudaSuccess);
}

/* A scalar parameter's size from its OpenCL type name (kernels/dialect.h's
 * typedefs included). */
static size_t scalar_size(const char *type)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {{"int", 4}, {"uint", 4}, {"float", 4}, {"long", 8}, {"ulong", 8}, {"pv_long", 8},
                 {"pv_u32", 4}, {"short", 2}, {"ushort", 2}, {"pv_u16", 2}, {"char", 1}, {"uchar", 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(type, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name)
{
    ENTER();
    struct standin_library *lib = (struct standin_library *)library;
    standin_kernel *k = calloc(1, sizeof *k);
    if (!k)
        LEAVE(cudaErrorMemoryAllocation);
    cl_int err;
    k->kernel = clCreateKernel(lib->program, name, &err);
    if (err != CL_SUCCESS) {
        free(k);
        LEAVE(cudaErrorSymbolNotFound);
    }
    snprintf(k->name, sizeof k->name, "%s", name);
    cl_uint n = 0;
    err = clGetKernelInfo(k->kernel, CL_KERNEL_NUM_ARGS, sizeof n, &n, NULL);
    k->n_params = (int)n;
    for (cl_uint i = 0; err == CL_SUCCESS && i < n && i < MAX_PARAMS; i++) {
        cl_kernel_arg_address_qualifier q;
        char type[64] = "";
        err = clGetKernelArgInfo(k->kernel, i, CL_KERNEL_ARG_ADDRESS_QUALIFIER, sizeof q, &q, NULL);
        if (err == CL_SUCCESS)
            err = clGetKernelArgInfo(k->kernel, i, CL_KERNEL_ARG_TYPE_NAME, sizeof type, type, NULL);
        if (err != CL_SUCCESS)
            break;
        k->pointer[i] = q == CL_KERNEL_ARG_ADDRESS_GLOBAL || q == CL_KERNEL_ARG_ADDRESS_CONSTANT;
        k->size[i] = k->pointer[i] ? sizeof(void *) : scalar_size(type);
        if (!k->size[i] || q == CL_KERNEL_ARG_ADDRESS_LOCAL) {
            fprintf(stderr, "cuda stand-in: kernel %s: parameter %u of type %s is not a pointer or known scalar\n",
                    name, i, type);
            err = CL_INVALID_KERNEL_ARGS;
            break;
        }
        k->offset[i] = k->arg_bytes;
        k->arg_bytes += k->size[i];
    }
    if (err != CL_SUCCESS || n > MAX_PARAMS) {
        clReleaseKernel(k->kernel);
        free(k);
        LEAVE(cudaErrorInvalidKernelImage);
    }
    k->next = lib->kernels;
    lib->kernels = k;
    *kernel = (cudaKernel_t)k;
    LEAVE(cudaSuccess);
}

cudaError_t cudaFuncGetParamInfo(const void *func, size_t index, size_t *offset, size_t *size)
{
    ENTER();
    const standin_kernel *k = func;
    if (index >= (size_t)k->n_params)
        LEAVE(cudaErrorInvalidValue);
    *offset = k->offset[index];
    *size = k->size[index];
    LEAVE(cudaSuccess);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t stream)
{
    ENTER();
    standin_kernel *k = (standin_kernel *)func;
    if (grid.x < 1 || grid.y < 1 || grid.y > 65535 || grid.z != 1 || block.x < 1 || block.x > 1024 ||
        block.y != 1 || block.z != 1 || shared != 0)
        LEAVE(cudaErrorInvalidValue);
    command c = {.kind = CMD_KERNEL, .kernel = k, .grid = grid, .block = block};
    c.args = malloc(k->arg_bytes ? k->arg_bytes : 1);
    if (!c.args)
        LEAVE(cudaErrorMemoryAllocation);
    for (int i = 0; i < k->n_params; i++)
        memcpy(c.args + k->offset[i], args[i], k->size[i]);
    LEAVE(enqueue(stream_of(stream), &c));
}

/* ---- cuBLAS ------------------------------------------------------------------------ */

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    struct cublasContext *h = calloc(1, sizeof *h);
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    return status == CUBLAS_STATUS_SUCCESS ? "success" : "not supported by the CUDA stand-in";
}

static cublasStatus_t gemm(cublasHandle_t handle, const gemm_args *g)
{
    pthread_mutex_lock(&lock);
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (rt.fault[0])
        st = CUBLAS_STATUS_EXECUTION_FAILED;
    else if (g->m < 0 || g->n < 0 || g->k < 0 || g->lda < 1 || g->ldb < 1 || g->ldc < (g->m > 1 ? g->m : 1))
        st = CUBLAS_STATUS_INVALID_VALUE;
    else if (g->m > 0 && g->n > 0) {
        command c = {.kind = CMD_GEMM, .gemm = *g};
        if (enqueue(stream_of(handle->stream), &c) != cudaSuccess)
            st = CUBLAS_STATUS_ALLOC_FAILED;
    }
    pthread_mutex_unlock(&lock);
    return st;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc)
{
    const gemm_args g = {transa, transb, m, n, k, lda, ldb, ldc, *alpha, *beta, A, B, C,
                         CUDA_R_32F, CUDA_R_32F, CUDA_R_32F};
    return gemm(handle, &g);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    const int type_ok = (Atype == CUDA_R_32F || Atype == CUDA_R_16F || Atype == CUDA_R_16BF) &&
                        (Btype == CUDA_R_32F || Btype == CUDA_R_16F || Btype == CUDA_R_16BF) &&
                        (Ctype == CUDA_R_32F || Ctype == CUDA_R_16F || Ctype == CUDA_R_16BF);
    /* f32 alpha and beta: the 32F compute types (tensor-core variants included) */
    if (!type_ok || (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32 &&
                     computeType != CUBLAS_COMPUTE_32F_FAST_16F && computeType != CUBLAS_COMPUTE_32F_FAST_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const gemm_args g = {transa, transb, m, n, k, lda, ldb, ldc, *(const float *)alpha, *(const float *)beta,
                         A, B, C, Atype, Btype, Ctype};
    return gemm(handle, &g);
}
