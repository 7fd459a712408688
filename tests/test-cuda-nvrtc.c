/* The CUDA kernels through NVRTC, with no GPU: every family of kernels/
 * compiles, for the architectures of --with-cuda-arch (PV_CUDA_TEST_ARCHS),
 * with the parameter sets of backends/kernel-params.h that the backend
 * may build (below), and holds the kernels the launchers look up, with no
 * register spills at the tuned defaults and no local memory at all in
 * qmatmul's (ptxas's report); compile errors are caught and reported with
 * NVRTC's log (checked by planted bugs); the on-disk cache keys, writes,
 * reads back and rejects damaged entries.
 *
 * Which sets compile where: on the first architecture, the full cartesian
 * product of every parameter's values per family, but for qmatmul's
 * PV_WG, crossed with the rest instead (wg_crossed: each work-group size
 * meets each value of every other parameter), 168 sets; on the others,
 * every combination of the variants with the tuned parameters at their
 * defaults (33 sets). With PV_CUDA_TEST_MATRIX=variants only the first
 * architecture compiles, and only those 33: CI's sanitizer build, where
 * the compiles are NVRTC's, which the sanitizers do not see, and our code
 * around them runs the same for every architecture; the whole matrix
 * (some 4 minutes on 2 cores) is the plain build's. The compiles run on
 * up to 4 threads. */
#include "config.h"

#include "backends/attention-split.h"
#include "backends/cuda/cuda_nvrtc.h"
#include "kernels/kernel-sources.h"
#include "tap.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARCHS 16
#define MAX_THREADS 4

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the table -------------------------------------------------------------------- */

/* The value of "#ifndef NAME\n#define NAME <value>" in text; 0 if absent. */
static int source_default(const char *text, const char *name, int *value)
{
    char pattern[96];
    snprintf(pattern, sizeof pattern, "#ifndef %s\n#define %s ", name, name);
    const char *at = strstr(text, pattern);
    return at && sscanf(at + strlen(pattern), "%d", value) == 1;
}

/* Each default is one of its values, and the kernels' own defaults (the
 * dialect's or the family's #ifndef blocks) are the table's. */
static void test_table(void)
{
    for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++) {
        const pv_kernel_family_spec *spec = pv_kernel_family_spec_of((pv_kernel_family)f);
        int good = spec->n_params > 0 && spec->n_params <= PV_KPARAM_MAX_PER_FAMILY;
        char why[256] = "";
        for (int i = 0; good && i < spec->n_params; i++) {
            const pv_kparam_spec *ps = &spec->params[i];
            const char *name = pv_kparam_define(ps->param);
            int listed = 0, in_source = 0;
            for (int v = 0; v < ps->n_values; v++)
                listed |= ps->values[v] == ps->def;
            if (!listed) {
                snprintf(why, sizeof why, "%s default %d is not among its values", name, ps->def);
                good = 0;
            } else if ((source_default(pv_kernel_family_source((pv_kernel_family)f), name, &in_source) ||
                        source_default(pv_kernel_source_dialect, name, &in_source)) &&
                       in_source != ps->def) {
                snprintf(why, sizeof why, "%s: the table's default is %d, the kernel's %d", name, ps->def,
                         in_source);
                good = 0;
            }
        }
        ok(good, "table: kernels/%s.cl's parameters and defaults%s%s", spec->name, why[0] ? ": " : "", why);
    }
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_GATHER, &p);
    char defines[128];
    pv_kernel_params_defines(&p, defines, sizeof defines);
    ok(strcmp(defines, "-DPV_WG=64 -DPV_ITEM_ELEMS=8 -DPV_STORE_F16=0") == 0,
       "table: gather's defaults as options: \"%s\"", defines);
}

/* ---- the compile matrix ----------------------------------------------------------------- */

typedef struct job {
    pv_kernel_params params;
    pv_cuda_target target;
    int arch_index;
    int ok;
    char message[1024];
    char note[600]; /* a spill in a tuned candidate, reported, not failed */
} job;

typedef struct job_list {
    job *jobs;
    int n, cap;
    atomic_int next;
} job_list;

