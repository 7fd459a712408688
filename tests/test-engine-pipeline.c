/* The layer-pipelined swap-in is real. On the delay backend (the CPU
 * backend with an asynchronous copy queue whose host -> device copies sleep,
 * and a sleep in every attention call), a turn whose whole history is on
 * HOST must take about max(copy, compute), not their sum; and no layer's
 * attention may read a slot before the copy into it has landed (the
 * backend's timeline of reads against copies says so), also when the
 * copies are much slower than compute.
 * And it is cheap for the host: on the CPU backend, a turn whose history
 * of 4 or of 12 chunks a layer comes back from HOST costs the same number
 * of backend calls (launches + copies), one transfer a layer, not one copy
 * a chunk. */
#include "delay-backend.h"
#include "engine-util.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define LAYERS 8
#define CHUNK 16
#define COPY_S 0.004   /* per chunk copy: 4 chunks a layer, 16 ms a layer */
#define ATTN_S 0.016   /* per attention call: one a layer, 16 ms a layer */
#define REPS 5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One turn of `n` fresh tokens for session id, one token generated; its
 * wall time and result. */
static pv_status turn(pv_engine *e, const char *id, int n, uint32_t seed, double *wall, eu_result *r)
{
    int32_t toks[256];
    for (int i = 0; i < n; i++)
        toks[i] = 3 + (int32_t)((seed * 2654435761u + (uint32_t)i * 40503u) % 250u);
    pv_turn t = {.tokens = toks, .n_tokens = (size_t)n};
    pv_sampling_defaults(&t.sampling);
    t.sampling.max_tokens = 1;
    t.sampling.ignore_eos = 1;
    pv_turn_callbacks cb = {eu_on_token, eu_on_done, r};
    memset(r, 0, sizeof *r);
    double t0 = now_s();
    pv_status st = pv_engine_submit(e, id, &t, &cb, NULL);
    if (st == PV_OK)
        st = pv_engine_run(e);
    *wall = now_s() - t0;
    return st != PV_OK ? st : r->status;
}

/* Backend calls that move bytes or run work: what a step costs the host. */
static uint64_t calls(const pv_backend *be)
{
    return pv_backend_launches(be) + pv_backend_copies(be);
}

/* Session A's history of `chunks` full chunks goes to HOST when B's turn
 * takes the whole device pool, then A returns with 7 tokens: the calls of
 * that turn, and how many chunk records it found on HOST. */
static pv_status swap_in_turn_calls(eu_model *m, uint32_t chunks, uint64_t *n_calls, uint32_t *on_host)
{
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m->model);
    cc.device_bytes = (uint64_t)(chunks + 1) * LAYERS * slot;
    cc.host_bytes = (uint64_t)(2 * chunks + 4) * LAYERS * slot;
    cc.reserve = 0.0;
    cc.high_water = 1.0;
    pv_engine *e = NULL;
    pv_status st = pv_engine_init(&e, m->be, m->model, &m->tok, &cc, NULL);
    eu_result r;
    double wall;
    if (st == PV_OK && (st = turn(e, "A", (int)chunks * CHUNK, 1, &wall, &r)) == PV_OK)
        st = turn(e, "B", (int)chunks * CHUNK + 6, 2, &wall, &r); /* chunks + 1 chunks: A goes to HOST */
    uint64_t before = calls(m->be);
    if (st == PV_OK)
        st = turn(e, "A", 7, 3, &wall, &r);
    *n_calls = calls(m->be) - before;
    *on_host = r.res.reused_host;
    pv_engine_free(e);
    return st;
}

/* With copies slower than compute, a layer whose attention ran ahead of
 * its own transfer (waiting for an earlier layer's, say) would read slots
 * still in flight; with copies about as fast as compute, as in the timed
 * reps, it may not. Each layer's copies take 3 x its attention here. */
static void order_with_slow_copies(pv_engine *e, pv_backend *be)
{
    pv_delay_options slow = {.h2d_delay_s = 3 * ATTN_S / 4, .attention_delay_s = ATTN_S};
    eu_result r;
    double wall;
    pv_status st = pv_delay_backend_set_delays(be, &slow);
    if (st == PV_OK && (st = turn(e, "slow-A", 64, 31, &wall, &r)) == PV_OK)
        st = turn(e, "slow-B", 70, 32, &wall, &r); /* slow-A goes to HOST */
    pv_delay_backend_reset(be);
    if (st == PV_OK)
        st = turn(e, "slow-A", 7, 33, &wall, &r);
    int all_host = st == PV_OK && r.res.reused_host == r.res.context_tokens && r.res.reused_device == 0;
    char why[512] = "";
    if (st == PV_OK)
        st = pv_delay_backend_check_order(be, why, sizeof why);
    ok(st == PV_OK && all_host,
       "copies 3x slower than compute: no attention read a slot before its copy landed (%lld delayed copies, "
       "history on HOST: %s)%s%s", (long long)pv_delay_backend_delayed_copies(be), all_host ? "yes" : "no",
       st == PV_OK ? "" : ": ", st == PV_OK ? "" : (why[0] ? why : pv_last_error()));
}

