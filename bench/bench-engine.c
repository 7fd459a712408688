/* bench-engine: what the engine buys, on one model and backend, in one run.
 *   1. A multi-turn conversation (--turns turns of --new-tokens new tokens,
 *      --gen generated each): time to first token per turn in pensieve mode
 *      (history kept) and stateless mode (history prefilled every turn),
 *      the two conversations interleaved turn by turn.
 *   2. Engine overhead per decode iteration: time outside the forward pass
 *      and sampling (scheduling, cache bookkeeping, swap planning) over the
 *      iteration's time, one session decoding.
 *   3. Batched decode: tokens/s of --batch sessions decoding together
 *      against one session alone (medians of 3 runs of each, alternating).
 * Prints a table, or JSON with --json. */
#include "bench/bench-load.h"
#include "bench/bench-util.h"

#include <pensieve/engine.h>

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
    const char *model, *backend;
    int turns, new_tokens, gen, batch, json, decode_steps;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'}, {"backend", required_argument, 0, 'b'},
        {"turns", required_argument, 0, 't'}, {"new-tokens", required_argument, 0, 'n'},
        {"gen", required_argument, 0, 'g'},   {"batch", required_argument, 0, 'B'},
        {"json", no_argument, 0, 'j'},        {"help", no_argument, 0, 'h'},
        {"decode-steps", required_argument, 0, 'D'},
        {0, 0, 0, 0},
    };
    *o = (opts){.backend = "cpu", .turns = 10, .new_tokens = 100, .gen = 32, .batch = 16};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'b': o->backend = optarg; break;
        case 't': if (bench_parse_int("bench-engine", optarg, "--turns", 1, 100, &o->turns)) return -1; break;
        case 'n': if (bench_parse_int("bench-engine", optarg, "--new-tokens", 1, 400, &o->new_tokens)) return -1; break;
        case 'g': if (bench_parse_int("bench-engine", optarg, "--gen", 2, 1000, &o->gen)) return -1; break;
        case 'B': if (bench_parse_int("bench-engine", optarg, "--batch", 1, 64, &o->batch)) return -1; break;
        case 'D':
            if (bench_parse_int("bench-engine", optarg, "--decode-steps", 0, PV_ENGINE_MAX_DECODE_STEPS, &o->decode_steps))
                return -1;
            break;
        case 'j': o->json = 1; break;
        case 'h':
            printf("usage: bench-engine [--model PATH] [--backend NAME] [--turns N] [--new-tokens N]\n"
                   "                    [--gen N] [--batch N] [--decode-steps N] [--json]\n"
                   "  --decode-steps N  chained decode steps per engine step (pv_engine_config.decode_steps;\n"
                   "                    0, the default: the engine's choice for the backend)\n");
            exit(0);
        default: return -1;
        }
    }
    return optind == argc ? 0 : -1;
}

static int fail(const char *what, pv_status st)
{
    fprintf(stderr, "bench-engine: %s: %s: %s\n", what, pv_status_str(st), pv_last_error());
    return 1;
}

/* Ordinary English, tokenized once: each turn's new tokens are a slice. */
static const char corpus[] =
    "The history of the lighthouse begins with fires lit on hilltops to guide ships home. "
    "Later, towers of stone carried lamps of oil, and lenses of polished glass threw their "
    "light many miles out to sea. Keepers lived beside them, trimming wicks through long "
    "nights and logging every passing vessel. In the twentieth century electricity replaced "
    "the flame, and automation replaced the keepers, yet the towers still stand along rocky "
    "coasts, white and red against the sky. Sailors today rely on satellites, but many still "
    "feel relief when a familiar beam sweeps across the water after a hard passage. ";

typedef struct turn_out {
    int done, n;
    pv_status st;
    pv_turn_result res;
} turn_out;

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    (void)text;
    (void)len;
    ((turn_out *)user)->n++;
}

static void on_done(void *user, pv_status st, const pv_turn_result *r)
{
    turn_out *t = user;
    t->done = 1;
    t->st = st;
    t->res = *r;
}

