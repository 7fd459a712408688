/* Sessions that outlive the engine (issue 14): scripted conversations on the
 * synthetic model, greedy; half the rounds run in one engine, its sessions
 * are saved to a state directory, the engine is freed, and a new engine
 * restores them and runs the other half. Every turn after the restart must
 * give the tokens stateless serving gives (the master test's reference).
 * Then: files that must be refused (truncated, bad checksum, another model,
 * another format version), single-byte corruptions never loaded, kill -9
 * during saves (every file restores to an old or a new version), the size
 * limit dropping the lowest retention values first, forget and background
 * saves. */
#include "engine-util.h"

#include <pensieve/state.h>

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N_SESSIONS 6
#define ROUNDS 4
#define HALF 2
#define N_TURNS (N_SESSIONS * ROUNDS)
#define LAYERS 4
#define CHUNK 16
#define N_CTX 512

static eu_turn turns[N_TURNS];
static eu_result ref[N_TURNS];

/* ---- helpers ------------------------------------------------------------------------ */

static pv_engine *make_engine(eu_model *m, pv_engine_mode mode, uint64_t device_slots, uint64_t host_slots,
                              pv_policy policy, pv_clock_fn clock, void *clock_ctx)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m->model);
    cc.device_bytes = device_slots * slot;
    cc.host_bytes = host_slots * slot;
    cc.policy = policy;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.token_budget = 48;
    ec.swap_out_chunks = 16;
    ec.clock = clock;
    ec.clock_ctx = clock_ctx;
    /* HOST in many segments: saving and restoring find each slot's. */
    ec.host_segment_bytes = 3 * slot;
    pv_engine *e = NULL;
    if (pv_engine_init(&e, m->be, m->model, &m->tok, &cc, &ec) != PV_OK) {
        tap_diag("engine init: %s", pv_last_error());
        return NULL;
    }
    return e;
}

/* Runs rounds [from, to) of the script; 0 when every turn completed. */
static int run_rounds(pv_engine *e, int from, int to, eu_result *results, char *why, size_t cap)
{
    int first = from * N_SESSIONS, n = (to - from) * N_SESSIONS;
    memset(results + first, 0, sizeof *results * (size_t)n);
    int bad = eu_run(e, turns + first, n, 2, results + first, why, cap);
    for (int i = first; i < first + n && !bad; i++)
        if (results[i].done != 1 || results[i].status != PV_OK) {
            snprintf(why, cap, "turn %d: done %d, %s", i, results[i].done, pv_status_str(results[i].status));
            bad = 1;
        }
    return bad;
}

static int same_rounds(const eu_result *a, const eu_result *b, int from, int to)
{
    for (int i = from * N_SESSIONS; i < to * N_SESSIONS; i++)
        if (a[i].n != b[i].n || memcmp(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].n) != 0) {
            tap_diag("turn %d differs (%d vs %d tokens)", i, a[i].n, b[i].n);
            return 0;
        }
    return 1;
}

typedef struct warnings {
    char text[8192];
    int n;
} warnings;

static void collect_warning(void *user, const char *line)
{
    warnings *w = user;
    size_t len = strlen(w->text);
    snprintf(w->text + len, sizeof w->text - len, "%s\n", line);
    w->n++;
}

static void make_dir(char *path, size_t cap, const char *what)
{
    snprintf(path, cap, "/tmp/pv-state-%s-XXXXXX", what);
    if (!mkdtemp(path))
        path[0] = 0;
}

static void remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", path, de->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(path);
}

static int count_files(const char *path, const char *suffix)
{
    int n = 0;
    DIR *d = opendir(path);
    if (!d)
        return -1;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name), sl = strlen(suffix);
        n += len > sl && strcmp(de->d_name + len - sl, suffix) == 0;
    }
    closedir(d);
    return n;
}

static void session_path(const char *dir, const char *id, char *path, size_t cap)
{
    char name[300];
    pv_state_file_name(id, name, sizeof name);
    snprintf(path, cap, "%s/%s", dir, name);
}

static pv_state_dir *open_dir(const char *path, pv_engine *e, uint64_t max_bytes, warnings *w)
{
    pv_state_dir_config dc = {.path = path, .max_bytes = max_bytes, .warn = collect_warning, .warn_user = w};
    pv_state_dir *d = NULL;
    if (pv_state_dir_open(&d, &dc, e, NULL) != PV_OK)
        tap_diag("state dir: %s", pv_last_error());
    return d;
}