static int push_job(job_list *list, const pv_kernel_params *p, pv_cuda_target t, int arch_index)
{
    if (list->n == list->cap) {
        int cap = list->cap ? 2 * list->cap : 64;
        job *grown = realloc(list->jobs, (size_t)cap * sizeof *grown);
        if (!grown)
            return 0;
        list->jobs = grown;
        list->cap = cap;
    }
    job *j = &list->jobs[list->n++];
    memset(j, 0, sizeof *j);
    j->params = *p;
    j->target = t;
    j->arch_index = arch_index;
    return 1;
}

/* Whether family f's full sets cross PV_WG with its other parameters
 * instead of multiplying it in: qmatmul's, where a compile takes some 6 s
 * (the others' 1-2) and its 24 kernels' registers, what its check is
 * about, differ by a few between work-group sizes (ptxas allots them
 * without launch bounds; the sums and the passes fill them). Set k of the
 * other parameters' combinations takes PV_WG's value k mod its count, so
 * that each value of PV_WG meets each value of every other parameter
 * (test_matrix checks it): 36 sets, not 144. */
static int wg_crossed(pv_kernel_family f)
{
    return f == PV_KERNEL_QMATMUL;
}

/* Every set of family f: variants over all their values, tuned parameters
 * over theirs too (all_tuned; PV_WG crossed where wg_crossed says) or at
 * their defaults; launch parameters at their defaults (they build no
 * program of their own). */
static int add_sets(job_list *list, pv_kernel_family f, pv_cuda_target t, int arch_index, int all_tuned)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(f);
    unsigned varied = pv_kernel_params_of_roles(f, (1u << PV_KPARAM_VARIANT) | (all_tuned ? 1u << PV_KPARAM_TUNED : 0));
    const pv_kparam_spec *wg = NULL;
    for (int i = 0; all_tuned && wg_crossed(f) && i < spec->n_params; i++)
        if (spec->params[i].param == PV_KPARAM_WG) {
            wg = &spec->params[i];
            varied &= ~(1u << i);
        }
    const int n = pv_kernel_sets_count(f, varied);
    for (int combo = 0; combo < n; combo++) {
        pv_kernel_params p;
        pv_kernel_sets_nth(f, varied, combo, &p);
        if (wg)
            p.value[PV_KPARAM_WG] = wg->values[combo % wg->n_values];
        if (!push_job(list, &p, t, arch_index))
            return 0;
    }
    return 1;
}

/* The kernels the launchers (backends/cuda/cuda_launch.c) look up in a
 * program of this set, NULL-terminated. */
#define MAX_KERNEL_NAMES 32

static void expected_kernels(const pv_kernel_params *p, const char *names[MAX_KERNEL_NAMES],
                             char storage[MAX_KERNEL_NAMES][40])
{
    const char *const attention[] = {
        pv_attention_kernel_base(p->value[PV_KPARAM_WG], p->value[PV_KPARAM_MAX_HEAD_DIM]), "pv_attention_combine",
        "pv_attention_combine16", NULL};
    static const char *const gather[] = {"pv_kv_write", "pv_rope_kv_write", "pv_slot_gather", "pv_slot_scatter", NULL};
    static const char *const qmatmul[] = {"pv_qmatmul_fused_1",  "pv_qmatmul_fused_4",  "pv_qmatmul_fused_16",
                                          "pv_qmatmul_swiglu_1", "pv_qmatmul_swiglu_4", "pv_qmatmul_swiglu_16",
                                          "pv_qmatmul_group_1",  "pv_qmatmul_group_4",  "pv_qmatmul_group_16",
                                          "pv_qmatmul_widen",    "pv_qmatmul_widen16",  "pv_qmatmul_narrow16",
                                          "pv_embed_gather",     NULL};
    /* the block types' PV_ACT16 kernels */
    static const char *const qmatmul16[] = {"pv_qmatmul_round16",    "pv_qmatmul_fused16_1",  "pv_qmatmul_fused16_4",
                                            "pv_qmatmul_fused16_16", "pv_qmatmul_swiglu16_1", "pv_qmatmul_swiglu16_4",
                                            "pv_qmatmul_swiglu16_16", "pv_qmatmul_group16_1", "pv_qmatmul_group16_4",
                                            "pv_qmatmul_group16_16",  NULL};
    static const char *const recompute[] = {"pv_rmsnorm", "pv_add_rmsnorm", "pv_add_rmsnorm16", "pv_rope",
                                            "pv_swiglu",  "pv_add",         "pv_softmax",       "pv_argmax",
                                            "pv_sample_top_p", "pv_sample_batch", NULL};
    const char *const *base = p->family == PV_KERNEL_ATTENTION ? attention
                              : p->family == PV_KERNEL_GATHER  ? gather
                              : p->family == PV_KERNEL_QMATMUL ? qmatmul
                                                               : recompute;
    const int stored = p->family == PV_KERNEL_ATTENTION || p->family == PV_KERNEL_GATHER;
    int n = 0;
    for (; base[n] && n < MAX_KERNEL_NAMES - 1; n++) {
        if (stored) {
            snprintf(storage[n], sizeof storage[n], "%s_%s", base[n], p->value[PV_KPARAM_STORE_F16] ? "f16" : "f32");
            names[n] = storage[n];
        } else {
            names[n] = base[n];
        }
    }
    /* The slot transfer moves words whatever the storage dtype: one name
     * in every gather program. */
    if (p->family == PV_KERNEL_GATHER && n < MAX_KERNEL_NAMES - 1)
        names[n++] = "pv_slot_transfer";
    if (p->family == PV_KERNEL_QMATMUL && pv_qmatmul_has_act16(p->value[PV_KPARAM_WTYPE]))
        for (int i = 0; qmatmul16[i] && n < MAX_KERNEL_NAMES - 1; i++)
            names[n++] = qmatmul16[i];
    names[n] = NULL;
}