static pv_status submit(pv_engine *e, const char *id, const int32_t *toks, int n, int gen, turn_out *out)
{
    pv_turn t = {.tokens = toks, .n_tokens = (size_t)n};
    pv_sampling_defaults(&t.sampling);
    t.sampling.max_tokens = gen;
    t.sampling.ignore_eos = 1;
    pv_turn_callbacks cb = {on_token, on_done, out};
    memset(out, 0, sizeof *out);
    return pv_engine_submit(e, id, &t, &cb, NULL);
}

static pv_status make_engine(pv_engine **e, pv_backend *be, pv_llama *m, const pv_tokenizer *tok,
                             pv_engine_mode mode, int decode_steps)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 512ull << 20;
    cc.host_bytes = 1ull << 30;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.decode_steps = decode_steps;
    return pv_engine_init(e, be, m, tok, &cc, &ec);
}

/* Decode tokens/s of n sessions decoding together: steps until every
 * session has its first token, then times the rest. */
static pv_status batched_decode(pv_backend *be, pv_llama *m, const pv_tokenizer *tok, const int32_t *toks,
                                int n, int gen, int decode_steps, double *tps, double *overhead)
{
    pv_engine *e = NULL;
    pv_status st = make_engine(&e, be, m, tok, PV_MODE_PENSIEVE, decode_steps);
    if (st != PV_OK)
        return st;
    turn_out *outs = calloc((size_t)n, sizeof *outs);
    for (int i = 0; i < n && st == PV_OK; i++) {
        char id[32];
        snprintf(id, sizeof id, "b%d", i);
        st = submit(e, id, toks + i * 7, 32, gen, &outs[i]);
    }
    for (int started = 0; st == PV_OK && started < n;) {
        st = pv_engine_step(e, NULL);
        started = 0;
        for (int i = 0; i < n; i++)
            started += outs[i].n > 0;
    }
    pv_engine_stats s0, s1;
    pv_engine_stats_get(e, &s0);
    int before = 0, after = 0;
    for (int i = 0; i < n; i++)
        before += outs[i].n;
    double t0 = bench_now_s();
    while (st == PV_OK && pv_engine_pending(e) > 0)
        st = pv_engine_step(e, NULL);
    double dt = bench_now_s() - t0;
    pv_engine_stats_get(e, &s1);
    for (int i = 0; i < n; i++)
        after += outs[i].n;
    *tps = (after - before) / dt;
    double sched = s1.schedule_s - s0.schedule_s, fwd = s1.forward_s - s0.forward_s;
    *overhead = sched / (sched + fwd);
    free(outs);
    pv_engine_free(e);
    return st;
}

