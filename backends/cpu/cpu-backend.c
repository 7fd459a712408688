/* The CPU backend: the reference every other backend is tested against.
 * Buffers of both kinds are aligned host memory, copies are memcpy and every
 * op runs to completion before it returns, so events are already complete
 * when they are handed out (but are still real objects, freed by
 * event_free). GEMM goes through OpenBLAS. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <cblas.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* Cache-line and SIMD friendly; also what posix_memalign needs. */
#define PV_CPU_ALIGN 64
/* Buffers of at least PV_CPU_HUGE_MIN bytes start on a 2 MiB boundary, so
 * that those advised as streamed (weights) can be backed by transparent huge
 * pages: the hardware prefetchers stop at every 4 KiB page boundary. Others
 * (the KV pool) keep small pages: a huge page's first touch may compact
 * memory, a pause that belongs at load, not in a request. */
#define PV_CPU_HUGE_PAGE ((size_t)2 << 20)
#define PV_CPU_HUGE_MIN ((uint64_t)8 << 20)

static pv_status cpu_device_count(int *count)
{
    *count = 1;
    return PV_OK;
}

/* Copies the value of the first "key : value" line of /proc/cpuinfo whose
 * key is `key`; leaves `dst` untouched when there is none. */
static void cpuinfo_field(const char *key, char *dst, size_t dst_size)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    size_t key_len = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, key_len) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t')
            value++;
        value[strcspn(value, "\n")] = '\0';
        snprintf(dst, dst_size, "%s", value);
        break;
    }
    fclose(f);
}

static pv_status cpu_device_info(int device, pv_device_info *info)
{
    if (device != 0)
        return pv_error(PV_ERR_INVALID_ARG, "cpu: device %d out of range (the CPU backend has 1 device)",
                        device);
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "CPU");
    snprintf(info->vendor, sizeof info->vendor, "unknown");
    cpuinfo_field("model name", info->name, sizeof info->name);
    cpuinfo_field("vendor_id", info->vendor, sizeof info->vendor);
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0)
        info->global_mem_bytes = (uint64_t)pages * (uint64_t)page_size;
    info->max_alloc_bytes = info->global_mem_bytes;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    info->compute_units = cores > 0 ? (uint32_t)cores : 1;
    info->has_f16 = 0; /* OpenBLAS has no f16 GEMM */
    return PV_OK;
}

/* All work is synchronous; the state is a scratch buffer that the batched
 * quantized matmul widens weight tiles into, and the kernel choice. */
typedef struct cpu_state {
    float *scratch;
    uint64_t scratch_floats;
    int avx2_kernels;
} cpu_state;

static pv_status cpu_init(pv_backend *be)
{
    cpu_state *s = calloc(1, sizeof *s);
    if (!s)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: cannot allocate the backend state");
    /* PV_CPU_KERNELS=portable runs the portable kernels on any CPU, so the
     * tests check them on machines whose CPU would pick AVX2. The CPU is
     * asked once here: CPUID traps to the hypervisor in a VM, too slow for
     * every op of a decode step. */
    const char *kernels = getenv("PV_CPU_KERNELS");
    s->avx2_kernels = !(kernels && strcmp(kernels, "portable") == 0) && pv_cpu_avx2_available();
    be->impl = s;
    be->info.activation_bits = pv_cpu_qmatmul_activation_bits(be);
    return PV_OK;
}

int pv_cpu_avx2_kernels(const pv_backend *be)
{
    const cpu_state *s = be->impl;
    return s->avx2_kernels;
}

static void cpu_free(pv_backend *be)
{
    cpu_state *s = be->impl;
    if (s)
        free(s->scratch);
    free(s);
    be->impl = NULL;
}

pv_status pv_cpu_scratch(pv_backend *be, uint64_t floats, float **out)
{
    cpu_state *s = be->impl;
    if (floats > s->scratch_floats) {
        float *grown = NULL;
        if (floats > SIZE_MAX / sizeof(float) ||
            posix_memalign((void **)&grown, PV_CPU_ALIGN, (size_t)floats * sizeof(float)) != 0)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: cannot allocate %" PRIu64 " floats of scratch",
                            floats);
        free(s->scratch);
        s->scratch = grown;
        s->scratch_floats = floats;
    }
    *out = s->scratch;
    return PV_OK;
}

static int cpu_supports_weights(const pv_backend *be, pv_op op, pv_wtype t)
{
    (void)be;
    return (op == PV_OP_QMATMUL || op == PV_OP_QMATMUL_SWIGLU || op == PV_OP_EMBED_GATHER) &&
           pv_cpu_qmatmul_supports(t);
}

