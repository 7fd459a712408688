/* The ops that take a step's host work in one call, and the decode step
 * kept on the device, on every backend against the CPU reference
 * (test-backend-ops.c's conventions: the CPU itself against closed forms
 * first, then each other backend that opens against the CPU, a backend
 * with no device a SKIP):
 *   - slot_transfer: whole slots between two pools (host -> device for
 *     swap-in, device -> host for swap-out, and the other pairs), bit for
 *     bit, every byte of both buffers compared, with sentinel bytes past
 *     each pool; its queue rules: a transfer out waits for the compute
 *     that wrote its slots, and compute that waits for a transfer in sees
 *     its bytes; no slots still orders `done` after `wait`;
 *   - sample_batch: a step's rows, greedy and sampled mixed, against this
 *     backend's own argmax and sample_top_p row by row (exactly: the same
 *     code), against the CPU (greedy rows exactly, ties to the lowest id;
 *     sampled rows up to rounding; the CPU itself against a reference
 *     computed here in double), and known answers;
 *   - host-out sampling (sample_batch, argmax, sample_top_p in turn) many
 *     calls in a row, row counts growing and shrinking: each call's tokens
 *     the CPU's (a results buffer kept between calls is big enough and
 *     read after its own call's kernel);
 *   - sample_batch into out_dev (at offsets, read back through an async
 *     copy, nothing around the rows written) = into host out, with and
 *     without a logit bias; the bias against the reference, known answers
 *     (ties, a moved maximum, bans that outweigh any logit), bans never
 *     picked across temperatures, top_p and u, no entries = no list, the
 *     logits never changed;
 *   - embed_gather of host and device ids (F32, F16, Q8_0; offsets; more
 *     ids than CUDA's grid has rows): each row its id's, zeros for a
 *     device id out of range;
 *   - the decode chain: sample_batch into out_dev, then embed_gather of
 *     those tokens as device ids with no host read between, plain and, on
 *     a backend with graphs, recorded into a graph (where sample_batch
 *     into host out must be refused).
 * Usage: test-backend-batch [--backend NAME] [--seed N] */
#include "config.h"

#include "backend-check.h"

#include <stdarg.h>
#include <stdio.h>

#define POOL_GUARD 256

typedef check_ctx ctx;

static void check(const ctx *c, pv_status st, int good, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (st != PV_OK)
        ok(0, "%s: %s: %s", c->name, what, pv_last_error());
    else
        ok(good, "%s: %s", c->name, what);
}

static const char *kind_name(pv_mem_kind kind)
{
    return kind == PV_MEM_HOST ? "host" : "device";
}

/* ---- slot_transfer ------------------------------------------------------------ */

typedef struct transfer_case {
    pv_dtype dtype;
    int64_t slot_elems;
    pv_mem_kind src_kind, dst_kind;
    int64_t src_slots, dst_slots;
    int32_t n;
} transfer_case;

/* A pool of n_slots slots followed by POOL_GUARD sentinel bytes. */
static uint64_t pool_bytes(const transfer_case *tc, int64_t n_slots)
{
    return (uint64_t)n_slots * (uint64_t)tc->slot_elems * pv_dtype_size(tc->dtype) + POOL_GUARD;
}

/* Runs the transfer on be from images src and dst (whole buffers, guards
 * included); dst and src get the buffers' contents afterwards. */
