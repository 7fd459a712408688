/* Session images: a session's history and KV bytes copied out of the
 * engine, encoded as a file (include/pensieve/state.h), decoded with every
 * field checked, and imported into a new engine. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <pensieve/state.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define STATE_MAGIC "PVSTATE1"
#define STATE_HEADER_BYTES 96u
#define STATE_RECORD_BYTES 16u
/* Limits a file may claim before anything is allocated for it. */
#define STATE_MAX_TOKENS (1u << 28)
#define STATE_MAX_SLOT_BYTES (1ull << 30)

void pv_engine_state_identity(const pv_engine *e, pv_state_identity *out)
{
    *out = (pv_state_identity){
        .model = pv_llama_identity(e->model),
        .weights = (uint32_t)pv_llama_options_of(e->model)->weights,
        .kv_dtype = (uint32_t)e->kv_dtype,
        .chunk_tokens = e->chunk_tokens,
        .n_layers = e->n_layers,
        .slot_bytes = e->slot_bytes,
    };
}

void pv_session_image_free(pv_session_image *img)
{
    if (!img)
        return;
    free(img->id);
    free(img->history);
    free(img->pending);
    free(img->records);
    if (img->storage)
        free(img->storage); /* kv points into it */
    else
        free(img->kv);
    free(img);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t chunks_of(uint64_t tokens, uint32_t chunk_tokens)
{
    return (tokens + chunk_tokens - 1) / chunk_tokens;
}

/* ---- export ----------------------------------------------------------------------- */

/* Calls fn for each chunk record an export writes: HOST, and DEVICE when
 * with_device. Returns the count. */
static uint64_t walk_records(pv_engine *e, const pv_esession *s, int with_device,
                             void (*fn)(void *ctx, uint32_t c, uint32_t l, pv_tier tier, uint32_t slot),
                             void *ctx)
{
    if (!s->opened)
        return 0;
    uint64_t n = 0, hc = chunks_of(s->history.n, e->chunk_tokens);
    for (uint32_t c = 0; c < hc; c++)
        for (uint32_t l = 0; l < e->n_layers; l++) {
            pv_tier tier;
            uint32_t slot;
            if (pv_cache_peek(e->cache, s->id, c, l, &tier, &slot, NULL) != PV_OK)
                continue;
            if (tier == PV_TIER_HOST || (with_device && tier == PV_TIER_DEVICE)) {
                if (fn)
                    fn(ctx, c, l, tier, slot);
                n++;
            }
        }
    return n;
}

typedef struct copy_ctx {
    pv_engine *e;
    pv_session_image *img;
    size_t i;
    pv_status st;
} copy_ctx;

static void copy_record(void *ctx, uint32_t c, uint32_t l, pv_tier tier, uint32_t slot)
{
    copy_ctx *x = ctx;
    pv_engine *e = x->e;
    uint8_t *dst = x->img->kv + x->i * e->slot_bytes;
    x->img->records[x->i++] = (pv_state_record){c, l};
    if (x->st != PV_OK)
        return;
    uint64_t off;
    if (tier == PV_TIER_HOST)
        memcpy(dst, (const uint8_t *)pv_engine_host_slot(e, slot, &off)->host_ptr + off, e->slot_bytes);
    else
        x->st = pv_buffer_read(e->device_pool, (uint64_t)slot * e->slot_bytes, dst, e->slot_bytes);
}

static pv_status dup_tokens(const pv_ivec *v, int32_t **out)
{
    *out = malloc((v->n ? v->n : 1) * sizeof **out);
    if (!*out)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "session image: %zu tokens", v->n);
    if (v->n)
        memcpy(*out, v->v, v->n * sizeof **out);
    return PV_OK;
}

