/* The CUDA launchers' arguments against the kernels' parameters as NVRTC
 * compiled them, with no GPU: backends/cuda/cuda_launch.c is linked with a
 * stand-in for the eight runtime calls it makes, which reads each kernel's
 * parameter records from the cubin's .nv.info.<kernel> section, so the
 * backend's own first-launch check (check_arguments) compares every
 * launcher's argument count and sizes with the compiler's.
 * cudaLaunchKernel takes the arguments as bare addresses, so a list that
 * is short, long or of another width runs a kernel on garbage: nothing
 * else here would see it before a GPU does.
 *
 * Checked: the record reader against a probe kernel of known parameter
 * sizes; every kernel of every program the launchers loaded launched at
 * least once, each checked in full at its first launch and not again,
 * each with its program's PV_WG as blockDim.x (the tuned sets are not the
 * defaults, so a launcher that ignores its set shows); the launch
 * geometry within CUDA's limits; ops taller than CUDA's grid (gridDim.y
 * 65535, gridDim.x 2^31 - 1: the OpenCL launchers have no such limit, so
 * PoCL never runs this code) split over launches, each starting in every
 * array where the last stopped; and the check itself, through records the
 * stand-in alters: a wider parameter, one more, one fewer, a runtime that
 * cannot answer. */
#include "config.h"

#include "backends/cuda/cuda_kernels.h"
#include "pensieve/status.h"
#include "tap.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the cubin's parameter records ----------------------------------------------- */

#define MAX_PARAMS 32
#define EIATTR_KPARAM_INFO 0x17 /* payload: u32 index, u16 ordinal, u16 offset, u32 (size << 18 | flags) */
#define EIFMT_SVAL 0x04         /* a u16 payload size, then the payload; the other formats carry 2 bytes */

