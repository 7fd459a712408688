/* The engine's life cycle, sessions and the submit / end API. The scheduler
 * is in engine_sched.c, the swap executor in engine_swap.c, chat rendering
 * and stop strings in engine_text.c. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "engine/engine_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const mode_names[] = {"pensieve", "gpu-only", "stateless"};

const char *pv_engine_mode_name(pv_engine_mode mode)
{
    return (unsigned)mode < 3 ? mode_names[mode] : "unknown";
}

pv_status pv_engine_mode_parse(const char *name, pv_engine_mode *mode)
{
    if (!name || !mode)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_mode_parse: NULL argument");
    for (int i = 0; i < 3; i++)
        if (strcmp(name, mode_names[i]) == 0) {
            *mode = (pv_engine_mode)i;
            return PV_OK;
        }
    return pv_error(PV_ERR_INVALID_ARG,
                    "mode \"%.64s\" is not one of pensieve, gpu-only, stateless", name);
}

const char *pv_finish_reason_name(pv_finish_reason r)
{
    switch (r) {
    case PV_FINISH_STOP: return "stop";
    case PV_FINISH_LENGTH: return "length";
    case PV_FINISH_ERROR: return "error";
    case PV_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

void pv_engine_config_defaults(pv_engine_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->mode = PV_MODE_PENSIEVE;
    cfg->swap_out_chunks = 256;
    cfg->prefix_sharing = 1;
}

void pv_sampling_defaults(pv_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
    s->seed = 1;
}

/* ---- small vectors ---------------------------------------------------------- */

pv_status pv_ivec_reserve(pv_ivec *a, size_t cap)
{
    if (cap <= a->cap)
        return PV_OK;
    size_t n = a->cap ? a->cap : 64;
    while (n < cap)
        n *= 2;
    int32_t *v = realloc(a->v, n * sizeof *v);
    if (!v)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: cannot grow a token list to %zu entries", n);
    a->v = v;
    a->cap = n;
    return PV_OK;
}

pv_status pv_ivec_push(pv_ivec *a, int32_t x)
{
    pv_status st = pv_ivec_reserve(a, a->n + 1);
    if (st == PV_OK)
        a->v[a->n++] = x;
    return st;
}

pv_status pv_ivec_append(pv_ivec *a, const int32_t *x, size_t n)
{
    pv_status st = pv_ivec_reserve(a, a->n + n);
    if (st == PV_OK && n) {
        memcpy(a->v + a->n, x, n * sizeof *x);
        a->n += n;
    }
    return st;
}

void pv_ivec_free(pv_ivec *a)
{
    free(a->v);
    *a = (pv_ivec){0};
}

/* ---- time ------------------------------------------------------------------- */

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double engine_clock(void *ctx)
{
    pv_engine *e = ctx;
    return e->cfg.clock ? e->cfg.clock(e->cfg.clock_ctx) : monotonic_s();
}

double pv_engine_now(pv_engine *e)
{
    return engine_clock(e);
}

/* ---- sessions ---------------------------------------------------------------- */

static size_t hash_id(const char *id)
{
    size_t h = 1469598103934665603ull;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return h;
}

pv_esession *pv_engine_find_session(const pv_engine *e, const char *id)
{
    for (pv_esession *s = e->buckets[hash_id(id) & (e->n_buckets - 1)]; s; s = s->next_in_bucket)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

static pv_status grow_buckets(pv_engine *e)
{
    size_t n = e->n_buckets * 2;
    pv_esession **b = calloc(n, sizeof *b);
    if (!b)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: cannot grow the session table to %zu", n);
    for (size_t i = 0; i < e->n_buckets; i++)
        for (pv_esession *s = e->buckets[i], *next; s; s = next) {
            next = s->next_in_bucket;
            size_t k = hash_id(s->id) & (n - 1);
            s->next_in_bucket = b[k];
            b[k] = s;
        }
    free(e->buckets);
    e->buckets = b;
    e->n_buckets = n;
    return PV_OK;
}

pv_status pv_engine_session_get(pv_engine *e, const char *id, pv_esession **out)
{
    pv_esession *s = pv_engine_find_session(e, id);
    if (s) {
        *out = s;
        return PV_OK;
    }
    if (e->n_sessions + 1 > e->n_buckets && grow_buckets(e) != PV_OK)
        return PV_ERR_OUT_OF_MEMORY;
    s = calloc(1, sizeof *s);
    if (!s || !(s->id = strdup(id))) {
        free(s);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "engine: cannot allocate session \"%.64s\"", id);
    }
    s->last_active = pv_engine_now(e);
    size_t k = hash_id(id) & (e->n_buckets - 1);
    s->next_in_bucket = e->buckets[k];
    e->buckets[k] = s;
    e->n_sessions++;
    *out = s;
    return PV_OK;
}

