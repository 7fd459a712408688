/* The master equivalence test: scripted conversations over 8 sessions on the
 * synthetic model, greedy. Every turn's tokens in `pensieve` and `gpu-only`
 * mode, with budgets so small that turns swap out, swap in, drop, recover
 * and suspend, equal `stateless` mode's (every turn recomputes the whole
 * history) exactly. The engine's and cache's invariants are checked after
 * every iteration, and the statistics must show that each mechanism ran.
 * On cpu, opencl and cuda (skipped where absent), f32 and f16 KV; the HOST tier allocated in segments
 * as it fills, and on a host that refuses its memory. Then bad input. */
#include "delay-backend.h"
#include "engine-util.h"

#include <inttypes.h>

#define N_SESSIONS 8
#define ROUNDS 4
#define N_TURNS (N_SESSIONS * ROUNDS)
#define LAYERS 4
#define CHUNK 16
#define N_CTX 512

typedef struct run_cfg {
    pv_engine_mode mode;
    uint64_t device_slots, host_slots;
    int concurrent;
    const char *what;
    uint64_t host_segment_slots; /* 0: the engine's default */
} run_cfg;

static int run(eu_model *m, const run_cfg *rc, const eu_turn *turns, eu_result *results,
               pv_engine_stats *stats, pv_cache_stats *cstats)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m->model);
    cc.device_bytes = rc->device_slots * slot;
    cc.host_bytes = rc->host_slots * slot;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = rc->mode;
    ec.token_budget = 48; /* prompts run in several pieces */
    ec.swap_out_chunks = 16;
    ec.host_segment_bytes = rc->host_segment_slots * slot;
    pv_engine *e = NULL;
    pv_status st = pv_engine_init(&e, m->be, m->model, &m->tok, &cc, &ec);
    if (!ok(st == PV_OK, "%s: engine init (%s)", rc->what, st == PV_OK ? "ok" : pv_last_error()))
        return -1;
    memset(results, 0, sizeof *results * N_TURNS);
    char why[512] = "";
    int bad = eu_run(e, turns, N_TURNS, rc->concurrent, results, why, sizeof why);
    ok(bad == 0, "%s: invariants hold after every iteration%s%s", rc->what, bad ? ": " : "", why);
    pv_engine_stats_get(e, stats);
    pv_cache_stats_get(pv_engine_cache(e), cstats);
    int failed = 0;
    for (int i = 0; i < N_TURNS; i++)
        failed += results[i].done != 1 || results[i].status != PV_OK;
    ok(failed == 0, "%s: every turn completes once with PV_OK (%d did not)", rc->what, failed);
    pv_engine_free(e);
    return 0;
}

static int same_tokens(const eu_result *a, const eu_result *b, int n, int *first_bad)
{
    for (int i = 0; i < n; i++)
        if (a[i].n != b[i].n || memcmp(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].n) != 0) {
            *first_bad = i;
            return 0;
        }
    return 1;
}

/* run() into got, then its tokens against ref's; 1 when the engine ran
 * (its statistics in es and cs), 0 when it did not open. */
static int run_equal(eu_model *m, const run_cfg *rc, const eu_turn *turns, const eu_result *ref, eu_result *got,
                     pv_engine_stats *es, pv_cache_stats *cs)
{
    if (run(m, rc, turns, got, es, cs) != 0)
        return 0;
    int bad = -1;
    int same = same_tokens(ref, got, N_TURNS, &bad);
    ok(same, "%s: every turn's tokens equal stateless mode's", rc->what);
    if (!same)
        tap_diag("turn %d: %d vs %d tokens", bad, ref[bad].n, got[bad].n);
    return 1;
}

