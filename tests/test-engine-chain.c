/* Chained decode steps (pv_engine_config.decode_steps): a step of decodes
 * only is followed by steps enqueued with the tokens the device sampled,
 * before the host has read them; the host takes the tokens one step
 * behind. The oracle is the same workload with decode_steps 1: every turn's
 * tokens, text, finish reason and status must be the same, whatever ends a
 * turn (max_tokens, an end token, a stop string, the device pool) and
 * wherever in a chain it ends, greedy or sampled, with sessions swapped and
 * recomputed under a small device pool. pv_engine_check runs after every
 * step, and the chains must really have run (more forward passes than
 * steps). Synthetic model on the CPU backend, and on OpenCL where present.
 * On a backend that records decode graphs (CUDA), a long turn's decode
 * passes replay their recordings as the context grows. */
#include "engine-util.h"

#include <inttypes.h>

#define LAYERS 2
#define CHUNK 8
#define N_CTX 1024
#define SESSIONS 6
#define ROUNDS 3
#define TURNS (SESSIONS * ROUNDS)
#define TEXT_CAP 2048

static eu_model M;
static uint64_t SLOT;

typedef struct turn_out {
    int32_t tokens[256];
    int n;
    char text[TEXT_CAP];
    size_t text_len;
    int done;
    pv_status status;
    pv_finish_reason finish;
} turn_out;

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    turn_out *o = user;
    if (token >= 0 && o->n < 256)
        o->tokens[o->n++] = token;
    if (len && o->text_len + len < TEXT_CAP) {
        memcpy(o->text + o->text_len, text, len);
        o->text_len += len;
    }
}

static void on_done(void *user, pv_status st, const pv_turn_result *res)
{
    turn_out *o = user;
    o->done++;
    o->status = st;
    o->finish = res->finish;
}

/* One turn of the workload: its session, prompt and how it samples and
 * stops; `stop` is filled in from a run without stops. */
typedef struct turn_plan {
    int session;
    int32_t prompt[40];
    int n_prompt;
    int variant;
    char stop[8];
} turn_plan;

static uint64_t rng = 0xc4a1;

static uint32_t rnd(uint32_t n)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rng >> 33) % n);
}

static void make_plan(turn_plan *plan)
{
    for (int i = 0; i < TURNS; i++) {
        turn_plan *t = &plan[i];
        t->session = i % SESSIONS;
        t->n_prompt = 3 + (int)rnd(30);
        for (int k = 0; k < t->n_prompt; k++)
            t->prompt[k] = 3 + (int32_t)rnd(M.tok.n_vocab - 3);
        /* Turns without a limit come last: they fill the session. */
        t->variant = i < TURNS - SESSIONS ? (int)rnd(5) : 5 - (i % 2) * (int)rnd(5);
        t->stop[0] = '\0';
    }
}

/* Variants: 0 greedy, max_tokens 1..7 (chains end at every position);
 * 1 greedy until an end token (or 48); 2 sampled, temperature 1, top-p
 * 0.9, 40 tokens; 3 greedy with a stop string; 4 sampled with a stop
 * string; 5 greedy with no limit (the device pool or the context ends it). */
static void sampling_of(const turn_plan *t, int index, pv_sampling *s, const char **stop)
{
    pv_sampling_defaults(s);
    s->ignore_eos = t->variant != 1;
    s->max_tokens = t->variant == 0 ? 1 + index % 7 : t->variant == 5 ? 0 : 48;
    if (t->variant == 2 || t->variant == 4) {
        s->temperature = 1.0f;
        s->top_p = 0.9f;
        s->seed = 1000 + (uint64_t)index;
    }
    if (t->stop[0]) {
        *stop = t->stop;
        s->stop = stop;
        s->n_stop = 1;
    }
}

typedef struct run_stats {
    uint64_t steps, iterations, discarded;
    double forward_s, schedule_s;
    int check_failures;
    char first_failure[256];
} run_stats;

/* The workload on a fresh engine: each round's turns submitted together,
 * stepped to the end with pv_engine_check after each step. */
