/* The swap path per backend: see bench-swap.h. */
#include "config.h"

#include "bench-swap.h"
#include "bench-timing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Chunks per layer of section 1, and section 2's shape. */
static const int32_t full_sizes[BENCH_SWAP_SIZES] = {16, 64, 256, 1024};
static const int32_t quick_sizes[BENCH_SWAP_SIZES] = {4, 16, 0, 0};
#define PIPE_LAYERS 8
#define PIPE_CHUNKS 256
#define PIPE_QUERIES 8
#define QUICK_PIPE_LAYERS 4
#define QUICK_PIPE_CHUNKS 16

/* Both pools, and a shuffled order of the slots of each. */
typedef struct swap_pools {
    pv_backend *be;
    const bench_swap_options *o;
    int64_t slot_elems;
    uint64_t slot_bytes;
    pv_buffer *host, *dev;
    int64_t host_slots, dev_slots;
    int32_t *host_order, *dev_order;
} swap_pools;

static uint64_t calls_of(const pv_backend *be)
{
    return pv_backend_launches(be) + pv_backend_copies(be);
}

static void shuffle(int32_t *x, int64_t n, uint64_t *state)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (int32_t)i;
    for (int64_t i = n; i > 1; i--) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        int64_t j = (int64_t)((*state >> 33) % (uint64_t)i);
        int32_t t = x[i - 1];
        x[i - 1] = x[j];
        x[j] = t;
    }
}

/* Fills a buffer once, so every copy reads real pages: 16-bit words
 * 0x30xx, which read as f16 are about 0.1 and, in pairs, as f32 about
 * 5e-10; never NaN, inf or subnormal, so the attention runs at speed. */
static pv_status fill(pv_buffer *buf)
{
    const size_t chunk = (size_t)16 << 20;
    uint16_t *words = malloc(chunk);
    if (!words)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench swap: a fill buffer of %zu bytes", chunk);
    for (size_t i = 0; i < chunk / 2; i++)
        words[i] = (uint16_t)(0x3000u | (i * 37u & 0xffu));
    const unsigned char *bytes = (const unsigned char *)words;
    pv_status st = PV_OK;
    for (uint64_t off = 0; st == PV_OK && off < buf->bytes; off += chunk)
        st = pv_buffer_write(buf, off, bytes, buf->bytes - off < chunk ? buf->bytes - off : chunk);
    free(words);
    return st;
}

static void pools_free(swap_pools *p)
{
    pv_buffer_free(p->host);
    pv_buffer_free(p->dev);
    free(p->host_order);
    free(p->dev_order);
}

static pv_status pools_init(swap_pools *p, pv_backend *be, const bench_swap_options *o, int64_t dev_slots)
{
    memset(p, 0, sizeof *p);
    p->be = be;
    p->o = o;
    p->slot_elems = 2 * (int64_t)o->chunk_tokens * o->n_kv_heads * o->head_dim;
    p->slot_bytes = (uint64_t)p->slot_elems * pv_dtype_size(o->kv_dtype);
    p->dev_slots = dev_slots;
    p->host_slots = 2 * dev_slots;
    p->host_order = malloc((size_t)p->host_slots * sizeof *p->host_order);
    p->dev_order = malloc((size_t)p->dev_slots * sizeof *p->dev_order);
    if (!p->host_order || !p->dev_order)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench swap: slot orders of %lld slots", (long long)p->host_slots);
    uint64_t state = 2026;
    shuffle(p->host_order, p->host_slots, &state);
    shuffle(p->dev_order, p->dev_slots, &state);
    pv_status st = pv_buffer_init(&p->host, be, PV_MEM_HOST, (uint64_t)p->host_slots * p->slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&p->dev, be, PV_MEM_DEVICE, (uint64_t)p->dev_slots * p->slot_bytes);
    if (st == PV_OK)
        st = fill(p->host);
    if (st == PV_OK)
        st = fill(p->dev);
    return st;
}