/* Whether the image's symbol strings hold `name` exactly ("\0name\0"). */
static int image_has(const pv_cuda_image *image, const char *name)
{
    const size_t len = strlen(name);
    const char *data = image->data;
    for (size_t i = 1; i + len < image->size; i++)
        if (data[i - 1] == '\0' && data[i + len] == '\0' && memcmp(data + i, name, len) == 0)
            return 1;
    return 0;
}

/* Whether p's tuned parameters are all at their family's defaults. */
static int is_default_tuned(const pv_kernel_params *p)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(p->family);
    for (int i = 0; i < spec->n_params; i++)
        if (spec->params[i].role == PV_KPARAM_TUNED && p->value[spec->params[i].param] != spec->params[i].def)
            return 0;
    return 1;
}

/* The first kernel in ptxas's report (NVRTC's log under
 * --ptxas-options=-v) that keeps something in local memory, in name; 0 if
 * none: spilled registers, or (unless spills_only) a stack frame, an array
 * indexed at run time. Local memory costs a GPU a memory round trip per
 * access, which nothing here could see without one. *n_kernels counts the
 * reports read. */
static int local_memory_user(const char *log, int spills_only, char *name, size_t size, int *n_kernels)
{
    static const char props[] = "Function properties for ";
    *n_kernels = 0;
    for (const char *p = log ? strstr(log, props) : NULL; p; p = strstr(p, props)) {
        p += strlen(props);
        const size_t len = strcspn(p, "\r\n");
        const char *line = p + len;
        unsigned stack = 0, spill_st = 0, spill_ld = 0;
        const char *stats = strstr(line, "bytes stack frame");
        if (!stats)
            break;
        while (stats > line && stats[-1] == ' ')
            stats--;
        while (stats > line && stats[-1] >= '0' && stats[-1] <= '9')
            stats--;
        if (sscanf(stats, "%u bytes stack frame, %u bytes spill stores, %u bytes spill loads", &stack, &spill_st,
                   &spill_ld) != 3)
            break;
        ++*n_kernels;
        if ((stack && !spills_only) || spill_st || spill_ld) {
            snprintf(name, size, "%.*s (%u bytes stack frame, %u spill stores, %u spill loads)", (int)len, p, stack,
                     spill_st, spill_ld);
            return 1;
        }
    }
    return 0;
}