pv_status pv_engine_session_export(pv_engine *e, const char *session, int with_device,
                                   pv_session_image **out, pv_session_signature *sig)
{
    if (!e || !session)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_session_export: NULL argument");
    if (out)
        *out = NULL;
    pv_esession *s = pv_engine_find_session(e, session);
    if (!s || s->anonymous)
        return pv_error(PV_ERR_NOT_FOUND, "pv_engine_session_export: unknown session \"%.64s\"", session);
    if (s->request)
        return pv_error(PV_ERR_BUSY, "pv_engine_session_export: session \"%.64s\" has a turn queued or running",
                        session);
    pv_session_signature now_sig = {
        .turns = (uint32_t)s->turns,
        .tokens = s->history.n + s->pending.n,
        .records = walk_records(e, s, with_device, NULL, NULL),
    };
    if (sig)
        *sig = now_sig;
    if (!out)
        return PV_OK;
    uint64_t kv_bytes;
    if (__builtin_mul_overflow(now_sig.records, e->slot_bytes, &kv_bytes) || kv_bytes > SIZE_MAX)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_session_export: %" PRIu64 " records of %" PRIu64 " bytes",
                        now_sig.records, e->slot_bytes);
    pv_session_image *img = calloc(1, sizeof *img);
    pv_status st = img ? PV_OK : pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_session_export: image");
    if (st == PV_OK && !(img->id = strdup(session)))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_session_export: id");
    if (st == PV_OK)
        st = dup_tokens(&s->history, &img->history);
    if (st == PV_OK)
        st = dup_tokens(&s->pending, &img->pending);
    if (st == PV_OK && (!(img->records = malloc((now_sig.records ? now_sig.records : 1) * sizeof *img->records)) ||
                        !(img->kv = malloc(kv_bytes ? kv_bytes : 1))))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_session_export: %" PRIu64 " bytes of KV for \"%.64s\"",
                      kv_bytes, session);
    /* Kernels that wrote device slots must have finished before they are read. */
    if (st == PV_OK && with_device)
        st = pv_backend_finish(e->be);
    if (st != PV_OK) {
        pv_session_image_free(img);
        return st;
    }
    pv_engine_state_identity(e, &img->ident);
    img->n_history = s->history.n;
    img->n_pending = s->pending.n;
    img->turns = (uint32_t)s->turns;
    img->last_active_unix = wall_now() - (pv_engine_now(e) - s->last_active);
    copy_ctx x = {e, img, 0, PV_OK};
    walk_records(e, s, with_device, copy_record, &x);
    img->n_records = x.i;
    if (x.st != PV_OK) {
        pv_session_image_free(img);
        return x.st;
    }
    *out = img;
    return PV_OK;
}

/* ---- import ----------------------------------------------------------------------- */

static pv_status check_identity(const pv_state_identity *want, const pv_state_identity *got,
                                const char *name)
{
    if (got->model != want->model)
        return pv_error(PV_ERR_FORMAT, "%s: saved for another model (identity %016" PRIx64 ", this one %016" PRIx64 ")",
                        name, got->model, want->model);
    if (got->weights != want->weights)
        return pv_error(PV_ERR_FORMAT, "%s: saved with weights %u, this engine uses %u", name, got->weights,
                        want->weights);
    if (got->kv_dtype != want->kv_dtype || got->slot_bytes != want->slot_bytes)
        return pv_error(PV_ERR_FORMAT, "%s: KV dtype %u with %" PRIu64 "-byte slots, this engine %u with %" PRIu64,
                        name, got->kv_dtype, got->slot_bytes, want->kv_dtype, want->slot_bytes);
    if (got->chunk_tokens != want->chunk_tokens || got->n_layers != want->n_layers)
        return pv_error(PV_ERR_FORMAT, "%s: %u-token chunks over %u layers, this engine %u over %u", name,
                        got->chunk_tokens, got->n_layers, want->chunk_tokens, want->n_layers);
    return PV_OK;
}

/* Records ascending and unique, each within the history and the layers. */
static pv_status check_records(const pv_session_image *img, const char *name)
{
    uint64_t hc = chunks_of(img->n_history, img->ident.chunk_tokens);
    for (size_t i = 0; i < img->n_records; i++) {
        const pv_state_record *r = &img->records[i];
        if (r->chunk >= hc || r->layer >= img->ident.n_layers)
            return pv_error(PV_ERR_FORMAT, "%s: record %zu (chunk %u, layer %u) outside %" PRIu64 " chunks x %u layers",
                            name, i, r->chunk, r->layer, hc, img->ident.n_layers);
        if (i > 0) {
            const pv_state_record *p = &img->records[i - 1];
            if (r->chunk < p->chunk || (r->chunk == p->chunk && r->layer <= p->layer))
                return pv_error(PV_ERR_FORMAT, "%s: record %zu (chunk %u, layer %u) out of order", name, i,
                                r->chunk, r->layer);
        }
    }
    return PV_OK;
}