static pv_status run_transfer(pv_backend *be, const transfer_case *tc, const int32_t *to, const int32_t *from,
                              unsigned char *src, unsigned char *dst)
{
    const uint64_t src_bytes = pool_bytes(tc, tc->src_slots), dst_bytes = pool_bytes(tc, tc->dst_slots);
    pv_buffer *sb = NULL, *db = NULL;
    pv_event *done = NULL;
    pv_status st = pv_buffer_init(&sb, be, tc->src_kind, src_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&db, be, tc->dst_kind, dst_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(sb, 0, src, src_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(db, 0, dst, dst_bytes);
    if (st == PV_OK) {
        pv_slot_transfer_args a = {.dtype = tc->dtype, .slot_elems = tc->slot_elems, .dst = db,
                                   .dst_n_slots = tc->dst_slots, .src = sb, .src_n_slots = tc->src_slots,
                                   .dst_slots = to, .src_slots = from, .n = tc->n};
        st = pv_slot_transfer(be, &a, NULL, &done);
    }
    if (st == PV_OK)
        st = pv_event_wait(done);
    if (st == PV_OK)
        st = pv_buffer_read(db, 0, dst, dst_bytes);
    if (st == PV_OK)
        st = pv_buffer_read(sb, 0, src, src_bytes);
    pv_event_free(done);
    pv_buffer_free(sb);
    pv_buffer_free(db);
    return st;
}

static void check_transfer(ctx *c, const transfer_case *tc)
{
    if (!pv_backend_supports(c->be, PV_OP_SLOT_TRANSFER, tc->dtype)) {
        if (c->cpu_pass)
            ok(0, "cpu: slot_transfer of %s must be supported by the reference", pv_dtype_name(tc->dtype));
        else
            tap_skip("%s: slot_transfer of %s not supported", c->name, pv_dtype_name(tc->dtype));
        return;
    }
    const uint64_t src_bytes = pool_bytes(tc, tc->src_slots), dst_bytes = pool_bytes(tc, tc->dst_slots);
    const size_t slot_bytes = (size_t)tc->slot_elems * pv_dtype_size(tc->dtype);
    int32_t *order = xmalloc((size_t)tc->dst_slots * sizeof *order);
    int32_t *from = xmalloc(((size_t)tc->n + 1) * sizeof *from);
    for (int32_t i = 0; i < tc->dst_slots; i++)
        order[i] = i;
    rng_shuffle(&c->rng, order, (size_t)tc->dst_slots); /* distinct, scattered destinations */
    for (int32_t i = 0; i < tc->n; i++)
        from[i] = rng_below(&c->rng, tc->src_slots); /* sources may repeat */
    unsigned char *src0 = xmalloc(src_bytes), *dst0 = xmalloc(dst_bytes);
    for (uint64_t i = 0; i < src_bytes; i++)
        src0[i] = (unsigned char)rng_next(&c->rng);
    for (uint64_t i = 0; i < dst_bytes; i++)
        dst0[i] = i < dst_bytes - POOL_GUARD ? (unsigned char)rng_next(&c->rng) : SENTINEL_BYTE;
    unsigned char *src = xmalloc(src_bytes), *dst = xmalloc(dst_bytes);
    unsigned char *want_src = xmalloc(src_bytes), *want_dst = xmalloc(dst_bytes);
    memcpy(src, src0, src_bytes);
    memcpy(dst, dst0, dst_bytes);
    memcpy(want_src, src0, src_bytes);
    memcpy(want_dst, dst0, dst_bytes);
    pv_status st = run_transfer(c->be, tc, order, from, src, dst);
    if (c->cpu_pass) {
        for (int32_t i = 0; i < tc->n; i++)
            memcpy(want_dst + (size_t)order[i] * slot_bytes, src0 + (size_t)from[i] * slot_bytes, slot_bytes);
    } else if (st == PV_OK) {
        st = run_transfer(c->cpu, tc, order, from, want_src, want_dst);
    }
    size_t differing = 0;
    for (uint64_t i = 0; i < dst_bytes; i++)
        differing += dst[i] != want_dst[i];
    for (uint64_t i = 0; i < src_bytes; i++)
        differing += src[i] != want_src[i];
    check(c, st, differing == 0,
          "slot_transfer %s, %d of %lld %s slots of %lld elements -> %lld %s slots: %zu bytes differ (both "
          "pools and the bytes past them compared)",
          pv_dtype_name(tc->dtype), tc->n, (long long)tc->src_slots, kind_name(tc->src_kind),
          (long long)tc->slot_elems, (long long)tc->dst_slots, kind_name(tc->dst_kind), differing);
    free(order);
    free(from);
    free(src0);
    free(dst0);
    free(src);
    free(dst);
    free(want_src);
    free(want_dst);
}

/* The queue rules, as the engine relies on them (backend.h):
 *   out: compute writes device slots (a scatter behind a GEMM long enough
 *        that a transfer not waiting would overtake it), an event recorded
 *        after it is the transfer's `wait`; once `done` completes, host_ptr holds
 *        the written bytes (read directly, as the engine's persistence
 *        does, not through a compute-ordered read);
 *   in:  a transfer into device slots, then pv_queue_wait(COMPUTE, done)
 *        and a compute op (a gather) reading them sees the new bytes;
 *   empty: a transfer of no slots still hands back an event that completes
 *        after its `wait`. */
static void check_transfer_order(ctx *c)
{
    enum { SLOTS = 8, ELEMS = 4096, MOVED = 5, GEMM_N = 768 };
    const size_t slot_bytes = ELEMS * sizeof(float);
    const uint64_t gemm_bytes = (uint64_t)GEMM_N * GEMM_N * sizeof(float);
    float *rows = xmalloc(MOVED * slot_bytes), *back = xmalloc(MOVED * slot_bytes);
    rng_fill(&c->rng, rows, (size_t)MOVED * ELEMS, -1.0f, 1.0f);
    const int32_t dev_slots[MOVED] = {6, 1, 3, 7, 0}, host_slots[MOVED] = {2, 5, 0, 7, 4};
    pv_buffer *dev = NULL, *host = NULL, *staging = NULL, *square = NULL, *product = NULL;
    pv_event *written = NULL, *out = NULL, *in = NULL, *mark = NULL, *empty = NULL;
    pv_status st = pv_buffer_init(&dev, c->be, PV_MEM_DEVICE, SLOTS * slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&host, c->be, PV_MEM_HOST, SLOTS * slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&staging, c->be, PV_MEM_DEVICE, MOVED * slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(staging, 0, rows, MOVED * slot_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&square, c->be, PV_MEM_DEVICE, gemm_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&product, c->be, PV_MEM_DEVICE, gemm_bytes);
    float *ones = xmalloc((size_t)gemm_bytes);
    for (size_t i = 0; i < (size_t)GEMM_N * GEMM_N; i++)
        ones[i] = 1.0f;
    if (st == PV_OK)
        st = pv_buffer_write(square, 0, ones, gemm_bytes);
    free(ones);
    pv_gemm_args busy = {.dtype = PV_F32, .m = GEMM_N, .n = GEMM_N, .k = GEMM_N, .alpha = 1.0f, .a = square,
                         .lda = GEMM_N, .b = square, .ldb = GEMM_N, .c = product, .ldc = GEMM_N};
    pv_slot_copy_args scatter = {.dtype = PV_F32, .slot_elems = ELEMS, .pool = dev, .n_slots = SLOTS,
                                 .staging = staging, .slots = dev_slots, .n_slots_moved = MOVED};
    pv_slot_transfer_args t = {.dtype = PV_F32, .slot_elems = ELEMS, .dst = host, .dst_n_slots = SLOTS,
                               .src = dev, .src_n_slots = SLOTS, .dst_slots = host_slots, .src_slots = dev_slots,
                               .n = MOVED};
    if (st == PV_OK)
        st = pv_gemm(c->be, &busy);
    if (st == PV_OK)
        st = pv_slot_scatter(c->be, &scatter);
    if (st == PV_OK)
        st = pv_event_record(c->be, PV_QUEUE_COMPUTE, &written);
    if (st == PV_OK)
        st = pv_slot_transfer(c->be, &t, written, &out);
    if (st == PV_OK)
        st = pv_event_wait(out);
    int out_ok = st == PV_OK;
    for (int i = 0; i < MOVED && out_ok; i++)
        out_ok = memcmp((const char *)host->host_ptr + (size_t)host_slots[i] * slot_bytes,
                        (const char *)rows + (size_t)i * slot_bytes, slot_bytes) == 0;
    check(c, st, out_ok, "slot_transfer device -> host waits for the compute that wrote its slots");

    /* Back in, into other device slots, and read by compute after the wait. */
    const int32_t back_slots[MOVED] = {5, 4, 2, 1, 3};
    t = (pv_slot_transfer_args){.dtype = PV_F32, .slot_elems = ELEMS, .dst = dev, .dst_n_slots = SLOTS,
                                .src = host, .src_n_slots = SLOTS, .dst_slots = back_slots, .src_slots = host_slots,
                                .n = MOVED};
    pv_slot_copy_args gather = scatter;
    gather.slots = back_slots;
    if (st == PV_OK)
        st = pv_slot_transfer(c->be, &t, NULL, &in);
    if (st == PV_OK)
        st = pv_queue_wait(c->be, PV_QUEUE_COMPUTE, in);
    if (st == PV_OK)
        st = pv_slot_gather(c->be, &gather);
    if (st == PV_OK)
        st = pv_buffer_read(staging, 0, back, MOVED * slot_bytes);
    check(c, st, st == PV_OK && memcmp(back, rows, MOVED * slot_bytes) == 0,
          "slot_transfer host -> device, then compute waiting for it reads its bytes");

    t.n = 0;
    if (st == PV_OK)
        st = pv_event_record(c->be, PV_QUEUE_COMPUTE, &mark);
    if (st == PV_OK)
        st = pv_slot_transfer(c->be, &t, mark, &empty);
    if (st == PV_OK)
        st = pv_event_wait(empty);
    check(c, st, empty != NULL, "slot_transfer of no slots hands back an event that completes");
    if (st == PV_OK)
        st = pv_backend_finish(c->be);
    pv_event_free(written);
    pv_event_free(out);
    pv_event_free(in);
    pv_event_free(mark);
    pv_event_free(empty);
    pv_buffer_free(dev);
    pv_buffer_free(host);
    pv_buffer_free(staging);
    pv_buffer_free(square);
    pv_buffer_free(product);
    free(rows);
    free(back);
}

/* ---- sample_batch ---------------------------------------------------------------- */

typedef struct sample_rows {
    int64_t rows, cols;
    float *x, *temperature, *top_p, *u;
    int32_t *bias_start, *bias_token; /* the logit bias: bias_start NULL for none */
    float *bias_value;
} sample_rows;

/* Elements of out_dev past a run's rows, and their sentinel. */
#define TOKEN_GUARD 16
#define TOKEN_SENTINEL 0x5a5a5a5a

/* The tokens of out_dev (rows from element dev_off of dev) through the
 * engine's path: an asynchronous copy into host memory and its event.
 * Then every element outside those rows must still hold the sentinel. */
static pv_status read_device_tokens(pv_backend *be, pv_buffer *dev, uint64_t dev_off, int64_t rows, int32_t *out)
{
    const uint64_t bytes = (uint64_t)rows * sizeof(int32_t), all = dev->bytes / sizeof(int32_t);
    pv_buffer *host = NULL;
    pv_event *done = NULL;
    pv_status st = pv_buffer_init(&host, be, PV_MEM_HOST, bytes);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COMPUTE, host, 0, dev, dev_off * sizeof(int32_t), bytes, NULL, &done);
    if (st == PV_OK)
        st = pv_event_wait(done);
    if (st == PV_OK)
        memcpy(out, host->host_ptr, (size_t)bytes);
    int32_t *image = xmalloc((size_t)all * sizeof *image);
    if (st == PV_OK)
        st = pv_buffer_read(dev, 0, image, all * sizeof(int32_t));
    for (uint64_t i = 0; i < all && st == PV_OK; i++)
        if ((i < dev_off || i >= dev_off + (uint64_t)rows) && image[i] != TOKEN_SENTINEL)
            st = pv_error(PV_ERR_STATE, "element %llu of out_dev, outside rows %llu..%llu, was written",
                          (unsigned long long)i, (unsigned long long)dev_off,
                          (unsigned long long)(dev_off + (uint64_t)rows - 1));
    free(image);
    pv_event_free(done);
    pv_buffer_free(host);
    return st;
}

/* A buffer of dev_off + rows + TOKEN_GUARD int32 sentinels for out_dev. */
static pv_status token_buffer(pv_backend *be, uint64_t dev_off, int64_t rows, pv_buffer **out)
{
    const uint64_t n = dev_off + (uint64_t)rows + TOKEN_GUARD;
    int32_t *fill = xmalloc((size_t)n * sizeof *fill);
    for (uint64_t i = 0; i < n; i++)
        fill[i] = TOKEN_SENTINEL;
    pv_status st = pv_buffer_init(out, be, PV_MEM_DEVICE, n * sizeof(int32_t));
    if (st == PV_OK)
        st = pv_buffer_write(*out, 0, fill, n * sizeof(int32_t));
    free(fill);
    return st;
}

static pv_sample_batch_args batch_args(const sample_rows *s, const tensor *logits)
{
    return (pv_sample_batch_args){.rows = s->rows, .cols = s->cols, .logits = logits->buf,
                                  .logits_off = logits->off, .temperature = s->temperature, .top_p = s->top_p,
                                  .u = s->u, .bias_start = s->bias_start, .bias_token = s->bias_token,
                                  .bias_value = s->bias_value};
}

/* sample_batch of s on be into host out (dev_off < 0) or into out_dev
 * from element dev_off; the logits and the bytes around them must be as
 * they were. */
static pv_status run_batch_to(pv_backend *be, const sample_rows *s, int64_t dev_off, int32_t *out)
{
    tensor tx;
    pv_buffer *dev = NULL;
    const size_t n = (size_t)(s->rows * s->cols);
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), n, s->x);
    if (st == PV_OK && dev_off >= 0)
        st = token_buffer(be, (uint64_t)dev_off, s->rows, &dev);
    if (st == PV_OK) {
        pv_sample_batch_args a = batch_args(s, &tx);
        a.out = dev_off < 0 ? out : NULL;
        a.out_dev = dev;
        a.out_dev_off = dev_off < 0 ? 0 : (uint64_t)dev_off;
        st = pv_sample_batch(be, &a);
    }
    if (st == PV_OK && dev)
        st = read_device_tokens(be, dev, (uint64_t)dev_off, s->rows, out);
    float *after = xmalloc(n * sizeof *after);
    if (st == PV_OK && (tensor_read(&tx, after) != PV_OK || memcmp(after, s->x, n * sizeof *after) != 0 ||
                        !guards_intact(&tx)))
        st = pv_error(PV_ERR_STATE, "sample_batch changed its logits or the guard bytes around them");
    free(after);
    pv_buffer_free(dev);
    tensor_free(&tx);
    return st;
}

