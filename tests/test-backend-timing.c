/* Timing markers (backend.h, pv_marker_*) on every built backend: CUDA
 * skips without a GPU.
 *
 * The long interval is a chain of GEMMs sized in the run to take about
 * LONG_S on the backend. Markers around it must give a positive time, no
 * more than the host's wall time from the first record until they are
 * read, and at least half of the host's time until the chain is finished;
 * once they are read, the chain must be done: markers taken on a queue the
 * GEMMs do not run on, or when they are enqueued rather than when the
 * queue reaches them, fail these. The same two markers recorded
 * again back to back give about nothing; read in the wrong order, the long
 * interval comes out negative (the documented answer). On a backend whose
 * ops return before they run (not the CPU), enqueueing the chain and the
 * markers takes a fraction of the chain's time: a record that waited for
 * the queue would take all of it. Misuse is PV_ERR_INVALID_ARG through the
 * front end. On a backend with graphs, markers recorded into a graph take
 * their times when it runs. */
#include "backend-check.h"

#include <math.h>
#include <time.h>

#define GEMM_N 512
#define LONG_S 0.15       /* the chain's target time */
#define MAX_CHAIN 4000    /* GEMMs in the chain at most */
#define CLOCK_SLACK_S 1e-3 /* two clocks read a moment apart */
#define EMPTY_ATTEMPTS 3

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct fixture {
    pv_backend *be;
    const char *name;
    pv_buffer *a, *b, *c;
    pv_gemm_args gemm;
    int chain; /* GEMMs in the long op */
} fixture;

static pv_status fixture_init(fixture *f, pv_backend *be, const char *name)
{
    *f = (fixture){.be = be, .name = name};
    const uint64_t bytes = (uint64_t)GEMM_N * GEMM_N * sizeof(float);
    float *fill = xmalloc((size_t)bytes);
    uint64_t rng = 7;
    rng_fill(&rng, fill, (size_t)GEMM_N * GEMM_N, -1.0f, 1.0f);
    pv_buffer **bufs[] = {&f->a, &f->b, &f->c};
    pv_status st = PV_OK;
    for (int i = 0; i < 3 && st == PV_OK; i++)
        if ((st = pv_buffer_init(bufs[i], be, PV_MEM_DEVICE, bytes)) == PV_OK)
            st = pv_buffer_write(*bufs[i], 0, fill, bytes);
    free(fill);
    f->gemm = (pv_gemm_args){.dtype = PV_F32, .trans_b = 1, .m = GEMM_N, .n = GEMM_N, .k = GEMM_N, .alpha = 1.0f,
                             .a = f->a, .lda = GEMM_N, .b = f->b, .ldb = GEMM_N, .c = f->c, .ldc = GEMM_N};
    /* The first call may build kernels (CLBlast, NVRTC): not the op's time. */
    if (st == PV_OK && (st = pv_gemm(be, &f->gemm)) == PV_OK)
        st = pv_backend_finish(be);
    /* The chain: enough GEMMs for LONG_S at the best of three timings. */
    double one = INFINITY;
    for (int r = 0; r < 3 && st == PV_OK; r++) {
        const double t0 = now_s();
        if ((st = pv_gemm(be, &f->gemm)) == PV_OK)
            st = pv_backend_finish(be);
        one = fmin(one, now_s() - t0);
    }
    f->chain = st == PV_OK ? (int)fmin(MAX_CHAIN, ceil(LONG_S / fmax(one, 1e-6))) : 0;
    return st;
}

static void fixture_free(fixture *f)
{
    pv_buffer_free(f->a);
    pv_buffer_free(f->b);
    pv_buffer_free(f->c);
}

static pv_status enqueue_chain(fixture *f)
{
    for (int i = 0; i < f->chain; i++)
        PV_TRY(pv_gemm(f->be, &f->gemm));
    return PV_OK;
}

/* 1 when the backend's ops return before they have run: the chain
 * enqueues in under half of the time it takes to run. */
static int ops_asynchronous(fixture *f)
{
    const double t0 = now_s();
    pv_status st = enqueue_chain(f);
    const double enqueued = now_s() - t0;
    if (st == PV_OK)
        st = pv_backend_finish(f->be);
    return st == PV_OK && enqueued < 0.5 * (now_s() - t0);
}

/* The long interval, the same markers again for an empty one, and the
 * long one read backwards. */
