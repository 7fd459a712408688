/* pensieve-cuda-warm: fills the CUDA backend's kernel cache ahead of a run
 * (backends/cuda/README.md, "The kernel cache"), so that no program is
 * compiled on first use: every parameter set of every kernel family that
 * the backend may build (backends/kernel-params.h: each variant with each
 * tuned value) for each architecture given, compiled by NVRTC on as many
 * threads as there are cores. Needs no GPU: a GPU run's package carries a
 * cache made this way (scripts/gpu-pack), since a qmatmul program takes
 * NVRTC seconds to build and a run builds dozens.
 *   pensieve-cuda-warm --arch 90[,80...] [--dir DIR] [--jobs N]
 *                      [--families attention,gather,qmatmul,recompute] [--check]
 * DIR defaults to the backend's own ($PV_CUDA_CACHE_DIR, else
 * ~/.cache/pensieve/cuda). --check compiles nothing and counts the sets
 * already there: an entry is used only under the NVRTC version, source
 * and options it was built with (its key). Prints one JSON object; exit
 * status 1 when a set fails to compile or is missing under --check. */
#include "backends/cuda/cuda_nvrtc.h"
#include "backends/kernel-params.h"

#include <pensieve/status.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARCHS 8
#define MAX_THREADS 64

typedef struct warm_job {
    pv_kernel_params params;
    pv_cuda_target target;
    int present; /* in the cache before */
    int compiled; /* and stored there */
    int failed;
    char message[512];
} warm_job;

typedef struct warm_run {
    warm_job *jobs;
    int n;
    atomic_int next;
    const char *dir;
    int check;
} warm_run;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether the set's image is in the cache under its key. */
static int in_cache(const char *dir, const warm_job *j)
{
    char *source = NULL, options[256];
    int present = 0;
    if (pv_cuda_family_source(j->params.family, &source) == PV_OK &&
        pv_cuda_build_options(&j->params, j->target, options, sizeof options) == PV_OK) {
        pv_cuda_image image = {NULL, 0};
        present = pv_cuda_cache_load(dir, pv_cuda_cache_key(source, options, j->target), j->target, &image);
        pv_cuda_image_free(&image);
    }
    free(source);
    return present;
}

/* One set: found in the cache, or (unless checking) compiled and stored
 * there; a set that compiles but cannot be stored fails too. */
static void warm_one(const warm_run *run, warm_job *j)
{
    j->present = in_cache(run->dir, j);
    if (j->present || run->check)
        return;
    pv_cuda_image image = {NULL, 0};
    if (pv_cuda_program_image(run->dir, &j->params, j->target, &image) != PV_OK) {
        j->failed = 1;
        snprintf(j->message, sizeof j->message, "%s", pv_last_error());
    } else if (!in_cache(run->dir, j)) {
        j->failed = 1;
        snprintf(j->message, sizeof j->message, "compiled, but the cache in %s cannot be written", run->dir);
    } else {
        j->compiled = 1;
    }
    pv_cuda_image_free(&image);
}

static void *worker(void *arg)
{
    warm_run *run = arg;
    for (int i; (i = atomic_fetch_add(&run->next, 1)) < run->n;)
        warm_one(run, &run->jobs[i]);
    return NULL;
}

/* s as a JSON string's contents: quotes and backslashes escaped, control
 * bytes as \u escapes. */
static void print_json_text(const char *s)
{
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: pensieve-cuda-warm --arch 90[,80...] [--dir DIR] [--jobs N]\n"
                    "                          [--families attention,gather,qmatmul,recompute] [--check]\n");
    return 2;
}

/* The families named in a comma-separated list, as bits. */
static int parse_families(const char *s, unsigned *out)
{
    *out = 0;
    while (*s) {
        const size_t len = strcspn(s, ",");
        int found = 0;
        for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++) {
            const char *name = pv_kernel_family_spec_of((pv_kernel_family)f)->name;
            if (strlen(name) == len && strncmp(name, s, len) == 0) {
                *out |= 1u << f;
                found = 1;
            }
        }
        if (!found)
            return -1;
        s += len + (s[len] == ',');
    }
    return *out ? 0 : -1;
}