static void equivalence(const char *backend, pv_dtype kv)
{
    eu_model m;
    pv_status st = eu_model_init(&m, backend, LAYERS, N_CTX, kv, CHUNK);
    if (st == PV_ERR_NO_DEVICE || st == PV_ERR_NOT_FOUND) {
        tap_skip("backend %s: %s", backend, pv_last_error());
        eu_model_free(&m);
        return;
    }
    if (!ok(st == PV_OK, "%s %s: synthetic model (%s)", backend, pv_dtype_name(kv),
            st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return;
    }
    static eu_turn turns[N_TURNS];
    eu_script(turns, N_SESSIONS, ROUNDS, m.tok.n_vocab, 7, 28, 12);
    static eu_result ref[N_TURNS], got[N_TURNS];
    pv_engine_stats es;
    pv_cache_stats cs;
    char what[128];

    snprintf(what, sizeof what, "%s %s stateless", backend, pv_dtype_name(kv));
    run_cfg base = {PV_MODE_STATELESS, 4096, 64, 1, what, 0};
    if (run(&m, &base, turns, ref, &es, &cs) != 0) {
        eu_model_free(&m);
        return;
    }
    ok(es.recomputed_tokens > 0 && es.reused_device_tokens == 0 && es.reused_host_tokens == 0,
       "%s: recomputes every history (%" PRIu64 " tokens), reuses nothing", what, es.recomputed_tokens);

    /* 48 device slots hold about one and a half sessions' context, 64 host
     * slots two: most turns find their history partly on host, partly
     * dropped; two sessions in flight at once run out of device slots. */
    snprintf(what, sizeof what, "%s %s pensieve", backend, pv_dtype_name(kv));
    run_cfg pens = {PV_MODE_PENSIEVE, 48, 64, 2, what, 0};
    if (run_equal(&m, &pens, turns, ref, got, &es, &cs)) {
        ok(es.swap_out_chunks > 0 && es.swap_in_chunks > 0 && es.dropped_chunks > 0,
           "%s: chunks swapped out (%" PRIu64 "), swapped in (%" PRIu64 ") and dropped (%" PRIu64 ")",
           what, es.swap_out_chunks, es.swap_in_chunks, es.dropped_chunks);
        ok(es.recomputed_tokens > 0 && cs.recomputed_chunks > 0,
           "%s: dropped chunks recovered (%" PRIu64 " tokens, %" PRIu64 " chunk records)", what,
           es.recomputed_tokens, cs.recomputed_chunks);
        ok(es.reused_device_tokens > 0 && es.reused_host_tokens > 0,
           "%s: history reused from device (%" PRIu64 " tokens) and host (%" PRIu64 ")", what,
           es.reused_device_tokens, es.reused_host_tokens);
        ok(es.suspensions > 0, "%s: decode ran out of device slots and suspended (%" PRIu64 " times)",
           what, es.suspensions);
        ok(cs.shadow_hits + cs.shadow_reclaimed > 0 || es.swap_out_chunks > 0,
           "%s: ahead-of-time swap-out left shadows (%" PRIu64 " hits, %" PRIu64 " reclaimed)", what,
           cs.shadow_hits, cs.shadow_reclaimed);
    }

    /* The HOST tier in segments of 5 slots (13, the last of 4), allocated
     * when first needed: transfers span segments, and a roomy budget costs
     * only what is used. */
    const uint64_t slot = pv_llama_slot_bytes(m.model);
    snprintf(what, sizeof what, "%s %s pensieve, host in 5-slot segments", backend, pv_dtype_name(kv));
    run_cfg segs = {PV_MODE_PENSIEVE, 48, 64, 2, what, 5};
    if (run_equal(&m, &segs, turns, ref, got, &es, &cs)) {
        ok(es.swap_out_chunks > 0 && es.swap_in_chunks > 0 && es.host_segments > 1 &&
               cs.host_backed_bytes == (es.host_segments == 13 ? 64 : es.host_segments * 5) * slot,
           "%s: chunks swapped out (%" PRIu64 ") and in (%" PRIu64 ") through %" PRIu64 " segments of %" PRIu64
           " backed bytes", what, es.swap_out_chunks, es.swap_in_chunks, es.host_segments, cs.host_backed_bytes);
    }
    snprintf(what, sizeof what, "%s %s pensieve, roomy host budget", backend, pv_dtype_name(kv));
    run_cfg roomy = {PV_MODE_PENSIEVE, 48, 8192, 2, what, 16};
    if (run_equal(&m, &roomy, turns, ref, got, &es, &cs)) {
        /* The whole conversation set is some 330 slots: no slot is dropped
         * for room, and memory follows them, not the 8192 of the budget. */
        ok(es.swap_out_chunks > 0 && cs.host_backed_bytes == es.host_segments * 16 * slot &&
               cs.host_backed_bytes <= 512 * slot && es.host_segments_refused == 0,
           "%s: %" PRIu64 " of %" PRIu64 " host bytes allocated, in %" PRIu64 " segments", what,
           cs.host_backed_bytes, cs.capacity_bytes[PV_TIER_HOST], es.host_segments);
    }

    /* The default budgets open on every backend: the 4 GiB host tier was
     * one buffer, past PoCL's largest allocation (1-2 GiB here); it now
     * holds nothing until used. */
    pv_cache_config defaults;
    pv_cache_config_defaults(&defaults);
    pv_engine *e = NULL;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &defaults, NULL);
    if (st == PV_OK)
        pv_cache_stats_get(pv_engine_cache(e), &cs);
    ok(st == PV_OK && cs.capacity_bytes[PV_TIER_HOST] == defaults.host_bytes && cs.host_backed_bytes == 0,
       "%s %s: an engine with the default budgets opens, no host memory allocated (%s)", backend, pv_dtype_name(kv),
       st == PV_OK ? "ok" : pv_last_error());
    pv_engine_free(e);

    snprintf(what, sizeof what, "%s %s gpu-only", backend, pv_dtype_name(kv));
    run_cfg gpu = {PV_MODE_GPU_ONLY, 48, 0, 2, what, 0};
    if (run_equal(&m, &gpu, turns, ref, got, &es, &cs)) {
        ok(es.swap_out_chunks == 0 && es.swap_in_chunks == 0 && es.dropped_chunks > 0 &&
               es.recomputed_tokens > 0,
           "%s: no host traffic, %" PRIu64 " chunks dropped and recomputed", what, es.dropped_chunks);
    }
    eu_model_free(&m);
}