static void run_job(job *j)
{
    char *source = NULL, *log = NULL;
    char options[256];
    pv_cuda_image image = {NULL, 0};
    pv_status st = pv_cuda_family_source(j->params.family, &source);
    if (st == PV_OK)
        st = pv_cuda_build_options(&j->params, j->target, options, sizeof options);
    if (st == PV_OK) {
        char what[64], verbose[300];
        snprintf(what, sizeof what, "kernels/%s.cl", pv_kernel_family_spec_of(j->params.family)->name);
        snprintf(verbose, sizeof verbose, "%s --ptxas-options=-v", options);
        st = pv_cuda_compile_logged(what, source, verbose, j->target, &image, &log);
    }
    if (st != PV_OK) {
        snprintf(j->message, sizeof j->message, "%s", pv_last_error());
    } else {
        const char *names[MAX_KERNEL_NAMES];
        char storage[MAX_KERNEL_NAMES][40], user[200];
        int n_kernels = 0;
        expected_kernels(&j->params, names, storage);
        j->ok = 1;
        for (int i = 0; names[i] && j->ok; i++)
            if (!image_has(&image, names[i])) {
                j->ok = 0;
                snprintf(j->message, sizeof j->message, "\"%s\": the cubin (%zu bytes) has no kernel %s", options,
                         image.size, names[i]);
            }
        /* qmatmul's decode kernels keep their sums and a pass's loads in
         * registers in every set (kernels/qmatmul.cl): no local memory at
         * all. The other families: no spills at the tuned defaults. A
         * stack frame there is CUDA's sin and cos reducing a huge argument
         * (pv_rope, 40 bytes, never reached at RoPE's angles), and a
         * tuned set that spills (attention at PV_WG=16 and head_dim 256:
         * 128 sums a work-item) is a slow candidate pensieve-tune times
         * and passes over, named here as a diagnostic. */
        const int strict = j->params.family == PV_KERNEL_QMATMUL || is_default_tuned(&j->params);
        if (j->ok && local_memory_user(log, j->params.family != PV_KERNEL_QMATMUL, user, sizeof user, &n_kernels)) {
            if (strict) {
                j->ok = 0;
                snprintf(j->message, sizeof j->message, "\"%s\": %s uses local memory", options, user);
            } else {
                snprintf(j->note, sizeof j->note, "\"%s\": %s (a tuned candidate)", options, user);
            }
        } else if (j->ok && n_kernels == 0) {
            j->ok = 0;
            snprintf(j->message, sizeof j->message, "\"%s\": no kernel's resources in ptxas's report", options);
        }
    }
    pv_cuda_image_free(&image);
    free(log);
    free(source);
}

static void *worker(void *arg)
{
    job_list *list = arg;
    for (int i; (i = atomic_fetch_add(&list->next, 1)) < list->n;)
        run_job(&list->jobs[i]);
    return NULL;
}

/* Whether the sets of family f for architecture a (n of them in *n_sets)
 * pair each value of PV_WG with each value of every other tuned or variant
 * parameter; the first pair missing in missing otherwise. */
static int wg_meets_all(const job_list *list, pv_kernel_family f, int a, int *n_sets, char *missing, size_t size)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(f);
    const pv_kparam_spec *wg = NULL;
    *n_sets = 0;
    for (int i = 0; i < spec->n_params; i++)
        if (spec->params[i].param == PV_KPARAM_WG)
            wg = &spec->params[i];
    for (int i = 0; i < list->n; i++)
        *n_sets += list->jobs[i].arch_index == a && list->jobs[i].params.family == f;
    for (int i = 0; wg && i < spec->n_params; i++) {
        const pv_kparam_spec *ps = &spec->params[i];
        if (ps == wg || ps->role == PV_KPARAM_LAUNCH)
            continue;
        for (int w = 0; w < wg->n_values; w++)
            for (int v = 0; v < ps->n_values; v++) {
                int met = 0;
                for (int j = 0; j < list->n && !met; j++) {
                    const pv_kernel_params *p = &list->jobs[j].params;
                    met = list->jobs[j].arch_index == a && p->family == f &&
                          p->value[PV_KPARAM_WG] == wg->values[w] && p->value[ps->param] == ps->values[v];
                }
                if (!met) {
                    snprintf(missing, size, "no set has PV_WG=%d with %s=%d", wg->values[w],
                             pv_kparam_define(ps->param), ps->values[v]);
                    return 0;
                }
            }
    }
    return wg != NULL;
}