/* ---- restart equivalence ---------------------------------------------------------------- */

typedef struct restart_cfg {
    const char *what;
    pv_engine_mode mode;
    uint64_t device_slots, host_slots;          /* before the restart */
    uint64_t device_after, host_after;          /* after */
} restart_cfg;

static void restart(eu_model *m, const restart_cfg *rc)
{
    static eu_result got[N_TURNS];
    char dir[256], why[512] = "";
    make_dir(dir, sizeof dir, "restart");
    pv_engine *e = make_engine(m, rc->mode, rc->device_slots, rc->host_slots, PV_POLICY_PENSIEVE, NULL, NULL);
    if (!ok(e && dir[0], "%s: engine and directory", rc->what))
        return;
    ok(run_rounds(e, 0, HALF, got, why, sizeof why) == 0, "%s: first half ran%s%s", rc->what, why[0] ? ": " : "",
       why);
    warnings w = {"", 0};
    pv_state_dir *d = open_dir(dir, e, 0, &w);
    pv_state_save_report sr = {0};
    pv_status st = d ? pv_state_dir_save_all(d, &sr) : PV_ERR_STATE;
    ok(st == PV_OK && sr.sessions == N_SESSIONS && sr.failed == 0 && count_files(dir, ".pvs") == N_SESSIONS,
       "%s: saved %u sessions, %" PRIu64 " bytes (%s)", rc->what, sr.sessions, sr.bytes_written,
       st == PV_OK ? "ok" : pv_last_error());
    pv_state_save_report again = {0};
    st = pv_state_dir_save_all(d, &again);
    ok(st == PV_OK && again.sessions == 0 && again.current == N_SESSIONS,
       "%s: a second save finds every file current (%u written, %u current)", rc->what, again.sessions,
       again.current);
    pv_state_dir_free(d);
    pv_engine_free(e);

    e = make_engine(m, rc->mode, rc->device_after, rc->host_after, PV_POLICY_PENSIEVE, NULL, NULL);
    d = e ? open_dir(dir, e, 0, &w) : NULL;
    pv_state_restore_report rr = {0};
    st = d ? pv_state_dir_restore(d, &rr) : PV_ERR_STATE;
    ok(st == PV_OK && rr.sessions == N_SESSIONS && rr.skipped == 0,
       "%s: restored %u sessions, %" PRIu64 " chunk records kept, %" PRIu64 " dropped (%s)", rc->what, rr.sessions,
       rr.records_kept, rr.records_dropped, st == PV_OK ? "ok" : pv_last_error());
    ok(e && pv_engine_check(e) == PV_OK && pv_cache_check(pv_engine_cache(e)) == PV_OK,
       "%s: engine and cache invariants hold after the restore", rc->what);
    int ran = e && run_rounds(e, HALF, ROUNDS, got, why, sizeof why) == 0;
    ok(ran, "%s: second half ran after the restart%s%s", rc->what, why[0] ? ": " : "", why);
    ok(ran && same_rounds(ref, got, HALF, ROUNDS),
       "%s: every turn after the restart gives stateless serving's tokens", rc->what);
    uint64_t host = 0, device = 0, recomputed = 0;
    for (int i = HALF * N_SESSIONS; i < (HALF + 1) * N_SESSIONS; i++) {
        host += got[i].res.reused_host;
        device += got[i].res.reused_device;
        recomputed += got[i].res.recomputed;
    }
    tap_diag("%s: first turns after the restart reused %" PRIu64 " host, %" PRIu64 " device tokens, recomputed %" PRIu64,
             rc->what, host, device, recomputed);
    if (rc->mode == PV_MODE_PENSIEVE && rc->host_after >= 256)
        ok(host > 0 && recomputed == 0 && rr.records_dropped == 0,
           "%s: with room for all, the restored KV is read from host and nothing is recomputed", rc->what);
    else if (rc->mode == PV_MODE_PENSIEVE)
        ok(rr.records_kept == rc->host_after && rr.records_dropped > 0 && recomputed > 0,
           "%s: a host tier too small is filled (%" PRIu64 " of %" PRIu64 " slots), the rest dropped and "
           "recomputed on return",
           rc->what, rr.records_kept, rc->host_after);
    else if (rc->mode == PV_MODE_GPU_ONLY)
        ok(device > 0 && host == 0, "%s: gpu-only restores into the device tier", rc->what);
    else
        ok(rr.records_kept == 0, "%s: stateless mode restores histories only", rc->what);
    pv_state_dir_free(d);
    pv_engine_free(e);
    remove_dir(dir);
}