/* A host that refuses the HOST tier's third segment (the delay backend,
 * CPU arithmetic, limiting its host buffers): HOST stays at two segments
 * of 5 slots, counts as full, evictions past it drop, and every turn still
 * equals stateless serving's. */
static void host_refused(void)
{
    pv_backend *be = NULL;
    eu_model m = {0};
    pv_status st = pv_delay_backend_init(&be, NULL);
    if (st == PV_OK)
        st = eu_model_init_on(&m, be, "delay", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "host refusing memory: synthetic model on the delay backend (%s)",
            st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m); /* frees be */
        return;
    }
    static eu_turn turns[N_TURNS];
    eu_script(turns, N_SESSIONS, ROUNDS, m.tok.n_vocab, 7, 28, 12);
    static eu_result ref[N_TURNS], got[N_TURNS];
    pv_engine_stats es;
    pv_cache_stats cs;
    run_cfg base = {PV_MODE_STATELESS, 4096, 64, 1, "host refusing memory: stateless", 0};
    run_cfg pens = {PV_MODE_PENSIEVE, 48, 64, 2, "host refusing memory: pensieve", 5};
    pv_delay_backend_limit_host_buffers(be, -1);
    if (run(&m, &base, turns, ref, &es, &cs) == 0) {
        /* The engine's own host buffers (sampled tokens) come at init,
         * before any segment: as many as a probe's init takes, then two. */
        pv_cache_config cc;
        pv_cache_config_defaults(&cc);
        cc.device_bytes = 48 * pv_llama_slot_bytes(m.model);
        cc.host_bytes = 64 * pv_llama_slot_bytes(m.model);
        pv_engine_config ec;
        pv_engine_config_defaults(&ec);
        ec.host_segment_bytes = 5 * pv_llama_slot_bytes(m.model);
        pv_engine *probe = NULL;
        int64_t before = pv_delay_backend_host_buffers(be);
        st = pv_engine_init(&probe, be, m.model, &m.tok, &cc, &ec);
        int64_t at_init = pv_delay_backend_host_buffers(be) - before;
        pv_engine_free(probe);
        pv_delay_backend_limit_host_buffers(be, at_init + 2);
        if (run_equal(&m, &pens, turns, ref, got, &es, &cs)) {
            ok(es.host_segments == 2 && es.host_segments_refused == 1 &&
                   cs.host_backed_bytes == 10 * pv_llama_slot_bytes(m.model) && es.swap_out_chunks > 0 &&
                   es.dropped_chunks > 0,
               "host refusing memory: 2 segments, 1 refused, HOST full at 10 slots; %" PRIu64
               " chunks swapped out, %" PRIu64 " dropped",
               es.swap_out_chunks, es.dropped_chunks);
        }
    }
    pv_delay_backend_limit_host_buffers(be, -1);
    eu_model_free(&m);
}

/* A directed script run twice on the CPU model: stateless with room for
 * everything, into ref, then pensieve with `device_slots` device slots and
 * `host_slots` host slots, into got (es: its statistics). The count of
 * invariant violations; the first is in why. */
static int directed_pair(eu_model *m, const eu_turn *turns, int n, pv_cache_config cc, uint64_t device_slots,
                         uint64_t host_slots, eu_result *ref, eu_result *got, pv_engine_stats *es, char *why,
                         size_t cap)
{
    const uint64_t slot = pv_llama_slot_bytes(m->model);
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        ec.mode = pass ? PV_MODE_PENSIEVE : PV_MODE_STATELESS;
        cc.device_bytes = (pass ? device_slots : 256) * slot;
        cc.host_bytes = host_slots * slot;
        pv_engine *e = NULL;
        pv_status st = pv_engine_init(&e, m->be, m->model, &m->tok, &cc, &ec);
        if (st != PV_OK) {
            snprintf(why, cap, "engine init: %s", pv_last_error());
            return bad + 1;
        }
        eu_result *res = pass ? got : ref;
        memset(res, 0, sizeof *res * (size_t)n);
        bad += eu_run(e, turns, n, 1, res, why, cap);
        pv_engine_stats_get(e, es);
        pv_engine_free(e);
    }
    return bad;
}