static void session_destroy(pv_engine *e, pv_esession *s)
{
    pv_esession **p = &e->buckets[hash_id(s->id) & (e->n_buckets - 1)];
    while (*p != s)
        p = &(*p)->next_in_bucket;
    *p = s->next_in_bucket;
    e->n_sessions--;
    pv_ivec_free(&s->history);
    pv_ivec_free(&s->pending);
    free(s->id);
    free(s);
}

static pv_status session_close_cache(pv_engine *e, pv_esession *s)
{
    if (!s->opened)
        return PV_OK;
    pv_status st = pv_cache_end_session(e->cache, s->id, NULL);
    if (st == PV_OK)
        s->opened = 0;
    return st;
}

pv_status pv_engine_forget_session(pv_engine *e, pv_esession *s)
{
    /* A swap-out in flight may hold chunks of it. */
    pv_status st = pv_engine_swap_out_reap(e);
    if (st == PV_OK)
        st = session_close_cache(e, s);
    if (st == PV_OK)
        session_destroy(e, s);
    return st;
}

pv_status pv_engine_end_session(pv_engine *e, const char *session)
{
    if (!e || !session)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_end_session: engine and session must not be NULL");
    pv_esession *s = pv_engine_find_session(e, session);
    if (!s)
        return pv_error(PV_ERR_NOT_FOUND, "pv_engine_end_session: unknown session \"%.64s\"", session);
    if (s->request)
        return pv_error(PV_ERR_BUSY, "pv_engine_end_session: session \"%.64s\" has a turn queued or running",
                        session);
    return pv_engine_forget_session(e, s);
}

pv_status pv_engine_session_tokens(const pv_engine *e, const char *session, size_t *n_tokens)
{
    if (!e || !session || !n_tokens)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_session_tokens: NULL argument");
    const pv_esession *s = pv_engine_find_session(e, session);
    if (!s)
        return pv_error(PV_ERR_NOT_FOUND, "pv_engine_session_tokens: unknown session \"%.64s\"", session);
    *n_tokens = s->history.n + s->pending.n;
    return PV_OK;
}

void pv_engine_foreach_session(const pv_engine *e, void (*fn)(void *user, const char *session),
                               void *user)
{
    if (!e || !fn)
        return;
    for (size_t i = 0; i < e->n_buckets; i++)
        for (const pv_esession *s = e->buckets[i]; s; s = s->next_in_bucket)
            if (!s->anonymous)
                fn(user, s->id);
}

/* Sessions idle past the timeout end, at most once a second of clock. */
pv_status pv_engine_expire_idle(pv_engine *e)
{
    if (e->cfg.idle_timeout_s <= 0)
        return PV_OK;
    double now = pv_engine_now(e);
    if (now - e->last_idle_scan < 1.0 && e->last_idle_scan != 0)
        return PV_OK;
    e->last_idle_scan = now;
    pv_status st;
    for (size_t i = 0; i < e->n_buckets; i++)
        for (pv_esession *s = e->buckets[i], *next; s; s = next) {
            next = s->next_in_bucket;
            if (s->request || now - s->last_active < e->cfg.idle_timeout_s)
                continue;
            if ((st = pv_engine_forget_session(e, s)) != PV_OK)
                return st;
            e->stats.sessions_timed_out++;
        }
    return PV_OK;
}

/* ---- init and free ------------------------------------------------------------ */

static pv_status check_config(pv_engine *e, const pv_llama_options *lo)
{
    pv_engine_config *c = &e->cfg;
    if ((unsigned)c->mode > PV_MODE_STATELESS)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_init: mode %d is not a pv_engine_mode", (int)c->mode);
    if (c->token_budget == 0)
        c->token_budget = lo->max_batch_tokens;
    if (c->max_running == 0)
        c->max_running = lo->max_logit_rows;
    if (c->token_budget < 1 || c->token_budget > lo->max_batch_tokens)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_init: token_budget %d out of range [1, %d] (the model's max_batch_tokens)",
                        c->token_budget, lo->max_batch_tokens);
    if (c->max_running < 1 || c->max_running > lo->max_logit_rows)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_init: max_running %d out of range [1, %d] (the model's max_logit_rows)",
                        c->max_running, lo->max_logit_rows);
    /* A step samples every running turn with its whole logit bias in one
     * call, which takes at most PV_LOGIT_BIAS_MAX entries. */
    if (c->max_running > PV_LOGIT_BIAS_MAX / PV_SAMPLING_MAX_BIAS)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_init: max_running %d: more than %d turns of %d logit bias entries would pass "
                        "the %d entries one sampling call takes",
                        c->max_running, PV_LOGIT_BIAS_MAX / PV_SAMPLING_MAX_BIAS, PV_SAMPLING_MAX_BIAS,
                        PV_LOGIT_BIAS_MAX);
    if (c->swap_out_chunks < 1 || c->swap_out_chunks > (1u << 20))
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_init: swap_out_chunks %u out of range [1, %u]",
                        c->swap_out_chunks, 1u << 20);
    if (!(c->idle_timeout_s >= 0) || isinf(c->idle_timeout_s))
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_init: idle_timeout_s %g must be finite and >= 0",
                        c->idle_timeout_s);
    if (c->decode_steps < 0 || c->decode_steps > PV_ENGINE_MAX_DECODE_STEPS)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_init: decode_steps %d out of range [0, %d]", c->decode_steps,
                        PV_ENGINE_MAX_DECODE_STEPS);
    /* The CPU backend computes inside each call: a chain would overlap
     * nothing there. */
    e->decode_steps = c->decode_steps ? c->decode_steps : strcmp(e->be->ops->name, "cpu") == 0 ? 1 : 4;
    return PV_OK;
}