static pv_status run_workload(const turn_plan *plan, int32_t decode_steps, pv_engine_mode mode, uint64_t device_slots,
                              turn_out *out, run_stats *rs)
{
    memset(out, 0, sizeof(turn_out) * TURNS);
    memset(rs, 0, sizeof *rs);
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = device_slots * SLOT;
    cc.host_bytes = 64 * SLOT;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.mode = mode;
    ec.decode_steps = decode_steps;
    ec.max_running = SESSIONS;
    ec.swap_out_chunks = 4;
    pv_engine *e = NULL;
    pv_status st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec);
    for (int round = 0; round < ROUNDS && st == PV_OK; round++) {
        const char *stops[TURNS];
        for (int i = round * SESSIONS; i < (round + 1) * SESSIONS && st == PV_OK; i++) {
            char name[16];
            snprintf(name, sizeof name, "c%d", plan[i].session);
            pv_turn t = {.tokens = plan[i].prompt, .n_tokens = (size_t)plan[i].n_prompt};
            sampling_of(&plan[i], i, &t.sampling, &stops[i]);
            pv_turn_callbacks cb = {on_token, on_done, &out[i]};
            /* A refused turn (no room left in the context) is an answer too. */
            if ((out[i].status = pv_engine_submit(e, name, &t, &cb, NULL)) != PV_OK)
                out[i].done = 1;
        }
        if (st == PV_OK)
            st = eu_drain(e, &rs->check_failures, rs->first_failure, sizeof rs->first_failure, &rs->steps);
    }
    if (e) {
        pv_engine_stats es;
        pv_engine_stats_get(e, &es);
        rs->iterations = es.iterations;
        rs->discarded = es.discarded_tokens;
        rs->forward_s = es.forward_s;
        rs->schedule_s = es.schedule_s;
    }
    pv_engine_free(e);
    return st;
}

/* Stop strings: three bytes from the middle of what a turn of variant 3
 * or 4 says without one, so the stop hits partway into the turn. */
static void choose_stops(turn_plan *plan, const turn_out *free_run)
{
    for (int i = 0; i < TURNS; i++) {
        const turn_out *o = &free_run[i];
        if ((plan[i].variant == 3 || plan[i].variant == 4) && o->text_len >= 8) {
            size_t at = o->text_len / 2;
            memcpy(plan[i].stop, o->text + at, 3);
            plan[i].stop[3] = '\0';
            if (strlen(plan[i].stop) != 3) /* a NUL inside: no stop */
                plan[i].stop[0] = '\0';
        }
    }
}

static int same_turn(const turn_out *a, const turn_out *b)
{
    return a->done == 1 && b->done == 1 && a->status == b->status && a->finish == b->finish && a->n == b->n &&
           memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->n) == 0 && a->text_len == b->text_len &&
           memcmp(a->text, b->text, a->text_len) == 0;
}

static void compare(const char *label, const turn_out *want, const turn_out *got)
{
    int same = 0, first_diff = -1;
    for (int i = 0; i < TURNS; i++) {
        if (same_turn(&want[i], &got[i]))
            same++;
        else if (first_diff < 0)
            first_diff = i;
    }
    ok(same == TURNS, "%s: %d of %d turns give decode_steps 1's tokens, text and finish%s", label, same, TURNS,
       first_diff < 0 ? "" : " (first different: see below)");
    if (first_diff >= 0)
        tap_diag("turn %d: %d tokens, finish %s, status %d; decode_steps 1: %d tokens, finish %s, status %d", first_diff,
                 got[first_diff].n, pv_finish_reason_name(got[first_diff].finish), (int)got[first_diff].status,
                 want[first_diff].n, pv_finish_reason_name(want[first_diff].finish), (int)want[first_diff].status);
}

/* One session decoding 240 tokens through the engine: on a backend that
 * records decode graphs, a key (tokens, sequences, slot-table width,
 * logit rows) is recorded once and replayed while the context grows. The
 * engine rounds the tables' width up to 8 chunks (64 tokens here), so at
 * most 5 of the ~240 decode passes record; with the exact width (a new
 * key every chunk of 8 tokens) some 30 would. A pass whose recording read
 * a scratch buffer that has grown since (a wider table splits attention
 * more) differs from it: it runs op by op and its key records anew, so
 * the bar is on the replays among the decode passes. */
#define REPLAY_TOKENS 240
/* The engine's own share of a chained workload's time at most (measured:
 * 1-2% on PoCL and the CPU, whose forward passes are slow). */
#define SCHEDULE_SHARE_MAX 0.25
#define REPLAY_AT_LEAST 0.95

