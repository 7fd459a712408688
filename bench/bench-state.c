/* Saving and restoring sessions (--state-dir): MB/s of a save (copy out on
 * the engine's thread, encode with checksums, write, fsync, rename) and of
 * a restore (read, check, import into the host tier), each against a plain
 * sequential write (with fsync) or read of the same number of bytes in one
 * file, measured in the same run. Reads are cold: every file's pages are
 * dropped from the page cache (posix_fadvise) before it is read.
 *
 *   bench/bench-state [--model PATH] [--sessions N] [--tokens T] [--reps R]
 *                     [--dir DIR] [--kv f32|f16] [--json]
 */
#define _GNU_SOURCE
#include "bench/bench-util.h"

#include <pensieve/engine.h>
#include <pensieve/gguf.h>
#include <pensieve/llama.h>
#include <pensieve/state.h>
#include <pensieve/tokenizer.h>

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <sys/stat.h>

typedef struct opts {
    const char *model, *dir;
    int sessions, tokens, reps, json;
    pv_dtype kv;
} opts;

static int fail(const char *what, pv_status st)
{
    fprintf(stderr, "bench-state: %s: %s: %s\n", what, pv_status_str(st), pv_last_error());
    return 1;
}

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"sessions", required_argument, 0, 's'},
        {"tokens", required_argument, 0, 't'}, {"reps", required_argument, 0, 'r'},
        {"dir", required_argument, 0, 'd'},    {"kv", required_argument, 0, 'k'},
        {"json", no_argument, 0, 'j'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (opts){NULL, NULL, 16, 448, 3, 0, PV_F32};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 's': o->sessions = atoi(optarg); break;
        case 't': o->tokens = atoi(optarg); break;
        case 'r': o->reps = atoi(optarg); break;
        case 'd': o->dir = optarg; break;
        case 'k': o->kv = strcmp(optarg, "f16") == 0 ? PV_F16 : PV_F32; break;
        case 'j': o->json = 1; break;
        default:
            fprintf(c == 'h' ? stdout : stderr,
                    "usage: bench-state [--model PATH] [--sessions N] [--tokens T] [--reps R] [--dir DIR] "
                    "[--kv f32|f16] [--json]\n");
            return c == 'h' ? 1 : 2;
        }
    }
    if (o->sessions < 1 || o->tokens < 2 || o->reps < 1) {
        fprintf(stderr, "bench-state: --sessions, --reps >= 1 and --tokens >= 2\n");
        return 2;
    }
    return 0;
}

/* fn on every file of dir. */
static void each_file(const char *dir, void (*fn)(const char *path))
{
    DIR *d = opendir(dir);
    for (struct dirent *de; d && (de = readdir(d));) {
        char p[4096];
        if (de->d_name[0] != '.' && (size_t)snprintf(p, sizeof p, "%s/%s", dir, de->d_name) < sizeof p)
            fn(p);
    }
    if (d)
        closedir(d);
}

/* Drops a file's clean pages from the page cache: its next read is cold. */
static void drop_cached(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static void remove_file(const char *path)
{
    unlink(path);
}

/* One file of `bytes` bytes written in 1 MiB blocks and fsynced; seconds. */
static double plain_write(const char *path, const uint8_t *buf, uint64_t bytes)
{
    double t0 = bench_now_s();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    for (uint64_t off = 0; fd >= 0 && off < bytes;) {
        size_t n = bytes - off < (1u << 20) ? (size_t)(bytes - off) : (1u << 20);
        ssize_t w = write(fd, buf + off, n);
        if (w <= 0)
            break;
        off += (uint64_t)w;
    }
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return bench_now_s() - t0;
}

static double plain_read(const char *path, uint8_t *buf, uint64_t bytes)
{
    double t0 = bench_now_s();
    int fd = open(path, O_RDONLY);
    for (uint64_t off = 0; fd >= 0 && off < bytes;) {
        size_t n = bytes - off < (1u << 20) ? (size_t)(bytes - off) : (1u << 20);
        ssize_t r = read(fd, buf + off, n);
        if (r <= 0)
            break;
        off += (uint64_t)r;
    }
    if (fd >= 0)
        close(fd);
    return bench_now_s() - t0;
}

static pv_status make_engine(pv_engine **e, pv_backend *be, pv_llama *m, const pv_tokenizer *tok, uint64_t host)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 64ull << 20; /* most of the KV is swapped out to host, as between turns */
    cc.host_bytes = host;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    return pv_engine_init(e, be, m, tok, &cc, &ec);
}

