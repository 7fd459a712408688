/* Shared prefixes through the engine (issue 28), on the synthetic model
 * and on SmolLM2 when scripts/get-model installed it (cpu backend).
 *
 * Conversations in two namespaces (API keys) start with one of two system
 * prompts and go on with turns of their own, several sessions in flight at
 * once. The oracle is the fresh answer: the whole conversation as one turn
 * of a new session on a stateless engine without sharing. With sharing,
 * in each mode (pensieve, gpu-only, stateless) and under budgets that
 * force swaps and drops, every answer must be that one exactly, and
 * pv_engine_check() must pass after every step (its slot check allows a
 * slot in two running contexts only for a shared chunk). Sharing must
 * show: later sessions' first turns link the prompt (shared_tokens), the
 * cache holds it once, a second namespace shares nothing with the first,
 * and the switch off shares nothing at all. */
#include "engine-util.h"

#include <pensieve/state.h>

#include <inttypes.h>
#include <unistd.h>

#define LAYERS 3
#define CHUNK 16
#define N_CTX 512
#define MAX_CONV 400
#define SESSIONS 8
#define ROUNDS 3
#define PROMPT 84          /* 5 full chunks and 4 tokens */

static eu_model M;
static uint64_t SLOT;
static pv_engine *REF;
static int32_t system_prompt[2][PROMPT];

typedef struct conv {
    int32_t v[MAX_CONV];
    int n;
} conv;

static uint64_t rng_state = 0x28;

static int32_t any_token(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return 3 + (int32_t)((rng_state >> 33) % (M.tok.n_vocab - 3));
}

static pv_sampling greedy(int max_tokens)
{
    pv_sampling s;
    pv_sampling_defaults(&s);
    s.max_tokens = max_tokens;
    s.ignore_eos = 1;
    return s;
}

static pv_engine *new_engine(pv_engine_mode mode, uint64_t device_slots, uint64_t host_slots, int sharing)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = device_slots * SLOT;
    cc.host_bytes = host_slots * SLOT;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.token_budget = 64;
    ec.max_running = 4;
    ec.swap_out_chunks = 4;
    ec.prefix_sharing = sharing;
    pv_engine *e = NULL;
    if (pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec) != PV_OK) {
        tap_diag("engine init: %s", pv_last_error());
        return NULL;
    }
    return e;
}

static int bad_checks;
static char first_bad[512];

static pv_status drive(pv_engine *e)
{
    while (pv_engine_pending(e) > 0) {
        int worked = 0;
        pv_status st = pv_engine_step(e, &worked);
        if (st != PV_OK)
            return st;
        if (!worked)
            return pv_error(PV_ERR_STATE, "%zu turns pending, no progress", pv_engine_pending(e));
        if (pv_engine_check(e) != PV_OK && !bad_checks++)
            snprintf(first_bad, sizeof first_bad, "%s", pv_last_error());
    }
    return PV_OK;
}

static void fresh(const conv *c, int max_tokens, eu_result *out)
{
    memset(out, 0, sizeof *out);
    pv_turn t = {.tokens = c->v, .n_tokens = (size_t)c->n, .sampling = greedy(max_tokens)};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, out};
    if (pv_engine_submit(REF, "fresh", &t, &cb, NULL) != PV_OK || drive(REF) != PV_OK ||
        pv_engine_end_session(REF, "fresh") != PV_OK)
        out->n = -1;
}

static int same(const eu_result *a, const eu_result *b)
{
    return a->done == 1 && b->done == 1 && a->status == PV_OK && b->status == PV_OK && a->n == b->n &&
           memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n) == 0;
}

/* Session i: namespace k1 or k2 (halves), system prompt (i / 2) % 2: the
 * sessions of a pair share a prompt, and run together after round 0. */
static void session_name(int i, char *buf)
{
    snprintf(buf, 32, "k%d:s%d", i < SESSIONS / 2 ? 1 : 2, i);
}

static conv convs[SESSIONS]; /* each session's conversation as its client sees it */

typedef struct run_stats {
    int answers, equal;
    uint32_t shared_first[SESSIONS]; /* shared_tokens of each first turn */
    uint64_t max_shared_chunks, swaps, drops;
    uint64_t first_turn_ms[SESSIONS];
} run_stats;

/* ROUNDS rounds over SESSIONS sessions: the first turns one at a time (so
 * later sessions find the prompt published), then `concurrent` sessions'
 * turns in flight at once (reading shared chunks together). */