/* Directed: a session's last, partly filled chunk is pushed to HOST (no
 * shadow: an eviction, not a background copy) by a larger session; its next
 * turn writes new rows into that chunk, so the chunk's old rows must come
 * back with it. */
static void partial_chunk_from_host(eu_model *m)
{
    static eu_turn turns[4];
    eu_script(turns, 1, 4, m->tok.n_vocab, 11, 90, 4);
    turns[0].n_prompt = 20; /* A: 23 tokens kept, chunk 1 partly filled */
    turns[1].session = 1;
    turns[1].n_prompt = 66; /* B: 5 chunks + the reserve push 6 of A's 8 slots out */
    turns[2].session = 2;
    turns[2].n_prompt = 5;  /* C: takes the device slots A's chunks left */
    turns[3].n_prompt = 10; /* A again */
    turns[3].max_tokens = 40;
    static eu_result ref[4], got[4];
    pv_engine_stats es;
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    char why[512] = "";
    int bad = directed_pair(m, turns, 4, cc, 24, 64, ref, got, &es, why, sizeof why);
    int first = -1;
    ok(bad == 0 && same_tokens(ref, got, 4, &first), "partial chunk from host: tokens equal stateless mode's%s%s",
       bad ? ": " : "", why);
    ok(got[3].res.reused_host > 0 && got[3].res.recomputed == 0,
       "partial chunk from host: A's second turn read %u history tokens from host (%u from device), "
       "recomputed %u",
       got[3].res.reused_host, got[3].res.reused_device, got[3].res.recomputed);
}

/* ---- sampling, stop strings, idle timeout ------------------------------------------- */

typedef struct text_out {
    char text[4096];
    size_t n;
    int done;
    pv_status st;
    pv_turn_result res;
} text_out;

static void text_on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    text_out *t = user;
    if (t->n + len < sizeof t->text) {
        memcpy(t->text + t->n, text, len);
        t->n += len;
        t->text[t->n] = '\0';
    }
}

static void text_on_done(void *user, pv_status st, const pv_turn_result *res)
{
    text_out *t = user;
    t->done++;
    t->st = st;
    t->res = *res;
}

/* Directed: one eviction plan that fills a host slot twice. W (2 chunks)
 * and X (3 chunks) fill the device; Y's turn needs all of it, with room on
 * HOST for 2 chunks. W goes to HOST first; then each of X's chunks drops a
 * colder one already there (W's, then X's own first chunk) and takes its
 * slot, in the same plan. So the plan's swap-out writes those host slots
 * twice, and only the chunk that stays may land there: when X returns, its
 * last two chunks come back from HOST and its answer must be stateless
 * mode's. */
static void host_slot_refilled(eu_model *m)
{
    static eu_turn turns[4];
    eu_script(turns, 3, 1, m->tok.n_vocab, 13, 90, 2);
    turns[0].n_prompt = 30; /* W: 31 tokens kept, 2 chunks */
    turns[1].n_prompt = 46; /* X: 47 tokens kept, 3 chunks */
    turns[2].n_prompt = 76; /* Y: 5 chunks, the whole device */
    turns[3] = turns[1];    /* X again */
    turns[3].n_prompt = 5;
    turns[3].max_tokens = 24;
    static eu_result ref[4], got[4];
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.reserve = 0.0;
    cc.high_water = 1.0;
    pv_engine_stats es = {0};
    char why[512] = "";
    int bad = directed_pair(m, turns, 4, cc, 5 * LAYERS, 2 * LAYERS, ref, got, &es, why, sizeof why);
    int first = -1;
    ok(bad == 0 && same_tokens(ref, got, 4, &first), "host slot refilled in one plan: tokens equal stateless "
       "mode's%s%s", bad ? ": " : "", why);
    ok(got[3].res.reused_host > CHUNK && es.dropped_chunks > 0,
       "host slot refilled in one plan: X's return read %u history tokens from host (more than %d), %" PRIu64
       " chunk records dropped", got[3].res.reused_host, CHUNK, es.dropped_chunks);
}

static pv_status one_turn(pv_engine *e, const char *id, const int32_t *toks, size_t n, const pv_sampling *s,
                          text_out *out)
{
    pv_turn t = {.tokens = toks, .n_tokens = n, .sampling = *s};
    pv_turn_callbacks cb = {text_on_token, text_on_done, out};
    memset(out, 0, sizeof *out);
    pv_status st = pv_engine_submit(e, id, &t, &cb, NULL);
    return st == PV_OK ? pv_engine_run(e) : st;
}

