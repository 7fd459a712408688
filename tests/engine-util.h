/* Shared by the engine tests: the synthetic model on a backend, and a
 * scripted multi-session conversation run through an engine, recording
 * every turn's generated tokens. */
#ifndef PV_TESTS_ENGINE_UTIL_H
#define PV_TESTS_ENGINE_UTIL_H

#include <pensieve/engine.h>

#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Spinning OpenMP workers starve the engine's other threads (a loop, a copy
 * queue, clients) on a small machine and burn CPU while idle; libgomp reads
 * its settings at load, so set them and start the test again. */
static inline void eu_passive_openmp(int argc, char **argv)
{
    if (argc > 0 && !getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "passive", 1);
        execv("/proc/self/exe", argv);
    }
}

typedef struct eu_model {
    pv_backend *be;
    pv_llama *model;
    pv_tokenizer tok;
} eu_model;

/* The synthetic model (n_layers layers, context n_ctx, logits for up to
 * max_logit_rows rows a pass, pv_llama_options.graph_buckets as given) on
 * backend be (NULL: open backend `name`), which m owns from now on, also
 * on failure. PV_ERR_NO_DEVICE / PV_ERR_NOT_FOUND when the backend is
 * absent. */
static inline pv_status eu_model_init_buckets(eu_model *m, pv_backend *be, const char *name, uint32_t n_layers,
                                              uint32_t n_ctx, pv_dtype kv, int32_t chunk_tokens,
                                              int32_t max_logit_rows, int graph_buckets)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    pv_synth_config c;
    pv_synth_config_default(&c);
    c.n_layers = n_layers;
    c.n_ctx = n_ctx;
    uint8_t *image = NULL;
    uint64_t size = 0;
    pv_gguf g;
    pv_status st = pv_synth_to_memory(&c, &image, &size);
    if (st != PV_OK)
        return st;
    if ((st = pv_gguf_init_memory(&g, image, size)) != PV_OK) {
        free(image);
        return st;
    }
    pv_llama_options o;
    pv_llama_options_default(&o);
    o.kv_dtype = kv;
    o.chunk_tokens = chunk_tokens;
    o.max_batch_tokens = 128;
    o.max_logit_rows = max_logit_rows;
    o.graph_buckets = graph_buckets;
    if ((st = pv_tokenizer_init(&m->tok, &g)) == PV_OK && (m->be || (st = pv_backend_init(&m->be, name, 0)) == PV_OK))
        st = pv_llama_init(&m->model, m->be, &g, &o);
    pv_gguf_free(&g);
    free(image);
    return st;
}

/* eu_model_init_buckets with the default buckets. */
static inline pv_status eu_model_init_rows(eu_model *m, pv_backend *be, const char *name, uint32_t n_layers,
                                           uint32_t n_ctx, pv_dtype kv, int32_t chunk_tokens, int32_t max_logit_rows)
{
    return eu_model_init_buckets(m, be, name, n_layers, n_ctx, kv, chunk_tokens, max_logit_rows, 1);
}

static inline pv_status eu_model_init_on(eu_model *m, pv_backend *be, const char *name, uint32_t n_layers,
                                         uint32_t n_ctx, pv_dtype kv, int32_t chunk_tokens)
{
    return eu_model_init_rows(m, be, name, n_layers, n_ctx, kv, chunk_tokens, 16);
}

static inline pv_status eu_model_init(eu_model *m, const char *name, uint32_t n_layers, uint32_t n_ctx,
                                      pv_dtype kv, int32_t chunk_tokens)
{
    return eu_model_init_on(m, NULL, name, n_layers, n_ctx, kv, chunk_tokens);
}

static inline void eu_model_free(eu_model *m)
{
    pv_llama_free(m->model);
    pv_tokenizer_free(&m->tok);
    pv_backend_free(m->be);
    memset(m, 0, sizeof *m);
}

/* eu_model_init for a test of backend `name`: 1 when the model is ready;
 * 0 after a SKIP line (the backend is absent here) or a failed check, the
 * model freed. */
static inline int eu_model_ready(eu_model *m, const char *name, uint32_t n_layers, uint32_t n_ctx, pv_dtype kv,
                                 int32_t chunk_tokens)
{
    pv_status st = eu_model_init(m, name, n_layers, n_ctx, kv, chunk_tokens);
    if (st == PV_ERR_NO_DEVICE || st == PV_ERR_NOT_FOUND)
        tap_skip("%s: %s", name, pv_last_error());
    else
        ok(st == PV_OK, "%s: synthetic model (%s)", name, st == PV_OK ? "ok" : pv_last_error());
    if (st != PV_OK)
        eu_model_free(m);
    return st == PV_OK;
}

