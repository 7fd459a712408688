/* The delay backend (see delay-backend.h): the CPU backend's ops, except
 * that copies and slot transfers on PV_QUEUE_COPY go to a worker thread
 * and every op that consumes swapped-in bytes is recorded for
 * pv_delay_backend_check_order().
 *
 * Events are tickets of the copy queue: job n completes ticket n, jobs run
 * in order, so an event with ticket t is complete once `completed` >= t.
 * Compute runs on the caller's thread before each call returns, so compute
 * events are ticket 0 (complete at birth). */
#include "delay-backend.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A delay longer than this is a mistake in the test, not a slow device. */
#define MAX_DELAY_S 60.0

typedef struct dly_event {
    pv_event pub; /* first, so a pv_event * is a dly_event * */
    uint64_t ticket;
} dly_event;

/* One move of `bytes` bytes of a job. */
typedef struct dly_move {
    uint64_t dst_off, src_off;
} dly_move;

/* A copy (one move) or a slot transfer (a move a slot) waiting for, or
 * being run by, the worker; the moves follow the struct. */
typedef struct dly_job {
    struct dly_job *next;
    uint64_t ticket;
    pv_buffer *dst;
    const pv_buffer *src;
    uint64_t bytes; /* of each move */
    int delayed;
    size_t record; /* its first entry in copies[], one a move */
    size_t n_moves;
    dly_move moves[];
} dly_job;

/* Ordering uses `seq`, drawn from one counter under the mutex, not the
 * times: two clock readings may tie, two draws never do. Times (ms since
 * the origin) are for messages and for the tests' timings. */
typedef struct dly_copy_rec {
    const pv_buffer *dst;
    uint64_t lo, hi;           /* destination bytes [lo, hi) */
    uint64_t enq_seq, done_seq; /* done_seq 0: not landed yet */
    double enq_ms, done_ms;
} dly_copy_rec;

typedef struct dly_range {
    uint64_t lo, hi;
} dly_range;

/* A compute op that reads bytes a copy may write: an attention call (its
 * slots of kv_pool) or a slot_scatter (its staging bytes). */
typedef struct dly_read_rec {
    const char *op;
    int64_t call;        /* 1-based, per op */
    const pv_buffer *buf;
    uint64_t slot_bytes; /* attention: to name the slot; scatter: 0 */
    uint64_t seq;
    double start_ms;
    size_t first_range, n_ranges; /* sorted, disjoint, in ranges[] */
} dly_read_rec;

typedef struct dly_state {
    pv_backend_ops ops; /* the CPU's, with this file's overrides */
    pv_backend *cpu;
    pv_delay_options opt;

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* the worker: a job arrived, or stop */
    pthread_cond_t done_cv; /* waiters: a ticket completed */
    pthread_t worker;
    dly_job *head, *tail;
    uint64_t enqueued, completed;
    int stop;

    /* The timeline, guarded by mu. */
    struct timespec origin;
    uint64_t seq;
    dly_copy_rec *copies;
    size_t n_copies, cap_copies;
    dly_read_rec *reads;
    size_t n_reads, cap_reads;
    dly_range *ranges;
    size_t n_ranges, cap_ranges;
    int64_t delayed_copies, attention_calls, scatter_calls;
    double busy_s;
    int64_t host_buffers_left; /* < 0: no limit (pv_delay_backend_limit_host_buffers) */
    int64_t host_buffers;      /* allocated since init */
} dly_state;

static dly_state *state_of(pv_backend *be)
{
    return be->impl;
}

static double ms_since(const struct timespec *origin)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - origin->tv_sec) * 1e3 + (double)(now.tv_nsec - origin->tv_nsec) / 1e6;
}

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long ns = (long long)(s * 1e9) + until.tv_nsec;
    until.tv_sec += (time_t)(ns / 1000000000);
    until.tv_nsec = (long)(ns % 1000000000);
    /* Absolute, so a signal does not stretch the delay when it restarts. */
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
        ;
}