static pv_status alloc_batch(pv_engine *e)
{
    size_t T = (size_t)e->cfg.token_budget, R = (size_t)e->cfg.max_running;
    e->b_tokens = malloc(T * sizeof *e->b_tokens);
    e->b_seq = malloc(T * sizeof *e->b_seq);
    e->b_pos = malloc(T * sizeof *e->b_pos);
    e->b_logit_rows = malloc(R * sizeof *e->b_logit_rows);
    e->b_sampled = malloc(R * sizeof *e->b_sampled);
    e->b_take = malloc(R * sizeof *e->b_take);
    e->b_reqs = malloc(R * sizeof *e->b_reqs);
    e->b_logit_req = malloc(R * sizeof *e->b_logit_req);
    e->u = malloc(R * sizeof *e->u);
    e->b_temperature = malloc(R * sizeof *e->b_temperature);
    e->b_top_p = malloc(R * sizeof *e->b_top_p);
    e->b_bias_start = malloc((R + 1) * sizeof *e->b_bias_start);
    e->running = malloc(R * sizeof *e->running);
    if (!e->b_tokens || !e->b_seq || !e->b_pos || !e->b_logit_rows || !e->b_sampled || !e->b_take || !e->b_reqs ||
        !e->b_logit_req || !e->u || !e->b_temperature || !e->b_top_p || !e->b_bias_start || !e->running)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_init: batch arrays for %zu tokens", T);
    if (e->decode_steps == 1)
        return PV_OK;
    e->chain_reqs[0] = malloc(R * sizeof *e->chain_reqs[0]);
    e->chain_reqs[1] = malloc(R * sizeof *e->chain_reqs[1]);
    e->chain_next = malloc(R * sizeof *e->chain_next);
    if (!e->chain_reqs[0] || !e->chain_reqs[1] || !e->chain_next)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_init: chained-step arrays for %zu rows", R);
    pv_status st = pv_buffer_init(&e->sampled_dev, e->be, PV_MEM_DEVICE, R * sizeof(int32_t));
    if (st == PV_OK)
        st = pv_buffer_init(&e->sampled_host, e->be, PV_MEM_HOST, 2 * R * sizeof(int32_t));
    return st;
}

