/* The GGUF reader: maps the file, walks the header, metadata and tensor
 * infos with a bounds-checked cursor, and answers lookups. Nothing is read
 * outside [base, base + size): every length and count is checked against
 * the bytes left before it is used. */
#include <pensieve/gguf.h>

#include "models/byte-level.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
/* Nesting limit for arrays of arrays: deeper files are rejected, not
 * recursed into without bound. */
#define MAX_ARRAY_DEPTH 4

const char *pv_gguf_type_name(pv_gguf_type type)
{
    switch (type) {
    case PV_GGUF_UINT8: return "uint8";
    case PV_GGUF_INT8: return "int8";
    case PV_GGUF_UINT16: return "uint16";
    case PV_GGUF_INT16: return "int16";
    case PV_GGUF_UINT32: return "uint32";
    case PV_GGUF_INT32: return "int32";
    case PV_GGUF_FLOAT32: return "float32";
    case PV_GGUF_BOOL: return "bool";
    case PV_GGUF_STRING: return "string";
    case PV_GGUF_ARRAY: return "array";
    case PV_GGUF_UINT64: return "uint64";
    case PV_GGUF_INT64: return "int64";
    case PV_GGUF_FLOAT64: return "float64";
    }
    return "unknown";
}

/* Size of a fixed-width scalar, 0 for STRING, ARRAY and unknown types. */
static uint64_t scalar_size(uint32_t type)
{
    switch (type) {
    case PV_GGUF_UINT8: case PV_GGUF_INT8: case PV_GGUF_BOOL: return 1;
    case PV_GGUF_UINT16: case PV_GGUF_INT16: return 2;
    case PV_GGUF_UINT32: case PV_GGUF_INT32: case PV_GGUF_FLOAT32: return 4;
    case PV_GGUF_UINT64: case PV_GGUF_INT64: case PV_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* A key or tensor name from the file, escaped for a message. */
static const char *shown(const char *name)
{
    return pv_printable(name, strlen(name));
}

/* ---- bounds-checked cursor -------------------------------------------- */

typedef struct cursor {
    const pv_gguf *g;
    uint64_t pos;
} cursor;

static pv_status truncated(const cursor *c, uint64_t need, const char *what)
{
    return pv_error(PV_ERR_FORMAT,
                    "%s: truncated or corrupt at offset %" PRIu64 ": %s needs %" PRIu64
                    " bytes, %" PRIu64 " left in the file",
                    c->g->path, c->pos, shown(what), need, c->g->size - c->pos);
}

static pv_status need(const cursor *c, uint64_t n, const char *what)
{
    if (n > c->g->size - c->pos)
        return truncated(c, n, what);
    return PV_OK;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static pv_status read_u32(cursor *c, uint32_t *out, const char *what)
{
    pv_status st = need(c, 4, what);
    if (st != PV_OK)
        return st;
    *out = (uint32_t)le(c->g->base + c->pos, 4);
    c->pos += 4;
    return PV_OK;
}

static pv_status read_u64(cursor *c, uint64_t *out, const char *what)
{
    pv_status st = need(c, 8, what);
    if (st != PV_OK)
        return st;
    *out = le(c->g->base + c->pos, 8);
    c->pos += 8;
    return PV_OK;
}

static pv_status read_string(cursor *c, const char **str, uint64_t *len, const char *what)
{
    pv_status st = read_u64(c, len, what);
    if (st != PV_OK)
        return st;
    if ((st = need(c, *len, what)) != PV_OK)
        return st;
    *str = (const char *)c->g->base + c->pos;
    c->pos += *len;
    return PV_OK;
}

static char *dup_bytes(const char *s, uint64_t len)
{
    char *d = malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

/* Skip (and bound-check) one value of `type`; arrays recurse to `depth`. */
static pv_status skip_value(cursor *c, uint32_t type, int depth, const char *key)
{
    uint64_t size = scalar_size(type);
    pv_status st;
    if (size) {
        if ((st = need(c, size, key)) != PV_OK)
            return st;
        c->pos += size;
        return PV_OK;
    }
    if (type == PV_GGUF_STRING) {
        const char *s;
        uint64_t len;
        return read_string(c, &s, &len, key);
    }
    if (type != PV_GGUF_ARRAY)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' at offset %" PRIu64 ": unknown value type %u",
                        c->g->path, shown(key), c->pos, type);
    if (depth >= MAX_ARRAY_DEPTH)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' at offset %" PRIu64
                        ": arrays nested deeper than %d", c->g->path, shown(key), c->pos,
                        MAX_ARRAY_DEPTH);
    uint32_t elem;
    uint64_t count;
    st = read_u32(c, &elem, key);
    if (st == PV_OK)
        st = read_u64(c, &count, key);
    if (st != PV_OK)
        return st;
    uint64_t esize = scalar_size(elem);
    /* Every element takes at least 8 bytes (a string or array header) or its
     * scalar size: reject impossible counts before looping over them. */
    uint64_t min_each = esize ? esize : 8;
    if (count > (c->g->size - c->pos) / min_each)
        return truncated(c, count, key);
    if (esize) {
        c->pos += count * esize;
        return PV_OK;
    }
    for (uint64_t i = 0; i < count; i++)
        if ((st = skip_value(c, elem, depth + 1, key)) != PV_OK)
            return st;
    return PV_OK;
}

static void decode_scalar(pv_gguf_kv *kv, const uint8_t *p)
{
    switch (kv->type) {
    case PV_GGUF_UINT8: case PV_GGUF_BOOL: kv->v.u64 = p[0]; break;
    case PV_GGUF_UINT16: kv->v.u64 = le(p, 2); break;
    case PV_GGUF_UINT32: kv->v.u64 = le(p, 4); break;
    case PV_GGUF_UINT64: kv->v.u64 = le(p, 8); break;
    case PV_GGUF_INT8: kv->v.i64 = (int8_t)p[0]; break;
    case PV_GGUF_INT16: kv->v.i64 = (int16_t)le(p, 2); break;
    case PV_GGUF_INT32: kv->v.i64 = (int32_t)le(p, 4); break;
    case PV_GGUF_INT64: kv->v.i64 = (int64_t)le(p, 8); break;
    case PV_GGUF_FLOAT32: {
        uint32_t bits = (uint32_t)le(p, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        kv->v.f64 = f;
        break;
    }
    case PV_GGUF_FLOAT64: {
        uint64_t bits = le(p, 8);
        memcpy(&kv->v.f64, &bits, sizeof kv->v.f64);
        break;
    }
    default: break;
    }
}

static pv_status parse_kv(cursor *c, pv_gguf_kv *kv)
{
    const char *key;
    uint64_t key_len;
    uint32_t type;
    kv->file_offset = c->pos;
    pv_status st = read_string(c, &key, &key_len, "metadata key");
    if (st != PV_OK)
        return st;
    if (!(kv->key = dup_bytes(key, key_len)))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: key of %" PRIu64 " bytes", c->g->path, key_len);
    if ((st = read_u32(c, &type, kv->key)) != PV_OK)
        return st;
    kv->type = (pv_gguf_type)type;
    uint64_t size = scalar_size(type);
    if (size) {
        if ((st = need(c, size, kv->key)) != PV_OK)
            return st;
        decode_scalar(kv, c->g->base + c->pos);
        c->pos += size;
        return PV_OK;
    }
    if (type == PV_GGUF_STRING)
        return read_string(c, &kv->str, &kv->str_len, kv->key);
    if (type != PV_GGUF_ARRAY)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' at offset %" PRIu64 ": unknown value type %u",
                        c->g->path, shown(kv->key), kv->file_offset, type);
    uint64_t start = c->pos;
    uint32_t elem;
    if ((st = read_u32(c, &elem, kv->key)) != PV_OK ||
        (st = read_u64(c, &kv->array_len, kv->key)) != PV_OK)
        return st;
    kv->array_type = (pv_gguf_type)elem;
    kv->array_data = c->g->base + c->pos;
    if (elem == PV_GGUF_STRING) {
        /* Index the strings once so element i is O(1) later. */
        if (kv->array_len > (c->g->size - c->pos) / 8)
            return truncated(c, kv->array_len * 8, kv->key);
        kv->string_offsets = malloc((kv->array_len ? kv->array_len : 1) * sizeof(uint64_t));
        if (!kv->string_offsets)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: index of %" PRIu64 " strings for '%s'",
                            c->g->path, kv->array_len, shown(kv->key));
        for (uint64_t i = 0; i < kv->array_len; i++) {
            const char *s;
            uint64_t len;
            kv->string_offsets[i] = c->pos;
            if ((st = read_string(c, &s, &len, kv->key)) != PV_OK)
                return st;
        }
        return PV_OK;
    }
    c->pos = start;
    return skip_value(c, PV_GGUF_ARRAY, 0, kv->key);
}

static pv_status parse_tensor_info(cursor *c, pv_gguf_tensor *t)
{
    const char *name;
    uint64_t name_len;
    t->info_offset = c->pos;
    pv_status st = read_string(c, &name, &name_len, "tensor name");
    if (st != PV_OK)
        return st;
    if (!(t->name = dup_bytes(name, name_len)))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tensor name of %" PRIu64 " bytes",
                        c->g->path, name_len);
    if ((st = read_u32(c, &t->n_dims, t->name)) != PV_OK)
        return st;
    if (t->n_dims == 0 || t->n_dims > PV_GGUF_MAX_DIMS)
        return pv_error(PV_ERR_FORMAT, "%s: tensor '%s' at offset %" PRIu64
                        ": %u dimensions, must be 1..%d",
                        c->g->path, shown(t->name), t->info_offset, t->n_dims, PV_GGUF_MAX_DIMS);
    t->n_elements = 1;
    for (uint32_t d = 0; d < PV_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((st = read_u64(c, &t->ne[d], t->name)) != PV_OK)
            return st;
        /* Any real tensor fits in the file, so a product above its size
         * (or an overflowing one) is corruption. */
        if (t->ne[d] == 0 || t->ne[d] > c->g->size * 8 ||
            t->n_elements > (c->g->size * 8) / t->ne[d])
            return pv_error(PV_ERR_FORMAT, "%s: tensor '%s' at offset %" PRIu64
                            ": dimension %u is %" PRIu64 ", larger than the file allows",
                            c->g->path, shown(t->name), t->info_offset, d, t->ne[d]);
        t->n_elements *= t->ne[d];
    }
    if ((st = read_u32(c, &t->type, t->name)) != PV_OK ||
        (st = read_u64(c, &t->offset, t->name)) != PV_OK)
        return st;
    uint32_t be, bb;
    if (pv_ggml_type_block(t->type, &be, &bb) != PV_OK)
        return pv_error(PV_ERR_FORMAT, "%s: tensor '%s' at offset %" PRIu64
                        ": unknown tensor type %u", c->g->path, shown(t->name), t->info_offset,
                        t->type);
    if (t->ne[0] % be != 0)
        return pv_error(PV_ERR_FORMAT, "%s: tensor '%s': row of %" PRIu64
                        " elements is not a multiple of the %s block size %u",
                        c->g->path, shown(t->name), t->ne[0], pv_ggml_type_name(t->type), be);
    t->n_bytes = t->n_elements / be * bb;
    return PV_OK;
}

