/* The backend front end: opening backends (their ops come from the
 * registry, backends/registry.c), and validation of every op's arguments
 * before dispatch, so that backends see only valid input and bad input is a
 * status with a message, never a crash or a wrong answer. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/backend.h"
#include "backends/kernel-tuning.h"
#include "backends/registry.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t pv_dtype_size(pv_dtype dtype)
{
    return dtype == PV_F16 ? 2 : 4;
}

const char *pv_dtype_name(pv_dtype dtype)
{
    return dtype == PV_F16 ? "f16" : "f32";
}

int pv_wtype_block(pv_wtype type, uint32_t *block_elems, uint32_t *block_bytes)
{
    uint32_t elems, bytes;
    switch (type) {
    case PV_W_F32: elems = 1; bytes = 4; break;
    case PV_W_F16:
    case PV_W_BF16: elems = 1; bytes = 2; break;
    case PV_W_Q8_0: elems = 32; bytes = 34; break;
    case PV_W_Q4_0: elems = 32; bytes = 18; break;
    case PV_W_Q4_1: elems = 32; bytes = 20; break;
    default: return 0;
    }
    if (block_elems)
        *block_elems = elems;
    if (block_bytes)
        *block_bytes = bytes;
    return 1;
}

const char *pv_wtype_name(pv_wtype type)
{
    switch (type) {
    case PV_W_F32: return "F32";
    case PV_W_F16: return "F16";
    case PV_W_BF16: return "BF16";
    case PV_W_Q8_0: return "Q8_0";
    case PV_W_Q4_0: return "Q4_0";
    case PV_W_Q4_1: return "Q4_1";
    }
    return "unknown";
}

const char *pv_op_name(pv_op op)
{
    static const char *const op_names[PV_OP_COUNT] = {
        "gemm", "attention", "kv_write", "slot_gather", "slot_scatter", "embed_gather",
        "rmsnorm", "rope", "swiglu", "add", "softmax", "argmax", "sample_top_p", "qmatmul",
        "add_rmsnorm", "rope_kv_write", "qmatmul_swiglu", "slot_transfer", "sample_batch",
    };
    return (op >= 0 && op < PV_OP_COUNT) ? op_names[op] : "unknown op";
}

int pv_attention_head_dim_supported(int32_t head_dim)
{
    return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0;
}

/* A backend that loads but has no usable device: keep its reason and add
 * the backends that do have one. */
static pv_status unavailable_backend(const char *name, pv_status status)
{
    char reason[512];
    snprintf(reason, sizeof reason, "%s", pv_last_error()[0] ? pv_last_error() : "no device found");
    const char *names[PV_BACKENDS_MAX + 1];
    const pv_backend_ops *ops[PV_BACKENDS_MAX];
    const size_t n = pv_backend_loadable(names, ops);
    char list[128] = "";
    for (size_t i = 0; i < n; i++) {
        int count = 0;
        if (ops[i]->device_count(&count) != PV_OK || count <= 0)
            continue;
        if (list[0])
            strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
    }
    return pv_error(status, "backend '%s' is unavailable: %s; available: %s", name, reason,
                    list[0] ? list : "none");
}

pv_status pv_backend_device_count(const char *name, int *count)
{
    if (!count)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_device_count: count is NULL");
    *count = 0;
    const pv_backend_ops *ops = NULL;
    PV_TRY(pv_backend_lookup(name, &ops));
    return ops->device_count(count);
}

pv_status pv_backend_init(pv_backend **out, const char *name, int device)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_init: out is NULL");
    *out = NULL;
    const pv_backend_ops *ops = NULL;
    PV_TRY(pv_backend_lookup(name, &ops));
    int count = 0;
    pv_clear_error();
    pv_status st = ops->device_count(&count);
    if (st != PV_OK || count <= 0)
        return unavailable_backend(name, st == PV_OK ? PV_ERR_NO_DEVICE : st);
    if (device < 0 || device >= count)
        return pv_error(PV_ERR_INVALID_ARG, "backend '%s': device %d out of range [0, %d)", name,
                        device, count);
    pv_backend *be = calloc(1, sizeof *be);
    if (!be)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "backend '%s': cannot allocate the backend", name);
    be->ops = ops;
    be->device = device;
    be->tuning = calloc(1, sizeof *be->tuning);
    if (!be->tuning) {
        free(be);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "backend '%s': cannot allocate its kernel tuning", name);
    }
    pv_kernel_tuning_reset(be->tuning);
    st = ops->device_info(device, &be->info);
    if (st == PV_OK)
        st = ops->init(be);
    if (st != PV_OK) {
        free(be->tuning);
        free(be);
        return st;
    }
    *out = be;
    return PV_OK;
}

void pv_backend_free(pv_backend *be)
{
    if (!be)
        return;
    be->ops->free(be);
    free(be->tuning);
    free(be);
}

int pv_backend_supports(const pv_backend *be, pv_op op, pv_dtype dtype)
{
    if (!be || op < 0 || op >= PV_OP_COUNT)
        return 0;
    return be->ops->supports(be, op, dtype);
}

int pv_backend_supports_weights(const pv_backend *be, pv_op op, pv_wtype t)
{
    if (!be || (op != PV_OP_QMATMUL && op != PV_OP_QMATMUL_SWIGLU && op != PV_OP_EMBED_GATHER) ||
        !pv_wtype_block(t, NULL, NULL) ||
        !be->ops->supports_weights)
        return 0;
    return be->ops->supports_weights(be, op, t);
}

/* ---- validation helpers ----------------------------------------------------
 * Each returns PV_OK or records a message naming the op, the argument, the
 * value and the limit. */

static pv_status need_supported(const pv_backend *be, pv_op op, pv_dtype dtype)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "%s: backend is NULL", pv_op_name(op));
    if (!be->ops->supports(be, op, dtype))
        return pv_error(PV_ERR_UNSUPPORTED, "%s: backend '%s' does not support dtype %s", pv_op_name(op),
                        be->ops->name, pv_dtype_name(dtype));
    return PV_OK;
}

static pv_status need_positive(pv_op op, const char *arg, int64_t value)
{
    if (value <= 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = %" PRId64 " must be > 0", pv_op_name(op), arg,
                        value);
    return PV_OK;
}

static pv_status need_host_array(pv_op op, const char *arg, const void *ptr)
{
    if (!ptr)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s is NULL", pv_op_name(op), arg);
    return PV_OK;
}

static pv_status need_weights(const pv_backend *be, pv_op op, pv_wtype t)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "%s: backend is NULL", pv_op_name(op));
    if (!pv_wtype_block(t, NULL, NULL))
        return pv_error(PV_ERR_INVALID_ARG, "%s: weight type %d is not a known weight type", pv_op_name(op),
                        (int)t);
    if (!pv_backend_supports_weights(be, op, t))
        return pv_error(PV_ERR_UNSUPPORTED, "%s: backend '%s' does not support weight type %s",
                        pv_op_name(op), be->ops->name, pv_wtype_name(t));
    return PV_OK;
}

/* elems elements of elem_size bytes from element offset off fit in buf. */
static pv_status need_extent(const pv_backend *be, pv_op op, const char *arg, const pv_buffer *buf,
                             uint64_t off, uint64_t elems, size_t elem_size)
{
    if (!buf)
        return pv_error(PV_ERR_INVALID_ARG, "%s: buffer %s is NULL", pv_op_name(op), arg);
    if (buf->backend != be)
        return pv_error(PV_ERR_INVALID_ARG, "%s: buffer %s belongs to another backend", pv_op_name(op),
                        arg);
    uint64_t cap = buf->bytes / elem_size;
    if (off > cap || elems > cap - off)
        return pv_error(PV_ERR_INVALID_ARG,
                        "%s: buffer %s too small: offset %" PRIu64 " + %" PRIu64
                        " elements of %zu bytes exceeds its %" PRIu64 " bytes",
                        pv_op_name(op), arg, off, elems, elem_size, buf->bytes);
    return PV_OK;
}

/* The element count of argument `arg`: the product of its n factors (named
 * in `formula`, e.g. "n_tokens x n_heads x head_dim"), each >= 0. A product
 * past 64 bits is an error naming the factors: wrapped, it could pass the
 * buffer size check and send a kernel far outside the buffer. */
static pv_status need_product(pv_op op, const char *arg, const char *formula, const int64_t *factors, int n,
                              uint64_t *out)
{
    uint64_t product = 1;
    int overflow = 0;
    for (int i = 0; i < n; i++)
        overflow |= factors[i] < 0 || __builtin_mul_overflow(product, (uint64_t)factors[i], &product);
    if (!overflow) {
        *out = product;
        return PV_OK;
    }
    char values[160] = "";
    for (int i = 0; i < n; i++)
        snprintf(values + strlen(values), sizeof values - strlen(values), "%s%" PRId64, i ? " x " : "",
                 factors[i]);
    return pv_error(PV_ERR_INVALID_ARG, "%s: %s needs %s = %s elements, more than the limit %" PRIu64,
                    pv_op_name(op), arg, formula, values, UINT64_MAX);
}

/* Elements spanned by `rows` rows of `cols` at leading dimension ld:
 * (rows - 1) x ld + cols, with rows >= 1, checked like need_product. */
