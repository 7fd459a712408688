/* Kernel tuning (backend.h, "kernel tuning"; backends/kernel-tuning.h):
 * the text forms of buckets and parameter sets, the candidate lists, and
 * on every tunable backend that opens, that a stored set reaches the
 * programs of its bucket's calls and of no other bucket. That last part
 * builds with kernels/attention.cl's test-only PV_TEST_BREAK_WG=32 (set
 * before the backend opens), so a call that runs with PV_WG = 32 gives
 * wrong results: the default set must be right, 32 set on the call's
 * bucket wrong, 32 set on another bucket right again. The copy and
 * element-wise families run at their extreme candidates, checked exactly,
 * which catches a launcher whose geometry is not the build's. A profile's
 * kernel sets reach the backend through pv_engine_profile_apply, all or
 * none: one the backend refuses is an error naming file, line and key. */
#include "config.h"

#include "backends/kernel-tuning.h"
#include "kv-scenario.h"

#include <pensieve/engine.h>

#include <stdio.h>
#include <unistd.h>

static void test_buckets(void)
{
    static const char *const good[] = {"attention.hd64.g1.decode.short", "attention.hd128.g8.prefill.long",
                                       "attention.hd256.g2.decode.long", "gather", "qmatmul", "recompute"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        pv_kernel_bucket b;
        char back[PV_KERNEL_BUCKET_NAME_MAX] = "";
        pv_status st = pv_kernel_bucket_parse(good[i], &b);
        if (st == PV_OK)
            pv_kernel_bucket_format(&b, back, sizeof back);
        ok(st == PV_OK && strcmp(back, good[i]) == 0, "bucket %s reads and writes back (\"%s\")", good[i], back);
    }
    static const char *const bad[] = {"",
                                      "attention",
                                      "attention.hd96.g1.decode.short",
                                      "attention.hd64.g3.decode.short",
                                      "attention.hd64.g16.decode.short",
                                      "attention.hd64.g1.decoding.short",
                                      "attention.hd64.g1.decode.medium",
                                      "attention.hd64.g1.decode.short.",
                                      "attention.hd64.g1.decode.shortx",
                                      "attention.hd064.g1.decode.short",
                                      "attentionx",
                                      "gather.hd64",
                                      "Gather"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pv_kernel_bucket b;
        pv_status st = pv_kernel_bucket_parse(bad[i], &b);
        ok(st == PV_ERR_INVALID_ARG, "bucket \"%s\" refused: %s", bad[i], pv_last_error());
    }

    /* the bucket of a call */
    int32_t pos[3] = {5, 1022, 7};
    pv_attention_args a = {.n_tokens = 3, .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .token_pos = pos};
    char name[PV_KERNEL_BUCKET_NAME_MAX] = "";
    pv_status st = pv_attention_bucket(&a, name, sizeof name);
    ok(st == PV_OK && strcmp(name, "attention.hd64.g4.decode.short") == 0,
       "3 tokens, 3 query heads per KV head, last position 1022: %s", name);
    pos[1] = 1023;
    a.head_dim = 80;
    a.n_heads = 24;
    st = pv_attention_bucket(&a, name, sizeof name);
    ok(st == PV_OK && strcmp(name, "attention.hd128.g8.decode.long") == 0,
       "position 1023 is a long context, head_dim 80 the 128 class, 8 heads per KV head g8: %s", name);
    int32_t many[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    a = (pv_attention_args){.n_tokens = 9, .n_heads = 32, .n_kv_heads = 1, .head_dim = 256, .token_pos = many};
    st = pv_attention_bucket(&a, name, sizeof name);
    ok(st == PV_OK && strcmp(name, "attention.hd256.g8.prefill.short") == 0,
       "9 query tokens are a prefill, 32 heads per KV head g8: %s", name);
    a.n_kv_heads = 5;
    ok(pv_attention_bucket(&a, name, sizeof name) == PV_ERR_INVALID_ARG, "heads not a multiple refused: %s",
       pv_last_error());
}

static void test_params(void)
{
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_ATTENTION, &p);
    char text[96] = "";
    pv_status st = pv_kernel_params_parse("PV_SPLITS=4", &p);
    pv_kernel_params_format(&p, text, sizeof text);
    ok(st == PV_OK && strcmp(text, "PV_WG=64 PV_SPLITS=4") == 0, "a subset keeps the other values: %s", text);
    st = pv_kernel_params_parse("  PV_WG=16   PV_SPLITS=0 ", &p);
    pv_kernel_params_format(&p, text, sizeof text);
    ok(st == PV_OK && strcmp(text, "PV_WG=16 PV_SPLITS=0") == 0, "spaces around sets: %s", text);
    static const char *const bad[] = {"PV_WG=48",         "PV_WG=",          "PV_WG",         "PV_WG=16x",
                                      "PV_STORE_F16=1",   "PV_ITEM_ELEMS=8", "PV_WG=16 PV_WG=32",
                                      "PV_WG=4294967312", "pv_wg=16",        "PV_WG=16,PV_SPLITS=2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pv_kernel_params before = p;
        st = pv_kernel_params_parse(bad[i], &p);
        ok(st == PV_ERR_INVALID_ARG, "attention set \"%s\" refused: %s", bad[i], pv_last_error());
        p = before;
    }
    pv_kernel_params_default(PV_KERNEL_GATHER, &p);
    st = pv_kernel_params_parse("PV_ITEM_ELEMS=1 PV_WG=256", &p);
    pv_kernel_params_format(&p, text, sizeof text);
    ok(st == PV_OK && strcmp(text, "PV_WG=256 PV_ITEM_ELEMS=1") == 0, "gather set in any order: %s", text);
}