/* ---- name index ---------------------------------------------------------- */

/* Keys and tensor names hashed to their entries, so that the duplicate
 * check while parsing and each lookup after it are O(1): comparing every
 * pair took 11.7 s for a file of 100k keys. Names compare as C strings. */
typedef struct name_table {
    uint64_t *slots; /* entry index + 1; 0 = empty */
    uint64_t mask;
} name_table;

struct pv_gguf_index {
    name_table keys, tensors;
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int table_init(name_table *t, uint64_t n)
{
    uint64_t size = 16;
    while (size < 2 * n)
        size *= 2;
    t->slots = calloc(size, sizeof *t->slots);
    t->mask = size - 1;
    return t->slots != NULL;
}

/* The slot holding `name`, or the empty slot where it would go. names[i]
 * is entry i's name, reached through `stride`-byte steps from `first`. */
static uint64_t *table_slot(const name_table *t, const char *name, const void *first,
                            size_t stride)
{
    for (uint64_t i = hash_name(name) & t->mask;; i = (i + 1) & t->mask) {
        uint64_t *slot = &t->slots[i];
        if (*slot == 0)
            return slot;
        const char *other = *(char *const *)((const char *)first + (*slot - 1) * stride);
        if (strcmp(other, name) == 0)
            return slot;
    }
}

static uint64_t *key_slot(const pv_gguf *g, const char *key)
{
    return table_slot(&g->index->keys, key, &g->kv[0].key, sizeof g->kv[0]);
}

static uint64_t *tensor_slot(const pv_gguf *g, const char *name)
{
    return table_slot(&g->index->tensors, name, &g->tensors[0].name, sizeof g->tensors[0]);
}

static pv_status parse(pv_gguf *g)
{
    cursor c = {g, 0};
    pv_status st;
    if (g->size < 4 || memcmp(g->base, GGUF_MAGIC, 4) != 0)
        return pv_error(PV_ERR_FORMAT, "%s: not a GGUF file (no 'GGUF' magic at offset 0)", g->path);
    c.pos = 4;
    if ((st = read_u32(&c, &g->version, "version")) != PV_OK)
        return st;
    if (g->version != 2 && g->version != 3)
        return pv_error(PV_ERR_UNSUPPORTED, "%s: GGUF version %u (0x%08x) not supported: "
                        "versions 2 and 3 are (little-endian only)",
                        g->path, g->version, g->version);
    uint64_t n_tensors, n_kv;
    if ((st = read_u64(&c, &n_tensors, "tensor count")) != PV_OK ||
        (st = read_u64(&c, &n_kv, "metadata count")) != PV_OK)
        return st;
    /* A metadata entry takes at least 13 bytes, a tensor info at least 28. */
    if (n_kv > (g->size - c.pos) / 13 || n_tensors > (g->size - c.pos) / 28)
        return pv_error(PV_ERR_FORMAT, "%s: header counts at offset 8: %" PRIu64
                        " tensors and %" PRIu64 " metadata entries cannot fit in %" PRIu64 " bytes",
                        g->path, n_tensors, n_kv, g->size);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->index = calloc(1, sizeof *g->index);
    if (!g->kv || !g->tensors || !g->index || !table_init(&g->index->keys, n_kv) ||
        !table_init(&g->index->tensors, n_tensors))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tables for %" PRIu64 " keys, %" PRIu64 " tensors",
                        g->path, n_kv, n_tensors);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = i + 1;
        if ((st = parse_kv(&c, &g->kv[i])) != PV_OK)
            return st;
        uint64_t *slot = key_slot(g, g->kv[i].key);
        if (*slot)
            return pv_error(PV_ERR_FORMAT, "%s: key '%s' at offset %" PRIu64 " appears twice "
                            "(first at offset %" PRIu64 ")", g->path, shown(g->kv[i].key),
                            g->kv[i].file_offset, g->kv[*slot - 1].file_offset);
        *slot = i + 1;
    }
    g->alignment = PV_GGUF_DEFAULT_ALIGNMENT;
    const pv_gguf_kv *align = pv_gguf_find(g, "general.alignment");
    if (align) {
        if (align->type != PV_GGUF_UINT32 || align->v.u64 == 0 ||
            (align->v.u64 & (align->v.u64 - 1)) != 0)
            return pv_error(PV_ERR_FORMAT, "%s: general.alignment at offset %" PRIu64
                            " must be a power-of-two uint32", g->path, align->file_offset);
        g->alignment = (uint32_t)align->v.u64;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = i + 1;
        if ((st = parse_tensor_info(&c, &g->tensors[i])) != PV_OK)
            return st;
    }
    uint64_t data = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data > g->size && n_tensors > 0)
        return pv_error(PV_ERR_FORMAT, "%s: data section at offset %" PRIu64
                        " lies past the end of the file (%" PRIu64 " bytes)", g->path, data, g->size);
    g->data_offset = data;
    uint64_t data_size = g->size > data ? g->size - data : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        pv_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return pv_error(PV_ERR_FORMAT, "%s: tensor '%s': data offset %" PRIu64
                            " is not a multiple of the alignment %u",
                            g->path, shown(t->name), t->offset, g->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return pv_error(PV_ERR_FORMAT, "%s: tensor '%s': %" PRIu64 " bytes at data offset %"
                            PRIu64 " (file offset %" PRIu64 ") run past the end of the file (%"
                            PRIu64 " bytes): truncated?", g->path, shown(t->name), t->n_bytes,
                            t->offset, data + t->offset, g->size);
        t->data = g->base + data + t->offset;
        uint64_t *slot = tensor_slot(g, t->name);
        if (*slot)
            return pv_error(PV_ERR_FORMAT, "%s: tensor '%s' at offset %" PRIu64 " appears twice "
                            "(first at offset %" PRIu64 ")", g->path, shown(t->name),
                            t->info_offset, g->tensors[*slot - 1].info_offset);
        *slot = i + 1;
    }
    return PV_OK;
}

