/* The OpenCL backend's kernel ops: the portable kernels of kernels/, built
 * at run time from their embedded text, cached per define set, launched on
 * the compute queue. Launch geometry follows kernels/dialect.h: groups of
 * work_group work-items along dimension 0, a second dimension of groups. */
#include "config.h"

#include "backends/opencl/opencl.h"
#include "backends/attention-split.h"
#include "kernels/kernel-sources.h"

#include <clblast_c.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- program cache ----------------------------------------------------------- */

static const char *family_name(pv_kernel_family family)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    return spec ? spec->name : "?";
}

static void program_release(pv_opencl_program *p)
{
    for (cl_uint k = 0; k < p->n_kernels; k++)
        clReleaseKernel(p->kernels[k]);
    free(p->kernels);
    free(p->kernel_names);
    if (p->program)
        clReleaseProgram(p->program);
    memset(p, 0, sizeof *p);
}

void pv_opencl_programs_free(pv_opencl *cl)
{
    for (int i = 0; i < cl->n_programs; i++)
        program_release(&cl->programs[i]);
    free(cl->programs);
    cl->programs = NULL;
    cl->n_programs = cl->cap_programs = 0;
}

/* A failed build: the message carries as much of the compiler log as fits. */
static pv_status build_failure(pv_opencl *cl, cl_program program, pv_kernel_family family,
                               const char *options, cl_int err)
{
    char log[640] = "";
    size_t size = 0;
    clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
    char *full = size ? malloc(size + 1) : NULL;
    if (full &&
        clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, size, full, NULL) == CL_SUCCESS) {
        full[size] = '\0';
        snprintf(log, sizeof log, "%s", full);
    }
    free(full);
    return pv_error(PV_ERR_BACKEND, "opencl: building kernels/%s.cl with \"%s\" failed: %s (%d); "
                    "build log: %s", family_name(family), options, pv_opencl_error_name(err), (int)err, log);
}

/* Build `family` with `options` and create all its kernels into *p. */
static pv_status program_build(pv_opencl *cl, pv_kernel_family family, const char *options,
                               pv_opencl_program *p)
{
    memset(p, 0, sizeof *p);
    p->family = family;
    snprintf(p->options, sizeof p->options, "%s", options);
    const char *sources[2] = {pv_kernel_source_dialect, pv_kernel_family_source(family)};
    cl_int err;
    p->program = clCreateProgramWithSource(cl->context, 2, sources, NULL, &err);
    if (err != CL_SUCCESS) {
        p->program = NULL;
        return pv_opencl_fail("program build", "clCreateProgramWithSource", err);
    }
    err = clBuildProgram(p->program, 1, &cl->device, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        pv_status st = build_failure(cl, p->program, family, options, err);
        program_release(p);
        return st;
    }
    err = clCreateKernelsInProgram(p->program, 0, NULL, &p->n_kernels);
    if (err == CL_SUCCESS) {
        p->kernels = calloc(p->n_kernels, sizeof *p->kernels);
        p->kernel_names = calloc(p->n_kernels, sizeof *p->kernel_names);
        if (!p->kernels || !p->kernel_names) {
            p->n_kernels = 0;
            program_release(p);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot list the kernels of kernels/%s.cl",
                            family_name(family));
        }
        err = clCreateKernelsInProgram(p->program, p->n_kernels, p->kernels, NULL);
    }
    if (err != CL_SUCCESS) {
        p->n_kernels = 0;
        program_release(p);
        return pv_opencl_fail("program build", "clCreateKernelsInProgram", err);
    }
    for (cl_uint k = 0; k < p->n_kernels; k++) {
        err = clGetKernelInfo(p->kernels[k], CL_KERNEL_FUNCTION_NAME, sizeof p->kernel_names[k],
                              p->kernel_names[k], NULL);
        if (err != CL_SUCCESS) {
            program_release(p);
            return pv_opencl_fail("program build", "clGetKernelInfo(CL_KERNEL_FUNCTION_NAME)", err);
        }
    }
    return PV_OK;
}

pv_status pv_opencl_kernel(pv_backend *be, const pv_kernel_params *params, const char *name, cl_kernel *out)
{
    pv_opencl *cl = pv_opencl_of(be);
    const pv_kernel_family family = params->family;
    char defines[256], options[384];
    /* -cl-kernel-arg-info costs a few bytes a kernel; the CUDA stand-in
     * (tests/cuda-standin.c) builds with these options and reads the
     * parameters' types, so PoCL's cache serves both. */
    if (pv_kernel_params_defines(params, defines, sizeof defines) >= (int)sizeof defines ||
        snprintf(options, sizeof options, "-cl-std=CL1.2 -cl-kernel-arg-info %s %s", defines, cl->test_defines) >=
            (int)sizeof options)
        return pv_error(PV_ERR_INVALID_ARG, "opencl: the build options of kernels/%s.cl do not fit in %zu bytes",
                        family_name(family), sizeof options);

    pv_opencl_program *p = NULL;
    for (int i = 0; i < cl->n_programs && !p; i++)
        if (cl->programs[i].family == family && strcmp(cl->programs[i].options, options) == 0)
            p = &cl->programs[i];
    if (!p) {
        if (cl->n_programs == cl->cap_programs) {
            int cap = cl->cap_programs ? 2 * cl->cap_programs : 8;
            pv_opencl_program *grown = realloc(cl->programs, (size_t)cap * sizeof *grown);
            if (!grown)
                return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl: cannot grow the program cache to %d", cap);
            cl->programs = grown;
            cl->cap_programs = cap;
        }
        pv_status st = program_build(cl, family, options, &cl->programs[cl->n_programs]);
        if (st != PV_OK)
            return st;
        p = &cl->programs[cl->n_programs++];
    }
    for (cl_uint k = 0; k < p->n_kernels; k++)
        if (strcmp(p->kernel_names[k], name) == 0) {
            *out = p->kernels[k];
            return PV_OK;
        }
    return pv_error(PV_ERR_BACKEND, "opencl: kernels/%s.cl has no kernel %s", family_name(family), name);
}

/* ---- launching ------------------------------------------------------------------ */

/* Arguments are set in order; the first failure is kept and reported at
 * launch, so the op code reads as a plain argument list. */
typedef struct kernel_args {
    cl_kernel kernel;
    int work_group; /* the PV_WG the kernel was built with */
    int item_elems; /* and its PV_ITEM_ELEMS, for the families that take one */
    cl_uint next;
    cl_int err;
} kernel_args;

static void arg(kernel_args *ka, size_t size, const void *value)
{
    if (ka->err == CL_SUCCESS)
        ka->err = clSetKernelArg(ka->kernel, ka->next, size, value);
    ka->next++;
}

static void arg_mem(kernel_args *ka, cl_mem mem)
{
    arg(ka, sizeof mem, &mem);
}

static void arg_long(kernel_args *ka, int64_t value)
{
    cl_long v = value;
    arg(ka, sizeof v, &v);
}