static int parse_archs(const char *text, int archs[MAX_ARCHS])
{
    int n = 0;
    for (const char *p = text; *p && n < MAX_ARCHS;) {
        char *end = NULL;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0)
            return 0;
        archs[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static void test_matrix(void)
{
    int archs[MAX_ARCHS];
    const int n_archs = parse_archs(PV_CUDA_TEST_ARCHS, archs);
    if (!ok(n_archs > 0, "matrix: architectures \"%s\" (--with-cuda-arch)", PV_CUDA_TEST_ARCHS))
        return;
    job_list list = {NULL, 0, 0, 0};
    int built = 1;
    const char *matrix = getenv("PV_CUDA_TEST_MATRIX");
    const int full = !matrix || strcmp(matrix, "variants") != 0;
    const int n_compiled = full ? n_archs : 1;
    if (!full && n_archs > 1)
        tap_diag("PV_CUDA_TEST_MATRIX=variants: sm_%d only; the other architectures are the full run's", archs[0]);
    for (int a = 0; a < n_compiled; a++) {
        const pv_cuda_target t = {archs[a], 0};
        for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++)
            built &= add_sets(&list, (pv_kernel_family)f, t, a, a == 0 && full);
    }
    if (!ok(built, "matrix: %d parameter sets listed", list.n))
        return;
    for (int f = 0; full && f < PV_KERNEL_FAMILY_COUNT; f++) {
        char missing[128] = "";
        int n_sets = 0;
        if (!wg_crossed((pv_kernel_family)f))
            continue;
        const int met = wg_meets_all(&list, (pv_kernel_family)f, 0, &n_sets, missing, sizeof missing);
        ok(met, "matrix: kernels/%s.cl's %d sets for sm_%d pair each PV_WG with each value of every other "
           "parameter%s%s",
           pv_kernel_family_spec_of((pv_kernel_family)f)->name, n_sets, archs[0], missing[0] ? ": " : "", missing);
    }

    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    pthread_t threads[MAX_THREADS];
    int started = 0;
    const double t0 = now();
    for (int i = 0; i < n_threads; i++)
        started += pthread_create(&threads[started], NULL, worker, &list) == 0;
    if (started == 0)
        worker(&list);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    tap_diag("%d compiles on %d threads in %.1f s", list.n, started ? started : 1, now() - t0);

    for (int a = 0; a < n_compiled; a++)
        for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++) {
            int total = 0, failed = 0;
            for (int i = 0; i < list.n; i++) {
                const job *j = &list.jobs[i];
                if (j->arch_index != a || j->params.family != (pv_kernel_family)f)
                    continue;
                total++;
                if (!j->ok) {
                    failed++;
                    tap_diag("%s", j->message);
                }
                if (j->note[0])
                    tap_diag("spills in %s", j->note);
            }
            ok(total > 0 && failed == 0,
               "matrix: kernels/%s.cl for sm_%d: %d of %d parameter sets (%s) compile, %s",
               pv_kernel_family_spec_of((pv_kernel_family)f)->name, archs[a], total - failed, total,
               a == 0 && full ? (wg_crossed((pv_kernel_family)f) ? "every value of every parameter, PV_WG crossed"
                                                                  : "every value of every parameter")
                              : "every variant, tuned values at their defaults",
               f == PV_KERNEL_QMATMUL ? "no kernel in local memory" : "no spills at the tuned defaults");
        }
    free(list.jobs);
}

/* ---- targets and PTX ---------------------------------------------------------------------- */

static void test_targets(void)
{
    pv_cuda_target t = {0, 0};
    ok(pv_cuda_target_for(8, 0, &t) == PV_OK && t.arch == 80 && !t.ptx, "target: sm_80 gets a cubin for sm_80");
    ok(pv_cuda_target_for(9, 0, &t) == PV_OK && t.arch == 90 && !t.ptx, "target: sm_90 gets a cubin for sm_90");
    /* A GPU newer than NVRTC knows: PTX of the newest architecture below it. */
    pv_status st = pv_cuda_target_for(99, 0, &t);
    ok(st == PV_OK && t.ptx && t.arch >= 90 && t.arch < 990, "target: a future sm_990 gets PTX for compute_%d",
       t.arch);
    st = pv_cuda_target_for(3, 0, &t);
    ok(st == PV_ERR_UNSUPPORTED && strstr(pv_last_error(), "sm_30"), "target: sm_30 is refused: %s",
       pv_last_error());

    /* The PTX path compiles too, and holds the entry points. */
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_RECOMPUTE, &p);
    const pv_cuda_target ptx = {80, 1};
    pv_cuda_image image = {NULL, 0};
    st = pv_cuda_program_image(NULL, &p, ptx, &image);
    ok(st == PV_OK && image.size > 1 && ((char *)image.data)[image.size - 1] == '\0' &&
           strstr(image.data, ".entry pv_sample_top_p"),
       "ptx: kernels/recompute.cl for compute_80 (%zu bytes)%s%s", image.size, st ? ": " : "",
       st ? pv_last_error() : "");
    pv_cuda_image_free(&image);
}