static void check_graph_replays(const char *backend)
{
    if (!pv_backend_graphs(M.be)) {
        tap_skip("%s: records no decode graphs", backend);
        return;
    }
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 4096 * SLOT;
    cc.host_bytes = 64 * SLOT;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    ec.decode_steps = 4;
    pv_engine *e = NULL;
    turn_out out = {0};
    int check_failures = 0;
    char first_failure[256] = "";
    uint64_t steps = 0;
    const uint64_t runs0 = pv_backend_graph_runs(M.be), replays0 = pv_backend_graph_replays(M.be);
    pv_status st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec);
    if (st == PV_OK) {
        const int32_t prompt[] = {5, 6, 7, 8, 9, 10, 11};
        pv_turn t = {.tokens = prompt, .n_tokens = sizeof prompt / sizeof prompt[0]};
        pv_sampling_defaults(&t.sampling);
        t.sampling.ignore_eos = 1;
        t.sampling.max_tokens = REPLAY_TOKENS;
        pv_turn_callbacks cb = {on_token, on_done, &out};
        st = pv_engine_submit(e, "g", &t, &cb, NULL);
    }
    if (st == PV_OK)
        st = eu_drain(e, &check_failures, first_failure, sizeof first_failure, &steps);
    pv_engine_free(e);
    const uint64_t runs = pv_backend_graph_runs(M.be) - runs0, replays = pv_backend_graph_replays(M.be) - replays0;
    ok(st == PV_OK && out.n == REPLAY_TOKENS && (double)replays >= REPLAY_AT_LEAST * (REPLAY_TOKENS - 1),
       "%s: %d decoded tokens, %" PRIu64 " forward passes as graphs, %" PRIu64 " of the %d decode passes replayed "
       "without recording (at least %.0f%%)%s%s%s%s",
       backend, out.n, runs, replays, REPLAY_TOKENS - 1, 100 * REPLAY_AT_LEAST, st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error(),
       pv_llama_graph_failure(M.model)[0] ? "; the last recording that did not run: " : "",
       pv_llama_graph_failure(M.model));
}

/* Decode steps padded to their batch-size buckets, as a GPU's graphs pad
 * them (pv_llama_options.graph_buckets 2 pads every one, here where no
 * graphs are): rows of token 0 in the engine's spare slot after the real
 * ones (batches of 3, 5 and 6 sessions become 4 and 8), whose values must
 * not reach any turn. The same turns as the unpadded model's with
 * decode_steps 1, roomy with decode_steps 1 and with 40 device slots and
 * chains of 5; rows were padded in both. */
static void check_buckets(const char *backend, const turn_plan *plan)
{
    static turn_out want[TURNS], got[TURNS];
    run_stats rs;
    const struct {
        int32_t steps;
        uint64_t device_slots;
        const char *name;
    } runs[] = {{1, 4096, "roomy, decode_steps 1"}, {5, 40, "40 device slots, decode_steps 5"}};
    eu_model padded;
    pv_status st = eu_model_init_buckets(&padded, NULL, backend, LAYERS, N_CTX, PV_F32, CHUNK, 16, 2);
    if (!ok(st == PV_OK, "%s: the model with every decode step padded opens (%s)", backend,
            st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&padded);
        return;
    }
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char label[160];
        snprintf(label, sizeof label, "%s, decode steps padded to buckets, %s", backend, runs[r].name);
        st = run_workload(plan, 1, PV_MODE_PENSIEVE, runs[r].device_slots, want, &rs);
        const eu_model unpadded = M;
        M = padded;
        const uint64_t rows0 = pv_llama_padded_rows(M.model);
        if (st == PV_OK)
            st = run_workload(plan, runs[r].steps, PV_MODE_PENSIEVE, runs[r].device_slots, got, &rs);
        const uint64_t rows = pv_llama_padded_rows(M.model) - rows0;
        M = unpadded;
        if (!ok(st == PV_OK, "%s: runs (%s)", label, st == PV_OK ? "ok" : pv_last_error()))
            break;
        compare(label, want, got);
        ok(rows > 0 && rs.check_failures == 0, "%s: %" PRIu64 " rows padded; pv_engine_check after every step (%d failed%s%s)",
           label, rows, rs.check_failures, rs.check_failures ? "; first: " : "", rs.first_failure);
    }
    eu_model_free(&padded);
}