/* ---- 1. one layer's move, three ways ---------------------------------------------------- */

typedef enum move_how { MOVE_TRANSFER = 0, MOVE_PER_CHUNK, MOVE_PLAIN } move_how;

typedef struct move_run {
    swap_pools *p;
    int dir; /* BENCH_SWAP_IN or BENCH_SWAP_OUT */
    move_how how;
    int32_t n;
    double issue_ms[BENCH_MAX_REPS + 1];
    int n_issue;
    uint64_t calls; /* of the last run */
} move_run;

/* n slots from shuffled places of one pool to shuffled places of the
 * other (or n slots' bytes from the start of one to the start of the
 * other), waited for. */
static pv_status run_move(void *state)
{
    move_run *m = state;
    swap_pools *p = m->p;
    const int in = m->dir == BENCH_SWAP_IN;
    pv_buffer *dst = in ? p->dev : p->host, *src = in ? p->host : p->dev;
    const int32_t *to = in ? p->dev_order : p->host_order, *from = in ? p->host_order : p->dev_order;
    const int64_t dst_slots = in ? p->dev_slots : p->host_slots, src_slots = in ? p->host_slots : p->dev_slots;
    const uint64_t calls = calls_of(p->be);
    const double t0 = bench_now_s();
    pv_event *done = NULL;
    pv_status st = PV_OK;
    if (m->how == MOVE_TRANSFER) {
        pv_slot_transfer_args a = {.dtype = p->o->kv_dtype, .slot_elems = p->slot_elems, .dst = dst,
                                   .dst_n_slots = dst_slots, .src = src, .src_n_slots = src_slots, .dst_slots = to,
                                   .src_slots = from, .n = m->n};
        st = pv_slot_transfer(p->be, &a, NULL, &done);
    } else if (m->how == MOVE_PER_CHUNK) {
        for (int32_t i = 0; i < m->n && st == PV_OK; i++)
            st = pv_copy_async(PV_QUEUE_COPY, dst, (uint64_t)to[i] * p->slot_bytes, src,
                               (uint64_t)from[i] * p->slot_bytes, p->slot_bytes, NULL, NULL);
        if (st == PV_OK)
            st = pv_event_record(p->be, PV_QUEUE_COPY, &done);
    } else {
        st = pv_copy_async(PV_QUEUE_COPY, dst, 0, src, 0, (uint64_t)m->n * p->slot_bytes, NULL, &done);
    }
    if (m->n_issue < BENCH_MAX_REPS + 1)
        m->issue_ms[m->n_issue++] = 1e3 * (bench_now_s() - t0);
    m->calls = calls_of(p->be) - calls;
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    return st;
}

static pv_status bench_moves(swap_pools *p, int reps, bench_swap_row *row)
{
    for (int dir = 0; dir < 2; dir++) {
        move_run runs[3];
        for (int how = 0; how < 3; how++)
            runs[how] = (move_run){.p = p, .dir = dir, .how = (move_how)how, .n = row->chunks};
        const bench_action_fn fns[3] = {run_move, run_move, run_move};
        void *const states[3] = {&runs[0], &runs[1], &runs[2]};
        double ms[3];
        PV_TRY(bench_time_alternating(fns, states, 3, reps, ms));
        row->transfer_ms[dir] = ms[MOVE_TRANSFER];
        row->per_chunk_ms[dir] = ms[MOVE_PER_CHUNK];
        row->plain_ms[dir] = ms[MOVE_PLAIN];
        row->transfer_issue_ms[dir] = bench_median(runs[MOVE_TRANSFER].issue_ms, runs[MOVE_TRANSFER].n_issue);
        row->per_chunk_issue_ms[dir] = bench_median(runs[MOVE_PER_CHUNK].issue_ms, runs[MOVE_PER_CHUNK].n_issue);
        row->transfer_calls[dir] = runs[MOVE_TRANSFER].calls;
        row->per_chunk_calls[dir] = runs[MOVE_PER_CHUNK].calls;
        row->plain_calls[dir] = runs[MOVE_PLAIN].calls;
    }
    row->bytes = (double)row->chunks * (double)p->slot_bytes;
    return PV_OK;
}

