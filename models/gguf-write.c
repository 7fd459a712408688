/* A small GGUF writer: metadata entries are serialised as they are added,
 * tensors are encoded into their type on add, and the image is laid out
 * (header, metadata, tensor infos, aligned data) when written. */
#include <pensieve/gguf.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pv_gguf_writer_tensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[PV_GGUF_MAX_DIMS];
    uint8_t *data;
    uint64_t n_bytes;
};

pv_status pv_gguf_writer_init(pv_gguf_writer *w, uint32_t version, uint32_t alignment)
{
    if (!w)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_writer_init: NULL writer");
    memset(w, 0, sizeof *w);
    if (version != 2 && version != 3)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: version %u, must be 2 or 3", version);
    if (alignment != 0 && (alignment & (alignment - 1)) != 0)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: alignment %u is not a power of two",
                        alignment);
    w->version = version;
    w->alignment = alignment ? alignment : PV_GGUF_DEFAULT_ALIGNMENT;
    if (alignment && alignment != PV_GGUF_DEFAULT_ALIGNMENT)
        return pv_gguf_writer_add_u32(w, "general.alignment", alignment);
    return PV_OK;
}

void pv_gguf_writer_free(pv_gguf_writer *w)
{
    if (!w)
        return;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w->kv_bytes);
    memset(w, 0, sizeof *w);
}

static pv_status reserve(pv_gguf_writer *w, uint64_t more)
{
    if (w->kv_len + more <= w->kv_cap)
        return PV_OK;
    uint64_t cap = w->kv_cap ? w->kv_cap : 256;
    while (cap < w->kv_len + more)
        cap *= 2;
    uint8_t *p = realloc(w->kv_bytes, cap);
    if (!p)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: metadata buffer of %" PRIu64 " bytes",
                        cap);
    w->kv_bytes = p;
    w->kv_cap = cap;
    return PV_OK;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static pv_status emit(pv_gguf_writer *w, uint64_t v, int n)
{
    pv_status st = reserve(w, (uint64_t)n);
    if (st != PV_OK)
        return st;
    put_le(w->kv_bytes + w->kv_len, v, n);
    w->kv_len += (uint64_t)n;
    return PV_OK;
}

static pv_status emit_string(pv_gguf_writer *w, const char *s)
{
    uint64_t len = strlen(s);
    pv_status st = emit(w, len, 8);
    if (st == PV_OK)
        st = reserve(w, len);
    if (st != PV_OK)
        return st;
    memcpy(w->kv_bytes + w->kv_len, s, len);
    w->kv_len += len;
    return PV_OK;
}

static pv_status begin_kv(pv_gguf_writer *w, const char *key, pv_gguf_type type)
{
    if (!w || !key)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL %s", w ? "key" : "writer");
    pv_status st = emit_string(w, key);
    if (st == PV_OK)
        st = emit(w, (uint64_t)type, 4);
    if (st == PV_OK)
        w->n_kv++;
    return st;
}

pv_status pv_gguf_writer_add_u32(pv_gguf_writer *w, const char *key, uint32_t value)
{
    pv_status st = begin_kv(w, key, PV_GGUF_UINT32);
    return st != PV_OK ? st : emit(w, value, 4);
}

pv_status pv_gguf_writer_add_i32(pv_gguf_writer *w, const char *key, int32_t value)
{
    pv_status st = begin_kv(w, key, PV_GGUF_INT32);
    return st != PV_OK ? st : emit(w, (uint32_t)value, 4);
}

pv_status pv_gguf_writer_add_f32(pv_gguf_writer *w, const char *key, float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    pv_status st = begin_kv(w, key, PV_GGUF_FLOAT32);
    return st != PV_OK ? st : emit(w, bits, 4);
}

pv_status pv_gguf_writer_add_bool(pv_gguf_writer *w, const char *key, int value)
{
    pv_status st = begin_kv(w, key, PV_GGUF_BOOL);
    return st != PV_OK ? st : emit(w, value ? 1 : 0, 1);
}

pv_status pv_gguf_writer_add_string(pv_gguf_writer *w, const char *key, const char *value)
{
    if (!value)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL value for '%s'", key ? key : "");
    pv_status st = begin_kv(w, key, PV_GGUF_STRING);
    return st != PV_OK ? st : emit_string(w, value);
}