static int cpu_supports(const pv_backend *be, pv_op op, pv_dtype dtype)
{
    switch (op) {
    case PV_OP_GEMM:
        return dtype == PV_F32;
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

static pv_status cpu_buffer_alloc(pv_backend *be, pv_mem_kind kind, uint64_t bytes, pv_buffer *buf)
{
    /* Round up so a zero-byte buffer still has a distinct pointer. */
    uint64_t rounded = (bytes + PV_CPU_ALIGN - 1) / PV_CPU_ALIGN * PV_CPU_ALIGN;
    if (rounded == 0)
        rounded = PV_CPU_ALIGN;
    if (rounded < bytes || rounded > (uint64_t)SIZE_MAX)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: buffer of %llu bytes exceeds the address space",
                        (unsigned long long)bytes);
    void *mem = NULL;
    int rc = posix_memalign(&mem, rounded >= PV_CPU_HUGE_MIN ? PV_CPU_HUGE_PAGE : PV_CPU_ALIGN, (size_t)rounded);
    if (rc != 0)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a buffer of %llu bytes: %s",
                        (unsigned long long)bytes, strerror(rc));
    buf->backend = be;
    buf->kind = kind;
    buf->bytes = bytes;
    buf->host_ptr = mem;
    buf->handle = mem;
    return PV_OK;
}

static pv_status cpu_buffer_advise_streamed(pv_backend *be, pv_buffer *buf)
{
    (void)be;
#ifdef MADV_HUGEPAGE
    /* Advice to the kernel too: where it declines, nothing changes. */
    if (buf->bytes >= PV_CPU_HUGE_MIN)
        madvise(buf->host_ptr, (size_t)buf->bytes, MADV_HUGEPAGE);
#else
    (void)buf;
#endif
    return PV_OK;
}

static void cpu_buffer_free(pv_backend *be, pv_buffer *buf)
{
    free(buf->host_ptr);
    buf->host_ptr = NULL;
    buf->handle = NULL;
}

static pv_status cpu_buffer_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, const void *src,
                                  uint64_t bytes)
{
    memcpy((char *)dst->host_ptr + dst_off, src, (size_t)bytes);
    return PV_OK;
}

static pv_status cpu_buffer_read(pv_backend *be, const pv_buffer *src, uint64_t src_off, void *dst,
                                 uint64_t bytes)
{
    memcpy(dst, (const char *)src->host_ptr + src_off, (size_t)bytes);
    return PV_OK;
}

/* Every CPU event is complete from birth; the object only carries identity. */
static pv_status cpu_event_new(pv_backend *be, pv_event **out)
{
    pv_event *ev = malloc(sizeof *ev);
    if (!ev)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: cannot allocate an event (%zu bytes)", sizeof *ev);
    ev->backend = be;
    ev->handle = NULL;
    *out = ev;
    return PV_OK;
}

static pv_status cpu_copy_async(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off,
                                const pv_buffer *src, uint64_t src_off, uint64_t bytes, pv_event *wait,
                                pv_event **done)
{
    be->copies++;
    /* memmove: a device-to-device copy within one buffer may overlap. */
    memmove((char *)dst->host_ptr + dst_off, (const char *)src->host_ptr + src_off, (size_t)bytes);
    return done ? cpu_event_new(be, done) : PV_OK;
}

static pv_status cpu_event_record(pv_backend *be, pv_queue q, pv_event **out)
{
    return cpu_event_new(be, out);
}

static pv_status cpu_queue_wait(pv_backend *be, pv_queue q, pv_event *ev)
{
    return PV_OK;
}

static pv_status cpu_event_wait(pv_backend *be, pv_event *ev)
{
    return PV_OK;
}

static pv_status cpu_event_query(pv_backend *be, pv_event *ev, int *done)
{
    *done = 1;
    return PV_OK;
}

static void cpu_event_free(pv_backend *be, pv_event *ev)
{
    free(ev);
}

static pv_status cpu_finish(pv_backend *be)
{
    return PV_OK;
}

/* A marker's time is the host's monotonic clock at its record: every op
 * has run when its call returns, so the queue reaches the marker then. The
 * handle holds the seconds. */
static pv_status cpu_marker_init(pv_backend *be, pv_marker *m)
{
    double *t = calloc(1, sizeof *t);
    if (!t)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu: cannot allocate a marker (%zu bytes)", sizeof *t);
    m->handle = t;
    return PV_OK;
}

static void cpu_marker_free(pv_backend *be, pv_marker *m)
{
    free(m->handle);
}

static pv_status cpu_marker_record(pv_backend *be, pv_marker *m)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    *(double *)m->handle = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
    return PV_OK;
}

static pv_status cpu_marker_elapsed(pv_backend *be, const pv_marker *start, const pv_marker *end, double *seconds)
{
    *seconds = *(const double *)end->handle - *(const double *)start->handle;
    return PV_OK;
}