/* ---- refused files -------------------------------------------------------------------------- */

static void patch(const char *path, long off, uint8_t xor_with)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return;
    fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
    int c = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(c ^ xor_with, f);
    fclose(f);
}

static void refused(eu_model *m)
{
    static eu_result got[N_TURNS];
    char dir[256], why[512] = "", path[4096];
    make_dir(dir, sizeof dir, "refused");
    pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL);
    warnings w = {"", 0};
    pv_state_dir *d = e ? open_dir(dir, e, 0, &w) : NULL;
    if (!ok(d && run_rounds(e, 0, HALF, got, why, sizeof why) == 0 && pv_state_dir_save_all(d, NULL) == PV_OK,
            "refused: %d sessions saved", N_SESSIONS)) {
        pv_state_dir_free(d);
        pv_engine_free(e);
        return;
    }
    pv_state_dir_free(d);
    pv_engine_free(e);
    /* s0 truncated, s1 a flipped KV byte, s2 another format version, s3
     * another model (below), a temporary file of an interrupted write. */
    session_path(dir, "s0", path, sizeof path);
    struct stat sb;
    if (stat(path, &sb) == 0 && truncate(path, sb.st_size - 1) != 0)
        tap_diag("truncate failed");
    session_path(dir, "s1", path, sizeof path);
    patch(path, -1, 0x40);
    session_path(dir, "s2", path, sizeof path);
    patch(path, 8, 0x02);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/deadbeef.pvs.tmp.1", dir);
    FILE *f = fopen(tmp, "wb");
    if (f)
        fclose(f);
    /* s3 from a model with another layer count. */
    eu_model other;
    int other_ok = eu_model_init(&other, "cpu", LAYERS + 1, N_CTX, PV_F32, CHUNK) == PV_OK;
    pv_engine *oe = other_ok ? make_engine(&other, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL)
                             : NULL;
    session_path(dir, "s3", path, sizeof path);
    unlink(path);
    pv_state_dir *od = oe ? open_dir(dir, oe, 0, &w) : NULL;
    int32_t prompt[20];
    for (int i = 0; i < 20; i++)
        prompt[i] = 5 + i;
    pv_turn t = {.tokens = prompt, .n_tokens = 20};
    pv_sampling_defaults(&t.sampling);
    t.sampling.max_tokens = 4;
    eu_result r = {0};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, &r};
    int other_saved = od && pv_engine_submit(oe, "s3", &t, &cb, NULL) == PV_OK && pv_engine_run(oe) == PV_OK &&
                      pv_state_dir_save_all(od, NULL) == PV_OK;
    ok(other_saved, "refused: a session of another model saved");
    pv_state_dir_free(od);
    pv_engine_free(oe);
    if (other_ok)
        eu_model_free(&other);

    e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL);
    w = (warnings){"", 0};
    d = e ? open_dir(dir, e, 0, &w) : NULL;
    pv_state_restore_report rr = {0};
    pv_status st = d ? pv_state_dir_restore(d, &rr) : PV_ERR_STATE;
    ok(st == PV_OK && rr.sessions == N_SESSIONS - 4 && rr.skipped == 4,
       "refused: %u restored, %u skipped (want %d and 4)", rr.sessions, rr.skipped, N_SESSIONS - 4);
    tap_diag("warnings:\n%s", w.text);
    ok(strstr(w.text, "truncated") != NULL, "refused: a truncated file, named as truncated");
    ok(strstr(w.text, "checksum mismatch") != NULL, "refused: a flipped byte, by its checksum");
    ok(strstr(w.text, "format version") != NULL, "refused: another format version");
    ok(strstr(w.text, "another model") != NULL, "refused: a file of another model");
    size_t n = 0;
    int none = 1;
    for (int s = 0; s < 4; s++) {
        char id[8];
        snprintf(id, sizeof id, "s%d", s);
        none &= e && pv_engine_session_tokens(e, id, &n) == PV_ERR_NOT_FOUND;
    }
    ok(none, "refused: no refused session exists in the engine");
    int s4 = e && pv_engine_session_tokens(e, "s4", &n) == PV_OK && n > 0;
    ok(s4, "refused: the others restored (s4: %zu tokens)", n);
    ok(count_files(dir, ".tmp.1") == 0, "refused: the interrupted write's temporary file is removed");
    pv_state_dir_free(d);
    pv_engine_free(e);
    remove_dir(dir);
}