static void arg_int(kernel_args *ka, int32_t value)
{
    cl_int v = value;
    arg(ka, sizeof v, &v);
}

static void arg_float(kernel_args *ka, float value)
{
    cl_float v = value;
    arg(ka, sizeof v, &v);
}

/* Kernel `name` built with p, its launch values in *ka. */
static pv_status kernel_begin_with(pv_backend *be, const pv_kernel_params *p, const char *name, kernel_args *ka)
{
    memset(ka, 0, sizeof *ka);
    ka->work_group = p->value[PV_KPARAM_WG];
    ka->item_elems = p->value[PV_KPARAM_ITEM_ELEMS];
    return pv_opencl_kernel(be, p, name, &ka->kernel);
}

/* The tuned set of a family with one bucket. */
static pv_kernel_params family_params(const pv_backend *be, pv_kernel_family family)
{
    const pv_kernel_bucket b = {.family = family};
    return pv_kernel_tuned(be->tuning, &b);
}

/* A kernel of the recompute family (f32 only). */
static pv_status kernel_begin(pv_backend *be, const char *name, kernel_args *ka)
{
    const pv_kernel_params p = family_params(be, PV_KERNEL_RECOMPUTE);
    return kernel_begin_with(be, &p, name, ka);
}

/* A kernel of the gather family for storage dtype `store`: name_f32/_f16. */
static pv_status kernel_begin_stored(pv_backend *be, pv_dtype store, const char *name, kernel_args *ka)
{
    pv_kernel_params p = family_params(be, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = store == PV_F16;
    char full_name[64];
    snprintf(full_name, sizeof full_name, "%s_%s", name, store == PV_F16 ? "f16" : "f32");
    return kernel_begin_with(be, &p, full_name, ka);
}

/* Enqueue on queue q: groups0 x groups1 groups of ka->work_group items,
 * after `wait` (may be NULL); *event (if non-NULL) gets the kernel's. */
static pv_status launch_on(pv_backend *be, pv_queue q, const char *what, const kernel_args *ka, uint64_t groups0,
                           uint64_t groups1, cl_event wait, cl_event *event)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (ka->err != CL_SUCCESS)
        return pv_opencl_fail(what, "clSetKernelArg", ka->err);
    size_t global[2] = {(size_t)groups0 * (size_t)ka->work_group, (size_t)groups1};
    size_t local[2] = {(size_t)ka->work_group, 1};
    cl_int err = clEnqueueNDRangeKernel(cl->queues[q], ka->kernel, 2, NULL, global, local, wait ? 1 : 0,
                                        wait ? &wait : NULL, event);
    if (err != CL_SUCCESS)
        return pv_opencl_fail(what, "clEnqueueNDRangeKernel", err);
    be->launches++;
    return PV_OK;
}

/* Enqueue on the compute queue. */
static pv_status launch(pv_backend *be, const char *what, const kernel_args *ka, uint64_t groups0,
                        uint64_t groups1)
{
    return launch_on(be, PV_QUEUE_COMPUTE, what, ka, groups0, groups1, NULL, NULL);
}

static uint64_t ceil_div(uint64_t n, uint64_t d)
{
    return (n + d - 1) / d;
}

static void CL_CALLBACK free_host_copy(cl_event event, cl_int status, void *copy)
{
    free(copy);
}

/* Host index arrays are valid only during the call, and a blocking upload
 * would stall the host until the queue drains. So the arrays are copied
 * into one host block, written without blocking into queue q's index
 * buffers (one per argument position, grown as needed) on that in-order
 * queue, and the block is freed by the last write's completion callback.
 * The queue being in order is what makes one buffer per position enough:
 * each write runs after the kernels that read the previous contents.
 * out[i] gets the buffer holding host[i]. */
static pv_status upload_indices_on(pv_backend *be, pv_queue q, const char *what, int n, const void *const host[],
                                   const size_t bytes[], cl_mem out[])
{
    pv_opencl *cl = pv_opencl_of(be);
    cl_command_queue queue = cl->queues[q];
    cl_mem *index_buffers = cl->index_buffers[q];
    size_t *index_bytes = cl->index_bytes[q];
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += bytes[i];
    char *copy = malloc(total ? total : 1);
    if (!copy)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "opencl %s: cannot stage %zu bytes of indices", what, total);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (bytes[i])
            memcpy(copy + at, host[i], bytes[i]);
        at += bytes[i];
    }

    cl_event last = NULL;
    cl_int err = CL_SUCCESS;
    const char *call = NULL;
    at = 0;
    for (int i = 0; i < n && err == CL_SUCCESS; at += bytes[i], i++) {
        if (index_bytes[i] < bytes[i] || !index_buffers[i]) {
            /* Released buffers live on until the kernels using them finish. */
            size_t grown = bytes[i] > 2 * index_bytes[i] ? bytes[i] : 2 * index_bytes[i];
            grown = grown < 4096 ? 4096 : grown;
            if (index_buffers[i])
                clReleaseMemObject(index_buffers[i]);
            index_buffers[i] = clCreateBuffer(cl->context, CL_MEM_READ_ONLY, grown, NULL, &err);
            index_bytes[i] = err == CL_SUCCESS ? grown : 0;
            if (err != CL_SUCCESS) {
                index_buffers[i] = NULL;
                call = "clCreateBuffer (index buffer)";
                break;
            }
        }
        out[i] = index_buffers[i];
        if (bytes[i] == 0)
            continue;
        if (last)
            clReleaseEvent(last);
        last = NULL;
        err = clEnqueueWriteBuffer(queue, out[i], CL_FALSE, 0, bytes[i], copy + at, 0, NULL, &last);
        call = "clEnqueueWriteBuffer (indices)";
    }
    if (err != CL_SUCCESS) {
        clFinish(queue); /* no write may still read the copy */
        if (last)
            clReleaseEvent(last);
        free(copy);
        return pv_opencl_fail(what, call, err);
    }
    if (!last || clSetEventCallback(last, CL_COMPLETE, free_host_copy, copy) != CL_SUCCESS) {
        if (last)
            clWaitForEvents(1, &last);
        free(copy);
    }
    if (last)
        clReleaseEvent(last);
    return PV_OK;
}

/* Uploads for a compute-queue op. */
static pv_status upload_indices(pv_backend *be, const char *what, int n, const void *const host[],
                                const size_t bytes[], cl_mem out[])
{
    return upload_indices_on(be, PV_QUEUE_COMPUTE, what, n, host, bytes, out);
}

void pv_opencl_index_buffers_free(pv_opencl *cl)
{
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < PV_OPENCL_INDEX_BUFFERS; i++) {
            if (cl->index_buffers[q][i])
                clReleaseMemObject(cl->index_buffers[q][i]);
            cl->index_buffers[q][i] = NULL;
            cl->index_bytes[q][i] = 0;
        }
    for (int i = 0; i < PV_OPENCL_SCRATCH_COUNT; i++) {
        if (cl->scratch[i])
            clReleaseMemObject(cl->scratch[i]);
        cl->scratch[i] = NULL;
        cl->scratch_bytes[i] = 0;
    }
}