static pv_status run_batch(pv_backend *be, const sample_rows *s, int32_t *out)
{
    return run_batch_to(be, s, -1, out);
}

/* Row by row through this backend's argmax or sample_top_p, each call
 * taking one row at its offset: the tokens sample_batch must equal. */
static pv_status run_rows_alone(pv_backend *be, const sample_rows *s, int32_t *out)
{
    tensor tx;
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), (uint64_t)(s->rows * s->cols), s->x);
    for (int64_t r = 0; r < s->rows && st == PV_OK; r++) {
        const uint64_t off = tx.off + (uint64_t)(r * s->cols);
        if (s->temperature[r] <= 0.0f) {
            pv_argmax_args a = {.rows = 1, .cols = s->cols, .x = tx.buf, .x_off = off, .out = &out[r]};
            st = pv_argmax(be, &a);
        } else {
            pv_sample_args a = {.rows = 1, .cols = s->cols, .temperature = s->temperature[r], .top_p = s->top_p[r],
                                .logits = tx.buf, .logits_off = off, .u = &s->u[r], .out = &out[r]};
            st = pv_sample_top_p(be, &a);
        }
    }
    tensor_free(&tx);
    return st;
}

/* Random logits; every third row greedy with its maximum twice (the lower
 * id must win), the others sampled with their own temperature, top_p and
 * u. No bias. */
static void random_rows(ctx *c, sample_rows *s, int64_t rows, int64_t cols)
{
    *s = (sample_rows){.rows = rows, .cols = cols};
    s->x = xmalloc((size_t)(rows * cols) * sizeof *s->x);
    s->temperature = xmalloc((size_t)rows * sizeof(float));
    s->top_p = xmalloc((size_t)rows * sizeof(float));
    s->u = xmalloc((size_t)rows * sizeof(float));
    rng_fill(&c->rng, s->x, (size_t)(rows * cols), -8.0f, 8.0f);
    for (int64_t r = 0; r < rows; r++) {
        if (r % 3 == 0) {
            s->temperature[r] = r % 2 ? -1.0f : 0.0f;
            s->top_p[r] = 0.0f; /* never read */
            s->u[r] = 5.0f;     /* nor this */
            const int32_t a = rng_below(&c->rng, cols), b = rng_below(&c->rng, cols);
            s->x[r * cols + a] = s->x[r * cols + b] = 9.0f;
        } else {
            s->temperature[r] = rng_range(&c->rng, 0.3f, 1.6f);
            s->top_p[r] = rng_range(&c->rng, 0.3f, 1.0f);
            s->u[r] = rng_range(&c->rng, 0.01f, 0.99f);
        }
    }
}

/* A logit bias for s: two rows in three get 1 to 6 distinct tokens, each
 * biased by up to +-6, banned one time in five (at -100 or -1e4, never
 * every token of a row), pushed up by +100 one time in twenty. */
static void random_bias(ctx *c, sample_rows *s)
{
    const int64_t most = s->cols < 6 ? s->cols : 6;
    s->bias_start = xmalloc((size_t)(s->rows + 1) * sizeof(int32_t));
    s->bias_token = xmalloc((size_t)(s->rows * most) * sizeof(int32_t));
    s->bias_value = xmalloc((size_t)(s->rows * most) * sizeof(float));
    int32_t n = 0;
    s->bias_start[0] = 0;
    for (int64_t r = 0; r < s->rows; r++) {
        const int64_t entries = rng_below(&c->rng, 3) ? 1 + rng_below(&c->rng, most) : 0;
        int64_t bans = 0;
        for (int64_t e = 0; e < entries; e++) {
            int32_t token, taken;
            do {
                token = rng_below(&c->rng, s->cols);
                taken = 0;
                for (int32_t k = s->bias_start[r]; k < n; k++)
                    taken |= s->bias_token[k] == token;
            } while (taken);
            const int32_t roll = rng_below(&c->rng, 20);
            float value = rng_range(&c->rng, -6.0f, 6.0f);
            if (roll < 4 && bans + 1 < s->cols) {
                value = roll ? PV_LOGIT_BIAS_BAN : -1e4f;
                bans++;
            } else if (roll == 4) {
                value = 100.0f;
            }
            s->bias_token[n] = token;
            s->bias_value[n++] = value;
        }
        s->bias_start[r + 1] = n;
    }
}