static pv_status check_tokens(const pv_engine *e, const int32_t *t, size_t n, const char *what,
                              const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= e->n_vocab)
            return pv_error(PV_ERR_FORMAT, "%s: %s token %zu is %d, outside the vocabulary of %u", name, what, i,
                            t[i], e->n_vocab);
    return PV_OK;
}

/* Stores one record's bytes in tier, evicting by retention value when the
 * tier is full; *kept 0 when no room could be made. */
static pv_status import_record(pv_engine *e, const char *id, pv_tier tier, uint32_t c, uint32_t l,
                               const uint8_t *bytes, int *kept)
{
    *kept = 0;
    uint32_t slot;
    pv_status st = pv_cache_store_chunk(e->cache, id, c, l, tier, &slot);
    if (st == PV_ERR_OUT_OF_MEMORY) {
        pv_cache_plan_clear(&e->scratch);
        st = pv_cache_evict_to_free(e->cache, tier, e->slot_bytes, &e->scratch);
        if (st == PV_ERR_OUT_OF_MEMORY)
            return PV_OK;
        if (st == PV_OK)
            st = pv_engine_run_plan(e, &e->scratch);
        if (st == PV_OK)
            st = pv_cache_store_chunk(e->cache, id, c, l, tier, &slot);
    }
    if (st != PV_OK)
        return st;
    uint64_t off;
    if (tier == PV_TIER_HOST)
        memcpy((uint8_t *)pv_engine_host_slot(e, slot, &off)->host_ptr + off, bytes, e->slot_bytes);
    else if ((st = pv_buffer_write(e->device_pool, (uint64_t)slot * e->slot_bytes, bytes, e->slot_bytes)) != PV_OK)
        return st;
    *kept = 1;
    return PV_OK;
}

static pv_status import_kv(pv_engine *e, pv_esession *s, const pv_session_image *img, double last_active,
                           pv_import_result *res)
{
    const char *id = s->id;
    pv_status st = pv_cache_session_open(e->cache, id);
    if (st != PV_OK)
        return st;
    s->opened = 1;
    if ((st = pv_cache_append_tokens(e->cache, id, img->history, img->n_history)) != PV_OK ||
        (st = pv_cache_session_set_active(e->cache, id, last_active)) != PV_OK)
        return st;
    const pv_tier tier = e->n_host_slots > 0 ? PV_TIER_HOST : PV_TIER_DEVICE;
    for (size_t i = 0; i < img->n_records; i++) {
        int kept;
        if ((st = import_record(e, id, tier, img->records[i].chunk, img->records[i].layer,
                                img->kv + i * e->slot_bytes, &kept)) != PV_OK)
            return st;
    }
    /* Every chunk of the history gets a record: what was not kept (or not
     * saved) is dropped, so the next turn recomputes through it. */
    const uint64_t hc = chunks_of(img->n_history, e->chunk_tokens);
    for (uint32_t c = 0; c < hc; c++)
        for (uint32_t l = 0; l < e->n_layers; l++) {
            pv_tier at;
            if ((st = pv_cache_peek(e->cache, id, c, l, &at, NULL, NULL)) != PV_OK)
                return st;
            if (at == PV_TIER_DEVICE || at == PV_TIER_HOST) {
                res->records_kept++;
            } else {
                if ((st = pv_cache_mark_dropped(e->cache, id, c, l)) != PV_OK)
                    return st;
                res->records_dropped++;
            }
        }
    /* Saving marks the session active now: its idle time is set after. */
    if ((st = pv_cache_session_save(e->cache, id, (uint32_t)img->n_history)) == PV_OK)
        st = pv_cache_session_set_active(e->cache, id, last_active);
    return st;
}

