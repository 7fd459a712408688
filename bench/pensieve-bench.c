/* pensieve-bench: the multi-turn serving benchmark (issue 13), the way the
 * paper measures it: conversations arrive as a Poisson process, each turn
 * is sent after the previous answer plus an exponential think time, and a
 * run reports throughput against normalized latency (end-to-end latency /
 * output tokens), side by side for the engine's modes.
 *
 * In process (bench-inproc.c) each mode builds its own stack (backend,
 * model, engine) and runs the workload from a clean cache; with --http URL
 * (bench-http.c) the same workload goes to a server over the OpenAI API.
 * A sweep (--rates, --sweep) runs each mode at rising rates until its mean
 * normalized latency passes the target, then compares the highest rates
 * that met it; the eviction policies are then compared at pensieve mode's
 * highest such rate (--policies).
 *
 * Prints a table, or JSON with --json; --plot draws throughput against
 * normalized latency, one line per mode (gnuplot). */
#include "config.h"

#include "apps/setup.h"
#include "bench/bench-http.h"
#include "bench/bench-inproc.h"
#include "bench/bench-run.h"
#include "bench/bench-sweep.h"
#include "bench/bench-util.h"
#include "bench/workload.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "pensieve-bench";

#define MAX_MODES 3
#define MAX_POLICIES 3
#define MAX_RATES 16
#define MAX_BAN_TOKENS 64

/* --sweep without --rates: a sweep sized for SmolLM2-135M on a small CPU
 * (2 cores; docs/PERFORMANCE.md), in under 15 minutes. The options given
 * override each of these. Rates are conversations/s before --time-scale:
 * 0.01 is one conversation every 5 s here. */
static const double sweep_rates[] = {0.02, 0.04, 0.08, 0.16};
#define SWEEP_DURATION_S 20
#define SWEEP_TIME_SCALE 0.05
#define SWEEP_LENGTH_SCALE 0.25
#define SWEEP_DEVICE_BYTES (24ull << 20) /* one conversation at the cap of 480 tokens: histories */
#define SWEEP_HOST_BYTES (256ull << 20)  /* must go to the host tier, which overflows past the knee */

typedef struct bench_options {
    app_stack_options stack;
    pv_engine_mode modes[MAX_MODES];
    int n_modes;
    pv_policy policies[MAX_POLICIES]; /* compared in pensieve mode (run_all says at which rate) */
    int n_policies;
    wl_options workload;
    double rates[MAX_RATES]; /* rising */
    int n_rates;
    int sweep;
    double target; /* normalized latency target, seconds per output token */
    double time_limit_s; /* --time-limit; 0: none */
    double duration_s; /* > 0: conversations arrive over this long (real time) at every rate */
    const char *replay;
    const char *plot;
    const char *http;         /* a server's base URL: the HTTP driver */
    const char *server_model; /* the requests' "model" */
    const char *label;        /* the server's name in reports */
    int no_sessions;
    double virtual_step_s, virtual_token_s; /* --virtual-time; step 0: real time */
    int32_t ban_tokens[MAX_BAN_TOKENS]; /* logit_bias -100: for servers without ignore_eos */
    int n_ban_tokens;
    int json;
} bench_options;

/* ---- the report -------------------------------------------------------------------- */

typedef struct run_report {
    char label[64];     /* the mode, or the server's --label */
    const char *policy; /* NULL over HTTP */
    double rate;
    wl_summary workload; /* what was drawn for this run */
    int64_t context_cap; /* --context-cap, or less: the model's context, the device pool */
    char first_error[256];
    int64_t requests, failed;
    int64_t input_tokens, generated_tokens, target_tokens;
    uint64_t prompt_tokens, cached_tokens;
    uint64_t history_tokens, reused_device, reused_host, recomputed; /* in process */
    double duration_s;
    double requests_per_s, tokens_per_s; /* measured: first request to last answer */
    double offered_requests_per_s;       /* the workload's: conversations/s x turns a conversation */
    double norm_latency_mean, norm_latency_p90; /* seconds per output token */
    double ttft_p50, ttft_p90;
    int meets_target;
    br_counters counters;
    int interrupted; /* cut short (br_stopping, bench-run.h): reported by name only */
} run_report;