pv_status pv_gguf_writer_add_strings(pv_gguf_writer *w, const char *key,
                                     const char *const *values, uint64_t count)
{
    if (!values && count)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL values for '%s'", key ? key : "");
    pv_status st = begin_kv(w, key, PV_GGUF_ARRAY);
    if (st == PV_OK)
        st = emit(w, PV_GGUF_STRING, 4);
    if (st == PV_OK)
        st = emit(w, count, 8);
    for (uint64_t i = 0; st == PV_OK && i < count; i++)
        st = emit_string(w, values[i]);
    return st;
}

pv_status pv_gguf_writer_add_i32s(pv_gguf_writer *w, const char *key,
                                  const int32_t *values, uint64_t count)
{
    if (!values && count)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL values for '%s'", key ? key : "");
    pv_status st = begin_kv(w, key, PV_GGUF_ARRAY);
    if (st == PV_OK)
        st = emit(w, PV_GGUF_INT32, 4);
    if (st == PV_OK)
        st = emit(w, count, 8);
    for (uint64_t i = 0; st == PV_OK && i < count; i++)
        st = emit(w, (uint32_t)values[i], 4);
    return st;
}

/* Checks a tensor's name and shape and appends its entry, without data;
 * *bytes is what its data takes. */
static pv_status add_entry(pv_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const uint64_t *ne, struct pv_gguf_writer_tensor **out, uint64_t *n,
                           uint64_t *bytes)
{
    if (!w || !name || !ne)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL argument for tensor '%s'",
                        name ? name : "");
    if (n_dims == 0 || n_dims > PV_GGUF_MAX_DIMS)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: tensor '%s' has %u dims, must be 1..%d",
                        name, n_dims, PV_GGUF_MAX_DIMS);
    *n = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        if (__builtin_mul_overflow(*n, ne[d], n))
            return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: tensor '%s': element count "
                            "overflows 64 bits at dim %u (%" PRIu64 ")", name, d, ne[d]);
    pv_status st = pv_ggml_row_bytes(type, *n, bytes);
    if (st != PV_OK)
        return st;
    if (w->n_tensors == w->tensors_cap) {
        uint64_t cap = w->tensors_cap ? w->tensors_cap * 2 : 16;
        struct pv_gguf_writer_tensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: table of %" PRIu64 " tensors", cap);
        w->tensors = p;
        w->tensors_cap = cap;
    }
    struct pv_gguf_writer_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: name of tensor '%s'", name);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->n_bytes = *bytes;
    *out = t;
    return PV_OK;
}

pv_status pv_gguf_writer_add_tensor(pv_gguf_writer *w, const char *name, uint32_t type,
                                    uint32_t n_dims, const uint64_t *ne, const float *values)
{
    if (!values)
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: NULL values for tensor '%s'",
                        name ? name : "");
    struct pv_gguf_writer_tensor *t;
    uint64_t n, bytes;
    pv_status st = add_entry(w, name, type, n_dims, ne, &t, &n, &bytes);
    if (st != PV_OK)
        return st;
    if (!(t->data = malloc(bytes ? bytes : 1))) {
        free(t->name);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: tensor '%s' of %" PRIu64 " bytes",
                        name, bytes);
    }
    if ((st = pv_ggml_quantize(type, values, n, t->data, bytes)) != PV_OK) {
        free(t->name);
        free(t->data);
        return st;
    }
    w->n_tensors++;
    return PV_OK;
}

pv_status pv_gguf_writer_add_tensor_info(pv_gguf_writer *w, const char *name, uint32_t type,
                                         uint32_t n_dims, const uint64_t *ne)
{
    struct pv_gguf_writer_tensor *t;
    uint64_t n, bytes;
    pv_status st = add_entry(w, name, type, n_dims, ne, &t, &n, &bytes);
    if (st == PV_OK)
        w->n_tensors++;
    return st;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* Where the data section starts and where the file ends. */
static pv_status layout(const pv_gguf_writer *w, uint64_t *data_start, uint64_t *total)
{
    uint64_t info_bytes = 0, data_bytes = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const struct pv_gguf_writer_tensor *t = &w->tensors[i];
        info_bytes += 8 + strlen(t->name) + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        data_bytes = align_up(data_bytes, w->alignment);
        if (__builtin_add_overflow(data_bytes, t->n_bytes, &data_bytes))
            return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: data past tensor '%s' overflows "
                            "64 bits", t->name);
    }
    uint64_t header = 4 + 4 + 8 + 8;
    *data_start = align_up(header + w->kv_len + info_bytes, w->alignment);
    *total = header + w->kv_len;
    if (w->n_tensors && __builtin_add_overflow(*data_start, data_bytes, total))
        return pv_error(PV_ERR_INVALID_ARG, "GGUF writer: file size overflows 64 bits");
    return PV_OK;
}

