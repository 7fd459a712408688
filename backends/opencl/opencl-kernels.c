/* The OpenCL backend's kernel ops: the portable kernels of kernels/, built
 * at run time from their embedded text, cached per define set, launched on
 * the compute queue. Launch geometry follows kernels/dialect.h: groups of
 * work_group work-items along dimension 0, a second dimension of groups. */
#include "config.h"

#include "backends/opencl/opencl.h"
#include "kernels/kernel-sources.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Elements per work-item in the copy and element-wise kernels
 * (PV_ITEM_ELEMS of the dialect). */
#define PV_OPENCL_ITEM_ELEMS 8

/* ---- program cache ----------------------------------------------------------- */

static const char *family_source(pv_opencl_family family)
{
    switch (family) {
    case PV_OPENCL_ATTENTION: return pv_kernel_source_attention;
    case PV_OPENCL_GATHER: return pv_kernel_source_gather;
    case PV_OPENCL_RECOMPUTE: return pv_kernel_source_recompute;
    case PV_OPENCL_FAMILY_COUNT: break;
    }
    return NULL;
}

static const char *family_name(pv_opencl_family family)
{
    switch (family) {
    case PV_OPENCL_ATTENTION: return "attention";
    case PV_OPENCL_GATHER: return "gather";
    case PV_OPENCL_RECOMPUTE: return "recompute";
    case PV_OPENCL_FAMILY_COUNT: break;
    }
    return "?";
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
static pv_status build_failure(pv_opencl *cl, cl_program program, pv_opencl_family family,
                               const char *options, cl_int err)
{
    char log[640] = "";
    size_t size = 0;
    clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size);
    char *full = size ? malloc(size + 1) : NULL;
    if (full && clGetProgramBuildInfo(program, cl->device, CL_PROGRAM_BUILD_LOG, size, full, NULL) == CL_SUCCESS) {
        full[size] = '\0';
        snprintf(log, sizeof log, "%s", full);
    }
    free(full);
    return pv_error(PV_ERR_BACKEND, "opencl: building kernels/%s.cl with \"%s\" failed: %s (%d); build log: %s",
                    family_name(family), options, pv_opencl_error_name(err), (int)err, log);
}

/* Build `family` with `options` and create all its kernels into *p. */
static pv_status program_build(pv_opencl *cl, pv_opencl_family family, const char *options,
                               pv_opencl_program *p)
{
    memset(p, 0, sizeof *p);
    p->family = family;
    snprintf(p->options, sizeof p->options, "%s", options);
    const char *sources[2] = {pv_kernel_source_dialect, family_source(family)};
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

pv_status pv_opencl_kernel(pv_backend *be, pv_opencl_family family, pv_dtype store, const char *name,
                           cl_kernel *out)
{
    pv_opencl *cl = pv_opencl_of(be);
    int f16 = family != PV_OPENCL_RECOMPUTE && store == PV_F16;
    char options[256];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DPV_WG=%d -DPV_ITEM_ELEMS=%d -DPV_STORE_F16=%d",
             cl->work_group, PV_OPENCL_ITEM_ELEMS, f16);
    char full_name[64];
    if (family == PV_OPENCL_RECOMPUTE)
        snprintf(full_name, sizeof full_name, "%s", name);
    else
        snprintf(full_name, sizeof full_name, "%s_%s", name, f16 ? "f16" : "f32");

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
        if (strcmp(p->kernel_names[k], full_name) == 0) {
            *out = p->kernels[k];
            return PV_OK;
        }
    return pv_error(PV_ERR_BACKEND, "opencl: kernels/%s.cl has no kernel %s", family_name(family), full_name);
}

/* ---- launching ------------------------------------------------------------------ */

/* Arguments are set in order; the first failure is kept and reported at
 * launch, so the op code reads as a plain argument list. */