/* Makes room for one more element of an array of `size`-byte elements. */
static int reserve(void **arr, size_t *cap, size_t n, size_t need, size_t size)
{
    if (n + need <= *cap)
        return 1;
    size_t new_cap = *cap ? *cap * 2 : 64;
    while (new_cap < n + need)
        new_cap *= 2;
    void *p = realloc(*arr, new_cap * size);
    if (!p)
        return 0;
    *arr = p;
    *cap = new_cap;
    return 1;
}

/* Blocks until every copy-queue job up to `ticket` has run; mu held. */
static void wait_ticket_locked(dly_state *d, uint64_t ticket)
{
    while (d->completed < ticket)
        pthread_cond_wait(&d->done_cv, &d->mu);
}

static void wait_ticket(dly_state *d, uint64_t ticket)
{
    pthread_mutex_lock(&d->mu);
    wait_ticket_locked(d, ticket);
    pthread_mutex_unlock(&d->mu);
}

static void *worker_main(void *arg)
{
    dly_state *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->head && !d->stop)
            pthread_cond_wait(&d->work_cv, &d->mu);
        dly_job *job = d->head;
        if (!job)
            break; /* stopping, and everything enqueued has run */
        d->head = job->next;
        if (!d->head)
            d->tail = NULL;
        pthread_mutex_unlock(&d->mu);

        struct timespec start;
        clock_gettime(CLOCK_MONOTONIC, &start);
        if (job->delayed)
            sleep_s(d->opt.h2d_delay_s * (double)job->n_moves);
        for (size_t i = 0; i < job->n_moves; i++)
            memmove((char *)job->dst->host_ptr + job->moves[i].dst_off,
                    (const char *)job->src->host_ptr + job->moves[i].src_off, (size_t)job->bytes);

        pthread_mutex_lock(&d->mu);
        d->busy_s += ms_since(&start) / 1e3;
        const uint64_t done_seq = ++d->seq;
        const double done_ms = ms_since(&d->origin);
        for (size_t i = 0; i < job->n_moves; i++) {
            d->copies[job->record + i].done_seq = done_seq;
            d->copies[job->record + i].done_ms = done_ms;
        }
        d->completed = job->ticket;
        pthread_cond_broadcast(&d->done_cv);
        free(job);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static pv_status event_new(pv_backend *be, uint64_t ticket, pv_event **out)
{
    dly_event *ev = malloc(sizeof *ev);
    if (!ev)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay: cannot allocate an event");
    ev->pub.backend = be;
    ev->pub.handle = NULL;
    ev->ticket = ticket;
    *out = &ev->pub;
    return PV_OK;
}

static uint64_t ticket_of(const pv_event *ev)
{
    return ev ? ((const dly_event *)ev)->ticket : 0;
}

/* Queues a job of n moves of `bytes` from src to dst on the copy queue
 * (their offsets in moves[]); *done (if done) gets its ticket. Everything
 * that can fail comes before the job is queued. */
