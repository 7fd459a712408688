/* The two ops that take a step's host work in one call, on every backend
 * against the CPU reference (test-backend-ops.c's conventions: the CPU
 * itself against closed forms first, then each other backend that opens
 * against the CPU, a backend with no device a SKIP):
 *   - slot_transfer: whole slots between two pools (host -> device for
 *     swap-in, device -> host for swap-out, and the other pairs), bit for
 *     bit, every byte of both buffers compared, with sentinel bytes past
 *     each pool; its queue rules: a transfer out waits for the compute
 *     that wrote its slots, and compute that waits for a transfer in sees
 *     its bytes; no slots still orders `done` after `wait`;
 *   - sample_batch: a step's rows, greedy and sampled mixed, against this
 *     backend's own argmax and sample_top_p row by row (exactly: the same
 *     code), against the CPU (greedy rows exactly, ties to the lowest id;
 *     sampled rows up to rounding), and known answers.
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
} sample_rows;

static pv_status run_batch(pv_backend *be, const sample_rows *s, int32_t *out)
{
    tensor tx;
    pv_status st = tensor_init(&tx, be, PV_MEM_DEVICE, sizeof(float), (uint64_t)(s->rows * s->cols), s->x);
    if (st == PV_OK) {
        pv_sample_batch_args a = {.rows = s->rows, .cols = s->cols, .logits = tx.buf, .logits_off = tx.off,
                                  .temperature = s->temperature, .top_p = s->top_p, .u = s->u, .out = out};
        st = pv_sample_batch(be, &a);
    }
    if (st == PV_OK && !guards_intact(&tx))
        st = pv_error(PV_ERR_STATE, "sample_batch changed the guard bytes around its logits");
    tensor_free(&tx);
    return st;
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
 * u. */
static void random_rows(ctx *c, sample_rows *s, int64_t rows, int64_t cols)
{
    s->rows = rows;
    s->cols = cols;
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

static void rows_free(sample_rows *s)
{
    free(s->x);
    free(s->temperature);
    free(s->top_p);
    free(s->u);
}

/* A sampled row's token off by rounding: f32 sums on a device and the
 * CPU's double sums differ by ~1e-6, which can move the u * mass target or
 * the top_p threshold across a token boundary. Such a token passes only if
 * the CPU itself draws it for some u and top_p within SAMPLE_SLACK. */
#define SAMPLE_SLACK 1e-4f

static int cpu_draws_nearby(ctx *c, const sample_rows *s, int64_t r, int32_t token)
{
    sample_rows one = {.rows = 1, .cols = s->cols, .x = s->x + r * s->cols, .temperature = &s->temperature[r]};
    for (int du = -1; du <= 1; du++)
        for (int dp = -1; dp <= 1; dp++) {
            float u = s->u[r] + (float)du * SAMPLE_SLACK, p = s->top_p[r] + (float)dp * SAMPLE_SLACK;
            int32_t near = -1;
            p = p > 1.0f ? 1.0f : p;
            one.u = &u;
            one.top_p = &p;
            if (run_batch(c->cpu, &one, &near) == PV_OK && near == token)
                return 1;
        }
    return 0;
}

static void check_sample_batch(ctx *c, int64_t rows, int64_t cols)
{
    if (!pv_backend_supports(c->be, PV_OP_SAMPLE_BATCH, PV_F32)) {
        if (c->cpu_pass)
            ok(0, "cpu: sample_batch must be supported by the reference");
        else
            tap_skip("%s: sample_batch not supported", c->name);
        return;
    }
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
    if (!c->cpu_pass && st == PV_OK) {
        int32_t *want = xmalloc((size_t)rows * sizeof *want);
        st = run_batch(c->cpu, &s, want);
        int64_t greedy_bad = 0, sampled_bad = 0, rounded = 0;
        for (int64_t r = 0; r < rows && st == PV_OK; r++) {
            if (got[r] == want[r])
                continue;
            if (s.temperature[r] <= 0.0f)
                greedy_bad++;
            else if (cpu_draws_nearby(c, &s, r, got[r]))
                rounded++;
            else
                sampled_bad++;
        }
        if (rounded)
            tap_diag("%s: %lld sampled rows drew a token next to the CPU's (rounding at a boundary)", c->name,
                     (long long)rounded);
        check(c, st, greedy_bad == 0 && sampled_bad == 0,
              "sample_batch of %lld rows x %lld: the CPU's tokens (greedy rows exactly: %lld differ; sampled "
              "up to rounding: %lld differ)",
              (long long)rows, (long long)cols, (long long)greedy_bad, (long long)sampled_bad);
        free(want);
    }
    free(got);
    free(alone);
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
}

int main(int argc, char **argv)
{
    return check_main(argc, argv, 20261127, run_all, NULL);
}