static void check_intervals(fixture *f, pv_marker *start, pv_marker *end)
{
    const int asynchronous = ops_asynchronous(f);
    double long_s = 0;
    pv_event *chain_done = NULL;
    int done_at_end = 0;
    const double t0 = now_s();
    pv_status st = pv_marker_record(f->be, start);
    if (st == PV_OK)
        st = enqueue_chain(f);
    if (st == PV_OK)
        st = pv_event_record(f->be, PV_QUEUE_COMPUTE, &chain_done);
    if (st == PV_OK)
        st = pv_marker_record(f->be, end);
    const double enqueued = now_s() - t0;
    if (st == PV_OK)
        st = pv_marker_elapsed(f->be, start, end, &long_s);
    const double read = now_s() - t0;
    if (st == PV_OK)
        st = pv_event_query(chain_done, &done_at_end);
    if (st == PV_OK)
        st = pv_backend_finish(f->be);
    const double finished = now_s() - t0;
    pv_event_free(chain_done);
    if (!ok(st == PV_OK, "%s: markers around %d GEMMs of %d^3 are recorded and read", f->name, f->chain, GEMM_N)) {
        tap_diag("%s", pv_last_error());
        return;
    }
    tap_diag("%s: %d GEMMs: %.3f ms between the markers; on the host %.3f ms to enqueue, %.3f ms to read the "
             "markers, %.3f ms to finish", f->name, f->chain, long_s * 1e3, enqueued * 1e3, read * 1e3,
             finished * 1e3);
    ok(long_s > 0, "%s: the time between markers around the GEMMs is positive (%.6f s)", f->name, long_s);
    ok(long_s <= read + CLOCK_SLACK_S,
       "%s: and no more than the host's wall time from the first record to the read (%.6f <= %.6f s)", f->name,
       long_s, read);
    ok(done_at_end, "%s: once the markers are read, the GEMMs enqueued before the end marker are done", f->name);
    ok(long_s >= 0.5 * finished,
       "%s: the markers bracket the GEMMs: at least half of the host's time from the first record to the finish "
       "(%.6f >= %.6f s)", f->name, long_s, 0.5 * finished);
    if (asynchronous)
        ok(enqueued < 0.5 * long_s,
           "%s: recording the markers does not wait for the queue: the GEMMs and markers enqueue in %.6f s, "
           "under half of their %.6f s", f->name, enqueued, long_s);
    else
        tap_skip("%s: its ops run inside their calls, so no record can be told from a waiting one", f->name);

    double back = 0;
    st = pv_marker_elapsed(f->be, end, start, &back);
    ok(st == PV_OK && back < 0 && fabs(back + long_s) <= 1e-6 + 1e-3 * long_s,
       "%s: read in the wrong order, the interval is negative: %.6f s = -%.6f s", f->name, back, long_s);

    /* Up to three pairs, until one reads short: a busy machine may hold
     * the device's thread between any two markers. */
    double empty = -1, empty_wall = 0;
    int empty_ok = 0;
    for (int attempt = 0; attempt < EMPTY_ATTEMPTS && !empty_ok; attempt++) {
        const double e0 = now_s();
        st = pv_marker_record(f->be, start);
        if (st == PV_OK)
            st = pv_marker_record(f->be, end);
        if (st == PV_OK)
            st = pv_marker_elapsed(f->be, start, end, &empty);
        empty_wall = now_s() - e0;
        empty_ok = st == PV_OK && empty >= 0 && empty <= empty_wall + CLOCK_SLACK_S && empty < 0.01 * long_s;
    }
    ok(empty_ok,
       "%s: the same markers recorded again back to back: %.6f s, >= 0 and under 1%% of the GEMMs' time "
       "(host %.6f s; the last of up to %d pairs)", f->name, empty, empty_wall, EMPTY_ATTEMPTS);
}