typedef struct kernel_args {
    cl_kernel kernel;
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

static pv_status kernel_begin(pv_backend *be, pv_opencl_family family, pv_dtype store, const char *name,
                              kernel_args *ka)
{
    memset(ka, 0, sizeof *ka);
    return pv_opencl_kernel(be, family, store, name, &ka->kernel);
}

/* Enqueue on the compute queue: groups0 x groups1 groups of work_group items. */
static pv_status launch(pv_backend *be, const char *what, const kernel_args *ka, uint64_t groups0,
                        uint64_t groups1)
{
    pv_opencl *cl = pv_opencl_of(be);
    if (ka->err != CL_SUCCESS)
        return pv_opencl_fail(what, "clSetKernelArg", ka->err);
    size_t global[2] = {(size_t)groups0 * (size_t)cl->work_group, (size_t)groups1};
    size_t local[2] = {(size_t)cl->work_group, 1};
    cl_int err = clEnqueueNDRangeKernel(cl->queues[PV_QUEUE_COMPUTE], ka->kernel, 2, NULL, global, local, 0,
                                        NULL, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail(what, "clEnqueueNDRangeKernel", err);
}

static uint64_t ceil_div(uint64_t n, uint64_t d)
{
    return (n + d - 1) / d;
}

/* Host index arrays are valid only during the call: each is copied into a
 * buffer of its own at creation (CL_MEM_COPY_HOST_PTR), so nothing blocks
 * on earlier work; releasing it right after the launch is safe, the runtime
 * keeps it until the kernel is done. */
static pv_status upload(pv_backend *be, const char *what, const void *host, size_t bytes, cl_mem *out)
{
    cl_int err;
    *out = clCreateBuffer(pv_opencl_of(be)->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes,
                          (void *)host, &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return pv_opencl_fail(what, "clCreateBuffer (index upload)", err);
    }
    return PV_OK;
}

static void release_all(cl_mem *mems, int n)
{
    for (int i = 0; i < n; i++)
        if (mems[i])
            clReleaseMemObject(mems[i]);
}

/* The paged index arrays shared by attention and kv_write. */
static pv_status upload_paging(pv_backend *be, const char *what, int32_t n_tokens, const int32_t *token_seq,
                               const int32_t *token_pos, const int32_t *slot_table, int32_t n_seqs,
                               int32_t max_chunks, cl_mem mems[3])
{
    mems[0] = mems[1] = mems[2] = NULL;
    size_t t_bytes = (size_t)n_tokens * sizeof(int32_t);
    pv_status st = upload(be, what, token_seq, t_bytes, &mems[0]);
    if (st == PV_OK)
        st = upload(be, what, token_pos, t_bytes, &mems[1]);
    if (st == PV_OK)
        st = upload(be, what, slot_table, (size_t)n_seqs * (size_t)max_chunks * sizeof(int32_t), &mems[2]);
    if (st != PV_OK)
        release_all(mems, 3);
    return st;
}

/* ---- the ops ----------------------------------------------------------------------- */

pv_status pv_opencl_attention(pv_backend *be, const pv_attention_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_ATTENTION, a->kv_dtype, "pv_attention", &ka);
    if (st != PV_OK)
        return st;
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
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    st = launch(be, "attention", &ka, (uint64_t)a->n_heads, (uint64_t)a->n_tokens);
    release_all(idx, 3);
    return st;
}

pv_status pv_opencl_kv_write(pv_backend *be, const pv_kv_write_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_GATHER, a->kv_dtype, "pv_kv_write", &ka);
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
    st = launch(be, "kv_write", &ka, ceil_div((uint64_t)row_elems, (uint64_t)pv_opencl_of(be)->work_group),
                (uint64_t)a->n_tokens);
    release_all(idx, 3);
    return st;
}

static pv_status slot_copy(pv_backend *be, const pv_slot_copy_args *a, const char *name)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_GATHER, a->dtype, name, &ka);
    if (st != PV_OK)
        return st;
    cl_mem slots;
    st = upload(be, name + 3, a->slots, (size_t)a->n_slots_moved * sizeof(int32_t), &slots);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->pool));
    arg_mem(&ka, pv_opencl_mem(a->staging));
    arg_long(&ka, (int64_t)a->staging_off);
    arg_mem(&ka, slots);
    arg_long(&ka, a->slot_elems);
    uint64_t per_group = (uint64_t)pv_opencl_of(be)->work_group * PV_OPENCL_ITEM_ELEMS;
    st = launch(be, name + 3, &ka, ceil_div((uint64_t)a->slot_elems, per_group), (uint64_t)a->n_slots_moved);
    clReleaseMemObject(slots);
    return st;
}

pv_status pv_opencl_slot_gather(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, "pv_slot_gather");
}

pv_status pv_opencl_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    return slot_copy(be, a, "pv_slot_scatter");
}

pv_status pv_opencl_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_GATHER, a->table_dtype, "pv_embed_gather", &ka);
    if (st != PV_OK)
        return st;
    cl_mem ids;
    st = upload(be, "embed_gather", a->ids, (size_t)a->n_ids * sizeof(int32_t), &ids);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->table));
    arg_long(&ka, (int64_t)a->table_off);
    arg_mem(&ka, ids);
    arg_long(&ka, a->dim);
    arg_mem(&ka, pv_opencl_mem(a->out));
    arg_long(&ka, (int64_t)a->out_off);
    st = launch(be, "embed_gather", &ka, ceil_div((uint64_t)a->dim, (uint64_t)pv_opencl_of(be)->work_group),
                (uint64_t)a->n_ids);
    clReleaseMemObject(ids);
    return st;
}