/* Nearest-rank quantile of v[0..n) (sorted in place); 0 for n = 0. */
static double quantile(double *v, int64_t n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    int64_t k = (int64_t)ceil(q * (double)n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static pv_status summarise(const br_run *run, double target, run_report *rep)
{
    const size_t n = (size_t)(run->n_records ? run->n_records : 1);
    double *norm = malloc(n * sizeof *norm), *ttft = malloc(n * sizeof *ttft);
    if (!norm || !ttft) {
        free(norm);
        free(ttft);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %lld records", prog, (long long)run->n_records);
    }
    double first = INFINITY, last = 0, norm_sum = 0;
    int64_t n_norm = 0, n_ttft = 0;
    for (int64_t i = 0; i < run->n_records; i++) {
        const br_record *rec = &run->records[i];
        rep->requests++;
        if (rec->failed) {
            rep->failed++;
            continue;
        }
        first = fmin(first, rec->submit_s);
        last = fmax(last, rec->end_s);
        rep->input_tokens += rec->input_tokens;
        rep->generated_tokens += rec->generated;
        rep->target_tokens += rec->target_tokens;
        rep->prompt_tokens += rec->prompt_tokens;
        rep->cached_tokens += rec->cached_tokens;
        rep->history_tokens += rec->history_tokens;
        rep->reused_device += rec->reused_device;
        rep->reused_host += rec->reused_host;
        rep->recomputed += rec->recomputed;
        if (rec->generated > 0) {
            norm[n_norm] = (rec->end_s - rec->submit_s) / rec->generated;
            norm_sum += norm[n_norm++];
        }
        if (rec->first_s >= 0)
            ttft[n_ttft++] = rec->first_s - rec->submit_s;
    }
    rep->duration_s = last > first ? last - first : 0;
    memcpy(rep->first_error, run->first_error, sizeof rep->first_error);
    const int64_t completed = rep->requests - rep->failed;
    rep->requests_per_s = rep->duration_s > 0 ? (double)completed / rep->duration_s : 0;
    rep->tokens_per_s = rep->duration_s > 0 ? (double)rep->generated_tokens / rep->duration_s : 0;
    rep->norm_latency_mean = n_norm ? norm_sum / (double)n_norm : 0;
    rep->norm_latency_p90 = quantile(norm, n_norm, 0.9);
    rep->ttft_p50 = quantile(ttft, n_ttft, 0.5);
    rep->ttft_p90 = quantile(ttft, n_ttft, 0.9);
    /* every turn of the workload answered, within the target */
    rep->meets_target = rep->failed == 0 && rep->requests == rep->workload.requests && n_norm > 0 &&
                        rep->norm_latency_mean <= target;
    rep->counters = run->counters;
    rep->interrupted = run->interrupted;
    free(norm);
    free(ttft);
    return PV_OK;
}

/* ---- one run ----------------------------------------------------------------------- */

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

static pv_status load_workload(const bench_options *o, double rate, int32_t cap, const pv_tokenizer *tok,
                               wl_workload *w, run_report *rep)
{
    wl_options wo = o->workload;
    wo.rate = rate;
    wo.context_cap = cap;
    /* a fixed arrival window: the offered load grows with the rate (a fixed
     * number of conversations would cap how many run at once) */
    if (o->duration_s > 0)
        wo.n_conversations = (int32_t)fmax(2, fmin(1e6, round(rate / wo.time_scale * o->duration_s)));
    pv_status s = o->replay ? wl_load_jsonl(o->replay, &wo, tok ? count_tokens : NULL, (void *)tok, w)
                            : wl_generate(&wo, w);
    if (s == PV_OK) {
        wl_summarise(w, &rep->workload);
        rep->offered_requests_per_s = rate / wo.time_scale * rep->workload.mean_turns;
    }
    return s;
}

/* One run through the engine in process; policy < 0: the stack's own. */
static pv_status run_engine(const bench_options *o, pv_engine_mode mode, int policy, double rate, run_report *rep)
{
    memset(rep, 0, sizeof *rep);
    snprintf(rep->label, sizeof rep->label, "%s", pv_engine_mode_name(mode));
    rep->rate = rate;
    if (br_stopping()) { /* between runs: no model to load for nothing */
        rep->interrupted = 1;
        return PV_OK;
    }
    app_stack_options so = o->stack;
    so.mode = mode;
    bi_clock clock = {.now = 0, .step_s = o->virtual_step_s, .token_s = o->virtual_token_s};
    if (o->virtual_step_s > 0) {
        so.clock = bi_clock_read;
        so.clock_ctx = &clock;
    }
    if (policy >= 0) {
        so.policy = (pv_policy)policy;
        so.have_policy = 1;
    }
    app_stack st;
    if (app_stack_init(&st, &so, prog) != 0) {
        app_stack_free(&st);
        return pv_error(PV_ERR_INVALID_ARG, "%s: the %s stack did not start", prog, rep->label);
    }
    rep->policy = pv_policy_name(st.policy);
    const pv_llama_hparams *hp = pv_llama_hparams_of(st.model);
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
    rep->context_cap = o->workload.context_cap;
    if (rep->context_cap >= (int64_t)hp->n_ctx_train)
        rep->context_cap = (int64_t)hp->n_ctx_train - 1;
    if (rep->context_cap > fits)
        rep->context_cap = fits;
    if (s == PV_OK && rep->context_cap < 2)
        s = pv_error(PV_ERR_INVALID_ARG, "%s: the device pool holds %lld chunks of a conversation: too small a "
                     "--device-mem for any conversation",
                     prog, (long long)pool_chunks);
    else if (s == PV_OK && rep->context_cap < (int64_t)o->workload.system_prompt_tokens + 2)
        s = pv_error(PV_ERR_INVALID_ARG, "%s: conversations are capped at %lld tokens here (the model's context, "
                     "the device pool's %lld chunks): no room for a %d-token system prompt and a turn; a larger "
                     "--device-mem, or fewer --system-prompt-tokens",
                     prog, (long long)rep->context_cap, (long long)pool_chunks, (int)o->workload.system_prompt_tokens);
    wl_workload w = {0};
    if (s == PV_OK)
        s = load_workload(o, rate, (int32_t)rep->context_cap, &st.tok, &w, rep);
    br_run run = {0};
    char label[96];
    snprintf(label, sizeof label, "%s %s at %.3g/s", rep->label, rep->policy, rate);
    if (s == PV_OK)
        s = bi_run(st.engine, o->virtual_step_s > 0 ? &clock : NULL, hp->n_vocab, &w, o->workload.seed, label,
                   &run);
    if (s == PV_OK)
        s = summarise(&run, o->target, rep);
    br_run_free(&run);
    wl_free(&w);
    app_stack_free(&st);
    return s;
}

/* One run against a server over HTTP; run_index keeps sessions apart. */
static pv_status run_http(const bench_options *o, double rate, int run_index, run_report *rep)
{
    memset(rep, 0, sizeof *rep);
    snprintf(rep->label, sizeof rep->label, "%s", o->label);
    rep->rate = rate;
    rep->context_cap = o->workload.context_cap;
    if (br_stopping()) {
        rep->interrupted = 1;
        return PV_OK;
    }
    wl_workload w = {0};
    pv_status s = load_workload(o, rate, o->workload.context_cap, NULL, &w, rep);
    char prefix[48], label[96];
    snprintf(prefix, sizeof prefix, "bench-%ld-%d-", (long)getpid(), run_index);
    snprintf(label, sizeof label, "%s at %.3g/s", o->label, rate);
    const bh_options ho = {.url = o->http,
                           .model = o->server_model,
                           .sessions = !o->no_sessions,
                           .session_prefix = prefix,
                           .ignore_eos = 1,
                           .ban_tokens = o->ban_tokens,
                           .n_ban_tokens = o->n_ban_tokens,
                           .request_timeout_s = 0,
                           .seed = o->workload.seed,
                           .label = label};
    br_run run = {0};
    if (s == PV_OK)
        s = bh_run(&ho, &w, &run);
    if (s == PV_OK)
        s = summarise(&run, o->target, rep);
    br_run_free(&run);
    wl_free(&w);
    return s;
}

/* ---- the sweep --------------------------------------------------------------------- */

typedef struct bench_results {
    run_report *runs; /* the sweep's (or the single rate's) runs, mode by mode, rates rising */
    int n_runs;
    run_report *policy_runs; /* pensieve mode at the operating rate, one per policy */
    int n_policy_runs;
    double policy_rate;
    const run_report *interrupted; /* the run cut short, counted in neither list; NULL: none */
} bench_results;

/* A mode's throughput at the target (bench-sweep.h) and its runs there. */
typedef struct at_target {
    const run_report *best, *miss; /* NULL: none */
    double requests_per_s;
    int lower_bound;
} at_target;

static at_target throughput_at_target(const bench_results *res, const char *label, double target)
{
    bs_point points[MAX_RATES];
    const run_report *runs[MAX_RATES];
    int n = 0;
    for (int i = 0; i < res->n_runs && n < MAX_RATES; i++) {
        const run_report *r = &res->runs[i];
        if (strcmp(r->label, label) != 0)
            continue;
        runs[n] = r;
        points[n++] = (bs_point){r->rate, r->offered_requests_per_s, r->norm_latency_mean, r->meets_target,
                                 r->failed > 0 || r->requests < r->workload.requests};
    }
    const bs_at_target t = bs_throughput_at_target(points, n, target);
    return (at_target){t.best >= 0 ? runs[t.best] : NULL, t.miss >= 0 ? runs[t.miss] : NULL, t.requests_per_s,
                       t.lower_bound};
}

/* pensieve mode's throughput at the target over another mode's; NaN when
 * either met it at no rate tried. */
static double throughput_ratio(const bench_results *res, const char *other, double target)
{
    const at_target p = throughput_at_target(res, "pensieve", target), q = throughput_at_target(res, other, target);
    return p.requests_per_s / q.requests_per_s;
}

static pv_status run_all(const bench_options *o, bench_results *res)
{
    const int n_series = o->http ? 1 : o->n_modes;
    res->runs = calloc((size_t)(n_series * o->n_rates), sizeof *res->runs);
    res->policy_runs = calloc(MAX_POLICIES, sizeof *res->policy_runs);
    if (!res->runs || !res->policy_runs)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %d runs", prog, n_series * o->n_rates);
    for (int m = 0; m < n_series; m++) {
        for (int k = 0; k < o->n_rates; k++) {
            run_report *rep = &res->runs[res->n_runs];
            pv_status s = o->http ? run_http(o, o->rates[k], res->n_runs, rep)
                                  : run_engine(o, o->modes[m], -1, o->rates[k], rep);
            if (s != PV_OK)
                return pv_error(s, "%s at %g/s: %s", o->http ? o->label : pv_engine_mode_name(o->modes[m]),
                                o->rates[k], pv_last_error());
            if (rep->interrupted) {
                res->interrupted = rep;
                return PV_OK;
            }
            res->n_runs++;
            /* a mode past the target at one rate is past it at higher ones */
            if (o->sweep && !rep->meets_target)
                break;
        }
    }
    if (o->http || o->n_policies == 0)
        return PV_OK;
    /* Policies differ only in what they drop: compare them at the lowest
     * rate where pensieve mode recomputed dropped history, else at its
     * highest rate that met the target. */
    const at_target op = throughput_at_target(res, "pensieve", o->target);
    res->policy_rate = op.best ? op.best->rate : o->rates[0];
    for (int i = res->n_runs - 1; i >= 0; i--)
        if (strcmp(res->runs[i].label, "pensieve") == 0 && res->runs[i].recomputed > 0)
            res->policy_rate = res->runs[i].rate;
    for (int p = 0; p < o->n_policies; p++) {
        run_report *rep = &res->policy_runs[res->n_policy_runs];
        const run_report *done = NULL;
        for (int i = 0; i < res->n_runs; i++)
            if (strcmp(res->runs[i].label, "pensieve") == 0 && res->runs[i].rate == res->policy_rate &&
                strcmp(res->runs[i].policy, pv_policy_name(o->policies[p])) == 0)
                done = &res->runs[i];
        if (done) {
            *rep = *done;
        } else {
            pv_status s = run_engine(o, PV_MODE_PENSIEVE, (int)o->policies[p], res->policy_rate, rep);
            if (s != PV_OK)
                return pv_error(s, "policy %s at %g/s: %s", pv_policy_name(o->policies[p]),
                                res->policy_rate, pv_last_error());
            if (rep->interrupted) {
                res->interrupted = rep;
                return PV_OK;
            }
        }
        res->n_policy_runs++;
    }
    return PV_OK;
}

/* ---- printing ------------------------------------------------------------------------ */

static double share(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0;
}

static void print_rows(const run_report *reps, int n)
{
    printf("%-10s %-9s %6s %7s %6s %6s %8s %8s %9s %9s %8s %8s %6s %6s %6s %6s %9s %9s %8s\n", "mode", "policy",
           "rate", "offered", "reqs", "failed", "req/s", "tok/s", "norm mean", "norm p90", "ttft p50", "ttft p90", "cached", "device",
           "host", "recomp", "swap-out", "swap-in", "dropped");
    for (int i = 0; i < n; i++) {
        const run_report *r = &reps[i];
        printf("%-10s %-9s %6.3g %7.3f %6lld %6lld %8.3f %8.1f %9.4f %9.4f %8.3f %8.3f %5.1f%%", r->label,
               r->policy ? r->policy : "-", r->rate, r->offered_requests_per_s, (long long)r->requests, (long long)r->failed, r->requests_per_s,
               r->tokens_per_s, r->norm_latency_mean, r->norm_latency_p90, r->ttft_p50, r->ttft_p90,
               share(r->cached_tokens, r->prompt_tokens));
        if (r->policy) /* in process: where the history came from */
            printf(" %5.1f%% %5.1f%% %5.1f%%", share(r->reused_device, r->history_tokens),
                   share(r->reused_host, r->history_tokens), share(r->recomputed, r->history_tokens));
        else
            printf(" %6s %6s %6s", "-", "-", "-");
        if (r->counters.known)
            printf(" %9llu %9llu %8llu\n", (unsigned long long)r->counters.swap_out_chunks,
                   (unsigned long long)r->counters.swap_in_chunks, (unsigned long long)r->counters.dropped_chunks);
        else
            printf(" %9s %9s %8s\n", "-", "-", "-");
    }
}

static void print_table(const bench_options *o, const bench_results *res)
{
    const wl_options *w = &o->workload;
    char count[64];
    if (o->duration_s > 0)
        snprintf(count, sizeof count, "arriving over %g s", o->duration_s);
    else
        snprintf(count, sizeof count, "(%d)", w->n_conversations);
    printf("pensieve-bench: %s, %s conversations %s, think %.3g s, time scale %.3g, length scale %.3g, seed %llu\n",
           o->replay ? o->replay : wl_dataset_stats_of(w->dataset)->name, o->replay ? "replayed" : "generated", count,
           w->think_mean_s, w->time_scale, w->length_scale, (unsigned long long)w->seed);
    char preamble[96] = "no system prompt";
    if (w->system_prompt_tokens > 0)
        snprintf(preamble, sizeof preamble, "system prompt %d tokens, one of %d", (int)w->system_prompt_tokens,
                 (int)w->system_prompts);
    printf("%s; prefix sharing %s\n", preamble,
           o->http ? "as the server has it" : o->stack.no_prefix_sharing ? "off" : "on");
    if (o->virtual_step_s > 0)
        printf("in virtual time: an engine iteration takes %.3g ms + %.3g ms a token it forwards\n",
               o->virtual_step_s * 1e3, o->virtual_token_s * 1e3);
    print_rows(res->runs, res->n_runs);
    printf("rate: --rate, conversations/s before --time-scale; offered: requests/s the workload sends; norm: end-to-end latency / output tokens (s); ttft in s at the client;\n"
           "cached: prompt tokens not prefilled again; device, host, recomp: shares of the history the turns found,\n"
           "by where they came from; swaps in (chunk, layer) records\n");
    for (int i = 0; i < res->n_runs; i++) {
        if (res->runs[i].first_error[0])
            printf("%s at %g/s: first failure: %s\n", res->runs[i].label, res->runs[i].rate,
                   res->runs[i].first_error);
    }
    if (res->interrupted) {
        char why[48];
        if (br_stop_signal())
            snprintf(why, sizeof why, "signal %d", br_stop_signal());
        else
            snprintf(why, sizeof why, "--time-limit %g s", o->time_limit_s);
        printf("%s: %s at %g/s was cut short and is not reported; the runs above ended before it\n", why,
               res->interrupted->label, res->interrupted->rate);
    }
    if (o->sweep) {
        printf("\nnormalized latency target %.4g s/token: highest rate meeting it, and the requests/s offered\n"
               "where the latency crosses the target (interpolated to the next rate; >=: no rate missed it)\n",
               o->target);
        for (int m = 0; m < (o->http ? 1 : o->n_modes); m++) {
            const char *label = o->http ? o->label : pv_engine_mode_name(o->modes[m]);
            const at_target t = throughput_at_target(res, label, o->target);
            if (t.best)
                printf("  %-10s rate %-6.3g norm mean %.4f  at the target %s%.3f requests/s\n", label, t.best->rate,
                       t.best->norm_latency_mean, t.lower_bound ? ">=" : "", t.requests_per_s);
            else
                printf("  %-10s none of the rates tried\n", label);
        }
        if (!o->http)
            printf("  pensieve / stateless throughput %.2fx, pensieve / gpu-only %.2fx (nan: a mode met the target at "
                   "no rate)\n",
                   throughput_ratio(res, "stateless", o->target), throughput_ratio(res, "gpu-only", o->target));
    }
    if (res->n_policy_runs) {
        printf("\npolicies, pensieve mode at %g conversations/s:\n", res->policy_rate);
        printf("  %-9s %12s %12s %8s %10s\n", "policy", "recomputed", "of history", "dropped", "norm mean");
        for (int i = 0; i < res->n_policy_runs; i++) {
            const run_report *r = &res->policy_runs[i];
            printf("  %-9s %12llu %11.2f%% %8llu %10.4f\n", r->policy, (unsigned long long)r->recomputed,
                   share(r->recomputed, r->history_tokens), (unsigned long long)r->counters.dropped_chunks,
                   r->norm_latency_mean);
        }
    }
}

static json_t *number_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *report_json(const run_report *r)
{
    json_t *j = json_object();
    json_object_set_new(j, "mode", json_string(r->policy ? r->label : "http"));
    json_object_set_new(j, "label", json_string(r->label));
    json_object_set_new(j, "policy", r->policy ? json_string(r->policy) : json_null());
    json_object_set_new(j, "rate", json_real(r->rate));
    json_object_set_new(j, "context_cap", json_integer(r->context_cap));
    json_object_set_new(j, "first_error", json_string(r->first_error));
    const struct { const char *name; int64_t v; } ints[] = {
        {"workload_conversations", r->workload.conversations}, {"workload_requests", r->workload.requests},
        {"requests", r->requests}, {"failed", r->failed}, {"input_tokens", r->input_tokens},
        {"generated_tokens", r->generated_tokens}, {"target_tokens", r->target_tokens},
        {"prompt_tokens", (int64_t)r->prompt_tokens}, {"cached_tokens", (int64_t)r->cached_tokens},
        {"history_tokens", (int64_t)r->history_tokens}, {"reused_device", (int64_t)r->reused_device},
        {"reused_host", (int64_t)r->reused_host}, {"recomputed", (int64_t)r->recomputed},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        json_object_set_new(j, ints[i].name, json_integer(ints[i].v));
    const struct { const char *name; double v; } reals[] = {
        {"duration_s", r->duration_s}, {"requests_per_s", r->requests_per_s}, {"tokens_per_s", r->tokens_per_s},
        {"offered_requests_per_s", r->offered_requests_per_s},
        {"norm_latency_mean", r->norm_latency_mean}, {"norm_latency_p90", r->norm_latency_p90},
        {"ttft_p50", r->ttft_p50}, {"ttft_p90", r->ttft_p90},
    };
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++)
        json_object_set_new(j, reals[i].name, json_real(reals[i].v));
    json_object_set_new(j, "meets_target", json_boolean(r->meets_target));
    const br_counters *c = &r->counters;
    json_object_set_new(
        j, "engine",
        c->known ? json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "turns_done", (json_int_t)c->turns_done,
                             "turns_failed", (json_int_t)c->turns_failed, "prefill_tokens",
                             (json_int_t)c->prefill_tokens, "recomputed_tokens", (json_int_t)c->recomputed_tokens,
                             "decode_tokens", (json_int_t)c->decode_tokens, "swap_in_chunks",
                             (json_int_t)c->swap_in_chunks, "swap_out_chunks", (json_int_t)c->swap_out_chunks,
                             "dropped_chunks", (json_int_t)c->dropped_chunks, "suspensions",
                             (json_int_t)c->suspensions)
                 : json_null());
    return j;
}

static void print_json(const bench_options *o, const bench_results *res)
{
    const wl_options *w = &o->workload;
    json_t *root = json_object(), *runs = json_array();
    json_object_set_new(root, "workload",
                        json_pack("{s:s,s:i,s:f,s:f,s:f,s:f,s:I,s:i,s:i,s:i}", "source",
                                  o->replay ? "replay" : wl_dataset_stats_of(w->dataset)->name, "conversations",
                                  w->n_conversations, "duration_s", o->duration_s, "think_mean_s", w->think_mean_s, "time_scale", w->time_scale,
                                  "length_scale", w->length_scale, "seed", (json_int_t)w->seed, "context_cap",
                                  w->context_cap, "system_prompt_tokens", w->system_prompt_tokens, "system_prompts",
                                  w->system_prompts));
    /* null over HTTP: the server's own switch */
    json_object_set_new(root, "prefix_sharing", o->http ? json_null() : json_boolean(!o->stack.no_prefix_sharing));
    json_object_set_new(root, "decode_steps", o->http ? json_null() : json_integer(o->stack.decode_steps));
    for (int i = 0; i < res->n_runs; i++)
        json_array_append_new(runs, report_json(&res->runs[i]));
    json_object_set_new(root, "virtual_time", o->virtual_step_s > 0 ? json_pack("{s:f,s:f}", "step_s",
                                                                                  o->virtual_step_s, "token_s",
                                                                                  o->virtual_token_s)
                                                                    : json_null());
    json_object_set_new(root, "runs", runs);
    if (o->sweep) {
        json_t *sweep = json_object(), *best = json_object();
        json_object_set_new(sweep, "target_norm_latency", json_real(o->target));
        for (int m = 0; m < (o->http ? 1 : o->n_modes); m++) {
            const char *label = o->http ? o->label : pv_engine_mode_name(o->modes[m]);
            const at_target t = throughput_at_target(res, label, o->target);
            json_object_set_new(best, label,
                                t.best ? json_pack("{s:f,s:f,s:f,s:f,s:o,s:b}", "rate", t.best->rate,
                                                   "norm_latency_mean", t.best->norm_latency_mean, "requests_per_s",
                                                   t.best->requests_per_s, "requests_per_s_at_target",
                                                   t.requests_per_s, "next_rate",
                                                   t.miss ? json_real(t.miss->rate) : json_null(), "lower_bound",
                                                   t.lower_bound)
                                       : json_null());
        }
        json_object_set_new(sweep, "best", best);
        json_object_set_new(root, "sweep", sweep);
        if (!o->http) {
            json_object_set_new(root, "throughput_ratio_vs_stateless",
                                number_or_null(throughput_ratio(res, "stateless", o->target)));
            json_object_set_new(root, "throughput_ratio_vs_gpu_only",
                                number_or_null(throughput_ratio(res, "gpu-only", o->target)));
        }
    }
    if (res->n_policy_runs) {
        json_t *pol = json_array();
        for (int i = 0; i < res->n_policy_runs; i++)
            json_array_append_new(pol, report_json(&res->policy_runs[i]));
        json_object_set_new(root, "policy_rate", json_real(res->policy_rate));
        json_object_set_new(root, "policies", pol);
    }
    const run_report *cut = res->interrupted;
    json_object_set_new(root, "interrupted",
                        cut ? json_pack("{s:s,s:s?,s:f,s:i}", "label", cut->label, "policy", cut->policy, "rate",
                                        cut->rate, "signal", br_stop_signal())
                            : json_null());
    json_object_set_new(root, "time_limit_s", o->time_limit_s > 0 ? json_real(o->time_limit_s) : json_null());
    json_dumpf(root, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(6));
    putchar('\n');
    json_decref(root);
}

/* Throughput against normalized latency, a line per mode (the paper's Fig. 10). */
static pv_status plot(const bench_options *o, const bench_results *res)
{
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g)
        return pv_error(PV_ERR_IO, "--plot %s: cannot run gnuplot", o->plot);
    const int n_series = o->http ? 1 : o->n_modes;
    fprintf(g,
            "set terminal pngcairo size 900,600\nset output '%s'\n"
            "set title 'pensieve-bench: %s, think %.3g s x %.3g, lengths x %.3g'\n"
            "set xlabel 'throughput (requests/s)'\nset ylabel 'normalized latency (s/token)'\nset key left top\n"
            "set logscale y\nplot ",
            o->plot, o->replay ? "replay" : wl_dataset_stats_of(o->workload.dataset)->name, o->workload.think_mean_s, o->workload.time_scale, o->workload.length_scale);
    for (int m = 0; m < n_series; m++)
        fprintf(g, "'-' with linespoints pt 7 title '%s', ", o->http ? o->label : pv_engine_mode_name(o->modes[m]));
    fprintf(g, "%g with lines dt 2 title 'target'\n", o->target);
    for (int m = 0; m < n_series; m++) {
        const char *label = o->http ? o->label : pv_engine_mode_name(o->modes[m]);
        for (int i = 0; i < res->n_runs; i++)
            if (strcmp(res->runs[i].label, label) == 0)
                fprintf(g, "%g %g\n", res->runs[i].requests_per_s, res->runs[i].norm_latency_mean);
        fputs("e\n", g);
    }
    const int rc = pclose(g);
    if (rc != 0)
        return pv_error(PV_ERR_IO, "--plot %s: gnuplot failed (exit status %d; is gnuplot installed?)", o->plot, rc);
    return PV_OK;
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
            "  --duration S         instead: as many as arrive in S seconds at each rate (rate / time scale * S)\n"
            "  --rate R             conversations per second, Poisson arrivals (default 1)\n"
            "  --think S            mean think time between turns, exponential (default 60)\n"
            "  --time-scale X       multiplies arrival gaps and think times (default 1)\n"
            "  --length-scale X     multiplies the mean input and output lengths (default 1)\n"
            "  --context-cap N      a conversation ends before passing N tokens (default 16384)\n"
            "  --seed N             the workload's draws (default 1)\n"
            "  --system-prompt-tokens N   every conversation starts with a shared preamble of N tokens, one of\n"
            "                       --system-prompts drawn per conversation, kept in its history and counted\n"
            "                       in the context cap (default 0: none); in process N token ids in front of\n"
            "                       the first turn, over HTTP a system message of N words (about N tokens);\n"
            "                       refused with --replay, whose conversations are sent as recorded\n"
            "  --system-prompts K   distinct preambles to draw from (default 4)\n"
            "sweep:\n"
            "  --rates LIST         a sweep over these rates (comma list, rising)\n"
            "  --sweep              a sweep sized for SmolLM2 on a small CPU, in under 15 minutes: rates\n"
            "                       0.02,0.04,0.08,0.16, --duration 20, time scale 0.05,\n"
            "                       length scale 0.25, --device-mem 24M, --host-mem 256M, unless given\n"
            "  --target S           normalized latency target, s/token (default 0.1: as fast as people read)\n"
            "  --policies LIST      compare these policies in pensieve mode at its lowest rate that dropped\n"
            "                       history, else its highest meeting the target (default in a sweep:\n"
            "                       pensieve,weighted,lru; none: no comparison)\n"
            "  --plot FILE.png      throughput against normalized latency, a line per mode (gnuplot)\n"
            "  --time-limit S       stop after S seconds: the run under way is cut short and named, the\n"
            "                       runs done before it reported (SIGTERM and SIGINT do the same)\n"
            "in process:\n"
            "  --modes LIST         comma list of pensieve, gpu-only, stateless (default all three)\n"
            "  --policy NAME        pensieve, weighted or lru\n"
            "  --model PATH | --synthetic   the GGUF file (default: scripts/get-model's) or the test model\n"
            "  --backend NAME       cpu, opencl or cuda (default cpu)\n"
            "  --device-mem SIZE    device tier budget, e.g. 64M\n"
            "  --host-mem SIZE      host tier budget\n"
            "  --config FILE        cache settings (INI)\n"
            "  --profile FILE       device profile from pensieve-tune\n"
            "  --no-prefix-sharing  each session keeps its own copy of a common prefix (the engine's\n"
            "                       prefix_sharing off), for comparison; refused with --http (the server's own)\n"
            "  --decode-steps N     decode steps chained on the device per engine step (default 0: the\n"
            "                       engine's choice, 1 on the CPU backend, 4 elsewhere)\n"
            "  --virtual-time STEP_MS,TOKEN_MS   no sleeping, no wall clock: an engine iteration takes\n"
            "                       STEP_MS + TOKEN_MS per token it forwards; a run depends on the workload\n"
            "                       and the engine's decisions only (repeatable, e.g. to compare policies)\n"
            "over HTTP:\n"
            "  --http URL           an OpenAI-compatible server (e.g. http://127.0.0.1:8080), streaming\n"
            "  --server-model NAME  the requests' model field (default pensieve)\n"
            "  --label NAME         the server's name in reports (default http)\n"
            "  --no-sessions        send no X-Session-Id (a server that keeps state per session)\n"
            "  --ban-tokens LIST    token ids sent as logit_bias -100 (comma list): given a server's end\n"
            "                       tokens, one without ignore_eos answers at the drawn lengths too\n"
            "  --json               print JSON instead of the table\n");
}