/* Scratch buffer `which` with at least `bytes`, grown to twice its size
 * when short. Kernels still queued on the old buffer keep it alive, and
 * the in-order queue runs the new user after them. */
static pv_status scratch_reserve(pv_opencl *cl, const char *what, int which, size_t bytes, cl_mem *out)
{
    if (cl->scratch_bytes[which] < bytes || !cl->scratch[which]) {
        size_t grown = bytes > 2 * cl->scratch_bytes[which] ? bytes : 2 * cl->scratch_bytes[which];
        if (cl->scratch[which])
            clReleaseMemObject(cl->scratch[which]);
        cl_int err;
        cl->scratch[which] = clCreateBuffer(cl->context, CL_MEM_READ_WRITE, grown, NULL, &err);
        cl->scratch_bytes[which] = err == CL_SUCCESS ? grown : 0;
        if (err != CL_SUCCESS) {
            cl->scratch[which] = NULL;
            return pv_opencl_fail(what, "clCreateBuffer (scratch)", err);
        }
    }
    *out = cl->scratch[which];
    return PV_OK;
}

/* The paged index arrays shared by attention and kv_write. */
static pv_status upload_paging(pv_backend *be, const char *what, int32_t n_tokens, const int32_t *token_seq,
                               const int32_t *token_pos, const int32_t *slot_table, int32_t n_seqs,
                               int32_t max_chunks, cl_mem mems[3])
{
    const void *host[3] = {token_seq, token_pos, slot_table};
    size_t t_bytes = (size_t)n_tokens * sizeof(int32_t);
    size_t bytes[3] = {t_bytes, t_bytes, (size_t)n_seqs * (size_t)max_chunks * sizeof(int32_t)};
    return upload_indices(be, what, 3, host, bytes, mems);
}

static pv_status upload_one(pv_backend *be, const char *what, const void *host, size_t bytes, cl_mem *out)
{
    return upload_indices(be, what, 1, &host, &bytes, out);
}

/* ---- the ops ----------------------------------------------------------------------- */

/* The attention kernels of the call's tuned set (its bucket's PV_WG and
 * PV_SPLITS) built per storage dtype, head-dim class (64, 128, 256: each
 * work-item holds only the dims it can own, head_dim <= 64 * k needing k
 * at a 64-wide group) and query-head class (1, 2, 4, 8: the registers of
 * the heads a group serves). */
static pv_kernel_params attention_params(const pv_backend *be, const pv_attention_args *a, int heads_per_block)
{
    pv_kernel_bucket bucket;
    pv_kernel_bucket_of_attention(a, &bucket);
    pv_kernel_params p = pv_kernel_tuned(be->tuning, &bucket);
    int max_group = 1;
    while (max_group < heads_per_block)
        max_group *= 2;
    p.value[PV_KPARAM_STORE_F16] = a->kv_dtype == PV_F16;
    p.value[PV_KPARAM_MAX_HEAD_DIM] = bucket.head_dim;
    p.value[PV_KPARAM_ATT_MAX_GROUP] = max_group;
    return p;
}

static pv_status attention_kernel(pv_backend *be, const pv_kernel_params *p, const pv_attention_args *a,
                                  const char *base, kernel_args *ka)
{
    char name[64];
    snprintf(name, sizeof name, "%s_%s", base, a->kv_dtype == PV_F16 ? "f16" : "f32");
    return kernel_begin_with(be, p, name, ka);
}

/* x rounded to 16 bits per block of 32 (PV_ACT16, kernels/qmatmul.cl) in
 * the scratch buffer q: its word pairs from word 0, the (scale, sum) pairs
 * from float s_off. */
typedef struct xq16 {
    cl_mem q;
    int64_t s_off;
} xq16;

/* The kernel arguments of xq: the words, then the (scale, sum) pairs. */
static void arg_xq(kernel_args *ka, const xq16 *xq)
{
    arg_mem(ka, xq->q);
    arg_long(ka, 0);
    arg_mem(ka, xq->q);
    arg_long(ka, xq->s_off);
}

/* pv_opencl_attention; with xq (not NULL) and the call split, the combine
 * kernel also rounds the output into xq (head_dim a multiple of 32), and
 * *rounded says it did. */
static pv_status attention_of(pv_backend *be, const pv_attention_args *a, const xq16 *xq, int *rounded)
{
    pv_opencl *cl = pv_opencl_of(be);
    const int blocks = pv_attention_head_blocks(a->n_heads, a->n_kv_heads, cl->attention_group);
    const int heads_per_block = pv_attention_heads_per_block(a->n_heads, a->n_kv_heads, cl->attention_group);
    const pv_kernel_params p = attention_params(be, a, heads_per_block);
    const int splits = pv_attention_splits(cl->attention_splits, p.value[PV_KPARAM_SPLITS], be->info.compute_units,
                                           cl->attention_group, a);
    kernel_args ka;
    pv_status st = attention_kernel(
        be, &p, a, pv_attention_kernel_base(p.value[PV_KPARAM_WG], p.value[PV_KPARAM_MAX_HEAD_DIM]), &ka);
    if (st != PV_OK)
        return st;
    cl_mem part = pv_opencl_mem(a->out); /* never touched with one split */
    const uint64_t out_floats = (uint64_t)a->n_tokens * (uint64_t)a->n_heads * (uint64_t)a->head_dim;
    if (splits > 1) {
        st = scratch_reserve(cl, "attention", PV_OPENCL_SCRATCH_ATTENTION,
                             (size_t)pv_attention_split_floats(splits, a) * sizeof(float), &part);
        if (st != PV_OK)
            return st;
    }
    cl_mem idx[3];
    st = upload_paging(be, "attention", a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs,
                       a->max_chunks, idx);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->q));
    arg_long(&ka, (int64_t)a->q_off);
    arg_mem(&ka, pv_opencl_mem(a->kv_pool));
    arg_mem(&ka, idx[0]);
    arg_mem(&ka, idx[1]);
    arg_mem(&ka, idx[2]);
    arg_int(&ka, a->max_chunks);
    arg_int(&ka, a->n_heads);
    arg_int(&ka, a->n_kv_heads);
    arg_int(&ka, a->head_dim);
    arg_int(&ka, a->chunk_tokens);
    arg_float(&ka, a->scale);
    arg_int(&ka, heads_per_block);
    arg_int(&ka, splits);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    arg_mem(&ka, part);
    arg_long(&ka, 0);
    arg_long(&ka, (int64_t)(out_floats * (uint64_t)splits));
    st = launch(be, "attention", &ka, (uint64_t)a->n_kv_heads * (uint64_t)blocks * (uint64_t)splits,
                (uint64_t)a->n_tokens);
    if (st != PV_OK || splits == 1)
        return st;

    kernel_args combine;
    *rounded = xq != NULL;
    st = attention_kernel(be, &p, a, xq ? "pv_attention_combine16" : "pv_attention_combine", &combine);
    if (st != PV_OK)
        return st;
    arg_mem(&combine, part);
    arg_long(&combine, 0);
    arg_long(&combine, (int64_t)(out_floats * (uint64_t)splits));
    arg_int(&combine, splits);
    arg_int(&combine, a->n_heads);
    arg_int(&combine, a->head_dim);
    arg_mem(&combine, pv_opencl_mem(a->out));
    arg_long(&combine, (int64_t)a->out_off);
    if (xq)
        arg_xq(&combine, xq);
    return launch(be, xq ? "attention combine16" : "attention combine", &combine, (uint64_t)a->n_heads,
                  (uint64_t)a->n_tokens);
}