static void rows_free(sample_rows *s)
{
    free(s->x);
    free(s->temperature);
    free(s->top_p);
    free(s->u);
    free(s->bias_start);
    free(s->bias_token);
    free(s->bias_value);
}

/* Row r of s alone (one row's arguments, its bias entries with it);
 * start holds its bias_start. */
static sample_rows one_row(const sample_rows *s, int64_t r, int32_t start[2])
{
    sample_rows one = {.rows = 1, .cols = s->cols, .x = s->x + r * s->cols, .temperature = &s->temperature[r],
                       .top_p = &s->top_p[r], .u = &s->u[r]};
    if (s->bias_start) {
        start[0] = 0;
        start[1] = s->bias_start[r + 1] - s->bias_start[r];
        one.bias_start = start;
        one.bias_token = s->bias_token + s->bias_start[r];
        one.bias_value = s->bias_value + s->bias_start[r];
    }
    return one;
}

static int by_value_desc(const void *lhs, const void *rhs)
{
    const double x = *(const double *)lhs, y = *(const double *)rhs;
    return (x < y) - (x > y);
}

/* The test's own reference for row r of s with top_p and u, from
 * backend.h's words, in double: the biased logits (f32 additions, a ban
 * -infinity); greedy: the lowest index of their maximum; sampled: p =
 * softmax(biased / temperature), the threshold the p at which the mass,
 * highest first, reaches top_p (0 if it never does), the tokens with p >=
 * threshold and p > 0 kept, and the first kept token in index order whose
 * running mass exceeds u times the kept mass (the last kept one if none). */
static int32_t reference_token(const sample_rows *s, int64_t r, float top_p, float u)
{
    const int64_t cols = s->cols;
    const float *row = s->x + r * cols;
    float *b = xmalloc((size_t)cols * sizeof *b);
    memcpy(b, row, (size_t)cols * sizeof *b);
    for (int32_t k = s->bias_start ? s->bias_start[r] : 0; s->bias_start && k < s->bias_start[r + 1]; k++)
        b[s->bias_token[k]] = s->bias_value[k] <= PV_LOGIT_BIAS_BAN ? -INFINITY : row[s->bias_token[k]] + s->bias_value[k];
    int32_t pick = 0;
    if (s->temperature[r] <= 0.0f) {
        for (int32_t col = 1; col < cols; col++)
            if (b[col] > b[pick])
                pick = col;
        free(b);
        return pick;
    }
    double *p = xmalloc((size_t)cols * sizeof *p), *sorted = xmalloc((size_t)cols * sizeof *sorted);
    double max = -INFINITY, total = 0.0, threshold = 0.0, running = 0.0, kept = 0.0, cumulative = 0.0;
    for (int64_t col = 0; col < cols; col++)
        max = fmax(max, (double)b[col]);
    for (int64_t col = 0; col < cols; col++)
        total += p[col] = exp(((double)b[col] - max) / s->temperature[r]);
    for (int64_t col = 0; col < cols; col++)
        sorted[col] = p[col] /= total;
    qsort(sorted, (size_t)cols, sizeof *sorted, by_value_desc);
    for (int64_t k = 0; k < cols && threshold == 0.0; k++)
        if ((running += sorted[k]) >= top_p)
            threshold = sorted[k];
    for (int64_t col = 0; col < cols; col++)
        kept += p[col] > 0.0 && p[col] >= threshold ? p[col] : 0.0;
    pick = -1;
    for (int32_t col = 0; col < cols && pick < 0; col++)
        if (p[col] > 0.0 && p[col] >= threshold && (cumulative += p[col]) > (double)u * kept)
            pick = col;
    for (int32_t col = 0; col < cols && pick < 0; col++) /* u * kept rounded up to the whole mass */
        if (p[col] > 0.0 && p[col] >= threshold)
            pick = col;
    free(b);
    free(p);
    free(sorted);
    return pick;
}

/* A sampled row's token off by rounding: f32 sums on a device and the
 * CPU's double sums differ by ~1e-6, which can move the u * mass target or
 * the top_p threshold across a token boundary. Such a token passes only if
 * the CPU (the reference on the CPU pass) itself draws it for some u and
 * top_p within SAMPLE_SLACK. */
#define SAMPLE_SLACK 1e-4f

static int draws_nearby(ctx *c, const sample_rows *s, int64_t r, int32_t token)
{
    int32_t start[2];
    sample_rows one = one_row(s, r, start);
    for (int du = -1; du <= 1; du++)
        for (int dp = -1; dp <= 1; dp++) {
            float u = s->u[r] + (float)du * SAMPLE_SLACK, p = s->top_p[r] + (float)dp * SAMPLE_SLACK;
            int32_t near = -1;
            p = p > 1.0f ? 1.0f : p;
            one.u = &u;
            one.top_p = &p;
            if (c->cpu_pass)
                near = reference_token(&one, 0, p, u);
            else if (run_batch(c->cpu, &one, &near) != PV_OK)
                continue;
            if (near == token)
                return 1;
        }
    return 0;
}

/* got (this backend's tokens for s, st its status) against the CPU's,
 * or on the CPU pass the test's reference: greedy rows exactly, sampled
 * rows up to rounding at a boundary. */
static void check_tokens(ctx *c, pv_status st, const sample_rows *s, const int32_t *got, const char *what)
{
    int32_t *want = xmalloc((size_t)s->rows * sizeof *want);
    for (int64_t r = 0; r < s->rows && c->cpu_pass; r++)
        want[r] = reference_token(s, r, s->top_p[r], s->u[r]);
    if (st == PV_OK && !c->cpu_pass)
        st = run_batch(c->cpu, s, want);
    int64_t greedy_bad = 0, sampled_bad = 0, rounded = 0;
    for (int64_t r = 0; r < s->rows && st == PV_OK; r++) {
        if (got[r] == want[r])
            continue;
        if (s->temperature[r] <= 0.0f)
            greedy_bad++;
        else if (draws_nearby(c, s, r, got[r]))
            rounded++;
        else
            sampled_bad++;
    }
    if (rounded)
        tap_diag("%s: %lld sampled rows drew a token next to the %s's (rounding at a boundary)", c->name,
                 (long long)rounded, c->cpu_pass ? "reference" : "CPU");
    check(c, st, greedy_bad == 0 && sampled_bad == 0,
          "%s: the %s's tokens (greedy rows exactly: %lld differ; sampled up to rounding: %lld differ)", what,
          c->cpu_pass ? "double reference" : "CPU", (long long)greedy_bad, (long long)sampled_bad);
    free(want);
}

static int sample_batch_supported(ctx *c)
{
    if (pv_backend_supports(c->be, PV_OP_SAMPLE_BATCH, PV_F32))
        return 1;
    if (c->cpu_pass)
        ok(0, "cpu: sample_batch must be supported by the reference");
    else
        tap_skip("%s: sample_batch not supported", c->name);
    return 0;
}