pv_status pv_engine_init(pv_engine **out, pv_backend *be, pv_llama *model, const pv_tokenizer *tok,
                         const pv_cache_config *cache_cfg, const pv_engine_config *cfg)
{
    if (!out || !be || !model || !tok || !cache_cfg)
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_init: out, backend, model, tokenizer and cache config must not be NULL");
    *out = NULL;
    pv_engine *e = calloc(1, sizeof *e);
    if (!e)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_init: cannot allocate the engine");
    e->be = be;
    e->graph_runs0 = pv_backend_graph_runs(be);
    e->graph_replays0 = pv_backend_graph_replays(be);
    e->model = model;
    e->tok = tok;
    if (cfg)
        e->cfg = *cfg;
    else
        pv_engine_config_defaults(&e->cfg);
    const pv_llama_hparams *hp = pv_llama_hparams_of(model);
    const pv_llama_options *lo = pv_llama_options_of(model);
    e->n_layers = hp->n_layers;
    e->chunk_tokens = (uint32_t)lo->chunk_tokens;
    e->n_ctx = hp->n_ctx_train;
    e->n_vocab = hp->n_vocab;
    e->slot_bytes = pv_llama_slot_bytes(model);
    e->slot_elems = pv_llama_slot_elems(model);
    e->kv_dtype = lo->kv_dtype;
    pv_status st = check_config(e, lo);
    if (st != PV_OK)
        goto fail;

    /* The cache's geometry is the model's. */
    e->cache_cfg = *cache_cfg;
    e->cache_cfg.chunk_tokens = e->chunk_tokens;
    e->cache_cfg.n_layers = e->n_layers;
    e->cache_cfg.slot_bytes = e->slot_bytes;
    e->cache_cfg.share_prefixes = e->cfg.prefix_sharing != 0;
    if (e->cfg.mode == PV_MODE_GPU_ONLY)
        e->cache_cfg.host_bytes = 0;
    /* A device budget past the device's memory fails at init, not later. */
    if (e->cache_cfg.device_limit_bytes == 0)
        e->cache_cfg.device_limit_bytes = be->info.global_mem_bytes;
    e->n_device_slots = (int64_t)(e->cache_cfg.device_bytes / e->slot_bytes);
    e->n_host_slots = (int64_t)(e->cache_cfg.host_bytes / e->slot_bytes);
    if (e->n_device_slots < (int64_t)e->n_layers) {
        st = pv_error(PV_ERR_INVALID_ARG,
                      "pv_engine_init: device budget %" PRIu64 " bytes holds %" PRId64
                      " slots of %" PRIu64 " bytes, fewer than one chunk of each of the %u layers",
                      e->cache_cfg.device_bytes, e->n_device_slots, e->slot_bytes, e->n_layers);
        goto fail;
    }
    if ((st = pv_cache_init(&e->cache, &e->cache_cfg, engine_clock, e)) != PV_OK)
        goto fail;
    /* One slot past the cache's: where the model's rows padding a decode
     * step to its graph bucket write (pv_llama_batch.pad_slot). */
    if ((st = pv_buffer_init(&e->device_pool, be, PV_MEM_DEVICE,
                             (uint64_t)(e->n_device_slots + 1) * e->slot_bytes)) != PV_OK)
        goto fail;
    if ((st = pv_engine_swap_init(e)) != PV_OK || (st = alloc_batch(e)) != PV_OK)
        goto fail;
    e->n_buckets = 64;
    if (!(e->buckets = calloc(e->n_buckets, sizeof *e->buckets))) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_init: session table");
        goto fail;
    }
    pv_cache_plan_init(&e->scratch);
    e->next_request_id = 1;
    *out = e;
    return PV_OK;
fail:
    pv_engine_free(e);
    return st;
}

void pv_engine_free(pv_engine *e)
{
    if (!e)
        return;
    /* Requests still queued or running are abandoned without callbacks;
     * copies in flight land before their buffers go. */
    for (size_t i = 0; i < e->n_running; i++) {
        if (e->running[i]->layer_ready || e->running[i]->n_swap_in)
            pv_engine_swap_in_finish(e, e->running[i]);
        pv_engine_request_free(e->running[i]);
    }
    if (e->be)
        pv_backend_finish(e->be);
    for (pv_request *r = e->wait_head, *next; r; r = next) {
        next = r->next;
        pv_engine_request_free(r);
    }
    if (e->buckets) {
        for (size_t i = 0; i < e->n_buckets; i++)
            for (pv_esession *s = e->buckets[i], *next; s; s = next) {
                next = s->next_in_bucket;
                pv_ivec_free(&s->history);
                pv_ivec_free(&s->pending);
                free(s->id);
                free(s);
            }
        free(e->buckets);
    }
    pv_engine_swap_free(e);
    pv_cache_plan_free(&e->scratch);
    pv_buffer_free(e->device_pool);
    pv_cache_free(e->cache);
    free(e->b_tokens);
    free(e->b_seq);
    free(e->b_pos);
    free(e->b_logit_rows);
    free(e->b_sampled);
    free(e->b_take);
    free(e->b_reqs);
    free(e->b_logit_req);
    free(e->b_tables);
    free(e->u);
    free(e->b_temperature);
    free(e->b_top_p);
    free(e->b_bias_start);
    free(e->b_bias_token);
    free(e->b_bias_value);
    free(e->chain_reqs[0]);
    free(e->chain_reqs[1]);
    free(e->chain_next);
    pv_buffer_free(e->sampled_dev);
    pv_buffer_free(e->sampled_host);
    free(e->running);
    free(e);
}

/* ---- submit ---------------------------------------------------------------- */

/* The logit bias of a turn (pv_sampling): every entry's token and value,
 * no token twice, not every token banned. */