static double fake_now;
static double fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static void sampling_and_stops(void)
{
    eu_model m;
    pv_status st = eu_model_init(&m, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu: synthetic model (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return;
    }
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m.model);
    cc.host_bytes = 64 * slot;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);

    /* Sampled turns: the same seed draws the same tokens in stateless mode
     * and in pensieve mode under pressure; another seed draws others. */
    static eu_turn turns[N_TURNS];
    eu_script(turns, N_SESSIONS, 2, m.tok.n_vocab, 3, 20, 10);
    int n = N_SESSIONS * 2;
    static text_out outs[3][N_SESSIONS * 2];
    for (int run = 0; run < 3; run++) {
        ec.mode = run == 1 ? PV_MODE_PENSIEVE : PV_MODE_STATELESS;
        cc.device_bytes = (run == 1 ? 24 : 1024) * slot;
        pv_engine *e = NULL;
        if ((st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, &ec)) != PV_OK)
            break;
        for (int i = 0; i < n && st == PV_OK; i++) {
            char id[16];
            snprintf(id, sizeof id, "s%d", turns[i].session);
            pv_sampling s;
            pv_sampling_defaults(&s);
            s.temperature = 0.9f;
            s.top_p = 0.9f;
            s.seed = run == 2 ? 99 : 5;
            s.max_tokens = turns[i].max_tokens;
            s.ignore_eos = 1;
            st = one_turn(e, id, turns[i].prompt, (size_t)turns[i].n_prompt, &s, &outs[run][i]);
        }
        pv_engine_free(e);
    }
    int same = st == PV_OK, differs = 0;
    for (int i = 0; i < n; i++) {
        same &= outs[0][i].n == outs[1][i].n && memcmp(outs[0][i].text, outs[1][i].text, outs[0][i].n) == 0;
        differs |= outs[0][i].n != outs[2][i].n || memcmp(outs[0][i].text, outs[2][i].text, outs[0][i].n) != 0;
    }
    ok(same, "sampled turns (temperature 0.9, top-p 0.9): pensieve mode under pressure draws stateless mode's "
       "tokens (%s)", st == PV_OK ? "ok" : pv_last_error());
    ok(differs, "another seed draws other tokens");

    /* Stop strings: the answer ends just before the first occurrence of a
     * string taken from the middle of the unstopped answer, and the string
     * itself is never streamed. */
    cc.device_bytes = 1024 * slot;
    ec.mode = PV_MODE_PENSIEVE;
    pv_engine *e = NULL;
    text_out full, cut;
    pv_sampling s;
    pv_sampling_defaults(&s);
    s.max_tokens = 40;
    s.ignore_eos = 1;
    s.temperature = 1.0f; /* varied text (greedy repeats one token here); same seed, same draws */
    s.seed = 17;
    if ((st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, &ec)) == PV_OK)
        st = one_turn(e, "full", turns[0].prompt, (size_t)turns[0].n_prompt, &s, &full);
    char stop[8] = "";
    if (st == PV_OK && full.n > 12) {
        /* Three bytes whose first occurrence is well inside the answer. */
        for (size_t at = full.n / 2; at + 3 <= full.n; at++) {
            memcpy(stop, full.text + at, 3);
            const char *hit = strstr(full.text, stop);
            if (hit && hit - full.text >= 4)
                break;
        }
        const char *stops[] = {"never-in-the-answer", stop};
        s.stop = stops;
        s.n_stop = 2;
        st = one_turn(e, "cut", turns[0].prompt, (size_t)turns[0].n_prompt, &s, &cut);
    }
    const char *first = st == PV_OK ? strstr(full.text, stop) : NULL;
    size_t expect = first ? (size_t)(first - full.text) : 0;
    ok(st == PV_OK && first && cut.n == expect && memcmp(cut.text, full.text, expect) == 0 &&
           cut.res.finish == PV_FINISH_STOP && !strstr(cut.text, stop),
       "a stop string ends the answer before it (%zu of %zu bytes streamed, finish %s)", cut.n, full.n,
       pv_finish_reason_name(cut.res.finish));
    pv_engine_free(e);

    /* Idle timeout on an injected clock. */
    ec.idle_timeout_s = 10;
    ec.clock = fake_clock;
    fake_now = 100;
    s.stop = NULL;
    s.n_stop = 0;
    s.max_tokens = 3;
    size_t tokens = 0;
    if ((st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, &ec)) == PV_OK)
        st = one_turn(e, "idle", turns[0].prompt, 5, &s, &full);
    fake_now = 105;
    pv_engine_step(e, NULL);
    int kept = pv_engine_session_tokens(e, "idle", &tokens) == PV_OK && tokens == 8;
    fake_now = 111;
    pv_engine_step(e, NULL);
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    pv_cache_stats cs;
    pv_cache_stats_get(pv_engine_cache(e), &cs);
    ok(st == PV_OK && kept && pv_engine_session_tokens(e, "idle", &tokens) == PV_ERR_NOT_FOUND &&
           es.sessions_timed_out == 1 && cs.sessions == 0 && cs.used_bytes[PV_TIER_DEVICE] == 0,
       "a session idle past the timeout is ended, its KV freed (kept at 5 s: %d)", kept);
    pv_engine_free(e);

    /* A turn that arrives makes its history active from then, not from the
     * last answer: eviction must not take a waiting turn for the idlest. */
    ec.idle_timeout_s = 0;
    fake_now = 100;
    e = NULL;
    if ((st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, &ec)) == PV_OK)
        st = one_turn(e, "back", turns[0].prompt, 5, &s, &full);
    pv_session_view before = {0}, queued = {0};
    if (st == PV_OK)
        st = pv_cache_session_restore(pv_engine_cache(e), "back", &before);
    fake_now = 160;
    pv_turn again = {.tokens = turns[0].prompt, .n_tokens = 3, .sampling = s};
    if (st == PV_OK && (st = pv_engine_submit(e, "back", &again, NULL, NULL)) == PV_OK)
        st = pv_cache_session_restore(pv_engine_cache(e), "back", &queued);
    ok(st == PV_OK && before.last_active == 100 && queued.last_active == 160 && pv_engine_run(e) == PV_OK,
       "a queued turn's history is active from its arrival (last active %g, then %g)", before.last_active,
       queued.last_active);
    pv_engine_free(e);
    eu_model_free(&m);
}

