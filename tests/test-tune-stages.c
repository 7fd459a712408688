/* qmatmul's two-stage kernel search (tuning/tune.h, tune_in_stage) over
 * the real candidate lists: pv_kernel_candidate on a fake backend with the
 * limits a device sets (the PV_GEMM modes it runs, a work-group limit) and
 * a default set. Stage 1 (decode) must be exactly the candidates at the
 * default's PV_GEMM, each decode combination once; stage 2 (prefill), for
 * each stage-1 candidate as its best, exactly one candidate per PV_GEMM
 * mode, each equal to the best in every other parameter. Both are checked
 * on the values pv_kernel_params_parse reads, not through the selection's
 * own string matching; that is then checked on strings the lists do not
 * hold (a value that extends another, a name that extends another, tokens
 * in another order, a token missing). */
#include "config.h"

#include "backends/kernel-tuning.h"
#include "tap.h"
#include "tuning/tune.h"

#include <string.h>

/* The parameters that choose and shape the decode products' kernels. */
static const pv_kparam decode_params[] = {PV_KPARAM_WG, PV_KPARAM_QMV_ROWS, PV_KPARAM_QMV_LANES, PV_KPARAM_ACT16};
#define N_DECODE_PARAMS (int)(sizeof decode_params / sizeof *decode_params)

static int same_decode(const pv_kernel_params *a, const pv_kernel_params *b)
{
    for (int k = 0; k < N_DECODE_PARAMS; k++)
        if (a->value[decode_params[k]] != b->value[decode_params[k]])
            return 0;
    return 1;
}

typedef struct stage_case {
    int max_gemm, wg_limit, default_gemm, default_wg;
    int decode_count; /* the stage-1 candidates: WG values x 3 rows x 2 lanes x 2 act16 */
} stage_case;

static void test_case(const stage_case *k)
{
    pv_kernel_tuning t;
    pv_kernel_tuning_reset(&t);
    t.max_gemm = k->max_gemm;
    t.max_work_group = k->wg_limit;
    pv_backend fake = {.tuning = &t};
    pv_status st = pv_kernel_tuning_default(&t, PV_KERNEL_QMATMUL, PV_KPARAM_GEMM, k->default_gemm);
    if (st == PV_OK)
        st = pv_kernel_tuning_default(&t, PV_KERNEL_QMATMUL, PV_KPARAM_WG, k->default_wg);
    const pv_kernel_params def = t.defaults[PV_KERNEL_QMATMUL];
    char def_text[96];
    pv_kernel_params_format(&def, def_text, sizeof def_text);
    char what[160];
    snprintf(what, sizeof what, "GEMM modes to %s, work-group limit %d, default \"%s\"",
             pv_gemm_mode_name(k->max_gemm), k->wg_limit, def_text);

    int count = 0;
    if (st == PV_OK)
        st = pv_kernel_candidate(&fake, "qmatmul", 0, NULL, 0, &count);
    char (*text)[96] = calloc(count > 0 ? (size_t)count : 1, sizeof *text);
    pv_kernel_params *p = calloc(count > 0 ? (size_t)count : 1, sizeof *p);
    for (int i = 0; st == PV_OK && i < count; i++) {
        st = pv_kernel_candidate(&fake, "qmatmul", i, text[i], sizeof text[i], NULL);
        p[i] = def;
        if (st == PV_OK)
            st = pv_kernel_params_parse(text[i], &p[i]);
    }
    if (!ok(st == PV_OK && count > 0, "%s: %d candidates enumerated and parsed", what, count)) {
        tap_diag("%s", pv_last_error());
        free(text);
        free(p);
        return;
    }

    int all = 1;
    for (int i = 0; i < count; i++)
        all &= tune_in_stage(TUNE_ALL, text[i], def_text, "") == 1;
    ok(all, "%s: a single-stage search takes every candidate", what);

    /* stage 1: membership is exactly "PV_GEMM is the default's", and its
     * members' decode parameters are distinct, so with the count each
     * combination is there once */
    int n_decode = 0, right = 1, distinct = 1, *decode = calloc((size_t)count, sizeof *decode);
    for (int i = 0; i < count; i++) {
        const int in = tune_in_stage(TUNE_DECODE, text[i], def_text, "");
        if (in != (p[i].value[PV_KPARAM_GEMM] == def.value[PV_KPARAM_GEMM])) {
            if (right)
                tap_diag("stage 1 %s \"%s\"", in ? "takes" : "leaves out", text[i]);
            right = 0;
        }
        for (int j = 0; in && j < n_decode; j++)
            distinct &= !same_decode(&p[i], &p[decode[j]]);
        if (in)
            decode[n_decode++] = i;
    }
    ok(right && distinct && n_decode == k->decode_count,
       "%s: stage 1 is the %d candidates at the default's PV_GEMM (want %d), each decode combination once", what,
       n_decode, k->decode_count);

    /* stage 2, with each stage-1 candidate as the best: membership is
     * exactly "equal to the best in every decode parameter", one per
     * PV_GEMM mode the device runs */
    int stage2 = 1;
    for (int b = 0; b < n_decode && stage2; b++) {
        const int best = decode[b];
        int n_prefill = 0, modes_seen = 0;
        for (int i = 0; i < count; i++) {
            const int in = tune_in_stage(TUNE_PREFILL, text[i], def_text, text[best]);
            if (in != same_decode(&p[i], &p[best])) {
                tap_diag("best \"%s\": stage 2 %s \"%s\"", text[best], in ? "takes" : "leaves out", text[i]);
                stage2 = 0;
            }
            if (in) {
                n_prefill++;
                modes_seen |= 1 << p[i].value[PV_KPARAM_GEMM];
            }
        }
        if (n_prefill != k->max_gemm + 1 || modes_seen != (1 << (k->max_gemm + 1)) - 1) {
            tap_diag("best \"%s\": stage 2 has %d candidates, PV_GEMM modes 0x%x", text[best], n_prefill,
                     (unsigned)modes_seen);
            stage2 = 0;
        }
    }
    ok(stage2, "%s: stage 2 after each of the %d stage-1 candidates is one candidate per PV_GEMM mode (%d), "
       "equal to it in the rest",
       what, n_decode, k->max_gemm + 1);
    free(decode);
    free(text);
    free(p);
}