static void check_sample_batch(ctx *c, int64_t rows, int64_t cols)
{
    if (!sample_batch_supported(c))
        return;
    sample_rows s;
    random_rows(c, &s, rows, cols);
    int32_t *got = xmalloc((size_t)rows * sizeof *got), *alone = xmalloc((size_t)rows * sizeof *alone);
    pv_status st = run_batch(c->be, &s, got);
    if (st == PV_OK)
        st = run_rows_alone(c->be, &s, alone);
    int64_t differ = 0;
    for (int64_t r = 0; r < rows; r++)
        differ += got[r] != alone[r];
    check(c, st, differ == 0,
          "sample_batch of %lld rows x %lld (greedy with ties, and sampled) = this backend's argmax and "
          "sample_top_p row by row (%lld rows differ)",
          (long long)rows, (long long)cols, (long long)differ);
    char what[96];
    snprintf(what, sizeof what, "sample_batch of %lld rows x %lld", (long long)rows, (long long)cols);
    check_tokens(c, st, &s, got, what);
    free(got);
    free(alone);
    rows_free(&s);
}

/* Host-out sampling calls one after another, row counts growing and
 * shrinking, through sample_batch, argmax and sample_top_p in turn, each
 * on fresh logits: every call's tokens are the CPU's (the reference's).
 * A backend that keeps one results buffer between calls (OpenCL) fails
 * here if it reads one too small, or reads before its own call's kernel
 * has written it (the previous call's tokens). */
static void check_host_out_calls(ctx *c, int64_t cols)
{
    static const int64_t sizes[] = {1, 5, 64, 3, 200, 2, 33, 513, 7, 100, 1, 300};
    static const char *const names[3] = {"sample_batch", "argmax", "sample_top_p"};
    const int n = (int)(sizeof sizes / sizeof sizes[0]);
    for (int i = 0; i < n; i++) {
        const int64_t rows = sizes[i];
        const int op = i % 3;
        sample_rows s;
        random_rows(c, &s, rows, cols);
        /* argmax: every row greedy; sample_top_p: one temperature and
         * top_p for all rows, each its own u. */
        const float temperature = rng_range(&c->rng, 0.3f, 1.6f), top_p = rng_range(&c->rng, 0.3f, 1.0f);
        for (int64_t r = 0; r < rows && op > 0; r++) {
            s.temperature[r] = op == 1 ? 0.0f : temperature;
            s.top_p[r] = top_p;
            s.u[r] = rng_range(&c->rng, 0.01f, 0.99f);
        }
        int32_t *got = xmalloc((size_t)rows * sizeof *got);
        pv_status st = PV_OK;
        if (op == 0) {
            st = run_batch(c->be, &s, got);
        } else {
            tensor tx;
            st = tensor_init(&tx, c->be, PV_MEM_DEVICE, sizeof(float), (uint64_t)(rows * cols), s.x);
            pv_argmax_args am = {.rows = rows, .cols = cols, .x = tx.buf, .x_off = tx.off, .out = got};
            pv_sample_args sa = {.rows = rows, .cols = cols, .temperature = temperature, .top_p = top_p,
                                 .logits = tx.buf, .logits_off = tx.off, .u = s.u, .out = got};
            if (st == PV_OK)
                st = op == 1 ? pv_argmax(c->be, &am) : pv_sample_top_p(c->be, &sa);
            tensor_free(&tx);
        }
        char what[96];
        snprintf(what, sizeof what, "host-out call %d of %d: %s of %lld rows x %lld", i + 1, n, names[op],
                 (long long)rows, (long long)cols);
        check_tokens(c, st, &s, got, what);
        free(got);
        rows_free(&s);
    }
}

/* out_dev from element dev_off gives what host out gives on this backend,
 * with or without a logit bias, and those tokens are the CPU's (the
 * reference's) up to rounding. */
static void check_device_out(ctx *c, int64_t rows, int64_t cols, uint64_t dev_off, int biased)
{
    if (!sample_batch_supported(c))
        return;
    sample_rows s;
    random_rows(c, &s, rows, cols);
    if (biased)
        random_bias(c, &s);
    int32_t *host = xmalloc((size_t)rows * sizeof *host), *dev = xmalloc((size_t)rows * sizeof *dev);
    pv_status st = run_batch(c->be, &s, host);
    if (st == PV_OK)
        st = run_batch_to(c->be, &s, (int64_t)dev_off, dev);
    int64_t differ = 0;
    for (int64_t r = 0; r < rows; r++)
        differ += host[r] != dev[r];
    char what[128];
    snprintf(what, sizeof what, "sample_batch of %lld rows x %lld%s into out_dev from element %llu", (long long)rows,
             (long long)cols, biased ? " with a logit bias" : "", (unsigned long long)dev_off);
    check(c, st, differ == 0, "%s = into host out (%lld rows differ)", what, (long long)differ);
    check_tokens(c, st, &s, dev, what);
    free(host);
    free(dev);
    rows_free(&s);
}

/* A bias list with no entries (bias_start all 0, the lists NULL) is no
 * bias: the very tokens of bias_start NULL, into host out and out_dev. */
static void check_empty_bias(ctx *c)
{
    if (!sample_batch_supported(c))
        return;
    sample_rows s;
    random_rows(c, &s, 30, 500);
    int32_t plain[30], empty[30], empty_dev[30];
    pv_status st = run_batch(c->be, &s, plain);
    s.bias_start = xmalloc(31 * sizeof(int32_t));
    memset(s.bias_start, 0, 31 * sizeof(int32_t));
    if (st == PV_OK)
        st = run_batch(c->be, &s, empty);
    if (st == PV_OK)
        st = run_batch_to(c->be, &s, 2, empty_dev);
    check(c, st, memcmp(plain, empty, sizeof plain) == 0 && memcmp(plain, empty_dev, sizeof plain) == 0,
          "sample_batch of 30 rows x 500: a bias list of no entries gives the tokens of no list (host out and "
          "out_dev)");
    rows_free(&s);
}

/* Known answers with a bias, in one call (the tokens f32 adds exactly):
 *   greedy (1, 3, 2, 0), +1 on 2: a tie 3 = 3 goes to id 1;
 *   greedy (1, 3, 2, 0), +2 on 0: the tie goes to id 0;
 *   greedy (1, 3, 2, 0), +3.5 on 3: the bias moves the maximum to 3;
 *   greedy (1000, 3, 2, 0), -100 on 0: a ban, not a subtraction -> 1;
 *   top_p .5, u .99 over (1000, 3, 2, 0), -100 on 0: p(1) = .705 -> 1;
 *   top_p 1, u .999 over (0, 0, 0, 1000), -1e4 on 3: the ban at the end
 *   holds where u takes the last kept token -> 2;
 *   top_p 1, u .6 over (0, 0, 0, 0), +log 3 on 0: p (.5, 1/6, 1/6, 1/6) -> 1
 *   (unbiased: 2);
 *   greedy (0, 5, 5, 1), no entries, between rows with entries -> 1. */