static void test_backend(const char *backend)
{
    if (!eu_model_ready(&M, backend, LAYERS, N_CTX, PV_F32, CHUNK))
        return;
    SLOT = pv_llama_slot_bytes(M.model);
    turn_plan plan[TURNS];
    make_plan(plan);
    static turn_out want[TURNS], got[TURNS];
    run_stats rs;
    pv_status st = run_workload(plan, 1, PV_MODE_PENSIEVE, 4096, want, &rs);
    choose_stops(plan, want);
    int stops = 0, ends[8] = {0};
    st = st == PV_OK ? run_workload(plan, 1, PV_MODE_PENSIEVE, 4096, want, &rs) : st;
    for (int i = 0; i < TURNS; i++) {
        stops += plan[i].stop[0] != '\0';
        ends[want[i].finish & 7]++;
    }
    ok(st == PV_OK && stops >= 2 && ends[PV_FINISH_STOP] >= 2 && ends[PV_FINISH_LENGTH] >= 2,
       "%s: the workload with decode_steps 1: %d stop strings; %d turns end at a stop, %d for length (%s)", backend,
       stops, ends[PV_FINISH_STOP], ends[PV_FINISH_LENGTH], st == PV_OK ? "ok" : pv_last_error());

    /* Roomy, then a device pool of 40 slots (20 chunks of 2 layers) that
     * six sessions outgrow: swaps, drops, recomputation, chains cut short
     * when a new chunk finds no room. */
    const struct {
        pv_engine_mode mode;
        uint64_t device_slots;
        const char *name;
    } setups[] = {{PV_MODE_PENSIEVE, 4096, "roomy"}, {PV_MODE_PENSIEVE, 40, "40 device slots"},
                  {PV_MODE_STATELESS, 4096, "stateless"}};
    static turn_out ref[TURNS];
    for (size_t s = 0; s < sizeof setups / sizeof setups[0]; s++) {
        run_stats r1;
        st = run_workload(plan, 1, setups[s].mode, setups[s].device_slots, ref, &r1);
        for (int32_t steps = 2; steps <= 5 && st == PV_OK; steps += 3) {
            char label[160];
            snprintf(label, sizeof label, "%s, %s, decode_steps %d", backend, setups[s].name, steps);
            st = run_workload(plan, steps, setups[s].mode, setups[s].device_slots, got, &rs);
            if (!ok(st == PV_OK, "%s: runs (%s)", label, st == PV_OK ? "ok" : pv_last_error()))
                break;
            compare(label, ref, got);
            ok(rs.check_failures == 0, "%s: pv_engine_check after every step (%d failed%s%s)", label, rs.check_failures,
               rs.check_failures ? "; first: " : "", rs.first_failure);
            int stopped = 0;
            for (int i = 0; i < TURNS; i++)
                stopped += ref[i].finish == PV_FINISH_STOP;
            /* A turn ended for length is seen coming: only a stop costs a
             * chained step's row. */
            ok(rs.discarded <= (uint64_t)stopped && r1.discarded == 0,
               "%s: %" PRIu64 " decode rows thrown away, at most one per turn ended at a stop (%d)", label,
               rs.discarded, stopped);
            /* Waiting for a chained step's tokens is the device's forward
             * work, not the engine's (pv_engine_stats.forward_s): on an
             * asynchronous backend it is nearly all of a chain's time. */
            ok(rs.schedule_s < SCHEDULE_SHARE_MAX * (rs.forward_s + rs.schedule_s),
               "%s: scheduling %.3f s against forward %.3f s (under %.0f%%; decode_steps 1: %.3f, %.3f)", label,
               rs.schedule_s, rs.forward_s, 100 * SCHEDULE_SHARE_MAX, r1.schedule_s, r1.forward_s);
            ok(rs.iterations > rs.steps && rs.steps < r1.steps,
               "%s: chains ran: %" PRIu64 " forward passes in %" PRIu64 " steps (decode_steps 1: %" PRIu64 " steps)",
               label, rs.iterations, rs.steps, r1.steps);
        }
        if (setups[s].device_slots == 4096 && setups[s].mode == PV_MODE_PENSIEVE)
            compare("roomy pensieve against the first run", want, ref);
    }
    check_buckets(backend, plan);
    check_graph_replays(backend);
    eu_model_free(&M);
}

static void test_config(void)
{
    pv_status st = eu_model_init(&M, "cpu", LAYERS, N_CTX, PV_F32, CHUNK);
    if (!ok(st == PV_OK, "cpu model for the config checks"))
        return;
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = 64 * pv_llama_slot_bytes(M.model);
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    pv_engine *e = NULL;
    const int32_t bad[] = {-1, PV_ENGINE_MAX_DECODE_STEPS + 1};
    for (size_t i = 0; i < 2; i++) {
        ec.decode_steps = bad[i];
        st = pv_engine_init(&e, M.be, M.model, &M.tok, &cc, &ec);
        ok(st == PV_ERR_INVALID_ARG && e == NULL && strstr(pv_last_error(), "decode_steps"),
           "decode_steps %d is refused (%s)", bad[i], pv_last_error());
    }
    eu_model_free(&M);
}

int main(int argc, char **argv)
{
    eu_passive_openmp(argc, argv);
    test_config();
    test_backend("cpu");
    test_backend("opencl");
    test_backend("cuda");
    return tap_done();
}
