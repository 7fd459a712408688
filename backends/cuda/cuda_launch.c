/* The CUDA backend's runtime errors (pv_cuda_fail), program cache and
 * kernel launchers (cuda_kernels.h).
 *
 * A launcher copies its family's tuned parameter set, fills in the variants
 * its op needs (storage dtype, weight type, head-dim and query-head
 * classes), finds or builds the program for that set, and launches with
 * the geometry each kernel's comment gives: gridDim = the kernel's groups,
 * blockDim = the set's PV_WG, the same value the program was compiled
 * with. CUDA caps gridDim.y at 65535 (and x at 2^31 - 1), so a launch with
 * more rows along dimension 1 (tokens, moved slots, ids) runs as several
 * launches, each shifted to its first row through the kernel's offset
 * arguments and the index-array pointers.
 *
 * cudaLaunchKernel takes a kernel's arguments as an array of pointers to
 * values of exactly the kernel's parameter types: pv_long is long long,
 * pointers are device pointers, the rest int or float. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/cuda/cuda_kernels.h"
#include "backends/attention-split.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GRID_ROWS 65535LL        /* gridDim.y */
#define MAX_GRID_X 2147483647LL      /* gridDim.x */

/* ---- errors ---------------------------------------------------------------------- */

/* For the whole backend; here, with the runtime's lowest layer, so that
 * tests/test-cuda-launch.c links it. The context is formatted only on
 * failure. Allocation failures are PV_ERR_OUT_OF_MEMORY so the cache can
 * tell a full device from a broken one. The runtime's last-error state is
 * cleared so the next call is not blamed for this one. */
pv_status pv_cuda_fail(cudaError_t err, const char *call, const char *fmt, ...)
{
    char context[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError();
    pv_status st = err == cudaErrorMemoryAllocation ? PV_ERR_OUT_OF_MEMORY : PV_ERR_BACKEND;
    return pv_error(st, "cuda: %s (%s) failed: %s (%s)", call, context, cudaGetErrorString(err),
                    cudaGetErrorName(err));
}

/* ---- programs -------------------------------------------------------------------- */

pv_status pv_cuda_kernels_init(pv_cuda_kernels *k, int major, int minor, const pv_kernel_tuning *tuning,
                               uint64_t *launches)
{
    memset(k, 0, sizeof *k);
    PV_TRY(pv_cuda_target_for(major, minor, &k->target));
    if (!pv_cuda_cache_dir(k->cache_dir, sizeof k->cache_dir))
        k->cache_dir[0] = '\0';
    k->tuning = tuning;
    k->launches = launches;
    return PV_OK;
}

/* The tuned set of a family with one bucket. */
static pv_kernel_params family_params(const pv_cuda_kernels *k, pv_kernel_family family)
{
    const pv_kernel_bucket b = {.family = family};
    return pv_kernel_tuned(k->tuning, &b);
}

void pv_cuda_kernels_free(pv_cuda_kernels *k)
{
    for (int i = 0; i < k->n_programs; i++) {
        cudaLibraryUnload(k->programs[i].library);
        pv_cuda_image_free(&k->programs[i].image);
    }
    (void)cudaGetLastError();
    free(k->programs);
    k->programs = NULL;
    k->n_programs = k->cap_programs = 0;
    free(k->unchecked);
    k->unchecked = NULL;
    k->n_unchecked = k->cap_unchecked = 0;
}

static int same_params(const pv_kernel_params *a, const pv_kernel_params *b)
{
    return a->family == b->family && memcmp(a->value, b->value, sizeof a->value) == 0;
}

/* Builds (or reads from the cache) and loads the program of set p. */
static pv_status program_load(pv_cuda_kernels *k, const pv_kernel_params *p, pv_cuda_program *prog)
{
    memset(prog, 0, sizeof *prog);
    prog->params = *p;
    PV_TRY(pv_cuda_program_image(k->cache_dir[0] ? k->cache_dir : NULL, p, k->target, &prog->image));
    cudaError_t err = cudaLibraryLoadData(&prog->library, prog->image.data, NULL, NULL, 0, NULL, NULL, 0);
    if (err != cudaSuccess) {
        pv_cuda_image_free(&prog->image);
        char defines[128];
        pv_kernel_params_defines(p, defines, sizeof defines);
        return pv_cuda_fail(err, "cudaLibraryLoadData", "kernels/%s.cl built with \"%s\" for %s_%d",
                            pv_kernel_family_spec_of(p->family)->name, defines, k->target.ptx ? "compute" : "sm",
                            k->target.arch);
    }
    return PV_OK;
}

static pv_status program_get(pv_cuda_kernels *k, const pv_kernel_params *set, pv_cuda_program **out)
{
    const pv_kernel_params built = pv_kernel_params_built(set), *p = &built; /* launch parameters build nothing */
    for (int i = 0; i < k->n_programs; i++)
        if (same_params(&k->programs[i].params, p)) {
            *out = &k->programs[i];
            return PV_OK;
        }
    if (k->n_programs == k->cap_programs) {
        int cap = k->cap_programs ? 2 * k->cap_programs : 8;
        pv_cuda_program *grown = realloc(k->programs, (size_t)cap * sizeof *grown);
        if (!grown)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot grow the program cache to %d programs", cap);
        k->programs = grown;
        k->cap_programs = cap;
    }
    PV_TRY(program_load(k, p, &k->programs[k->n_programs]));
    *out = &k->programs[k->n_programs++];
    return PV_OK;
}

/* The kernel `name` of the program of set p. */
static pv_status kernel_get(pv_cuda_kernels *k, const pv_kernel_params *p, const char *name, cudaKernel_t *out)
{
    pv_cuda_program *prog = NULL;
    PV_TRY(program_get(k, p, &prog));
    for (int i = 0; i < prog->n_kernels; i++)
        if (strcmp(prog->names[i], name) == 0) {
            *out = prog->kernels[i];
            return PV_OK;
        }
    const char *family = pv_kernel_family_spec_of(p->family)->name;
    if (prog->n_kernels == PV_CUDA_PROGRAM_KERNELS || strlen(name) >= sizeof prog->names[0])
        return pv_error(PV_ERR_BACKEND, "cuda: kernel %s of kernels/%s.cl: the program holds %d names of < %zu bytes",
                        name, family, PV_CUDA_PROGRAM_KERNELS, sizeof prog->names[0]);
    if (k->n_unchecked == k->cap_unchecked) {
        int cap = k->cap_unchecked ? 2 * k->cap_unchecked : 8;
        struct pv_cuda_unchecked *grown = realloc(k->unchecked, (size_t)cap * sizeof *grown);
        if (!grown)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "cuda: cannot grow the list of kernels to check to %d", cap);
        k->unchecked = grown;
        k->cap_unchecked = cap;
    }
    cudaKernel_t kernel;
    cudaError_t err = cudaLibraryGetKernel(&kernel, prog->library, name);
    if (err != cudaSuccess)
        return pv_cuda_fail(err, "cudaLibraryGetKernel", "%s of kernels/%s.cl", name, family);
    k->unchecked[k->n_unchecked].kernel = kernel;
    snprintf(k->unchecked[k->n_unchecked++].name, sizeof k->unchecked->name, "%s", name);
    snprintf(prog->names[prog->n_kernels], sizeof prog->names[0], "%s", name);
    prog->kernels[prog->n_kernels++] = kernel;
    *out = kernel;
    return PV_OK;
}