static pv_status check_bias(const pv_sampling *s, uint32_t n_vocab)
{
    if (s->n_bias == 0)
        return PV_OK;
    if (s->n_bias > PV_SAMPLING_MAX_BIAS)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: %zu logit bias entries: at most %d are accepted",
                        s->n_bias, PV_SAMPLING_MAX_BIAS);
    if (!s->bias_tokens || !s->bias_values)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: %zu logit bias entries but bias_%s is NULL", s->n_bias,
                        s->bias_tokens ? "values" : "tokens");
    uint8_t *seen = calloc((n_vocab + 7) / 8, 1);
    if (!seen)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_submit: %u bits to check the logit bias tokens", n_vocab);
    pv_status st = PV_OK;
    size_t banned = 0;
    for (size_t k = 0; k < s->n_bias; k++) {
        const int32_t t = s->bias_tokens[k];
        const float v = s->bias_values[k];
        if (t < 0 || (uint32_t)t >= n_vocab) {
            st = pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: logit bias entry %zu: token %d out of range [0, %u)",
                          k, t, n_vocab);
            break;
        }
        if (!isfinite(v) || v < -PV_SAMPLING_BIAS_RANGE || v > PV_SAMPLING_BIAS_RANGE) {
            st = pv_error(PV_ERR_INVALID_ARG,
                          "pv_engine_submit: logit bias entry %zu: value %g for token %d out of range [%g, %g]", k,
                          (double)v, t, (double)-PV_SAMPLING_BIAS_RANGE, (double)PV_SAMPLING_BIAS_RANGE);
            break;
        }
        if (seen[t / 8] & (1u << (t % 8))) {
            st = pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: logit bias entry %zu: token %d is listed twice", k, t);
            break;
        }
        seen[t / 8] |= (uint8_t)(1u << (t % 8));
        banned += v <= PV_LOGIT_BIAS_BAN;
    }
    free(seen);
    if (st == PV_OK && banned == n_vocab)
        st = pv_error(PV_ERR_INVALID_ARG,
                      "pv_engine_submit: the logit bias bans all %u tokens of the vocabulary (value <= %g): "
                      "none is left to sample",
                      n_vocab, (double)PV_LOGIT_BIAS_BAN);
    return st;
}

static pv_status check_sampling(const pv_sampling *s, uint32_t n_vocab)
{
    if (!(s->temperature >= 0.0f) || s->temperature > 100.0f)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: temperature %g out of range [0, 100]",
                        (double)s->temperature);
    if (s->temperature > 0.0f && !(s->top_p > 0.0f && s->top_p <= 1.0f))
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: top_p %g out of range (0, 1]",
                        (double)s->top_p);
    if (s->max_tokens < 0)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: max_tokens %d is negative", s->max_tokens);
    if (s->n_stop && !s->stop)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: %zu stop strings but stop is NULL", s->n_stop);
    for (size_t i = 0; i < s->n_stop; i++)
        if (!s->stop[i] || !s->stop[i][0])
            return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: stop string %zu is NULL or empty", i);
    return check_bias(s, n_vocab);
}

void pv_engine_request_free(pv_request *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->sampling.n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->bias_tokens);
    free(r->bias_values);
    pv_ivec_free(&r->feed);
    free(r->slots);
    free(r->layer_ready);
    free(r->swap_in);
    free(r->held.s);
    free(r);
}

/* A turn must fit the device pool before it runs (a context that outgrows
 * it mid-answer fails with the answer half streamed). A turn running alone
 * has the whole pool: admission's reserve gives way when nothing else runs,
 * and running turns are suspended for room. Its KV is every token it runs:
 * the context, then each generated token but the last (sampled, not run),
 * up to the model's context; in whole chunks of every layer. Unbounded
 * generation is not checked past its first token: it stops with finish
 * "length" when the pool is full (pv_engine_device_tokens). `what` names
 * the context's parts for the message. */
static pv_status check_device_fit(const pv_engine *e, const char *who, uint64_t context, int32_t max_tokens,
                                  const char *what)
{
    uint64_t kv = context + (max_tokens > 0 ? (uint64_t)max_tokens : 1) - 1;
    if (kv > e->n_ctx - 1)
        kv = e->n_ctx - 1;
    const uint64_t holds = pv_engine_device_tokens(e);
    if (kv <= holds)
        return PV_OK;
    const uint64_t chunks = (kv + e->chunk_tokens - 1) / e->chunk_tokens, slots = chunks * e->n_layers;
    const uint64_t mib = 1u << 20, need_mib = (slots * e->slot_bytes + mib - 1) / mib;
    char generate[64] = "", shorter[96] = "", device[96] = "";
    if (max_tokens > 0)
        snprintf(generate, sizeof generate, " + up to %d to generate", max_tokens);
    /* The most it could generate now: its context's KV plus max_tokens - 1. */
    if (max_tokens > 0 && context <= holds)
        snprintf(shorter, sizeof shorter, ", or max_tokens %" PRIu64 " or less", holds - context + 1);
    if (e->be->info.global_mem_bytes && slots * e->slot_bytes > e->be->info.global_mem_bytes)
        snprintf(device, sizeof device, " (more than the device's %" PRIu64 " MiB)",
                 e->be->info.global_mem_bytes / mib);
    return pv_error(PV_ERR_CAPACITY,
                    "pv_engine_submit: %s: the device pool cannot hold this turn (%s%s): it needs "
                    "%" PRIu64 " chunks of %u tokens in each of %u layers (%" PRIu64 " slots), the pool holds "
                    "%" PRId64 " slots (%" PRIu64 " tokens); a device budget of %" PRIu64 " MiB (--device-mem %" PRIu64
                    "M) would fit it%s%s",
                    who, what, generate, chunks, e->chunk_tokens, e->n_layers, slots, e->n_device_slots,
                    holds, need_mib, need_mib, device, shorter);
}