pv_status pv_opencl_attention(pv_backend *be, const pv_attention_args *a)
{
    int rounded = 0;
    return attention_of(be, a, NULL, &rounded);
}

pv_status pv_opencl_kv_write(pv_backend *be, const pv_kv_write_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin_stored(be, a->kv_dtype, "pv_kv_write", &ka);
    if (st != PV_OK)
        return st;
    cl_mem idx[3];
    st = upload_paging(be, "kv_write", a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs,
                       a->max_chunks, idx);
    if (st != PV_OK)
        return st;
    int64_t row_elems = (int64_t)a->n_kv_heads * a->head_dim;
    arg_mem(&ka, pv_opencl_mem(a->k));
    arg_long(&ka, (int64_t)a->k_off);
    arg_mem(&ka, pv_opencl_mem(a->v));
    arg_long(&ka, (int64_t)a->v_off);
    arg_mem(&ka, pv_opencl_mem(a->kv_pool));
    arg_mem(&ka, idx[0]);
    arg_mem(&ka, idx[1]);
    arg_mem(&ka, idx[2]);
    arg_int(&ka, a->max_chunks);
    arg_int(&ka, a->chunk_tokens);
    arg_long(&ka, row_elems);
    return launch(be, "kv_write", &ka, ceil_div((uint64_t)row_elems, (uint64_t)ka.work_group),
                  (uint64_t)a->n_tokens);
}

pv_status pv_opencl_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin_stored(be, a->kv_dtype, "pv_rope_kv_write", &ka);
    if (st != PV_OK)
        return st;
    cl_mem idx[3];
    st = upload_paging(be, "rope_kv_write", a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs,
                       a->max_chunks, idx);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->q));
    arg_long(&ka, (int64_t)a->q_off);
    arg_mem(&ka, pv_opencl_mem(a->k));
    arg_long(&ka, (int64_t)a->k_off);
    arg_mem(&ka, pv_opencl_mem(a->v));
    arg_long(&ka, (int64_t)a->v_off);
    arg_mem(&ka, pv_opencl_mem(a->kv_pool));
    arg_mem(&ka, idx[0]);
    arg_mem(&ka, idx[1]);
    arg_mem(&ka, idx[2]);
    arg_int(&ka, a->max_chunks);
    arg_int(&ka, a->chunk_tokens);
    arg_int(&ka, a->n_heads);
    arg_int(&ka, a->n_kv_heads);
    arg_int(&ka, a->head_dim);
    arg_float(&ka, a->base);
    arg_int(&ka, a->neox ? 1 : 0);
    return launch(be, "rope_kv_write", &ka, (uint64_t)a->n_heads + (uint64_t)a->n_kv_heads, (uint64_t)a->n_tokens);
}

static pv_status slot_copy(pv_backend *be, const pv_slot_copy_args *a, const char *name)
{
    kernel_args ka;
    pv_status st = kernel_begin_stored(be, a->dtype, name, &ka);
    if (st != PV_OK)
        return st;
    cl_mem slots;
    st = upload_one(be, name + 3, a->slots, (size_t)a->n_slots_moved * sizeof(int32_t), &slots);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->pool));
    arg_mem(&ka, pv_opencl_mem(a->staging));
    arg_long(&ka, (int64_t)a->staging_off);
    arg_mem(&ka, slots);
    arg_long(&ka, a->slot_elems);
    uint64_t per_group = (uint64_t)ka.work_group * (uint64_t)ka.item_elems;
    return launch(be, name + 3, &ka, ceil_div((uint64_t)a->slot_elems, per_group),
                  (uint64_t)a->n_slots_moved);
}

pv_status pv_opencl_slot_gather(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, "pv_slot_gather");
}

pv_status pv_opencl_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, "pv_slot_scatter");
}

/* One copy command per slot on the copy queue, the first after `wait`:
 * a device with memory of its own may keep a mapped host buffer's bytes
 * apart from the buffer a kernel would see, so only the copies that name
 * host_ptr (the pinned-transfer path) are sure to move them. */
static pv_status transfer_by_copies(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    const uint64_t slot_bytes = (uint64_t)a->slot_elems * pv_dtype_size(a->dtype);
    pv_status st = PV_OK;
    for (int32_t i = 0; i < a->n && st == PV_OK; i++)
        st = pv_opencl_copy_async(be, PV_QUEUE_COPY, a->dst, (uint64_t)a->dst_slots[i] * slot_bytes, a->src,
                                  (uint64_t)a->src_slots[i] * slot_bytes, slot_bytes, i == 0 ? wait : NULL, NULL);
    if (st == PV_OK && a->n == 0 && wait) {
        cl_event handle = (cl_event)wait->handle;
        cl_int err = clEnqueueBarrierWithWaitList(pv_opencl_of(be)->queues[PV_QUEUE_COPY], 1, &handle, NULL);
        if (err != CL_SUCCESS)
            st = pv_opencl_fail("slot_transfer", "clEnqueueBarrierWithWaitList", err);
    }
    if (st == PV_OK && done)
        st = pv_opencl_event_record(be, PV_QUEUE_COPY, done);
    return st;
}

/* On a device that shares the host's memory, one kernel on the copy queue
 * over both buffers (kernels/gather.cl's pv_slot_transfer): a host
 * buffer's mapping is then its storage, and the host touches it only
 * after `done` (backend.h). Elsewhere, transfer_by_copies. */
pv_status pv_opencl_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    if (!pv_opencl_of(be)->host_unified || a->n == 0)
        return transfer_by_copies(be, a, wait, done);
    pv_kernel_params p = family_params(be, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = 0; /* words are words: any build has the kernel */
    kernel_args ka;
    pv_status st = kernel_begin_with(be, &p, "pv_slot_transfer", &ka);
    if (st != PV_OK)
        return st;
    cl_mem lists[2];
    const void *host[2] = {a->dst_slots, a->src_slots};
    const size_t bytes[2] = {(size_t)a->n * sizeof(int32_t), (size_t)a->n * sizeof(int32_t)};
    st = upload_indices_on(be, PV_QUEUE_COPY, "slot_transfer", 2, host, bytes, lists);
    if (st != PV_OK)
        return st;
    const int64_t slot_words = a->slot_elems * (int64_t)pv_dtype_size(a->dtype) / 4;
    arg_mem(&ka, pv_opencl_mem(a->dst));
    arg_mem(&ka, pv_opencl_mem(a->src));
    arg_mem(&ka, lists[0]);
    arg_mem(&ka, lists[1]);
    arg_long(&ka, slot_words);
    const uint64_t per_group = (uint64_t)ka.work_group * (uint64_t)ka.item_elems;
    cl_event handle = NULL;
    st = launch_on(be, PV_QUEUE_COPY, "slot_transfer", &ka, ceil_div((uint64_t)slot_words, per_group),
                   (uint64_t)a->n, wait ? (cl_event)wait->handle : NULL, done ? &handle : NULL);
    if (st == PV_OK && done)
        st = pv_opencl_wrap_event(be, handle, done);
    return st;
}