/* kernel_get for the name base_f32 or base_f16. */
static pv_status kernel_get_stored(pv_cuda_kernels *k, const pv_kernel_params *p, const char *base, int f16,
                                   cudaKernel_t *out)
{
    char name[40];
    snprintf(name, sizeof name, "%s_%s", base, f16 ? "f16" : "f32");
    return kernel_get(k, p, name, out);
}

/* ---- launching --------------------------------------------------------------------- */

static unsigned int groups_of(long long n, long long per_group)
{
    return (unsigned int)((n + per_group - 1) / per_group);
}

/* Rows of dimension 1 in the launch that starts at row `first`. */
static long long rows_in_launch(long long total, long long first)
{
    return total - first < MAX_GRID_ROWS ? total - first : MAX_GRID_ROWS;
}

/* Groups of dimension 0 in the launch that starts at group `first`. */
static long long rows_in_grid_x(long long total, long long first)
{
    return total - first < MAX_GRID_X ? total - first : MAX_GRID_X;
}

/* A kernel argument: its address, for cudaLaunchKernel, and its size, for
 * the graph trace (which compares the bytes a step would launch with). */
typedef struct karg {
    void *p;
    size_t size;
} karg;
#define KARG(x) {(void *)&(x), sizeof(x)}
#define N_ARGS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define MAX_KERNEL_ARGS 24 /* more than any kernel of kernels/ takes */

/* Describes a launch to the graph trace: kernel, geometry and the bytes of
 * every argument, so a later step launches the recorded graph only if it
 * would have launched exactly this. */
static void trace_launch(pv_cuda_kernels *k, cudaKernel_t kernel, dim3 grid, dim3 block, const karg *args,
                         int n_args)
{
    unsigned char item[3 * sizeof(uint64_t) + MAX_KERNEL_ARGS * sizeof(uint64_t)];
    const uint64_t head[3] = {(uint64_t)(uintptr_t)(const void *)kernel,
                              (uint64_t)grid.x | (uint64_t)grid.y << 32, block.x};
    size_t n = sizeof head;
    memcpy(item, head, n);
    for (int i = 0; i < n_args; i++) {
        if (args[i].size > sizeof item - n) { /* no kernel has such arguments; never replayed */
            pv_graph_trace_opaque(k->trace, PV_TRACE_LAUNCH);
            return;
        }
        memcpy(item + n, args[i].p, args[i].size);
        n += args[i].size;
    }
    pv_graph_trace_item(k->trace, PV_TRACE_LAUNCH, item, n);
}

/* The arguments of a kernel's first launch against its parameters as
 * compiled (cudaFuncGetParamInfo): their count and each one's size.
 * cudaLaunchKernel copies each parameter's size from the address it is
 * given, so an argument missing, extra or of another width would run the
 * kernel on garbage; here it is an error naming the kernel and the
 * argument. kernels/ has no kernel without parameters, so a query that
 * fails at the first one (a runtime that cannot answer it) checks
 * nothing. The runtime's last error is cleared after the query past the
 * end, which fails by design. */
