/* A state directory: one file per session (engine_state.c's format),
 * restored on start, saved in the background and on shutdown, kept under a
 * size limit by the cache policy's retention value.
 *
 * Threads: engine calls go through the engine loop when there is one; file
 * I/O runs on the caller's thread (the background saver's, or the one
 * starting or stopping the server), so the engine serves while files are
 * written. The index (which files exist, what they hold) is under mu. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <pensieve/state.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* What the directory holds for one session (or held: a tombstone after a
 * forget, so a save racing with it does not bring the file back). */
typedef struct dir_entry {
    char *id;
    uint64_t bytes;              /* 0: no file */
    double last_active_unix;
    uint64_t history_chunks;
    pv_state_record *records;    /* in the file */
    size_t n_records;
    pv_session_signature sig;    /* the engine session's when written or restored */
    uint64_t forgot_at;          /* forget sequence number, 0 if never */
    uint64_t seen_pass;          /* the last save pass that found its session live */
    struct dir_entry *next;
} dir_entry;

struct pv_state_dir {
    pv_state_dir_config cfg;
    char *path;
    pv_engine *e;
    pv_engine_loop *loop;
    pthread_mutex_t mu;
    dir_entry **buckets;
    size_t n_buckets, n_entries;
    uint64_t total_bytes;
    uint64_t forget_seq;
    uint64_t pass;
    /* background saver */
    pthread_t thread;
    pthread_cond_t wake;
    int running, stopping;
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void warn(pv_state_dir *d, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (d->cfg.warn)
        d->cfg.warn(d->cfg.warn_user, line);
    else
        fprintf(stderr, "pensieve: state: %s\n", line);
}

/* Runs fn on the engine's thread. */
static pv_status on_engine(pv_state_dir *d, pv_status (*fn)(pv_engine *e, void *arg), void *arg)
{
    return d->loop ? pv_engine_loop_call(d->loop, fn, arg) : fn(d->e, arg);
}

/* ---- the index ------------------------------------------------------------------- */

static size_t hash_id(const char *id)
{
    size_t h = 1469598103934665603ull;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return h;
}

static dir_entry *entry_find(const pv_state_dir *d, const char *id)
{
    for (dir_entry *x = d->buckets[hash_id(id) & (d->n_buckets - 1)]; x; x = x->next)
        if (strcmp(x->id, id) == 0)
            return x;
    return NULL;
}

static pv_status entry_get(pv_state_dir *d, const char *id, dir_entry **out)
{
    if ((*out = entry_find(d, id)))
        return PV_OK;
    if (d->n_entries + 1 > d->n_buckets) {
        size_t n = d->n_buckets * 2;
        dir_entry **b = calloc(n, sizeof *b);
        if (!b)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "state: index of %zu sessions", n);
        for (size_t i = 0; i < d->n_buckets; i++)
            for (dir_entry *x = d->buckets[i], *next; x; x = next) {
                next = x->next;
                x->next = b[hash_id(x->id) & (n - 1)];
                b[hash_id(x->id) & (n - 1)] = x;
            }
        free(d->buckets);
        d->buckets = b;
        d->n_buckets = n;
    }
    dir_entry *x = calloc(1, sizeof *x);
    if (!x || !(x->id = strdup(id))) {
        free(x);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "state: index entry for \"%.64s\"", id);
    }
    size_t k = hash_id(id) & (d->n_buckets - 1);
    x->next = d->buckets[k];
    d->buckets[k] = x;
    d->n_entries++;
    *out = x;
    return PV_OK;
}