/* Every single-byte change of a file is refused, and truncations too. */
static void corruptions(eu_model *m)
{
    static eu_result got[N_TURNS];
    char why[512] = "";
    pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL);
    pv_session_image *img = NULL;
    uint8_t *f = NULL;
    size_t size = 0;
    int ready = e && run_rounds(e, 0, 1, got, why, sizeof why) == 0 &&
                pv_engine_session_export(e, "s0", 1, &img, NULL) == PV_OK &&
                pv_session_image_encode(img, &f, &size) == PV_OK;
    pv_state_identity ident;
    if (e)
        pv_engine_state_identity(e, &ident);
    pv_session_image *back = NULL;
    ok(ready && pv_session_image_decode(f, size, &ident, "s0", &back) == PV_OK && back->n_records == img->n_records &&
           memcmp(back->kv, img->kv, img->n_records * ident.slot_bytes) == 0,
       "corruption: an intact image decodes to the same records and bytes (%zu bytes, %zu records)", size,
       img ? img->n_records : 0);
    pv_session_image_free(back);
    int loaded = 0, tried = 0;
    uint64_t x = 12345;
    for (size_t i = 0; ready && i < size; i += 1 + (i >= 256 ? (size_t)(x % 61) : 0)) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint8_t keep = f[i];
        f[i] ^= (uint8_t)(1u << (x >> 61));
        back = NULL;
        if (pv_session_image_decode(f, size, &ident, "s0", &back) == PV_OK)
            loaded++;
        pv_session_image_free(back);
        f[i] = keep;
        tried++;
    }
    for (size_t cut = 0; ready && cut < size; cut += 1 + cut / 3) {
        back = NULL;
        if (pv_session_image_decode(f, cut, &ident, "s0", &back) == PV_OK)
            loaded++;
        pv_session_image_free(back);
        tried++;
    }
    ok(ready && loaded == 0, "corruption: %d of %d changed or truncated images decoded (want 0)", loaded, tried);
    free(f);
    pv_session_image_free(img);
    pv_engine_free(e);
}

/* ---- kill -9 during saves --------------------------------------------------------------------- */

/* The child: runs the script, saving every session after every turn,
 * until killed. */
static int crash_child(const char *dir)
{
    eu_model m;
    if (eu_model_init(&m, "cpu", LAYERS, N_CTX, PV_F32, CHUNK) != PV_OK)
        return 2;
    eu_script(turns, N_SESSIONS, ROUNDS, m.tok.n_vocab, 7, 28, 12);
    pv_engine *e = make_engine(&m, PV_MODE_PENSIEVE, 48, 64, PV_POLICY_PENSIEVE, NULL, NULL);
    pv_state_dir_config dc = {.path = dir};
    pv_state_dir *d = NULL;
    if (!e || pv_state_dir_open(&d, &dc, e, NULL) != PV_OK)
        return 2;
    static eu_result got[N_TURNS];
    char why[256], ready[4096];
    snprintf(ready, sizeof ready, "%s/ready", dir);
    for (;;)
        for (int i = 0; i < N_TURNS; i++) {
            memset(&got[i], 0, sizeof got[i]);
            if (eu_run(e, turns + i, 1, 1, got + i, why, sizeof why) != 0 || pv_state_dir_save_all(d, NULL) != PV_OK)
                return 3;
            if (i == 0) { /* saving from now on: the parent may kill */
                FILE *f = fopen(ready, "w");
                if (f)
                    fclose(f);
            }
            if (i == N_TURNS - 1) { /* start over: the same versions again */
                for (int s = 0; s < N_SESSIONS; s++) {
                    char id[8];
                    snprintf(id, sizeof id, "s%d", s);
                    pv_engine_end_session(e, id);
                }
            }
        }
}

/* The versions a session passes through: its tokens after each turn. */
typedef struct version {
    int32_t *tokens;
    size_t n;
} version;

static version versions[N_SESSIONS][ROUNDS];

