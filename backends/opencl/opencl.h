/* The OpenCL backend's internals, shared by its source files: the device
 * state, error reporting, and the program cache that builds the portable
 * kernels (kernels/) from their embedded text. Not installed: the backend
 * is a module (pensieve-opencl.so) whose one entry is
 * pv_backend_module_ops (backends/backend-module.h). */
#ifndef PV_BACKENDS_OPENCL_H
#define PV_BACKENDS_OPENCL_H

/* The 1.2 API is all this backend uses; naming it keeps the headers from
 * guessing (and from warning about deprecated 1.2 entry points). */
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include "backends/backend.h"
#include "backends/kernel-tuning.h"

/* Attention's default PV_WG on CPU devices, where the table's 64 is slow:
 * attention sums PV_WG partials per score (over tiles of PV_WG positions
 * with one query head a group, the CPU devices' default), so a small group
 * keeps that sum cheap and gives each work-item 8 dims of a 128-dim head
 * in one unrolled run (PoCL, decode, 2 cores: 1.7-1.8x faster than 64; 8
 * and 32 are slower than 16). pensieve-tune may pick others per bucket. */
#define PV_OPENCL_ATTENTION_WORK_GROUP_CPU 16

/* Extra -D defines for every build, from the environment variable
 * PV_TEST_KERNEL_DEFINES (tests only: it lets a test break one candidate,
 * kernels/attention.cl's PV_TEST_BREAK_WG). */
#define PV_OPENCL_TEST_DEFINES_MAX 128

/* The scratch buffers: widened weight tiles of qmatmul and its
 * activations rounded to 16-bit integers (PV_ACT16), split-K partials of
 * attention, the biased rows of sample_batch, and the tokens of a
 * host-out sample_batch, argmax or sample_top_p (read back blocking before
 * the call returns, so the next call may write them again). */
#define PV_OPENCL_SCRATCH_QMATMUL 0
#define PV_OPENCL_SCRATCH_ATTENTION 1
#define PV_OPENCL_SCRATCH_BIAS 2
#define PV_OPENCL_SCRATCH_RESULTS 3
#define PV_OPENCL_SCRATCH_QMATMUL_XQ 4
#define PV_OPENCL_SCRATCH_COUNT 5

/* The most host index arrays one op passes (sample_batch with a logit
 * bias: 6). */
#define PV_OPENCL_INDEX_BUFFERS 6

/* A freed buffer whose release waits for the commands enqueued before the
 * free: markers of both queues (and, for a host buffer, its unmap). */
typedef struct pv_opencl_deferred {
    cl_mem mem;
    cl_event events[3];
    int n_events;
} pv_opencl_deferred;

/* One built program: a family under one set of -D defines, with its
 * kernels created once. A cl_kernel holds its arguments until enqueued, so
 * a backend serves one thread at a time. */
typedef struct pv_opencl_program {
    pv_kernel_family family;
    char options[384];
    cl_program program;
    cl_uint n_kernels;
    cl_kernel *kernels;
    char (*kernel_names)[64];
} pv_opencl_program;

typedef struct pv_opencl {
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queues[2]; /* PV_QUEUE_COMPUTE, PV_QUEUE_COPY; in order */
    /* Unmaps freed host buffers after both queues are done with them, so a
     * free holds neither queue behind the other (backend.h's contract). */
    cl_command_queue release_queue;
    /* Freed buffers not yet released: released once their events complete
     * (checked at each alloc and free, all at finish and teardown), since
     * a driver's release may wait for the whole device (NVIDIA's, as
     * cudaFree does), which would hold the caller behind every queue. */
    pv_opencl_deferred *deferred;
    int n_deferred, cap_deferred;
    pv_opencl_program *programs;
    int n_programs, cap_programs;
    /* Device copies of host index arrays, one buffer per argument position
     * of an op (token_seq, token_pos, slot_table, ...) and per queue (the
     * copy queue's slot transfers have their own, so neither queue's
     * uploads wait for the other's kernels), grown as needed. */
    cl_mem index_buffers[2][PV_OPENCL_INDEX_BUFFERS];
    size_t index_bytes[2][PV_OPENCL_INDEX_BUFFERS];
    /* The device shares the host's memory (CL_DEVICE_HOST_UNIFIED_MEMORY):
     * a host buffer's mapping is its storage, so a kernel may move slots
     * between it and a device buffer (pv_opencl_slot_transfer). */
    int host_unified;
    /* Device scratch of the ops that need some (PV_OPENCL_SCRATCH_*),
     * grown as needed and kept: creating a buffer does not synchronise,
     * and a released one lives on until the kernels using it finish. */
    cl_mem scratch[PV_OPENCL_SCRATCH_COUNT];
    size_t scratch_bytes[PV_OPENCL_SCRATCH_COUNT];
    int attention_splits; /* PV_ATTENTION_SPLITS (backends/attention-split.h); 0: the default */
    int attention_group;  /* query heads per attention work-group at most (the same header) */
    char test_defines[PV_OPENCL_TEST_DEFINES_MAX];
} pv_opencl;

