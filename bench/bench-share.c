/* bench-share: what shared prefixes buy (issue 28), on one model and
 * backend, in one run. --sessions conversations start with the same
 * --system-tokens system prompt and go on with --turns short turns of their
 * own (--turn-tokens new tokens, --gen generated each): the first turns one
 * session after another, then the later turns round by round; on an engine
 * with prefix sharing and on one without (the reference, same run):
 *   - time to first token of session 1 (the prompt is new) and of sessions
 *     2..N (median and worst), and their ratio to session 1's;
 *   - device + host bytes held after every turn, against the bytes of one
 *     copy of the prompt plus each session's own tokens (the ideal).
 * Prints a table, or JSON with --json. */
#include "bench/bench-load.h"
#include "bench/bench-util.h"

#include <pensieve/engine.h>

#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
    const char *model, *backend;
    int sessions, system_tokens, turns, turn_tokens, gen, json;
    uint64_t device_mib, host_mib;
} opts;

static int parse(int argc, char **argv, opts *o)
{
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},       {"backend", required_argument, 0, 'b'},
        {"sessions", required_argument, 0, 's'},    {"system-tokens", required_argument, 0, 'p'},
        {"turn-tokens", required_argument, 0, 't'}, {"gen", required_argument, 0, 'g'},
        {"turns", required_argument, 0, 'T'},
        {"device-mib", required_argument, 0, 'D'},  {"host-mib", required_argument, 0, 'H'},
        {"json", no_argument, 0, 'j'},              {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    *o = (opts){.backend = "cpu", .sessions = 32, .system_tokens = 2000, .turns = 4, .turn_tokens = 24, .gen = 8,
                .device_mib = 4096, .host_mib = 0};
    int c, v;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm': o->model = optarg; break;
        case 'b': o->backend = optarg; break;
        case 's': if (bench_parse_int("bench-share", optarg, "--sessions", 2, 1024, &o->sessions)) return -1; break;
        case 'p': if (bench_parse_int("bench-share", optarg, "--system-tokens", 1, 100000, &o->system_tokens)) return -1; break;
        case 't': if (bench_parse_int("bench-share", optarg, "--turn-tokens", 1, 4096, &o->turn_tokens)) return -1; break;
        case 'g': if (bench_parse_int("bench-share", optarg, "--gen", 1, 4096, &o->gen)) return -1; break;
        case 'T': if (bench_parse_int("bench-share", optarg, "--turns", 1, 64, &o->turns)) return -1; break;
        case 'D': if (bench_parse_int("bench-share", optarg, "--device-mib", 1, 1 << 20, &v)) return -1; o->device_mib = (uint64_t)v; break;
        case 'H': if (bench_parse_int("bench-share", optarg, "--host-mib", 0, 1 << 20, &v)) return -1; o->host_mib = (uint64_t)v; break;
        case 'j': o->json = 1; break;
        case 'h':
            printf("usage: bench-share [--model PATH] [--backend NAME] [--sessions N] [--system-tokens N]\n"
                   "                   [--turns N] [--turn-tokens N] [--gen N] [--device-mib N] [--host-mib N]\n"
                   "                   [--json]\n"
                   "defaults: 32 sessions, a 2000-token system prompt, 4 turns of 24 tokens, 8 generated,\n"
                   "4096 MiB device, no host tier (every session's KV stays: bytes compare whole copies)\n");
            exit(0);
        default: return -1;
        }
    }
    return optind == argc ? 0 : -1;
}

static int fail(const char *what, pv_status st)
{
    fprintf(stderr, "bench-share: %s: %s: %s\n", what, pv_status_str(st), pv_last_error());
    return 1;
}

/* Ordinary text, tokenized and repeated: the prompt is its first tokens,
 * each session's turn a slice further on. */
