/* Paged attention on every backend that opens, against a reference computed
 * in double precision over the same K/V laid out contiguously: decode,
 * prefill and recovery batches, shuffled slots, GQA, f32 and f16 KV. Also
 * two closed forms: constant V rows give that constant, and a query at
 * position 0 returns V row 0.
 * Usage: test-attention-ref [--backend NAME] [--seed N] */
#include "config.h"

#include "kv-scenario.h"

#include <stdio.h>

typedef struct ref_case {
    const char *what;
    pv_dtype kv_dtype;
    int32_t n_heads, n_kv_heads, head_dim, chunk_tokens;
    query_shape shape;
    int32_t n_query;
    int32_t n_seqs;
    int32_t seq_len[6];
} ref_case;

static const ref_case cases[] = {
    {"decode, ragged lengths", PV_F32, 4, 4, 64, 32, QUERY_DECODE, 1, 6, {1, 31, 32, 33, 64, 97}},
    {"decode, ragged lengths", PV_F16, 4, 4, 64, 32, QUERY_DECODE, 1, 6, {1, 31, 32, 33, 64, 97}},
    {"prefill, GQA 3", PV_F32, 6, 2, 128, 32, QUERY_PREFILL, 40, 3, {31, 33, 70}},
    {"prefill, GQA 3", PV_F16, 6, 2, 128, 32, QUERY_PREFILL, 40, 3, {31, 33, 70}},
    {"recovery, chunk 16", PV_F32, 3, 1, 64, 16, QUERY_RECOVERY, 20, 2, {50, 77}},
    {"recovery, chunk 16", PV_F16, 3, 1, 64, 16, QUERY_RECOVERY, 20, 2, {50, 77}},
    {"decode, long context", PV_F32, 6, 2, 128, 32, QUERY_DECODE, 1, 2, {1031, 1500}},
    {"decode, long context", PV_F16, 6, 2, 128, 32, QUERY_DECODE, 1, 2, {1031, 1500}},
    {"head_dim 16 and 256", PV_F32, 2, 1, 16, 32, QUERY_PREFILL, 5, 2, {9, 40}},
    {"head_dim 16 and 256", PV_F32, 2, 2, 256, 32, QUERY_PREFILL, 5, 2, {9, 40}},
};

/* Relative to the largest output: f16 KV is rounded in the reference too,
 * so both dtypes differ only by f32 arithmetic; f16 allows backends that
 * compute in half. */
static double tolerance(pv_dtype kv_dtype)
{
    return kv_dtype == PV_F32 ? 2e-5 : 5e-4;
}

static void check_cases(pv_backend *be, const char *name, uint64_t *rng)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ref_case *rc = &cases[c];
        if (!pv_backend_supports(be, PV_OP_ATTENTION, rc->kv_dtype)) {
            tap_skip("%s: %s: no %s attention", name, rc->what, pv_dtype_name(rc->kv_dtype));
            continue;
        }
        kv_scenario sc;
        kv_scenario_init(&sc, rng, rc->kv_dtype, rc->n_heads, rc->n_kv_heads, rc->head_dim, rc->chunk_tokens,
                         rc->seq_len, rc->n_seqs, rc->shape, rc->n_query);
        size_t n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
        float *got = xmalloc(n * sizeof *got);
        double *want = xmalloc(n * sizeof *want);
        int guards_ok = 0;
        pv_status st = kv_scenario_run(&sc, be, got, &guards_ok);
        if (st != PV_OK) {
            ok(0, "%s: %s (%s KV, heads %d/%d, head_dim %d): %s", name, rc->what, pv_dtype_name(rc->kv_dtype),
               rc->n_heads, rc->n_kv_heads, rc->head_dim, pv_last_error());
        } else {
            kv_scenario_reference(&sc, want);
            double err = normalized_error_f64(got, want, n);
            ok(err <= tolerance(rc->kv_dtype) && guards_ok,
               "%s: %s (%s KV, heads %d/%d, head_dim %d, T %d): error %.3g (limit %.1g), guards %s", name,
               rc->what, pv_dtype_name(rc->kv_dtype), rc->n_heads, rc->n_kv_heads, rc->head_dim, sc.n_tokens,
               err, tolerance(rc->kv_dtype), guards_ok ? "intact" : "CHANGED");
        }
        free(got);
        free(want);
        kv_scenario_free(&sc);
    }
}

/* The larger of worst and |got - want|; NaN counts as infinitely wrong. */
static double worse(double worst, float got, double want)
{
    double diff = fabs((double)got - want);
    if (isnan(diff))
        return INFINITY;
    return diff > worst ? diff : worst;
}

/* Closed forms: with every V row equal to c, any softmax weights give c;
 * a query at position 0 sees only row 0, so it returns V row 0 exactly
 * (up to f32 rounding of 1 * v). */