static pv_status check_arguments(const char *name, cudaKernel_t kernel, const karg *args, int n_args)
{
    for (int i = 0; i <= n_args; i++) {
        size_t offset = 0, size = 0;
        const cudaError_t err = cudaFuncGetParamInfo((const void *)kernel, (size_t)i, &offset, &size);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            if (i == n_args || i == 0 || err != cudaErrorInvalidValue)
                return PV_OK;
            return pv_error(PV_ERR_BACKEND, "cuda: kernel %s takes %d arguments, its launcher gives %d", name, i,
                            n_args);
        }
        if (i == n_args)
            return pv_error(PV_ERR_BACKEND, "cuda: kernel %s takes more than the %d arguments its launcher gives",
                            name, n_args);
        if (size != args[i].size)
            return pv_error(PV_ERR_BACKEND,
                            "cuda: kernel %s: its launcher gives argument %d as %zu bytes, the parameter has %zu",
                            name, i, args[i].size, size);
    }
    return PV_OK;
}

/* check_arguments at a kernel's first launch; it is then off the list. A
 * mismatch stays on it, so every launch of that kernel fails alike. */
static pv_status check_first_launch(pv_cuda_kernels *k, cudaKernel_t kernel, const karg *args, int n_args)
{
    for (int i = 0; i < k->n_unchecked; i++)
        if (k->unchecked[i].kernel == kernel) {
            PV_TRY(check_arguments(k->unchecked[i].name, kernel, args, n_args));
            k->unchecked[i] = k->unchecked[--k->n_unchecked];
            break;
        }
    return PV_OK;
}

static pv_status launch(pv_cuda_kernels *k, cudaStream_t stream, const char *what, cudaKernel_t kernel,
                        unsigned int groups0, unsigned int groups1, int work_group, const karg *args, int n_args)
{
    if (n_args > MAX_KERNEL_ARGS)
        return pv_error(PV_ERR_BACKEND, "cuda: %s takes %d arguments, more than the launcher's %d", what, n_args,
                        MAX_KERNEL_ARGS);
    dim3 grid = {groups0, groups1, 1};
    dim3 block = {(unsigned int)work_group, 1, 1};
    if (k->trace) {
        trace_launch(k, kernel, grid, block, args, n_args);
        if (k->check) { /* the recorded graph launches it */
            (*k->launches)++;
            return PV_OK;
        }
    }
    if (k->n_unchecked)
        PV_TRY(check_first_launch(k, kernel, args, n_args));
    void *addresses[MAX_KERNEL_ARGS];
    for (int i = 0; i < n_args; i++)
        addresses[i] = args[i].p;
    cudaError_t err = cudaLaunchKernel((const void *)kernel, grid, block, addresses, 0, stream);
    if (err != cudaSuccess)
        return pv_cuda_fail(err, "cudaLaunchKernel", "%s, %u x %u groups of %d", what, groups0, groups1,
                            work_group);
    (*k->launches)++;
    return PV_OK;
}

/* ---- attention: groups {n_kv_heads * blocks * splits, T}, combine {n_heads, T} ---- */

pv_status pv_cuda_launch_attention(pv_cuda_kernels *k, cudaStream_t stream, const pv_attention_args *a,
                                   const float *q, const void *kv_pool, const int32_t *token_seq,
                                   const int32_t *token_pos, const int32_t *slot_table, int max_group, int splits,
                                   float *part, float *out, const pv_cuda_xq16 *xq)
{
    const int blocks = pv_attention_head_blocks(a->n_heads, a->n_kv_heads, max_group);
    int heads_per_block = pv_attention_heads_per_block(a->n_heads, a->n_kv_heads, max_group);
    /* The smallest classes that hold this call: registers for the heads
     * and dims a work-item really has. */
    int group_class = 1;
    while (group_class < heads_per_block)
        group_class *= 2;
    pv_kernel_bucket bucket;
    pv_kernel_bucket_of_attention(a, &bucket);
    pv_kernel_params p = pv_kernel_tuned(k->tuning, &bucket);
    p.value[PV_KPARAM_STORE_F16] = a->kv_dtype == PV_F16;
    p.value[PV_KPARAM_MAX_HEAD_DIM] = bucket.head_dim;
    p.value[PV_KPARAM_ATT_MAX_GROUP] = group_class;
    const int f16 = a->kv_dtype == PV_F16, wg = p.value[PV_KPARAM_WG];
    cudaKernel_t attention, combine = NULL;
    PV_TRY(kernel_get_stored(k, &p, pv_attention_kernel_base(wg, bucket.head_dim), f16, &attention));
    if (splits > 1)
        PV_TRY(kernel_get_stored(k, &p, xq ? "pv_attention_combine16" : "pv_attention_combine", f16, &combine));
    void *xq_q = xq ? xq->q : NULL;
    float *xq_s = xq ? xq->s : NULL;

    int max_chunks = a->max_chunks, n_heads = a->n_heads, n_kv_heads = a->n_kv_heads, head_dim = a->head_dim;
    int chunk_tokens = a->chunk_tokens, n_splits = splits;
    float scale = a->scale;
    const long long token_elems = (long long)a->n_heads * a->head_dim;
    /* part: [T][splits][n_heads][head_dim], then [T][splits][n_heads][2] */
    const long long ml_base = (long long)a->n_tokens * splits * token_elems;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += MAX_GRID_ROWS) {
        const unsigned int rows = (unsigned int)rows_in_launch(a->n_tokens, i0);
        long long off = i0 * token_elems;
        long long part_off = i0 * splits * token_elems;
        long long ml_off = ml_base + i0 * splits * a->n_heads * 2;
        const int32_t *seq = token_seq + i0, *pos = token_pos + i0;
        karg args[] = {KARG(q),          KARG(off),          KARG(kv_pool),  KARG(seq),        KARG(pos),
                       KARG(slot_table), KARG(max_chunks),   KARG(n_heads),  KARG(n_kv_heads), KARG(head_dim),
                       KARG(chunk_tokens), KARG(scale),      KARG(heads_per_block), KARG(n_splits), KARG(out),
                       KARG(off),        KARG(part),         KARG(part_off), KARG(ml_off)};
        PV_TRY(launch(k, stream, "attention", attention, (unsigned int)(a->n_kv_heads * blocks * splits), rows, wg,
                   args, N_ARGS(args)));
        if (splits > 1) {
            /* xq's words and xs's floats of the tokens before i0: 16 and 2 a block */
            long long q_off = off / 2, s_off = off / 16;
            karg combine_args[] = {KARG(part),    KARG(part_off), KARG(ml_off), KARG(n_splits),
                                   KARG(n_heads), KARG(head_dim), KARG(out),    KARG(off),
                                   KARG(xq_q),    KARG(q_off),    KARG(xq_s),   KARG(s_off)};
            PV_TRY(launch(k, stream, xq ? "attention combine16" : "attention combine", combine,
                          (unsigned int)a->n_heads, rows, wg, combine_args,
                          xq ? N_ARGS(combine_args) : N_ARGS(combine_args) - 4));
        }
    }
    return PV_OK;
}