pv_status pv_engine_session_import(pv_engine *e, const pv_session_image *img, pv_import_result *res)
{
    if (!e || !img || !img->id)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_session_import: NULL argument");
    pv_import_result local = {0, 0};
    if (!res)
        res = &local;
    *res = local;
    const char *id = img->id;
    size_t id_len = strlen(id);
    if (id_len == 0 || id_len > PV_SESSION_ID_MAX || (unsigned char)id[0] == 0x1f)
        return pv_error(PV_ERR_FORMAT, "pv_engine_session_import: session id of %zu bytes (1 to %d, not "
                                       "starting with 0x1f)",
                        id_len, PV_SESSION_ID_MAX);
    pv_state_identity mine;
    pv_engine_state_identity(e, &mine);
    pv_status st = check_identity(&mine, &img->ident, id);
    if (st == PV_OK)
        st = check_records(img, id);
    if (st == PV_OK && img->n_history + img->n_pending > e->n_ctx)
        st = pv_error(PV_ERR_FORMAT, "session \"%.64s\": %zu + %zu tokens exceed the model's context of %u", id,
                      img->n_history, img->n_pending, e->n_ctx);
    if (st == PV_OK)
        st = check_tokens(e, img->history, img->n_history, "history", id);
    if (st == PV_OK)
        st = check_tokens(e, img->pending, img->n_pending, "pending", id);
    if (st != PV_OK)
        return st;
    if (pv_engine_find_session(e, id))
        return pv_error(PV_ERR_BUSY, "pv_engine_session_import: session \"%.64s\" exists already", id);
    pv_esession *s;
    if ((st = pv_engine_session_get(e, id, &s)) != PV_OK)
        return st;
    double idle = wall_now() - img->last_active_unix;
    if (!(idle >= 0) || !isfinite(idle))
        idle = 0; /* a clock set back, or a file from the future */
    double last_active = pv_engine_now(e) - idle;
    s->last_active = last_active;
    s->turns = (int)img->turns;
    if ((st = pv_ivec_append(&s->history, img->history, img->n_history)) == PV_OK)
        st = pv_ivec_append(&s->pending, img->pending, img->n_pending);
    /* Stateless mode keeps no KV between turns: the history is enough. */
    if (st == PV_OK && e->cfg.mode != PV_MODE_STATELESS && img->n_history > 0)
        st = import_kv(e, s, img, last_active, res);
    if (st != PV_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", pv_last_error());
        (void)pv_engine_forget_session(e, s);
        return pv_error(st, "%s", msg);
    }
    if (e->cfg.mode == PV_MODE_STATELESS)
        res->records_dropped = img->n_records;
    return PV_OK;
}

/* ---- files -------------------------------------------------------------------------- */

pv_status pv_state_file_name(const char *session, char *buf, size_t cap)
{
    if (!session || !buf)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_file_name: NULL argument");
    size_t n = strlen(session), shown = n <= 100 ? n : 80;
    size_t need = 2 * shown + (n > 100 ? 17 : 0) + sizeof ".pvs";
    if (cap < need)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_file_name: buffer of %zu bytes, %zu needed", cap, need);
    char *p = buf;
    for (size_t i = 0; i < shown; i++, p += 2)
        snprintf(p, 3, "%02x", (unsigned char)session[i]);
    if (n > 100) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
            h = (h ^ (unsigned char)session[i]) * 0x100000001b3ull;
        p += snprintf(p, 18, "-%016" PRIx64, h);
    }
    memcpy(p, ".pvs", sizeof ".pvs");
    return PV_OK;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static uint32_t crc(uint32_t c, const uint8_t *p, uint64_t n)
{
    /* zlib's crc32 takes 32-bit lengths. */
    while (n > 0) {
        uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = (uint32_t)crc32(c, p, part);
        p += part;
        n -= part;
    }
    return c;
}

/* Offsets of a file's parts, from its counts; 0 on overflow. */
typedef struct layout {
    uint64_t id, history, pending, table, kv, total;
} layout;

static int layout_of(uint64_t id_len, uint64_t n_history, uint64_t n_pending, uint64_t n_records,
                     uint64_t slot_bytes, layout *o)
{
    uint64_t kv_bytes;
    o->id = STATE_HEADER_BYTES;
    o->history = o->id + id_len;
    o->pending = o->history + 4 * n_history;
    o->table = o->pending + 4 * n_pending;
    if (__builtin_mul_overflow(n_records, (uint64_t)STATE_RECORD_BYTES, &o->kv) ||
        __builtin_add_overflow(o->kv, o->table, &o->kv) ||
        __builtin_mul_overflow(n_records, slot_bytes, &kv_bytes) ||
        __builtin_add_overflow(o->kv, kv_bytes, &o->total))
        return 0;
    return 1;
}

