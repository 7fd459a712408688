/* pensieve-bench: the multi-turn serving benchmark (issue 13), the way the
 * paper measures it: conversations arrive as a Poisson process, each turn
 * is sent after the previous answer plus an exponential think time, and a
 * run reports throughput against normalized latency (end-to-end latency /
 * output tokens), side by side for the engine's modes.
 *
 * This driver runs the engine in process, in real time on one thread:
 * between iterations (pv_engine_step) it submits every turn that is due,
 * and sleeps until the next one when nothing is running. Generated turns
 * are token ids (random ids of the vocabulary's middle, never an end
 * token), answered with ignore_eos so every answer has the length the
 * workload drew; replayed turns (--replay FILE.jsonl) are chat messages.
 * Each mode builds its own stack (backend, model, engine) and runs the same
 * workload from a clean cache.
 *
 * Prints a table per run, or JSON with --json. */
#include "config.h"

#include "apps/setup.h"
#include "bench/bench-util.h"
#include "bench/workload.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *prog = "pensieve-bench";

#define MAX_MODES 3

typedef struct bench_options {
    app_stack_options stack;
    pv_engine_mode modes[MAX_MODES];
    int n_modes;
    wl_options workload;
    const char *replay;
    int json;
} bench_options;

/* ---- one run --------------------------------------------------------------------- */

/* What one request (turn) saw, from the client's side and the engine's. */
typedef struct request_record {
    double submit_s, first_s, end_s; /* since the run's start; first_s < 0: no token */
    int32_t input_tokens, target_tokens, generated;
    pv_turn_result result;
    pv_status status;
} request_record;

typedef struct conv_state {
    int32_t next;      /* index of the next turn to send */
    int in_flight;
    int ended;         /* its last turn ended and its session was closed */
    double due_s;      /* when the next turn may be sent */
    char session[32];
    int32_t *prompt_ids; /* generated turns: the ids of the current request */
} conv_state;

typedef struct run_state {
    const bench_options *o;
    const wl_workload *w;
    pv_engine *engine;
    const pv_tokenizer *tok;
    uint32_t n_vocab;
    double t0;
    conv_state *convs;
    request_record *records; /* [request index] in order of submission */
    int64_t n_records, n_done;
    uint64_t rng;
    char first_error[256]; /* the first failed request's message */
} run_state;

typedef struct request_ctx {
    run_state *run;
    int32_t conv;
    int64_t record;
} request_ctx;

static double since(const run_state *r)
{
    return bench_now_s() - r->t0;
}

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token, (void)text, (void)len;
    request_ctx *c = user;
    request_record *rec = &c->run->records[c->record];
    if (rec->first_s < 0)
        rec->first_s = since(c->run);
}

static void on_done(void *user, pv_status status, const pv_turn_result *result)
{
    request_ctx *c = user;
    run_state *r = c->run;
    request_record *rec = &r->records[c->record];
    rec->end_s = since(r);
    rec->status = status;
    if ((status != PV_OK || (result && result->finish == PV_FINISH_ERROR)) && !r->first_error[0])
        snprintf(r->first_error, sizeof r->first_error, "conversation %d: %s", c->conv, pv_last_error());
    if (result)
        rec->result = *result;
    rec->generated = result ? (int32_t)result->generated : 0;
    conv_state *cs = &r->convs[c->conv];
    cs->in_flight = 0;
    const wl_conversation *wc = &r->w->conv[c->conv];
    if (cs->next < wc->n_turns)
        cs->due_s = rec->end_s + wc->turns[cs->next].think_s;
    r->n_done++;
    free(c);
}