/* The entry now describes img, written in bytes. */
static pv_status entry_set(pv_state_dir *d, dir_entry *x, const pv_session_image *img, uint64_t bytes,
                           const pv_session_signature *sig)
{
    pv_state_record *r = malloc((img->n_records ? img->n_records : 1) * sizeof *r);
    if (!r)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "state: %zu records of \"%.64s\"", img->n_records, img->id);
    if (img->n_records)
        memcpy(r, img->records, img->n_records * sizeof *r);
    free(x->records);
    x->records = r;
    x->n_records = img->n_records;
    d->total_bytes = d->total_bytes - x->bytes + bytes;
    x->bytes = bytes;
    x->last_active_unix = img->last_active_unix;
    x->history_chunks = (img->n_history + img->ident.chunk_tokens - 1) / img->ident.chunk_tokens;
    x->sig = *sig;
    return PV_OK;
}

static void entry_clear_file(pv_state_dir *d, dir_entry *x)
{
    d->total_bytes -= x->bytes;
    x->bytes = 0;
    free(x->records);
    x->records = NULL;
    x->n_records = 0;
    x->sig = (pv_session_signature){0, 0, 0};
}

static int file_path(const pv_state_dir *d, const char *id, char *path, size_t cap)
{
    char name[300];
    if (pv_state_file_name(id, name, sizeof name) != PV_OK)
        return 0;
    return (size_t)snprintf(path, cap, "%s/%s", d->path, name) < cap;
}

/* ---- open and free ---------------------------------------------------------------- */

pv_status pv_state_dir_open(pv_state_dir **out, const pv_state_dir_config *cfg, pv_engine *e,
                            pv_engine_loop *loop)
{
    if (!out || !cfg || !cfg->path || !e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_open: NULL argument");
    *out = NULL;
    if (!(cfg->save_idle_s >= 0))
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_open: save_idle_s %g must be >= 0", cfg->save_idle_s);
    if (mkdir(cfg->path, 0700) != 0 && errno != EEXIST)
        return pv_error(PV_ERR_IO, "state directory %s: %s", cfg->path, strerror(errno));
    struct stat sb;
    if (stat(cfg->path, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(cfg->path, W_OK | X_OK) != 0)
        return pv_error(PV_ERR_IO, "state directory %s: not a writable directory", cfg->path);
    pv_state_dir *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(cfg->path)) || !(d->buckets = calloc(16, sizeof *d->buckets))) {
        if (d)
            free(d->path);
        free(d);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_state_dir_open: %s", cfg->path);
    }
    d->n_buckets = 16;
    d->cfg = *cfg;
    d->cfg.path = d->path;
    d->e = e;
    d->loop = loop;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->wake, NULL);
    *out = d;
    return PV_OK;
}

void pv_state_dir_free(pv_state_dir *d)
{
    if (!d)
        return;
    pv_state_dir_stop(d);
    for (size_t i = 0; i < d->n_buckets; i++)
        for (dir_entry *x = d->buckets[i], *next; x; x = next) {
            next = x->next;
            free(x->records);
            free(x->id);
            free(x);
        }
    free(d->buckets);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->wake);
    free(d->path);
    free(d);
}

/* ---- the directory's secret ---------------------------------------------------- */

#define SECRET_FILE "secret"