/* ---- planted bugs: the errors the matrix would report ----------------------------------- */

/* Compiles text with options and checks that it fails with a message
 * naming `what`, the options and `needle` from NVRTC's log. */
static void expect_failure(const char *label, const char *what, const char *source, const char *options,
                           const char *needle)
{
    const pv_cuda_target t = {80, 0};
    pv_cuda_image image = {NULL, 0};
    pv_status st = pv_cuda_compile(what, source, options, t, &image);
    const char *msg = pv_last_error();
    ok(st == PV_ERR_BACKEND && image.data == NULL && strstr(msg, what) && strstr(msg, options) &&
           strstr(msg, needle),
       "planted: %s fails, naming the file, the options and \"%s\"", label, needle);
    tap_diag("%s", msg);
    pv_cuda_image_free(&image);
}

static void test_planted(void)
{
    char *source = NULL;
    if (!ok(pv_cuda_family_source(PV_KERNEL_RECOMPUTE, &source) == PV_OK, "planted: recompute source"))
        return;
    char options[256];
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_RECOMPUTE, &p);
    const pv_cuda_target t = {80, 0};
    pv_cuda_build_options(&p, t, options, sizeof options);

    /* A syntax error in a kernel: the source, as the matrix builds it, with
     * one broken line after the family's text. */
    const char bug[] = "\nPV_KERNEL pv_planted(PV_GLOBAL float *x) { x[0] = 1.0f }\n";
    char *broken = malloc(strlen(source) + sizeof bug);
    if (broken) {
        strcpy(broken, source);
        strcat(broken, bug);
        expect_failure("a missing semicolon", "kernels/recompute.cl", broken, options, "expected a \";\"");
    }
    free(broken);
    /* An option NVRTC does not know. */
    char bad_option[300];
    snprintf(bad_option, sizeof bad_option, "%s --no-such-option", options);
    expect_failure("an unknown option", "kernels/recompute.cl", source, bad_option, "no-such-option");
    free(source);

    /* A value outside the table: the kernel's own #error. */
    pv_kernel_params_default(PV_KERNEL_QMATMUL, &p);
    p.value[PV_KPARAM_WTYPE] = 5;
    if (pv_cuda_family_source(PV_KERNEL_QMATMUL, &source) == PV_OK &&
        pv_cuda_build_options(&p, t, options, sizeof options) == PV_OK)
        expect_failure("PV_WTYPE=5", "kernels/qmatmul.cl", source, options, "not a supported weight type");
    free(source);
    /* Past a resource limit, caught by ptxas: attention at PV_WG = 128
     * needs 66 KiB of shared memory, over CUDA's 48 KiB. */
    pv_kernel_params_default(PV_KERNEL_ATTENTION, &p);
    p.value[PV_KPARAM_WG] = 128;
    source = NULL;
    if (pv_cuda_family_source(PV_KERNEL_ATTENTION, &source) == PV_OK &&
        pv_cuda_build_options(&p, t, options, sizeof options) == PV_OK)
        expect_failure("attention at PV_WG=128", "kernels/attention.cl", source, options, "too much shared data");
    free(source);

    /* A kernel that keeps an array in local memory (indexed at run time),
     * and one that does not: the matrix's local-memory check tells them
     * apart by name. */
    static const char local_array[] =
        "extern \"C\" __global__ void pv_clean(float *x) { x[threadIdx.x] *= 2.0f; }\n"
        "extern \"C\" __global__ void pv_stack(float *x, int i)\n"
        "{ float a[64]; for (int k = 0; k < 64; k++) a[k] = x[k]; a[i & 63] += 1.0f; x[0] = a[(i >> 6) & 63]; }\n";
    pv_cuda_image image = {NULL, 0};
    char *log = NULL, user[200] = "";
    int n_kernels = 0;
    const pv_status st = pv_cuda_compile_logged("planted", local_array, "--gpu-architecture=sm_80 --ptxas-options=-v",
                                                t, &image, &log);
    const int found = st == PV_OK && local_memory_user(log, 0, user, sizeof user, &n_kernels);
    ok(found && strstr(user, "pv_stack") && !strstr(user, "pv_clean") && n_kernels >= 1,
       "planted: an array indexed at run time is found in local memory: %s", user[0] ? user : pv_last_error());
    pv_cuda_image_free(&image);
    free(log);
}