pv_status pv_gguf_init_memory(pv_gguf *g, const void *data, uint64_t size)
{
    if (!g || !data)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_init_memory: NULL %s", g ? "data" : "reader");
    memset(g, 0, sizeof *g);
    g->path = dup_bytes("<memory>", 8);
    if (!g->path)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "gguf reader name");
    g->base = data;
    g->size = size;
    pv_status st = parse(g);
    if (st != PV_OK)
        pv_gguf_free(g);
    return st;
}

pv_status pv_gguf_init(pv_gguf *g, const char *path)
{
    if (!g || !path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_init: NULL %s", g ? "path" : "reader");
    memset(g, 0, sizeof *g);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return pv_error(PV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return pv_error(PV_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    /* A directory opens and fstat()s like a file; only mmap fails, with
     * "No such device". Say what is wrong instead. */
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return pv_error(PV_ERR_IO, "%s: is %s, not a GGUF file", path,
                        S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
    }
    if (sb.st_size < 24) {
        close(fd);
        return pv_error(PV_ERR_FORMAT, "%s: %lld bytes is too short for a GGUF header (24 bytes)",
                        path, (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return pv_error(PV_ERR_IO, "%s: cannot map %lld bytes: %s", path, (long long)sb.st_size,
                        strerror(e));
    g->path = dup_bytes(path, strlen(path));
    g->base = map;
    g->size = (uint64_t)sb.st_size;
    g->mapped = 1;
    if (!g->path) {
        pv_gguf_free(g);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "gguf reader name for %s", path);
    }
    pv_status st = parse(g);
    if (st != PV_OK)
        pv_gguf_free(g);
    return st;
}

/* FNV-1a, 64 bits: fast enough for the metadata and samples it covers. */
static uint64_t fnv1a(uint64_t h, const void *data, uint64_t n)
{
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#define PV_IDENTITY_SAMPLE 4096

pv_status pv_gguf_identity(const pv_gguf *g, uint64_t *out)
{
    if (!g || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_identity: NULL %s", g ? "out" : "file");
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, &g->n_tensors, sizeof g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const pv_gguf_tensor *t = &g->tensors[i];
        h = fnv1a(h, t->name, strlen(t->name) + 1);
        h = fnv1a(h, &t->n_dims, sizeof t->n_dims);
        h = fnv1a(h, t->ne, sizeof t->ne);
        h = fnv1a(h, &t->type, sizeof t->type);
        h = fnv1a(h, &t->offset, sizeof t->offset);
        /* The first bytes of every tensor: a fine-tune of the same shapes
         * changes them, and its KV is not this model's. */
        h = fnv1a(h, t->data, t->n_bytes < PV_IDENTITY_SAMPLE ? t->n_bytes : PV_IDENTITY_SAMPLE);
    }
    *out = h;
    return PV_OK;
}

void pv_gguf_free(pv_gguf *g)
{
    if (!g)
        return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].string_offsets);
    }
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    if (g->index) {
        free(g->index->keys.slots);
        free(g->index->tensors.slots);
        free(g->index);
    }
    if (g->mapped && g->base)
        munmap((void *)g->base, (size_t)g->size);
    free(g->path);
    memset(g, 0, sizeof *g);
}

/* ---- lookups ------------------------------------------------------------ */

const pv_gguf_kv *pv_gguf_find(const pv_gguf *g, const char *key)
{
    if (!g || !key || !g->index)
        return NULL;
    uint64_t slot = *key_slot(g, key);
    return slot ? &g->kv[slot - 1] : NULL;
}

static pv_status find_typed(const pv_gguf *g, const char *key, const pv_gguf_kv **out)
{
    if (!g || !key)
        return pv_error(PV_ERR_INVALID_ARG, "gguf lookup: NULL %s", g ? "key" : "reader");
    *out = pv_gguf_find(g, key);
    if (!*out)
        return pv_error(PV_ERR_NOT_FOUND, "%s: no metadata key '%s'", g->path, key);
    return PV_OK;
}

static int is_unsigned(pv_gguf_type t)
{
    return t == PV_GGUF_UINT8 || t == PV_GGUF_UINT16 || t == PV_GGUF_UINT32 ||
           t == PV_GGUF_UINT64 || t == PV_GGUF_BOOL;
}

static int is_signed(pv_gguf_type t)
{
    return t == PV_GGUF_INT8 || t == PV_GGUF_INT16 || t == PV_GGUF_INT32 || t == PV_GGUF_INT64;
}

pv_status pv_gguf_get_i64(const pv_gguf *g, const char *key, int64_t *out)
{
    const pv_gguf_kv *kv;
    pv_status st = find_typed(g, key, &kv);
    if (st != PV_OK)
        return st;
    if (is_signed(kv->type)) {
        *out = kv->v.i64;
        return PV_OK;
    }
    if (is_unsigned(kv->type) && kv->v.u64 <= INT64_MAX) {
        *out = (int64_t)kv->v.u64;
        return PV_OK;
    }
    return pv_error(PV_ERR_FORMAT, "%s: key '%s' is a %s, not an integer that fits int64",
                    g->path, key, pv_gguf_type_name(kv->type));
}

pv_status pv_gguf_get_u32(const pv_gguf *g, const char *key, uint32_t *out)
{
    int64_t v;
    pv_status st = pv_gguf_get_i64(g, key, &v);
    if (st != PV_OK)
        return st;
    if (v < 0 || v > UINT32_MAX)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' = %" PRId64 " does not fit uint32",
                        g->path, key, v);
    *out = (uint32_t)v;
    return PV_OK;
}

pv_status pv_gguf_get_f32(const pv_gguf *g, const char *key, float *out)
{
    const pv_gguf_kv *kv;
    pv_status st = find_typed(g, key, &kv);
    if (st != PV_OK)
        return st;
    if (kv->type != PV_GGUF_FLOAT32 && kv->type != PV_GGUF_FLOAT64)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' is a %s, not a float",
                        g->path, key, pv_gguf_type_name(kv->type));
    *out = (float)kv->v.f64;
    return PV_OK;
}

pv_status pv_gguf_get_bool(const pv_gguf *g, const char *key, int *out)
{
    const pv_gguf_kv *kv;
    pv_status st = find_typed(g, key, &kv);
    if (st != PV_OK)
        return st;
    if (kv->type != PV_GGUF_BOOL)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' is a %s, not a bool",
                        g->path, key, pv_gguf_type_name(kv->type));
    *out = kv->v.u64 != 0;
    return PV_OK;
}