static pv_status read_secret(const char *path, int fd, uint8_t out[PV_STATE_SECRET_BYTES])
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return pv_error(PV_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return pv_error(PV_ERR_IO, "%s: not a regular file", path);
    /* As ssh does with keys: a secret others can read protects nothing. */
    if (sb.st_mode & 077)
        return pv_error(PV_ERR_IO, "%s: mode %03o lets others read it (chmod 600 it)", path,
                        (unsigned)(sb.st_mode & 0777));
    if (sb.st_uid != geteuid())
        return pv_error(PV_ERR_IO, "%s: owned by uid %u, not by this process (uid %u)", path,
                        (unsigned)sb.st_uid, (unsigned)geteuid());
    if (sb.st_size != PV_STATE_SECRET_BYTES)
        return pv_error(PV_ERR_FORMAT, "%s: %lld bytes, a secret is %d", path, (long long)sb.st_size,
                        PV_STATE_SECRET_BYTES);
    size_t got = 0;
    while (got < PV_STATE_SECRET_BYTES) {
        ssize_t r = read(fd, out + got, PV_STATE_SECRET_BYTES - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return pv_error(PV_ERR_IO, "%s: short read", path);
        got += (size_t)r;
    }
    return PV_OK;
}

pv_status pv_state_dir_secret(pv_state_dir *d, uint8_t out[PV_STATE_SECRET_BYTES])
{
    if (!d || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_secret: NULL argument");
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/" SECRET_FILE, d->path) >= sizeof path)
        return pv_error(PV_ERR_INVALID_ARG, "state directory name of %zu bytes is too long", strlen(d->path));
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
        if (fd >= 0) {
            pv_status st = read_secret(path, fd, out);
            close(fd);
            return st;
        }
        if (errno != ENOENT)
            return pv_error(PV_ERR_IO, "%s: %s", path, strerror(errno));
        uint8_t fresh[PV_STATE_SECRET_BYTES];
        if (getrandom(fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh)
            return pv_error(PV_ERR_IO, "getrandom: %s", strerror(errno));
        /* Written whole under another name, then linked in: a reader never
         * sees half a secret, and of two servers starting at once one
         * secret wins (the loser reads it on its second attempt). */
        char tmp[4160];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        int wfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (wfd < 0)
            return pv_error(PV_ERR_IO, "%s: %s", tmp, strerror(errno));
        pv_status st = write(wfd, fresh, sizeof fresh) == (ssize_t)sizeof fresh && fsync(wfd) == 0
                           ? PV_OK
                           : pv_error(PV_ERR_IO, "%s: write: %s", tmp, strerror(errno));
        close(wfd);
        if (st == PV_OK && link(tmp, path) != 0 && errno != EEXIST)
            st = pv_error(PV_ERR_IO, "link %s -> %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        if (st != PV_OK)
            return st;
    }
    return pv_error(PV_ERR_IO, "%s: appeared and vanished while it was being created", path);
}

void pv_state_dir_use_loop(pv_state_dir *d, pv_engine_loop *loop)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->loop = loop;
    pthread_mutex_unlock(&d->mu);
}

int pv_state_dir_saves_idle(const pv_state_dir *d)
{
    return d && d->cfg.save_idle_s > 0;
}

uint64_t pv_state_dir_bytes(const pv_state_dir *d)
{
    if (!d)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&d->mu);
    uint64_t n = d->total_bytes;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
    return n;
}

/* ---- restore ---------------------------------------------------------------------- */

typedef struct id_list {
    char **ids;
    size_t n, cap;
    double min_idle_s;       /* sessions idle at least this long (< 0: all) */
    int include_busy;        /* with a turn queued or running too */
    pv_status st;
} id_list;

static void collect_one(id_list *l, const pv_esession *s, double now)
{
    if (l->st != PV_OK || s->anonymous || (s->request && !l->include_busy))
        return;
    if (l->min_idle_s >= 0 && now - s->last_active < l->min_idle_s)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        char **grown = realloc(l->ids, cap * sizeof *grown);
        if (!grown) {
            l->st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: list of %zu sessions", cap);
            return;
        }
        l->ids = grown;
        l->cap = cap;
    }
    if (!(l->ids[l->n] = strdup(s->id)))
        l->st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: session id");
    else
        l->n++;
}

static pv_status collect_on_engine(pv_engine *e, void *arg)
{
    id_list *l = arg;
    double now = pv_engine_now(e);
    for (size_t b = 0; b < e->n_buckets; b++)
        for (const pv_esession *s = e->buckets[b]; s; s = s->next_in_bucket)
            collect_one(l, s, now);
    return l->st;
}

static void id_list_free(id_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->ids[i]);
    free(l->ids);
}


typedef struct found_file {
    char *path;
    double last_active_unix;
} found_file;

static int by_last_active(const void *a, const void *b)
{
    double x = ((const found_file *)a)->last_active_unix, y = ((const found_file *)b)->last_active_unix;
    return x < y ? -1 : x > y;
}