static const char corpus[] =
    "You are a careful assistant for a travel company. Answer questions about bookings, "
    "refunds, luggage, seats, meals and connections. Quote the policy section you rely on, "
    "keep answers under one hundred words, never invent flight numbers, and ask for the booking "
    "reference before discussing a reservation. Fees: a change costs forty euros, a same-day "
    "change sixty, a name correction is free within a day. Checked bags weigh at most twenty-three "
    "kilograms; sports equipment needs notice two days ahead. Refunds go to the original payment "
    "within fourteen days. Be polite, plain and exact. ";

typedef struct turn_out {
    int done;
    pv_status st;
    pv_turn_result res;
} turn_out;

static void on_done(void *user, pv_status st, const pv_turn_result *r)
{
    turn_out *t = user;
    t->done = 1;
    t->st = st;
    t->res = *r;
}

typedef struct result {
    double ttft_first_ms, ttft_rest_median_ms, ttft_rest_max_ms;
    uint64_t used_bytes, ideal_bytes, shared_chunks, shared_tokens;
} result;

static pv_status run(const opts *o, pv_backend *be, pv_llama *m, const pv_tokenizer *tok, const int32_t *toks,
                     int sharing, result *out)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = o->device_mib << 20;
    cc.host_bytes = o->host_mib << 20;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.prefix_sharing = sharing;
    pv_engine *e = NULL;
    pv_status st = pv_engine_init(&e, be, m, tok, &cc, &ec);
    if (st != PV_OK)
        return st;
    int n = o->sessions, turn = o->system_tokens + o->turn_tokens;
    int32_t *buf = malloc((size_t)turn * sizeof *buf);
    double *rest = malloc((size_t)n * sizeof *rest);
    memset(out, 0, sizeof *out);
    for (int k = 0; k < o->turns && st == PV_OK; k++)
        for (int i = 0; i < n && st == PV_OK; i++) {
            /* A session's k-th turn: its own slice of the text (the first
             * behind the prompt). */
            const int32_t *own = toks + o->system_tokens + ((size_t)k * n + i) * o->turn_tokens;
            size_t len = 0;
            if (k == 0) {
                memcpy(buf, toks, (size_t)o->system_tokens * sizeof *buf);
                len = (size_t)o->system_tokens;
            }
            memcpy(buf + len, own, (size_t)o->turn_tokens * sizeof *buf);
            len += (size_t)o->turn_tokens;
            pv_turn t = {.tokens = buf, .n_tokens = len};
            pv_sampling_defaults(&t.sampling);
            t.sampling.max_tokens = o->gen;
            t.sampling.ignore_eos = 1;
            turn_out r = {0};
            pv_turn_callbacks cb = {NULL, on_done, &r};
            char id[32];
            snprintf(id, sizeof id, "bench:s%d", i);
            if ((st = pv_engine_submit(e, id, &t, &cb, NULL)) == PV_OK && (st = pv_engine_run(e)) == PV_OK)
                st = r.st;
            if (k == 0 && i == 0)
                out->ttft_first_ms = r.res.ttft_ms;
            else if (k == 0)
                rest[i - 1] = r.res.ttft_ms;
            if (k == 0)
                out->shared_tokens += r.res.shared_tokens;
        }
    if (st == PV_OK) {
        out->ttft_rest_median_ms = bench_median(rest, n - 1);
        out->ttft_rest_max_ms = 0;
        for (int i = 0; i < n - 1; i++)
            if (rest[i] > out->ttft_rest_max_ms)
                out->ttft_rest_max_ms = rest[i];
        pv_cache_stats cs;
        pv_cache_stats_get(pv_engine_cache(e), &cs);
        out->used_bytes = cs.used_bytes[PV_TIER_DEVICE] + cs.used_bytes[PV_TIER_HOST];
        out->shared_chunks = cs.shared_chunks;
        /* One prompt, then each session's own tokens (its turn and answer,
         * the last generated token not yet run), at the KV bytes a token
         * takes. */
        uint64_t own = (uint64_t)n * ((uint64_t)o->turns * (o->turn_tokens + o->gen) - 1);
        const pv_llama_hparams *hp = pv_llama_hparams_of(m);
        uint64_t per_token = pv_llama_slot_bytes(m) * hp->n_layers / (uint64_t)pv_llama_options_of(m)->chunk_tokens;
        out->ideal_bytes = ((uint64_t)o->system_tokens + own) * per_token;
    }
    free(buf);
    free(rest);
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
    size_t need = (size_t)o.system_tokens + (size_t)o.turns * o.sessions * o.turn_tokens;
    size_t cap = need + sizeof corpus, n_text = 0;
    int32_t *toks = malloc(cap * sizeof *toks);
    while (st == PV_OK && n_text < need) {
        size_t got = 0;
        st = pv_tokenizer_encode(&tok, corpus, sizeof corpus - 1, 0, toks + n_text, cap - n_text, &got);
        n_text += got;
    }
    /* Each turn must differ from the others': number them. */
    for (int i = 0; i < o.turns * o.sessions; i++)
        toks[o.system_tokens + (size_t)i * o.turn_tokens] = 3 + i;
    result on, off;
    if (st == PV_OK && (st = run(&o, be, m, &tok, toks, 1, &on)) == PV_OK)
        st = run(&o, be, m, &tok, toks, 0, &off);
    if (st != PV_OK)
        return fail("sessions", st);
    const result *r[2] = {&on, &off};
    const char *name[2] = {"sharing", "no sharing"};
    if (o.json) {
        printf("{\"backend\": \"%s\", \"sessions\": %d, \"system_tokens\": %d, \"turns\": %d, "
               "\"turn_tokens\": %d, \"gen\": %d",
               o.backend, o.sessions, o.system_tokens, o.turns, o.turn_tokens, o.gen);
        for (int k = 0; k < 2; k++)
            printf(", \"%s\": {\"ttft_first_ms\": %.2f, \"ttft_rest_median_ms\": %.2f, \"ttft_rest_max_ms\": %.2f, "
                   "\"rest_over_first_max\": %.4f, \"used_bytes\": %" PRIu64 ", \"ideal_bytes\": %" PRIu64
                   ", \"bytes_over_ideal\": %.4f, \"shared_chunks\": %" PRIu64 ", \"shared_tokens\": %" PRIu64 "}",
                   k ? "off" : "on", r[k]->ttft_first_ms, r[k]->ttft_rest_median_ms, r[k]->ttft_rest_max_ms,
                   r[k]->ttft_rest_max_ms / r[k]->ttft_first_ms, r[k]->used_bytes, r[k]->ideal_bytes,
                   (double)r[k]->used_bytes / r[k]->ideal_bytes, r[k]->shared_chunks, r[k]->shared_tokens);
        printf("}\n");
    } else {
        printf("%d sessions, a %d-token system prompt, %d turns of %d tokens each, %d generated a turn (%s)\n",
               o.sessions, o.system_tokens, o.turns, o.turn_tokens, o.gen, o.backend);
        printf("%-11s %12s %14s %12s %10s %10s %10s %8s %7s\n", "", "ttft s1 ms", "ttft 2..N med", "2..N max",
               "max/s1", "held MiB", "ideal MiB", "x ideal", "shared");
        for (int k = 0; k < 2; k++)
            printf("%-11s %12.1f %14.1f %12.1f %10.3f %10.1f %10.1f %8.2f %7" PRIu64 "\n", name[k],
                   r[k]->ttft_first_ms, r[k]->ttft_rest_median_ms, r[k]->ttft_rest_max_ms,
                   r[k]->ttft_rest_max_ms / r[k]->ttft_first_ms, r[k]->used_bytes / 1048576.0,
                   r[k]->ideal_bytes / 1048576.0, (double)r[k]->used_bytes / r[k]->ideal_bytes, r[k]->shared_chunks);
        printf("ideal: one copy of the prompt plus each session's own tokens; shared: chunks held once\n");
    }
    free(toks);
    pv_llama_free(m);
    pv_tokenizer_free(&tok);
    pv_backend_free(be);
    return 0;
}
