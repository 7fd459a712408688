#include "config.h"

#include "bench/bench-inproc.h"
#include "bench/bench-util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct conv_state {
    int32_t next;        /* index of the next turn to send */
    int in_flight;
    int ended;           /* its last turn ended and its session was closed */
    double due_s;        /* when the next turn may be sent */
    char session[32];
    int32_t *prompt_ids; /* generated turns: the ids of the current request */
} conv_state;

typedef struct request_ctx request_ctx;

typedef struct run_state {
    const wl_workload *w;
    pv_engine *engine;
    bi_clock *clock; /* NULL: real time */
    uint32_t n_vocab;
    uint64_t seed; /* the workload's: the preambles' ids */
    const char *label;
    double t0;
    conv_state *convs;
    br_run *out;
    int64_t total, n_done;
    uint64_t rng;
    /* virtual time: what the engine had forwarded, and the first tokens and
     * answers of the iteration under way, stamped once its cost is known */
    uint64_t iterations, forwarded;
    int64_t *first_pending, n_first_pending;
    request_ctx **done_pending;
    int64_t n_done_pending;
} run_state;

struct request_ctx {
    run_state *run;
    int32_t conv;
    int64_t record;
};

static double since(const run_state *r)
{
    return (r->clock ? r->clock->now : bench_now_s()) - r->t0;
}

double bi_clock_read(void *clock)
{
    return ((const bi_clock *)clock)->now;
}

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token, (void)text, (void)len;
    request_ctx *c = user;
    run_state *r = c->run;
    br_record *rec = &r->out->records[c->record];
    if (rec->first_s != -1) /* -1: no token yet; -2: one, stamped at the iteration's end */
        return;
    if (r->clock) {
        rec->first_s = -2;
        r->first_pending[r->n_first_pending++] = c->record;
    } else {
        rec->first_s = since(r);
    }
}

/* A turn's end at end_s: its conversation's next turn is due after the
 * think time. */
static void settle(run_state *r, request_ctx *c, double end_s)
{
    br_record *rec = &r->out->records[c->record];
    rec->end_s = end_s;
    conv_state *cs = &r->convs[c->conv];
    cs->in_flight = 0;
    const wl_conversation *wc = &r->w->conv[c->conv];
    if (cs->next < wc->n_turns)
        cs->due_s = rec->end_s + wc->turns[cs->next].think_s;
    r->n_done++;
    br_progress(r->label, r->n_done, r->total, rec->end_s);
    free(c);
}

static void on_done(void *user, pv_status status, const pv_turn_result *result)
{
    request_ctx *c = user;
    run_state *r = c->run;
    br_record *rec = &r->out->records[c->record];
    rec->failed = status != PV_OK || !result || result->finish == PV_FINISH_ERROR;
    if (rec->failed && !r->out->first_error[0])
        snprintf(r->out->first_error, sizeof r->out->first_error, "conversation %d: %s", c->conv,
                 pv_last_error());
    if (result) {
        rec->generated = (int32_t)result->generated;
        rec->history_tokens = result->context_tokens;
        rec->reused_device = result->reused_device;
        rec->reused_host = result->reused_host;
        rec->recomputed = result->recomputed;
        rec->cached_tokens = (uint64_t)result->reused_device + result->reused_host;
        rec->prompt_tokens = (uint64_t)result->context_tokens + result->new_tokens;
    }
    if (r->clock)
        r->done_pending[r->n_done_pending++] = c;
    else
        settle(r, c, since(r));
}

/* Virtual time after an iteration: the clock moves by its cost, then the
 * first tokens and answers it produced are stamped. */
static pv_status advance_clock(run_state *r)
{
    pv_engine_stats es;
    pv_status st = pv_engine_stats_get(r->engine, &es);
    if (st != PV_OK)
        return st;
    const uint64_t forwarded = es.prefill_tokens + es.decode_tokens;
    r->clock->now += r->clock->step_s * (double)(es.iterations - r->iterations) +
                     r->clock->token_s * (double)(forwarded - r->forwarded);
    r->iterations = es.iterations;
    r->forwarded = forwarded;
    const double now = since(r);
    for (int64_t k = 0; k < r->n_first_pending; k++)
        r->out->records[r->first_pending[k]].first_s = now;
    r->n_first_pending = 0;
    for (int64_t k = 0; k < r->n_done_pending; k++)
        settle(r, r->done_pending[k], now);
    r->n_done_pending = 0;
    return PV_OK;
}