/* Every candidate distinct and valid, the count the product of the lists
 * within the device's limit. */
static void test_candidates(void)
{
    static const struct {
        const char *bucket;
        int limit, max_gemm, count;
    } cases[] = {
        {"attention.hd128.g2.prefill.long", 0, 0, 3 * 6},
        {"attention.hd128.g2.prefill.long", 32, 0, 2 * 6},
        {"gather", 0, 0, 4 * 5},
        {"gather", 64, 0, 2 * 5},
        /* PV_WG x PV_QMV_ROWS x PV_QMV_LANES x PV_GEMM x PV_ACT16 */
        {"qmatmul", 0, PV_GEMM_F32, 4 * 3 * 2 * 2},
        {"qmatmul", 64, PV_GEMM_F16, 2 * 3 * 2 * 2 * 2},
        {"qmatmul", 0, PV_GEMM_TF32, 4 * 3 * 2 * 4 * 2},
        {"recompute", 128, 0, 3 * 5},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        pv_kernel_tuning t;
        pv_kernel_tuning_reset(&t);
        t.max_work_group = cases[c].limit;
        t.max_gemm = cases[c].max_gemm;
        pv_backend fake = {.tuning = &t};
        int count = -1, good = 1;
        pv_status st = pv_kernel_candidate(&fake, cases[c].bucket, 0, NULL, 0, &count);
        char (*seen)[96] = calloc(count > 0 ? (size_t)count : 1, sizeof *seen);
        pv_kernel_bucket b;
        pv_kernel_bucket_parse(cases[c].bucket, &b);
        for (int i = 0; st == PV_OK && good && i < count; i++) {
            st = pv_kernel_candidate(&fake, cases[c].bucket, i, seen[i], sizeof seen[i], NULL);
            pv_kernel_params p = t.defaults[b.family];
            good = st == PV_OK && pv_kernel_params_parse(seen[i], &p) == PV_OK &&
                   (!cases[c].limit || p.value[PV_KPARAM_WG] <= cases[c].limit) &&
                   p.value[PV_KPARAM_GEMM] <= cases[c].max_gemm;
            for (int j = 0; good && j < i; j++)
                good = strcmp(seen[i], seen[j]) != 0;
        }
        ok(st == PV_OK && good && count == cases[c].count,
           "%s, work-group limit %d, GEMM modes to %s: %d candidates (want %d), distinct and within the limits",
           cases[c].bucket, cases[c].limit, pv_gemm_mode_name(cases[c].max_gemm), count, cases[c].count);
        free(seen);
        char past[96];
        ok(pv_kernel_candidate(&fake, cases[c].bucket, count, past, sizeof past, NULL) == PV_ERR_INVALID_ARG,
           "%s: candidate %d (one past the end) refused", cases[c].bucket, count);
    }
}

/* ---- on a backend ----------------------------------------------------------------- */

/* The decode of one sequence at a long context, as kv_scenario builds it:
 * error relative to the largest output of the double reference. */