static void run(pv_engine *e, int concurrent, run_stats *rs)
{
    memset(rs, 0, sizeof *rs);
    rng_state = 0x28;
    for (int i = 0; i < SESSIONS; i++)
        convs[i].n = 0;
    for (int round = 0; round < ROUNDS; round++)
        for (int base = 0, step = round ? concurrent : 1; base < SESSIONS; base += step) {
            static eu_result got[SESSIONS];
            int end = base + step < SESSIONS ? base + step : SESSIONS;
            for (int i = base; i < end; i++) {
                conv *c = &convs[i];
                int32_t turn[PROMPT + 8];
                int n = 0;
                if (round == 0)
                    for (; n < PROMPT; n++)
                        turn[n] = system_prompt[(i / 2) % 2][n];
                for (int k = 0; k < 4 + i % 3; k++)
                    turn[n++] = any_token();
                memcpy(c->v + c->n, turn, (size_t)n * sizeof *turn);
                c->n += n;
                char sid[32];
                session_name(i, sid);
                memset(&got[i], 0, sizeof got[i]);
                pv_turn t = {.tokens = turn, .n_tokens = (size_t)n, .sampling = greedy(6)};
                pv_turn_callbacks cb = {eu_on_token, eu_on_done, &got[i]};
                if (pv_engine_submit(e, sid, &t, &cb, NULL) != PV_OK)
                    got[i].status = PV_ERR_STATE;
            }
            if (drive(e) != PV_OK && !bad_checks++)
                snprintf(first_bad, sizeof first_bad, "drive: %s", pv_last_error());
            pv_engine_stats es;
            pv_engine_stats_get(e, &es);
            if (es.shared_chunks > rs->max_shared_chunks)
                rs->max_shared_chunks = es.shared_chunks;
            for (int i = base; i < end; i++) {
                eu_result want;
                fresh(&convs[i], 6, &want);
                rs->answers++;
                if (same(&got[i], &want))
                    rs->equal++;
                else if (rs->equal + 1 == rs->answers)
                    tap_diag("round %d session %d: %d tokens (status %d), fresh %d", round, i, got[i].n,
                             got[i].status, want.n);
                if (round == 0)
                    rs->shared_first[i] = got[i].res.shared_tokens;
                memcpy(convs[i].v + convs[i].n, got[i].tokens, (size_t)got[i].n * sizeof(int32_t));
                convs[i].n += got[i].n;
            }
        }
    pv_engine_stats es;
    pv_engine_stats_get(e, &es);
    rs->swaps = es.swap_in_chunks + es.swap_out_chunks;
    rs->drops = es.dropped_chunks;
}

static void mode_case(const char *what, pv_engine_mode mode, uint64_t device, uint64_t host, int concurrent,
                      int need_pressure)
{
    pv_engine *e = new_engine(mode, device, host, 1);
    if (!e) {
        ok(0, "%s: engine", what);
        return;
    }
    run_stats rs;
    bad_checks = 0;
    run(e, concurrent, &rs);
    ok(rs.equal == rs.answers, "%s: %d of %d answers equal the fresh ones", what, rs.equal, rs.answers);
    ok(bad_checks == 0, "%s: pv_engine_check after every step (%d failed%s%s)", what, bad_checks,
       bad_checks ? ": " : "", first_bad);
    /* The second session of each pair finds its prompt. */
    int later_shared = 0;
    for (int i = 1; i < SESSIONS; i += 2)
        later_shared += rs.shared_first[i] >= (PROMPT / CHUNK) * CHUNK && rs.shared_first[i - 1] == 0;
    if (mode != PV_MODE_STATELESS)
        ok(later_shared == SESSIONS / 2 && rs.max_shared_chunks > 0,
           "%s: the second session of each pair links the %d prompt chunks on its first turn, the first "
           "links none (%d of %d pairs; up to %" PRIu64 " shared chunks)",
           what, PROMPT / CHUNK, later_shared, SESSIONS / 2, rs.max_shared_chunks);
    if (need_pressure)
        ok(rs.drops > 0 && (host == 0 || rs.swaps > 0), "%s: the budget forced %" PRIu64 " drops and %" PRIu64
           " swapped chunks", what, rs.drops, rs.swaps);
    pv_engine_free(e);
}

/* Namespaces: the first k2 session shares nothing with k1's sessions that
 * hold the same prompt; it holds its own copy (bytes show it). */