static pv_status enqueue_job(pv_backend *be, pv_buffer *dst, const pv_buffer *src, uint64_t bytes,
                             const dly_move *moves, size_t n, pv_event **done)
{
    dly_state *d = state_of(be);
    pv_event *ev = NULL;
    if (done && event_new(be, 0, &ev) != PV_OK)
        return PV_ERR_OUT_OF_MEMORY;
    dly_job *job = calloc(1, sizeof *job + n * sizeof *moves);
    pthread_mutex_lock(&d->mu);
    if (!job || !reserve((void **)&d->copies, &d->cap_copies, d->n_copies, n, sizeof *d->copies)) {
        pthread_mutex_unlock(&d->mu);
        free(job);
        free(ev);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay: cannot queue %zu moves of %" PRIu64 " bytes", n, bytes);
    }
    job->ticket = ++d->enqueued;
    job->dst = dst;
    job->src = src;
    job->bytes = bytes;
    job->delayed = src->kind == PV_MEM_HOST && dst->kind == PV_MEM_DEVICE;
    job->record = d->n_copies;
    job->n_moves = n;
    memcpy(job->moves, moves, n * sizeof *moves);
    const uint64_t enq_seq = ++d->seq;
    const double enq_ms = ms_since(&d->origin);
    for (size_t i = 0; i < n; i++)
        d->copies[d->n_copies++] = (dly_copy_rec){
            .dst = dst, .lo = moves[i].dst_off, .hi = moves[i].dst_off + bytes,
            .enq_seq = enq_seq, .enq_ms = enq_ms,
        };
    d->delayed_copies += job->delayed ? (int64_t)n : 0;
    if (d->tail)
        d->tail->next = job;
    else
        d->head = job;
    d->tail = job;
    pthread_cond_signal(&d->work_cv);
    if (ev) {
        ((dly_event *)ev)->ticket = job->ticket; /* before unlocking: then job may be freed */
        *done = ev;
    }
    pthread_mutex_unlock(&d->mu);
    return PV_OK;
}

/* A `wait` event is either a compute event (complete) or an earlier ticket
 * of the copy queue, which runs in order: on PV_QUEUE_COPY it is honoured
 * by the queue's order itself, on PV_QUEUE_COMPUTE by blocking here. */
static pv_status dly_copy_async(pv_backend *be, pv_queue q, pv_buffer *dst, uint64_t dst_off,
                                const pv_buffer *src, uint64_t src_off, uint64_t bytes, pv_event *wait,
                                pv_event **done)
{
    dly_state *d = state_of(be);
    be->copies++;
    if (q == PV_QUEUE_COMPUTE) {
        wait_ticket(d, ticket_of(wait));
        memmove((char *)dst->host_ptr + dst_off, (const char *)src->host_ptr + src_off, (size_t)bytes);
        return done ? event_new(be, 0, done) : PV_OK;
    }
    const dly_move move = {dst_off, src_off};
    return enqueue_job(be, dst, src, bytes, &move, 1, done);
}

/* One job for all the slots, one launch as on the CPU; the copy queue's
 * order honours `wait` as for a copy. A host -> device transfer sleeps
 * h2d_delay_s a slot, as that many copies would. */
static pv_status dly_slot_transfer(pv_backend *be, const pv_slot_transfer_args *a, pv_event *wait, pv_event **done)
{
    (void)wait;
    be->launches++;
    const uint64_t slot_bytes = (uint64_t)a->slot_elems * pv_dtype_size(a->dtype);
    dly_move *moves = malloc(((size_t)a->n + 1) * sizeof *moves);
    if (!moves)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay: cannot list %d slot moves", a->n);
    for (int32_t i = 0; i < a->n; i++)
        moves[i] = (dly_move){(uint64_t)a->dst_slots[i] * slot_bytes, (uint64_t)a->src_slots[i] * slot_bytes};
    pv_status st = enqueue_job(be, a->dst, a->src, slot_bytes, moves, (size_t)a->n, done);
    free(moves);
    return st;
}

static pv_status dly_event_record(pv_backend *be, pv_queue q, pv_event **out)
{
    dly_state *d = state_of(be);
    if (q == PV_QUEUE_COMPUTE)
        return event_new(be, 0, out);
    pthread_mutex_lock(&d->mu);
    uint64_t ticket = d->enqueued;
    pthread_mutex_unlock(&d->mu);
    return event_new(be, ticket, out);
}

/* Compute is synchronous, so gating later compute means blocking the
 * caller. The copy queue needs nothing: see dly_copy_async. */
static pv_status dly_queue_wait(pv_backend *be, pv_queue q, pv_event *ev)
{
    if (q == PV_QUEUE_COMPUTE)
        wait_ticket(state_of(be), ticket_of(ev));
    return PV_OK;
}