static void record_versions(eu_model *m)
{
    static eu_result got[N_TURNS];
    char why[256];
    pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 48, 64, PV_POLICY_PENSIEVE, NULL, NULL);
    for (int i = 0; e && i < N_TURNS; i++) {
        memset(&got[i], 0, sizeof got[i]);
        eu_run(e, turns + i, 1, 1, got + i, why, sizeof why);
        char id[8];
        snprintf(id, sizeof id, "s%d", turns[i].session);
        pv_session_image *img = NULL;
        if (pv_engine_session_export(e, id, 0, &img, NULL) == PV_OK) {
            version *v = &versions[turns[i].session][i / N_SESSIONS];
            v->n = img->n_history + img->n_pending;
            v->tokens = malloc(v->n * sizeof *v->tokens + 1);
            memcpy(v->tokens, img->history, img->n_history * sizeof(int32_t));
            memcpy(v->tokens + img->n_history, img->pending, img->n_pending * sizeof(int32_t));
        }
        pv_session_image_free(img);
    }
    pv_engine_free(e);
}

static int is_a_version(int s, const pv_session_image *img)
{
    for (int r = 0; r < ROUNDS; r++) {
        const version *v = &versions[s][r];
        if (v->tokens && v->n == img->n_history + img->n_pending &&
            memcmp(v->tokens, img->history, img->n_history * sizeof(int32_t)) == 0 &&
            memcmp(v->tokens + img->n_history, img->pending, img->n_pending * sizeof(int32_t)) == 0)
            return 1;
    }
    return 0;
}

static void crashes(eu_model *m, const char *self)
{
    record_versions(m);
    char dir[256];
    make_dir(dir, sizeof dir, "crash");
    int kills = 0, bad_restores = 0, bad_versions = 0, checks_failed = 0, restored = 0, tmp_left = 0;
    uint64_t x = 99;
    char ready[4096];
    snprintf(ready, sizeof ready, "%s/ready", dir);
    for (int iter = 0; iter < 12; iter++) {
        unlink(ready);
        pid_t pid = fork();
        if (pid == 0) {
            execl(self, self, "--crash-child", dir, (char *)NULL);
            _exit(4);
        }
        /* Once the child saves (it says so), a kill at a random moment of
         * the next 0-300 ms lands in or between writes. */
        for (int i = 0; i < 4000 && access(ready, F_OK) != 0; i++) {
            struct timespec poll = {0, 5 * 1000000L};
            nanosleep(&poll, NULL);
        }
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        struct timespec ts = {0, (long)((x >> 33) % 300) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status);
        pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 48, 64, PV_POLICY_PENSIEVE, NULL, NULL);
        warnings w = {"", 0};
        pv_state_dir *d = e ? open_dir(dir, e, 0, &w) : NULL;
        pv_state_restore_report rr = {0};
        if (!d || pv_state_dir_restore(d, &rr) != PV_OK || rr.skipped != 0) {
            if (!bad_restores++)
                tap_diag("iteration %d: %u skipped: %s", iter, rr.skipped, w.text);
        }
        restored += rr.sessions;
        for (int s = 0; e && s < N_SESSIONS; s++) {
            char id[8];
            snprintf(id, sizeof id, "s%d", s);
            pv_session_image *img = NULL;
            if (pv_engine_session_export(e, id, 1, &img, NULL) == PV_OK && !is_a_version(s, img))
                bad_versions++;
            pv_session_image_free(img);
        }
        if (e && (pv_engine_check(e) != PV_OK || pv_cache_check(pv_engine_cache(e)) != PV_OK))
            checks_failed++;
        tmp_left += count_files(dir, ".tmp.") > 0;
        pv_state_dir_free(d);
        pv_engine_free(e);
    }
    ok(kills == 12, "kill -9: the saving child was killed 12 times (%d)", kills);
    ok(bad_restores == 0 && restored > 0, "kill -9: every restore read every file (%d sessions restored in all)",
       restored);
    ok(bad_versions == 0, "kill -9: every restored session is one of the versions it had (%d were not)", bad_versions);
    ok(checks_failed == 0, "kill -9: engine and cache invariants hold after every restore");
    ok(tmp_left == 0, "kill -9: no temporary file is left after a restore (%d were)", tmp_left);
    remove_dir(dir);
    for (int s = 0; s < N_SESSIONS; s++)
        for (int r = 0; r < ROUNDS; r++)
            free(versions[s][r].tokens);
}

/* ---- the size limit ---------------------------------------------------------------------------- */

static double fake_now;