static void isolation(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 4096, 0, 1);
    if (!e) {
        ok(0, "isolation: engine");
        return;
    }
    run_stats rs;
    run(e, 1, &rs);
    /* k1: sessions 0..3 (prompts 0,0,1,1); k2: 4..7 (prompts 0,0,1,1). */
    ok(rs.shared_first[4] == 0 && rs.shared_first[6] == 0 && rs.shared_first[5] > 0 && rs.shared_first[7] > 0,
       "namespaces: k2's first sessions of each prompt share nothing with k1 (%u, %u tokens), the next ones "
       "share k2's own (%u, %u)",
       rs.shared_first[4], rs.shared_first[6], rs.shared_first[5], rs.shared_first[7]);
    pv_session_view v4, v2;
    pv_cache *cache = pv_engine_cache(e);
    pv_cache_session_restore(cache, "k2:s4", &v4);
    pv_cache_session_restore(cache, "k1:s0", &v2);
    pv_tier t4, t2;
    uint32_t slot4 = 0, slot2 = 0;
    pv_cache_peek(cache, "k2:s4", 0, 0, &t4, &slot4, NULL);
    pv_cache_peek(cache, "k1:s0", 0, 0, &t2, &slot2, NULL);
    ok(v4.shared_chunks == PROMPT / CHUNK && v2.shared_chunks == PROMPT / CHUNK && t4 == PV_TIER_DEVICE &&
           t2 == PV_TIER_DEVICE && slot4 != slot2,
       "namespaces: k2:s4 and k1:s0 share the same prompt's %u and %u chunks, each in its own copy (device "
       "slots %u and %u)",
       v4.shared_chunks, v2.shared_chunks, slot4, slot2);
    /* Two copies of each prompt: one per namespace. */
    pv_cache_stats cs;
    pv_cache_stats_get(cache, &cs);
    ok(cs.shared_chunks == 4 * (PROMPT / CHUNK) && cs.shared_saved_bytes[PV_TIER_DEVICE] ==
       (uint64_t)4 * (PROMPT / CHUNK) * LAYERS * SLOT,
       "the cache holds each prompt once per namespace: %" PRIu64 " shared chunks, %" PRIu64 " bytes saved",
       cs.shared_chunks, cs.shared_saved_bytes[PV_TIER_DEVICE]);
    pv_engine_free(e);
}

/* A state export carries its own copy of the shared chunks; imported, the
 * session holds them as its own and answers as before. */
static void state_roundtrip(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 4096, 4096, 1);
    if (!e) {
        ok(0, "state: engine");
        return;
    }
    run_stats rs;
    bad_checks = 0;
    run(e, 1, &rs);
    pv_session_view before, after;
    pv_cache *cache = pv_engine_cache(e);
    pv_cache_session_restore(cache, "k1:s1", &before);
    pv_session_image *img = NULL;
    pv_status st = pv_engine_session_export(e, "k1:s1", 1, &img, NULL);
    if (st == PV_OK)
        st = pv_engine_end_session(e, "k1:s1");
    if (st == PV_OK)
        st = pv_engine_session_import(e, img, NULL);
    pv_session_image_free(img);
    if (st == PV_OK)
        st = pv_cache_session_restore(cache, "k1:s1", &after);
    uint32_t own = after.records[0] + after.records[1] + after.records[2];
    ok(st == PV_OK && before.shared_chunks == PROMPT / CHUNK && after.shared_chunks == 0 &&
           own == after.n_chunks * LAYERS && pv_engine_check(e) == PV_OK,
       "state: an export of a session sharing %u chunks imports as its own copy (%u shared, %u of %u records "
       "its own): %s",
       before.shared_chunks, after.shared_chunks, own, after.n_chunks * LAYERS, st == PV_OK ? "ok" : pv_last_error());
    /* Its next turn answers as a fresh run of the whole conversation. */
    conv *c = &convs[1];
    int32_t more[5];
    for (int k = 0; k < 5; k++)
        more[k] = c->v[k + 7];
    memcpy(c->v + c->n, more, sizeof more);
    c->n += 5;
    eu_result got, want;
    memset(&got, 0, sizeof got);
    pv_turn t = {.tokens = more, .n_tokens = 5, .sampling = greedy(6)};
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, &got};
    if (pv_engine_submit(e, "k1:s1", &t, &cb, NULL) != PV_OK || drive(e) != PV_OK)
        got.status = PV_ERR_STATE;
    fresh(c, 6, &want);
    ok(same(&got, &want) && bad_checks == 0, "state: the imported session's next answer equals the fresh one "
       "(%d tokens, fresh %d)", got.n, want.n);
    pv_engine_free(e);
}