static double attention_error(pv_backend *be, kv_scenario *sc)
{
    size_t n = (size_t)sc->n_tokens * sc->n_heads * sc->head_dim;
    float *got = xmalloc(n * sizeof *got);
    double *want = xmalloc(n * sizeof *want);
    int guards_ok = 0;
    double err = INFINITY;
    if (kv_scenario_run(sc, be, got, &guards_ok) == PV_OK && guards_ok) {
        kv_scenario_reference(sc, want);
        err = normalized_error_f64(got, want, n);
    }
    free(got);
    free(want);
    return err;
}

static int set_and_say(pv_backend *be, const char *bucket, const char *params)
{
    pv_status st = pv_backend_kernel_set(be, bucket, params);
    if (st != PV_OK)
        tap_diag("set %s = \"%s\": %s", bucket, params ? params : "", pv_last_error());
    return st == PV_OK;
}

#define ATTENTION_LIMIT 1e-4
/* the broken build skips half of each context: far off */
#define BROKEN_AT_LEAST 1e-2

/* pv_qmatmul_group_rounds: the first block-type product of a decode-sized
 * group under PV_ACT16=1; none with PV_ACT16=0, past the fused kernels'
 * tokens, or without a block type. */
static void test_group_rounds(void)
{
    pv_kernel_tuning t;
    pv_kernel_tuning_reset(&t);
    const pv_qmatmul_args mixed[2] = {{.w_type = PV_W_F16, .n_tokens = 4}, {.w_type = PV_W_Q4_1, .n_tokens = 4}};
    ok(pv_qmatmul_group_rounds(&t, mixed, 2, 16) == -1, "group rounds: none under the default PV_ACT16=0");
    pv_status st = pv_kernel_tuning_default(&t, PV_KERNEL_QMATMUL, PV_KPARAM_ACT16, 1);
    ok(st == PV_OK && pv_qmatmul_group_rounds(&t, mixed, 2, 16) == 1,
       "group rounds: F16 then Q4_1 under PV_ACT16=1: the Q4_1 product");
    ok(pv_qmatmul_group_rounds(&t, mixed, 1, 16) == -1, "group rounds: F16 alone: none");
    ok(pv_qmatmul_group_rounds(&t, mixed, 2, 3) == -1, "group rounds: 4 tokens past a fused limit of 3: none");
}

static void test_attention_routing(pv_backend *be, const char *name, uint64_t *rng)
{
    kv_scenario sc;
    const int32_t len = 1500;
    kv_scenario_init(&sc, rng, PV_F32, 9, 3, 64, 32, &len, 1, QUERY_DECODE, 1);
    const char *mine = "attention.hd64.g4.decode.long", *other = "attention.hd64.g4.prefill.long";
    char text[96] = "";
    pv_status st = pv_backend_kernel_get(be, mine, text, sizeof text);
    ok(st == PV_OK && strstr(text, "PV_WG=") && strstr(text, "PV_SPLITS="), "%s: %s's defaults \"%s\"", name, mine,
       text);
    const int default_is_broken = strstr(text, "PV_WG=32 ") != NULL;
    if (default_is_broken) {
        for (int i = 0; i < 5; i++)
            tap_skip("%s: the default PV_WG is the broken one", name);
        kv_scenario_free(&sc);
        return;
    }
    double err = attention_error(be, &sc);
    ok(err < ATTENTION_LIMIT, "%s: decode at 1500 with the defaults: error %.3g (limit %g)", name, err,
       ATTENTION_LIMIT);
    err = set_and_say(be, mine, "PV_WG=32") ? attention_error(be, &sc) : 0.0;
    ok(err > BROKEN_AT_LEAST, "%s: PV_WG=32 on the call's bucket reaches its build: error %.3g (broken: > %g)", name,
       err, BROKEN_AT_LEAST);
    err = set_and_say(be, mine, "") && set_and_say(be, other, "PV_WG=32") ? attention_error(be, &sc) : INFINITY;
    ok(err < ATTENTION_LIMIT, "%s: PV_WG=32 on %s only leaves the call's build alone: error %.3g", name, other, err);
    int good = 1;
    for (int splits = 1; splits <= 16 && good; splits *= 2) {
        char set[64];
        snprintf(set, sizeof set, "PV_WG=64 PV_SPLITS=%d", splits);
        err = set_and_say(be, mine, set) ? attention_error(be, &sc) : INFINITY;
        good = err < ATTENTION_LIMIT;
        if (!good)
            tap_diag("%s: error %.3g", set, err);
    }
    ok(good, "%s: PV_WG=64 with PV_SPLITS 1 to 16 on the call's bucket: right", name);
    st = pv_backend_kernel_get(be, mine, text, sizeof text);
    ok(st == PV_OK && strcmp(text, "PV_WG=64 PV_SPLITS=16") == 0, "%s: the bucket reads back \"%s\"", name, text);
    set_and_say(be, mine, "");
    set_and_say(be, other, "");
    kv_scenario_free(&sc);
}