/* ---- weights: embed_gather and qmatmul (kernels/qmatmul.cl) ------------------------ */

/* Decode-sized batches (T up to this) take the fused dequantize-and-dot
 * kernel, which reads W once per call; larger ones widen W into scratch
 * tiles for CLBlast's GEMM, whose work per weight grows with T. */
#define PV_OPENCL_QMATMUL_FUSED_MAX_T 16
/* Largest widened tile of W: 64 MiB of f32 (whole matrices of small
 * models, a few tiles of large ones). */
#define PV_OPENCL_QMATMUL_TILE_BYTES ((size_t)64 << 20)

/* A kernel of the qmatmul family built for weight type t. */
static pv_status kernel_begin_weights(pv_backend *be, pv_wtype t, const char *name, kernel_args *ka)
{
    pv_kernel_params p = family_params(be, PV_KERNEL_QMATMUL);
    p.value[PV_KPARAM_WTYPE] = (int)t;
    return kernel_begin_with(be, &p, name, ka);
}

/* The kernels address weights in 16-bit words (kernels/qmatmul.cl): the
 * word offset of element `elems` (whole blocks) of type t. */
static int64_t weight_words(pv_wtype t, uint64_t elems)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    return (int64_t)(elems / block_elems * block_bytes / 2);
}

pv_status pv_opencl_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin_weights(be, a->table_type, "pv_embed_gather", &ka);
    if (st != PV_OK)
        return st;
    cl_mem ids;
    st = upload_one(be, "embed_gather", a->ids, (size_t)a->n_ids * sizeof(int32_t), &ids);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->table));
    arg_long(&ka, weight_words(a->table_type, a->table_off));
    arg_long(&ka, a->n_rows);
    arg_mem(&ka, ids);
    arg_mem(&ka, a->ids_dev ? pv_opencl_mem(a->ids_dev) : NULL); /* NULL: never read (no negative id) */
    arg_long(&ka, (int64_t)a->ids_dev_off);
    arg_long(&ka, a->dim);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    return launch(be, "embed_gather", &ka, ceil_div((uint64_t)a->dim, (uint64_t)ka.work_group),
                  (uint64_t)a->n_ids);
}

/* Whether decode-sized products of type t take x rounded (PV_ACT16). */
static int act16(const pv_backend *be, pv_wtype t)
{
    const pv_kernel_params p = family_params(be, PV_KERNEL_QMATMUL);
    return pv_qmatmul_act16(&p, (int)t);
}

/* *xq = the scratch for x [T][n_in] rounded. */
static pv_status xq16_reserve(pv_backend *be, int64_t n_tokens, int64_t n_in, xq16 *xq)
{
    const uint64_t q_bytes = (uint64_t)n_tokens * (uint64_t)n_in * 2, n_blocks = (uint64_t)n_tokens * n_in / 32;
    xq->s_off = (int64_t)(q_bytes / sizeof(float));
    return scratch_reserve(pv_opencl_of(be), "qmatmul", PV_OPENCL_SCRATCH_QMATMUL_XQ,
                           (size_t)(q_bytes + n_blocks * 2 * sizeof(float)), &xq->q);
}

/* *xq = x [T][n_in] rounded, by the kernel of type t's program. */
static pv_status round_x16(pv_backend *be, pv_wtype t, const pv_buffer *x, uint64_t x_off, int64_t n_tokens,
                           int64_t n_in, xq16 *xq)
{
    const uint64_t n_blocks = (uint64_t)n_tokens * n_in / 32;
    pv_status st = xq16_reserve(be, n_tokens, n_in, xq);
    if (st != PV_OK)
        return st;
    kernel_args ka;
    if ((st = kernel_begin_weights(be, t, "pv_qmatmul_round16", &ka)) != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(x));
    arg_long(&ka, (int64_t)x_off);
    arg_long(&ka, (int64_t)n_blocks);
    arg_mem(&ka, xq->q);
    arg_long(&ka, 0);
    arg_mem(&ka, xq->q);
    arg_long(&ka, xq->s_off);
    return launch(be, "qmatmul round16", &ka, ceil_div(n_blocks, (uint64_t)ka.work_group), 1);
}

/* The fused kernels (T <= PV_OPENCL_QMATMUL_FUSED_MAX_T), "<base>_<class>"
 * for T's token class, over n_w matrices of weight type t (the product, or
 * the gate and up of a SwiGLU): a work-group a pv_qmv_rows run of rows.
 * With xq, "<base>16_<class>" from x rounded there instead of x. */
/* The decode kernels' activations: xq's bytes and scales where x was
 * rounded (PV_ACT16), else x. */
static void arg_x(kernel_args *ka, const pv_buffer *x, uint64_t x_off, const xq16 *xq)
{
    if (xq) {
        arg_xq(ka, xq);
    } else {
        arg_mem(ka, pv_opencl_mem(x));
        arg_long(ka, (int64_t)x_off);
        arg_int(ka, 0); /* x4: CUDA's 16-byte loads; vload4 needs no more than 4 */
    }
}

static pv_status fused_products(pv_backend *be, const char *base, pv_wtype t, int n_w, const pv_buffer *const *w,
                                const uint64_t *w_off, const pv_buffer *x, uint64_t x_off, const xq16 *xq,
                                const pv_buffer *y, uint64_t y_off, int64_t n_tokens, int64_t n_in, int64_t n_out)
{
    const int token_class = pv_qmv_token_class(n_tokens);
    char name[40];
    snprintf(name, sizeof name, "%s%s_%d", base, xq ? "16" : "", token_class);
    kernel_args ka;
    pv_status st = kernel_begin_weights(be, t, name, &ka);
    if (st != PV_OK)
        return st;
    for (int i = 0; i < n_w; i++) {
        arg_mem(&ka, pv_opencl_mem(w[i]));
        arg_long(&ka, weight_words(t, w_off[i]));
    }
    arg_x(&ka, x, x_off, xq);
    arg_mem(&ka, pv_opencl_mem(y));
    arg_long(&ka, (int64_t)y_off);
    arg_int(&ka, (int32_t)n_tokens);
    arg_int(&ka, (int32_t)n_in);
    arg_int(&ka, (int32_t)n_out);
    const pv_kernel_params p = family_params(be, PV_KERNEL_QMATMUL);
    return launch(be, name + 3, &ka, ceil_div((uint64_t)n_out, (uint64_t)pv_qmv_rows(&p, token_class)), 1);
}