static void switched_off(void)
{
    pv_engine *e = new_engine(PV_MODE_PENSIEVE, 4096, 0, 0);
    if (!e) {
        ok(0, "off: engine");
        return;
    }
    run_stats rs;
    bad_checks = 0;
    run(e, 2, &rs);
    uint32_t any = 0;
    for (int i = 0; i < SESSIONS; i++)
        any += rs.shared_first[i];
    ok(rs.equal == rs.answers && any == 0 && rs.max_shared_chunks == 0,
       "prefix_sharing 0: %d of %d answers equal, %u tokens shared, %" PRIu64 " shared chunks", rs.equal,
       rs.answers, any, rs.max_shared_chunks);
    pv_engine_free(e);
}

/* The model in M is loaded: its slot size, the two prompts, the reference. */
static int start(void)
{
    SLOT = pv_llama_slot_bytes(M.model);
    rng_state = 0x28;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < PROMPT; k++)
            system_prompt[p][k] = any_token();
    REF = new_engine(PV_MODE_STATELESS, 4096 * pv_llama_hparams_of(M.model)->n_layers, 0, 0);
    return ok(REF != NULL, "reference engine");
}

int main(int argc, char **argv)
{
    eu_passive_openmp(argc, argv);
    pv_status st = eu_model_init(&M, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu: synthetic model (%s)", st == PV_OK ? "ok" : pv_last_error()) || !start()) {
        eu_model_free(&M);
        return tap_done();
    }
    /* Roomy: sharing on every path without pressure. */
    mode_case("pensieve, roomy", PV_MODE_PENSIEVE, 4096, 4096, 1, 0);
    mode_case("pensieve, roomy, 4 at once", PV_MODE_PENSIEVE, 4096, 4096, 4, 0);
    /* Tight: each session's context is ~8 chunks x 3 layers = 24 slots. */
    mode_case("pensieve, 60 device + 40 host slots", PV_MODE_PENSIEVE, 60, 40, 2, 1);
    mode_case("gpu-only, 60 device slots", PV_MODE_GPU_ONLY, 60, 0, 2, 1);
    mode_case("stateless with sharing", PV_MODE_STATELESS, 4096, 0, 4, 0);
    isolation();
    state_roundtrip();
    switched_off();
    pv_engine_free(REF);
    eu_model_free(&M);

    /* SmolLM2 (scripts/get-model), the same conversations in every mode
     * under the same pressure: 20 chunk columns of device, 13 of host. */
#ifdef __SANITIZE_ADDRESS__
    /* Six times slower there (5 minutes); the synthetic cases above run
     * the same paths under the sanitizers. */
    tap_skip("SmolLM2 under AddressSanitizer: the plain build runs it");
    return tap_done();
#endif
    char path[4096];
    if (pv_default_model_path(path, sizeof path) != PV_OK || access(path, R_OK) != 0) {
        tap_skip("SmolLM2 absent (%s): run scripts/get-model", path);
        return tap_done();
    }
    pv_gguf g;
    if ((st = pv_gguf_init(&g, path)) == PV_OK) {
        pv_llama_options o;
        pv_llama_options_default(&o);
        o.chunk_tokens = CHUNK;
        o.max_batch_tokens = 128;
        o.max_logit_rows = 16;
        memset(&M, 0, sizeof M);
        if ((st = pv_tokenizer_init(&M.tok, &g)) == PV_OK && (st = pv_backend_init(&M.be, "cpu", 0)) == PV_OK)
            st = pv_llama_init(&M.model, M.be, &g, &o);
        pv_gguf_free(&g);
    }
    if (!ok(st == PV_OK, "SmolLM2 loads (%s)", st == PV_OK ? "ok" : pv_last_error()) || !start()) {
        eu_model_free(&M);
        return tap_done();
    }
    uint64_t L = pv_llama_hparams_of(M.model)->n_layers;
    mode_case("SmolLM2, pensieve, 20 + 13 chunk columns", PV_MODE_PENSIEVE, 20 * L, 13 * L, 2, 1);
    mode_case("SmolLM2, gpu-only, 20 chunk columns", PV_MODE_GPU_ONLY, 20 * L, 0, 2, 1);
    mode_case("SmolLM2, stateless with sharing", PV_MODE_STATELESS, 4096 * L, 0, 4, 0);
    pv_engine_free(REF);
    eu_model_free(&M);
    return tap_done();
}