static pv_status need_span(pv_op op, const char *arg, int64_t rows, int64_t ld, int64_t cols, uint64_t *out)
{
    uint64_t span = 0;
    if (rows < 1 || ld < 0 || cols < 0 || __builtin_mul_overflow((uint64_t)(rows - 1), (uint64_t)ld, &span) ||
        __builtin_add_overflow(span, (uint64_t)cols, &span))
        return pv_error(PV_ERR_INVALID_ARG,
                        "%s: %s spans (rows - 1) x ld + cols = (%" PRId64 " - 1) x %" PRId64 " + %" PRId64
                        " elements, more than the limit %" PRIu64,
                        pv_op_name(op), arg, rows, ld, cols, UINT64_MAX);
    *out = span;
    return PV_OK;
}

/* Sizes a kernel or BLAS call takes as 32-bit ints: each at most INT32_MAX. */
static pv_status need_int_sizes(pv_op op, const char *const *size_names, const int64_t *sizes, int n)
{
    for (int i = 0; i < n; i++)
        if (sizes[i] > INT32_MAX)
            return pv_error(PV_ERR_UNSUPPORTED, "%s: %s = %" PRId64 " exceeds %d", pv_op_name(op),
                            size_names[i], sizes[i], INT32_MAX);
    return PV_OK;
}

#define PRODUCT(op, arg, formula, out, ...)                                                        \
    need_product(op, arg, formula, (const int64_t[]){__VA_ARGS__},                                   \
                 (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), out)

/* Byte ranges [a_begin, a_end) of buffer a and [b_begin, b_end) of b do
 * not overlap: an op writes one while it still reads the other. */
static pv_status need_apart(pv_op op, const char *a_name, const pv_buffer *a, uint64_t a_begin, uint64_t a_end,
                            const char *b_name, const pv_buffer *b, uint64_t b_begin, uint64_t b_end)
{
    if (a == b && a_begin < b_end && b_begin < a_end)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s (bytes %" PRIu64 " to %" PRIu64 ") overlaps %s (bytes %" PRIu64
                        " to %" PRIu64 ") in the same buffer",
                        pv_op_name(op), a_name, a_begin, a_end, b_name, b_begin, b_end);
    return PV_OK;
}

/* need_apart for f32 ranges given as element offset and count (checked
 * against their buffers already, so the byte ends fit). */
static pv_status need_apart_f32(pv_op op, const char *a_name, const pv_buffer *a, uint64_t a_off, uint64_t a_n,
                                const char *b_name, const pv_buffer *b, uint64_t b_off, uint64_t b_n)
{
    return need_apart(op, a_name, a, a_off * 4, (a_off + a_n) * 4, b_name, b, b_off * 4, (b_off + b_n) * 4);
}

/* Whether every slot of slots[0..n) lies in [0, n_slots). Branch-free in
 * lanes of 8, which the compiler vectorises at -O2: a decode step checks
 * every chunk of every sequence's context in every layer. */
static int slots_in_range(const int32_t *slots, int32_t n, int64_t n_slots)
{
    /* a negative slot is 2^31 or more as unsigned: out of range too */
    const uint32_t limit = n_slots > INT32_MAX ? 0x80000000u : (uint32_t)n_slots;
    uint32_t lane[8] = {0}, bad = 0;
    int32_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int j = 0; j < 8; j++)
            lane[j] |= (uint32_t)slots[c + j] >= limit;
    for (; c < n; c++)
        bad |= (uint32_t)slots[c] >= limit;
    for (int j = 0; j < 8; j++)
        bad |= lane[j];
    return !bad;
}

/* Validates the paged-KV addressing shared by attention and kv_write:
 * sequence ids, positions and the slot of every chunk a token touches.
 * For attention (whole_context) every chunk up to the token's position must
 * hold a slot; for kv_write only the token's own chunk. */
static pv_status check_paging(pv_op op, int32_t n_tokens, const int32_t *token_seq,
                              const int32_t *token_pos, const int32_t *slot_table, int32_t n_seqs,
                              int32_t max_chunks, int32_t chunk_tokens, int64_t n_slots,
                              int whole_context)
{
    PV_TRY(need_positive(op, "n_seqs", n_seqs));
    PV_TRY(need_positive(op, "max_chunks", max_chunks));
    PV_TRY(need_positive(op, "chunk_tokens", chunk_tokens));
    PV_TRY(need_positive(op, "n_slots", n_slots));
    PV_TRY(need_host_array(op, "token_seq", token_seq));
    PV_TRY(need_host_array(op, "token_pos", token_pos));
    PV_TRY(need_host_array(op, "slot_table", slot_table));
    int64_t max_pos = (int64_t)max_chunks * chunk_tokens; /* both positive int32: fits */
    /* Chunks [0, checked) of sequence last_seq are known good: a prefill's
     * tokens of one sequence check their context once, not once each. */
    int32_t last_seq = -1, checked = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        int32_t s = token_seq[i], p = token_pos[i];
        if (s < 0 || s >= n_seqs)
            return pv_error(PV_ERR_INVALID_ARG, "%s: token_seq[%d] = %d out of range [0, %d)",
                            pv_op_name(op), i, s, n_seqs);
        if (p < 0 || p >= max_pos)
            return pv_error(PV_ERR_INVALID_ARG,
                            "%s: token_pos[%d] = %d out of range [0, %" PRId64
                            ") (max_chunks %d x chunk_tokens %d)",
                            pv_op_name(op), i, p, max_pos, max_chunks, chunk_tokens);
        const int32_t last = p / chunk_tokens;
        int32_t first = whole_context ? 0 : last;
        if (whole_context && s == last_seq && checked > first)
            first = checked;
        const int32_t *row = slot_table + (int64_t)s * max_chunks;
        if (first <= last && !slots_in_range(row + first, last - first + 1, n_slots))
            for (int32_t c = first; c <= last; c++)
                if (row[c] < 0 || row[c] >= n_slots)
                    return pv_error(PV_ERR_INVALID_ARG,
                                    "%s: slot_table[%d][%d] = %d out of range [0, %" PRId64
                                    ") (needed by token %d at position %d)",
                                    pv_op_name(op), s, c, row[c], n_slots, i, p);
        if (s != last_seq) {
            last_seq = s;
            checked = 0;
        }
        if (whole_context && last + 1 > checked)
            checked = last + 1;
    }
    return PV_OK;
}

/* A host index value and the array position it came from: sorting these
 * finds repeated values in O(n log n). */
typedef struct keyed {
    int64_t key;
    int32_t index;
} keyed;

static int keyed_cmp(const void *pa, const void *pb)
{
    const keyed *a = pa, *b = pb;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

/* Sorts keys[n]; 1 with the positions of two equal keys (first < second)
 * when some key repeats, else 0. */
static int find_repeat(keyed *keys, int32_t n, int32_t *first, int32_t *second)
{
    qsort(keys, (size_t)n, sizeof *keys, keyed_cmp);
    for (int32_t i = 1; i < n; i++)
        if (keys[i].key == keys[i - 1].key) {
            *first = keys[i - 1].index;
            *second = keys[i].index;
            return 1;
        }
    return 0;
}

/* kv_write: two rows for one (sequence, position) would race inside the
 * kernel, and which one lands would differ between backends. */
static pv_status need_unique_rows(const pv_kv_write_args *a)
{
    keyed *keys = malloc((size_t)a->n_tokens * sizeof *keys);
    if (!keys)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "kv_write: cannot allocate %d keys to check for repeated rows",
                        a->n_tokens);
    for (int32_t i = 0; i < a->n_tokens; i++)
        keys[i] = (keyed){(int64_t)a->token_seq[i] << 32 | (uint32_t)a->token_pos[i], i};
    int32_t i = 0, j = 0;
    int repeated = find_repeat(keys, a->n_tokens, &i, &j);
    free(keys);
    if (repeated)
        return pv_error(PV_ERR_INVALID_ARG,
                        "kv_write: rows %d and %d both write sequence %d position %d (token_seq[%d] = %d, "
                        "token_pos[%d] = %d): at most one row per position",
                        i, j, a->token_seq[i], a->token_pos[i], j, a->token_seq[j], j, a->token_pos[j]);
    return PV_OK;
}

/* ---- buffers, copies, events ------------------------------------------------ */

pv_status pv_buffer_init(pv_buffer **out, pv_backend *be, pv_mem_kind kind, uint64_t bytes)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_init: out is NULL");
    *out = NULL;
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_init: backend is NULL");
    if (kind != PV_MEM_DEVICE && kind != PV_MEM_HOST)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_init: kind %d is neither device nor host",
                        (int)kind);
    if (bytes == 0)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_init: bytes = 0 must be > 0");
    pv_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_buffer_init: cannot allocate the buffer record");
    buf->backend = be;
    buf->kind = kind;
    buf->bytes = bytes;
    pv_status st = be->ops->buffer_alloc(be, kind, bytes, buf);
    if (st != PV_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    return PV_OK;
}

void pv_buffer_free(pv_buffer *buf)
{
    if (!buf)
        return;
    buf->backend->ops->buffer_free(buf->backend, buf);
    free(buf);
}

