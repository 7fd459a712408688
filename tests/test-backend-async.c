/* Asynchronous ops on every built backend: host index arrays reused at
 * once, many ops in flight, both queues ordered by events.
 *
 * The CUDA backend copies each op's host index arrays into a ring of
 * staging buffers and runs the op later on its compute stream; this test
 * is the check of that ring. Every call below changes the index arrays as
 * soon as the call returns, more ops are queued than the ring has entries
 * (without a finish in between), some need a larger entry than the ring
 * holds, and the results are compared with a replay on the host. A backend
 * that read an index array after the call, reused a staging entry too
 * early or lost an event between its queues gets a different pool. The
 * same contract holds for every backend, so all built ones run it; CUDA
 * skips without a GPU.
 *
 * Then the queue contract of backend.h: with a long chain of copies in
 * flight on the copy queue, a buffer write, an op, buffer frees and the
 * read of the op's result all complete while the chain is still running. */
#include "backends/backend.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 32
#define KV_HEADS 2
#define HEAD_DIM 16
#define ROW_ELEMS (KV_HEADS * HEAD_DIM)
#define SLOT_ELEMS (2 * CHUNK * ROW_ELEMS)
#define N_SLOTS 8
#define POSITIONS (N_SLOTS * CHUNK)
#define N_WRITES 100     /* several laps of any small staging ring */
#define BIG_CHUNKS 4096  /* a 16 KiB slot table: larger than a first staging entry */
#define N_MOVED 5
#define ARGMAX_CALLS 24
#define ARGMAX_COLS 1000

/* K of write i, element e; V is its negative. Exact in f32. */
static float k_value(int i, int e)
{
    return (float)(i * 1000 + e);
}

/* The slot of chunk c for write i: the table turns by one slot per write. */
static int32_t slot_of(int i, int c)
{
    return (int32_t)((c + i) % N_SLOTS);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        printf("Bail out! cannot allocate %zu bytes of test data\n", n * size);
        exit(1);
    }
    return p;
}

/* Writes N_WRITES token rows through kv_write with no finish in between and
 * returns the pool contents expected from replaying them in order. */