/* fused_products with x rounded first where PV_ACT16 says so, unless
 * `rounded` (not NULL) holds it rounded already. */
static pv_status fused_products_of_x(pv_backend *be, const char *base, pv_wtype t, int n_w,
                                     const pv_buffer *const *w, const uint64_t *w_off, const pv_buffer *x,
                                     uint64_t x_off, const xq16 *rounded, const pv_buffer *y, uint64_t y_off,
                                     int64_t n_tokens, int64_t n_in, int64_t n_out)
{
    xq16 xq;
    if (!rounded && act16(be, t)) {
        pv_status st = round_x16(be, t, x, x_off, n_tokens, n_in, &xq);
        if (st != PV_OK)
            return st;
        rounded = &xq;
    }
    return fused_products(be, base, t, n_w, w, w_off, x, x_off, rounded, y, y_off, n_tokens, n_in, n_out);
}

/* y[:, r0 : r0 + n_rows] = x W_tile^T, W_tile [n_rows][n_in] f32 from b_off of b. */
static pv_status qmatmul_sgemm(pv_backend *be, const pv_qmatmul_args *a, int64_t r0, int64_t n_rows, cl_mem b,
                               size_t b_off)
{
    cl_command_queue queue = pv_opencl_of(be)->queues[PV_QUEUE_COMPUTE];
    CLBlastStatusCode status =
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, (size_t)a->n_tokens,
                     (size_t)n_rows, (size_t)a->n_in, 1.0f, pv_opencl_mem(a->x), (size_t)a->x_off,
                     (size_t)a->n_in, b, b_off, (size_t)a->n_in, 0.0f, pv_opencl_mem(a->y),
                     (size_t)(a->y_off + (uint64_t)r0), (size_t)a->n_out, &queue, NULL);
    if (status != CLBlastSuccess)
        return pv_error(PV_ERR_BACKEND, "opencl qmatmul: CLBlastSgemm (T %" PRId64 ", rows %" PRId64
                        " from %" PRId64 ", n_in %" PRId64 ") failed with status %d",
                        a->n_tokens, n_rows, r0, a->n_in, (int)status);
    be->launches++;
    return PV_OK;
}

pv_status pv_opencl_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (a->n_tokens <= PV_OPENCL_QMATMUL_FUSED_MAX_T)
        return fused_products_of_x(be, "pv_qmatmul_fused", a->w_type, 1, &a->w, &a->w_off, a->x, a->x_off, NULL,
                                   a->y, a->y_off, a->n_tokens, a->n_in, a->n_out);
    if (a->w_type == PV_W_F32) /* GEMM reads f32 weights in place */
        return qmatmul_sgemm(be, a, 0, a->n_out, pv_opencl_mem(a->w), (size_t)a->w_off);

    int64_t tile_rows = (int64_t)(PV_OPENCL_QMATMUL_TILE_BYTES / sizeof(float)) / a->n_in;
    tile_rows = tile_rows < 1 ? 1 : tile_rows > a->n_out ? a->n_out : tile_rows;
    cl_mem tile;
    pv_status st = scratch_reserve(cl, "qmatmul", PV_OPENCL_SCRATCH_QMATMUL,
                                   (size_t)tile_rows * (size_t)a->n_in * sizeof(float), &tile);
    if (st != PV_OK)
        return st;
    const int64_t w_words = weight_words(a->w_type, a->w_off);
    for (int64_t r0 = 0; r0 < a->n_out && st == PV_OK; r0 += tile_rows) {
        const int64_t n_rows = a->n_out - r0 < tile_rows ? a->n_out - r0 : tile_rows;
        kernel_args ka;
        st = kernel_begin_weights(be, a->w_type, "pv_qmatmul_widen", &ka);
        if (st != PV_OK)
            return st;
        arg_mem(&ka, pv_opencl_mem(a->w));
        arg_long(&ka, w_words);
        arg_int(&ka, (int32_t)a->n_in);
        arg_long(&ka, r0);
        arg_mem(&ka, tile);
        st = launch(be, "qmatmul widen", &ka, ceil_div((uint64_t)a->n_in, (uint64_t)ka.work_group),
                    (uint64_t)n_rows);
        if (st == PV_OK)
            st = qmatmul_sgemm(be, a, r0, n_rows, tile, 0);
    }
    return st;
}

pv_status pv_opencl_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_rmsnorm", &ka);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_mem(&ka, pv_opencl_mem(a->weight));
    arg_long(&ka, (int64_t)a->weight_off);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    arg_long(&ka, a->dim);
    arg_float(&ka, a->eps);
    return launch(be, "rmsnorm", &ka, (uint64_t)a->rows, 1);
}

pv_status pv_opencl_rope(pv_backend *be, const pv_rope_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_rope", &ka);
    if (st != PV_OK)
        return st;
    cl_mem pos;
    st = upload_one(be, "rope", a->pos, (size_t)a->n_tokens * sizeof(int32_t), &pos);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_mem(&ka, pos);
    arg_int(&ka, a->n_heads);
    arg_int(&ka, a->head_dim);
    arg_float(&ka, a->base);
    arg_int(&ka, a->neox ? 1 : 0);
    return launch(be, "rope", &ka, (uint64_t)a->n_heads, (uint64_t)a->n_tokens);
}

/* The element-wise kernels share their argument shape: (x, x_off, y, y_off,
 * out, out_off, n). */
static pv_status elementwise(pv_backend *be, const char *name, const pv_buffer *x, uint64_t x_off,
                             const pv_buffer *y, uint64_t y_off, const pv_buffer *out, uint64_t out_off,
                             int64_t n)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, name, &ka);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(x));
    arg_long(&ka, (int64_t)x_off);
    arg_mem(&ka, pv_opencl_mem(y));
    arg_long(&ka, (int64_t)y_off);
    arg_mem(&ka, pv_opencl_mem(out));
    arg_long(&ka, (int64_t)out_off);
    arg_long(&ka, n);
    uint64_t per_group = (uint64_t)ka.work_group * (uint64_t)ka.item_elems;
    return launch(be, name + 3, &ka, ceil_div((uint64_t)n, per_group), 1);
}

pv_status pv_opencl_swiglu(pv_backend *be, const pv_swiglu_args *a)
{
    return elementwise(be, "pv_swiglu", a->gate, a->gate_off, a->up, a->up_off, a->out, a->out_off, a->n);
}

pv_status pv_opencl_add(pv_backend *be, const pv_add_args *a)
{
    return elementwise(be, "pv_add", a->a, a->a_off, a->b, a->b_off, a->out, a->out_off, a->n);
}

/* Decode-sized batches: one pass of pv_qmatmul_swiglu_<max_t> over both
 * matrices. Larger ones: the two products as pv_opencl_qmatmul runs them
 * (widened tiles and CLBlast, gate into y and up into a->up), then
 * pv_swiglu: 2 x (widen + GEMM) + 1 launches per tile pair, 3 for F32. */
