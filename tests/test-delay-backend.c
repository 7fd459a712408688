/* The delay backend, which the engine's pipelining test relies on: its copy
 * queue is really asynchronous and in order, host->device copies take the
 * delay they are given, compute overlaps them, copied bytes land, and the
 * order check passes when attention waits for its copies and fails when it
 * does not. Timings are asserted with wide margins (the machine is shared);
 * the lower bounds are exact, since every delay is a sleep to a deadline. */
#include "delay-backend.h"
#include "tap.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 4
#define HEAD_DIM 16
#define SLOT_FLOATS (2 * CHUNK * HEAD_DIM) /* one kv head, f32 */
#define SLOT_BYTES (SLOT_FLOATS * 4)
#define N_SLOTS 16
#define N_COPIES 8
#define DELAY_MS 10.0
#define TIMING_ATTEMPTS 3 /* runs of a step bounded by one delay (fastest_ms) */

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

typedef struct fixture {
    pv_backend *be;
    pv_buffer *src;     /* host: what copies bring in */
    pv_buffer *pool;    /* device: the KV pool */
    pv_buffer *staging; /* device: swap-in through slot_scatter */
    pv_buffer *q, *out;
    float *pattern;     /* src's contents */
} fixture;

static pv_buffer *buffer(pv_backend *be, pv_mem_kind kind, uint64_t bytes)
{
    pv_buffer *b = NULL;
    if (pv_buffer_init(&b, be, kind, bytes) != PV_OK) {
        printf("Bail out! %s\n", pv_last_error());
        exit(1);
    }
    return b;
}

/* The fastest of up to TIMING_ATTEMPTS runs of `step`, stopping at the
 * first under one delay or at a failure (*st): a busy machine may hold
 * up any one run. */
static double fastest_ms(fixture *f, pv_status (*step)(fixture *f, void *arg), void *arg, pv_status *st)
{
    double best = HUGE_VAL;
    for (int attempt = 0; attempt < TIMING_ATTEMPTS && *st == PV_OK && best >= DELAY_MS; attempt++) {
        const double t0 = now_ms();
        *st = step(f, arg);
        const double ms = now_ms() - t0;
        best = ms < best ? ms : best;
    }
    return best;
}