/* ---- 2. the layer-pipelined swap-in ------------------------------------------------------- */

typedef enum pipe_mode { PIPE_COPY = 0, PIPE_COMPUTE, PIPE_BOTH } pipe_mode;

typedef struct pipe_run {
    swap_pools *p;
    pipe_mode mode;
    int32_t layers, chunks, queries;
    int32_t *tables;    /* [layers][chunks]: the device slots of each layer */
    int32_t token_seq[PIPE_QUERIES], token_pos[PIPE_QUERIES];
    pv_buffer *q, *out; /* [queries][n_heads][head_dim] f32 */
} pipe_run;

static pv_status run_pipe(void *state)
{
    pipe_run *r = state;
    swap_pools *p = r->p;
    const bench_swap_options *o = p->o;
    pv_event *done[PIPE_LAYERS] = {NULL};
    pv_status st = PV_OK;
    for (int32_t l = 0; l < r->layers && st == PV_OK && r->mode != PIPE_COMPUTE; l++) {
        pv_slot_transfer_args a = {.dtype = o->kv_dtype, .slot_elems = p->slot_elems, .dst = p->dev,
                                   .dst_n_slots = p->dev_slots, .src = p->host, .src_n_slots = p->host_slots,
                                   .dst_slots = r->tables + (size_t)l * r->chunks,
                                   .src_slots = p->host_order + (size_t)l * r->chunks, .n = r->chunks};
        st = pv_slot_transfer(p->be, &a, NULL, &done[l]);
    }
    for (int32_t l = 0; l < r->layers && st == PV_OK && r->mode != PIPE_COPY; l++) {
        if (done[l])
            st = pv_queue_wait(p->be, PV_QUEUE_COMPUTE, done[l]);
        pv_attention_args a = {
            .kv_dtype = o->kv_dtype, .n_tokens = r->queries, .n_heads = o->n_heads, .n_kv_heads = o->n_kv_heads,
            .head_dim = o->head_dim, .chunk_tokens = o->chunk_tokens, .scale = 1.0f / sqrtf((float)o->head_dim),
            .q = r->q, .kv_pool = p->dev, .n_slots = p->dev_slots, .token_seq = r->token_seq,
            .token_pos = r->token_pos, .slot_table = r->tables + (size_t)l * r->chunks, .n_seqs = 1,
            .max_chunks = r->chunks, .out = r->out,
        };
        if (st == PV_OK)
            st = pv_attention(p->be, &a);
    }
    if (st == PV_OK)
        st = pv_backend_finish(p->be);
    for (int32_t l = 0; l < r->layers; l++)
        pv_event_free(done[l]);
    return st;
}