/* ---- the cache ------------------------------------------------------------------------------ */

static int write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    int good = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && good;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Removes dir and what the test put in it (two levels at most). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            struct stat st;
            if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(path);
            else
                unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static void test_cache_keys(void)
{
    const pv_cuda_target sm80 = {80, 0}, sm90 = {90, 0}, ptx80 = {80, 1};
    const uint64_t base = pv_cuda_cache_key("source", "-DPV_WG=64 --gpu-architecture=sm_80", sm80);
    ok(base == pv_cuda_cache_key("source", "-DPV_WG=64 --gpu-architecture=sm_80", sm80),
       "cache key: the same build, the same key");
    ok(base != pv_cuda_cache_key("source", "-DPV_WG=32 --gpu-architecture=sm_80", sm80),
       "cache key: other options, another key");
    ok(base != pv_cuda_cache_key("sourcf", "-DPV_WG=64 --gpu-architecture=sm_80", sm80),
       "cache key: another source, another key");
    ok(base != pv_cuda_cache_key("source", "-DPV_WG=64 --gpu-architecture=sm_80", sm90) &&
           base != pv_cuda_cache_key("source", "-DPV_WG=64 --gpu-architecture=sm_80", ptx80),
       "cache key: another target, another key");
    ok(pv_cuda_cache_key("ab", "c", sm80) != pv_cuda_cache_key("a", "bc", sm80),
       "cache key: the boundary between source and options counts");

    /* Where the cache lives. */
    char dir[4096], home[4096] = "";
    const char *saved_home = getenv("HOME");
    if (saved_home)
        snprintf(home, sizeof home, "%s", saved_home);
    setenv("PV_CUDA_CACHE_DIR", "/tmp/pv-explicit", 1);
    ok(pv_cuda_cache_dir(dir, sizeof dir) && strcmp(dir, "/tmp/pv-explicit") == 0,
       "cache dir: $PV_CUDA_CACHE_DIR first: %s", dir);
    unsetenv("PV_CUDA_CACHE_DIR");
    setenv("XDG_CACHE_HOME", "/tmp/pv-xdg", 1);
    ok(pv_cuda_cache_dir(dir, sizeof dir) && strcmp(dir, "/tmp/pv-xdg/pensieve/cuda") == 0,
       "cache dir: then $XDG_CACHE_HOME/pensieve/cuda: %s", dir);
    setenv("XDG_CACHE_HOME", "relative", 1);
    setenv("HOME", "/tmp/pv-home", 1);
    ok(pv_cuda_cache_dir(dir, sizeof dir) && strcmp(dir, "/tmp/pv-home/.cache/pensieve/cuda") == 0,
       "cache dir: a relative $XDG_CACHE_HOME is ignored for $HOME/.cache/pensieve/cuda: %s", dir);
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    ok(!pv_cuda_cache_dir(dir, sizeof dir), "cache dir: none without any of them");
    if (saved_home)
        setenv("HOME", home, 1);
}