static pv_status swiglu_of(pv_backend *be, const pv_qmatmul_swiglu_args *a, const xq16 *rounded)
{
    if (a->n_tokens > PV_OPENCL_QMATMUL_FUSED_MAX_T) {
        pv_qmatmul_args product = {.w_type = a->w_type, .n_tokens = a->n_tokens, .n_in = a->n_in,
                                   .n_out = a->n_out, .w = a->w_gate, .w_off = a->w_gate_off, .x = a->x,
                                   .x_off = a->x_off, .y = a->y, .y_off = a->y_off};
        pv_status st = pv_opencl_qmatmul(be, &product);
        product.w = a->w_up;
        product.w_off = a->w_up_off;
        product.y = a->up;
        product.y_off = a->up_off;
        if (st == PV_OK)
            st = pv_opencl_qmatmul(be, &product);
        if (st != PV_OK)
            return st;
        return elementwise(be, "pv_swiglu", a->y, a->y_off, a->up, a->up_off, a->y, a->y_off,
                           a->n_tokens * a->n_out);
    }
    const pv_buffer *const w[2] = {a->w_gate, a->w_up};
    const uint64_t w_off[2] = {a->w_gate_off, a->w_up_off};
    return fused_products_of_x(be, "pv_qmatmul_swiglu", a->w_type, 2, w, w_off, a->x, a->x_off, rounded, a->y,
                               a->y_off, a->n_tokens, a->n_in, a->n_out);
}

pv_status pv_opencl_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a)
{
    return swiglu_of(be, a, NULL);
}

/* Up to three decode-sized products of one x and one weight type in one
 * launch of pv_qmatmul_group[16]_<class> (kernels/qmatmul.cl); xq: x as
 * rounded for PV_ACT16, or NULL. */
static pv_status group_launch(pv_backend *be, const pv_qmatmul_args *p, int n, const xq16 *xq)
{
    const pv_qmatmul_args *first = &p[0];
    const int token_class = pv_qmv_token_class(first->n_tokens);
    const pv_kernel_params params = family_params(be, PV_KERNEL_QMATMUL);
    const uint64_t rows = (uint64_t)pv_qmv_rows(&params, token_class);
    char name[40];
    snprintf(name, sizeof name, "pv_qmatmul_group%s_%d", xq ? "16" : "", token_class);
    kernel_args ka;
    pv_status st = kernel_begin_weights(be, first->w_type, name, &ka);
    if (st != PV_OK)
        return st;
    uint64_t groups = 0;
    for (int i = 0; i < 3; i++) { /* a missing third: the second again, with no rows */
        const pv_qmatmul_args *a = &p[i < n ? i : n - 1];
        const int64_t n_out = i < n ? a->n_out : 0;
        arg_mem(&ka, pv_opencl_mem(a->w));
        arg_long(&ka, weight_words(a->w_type, a->w_off));
        arg_mem(&ka, pv_opencl_mem(a->y));
        arg_long(&ka, (int64_t)a->y_off);
        arg_int(&ka, (int32_t)n_out);
        groups += ceil_div((uint64_t)n_out, rows);
    }
    arg_x(&ka, first->x, first->x_off, xq);
    arg_int(&ka, (int32_t)first->n_tokens);
    arg_int(&ka, (int32_t)first->n_in);
    return launch(be, name + 3, &ka, groups, 1);
}

/* Products of one x (Q, K and V). At decode sizes, products of one weight
 * type go three to a launch (group_launch), x rounded once first where
 * PV_ACT16 says so; products of mixed types one by one, x still rounded
 * once for all the block-type ones. Larger batches one by one. `rounded`
 * (not NULL) holds x rounded already where pv_qmatmul_group_rounds says
 * the group takes it so. */
static pv_status group_of(pv_backend *be, const pv_qmatmul_args *products, int n, const xq16 *rounded)
{
    const pv_qmatmul_args *first = &products[0];
    const int decode = first->n_tokens <= PV_OPENCL_QMATMUL_FUSED_MAX_T;
    int one_type = 1;
    for (int i = 1; i < n; i++)
        one_type &= products[i].w_type == first->w_type;
    const int shared = pv_qmatmul_group_rounds(be->tuning, products, n, PV_OPENCL_QMATMUL_FUSED_MAX_T);
    xq16 xq = rounded ? *rounded : (xq16){0};
    pv_status st = shared >= 0 && !rounded ? round_x16(be, products[shared].w_type, first->x, first->x_off,
                                                       first->n_tokens, first->n_in, &xq)
                                           : PV_OK;
    if (decode && one_type && n > 1) {
        for (int i = 0; i < n && st == PV_OK; i += 3)
            st = group_launch(be, products + i, n - i < 3 ? n - i : 3, shared >= 0 ? &xq : NULL);
        return st;
    }
    for (int i = 0; i < n && st == PV_OK; i++) {
        const pv_qmatmul_args *a = &products[i];
        st = shared >= 0 && act16(be, a->w_type)
                 ? fused_products(be, "pv_qmatmul_fused", a->w_type, 1, &a->w, &a->w_off, a->x, a->x_off, &xq,
                                  a->y, a->y_off, a->n_tokens, a->n_in, a->n_out)
                 : pv_opencl_qmatmul(be, a);
    }
    return st;
}

pv_status pv_opencl_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    return group_of(be, products, n, NULL);
}

/* pv_add_rmsnorm, with the norm also rounded into xq (not NULL) for the
 * PV_ACT16 products that read it next. */
static pv_status add_rmsnorm_of(pv_backend *be, const pv_add_rmsnorm_args *a, const xq16 *xq)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, xq ? "pv_add_rmsnorm16" : "pv_add_rmsnorm", &ka);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_mem(&ka, pv_opencl_mem(a->y));
    arg_long(&ka, (int64_t)a->y_off);
    arg_mem(&ka, pv_opencl_mem(a->weight));
    arg_long(&ka, (int64_t)a->weight_off);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    arg_long(&ka, a->dim);
    arg_float(&ka, a->eps);
    if (xq)
        arg_xq(&ka, xq);
    return launch(be, xq ? "add_rmsnorm16" : "add_rmsnorm", &ka, (uint64_t)a->rows, 1);
}

pv_status pv_opencl_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a)
{
    return add_rmsnorm_of(be, a, NULL);
}

/* The norm's kernel rounds its output for the products where they take x
 * rounded (PV_ACT16): the rounding launch saved. */
pv_status pv_opencl_add_rmsnorm_group(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                                      int n)
{
    xq16 xq;
    const int rounds = pv_qmatmul_group_rounds(be->tuning, products, n, PV_OPENCL_QMATMUL_FUSED_MAX_T) >= 0;
    pv_status st = rounds ? xq16_reserve(be, norm->rows, norm->dim, &xq) : PV_OK;
    if (st == PV_OK)
        st = add_rmsnorm_of(be, norm, rounds ? &xq : NULL);
    return st == PV_OK ? group_of(be, products, n, rounds ? &xq : NULL) : st;
}