/* ---- bad input ------------------------------------------------------------------ */

static void bad_input(void)
{
    eu_model m;
    pv_status st = eu_model_init(&m, "cpu", LAYERS, 128, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu: synthetic model for bad input (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return;
    }
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m.model);
    pv_engine *e = NULL;

    cc.device_bytes = (LAYERS - 1) * slot;
    cc.host_bytes = 16 * slot;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, NULL);
    ok(st == PV_ERR_INVALID_ARG && e == NULL && strstr(pv_last_error(), "fewer than one chunk of each"),
       "a device budget under one layer's worth of slots is refused: %s", pv_last_error());

    cc.device_bytes = 64 * slot;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, NULL);
    if (!ok(st == PV_OK, "engine init (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return;
    }
    pv_turn t = {0};
    pv_sampling_defaults(&t.sampling);
    t.sampling.max_tokens = 4;
    st = pv_engine_submit(e, "a", &t, NULL, NULL);
    ok(st == PV_ERR_INVALID_ARG && pv_engine_pending(e) == 0, "an empty turn is refused: %s", pv_last_error());

    int32_t toks[200];
    for (int i = 0; i < 200; i++)
        toks[i] = 3 + i % 50;
    t.tokens = toks;
    t.n_tokens = 128;
    st = pv_engine_submit(e, "a", &t, NULL, NULL);
    ok(st == PV_ERR_CAPACITY && strstr(pv_last_error(), "context of 128"),
       "a turn past the model's context is refused (PV_ERR_CAPACITY), not truncated: %s", pv_last_error());

    t.n_tokens = 1;
    toks[0] = 1 << 20;
    st = pv_engine_submit(e, "a", &t, NULL, NULL);
    ok(st == PV_ERR_INVALID_ARG, "a token id past the vocabulary is refused as an invalid argument, not capacity: %s",
       pv_last_error());
    toks[0] = 5;

    st = pv_engine_end_session(e, "nobody");
    ok(st == PV_ERR_NOT_FOUND, "ending an unknown session: %s", pv_last_error());

    eu_result r = {0};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, &r};
    t.n_tokens = 10;
    st = pv_engine_submit(e, "a", &t, &cb, NULL);
    ok(st == PV_OK, "a valid turn is queued");
    st = pv_engine_submit(e, "a", &t, &cb, NULL);
    ok(st == PV_ERR_BUSY, "a second turn while one is queued: %s", pv_last_error());
    st = pv_engine_end_session(e, "a");
    ok(st == PV_ERR_BUSY, "ending a session with a turn queued: %s", pv_last_error());
    st = pv_engine_run(e);
    ok(st == PV_OK && r.done == 1 && r.status == PV_OK && r.n == 4, "the turn runs: %d tokens", r.n);

    /* History 13 + the pending token + 110 new = 124 tokens: 4 more fill
     * the 128-token context (the last one is sampled, not run). */
    memset(&r, 0, sizeof r);
    t.n_tokens = 110;
    t.sampling.max_tokens = 0;
    st = pv_engine_submit(e, "a", &t, &cb, NULL);
    if (st == PV_OK)
        st = pv_engine_run(e);
    ok(st == PV_OK && r.done == 1 && r.res.finish == PV_FINISH_LENGTH && r.n == 128 - 124,
       "generation stops at the context limit with finish=length (%d tokens, %s)", r.n,
       pv_finish_reason_name(r.res.finish));
    ok(pv_engine_check(e) == PV_OK, "invariants hold after the bad input");

    st = pv_engine_end_session(e, "a");
    ok(st == PV_OK, "ending the session");
    pv_cache_stats cs;
    pv_cache_stats_get(pv_engine_cache(e), &cs);
    ok(cs.used_bytes[PV_TIER_DEVICE] == 0 && cs.used_bytes[PV_TIER_HOST] == 0 && cs.sessions == 0,
       "ending it frees every tier (%" PRIu64 " device, %" PRIu64 " host bytes left)",
       cs.used_bytes[PV_TIER_DEVICE], cs.used_bytes[PV_TIER_HOST]);
    st = pv_engine_end_session(e, "a");
    ok(st == PV_ERR_NOT_FOUND, "ending it twice: %s", pv_last_error());
    pv_engine_free(e);

    /* A device pool of 16 slots: 4 chunks of 16 tokens for each of the 4
     * layers, 64 tokens of KV. A session whose own context fills it with
     * nothing else running is admitted anyway (waiting would free nothing;
     * the reserve gives way). A turn past it is refused at submit, before
     * it generates anything, naming the budget that would fit; the session
     * stays usable. */
    cc.device_bytes = 16 * slot;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, NULL);
    const int lens[3] = {40, 16, 10}, gens[3] = {4, 2, 2};
    eu_result rr[3];
    memset(rr, 0, sizeof rr);
    pv_status sub[3] = {PV_OK, PV_OK, PV_OK};
    char refused[512] = "";
    for (int i = 0; i < 3 && st == PV_OK; i++) {
        pv_turn_callbacks c3 = {eu_on_token, eu_on_done, &rr[i]};
        t.n_tokens = (size_t)lens[i];
        t.sampling.max_tokens = gens[i];
        if ((sub[i] = pv_engine_submit(e, "big", &t, &c3, NULL)) == PV_OK)
            st = pv_engine_run(e);
        else
            snprintf(refused, sizeof refused, "%s", pv_last_error());
    }
    /* Turn 2 runs 43 + 1 pending + 16 tokens and generates 2: 61 tokens of
     * KV. Turn 3 would need 61 + 1 + 10 + 2 - 1 = 73: 5 chunks, 20 slots. */
    ok(st == PV_OK && rr[0].status == PV_OK && rr[1].status == PV_OK && rr[1].n == 2,
       "a turn whose context fills the device pool runs when nothing else does (%s)",
       st == PV_OK ? "ok" : pv_last_error());
    char want[64];
    snprintf(want, sizeof want, "(--device-mem %lluM)",
             (unsigned long long)((20 * slot + (1u << 20) - 1) >> 20));
    ok(sub[2] == PV_ERR_CAPACITY && rr[2].done == 0 && rr[2].n == 0 && pv_engine_pending(e) == 0 &&
           strstr(refused, "it needs 5 chunks of 16 tokens in each of 4 layers (20 slots), the pool holds 16 slots") &&
           strstr(refused, want),
       "a turn past the device pool is refused at submit with the budget that fits: %s", refused);

    /* Bounded turns: history + prompt + max_tokens - 1 tokens of KV. The
     * session now holds 61 + 1 pending: 1 new token and 2 generated fill
     * the pool to the last token; 3 are one too many. */
    eu_result rb;
    memset(&rb, 0, sizeof rb);
    pv_turn_callbacks cbb = {eu_on_token, eu_on_done, &rb};
    t.n_tokens = 1;
    t.sampling.max_tokens = 3;
    pv_status over = pv_engine_submit(e, "big", &t, &cbb, NULL);
    snprintf(refused, sizeof refused, "%s", pv_last_error());
    ok(over == PV_ERR_CAPACITY && strstr(refused, "or max_tokens 2 or less"),
       "one generated token past the pool is refused, naming the max_tokens that fits: %s", refused);
    t.sampling.max_tokens = 2;
    st = pv_engine_submit(e, "big", &t, &cbb, NULL);
    if (st == PV_OK)
        st = pv_engine_run(e);
    ok(st == PV_OK && rb.done == 1 && rb.status == PV_OK && rb.n == 2 && pv_engine_check(e) == PV_OK,
       "the session stays usable: a turn that fills the pool exactly runs (%s)",
       st == PV_OK ? pv_status_str(rb.status) : pv_last_error());
    /* Full: even unbounded, no room for the next prompt. */
    t.sampling.max_tokens = 0;
    st = pv_engine_submit(e, "big", &t, &cbb, NULL);
    ok(st == PV_ERR_CAPACITY && strstr(pv_last_error(), "the device pool cannot hold this turn"),
       "a full session's next turn is refused, bounded or not: %s", pv_last_error());

    /* Unbounded generation stops where the pool is full: 40 tokens of
     * prompt, then 64 - 40 run and one more sampled, finish "length". The
     * first session's chunks are evicted for it. */
    eu_result ru;
    memset(&ru, 0, sizeof ru);
    pv_turn_callbacks cbu = {eu_on_token, eu_on_done, &ru};
    t.n_tokens = 40;
    t.sampling.max_tokens = 0;
    t.sampling.ignore_eos = 1;
    st = pv_engine_submit(e, "unbounded", &t, &cbu, NULL);
    if (st == PV_OK)
        st = pv_engine_run(e);
    ok(st == PV_OK && ru.done == 1 && ru.status == PV_OK && ru.res.finish == PV_FINISH_LENGTH && ru.n == 25,
       "unbounded generation stops when the device pool is full, finish=length (%d tokens, %s, %s)", ru.n,
       pv_finish_reason_name(ru.res.finish), st == PV_OK ? pv_status_str(ru.status) : pv_last_error());
    t.sampling.ignore_eos = 0;
    ok(pv_engine_pending(e) == 0 && pv_engine_check(e) == PV_OK && pv_engine_end_session(e, "big") == PV_OK,
       "nothing stays queued; invariants hold; the session can be ended");
    pv_engine_free(e);

    /* The slots the message names are enough: a pool of 20 slots runs the
     * turn that 16 refused (40 tokens + 26 generated: 65 of KV). */
    cc.device_bytes = 16 * slot;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, NULL);
    t.n_tokens = 40;
    t.sampling.max_tokens = 26;
    over = st == PV_OK ? pv_engine_submit(e, "edge", &t, NULL, NULL) : st;
    snprintf(refused, sizeof refused, "%s", pv_last_error());
    pv_engine_free(e);
    cc.device_bytes = 20 * slot;
    eu_result rf;
    memset(&rf, 0, sizeof rf);
    pv_turn_callbacks cbf = {eu_on_token, eu_on_done, &rf};
    t.sampling.ignore_eos = 1;
    st = pv_engine_init(&e, m.be, m.model, &m.tok, &cc, NULL);
    if (st == PV_OK && (st = pv_engine_submit(e, "edge", &t, &cbf, NULL)) == PV_OK)
        st = pv_engine_run(e);
    t.sampling.ignore_eos = 0;
    ok(over == PV_ERR_CAPACITY && strstr(refused, "(20 slots)") && st == PV_OK && rf.status == PV_OK &&
           rf.n == 26,
       "the slots a refusal names run the turn (%s; then %d tokens)", refused, rf.n);
    /* Freed mid-turn: one running, one queued (LeakSanitizer checks the rest). */
    eu_result r1, r2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    pv_turn_callbacks c1 = {eu_on_token, eu_on_done, &r1}, c2 = {eu_on_token, eu_on_done, &r2};
    t.n_tokens = 20;
    t.sampling.max_tokens = 8;
    int mid = pv_engine_submit(e, "x", &t, &c1, NULL) == PV_OK && pv_engine_step(e, NULL) == PV_OK &&
              pv_engine_submit(e, "y", &t, &c2, NULL) == PV_OK && pv_engine_pending(e) == 2;
    ok(mid && r1.done == 0 && r2.done == 0, "an engine with a turn running and one queued");
    pv_engine_free(e);
    pv_engine_free(NULL);
    eu_model_free(&m);
}

int main(void)
{
    const char *backends[] = {"cpu", "opencl", "cuda"};
    for (size_t b = 0; b < sizeof backends / sizeof *backends; b++) {
        equivalence(backends[b], PV_F32);
        equivalence(backends[b], PV_F16);
    }
    host_refused();
    eu_model m;
    pv_status st = eu_model_init(&m, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (ok(st == PV_OK, "cpu: synthetic model for the directed scripts (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        partial_chunk_from_host(&m);
        host_slot_refilled(&m);
    }
    eu_model_free(&m);
    sampling_and_stops();
    bad_input();
    return tap_done();
}