static void swap_in_calls(void)
{
    eu_model m;
    pv_status st = eu_model_init(&m, "cpu", LAYERS, 512, PV_F32, CHUNK);
    uint64_t few = 0, many = 0;
    uint32_t host_few = 0, host_many = 0;
    if (st == PV_OK)
        st = swap_in_turn_calls(&m, 4, &few, &host_few);
    if (st == PV_OK)
        st = swap_in_turn_calls(&m, 12, &many, &host_many);
    ok(st == PV_OK && host_few == 4 * CHUNK && host_many == 12 * CHUNK,
       "cpu: returning turns found their histories of 4 and 12 chunks on HOST (%u and %u tokens; %s)", host_few,
       host_many, st == PV_OK ? "ok" : pv_last_error());
    /* A copy a chunk would cost 8 x 8 = 64 calls more for the longer history. */
    ok(st == PV_OK && many <= few + 2,
       "cpu: a swap-in costs O(layers) backend calls, not O(chunks x layers): %llu calls for a turn swapping in "
       "4 chunks x %d layers, %llu for 12 chunks x %d layers", (unsigned long long)few, LAYERS,
       (unsigned long long)many, LAYERS);
    eu_model_free(&m);
}

int main(int argc, char **argv)
{
    eu_passive_openmp(argc, argv);
    pv_delay_options o = {.h2d_delay_s = COPY_S, .attention_delay_s = ATTN_S};
    pv_backend *be = NULL;
    pv_status st = pv_delay_backend_init(&be, &o);
    if (!ok(st == PV_OK, "delay backend (%s)", st == PV_OK ? "ok" : pv_last_error()))
        return tap_done();
    pv_synth_config c;
    pv_synth_config_default(&c);
    c.n_layers = LAYERS;
    c.n_ctx = 512;
    uint8_t *image = NULL;
    uint64_t size = 0;
    pv_gguf g;
    eu_model m = {.be = be};
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.chunk_tokens = CHUNK;
    lo.max_batch_tokens = 128;
    lo.max_logit_rows = 8;
    if ((st = pv_synth_to_memory(&c, &image, &size)) == PV_OK && (st = pv_gguf_init_memory(&g, image, size)) == PV_OK) {
        if ((st = pv_tokenizer_init(&m.tok, &g)) == PV_OK)
            st = pv_llama_init(&m.model, be, &g, &lo);
        pv_gguf_free(&g);
    }
    free(image);
    if (!ok(st == PV_OK, "synthetic model with %d layers on the delay backend (%s)", LAYERS,
            st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return tap_done();
    }

    /* 40 device slots, no reserve, no background swap-out: A's 4 chunks x
     * 8 layers (32 slots) are all evicted to HOST when B's 5 chunks arrive,
     * and come back when A returns. */
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    uint64_t slot = pv_llama_slot_bytes(m.model);
    cc.device_bytes = 40 * slot;
    cc.host_bytes = 128 * slot;
    cc.reserve = 0.0;
    cc.high_water = 1.0;
    pv_engine *e = NULL;
    st = pv_engine_init(&e, be, m.model, &m.tok, &cc, NULL);
    if (!ok(st == PV_OK, "engine (%s)", st == PV_OK ? "ok" : pv_last_error())) {
        eu_model_free(&m);
        return tap_done();
    }
    eu_result r;
    double wall, piped[REPS], resident[REPS], copy[REPS];
    int fails = 0, all_host = 1;
    for (int rep = 0; rep < REPS; rep++) {
        char a[16], b[16];
        snprintf(a, sizeof a, "A%d", rep);
        snprintf(b, sizeof b, "B%d", rep);
        fails += turn(e, a, 64, 1 + rep, &wall, &r) != PV_OK; /* 4 full chunks */
        fails += turn(e, b, 70, 2 + rep, &wall, &r) != PV_OK; /* 5 chunks: A goes to HOST */
        pv_delay_backend_reset(be);
        fails += turn(e, a, 7, 10 + rep, &piped[rep], &r) != PV_OK;
        all_host &= r.res.reused_host == r.res.context_tokens && r.res.reused_device == 0;
        copy[rep] = pv_delay_backend_copy_busy_s(be);
        char why[512] = "";
        st = pv_delay_backend_check_order(be, why, sizeof why);
        ok(st == PV_OK, "rep %d: no attention read a slot before its copy landed (%lld delayed copies, "
           "%lld attention calls)%s%s", rep, (long long)pv_delay_backend_delayed_copies(be),
           (long long)pv_delay_backend_attention_calls(be), st == PV_OK ? "" : ": ", st == PV_OK ? "" : why);
        /* The same turn again, its history resident on DEVICE: compute alone. */
        fails += turn(e, a, 7, 20 + rep, &resident[rep], &r) != PV_OK;
        fails += pv_engine_end_session(e, a) != PV_OK;
        fails += pv_engine_end_session(e, b) != PV_OK;
    }
    ok(fails == 0, "every turn completed");
    ok(all_host, "each pipelined turn found its whole history on HOST");
    qsort(piped, REPS, sizeof *piped, cmp_double);
    qsort(resident, REPS, sizeof *resident, cmp_double);
    qsort(copy, REPS, sizeof *copy, cmp_double);
    double p = piped[REPS / 2], comp = resident[REPS / 2], cp = copy[REPS / 2];
    double shorter = comp < cp ? comp : cp, longer = comp < cp ? cp : comp;
    tap_diag("medians: pipelined turn %.1f ms; copies %.1f ms; compute alone %.1f ms; sum %.1f ms",
             p * 1e3, cp * 1e3, comp * 1e3, (cp + comp) * 1e3);
    /* Serialised, the turn takes the sum; pipelined, about the longer part
     * plus one layer's copy. The margin absorbs a loaded machine. */
    ok(p < cp + comp - 0.3 * shorter,
       "a turn with its history on HOST takes %.0f ms: near max(copy, compute) = %.0f ms, well under "
       "their sum %.0f ms", p * 1e3, longer * 1e3, (cp + comp) * 1e3);
    order_with_slow_copies(e, be);
    pv_backend_finish(be);
    pv_engine_free(e);
    eu_model_free(&m);
    swap_in_calls();
    return tap_done();
}