/* Everything before the KV bytes (header, id, tokens, record table with the
 * chunks' checksums) in a new buffer of lo->kv bytes: the KV bytes follow
 * it in the file as they are in the image, so a save copies them no more. */
static pv_status encode_meta(const pv_session_image *img, layout *lo, uint8_t **out)
{
    if (!img || !img->id)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_encode: NULL argument");
    uint64_t id_len = strlen(img->id);
    if (img->n_history > STATE_MAX_TOKENS || img->n_pending > STATE_MAX_TOKENS ||
        !layout_of(id_len, img->n_history, img->n_pending, img->n_records, img->ident.slot_bytes, lo) ||
        lo->total > SIZE_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_encode: session \"%.64s\" too large", img->id);
    uint8_t *f = malloc(lo->kv);
    if (!f)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_session_image_encode: %" PRIu64 " bytes", lo->kv);
    memset(f, 0, STATE_HEADER_BYTES);
    memcpy(f, STATE_MAGIC, 8);
    put32(f + 8, PV_STATE_VERSION);
    put32(f + 12, STATE_HEADER_BYTES);
    put64(f + 16, img->ident.model);
    put32(f + 24, img->ident.weights);
    put32(f + 28, img->ident.kv_dtype);
    put32(f + 32, img->ident.chunk_tokens);
    put32(f + 36, img->ident.n_layers);
    put64(f + 40, img->ident.slot_bytes);
    uint64_t t;
    memcpy(&t, &img->last_active_unix, 8);
    put64(f + 48, t);
    put32(f + 56, img->turns);
    put32(f + 60, (uint32_t)id_len);
    put64(f + 64, img->n_history);
    put64(f + 72, img->n_pending);
    put64(f + 80, img->n_records);
    memcpy(f + lo->id, img->id, id_len);
    for (size_t i = 0; i < img->n_history; i++)
        put32(f + lo->history + 4 * i, (uint32_t)img->history[i]);
    for (size_t i = 0; i < img->n_pending; i++)
        put32(f + lo->pending + 4 * i, (uint32_t)img->pending[i]);
    for (size_t i = 0; i < img->n_records; i++) {
        uint8_t *r = f + lo->table + (uint64_t)STATE_RECORD_BYTES * i;
        put32(r, img->records[i].chunk);
        put32(r + 4, img->records[i].layer);
        put32(r + 8, crc(0, img->kv + i * img->ident.slot_bytes, img->ident.slot_bytes));
        put32(r + 12, 0);
    }
    /* The header's checksum covers everything before the KV bytes. */
    put32(f + 88, crc(crc(0, f, 88), f + STATE_HEADER_BYTES, lo->kv - STATE_HEADER_BYTES));
    *out = f;
    return PV_OK;
}