static pv_status need_bytes(const char *fn, const char *arg, const pv_buffer *buf, uint64_t off,
                            uint64_t bytes)
{
    if (!buf)
        return pv_error(PV_ERR_INVALID_ARG, "%s: buffer %s is NULL", fn, arg);
    if (off > buf->bytes || bytes > buf->bytes - off)
        return pv_error(PV_ERR_INVALID_ARG,
                        "%s: %s range of %" PRIu64 " bytes from offset %" PRIu64 " exceeds its %" PRIu64
                        " bytes",
                        fn, arg, bytes, off, buf->bytes); /* off + bytes itself may wrap */
    return PV_OK;
}

pv_status pv_buffer_advise_streamed(pv_buffer *buf)
{
    if (!buf)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_advise_streamed: buf is NULL");
    if (!buf->backend->ops->buffer_advise_streamed)
        return PV_OK;
    return buf->backend->ops->buffer_advise_streamed(buf->backend, buf);
}

pv_status pv_buffer_write(pv_buffer *dst, uint64_t dst_off, const void *src, uint64_t bytes)
{
    PV_TRY(need_bytes("pv_buffer_write", "dst", dst, dst_off, bytes));
    if (!src && bytes)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_write: src is NULL");
    if (bytes == 0)
        return PV_OK;
    return dst->backend->ops->buffer_write(dst->backend, dst, dst_off, src, bytes);
}

pv_status pv_weights_write(pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows, int64_t n_cols,
                           const void *src)
{
    uint32_t block_elems = 1, block_bytes = 4;
    if (!pv_wtype_block(t, &block_elems, &block_bytes))
        return pv_error(PV_ERR_INVALID_ARG, "pv_weights_write: weight type %d is not a known weight type", (int)t);
    if (n_rows <= 0 || n_cols <= 0 || n_cols % block_elems != 0)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_weights_write: a %s matrix of %" PRId64 " x %" PRId64
                        " needs rows > 0 and columns a positive multiple of %u",
                        pv_wtype_name(t), n_rows, n_cols, block_elems);
    uint64_t bytes = 0;
    if (__builtin_mul_overflow((uint64_t)n_rows, (uint64_t)n_cols / block_elems * block_bytes, &bytes))
        return pv_error(PV_ERR_INVALID_ARG, "pv_weights_write: a %s matrix of %" PRId64 " x %" PRId64
                        " has more than %" PRIu64 " bytes", pv_wtype_name(t), n_rows, n_cols, UINT64_MAX);
    PV_TRY(need_bytes("pv_weights_write", "dst", dst, dst_off, bytes));
    if (!src)
        return pv_error(PV_ERR_INVALID_ARG, "pv_weights_write: src is NULL");
    if (!dst->backend->ops->weights_write)
        return dst->backend->ops->buffer_write(dst->backend, dst, dst_off, src, bytes);
    return dst->backend->ops->weights_write(dst->backend, dst, dst_off, t, n_rows, n_cols, src);
}

pv_status pv_buffer_read(const pv_buffer *src, uint64_t src_off, void *dst, uint64_t bytes)
{
    PV_TRY(need_bytes("pv_buffer_read", "src", src, src_off, bytes));
    if (!dst && bytes)
        return pv_error(PV_ERR_INVALID_ARG, "pv_buffer_read: dst is NULL");
    if (bytes == 0)
        return PV_OK;
    return src->backend->ops->buffer_read(src->backend, src, src_off, dst, bytes);
}