static pv_status dly_event_wait(pv_backend *be, pv_event *ev)
{
    wait_ticket(state_of(be), ticket_of(ev));
    return PV_OK;
}

static pv_status dly_event_query(pv_backend *be, pv_event *ev, int *done)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    *done = d->completed >= ticket_of(ev);
    pthread_mutex_unlock(&d->mu);
    return PV_OK;
}

static void dly_event_free(pv_backend *be, pv_event *ev)
{
    free(ev);
}

static pv_status dly_finish(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    wait_ticket_locked(d, d->enqueued);
    pthread_mutex_unlock(&d->mu);
    return PV_OK;
}

static int cmp_range(const void *a, const void *b)
{
    const dly_range *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Appends a read record whose byte ranges are ranges[0..n) (any order,
 * possibly overlapping); sorts and merges them. */
static pv_status record_read(dly_state *d, const char *op, int64_t *counter, const pv_buffer *buf,
                             uint64_t slot_bytes, dly_range *ranges, size_t n)
{
    qsort(ranges, n, sizeof *ranges, cmp_range);
    size_t merged = 0;
    for (size_t i = 0; i < n; i++) {
        if (merged && ranges[i].lo <= ranges[merged - 1].hi) {
            if (ranges[i].hi > ranges[merged - 1].hi)
                ranges[merged - 1].hi = ranges[i].hi;
        } else {
            ranges[merged++] = ranges[i];
        }
    }
    pthread_mutex_lock(&d->mu);
    if (!reserve((void **)&d->reads, &d->cap_reads, d->n_reads, 1, sizeof *d->reads) ||
        !reserve((void **)&d->ranges, &d->cap_ranges, d->n_ranges, merged, sizeof *d->ranges)) {
        pthread_mutex_unlock(&d->mu);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay: cannot record a %s call", op);
    }
    if (merged)
        memcpy(d->ranges + d->n_ranges, ranges, merged * sizeof *ranges);
    d->reads[d->n_reads++] = (dly_read_rec){
        .op = op, .call = ++*counter, .buf = buf, .slot_bytes = slot_bytes,
        .seq = ++d->seq, .start_ms = ms_since(&d->origin),
        .first_range = d->n_ranges, .n_ranges = merged,
    };
    d->n_ranges += merged;
    pthread_mutex_unlock(&d->mu);
    return PV_OK;
}

/* The slots the CPU kernel reads: for each sequence with a query, chunks 0
 * up to its highest query position's chunk (the front end has checked that
 * those have slots). */
static pv_status dly_attention(pv_backend *be, const pv_attention_args *a)
{
    dly_state *d = state_of(be);
    uint64_t slot_bytes = 2 * (uint64_t)a->chunk_tokens * (uint64_t)a->n_kv_heads *
                          (uint64_t)a->head_dim * pv_dtype_size(a->kv_dtype);
    int32_t *max_pos = malloc((size_t)a->n_seqs * sizeof *max_pos);
    dly_range *ranges = malloc(((size_t)a->n_seqs * (size_t)a->max_chunks) * sizeof *ranges);
    if (!max_pos || !ranges) {
        free(max_pos);
        free(ranges);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay: cannot record an attention call");
    }
    for (int32_t s = 0; s < a->n_seqs; s++)
        max_pos[s] = -1;
    for (int32_t i = 0; i < a->n_tokens; i++)
        if (a->token_pos[i] > max_pos[a->token_seq[i]])
            max_pos[a->token_seq[i]] = a->token_pos[i];
    size_t n = 0;
    for (int32_t s = 0; s < a->n_seqs; s++) {
        if (max_pos[s] < 0)
            continue;
        for (int32_t c = 0; c <= max_pos[s] / a->chunk_tokens; c++) {
            uint64_t slot = (uint64_t)a->slot_table[(int64_t)s * a->max_chunks + c];
            ranges[n++] = (dly_range){slot * slot_bytes, (slot + 1) * slot_bytes};
        }
    }
    pv_status st = record_read(d, "attention", &d->attention_calls, a->kv_pool, slot_bytes, ranges, n);
    free(max_pos);
    free(ranges);
    if (st != PV_OK)
        return st;
    sleep_s(d->opt.attention_delay_s);
    return d->cpu->ops->attention(be, a);
}

/* Swap-in through a staging buffer: the scatter reads what the copy wrote. */
static pv_status dly_slot_scatter(pv_backend *be, const pv_slot_copy_args *a)
{
    dly_state *d = state_of(be);
    uint64_t elem = pv_dtype_size(a->dtype);
    dly_range range = {
        a->staging_off * elem,
        (a->staging_off + (uint64_t)a->n_slots_moved * (uint64_t)a->slot_elems) * elem,
    };
    pv_status st = record_read(d, "slot_scatter", &d->scatter_calls, a->staging, 0, &range, 1);
    if (st != PV_OK)
        return st;
    return d->cpu->ops->slot_scatter(be, a);
}

/* The CPU's qmatmul keeps a scratch buffer in its own backend state: it
 * runs on the wrapped CPU backend (CPU buffers are plain host memory). */
static pv_status dly_qmatmul(pv_backend *be, const pv_qmatmul_args *a)
{
    return state_of(be)->cpu->ops->qmatmul(state_of(be)->cpu, a);
}

static pv_status dly_qmatmul_group(pv_backend *be, const pv_qmatmul_args *products, int n)
{
    return state_of(be)->cpu->ops->qmatmul_group(state_of(be)->cpu, products, n);
}

static pv_status dly_qmatmul_swiglu(pv_backend *be, const pv_qmatmul_swiglu_args *a)
{
    return state_of(be)->cpu->ops->qmatmul_swiglu(state_of(be)->cpu, a);
}

/* The CPU's weight layout depends on its own state: writes and gathers of
 * weights run on the wrapped backend too. */
static pv_status dly_weights_write(pv_backend *be, pv_buffer *dst, uint64_t dst_off, pv_wtype t, int64_t n_rows,
                                   int64_t n_cols, const void *src)
{
    return state_of(be)->cpu->ops->weights_write(state_of(be)->cpu, dst, dst_off, t, n_rows, n_cols, src);
}

static pv_status dly_embed_gather(pv_backend *be, const pv_embed_gather_args *a)
{
    return state_of(be)->cpu->ops->embed_gather(state_of(be)->cpu, a);
}

static void dly_free(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->work_cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->worker, NULL); /* it drains the queue before it exits */
    pthread_cond_destroy(&d->done_cv);
    pthread_cond_destroy(&d->work_cv);
    pthread_mutex_destroy(&d->mu);
    free(d->copies);
    free(d->reads);
    free(d->ranges);
    pv_backend_free(d->cpu);
    free(d);
    be->impl = NULL;
}