/* NULLs, a marker never recorded, and markers of another backend. */
static void check_misuse(fixture *f, pv_marker *start, pv_marker *end)
{
    pv_marker sentinel, *fresh = NULL, *foreign = NULL, *out = &sentinel;
    pv_backend *other = NULL;
    double s = 1;
    ok(pv_marker_init(NULL, f->be) == PV_ERR_INVALID_ARG, "%s: marker_init with out NULL is refused", f->name);
    ok(pv_marker_init(&out, NULL) == PV_ERR_INVALID_ARG && out == NULL,
       "%s: marker_init with backend NULL is refused and gives NULL", f->name);
    ok(pv_marker_record(NULL, start) == PV_ERR_INVALID_ARG && pv_marker_record(f->be, NULL) == PV_ERR_INVALID_ARG,
       "%s: marker_record with a NULL backend or marker is refused", f->name);
    ok(pv_marker_elapsed(NULL, start, end, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(f->be, NULL, end, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(f->be, start, NULL, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(f->be, start, end, NULL) == PV_ERR_INVALID_ARG,
       "%s: marker_elapsed with a NULL backend, marker or result is refused", f->name);
    if (!ok(pv_marker_init(&fresh, f->be) == PV_OK, "%s: a third marker opens", f->name))
        return;
    s = 1;
    ok(pv_marker_elapsed(f->be, start, fresh, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(f->be, fresh, end, &s) == PV_ERR_INVALID_ARG && s == 0,
       "%s: the time to or from a marker never recorded is refused", f->name);
    pv_marker_free(fresh);
    pv_marker_free(NULL);
    if (!ok(pv_backend_init(&other, "cpu", 0) == PV_OK && pv_marker_init(&foreign, other) == PV_OK &&
                pv_marker_record(other, foreign) == PV_OK,
            "%s: a second CPU backend and its marker open", f->name)) {
        pv_marker_free(foreign);
        pv_backend_free(other);
        return;
    }
    ok(pv_marker_record(f->be, foreign) == PV_ERR_INVALID_ARG,
       "%s: recording another backend's marker is refused", f->name);
    ok(pv_marker_elapsed(f->be, start, foreign, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(f->be, foreign, end, &s) == PV_ERR_INVALID_ARG &&
           pv_marker_elapsed(other, foreign, foreign, &s) == PV_OK && s == 0 &&
           pv_marker_elapsed(other, start, foreign, &s) == PV_ERR_INVALID_ARG,
       "%s: the time between markers of two backends is refused", f->name);
    pv_marker_free(foreign);
    pv_backend_free(other);
}

/* Markers recorded into a graph around an add take their times when it
 * runs; reading them while the graph is recorded is refused. */
static void check_graph(fixture *f, pv_marker *start, pv_marker *end)
{
    if (!pv_backend_graphs(f->be)) {
        tap_skip("%s: no graphs", f->name);
        return;
    }
    double s = 0;
    int ran = 0;
    pv_add_args add = {.n = (int64_t)GEMM_N * GEMM_N, .a = f->a, .b = f->b, .out = f->c};
    const double t0 = now_s();
    pv_status st = pv_backend_graph_begin(f->be, 0x7e57);
    if (!ok(st == PV_OK, "%s: a graph begins", f->name)) {
        tap_diag("%s", pv_last_error());
        return;
    }
    pv_status rec = pv_marker_record(f->be, start);
    if (rec == PV_OK)
        rec = pv_add(f->be, &add);
    if (rec == PV_OK)
        rec = pv_marker_record(f->be, end);
    const pv_status read_inside = pv_marker_elapsed(f->be, start, end, &s);
    st = pv_backend_graph_end(f->be, rec == PV_OK, &ran);
    ok(rec == PV_OK && st == PV_OK && ran, "%s: markers around an add record into a graph, which runs", f->name);
    ok(read_inside == PV_ERR_UNSUPPORTED, "%s: reading markers while a graph is recorded is refused", f->name);
    if (!ran)
        return;
    st = pv_marker_elapsed(f->be, start, end, &s);
    const double wall = now_s() - t0;
    ok(st == PV_OK && s > 0 && s <= wall + CLOCK_SLACK_S,
       "%s: the markers of the graph give the add's time: %.6f s, positive and within the host's %.6f s", f->name, s,
       wall);
}

static void check_backend(pv_backend *be, const char *name, void *arg)
{
    (void)arg;
    fixture f;
    pv_marker *start = NULL, *end = NULL;
    pv_status st = fixture_init(&f, be, name);
    if (st == PV_OK && (st = pv_marker_init(&start, be)) == PV_OK)
        st = pv_marker_init(&end, be);
    if (ok(st == PV_OK, "%s: GEMM buffers and two markers open", name)) {
        check_intervals(&f, start, end);
        check_misuse(&f, start, end);
        check_graph(&f, start, end);
    } else {
        tap_diag("%s", pv_last_error());
    }
    pv_marker_free(start);
    pv_marker_free(end);
    fixture_free(&f);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    const int usage = check_args(argc, argv, &only, NULL);
    if (usage)
        return usage;
    if (!check_each_backend(only, 0, check_backend, NULL))
        ok(0, "backend %s is built into this library", only);
    return tap_done();
}