/* One turn of the script: session index, prompt tokens, tokens to make. */
typedef struct eu_turn {
    int session;
    int32_t prompt[96];
    int n_prompt;
    int max_tokens;
} eu_turn;

typedef struct eu_result {
    int32_t tokens[256];
    int n;
    int done;
    pv_status status;
    pv_turn_result res;
} eu_result;

static inline void eu_on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)text;
    (void)len;
    eu_result *r = user;
    if (token >= 0 && r->n < 256)
        r->tokens[r->n++] = token;
}

static inline void eu_on_done(void *user, pv_status st, const pv_turn_result *res)
{
    eu_result *r = user;
    r->done++;
    r->status = st;
    r->res = *res;
}

/* A deterministic script: rounds of turns over n_sessions sessions. */
static inline void eu_script(eu_turn *turns, int n_sessions, int rounds, uint32_t n_vocab, uint64_t seed,
                      int max_prompt, int max_tokens)
{
    uint64_t x = seed;
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < n_sessions; s++) {
            eu_turn *t = &turns[r * n_sessions + s];
            t->session = s;
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t->n_prompt = 3 + (int)((x >> 33) % (uint64_t)(max_prompt - 2));
            for (int i = 0; i < t->n_prompt; i++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                /* Past the specials: ordinary byte and merge tokens. */
                t->prompt[i] = 3 + (int32_t)((x >> 33) % (n_vocab - 3));
            }
            t->max_tokens = max_tokens;
        }
}

/* Steps e until no turn is pending, pv_engine_check after every step: its
 * failures counted in *check_failures, the first one's message kept in
 * first_failure. steps (NULL: not counted) grows by the steps taken. A
 * step that fails or does no work while turns are pending ends it. */
static inline pv_status eu_drain(pv_engine *e, int *check_failures, char *first_failure, size_t cap, uint64_t *steps)
{
    pv_status st = PV_OK;
    while (st == PV_OK && pv_engine_pending(e) > 0) {
        int worked = 0;
        if ((st = pv_engine_step(e, &worked)) == PV_OK && !worked)
            st = pv_error(PV_ERR_STATE, "no progress with %zu turns pending", pv_engine_pending(e));
        if (steps)
            (*steps)++;
        if (st == PV_OK && pv_engine_check(e) != PV_OK && !(*check_failures)++)
            snprintf(first_failure, cap, "%s", pv_last_error());
    }
    return st;
}

/* Runs the script with `concurrent` sessions' turns in flight at once,
 * checking the engine's invariants after every step. Returns the number of
 * failed invariant checks (0 is good); results get each turn's tokens. */
static inline int eu_run(pv_engine *e, const eu_turn *turns, int n_turns, int concurrent, eu_result *results,
                  char *first_violation, size_t cap)
{
    int violations = 0;
    for (int base = 0; base < n_turns; base += concurrent) {
        int end = base + concurrent < n_turns ? base + concurrent : n_turns;
        for (int i = base; i < end; i++) {
            char name[32];
            snprintf(name, sizeof name, "s%d", turns[i].session);
            pv_turn t = {.tokens = turns[i].prompt, .n_tokens = (size_t)turns[i].n_prompt};
            pv_sampling_defaults(&t.sampling);
            t.sampling.max_tokens = turns[i].max_tokens;
            t.sampling.ignore_eos = 1;
            pv_turn_callbacks cb = {eu_on_token, eu_on_done, &results[i]};
            pv_status st = pv_engine_submit(e, name, &t, &cb, NULL);
            if (st != PV_OK) {
                results[i].status = st;
                if (!violations++)
                    snprintf(first_violation, cap, "submit of turn %d: %s", i, pv_last_error());
            }
        }
        while (pv_engine_pending(e) > 0) {
            int worked = 0;
            pv_status st = pv_engine_step(e, &worked);
            if (st != PV_OK || !worked) {
                if (!violations++)
                    snprintf(first_violation, cap, "step: %s", st != PV_OK ? pv_last_error() : "no progress");
                return violations;
            }
            if ((st = pv_engine_check(e)) != PV_OK && !violations++)
                snprintf(first_violation, cap, "check after a step: %s", pv_last_error());
        }
    }
    return violations;
}

#endif