/* Header, metadata and tensor infos into img (zeroed, at least data_start
 * long); tensor i's data offset (from data_start) into offsets[i] when
 * offsets is not NULL. */
static void write_head(const pv_gguf_writer *w, uint8_t *img, uint64_t *offsets)
{
    uint8_t *p = img;
    memcpy(p, "GGUF", 4);
    put_le(p + 4, w->version, 4);
    put_le(p + 8, w->n_tensors, 8);
    put_le(p + 16, w->n_kv, 8);
    p += 24;
    if (w->kv_len)
        memcpy(p, w->kv_bytes, w->kv_len);
    p += w->kv_len;
    uint64_t offset = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const struct pv_gguf_writer_tensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name);
        put_le(p, len, 8);
        memcpy(p + 8, t->name, len);
        p += 8 + len;
        put_le(p, t->n_dims, 4);
        p += 4;
        for (uint32_t d = 0; d < t->n_dims; d++, p += 8)
            put_le(p, t->ne[d], 8);
        put_le(p, t->type, 4);
        offset = align_up(offset, w->alignment);
        put_le(p + 4, offset, 8);
        p += 12;
        if (offsets)
            offsets[i] = offset;
        offset += t->n_bytes;
    }
}

pv_status pv_gguf_writer_head(const pv_gguf_writer *w, uint8_t **head, uint64_t *head_size,
                              uint64_t *offsets, uint64_t *file_size)
{
    if (!w || !head || !head_size || !offsets || !file_size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_writer_head: NULL argument");
    uint64_t data_start, total;
    pv_status st = layout(w, &data_start, &total);
    if (st != PV_OK)
        return st;
    uint8_t *img = calloc(data_start, 1);
    if (!img)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: head of %" PRIu64 " bytes",
                        data_start);
    write_head(w, img, offsets);
    *head = img;
    *head_size = data_start;
    *file_size = total;
    return PV_OK;
}

pv_status pv_gguf_writer_to_memory(const pv_gguf_writer *w, uint8_t **out, uint64_t *size)
{
    if (!w || !out || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_writer_to_memory: NULL argument");
    uint64_t data_start, total;
    pv_status st = layout(w, &data_start, &total);
    if (st != PV_OK)
        return st;
    uint64_t *offsets = malloc((w->n_tensors ? w->n_tensors : 1) * sizeof *offsets);
    uint8_t *img = total <= SIZE_MAX ? calloc(total, 1) : NULL;
    if (!img || !offsets) {
        free(img);
        free(offsets);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "GGUF writer: image of %" PRIu64 " bytes", total);
    }
    write_head(w, img, offsets);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].data)
            memcpy(img + data_start + offsets[i], w->tensors[i].data, w->tensors[i].n_bytes);
    free(offsets);
    *out = img;
    *size = total;
    return PV_OK;
}

pv_status pv_gguf_writer_write(const pv_gguf_writer *w, const char *path)
{
    if (!path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_writer_write: NULL path");
    uint8_t *img;
    uint64_t size;
    pv_status st = pv_gguf_writer_to_memory(w, &img, &size);
    if (st != PV_OK)
        return st;
    FILE *f = fopen(path, "wb");
    if (!f) {
        st = pv_error(PV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        free(img);
        return st;
    }
    size_t written = fwrite(img, 1, (size_t)size, f);
    int close_failed = fclose(f) != 0;
    free(img);
    if (written != size || close_failed)
        return pv_error(PV_ERR_IO, "%s: wrote %zu of %" PRIu64 " bytes", path, written, size);
    return PV_OK;
}