/* The string matching on what the candidate lists do not show. */
static void test_tokens(void)
{
    static const struct {
        tune_products stage;
        const char *params, *default_params, *decode_best;
        int want;
        const char *why;
    } cases[] = {
        {TUNE_DECODE, "PV_WG=64 PV_GEMM=1", "PV_WG=64 PV_GEMM=10", "", 0, "PV_GEMM=1 is not PV_GEMM=10"},
        {TUNE_DECODE, "PV_WG=64 PV_GEMM=10", "PV_WG=64 PV_GEMM=1", "", 0, "PV_GEMM=10 is not PV_GEMM=1"},
        {TUNE_DECODE, "PV_GEMM=2 PV_WG=32", "PV_WG=64  PV_GEMM=2", "", 1, "PV_GEMM=2 in any place and spacing"},
        {TUNE_DECODE, "PV_GEMMX=0 PV_GEMM=2", "PV_GEMM=2", "", 1, "PV_GEMMX is not PV_GEMM"},
        {TUNE_DECODE, "PV_WG=64", "PV_WG=64", "", 0, "no PV_GEMM: in no stage 1"},
        {TUNE_PREFILL, "PV_WG=64 PV_QMV_ROWS=4 PV_GEMM=3", "", "PV_QMV_ROWS=4 PV_GEMM=0 PV_WG=64", 1,
         "the same tokens in another order"},
        {TUNE_PREFILL, "PV_WG=6 PV_GEMM=3", "", "PV_WG=64 PV_GEMM=0", 0, "PV_WG=6 is not PV_WG=64"},
        {TUNE_PREFILL, "PV_WG=64 PV_GEMM=3", "", "PV_WG=6 PV_GEMM=0", 0, "PV_WG=64 is not PV_WG=6"},
        {TUNE_PREFILL, "PV_WG=64 PV_WGX=1 PV_GEMM=0", "", "PV_WGX=1 PV_WG=64 PV_GEMM=2", 1,
         "PV_WG and PV_WGX told apart"},
        {TUNE_PREFILL, "PV_WG=64 PV_GEMM=1", "", "PV_WG=64 PV_ACT16=1 PV_GEMM=0", 0, "a token of the best missing"},
        {TUNE_PREFILL, "PV_WG=64 PV_ACT16=1 PV_GEMM=1", "", "PV_WG=64 PV_GEMM=0", 0, "a token the best lacks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        ok(tune_in_stage(cases[i].stage, cases[i].params, cases[i].default_params, cases[i].decode_best) ==
               cases[i].want,
           "%s: \"%s\" %s stage %s (default \"%s\", best \"%s\")", cases[i].why, cases[i].params,
           cases[i].want ? "in" : "not in", tune_products_name(cases[i].stage), cases[i].default_params,
           cases[i].decode_best);
}

int main(void)
{
    static const stage_case cases[] = {
        {PV_GEMM_TF32, 0, PV_GEMM_F32, 64, 4 * 3 * 2 * 2},  /* CUDA, compute capability 8.0 and up */
        {PV_GEMM_F32, 0, PV_GEMM_F32, 64, 4 * 3 * 2 * 2},   /* OpenCL: f32 only */
        {PV_GEMM_TF32, 64, PV_GEMM_F32, 64, 2 * 3 * 2 * 2}, /* a work-group limit */
        {PV_GEMM_TF32, 0, PV_GEMM_BF16, 256, 4 * 3 * 2 * 2}, /* a non-zero default PV_GEMM */
        {PV_GEMM_F16, 128, PV_GEMM_F16, 128, 3 * 3 * 2 * 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        test_case(&cases[i]);
    test_tokens();
    return tap_done();
}