static pv_status bench_pipeline(swap_pools *p, int reps, bench_swap_pipeline *out)
{
    const bench_swap_options *o = p->o;
    pipe_run r = {.p = p, .layers = o->quick ? QUICK_PIPE_LAYERS : PIPE_LAYERS,
                  .chunks = o->quick ? QUICK_PIPE_CHUNKS : PIPE_CHUNKS, .queries = PIPE_QUERIES};
    const int64_t context = (int64_t)r.chunks * o->chunk_tokens;
    for (int32_t i = 0; i < r.queries; i++) {
        r.token_seq[i] = 0;
        r.token_pos[i] = (int32_t)(context - r.queries + i);
    }
    const uint64_t q_bytes = (uint64_t)r.queries * (uint64_t)o->n_heads * (uint64_t)o->head_dim * sizeof(float);
    r.tables = malloc((size_t)r.layers * (size_t)r.chunks * sizeof *r.tables);
    if (!r.tables)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "bench swap: slot tables of %d layers", r.layers);
    memcpy(r.tables, p->dev_order, (size_t)r.layers * (size_t)r.chunks * sizeof *r.tables);
    pv_status st = pv_buffer_init(&r.q, p->be, PV_MEM_DEVICE, q_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&r.out, p->be, PV_MEM_DEVICE, q_bytes);
    if (st == PV_OK)
        st = fill(r.q);
    pipe_run runs[3] = {r, r, r};
    for (int m = 0; m < 3; m++)
        runs[m].mode = (pipe_mode)m;
    const bench_action_fn fns[3] = {run_pipe, run_pipe, run_pipe};
    void *const states[3] = {&runs[0], &runs[1], &runs[2]};
    double ms[3] = {0, 0, 0};
    if (st == PV_OK)
        st = bench_time_alternating(fns, states, 3, reps, ms);
    *out = (bench_swap_pipeline){.layers = r.layers, .chunks = r.chunks, .queries = r.queries,
                                 .bytes = (double)r.layers * r.chunks * (double)p->slot_bytes,
                                 .copy_ms = ms[PIPE_COPY], .compute_ms = ms[PIPE_COMPUTE],
                                 .pipelined_ms = ms[PIPE_BOTH]};
    pv_buffer_free(r.q);
    pv_buffer_free(r.out);
    free(r.tables);
    return st;
}

pv_status bench_swap_run(pv_backend *be, const bench_swap_options *o, bench_swap_report *rep)
{
    memset(rep, 0, sizeof *rep);
    const int32_t *sizes = o->quick ? quick_sizes : full_sizes;
    int32_t most = 0;
    for (int i = 0; i < BENCH_SWAP_SIZES; i++)
        most = sizes[i] > most ? sizes[i] : most;
    const int32_t pipe = o->quick ? QUICK_PIPE_LAYERS * QUICK_PIPE_CHUNKS : PIPE_LAYERS * PIPE_CHUNKS;
    swap_pools p;
    pv_status st = pools_init(&p, be, o, most > pipe ? most : pipe);
    rep->slot_bytes = p.slot_bytes;
    rep->reps = o->reps;
    for (int i = 0; i < BENCH_SWAP_SIZES && sizes[i] && st == PV_OK; i++) {
        bench_swap_row *row = &rep->rows[rep->n_rows];
        row->chunks = sizes[i];
        if ((st = bench_moves(&p, o->reps, row)) == PV_OK)
            rep->n_rows++;
    }
    if (st == PV_OK)
        st = bench_pipeline(&p, o->reps, &rep->pipeline);
    pools_free(&p);
    return st;
}

/* ---- output ------------------------------------------------------------------------------ */

static double gbps(double bytes, double ms)
{
    return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0;
}

void bench_swap_print(const bench_swap_report *rep)
{
    static const char *const names[2] = {"swap-in (HOST -> DEVICE)", "swap-out (DEVICE -> HOST)"};
    for (int dir = 0; dir < 2; dir++) {
        printf("\n%s, one layer of N chunks of %.0f KiB, shuffled slots, to completion; vs one plain copy of the "
               "same bytes (median of %d+ runs, alternating); calls: launches + copies, issue: the host's time in "
               "them\n",
               names[dir], (double)rep->slot_bytes / 1024, rep->reps);
        printf("%6s %8s | %9s %8s %7s %5s %8s | %9s %8s %7s %5s %8s | %9s %8s\n", "chunks", "MiB", "transfer", "GB/s",
               "of copy", "calls", "issue ms", "per-chunk", "GB/s", "of copy", "calls", "issue ms", "plain ms", "GB/s");
        for (int i = 0; i < rep->n_rows; i++) {
            const bench_swap_row *r = &rep->rows[i];
            const double plain = gbps(r->bytes, r->plain_ms[dir]);
            const double t = gbps(r->bytes, r->transfer_ms[dir]), c = gbps(r->bytes, r->per_chunk_ms[dir]);
            printf("%6d %8.1f | %9.3f %8.2f %7.2f %5llu %8.3f | %9.3f %8.2f %7.2f %5llu %8.3f | %9.3f %8.2f\n",
                   r->chunks, r->bytes / (1 << 20), r->transfer_ms[dir], t, t / plain,
                   (unsigned long long)r->transfer_calls[dir], r->transfer_issue_ms[dir], r->per_chunk_ms[dir], c,
                   c / plain, (unsigned long long)r->per_chunk_calls[dir], r->per_chunk_issue_ms[dir],
                   r->plain_ms[dir], plain);
        }
    }
    const bench_swap_pipeline *pl = &rep->pipeline;
    const double longer = pl->copy_ms > pl->compute_ms ? pl->copy_ms : pl->compute_ms;
    printf("\nlayer-pipelined swap-in: %d layers x %d chunks (%.1f MiB), attention of %d query tokens a layer "
           "over its chunks\n",
           pl->layers, pl->chunks, pl->bytes / (1 << 20), pl->queries);
    printf("%10s %11s %13s %14s %9s\n", "copy ms", "compute ms", "pipelined ms", "of max(both)", "of sum");
    printf("%10.3f %11.3f %13.3f %14.2f %9.2f\n", pl->copy_ms, pl->compute_ms, pl->pipelined_ms,
           pl->pipelined_ms / longer, pl->pipelined_ms / (pl->copy_ms + pl->compute_ms));
}