/* Splits a comma list into at most max names, each given to parse. */
static int parse_list(const char *text, int max, int (*parse)(const char *, void *, int),
                      void *out, int *n)
{
    char buf[256];
    *n = 0;
    if (strlen(text) >= sizeof buf)
        return -1;
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (*n == max || parse(item, out, *n) != 0)
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_mode_item(const char *s, void *out, int i)
{
    return pv_engine_mode_parse(s, &((pv_engine_mode *)out)[i]) == PV_OK ? 0 : -1;
}

static int parse_policy_item(const char *s, void *out, int i)
{
    return pv_policy_parse(s, &((pv_policy *)out)[i]) == PV_OK ? 0 : -1;
}

static int parse_rate_item(const char *s, void *out, int i)
{
    double *rates = out;
    char *end;
    const double v = strtod(s, &end);
    if (end == s || *end || !(v >= 1e-6 && v <= 1e6) || (i > 0 && !(v > rates[i - 1])))
        return -1;
    rates[i] = v;
    return 0;
}

static int parse_token_item(const char *s, void *out, int i)
{
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > INT32_MAX)
        return -1;
    ((int32_t *)out)[i] = (int32_t)v;
    return 0;
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
    OPT_SEED, OPT_MODES, OPT_JSON, OPT_RATES, OPT_SWEEP, OPT_TARGET, OPT_POLICIES, OPT_PLOT, OPT_HTTP,
    OPT_SERVER_MODEL, OPT_LABEL, OPT_NO_SESSIONS, OPT_DURATION, OPT_BAN_TOKENS, OPT_VIRTUAL_TIME,
    OPT_SYSTEM_PROMPT_TOKENS, OPT_SYSTEM_PROMPTS, OPT_NO_PREFIX_SHARING, OPT_TIME_LIMIT,
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
        {"rates", required_argument, 0, OPT_RATES},       {"sweep", no_argument, 0, OPT_SWEEP},
        {"target", required_argument, 0, OPT_TARGET},     {"policies", required_argument, 0, OPT_POLICIES},
        {"plot", required_argument, 0, OPT_PLOT},         {"http", required_argument, 0, OPT_HTTP},
        {"server-model", required_argument, 0, OPT_SERVER_MODEL}, {"label", required_argument, 0, OPT_LABEL},
        {"no-sessions", no_argument, 0, OPT_NO_SESSIONS}, {"duration", required_argument, 0, OPT_DURATION},
        {"ban-tokens", required_argument, 0, OPT_BAN_TOKENS},
        {"virtual-time", required_argument, 0, OPT_VIRTUAL_TIME},
        {"system-prompt-tokens", required_argument, 0, OPT_SYSTEM_PROMPT_TOKENS},
        {"system-prompts", required_argument, 0, OPT_SYSTEM_PROMPTS},
        {"no-prefix-sharing", no_argument, 0, OPT_NO_PREFIX_SHARING},
        {"time-limit", required_argument, 0, OPT_TIME_LIMIT},
        {"policy", required_argument, 0, OPT_STACK},      {"model", required_argument, 0, OPT_STACK},
        {"synthetic", no_argument, 0, OPT_STACK},         {"backend", required_argument, 0, OPT_STACK},
        {"device-mem", required_argument, 0, OPT_STACK},  {"host-mem", required_argument, 0, OPT_STACK},
        {"config", required_argument, 0, OPT_STACK},      {"profile", required_argument, 0, OPT_STACK},
        {"decode-steps", required_argument, 0, OPT_STACK},
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
    o->target = 0.1;
    o->server_model = "pensieve";
    o->label = "http";
    int c, index = 0, have_stack = 0;
    long v;
    int given[OPT_STACK - OPT_DATASET] = {0};
    while ((c = getopt_long(argc, argv, "h", longopts, &index)) != -1) {
        if (c >= OPT_DATASET && c < OPT_STACK)
            given[c - OPT_DATASET] = 1;
        switch (c) {
        case OPT_STACK:
            if (app_stack_option(prog, longopts[index].name, optarg, &o->stack) < 0) return -1;
            have_stack = 1;
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
        case OPT_SYSTEM_PROMPT_TOKENS:
            if (app_opt_long(prog, "--system-prompt-tokens", optarg, 0, 1 << 24, &v)) return -1;
            o->workload.system_prompt_tokens = (int32_t)v;
            break;
        case OPT_SYSTEM_PROMPTS:
            if (app_opt_long(prog, "--system-prompts", optarg, 1, 1000000, &v)) return -1;
            o->workload.system_prompts = (int32_t)v;
            break;
        case OPT_NO_PREFIX_SHARING: o->stack.no_prefix_sharing = 1; break;
        case OPT_MODES:
            if (parse_list(optarg, MAX_MODES, parse_mode_item, o->modes, &o->n_modes)) {
                fprintf(stderr, "%s: --modes '%s': want a comma list of pensieve, gpu-only, stateless\n", prog,
                        optarg);
                return -1;
            }
            break;
        case OPT_POLICIES:
            if (strcmp(optarg, "none") == 0) {
                o->n_policies = 0;
                break;
            }
            if (parse_list(optarg, MAX_POLICIES, parse_policy_item, o->policies, &o->n_policies)) {
                fprintf(stderr, "%s: --policies '%s': want none or a comma list of pensieve, weighted, lru\n", prog,
                        optarg);
                return -1;
            }
            break;
        case OPT_RATES:
            if (parse_list(optarg, MAX_RATES, parse_rate_item, o->rates, &o->n_rates)) {
                fprintf(stderr, "%s: --rates '%s': want at most %d rising rates in [1e-06, 1e+06]\n", prog, optarg,
                        MAX_RATES);
                return -1;
            }
            o->sweep = 1;
            break;
        case OPT_SWEEP: o->sweep = 1; break;
        case OPT_DURATION:
            if (parse_double("--duration", optarg, 1e-3, 1e6, &o->duration_s)) return -1;
            break;
        case OPT_TIME_LIMIT:
            if (parse_double("--time-limit", optarg, 1e-3, 1e7, &o->time_limit_s)) return -1;
            break;
        case OPT_TARGET:
            if (parse_double("--target", optarg, 1e-6, 1e6, &o->target)) return -1;
            break;
        case OPT_PLOT: o->plot = optarg; break;
        case OPT_HTTP: o->http = optarg; break;
        case OPT_SERVER_MODEL: o->server_model = optarg; break;
        case OPT_LABEL: o->label = optarg; break;
        case OPT_NO_SESSIONS: o->no_sessions = 1; break;
        case OPT_VIRTUAL_TIME: {
            char *end;
            o->virtual_step_s = strtod(optarg, &end) / 1e3;
            const int step_ok = end != optarg && *end == ',' && o->virtual_step_s > 0 && o->virtual_step_s <= 60;
            const char *token = step_ok ? end + 1 : optarg;
            o->virtual_token_s = strtod(token, &end) / 1e3;
            if (!step_ok || end == token || *end || !(o->virtual_token_s >= 0 && o->virtual_token_s <= 60)) {
                fprintf(stderr, "%s: --virtual-time '%s': want STEP_MS,TOKEN_MS (step in (0, 60000], token in "
                        "[0, 60000])\n", prog, optarg);
                return -1;
            }
            break;
        }
        case OPT_BAN_TOKENS:
            if (parse_list(optarg, MAX_BAN_TOKENS, parse_token_item, o->ban_tokens, &o->n_ban_tokens)) {
                fprintf(stderr, "%s: --ban-tokens '%s': want at most %d token ids (comma list)\n", prog, optarg,
                        MAX_BAN_TOKENS);
                return -1;
            }
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
    if (o->http && (given[OPT_MODES - OPT_DATASET] || given[OPT_POLICIES - OPT_DATASET] || have_stack)) {
        fprintf(stderr, "%s: --http runs against a server: --modes, --policies and the stack's options are the "
                "server's own\n", prog);
        return -1;
    }
    if (o->http && o->stack.no_prefix_sharing) {
        fprintf(stderr, "%s: --no-prefix-sharing is in process only: over --http, sharing is the server's own "
                "setting\n", prog);
        return -1;
    }
    if (o->http && o->virtual_step_s > 0) {
        fprintf(stderr, "%s: --virtual-time is in process only (a server keeps its own time)\n", prog);
        return -1;
    }
    if (!o->http && o->n_ban_tokens) {
        fprintf(stderr, "%s: --ban-tokens is for --http (in process every answer has its drawn length)\n", prog);
        return -1;
    }
    if (given[OPT_SWEEP - OPT_DATASET]) { /* --sweep: the preset, where not given (--rates alone: none) */
        if (o->n_rates == 0) {
            o->n_rates = (int)(sizeof sweep_rates / sizeof *sweep_rates);
            memcpy(o->rates, sweep_rates, sizeof sweep_rates);
        }
        if (!given[OPT_CONVS - OPT_DATASET] && !given[OPT_DURATION - OPT_DATASET])
            o->duration_s = SWEEP_DURATION_S;
        if (!given[OPT_TIME_SCALE - OPT_DATASET])
            o->workload.time_scale = SWEEP_TIME_SCALE;
        if (!given[OPT_LENGTH_SCALE - OPT_DATASET])
            o->workload.length_scale = SWEEP_LENGTH_SCALE;
        if (!o->http && !o->stack.config && !o->stack.device_bytes)
            o->stack.device_bytes = SWEEP_DEVICE_BYTES;
        if (!o->http && !o->stack.config && !o->stack.host_bytes)
            o->stack.host_bytes = SWEEP_HOST_BYTES;
    }
    if (!o->sweep) {
        o->rates[0] = o->workload.rate;
        o->n_rates = 1;
    }
    if (o->sweep && !given[OPT_POLICIES - OPT_DATASET] && !o->http) {
        o->n_policies = MAX_POLICIES;
        o->policies[0] = PV_POLICY_PENSIEVE;
        o->policies[1] = PV_POLICY_WEIGHTED;
        o->policies[2] = PV_POLICY_LRU;
    }
    if (wl_options_check(&o->workload, o->replay != NULL) != PV_OK) {
        fprintf(stderr, "%s: %s\n", prog, pv_last_error());
        return -1;
    }
    return app_stack_options_check(prog, &o->stack);
}

int main(int argc, char **argv)
{
    bench_options o;
    if (parse_options(argc, argv, &o) != 0)
        return 2;
    app_catch_stop_signals(br_on_stop_signal);
    if (o.time_limit_s > 0)
        br_stop_at(bench_now_s() + o.time_limit_s);
    bench_results res = {0};
    pv_status st = run_all(&o, &res);
    if (st == PV_OK) {
        if (o.json)
            print_json(&o, &res);
        else
            print_table(&o, &res);
        if (o.plot)
            st = plot(&o, &res);
    }
    if (st != PV_OK)
        fprintf(stderr, "%s: %s (%s)\n", prog, pv_last_error(), pv_status_str(st));
    const int interrupted = res.interrupted != NULL;
    free(res.runs);
    free(res.policy_runs);
    if (st == PV_OK && interrupted && br_stop_signal()) /* as a shell reports a command a signal ended */
        return 128 + br_stop_signal();
    return st == PV_OK ? 0 : 1;
}