/* The options o stands for (NULL: no delays), if they are sane. */
static pv_status delays_of(const char *fn, const pv_delay_options *o, pv_delay_options *opt)
{
    *opt = o ? *o : (pv_delay_options){0};
    if (!(opt->h2d_delay_s >= 0 && opt->h2d_delay_s <= MAX_DELAY_S) ||
        !(opt->attention_delay_s >= 0 && opt->attention_delay_s <= MAX_DELAY_S))
        return pv_error(PV_ERR_INVALID_ARG, "%s: delays h2d %g s, attention %g s must be in [0, %g]", fn,
                        opt->h2d_delay_s, opt->attention_delay_s, MAX_DELAY_S);
    return PV_OK;
}

static pv_status dly_buffer_alloc(pv_backend *be, pv_mem_kind kind, uint64_t bytes, pv_buffer *buf)
{
    dly_state *d = state_of(be);
    if (kind == PV_MEM_HOST && d->host_buffers_left == 0)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "delay buffer_alloc: host buffer of %llu bytes refused (the "
                        "test's limit)", (unsigned long long)bytes);
    pv_status st = d->cpu->ops->buffer_alloc(be, kind, bytes, buf);
    if (st == PV_OK && kind == PV_MEM_HOST) {
        d->host_buffers++;
        if (d->host_buffers_left > 0)
            d->host_buffers_left--;
    }
    return st;
}