static double fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static void size_limit(eu_model *m)
{
    static eu_result got[N_TURNS];
    char dir[256], why[512] = "", path[4096];
    make_dir(dir, sizeof dir, "limit");
    fake_now = 1000;
    pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, fake_clock, NULL);
    /* Round 0 for every session at t = 1000; then s5 (only) again at
     * t = 1100: the others have been idle 100 s more. */
    int ran = e && run_rounds(e, 0, 1, got, why, sizeof why) == 0;
    fake_now = 1100;
    memset(&got[N_SESSIONS + 5], 0, sizeof got[0]);
    ran = ran && eu_run(e, turns + N_SESSIONS + 5, 1, 1, got + N_SESSIONS + 5, why, sizeof why) == 0;
    warnings w = {"", 0};
    pv_state_dir *d = ran ? open_dir(dir, e, 0, &w) : NULL;
    pv_state_save_report sr = {0};
    int saved = d && pv_state_dir_save_all(d, &sr) == PV_OK && sr.sessions == N_SESSIONS;
    ok(saved, "limit: saved without a limit (%" PRIu64 " bytes)", sr.bytes_written);
    uint64_t full = d ? pv_state_dir_bytes(d) : 0;
    pv_state_dir_free(d);
    /* A limit that costs a few chunk records. */
    uint64_t slot = pv_llama_slot_bytes(m->model), limit = full - 5 * (slot + 16);
    d = open_dir(dir, e, limit, &w);
    saved = d && pv_state_dir_save_all(d, &sr) == PV_OK;
    uint64_t on_disk = d ? pv_state_dir_bytes(d) : 0;
    ok(saved && on_disk <= limit && on_disk > limit - 3 * (slot + 16),
       "limit: %" PRIu64 " bytes on disk, at most the limit %" PRIu64 " and not far below", on_disk, limit);
    /* Which records went: s5, active 100 s later, keeps all of its; the
     * others lose leading chunks first. */
    pv_state_identity ident;
    pv_engine_state_identity(e, &ident);
    int s5_whole = 0, leading_first = 1, lost = 0;
    for (int s = 0; s < N_SESSIONS; s++) {
        char id[8];
        snprintf(id, sizeof id, "s%d", s);
        session_path(dir, id, path, sizeof path);
        pv_session_image *img = NULL, *live = NULL;
        if (pv_session_image_read(path, &ident, &img) != PV_OK ||
            pv_engine_session_export(e, id, 1, &live, NULL) != PV_OK) {
            leading_first = 0;
        } else {
            size_t missing = live->n_records - img->n_records;
            lost += (int)missing;
            if (s == 5)
                s5_whole = missing == 0;
            /* No kept record lies in an earlier chunk than a lost one
             * (within a chunk, later layers go first, as in the cache). */
            uint32_t max_lost = 0, min_kept = UINT32_MAX;
            for (size_t i = 0, j = 0; i < live->n_records; i++) {
                if (j < img->n_records && memcmp(&img->records[j], &live->records[i], sizeof img->records[j]) == 0) {
                    if (live->records[i].chunk < min_kept)
                        min_kept = live->records[i].chunk;
                    j++;
                } else if (live->records[i].chunk > max_lost) {
                    max_lost = live->records[i].chunk;
                }
            }
            if (missing && max_lost > min_kept)
                leading_first = 0;
        }
        pv_session_image_free(img);
        pv_session_image_free(live);
    }
    ok(lost >= 5 && s5_whole, "limit: %d records dropped, none of the most recently active session's", lost);
    ok(leading_first, "limit: each session lost its leading chunks first");
    pv_state_dir_free(d);
    pv_engine_free(e);
    /* What is left restores and still gives the reference's tokens. */
    e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL);
    d = e ? open_dir(dir, e, 0, &w) : NULL;
    pv_state_restore_report rr = {0};
    int restored = d && pv_state_dir_restore(d, &rr) == PV_OK && rr.sessions == N_SESSIONS && rr.records_dropped >= 5;
    ok(restored, "limit: restored with %" PRIu64 " records dropped", rr.records_dropped);
    for (int s = 0; s < N_SESSIONS - 1; s++) { /* s5 ran round 1 already */
        int i = N_SESSIONS + s;
        memset(&got[i], 0, sizeof got[i]);
        eu_run(e, turns + i, 1, 1, got + i, why, sizeof why);
    }
    ok(same_rounds(ref, got, 1, 2), "limit: the next turns give stateless serving's tokens");
    pv_state_dir_free(d);
    pv_engine_free(e);
    remove_dir(dir);
}