static int parse_archs(const char *s, int archs[MAX_ARCHS])
{
    int n = 0;
    while (*s && n < MAX_ARCHS) {
        char *end = NULL;
        const long v = strtol(s, &end, 10);
        if (end == s || v < 50 || v > 999 || (*end && *end != ','))
            return -1;
        archs[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *s || !n ? -1 : n;
}

int main(int argc, char **argv)
{
    int archs[MAX_ARCHS], n_archs = 0, n_threads = 0, check = 0;
    unsigned families = (1u << PV_KERNEL_FAMILY_COUNT) - 1;
    char dir[4096] = "";
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--check") == 0) {
            check = 1;
            continue;
        }
        if (!value)
            return usage();
        int ok = 1;
        if (strcmp(arg, "--arch") == 0)
            ok = (n_archs = parse_archs(value, archs)) > 0;
        else if (strcmp(arg, "--dir") == 0)
            ok = strlen(value) < sizeof dir && snprintf(dir, sizeof dir, "%s", value) > 0;
        else if (strcmp(arg, "--jobs") == 0) {
            char *end = NULL;
            const long v = strtol(value, &end, 10);
            ok = end != value && !*end && v >= 1 && v <= MAX_THREADS;
            n_threads = ok ? (int)v : 0;
        }
        else if (strcmp(arg, "--families") == 0)
            ok = parse_families(value, &families) == 0;
        else
            ok = 0;
        if (!ok)
            return usage();
        i++;
    }
    if (!n_archs)
        return usage();
    if (!dir[0] && !pv_cuda_cache_dir(dir, sizeof dir)) {
        fprintf(stderr, "pensieve-cuda-warm: no cache directory (set PV_CUDA_CACHE_DIR or HOME)\n");
        return 1;
    }
    if (!n_threads) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    }

    warm_run run = {.dir = dir, .check = check};
    int cap = 0;
    for (int a = 0; a < n_archs; a++)
        for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++)
            if (families & (1u << f))
                cap += pv_kernel_sets_count(
                    (pv_kernel_family)f,
                    pv_kernel_params_of_roles((pv_kernel_family)f, (1u << PV_KPARAM_TUNED) | (1u << PV_KPARAM_VARIANT)));
    run.jobs = calloc((size_t)cap, sizeof *run.jobs);
    if (!run.jobs) {
        fprintf(stderr, "pensieve-cuda-warm: out of memory for %d parameter sets\n", cap);
        return 1;
    }
    for (int a = 0; a < n_archs; a++) {
        pv_cuda_target target = {0, 0};
        if (pv_cuda_target_for(archs[a] / 10, archs[a] % 10, &target) != PV_OK) {
            fprintf(stderr, "pensieve-cuda-warm: --arch %d: %s\n", archs[a], pv_last_error());
            free(run.jobs);
            return 2;
        }
        for (int f = 0; f < PV_KERNEL_FAMILY_COUNT; f++) {
            if (!(families & (1u << f)))
                continue;
            const unsigned built =
                pv_kernel_params_of_roles((pv_kernel_family)f, (1u << PV_KPARAM_TUNED) | (1u << PV_KPARAM_VARIANT));
            for (int k = 0; k < pv_kernel_sets_count((pv_kernel_family)f, built); k++) {
                warm_job *j = &run.jobs[run.n++];
                pv_kernel_sets_nth((pv_kernel_family)f, built, k, &j->params);
                j->target = target;
            }
        }
    }

    /* The first set alone: a cache that cannot be written fails before
     * the rest are compiled for nothing. */
    const double t0 = now();
    pthread_t threads[MAX_THREADS];
    int started = 0;
    if (run.n) {
        warm_one(&run, &run.jobs[0]);
        atomic_store(&run.next, run.jobs[0].failed ? run.n : 1);
    }
    for (int i = 0; i < n_threads && atomic_load(&run.next) < run.n; i++)
        started += pthread_create(&threads[started], NULL, worker, &run) == 0;
    if (!started)
        worker(&run);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    const double seconds = now() - t0;

    int present = 0, compiled = 0, failed = 0;
    for (int i = 0; i < run.n; i++) {
        present += run.jobs[i].present;
        compiled += run.jobs[i].compiled;
        failed += run.jobs[i].failed;
        if (run.jobs[i].failed)
            fprintf(stderr, "pensieve-cuda-warm: %s\n", run.jobs[i].message);
    }
    const int missing = check ? run.n - present : 0;
    printf("{\"dir\": \"");
    print_json_text(dir);
    printf("\", \"sets\": %d, \"present\": %d, \"compiled\": %d, \"failed\": %d, \"missing\": %d, "
           "\"threads\": %d, \"seconds\": %.1f}\n",
           run.n, present, compiled, failed, missing, started ? started : 1,
           seconds);
    free(run.jobs);
    return failed || missing ? 1 : 0;
}