static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Sends conversation i's next turn. */
static pv_status submit_turn(run_state *r, int32_t i)
{
    conv_state *cs = &r->convs[i];
    const wl_turn *t = &r->w->conv[i].turns[cs->next];
    request_ctx *ctx = malloc(sizeof *ctx);
    if (!ctx)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory for a request", prog);
    *ctx = (request_ctx){r, i, r->n_records};
    request_record *rec = &r->records[r->n_records];
    *rec = (request_record){.submit_s = since(r), .first_s = -1, .input_tokens = t->input_tokens,
                            .target_tokens = t->output_tokens};
    pv_turn turn;
    memset(&turn, 0, sizeof turn);
    pv_sampling_defaults(&turn.sampling);
    turn.sampling.max_tokens = t->output_tokens;
    turn.sampling.ignore_eos = 1;
    pv_chat_message msg = {"user", t->text};
    if (t->text) {
        turn.messages = &msg;
        turn.n_messages = 1;
    } else {
        int32_t *ids = realloc(cs->prompt_ids, (size_t)t->input_tokens * sizeof *ids);
        if (!ids) {
            free(ctx);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %d prompt tokens", prog, t->input_tokens);
        }
        cs->prompt_ids = ids;
        /* the vocabulary's middle half: no end or control tokens */
        for (int32_t k = 0; k < t->input_tokens; k++)
            ids[k] = (int32_t)(r->n_vocab / 4 + next_random(&r->rng) % (r->n_vocab / 2));
        turn.tokens = ids;
        turn.n_tokens = (size_t)t->input_tokens;
    }
    const pv_turn_callbacks cb = {on_token, on_done, ctx};
    pv_status st = pv_engine_submit(r->engine, cs->session, &turn, &cb, NULL);
    if (st != PV_OK) {
        free(ctx);
        return pv_error(st, "%s: conversation %d turn %d: %s", prog, i, cs->next, pv_last_error());
    }
    r->n_records++;
    cs->next++;
    cs->in_flight = 1;
    return PV_OK;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The workload, in real time, until every turn has ended. */
static pv_status run_workload(run_state *r)
{
    const wl_workload *w = r->w;
    int64_t total = 0;
    for (int32_t i = 0; i < w->n; i++) {
        total += w->conv[i].n_turns;
        r->convs[i].due_s = w->conv[i].arrival_s;
        snprintf(r->convs[i].session, sizeof r->convs[i].session, "conv-%d", i);
    }
    r->t0 = bench_now_s();
    pv_status st = PV_OK;
    while (st == PV_OK && r->n_done < total) {
        const double now = since(r);
        double next_due = INFINITY;
        for (int32_t i = 0; st == PV_OK && i < w->n; i++) {
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
        if (pv_engine_pending(r->engine) > 0)
            st = pv_engine_step(r->engine, NULL);
        else if (isfinite(next_due))
            sleep_s(next_due - since(r));
        /* a conversation whose last turn ended frees its cache */
        for (int32_t i = 0; st == PV_OK && i < w->n; i++) {
            conv_state *cs = &r->convs[i];
            if (cs->ended || cs->in_flight || cs->next < w->conv[i].n_turns)
                continue;
            const pv_status end = pv_engine_end_session(r->engine, cs->session);
            if (end != PV_OK && end != PV_ERR_NOT_FOUND) /* stateless mode keeps no session */
                st = end;
            cs->ended = 1;
        }
    }
    return st;
}

/* ---- the report -------------------------------------------------------------------- */

typedef struct run_report {
    pv_engine_mode mode;
    pv_policy policy;
    wl_summary workload; /* what was drawn for this run */
    int64_t context_cap; /* --context-cap, or less: the model's context, the device pool */
    char first_error[256];
    int64_t requests, failed;
    int64_t input_tokens, generated_tokens, target_tokens;
    double duration_s;
    double requests_per_s, tokens_per_s;
    double norm_latency_mean, norm_latency_p90; /* seconds per output token */
    double ttft_p50, ttft_p90;
    uint64_t history_tokens, reused_device, reused_host, recomputed;
    pv_engine_stats stats;
} run_report;

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank quantile of v[0..n) (sorted in place); 0 for n = 0. */
static double quantile(double *v, int64_t n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, by_value);
    int64_t k = (int64_t)ceil(q * (double)n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static pv_status summarise(const run_state *r, run_report *rep)
{
    double *norm = malloc((size_t)(r->n_records ? r->n_records : 1) * sizeof *norm);
    double *ttft = malloc((size_t)(r->n_records ? r->n_records : 1) * sizeof *ttft);
    if (!norm || !ttft) {
        free(norm);
        free(ttft);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %lld records", prog, (long long)r->n_records);
    }
    double first = INFINITY, last = 0, norm_sum = 0;
    int64_t n_norm = 0, n_ttft = 0;
    for (int64_t i = 0; i < r->n_records; i++) {
        const request_record *rec = &r->records[i];
        rep->requests++;
        if (rec->status != PV_OK || rec->result.finish == PV_FINISH_ERROR) {
            rep->failed++;
            continue;
        }
        first = fmin(first, rec->submit_s);
        last = fmax(last, rec->end_s);
        rep->input_tokens += rec->input_tokens;
        rep->generated_tokens += rec->generated;
        rep->target_tokens += rec->target_tokens;
        rep->history_tokens += rec->result.context_tokens;
        rep->reused_device += rec->result.reused_device;
        rep->reused_host += rec->result.reused_host;
        rep->recomputed += rec->result.recomputed;
        if (rec->generated > 0) {
            norm[n_norm] = (rec->end_s - rec->submit_s) / rec->generated;
            norm_sum += norm[n_norm++];
        }
        if (rec->first_s >= 0)
            ttft[n_ttft++] = rec->first_s - rec->submit_s;
    }
    rep->duration_s = last > first ? last - first : 0;
    memcpy(rep->first_error, r->first_error, sizeof rep->first_error);
    const int64_t completed = rep->requests - rep->failed;
    rep->requests_per_s = rep->duration_s > 0 ? (double)completed / rep->duration_s : 0;
    rep->tokens_per_s = rep->duration_s > 0 ? (double)rep->generated_tokens / rep->duration_s : 0;
    rep->norm_latency_mean = n_norm ? norm_sum / (double)n_norm : 0;
    rep->norm_latency_p90 = quantile(norm, n_norm, 0.9);
    rep->ttft_p50 = quantile(ttft, n_ttft, 0.5);
    rep->ttft_p90 = quantile(ttft, n_ttft, 0.9);
    free(norm);
    free(ttft);
    return pv_engine_stats_get(r->engine, &rep->stats);
}

/* Replayed messages' lengths in the model's own tokens. */
static int32_t count_tokens(void *ctx, const char *text)
{
    const pv_tokenizer *tok = ctx;
    const size_t len = strlen(text);
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    size_t n = 0;
    if (!ids || pv_tokenizer_encode(tok, text, len, 0, ids, len + 1, &n) != PV_OK)
        n = (len + 3) / 4; /* the rough rule, should the text not encode */
    free(ids);
    return n > INT32_MAX ? INT32_MAX : (int32_t)(n ? n : 1);
}

static pv_status run_mode(const bench_options *o, pv_engine_mode mode, run_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->mode = mode;
    app_stack_options so = o->stack;
    so.mode = mode;
    app_stack st;
    if (app_stack_init(&st, &so, prog) != 0) {
        app_stack_free(&st);
        return pv_error(PV_ERR_INVALID_ARG, "%s: the %s stack did not start", prog, pv_engine_mode_name(mode));
    }
    rep->policy = st.policy;
    const pv_llama_hparams *hp = pv_llama_hparams_of(st.model);
    wl_options wo = o->workload;
    /* The engine refuses a turn past the model's context, and fails one
     * whose context outgrows the whole device pool (every layer's chunks of
     * a running request live there, and a partly filled last chunk is
     * copied to a fresh slot at admission while its old one is held):
     * conversations stop short of both, two chunks short of the pool. */
    pv_cache_stats cs;
    pv_status s = pv_cache_stats_get(pv_engine_cache(st.engine), &cs);
    const int64_t chunk = pv_llama_options_of(st.model)->chunk_tokens;
    const int64_t pool_chunks = (int64_t)(cs.capacity_bytes[PV_TIER_DEVICE] / pv_llama_slot_bytes(st.model)) /
                                (int64_t)hp->n_layers;
    const int64_t fits = (pool_chunks - 2) * chunk;
    rep->context_cap = wo.context_cap;
    if (rep->context_cap >= (int64_t)hp->n_ctx_train)
        rep->context_cap = (int64_t)hp->n_ctx_train - 1;
    if (rep->context_cap > fits)
        rep->context_cap = fits;
    if (s == PV_OK && rep->context_cap < 2)
        s = pv_error(PV_ERR_INVALID_ARG, "%s: the device pool holds %lld chunks of a conversation: too small a "
                     "--device-mem for any conversation",
                     prog, (long long)pool_chunks);
    wo.context_cap = (int32_t)rep->context_cap;
    wl_workload w = {0};
    if (s == PV_OK)
        s = o->replay ? wl_load_jsonl(o->replay, &wo, count_tokens, &st.tok, &w) : wl_generate(&wo, &w);
    run_state r = {.o = o, .w = &w, .engine = st.engine, .tok = &st.tok, .n_vocab = hp->n_vocab, .rng = wo.seed};
    int64_t total = 0;
    for (int32_t i = 0; s == PV_OK && i < w.n; i++)
        total += w.conv[i].n_turns;
    if (s == PV_OK) {
        r.convs = calloc(w.n > 0 ? (size_t)w.n : 1, sizeof *r.convs);
        r.records = calloc((size_t)(total ? total : 1), sizeof *r.records);
        if (!r.convs || !r.records)
            s = pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %lld requests", prog, (long long)total);
    }
    if (s == PV_OK) {
        wl_summarise(&w, &rep->workload);
        s = run_workload(&r);
    }
    if (s == PV_OK)
        s = summarise(&r, rep);
    for (int32_t i = 0; r.convs && i < w.n; i++)
        free(r.convs[i].prompt_ids);
    free(r.convs);
    free(r.records);
    wl_free(&w);
    app_stack_free(&st);
    return s;
}

static void print_table(const bench_options *o, const run_report *reps, int n)
{
    const wl_options *w = &o->workload;
    printf("pensieve-bench: %s, %s conversations at %.3g/s, think %.3g s, time scale %.3g, length scale %.3g, "
           "seed %llu\n",
           o->replay ? o->replay : wl_dataset_stats_of(w->dataset)->name, o->replay ? "replayed" : "generated",
           w->rate, w->think_mean_s, w->time_scale, w->length_scale, (unsigned long long)w->seed);
    printf("%-10s %-9s %6s %6s %9s %9s %10s %10s %9s %9s %7s %7s %7s %9s %9s %8s\n", "mode", "policy", "reqs",
           "failed", "req/s", "tok/s", "norm mean", "norm p90", "ttft p50", "ttft p90", "device", "host",
           "recomp", "swap-out", "swap-in", "dropped");
    for (int i = 0; i < n; i++) {
        const run_report *r = &reps[i];
        const double h = r->history_tokens ? (double)r->history_tokens : 1;
        printf("%-10s %-9s %6lld %6lld %9.3f %9.1f %10.4f %10.4f %9.3f %9.3f %6.1f%% %6.1f%% %6.1f%% %9llu %9llu "
               "%8llu\n",
               pv_engine_mode_name(r->mode), pv_policy_name(r->policy), (long long)r->requests,
               (long long)r->failed, r->requests_per_s, r->tokens_per_s, r->norm_latency_mean,
               r->norm_latency_p90, r->ttft_p50, r->ttft_p90, 100 * r->reused_device / h,
               100 * r->reused_host / h, 100 * r->recomputed / h, (unsigned long long)r->stats.swap_out_chunks,
               (unsigned long long)r->stats.swap_in_chunks, (unsigned long long)r->stats.dropped_chunks);
    }
    printf("norm: end-to-end latency / output tokens (s); ttft in s at the client; device, host, recomp: shares of\n"
           "the history tokens the turns found, by where they came from; swaps in (chunk, layer) records\n");
    for (int i = 0; i < n; i++) {
        printf("%s: %lld conversations, %lld requests, context cap %lld tokens\n", pv_engine_mode_name(reps[i].mode),
               (long long)reps[i].workload.conversations, (long long)reps[i].workload.requests,
               (long long)reps[i].context_cap);
        if (reps[i].first_error[0])
            printf("%s: first failure: %s\n", pv_engine_mode_name(reps[i].mode), reps[i].first_error);
    }
}

static void print_json(const bench_options *o, const run_report *reps, int n)
{
    const wl_options *w = &o->workload;
    printf("{\"workload\": {\"source\": \"%s\", \"rate\": %.6g, \"think_mean_s\": %.6g, \"time_scale\": %.6g, "
           "\"length_scale\": %.6g, \"seed\": %llu, \"context_cap\": %d},\n \"runs\": [",
           o->replay ? "replay" : wl_dataset_stats_of(w->dataset)->name, w->rate, w->think_mean_s, w->time_scale,
           w->length_scale, (unsigned long long)w->seed, w->context_cap);
    for (int i = 0; i < n; i++) {
        const run_report *r = &reps[i];
        json_t *why = json_string(r->first_error);
        char *why_text = json_dumps(why, JSON_ENCODE_ANY);
        printf("%s\n  {\"mode\": \"%s\", \"policy\": \"%s\", \"context_cap\": %lld, \"first_error\": %s, "
               "\"workload_conversations\": %lld, \"workload_requests\": %lld, \"requests\": %lld, \"failed\": %lld, "
               "\"input_tokens\": %lld, \"generated_tokens\": %lld, \"target_tokens\": %lld, \"duration_s\": %.4f, "
               "\"requests_per_s\": %.6g, \"tokens_per_s\": %.6g, \"norm_latency_mean\": %.6g, "
               "\"norm_latency_p90\": %.6g, \"ttft_p50\": %.6g, \"ttft_p90\": %.6g, \"history_tokens\": %llu, "
               "\"reused_device\": %llu, \"reused_host\": %llu, \"recomputed\": %llu, \"engine\": "
               "{\"turns_done\": %llu, \"turns_failed\": %llu, \"prefill_tokens\": %llu, \"recomputed_tokens\": %llu, "
               "\"decode_tokens\": %llu, \"swap_in_chunks\": %llu, \"swap_out_chunks\": %llu, \"dropped_chunks\": "
               "%llu, \"suspensions\": %llu}}",
               i ? "," : "", pv_engine_mode_name(r->mode), pv_policy_name(r->policy), (long long)r->context_cap,
               why_text ? why_text : "null", (long long)r->workload.conversations, (long long)r->workload.requests, (long long)r->requests,
               (long long)r->failed, (long long)r->input_tokens, (long long)r->generated_tokens,
               (long long)r->target_tokens, r->duration_s, r->requests_per_s, r->tokens_per_s,
               r->norm_latency_mean, r->norm_latency_p90, r->ttft_p50, r->ttft_p90,
               (unsigned long long)r->history_tokens, (unsigned long long)r->reused_device,
               (unsigned long long)r->reused_host, (unsigned long long)r->recomputed,
               (unsigned long long)r->stats.turns_done, (unsigned long long)r->stats.turns_failed,
               (unsigned long long)r->stats.prefill_tokens, (unsigned long long)r->stats.recomputed_tokens,
               (unsigned long long)r->stats.decode_tokens, (unsigned long long)r->stats.swap_in_chunks,
               (unsigned long long)r->stats.swap_out_chunks, (unsigned long long)r->stats.dropped_chunks,
               (unsigned long long)r->stats.suspensions);
        free(why_text);
        json_decref(why);
    }
    printf("\n]}\n");
}

/* ---- options ------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pensieve-bench [options]\n"
            "workload:\n"
            "  --dataset NAME       sharegpt (default) or ultrachat: the paper's turn and length means\n"
            "  --replay FILE        conversations from a JSONL file (OpenAI messages, one a line)\n"
            "  --conversations N    how many (default 100; with --replay, at most N lines)\n"
            "  --rate R             conversations per second, Poisson arrivals (default 1)\n"
            "  --think S            mean think time between turns, exponential (default 60)\n"
            "  --time-scale X       multiplies arrival gaps and think times (default 1)\n"
            "  --length-scale X     multiplies the mean input and output lengths (default 1)\n"
            "  --context-cap N      a conversation ends before passing N tokens (default 16384)\n"
            "  --seed N             the workload's draws (default 1)\n"
            "serving:\n"
            "  --modes LIST         comma list of pensieve, gpu-only, stateless (default all three)\n"
            "  --policy NAME        pensieve, weighted or lru\n"
            "  --model PATH | --synthetic   the GGUF file (default: scripts/get-model's) or the test model\n"
            "  --backend NAME       cpu, opencl or cuda (default cpu)\n"
            "  --device-mem SIZE    device tier budget, e.g. 64M\n"
            "  --host-mem SIZE      host tier budget\n"
            "  --config FILE        cache settings (INI)\n"
            "  --profile FILE       device profile from pensieve-tune\n"
            "  --json               print JSON instead of the table\n");
}

static int parse_modes(const char *text, bench_options *o)
{
    o->n_modes = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        pv_engine_mode m;
        if (o->n_modes == MAX_MODES || pv_engine_mode_parse(name, &m) != PV_OK) {
            fprintf(stderr, "%s: --modes '%s': want a comma list of pensieve, gpu-only, stateless\n", prog, text);
            return -1;
        }
        o->modes[o->n_modes++] = m;
    }
    return o->n_modes ? 0 : -1;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: %s '%s' is not a number in [%g, %g]\n", prog, opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

enum {
    OPT_DATASET = 256, OPT_REPLAY, OPT_CONVS, OPT_RATE, OPT_THINK, OPT_TIME_SCALE, OPT_LENGTH_SCALE, OPT_CAP,
    OPT_SEED, OPT_MODES, OPT_JSON,
    OPT_STACK /* the stack's options (app_stack_option) */
};

static int parse_options(int argc, char **argv, bench_options *o)
{
    static const struct option longopts[] = {
        {"dataset", required_argument, 0, OPT_DATASET},   {"replay", required_argument, 0, OPT_REPLAY},
        {"conversations", required_argument, 0, OPT_CONVS}, {"rate", required_argument, 0, OPT_RATE},
        {"think", required_argument, 0, OPT_THINK},       {"time-scale", required_argument, 0, OPT_TIME_SCALE},
        {"length-scale", required_argument, 0, OPT_LENGTH_SCALE}, {"context-cap", required_argument, 0, OPT_CAP},
        {"seed", required_argument, 0, OPT_SEED},         {"modes", required_argument, 0, OPT_MODES},
        {"json", no_argument, 0, OPT_JSON},               {"help", no_argument, 0, 'h'},
        {"policy", required_argument, 0, OPT_STACK},      {"model", required_argument, 0, OPT_STACK},
        {"synthetic", no_argument, 0, OPT_STACK},         {"backend", required_argument, 0, OPT_STACK},
        {"device-mem", required_argument, 0, OPT_STACK},  {"host-mem", required_argument, 0, OPT_STACK},
        {"config", required_argument, 0, OPT_STACK},      {"profile", required_argument, 0, OPT_STACK},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->stack.backend = "cpu";
    o->stack.kv_dtype = PV_F32;
    wl_options_default(&o->workload);
    o->n_modes = 3;
    o->modes[0] = PV_MODE_PENSIEVE;
    o->modes[1] = PV_MODE_GPU_ONLY;
    o->modes[2] = PV_MODE_STATELESS;
    int c, index = 0;
    long v;
    while ((c = getopt_long(argc, argv, "h", longopts, &index)) != -1) {
        switch (c) {
        case OPT_STACK:
            if (app_stack_option(prog, longopts[index].name, optarg, &o->stack) < 0) return -1;
            break;
        case OPT_DATASET:
            if (wl_dataset_parse(optarg, &o->workload.dataset) != 0) {
                fprintf(stderr, "%s: --dataset '%s' is not sharegpt or ultrachat\n", prog, optarg);
                return -1;
            }
            break;
        case OPT_REPLAY: o->replay = optarg; break;
        case OPT_CONVS:
            if (app_opt_long(prog, "--conversations", optarg, 1, 1000000, &v)) return -1;
            o->workload.n_conversations = (int32_t)v;
            break;
        case OPT_RATE:
            if (parse_double("--rate", optarg, 1e-6, 1e6, &o->workload.rate)) return -1;
            break;
        case OPT_THINK:
            if (parse_double("--think", optarg, 0, 1e6, &o->workload.think_mean_s)) return -1;
            break;
        case OPT_TIME_SCALE:
            if (parse_double("--time-scale", optarg, 1e-6, 1e6, &o->workload.time_scale)) return -1;
            break;
        case OPT_LENGTH_SCALE:
            if (parse_double("--length-scale", optarg, 1e-6, 1e3, &o->workload.length_scale)) return -1;
            break;
        case OPT_CAP:
            if (app_opt_long(prog, "--context-cap", optarg, 2, 1 << 24, &v)) return -1;
            o->workload.context_cap = (int32_t)v;
            break;
        case OPT_SEED:
            if (app_opt_long(prog, "--seed", optarg, 0, INT32_MAX, &v)) return -1;
            o->workload.seed = (uint64_t)v;
            break;
        case OPT_MODES:
            if (parse_modes(optarg, o)) return -1;
            break;
        case OPT_JSON: o->json = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return -1;
    }
    return app_stack_options_check(prog, &o->stack);
}

int main(int argc, char **argv)
{
    bench_options o;
    if (parse_options(argc, argv, &o) != 0)
        return 2;
    run_report reps[MAX_MODES];
    for (int i = 0; i < o.n_modes; i++) {
        pv_status st = run_mode(&o, o.modes[i], &reps[i]);
        if (st != PV_OK) {
            fprintf(stderr, "%s: %s mode: %s (%s)\n", prog, pv_engine_mode_name(o.modes[i]), pv_last_error(),
                    pv_status_str(st));
            return 1;
        }
    }
    if (o.json)
        print_json(&o, reps, o.n_modes);
    else
        print_table(&o, reps, o.n_modes);
    return 0;
}