/* A whole conversation against the session's history and pending tokens:
 * keeps their longest common prefix (short of the conversation's last
 * token, which must run for its logits), drops the rest in every tier, and
 * leaves the conversation's remainder in feed. */
static pv_status continue_conversation(pv_engine *e, pv_esession *s, const pv_ivec *conv, pv_ivec *feed)
{
    const size_t H = s->history.n, known = H + s->pending.n, limit = conv->n - 1;
    size_t p = 0;
    while (p < limit && p < known && conv->v[p] == (p < H ? s->history.v[p] : s->pending.v[p - H]))
        p++;
    if (p < H) {
        if (s->opened) {
            /* A swap-out in flight may hold chunks past the cut. */
            pv_status st = pv_engine_swap_out_reap(e);
            if (st == PV_OK)
                st = pv_cache_session_truncate(e->cache, s->id, (uint32_t)p);
            if (st != PV_OK)
                return st;
        }
        s->history.n = p;
    }
    /* Pending tokens are the conversation's own from the history's end to
     * the prefix: they run again as the start of the feed. */
    s->pending.n = 0;
    return pv_ivec_append(feed, conv->v + s->history.n, conv->n - s->history.n);
}

pv_status pv_engine_submit(pv_engine *e, const char *session, const pv_turn *turn,
                           const pv_turn_callbacks *cb, uint64_t *request_id)
{
    if (!e || !turn)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: engine and turn must not be NULL");
    char anonymous_id[32];
    if (!session) {
        snprintf(anonymous_id, sizeof anonymous_id, "\x1f%" PRIu64, e->next_request_id);
        session = anonymous_id;
    }
    size_t id_len = strlen(session);
    if (id_len == 0 || id_len > PV_SESSION_ID_MAX)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: session id of %zu bytes (1 to %d allowed)",
                        id_len, PV_SESSION_ID_MAX);
    if (session != anonymous_id && session[0] == '\x1f')
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_submit: session ids starting with byte 0x1f are reserved for NULL-session turns");
    if ((turn->n_tokens == 0) == (turn->n_messages == 0))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_engine_submit: a turn needs tokens or messages, not %s (%zu tokens, %zu messages)",
                        turn->n_tokens ? "both" : "neither", turn->n_tokens, turn->n_messages);
    if ((turn->n_tokens && !turn->tokens) || (turn->n_messages && !turn->messages))
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: tokens or messages is NULL");
    for (size_t i = 0; i < turn->n_tokens; i++)
        if (turn->tokens[i] < 0 || (uint32_t)turn->tokens[i] >= e->n_vocab)
            return pv_error(PV_ERR_INVALID_ARG, "pv_engine_submit: token %zu = %d out of range [0, %u)", i,
                            turn->tokens[i], e->n_vocab);
    pv_status st = check_sampling(&turn->sampling, e->n_vocab);
    if (st != PV_OK)
        return st;
    pv_esession *existing = pv_engine_find_session(e, session);
    if (existing && existing->request)
        return pv_error(PV_ERR_BUSY, "pv_engine_submit: session \"%.64s\" has a turn queued or running",
                        session);

    pv_esession *s = NULL;
    pv_ivec conv = {0};
    if ((st = pv_engine_session_get(e, session, &s)) != PV_OK)
        return st;
    s->anonymous = session == anonymous_id;
    /* What a refusal calls the turn: the internal id of a turn without a
     * session is no name for a client to see. */
    char who[96] = "a turn without a session";
    if (!s->anonymous)
        snprintf(who, sizeof who, "session \"%.64s\"", session);
    pv_request *r = calloc(1, sizeof *r);
    if (!r) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_submit: request");
        goto fail;
    }
    r->sampling = turn->sampling;
    r->sampling.stop = NULL;
    r->sampling.n_stop = 0;
    if (turn->sampling.n_stop) {
        if (!(r->stop = calloc(turn->sampling.n_stop, sizeof *r->stop))) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_submit: stop strings");
            goto fail;
        }
        for (size_t i = 0; i < turn->sampling.n_stop; i++, r->sampling.n_stop++)
            if (!(r->stop[i] = strdup(turn->sampling.stop[i]))) {
                st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_submit: stop strings");
                goto fail;
            }
    }
    r->sampling.bias_tokens = NULL;
    r->sampling.bias_values = NULL;
    r->sampling.n_bias = 0;
    if (turn->sampling.n_bias) {
        const size_t n = turn->sampling.n_bias;
        r->bias_tokens = malloc(n * sizeof *r->bias_tokens);
        r->bias_values = malloc(n * sizeof *r->bias_values);
        if (!r->bias_tokens || !r->bias_values) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_submit: a logit bias of %zu entries", n);
            goto fail;
        }
        memcpy(r->bias_tokens, turn->sampling.bias_tokens, n * sizeof *r->bias_tokens);
        memcpy(r->bias_values, turn->sampling.bias_values, n * sizeof *r->bias_values);
        r->sampling.n_bias = n;
    }
    if (turn->whole_conversation) {
        if (turn->n_tokens)
            st = pv_ivec_append(&conv, turn->tokens, turn->n_tokens);
        else
            st = pv_engine_render_turn(e, s, turn, &conv);
        if (st != PV_OK)
            goto fail;
        if (conv.n + 1 > e->n_ctx) {
            st = pv_error(PV_ERR_CAPACITY,
                          "pv_engine_submit: %s: a conversation of %zu tokens leaves no room "
                          "to generate within the model's context of %u tokens",
                          who, conv.n, e->n_ctx);
            goto fail;
        }
        char what[64];
        snprintf(what, sizeof what, "a conversation of %zu tokens", conv.n);
        if ((st = check_device_fit(e, who, conv.n, r->sampling.max_tokens, what)) != PV_OK)
            goto fail;
        if ((st = continue_conversation(e, s, &conv, &r->feed)) != PV_OK)
            goto fail;
    } else {
        /* The turn's input: tokens decided earlier but not yet run, then
         * the new prompt. */
        if ((st = pv_ivec_append(&r->feed, s->pending.v, s->pending.n)) != PV_OK)
            goto fail;
        if (turn->n_tokens)
            st = pv_ivec_append(&r->feed, turn->tokens, turn->n_tokens);
        else
            st = pv_engine_render_turn(e, s, turn, &r->feed);
        if (st != PV_OK)
            goto fail;
    }
    /* One token at least must fit after the prompt. */
    uint64_t total = (uint64_t)s->history.n + r->feed.n;
    if (total + 1 > e->n_ctx) {
        st = pv_error(PV_ERR_CAPACITY,
                      "pv_engine_submit: %s: %zu tokens of history + %zu of this turn "
                      "leave no room to generate within the model's context of %u tokens",
                      who, s->history.n, r->feed.n, e->n_ctx);
        goto fail;
    }
    if (!turn->whole_conversation) {
        char what[96];
        snprintf(what, sizeof what, "%zu tokens of history + %zu of this turn", s->history.n, r->feed.n);
        if ((st = check_device_fit(e, who, total, r->sampling.max_tokens, what)) != PV_OK)
            goto fail;
    }
    pv_ivec_free(&conv);
    /* The user is back: the history counts as active from now, not from
     * its last answer, or a turn queued past the knee looks the idlest
     * session and loses its history to eviction while it waits. */
    if (s->opened && (st = pv_cache_touch(e->cache, s->id)) != PV_OK)
        goto fail;
    if (cb)
        r->cb = *cb;
    r->id = e->next_request_id++;
    r->session = s;
    r->rng = r->sampling.seed * 0x9e3779b97f4a7c15ull + 1;
    r->t_submit = pv_engine_now(e);
    r->result.request_id = r->id;
    r->result.context_tokens = (uint32_t)s->history.n;
    r->result.new_tokens = (uint32_t)r->feed.n;
    s->request = r;
    s->last_active = r->t_submit;
    if (e->wait_tail)
        e->wait_tail->next = r;
    else
        e->wait_head = r;
    e->wait_tail = r;
    e->n_waiting++;
    if (request_id)
        *request_id = r->id;
    return PV_OK;