size_t bi_turn_messages(const wl_conversation *c, int32_t turn, pv_chat_message msgs[2])
{
    size_t n = 0;
    if (turn == 0 && c->system_text)
        msgs[n++] = (pv_chat_message){"system", c->system_text};
    msgs[n++] = (pv_chat_message){"user", c->turns[turn].text};
    return n;
}

pv_status bi_prompt_ids(const wl_conversation *c, int32_t turn, uint64_t seed, uint32_t n_vocab, uint64_t *rng,
                        int32_t **ids, size_t *n)
{
    const int32_t pre = turn == 0 ? c->system_tokens : 0;
    const size_t len = (size_t)pre + (size_t)c->turns[turn].input_tokens;
    int32_t *grown = realloc(*ids, len * sizeof *grown);
    if (!grown)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-bench: %zu prompt tokens", len);
    *ids = grown;
    wl_system_prompt_ids(seed, c->system_prompt, pre, n_vocab, grown);
    for (size_t k = (size_t)pre; k < len; k++)
        grown[k] = wl_token_id(wl_splitmix64(rng), n_vocab);
    *n = len;
    return PV_OK;
}

/* Sends conversation i's next turn. */
static pv_status submit_turn(run_state *r, int32_t i)
{
    conv_state *cs = &r->convs[i];
    const wl_conversation *c = &r->w->conv[i];
    const wl_turn *t = &c->turns[cs->next];
    request_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-bench: no memory for a request");
    *ctx = (request_ctx){r, i, r->out->n_records};
    br_record *rec = &r->out->records[r->out->n_records];
    *rec = (br_record){.submit_s = since(r), .first_s = -1,
                       .input_tokens = t->input_tokens + (cs->next == 0 ? c->system_tokens : 0),
                       .target_tokens = t->output_tokens};
    pv_turn turn;
    memset(&turn, 0, sizeof turn);
    pv_sampling_defaults(&turn.sampling);
    turn.sampling.max_tokens = t->output_tokens;
    turn.sampling.ignore_eos = 1;
    pv_chat_message msgs[2];
    if (t->text) {
        turn.messages = msgs;
        turn.n_messages = bi_turn_messages(c, cs->next, msgs);
    } else {
        const pv_status st = bi_prompt_ids(c, cs->next, r->seed, r->n_vocab, &r->rng, &cs->prompt_ids,
                                           &turn.n_tokens);
        if (st != PV_OK) {
            free(ctx);
            return st;
        }
        turn.tokens = cs->prompt_ids;
    }
    const pv_turn_callbacks cb = {on_token, on_done, ctx};
    pv_status st = pv_engine_submit(r->engine, cs->session, &turn, &cb, NULL);
    if (st != PV_OK) {
        free(ctx);
        return pv_error(st, "pensieve-bench: conversation %d turn %d: %s", i, cs->next, pv_last_error());
    }
    r->out->n_records++;
    cs->next++;
    cs->in_flight = 1;
    return PV_OK;
}