/* slot_gather and add at a family's candidate `set`, exact. */
static int copies_exact(pv_backend *be, const char *family, const char *set, uint64_t *rng)
{
    if (!set_and_say(be, family, set))
        return 0;
    const int64_t slot_elems = 2 * 32 * 3 * 64 + 5, n_slots = 7, n = 12345; /* odd sizes: partial groups */
    const int32_t slots[4] = {6, 0, 3, 5};
    float *pool = xmalloc((size_t)(slot_elems * n_slots) * sizeof *pool);
    float *a = xmalloc((size_t)n * sizeof *a), *b = xmalloc((size_t)n * sizeof *b);
    float *got = xmalloc((size_t)(slot_elems * n_slots + n) * sizeof *got);
    rng_fill(rng, pool, (size_t)(slot_elems * n_slots), -1.0f, 1.0f);
    rng_fill(rng, a, (size_t)n, -1.0f, 1.0f);
    rng_fill(rng, b, (size_t)n, -1.0f, 1.0f);
    pv_buffer *pool_buf = NULL, *staging = NULL, *x = NULL, *y = NULL, *sum = NULL;
    const uint64_t pool_bytes = (uint64_t)(slot_elems * n_slots) * sizeof(float), vec = (uint64_t)n * sizeof(float);
    pv_status st = pv_buffer_init(&pool_buf, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&staging, be, PV_MEM_DEVICE, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_init(&x, be, PV_MEM_DEVICE, vec);
    if (st == PV_OK)
        st = pv_buffer_init(&y, be, PV_MEM_DEVICE, vec);
    if (st == PV_OK)
        st = pv_buffer_init(&sum, be, PV_MEM_DEVICE, vec);
    if (st == PV_OK)
        st = pv_buffer_write(pool_buf, 0, pool, pool_bytes);
    if (st == PV_OK)
        st = pv_buffer_write(x, 0, a, vec);
    if (st == PV_OK)
        st = pv_buffer_write(y, 0, b, vec);
    const pv_slot_copy_args gather = {.dtype = PV_F32, .slot_elems = slot_elems, .pool = pool_buf,
                                      .n_slots = n_slots, .staging = staging, .slots = slots, .n_slots_moved = 4};
    const pv_add_args add = {.n = n, .a = x, .b = y, .out = sum};
    if (st == PV_OK)
        st = strcmp(family, "gather") == 0 ? pv_slot_gather(be, &gather) : pv_add(be, &add);
    int exact = 0;
    if (st == PV_OK && strcmp(family, "gather") == 0 &&
        pv_buffer_read(staging, 0, got, 4 * (uint64_t)slot_elems * sizeof(float)) == PV_OK) {
        exact = 1;
        for (int s = 0; s < 4 && exact; s++)
            exact = memcmp(got + s * slot_elems, pool + slots[s] * slot_elems, (size_t)slot_elems * sizeof(float)) ==
                    0;
    } else if (st == PV_OK && pv_buffer_read(sum, 0, got, vec) == PV_OK) {
        exact = 1;
        for (int64_t i = 0; i < n && exact; i++)
            exact = got[i] == a[i] + b[i];
    }
    if (st != PV_OK)
        tap_diag("%s at \"%s\": %s", family, set, pv_last_error());
    pv_buffer_free(pool_buf);
    pv_buffer_free(staging);
    pv_buffer_free(x);
    pv_buffer_free(y);
    pv_buffer_free(sum);
    free(pool);
    free(a);
    free(b);
    free(got);
    set_and_say(be, family, "");
    return exact;
}

static void test_profile_sets(pv_backend *be, const char *name)
{
    char path[] = "/tmp/pv-test-kernel-tuning-XXXXXX";
    const int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        tap_skip("%s: no temporary file", name);
        tap_skip("%s: no temporary file", name);
        return;
    }
    /* line 7 is good, line 8 refused: its value is off the list */
    fprintf(f, "[%s: %s]\nalpha = 1e-6\nbeta = 1e-5\nc = 1e-3\nchunk_tokens = 32\n\n"
               "kernel.attention.hd64.g4.decode.long = PV_WG=32 PV_SPLITS=2\nkernel.gather = PV_WG=48\n",
            name, be->info.name);
    fclose(f);
    pv_cache_config cfg, before;
    pv_cache_config_defaults(&cfg);
    before = cfg;
    pv_engine_profile_use use;
    char now[96] = "", defaults[96] = "";
    pv_backend_kernel_get(be, "attention.hd64.g4.decode.long", defaults, sizeof defaults);
    pv_status st = pv_engine_profile_apply(be, path, &cfg, &use);
    pv_backend_kernel_get(be, "attention.hd64.g4.decode.long", now, sizeof now);
    ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), path) && strstr(pv_last_error(), ":8: key [") &&
           strstr(pv_last_error(), "kernel.gather") && strcmp(now, defaults) == 0 && cfg.alpha == before.alpha,
       "%s: a kernel set the backend refuses is an error naming file, line and key, and nothing is applied "
       "(attention keeps \"%s\"): %s",
       name, now, pv_last_error());
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "[%s: %s]\nalpha = 1e-6\nbeta = 1e-5\nc = 1e-3\nchunk_tokens = 32\n"
                   "kernel.attention.hd64.g4.decode.long = PV_WG=32 PV_SPLITS=2\nkernel.gather = PV_ITEM_ELEMS=2\n",
                name, be->info.name);
        fclose(f);
    }
    st = pv_engine_profile_apply(be, path, &cfg, &use);
    char gather[96] = "";
    pv_backend_kernel_get(be, "attention.hd64.g4.decode.long", now, sizeof now);
    pv_backend_kernel_get(be, "gather", gather, sizeof gather);
    ok(st == PV_OK && use.applied && use.kernel_sets == 2 && strcmp(now, "PV_WG=32 PV_SPLITS=2") == 0 &&
           strstr(gather, "PV_ITEM_ELEMS=2"),
       "%s: a good profile's sets are in the backend: \"%s\", gather \"%s\"", name, now, gather);
    pv_backend_kernel_set(be, "attention.hd64.g4.decode.long", NULL);
    pv_backend_kernel_set(be, "gather", NULL);
    unlink(path);
}