static void check_closed_forms(pv_backend *be, const char *name, uint64_t *rng)
{
    for (int dt = 0; dt < 2; dt++) {
        pv_dtype kv_dtype = dt ? PV_F16 : PV_F32;
        if (!pv_backend_supports(be, PV_OP_ATTENTION, kv_dtype))
            continue;
        int32_t seq_len[2] = {45, 1};
        kv_scenario sc;
        kv_scenario_init(&sc, rng, kv_dtype, 4, 2, 64, 32, seq_len, 2, QUERY_PREFILL, 45);
        size_t row = (size_t)sc.n_kv_heads * sc.head_dim;
        size_t slot_elems = 2 * (size_t)sc.chunk_tokens * row;
        /* Sequence 0: V rows all 0.375 (exact in f16) in every stored row. */
        for (int32_t p = 0; p < sc.seq_len[0]; p++) {
            int32_t slot = sc.slot_table[p / sc.chunk_tokens];
            uint64_t v_at = (uint64_t)slot * slot_elems + (uint64_t)(sc.chunk_tokens + p % sc.chunk_tokens) * row;
            for (size_t e = 0; e < row; e++)
                pool_store(&sc, v_at + e, 0.375f);
        }
        size_t n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
        float *got = xmalloc(n * sizeof *got);
        int guards_ok = 0;
        pv_status st = kv_scenario_run(&sc, be, got, &guards_ok);
        double worst_const = 0.0, worst_first = 0.0;
        int32_t group = sc.n_heads / sc.n_kv_heads;
        for (int32_t i = 0; st == PV_OK && i < sc.n_tokens; i++)
            for (int32_t h = 0; h < sc.n_heads; h++)
                for (int32_t d = 0; d < sc.head_dim; d++) {
                    float o = got[((size_t)i * sc.n_heads + h) * sc.head_dim + d];
                    if (sc.token_seq[i] == 0) {
                        worst_const = worse(worst_const, o, 0.375);
                    } else {
                        size_t v0 = (size_t)1 * sc.max_tokens * row + (size_t)(h / group) * sc.head_dim + d;
                        worst_first = worse(worst_first, o, sc.v[v0]);
                    }
                }
        ok(st == PV_OK && worst_const <= 1e-6 && guards_ok, "%s: constant V rows give the constant (%s KV): max error %.3g %s",
           name, pv_dtype_name(kv_dtype), worst_const, st == PV_OK ? "" : pv_last_error());
        ok(st == PV_OK && worst_first <= 1e-6, "%s: a query at position 0 returns V row 0 (%s KV): max error %.3g",
           name, pv_dtype_name(kv_dtype), worst_first);
        free(got);
        kv_scenario_free(&sc);
    }
}

/* The CPU widens f16 K/V rows with F16C and computes softmax weights with
 * AVX2 code when it runs its AVX2 kernels, and with portable code under
 * PV_CPU_KERNELS=portable: the same operations in the same order (the
 * conversions are exact), so the outputs must agree bit for bit. */
static void check_cpu_kernels(uint64_t seed)
{
    pv_backend *fast = NULL, *portable = NULL;
    pv_status st = pv_backend_init(&fast, "cpu", 0);
    if (st == PV_OK && setenv("PV_CPU_KERNELS", "portable", 1) == 0) {
        st = pv_backend_init(&portable, "cpu", 0);
        unsetenv("PV_CPU_KERNELS");
    }
    if (!ok(st == PV_OK && portable, "cpu opens with and without PV_CPU_KERNELS=portable")) {
        tap_diag("%s", pv_last_error());
        pv_backend_free(fast);
        return;
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const ref_case *rc = &cases[c];
        float *got[2] = {NULL, NULL};
        size_t n = 0;
        pv_status run_st[2];
        pv_backend *bes[2] = {fast, portable};
        for (int b = 0; b < 2; b++) {
            uint64_t rng = seed + c;
            kv_scenario sc;
            kv_scenario_init(&sc, &rng, rc->kv_dtype, rc->n_heads, rc->n_kv_heads, rc->head_dim,
                             rc->chunk_tokens, rc->seq_len, rc->n_seqs, rc->shape, rc->n_query);
            n = (size_t)sc.n_tokens * sc.n_heads * sc.head_dim;
            got[b] = xmalloc(n * sizeof(float));
            int guards_ok = 0;
            run_st[b] = kv_scenario_run(&sc, bes[b], got[b], &guards_ok);
            kv_scenario_free(&sc);
        }
        size_t differ = 0;
        for (size_t i = 0; i < n; i++)
            differ += memcmp(&got[0][i], &got[1][i], sizeof(float)) != 0;
        ok(run_st[0] == PV_OK && run_st[1] == PV_OK && differ == 0,
           "cpu: %s (%s KV, head_dim %d): AVX2 and portable kernels give the same bits (%zu of %zu outputs "
           "differ)",
           rc->what, pv_dtype_name(rc->kv_dtype), rc->head_dim, differ, n);
        free(got[0]);
        free(got[1]);
    }
    pv_backend_free(fast);
    pv_backend_free(portable);
}

static void check_opened(pv_backend *be, const char *name, void *arg)
{
    uint64_t rng = *(const uint64_t *)arg;
    if (pv_backend_supports(be, PV_OP_ATTENTION, PV_F32)) {
        check_cases(be, name, &rng);
        check_closed_forms(be, name, &rng);
    } else {
        tap_skip("backend %s: no attention", name);
    }
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    uint64_t seed = 20261122;
    const int usage = check_args(argc, argv, &only, &seed);
    if (usage)
        return usage;
    tap_diag("seed %llu", (unsigned long long)seed);
    check_each_backend(only, 0, check_opened, &seed);
    if (!only || strcmp(only, "cpu") == 0)
        check_cpu_kernels(seed);
    return tap_done();
}