static void on_done(void *user, pv_status st, const pv_turn_result *r)
{
    (void)r;
    *(pv_status *)user = st;
}

static pv_status export_all(pv_engine *e, void *arg)
{
    int n = *(int *)arg;
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "bench-%d", i);
        pv_session_image *img = NULL;
        pv_status st = pv_engine_session_export(e, id, 1, &img, NULL);
        pv_session_image_free(img);
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}

int main(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char path[4096], dir[4096];
    if (!o.model) {
        pv_status st = pv_default_model_path(path, sizeof path);
        if (st != PV_OK)
            return fail("default model path", st);
        o.model = path;
    }
    snprintf(dir, sizeof dir, "%s/pv-bench-state-XXXXXX", o.dir ? o.dir : "/var/tmp");
    if (!mkdtemp(dir))
        return fail(dir, PV_ERR_IO);
    pv_gguf g;
    pv_tokenizer tok;
    pv_backend *be = NULL;
    pv_llama *m = NULL;
    pv_status st = pv_gguf_init(&g, o.model);
    if (st != PV_OK)
        return fail(o.model, st);
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.kv_dtype = o.kv;
    if ((st = pv_tokenizer_init(&tok, &g)) == PV_OK && (st = pv_backend_init(&be, "cpu", 0)) == PV_OK)
        st = pv_llama_init(&m, be, &g, &lo);
    pv_gguf_free(&g);
    if (st != PV_OK)
        return fail("setup", st);
    uint64_t slot = pv_llama_slot_bytes(m);
    uint32_t layers = pv_llama_hparams_of(m)->n_layers;
    uint64_t kv_bytes = (uint64_t)o.sessions * ((uint64_t)o.tokens + 31) / 32 * layers * slot;
    uint64_t host = kv_bytes * 2 + (64ull << 20);

    /* N sessions of T tokens each, their KV kept. */
    pv_engine *e = NULL;
    if ((st = make_engine(&e, be, m, &tok, host)) != PV_OK)
        return fail("engine", st);
    int32_t *prompt = malloc((size_t)o.tokens * sizeof *prompt);
    uint64_t x = 1;
    for (int s = 0; s < o.sessions && st == PV_OK; s++) {
        for (int i = 0; i < o.tokens; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompt[i] = 100 + (int32_t)((x >> 33) % 40000);
        }
        char id[32];
        snprintf(id, sizeof id, "bench-%d", s);
        pv_turn t = {.tokens = prompt, .n_tokens = (size_t)o.tokens};
        pv_sampling_defaults(&t.sampling);
        t.sampling.max_tokens = 1;
        pv_status done = PV_OK;
        pv_turn_callbacks cb = {NULL, on_done, &done};
        if ((st = pv_engine_submit(e, id, &t, &cb, NULL)) == PV_OK && (st = pv_engine_run(e)) == PV_OK)
            st = done;
    }
    free(prompt);
    if (st != PV_OK)
        return fail("filling sessions", st);

    double *save = calloc((size_t)o.reps, sizeof(double)), *wr = calloc((size_t)o.reps, sizeof(double));
    double *rest = calloc((size_t)o.reps, sizeof(double)), *rd = calloc((size_t)o.reps, sizeof(double));
    double *copy = calloc((size_t)o.reps, sizeof(double));
    uint64_t bytes = 0, records = 0;
    char plain[4200];
    snprintf(plain, sizeof plain, "%s/plain.bin", dir);
    for (int r = 0; r < o.reps && st == PV_OK; r++) {
        each_file(dir, remove_file);
        /* The engine thread's share: copying the bytes out. */
        double t0 = bench_now_s();
        st = export_all(e, &o.sessions);
        copy[r] = bench_now_s() - t0;
        pv_state_dir_config dc = {.path = dir};
        pv_state_dir *d = NULL;
        pv_state_save_report sr;
        if (st == PV_OK && (st = pv_state_dir_open(&d, &dc, e, NULL)) == PV_OK)
            st = pv_state_dir_save_all(d, &sr);
        pv_state_dir_free(d);
        if (st != PV_OK)
            break;
        save[r] = sr.seconds;
        bytes = sr.bytes_written;
        uint8_t *buf = malloc(bytes);
        for (uint64_t i = 0; i < bytes; i++)
            buf[i] = (uint8_t)(i * 131);
        wr[r] = plain_write(plain, buf, bytes);
        each_file(dir, drop_cached);
        /* Restore into a fresh engine; then the plain read of as many bytes. */
        pv_engine *e2 = NULL;
        pv_state_restore_report rr;
        if ((st = make_engine(&e2, be, m, &tok, host)) == PV_OK &&
            (st = pv_state_dir_open(&d, &dc, e2, NULL)) == PV_OK)
            st = pv_state_dir_restore(d, &rr);
        pv_state_dir_free(d);
        pv_engine_free(e2);
        rest[r] = rr.seconds;
        records = rr.records_kept;
        if (st == PV_OK && (rr.sessions != (uint32_t)o.sessions || rr.records_dropped)) {
            fprintf(stderr, "bench-state: restored %u of %d sessions, %" PRIu64 " records dropped\n", rr.sessions,
                    o.sessions, rr.records_dropped);
            st = PV_ERR_STATE;
        }
        rd[r] = plain_read(plain, buf, bytes);
        free(buf);
    }
    each_file(dir, remove_file);
    rmdir(dir);
    pv_engine_free(e);
    pv_llama_free(m);
    pv_tokenizer_free(&tok);
    pv_backend_free(be);
    if (st != PV_OK)
        return fail("save/restore", st);
    double ms = bench_median(save, o.reps), mw = bench_median(wr, o.reps), mr = bench_median(rest, o.reps),
           mp = bench_median(rd, o.reps), mc = bench_median(copy, o.reps);
    double mb = bytes / 1e6;
    if (o.json) {
        printf("{\"sessions\": %d, \"tokens\": %d, \"kv\": \"%s\", \"bytes\": %" PRIu64 ", \"records\": %" PRIu64
               ", \"reps\": %d, \"save_mb_s\": %.1f, \"plain_write_mb_s\": %.1f, \"save_ratio\": %.3f, "
               "\"restore_mb_s\": %.1f, \"plain_read_mb_s\": %.1f, \"restore_ratio\": %.3f, "
               "\"engine_copy_ms\": %.2f}\n",
               o.sessions, o.tokens, pv_dtype_name(o.kv), bytes, records, o.reps, mb / ms, mb / mw, mw / ms,
               mb / mr, mb / mp, mp / mr, mc * 1e3);
    } else {
        printf("%d sessions x %d tokens, %s KV: %.1f MB in %d files, %" PRIu64 " chunk records; medians of %d\n",
               o.sessions, o.tokens, pv_dtype_name(o.kv), mb, o.sessions, records, o.reps);
        printf("%-34s %10s %12s %10s\n", "", "MB/s", "plain MB/s", "of plain");
        printf("%-34s %10.1f %12.1f %9.0f%%\n", "save (copy, encode, write, fsync)", mb / ms, mb / mw, 100 * mw / ms);
        printf("%-34s %10.1f %12.1f %9.0f%%\n", "restore (cold read, check, import)", mb / mr, mb / mp,
               100 * mp / mr);
        printf("engine thread's share of a save (copying the bytes out): %.1f ms for all %d sessions\n", mc * 1e3,
               o.sessions);
    }
    free(save);
    free(wr);
    free(rest);
    free(rd);
    free(copy);
    return 0;
}