pv_status pv_copy_async(pv_queue q, pv_buffer *dst, uint64_t dst_off, const pv_buffer *src,
                        uint64_t src_off, uint64_t bytes, pv_event *wait, pv_event **done)
{
    if (done)
        *done = NULL;
    PV_TRY(need_bytes("pv_copy_async", "dst", dst, dst_off, bytes));
    PV_TRY(need_bytes("pv_copy_async", "src", src, src_off, bytes));
    if (src->backend != dst->backend)
        return pv_error(PV_ERR_INVALID_ARG, "pv_copy_async: src and dst belong to different backends");
    if (q != PV_QUEUE_COMPUTE && q != PV_QUEUE_COPY)
        return pv_error(PV_ERR_INVALID_ARG, "pv_copy_async: queue %d is neither compute nor copy",
                        (int)q);
    if (wait && wait->backend != dst->backend)
        return pv_error(PV_ERR_INVALID_ARG, "pv_copy_async: wait event belongs to another backend");
    if (src == dst && bytes && src_off < dst_off + bytes && dst_off < src_off + bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_copy_async: ranges [%" PRIu64 ", +%" PRIu64 ") and [%" PRIu64
                        ", +%" PRIu64 ") of one buffer overlap",
                        src_off, bytes, dst_off, bytes);
    return dst->backend->ops->copy_async(dst->backend, q, dst, dst_off, src, src_off, bytes, wait,
                                         done);
}

pv_status pv_event_record(pv_backend *be, pv_queue q, pv_event **out)
{
    if (!be || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_event_record: backend or out is NULL");
    *out = NULL;
    if (q != PV_QUEUE_COMPUTE && q != PV_QUEUE_COPY)
        return pv_error(PV_ERR_INVALID_ARG, "pv_event_record: queue %d is neither compute nor copy",
                        (int)q);
    return be->ops->event_record(be, q, out);
}

pv_status pv_queue_wait(pv_backend *be, pv_queue q, pv_event *ev)
{
    if (!be || !ev || ev->backend != be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_queue_wait: backend or event is NULL or mismatched");
    if (q != PV_QUEUE_COMPUTE && q != PV_QUEUE_COPY)
        return pv_error(PV_ERR_INVALID_ARG, "pv_queue_wait: queue %d is neither compute nor copy",
                        (int)q);
    return be->ops->queue_wait(be, q, ev);
}

pv_status pv_event_wait(pv_event *ev)
{
    if (!ev)
        return pv_error(PV_ERR_INVALID_ARG, "pv_event_wait: event is NULL");
    return ev->backend->ops->event_wait(ev->backend, ev);
}

pv_status pv_event_query(pv_event *ev, int *done)
{
    if (!ev || !done)
        return pv_error(PV_ERR_INVALID_ARG, "pv_event_query: %s is NULL", ev ? "done" : "event");
    *done = 0;
    return ev->backend->ops->event_query(ev->backend, ev, done);
}

void pv_event_free(pv_event *ev)
{
    if (ev)
        ev->backend->ops->event_free(ev->backend, ev);
}

pv_status pv_backend_finish(pv_backend *be)
{
    if (!be)
        return pv_error(PV_ERR_INVALID_ARG, "pv_backend_finish: backend is NULL");
    return be->ops->finish(be);
}

/* ---- ops -------------------------------------------------------------------- */

pv_status pv_gemm(pv_backend *be, const pv_gemm_args *a)
{
    const pv_op op = PV_OP_GEMM;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "gemm: args is NULL");
    PV_TRY(need_supported(be, op, a->dtype));
    if (a->m < 0 || a->n < 0 || a->k < 0)
        return pv_error(PV_ERR_INVALID_ARG, "gemm: m, n, k = %" PRId64 ", %" PRId64 ", %" PRId64
                        " must be >= 0", a->m, a->n, a->k);
    /* Row-major: op(A) is m x k, stored m x k (lda >= k) or k x m if transposed. */
    int64_t a_rows = a->trans_a ? a->k : a->m, a_cols = a->trans_a ? a->m : a->k;
    int64_t b_rows = a->trans_b ? a->n : a->k, b_cols = a->trans_b ? a->k : a->n;
    if (a->lda < (a_cols > 1 ? a_cols : 1))
        return pv_error(PV_ERR_INVALID_ARG, "gemm: lda = %" PRId64 " < %" PRId64 " columns of A",
                        a->lda, a_cols);
    if (a->ldb < (b_cols > 1 ? b_cols : 1))
        return pv_error(PV_ERR_INVALID_ARG, "gemm: ldb = %" PRId64 " < %" PRId64 " columns of B",
                        a->ldb, b_cols);
    if (a->ldc < (a->n > 1 ? a->n : 1))
        return pv_error(PV_ERR_INVALID_ARG, "gemm: ldc = %" PRId64 " < n = %" PRId64, a->ldc, a->n);
    /* cuBLAS and OpenBLAS (32-bit build) take int sizes. */
    static const char *const dim_names[6] = {"m", "n", "k", "lda", "ldb", "ldc"};
    PV_TRY(need_int_sizes(op, dim_names, (const int64_t[]){a->m, a->n, a->k, a->lda, a->ldb, a->ldc}, 6));
    if (a->m == 0 || a->n == 0)
        return PV_OK;
    size_t es = pv_dtype_size(a->dtype);
    /* With k = 0 nothing of A or B is read, but they must still be real buffers. */
    uint64_t a_extent = 0, b_extent = 0, c_extent = 0;
    if (a->k > 0) {
        PV_TRY(need_span(op, "a", a_rows, a->lda, a_cols, &a_extent));
        PV_TRY(need_span(op, "b", b_rows, a->ldb, b_cols, &b_extent));
    }
    PV_TRY(need_span(op, "c", a->m, a->ldc, a->n, &c_extent));
    PV_TRY(need_extent(be, op, "a", a->a, a->a_off, a_extent, es));
    PV_TRY(need_extent(be, op, "b", a->b, a->b_off, b_extent, es));
    PV_TRY(need_extent(be, op, "c", a->c, a->c_off, c_extent, es));
    return be->ops->gemm(be, a);
}

/* The checks of pv_attention; *empty = 1 when there is nothing to compute. */
static pv_status check_attention(pv_backend *be, const pv_attention_args *a, int *empty)
{
    const pv_op op = PV_OP_ATTENTION;
    *empty = 1;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "attention: args is NULL");
    PV_TRY(need_supported(be, op, a->kv_dtype));
    if (a->n_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "attention: n_tokens = %d must be >= 0", a->n_tokens);
    PV_TRY(need_positive(op, "n_heads", a->n_heads));
    PV_TRY(need_positive(op, "n_kv_heads", a->n_kv_heads));
    if (a->n_heads % a->n_kv_heads != 0)
        return pv_error(PV_ERR_INVALID_ARG, "attention: n_heads = %d is not a multiple of n_kv_heads = %d",
                        a->n_heads, a->n_kv_heads);
    if (!pv_attention_head_dim_supported(a->head_dim))
        return pv_error(PV_ERR_UNSUPPORTED,
                        "attention: head_dim = %d unsupported (multiples of 16 from 16 to 256)",
                        a->head_dim);
    if (!(a->scale > 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "attention: scale = %g must be > 0", (double)a->scale);
    if (a->n_tokens == 0)
        return PV_OK;
    *empty = 0;
    PV_TRY(check_paging(op, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs,
                     a->max_chunks, a->chunk_tokens, a->n_slots, 1));
    uint64_t q_elems = 0, pool_elems = 0;
    PV_TRY(PRODUCT(op, "q", "n_tokens x n_heads x head_dim", &q_elems, a->n_tokens, a->n_heads, a->head_dim));
    PV_TRY(PRODUCT(op, "kv_pool", "n_slots x 2 x chunk_tokens x n_kv_heads x head_dim", &pool_elems, a->n_slots, 2,
                a->chunk_tokens, a->n_kv_heads, a->head_dim));
    PV_TRY(need_extent(be, op, "q", a->q, a->q_off, q_elems, 4));
    PV_TRY(need_extent(be, op, "out", a->out, a->out_off, q_elems, 4));
    PV_TRY(need_extent(be, op, "kv_pool", a->kv_pool, 0, pool_elems, pv_dtype_size(a->kv_dtype)));
    return PV_OK;
}

pv_status pv_attention(pv_backend *be, const pv_attention_args *a)
{
    int empty = 1;
    PV_TRY(check_attention(be, a, &empty));
    return empty ? PV_OK : be->ops->attention(be, a);
}

pv_status pv_kv_write(pv_backend *be, const pv_kv_write_args *a)
{
    const pv_op op = PV_OP_KV_WRITE;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "kv_write: args is NULL");
    PV_TRY(need_supported(be, op, a->kv_dtype));
    if (a->n_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "kv_write: n_tokens = %d must be >= 0", a->n_tokens);
    PV_TRY(need_positive(op, "n_kv_heads", a->n_kv_heads));
    PV_TRY(need_positive(op, "head_dim", a->head_dim));
    if (a->n_tokens == 0)
        return PV_OK;
    PV_TRY(check_paging(op, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs,
                     a->max_chunks, a->chunk_tokens, a->n_slots, 0));
    uint64_t row_elems = 0, pool_elems = 0;
    PV_TRY(PRODUCT(op, "k and v", "n_tokens x n_kv_heads x head_dim", &row_elems, a->n_tokens, a->n_kv_heads,
                a->head_dim));
    PV_TRY(PRODUCT(op, "kv_pool", "n_slots x 2 x chunk_tokens x n_kv_heads x head_dim", &pool_elems, a->n_slots, 2,
                a->chunk_tokens, a->n_kv_heads, a->head_dim));
    PV_TRY(need_extent(be, op, "k", a->k, a->k_off, row_elems, 4));
    PV_TRY(need_extent(be, op, "v", a->v, a->v_off, row_elems, 4));
    PV_TRY(need_extent(be, op, "kv_pool", a->kv_pool, 0, pool_elems, pv_dtype_size(a->kv_dtype)));
    PV_TRY(need_unique_rows(a));
    return be->ops->kv_write(be, a);
}

static pv_status check_slot_copy(pv_backend *be, pv_op op, const pv_slot_copy_args *a)
{
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "%s: args is NULL", pv_op_name(op));
    PV_TRY(need_supported(be, op, a->dtype));
    PV_TRY(need_positive(op, "slot_elems", a->slot_elems));
    PV_TRY(need_positive(op, "n_slots", a->n_slots));
    if (a->n_slots_moved < 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: n_slots_moved = %d must be >= 0", pv_op_name(op),
                        a->n_slots_moved);
    if (a->n_slots_moved == 0)
        return PV_OK;
    PV_TRY(need_host_array(op, "slots", a->slots));
    for (int32_t i = 0; i < a->n_slots_moved; i++)
        if (a->slots[i] < 0 || a->slots[i] >= a->n_slots)
            return pv_error(PV_ERR_INVALID_ARG, "%s: slots[%d] = %d out of range [0, %" PRId64 ")",
                            pv_op_name(op), i, a->slots[i], a->n_slots);
    size_t es = pv_dtype_size(a->dtype);
    uint64_t pool_elems = 0, moved_elems = 0;
    PV_TRY(PRODUCT(op, "pool", "n_slots x slot_elems", &pool_elems, a->n_slots, a->slot_elems));
    PV_TRY(PRODUCT(op, "staging", "n_slots_moved x slot_elems", &moved_elems, a->n_slots_moved, a->slot_elems));
    PV_TRY(need_extent(be, op, "pool", a->pool, 0, pool_elems, es));
    PV_TRY(need_extent(be, op, "staging", a->staging, a->staging_off, moved_elems, es));
    if (a->pool == a->staging)
        return pv_error(PV_ERR_INVALID_ARG, "%s: pool and staging are the same buffer", pv_op_name(op));
    return PV_OK;
}

pv_status pv_slot_gather(pv_backend *be, const pv_slot_copy_args *a)
{
    PV_TRY(check_slot_copy(be, PV_OP_SLOT_GATHER, a));
    return a->n_slots_moved ? be->ops->slot_gather(be, a) : PV_OK;
}

/* The slots an op writes: two writes into one slot would race, and the
 * result would depend on their order. */
static pv_status need_unique_slots(pv_op op, const char *arg, const int32_t *slots, int32_t n)
{
    keyed *keys = malloc((size_t)n * sizeof *keys);
    if (!keys)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d keys to check for repeated slots",
                        pv_op_name(op), n);
    for (int32_t i = 0; i < n; i++)
        keys[i] = (keyed){slots[i], i};
    int32_t i = 0, j = 0;
    int repeated = find_repeat(keys, n, &i, &j);
    free(keys);
    if (repeated)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s[%d] = %s[%d] = %d: slot %d appears twice in %s", pv_op_name(op),
                        arg, i, arg, j, slots[i], slots[i], arg);
    return PV_OK;
}

pv_status pv_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    PV_TRY(check_slot_copy(be, PV_OP_SLOT_SCATTER, a));
    if (a->n_slots_moved == 0)
        return PV_OK;
    PV_TRY(need_unique_slots(PV_OP_SLOT_SCATTER, "slots", a->slots, a->n_slots_moved));
    return be->ops->slot_scatter(be, a);
}

/* Every slot number of list (n entries) names one of a pool's n_slots. */
static pv_status need_slots_in_range(pv_op op, const char *arg, const int32_t *list, int32_t n, int64_t n_slots)
{
    PV_TRY(need_host_array(op, arg, list));
    for (int32_t i = 0; i < n; i++)
        if (list[i] < 0 || list[i] >= n_slots)
            return pv_error(PV_ERR_INVALID_ARG, "%s: %s[%d] = %d out of range [0, %" PRId64 ")", pv_op_name(op), arg,
                            i, list[i], n_slots);
    return PV_OK;
}