/* The last-active time from a file's header, or 0 when unreadable (the
 * full read reports why). */
static double peek_last_active(const char *path)
{
    unsigned char h[56];
    double t = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && read(fd, h, sizeof h) == (ssize_t)sizeof h) {
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--)
            bits = bits << 8 | h[48 + i];
        memcpy(&t, &bits, 8);
    }
    if (fd >= 0)
        close(fd);
    return t == t ? t : 0;
}

typedef struct tier_count {
    const id_list *ids;
    uint64_t kept, dropped;
} tier_count;

static pv_status count_on_engine(pv_engine *e, void *arg)
{
    tier_count *c = arg;
    for (size_t i = 0; i < c->ids->n; i++) {
        pv_session_view v;
        if (pv_cache_session_restore(e->cache, c->ids->ids[i], &v) != PV_OK)
            continue; /* stateless mode: histories only */
        c->kept += (uint64_t)v.records[PV_TIER_DEVICE] + v.records[PV_TIER_HOST];
        c->dropped += v.records[PV_TIER_DROPPED];
    }
    return PV_OK;
}

typedef struct import_call {
    const pv_session_image *img;
    pv_import_result res;
    pv_session_signature sig;
} import_call;

static pv_status import_on_engine(pv_engine *e, void *arg)
{
    import_call *c = arg;
    pv_status st = pv_engine_session_import(e, c->img, &c->res);
    if (st == PV_OK)
        /* The signature an export would give now. */
        st = pv_engine_session_export(e, c->img->id, 1, NULL, &c->sig);
    return st;
}

pv_status pv_state_dir_restore(pv_state_dir *d, pv_state_restore_report *rep)
{
    if (!d)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_restore: NULL directory");
    pv_state_restore_report local;
    if (!rep)
        rep = &local;
    memset(rep, 0, sizeof *rep);
    double t0 = wall_now();
    DIR *dir = opendir(d->path);
    if (!dir)
        return pv_error(PV_ERR_IO, "state directory %s: %s", d->path, strerror(errno));
    found_file *files = NULL;
    size_t n = 0, cap = 0;
    pv_status st = PV_OK;
    for (struct dirent *de; (de = readdir(dir)) && st == PV_OK;) {
        const char *name = de->d_name;
        size_t len = strlen(name);
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", d->path, name) >= sizeof path)
            continue;
        if (strstr(name, ".pvs.tmp.")) {
            /* A write that never reached its rename: the old file stands. */
            unlink(path);
            continue;
        }
        if (len < 5 || strcmp(name + len - 4, ".pvs") != 0)
            continue;
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            /* A FIFO would block the start, a link leads out of the
             * directory: only regular files are state. */
            rep->skipped++;
            warn(d, "skipped %s: not a regular file", path);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            found_file *grown = realloc(files, cap * sizeof *files);
            if (!grown) {
                st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: list of %zu files", cap);
                break;
            }
            files = grown;
        }
        if (!(files[n].path = strdup(path))) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: file name");
            break;
        }
        files[n++].last_active_unix = peek_last_active(path);
    }
    closedir(dir);
    /* Least recently active first: the most recent are imported last and
     * take host room from older ones when it runs short. */
    if (st == PV_OK && n > 1)
        qsort(files, n, sizeof *files, by_last_active);
    pv_state_identity ident;
    pv_engine_state_identity(d->e, &ident);
    id_list restored = {.min_idle_s = -1};
    for (size_t i = 0; i < n && st == PV_OK; i++) {
        pv_session_image *img = NULL;
        pv_status rs = pv_session_image_read(files[i].path, &ident, &img);
        char want[4096];
        if (rs == PV_OK && (!file_path(d, img->id, want, sizeof want) || strcmp(want, files[i].path) != 0))
            rs = pv_error(PV_ERR_FORMAT, "%s: holds session \"%.64s\", whose file is %s", files[i].path, img->id,
                          want);
        import_call c = {img, {0, 0}, {0, 0, 0}};
        if (rs == PV_OK)
            rs = on_engine(d, import_on_engine, &c);
        if (rs == PV_OK) {
            struct stat sb;
            uint64_t bytes = stat(files[i].path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
            pthread_mutex_lock(&d->mu);
            dir_entry *x;
            rs = entry_get(d, img->id, &x);
            if (rs == PV_OK) {
                /* The file may hold more than the engine kept: it stays
                 * current until the session changes. */
                c.sig.records = img->n_records;
                rs = entry_set(d, x, img, bytes, &c.sig);
            }
            pthread_mutex_unlock(&d->mu);
            if (rs == PV_OK) {
                rep->sessions++;
                rep->bytes_read += bytes;
                if (restored.n == restored.cap) {
                    size_t grow_to = restored.cap ? 2 * restored.cap : 64;
                    char **grown = realloc(restored.ids, grow_to * sizeof *grown);
                    if (grown) {
                        restored.ids = grown;
                        restored.cap = grow_to;
                    }
                }
                if (restored.n < restored.cap && (restored.ids[restored.n] = strdup(img->id)))
                    restored.n++;
            } else {
                st = rs; /* out of memory for the index: stop */
            }
        } else if (rs == PV_ERR_FORMAT || rs == PV_ERR_IO || rs == PV_ERR_BUSY) {
            rep->skipped++;
            warn(d, "skipped %s: %s", files[i].path, pv_last_error());
        } else {
            st = rs;
        }
        pv_session_image_free(img);
    }
    for (size_t i = 0; i < n; i++)
        free(files[i].path);
    free(files);
    /* Later imports take room from earlier ones: count where the chunks
     * ended up. */
    tier_count tc = {&restored, 0, 0};
    if (st == PV_OK)
        st = on_engine(d, count_on_engine, &tc);
    rep->records_kept = tc.kept;
    rep->records_dropped = tc.dropped;
    id_list_free(&restored);
    rep->seconds = wall_now() - t0;
    return st;
}

