/* Split-K of the CPU attention kernel against a reference in double: one
 * and two sequences, 1-3 query tokens, contexts from one token to several
 * thousand (ending mid-chunk and on a chunk's last row), f32 and f16 KV,
 * heads 9/3, 8/8 and 4/1, head_dim 64 and 128. Each scenario runs through
 * the front end (the kernel's own split count) and with the split count
 * forced to 1, 2, 3, 8 and 40 (more splits than a short context has
 * blocks, so splits hold no rows; and tokens of a group that end before a
 * split starts). Peaked scenarios scale q up so the splits' maxima differ
 * by tens and their weights underflow. One thread or many, the split path
 * runs.
 * Usage: test-attention-splitk [--seed N] */
#include "config.h"

#include "backends/cpu/cpu.h"
#include "kv-scenario.h"

#include <stdio.h>

typedef struct splitk_case {
    const char *what;
    int32_t n_heads, n_kv_heads, head_dim;
    int32_t n_query; /* per sequence, at its last positions */
    float q_gain;    /* q drawn from [-2, 2] times this */
    int32_t n_seqs;
    int32_t seq_len[2];
} splitk_case;

static const splitk_case cases[] = {
    {"one token of context", 9, 3, 64, 1, 1.0f, 1, {1}},
    {"mid-chunk, 3 tokens", 9, 3, 64, 3, 1.0f, 1, {45}},
    {"3 tokens across a chunk boundary", 9, 3, 128, 3, 1.0f, 1, {33}},
    {"single-stream decode", 9, 3, 64, 1, 1.0f, 1, {2048}},
    {"single-stream decode, mid-chunk", 9, 3, 64, 1, 1.0f, 1, {4001}},
    {"two sequences, ragged", 9, 3, 128, 2, 1.0f, 2, {3001, 77}},
    {"heads 8/8", 8, 8, 64, 1, 1.0f, 1, {2047}},
    {"heads 8/8, two sequences", 8, 8, 128, 3, 1.0f, 2, {5000, 1030}},
    {"heads 4/1, long", 4, 1, 64, 2, 1.0f, 1, {8191}},
    {"heads 4/1, long and one chunk", 4, 1, 128, 1, 1.0f, 2, {6000, 33}},
    {"heads 4/1, tiny", 4, 1, 64, 3, 1.0f, 2, {65, 1}},
    {"peaked softmax", 9, 3, 64, 2, 20.0f, 1, {3000}},
    {"peaked softmax, two sequences", 4, 1, 128, 3, 20.0f, 2, {1500, 700}},
};

static const int32_t forced[] = {1, 2, 3, 8, 40};

/* Relative to the largest output. The reference rounds f16 KV too, so both
 * dtypes differ from it only by f32 arithmetic: the unsplit kernel stays
 * near 1e-6; a combine that mis-weighs a split is off by far more. */
#define TOLERANCE 2e-5

/* The scenario's attention on the CPU backend with guarded q and out:
 * through the front end (n_splits 0; *used is then the kernel's own split
 * count) or with every work item cut into n_splits. *guards_ok is 0 when
 * anything outside out or in the pool changed. */
static pv_status run_splits(const kv_scenario *sc, pv_backend *be, int32_t n_splits, float *out, int *guards_ok,
                            int32_t *used)
{
    size_t q_elems = (size_t)sc->n_tokens * sc->n_heads * sc->head_dim;
    size_t pool_bytes = (size_t)sc->pool_elems * pv_dtype_size(sc->kv_dtype);
    tensor q, o;
    pv_buffer *pool = NULL;
    memset(&o, 0, sizeof o);
    *guards_ok = 0;
    pv_status st = tensor_init(&q, be, PV_MEM_DEVICE, sizeof(float), q_elems, sc->q);
    if (st == PV_OK)
        st = tensor_init(&o, be, PV_MEM_DEVICE, sizeof(float), q_elems, NULL);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(pool, 0, sc->pool, pool_bytes);
    if (st == PV_OK) {
        const pv_attention_args a = kv_scenario_args(sc, &q, pool, &o);
        *used = n_splits;
        if (n_splits == 0)
            st = pv_cpu_attention_split_count(&a, used);
        if (st == PV_OK)
            st = n_splits == 0 ? pv_attention(be, &a) : pv_cpu_attention_forced_splits(&a, n_splits);
    }
    if (st == PV_OK)
        st = tensor_read(&o, out);
    if (st == PV_OK)
        *guards_ok = guards_intact(&o) && guards_intact(&q) && memcmp(pool->host_ptr, sc->pool, pool_bytes) == 0;
    pv_buffer_free(pool);
    tensor_free(&o);
    tensor_free(&q);
    return st;
}