static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const unsigned char *p) { return (uint32_t)get16(p) | (uint32_t)get16(p + 2) << 16; }
static uint64_t get64(const unsigned char *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

/* An ELF64 image's section headers, bounds-checked: their count, and each
 * one's name, file offset and size through section(). */
typedef struct elf_view {
    const unsigned char *data;
    size_t size;
    uint64_t shoff;
    unsigned shnum, shentsize;
    uint64_t strtab, strtab_size;
} elf_view;

static int section(const elf_view *e, unsigned i, const char **name, uint64_t *off, uint64_t *size)
{
    const unsigned char *h = e->data + e->shoff + (uint64_t)i * e->shentsize;
    const uint32_t name_at = get32(h);
    *off = get64(h + 0x18);
    *size = get64(h + 0x20);
    if (name_at >= e->strtab_size || *off > e->size || *size > e->size - *off ||
        !memchr(e->data + e->strtab + name_at, '\0', e->strtab_size - name_at))
        return 0;
    *name = (const char *)e->data + e->strtab + name_at;
    return 1;
}

static int elf_open(const void *image, elf_view *e)
{
    const unsigned char *d = image;
    memset(e, 0, sizeof *e);
    if (memcmp(d, "\177ELF\2\1", 6) != 0) /* 64-bit, little-endian */
        return 0;
    e->data = d;
    e->shoff = get64(d + 0x28);
    e->shentsize = get16(d + 0x3a);
    e->shnum = get16(d + 0x3c);
    const unsigned shstrndx = get16(d + 0x3e);
    /* the image ends with the section headers or the last section */
    e->size = e->shoff + (uint64_t)e->shnum * e->shentsize;
    if (e->shentsize < 0x40 || shstrndx >= e->shnum)
        return 0;
    for (unsigned i = 0; i < e->shnum; i++) {
        const unsigned char *h = d + e->shoff + (uint64_t)i * e->shentsize;
        if (get32(h + 4) != 8 /* SHT_NOBITS */ && get64(h + 0x18) + get64(h + 0x20) > e->size)
            e->size = get64(h + 0x18) + get64(h + 0x20);
    }
    const unsigned char *strh = d + e->shoff + (uint64_t)shstrndx * e->shentsize;
    e->strtab = get64(strh + 0x18);
    e->strtab_size = get64(strh + 0x20);
    return e->strtab <= e->size && e->strtab_size <= e->size - e->strtab;
}

/* The parameter sizes of `kernel` in image, by ordinal: their count, or -1
 * when the image has no records for it or they are not 0..n-1 once each. */
static int kernel_params(const elf_view *e, const char *kernel, size_t size[MAX_PARAMS])
{
    char want[96];
    snprintf(want, sizeof want, ".nv.info.%s", kernel);
    for (unsigned i = 0; i < e->shnum; i++) {
        const char *name;
        uint64_t off, len;
        if (!section(e, i, &name, &off, &len) || strcmp(name, want) != 0)
            continue;
        int n = 0, seen[MAX_PARAMS] = {0};
        for (uint64_t p = off; p + 4 <= off + len;) {
            const unsigned format = e->data[p], attribute = e->data[p + 1];
            const uint64_t payload = format == EIFMT_SVAL ? get16(e->data + p + 2) : 0;
            if (p + 4 + payload > off + len)
                return -1;
            if (format == EIFMT_SVAL && attribute == EIATTR_KPARAM_INFO && payload >= 12) {
                const unsigned ordinal = get16(e->data + p + 8);
                if (ordinal >= MAX_PARAMS || seen[ordinal]++)
                    return -1;
                size[ordinal] = get32(e->data + p + 12) >> 18 & 0x3fff;
                n = ordinal + 1 > (unsigned)n ? (int)ordinal + 1 : n;
            }
            p += 4 + payload;
        }
        for (int o = 0; o < n; o++)
            if (!seen[o])
                return -1;
        return n;
    }
    return -1;
}

/* ---- the runtime's stand-in ------------------------------------------------------ */

typedef struct mock_kernel {
    char name[64];
    int n_params;
    size_t size[MAX_PARAMS];
    int queries;         /* cudaFuncGetParamInfo calls */
    int checked;         /* the query past the last parameter came */
    int launches;
    const void *library; /* its program's */
    unsigned block;      /* blockDim.x of its first launch */
    int block_varies;    /* a later launch had another */
} mock_kernel;

typedef struct mock_library {
    elf_view elf;
} mock_library;

#define MAX_MOCK_KERNELS 256
static mock_kernel mock_kernels[MAX_MOCK_KERNELS];
static int n_mock_kernels;
static cudaError_t last_error = cudaSuccess;
static char geometry_fault[160];

/* The launches since the log was last emptied: kernel, grid, and each
 * argument's value (as many bytes as its parameter has). */
#define LOG_LAUNCHES 8
typedef struct logged_launch {
    const mock_kernel *kernel;
    unsigned grid_x, grid_y;
    int64_t arg[MAX_PARAMS];
} logged_launch;
static logged_launch launch_log[LOG_LAUNCHES];
static int n_logged;

/* What the stand-in alters in the records of the kernel named. */
static struct {
    const char *kernel;
    enum { FAULT_NONE, FAULT_WIDER, FAULT_EXTRA, FAULT_FEWER, FAULT_UNANSWERED } kind;
} fault;

static mock_kernel *mock_of(const void *func)
{
    const mock_kernel *m = func;
    return m >= mock_kernels && m < mock_kernels + n_mock_kernels ? (mock_kernel *)m : NULL;
}

static cudaError_t fail(cudaError_t err)
{
    last_error = err;
    return err;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code, enum cudaJitOption *jitOptions,
                                void **jitOptionsValues, unsigned int numJitOptions,
                                enum cudaLibraryOption *libraryOptions, void **libraryOptionValues,
                                unsigned int numLibraryOptions)
{
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    mock_library *lib = calloc(1, sizeof *lib);
    if (!lib)
        return fail(cudaErrorMemoryAllocation);
    if (!elf_open(code, &lib->elf)) {
        free(lib);
        return fail(cudaErrorInvalidKernelImage);
    }
    *library = (cudaLibrary_t)lib;
    return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
    free(library);
    return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name)
{
    const mock_library *lib = (const mock_library *)library;
    if (n_mock_kernels == MAX_MOCK_KERNELS || strlen(name) >= sizeof mock_kernels->name)
        return fail(cudaErrorMemoryAllocation);
    mock_kernel *m = &mock_kernels[n_mock_kernels];
    memset(m, 0, sizeof *m);
    m->n_params = kernel_params(&lib->elf, name, m->size);
    if (m->n_params < 0)
        return fail(cudaErrorSymbolNotFound);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->library = library;
    n_mock_kernels++;
    *kernel = (cudaKernel_t)m;
    return cudaSuccess;
}

cudaError_t cudaFuncGetParamInfo(const void *func, size_t index, size_t *offset, size_t *size)
{
    mock_kernel *m = mock_of(func);
    if (!m)
        return fail(cudaErrorInvalidDeviceFunction);
    m->queries++;
    const int altered = fault.kernel && strcmp(fault.kernel, m->name) == 0;
    if (altered && fault.kind == FAULT_UNANSWERED)
        return fail(cudaErrorNotSupported);
    const int n = m->n_params + (altered && fault.kind == FAULT_EXTRA) - (altered && fault.kind == FAULT_FEWER);
    if (index >= (size_t)n) {
        m->checked |= index == (size_t)n;
        return fail(cudaErrorInvalidValue);
    }
    *offset = 0; /* unused by the check */
    *size = index < (size_t)m->n_params ? m->size[index] : 8;
    *size += altered && fault.kind == FAULT_WIDER && index == 2 ? 4 : 0;
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t stream)
{
    (void)stream;
    mock_kernel *m = mock_of(func);
    if (!m)
        return fail(cudaErrorInvalidDeviceFunction);
    int null_arg = -1;
    for (int i = 0; i < m->n_params && null_arg < 0; i++)
        null_arg = args[i] ? -1 : i;
    if (!geometry_fault[0] &&
        (grid.x < 1 || grid.y < 1 || grid.y > 65535 || grid.z != 1 || block.x < 1 || block.x > 1024 ||
         block.y != 1 || block.z != 1 || shared != 0 || null_arg >= 0))
        snprintf(geometry_fault, sizeof geometry_fault, "%s: grid %u x %u x %u, block %u x %u x %u, shared %zu, "
                 "argument %d's address NULL", m->name, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared,
                 null_arg);
    m->block_varies |= m->launches && m->block != block.x;
    m->block = m->launches++ ? m->block : block.x;
    if (n_logged < LOG_LAUNCHES) {
        logged_launch *l = &launch_log[n_logged++];
        *l = (logged_launch){.kernel = m, .grid_x = grid.x, .grid_y = grid.y};
        for (int i = 0; i < m->n_params && args[i]; i++) {
            if (m->size[i] == 8)
                memcpy(&l->arg[i], args[i], 8);
            else if (m->size[i] == 4) {
                int32_t v;
                memcpy(&v, args[i], 4);
                l->arg[i] = v;
            }
        }
    }
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    const cudaError_t err = last_error;
    last_error = cudaSuccess;
    return err;
}

const char *cudaGetErrorString(cudaError_t error)
{
    return error == cudaSuccess ? "no error" : "an error of the stand-in";
}

const char *cudaGetErrorName(cudaError_t error)
{
    return error == cudaSuccess ? "cudaSuccess" : "cudaError";
}

/* ---- the launches ----------------------------------------------------------------- */

/* Device memory the launchers only pass on: addresses, never read. */
static float device[1 << 12];
static int32_t host_index[64];

static void *dev(size_t at) { return (char *)device + 64 * at; }

static pv_status attention(pv_cuda_kernels *k, pv_kernel_tuning *t, pv_dtype dtype, int head_dim, int wg,
                           int with_xq)
{
    t->defaults[PV_KERNEL_ATTENTION].value[PV_KPARAM_WG] = wg;
    const pv_attention_args a = {.kv_dtype = dtype, .n_tokens = 3, .n_heads = 8, .n_kv_heads = 2,
                                 .head_dim = head_dim, .chunk_tokens = 16, .scale = 0.125f,
                                 .token_seq = host_index, .token_pos = host_index, .n_seqs = 1, .max_chunks = 4};
    const pv_cuda_xq16 xq = {dev(1), dev(2)};
    return pv_cuda_launch_attention(k, NULL, &a, dev(3), dev(4), dev(5), dev(6), dev(7), 4, 2, dev(8), dev(9),
                                    with_xq ? &xq : NULL);
}

static pv_status gather_family(pv_cuda_kernels *k, pv_dtype dtype)
{
    const pv_kv_write_args kv = {.kv_dtype = dtype, .n_tokens = 3, .n_kv_heads = 2, .head_dim = 64,
                                 .chunk_tokens = 16, .max_chunks = 4};
    const pv_rope_kv_write_args rope = {.kv_dtype = dtype, .n_tokens = 3, .n_heads = 8, .n_kv_heads = 2,
                                        .head_dim = 64, .chunk_tokens = 16, .max_chunks = 4, .base = 1e4f};
    const pv_slot_copy_args copy = {.dtype = dtype, .slot_elems = 4096, .n_slots_moved = 5};
    const pv_slot_transfer_args transfer = {.dtype = dtype, .slot_elems = 4096, .n = 5};
    pv_status st = pv_cuda_launch_kv_write(k, NULL, &kv, dev(1), dev(2), dev(3), dev(4), dev(5), dev(6));
    if (st == PV_OK)
        st = pv_cuda_launch_rope_kv_write(k, NULL, &rope, dev(1), dev(2), dev(3), dev(4), dev(5), dev(6), dev(7));
    for (int scatter = 0; scatter < 2 && st == PV_OK; scatter++)
        st = pv_cuda_launch_slot_copy(k, NULL, &copy, scatter, dev(1), dev(2), dev(3));
    return st == PV_OK ? pv_cuda_launch_slot_transfer(k, NULL, &transfer, dev(1), dev(2), dev(3), dev(4)) : st;
}

static pv_status qmatmul_family(pv_cuda_kernels *k)
{
    const pv_cuda_xq16 xq = {dev(1), dev(2)};
    const pv_embed_gather_args embed = {.table_type = PV_W_Q4_0, .n_rows = 100, .dim = 64, .n_ids = 3,
                                        .ids = host_index};
    pv_status st = pv_cuda_launch_embed_gather(k, NULL, &embed, dev(3), dev(4), dev(5), dev(6));
    if (st == PV_OK)
        st = pv_cuda_launch_qmatmul_round16(k, NULL, PV_W_Q4_0, dev(3), 2, 64, &xq);
    const int32_t classes[3] = {1, 3, 9}; /* pv_qmv_token_class: 1, 4 and 16 */
    for (int c = 0; c < 3 && st == PV_OK; c++)
        for (int with_xq = 0; with_xq < 2 && st == PV_OK; with_xq++) {
            const pv_cuda_xq16 *x16 = with_xq ? &xq : NULL;
            pv_qmatmul_args products[3];
            for (int i = 0; i < 3; i++)
                products[i] = (pv_qmatmul_args){.w_type = PV_W_Q4_0, .n_tokens = classes[c], .n_in = 64,
                                                .n_out = 96 + 32 * i};
            const pv_qmatmul_swiglu_args swiglu = {.w_type = PV_W_Q4_0, .n_tokens = classes[c], .n_in = 64,
                                                   .n_out = 128};
            const void *w[3] = {dev(4), dev(5), dev(6)};
            float *y[3] = {dev(7), dev(8), dev(9)};
            st = pv_cuda_launch_qmatmul_fused(k, NULL, &products[0], dev(4), dev(3), x16, dev(7));
            if (st == PV_OK)
                st = pv_cuda_launch_qmatmul_swiglu_fused(k, NULL, &swiglu, dev(4), dev(5), dev(3), x16, dev(7));
            if (st == PV_OK)
                st = pv_cuda_launch_qmatmul_group(k, NULL, products, 2 + with_xq, w, y, dev(3), x16);
        }
    const pv_qmatmul_args big = {.w_type = PV_W_Q4_0, .n_tokens = 40, .n_in = 64, .n_out = 256};
    for (int mode = 0; mode < PV_GEMM_MODES && st == PV_OK; mode++)
        st = pv_cuda_launch_qmatmul_widen(k, NULL, &big, dev(4), 32, 128, mode, dev(10));
    for (int bf16 = 0; bf16 < 2 && st == PV_OK; bf16++)
        st = pv_cuda_launch_qmatmul_narrow16(k, NULL, &big, dev(3), bf16, dev(11));
    return st;
}

static pv_status recompute_family(pv_cuda_kernels *k)
{
    const pv_cuda_xq16 xq = {dev(1), dev(2)};
    const pv_rmsnorm_args norm = {.rows = 3, .dim = 64, .eps = 1e-5f};
    const pv_add_rmsnorm_args add_norm = {.rows = 3, .dim = 64, .eps = 1e-5f};
    const pv_rope_args rope = {.n_tokens = 3, .n_heads = 8, .head_dim = 64, .base = 1e4f, .neox = 1};
    const pv_swiglu_args swiglu = {.n = 1000};
    const pv_add_args add = {.n = 1000};
    const pv_softmax_args softmax = {.rows = 3, .cols = 100, .scale = 1};
    const pv_argmax_args argmax = {.rows = 3, .cols = 100};
    const pv_sample_args sample = {.rows = 3, .cols = 100, .temperature = 0.7f, .top_p = 0.9f};
    const pv_sample_batch_args batch = {.rows = 3, .cols = 100};
    const pv_cuda_logit_bias bias = {dev(1), dev(2), dev(3), dev(4)};
    pv_status st = pv_cuda_launch_rmsnorm(k, NULL, &norm, dev(5), dev(6), dev(7));
    for (int with_xq = 0; with_xq < 2 && st == PV_OK; with_xq++)
        st = pv_cuda_launch_add_rmsnorm(k, NULL, &add_norm, dev(5), dev(6), dev(7), dev(8), with_xq ? &xq : NULL);
    if (st == PV_OK)
        st = pv_cuda_launch_rope(k, NULL, &rope, dev(5), dev(6));
    if (st == PV_OK)
        st = pv_cuda_launch_swiglu(k, NULL, &swiglu, dev(5), dev(6), dev(7));
    if (st == PV_OK)
        st = pv_cuda_launch_add(k, NULL, &add, dev(5), dev(6), dev(7));
    if (st == PV_OK)
        st = pv_cuda_launch_softmax(k, NULL, &softmax, dev(5), dev(6));
    if (st == PV_OK)
        st = pv_cuda_launch_argmax(k, NULL, &argmax, dev(5), dev(6));
    if (st == PV_OK)
        st = pv_cuda_launch_sample_top_p(k, NULL, &sample, dev(5), dev(6), dev(7));
    return st == PV_OK ? pv_cuda_launch_sample_batch(k, NULL, &batch, dev(5), dev(6), dev(7), dev(8), &bias, dev(9))
                       : st;
}

/* ---- launches taller than CUDA's grid ------------------------------------------- */

/* Where a launch's first row starts in one of its arrays: a pointer
 * argument and, with off >= 0, an offset argument of `unit` bytes into
 * it; row r of the whole op is `per_row` bytes on. */
typedef struct row_address {
    int ptr, off, unit;
    int64_t per_row;
} row_address;

#define MAX_MOVED 6

/* The op's launches of `kernel` in the log: two, the first with the most
 * rows CUDA's grid takes along its dimension (gridDim.y 65535, x 2^31 -
 * 1), the second the rest, starting where the first stopped in every
 * array; every other argument the same in both. */
static void check_split(pv_status st, const char *kernel, int along_x, int64_t rows, const row_address *moved,
                        int n_moved)
{
    const logged_launch *l[2] = {NULL, NULL};
    int n = 0;
    for (int i = 0; i < n_logged; i++)
        if (strcmp(launch_log[i].kernel->name, kernel) == 0 && n++ < 2)
            l[n - 1] = &launch_log[i];
    const int64_t most = along_x ? 2147483647 : 65535;
    const int64_t first = n == 2 ? (along_x ? l[0]->grid_x : l[0]->grid_y) : 0;
    const int64_t second = n == 2 ? (along_x ? l[1]->grid_x : l[1]->grid_y) : 0;
    int good = st == PV_OK && n == 2 && first == most && first + second == rows, bad_arg = -1;
    for (int i = 0; good && i < l[0]->kernel->n_params; i++) {
        int part_of_address = 0;
        for (int m = 0; m < n_moved; m++)
            part_of_address |= moved[m].ptr == i || moved[m].off == i;
        if (!part_of_address && l[0]->arg[i] != l[1]->arg[i])
            good = 0, bad_arg = i;
    }
    for (int m = 0; good && m < n_moved; m++) {
        int64_t at[2];
        for (int k = 0; k < 2; k++)
            at[k] = l[k]->arg[moved[m].ptr] + (moved[m].off >= 0 ? l[k]->arg[moved[m].off] * moved[m].unit : 0);
        if (at[1] - at[0] != first * moved[m].per_row)
            good = 0, bad_arg = moved[m].ptr;
    }
    char wrong[32] = "";
    if (bad_arg >= 0)
        snprintf(wrong, sizeof wrong, ": argument %d wrong", bad_arg);
    ok(good, "%s: %lld rows along gridDim.%c in %d launches (%lld + %lld), the second from the first's end%s",
       kernel, (long long)rows, along_x ? 'x' : 'y', n, (long long)first, (long long)second, wrong);
    if (st != PV_OK)
        tap_diag("%s", pv_last_error());
}

/* Device addresses far from the null page and from wrapping, for ops of
 * billions of rows that the launchers only offset. */
static void *far(int64_t at) { return (void *)(uintptr_t)((UINT64_C(1) << 40) + (uint64_t)at * (UINT64_C(1) << 32)); }

/* Each launcher that splits its rows over launches, one row past a
 * launch's most and a few more. */
static void test_splits(pv_cuda_kernels *k, pv_kernel_tuning *t)
{
    const int32_t T = 65535 + 5;
    const int64_t X = INT64_C(2147483647) + 3;
    int32_t *pos = calloc((size_t)T, sizeof *pos); /* attention's bucket reads the positions */
    if (!pos) {
        ok(0, "memory for %d positions", T);
        return;
    }
    t->defaults[PV_KERNEL_ATTENTION].value[PV_KPARAM_WG] = 64;
    /* attention: 8 heads of 128 (a token 4 KiB of q and out), 2 splits;
     * part is [T][splits][heads][128] floats, then [T][splits][heads][2] */
    const pv_attention_args att = {.kv_dtype = PV_F32, .n_tokens = T, .n_heads = 8, .n_kv_heads = 2,
                                   .head_dim = 128, .chunk_tokens = 16, .scale = 0.1f, .token_seq = pos,
                                   .token_pos = pos, .n_seqs = 1, .max_chunks = 4};
    const pv_cuda_xq16 xq = {far(1), far(2)};
    n_logged = 0;
    pv_status st = pv_cuda_launch_attention(k, NULL, &att, far(3), far(4), far(5), far(6), far(7), 4, 2, far(8),
                                            far(9), &xq);
    const row_address att_moved[] = {{0, 1, 4, 4096}, {3, -1, 0, 4}, {4, -1, 0, 4}, {14, 15, 4, 4096},
                                     {16, 17, 4, 2 * 4096}, {16, 18, 4, 2 * 8 * 2 * 4}};
    check_split(st, "pv_attention_teams_f32", 0, T, att_moved, 6);
    /* combine16: xq's rows of 1024 elements are 512 words and 64 floats */
    const row_address combine_moved[] = {{0, 1, 4, 2 * 4096}, {0, 2, 4, 2 * 8 * 2 * 4}, {6, 7, 4, 4096},
                                         {8, 9, 4, 512 * 4},  {10, 11, 4, 64 * 4}};
    check_split(st, "pv_attention_combine16_f32", 0, T, combine_moved, 5);

    /* K and V rows of 2 heads of 64 floats */
    const pv_kv_write_args kv = {.kv_dtype = PV_F32, .n_tokens = T, .n_kv_heads = 2, .head_dim = 64,
                                 .chunk_tokens = 16, .max_chunks = 4};
    n_logged = 0;
    st = pv_cuda_launch_kv_write(k, NULL, &kv, far(1), far(2), far(3), far(4), far(5), far(6));
    const row_address kv_moved[] = {{0, 1, 4, 512}, {2, 3, 4, 512}, {5, -1, 0, 4}, {6, -1, 0, 4}};
    check_split(st, "pv_kv_write_f32", 0, T, kv_moved, 4);

    const pv_rope_kv_write_args rkv = {.kv_dtype = PV_F16, .n_tokens = T, .n_heads = 8, .n_kv_heads = 2,
                                       .head_dim = 64, .chunk_tokens = 16, .max_chunks = 4, .base = 1e4f};
    n_logged = 0;
    st = pv_cuda_launch_rope_kv_write(k, NULL, &rkv, far(1), far(2), far(3), far(4), far(5), far(6), far(7));
    const row_address rkv_moved[] = {{0, 1, 4, 2048}, {2, 3, 4, 512}, {4, 5, 4, 512}, {7, -1, 0, 4}, {8, -1, 0, 4}};
    check_split(st, "pv_rope_kv_write_f16", 0, T, rkv_moved, 5);

    /* slots of 4096 f16 elements (moved as 16-bit words) */
    const pv_slot_copy_args copy = {.dtype = PV_F16, .slot_elems = 4096, .n_slots_moved = T};
    n_logged = 0;
    st = pv_cuda_launch_slot_copy(k, NULL, &copy, 0, far(1), far(2), far(3));
    const row_address copy_moved[] = {{1, 2, 2, 4096 * 2}, {3, -1, 0, 4}};
    check_split(st, "pv_slot_gather_f16", 0, T, copy_moved, 2);

    const pv_slot_transfer_args transfer = {.dtype = PV_F16, .slot_elems = 4096, .n = T};
    n_logged = 0;
    st = pv_cuda_launch_slot_transfer(k, NULL, &transfer, far(1), far(2), far(3), far(4));
    const row_address transfer_moved[] = {{2, -1, 0, 4}, {3, -1, 0, 4}};
    check_split(st, "pv_slot_transfer", 0, T, transfer_moved, 2);

    const pv_embed_gather_args embed = {.table_type = PV_W_Q4_0, .n_rows = 100, .dim = 64, .n_ids = T};
    n_logged = 0;
    st = pv_cuda_launch_embed_gather(k, NULL, &embed, far(1), far(2), far(3), far(4));
    const row_address embed_moved[] = {{3, -1, 0, 4}, {7, 8, 4, 64 * 4}};
    check_split(st, "pv_embed_gather", 0, T, embed_moved, 2);

    const pv_rope_args rope = {.n_tokens = T, .n_heads = 8, .head_dim = 64, .base = 1e4f};
    n_logged = 0;
    st = pv_cuda_launch_rope(k, NULL, &rope, far(1), far(2));
    const row_address rope_moved[] = {{0, 1, 4, 2048}, {2, -1, 0, 4}};
    check_split(st, "pv_rope", 0, T, rope_moved, 2);

    /* rows along gridDim.x: one work-group a row of 64 (or 100) */
    const pv_rmsnorm_args norm = {.rows = X, .dim = 64, .eps = 1e-5f};
    n_logged = 0;
    st = pv_cuda_launch_rmsnorm(k, NULL, &norm, far(1), far(2), far(3));
    const row_address norm_moved[] = {{0, 1, 4, 256}, {4, 5, 4, 256}};
    check_split(st, "pv_rmsnorm", 1, X, norm_moved, 2);

    const pv_argmax_args argmax = {.rows = X, .cols = 100};
    n_logged = 0;
    st = pv_cuda_launch_argmax(k, NULL, &argmax, far(1), far(2));
    const row_address argmax_moved[] = {{0, 1, 4, 400}, {3, -1, 0, 4}};
    check_split(st, "pv_argmax", 1, X, argmax_moved, 2);

    const pv_sample_batch_args batch = {.rows = X, .cols = 100};
    const pv_cuda_logit_bias bias = {far(1), far(2), far(3), far(4)};
    n_logged = 0;
    st = pv_cuda_launch_sample_batch(k, NULL, &batch, far(5), far(6), far(7), far(8), &bias, far(9));
    const row_address batch_moved[] = {{0, 1, 4, 400}, {3, -1, 0, 4}, {4, -1, 0, 4},
                                       {5, -1, 0, 4},   {7, -1, 0, 4}, {11, -1, 0, 4}};
    check_split(st, "pv_sample_batch", 1, X, batch_moved, 6);
    free(pos);
}

/* ---- the checks ------------------------------------------------------------------- */

static void test_records(void)
{
    /* sizes 8 4 8 4 12 1 8, and a kernel without parameters */
    static const char probe[] = "struct three { int a, b, c; };\n"
                                "extern \"C\" __global__ void probe(float *p, int n, long long m, float f, "
                                "three t, char c, double d) { if (n < 0) *p = f + m + t.c + c + d; }\n"
                                "extern \"C\" __global__ void none() {}\n";
    const pv_cuda_target target = {.arch = 90, .ptx = 0};
    pv_cuda_image image;
    pv_status st = pv_cuda_compile("probe", probe, "--gpu-architecture=sm_90", target, &image);
    if (st != PV_OK) {
        ok(0, "NVRTC compiles the probe: %s", pv_last_error());
        return;
    }
    elf_view e;
    size_t size[MAX_PARAMS];
    const size_t want[] = {8, 4, 8, 4, 12, 1, 8};
    int n = elf_open(image.data, &e) && e.size <= image.size ? kernel_params(&e, "probe", size) : -2;
    int same = n == 7;
    for (int i = 0; same && i < n; i++)
        same = size[i] == want[i];
    ok(same, "the probe's records read 7 parameters of 8 4 8 4 12 1 8 bytes (read %d, the ELF's extent %zu of %zu)",
       n, e.size, image.size);
    ok(kernel_params(&e, "none", size) == 0 && kernel_params(&e, "absent", size) == -1,
       "a kernel without parameters has none; a kernel not in the image has no records");
    pv_cuda_image_free(&image);
}

static int kernels_init(pv_cuda_kernels *k, pv_kernel_tuning *t, uint64_t *launches)
{
    pv_kernel_tuning_reset(t);
    t->max_gemm = PV_GEMM_TF32;
    pv_status st = pv_cuda_kernels_init(k, 9, 0, t, launches);
    return st == PV_OK || ok(0, "the launchers' state for sm_90: %s", pv_last_error());
}

/* Every launcher, every kernel of the programs they load. */
static void test_launchers(void)
{
    pv_kernel_tuning t;
    pv_cuda_kernels k;
    uint64_t launches = 0;
    if (!kernels_init(&k, &t, &launches))
        return;
    /* sets other than the defaults, so that a launcher that ignores its
     * call's set is seen (attention's PV_WG is set per call below) */
    t.defaults[PV_KERNEL_GATHER].value[PV_KPARAM_WG] = 128;
    t.defaults[PV_KERNEL_GATHER].value[PV_KPARAM_ITEM_ELEMS] = 4;
    t.defaults[PV_KERNEL_QMATMUL].value[PV_KPARAM_WG] = 256;
    t.defaults[PV_KERNEL_QMATMUL].value[PV_KPARAM_QMV_ROWS] = 4;
    t.defaults[PV_KERNEL_QMATMUL].value[PV_KPARAM_QMV_LANES] = 8;
    t.defaults[PV_KERNEL_RECOMPUTE].value[PV_KPARAM_WG] = 32;
    /* teams at head dim 128 (PV_WG 64 >= 128 / 8), the other at 256 with PV_WG 16 */
    pv_status st = PV_OK;
    for (int f16 = 0; f16 < 2 && st == PV_OK; f16++)
        for (int with_xq = 0; with_xq < 2 && st == PV_OK; with_xq++) {
            st = attention(&k, &t, f16 ? PV_F16 : PV_F32, 128, 64, with_xq);
            if (st == PV_OK)
                st = attention(&k, &t, f16 ? PV_F16 : PV_F32, 256, 16, with_xq);
        }
    for (int f16 = 0; f16 < 2 && st == PV_OK; f16++)
        st = gather_family(&k, f16 ? PV_F16 : PV_F32);
    if (st == PV_OK)
        st = qmatmul_family(&k);
    if (st == PV_OK)
        st = recompute_family(&k);
    ok(st == PV_OK, "every launcher launches%s%s", st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());

    /* every kernel of every program loaded, by name (the programs of other
     * parameter sets hold the same kernels under the same names) */
    int programs = 0, kernels = 0, missing = 0;
    char first_missing[96] = "";
    for (int p = 0; p < k.n_programs; p++) {
        elf_view e;
        if (!elf_open(k.programs[p].image.data, &e))
            continue;
        programs++;
        for (unsigned i = 0; i < e.shnum; i++) {
            const char *name;
            uint64_t off, len;
            if (!section(&e, i, &name, &off, &len) || strncmp(name, ".nv.info.", 9) != 0)
                continue;
            kernels++;
            int launched = 0;
            for (int m = 0; m < n_mock_kernels && !launched; m++)
                launched = strcmp(mock_kernels[m].name, name + 9) == 0 && mock_kernels[m].launches > 0;
            if (!launched && !missing++)
                snprintf(first_missing, sizeof first_missing, "%s", name + 9);
        }
    }
    ok(programs == k.n_programs && programs >= 8 && missing == 0,
       "every kernel of the %d programs loaded (%d kernels in all) launched%s%s", programs, kernels,
       missing ? ", but not " : "", first_missing);
    int unchecked = 0, rechecked = 0, distinct = n_mock_kernels;
    uint64_t launched = 0;
    for (int m = 0; m < n_mock_kernels; m++) {
        unchecked += !mock_kernels[m].checked;
        rechecked += mock_kernels[m].queries != mock_kernels[m].n_params + 1;
        launched += (uint64_t)mock_kernels[m].launches;
    }
    ok(unchecked == 0 && rechecked == 0 && k.n_unchecked == 0,
       "each of the %d kernels checked in full at its first launch, once (%d unchecked, %d queried again, %d left "
       "on the list)",
       distinct, unchecked, rechecked, k.n_unchecked);
    ok(!geometry_fault[0], "every launch's geometry within CUDA's limits, no argument address NULL%s%s",
       geometry_fault[0] ? ": " : "", geometry_fault);
    /* the kernels' shared arrays are sized by the PV_WG they were built with */
    int off_wg = 0;
    char first_off[160] = "";
    for (int m = 0; m < n_mock_kernels; m++)
        for (int p = 0; p < k.n_programs; p++) {
            const int wg = k.programs[p].params.value[PV_KPARAM_WG];
            if ((const void *)k.programs[p].library == mock_kernels[m].library && mock_kernels[m].launches &&
                (mock_kernels[m].block_varies || mock_kernels[m].block != (unsigned)wg) && !off_wg++)
                snprintf(first_off, sizeof first_off, ": %.63s launched with blockDim.x %u, built with PV_WG %d",
                         mock_kernels[m].name, mock_kernels[m].block, wg);
        }
    ok(off_wg == 0, "every kernel launched with its program's PV_WG as blockDim.x%s", first_off);
    ok(launches == launched, "the backend's launch count %llu, the runtime's %llu", (unsigned long long)launches,
       (unsigned long long)launched);
    test_splits(&k, &t);
    pv_cuda_kernels_free(&k);
}

/* The check itself: the stand-in's records altered for one kernel. */
static void test_mismatches(void)
{
    static const struct {
        const char *kernel;
        int kind;
        const char *message;
    } cases[] = {
        {"pv_rope", FAULT_WIDER, "gives argument 2 as 8 bytes, the parameter has 12"},
        {"pv_softmax", FAULT_EXTRA, "takes more than the 6 arguments"},
        {"pv_add", FAULT_FEWER, "takes 6 arguments, its launcher gives 7"},
    };
    const pv_rope_args rope = {.n_tokens = 3, .n_heads = 8, .head_dim = 64, .base = 1e4f};
    const pv_softmax_args softmax = {.rows = 3, .cols = 100, .scale = 1};
    const pv_add_args add = {.n = 1000};
    const pv_argmax_args argmax = {.rows = 3, .cols = 100};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        pv_kernel_tuning t;
        pv_cuda_kernels k;
        uint64_t launches = 0;
        if (!kernels_init(&k, &t, &launches))
            return;
        fault.kernel = cases[c].kernel;
        fault.kind = cases[c].kind;
        pv_status st[2];
        for (int round = 0; round < 2; round++) /* a mismatch fails every launch, not the first alone */
            st[round] = c == 0   ? pv_cuda_launch_rope(&k, NULL, &rope, dev(1), dev(2))
                        : c == 1 ? pv_cuda_launch_softmax(&k, NULL, &softmax, dev(1), dev(2))
                                 : pv_cuda_launch_add(&k, NULL, &add, dev(1), dev(2), dev(3));
        const char *msg = pv_last_error();
        ok(st[0] == PV_ERR_BACKEND && st[1] == PV_ERR_BACKEND && strstr(msg, cases[c].message) &&
               strstr(msg, cases[c].kernel) && launches == 0 && cudaGetLastError() == cudaSuccess,
           "%s's records altered: refused before launching, every time: %s", cases[c].kernel, msg);
        pv_cuda_kernels_free(&k);
    }
    /* a runtime that cannot answer: launched unchecked, its error cleared */
    pv_kernel_tuning t;
    pv_cuda_kernels k;
    uint64_t launches = 0;
    if (!kernels_init(&k, &t, &launches))
        return;
    fault.kernel = "pv_argmax";
    fault.kind = FAULT_UNANSWERED;
    pv_status st = pv_cuda_launch_argmax(&k, NULL, &argmax, dev(1), dev(2));
    ok(st == PV_OK && launches == 1 && cudaGetLastError() == cudaSuccess,
       "a runtime that cannot answer the query: the kernel launches unchecked, the runtime's error cleared");
    fault.kernel = NULL;
    pv_cuda_kernels_free(&k);
}

int main(void)
{
    /* the programs built here, in a cache of the test's own (the
     * mismatch cases load them again from it) */
    char cache[] = "/tmp/pv-test-cuda-launch-XXXXXX";
    if (!mkdtemp(cache))
        return tap_skip_all("cannot make a temporary directory");
    setenv("PV_CUDA_CACHE_DIR", cache, 1);
    test_records();
    test_launchers();
    test_mismatches();
    DIR *d = opendir(cache);
    for (struct dirent *f; d && (f = readdir(d));) {
        char path[sizeof cache + 300];
        snprintf(path, sizeof path, "%s/%s", cache, f->d_name);
        if (f->d_name[0] != '.')
            unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(cache);
    return tap_done();
}