static inline pv_opencl *pv_opencl_of(const pv_backend *be)
{
    return (pv_opencl *)be->impl;
}

static inline cl_mem pv_opencl_mem(const pv_buffer *buf)
{
    return (cl_mem)buf->handle;
}

/* The symbolic name of an OpenCL error code ("CL_OUT_OF_RESOURCES"). */
const char *pv_opencl_error_name(cl_int err);

/* Record "opencl <what>: <call> failed: <name> (<code>)" and return
 * PV_ERR_BACKEND (PV_ERR_OUT_OF_MEMORY for allocation failures). */
pv_status pv_opencl_fail(const char *what, const char *call, cl_int err);

/* Find the platform and device with flat index `index` over all platforms. */
pv_status pv_opencl_find_device(int index, cl_platform_id *platform, cl_device_id *device);

/* The kernel `name` of the program built with parameter set p (tuned
 * values and variants, kernel-params.h). Programs are built on first use
 * and cached per option string; a failed build reports its log. */
pv_status pv_opencl_kernel(pv_backend *be, const pv_kernel_params *p, const char *name, cl_kernel *out);

void pv_opencl_programs_free(pv_opencl *cl);
/* The index buffers and the scratch buffers. */
void pv_opencl_index_buffers_free(pv_opencl *cl);

/* Copies and events (opencl-backend.c), for the slot transfer. */
pv_status pv_opencl_copy_async(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off, const pv_buffer *src,
                               uint64_t src_off, uint64_t bytes, pv_event *wait, pv_event **done);
pv_status pv_opencl_event_record(pv_backend *be, pv_queue q, pv_event **out);
/* Wraps handle (whose reference it takes) as *out. */
pv_status pv_opencl_wrap_event(pv_backend *be, cl_event handle, pv_event **out);

/* Kernel ops (opencl-kernels.c). */
pv_status pv_opencl_attention(pv_backend *be, const pv_attention_args *a);
pv_status pv_opencl_kv_write(pv_backend *be, const pv_kv_write_args *a);
pv_status pv_opencl_slot_gather(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_opencl_slot_scatter(pv_backend *be, const pv_slot_copy_args *a);
pv_status pv_opencl_embed_gather(pv_backend *be, const pv_embed_gather_args *a);
pv_status pv_opencl_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a);
pv_status pv_opencl_rope(pv_backend *be, const pv_rope_args *a);
pv_status pv_opencl_swiglu(pv_backend *be, const pv_swiglu_args *a);
pv_status pv_opencl_add(pv_backend *be, const pv_add_args *a);
pv_status pv_opencl_softmax(pv_backend *be, const pv_softmax_args *a);
pv_status pv_opencl_argmax(pv_backend *be, const pv_argmax_args *a);
pv_status pv_opencl_sample_top_p(pv_backend *be, const pv_sample_args *a);
pv_status pv_opencl_qmatmul(pv_backend *be, const pv_qmatmul_args *a);
pv_status pv_opencl_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n);
pv_status pv_opencl_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a);
pv_status pv_opencl_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a);
pv_status pv_opencl_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a);
pv_status pv_opencl_add_rmsnorm_group(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                                      int n);
pv_status pv_opencl_add_rmsnorm_swiglu(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                       const pv_qmatmul_swiglu_args *swiglu);
pv_status pv_opencl_attention_qmatmul(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product);
pv_status pv_opencl_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done);
pv_status pv_opencl_sample_batch(pv_backend *be, const pv_sample_batch_args *a);

#endif