/* Until t (s since the start): a sleep, or in virtual time a jump. */
static void wait_until(run_state *r, double t)
{
    if (r->clock) {
        r->clock->now = fmax(r->clock->now, r->t0 + t);
        return;
    }
    double s = t - since(r);
    if (s <= 0)
        return;
    s = fmin(s, 0.25); /* the loop looks at br_stopping() a few times a second */
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The workload, in real time, until every turn has ended or a stop signal
 * came (the run is then marked interrupted). Conversations
 * come in arrival order: only those in [lo, hi) (arrived, not ended) are
 * looked at, so a step costs what is live, not the whole workload. */
static pv_status run_workload(run_state *r)
{
    const wl_workload *w = r->w;
    for (int32_t i = 0; i < w->n; i++) {
        r->convs[i].due_s = w->conv[i].arrival_s;
        /* One namespace (the bytes before ':') for the whole run: one
         * client's conversations, which may share a common prefix. */
        snprintf(r->convs[i].session, sizeof r->convs[i].session, "bench:conv-%d", i);
    }
    r->t0 = r->clock ? r->clock->now : bench_now_s();
    pv_status st = PV_OK;
    int32_t lo = 0, hi = 0;
    while (st == PV_OK && r->n_done < r->total) {
        if (br_stopping()) {
            r->out->interrupted = 1;
            pv_engine_cancel_all(r->engine); /* each turn's on_done frees its context */
            break;
        }
        const double now = since(r);
        while (hi < w->n && w->conv[hi].arrival_s <= now)
            hi++;
        double next_due = hi < w->n ? w->conv[hi].arrival_s : INFINITY;
        for (int32_t i = lo; st == PV_OK && i < hi; i++) {
            conv_state *cs = &r->convs[i];
            if (cs->in_flight || cs->next >= w->conv[i].n_turns)
                continue;
            if (cs->due_s <= now)
                st = submit_turn(r, i);
            else
                next_due = fmin(next_due, cs->due_s);
        }
        if (st != PV_OK)
            break;
        if (pv_engine_pending(r->engine) > 0) {
            st = pv_engine_step(r->engine, NULL);
            if (st == PV_OK && r->clock)
                st = advance_clock(r);
        } else if (isfinite(next_due)) {
            wait_until(r, next_due);
        }
        /* a conversation whose last turn ended frees its cache */
        for (int32_t i = lo; st == PV_OK && i < hi; i++) {
            conv_state *cs = &r->convs[i];
            if (cs->ended || cs->in_flight || cs->next < w->conv[i].n_turns)
                continue;
            const pv_status end = pv_engine_end_session(r->engine, cs->session);
            if (end != PV_OK && end != PV_ERR_NOT_FOUND) /* stateless mode keeps no session */
                st = end;
            cs->ended = 1;
        }
        while (lo < hi && r->convs[lo].ended)
            lo++;
    }
    return st;
}

pv_status bi_run(pv_engine *engine, bi_clock *clock, uint32_t n_vocab, const wl_workload *w, uint64_t seed,
                 const char *label, br_run *out)
{
    memset(out, 0, sizeof *out);
    run_state r = {.w = w, .engine = engine, .clock = clock, .n_vocab = n_vocab, .label = label, .out = out,
                   .seed = seed, .rng = seed};
    for (int32_t i = 0; i < w->n; i++)
        r.total += w->conv[i].n_turns;
    const size_t n_records = (size_t)(r.total ? r.total : 1);
    r.convs = calloc(w->n > 0 ? (size_t)w->n : 1, sizeof *r.convs);
    out->records = calloc(n_records, sizeof *out->records);
    pv_status st = PV_OK;
    if (clock) { /* at most one pending first token and answer per turn */
        r.first_pending = malloc(n_records * sizeof *r.first_pending);
        r.done_pending = malloc(n_records * sizeof *r.done_pending);
        if (!r.first_pending || !r.done_pending)
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-bench: %lld requests", (long long)r.total);
    }
    if (!r.convs || !out->records)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-bench: %lld requests", (long long)r.total);
    if (st == PV_OK)
        st = run_workload(&r);
    pv_engine_stats es;
    if (st == PV_OK && (st = pv_engine_stats_get(engine, &es)) == PV_OK)
        out->counters = (br_counters){.known = 1,
                                      .turns_done = es.turns_done,
                                      .turns_failed = es.turns_failed,
                                      .prefill_tokens = es.prefill_tokens,
                                      .recomputed_tokens = es.recomputed_tokens,
                                      .decode_tokens = es.decode_tokens,
                                      .swap_in_chunks = es.swap_in_chunks,
                                      .swap_out_chunks = es.swap_out_chunks,
                                      .dropped_chunks = es.dropped_chunks,
                                      .suspensions = es.suspensions};
    for (int32_t i = 0; r.convs && i < w->n; i++)
        free(r.convs[i].prompt_ids);
    free(r.convs);
    for (int64_t k = 0; k < r.n_done_pending; k++) /* a failed run's last iteration */
        free(r.done_pending[k]);
    free(r.first_pending);
    free(r.done_pending);
    return st;
}