/* One device->host copy of the first N_COPIES slots into `back`, waited. */
static pv_status copy_back(fixture *f, void *back)
{
    pv_event *done = NULL;
    pv_status st = pv_copy_async(PV_QUEUE_COPY, back, 0, f->pool, 0, N_COPIES * SLOT_BYTES, NULL, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    pv_event_free(done);
    return st;
}

/* A compute-queue event that both queues wait for, waited. */
static pv_status compute_event(fixture *f, void *unused)
{
    (void)unused;
    pv_event *compute = NULL;
    pv_status st = pv_event_record(f->be, PV_QUEUE_COMPUTE, &compute);
    if (st == PV_OK)
        st = pv_queue_wait(f->be, PV_QUEUE_COPY, compute);
    if (st == PV_OK)
        st = pv_queue_wait(f->be, PV_QUEUE_COMPUTE, compute);
    if (st == PV_OK)
        st = pv_event_wait(compute);
    pv_event_free(compute);
    return st;
}

static void fixture_init(fixture *f)
{
    pv_delay_options o = {.h2d_delay_s = DELAY_MS / 1e3, .attention_delay_s = DELAY_MS / 1e3};
    if (pv_delay_backend_init(&f->be, &o) != PV_OK) {
        printf("Bail out! %s\n", pv_last_error());
        exit(1);
    }
    f->src = buffer(f->be, PV_MEM_HOST, N_SLOTS * SLOT_BYTES);
    f->pool = buffer(f->be, PV_MEM_DEVICE, N_SLOTS * SLOT_BYTES);
    f->staging = buffer(f->be, PV_MEM_DEVICE, SLOT_BYTES);
    f->q = buffer(f->be, PV_MEM_DEVICE, HEAD_DIM * 4);
    f->out = buffer(f->be, PV_MEM_DEVICE, HEAD_DIM * 4);
    f->pattern = malloc(N_SLOTS * SLOT_BYTES);
    if (!f->pattern) {
        printf("Bail out! out of memory\n");
        exit(1);
    }
    for (int i = 0; i < N_SLOTS * SLOT_FLOATS; i++)
        f->pattern[i] = (float)(i % 97) / 97.0f;
    float *zero = calloc(N_SLOTS, SLOT_BYTES);
    if (!zero) {
        printf("Bail out! out of memory\n");
        exit(1);
    }
    pv_buffer_write(f->src, 0, f->pattern, N_SLOTS * SLOT_BYTES);
    pv_buffer_write(f->pool, 0, zero, N_SLOTS * SLOT_BYTES);
    pv_buffer_write(f->q, 0, f->pattern, HEAD_DIM * 4);
    free(zero);
}

static void fixture_free(fixture *f)
{
    pv_buffer_free(f->src);
    pv_buffer_free(f->pool);
    pv_buffer_free(f->staging);
    pv_buffer_free(f->q);
    pv_buffer_free(f->out);
    pv_delay_backend_free(f->be);
    free(f->pattern);
}

/* Host->device copy of src's slot `from` into pool slot `to`. */
static pv_status copy_slot(fixture *f, int to, int from, pv_event **done)
{
    return pv_copy_async(PV_QUEUE_COPY, f->pool, (uint64_t)to * SLOT_BYTES, f->src,
                         (uint64_t)from * SLOT_BYTES, SLOT_BYTES, NULL, done);
}

/* One query at the last row of a one-chunk sequence: reads exactly `slot`. */
static pv_status attend(fixture *f, int32_t slot)
{
    int32_t seq = 0, pos = CHUNK - 1;
    pv_attention_args a = {
        .kv_dtype = PV_F32, .n_tokens = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = HEAD_DIM,
        .chunk_tokens = CHUNK, .scale = 0.25f, .q = f->q, .kv_pool = f->pool, .n_slots = N_SLOTS,
        .token_seq = &seq, .token_pos = &pos, .slot_table = &slot, .n_seqs = 1, .max_chunks = 1,
        .out = f->out,
    };
    return pv_attention(f->be, &a);
}

static int pool_slot_is(fixture *f, int slot, int from)
{
    float got[SLOT_FLOATS];
    pv_buffer_read(f->pool, (uint64_t)slot * SLOT_BYTES, got, SLOT_BYTES);
    return memcmp(got, f->pattern + from * SLOT_FLOATS, SLOT_BYTES) == 0;
}

/* (1) and (4): the copy queue is asynchronous, in order, delayed, correct. */
static void test_queue(fixture *f)
{
    pv_event *ev[N_COPIES] = {0};
    double t0 = now_ms();
    pv_status st = PV_OK;
    for (int i = 0; i < N_COPIES && st == PV_OK; i++)
        st = copy_slot(f, i, i, &ev[i]);
    double enqueue_ms = now_ms() - t0;
    ok(st == PV_OK, "%d host->device copies queued", N_COPIES);
    ok(enqueue_ms < N_COPIES * DELAY_MS / 4, "queueing them took %.3f ms, not their %.0f ms", enqueue_ms,
       N_COPIES * DELAY_MS);
    int done_before = 1, done_after = 0;
    pv_event_query(ev[N_COPIES - 1], &done_before);
    pv_event_wait(ev[N_COPIES - 1]);
    double landed_ms = now_ms() - t0;
    pv_event_query(ev[N_COPIES - 1], &done_after);
    ok(!done_before && done_after, "event_query: the last copy is pending before the wait, done after");
    ok(landed_ms >= N_COPIES * DELAY_MS && landed_ms < 3 * N_COPIES * DELAY_MS,
       "waiting on the last one returns after %.1f ms (%d x %.0f ms, in order)", landed_ms, N_COPIES,
       DELAY_MS);
    ok(pv_delay_backend_delayed_copies(f->be) == N_COPIES, "%lld delayed copies counted",
       (long long)pv_delay_backend_delayed_copies(f->be));
    double busy_ms = pv_delay_backend_copy_busy_s(f->be) * 1e3;
    ok(busy_ms >= N_COPIES * DELAY_MS && busy_ms <= landed_ms, "copy queue busy %.1f ms", busy_ms);
    int landed = 1;
    for (int i = 0; i < N_COPIES; i++)
        landed &= pool_slot_is(f, i, i);
    ok(landed, "every copied slot holds its bytes");
    for (int i = 0; i < N_COPIES; i++)
        pv_event_free(ev[i]);

    /* Device->host copies are not delayed: the counter says so, and the
     * fastest copy takes less than one delay. */
    pv_buffer *back = buffer(f->be, PV_MEM_HOST, N_COPIES * SLOT_BYTES);
    const double d2h_ms = fastest_ms(f, copy_back, back, &st);
    float *got = malloc(N_COPIES * SLOT_BYTES);
    if (got)
        pv_buffer_read(back, 0, got, N_COPIES * SLOT_BYTES);
    ok(st == PV_OK && d2h_ms < DELAY_MS && got &&
           memcmp(got, f->pattern, N_COPIES * SLOT_BYTES) == 0 &&
           pv_delay_backend_delayed_copies(f->be) == N_COPIES,
       "a device->host copy is not delayed (%.3f ms, the fastest of up to %d) and brings the bytes back",
       d2h_ms, TIMING_ATTEMPTS);
    free(got);
    pv_buffer_free(back);

    /* A compute-queue copy waits for its `wait` event: slot 9 <- slot 8
     * after slot 8's delayed copy. */
    pv_event *in8 = NULL, *moved = NULL;
    t0 = now_ms();
    st = copy_slot(f, 8, 8, &in8);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COMPUTE, f->pool, 9 * SLOT_BYTES, f->pool, 8 * SLOT_BYTES, SLOT_BYTES,
                           in8, &moved);
    double chained_ms = now_ms() - t0;
    ok(st == PV_OK && chained_ms >= DELAY_MS && pool_slot_is(f, 9, 8),
       "a compute-queue copy waits for its copy-queue event (%.1f ms) and sees its bytes", chained_ms);
    pv_event_free(in8);
    pv_event_free(moved);

    /* event_record on the copy queue covers everything queued before it;
     * the compute queue's events are complete at once. */
    pv_event *all = NULL;
    t0 = now_ms();
    for (int i = 10; i < 13 && st == PV_OK; i++)
        st = copy_slot(f, i, i, NULL);
    if (st == PV_OK)
        st = pv_event_record(f->be, PV_QUEUE_COPY, &all);
    if (st == PV_OK)
        st = pv_event_wait(all);
    double recorded_ms = now_ms() - t0;
    ok(st == PV_OK && recorded_ms >= 3 * DELAY_MS && pool_slot_is(f, 10, 10) && pool_slot_is(f, 12, 12),
       "a copy-queue event completes with the copies before it (%.1f ms)", recorded_ms);
    const double compute_ms = fastest_ms(f, compute_event, NULL, &st);
    ok(st == PV_OK && compute_ms < DELAY_MS, "a compute event is complete at once (%.3f ms, the fastest of up to %d)",
       compute_ms, TIMING_ATTEMPTS);
    pv_event_free(all);

    /* finish drains the copy queue. */
    t0 = now_ms();
    st = copy_slot(f, 13, 13, NULL);
    if (st == PV_OK)
        st = pv_backend_finish(f->be);
    ok(st == PV_OK && now_ms() - t0 >= DELAY_MS && pool_slot_is(f, 13, 13), "finish waits for the copy queue");
}