pv_status pv_opencl_add_rmsnorm_swiglu(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                       const pv_qmatmul_swiglu_args *swiglu)
{
    xq16 xq;
    const int rounds = swiglu->n_tokens <= PV_OPENCL_QMATMUL_FUSED_MAX_T && act16(be, swiglu->w_type);
    pv_status st = rounds ? xq16_reserve(be, norm->rows, norm->dim, &xq) : PV_OK;
    if (st == PV_OK)
        st = add_rmsnorm_of(be, norm, rounds ? &xq : NULL);
    return st == PV_OK ? swiglu_of(be, swiglu, rounds ? &xq : NULL) : st;
}

pv_status pv_opencl_softmax(pv_backend *be, const pv_softmax_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_softmax", &ka);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    arg_long(&ka, a->cols);
    arg_float(&ka, a->scale);
    return launch(be, "softmax", &ka, (uint64_t)a->rows, 1);
}

/* The row results land in the backend's results scratch, created once and
 * grown, not per call. */
static pv_status result_buffer(pv_backend *be, const char *what, int64_t rows, cl_mem *out)
{
    return scratch_reserve(pv_opencl_of(be), what, PV_OPENCL_SCRATCH_RESULTS, (size_t)rows * sizeof(int32_t), out);
}

/* A blocking read on the compute queue, in order after the call's kernel:
 * it waits for that kernel (and the compute before it), never for the copy
 * queue, and is done before the next call's kernel may write the buffer. */
static pv_status read_results(pv_backend *be, const char *what, cl_mem results, int64_t rows, int32_t *out)
{
    cl_int err = clEnqueueReadBuffer(pv_opencl_of(be)->queues[PV_QUEUE_COMPUTE], results, CL_TRUE, 0,
                                     (size_t)rows * sizeof(int32_t), out, 0, NULL, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail(what, "clEnqueueReadBuffer (results)", err);
}

pv_status pv_opencl_argmax(pv_backend *be, const pv_argmax_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_argmax", &ka);
    if (st != PV_OK)
        return st;
    cl_mem results;
    st = result_buffer(be, "argmax", a->rows, &results);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_long(&ka, a->cols);
    arg_mem(&ka, results);
    st = launch(be, "argmax", &ka, (uint64_t)a->rows, 1);
    if (st == PV_OK)
        st = read_results(be, "argmax", results, a->rows, a->out);
    return st;
}

pv_status pv_opencl_sample_top_p(pv_backend *be, const pv_sample_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_sample_top_p", &ka);
    if (st != PV_OK)
        return st;
    cl_mem u, results;
    st = upload_one(be, "sample_top_p", a->u, (size_t)a->rows * sizeof(float), &u);
    if (st == PV_OK)
        st = result_buffer(be, "sample_top_p", a->rows, &results);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->logits));
    arg_long(&ka, (int64_t)a->logits_off);
    arg_long(&ka, a->cols);
    arg_float(&ka, a->temperature);
    arg_float(&ka, a->top_p);
    arg_mem(&ka, u);
    arg_mem(&ka, results);
    st = launch(be, "sample_top_p", &ka, (uint64_t)a->rows, 1);
    if (st == PV_OK)
        st = read_results(be, "sample_top_p", results, a->rows, a->out);
    return st;
}

/* Rows with logit bias entries: the rows of sample_batch's scratch. */
static int64_t biased_rows(const pv_sample_batch_args *a)
{
    int64_t n = 0;
    for (int64_t r = 0; a->bias_start && r < a->rows; r++)
        n += a->bias_start[r + 1] > a->bias_start[r];
    return n;
}

/* Every row's parameters (and bias lists) in one upload, one kernel; with
 * out, one blocking read of the tokens, with out_dev none. */
pv_status pv_opencl_sample_batch(pv_backend *be, const pv_sample_batch_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, "pv_sample_batch", &ka);
    if (st != PV_OK)
        return st;
    const int64_t n_biased = biased_rows(a);
    const int32_t n_entries = n_biased ? a->bias_start[a->rows] : 0;
    cl_mem rows[6] = {NULL}, biased = NULL, results = NULL;
    const void *host[6] = {a->temperature, a->top_p, a->u, a->bias_start, a->bias_token, a->bias_value};
    const size_t row_bytes = (size_t)a->rows * sizeof(float), entry_bytes = (size_t)n_entries * 4;
    const size_t bytes[6] = {row_bytes, row_bytes, row_bytes, row_bytes + 4, entry_bytes, entry_bytes};
    st = upload_indices(be, "sample_batch", n_biased ? 6 : 3, host, bytes, rows);
    if (st == PV_OK && n_biased)
        st = scratch_reserve(pv_opencl_of(be), "sample_batch", PV_OPENCL_SCRATCH_BIAS,
                             (size_t)n_biased * (size_t)a->cols * sizeof(float), &biased);
    if (st == PV_OK && a->out)
        st = result_buffer(be, "sample_batch", a->rows, &results);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->logits));
    arg_long(&ka, (int64_t)a->logits_off);
    arg_long(&ka, a->cols);
    arg_mem(&ka, rows[0]);
    arg_mem(&ka, rows[1]);
    arg_mem(&ka, rows[2]);
    arg_int(&ka, n_biased > 0);
    arg_mem(&ka, rows[3]); /* without a bias these are NULL and never read */
    arg_mem(&ka, rows[4]);
    arg_mem(&ka, rows[5]);
    arg_mem(&ka, biased);
    arg_mem(&ka, a->out ? results : pv_opencl_mem(a->out_dev));
    arg_long(&ka, a->out ? 0 : (int64_t)a->out_dev_off);
    st = launch(be, "sample_batch", &ka, (uint64_t)a->rows, 1);
    if (st == PV_OK && a->out)
        st = read_results(be, "sample_batch", results, a->rows, a->out);
    return st;
}

/* The combine kernel of a split attention rounds its output for the
 * product where it takes x rounded (PV_ACT16): the rounding launch saved;
 * unsplit, the product rounds it. */
pv_status pv_opencl_attention_qmatmul(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product)
{
    xq16 xq;
    int rounded = 0;
    const int decode = product->n_tokens <= PV_OPENCL_QMATMUL_FUSED_MAX_T;
    const int rounds = decode && act16(be, product->w_type) && att->head_dim % 32 == 0;
    pv_status st = rounds ? xq16_reserve(be, product->n_tokens, product->n_in, &xq) : PV_OK;
    if (st == PV_OK)
        st = attention_of(be, att, rounds ? &xq : NULL, &rounded);
    if (st != PV_OK)
        return st;
    if (!decode)
        return pv_opencl_qmatmul(be, product);
    return fused_products_of_x(be, "pv_qmatmul_fused", product->w_type, 1, &product->w, &product->w_off, product->x,
                               product->x_off, rounded ? &xq : NULL, product->y, product->y_off, product->n_tokens,
                               product->n_in, product->n_out);
}