int64_t pv_delay_backend_host_buffers(pv_backend *be)
{
    return state_of(be)->host_buffers;
}

void pv_delay_backend_limit_host_buffers(pv_backend *be, int64_t n)
{
    state_of(be)->host_buffers_left = n < 0 ? -1 : n;
}

pv_status pv_delay_backend_init(pv_backend **out, const pv_delay_options *o)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_delay_backend_init: out is NULL");
    *out = NULL;
    pv_delay_options opt;
    PV_TRY(delays_of("pv_delay_backend_init", o, &opt));
    pv_backend *cpu = NULL;
    pv_status st = pv_backend_init(&cpu, "cpu", 0);
    if (st != PV_OK)
        return st;
    dly_state *d = calloc(1, sizeof *d);
    pv_backend *be = calloc(1, sizeof *be);
    if (!d || !be) {
        free(d);
        free(be);
        pv_backend_free(cpu);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_delay_backend_init: cannot allocate the backend");
    }
    d->cpu = cpu;
    d->opt = opt;
    d->ops = *cpu->ops;
    d->ops.name = "delay";
    d->ops.free = dly_free;
    d->ops.copy_async = dly_copy_async;
    d->ops.event_record = dly_event_record;
    d->ops.queue_wait = dly_queue_wait;
    d->ops.event_wait = dly_event_wait;
    d->ops.event_query = dly_event_query;
    d->ops.event_free = dly_event_free;
    d->ops.finish = dly_finish;
    d->ops.attention = dly_attention;
    d->ops.slot_scatter = dly_slot_scatter;
    d->ops.slot_transfer = dly_slot_transfer;
    d->ops.qmatmul = dly_qmatmul;
    d->ops.qmatmul_group = d->ops.qmatmul_group ? dly_qmatmul_group : NULL;
    d->ops.qmatmul_swiglu = dly_qmatmul_swiglu;
    d->ops.weights_write = dly_weights_write;
    d->ops.embed_gather = dly_embed_gather;
    d->ops.buffer_alloc = dly_buffer_alloc;
    d->host_buffers_left = -1;
    clock_gettime(CLOCK_MONOTONIC, &d->origin);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work_cv, NULL);
    pthread_cond_init(&d->done_cv, NULL);
    int rc = pthread_create(&d->worker, NULL, worker_main, d);
    if (rc != 0) {
        pthread_cond_destroy(&d->done_cv);
        pthread_cond_destroy(&d->work_cv);
        pthread_mutex_destroy(&d->mu);
        free(d);
        free(be);
        pv_backend_free(cpu);
        return pv_error(PV_ERR_BACKEND, "pv_delay_backend_init: cannot start the copy thread: %s",
                        strerror(rc));
    }
    /* The CPU's ops ignore be->impl, so they run unchanged on this backend,
     * and buffers allocated through it name it as their backend. */
    be->ops = &d->ops;
    be->device = 0;
    be->info = cpu->info;
    be->impl = d;
    *out = be;
    return PV_OK;
}

void pv_delay_backend_free(pv_backend *be)
{
    pv_backend_free(be);
}

/* The first of r's ranges overlapping [lo, hi), or NULL. */
static const dly_range *overlap(const dly_state *d, const dly_read_rec *r, uint64_t lo, uint64_t hi)
{
    const dly_range *first = d->ranges + r->first_range;
    size_t left = 0, right = r->n_ranges;
    /* The first range ending after lo: ranges are sorted and disjoint. */
    while (left < right) {
        size_t mid = left + (right - left) / 2;
        if (first[mid].hi <= lo)
            left = mid + 1;
        else
            right = mid;
    }
    return left < r->n_ranges && first[left].lo < hi ? &first[left] : NULL;
}