pv_status pv_session_image_encode(const pv_session_image *img, uint8_t **out, size_t *size)
{
    if (!out || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_encode: NULL argument");
    layout lo;
    uint8_t *meta;
    pv_status st = encode_meta(img, &lo, &meta);
    if (st != PV_OK)
        return st;
    uint8_t *f = realloc(meta, lo.total ? lo.total : 1);
    if (!f) {
        free(meta);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_session_image_encode: %" PRIu64 " bytes", lo.total);
    }
    if (lo.total > lo.kv)
        memcpy(f + lo.kv, img->kv, lo.total - lo.kv);
    *out = f;
    *size = (size_t)lo.total;
    return PV_OK;
}

/* Decodes data; with adopt, the image takes the buffer (malloc'd) and its
 * KV bytes stay where they are in it (a restore copies them once, into the
 * host tier). */
static pv_status decode(const void *data, size_t size, const pv_state_identity *expect, const char *name,
                        int adopt, pv_session_image **out)
{
    if (!data || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_decode: NULL argument");
    if (!name)
        name = "<memory>";
    *out = NULL;
    const uint8_t *f = data;
    if (size < STATE_HEADER_BYTES || memcmp(f, STATE_MAGIC, 8) != 0)
        return pv_error(PV_ERR_FORMAT, "%s: not a session state file (%zu bytes, no \"%s\" header)", name, size,
                        STATE_MAGIC);
    uint32_t version = get32(f + 8), header = get32(f + 12);
    if (version != PV_STATE_VERSION || header != STATE_HEADER_BYTES)
        return pv_error(PV_ERR_FORMAT, "%s: format version %u with a %u-byte header; this build reads version %d (%u)",
                        name, version, header, PV_STATE_VERSION, STATE_HEADER_BYTES);
    pv_state_identity id = {
        .model = get64(f + 16), .weights = get32(f + 24), .kv_dtype = get32(f + 28),
        .chunk_tokens = get32(f + 32), .n_layers = get32(f + 36), .slot_bytes = get64(f + 40),
    };
    uint32_t id_len = get32(f + 60);
    uint64_t n_history = get64(f + 64), n_pending = get64(f + 72), n_records = get64(f + 80);
    if (id.chunk_tokens == 0 || id.n_layers == 0 || id.slot_bytes == 0 || id.slot_bytes > STATE_MAX_SLOT_BYTES)
        return pv_error(PV_ERR_FORMAT, "%s: %u-token chunks, %u layers, %" PRIu64 "-byte slots (at most %llu)", name,
                        id.chunk_tokens, id.n_layers, id.slot_bytes, STATE_MAX_SLOT_BYTES);
    if (id_len == 0 || id_len > PV_SESSION_ID_MAX || n_history > STATE_MAX_TOKENS || n_pending > STATE_MAX_TOKENS)
        return pv_error(PV_ERR_FORMAT, "%s: id of %u bytes (1 to %d), %" PRIu64 " + %" PRIu64 " tokens (at most %u each)",
                        name, id_len, PV_SESSION_ID_MAX, n_history, n_pending, STATE_MAX_TOKENS);
    uint64_t max_records;
    if (__builtin_mul_overflow(chunks_of(n_history, id.chunk_tokens), (uint64_t)id.n_layers, &max_records) ||
        n_records > max_records)
        return pv_error(PV_ERR_FORMAT, "%s: %" PRIu64 " chunk records for %" PRIu64 " tokens over %u layers", name,
                        n_records, n_history, id.n_layers);
    layout lo = {0, 0, 0, 0, 0, 0};
    if (!layout_of(id_len, n_history, n_pending, n_records, id.slot_bytes, &lo) || lo.total != size)
        return pv_error(PV_ERR_FORMAT, "%s: %zu bytes, the header describes %" PRIu64 " (truncated or corrupt)", name,
                        size, lo.total);
    if (crc(crc(0, f, 88), f + STATE_HEADER_BYTES, lo.kv - STATE_HEADER_BYTES) != get32(f + 88))
        return pv_error(PV_ERR_FORMAT, "%s: header checksum mismatch", name);
    if (get32(f + 92) != 0)
        return pv_error(PV_ERR_FORMAT, "%s: reserved header field is %u, not 0", name, get32(f + 92));
    if (memchr(f + lo.id, 0, id_len))
        return pv_error(PV_ERR_FORMAT, "%s: session id holds a NUL byte", name);
    pv_status st = expect ? check_identity(expect, &id, name) : PV_OK;
    if (st != PV_OK)
        return st;
    for (uint64_t i = 0; i < n_records; i++) {
        const uint8_t *r = f + lo.table + (uint64_t)STATE_RECORD_BYTES * i;
        if (get32(r + 12) != 0)
            return pv_error(PV_ERR_FORMAT, "%s: record %" PRIu64 ": reserved field is %u, not 0", name, i,
                            get32(r + 12));
        if (crc(0, f + lo.kv + i * id.slot_bytes, id.slot_bytes) != get32(r + 8))
            return pv_error(PV_ERR_FORMAT, "%s: chunk %u layer %u: checksum mismatch", name, get32(r), get32(r + 4));
    }
    pv_session_image *img = calloc(1, sizeof *img);
    if (!img || !(img->id = malloc(id_len + 1)) || !(img->history = malloc(4 * n_history + 4)) ||
        !(img->pending = malloc(4 * n_pending + 4)) ||
        !(img->records = malloc(n_records * sizeof *img->records + 1)) ||
        (!adopt && !(img->kv = malloc(size - lo.kv + 1)))) {
        pv_session_image_free(img);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: cannot hold a %zu-byte session image", name, size);
    }
    img->ident = id;
    uint64_t t = get64(f + 48);
    memcpy(&img->last_active_unix, &t, 8);
    img->turns = get32(f + 56);
    memcpy(img->id, f + lo.id, id_len);
    img->id[id_len] = 0;
    img->n_history = n_history;
    img->n_pending = n_pending;
    img->n_records = n_records;
    for (uint64_t i = 0; i < n_history; i++)
        img->history[i] = (int32_t)get32(f + lo.history + 4 * i);
    for (uint64_t i = 0; i < n_pending; i++)
        img->pending[i] = (int32_t)get32(f + lo.pending + 4 * i);
    for (uint64_t i = 0; i < n_records; i++) {
        const uint8_t *r = f + lo.table + (uint64_t)STATE_RECORD_BYTES * i;
        img->records[i] = (pv_state_record){get32(r), get32(r + 4)};
    }
    if (adopt) {
        img->storage = (void *)data;
        img->kv = (uint8_t *)data + lo.kv;
    } else {
        memcpy(img->kv, f + lo.kv, size - lo.kv);
    }
    if ((st = check_records(img, name)) != PV_OK) {
        if (adopt) /* the caller still owns data */
            img->storage = img->kv = NULL;
        pv_session_image_free(img);
        return st;
    }
    *out = img;
    return PV_OK;
}

pv_status pv_session_image_decode(const void *data, size_t size, const pv_state_identity *expect,
                                  const char *name, pv_session_image **out)
{
    return decode(data, size, expect, name, 0, out);
}

static pv_status write_all(int fd, const uint8_t *p, size_t n, const char *path)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return pv_error(PV_ERR_IO, "%s: write: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
    return PV_OK;
}

pv_status pv_session_image_write(const pv_session_image *img, const char *dir, uint64_t *bytes)
{
    if (!img || !img->id || !dir)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_write: NULL argument");
    char name[300], path[4096], tmp[4096];
    pv_status st = pv_state_file_name(img->id, name, sizeof name);
    if (st != PV_OK)
        return st;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path ||
        (size_t)snprintf(tmp, sizeof tmp, "%s/%s.tmp.%ld", dir, name, (long)getpid()) >= sizeof tmp)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_write: directory name of %zu bytes is too long",
                        strlen(dir));
    uint8_t *meta;
    layout lo;
    if ((st = encode_meta(img, &lo, &meta)) != PV_OK)
        return st;
    /* A crash leaves either the old file or the new one: the new bytes
     * reach the disk under a temporary name before the rename. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        free(meta);
        return pv_error(PV_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    st = write_all(fd, meta, lo.kv, tmp);
    free(meta);
    if (st == PV_OK)
        st = write_all(fd, img->kv, lo.total - lo.kv, tmp);
    if (st == PV_OK && fsync(fd) != 0)
        st = pv_error(PV_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == PV_OK)
        st = pv_error(PV_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (st == PV_OK && rename(tmp, path) != 0)
        st = pv_error(PV_ERR_IO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (st != PV_OK) {
        unlink(tmp);
        return st;
    }
    /* The rename itself reaches the disk with the directory. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        if (fsync(dfd) != 0)
            st = pv_error(PV_ERR_IO, "%s: fsync of the directory: %s", dir, strerror(errno));
        close(dfd);
    }
    if (bytes)
        *bytes = lo.total;
    return st;
}

pv_status pv_session_image_read(const char *path, const pv_state_identity *expect, pv_session_image **out)
{
    if (!path || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_session_image_read: NULL argument");
    *out = NULL;
    /* Nothing in a state directory is trusted: a FIFO must not block the
     * open, and a link must not lead elsewhere. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
        return pv_error(PV_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return pv_error(PV_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return pv_error(PV_ERR_FORMAT, "%s: %lld bytes", path, (long long)sb.st_size);
    }
    size_t size = (size_t)sb.st_size, got = 0;
    uint8_t *f = malloc(size ? size : 1);
    if (!f) {
        close(fd);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %zu bytes", path, size);
    }
    while (got < size) {
        ssize_t r = read(fd, f + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    pv_status st = got == size ? decode(f, size, expect, path, 1, out)
                               : pv_error(PV_ERR_IO, "%s: read %zu of %zu bytes", path, got, size);
    if (st != PV_OK)
        free(f);
    return st;
}