pv_status pv_opencl_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, "pv_rmsnorm", &ka);
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
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, "pv_rope", &ka);
    if (st != PV_OK)
        return st;
    cl_mem pos;
    st = upload(be, "rope", a->pos, (size_t)a->n_tokens * sizeof(int32_t), &pos);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(a->x));
    arg_long(&ka, (int64_t)a->x_off);
    arg_mem(&ka, pos);
    arg_int(&ka, a->n_heads);
    arg_int(&ka, a->head_dim);
    arg_float(&ka, a->base);
    arg_int(&ka, a->neox ? 1 : 0);
    st = launch(be, "rope", &ka, (uint64_t)a->n_heads, (uint64_t)a->n_tokens);
    clReleaseMemObject(pos);
    return st;
}

/* The element-wise kernels share their argument shape: (x, x_off, y, y_off,
 * out, out_off, n). */
static pv_status elementwise(pv_backend *be, const char *name, const pv_buffer *x, uint64_t x_off,
                             const pv_buffer *y, uint64_t y_off, const pv_buffer *out, uint64_t out_off,
                             int64_t n)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, name, &ka);
    if (st != PV_OK)
        return st;
    arg_mem(&ka, pv_opencl_mem(x));
    arg_long(&ka, (int64_t)x_off);
    arg_mem(&ka, pv_opencl_mem(y));
    arg_long(&ka, (int64_t)y_off);
    arg_mem(&ka, pv_opencl_mem(out));
    arg_long(&ka, (int64_t)out_off);
    arg_long(&ka, n);
    uint64_t per_group = (uint64_t)pv_opencl_of(be)->work_group * PV_OPENCL_ITEM_ELEMS;
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

pv_status pv_opencl_softmax(pv_backend *be, const pv_softmax_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, "pv_softmax", &ka);
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

/* The row results land in a device buffer of their own, read back blocking. */
static pv_status result_buffer(pv_backend *be, const char *what, int64_t rows, cl_mem *out)
{
    cl_int err;
    *out = clCreateBuffer(pv_opencl_of(be)->context, CL_MEM_WRITE_ONLY, (size_t)rows * sizeof(int32_t), NULL,
                          &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return pv_opencl_fail(what, "clCreateBuffer (results)", err);
    }
    return PV_OK;
}

static pv_status read_results(pv_backend *be, const char *what, cl_mem results, int64_t rows, int32_t *out)
{
    cl_int err = clEnqueueReadBuffer(pv_opencl_of(be)->queues[PV_QUEUE_COMPUTE], results, CL_TRUE, 0,
                                     (size_t)rows * sizeof(int32_t), out, 0, NULL, NULL);
    return err == CL_SUCCESS ? PV_OK : pv_opencl_fail(what, "clEnqueueReadBuffer (results)", err);
}

pv_status pv_opencl_argmax(pv_backend *be, const pv_argmax_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, "pv_argmax", &ka);
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
    clReleaseMemObject(results);
    return st;
}

pv_status pv_opencl_sample_top_p(pv_backend *be, const pv_sample_args *a)
{
    kernel_args ka;
    pv_status st = kernel_begin(be, PV_OPENCL_RECOMPUTE, PV_F32, "pv_sample_top_p", &ka);
    if (st != PV_OK)
        return st;
    cl_mem mems[2] = {NULL, NULL}; /* u, results */
    st = upload(be, "sample_top_p", a->u, (size_t)a->rows * sizeof(float), &mems[0]);
    if (st == PV_OK)
        st = result_buffer(be, "sample_top_p", a->rows, &mems[1]);
    if (st != PV_OK) {
        release_all(mems, 2);
        return st;
    }
    arg_mem(&ka, pv_opencl_mem(a->logits));
    arg_long(&ka, (int64_t)a->logits_off);
    arg_long(&ka, a->cols);
    arg_float(&ka, a->temperature);
    arg_float(&ka, a->top_p);
    arg_mem(&ka, mems[0]);
    arg_mem(&ka, mems[1]);
    st = launch(be, "sample_top_p", &ka, (uint64_t)a->rows, 1);
    if (st == PV_OK)
        st = read_results(be, "sample_top_p", mems[1], a->rows, a->out);
    release_all(mems, 2);
    return st;
}