pv_status pv_gguf_get_string(const pv_gguf *g, const char *key, const char **str, uint64_t *len)
{
    const pv_gguf_kv *kv;
    pv_status st = find_typed(g, key, &kv);
    if (st != PV_OK)
        return st;
    if (kv->type != PV_GGUF_STRING)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' is a %s, not a string",
                        g->path, key, pv_gguf_type_name(kv->type));
    *str = kv->str;
    *len = kv->str_len;
    return PV_OK;
}

pv_status pv_gguf_get_array(const pv_gguf *g, const char *key, pv_gguf_type *elem_type,
                            uint64_t *count)
{
    const pv_gguf_kv *kv;
    pv_status st = find_typed(g, key, &kv);
    if (st != PV_OK)
        return st;
    if (kv->type != PV_GGUF_ARRAY)
        return pv_error(PV_ERR_FORMAT, "%s: key '%s' is a %s, not an array",
                        g->path, key, pv_gguf_type_name(kv->type));
    if (elem_type)
        *elem_type = kv->array_type;
    if (count)
        *count = kv->array_len;
    return PV_OK;
}

static pv_status check_element(const pv_gguf_kv *kv, uint64_t i)
{
    if (!kv || kv->type != PV_GGUF_ARRAY)
        return pv_error(PV_ERR_INVALID_ARG, "array element: '%s' is not an array",
                        kv ? kv->key : "(null)");
    if (i >= kv->array_len)
        return pv_error(PV_ERR_INVALID_ARG, "array '%s': index %" PRIu64 " out of range (%" PRIu64
                        " elements)", shown(kv->key), i, kv->array_len);
    return PV_OK;
}