/* ---- gather family ------------------------------------------------------------------ */

/* groups {ceil(row_elems / PV_WG), T} */
pv_status pv_cuda_launch_kv_write(pv_cuda_kernels *k, cudaStream_t stream, const pv_kv_write_args *a,
                                  const float *kf, const float *vf, void *kv_pool, const int32_t *token_seq,
                                  const int32_t *token_pos, const int32_t *slot_table)
{
    pv_kernel_params p = family_params(k, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = a->kv_dtype == PV_F16;
    cudaKernel_t kernel;
    PV_TRY(kernel_get_stored(k, &p, "pv_kv_write", a->kv_dtype == PV_F16, &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    int max_chunks = a->max_chunks, chunk_tokens = a->chunk_tokens;
    long long row_elems = (long long)a->n_kv_heads * a->head_dim;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += MAX_GRID_ROWS) {
        long long off = i0 * row_elems;
        const int32_t *seq = token_seq + i0, *pos = token_pos + i0;
        karg args[] = {KARG(kf),  KARG(off),        KARG(vf),         KARG(off),          KARG(kv_pool),  KARG(seq),
                       KARG(pos), KARG(slot_table), KARG(max_chunks), KARG(chunk_tokens), KARG(row_elems)};
        PV_TRY(launch(k, stream, "kv_write", kernel, groups_of(row_elems, wg),
                   (unsigned int)rows_in_launch(a->n_tokens, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {ceil(slot_elems / (PV_WG * PV_ITEM_ELEMS)), n_moved}; the words
 * are moved bit-exactly, so f16 slots travel as 16-bit words. */
pv_status pv_cuda_launch_slot_copy(pv_cuda_kernels *k, cudaStream_t stream, const pv_slot_copy_args *a,
                                   int scatter, void *pool, void *staging, const int32_t *slots)
{
    pv_kernel_params p = family_params(k, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = a->dtype == PV_F16;
    const char *what = scatter ? "slot_scatter" : "slot_gather";
    cudaKernel_t kernel;
    PV_TRY(kernel_get_stored(k, &p, scatter ? "pv_slot_scatter" : "pv_slot_gather", a->dtype == PV_F16, &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    const long long per_group = (long long)wg * p.value[PV_KPARAM_ITEM_ELEMS];
    long long slot_elems = a->slot_elems;
    for (long long i0 = 0; i0 < a->n_slots_moved; i0 += MAX_GRID_ROWS) {
        long long off = i0 * slot_elems;
        const int32_t *ids = slots + i0;
        karg args[] = {KARG(pool), KARG(staging), KARG(off), KARG(ids), KARG(slot_elems)};
        PV_TRY(launch(k, stream, what, kernel, groups_of(slot_elems, per_group),
                   (unsigned int)rows_in_launch(a->n_slots_moved, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {ceil(slot_words / (PV_WG * PV_ITEM_ELEMS)), n}; any build of the
 * family has the kernel (words are words), so the f32 one serves. */
pv_status pv_cuda_launch_slot_transfer(pv_cuda_kernels *k, cudaStream_t stream, const pv_slot_transfer_args *a,
                                       void *dst, const void *src, const int32_t *dst_slots,
                                       const int32_t *src_slots)
{
    pv_kernel_params p = family_params(k, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = 0;
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, "pv_slot_transfer", &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    const long long per_group = (long long)wg * p.value[PV_KPARAM_ITEM_ELEMS];
    long long slot_words = a->slot_elems * (long long)pv_dtype_size(a->dtype) / 4;
    for (long long i0 = 0; i0 < a->n; i0 += MAX_GRID_ROWS) {
        const int32_t *to = dst_slots + i0, *from = src_slots + i0;
        karg args[] = {KARG(dst), KARG(src), KARG(to), KARG(from), KARG(slot_words)};
        PV_TRY(launch(k, stream, "slot_transfer", kernel, groups_of(slot_words, per_group),
                      (unsigned int)rows_in_launch(a->n, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* ---- qmatmul family ----------------------------------------------------------------- */

static pv_kernel_params weight_params(const pv_cuda_kernels *k, pv_wtype t)
{
    pv_kernel_params p = family_params(k, PV_KERNEL_QMATMUL);
    p.value[PV_KPARAM_WTYPE] = (int)t;
    return p;
}

/* groups {n_heads + n_kv_heads, T} */
pv_status pv_cuda_launch_rope_kv_write(pv_cuda_kernels *k, cudaStream_t stream, const pv_rope_kv_write_args *a,
                                       float *q, const float *kf, const float *vf, void *kv_pool,
                                       const int32_t *token_seq, const int32_t *token_pos, const int32_t *slot_table)
{
    pv_kernel_params p = family_params(k, PV_KERNEL_GATHER);
    p.value[PV_KPARAM_STORE_F16] = a->kv_dtype == PV_F16;
    cudaKernel_t kernel;
    PV_TRY(kernel_get_stored(k, &p, "pv_rope_kv_write", a->kv_dtype == PV_F16, &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    int max_chunks = a->max_chunks, chunk_tokens = a->chunk_tokens, n_heads = a->n_heads;
    int n_kv_heads = a->n_kv_heads, head_dim = a->head_dim, neox = a->neox ? 1 : 0;
    float base = a->base;
    const long long q_elems = (long long)a->n_heads * a->head_dim, row_elems = (long long)a->n_kv_heads * a->head_dim;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += MAX_GRID_ROWS) {
        long long q_off = i0 * q_elems, off = i0 * row_elems;
        const int32_t *seq = token_seq + i0, *pos = token_pos + i0;
        karg args[] = {KARG(q),          KARG(q_off),        KARG(kf),      KARG(off),        KARG(vf),
                       KARG(off),        KARG(kv_pool),      KARG(seq),     KARG(pos),        KARG(slot_table),
                       KARG(max_chunks), KARG(chunk_tokens), KARG(n_heads), KARG(n_kv_heads), KARG(head_dim),
                       KARG(base),       KARG(neox)};
        PV_TRY(launch(k, stream, "rope_kv_write", kernel, (unsigned int)(a->n_heads + a->n_kv_heads),
                      (unsigned int)rows_in_launch(a->n_tokens, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {ceil(dim / PV_WG), n_ids} */
pv_status pv_cuda_launch_embed_gather(pv_cuda_kernels *k, cudaStream_t stream, const pv_embed_gather_args *a,
                                      const void *table, const int32_t *ids, const int32_t *ids_dev, float *out)
{
    const pv_kernel_params p = weight_params(k, a->table_type);
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, "pv_embed_gather", &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    long long table_off = 0, n_rows = a->n_rows, ids_dev_off = 0, dim = a->dim;
    for (long long i0 = 0; i0 < a->n_ids; i0 += MAX_GRID_ROWS) {
        long long out_off = i0 * a->dim;
        const int32_t *first = ids + i0; /* device ids stay numbered from ids_dev */
        karg args[] = {KARG(table),       KARG(table_off), KARG(n_rows), KARG(first),  KARG(ids_dev),
                       KARG(ids_dev_off), KARG(dim),       KARG(out),    KARG(out_off)};
        PV_TRY(launch(k, stream, "embed_gather", kernel, groups_of(a->dim, wg),
                   (unsigned int)rows_in_launch(a->n_ids, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* The fused kernel "<base>_<class>" for T's token class, of weight type
 * t, over W (w_up NULL) or the gate and up matrices of a SwiGLU: a block
 * a pv_qmv_rows run of rows. x is f32, or with xq the rounded activations
 * of pv_cuda_launch_qmatmul_round16 (the "<base>16_<class>" kernels). */
static pv_status launch_fused(pv_cuda_kernels *k, cudaStream_t stream, const char *base, pv_wtype t, const void *w,
                              const void *w_up, const float *x, const pv_cuda_xq16 *xq, float *y, int64_t n_tokens,
                              int64_t n_in, int64_t n_out)
{
    const pv_kernel_params p = weight_params(k, t);
    const int token_class = pv_qmv_token_class(n_tokens);
    char name[40];
    snprintf(name, sizeof name, "%s%s_%d", base, xq ? "16" : "", token_class);
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, name, &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    long long zero = 0;
    int tokens = (int)n_tokens, in = (int)n_in, out = (int)n_out;
    int x4 = (uintptr_t)x % 16 == 0 && n_in % 4 == 0;
    const void *q = xq ? xq->q : NULL;
    const float *s = xq ? xq->s : NULL;
    karg args[13];
    int n = 0;
    args[n++] = (karg)KARG(w);
    args[n++] = (karg)KARG(zero);
    if (w_up) {
        args[n++] = (karg)KARG(w_up);
        args[n++] = (karg)KARG(zero);
    }
    if (xq) {
        const karg act[] = {KARG(q), KARG(zero), KARG(s), KARG(zero)};
        for (int i = 0; i < N_ARGS(act); i++)
            args[n++] = act[i];
    } else {
        const karg act[] = {KARG(x), KARG(zero), KARG(x4)};
        for (int i = 0; i < N_ARGS(act); i++)
            args[n++] = act[i];
    }
    const karg rest[] = {KARG(y), KARG(zero), KARG(tokens), KARG(in), KARG(out)};
    for (int i = 0; i < N_ARGS(rest); i++)
        args[n++] = rest[i];
    return launch(k, stream, name + 3, kernel, groups_of(n_out, pv_qmv_rows(&p, token_class)), 1, wg, args, n);
}

pv_status pv_cuda_launch_qmatmul_fused(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                       const void *w, const float *x, const pv_cuda_xq16 *xq, float *y)
{
    return launch_fused(k, stream, "pv_qmatmul_fused", a->w_type, w, NULL, x, xq, y, a->n_tokens, a->n_in, a->n_out);
}

pv_status pv_cuda_launch_qmatmul_swiglu_fused(pv_cuda_kernels *k, cudaStream_t stream,
                                              const pv_qmatmul_swiglu_args *a, const void *w_gate,
                                              const void *w_up, const float *x, const pv_cuda_xq16 *xq, float *y)
{
    return launch_fused(k, stream, "pv_qmatmul_swiglu", a->w_type, w_gate, w_up, x, xq, y, a->n_tokens, a->n_in,
                        a->n_out);
}

/* groups: each product's ceil(n_out / rows), side by side (kernels/
 * qmatmul.cl, PV_QMV_PICK3); a missing third is the second with no rows */
pv_status pv_cuda_launch_qmatmul_group(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *products,
                                       int n, const void *const *w, float *const *y, const float *x,
                                       const pv_cuda_xq16 *xq)
{
    const pv_qmatmul_args *first = &products[0];
    const pv_kernel_params p = weight_params(k, first->w_type);
    const int token_class = pv_qmv_token_class(first->n_tokens);
    char name[40];
    snprintf(name, sizeof name, "pv_qmatmul_group%s_%d", xq ? "16" : "", token_class);
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, name, &kernel));
    long long zero = 0, groups = 0;
    const void *ws[3];
    float *ys[3];
    int outs[3];
    karg args[3 * 5 + 6];
    int na = 0;
    for (int i = 0; i < 3; i++) {
        const int j = i < n ? i : n - 1;
        ws[i] = w[j];
        ys[i] = y[j];
        outs[i] = i < n ? (int)products[i].n_out : 0;
        groups += groups_of(outs[i], pv_qmv_rows(&p, token_class));
        const karg one[] = {KARG(ws[i]), KARG(zero), KARG(ys[i]), KARG(zero), KARG(outs[i])};
        for (int e = 0; e < N_ARGS(one); e++)
            args[na++] = one[e];
    }
    int tokens = (int)first->n_tokens, in = (int)first->n_in;
    int x4 = (uintptr_t)x % 16 == 0 && first->n_in % 4 == 0;
    const void *q = xq ? xq->q : NULL;
    const float *s = xq ? xq->s : NULL;
    if (xq) {
        const karg act[] = {KARG(q), KARG(zero), KARG(s), KARG(zero)};
        for (int e = 0; e < N_ARGS(act); e++)
            args[na++] = act[e];
    } else {
        const karg act[] = {KARG(x), KARG(zero), KARG(x4)};
        for (int e = 0; e < N_ARGS(act); e++)
            args[na++] = act[e];
    }
    const karg rest[] = {KARG(tokens), KARG(in)};
    for (int e = 0; e < N_ARGS(rest); e++)
        args[na++] = rest[e];
    return launch(k, stream, name + 3, kernel, (unsigned int)groups, 1, p.value[PV_KPARAM_WG], args, na);
}

/* groups {ceil(n_blocks / PV_WG)}: a thread a block of 32 of x */
pv_status pv_cuda_launch_qmatmul_round16(pv_cuda_kernels *k, cudaStream_t stream, pv_wtype t, const float *x,
                                         int64_t n_tokens, int64_t n_in, const pv_cuda_xq16 *xq)
{
    const pv_kernel_params p = weight_params(k, t);
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, "pv_qmatmul_round16", &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    long long zero = 0, n_blocks = n_tokens * n_in / 32;
    void *q = xq->q;
    float *s = xq->s;
    karg args[] = {KARG(x), KARG(zero), KARG(n_blocks), KARG(q), KARG(zero), KARG(s), KARG(zero)};
    return launch(k, stream, "qmatmul_round16", kernel, groups_of(n_blocks, wg), 1, wg, args, N_ARGS(args));
}

/* groups {ceil(n_in / PV_WG), n_rows}, n_rows <= 65535 (the caller's tiles) */
pv_status pv_cuda_launch_qmatmul_widen(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                       const void *w, int64_t row0, int64_t n_rows, int gemm_mode, void *tile)
{
    const pv_kernel_params p = weight_params(k, a->w_type);
    const int narrow = gemm_mode == PV_GEMM_F16 || gemm_mode == PV_GEMM_BF16;
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, narrow ? "pv_qmatmul_widen16" : "pv_qmatmul_widen", &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    long long w_off = 0, first_row = row0;
    int n_in = (int)a->n_in, bf16 = gemm_mode == PV_GEMM_BF16;
    karg args_f32[] = {KARG(w), KARG(w_off), KARG(n_in), KARG(first_row), KARG(tile)};
    karg args_16[] = {KARG(w), KARG(w_off), KARG(n_in), KARG(first_row), KARG(bf16), KARG(tile)};
    return launch(k, stream, "qmatmul_widen", kernel, groups_of(a->n_in, wg), (unsigned int)n_rows, wg,
                  narrow ? args_16 : args_f32, narrow ? N_ARGS(args_16) : N_ARGS(args_f32));
}

/* groups {ceil(n / PV_WG)}, n / PV_WG below gridDim.x (the caller's T * n_in, each < 2^31) */
pv_status pv_cuda_launch_qmatmul_narrow16(pv_cuda_kernels *k, cudaStream_t stream, const pv_qmatmul_args *a,
                                          const float *x, int bf16, void *out)
{
    const pv_kernel_params p = weight_params(k, a->w_type);
    cudaKernel_t kernel;
    PV_TRY(kernel_get(k, &p, "pv_qmatmul_narrow16", &kernel));
    const int wg = p.value[PV_KPARAM_WG];
    long long x_off = 0, n = a->n_tokens * a->n_in;
    karg args[] = {KARG(x), KARG(x_off), KARG(n), KARG(bf16), KARG(out)};
    return launch(k, stream, "qmatmul_narrow16", kernel, groups_of(n, wg), 1, wg, args, N_ARGS(args));
}

/* ---- recompute family ---------------------------------------------------------------- */

static pv_status recompute_kernel(pv_cuda_kernels *k, const char *name, cudaKernel_t *kernel, int *wg,
                                  int *item_elems)
{
    const pv_kernel_params tuned = family_params(k, PV_KERNEL_RECOMPUTE), *p = &tuned;
    *wg = p->value[PV_KPARAM_WG];
    if (item_elems)
        *item_elems = p->value[PV_KPARAM_ITEM_ELEMS];
    return kernel_get(k, p, name, kernel);
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_rmsnorm(pv_cuda_kernels *k, cudaStream_t stream, const pv_rmsnorm_args *a,
                                 const float *x, const float *weight, float *out)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_rmsnorm", &kernel, &wg, NULL));
    long long weight_off = 0, dim = a->dim;
    float eps = a->eps;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        long long off = r0 * a->dim;
        karg args[] = {KARG(x), KARG(off), KARG(weight), KARG(weight_off), KARG(out), KARG(off), KARG(dim), KARG(eps)};
        PV_TRY(
            launch(k, stream, "rmsnorm", kernel, (unsigned int)rows_in_grid_x(a->rows, r0), 1, wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_add_rmsnorm(pv_cuda_kernels *k, cudaStream_t stream, const pv_add_rmsnorm_args *a, float *x,
                                     const float *y, const float *weight, float *out, const pv_cuda_xq16 *xq)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, xq ? "pv_add_rmsnorm16" : "pv_add_rmsnorm", &kernel, &wg, NULL));
    long long weight_off = 0, dim = a->dim;
    float eps = a->eps;
    void *q = xq ? xq->q : NULL;
    float *s = xq ? xq->s : NULL;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        /* xq's words and xs's floats of the rows before r0: 16 and 2 a block */
        long long off = r0 * a->dim, q_off = off / 2, s_off = off / 16;
        karg args[] = {KARG(x),   KARG(off), KARG(y),   KARG(off),   KARG(weight), KARG(weight_off), KARG(out),
                       KARG(off), KARG(dim), KARG(eps), KARG(q),     KARG(q_off),  KARG(s),          KARG(s_off)};
        PV_TRY(launch(k, stream, xq ? "add_rmsnorm16" : "add_rmsnorm", kernel, (unsigned int)rows_in_grid_x(a->rows, r0),
                      1, wg, args, xq ? N_ARGS(args) : N_ARGS(args) - 4));
    }
    return PV_OK;
}

/* groups {n_heads, T} */
pv_status pv_cuda_launch_rope(pv_cuda_kernels *k, cudaStream_t stream, const pv_rope_args *a, float *x,
                              const int32_t *pos)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_rope", &kernel, &wg, NULL));
    int n_heads = a->n_heads, head_dim = a->head_dim, neox = a->neox ? 1 : 0;
    float base = a->base;
    const long long token_elems = (long long)a->n_heads * a->head_dim;
    for (long long i0 = 0; i0 < a->n_tokens; i0 += MAX_GRID_ROWS) {
        long long off = i0 * token_elems;
        const int32_t *first = pos + i0;
        karg args[] = {KARG(x), KARG(off), KARG(first), KARG(n_heads), KARG(head_dim), KARG(base), KARG(neox)};
        PV_TRY(launch(k, stream, "rope", kernel, (unsigned int)a->n_heads,
                      (unsigned int)rows_in_launch(a->n_tokens, i0), wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* Element-wise, (x, x_off, y, y_off, out, out_off, n):
 * groups {ceil(n / (PV_WG * PV_ITEM_ELEMS)), 1}. */
static pv_status elementwise(pv_cuda_kernels *k, cudaStream_t stream, const char *name, const float *x,
                             const float *y, float *out, int64_t total)
{
    cudaKernel_t kernel;
    int wg, item_elems;
    PV_TRY(recompute_kernel(k, name, &kernel, &wg, &item_elems));
    const long long per_group = (long long)wg * item_elems, per_launch = MAX_GRID_X * per_group;
    long long zero = 0;
    for (long long e0 = 0; e0 < total; e0 += per_launch) {
        long long n = total - e0 < per_launch ? total - e0 : per_launch;
        const float *xe = x + e0, *ye = y + e0;
        float *oute = out + e0;
        karg args[] = {KARG(xe), KARG(zero), KARG(ye), KARG(zero), KARG(oute), KARG(zero), KARG(n)};
        PV_TRY(launch(k, stream, name + 3, kernel, groups_of(n, per_group), 1, wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

pv_status pv_cuda_launch_swiglu(pv_cuda_kernels *k, cudaStream_t stream, const pv_swiglu_args *a,
                                const float *gate, const float *up, float *out)
{
    return elementwise(k, stream, "pv_swiglu", gate, up, out, a->n);
}

pv_status pv_cuda_launch_add(pv_cuda_kernels *k, cudaStream_t stream, const pv_add_args *a, const float *x,
                             const float *y, float *out)
{
    return elementwise(k, stream, "pv_add", x, y, out, a->n);
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_softmax(pv_cuda_kernels *k, cudaStream_t stream, const pv_softmax_args *a,
                                 const float *x, float *out)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_softmax", &kernel, &wg, NULL));
    long long cols = a->cols;
    float scale = a->scale;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        long long off = r0 * a->cols;
        karg args[] = {KARG(x), KARG(off), KARG(out), KARG(off), KARG(cols), KARG(scale)};
        PV_TRY(
            launch(k, stream, "softmax", kernel, (unsigned int)rows_in_grid_x(a->rows, r0), 1, wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_argmax(pv_cuda_kernels *k, cudaStream_t stream, const pv_argmax_args *a,
                                const float *x, int32_t *out)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_argmax", &kernel, &wg, NULL));
    long long cols = a->cols;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        long long off = r0 * a->cols;
        int32_t *rows_out = out + r0;
        karg args[] = {KARG(x), KARG(off), KARG(cols), KARG(rows_out)};
        PV_TRY(
            launch(k, stream, "argmax", kernel, (unsigned int)rows_in_grid_x(a->rows, r0), 1, wg, args, N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_sample_top_p(pv_cuda_kernels *k, cudaStream_t stream, const pv_sample_args *a,
                                      const float *logits, const float *u, int32_t *out)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_sample_top_p", &kernel, &wg, NULL));
    long long cols = a->cols;
    float temperature = a->temperature, top_p = a->top_p;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        long long off = r0 * a->cols;
        const float *rows_u = u + r0;
        int32_t *rows_out = out + r0;
        karg args[] = {KARG(logits), KARG(off),    KARG(cols),    KARG(temperature),
                       KARG(top_p),  KARG(rows_u), KARG(rows_out)};
        PV_TRY(launch(k, stream, "sample_top_p", kernel, (unsigned int)rows_in_grid_x(a->rows, r0), 1, wg, args,
                      N_ARGS(args)));
    }
    return PV_OK;
}

/* groups {rows, 1} */
pv_status pv_cuda_launch_sample_batch(pv_cuda_kernels *k, cudaStream_t stream, const pv_sample_batch_args *a,
                                      const float *logits, const float *temperature, const float *top_p,
                                      const float *u, const pv_cuda_logit_bias *bias, int32_t *out)
{
    cudaKernel_t kernel;
    int wg;
    PV_TRY(recompute_kernel(k, "pv_sample_batch", &kernel, &wg, NULL));
    long long cols = a->cols, out_off = 0;
    int biased_rows = bias->start != NULL;
    const int32_t *bias_token = bias->token;
    const float *bias_value = bias->value;
    float *biased = bias->biased;
    for (long long r0 = 0; r0 < a->rows; r0 += MAX_GRID_X) {
        long long off = r0 * a->cols;
        const float *rows_t = temperature + r0, *rows_p = top_p + r0, *rows_u = u + r0;
        /* Entries stay numbered from the lists' start; each launch packs
         * its own biased rows from the scratch's start, after the last. */
        const int32_t *rows_start = bias->start ? bias->start + r0 : NULL;
        int32_t *rows_out = out + r0;
        karg args[] = {KARG(logits), KARG(off),         KARG(cols),       KARG(rows_t),     KARG(rows_p),
                       KARG(rows_u), KARG(biased_rows), KARG(rows_start), KARG(bias_token), KARG(bias_value),
                       KARG(biased), KARG(rows_out),    KARG(out_off)};
        PV_TRY(launch(k, stream, "sample_batch", kernel, (unsigned int)rows_in_grid_x(a->rows, r0), 1, wg, args,
                      N_ARGS(args)));
    }
    return PV_OK;
}