/* ---- saving ----------------------------------------------------------------------- */

typedef struct export_call {
    const char *id;
    int with_device;
    pv_session_signature known;
    int have_known;
    pv_session_image *img;
    pv_session_signature sig;
} export_call;

static pv_status export_on_engine(pv_engine *e, void *arg)
{
    export_call *c = arg;
    pv_session_signature now;
    pv_status st = pv_engine_session_export(e, c->id, c->with_device, NULL, &now);
    if (st != PV_OK)
        return st;
    c->sig = now;
    /* The file holds all an export would write (it may hold more: chunks
     * dropped from memory since are still good on disk). */
    if (c->have_known && now.turns == c->known.turns && now.tokens == c->known.tokens &&
        now.records <= c->known.records)
        return PV_OK;
    return pv_engine_session_export(e, c->id, c->with_device, &c->img, &c->sig);
}

/* Saves one session unless its file is current; *written 1 when it wrote. */
static pv_status save_one(pv_state_dir *d, const char *id, int with_device, pv_state_save_report *rep)
{
    export_call c = {.id = id, .with_device = with_device};
    pthread_mutex_lock(&d->mu);
    dir_entry *x = entry_find(d, id);
    uint64_t seq = d->forget_seq;
    if (x && x->bytes) {
        c.known = x->sig;
        c.have_known = 1;
    }
    pthread_mutex_unlock(&d->mu);
    pv_status st = on_engine(d, export_on_engine, &c);
    if (st == PV_ERR_NOT_FOUND || st == PV_ERR_BUSY)
        return PV_OK; /* ended or busy again since listed: next pass */
    if (st != PV_OK)
        return st;
    if (!c.img) {
        rep->current++;
        return PV_OK;
    }
    /* Under mu: a forget of this session meanwhile wins over the write. */
    pthread_mutex_lock(&d->mu);
    x = entry_find(d, id);
    if (x && x->forgot_at > seq) {
        pthread_mutex_unlock(&d->mu);
        pv_session_image_free(c.img);
        return PV_OK;
    }
    uint64_t bytes = 0;
    st = pv_session_image_write(c.img, d->path, &bytes);
    if (st == PV_OK && (st = entry_get(d, id, &x)) == PV_OK)
        st = entry_set(d, x, c.img, bytes, &c.sig);
    pthread_mutex_unlock(&d->mu);
    pv_session_image_free(c.img);
    if (st == PV_ERR_IO) {
        rep->failed++;
        warn(d, "saving session \"%.64s\": %s", id, pv_last_error());
        return PV_OK;
    }
    if (st == PV_OK) {
        rep->sessions++;
        rep->bytes_written += bytes;
    }
    return st;
}