/* ---- forget, stale files and the background saver ------------------------------------------- */

static pv_status end_s0(pv_engine *e, void *arg)
{
    (void)arg;
    return pv_engine_end_session(e, "s0");
}

static pv_status end_s1(pv_engine *e, void *arg)
{
    (void)arg;
    return pv_engine_end_session(e, "s1");
}

static void background(eu_model *m)
{
    static eu_result got[N_TURNS];
    char dir[256], why[512] = "", path[4096];
    make_dir(dir, sizeof dir, "bg");
    pv_engine *e = make_engine(m, PV_MODE_PENSIEVE, 1024, 1024, PV_POLICY_PENSIEVE, NULL, NULL);
    int ran = e && run_rounds(e, 0, 1, got, why, sizeof why) == 0;
    pv_engine_loop *loop = NULL;
    warnings w = {"", 0};
    pv_state_dir_config dc = {.path = dir, .save_idle_s = 0.2, .warn = collect_warning, .warn_user = &w};
    pv_state_dir *d = NULL;
    int started = ran && pv_engine_loop_start(&loop, e) == PV_OK && pv_state_dir_open(&d, &dc, e, loop) == PV_OK &&
                  pv_state_dir_start(d) == PV_OK;
    ok(started, "background: saver started");
    int files = 0;
    for (int i = 0; started && i < 100 && (files = count_files(dir, ".pvs")) < N_SESSIONS; i++) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ok(files == N_SESSIONS, "background: idle sessions saved without a shutdown (%d files)", files);
    /* DELETE: the server ends the session, then forgets its file. */
    session_path(dir, "s0", path, sizeof path);
    ok(started && pv_engine_loop_call(loop, end_s0, NULL) == PV_OK && pv_state_dir_forget(d, "s0") == PV_OK &&
           access(path, F_OK) != 0,
       "background: forget removes the file");
    /* A session the engine ended (DELETE, idle timeout): its file goes at
     * the next pass. */
    session_path(dir, "s1", path, sizeof path);
    int gone = 0;
    if (started && pv_engine_loop_call(loop, end_s1, NULL) == PV_OK)
        for (int i = 0; i < 100 && !(gone = access(path, F_OK) != 0); i++) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    ok(gone, "background: an ended session's file is removed by the next pass");
    struct timespec two_passes = {2, 200 * 1000000L};
    nanosleep(&two_passes, NULL);
    session_path(dir, "s0", path, sizeof path);
    ok(access(path, F_OK) != 0 && count_files(dir, ".pvs") == N_SESSIONS - 2,
       "background: neither is written again (%d files)", count_files(dir, ".pvs"));
    pv_state_dir_free(d);
    pv_engine_loop_stop(loop);
    pv_engine_free(e);
    remove_dir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--crash-child") == 0)
        return crash_child(argv[2]);
    eu_model m;
    pv_status st = eu_model_init(&m, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (st != PV_OK) {
        printf("1..0 # SKIP synthetic model: %s\n", pv_last_error());
        return 0;
    }
    eu_script(turns, N_SESSIONS, ROUNDS, m.tok.n_vocab, 7, 28, 12);
    char why[512] = "";
    pv_engine *e = make_engine(&m, PV_MODE_STATELESS, 4096, 64, PV_POLICY_PENSIEVE, NULL, NULL);
    ok(e && run_rounds(e, 0, ROUNDS, ref, why, sizeof why) == 0, "reference: stateless run%s%s", why[0] ? ": " : "",
       why);
    pv_engine_free(e);

    const restart_cfg cfgs[] = {
        {"pensieve, room for all", PV_MODE_PENSIEVE, 48, 256, 48, 256},
        {"pensieve, a small host tier after", PV_MODE_PENSIEVE, 48, 256, 48, 24},
        {"gpu-only", PV_MODE_GPU_ONLY, 1024, 0, 1024, 0},
        {"stateless", PV_MODE_STATELESS, 1024, 64, 1024, 64},
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        restart(&m, &cfgs[i]);
    refused(&m);
    corruptions(&m);
    size_limit(&m);
    background(&m);
    crashes(&m, argv[0]);
    eu_model_free(&m);
    return tap_done();
}