static pv_status queue_writes(pv_backend *be, pv_buffer *kv_src, pv_buffer *pool, float *expected)
{
    int32_t *table = xcalloc(BIG_CHUNKS, sizeof *table);
    int32_t token_seq[1] = {0}, token_pos[1];
    pv_status st = PV_OK;
    for (int i = 0; i < N_WRITES && st == PV_OK; i++) {
        /* 97 is odd, so the first POSITIONS writes all land on new positions. */
        int32_t pos = (int32_t)((i * 97) % POSITIONS);
        int big = i % 10 == 9;
        int32_t max_chunks = big ? BIG_CHUNKS : N_SLOTS;
        for (int32_t c = 0; c < max_chunks; c++)
            table[c] = c < N_SLOTS ? slot_of(i, c) : -1;
        token_pos[0] = pos;
        pv_kv_write_args a = {
            .kv_dtype = PV_F32, .n_tokens = 1, .n_kv_heads = KV_HEADS, .head_dim = HEAD_DIM,
            .chunk_tokens = CHUNK, .k = kv_src, .k_off = (uint64_t)i * ROW_ELEMS, .v = kv_src,
            .v_off = (uint64_t)(N_WRITES + i) * ROW_ELEMS, .kv_pool = pool, .n_slots = N_SLOTS,
            .token_seq = token_seq, .token_pos = token_pos, .slot_table = table, .n_seqs = 1,
            .max_chunks = max_chunks,
        };
        st = pv_kv_write(be, &a);
        /* The call has returned: the arrays are the caller's again. */
        token_pos[0] = (pos + CHUNK) % POSITIONS;
        for (int32_t c = 0; c < N_SLOTS; c++)
            table[c] = (int32_t)(N_SLOTS - 1 - c);

        float *k = expected + (size_t)slot_of(i, pos / CHUNK) * SLOT_ELEMS + (size_t)(pos % CHUNK) * ROW_ELEMS;
        for (int e = 0; e < ROW_ELEMS; e++) {
            k[e] = k_value(i, e);
            k[CHUNK * ROW_ELEMS + e] = -k_value(i, e);
        }
    }
    free(table);
    return st;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHAIN_BYTES ((uint64_t)64 << 20) /* one host -> device copy of the chain */
#define CHAIN_SECONDS 1.0                /* how long the chain keeps the copy queue busy */
#define ADD_N 4096

/* 1 when ev is done; a failed query fails the test with its message. */
static int is_done(pv_event *ev, const char *name)
{
    int done = 0;
    pv_status st = pv_event_query(ev, &done);
    if (st != PV_OK)
        tap_diag("%s: pv_event_query: %s", name, pv_last_error());
    return st != PV_OK || done;
}

/* The queue contract of backend.h. The chain is CHAIN_SECONDS of host ->
 * device copies on the copy queue (timed on one copy first); then, on the
 * compute side, a buffer write, an add, the free of a host and a device
 * buffer, and the blocking read of the add's result. The chain's last
 * event must still be pending after the read: a read, write or free that
 * waited for the copy queue (or held the compute queue behind it) would
 * find it complete. */
static void check_read_beside_copies(pv_backend *be, const char *name)
{
    if (strcmp(name, "cpu") == 0) {
        tap_skip("%s: copies complete before copy_async returns, so none is ever in flight", name);
        return;
    }
    float *a = xcalloc(ADD_N, sizeof *a), *b = xcalloc(ADD_N, sizeof *b), *sum = xcalloc(ADD_N, sizeof *sum);
    pv_buffer *host = NULL, *dev = NULL, *ba = NULL, *bb = NULL, *bsum = NULL, *spare_host = NULL, *spare_dev = NULL;
    pv_event *one = NULL, *last = NULL;
    pv_status st = pv_buffer_init(&host, be, PV_MEM_HOST, CHAIN_BYTES);
    if (st == PV_OK)
        st = pv_buffer_init(&dev, be, PV_MEM_DEVICE, CHAIN_BYTES);
    if (st == PV_OK)
        st = pv_buffer_init(&ba, be, PV_MEM_DEVICE, ADD_N * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&bb, be, PV_MEM_DEVICE, ADD_N * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&bsum, be, PV_MEM_DEVICE, ADD_N * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&spare_host, be, PV_MEM_HOST, 4096);
    if (st == PV_OK)
        st = pv_buffer_init(&spare_dev, be, PV_MEM_DEVICE, 4096);
    for (int i = 0; i < ADD_N; i++)
        b[i] = (float)i;
    if (st == PV_OK) {
        memset(host->host_ptr, 0x3c, CHAIN_BYTES);
        st = pv_buffer_write(bb, 0, b, ADD_N * sizeof(float));
    }
    pv_add_args add = {.n = ADD_N, .a = ba, .b = bb, .out = bsum};
    /* Warm up: kernels built, memory touched. */
    if (st == PV_OK)
        st = pv_buffer_write(ba, 0, b, ADD_N * sizeof(float));
    if (st == PV_OK)
        st = pv_add(be, &add);
    if (st == PV_OK)
        st = pv_buffer_read(bsum, 0, sum, ADD_N * sizeof(float));
    /* Time the second copy: the first also faults the pages in. */
    double t0 = 0.0;
    for (int i = 0; i < 2 && st == PV_OK; i++) {
        pv_event_free(one);
        one = NULL;
        t0 = now_s();
        st = pv_copy_async(PV_QUEUE_COPY, dev, 0, host, 0, CHAIN_BYTES, NULL, &one);
        if (st == PV_OK)
            st = pv_event_wait(one);
    }
    double per_copy = now_s() - t0;
    int n_copies = (int)(CHAIN_SECONDS / (per_copy > 1e-4 ? per_copy : 1e-4)) + 1;
    n_copies = n_copies > 20000 ? 20000 : n_copies;
    if (!ok(st == PV_OK, "%s: contract setup: buffers, warm-up, one %.0f MiB copy in %.1f ms", name,
            (double)CHAIN_BYTES / (1 << 20), per_copy * 1e3)) {
        tap_diag("%s", pv_last_error());
        goto out;
    }

    t0 = now_s();
    for (int i = 0; i < n_copies && st == PV_OK; i++)
        st = pv_copy_async(PV_QUEUE_COPY, dev, 0, host, 0, CHAIN_BYTES, NULL, i == n_copies - 1 ? &last : NULL);
    double t_enqueued = now_s() - t0;
    int pending_after_enqueue = st == PV_OK && !is_done(last, name);
    for (int i = 0; i < ADD_N; i++)
        a[i] = 0.5f * (float)i;
    /* each call's end, so that a driver that serialises one of them
     * behind the copy queue (NVIDIA's OpenCL did, 2026-11) is named */
    pv_buffer_free(spare_host);
    pv_buffer_free(spare_dev);
    spare_host = spare_dev = NULL;
    const double t_frees = now_s() - t0;
    if (st == PV_OK)
        st = pv_buffer_write(ba, 0, a, ADD_N * sizeof(float));
    const double t_write = now_s() - t0;
    if (st == PV_OK)
        st = pv_add(be, &add);
    const double t_add = now_s() - t0;
    if (st == PV_OK)
        st = pv_buffer_read(bsum, 0, sum, ADD_N * sizeof(float));
    double t_read = now_s() - t0;
    int pending_after_read = st == PV_OK && !is_done(last, name);
    int sum_ok = st == PV_OK;
    for (int i = 0; i < ADD_N && sum_ok; i++)
        sum_ok = sum[i] == 1.5f * (float)i;
    if (st == PV_OK)
        st = pv_event_wait(last);
    double t_chain = now_s() - t0;
    tap_diag("%s: %d copies of %.0f MiB enqueued in %.1f ms; frees done at %.1f ms, write at %.1f ms, add at "
             "%.1f ms, read at %.1f ms; chain done at %.1f ms",
             name, n_copies, (double)CHAIN_BYTES / (1 << 20), t_enqueued * 1e3, t_frees * 1e3, t_write * 1e3,
             t_add * 1e3, t_read * 1e3, t_chain * 1e3);
    ok(st == PV_OK && pending_after_enqueue, "%s: copy_async returns with the copy chain still in flight%s%s", name,
       st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());
    ok(st == PV_OK && pending_after_read && sum_ok,
       "%s: write, add, buffer frees and the read of the add's result complete while the copy chain is in flight"
       " (and the sum is right)",
       name);
    unsigned char head[64], tail[64];
    if (st == PV_OK)
        st = pv_buffer_read(dev, 0, head, sizeof head);
    if (st == PV_OK)
        st = pv_buffer_read(dev, CHAIN_BYTES - sizeof tail, tail, sizeof tail);
    int copied = st == PV_OK;
    for (size_t i = 0; i < sizeof head && copied; i++)
        copied = head[i] == 0x3c && tail[i] == 0x3c;
    ok(copied, "%s: after the chain's event, the copied bytes read back%s%s", name, st == PV_OK ? "" : ": ",
       st == PV_OK ? "" : pv_last_error());
out:
    pv_event_free(one);
    pv_event_free(last);
    pv_buffer_free(host);
    pv_buffer_free(dev);
    pv_buffer_free(ba);
    pv_buffer_free(bb);
    pv_buffer_free(bsum);
    pv_buffer_free(spare_host);
    pv_buffer_free(spare_dev);
    free(a);
    free(b);
    free(sum);
}

static int same_floats(const float *a, const float *b, size_t n, size_t *first_diff)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
            *first_diff = i;
            return 0;
        }
    return 1;
}