static void test_backend(const char *name, uint64_t *rng)
{
    pv_backend *be = NULL;
    pv_status st = pv_backend_init(&be, name, 0);
    if (st != PV_OK) {
        for (int i = 0; i < 11; i++)
            tap_skip("%s: %s", name, pv_last_error());
        return;
    }
    ok(pv_backend_kernels_tunable(be), "%s: runs the portable kernels", name);
    if (strcmp(name, "opencl") == 0)
        test_attention_routing(be, name, rng);
    else
        for (int i = 0; i < 6; i++)
            tap_skip("%s: PV_TEST_KERNEL_DEFINES is read by the OpenCL backend only", name);
    for (const char *const *family = (const char *const[]){"gather", "recompute", NULL}; *family; family++) {
        int good = 1;
        int count = 0;
        pv_kernel_candidate(be, *family, 0, NULL, 0, &count);
        const int extremes[2] = {0, count - 1};
        for (int i = 0; i < 2 && good; i++) {
            char set[96];
            good = pv_kernel_candidate(be, *family, extremes[i], set, sizeof set, NULL) == PV_OK &&
                   copies_exact(be, *family, set, rng);
            if (!good)
                tap_diag("%s at \"%s\" is not exact", *family, set);
        }
        ok(good, "%s: %s exact at its first and last candidates", name, *family);
    }
    test_profile_sets(be, name);
    pv_backend_free(be);
}

int main(void)
{
    uint64_t rng = 42;
    test_buckets();
    test_params();
    test_candidates();
    test_group_rounds();

    pv_backend *cpu = NULL;
    if (pv_backend_init(&cpu, "cpu", 0) == PV_OK) {
        char text[64];
        ok(!pv_backend_kernels_tunable(cpu) && pv_backend_kernel_set(cpu, "gather", "PV_WG=32") == PV_ERR_UNSUPPORTED &&
               pv_backend_kernel_get(cpu, "gather", text, sizeof text) == PV_ERR_UNSUPPORTED,
           "cpu: no tunable kernels: %s", pv_last_error());
        pv_backend_free(cpu);
    } else {
        tap_skip("cpu: %s", pv_last_error());
    }
    /* before any backend opens: the OpenCL backend reads it at init */
    setenv("PV_TEST_KERNEL_DEFINES", "-DPV_TEST_BREAK_WG=32", 1);
    test_backend("opencl", &rng);
    test_backend("cuda", &rng);
    return tap_done();
}
