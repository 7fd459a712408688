/* The OpenCL backend's internals, shared by its source files: the device
 * state, error reporting, and the program cache that builds the portable
 * kernels (kernels/) from their embedded text. Not installed: the public
 * entry is pv_opencl_backend_ops, reached through the front end. */
#ifndef PV_BACKENDS_OPENCL_H
#define PV_BACKENDS_OPENCL_H

/* The 1.2 API is all this backend uses; naming it keeps the headers from
 * guessing (and from warning about deprecated 1.2 entry points). */
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include "backends/backend.h"

extern const pv_backend_ops pv_opencl_backend_ops;

/* The kernel families, one embedded program text each (kernels/<family>.cl). */
typedef enum pv_opencl_family {
    PV_OPENCL_ATTENTION = 0,
    PV_OPENCL_GATHER,
    PV_OPENCL_RECOMPUTE,
    PV_OPENCL_FAMILY_COUNT
} pv_opencl_family;

/* One built program: a family under one set of -D defines, with its
 * kernels created once. */
typedef struct pv_opencl_program {
    pv_opencl_family family;
    char options[256];
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
    int work_group;             /* PV_WG of every kernel build */
    pv_opencl_program *programs;
    int n_programs, cap_programs;
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

/* The kernel `name` of `family` built with storage dtype `store` (f32/f16
 * KV pools and tables; the recompute family ignores it). Programs are built
 * on first use and cached per define set; a failed build reports its log. */
pv_status pv_opencl_kernel(pv_backend *be, pv_opencl_family family, pv_dtype store,
                           const char *name, cl_kernel *out);

void pv_opencl_programs_free(pv_opencl *cl);

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

#endif