static void run_backend(pv_backend *be, const char *name)
{
    size_t pool_bytes = (size_t)N_SLOTS * SLOT_ELEMS * sizeof(float);
    size_t moved_bytes = (size_t)N_MOVED * SLOT_ELEMS * sizeof(float);
    float *src = xcalloc((size_t)2 * N_WRITES * ROW_ELEMS, sizeof *src);
    float *expected = xcalloc((size_t)N_SLOTS * SLOT_ELEMS, sizeof *expected);
    float *got = xcalloc((size_t)N_SLOTS * SLOT_ELEMS, sizeof *got);
    float *logits = xcalloc((size_t)ARGMAX_CALLS * ARGMAX_COLS, sizeof *logits);
    for (int i = 0; i < N_WRITES; i++)
        for (int e = 0; e < ROW_ELEMS; e++) {
            src[(size_t)i * ROW_ELEMS + e] = k_value(i, e);
            src[(size_t)(N_WRITES + i) * ROW_ELEMS + e] = -k_value(i, e);
        }

    pv_buffer *kv_src = NULL, *pool = NULL, *pool2 = NULL, *staging = NULL, *staging2 = NULL;
    pv_buffer *host = NULL, *logit_buf = NULL;
    pv_status st = pv_buffer_init(&kv_src, be, PV_MEM_DEVICE, (uint64_t)2 * N_WRITES * ROW_ELEMS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&pool2, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&staging, be, PV_MEM_DEVICE, moved_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&staging2, be, PV_MEM_DEVICE, moved_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&host, be, PV_MEM_HOST, moved_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&logit_buf, be, PV_MEM_DEVICE, (uint64_t)ARGMAX_CALLS * ARGMAX_COLS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_write(kv_src, 0, src, (uint64_t)2 * N_WRITES * ROW_ELEMS * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, expected, pool_bytes); /* zeros */
    if (!ok(st == PV_OK, "%s: buffers allocate and fill (%s)", name, st == PV_OK ? "ok" : pv_last_error()))
        goto out;

    /* 1. kv_write: many in flight, index arrays changed after each call. */
    st = queue_writes(be, kv_src, pool, expected);
    if (st == PV_OK)
        st = pv_buffer_read(pool, 0, got, pool_bytes);
    size_t diff = 0;
    ok(st == PV_OK && same_floats(got, expected, (size_t)N_SLOTS * SLOT_ELEMS, &diff),
       "%s: %d queued kv_writes with reused index arrays land where the host replay puts them%s%s",
       name, N_WRITES, st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());
    if (st == PV_OK && diff)
        tap_diag("first difference at element %zu: got %g, expected %g", diff, (double)got[diff],
                 (double)expected[diff]);

    /* 2. gather on the compute queue -> copy queue to pinned host memory,
     * ordered by an event; then host -> copy queue -> compute queue scatter. */
    int32_t slots[N_MOVED] = {6, 1, 7, 3, 0};
    const int32_t order[N_MOVED] = {6, 1, 7, 3, 0};
    pv_slot_copy_args g = {.dtype = PV_F32, .slot_elems = SLOT_ELEMS, .pool = pool, .n_slots = N_SLOTS,
                           .staging = staging, .staging_off = 0, .slots = slots, .n_slots_moved = N_MOVED};
    pv_event *gathered = NULL, *landed = NULL, *uploaded = NULL;
    st = pv_slot_gather(be, &g);
    for (int i = 0; i < N_MOVED; i++)
        slots[i] = (int32_t)i; /* too late to matter */
    if (st == PV_OK)
        st = pv_event_record(be, PV_QUEUE_COMPUTE, &gathered);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COPY, host, 0, staging, 0, moved_bytes, gathered, &landed);
    if (st == PV_OK)
        st = pv_event_wait(landed);
    int gather_ok = st == PV_OK;
    for (int i = 0; i < N_MOVED && gather_ok; i++)
        gather_ok = same_floats((const float *)host->host_ptr + (size_t)i * SLOT_ELEMS,
                                expected + (size_t)order[i] * SLOT_ELEMS, SLOT_ELEMS, &diff);
    ok(gather_ok, "%s: slot_gather then an event-ordered copy-queue copy to pinned host memory%s%s",
       name, st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());

    /* Scatter the gathered slots, negated on the host, into a zeroed pool. */
    float *pinned = host->host_ptr;
    for (size_t e = 0; e < (size_t)N_MOVED * SLOT_ELEMS; e++)
        pinned[e] = -pinned[e];
    memset(expected, 0, pool_bytes);
    for (int i = 0; i < N_MOVED; i++)
        memcpy(expected + (size_t)order[i] * SLOT_ELEMS, pinned + (size_t)i * SLOT_ELEMS,
               SLOT_ELEMS * sizeof(float));
    memcpy(slots, order, sizeof slots);
    float *zeros = xcalloc((size_t)N_SLOTS * SLOT_ELEMS, sizeof *zeros);
    if (st == PV_OK)
        st = pv_buffer_write(pool2, 0, zeros, pool_bytes);
    free(zeros);
    if (st == PV_OK)
        st = pv_copy_async(PV_QUEUE_COPY, staging2, 0, host, 0, moved_bytes, NULL, &uploaded);
    if (st == PV_OK)
        st = pv_queue_wait(be, PV_QUEUE_COMPUTE, uploaded);
    pv_slot_copy_args sc = g;
    sc.pool = pool2;
    sc.staging = staging2;
    sc.slots = slots;
    if (st == PV_OK)
        st = pv_slot_scatter(be, &sc);
    for (int i = 0; i < N_MOVED; i++)
        slots[i] = (int32_t)(N_MOVED - 1 - i);
    if (st == PV_OK)
        st = pv_buffer_read(pool2, 0, got, pool_bytes);
    ok(st == PV_OK && same_floats(got, expected, (size_t)N_SLOTS * SLOT_ELEMS, &diff),
       "%s: copy-queue upload, queue_wait, then slot_scatter with a reused slot list%s%s", name,
       st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());
    pv_event_free(gathered);
    pv_event_free(landed);
    pv_event_free(uploaded);

    /* 3. Blocking argmax calls back to back, each row's maximum planted at
     * a different column, some calls needing more rows than the last. */
    for (int r = 0; r < ARGMAX_CALLS; r++)
        for (int c = 0; c < ARGMAX_COLS; c++)
            logits[(size_t)r * ARGMAX_COLS + c] = (float)((c * 7 + r) % 101) / 101.0f;
    for (int r = 0; r < ARGMAX_CALLS; r++)
        logits[(size_t)r * ARGMAX_COLS + (size_t)(r * 41) % ARGMAX_COLS] = 2.0f;
    st = pv_buffer_write(logit_buf, 0, logits, (uint64_t)ARGMAX_CALLS * ARGMAX_COLS * sizeof(float));
    int argmax_ok = st == PV_OK;
    int32_t picks[ARGMAX_CALLS];
    for (int call = 1; call <= ARGMAX_CALLS && argmax_ok; call++) {
        int64_t rows = call % 2 ? call : ARGMAX_CALLS - call + 1;
        pv_argmax_args am = {.rows = rows, .cols = ARGMAX_COLS, .x = logit_buf, .x_off = 0, .out = picks};
        st = pv_argmax(be, &am);
        for (int64_t r = 0; r < rows && st == PV_OK; r++)
            if (picks[r] != (int32_t)((r * 41) % ARGMAX_COLS)) {
                tap_diag("call %d row %lld: argmax %d, expected %d", call, (long long)r, picks[r],
                         (int)((r * 41) % ARGMAX_COLS));
                argmax_ok = 0;
            }
        argmax_ok = argmax_ok && st == PV_OK;
    }
    ok(argmax_ok, "%s: %d blocking argmax calls of varying rows%s%s", name, ARGMAX_CALLS,
       st == PV_OK ? "" : ": ", st == PV_OK ? "" : pv_last_error());

out:
    pv_buffer_free(kv_src);
    pv_buffer_free(pool);
    pv_buffer_free(pool2);
    pv_buffer_free(staging);
    pv_buffer_free(staging2);
    pv_buffer_free(host);
    pv_buffer_free(logit_buf);
    free(src);
    free(expected);
    free(got);
    free(logits);
}

int main(void)
{
    for (const char *const *name = pv_backend_names(); *name; name++) {
        pv_backend *be = NULL;
        pv_status st = pv_backend_init(&be, *name, 0);
        if (st == PV_ERR_NO_DEVICE) {
            tap_skip("backend %s: %s", *name, pv_last_error());
            continue;
        }
        if (!ok(st == PV_OK, "backend %s opens%s%s", *name, st == PV_OK ? "" : ": ",
                st == PV_OK ? "" : pv_last_error()))
            continue;
        run_backend(be, *name);
        check_read_beside_copies(be, *name);
        pv_backend_free(be);
    }
    return tap_done();
}