/* (2): compute runs while copies are in flight: max, not sum. The times
 * are those measured in this run, so a loaded machine that stretches them
 * stretches the bound too: the overlap must hide at least half of the
 * shorter of the two (run one after the other, it would hide none). */
static void test_overlap(fixture *f)
{
    pv_status st = attend(f, 0); /* starts the thread pools outside the timing */
    pv_delay_backend_reset(f->be);
    double t0 = now_ms(), compute_ms = 0;
    for (int i = 0; i < N_COPIES && st == PV_OK; i++)
        st = copy_slot(f, N_COPIES + i, i, NULL);
    /* Attention over slots 0..7, which are already there. */
    for (int i = 0; i < N_COPIES && st == PV_OK; i++) {
        double t = now_ms();
        st = attend(f, i);
        compute_ms += now_ms() - t;
    }
    if (st == PV_OK)
        st = pv_backend_finish(f->be);
    double wall_ms = now_ms() - t0;
    double copy_ms = pv_delay_backend_copy_busy_s(f->be) * 1e3;
    ok(st == PV_OK, "%d copies and %d attention calls ran", N_COPIES, N_COPIES);
    double longer = copy_ms > compute_ms ? copy_ms : compute_ms;
    double shorter = copy_ms + compute_ms - longer;
    ok(copy_ms >= N_COPIES * DELAY_MS && compute_ms >= N_COPIES * DELAY_MS &&
           wall_ms < longer + shorter / 2,
       "copies and compute overlap: %.1f ms; copies %.1f ms, compute %.1f ms, sum %.1f ms", wall_ms,
       copy_ms, compute_ms, copy_ms + compute_ms);
    ok(pv_delay_backend_attention_calls(f->be) == N_COPIES, "%lld attention calls counted",
       (long long)pv_delay_backend_attention_calls(f->be));
    char msg[512];
    st = pv_delay_backend_check_order(f->be, msg, sizeof msg);
    ok(st == PV_OK, "copies into slots nobody reads are no violation: %s", msg);
}