static void check_case(pv_backend *be, const splitk_case *sc_case, pv_dtype kv_dtype, uint64_t *rng)
{
    kv_scenario sc;
    kv_scenario_init(&sc, rng, kv_dtype, sc_case->n_heads, sc_case->n_kv_heads, sc_case->head_dim, 32,
                     sc_case->seq_len, sc_case->n_seqs, QUERY_PREFILL, sc_case->n_query);
    size_t n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
    for (size_t e = 0; e < n; e++)
        sc.q[e] *= sc_case->q_gain;
    double *want = xmalloc(n * sizeof *want);
    float *got = xmalloc(n * sizeof *got);
    kv_scenario_reference(&sc, want);
    for (size_t f = 0; f <= sizeof forced / sizeof forced[0]; f++) {
        int32_t n_splits = f == 0 ? 0 : forced[f - 1];
        int guards_ok = 0;
        int32_t used = 0;
        pv_status st = run_splits(&sc, be, n_splits, got, &guards_ok, &used);
        char how[48];
        if (n_splits == 0)
            snprintf(how, sizeof how, "front end, %d split%s", used, used == 1 ? "" : "s");
        else
            snprintf(how, sizeof how, "forced %d splits", n_splits);
        if (st != PV_OK) {
            ok(0, "%s (%s KV, heads %d/%d, head_dim %d), %s: %s", sc_case->what, pv_dtype_name(kv_dtype),
               sc.n_heads, sc.n_kv_heads, sc.head_dim, how, pv_last_error());
            continue;
        }
        double err = normalized_error_f64(got, want, n);
        ok(err <= TOLERANCE && guards_ok,
           "%s (%s KV, heads %d/%d, head_dim %d, T %d, contexts %d %d), %s: error %.3g (limit %.1g), guards %s",
           sc_case->what, pv_dtype_name(kv_dtype), sc.n_heads, sc.n_kv_heads, sc.head_dim, sc.n_tokens,
           sc.seq_len[0], sc.n_seqs > 1 ? sc.seq_len[1] : 0, how, err, TOLERANCE,
           guards_ok ? "intact" : "CHANGED");
    }
    free(got);
    free(want);
    kv_scenario_free(&sc);
}

/* Single-stream decode with 9 query heads over 3 kv heads cannot split by
 * kv heads alone on two threads or more: the planner must split the
 * context too, into enough ranges that 3 kv heads x ranges cover the
 * threads, but none shorter than its 8 blocks (backends/cpu/cpu-attention.c's
 * MIN_SPLIT_BLOCKS): at 2048 positions in 32-token blocks, at most 8. So
 * the check holds on any core count (ranges >= threads, asked before, no
 * 2048-token context meets past 8 threads). */
static void check_natural_split(pv_backend *be, uint64_t *rng)
{
    int threads = pv_cpu_max_threads();
    if (threads < 2) {
        tap_skip("single-stream decode splits its context: one thread, nothing to split for");
        return;
    }
    int32_t len = 2048;
    kv_scenario sc;
    kv_scenario_init(&sc, rng, PV_F16, 9, 3, 64, 32, &len, 1, QUERY_DECODE, 1);
    float *got = xmalloc((size_t)sc.n_heads * sc.head_dim * sizeof *got);
    int guards_ok = 0;
    int32_t n = 0;
    pv_status st = run_splits(&sc, be, 0, got, &guards_ok, &n);
    const int32_t most = len / 32 / 8, cover = (threads + 2) / 3;
    const int32_t least = cover < 2 ? 2 : cover > most ? most : cover;
    ok(st == PV_OK && n >= least && n <= most,
       "single-stream decode at context %d on %d threads splits its context: %d splits (%d to %d)", len, threads, n,
       least, most);
    free(got);
    kv_scenario_free(&sc);
}

static void check_bad_split_count(pv_backend *be, uint64_t *rng)
{
    int32_t len = 40;
    kv_scenario sc;
    kv_scenario_init(&sc, rng, PV_F32, 4, 1, 64, 32, &len, 1, QUERY_DECODE, 1);
    float *got = xmalloc((size_t)sc.n_heads * sc.head_dim * sizeof *got);
    int guards_ok = 0;
    int32_t used = 0;
    pv_status st = run_splits(&sc, be, -1, got, &guards_ok, &used);
    ok(st == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "n_splits = -1"),
       "n_splits -1 is refused, naming the value: %s", pv_last_error());
    free(got);
    kv_scenario_free(&sc);
}

int main(int argc, char **argv)
{
    uint64_t seed = 20261124;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--seed N]\n", argv[0]);
            return 2;
        }
    }
    tap_diag("seed %llu, %d threads", (unsigned long long)seed, pv_cpu_max_threads());
    pv_backend *be = NULL;
    if (!ok(pv_backend_init(&be, "cpu", 0) == PV_OK, "backend cpu opens")) {
        tap_diag("%s", pv_last_error());
        return tap_done();
    }
    uint64_t rng = seed;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        check_case(be, &cases[c], PV_F32, &rng);
        check_case(be, &cases[c], PV_F16, &rng);
    }
    check_natural_split(be, &rng);
    check_bad_split_count(be, &rng);
    pv_backend_free(be);
    return tap_done();
}