pv_status pv_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    const pv_op op = PV_OP_SLOT_TRANSFER;
    if (done)
        *done = NULL;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "slot_transfer: args is NULL");
    PV_TRY(need_supported(be, op, a->dtype));
    PV_TRY(need_positive(op, "slot_elems", a->slot_elems));
    PV_TRY(need_positive(op, "dst_n_slots", a->dst_n_slots));
    PV_TRY(need_positive(op, "src_n_slots", a->src_n_slots));
    const size_t es = pv_dtype_size(a->dtype);
    /* The kernels move 4-byte words. */
    if ((uint64_t)a->slot_elems * es % 4 != 0)
        return pv_error(PV_ERR_INVALID_ARG, "slot_transfer: a slot of %" PRId64 " %s elements is not a whole number "
                        "of 4-byte words", a->slot_elems, pv_dtype_name(a->dtype));
    if (a->n < 0)
        return pv_error(PV_ERR_INVALID_ARG, "slot_transfer: n = %d must be >= 0", a->n);
    if (wait && wait->backend != be)
        return pv_error(PV_ERR_INVALID_ARG, "slot_transfer: wait event belongs to another backend");
    uint64_t dst_elems = 0, src_elems = 0;
    PV_TRY(PRODUCT(op, "dst", "dst_n_slots x slot_elems", &dst_elems, a->dst_n_slots, a->slot_elems));
    PV_TRY(PRODUCT(op, "src", "src_n_slots x slot_elems", &src_elems, a->src_n_slots, a->slot_elems));
    PV_TRY(need_extent(be, op, "dst", a->dst, 0, dst_elems, es));
    PV_TRY(need_extent(be, op, "src", a->src, 0, src_elems, es));
    if (a->dst == a->src)
        return pv_error(PV_ERR_INVALID_ARG, "slot_transfer: src and dst are the same buffer");
    if (a->n > 0) {
        PV_TRY(need_slots_in_range(op, "dst_slots", a->dst_slots, a->n, a->dst_n_slots));
        PV_TRY(need_slots_in_range(op, "src_slots", a->src_slots, a->n, a->src_n_slots));
        PV_TRY(need_unique_slots(op, "dst_slots", a->dst_slots, a->n));
    }
    return be->ops->slot_transfer(be, a, wait, done);
}

/* `elems` elements of weight type t from element offset off fit in buf;
 * both are whole blocks (checked by the caller). */
static pv_status need_weight_extent(const pv_backend *be, pv_op op, const char *arg, const pv_buffer *buf,
                                    pv_wtype t, uint64_t off, uint64_t elems)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    if (block_elems == 1 || !buf || buf->backend != be)
        return need_extent(be, op, arg, buf, off, elems, block_bytes);
    uint64_t cap = buf->bytes / block_bytes, first = off / block_elems, count = elems / block_elems;
    if (first > cap || count > cap - first)
        return pv_error(PV_ERR_INVALID_ARG,
                        "%s: buffer %s too small: %" PRIu64 " blocks of %s (%u bytes) from block %" PRIu64
                        " exceed its %" PRIu64 " bytes",
                        pv_op_name(op), arg, count, pv_wtype_name(t), block_bytes, first, buf->bytes);
    return PV_OK;
}

/* A weight row of n elements must be whole blocks of type t, and so must the
 * buffer offset: GGUF stores no partial block. */
static pv_status need_whole_blocks(pv_op op, pv_wtype t, const char *n_name, int64_t n, const char *off_name,
                                   uint64_t off)
{
    uint32_t block_elems = 1;
    pv_wtype_block(t, &block_elems, NULL);
    if (n % block_elems != 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = %" PRId64 " is not a multiple of %s's block of %u elements",
                        pv_op_name(op), n_name, n, pv_wtype_name(t), block_elems);
    if (off % block_elems != 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = %" PRIu64 " is not a multiple of %s's block of %u elements",
                        pv_op_name(op), off_name, off, pv_wtype_name(t), block_elems);
    return PV_OK;
}

pv_status pv_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    const pv_op op = PV_OP_EMBED_GATHER;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "embed_gather: args is NULL");
    PV_TRY(need_weights(be, op, a->table_type));
    PV_TRY(need_positive(op, "n_rows", a->n_rows));
    PV_TRY(need_positive(op, "dim", a->dim));
    PV_TRY(need_whole_blocks(op, a->table_type, "dim", a->dim, "table_off", a->table_off));
    if (a->n_ids < 0)
        return pv_error(PV_ERR_INVALID_ARG, "embed_gather: n_ids = %d must be >= 0", a->n_ids);
    if (a->n_ids_dev < 0)
        return pv_error(PV_ERR_INVALID_ARG, "embed_gather: n_ids_dev = %" PRId64 " must be >= 0", a->n_ids_dev);
    if (a->n_ids == 0)
        return PV_OK;
    PV_TRY(need_host_array(op, "ids", a->ids));
    if (a->ids_dev)
        PV_TRY(need_extent(be, op, "ids_dev", a->ids_dev, a->ids_dev_off, (uint64_t)a->n_ids_dev, 4));
    else if (a->n_ids_dev != 0)
        return pv_error(PV_ERR_INVALID_ARG, "embed_gather: n_ids_dev = %" PRId64 " without ids_dev", a->n_ids_dev);
    for (int32_t i = 0; i < a->n_ids; i++) {
        const int32_t id = a->ids[i];
        if (id >= a->n_rows)
            return pv_error(PV_ERR_INVALID_ARG, "embed_gather: ids[%d] = %d out of range [0, %" PRId64 ")", i, id,
                            a->n_rows);
        const int64_t j = -(int64_t)id - 1; /* id = -(j + 1): device id j */
        if (id < 0 && j >= a->n_ids_dev)
            return pv_error(PV_ERR_INVALID_ARG,
                            "embed_gather: ids[%d] = %d takes device id %" PRId64 ", past n_ids_dev = %" PRId64
                            "%s",
                            i, id, j, a->n_ids_dev, a->ids_dev ? "" : " (ids_dev is NULL)");
    }
    uint64_t table_elems = 0, out_elems = 0;
    PV_TRY(PRODUCT(op, "table", "n_rows x dim", &table_elems, a->n_rows, a->dim));
    PV_TRY(PRODUCT(op, "out", "n_ids x dim", &out_elems, a->n_ids, a->dim));
    PV_TRY(need_weight_extent(be, op, "table", a->table, a->table_type, a->table_off, table_elems));
    PV_TRY(need_extent(be, op, "out", a->out, a->out_off, out_elems, 4));
    /* Row i is written while later rows' device ids are still read. */
    if (a->ids_dev)
        PV_TRY(need_apart_f32(op, "out", a->out, a->out_off, out_elems, "ids_dev", a->ids_dev, a->ids_dev_off,
                              (uint64_t)a->n_ids_dev));
    return be->ops->embed_gather(be, a);
}

/* The checks of pv_qmatmul; *empty = 1 when there is nothing to compute. */
static pv_status check_qmatmul(pv_backend *be, const pv_qmatmul_args *a, int *empty)
{
    const pv_op op = PV_OP_QMATMUL;
    *empty = 1;
    PV_TRY(need_weights(be, op, a->w_type));
    if (a->n_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "qmatmul: n_tokens = %" PRId64 " must be >= 0", a->n_tokens);
    PV_TRY(need_positive(op, "n_in", a->n_in));
    PV_TRY(need_positive(op, "n_out", a->n_out));
    PV_TRY(need_whole_blocks(op, a->w_type, "n_in", a->n_in, "w_off", a->w_off));
    /* Kernels index rows and columns with 32-bit ints, as the BLAS calls do. */
    static const char *const dim_names[3] = {"n_tokens", "n_in", "n_out"};
    PV_TRY(need_int_sizes(op, dim_names, (const int64_t[]){a->n_tokens, a->n_in, a->n_out}, 3));
    if (a->n_tokens == 0)
        return PV_OK;
    *empty = 0;
    uint64_t w_elems = 0, x_elems = 0, y_elems = 0;
    PV_TRY(PRODUCT(op, "w", "n_out x n_in", &w_elems, a->n_out, a->n_in));
    PV_TRY(PRODUCT(op, "x", "n_tokens x n_in", &x_elems, a->n_tokens, a->n_in));
    PV_TRY(PRODUCT(op, "y", "n_tokens x n_out", &y_elems, a->n_tokens, a->n_out));
    PV_TRY(need_weight_extent(be, op, "w", a->w, a->w_type, a->w_off, w_elems));
    PV_TRY(need_extent(be, op, "x", a->x, a->x_off, x_elems, 4));
    PV_TRY(need_extent(be, op, "y", a->y, a->y_off, y_elems, 4));
    /* y is written while x (and w) are still read. */
    const pv_buffer *ins[2] = {a->x, a->w};
    const uint64_t in_begin[2] = {a->x_off * 4, 0}, in_end[2] = {(a->x_off + x_elems) * 4, a->w->bytes};
    const char *const in_names[2] = {"x", "w"};
    for (int i = 0; i < 2; i++)
        if (ins[i] == a->y && a->y_off * 4 < in_end[i] && in_begin[i] < (a->y_off + y_elems) * 4)
            return pv_error(PV_ERR_INVALID_ARG, "qmatmul: y overlaps %s in the same buffer", in_names[i]);
    return PV_OK;
}

pv_status pv_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "qmatmul: args is NULL");
    int empty = 1;
    PV_TRY(check_qmatmul(be, a, &empty));
    return empty ? PV_OK : be->ops->qmatmul(be, a);
}

/* st, with the last error's message prefixed by the op and the part of
 * its arguments at fault. */
static pv_status qualified(pv_status st, const char *op, const char *part)
{
    char why[512]; /* pv_error writes the buffer pv_last_error reads */
    snprintf(why, sizeof why, "%s", pv_last_error());
    return pv_error(st, "%s: %s: %s", op, part, why);
}

/* The checks of pv_qmatmul_group; *empty = 1 when there is nothing to
 * compute. */