/* Files of sessions the engine no longer has (ended by a timeout or
 * DELETE) go: a restart must not bring them back. */
static void remove_stale(pv_state_dir *d, const id_list *live)
{
    pthread_mutex_lock(&d->mu);
    uint64_t pass = ++d->pass;
    for (size_t i = 0; i < live->n; i++) {
        dir_entry *x = entry_find(d, live->ids[i]);
        if (x)
            x->seen_pass = pass;
    }
    for (size_t b = 0; b < d->n_buckets; b++)
        for (dir_entry *x = d->buckets[b]; x; x = x->next) {
            char path[4096];
            if (x->bytes && x->seen_pass != pass && file_path(d, x->id, path, sizeof path) &&
                (unlink(path) == 0 || errno == ENOENT))
                entry_clear_file(d, x);
        }
    pthread_mutex_unlock(&d->mu);
}

static pv_status enforce_limit(pv_state_dir *d);

static pv_status save_pass(pv_state_dir *d, double min_idle_s, int with_device, pv_state_save_report *rep)
{
    pv_state_save_report local;
    if (!rep)
        rep = &local;
    memset(rep, 0, sizeof *rep);
    double t0 = wall_now();
    id_list l = {.min_idle_s = min_idle_s};
    pv_status st = on_engine(d, collect_on_engine, &l);
    for (size_t i = 0; i < l.n && st == PV_OK; i++)
        st = save_one(d, l.ids[i], with_device, rep);
    id_list_free(&l);
    if (st == PV_OK) {
        /* Every live session, busy ones included, for the stale check. */
        id_list all = {.min_idle_s = -1, .include_busy = 1};
        st = on_engine(d, collect_on_engine, &all);
        if (st == PV_OK)
            remove_stale(d, &all);
        id_list_free(&all);
    }
    if (st == PV_OK)
        st = enforce_limit(d);
    rep->seconds = wall_now() - t0;
    return st;
}

pv_status pv_state_dir_save_all(pv_state_dir *d, pv_state_save_report *rep)
{
    if (!d)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_save_all: NULL directory");
    return save_pass(d, 0, 1, rep);
}

pv_status pv_state_dir_save_idle(pv_state_dir *d, pv_state_save_report *rep)
{
    if (!d)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_save_idle: NULL directory");
    /* Device chunks too: a session idle on the device (no memory pressure
     * moved it) would otherwise have no KV on disk until shutdown, and a
     * crash would lose it. */
    return save_pass(d, d->cfg.save_idle_s, 1, rep);
}