int main(int argc, char **argv)
{
    opts o;
    if (parse(argc, argv, &o))
        return 2;
    pv_tokenizer tok;
    pv_backend *be = NULL;
    pv_llama *m = NULL;
    const char *what;
    pv_status st = bench_load_model(o.model, o.backend, &tok, &be, &m, &what);
    if (st != PV_OK)
        return fail(what, st);

    /* Enough corpus tokens for every turn and batch prompt. */
    size_t need = (size_t)o.turns * (size_t)o.new_tokens + (size_t)o.batch * 7 + 64;
    size_t cap = need + sizeof corpus, n_text = 0;
    int32_t *toks = malloc(cap * sizeof *toks);
    while (st == PV_OK && n_text < need) {
        size_t got = 0;
        st = pv_tokenizer_encode(&tok, corpus, sizeof corpus - 1, 0, toks + n_text, cap - n_text, &got);
        n_text += got;
    }

    /* 1. multi-turn time to first token */
    pv_engine *pens = NULL, *stl = NULL;
    if (st == PV_OK && (st = make_engine(&pens, be, m, &tok, PV_MODE_PENSIEVE, o.decode_steps)) == PV_OK)
        st = make_engine(&stl, be, m, &tok, PV_MODE_STATELESS, o.decode_steps);
    double *ttft_p = calloc((size_t)o.turns, sizeof *ttft_p), *ttft_s = calloc((size_t)o.turns, sizeof *ttft_s);
    uint32_t *ctx = calloc((size_t)o.turns, sizeof *ctx);
    for (int t = 0; t < o.turns && st == PV_OK; t++) {
        turn_out a, b;
        const int32_t *slice = toks + (size_t)t * o.new_tokens;
        if ((st = submit(pens, "conv", slice, o.new_tokens, o.gen, &a)) == PV_OK &&
            (st = pv_engine_run(pens)) == PV_OK && (st = submit(stl, "conv", slice, o.new_tokens, o.gen, &b)) == PV_OK)
            st = pv_engine_run(stl);
        if (st == PV_OK && (a.st != PV_OK || b.st != PV_OK))
            st = a.st != PV_OK ? a.st : b.st;
        ttft_p[t] = a.res.ttft_ms;
        ttft_s[t] = b.res.ttft_ms;
        ctx[t] = a.res.context_tokens;
    }
    pv_engine_free(pens);
    pv_engine_free(stl);
    if (st != PV_OK)
        return fail("multi-turn conversation", st);

    /* 2 and 3. decode: one session, then a batch, alternating; medians */
    enum { REPS = 3 };
    double t1[REPS], tn[REPS], o1[REPS], on[REPS];
    for (int k = 0; k < REPS; k++)
        if ((st = batched_decode(be, m, &tok, toks, 1, o.gen * 4, o.decode_steps, &t1[k], &o1[k])) != PV_OK ||
            (st = batched_decode(be, m, &tok, toks, o.batch, o.gen * 4, o.decode_steps, &tn[k], &on[k])) != PV_OK)
            return fail("batched decode", st);
    double tps1 = bench_median(t1, REPS), tpsn = bench_median(tn, REPS);
    double ov1 = bench_median(o1, REPS), ovn = bench_median(on, REPS);

    int last = o.turns - 1;
    if (o.json) {
        printf("{\"backend\": \"%s\", \"decode_steps\": %d, \"turns\": [", o.backend, o.decode_steps);
        for (int t = 0; t < o.turns; t++)
            printf("%s{\"turn\": %d, \"context\": %u, \"ttft_pensieve_ms\": %.2f, \"ttft_stateless_ms\": %.2f}",
                   t ? ", " : "", t + 1, ctx[t], ttft_p[t], ttft_s[t]);
        printf("], \"ttft_ratio_last\": %.4f, \"decode_tps_1\": %.2f, \"decode_tps_batch\": %.2f, "
               "\"batch\": %d, \"batch_speedup\": %.3f, \"overhead_1\": %.5f, \"overhead_batch\": %.5f}\n",
               ttft_p[last] / ttft_s[last], tps1, tpsn, o.batch, tpsn / tps1, ov1, ovn);
    } else {
        printf("multi-turn conversation on %s: %d new tokens and %d generated per turn\n", o.backend,
               o.new_tokens, o.gen);
        printf("%5s %8s %16s %17s %7s\n", "turn", "context", "ttft pensieve ms", "ttft stateless ms", "ratio");
        for (int t = 0; t < o.turns; t++)
            printf("%5d %8u %16.1f %17.1f %7.3f\n", t + 1, ctx[t], ttft_p[t], ttft_s[t], ttft_p[t] / ttft_s[t]);
        printf("\ndecode (%d tokens per session; medians of %d alternating runs; decode_steps %d%s)\n", o.gen * 4,
               REPS, o.decode_steps, o.decode_steps ? "" : ": the engine's choice");
        printf("%9s %12s %10s %21s\n", "sessions", "tokens/s", "speedup", "engine overhead/iter");
        printf("%9d %12.1f %10.2f %20.2f%%\n", 1, tps1, 1.0, 100 * ov1);
        printf("%9d %12.1f %10.2f %20.2f%%\n", o.batch, tpsn, tpsn / tps1, 100 * ovn);
    }
    free(toks);
    free(ttft_p);
    free(ttft_s);
    free(ctx);
    pv_llama_free(m);
    pv_tokenizer_free(&tok);
    pv_backend_free(be);
    return 0;
}