void bench_swap_json(const bench_swap_report *rep)
{
    static const char *const keys[2] = {"in", "out"};
    printf("{\"slot_bytes\": %llu, \"reps\": %d, \"moves\": [", (unsigned long long)rep->slot_bytes, rep->reps);
    for (int i = 0; i < rep->n_rows; i++) {
        const bench_swap_row *r = &rep->rows[i];
        printf("%s{\"chunks\": %d, \"bytes\": %.0f", i ? ", " : "", r->chunks, r->bytes);
        for (int dir = 0; dir < 2; dir++) {
            const double plain = gbps(r->bytes, r->plain_ms[dir]);
            printf(", \"%s\": {\"transfer_ms\": %.4f, \"transfer_gbps\": %.3f, \"transfer_of_plain\": %.4f, "
                   "\"transfer_calls\": %llu, \"transfer_issue_ms\": %.4f, \"per_chunk_ms\": %.4f, "
                   "\"per_chunk_gbps\": %.3f, \"per_chunk_of_plain\": %.4f, \"per_chunk_calls\": %llu, "
                   "\"per_chunk_issue_ms\": %.4f, \"plain_ms\": %.4f, \"plain_gbps\": %.3f, \"plain_calls\": %llu}",
                   keys[dir], r->transfer_ms[dir], gbps(r->bytes, r->transfer_ms[dir]),
                   gbps(r->bytes, r->transfer_ms[dir]) / plain, (unsigned long long)r->transfer_calls[dir],
                   r->transfer_issue_ms[dir], r->per_chunk_ms[dir], gbps(r->bytes, r->per_chunk_ms[dir]),
                   gbps(r->bytes, r->per_chunk_ms[dir]) / plain, (unsigned long long)r->per_chunk_calls[dir],
                   r->per_chunk_issue_ms[dir], r->plain_ms[dir], plain, (unsigned long long)r->plain_calls[dir]);
        }
        printf("}");
    }
    const bench_swap_pipeline *pl = &rep->pipeline;
    const double longer = pl->copy_ms > pl->compute_ms ? pl->copy_ms : pl->compute_ms;
    printf("], \"pipeline\": {\"layers\": %d, \"chunks\": %d, \"queries\": %d, \"bytes\": %.0f, \"copy_ms\": %.4f, "
           "\"compute_ms\": %.4f, \"pipelined_ms\": %.4f, \"of_max\": %.4f, \"of_sum\": %.4f}}",
           pl->layers, pl->chunks, pl->queries, pl->bytes, pl->copy_ms, pl->compute_ms, pl->pipelined_ms,
           pl->pipelined_ms / longer, pl->pipelined_ms / (pl->copy_ms + pl->compute_ms));
}