static pv_status check_group(pv_backend *be, const pv_qmatmul_args *products, int n, int *empty)
{
    if (!products)
        return pv_error(PV_ERR_INVALID_ARG, "qmatmul_group: products is NULL");
    if (n < 1 || n > PV_QMATMUL_GROUP_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "qmatmul_group: n = %d out of range [1, %d]", n,
                        PV_QMATMUL_GROUP_MAX);
    const pv_qmatmul_args *first = &products[0];
    *empty = 1;
    for (int i = 0; i < n; i++) {
        const pv_qmatmul_args *a = &products[i];
        if (a->x != first->x || a->x_off != first->x_off || a->n_tokens != first->n_tokens ||
            a->n_in != first->n_in)
            return pv_error(PV_ERR_INVALID_ARG,
                            "qmatmul_group: product %d reads x at offset %" PRIu64 ", %" PRId64 " x %" PRId64
                            ", not product 0's x at %" PRIu64 ", %" PRId64 " x %" PRId64 " (one buffer)",
                            i, a->x_off, a->n_tokens, a->n_in, first->x_off, first->n_tokens, first->n_in);
        pv_status st = check_qmatmul(be, a, empty);
        if (st != PV_OK) {
            char part[32];
            snprintf(part, sizeof part, "product %d", i);
            return qualified(st, "qmatmul_group", part);
        }
        /* the products' sizes are checked above, so these products fit */
        for (int j = 0; j < i; j++) {
            const pv_qmatmul_args *b = &products[j];
            uint64_t a_end = (a->y_off + (uint64_t)a->n_tokens * (uint64_t)a->n_out) * 4;
            uint64_t b_end = (b->y_off + (uint64_t)b->n_tokens * (uint64_t)b->n_out) * 4;
            if (!*empty && a->y == b->y && a->y_off * 4 < b_end && b->y_off * 4 < a_end)
                return pv_error(PV_ERR_INVALID_ARG, "qmatmul_group: products %d and %d write overlapping y", j,
                                i);
        }
    }
    return PV_OK;
}

/* A checked group, as one dispatch where the backend has it. */
static pv_status run_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    if (be->ops->qmatmul_group)
        return be->ops->qmatmul_group(be, products, n);
    for (int i = 0; i < n; i++)
        PV_TRY(be->ops->qmatmul(be, &products[i]));
    return PV_OK;
}

pv_status pv_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    int empty = 1;
    PV_TRY(check_group(be, products, n, &empty));
    return empty ? PV_OK : run_group(be, products, n);
}


pv_status pv_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a)
{
    const pv_op op = PV_OP_RMSNORM;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "rmsnorm: args is NULL");
    PV_TRY(need_supported(be, op, PV_F32));
    PV_TRY(need_positive(op, "rows", a->rows));
    PV_TRY(need_positive(op, "dim", a->dim));
    if (!(a->eps >= 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "rmsnorm: eps = %g must be >= 0", (double)a->eps);
    uint64_t n = 0;
    PV_TRY(PRODUCT(op, "x and out", "rows x dim", &n, a->rows, a->dim));
    PV_TRY(need_extent(be, op, "x", a->x, a->x_off, n, 4));
    PV_TRY(need_extent(be, op, "weight", a->weight, a->weight_off, (uint64_t)a->dim, 4));
    PV_TRY(need_extent(be, op, "out", a->out, a->out_off, n, 4));
    return be->ops->rmsnorm(be, a);
}

pv_status pv_rope(pv_backend *be, const pv_rope_args *a)
{
    const pv_op op = PV_OP_ROPE;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "rope: args is NULL");
    PV_TRY(need_supported(be, op, PV_F32));
    if (a->n_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "rope: n_tokens = %d must be >= 0", a->n_tokens);
    PV_TRY(need_positive(op, "n_heads", a->n_heads));
    PV_TRY(need_positive(op, "head_dim", a->head_dim));
    if (a->head_dim % 2)
        return pv_error(PV_ERR_INVALID_ARG, "rope: head_dim = %d must be even", a->head_dim);
    if (!(a->base > 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "rope: base = %g must be > 0", (double)a->base);
    if (a->n_tokens == 0)
        return PV_OK;
    PV_TRY(need_host_array(op, "pos", a->pos));
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (a->pos[i] < 0)
            return pv_error(PV_ERR_INVALID_ARG, "rope: pos[%d] = %d must be >= 0", i, a->pos[i]);
    uint64_t n = 0;
    PV_TRY(PRODUCT(op, "x", "n_tokens x n_heads x head_dim", &n, a->n_tokens, a->n_heads, a->head_dim));
    PV_TRY(need_extent(be, op, "x", a->x, a->x_off, n, 4));
    return be->ops->rope(be, a);
}

/* out = f(x, y) elementwise over n f32 values (swiglu, add). */
static pv_status check_binary(pv_backend *be, pv_op op, int64_t n, const char *x_name,
                              const pv_buffer *x, uint64_t x_off, const char *y_name,
                              const pv_buffer *y, uint64_t y_off, const pv_buffer *out,
                              uint64_t out_off)
{
    PV_TRY(need_supported(be, op, PV_F32));
    if (n < 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: n = %" PRId64 " must be >= 0", pv_op_name(op), n);
    if (n == 0)
        return PV_OK;
    PV_TRY(need_extent(be, op, x_name, x, x_off, (uint64_t)n, 4));
    PV_TRY(need_extent(be, op, y_name, y, y_off, (uint64_t)n, 4));
    return need_extent(be, op, "out", out, out_off, (uint64_t)n, 4);
}

pv_status pv_swiglu(pv_backend *be, const pv_swiglu_args *a)
{
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "swiglu: args is NULL");
    PV_TRY(check_binary(be, PV_OP_SWIGLU, a->n, "gate", a->gate, a->gate_off, "up", a->up, a->up_off,
                     a->out, a->out_off));
    return a->n ? be->ops->swiglu(be, a) : PV_OK;
}

pv_status pv_add(pv_backend *be, const pv_add_args *a)
{
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "add: args is NULL");
    PV_TRY(check_binary(be, PV_OP_ADD, a->n, "a", a->a, a->a_off, "b", a->b, a->b_off, a->out,
                     a->out_off));
    return a->n ? be->ops->add(be, a) : PV_OK;
}

pv_status pv_softmax(pv_backend *be, const pv_softmax_args *a)
{
    const pv_op op = PV_OP_SOFTMAX;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "softmax: args is NULL");
    PV_TRY(need_supported(be, op, PV_F32));
    PV_TRY(need_positive(op, "rows", a->rows));
    PV_TRY(need_positive(op, "cols", a->cols));
    uint64_t n = 0;
    PV_TRY(PRODUCT(op, "x and out", "rows x cols", &n, a->rows, a->cols));
    PV_TRY(need_extent(be, op, "x", a->x, a->x_off, n, 4));
    PV_TRY(need_extent(be, op, "out", a->out, a->out_off, n, 4));
    return be->ops->softmax(be, a);
}

/* What the ops that pick a token a row (argmax, sample_top_p,
 * sample_batch) read: rows x cols f32 of buffer x from x_off (`arg` names
 * it, *n gets its elements), cols within the kernels' int. */
static pv_status need_pick_rows(pv_backend *be, pv_op op, const char *arg, int64_t rows, int64_t cols,
                                const pv_buffer *x, uint64_t x_off, uint64_t *n)
{
    PV_TRY(need_supported(be, op, PV_F32));
    PV_TRY(need_positive(op, "rows", rows));
    PV_TRY(need_positive(op, "cols", cols));
    if (cols > INT32_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "%s: cols = %" PRId64 " exceeds %d", pv_op_name(op), cols, INT32_MAX);
    PV_TRY(PRODUCT(op, arg, "rows x cols", n, rows, cols));
    return need_extent(be, op, arg, x, x_off, *n, 4);
}

pv_status pv_argmax(pv_backend *be, const pv_argmax_args *a)
{
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "argmax: args is NULL");
    uint64_t n = 0;
    PV_TRY(need_pick_rows(be, PV_OP_ARGMAX, "x", a->rows, a->cols, a->x, a->x_off, &n));
    PV_TRY(need_host_array(PV_OP_ARGMAX, "out", a->out));
    return be->ops->argmax(be, a);
}

/* A sampled row's top_p and u, named in messages as the caller says. */
static pv_status need_sampling(pv_op op, const char *top_p_name, float top_p, const char *u_name, float u)
{
    if (!(top_p > 0.0f && top_p <= 1.0f))
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = %g must be in (0, 1]", pv_op_name(op), top_p_name,
                        (double)top_p);
    if (!(u >= 0.0f && u < 1.0f))
        return pv_error(PV_ERR_INVALID_ARG, "%s: %s = %g must be in [0, 1)", pv_op_name(op), u_name, (double)u);
    return PV_OK;
}

pv_status pv_sample_top_p(pv_backend *be, const pv_sample_args *a)
{
    const pv_op op = PV_OP_SAMPLE_TOP_P;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "sample_top_p: args is NULL");
    uint64_t n = 0;
    PV_TRY(need_pick_rows(be, op, "logits", a->rows, a->cols, a->logits, a->logits_off, &n));
    PV_TRY(need_host_array(op, "out", a->out));
    if (!(a->temperature > 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "sample_top_p: temperature = %g must be > 0",
                        (double)a->temperature);
    PV_TRY(need_host_array(op, "u", a->u));
    char u_name[32];
    for (int64_t r = 0; r < a->rows; r++) {
        snprintf(u_name, sizeof u_name, "u[%" PRId64 "]", r);
        PV_TRY(need_sampling(op, "top_p", a->top_p, u_name, a->u[r]));
    }
    return be->ops->sample_top_p(be, a);
}