pv_status pv_delay_backend_check_order(pv_backend *be, char *msg, size_t cap)
{
    dly_state *d = state_of(be);
    char text[512];
    pv_status st = PV_OK;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->n_reads && st == PV_OK; i++) {
        const dly_read_rec *r = &d->reads[i];
        for (size_t j = 0; j < d->n_copies; j++) {
            const dly_copy_rec *c = &d->copies[j];
            int landed_before = c->done_seq != 0 && c->done_seq < r->seq;
            if (c->dst != r->buf || c->enq_seq > r->seq || landed_before)
                continue;
            const dly_range *hit = overlap(d, r, c->lo, c->hi);
            if (!hit)
                continue;
            uint64_t at = hit->lo > c->lo ? hit->lo : c->lo;
            char what[96], landed[64];
            if (r->slot_bytes)
                snprintf(what, sizeof what, "slot %" PRIu64, at / r->slot_bytes);
            else
                snprintf(what, sizeof what, "byte %" PRIu64, at);
            if (c->done_seq)
                snprintf(landed, sizeof landed, "landed at %.3f ms", c->done_ms);
            else
                snprintf(landed, sizeof landed, "is still in flight");
            snprintf(text, sizeof text,
                     "%s call %" PRId64 " started at %.3f ms and read %s of buffer %p, but copy %zu "
                     "into its bytes [%" PRIu64 ", %" PRIu64 "), enqueued at %.3f ms, %s",
                     r->op, r->call, r->start_ms, what, (const void *)r->buf, j + 1, c->lo, c->hi,
                     c->enq_ms, landed);
            st = PV_ERR_STATE;
            break;
        }
    }
    if (st == PV_OK)
        snprintf(text, sizeof text,
                 "in order: %zu reads (%" PRId64 " attention, %" PRId64 " slot_scatter) against %zu copies",
                 d->n_reads, d->attention_calls, d->scatter_calls, d->n_copies);
    pthread_mutex_unlock(&d->mu);
    if (msg && cap)
        snprintf(msg, cap, "%s", text);
    return st == PV_OK ? PV_OK : pv_error(st, "delay: %s", text);
}

int64_t pv_delay_backend_delayed_copies(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    int64_t n = d->delayed_copies;
    pthread_mutex_unlock(&d->mu);
    return n;
}

double pv_delay_backend_copy_busy_s(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    double s = d->busy_s;
    pthread_mutex_unlock(&d->mu);
    return s;
}

int64_t pv_delay_backend_attention_calls(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    int64_t n = d->attention_calls;
    pthread_mutex_unlock(&d->mu);
    return n;
}

pv_status pv_delay_backend_set_delays(pv_backend *be, const pv_delay_options *o)
{
    pv_delay_options opt;
    PV_TRY(delays_of("pv_delay_backend_set_delays", o, &opt));
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    /* The worker reads the delays when it takes a job: none may be queued. */
    wait_ticket_locked(d, d->enqueued);
    d->opt = opt;
    pthread_mutex_unlock(&d->mu);
    return PV_OK;
}

void pv_delay_backend_reset(pv_backend *be)
{
    dly_state *d = state_of(be);
    pthread_mutex_lock(&d->mu);
    /* A queued job points into copies[]: let them all land first. */
    wait_ticket_locked(d, d->enqueued);
    d->n_copies = d->n_reads = d->n_ranges = 0;
    d->delayed_copies = d->attention_calls = d->scatter_calls = 0;
    d->busy_s = 0;
    clock_gettime(CLOCK_MONOTONIC, &d->origin);
    pthread_mutex_unlock(&d->mu);
}