static void check_bias_known(ctx *c)
{
    if (!sample_batch_supported(c))
        return;
    float x[8 * 4] = {1, 3, 2, 0, 1, 3, 2, 0, 1, 3, 2, 0, 1000, 3, 2, 0, 1000, 3, 2, 0, 0, 0, 0, 1000, 0, 0, 0, 0,
                      0, 5, 5, 1};
    float temperature[8] = {0, 0, 0, 0, 1, 1, 1, -1}, top_p[8] = {0, 0, 0, 0, 0.5f, 1, 1, 0};
    float u[8] = {0, 0, 0, 0, 0.99f, 0.999f, 0.6f, 0};
    int32_t start[9] = {0, 1, 2, 3, 4, 5, 6, 7, 7}, token[7] = {2, 0, 3, 0, 0, 3, 0};
    float value[7] = {1, 2, 3.5f, PV_LOGIT_BIAS_BAN, PV_LOGIT_BIAS_BAN, -1e4f, logf(3.0f)};
    const int32_t want[8] = {1, 0, 3, 1, 1, 2, 1, 1};
    sample_rows s = {.rows = 8, .cols = 4, .x = x, .temperature = temperature, .top_p = top_p, .u = u,
                     .bias_start = start, .bias_token = token, .bias_value = value};
    int32_t got[8], dev[8];
    pv_status st = run_batch(c->be, &s, got);
    if (st == PV_OK)
        st = run_batch_to(c->be, &s, 3, dev);
    check(c, st, memcmp(got, want, sizeof want) == 0 && memcmp(dev, want, sizeof want) == 0,
          "sample_batch with a bias, known answers of 8 rows: %d %d %d %d %d %d %d %d (want 1 0 3 1 1 2 1 1; "
          "out_dev the same: %s)",
          got[0], got[1], got[2], got[3], got[4], got[5], got[6], got[7],
          memcmp(dev, want, sizeof want) == 0 ? "yes" : "no");
}

/* Banned tokens are never picked: 96 rows of 50 whose top token (logit
 * 12, most of the mass) and two more are banned, greedy and sampled with
 * temperatures 0.5 to 4, top_p 0.05 to 1 and u swept across [0, 1). */
static void check_bans(ctx *c)
{
    if (!sample_batch_supported(c))
        return;
    enum { ROWS = 96, COLS = 50 };
    sample_rows s;
    random_rows(c, &s, ROWS, COLS);
    s.bias_start = xmalloc((ROWS + 1) * sizeof(int32_t));
    s.bias_token = xmalloc(3 * ROWS * sizeof(int32_t));
    s.bias_value = xmalloc(3 * ROWS * sizeof(float));
    s.bias_start[0] = 0;
    for (int32_t r = 0; r < ROWS; r++) {
        const int32_t top = rng_below(&c->rng, COLS), other = (top + 1 + rng_below(&c->rng, COLS - 2)) % COLS;
        s.x[r * COLS + top] = 12.0f;
        const int32_t banned[3] = {top, other, (other + 1) % COLS == top ? (other + 2) % COLS : (other + 1) % COLS};
        for (int k = 0; k < 3; k++) {
            s.bias_token[3 * r + k] = banned[k];
            s.bias_value[3 * r + k] = k == 1 ? -3e38f : PV_LOGIT_BIAS_BAN;
        }
        s.bias_start[r + 1] = 3 * (r + 1);
        if (r % 4 == 0) {
            s.temperature[r] = 0.0f;
        } else {
            s.temperature[r] = 0.5f + 3.5f * (float)(r % 7) / 6.0f;
            s.top_p[r] = r % 5 == 0 ? 1.0f : 0.05f + 0.95f * (float)(r % 11) / 10.0f;
            s.u[r] = ((float)r + 0.5f) / ROWS;
        }
    }
    int32_t got[ROWS], dev[ROWS];
    pv_status st = run_batch(c->be, &s, got);
    if (st == PV_OK)
        st = run_batch_to(c->be, &s, 0, dev);
    int picked_banned = 0;
    for (int32_t r = 0; r < ROWS && st == PV_OK; r++)
        for (int k = 0; k < 3; k++)
            picked_banned += got[r] == s.bias_token[3 * r + k] || dev[r] == s.bias_token[3 * r + k];
    check(c, st, picked_banned == 0,
          "sample_batch, 96 rows with their top token banned: no banned token picked, greedy or sampled (%d "
          "picked)",
          picked_banned);
    rows_free(&s);
}

/* Known answers in one call, greedy and sampled rows mixed (logits log(p)):
 *   greedy over (.125, .5, .5, .25): the tie goes to id 1;
 *   p (.5, .25, .125, .125), top_p .7 keeps {0, 1}: u .5 -> 0, u .7 -> 1;
 *   p (.4, .2, .2, .2), top_p .5: the tied threshold keeps all, u .99 -> 3;
 *   temperature 2 flattens (.5, .25, .125, .125); top_p 1, u .6 -> 1;
 *   greedy at temperature -1 over (.4, .2, .2, .2) -> 0. */
static void check_sample_batch_known(ctx *c)
{
    static const double p[6][4] = {{.125, .5, .5, .25}, {.5, .25, .125, .125}, {.5, .25, .125, .125},
                                   {.4, .2, .2, .2},    {.5, .25, .125, .125}, {.4, .2, .2, .2}};
    float x[6 * 4], temperature[6] = {0.0f, 1.0f, 1.0f, 1.0f, 2.0f, -1.0f};
    float top_p[6] = {0.0f, 0.7f, 0.7f, 0.5f, 1.0f, 0.0f}, u[6] = {0.0f, 0.5f, 0.7f, 0.99f, 0.6f, 0.0f};
    const int32_t want[6] = {1, 0, 1, 3, 1, 0};
    for (int r = 0; r < 6; r++)
        for (int j = 0; j < 4; j++)
            x[r * 4 + j] = (float)log(p[r][j]);
    sample_rows s = {.rows = 6, .cols = 4, .x = x, .temperature = temperature, .top_p = top_p, .u = u};
    int32_t got[6] = {-1, -1, -1, -1, -1, -1};
    pv_status st = run_batch(c->be, &s, got);
    check(c, st, memcmp(got, want, sizeof want) == 0,
          "sample_batch known answers, 6 rows mixed: %d %d %d %d %d %d (want 1 0 1 3 1 0)", got[0], got[1], got[2],
          got[3], got[4], got[5]);
}

/* ---- embed_gather of device ids ------------------------------------------------ */

/* A table of n_rows x dim in type t (F32, F16 or Q8_0) as GGUF bytes,
 * and its values as f32 in *values: every value exact in f32, so every
 * backend must give them bit for bit. */
static void *random_table(ctx *c, pv_wtype t, int64_t n_rows, int64_t dim, float **values)
{
    const size_t n = (size_t)(n_rows * dim);
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    unsigned char *bytes = xmalloc(n / block_elems * block_bytes);
    float *v = xmalloc(n * sizeof *v);
    for (size_t b = 0; b < n / block_elems; b++) {
        unsigned char *block = bytes + b * block_bytes;
        if (t == PV_W_Q8_0) {
            const pv_half d = pv_float_to_half(rng_range(&c->rng, -0.1f, 0.1f));
            memcpy(block, &d, 2);
            for (int j = 0; j < 32; j++) {
                const int8_t q = (int8_t)(rng_below(&c->rng, 255) - 127);
                memcpy(block + 2 + j, &q, 1);
                v[b * 32 + (size_t)j] = pv_half_to_float(d) * (float)q;
            }
        } else if (t == PV_W_F16) {
            const pv_half h = pv_float_to_half(rng_range(&c->rng, -2.0f, 2.0f));
            memcpy(block, &h, 2);
            v[b] = pv_half_to_float(h);
        } else {
            v[b] = rng_range(&c->rng, -2.0f, 2.0f);
            memcpy(block, &v[b], 4);
        }
    }
    *values = v;
    return bytes;
}