pv_status pv_gguf_array_int(const pv_gguf_kv *kv, uint64_t i, int64_t *out)
{
    pv_status st = check_element(kv, i);
    if (st != PV_OK)
        return st;
    pv_gguf_kv tmp = {.type = kv->array_type};
    uint64_t size = scalar_size(kv->array_type);
    if (!is_signed(tmp.type) && !is_unsigned(tmp.type))
        return pv_error(PV_ERR_FORMAT, "array '%s' holds %s, not integers", shown(kv->key),
                        pv_gguf_type_name(kv->array_type));
    decode_scalar(&tmp, kv->array_data + i * size);
    if (is_unsigned(tmp.type) && tmp.v.u64 > INT64_MAX)
        return pv_error(PV_ERR_FORMAT, "array '%s'[%" PRIu64 "] does not fit int64",
                        shown(kv->key), i);
    *out = is_signed(tmp.type) ? tmp.v.i64 : (int64_t)tmp.v.u64;
    return PV_OK;
}

pv_status pv_gguf_array_float(const pv_gguf_kv *kv, uint64_t i, double *out)
{
    pv_status st = check_element(kv, i);
    if (st != PV_OK)
        return st;
    if (kv->array_type != PV_GGUF_FLOAT32 && kv->array_type != PV_GGUF_FLOAT64)
        return pv_error(PV_ERR_FORMAT, "array '%s' holds %s, not floats", shown(kv->key),
                        pv_gguf_type_name(kv->array_type));
    pv_gguf_kv tmp = {.type = kv->array_type};
    decode_scalar(&tmp, kv->array_data + i * scalar_size(kv->array_type));
    *out = tmp.v.f64;
    return PV_OK;
}