static void test_cache_files(const char *tmp)
{
    const pv_cuda_target t = {80, 0};
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/a/b/cuda", tmp); /* parents created on the way */
    const uint64_t key = 0x0123456789abcdefULL;
    unsigned char bytes[1000];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)(i * 7 + 3);
    const pv_cuda_image image = {bytes, sizeof bytes};
    pv_cuda_image back = {NULL, 0};
    pv_cuda_cache_path(dir, key, t, path, sizeof path);

    ok(!pv_cuda_cache_load(dir, key, t, &back), "cache: a missing entry is a miss");
    ok(pv_cuda_cache_store(dir, key, t, &image), "cache: an entry is written, parents created: %s", path);
    int loaded = pv_cuda_cache_load(dir, key, t, &back);
    ok(loaded && back.size == sizeof bytes && memcmp(back.data, bytes, back.size) == 0,
       "cache: the entry reads back (%zu bytes)", back.size);
    pv_cuda_image_free(&back);
    ok(!pv_cuda_cache_load(dir, key ^ 1, t, &back), "cache: another key misses");
    const pv_cuda_target ptx = {80, 1};
    ok(!pv_cuda_cache_load(dir, key, ptx, &back), "cache: the same key for PTX misses");

    /* Damaged entries are misses, never errors, and are replaced. */
    const long whole = file_size(path);
    ok(truncate(path, whole - 1) == 0 && !pv_cuda_cache_load(dir, key, t, &back),
       "cache: an entry truncated by one byte is rejected");
    ok(truncate(path, 20) == 0 && !pv_cuda_cache_load(dir, key, t, &back),
       "cache: an entry truncated inside its header is rejected");
    ok(pv_cuda_cache_store(dir, key, t, &image) && pv_cuda_cache_load(dir, key, t, &back),
       "cache: a rejected entry is rewritten and then read");
    pv_cuda_image_free(&back);
    FILE *f = fopen(path, "r+b");
    int flipped = f && fseek(f, whole - 10, SEEK_SET) == 0 && fputc(0x5a, f) != EOF;
    if (f)
        fclose(f);
    ok(flipped && !pv_cuda_cache_load(dir, key, t, &back), "cache: an entry with a changed byte is rejected");
    ok(write_file(path, "garbage", 7) && !pv_cuda_cache_load(dir, key, t, &back),
       "cache: a file that is no entry is rejected");

    /* A directory that cannot be made: no entry, no error, no output. */
    char blocked[4096];
    snprintf(blocked, sizeof blocked, "%s/file", tmp);
    write_file(blocked, "x", 1);
    snprintf(blocked, sizeof blocked, "%s/file/cuda", tmp);
    ok(!pv_cuda_cache_store(blocked, key, t, &image) && !pv_cuda_cache_load(blocked, key, t, &back),
       "cache: a directory under a file is not written, and misses");

    /* No temporary files are left behind. */
    DIR *d = opendir(dir);
    int others = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        others += e->d_name[0] != '.' && strcmp(e->d_name, "0123456789abcdef.cubin") != 0;
    if (d)
        closedir(d);
    ok(d && others == 0, "cache: only the entry is in the directory (%d other files)", others);
}

/* pv_cuda_program_image: compiles and stores on a miss, reads on a hit
 * (a planted entry proves the read), recompiles over a damaged entry. */
static void test_program_cache(const char *tmp)
{
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/programs", tmp);
    const pv_cuda_target t = {80, 0};
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_GATHER, &p);
    char *source = NULL, options[256];
    if (!ok(pv_cuda_family_source(PV_KERNEL_GATHER, &source) == PV_OK &&
                pv_cuda_build_options(&p, t, options, sizeof options) == PV_OK,
            "program cache: gather source and options"))
        return;
    const uint64_t key = pv_cuda_cache_key(source, options, t);
    free(source);
    pv_cuda_cache_path(dir, key, t, path, sizeof path);

    pv_cuda_image compiled = {NULL, 0}, again = {NULL, 0};
    pv_status st = pv_cuda_program_image(dir, &p, t, &compiled);
    ok(st == PV_OK && file_size(path) == (long)compiled.size + 32,
       "program cache: a miss compiles (%zu bytes) and stores %s%s%s", compiled.size, path, st ? ": " : "",
       st ? pv_last_error() : "");

    static const char planted[] = "not a cubin, but the cache's";
    const pv_cuda_image fake = {(void *)planted, sizeof planted};
    pv_cuda_cache_store(dir, key, t, &fake);
    st = pv_cuda_program_image(dir, &p, t, &again);
    ok(st == PV_OK && again.size == sizeof planted && memcmp(again.data, planted, sizeof planted) == 0,
       "program cache: a hit is read, not compiled");
    pv_cuda_image_free(&again);

    if (truncate(path, file_size(path) - 3) != 0)
        tap_diag("cannot truncate %s", path);
    st = pv_cuda_program_image(dir, &p, t, &again);
    ok(st == PV_OK && again.size == compiled.size && memcmp(again.data, compiled.data, compiled.size) == 0 &&
           file_size(path) == (long)compiled.size + 32,
       "program cache: a truncated entry is recompiled and rewritten");
    pv_cuda_image_free(&again);
    pv_cuda_image_free(&compiled);
}

int main(void)
{
    const double t0 = now();
    test_table();
    test_cache_keys();
    const char *base = getenv("TMPDIR");
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s/pv-cuda-cache-XXXXXX", base && *base ? base : "/tmp");
    if (ok(mkdtemp(tmp) != NULL, "cache: a scratch directory")) {
        test_cache_files(tmp);
        test_program_cache(tmp);
        remove_tree(tmp);
    }
    test_targets();
    test_planted();
    test_matrix();
    tap_diag("%.1f s in all", now() - t0);
    return tap_done();
}