/* C[m x n] = alpha * op(A)[m x k] op(B)[k x n] + beta * C, row-major. */
static pv_status cpu_gemm(pv_backend *be, const pv_gemm_args *a)
{
    be->launches++; /* see CPU_OP below */
    const float *A = pv_cpu_elem_ptr(a->a, a->a_off, sizeof(float));
    const float *B = pv_cpu_elem_ptr(a->b, a->b_off, sizeof(float));
    float *C = pv_cpu_elem_ptr(a->c, a->c_off, sizeof(float));
    /* A decode batch against weights stored [n][k]: sgemm would pack all of
     * B on every call, which costs as much as the products at a few rows. */
    if (pv_cpu_gemm_small(a, A, B, C))
        return PV_OK;
    /* One row of C (a decode step) is a matrix-vector product: sgemm would
     * first pack all of B, doubling the memory traffic that bounds decode. */
    if (a->m == 1 && a->k > 0) {
        /* c[n] = alpha * op(B)^T a[k] + beta * c: op(B) is k x n. */
        cblas_sgemv(CblasRowMajor, a->trans_b ? CblasNoTrans : CblasTrans,
                    (blasint)(a->trans_b ? a->n : a->k), (blasint)(a->trans_b ? a->k : a->n),
                    a->alpha, B, (blasint)a->ldb, A, a->trans_a ? (blasint)a->lda : 1, a->beta, C, 1);
        return PV_OK;
    }
    cblas_sgemm(CblasRowMajor, a->trans_a ? CblasTrans : CblasNoTrans,
                a->trans_b ? CblasTrans : CblasNoTrans, (blasint)a->m, (blasint)a->n, (blasint)a->k,
                a->alpha, A, (blasint)a->lda, B, (blasint)a->ldb, a->beta, C, (blasint)a->ldc);
    return PV_OK;
}

/* Each op call is one launch here (pv_backend_launches), counted at the
 * vtable so that ops which call others internally (a group of products, a
 * fused op) count once. */
#define CPU_OP(name, args_type)                                                                    \
    static pv_status cpu_##name(pv_backend *be, const args_type *a)                                \
    {                                                                                              \
        be->launches++;                                                                            \
        return pv_cpu_##name(be, a);                                                               \
    }
CPU_OP(attention, pv_attention_args)
CPU_OP(kv_write, pv_kv_write_args)
CPU_OP(slot_gather, pv_slot_copy_args)
CPU_OP(slot_scatter, pv_slot_copy_args)
CPU_OP(embed_gather, pv_embed_gather_args)
CPU_OP(rmsnorm, pv_rmsnorm_args)
CPU_OP(rope, pv_rope_args)
CPU_OP(swiglu, pv_swiglu_args)
CPU_OP(add, pv_add_args)
CPU_OP(softmax, pv_softmax_args)
CPU_OP(argmax, pv_argmax_args)
CPU_OP(sample_top_p, pv_sample_args)
CPU_OP(qmatmul, pv_qmatmul_args)
CPU_OP(add_rmsnorm, pv_add_rmsnorm_args)
CPU_OP(rope_kv_write, pv_rope_kv_write_args)
CPU_OP(qmatmul_swiglu, pv_qmatmul_swiglu_args)
CPU_OP(sample_batch, pv_sample_batch_args)
#undef CPU_OP

/* Synchronous like every CPU op: done is complete at birth, and wait has
 * completed already (CPU events always have). */
static pv_status cpu_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    be->launches++;
    pv_cpu_slot_transfer(be, a);
    return done ? cpu_event_new(be, done) : PV_OK;
}

static pv_status cpu_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    be->launches++;
    return pv_cpu_qmatmul_group(be, products, n);
}

const pv_backend_ops pv_cpu_backend_ops = {
    .api_version = PV_BACKEND_API_VERSION,
    .name = "cpu",
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .init = cpu_init,
    .free = cpu_free,
    .supports = cpu_supports,
    .supports_weights = cpu_supports_weights,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_advise_streamed = cpu_buffer_advise_streamed,
    .weights_write = pv_cpu_weights_write,
    .buffer_write = cpu_buffer_write,
    .buffer_read = cpu_buffer_read,
    .copy_async = cpu_copy_async,
    .event_record = cpu_event_record,
    .queue_wait = cpu_queue_wait,
    .event_wait = cpu_event_wait,
    .event_query = cpu_event_query,
    .event_free = cpu_event_free,
    .finish = cpu_finish,
    .gemm = cpu_gemm,
    .attention = cpu_attention,
    .kv_write = cpu_kv_write,
    .slot_gather = cpu_slot_gather,
    .slot_scatter = cpu_slot_scatter,
    .embed_gather = cpu_embed_gather,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .softmax = cpu_softmax,
    .argmax = cpu_argmax,
    .sample_top_p = cpu_sample_top_p,
    .qmatmul = cpu_qmatmul,
    .qmatmul_group = cpu_qmatmul_group,
    .add_rmsnorm = cpu_add_rmsnorm,
    .rope_kv_write = cpu_rope_kv_write,
    .qmatmul_swiglu = cpu_qmatmul_swiglu,
    .slot_transfer = cpu_slot_transfer,
    .sample_batch = cpu_sample_batch,
    .marker_init = cpu_marker_init,
    .marker_free = cpu_marker_free,
    .marker_record = cpu_marker_record,
    .marker_elapsed = cpu_marker_elapsed,
};