pv_status pv_state_dir_forget(pv_state_dir *d, const char *session)
{
    if (!d || !session)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_forget: NULL argument");
    pv_status st = PV_OK;
    char path[4096];
    pthread_mutex_lock(&d->mu);
    dir_entry *x;
    if ((st = entry_get(d, session, &x)) == PV_OK) {
        x->forgot_at = ++d->forget_seq;
        if (file_path(d, session, path, sizeof path) && unlink(path) != 0 && errno != ENOENT)
            st = pv_error(PV_ERR_IO, "%s: %s", path, strerror(errno));
        else
            entry_clear_file(d, x);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* ---- the size limit ----------------------------------------------------------------- */

typedef struct candidate {
    dir_entry *x;
    size_t record;
    double value;
} candidate;

static int by_value(const void *a, const void *b)
{
    const candidate *p = a, *q = b;
    if (p->value != q->value)
        return p->value < q->value ? -1 : 1;
    const pv_state_record *r = &p->x->records[p->record], *s = &q->x->records[q->record];
    if (r->chunk != s->chunk)
        return r->chunk < s->chunk ? -1 : 1;
    if (r->layer != s->layer)
        return r->layer > s->layer ? -1 : 1; /* later layers go first, as in the cache */
    return strcmp(p->x->id, q->x->id);
}

/* Rewrites x's file without the records flagged in drop. */
static pv_status rewrite_without(pv_state_dir *d, dir_entry *x, const unsigned char *drop)
{
    char path[4096];
    if (!file_path(d, x->id, path, sizeof path))
        return pv_error(PV_ERR_IO, "state: no file name for \"%.64s\"", x->id);
    pv_state_identity ident;
    pv_engine_state_identity(d->e, &ident);
    pv_session_image *img;
    pv_status st = pv_session_image_read(path, &ident, &img);
    if (st != PV_OK)
        return st;
    if (img->n_records != x->n_records) {
        pv_session_image_free(img);
        return pv_error(PV_ERR_STATE, "%s: %zu records, the index says %zu", path, img->n_records, x->n_records);
    }
    size_t kept = 0;
    for (size_t i = 0; i < img->n_records; i++)
        if (!drop[i]) {
            img->records[kept] = img->records[i];
            memmove(img->kv + kept * ident.slot_bytes, img->kv + i * ident.slot_bytes, ident.slot_bytes);
            kept++;
        }
    img->n_records = kept;
    uint64_t bytes;
    if ((st = pv_session_image_write(img, d->path, &bytes)) == PV_OK)
        /* The session's signature stays: until it changes, the smaller
         * file counts as current and is not written again whole. */
        st = entry_set(d, x, img, bytes, &x->sig);
    pv_session_image_free(img);
    return st;
}

/* Over the limit: chunk records of lowest retention value go first (the
 * cache policy's cost over the idle time since the session was last
 * active), then, if the tokens alone are still too many, whole files of the
 * longest idle sessions. */
static pv_status enforce_limit(pv_state_dir *d)
{
    if (!d->cfg.max_bytes)
        return PV_OK;
    pv_status st = PV_OK;
    pthread_mutex_lock(&d->mu);
    if (d->total_bytes <= d->cfg.max_bytes) {
        pthread_mutex_unlock(&d->mu);
        return PV_OK;
    }
    const double now = wall_now();
    const pv_cache_config *cc = &d->e->cache_cfg;
    size_t n = 0;
    for (size_t b = 0; b < d->n_buckets; b++)
        for (dir_entry *x = d->buckets[b]; x; x = x->next)
            n += x->bytes ? x->n_records : 0;
    candidate *c = malloc((n ? n : 1) * sizeof *c);
    unsigned char **drops = NULL;
    dir_entry **touched = NULL;
    size_t n_touched = 0;
    if (!c) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: %zu records to rank", n);
        goto out;
    }
    n = 0;
    for (size_t b = 0; b < d->n_buckets; b++)
        for (dir_entry *x = d->buckets[b]; x; x = x->next) {
            if (!x->bytes)
                continue;
            double idle = now - x->last_active_unix;
            if (!(idle > 1e-3))
                idle = 1e-3;
            for (size_t i = 0; i < x->n_records; i++)
                c[n++] = (candidate){x, i,
                                     pv_cache_policy_cost(cc, x->records[i].chunk, x->records[i].layer,
                                                          (uint32_t)x->history_chunks) / idle};
        }
    qsort(c, n, sizeof *c, by_value);
    const uint64_t per_record = d->e->slot_bytes + 16;
    uint64_t over = d->total_bytes - d->cfg.max_bytes, freed = 0;
    size_t take = 0;
    while (take < n && freed < over) {
        freed += per_record;
        take++;
    }
    /* Flags per file, in the order files first appear among the victims. */
    drops = calloc(take ? take : 1, sizeof *drops);
    touched = calloc(take ? take : 1, sizeof *touched);
    if (!drops || !touched) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: %zu records to drop", take);
        goto out;
    }
    for (size_t i = 0; i < take && st == PV_OK; i++) {
        size_t k = 0;
        while (k < n_touched && touched[k] != c[i].x)
            k++;
        if (k == n_touched) {
            touched[k] = c[i].x;
            if (!(drops[k] = calloc(c[i].x->n_records, 1)))
                st = pv_error(PV_ERR_OUT_OF_MEMORY, "state: drop flags");
            n_touched++;
        }
        if (st == PV_OK)
            drops[k][c[i].record] = 1;
    }
    for (size_t k = 0; k < n_touched && st == PV_OK; k++) {
        pv_status rs = rewrite_without(d, touched[k], drops[k]);
        if (rs != PV_OK && rs != PV_ERR_OUT_OF_MEMORY) {
            warn(d, "size limit: rewriting \"%.64s\": %s", touched[k]->id, pv_last_error());
            rs = PV_OK;
        }
        st = rs;
    }
    /* Tokens alone over the limit: the longest idle sessions' files go. */
    while (st == PV_OK && d->total_bytes > d->cfg.max_bytes) {
        dir_entry *oldest = NULL;
        for (size_t b = 0; b < d->n_buckets; b++)
            for (dir_entry *x = d->buckets[b]; x; x = x->next)
                if (x->bytes && (!oldest || x->last_active_unix < oldest->last_active_unix))
                    oldest = x;
        char path[4096];
        if (!oldest || !file_path(d, oldest->id, path, sizeof path))
            break;
        if (unlink(path) != 0 && errno != ENOENT) {
            warn(d, "size limit: %s: %s", path, strerror(errno));
            break;
        }
        warn(d, "size limit: removed session \"%.64s\" (%" PRIu64 " bytes over %" PRIu64 ")", oldest->id,
             d->total_bytes - d->cfg.max_bytes, d->cfg.max_bytes);
        entry_clear_file(d, oldest);
    }
out:
    for (size_t k = 0; drops && k < n_touched; k++)
        free(drops[k]);
    free(drops);
    free(touched);
    free(c);
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* ---- the background saver ----------------------------------------------------------- */

static void *saver_main(void *arg)
{
    pv_state_dir *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&d->wake, &d->mu, &until);
        if (d->stopping)
            break;
        pthread_mutex_unlock(&d->mu);
        pv_state_save_report rep;
        if (pv_state_dir_save_idle(d, &rep) != PV_OK)
            warn(d, "background save: %s", pv_last_error());
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

pv_status pv_state_dir_start(pv_state_dir *d)
{
    if (!d)
        return pv_error(PV_ERR_INVALID_ARG, "pv_state_dir_start: NULL directory");
    if (!d->loop || !(d->cfg.save_idle_s > 0))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_state_dir_start: background saves need an engine loop and save_idle_s > 0 (%g)",
                        d->cfg.save_idle_s);
    if (d->running)
        return PV_OK;
    d->stopping = 0;
    if (pthread_create(&d->thread, NULL, saver_main, d) != 0)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_state_dir_start: cannot start a thread");
    d->running = 1;
    return PV_OK;
}

void pv_state_dir_stop(pv_state_dir *d)
{
    if (!d || !d->running)
        return;
    pthread_mutex_lock(&d->mu);
    d->stopping = 1;
    pthread_cond_broadcast(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    d->running = 0;
}