static int contains(const char *s, const char *part)
{
    return strstr(s, part) != NULL;
}

/* (3): the order check passes with the wait and fails without it. */
static void test_check_order(fixture *f)
{
    char msg[512];
    pv_delay_backend_reset(f->be);
    pv_event *ev = NULL;
    pv_status st = copy_slot(f, 0, 5, &ev);
    if (st == PV_OK)
        st = pv_queue_wait(f->be, PV_QUEUE_COMPUTE, ev);
    if (st == PV_OK)
        st = attend(f, 0);
    pv_event_free(ev);
    ok(st == PV_OK && pool_slot_is(f, 0, 5), "attention after queue_wait on its copy's event ran");
    st = pv_delay_backend_check_order(f->be, msg, sizeof msg);
    ok(st == PV_OK, "check_order passes: %s", msg);

    /* The same without the wait: attention call 2 reads slot 1 early. Three
     * copies ahead of it keep it in flight past the attention's own delay. */
    ev = NULL;
    for (int i = 0; i < 3 && st == PV_OK; i++)
        st = copy_slot(f, 14, 14, NULL);
    if (st == PV_OK)
        st = copy_slot(f, 1, 6, &ev);
    if (st == PV_OK)
        st = attend(f, 1);
    ok(st == PV_OK, "attention without the wait ran");
    st = pv_delay_backend_check_order(f->be, msg, sizeof msg);
    /* Usually still in flight here; on a loaded machine it may have landed
     * already, which must fail all the same. */
    ok(st == PV_ERR_STATE && contains(msg, "attention call 2") && contains(msg, "slot 1") &&
           (contains(msg, "still in flight") || contains(msg, "landed at")),
       "check_order fails when attention skipped the wait: %s", msg);
    pv_event_wait(ev);
    pv_event_free(ev);
    st = pv_delay_backend_check_order(f->be, msg, sizeof msg);
    ok(st == PV_ERR_STATE && contains(msg, "landed at") && contains(pv_last_error(), "attention call 2"),
       "and after it landed: %s", msg);

    /* Swap-in through a staging buffer: slot_scatter is checked too. */
    pv_delay_backend_reset(f->be);
    int32_t slot = 2;
    pv_slot_copy_args scatter = {
        .dtype = PV_F32, .slot_elems = SLOT_FLOATS, .pool = f->pool, .n_slots = N_SLOTS,
        .staging = f->staging, .slots = &slot, .n_slots_moved = 1,
    };
    ev = NULL;
    st = pv_copy_async(PV_QUEUE_COPY, f->staging, 0, f->src, 7 * SLOT_BYTES, SLOT_BYTES, NULL, &ev);
    if (st == PV_OK)
        st = pv_queue_wait(f->be, PV_QUEUE_COMPUTE, ev);
    if (st == PV_OK)
        st = pv_slot_scatter(f->be, &scatter);
    pv_event_free(ev);
    ok(st == PV_OK && pool_slot_is(f, 2, 7) && pv_delay_backend_check_order(f->be, msg, sizeof msg) == PV_OK,
       "a scatter after its staging copy's event passes: %s", msg);
    st = pv_copy_async(PV_QUEUE_COPY, f->staging, 0, f->src, 8 * SLOT_BYTES, SLOT_BYTES, NULL, NULL);
    if (st == PV_OK)
        st = pv_slot_scatter(f->be, &scatter);
    pv_backend_finish(f->be);
    st = pv_delay_backend_check_order(f->be, msg, sizeof msg);
    ok(st == PV_ERR_STATE && contains(msg, "slot_scatter call 2"), "a scatter without it fails: %s", msg);
}

int main(void)
{
    pv_backend *be = NULL;
    pv_delay_options bad = {.h2d_delay_s = -1};
    ok(pv_delay_backend_init(&be, &bad) == PV_ERR_INVALID_ARG && !be, "a negative delay is refused: %s",
       pv_last_error());
    ok(pv_delay_backend_init(&be, NULL) == PV_OK && be, "no options: no delays");
    pv_delay_backend_free(be);

    fixture f;
    fixture_init(&f);
    ok(f.pool->backend == f.be && strcmp(f.be->ops->name, "delay") == 0,
       "buffers dispatch through the delay backend");
    test_queue(&f);
    test_overlap(&f);
    test_check_order(&f);
    fixture_free(&f);
    return tap_done();
}