pv_status pv_gguf_array_string(const pv_gguf_kv *kv, uint64_t i, const char **str, uint64_t *len)
{
    pv_status st = check_element(kv, i);
    if (st != PV_OK)
        return st;
    if (kv->array_type != PV_GGUF_STRING || !kv->string_offsets)
        return pv_error(PV_ERR_FORMAT, "array '%s' holds %s, not strings", shown(kv->key),
                        pv_gguf_type_name(kv->array_type));
    /* Offsets are relative to the file; array_data sits at a known file
     * offset, so rebase from the first element's position. */
    const uint8_t *p = kv->array_data + (kv->string_offsets[i] - kv->string_offsets[0]);
    *len = le(p, 8);
    *str = (const char *)p + 8;
    return PV_OK;
}

const pv_gguf_tensor *pv_gguf_find_tensor(const pv_gguf *g, const char *name)
{
    if (!g || !name || !g->index)
        return NULL;
    uint64_t slot = *tensor_slot(g, name);
    return slot ? &g->tensors[slot - 1] : NULL;
}

pv_status pv_gguf_get_tensor(const pv_gguf *g, const char *name, const pv_gguf_tensor **out)
{
    if (!g || !name || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_gguf_get_tensor: NULL argument");
    *out = pv_gguf_find_tensor(g, name);
    if (!*out)
        return pv_error(PV_ERR_NOT_FOUND, "%s: no tensor '%s'", g->path, name);
    return PV_OK;
}

static pv_status tensor_decodable(const pv_gguf_tensor *t)
{
    if (!t)
        return pv_error(PV_ERR_INVALID_ARG, "dequantise: NULL tensor");
    if (!pv_ggml_type_dequantizable(t->type))
        return pv_error(PV_ERR_UNSUPPORTED, "tensor '%s' at data offset %" PRIu64
                        ": type %s (%u) cannot be dequantised (supported: F32, F16, BF16, "
                        "Q8_0, Q4_0, Q4_1)", shown(t->name), t->offset, pv_ggml_type_name(t->type),
                        t->type);
    return PV_OK;
}

void pv_gguf_release(const pv_gguf *g)
{
    if (!g || !g->mapped || !g->base || g->data_offset >= g->size)
        return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t start = ((uintptr_t)g->base + (uintptr_t)g->data_offset + page - 1) / page * page;
    const uintptr_t end = ((uintptr_t)g->base + (uintptr_t)g->size + page - 1) / page * page;
    /* Advice on a private read-only file mapping: the pages come back
     * from the file unchanged, so a failure only keeps them resident. */
    if (end > start)
        (void)madvise((void *)start, end - start, MADV_DONTNEED);
}

pv_status pv_gguf_tensor_f32(const pv_gguf_tensor *t, float *dst, uint64_t n)
{
    pv_status st = tensor_decodable(t);
    if (st != PV_OK)
        return st;
    if (n != t->n_elements)
        return pv_error(PV_ERR_INVALID_ARG, "tensor '%s' has %" PRIu64
                        " elements, destination holds %" PRIu64, shown(t->name), t->n_elements, n);
    return pv_ggml_dequantize_f32(t->type, t->data, t->n_bytes, dst, n);
}

pv_status pv_gguf_tensor_f16(const pv_gguf_tensor *t, pv_half *dst, uint64_t n)
{
    pv_status st = tensor_decodable(t);
    if (st != PV_OK)
        return st;
    if (n != t->n_elements)
        return pv_error(PV_ERR_INVALID_ARG, "tensor '%s' has %" PRIu64
                        " elements, destination holds %" PRIu64, shown(t->name), t->n_elements, n);
    return pv_ggml_dequantize_f16(t->type, t->data, t->n_bytes, dst, n);
}

pv_status pv_gguf_tensor_rows_f32(const pv_gguf_tensor *t, uint64_t first_row,
                                  uint64_t n_rows, float *dst)
{
    pv_status st = tensor_decodable(t);
    if (st != PV_OK)
        return st;
    uint64_t total_rows = t->n_elements / t->ne[0];
    if (first_row > total_rows || n_rows > total_rows - first_row)
        return pv_error(PV_ERR_INVALID_ARG, "tensor '%s': rows %" PRIu64 "..%" PRIu64
                        " out of range (%" PRIu64 " rows)", shown(t->name), first_row,
                        first_row + n_rows, total_rows);
    uint64_t row_bytes;
    if ((st = pv_ggml_row_bytes(t->type, t->ne[0], &row_bytes)) != PV_OK)
        return st;
    const uint8_t *src = (const uint8_t *)t->data + first_row * row_bytes;
    return pv_ggml_dequantize_f32(t->type, src, n_rows * row_bytes, dst, n_rows * t->ne[0]);
}