/* sample_batch's logit bias (pv_sample_batch_args): the lists' shape,
 * each entry, no token twice in a row (two entries would add twice on one
 * backend and race on another), and no row with every token banned. */
static pv_status need_logit_bias(const pv_sample_batch_args *a)
{
    const pv_op op = PV_OP_SAMPLE_BATCH;
    const int32_t *start = a->bias_start;
    if (!start)
        return PV_OK;
    if (start[0] != 0)
        return pv_error(PV_ERR_INVALID_ARG, "sample_batch: bias_start[0] = %d must be 0", start[0]);
    for (int64_t r = 0; r < a->rows; r++) {
        if (start[r + 1] < start[r])
            return pv_error(PV_ERR_INVALID_ARG,
                            "sample_batch: bias_start[%" PRId64 "] = %d is below bias_start[%" PRId64
                            "] = %d (row %" PRId64 "'s entries end before they start)",
                            r + 1, start[r + 1], r, start[r], r);
        if (start[r + 1] > PV_LOGIT_BIAS_MAX)
            return pv_error(PV_ERR_INVALID_ARG,
                            "sample_batch: bias_start[%" PRId64 "] = %d: more than the %d bias entries allowed",
                            r + 1, start[r + 1], PV_LOGIT_BIAS_MAX);
    }
    const int32_t n = start[a->rows];
    if (n == 0)
        return PV_OK;
    PV_TRY(need_host_array(op, "bias_token", a->bias_token));
    PV_TRY(need_host_array(op, "bias_value", a->bias_value));
    keyed *keys = malloc((size_t)n * sizeof *keys);
    if (!keys)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "sample_batch: cannot allocate %d keys to check the bias tokens", n);
    for (int64_t r = 0, k = 0; r < a->rows; r++)
        for (; k < start[r + 1]; k++) {
            const int32_t token = a->bias_token[k];
            const float value = a->bias_value[k];
            pv_status st = PV_OK;
            if (token < 0 || token >= a->cols)
                st = pv_error(PV_ERR_INVALID_ARG,
                              "sample_batch: bias_token[%" PRId64 "] = %d (row %" PRId64 ") out of range [0, %" PRId64
                              ")",
                              k, token, r, a->cols);
            else if (!isfinite(value))
                st = pv_error(PV_ERR_INVALID_ARG,
                              "sample_batch: bias_value[%" PRId64 "] = %g (row %" PRId64 ", token %d) is not finite",
                              k, (double)value, r, token);
            if (st != PV_OK) {
                free(keys);
                return st;
            }
            keys[k] = (keyed){r * a->cols + token, (int32_t)k}; /* < rows x cols, checked */
        }
    int32_t first = 0, second = 0;
    const int repeated = find_repeat(keys, n, &first, &second);
    free(keys);
    if (repeated) {
        int64_t r = 0;
        while (start[r + 1] <= first)
            r++;
        return pv_error(PV_ERR_INVALID_ARG,
                        "sample_batch: row %" PRId64 " has token %d twice (bias_token[%d] and bias_token[%d]): at "
                        "most one bias a token",
                        r, a->bias_token[first], first, second);
    }
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t banned = 0;
        for (int32_t k = start[r]; k < start[r + 1]; k++)
            banned += a->bias_value[k] <= PV_LOGIT_BIAS_BAN;
        if (banned == a->cols) /* the tokens are distinct: every one of them */
            return pv_error(PV_ERR_INVALID_ARG,
                            "sample_batch: row %" PRId64 " bans all its %" PRId64 " tokens (bias <= %g): none is "
                            "left to pick",
                            r, a->cols, (double)PV_LOGIT_BIAS_BAN);
    }
    return PV_OK;
}

pv_status pv_sample_batch(pv_backend *be, const pv_sample_batch_args *a)
{
    const pv_op op = PV_OP_SAMPLE_BATCH;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "sample_batch: args is NULL");
    uint64_t n = 0;
    PV_TRY(need_pick_rows(be, op, "logits", a->rows, a->cols, a->logits, a->logits_off, &n));
    if (!a->out == !a->out_dev)
        return pv_error(PV_ERR_INVALID_ARG, "sample_batch: give exactly one of out (host) and out_dev (device), not %s",
                        a->out ? "both" : "neither");
    if (a->out_dev) {
        PV_TRY(need_extent(be, op, "out_dev", a->out_dev, a->out_dev_off, (uint64_t)a->rows, 4));
        PV_TRY(need_apart_f32(op, "out_dev", a->out_dev, a->out_dev_off, (uint64_t)a->rows, "logits", a->logits,
                              a->logits_off, n));
    }
    PV_TRY(need_host_array(op, "temperature", a->temperature));
    PV_TRY(need_host_array(op, "top_p", a->top_p));
    PV_TRY(need_host_array(op, "u", a->u));
    char top_p_name[32], u_name[32];
    for (int64_t r = 0; r < a->rows; r++) {
        if (isnan(a->temperature[r]))
            return pv_error(PV_ERR_INVALID_ARG, "sample_batch: temperature[%" PRId64 "] is NaN", r);
        if (a->temperature[r] <= 0.0f)
            continue; /* greedy: top_p and u unused */
        snprintf(top_p_name, sizeof top_p_name, "top_p[%" PRId64 "]", r);
        snprintf(u_name, sizeof u_name, "u[%" PRId64 "]", r);
        PV_TRY(need_sampling(op, top_p_name, a->top_p[r], u_name, a->u[r]));
    }
    PV_TRY(need_logit_bias(a));
    return be->ops->sample_batch(be, a);
}

/* ---- fused ops ------------------------------------------------------------------ */

static pv_status check_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a)
{
    const pv_op op = PV_OP_ADD_RMSNORM;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "add_rmsnorm: args is NULL");
    PV_TRY(need_supported(be, op, PV_F32));
    PV_TRY(need_positive(op, "rows", a->rows));
    PV_TRY(need_positive(op, "dim", a->dim));
    if (!(a->eps >= 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "add_rmsnorm: eps = %g must be >= 0", (double)a->eps);
    uint64_t n = 0, dim = (uint64_t)a->dim;
    PV_TRY(PRODUCT(op, "x, y and out", "rows x dim", &n, a->rows, a->dim));
    PV_TRY(need_extent(be, op, "x", a->x, a->x_off, n, 4));
    PV_TRY(need_extent(be, op, "y", a->y, a->y_off, n, 4));
    PV_TRY(need_extent(be, op, "weight", a->weight, a->weight_off, dim, 4));
    PV_TRY(need_extent(be, op, "out", a->out, a->out_off, n, 4));
    /* x and out are written while the others are still read. */
    PV_TRY(need_apart_f32(op, "x", a->x, a->x_off, n, "y", a->y, a->y_off, n));
    PV_TRY(need_apart_f32(op, "x", a->x, a->x_off, n, "weight", a->weight, a->weight_off, dim));
    PV_TRY(need_apart_f32(op, "x", a->x, a->x_off, n, "out", a->out, a->out_off, n));
    PV_TRY(need_apart_f32(op, "out", a->out, a->out_off, n, "y", a->y, a->y_off, n));
    PV_TRY(need_apart_f32(op, "out", a->out, a->out_off, n, "weight", a->weight, a->weight_off, dim));
    return PV_OK;
}

pv_status pv_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a)
{
    PV_TRY(check_add_rmsnorm(be, a));
    return be->ops->add_rmsnorm(be, a);
}