fail:
    pv_ivec_free(&conv);
    pv_engine_request_free(r);
    if (!existing && s)
        session_destroy(e, s);
    return st;
}

size_t pv_engine_pending(const pv_engine *e)
{
    return e ? e->n_running + e->n_waiting : 0;
}

pv_status pv_engine_run(pv_engine *e)
{
    if (!e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_run: engine is NULL");
    while (pv_engine_pending(e) > 0) {
        int worked = 0;
        pv_status st = pv_engine_step(e, &worked);
        if (st != PV_OK)
            return st;
        if (!worked)
            return pv_error(PV_ERR_STATE, "pv_engine_run: %zu turns pending but no progress possible",
                            pv_engine_pending(e));
    }
    return PV_OK;
}

pv_status pv_engine_stats_get(const pv_engine *e, pv_engine_stats *stats)
{
    if (!e || !stats)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_stats_get: NULL argument");
    *stats = e->stats;
    pv_cache_stats cs;
    pv_cache_stats_get(e->cache, &cs);
    stats->swap_in_chunks = cs.swap_in_chunks;
    stats->swap_out_chunks = cs.swap_out_chunks;
    stats->dropped_chunks = cs.dropped_chunks;
    stats->shared_chunks = cs.shared_chunks;
    stats->shared_saved_bytes = cs.shared_saved_bytes[PV_TIER_DEVICE] + cs.shared_saved_bytes[PV_TIER_HOST];
    stats->graph_runs = pv_backend_graph_runs(e->be) - e->graph_runs0;
    stats->graph_replays = pv_backend_graph_replays(e->be) - e->graph_replays0;
    stats->sessions = (uint32_t)e->n_sessions;
    stats->running = (uint32_t)e->n_running;
    stats->waiting = (uint32_t)e->n_waiting;
    return PV_OK;
}

pv_cache *pv_engine_cache(pv_engine *e)
{
    return e ? e->cache : NULL;
}

pv_status pv_engine_check(pv_engine *e)
{
    if (!e)
        return pv_error(PV_ERR_INVALID_ARG, "pv_engine_check: engine is NULL");
    pv_status st = pv_cache_check(e->cache);
    if (st != PV_OK)
        return st;
    /* No DEVICE slot is read by two running requests but a shared chunk's,
     * and every slot in a running request's table is in the pool. */
    uint8_t *owner = calloc((size_t)e->n_device_slots, 1);
    if (!owner)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_engine_check: %" PRId64 " bytes", e->n_device_slots);
    enum { OWN = 1, SHARED = 2 };
    for (size_t i = 0; i < e->n_running && st == PV_OK; i++) {
        const pv_request *r = e->running[i];
        pv_session_view view;
        if ((st = pv_cache_session_restore(e->cache, r->session->id, &view)) != PV_OK)
            break;
        for (uint32_t l = 0; l < e->n_layers && st == PV_OK; l++)
            for (uint32_t c = 0; c < r->n_chunks && st == PV_OK; c++) {
                int32_t slot = r->slots[(size_t)l * r->cap_chunks + c];
                uint8_t kind = c < view.shared_chunks ? SHARED : OWN;
                if (slot < 0)
                    continue;
                if (slot >= e->n_device_slots)
                    st = pv_error(PV_ERR_STATE,
                                  "engine: request %" PRIu64 " chunk %u layer %u: slot %d outside the "
                                  "%" PRId64 "-slot device pool",
                                  r->id, c, l, slot, e->n_device_slots);
                else if (owner[slot] && (owner[slot] != SHARED || kind != SHARED))
                    st = pv_error(PV_ERR_STATE,
                                  "engine: device slot %d is in two running contexts (request %" PRIu64
                                  " chunk %u layer %u)",
                                  slot, r->id, c, l);
                else
                    owner[slot] = kind;
            }
    }
    free(owner);
    /* A running request's table covers its chunks in every layer. */
    for (size_t i = 0; i < e->n_running && st == PV_OK; i++) {
        const pv_request *r = e->running[i];
        for (uint32_t c = 0; c < r->n_chunks && st == PV_OK; c++)
            for (uint32_t l = 0; l < e->n_layers && st == PV_OK; l++)
                if (r->slots[(size_t)l * r->cap_chunks + c] < 0)
                    st = pv_error(PV_ERR_STATE,
                                  "engine: request %" PRIu64 " has no slot for chunk %u layer %u of its %u",
                                  r->id, c, l, r->n_chunks);
    }
    /* Outside a running turn, the cache holds no chunk past the history. */
    for (size_t b = 0; b < e->n_buckets && st == PV_OK; b++)
        for (const pv_esession *s = e->buckets[b]; s && st == PV_OK; s = s->next_in_bucket) {
            if (!s->opened || (s->request && s->request->state == PV_REQ_RUNNING))
                continue;
            pv_session_view view;
            if ((st = pv_cache_session_restore(e->cache, s->id, &view)) != PV_OK)
                break;
            uint64_t chunks = (s->history.n + e->chunk_tokens - 1) / e->chunk_tokens;
            if (view.n_chunks > chunks)
                st = pv_error(PV_ERR_STATE,
                              "engine: session \"%.64s\" has %u chunks in the cache, past its %zu-token history",
                              s->id, view.n_chunks, s->history.n);
        }
    return st;
}