/* The table written for embed_gather into a buffer of its own. */
static pv_status table_buffer(pv_backend *be, pv_wtype t, int64_t n_rows, int64_t dim, const void *bytes,
                              pv_buffer **out)
{
    uint32_t block_elems = 1, block_bytes = 4;
    pv_wtype_block(t, &block_elems, &block_bytes);
    pv_status st = pv_buffer_init(out, be, PV_MEM_DEVICE, (uint64_t)(n_rows * dim) / block_elems * block_bytes);
    return st == PV_OK ? pv_weights_write(*out, 0, t, n_rows, dim, bytes) : st;
}

/* A device id no host check sees: out of [0, n_rows). */
static int32_t bad_device_id(int64_t j, int64_t n_rows)
{
    const int32_t bad[6] = {-1, (int32_t)n_rows, INT32_MIN, INT32_MAX, -1000, (int32_t)n_rows + 100};
    return bad[j % 6];
}

/* embed_gather of n_ids ids, every third a host id and the others
 * -(j + 1) for device ids j of n_dev at element dev_off of ids_dev (the
 * first and the last j among them); one device id in seven out of range.
 * Each row must be its resolved id's table row, zeros for an id out of
 * range, and nothing around out written. */
static void check_device_ids(ctx *c, pv_wtype t, int64_t n_rows, int64_t dim, int32_t n_ids, int64_t n_dev,
                             uint64_t dev_off)
{
    if (!pv_backend_supports_weights(c->be, PV_OP_EMBED_GATHER, t)) {
        tap_skip("%s: embed_gather of %s not supported", c->name, pv_wtype_name(t));
        return;
    }
    float *values = NULL;
    void *bytes = random_table(c, t, n_rows, dim, &values);
    int32_t *ids = xmalloc((size_t)n_ids * sizeof *ids), *dev_ids = xmalloc((size_t)(dev_off + n_dev) * sizeof *dev_ids);
    for (int64_t j = 0; j < (int64_t)dev_off + n_dev; j++)
        dev_ids[j] = j >= (int64_t)dev_off && (j - (int64_t)dev_off) % 7 == 3 ? bad_device_id(j, n_rows)
                                                                           : rng_below(&c->rng, n_rows);
    for (int32_t i = 0; i < n_ids; i++)
        ids[i] = i % 3 == 0 ? rng_below(&c->rng, n_rows)
                            : -(1 + (i == 1 ? 0 : i == 2 ? (int32_t)n_dev - 1 : rng_below(&c->rng, n_dev)));
    const size_t out_n = (size_t)n_ids * (size_t)dim;
    float *want = xmalloc(out_n * sizeof *want), *got = xmalloc(out_n * sizeof *got);
    int64_t zero_rows = 0;
    for (int32_t i = 0; i < n_ids; i++) {
        const int32_t id = ids[i] >= 0 ? ids[i] : dev_ids[dev_off + (uint64_t)(-(int64_t)ids[i] - 1)];
        const int valid = id >= 0 && id < n_rows;
        zero_rows += !valid;
        for (int64_t e = 0; e < dim; e++)
            want[(size_t)i * (size_t)dim + (size_t)e] = valid ? values[(size_t)id * (size_t)dim + (size_t)e] : 0.0f;
    }
    pv_buffer *table = NULL, *ids_dev = NULL;
    tensor out = {0};
    pv_status st = table_buffer(c->be, t, n_rows, dim, bytes, &table);
    if (st == PV_OK)
        st = pv_buffer_init(&ids_dev, c->be, PV_MEM_DEVICE, (dev_off + (uint64_t)n_dev) * sizeof(int32_t));
    if (st == PV_OK)
        st = pv_buffer_write(ids_dev, 0, dev_ids, (dev_off + (uint64_t)n_dev) * sizeof(int32_t));
    if (st == PV_OK)
        st = tensor_init(&out, c->be, PV_MEM_DEVICE, sizeof(float), out_n, NULL);
    if (st == PV_OK) {
        pv_embed_gather_args a = {.table_type = t, .n_rows = n_rows, .dim = dim, .table = table, .ids = ids,
                                  .n_ids = n_ids, .out = out.buf, .out_off = out.off, .ids_dev = ids_dev,
                                  .ids_dev_off = dev_off, .n_ids_dev = n_dev};
        st = pv_embed_gather(c->be, &a);
    }
    if (st == PV_OK)
        st = tensor_read(&out, got);
    int64_t differ = 0;
    for (size_t k = 0; k < out_n; k++)
        differ += got[k] != want[k];
    check(c, st, differ == 0 && guards_intact(&out),
          "embed_gather %s of %d ids (host and device, %lld device ids out of range) from %lld device ids at "
          "element %llu: each row its id's, zeros out of range, nothing around out (%lld values differ)",
          pv_wtype_name(t), n_ids, (long long)zero_rows, (long long)n_dev, (unsigned long long)dev_off,
          (long long)differ);
    tensor_free(&out);
    pv_buffer_free(table);
    pv_buffer_free(ids_dev);
    free(bytes);
    free(values);
    free(ids);
    free(dev_ids);
    free(want);
    free(got);
}

/* ---- the decode chain: sample on the device, embed what was sampled --------------- */

/* The engine's step on the device: sample_batch of s into out_dev (from
 * element 5), then embed_gather of ids that take those tokens as device
 * ids (in reverse order, then three host ids) from a table of s->cols
 * rows, on the compute queue with no host read between, recorded into a
 * graph with in_graph, where sample_batch into host out must be refused.
 * *tokens and *rows get what they wrote. */