pv_status pv_rope_kv_write(pv_backend *be, const pv_rope_kv_write_args *a)
{
    const pv_op op = PV_OP_ROPE_KV_WRITE;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "rope_kv_write: args is NULL");
    PV_TRY(need_supported(be, op, a->kv_dtype));
    if (a->n_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "rope_kv_write: n_tokens = %d must be >= 0", a->n_tokens);
    PV_TRY(need_positive(op, "n_heads", a->n_heads));
    PV_TRY(need_positive(op, "n_kv_heads", a->n_kv_heads));
    PV_TRY(need_positive(op, "head_dim", a->head_dim));
    if (a->head_dim % 2)
        return pv_error(PV_ERR_INVALID_ARG, "rope_kv_write: head_dim = %d must be even", a->head_dim);
    if (!(a->base > 0.0f))
        return pv_error(PV_ERR_INVALID_ARG, "rope_kv_write: base = %g must be > 0", (double)a->base);
    if (a->n_tokens == 0)
        return PV_OK;
    PV_TRY(check_paging(op, a->n_tokens, a->token_seq, a->token_pos, a->slot_table, a->n_seqs, a->max_chunks,
                        a->chunk_tokens, a->n_slots, 0));
    uint64_t q_elems = 0, row_elems = 0, pool_elems = 0;
    PV_TRY(PRODUCT(op, "q", "n_tokens x n_heads x head_dim", &q_elems, a->n_tokens, a->n_heads, a->head_dim));
    PV_TRY(PRODUCT(op, "k and v", "n_tokens x n_kv_heads x head_dim", &row_elems, a->n_tokens, a->n_kv_heads,
                   a->head_dim));
    PV_TRY(PRODUCT(op, "kv_pool", "n_slots x 2 x chunk_tokens x n_kv_heads x head_dim", &pool_elems, a->n_slots, 2,
                   a->chunk_tokens, a->n_kv_heads, a->head_dim));
    const size_t es = pv_dtype_size(a->kv_dtype);
    PV_TRY(need_extent(be, op, "q", a->q, a->q_off, q_elems, 4));
    PV_TRY(need_extent(be, op, "k", a->k, a->k_off, row_elems, 4));
    PV_TRY(need_extent(be, op, "v", a->v, a->v_off, row_elems, 4));
    PV_TRY(need_extent(be, op, "kv_pool", a->kv_pool, 0, pool_elems, es));
    /* q and the pool are written while k and v are read. */
    const uint64_t pool_end = pool_elems * es;
    PV_TRY(need_apart_f32(op, "q", a->q, a->q_off, q_elems, "k", a->k, a->k_off, row_elems));
    PV_TRY(need_apart_f32(op, "q", a->q, a->q_off, q_elems, "v", a->v, a->v_off, row_elems));
    PV_TRY(need_apart(op, "q", a->q, a->q_off * 4, (a->q_off + q_elems) * 4, "kv_pool", a->kv_pool, 0, pool_end));
    PV_TRY(need_apart(op, "k", a->k, a->k_off * 4, (a->k_off + row_elems) * 4, "kv_pool", a->kv_pool, 0, pool_end));
    PV_TRY(need_apart(op, "v", a->v, a->v_off * 4, (a->v_off + row_elems) * 4, "kv_pool", a->kv_pool, 0, pool_end));
    const pv_kv_write_args rows = {
        .kv_dtype = a->kv_dtype, .n_tokens = a->n_tokens, .n_kv_heads = a->n_kv_heads, .head_dim = a->head_dim,
        .chunk_tokens = a->chunk_tokens, .k = a->k, .k_off = a->k_off, .v = a->v, .v_off = a->v_off,
        .kv_pool = a->kv_pool, .n_slots = a->n_slots, .token_seq = a->token_seq, .token_pos = a->token_pos,
        .slot_table = a->slot_table, .n_seqs = a->n_seqs, .max_chunks = a->max_chunks,
    };
    pv_status st = need_unique_rows(&rows);
    if (st != PV_OK)
        return qualified(st, "rope_kv_write", "its K/V write");
    return be->ops->rope_kv_write(be, a);
}

/* The checks of pv_qmatmul_swiglu; *empty = 1 when there is nothing to
 * compute. */
static pv_status check_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a, int *empty)
{
    const pv_op op = PV_OP_QMATMUL_SWIGLU;
    if (!a)
        return pv_error(PV_ERR_INVALID_ARG, "qmatmul_swiglu: args is NULL");
    PV_TRY(need_weights(be, op, a->w_type));
    const pv_qmatmul_args gate = {.w_type = a->w_type, .n_tokens = a->n_tokens, .n_in = a->n_in,
                                  .n_out = a->n_out, .w = a->w_gate, .w_off = a->w_gate_off, .x = a->x,
                                  .x_off = a->x_off, .y = a->y, .y_off = a->y_off};
    pv_qmatmul_args up = gate;
    up.w = a->w_up;
    up.w_off = a->w_up_off;
    up.y = a->up;
    up.y_off = a->up_off;
    *empty = 1;
    pv_status st = check_qmatmul(be, &gate, empty);
    if (st != PV_OK)
        return qualified(st, "qmatmul_swiglu", "the gate product (w_gate into y)");
    if ((st = check_qmatmul(be, &up, empty)) != PV_OK)
        return qualified(st, "qmatmul_swiglu", "the up product (w_up into up)");
    if (*empty)
        return PV_OK;
    /* Each product's own output and weights are checked above; here the
     * other's. The sizes fit: check_qmatmul checked their products. */
    const uint64_t out_elems = (uint64_t)a->n_tokens * (uint64_t)a->n_out;
    PV_TRY(need_apart_f32(op, "y", a->y, a->y_off, out_elems, "up", a->up, a->up_off, out_elems));
    PV_TRY(need_apart(op, "y", a->y, a->y_off * 4, (a->y_off + out_elems) * 4, "w_up", a->w_up, 0, a->w_up->bytes));
    PV_TRY(need_apart(op, "up", a->up, a->up_off * 4, (a->up_off + out_elems) * 4, "w_gate", a->w_gate, 0,
                      a->w_gate->bytes));
    return PV_OK;
}

pv_status pv_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a)
{
    int empty = 1;
    PV_TRY(check_swiglu(be, a, &empty));
    return empty ? PV_OK : be->ops->qmatmul_swiglu(be, a);
}

/* Product i of a fused op reads its first part's output (out, rows x
 * cols), whole. */
static pv_status need_fed(const char *op, const char *producer, const pv_buffer *out, uint64_t out_off, int64_t rows,
                          int64_t cols, int i, const pv_buffer *x, uint64_t x_off, int64_t n_tokens, int64_t n_in)
{
    if (x == out && x_off == out_off && n_tokens == rows && n_in == cols)
        return PV_OK;
    return pv_error(PV_ERR_INVALID_ARG,
                    "%s: product %d reads x %s at offset %" PRIu64 ", %" PRId64 " x %" PRId64
                    ", not the %s's out at offset %" PRIu64 ", %" PRId64 " x %" PRId64,
                    op, i, x == out ? "(the same buffer)" : "(another buffer)", x_off, n_tokens, n_in, producer,
                    out_off, rows, cols);
}

static pv_status need_fed_by_norm(const char *op, const pv_add_rmsnorm_args *norm, int i, const pv_buffer *x,
                                  uint64_t x_off, int64_t n_tokens, int64_t n_in)
{
    return need_fed(op, "norm", norm->out, norm->out_off, norm->rows, norm->dim, i, x, x_off, n_tokens, n_in);
}

pv_status pv_add_rmsnorm_group(pv_backend *be, const pv_add_rmsnorm_args *norm, const pv_qmatmul_args *products,
                               int n)
{
    static const char op[] = "add_rmsnorm_group";
    pv_status st = check_add_rmsnorm(be, norm);
    if (st != PV_OK)
        return qualified(st, op, "its norm");
    int empty = 1;
    if ((st = check_group(be, products, n, &empty)) != PV_OK)
        return qualified(st, op, "its products");
    for (int i = 0; i < n; i++)
        PV_TRY(need_fed_by_norm(op, norm, i, products[i].x, products[i].x_off, products[i].n_tokens,
                                products[i].n_in));
    if (be->ops->add_rmsnorm_group)
        return be->ops->add_rmsnorm_group(be, norm, products, n);
    PV_TRY(be->ops->add_rmsnorm(be, norm));
    return run_group(be, products, n);
}

pv_status pv_add_rmsnorm_swiglu(pv_backend *be, const pv_add_rmsnorm_args *norm,
                                const pv_qmatmul_swiglu_args *swiglu)
{
    static const char op[] = "add_rmsnorm_swiglu";
    pv_status st = check_add_rmsnorm(be, norm);
    if (st != PV_OK)
        return qualified(st, op, "its norm");
    int empty = 1;
    if ((st = check_swiglu(be, swiglu, &empty)) != PV_OK)
        return qualified(st, op, "its SwiGLU product");
    PV_TRY(need_fed_by_norm(op, norm, 0, swiglu->x, swiglu->x_off, swiglu->n_tokens, swiglu->n_in));
    if (be->ops->add_rmsnorm_swiglu)
        return be->ops->add_rmsnorm_swiglu(be, norm, swiglu);
    PV_TRY(be->ops->add_rmsnorm(be, norm));
    return be->ops->qmatmul_swiglu(be, swiglu);
}

pv_status pv_attention_qmatmul(pv_backend *be, const pv_attention_args *att, const pv_qmatmul_args *product)
{
    static const char op[] = "attention_qmatmul";
    int empty = 1, product_empty = 1;
    pv_status st = check_attention(be, att, &empty);
    if (st != PV_OK)
        return qualified(st, op, "its attention");
    if (!product)
        return pv_error(PV_ERR_INVALID_ARG, "%s: product is NULL", op);
    if ((st = check_qmatmul(be, product, &product_empty)) != PV_OK)
        return qualified(st, op, "its product");
    /* the product's sizes are checked, so n_heads x head_dim fits */
    PV_TRY(need_fed(op, "attention", att->out, att->out_off, att->n_tokens, (int64_t)att->n_heads * att->head_dim, 0,
                    product->x, product->x_off, product->n_tokens, product->n_in));
    if (empty)
        return PV_OK;
    if (be->ops->attention_qmatmul)
        return be->ops->attention_qmatmul(be, att, product);
    PV_TRY(be->ops->attention(be, att));
    return be->ops->qmatmul(be, product);
}