#define CHAIN_DIM 64
#define CHAIN_OFF 5
static pv_status run_chain(ctx *c, const sample_rows *s, pv_buffer *table, int in_graph, int32_t *tokens, float *rows)
{
    const int32_t n_ids = (int32_t)s->rows + 3;
    int32_t *ids = xmalloc((size_t)n_ids * sizeof *ids);
    for (int32_t i = 0; i < (int32_t)s->rows; i++)
        ids[i] = -(int32_t)(s->rows - i); /* device id rows - 1 - i */
    ids[s->rows] = 7;
    ids[s->rows + 1] = 0;
    ids[s->rows + 2] = (int32_t)s->cols - 1;
    tensor logits = {0}, out = {0};
    pv_buffer *dev = NULL;
    pv_status st = tensor_init(&logits, c->be, PV_MEM_DEVICE, sizeof(float), (uint64_t)(s->rows * s->cols), s->x);
    if (st == PV_OK)
        st = tensor_init(&out, c->be, PV_MEM_DEVICE, sizeof(float), (uint64_t)n_ids * CHAIN_DIM, NULL);
    if (st == PV_OK)
        st = token_buffer(c->be, CHAIN_OFF, s->rows, &dev);
    pv_sample_batch_args a = batch_args(s, &logits);
    pv_embed_gather_args e = {.table_type = PV_W_F32, .n_rows = s->cols, .dim = CHAIN_DIM, .table = table,
                              .ids = ids, .n_ids = n_ids, .out = out.buf, .out_off = out.off, .ids_dev = dev,
                              .ids_dev_off = CHAIN_OFF, .n_ids_dev = s->rows};
    pv_status refused = PV_ERR_UNSUPPORTED;
    if (st == PV_OK && in_graph) {
        /* a key per shape, as the model keys its steps: under one key a
         * step of another shape differs from the recording and runs nothing */
        st = pv_backend_graph_begin(c->be, 0x5a3b1e ^ (uint64_t)s->rows << 32 ^ (uint64_t)s->cols << 48);
        a.out = tokens;
        refused = st == PV_OK ? pv_sample_batch(c->be, &a) : PV_ERR_UNSUPPORTED;
        a.out = NULL;
    }
    a.out_dev = dev;
    a.out_dev_off = CHAIN_OFF;
    pv_status ops = st;
    if (ops == PV_OK)
        ops = pv_sample_batch(c->be, &a);
    if (ops == PV_OK)
        ops = pv_embed_gather(c->be, &e);
    if (st == PV_OK && in_graph) {
        int ran = 0;
        st = pv_backend_graph_end(c->be, ops == PV_OK, &ran);
        if (st == PV_OK && ops == PV_OK && !ran)
            st = pv_error(PV_ERR_STATE, "the graph of sample_batch and embed_gather did not run");
        if (st == PV_OK && refused != PV_ERR_UNSUPPORTED)
            st = pv_error(PV_ERR_STATE, "sample_batch into host out while a graph was recorded gave %s, not %s",
                          pv_status_str(refused), pv_status_str(PV_ERR_UNSUPPORTED));
    }
    if (st == PV_OK)
        st = ops;
    if (st == PV_OK)
        st = tensor_read(&out, rows); /* the first host read */
    if (st == PV_OK)
        st = read_device_tokens(c->be, dev, CHAIN_OFF, s->rows, tokens);
    if (st == PV_OK && !guards_intact(&out))
        st = pv_error(PV_ERR_STATE, "embed_gather wrote around its out");
    pv_buffer_free(dev);
    tensor_free(&out);
    tensor_free(&logits);
    free(ids);
    return st;
}

/* The chain gives the tokens host out gives, and the table rows of those
 * tokens (and of the host ids); then the same recorded into a graph on a
 * backend with graphs (the plain run first grows any bias scratch, which a
 * recording may not). */
static void check_chain(ctx *c, int64_t rows, int64_t vocab)
{
    if (!sample_batch_supported(c))
        return;
    sample_rows s;
    random_rows(c, &s, rows, vocab);
    random_bias(c, &s);
    float *values = NULL;
    void *bytes = random_table(c, PV_W_F32, vocab, CHAIN_DIM, &values);
    const int64_t n_ids = rows + 3;
    int32_t *want = xmalloc((size_t)rows * sizeof *want), *tokens = xmalloc((size_t)rows * sizeof *tokens);
    float *got = xmalloc((size_t)n_ids * CHAIN_DIM * sizeof *got);
    pv_buffer *table = NULL;
    pv_status st = table_buffer(c->be, PV_W_F32, vocab, CHAIN_DIM, bytes, &table);
    if (st == PV_OK)
        st = run_batch(c->be, &s, want);
    for (int in_graph = 0; in_graph < 2; in_graph++) {
        if (in_graph && !pv_backend_graphs(c->be)) {
            tap_skip("%s: no graphs to record sample_batch into out_dev in", c->name);
            break;
        }
        pv_status run = st == PV_OK ? run_chain(c, &s, table, in_graph, tokens, got) : st;
        int64_t bad_tokens = 0, bad_rows = 0;
        for (int64_t i = 0; i < n_ids && run == PV_OK; i++) {
            const int32_t id = i < rows ? tokens[rows - 1 - i] : i == rows ? 7 : i == rows + 1 ? 0 : (int32_t)vocab - 1;
            bad_rows += memcmp(got + i * CHAIN_DIM, values + (int64_t)id * CHAIN_DIM, CHAIN_DIM * sizeof *got) != 0;
        }
        for (int64_t r = 0; r < rows && run == PV_OK; r++)
            bad_tokens += tokens[r] != want[r];
        check(c, run, bad_tokens == 0 && bad_rows == 0,
              "sample_batch of %lld rows x %lld with a bias into out_dev, then embed_gather of its tokens as device "
              "ids, no host read between%s: host out's tokens (%lld differ), their rows (%lld differ)",
              (long long)rows, (long long)vocab,
              in_graph ? ", recorded into a graph (host out refused there)" : "", (long long)bad_tokens,
              (long long)bad_rows);
    }
    pv_buffer_free(table);
    free(bytes);
    free(values);
    free(want);
    free(tokens);
    free(got);
    rows_free(&s);
}

/* ---- the run ------------------------------------------------------------------------ */

static void run_all(ctx *c)
{
    tap_diag("%s: %s (%s)", c->name, c->be->info.name, c->be->info.vendor);
    const transfer_case transfers[] = {
        /* SmolLM2's slot (chunk 32, 3 KV heads of 64, f16): swap-in and swap-out */
        {PV_F16, 2 * 32 * 3 * 64, PV_MEM_HOST, PV_MEM_DEVICE, 40, 24, 17},
        {PV_F16, 2 * 32 * 3 * 64, PV_MEM_DEVICE, PV_MEM_HOST, 24, 40, 24},
        {PV_F32, 2 * 16 * 2 * 64, PV_MEM_HOST, PV_MEM_DEVICE, 9, 30, 9},
        {PV_F32, 2 * 16 * 2 * 64, PV_MEM_DEVICE, PV_MEM_DEVICE, 12, 12, 7},
        {PV_F32, 2 * 16 * 2 * 64, PV_MEM_HOST, PV_MEM_HOST, 12, 12, 12},
        /* odd sizes: one word a slot, and a slot shorter than a work-group's words */
        {PV_F16, 2, PV_MEM_HOST, PV_MEM_DEVICE, 100, 100, 99},
        {PV_F32, 37, PV_MEM_DEVICE, PV_MEM_HOST, 50, 64, 1},
        /* more slots than CUDA's grid has rows (65535): launched in parts */
        {PV_F32, 1, PV_MEM_HOST, PV_MEM_DEVICE, 70000, 70001, 70000},
    };
    for (size_t i = 0; i < sizeof transfers / sizeof transfers[0]; i++)
        check_transfer(c, &transfers[i]);
    check_transfer_order(c);

    check_sample_batch_known(c);
    check_sample_batch(c, 9, 32000);
    check_sample_batch(c, 40, 1000);
    check_sample_batch(c, 2, 3);
    check_host_out_calls(c, 257);

    /* into the device, with and without a bias; many rows; offsets */
    static const struct {
        int64_t rows, cols;
        uint64_t dev_off;
    } device_cases[] = {{9, 32000, 0}, {40, 1000, 7}, {300, 64, 1000}, {2, 3, 1}};
    for (int biased = 0; biased < 2; biased++)
        for (size_t i = 0; i < sizeof device_cases / sizeof device_cases[0]; i++)
            check_device_out(c, device_cases[i].rows, device_cases[i].cols, device_cases[i].dev_off, biased);
    check_empty_bias(c);
    check_bias_known(c);
    check_bans(c);

    check_device_ids(c, PV_W_F32, 300, 64, 40, 12, 0);
    check_device_ids(c, PV_W_F16, 50, 96, 17, 5, 9);
    check_device_ids(c, PV_W_Q8_0, 200, 64, 70000, 30, 3); /* more ids than CUDA's grid has rows */
    check_chain(c, 12, 300);
    check_chain(c, 33, 2000);
}

int main(int argc, char **argv)
{
    return check_main(argc, argv, 20261127, run_all, NULL);
}
