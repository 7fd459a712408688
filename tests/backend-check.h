/* Helpers shared by the backend tests: a seeded RNG, guarded device tensors
 * (sentinel bytes around the region an op may write) and comparisons that
 * never let NaN pass. */
#ifndef PV_TESTS_BACKEND_CHECK_H
#define PV_TESTS_BACKEND_CHECK_H

#include "backends/backend.h"
#include "tap.h"

#include <pensieve/half.h>

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers (splitmix64: tiny, seedable, same on every machine) ---- */

static inline uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [0, 1) */
static inline double rng_unit(uint64_t *state)
{
    return (double)(rng_next(state) >> 11) * 0x1p-53;
}

/* uniform in [lo, hi) */
static inline float rng_range(uint64_t *state, float lo, float hi)
{
    return lo + (hi - lo) * (float)rng_unit(state);
}

/* uniform integer in [0, n) */
static inline int32_t rng_below(uint64_t *state, int64_t n)
{
    return (int32_t)(rng_next(state) % (uint64_t)n);
}

static inline void rng_fill(uint64_t *state, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_range(state, lo, hi);
}

/* Fisher-Yates */
static inline void rng_shuffle(uint64_t *state, int32_t *x, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(state, (int64_t)i);
        int32_t t = x[i - 1];
        x[i - 1] = x[j];
        x[j] = t;
    }
}

/* Exits the test with a diagnostic: only for allocation failures of the
 * test's own host memory, which leave nothing meaningful to test. */
static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        printf("Bail out! cannot allocate %zu bytes of test data\n", bytes);
        exit(1);
    }
    return p;
}

/* ---- guarded tensors ------------------------------------------------------
 * A tensor is a region of n elements inside a buffer that has GUARD_BYTES of
 * sentinel before and after it; ops get the region's element offset, and
 * guards_intact() checks that nothing outside the region changed. */

#define GUARD_BYTES 256
#define SENTINEL_BYTE 0xa5

typedef struct tensor {
    pv_buffer *buf;
    size_t elem_size;
    uint64_t n;   /* elements in the region */
    uint64_t off; /* region offset in elements */
} tensor;

/* Allocates the guarded region; fills it from init (n elements) or with the
 * sentinel when init is NULL. Returns a status; msg names the failure. */
static inline pv_status tensor_init(tensor *t, pv_backend *be, pv_mem_kind kind, size_t elem_size, uint64_t n,
                                    const void *init)
{
    memset(t, 0, sizeof *t);
    t->elem_size = elem_size;
    t->n = n;
    t->off = GUARD_BYTES / elem_size;
    uint64_t total = 2 * GUARD_BYTES + n * elem_size;
    unsigned char *fill = xmalloc((size_t)total);
    memset(fill, SENTINEL_BYTE, (size_t)total);
    if (init)
        memcpy(fill + GUARD_BYTES, init, (size_t)(n * elem_size));
    pv_status st = pv_buffer_init(&t->buf, be, kind, total);
    if (st == PV_OK)
        st = pv_buffer_write(t->buf, 0, fill, total);
    free(fill);
    return st;
}

static inline void tensor_free(tensor *t)
{
    pv_buffer_free(t->buf);
    t->buf = NULL;
}

static inline pv_status tensor_read(const tensor *t, void *dst)
{
    return pv_buffer_read(t->buf, GUARD_BYTES, dst, t->n * t->elem_size);
}

static inline pv_status tensor_write(tensor *t, const void *src)
{
    return pv_buffer_write(t->buf, GUARD_BYTES, src, t->n * t->elem_size);
}

/* 1 when both guards still hold the sentinel. */
static inline int guards_intact(const tensor *t)
{
    unsigned char guard[GUARD_BYTES];
    int intact = 1;
    for (int side = 0; side < 2; side++) {
        uint64_t at = side == 0 ? 0 : GUARD_BYTES + t->n * t->elem_size;
        if (pv_buffer_read(t->buf, at, guard, GUARD_BYTES) != PV_OK)
            return 0;
        for (int i = 0; i < GUARD_BYTES; i++)
            intact &= guard[i] == SENTINEL_BYTE;
    }
    return intact;
}

/* ---- the backends under test ------------------------------------------------------------ */

/* A run of op checks on one backend against the CPU reference. */
typedef struct check_ctx {
    pv_backend *cpu;
    pv_backend *be; /* under test: the CPU itself in the CPU pass */
    const char *name;
    int cpu_pass;   /* want = closed form; otherwise want = the CPU's output */
    uint64_t rng;
} check_ctx;

/* Opens each backend this library can load (or only `only`, NULL for all;
 * the CPU too unless skip_cpu) and calls fn on it, then frees it: a
 * backend with no device is a SKIP, one that does not open a failure.
 * Returns whether `only` (if any) was among them. */
static inline int check_each_backend(const char *only, int skip_cpu,
                                     void (*fn)(pv_backend *be, const char *name, void *arg), void *arg)
{
    int found = only == NULL;
    for (const char *const *name = pv_backend_names(); *name; name++) {
        if ((skip_cpu && strcmp(*name, "cpu") == 0) || (only && strcmp(only, *name) != 0))
            continue;
        found = 1;
        pv_backend *be = NULL;
        pv_status st = pv_backend_init(&be, *name, 0);
        if (st == PV_ERR_NO_DEVICE) {
            tap_skip("backend %s: %s", *name, pv_last_error());
            continue;
        }
        if (!ok(st == PV_OK, "backend %s opens", *name)) {
            tap_diag("%s", pv_last_error());
            continue;
        }
        fn(be, *name, arg);
        pv_backend_free(be);
    }
    return found;
}

/* Parses [--backend NAME] [--seed N] (--seed only when seed is not NULL):
 * returns 0, or the exit status of a usage error. */
static inline int check_args(int argc, char **argv, const char **only, uint64_t *seed)
{
    *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            *only = argv[++i];
        else if (seed && strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
            *seed = strtoull(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--backend NAME]%s\n", argv[0], seed ? " [--seed N]" : "");
            return 2;
        }
    }
    return 0;
}

typedef struct check_main_run {
    check_ctx *c;
    uint64_t seed;
    void (*run)(check_ctx *c);
    void (*device_extra)(check_ctx *c);
} check_main_run;

static inline void check_main_device(pv_backend *be, const char *name, void *arg)
{
    check_main_run *m = arg;
    *m->c = (check_ctx){.cpu = m->c->cpu, .be = be, .name = name, .cpu_pass = 0, .rng = m->seed};
    m->run(m->c);
    if (m->device_extra)
        m->device_extra(m->c);
}

/* The main of a test of ops against the CPU reference:
 *   usage: PROGRAM [--backend NAME] [--seed N]
 * the CPU first (its checks against closed forms: cpu_pass set), then
 * every other backend this library can load (or only NAME), each from the
 * same seed (check_each_backend). run(c) checks one backend;
 * device_extra(c), if any, runs after it on the others. Returns the exit
 * status. */
static inline int check_main(int argc, char **argv, uint64_t seed, void (*run)(check_ctx *c),
                             void (*device_extra)(check_ctx *c))
{
    const char *only = NULL;
    int usage = check_args(argc, argv, &only, &seed);
    if (usage)
        return usage;
    tap_diag("seed %llu (rerun with --seed to reproduce)", (unsigned long long)seed);
    check_ctx c = {.name = "cpu", .rng = seed};
    if (pv_backend_init(&c.cpu, "cpu", 0) != PV_OK) {
        printf("Bail out! the CPU reference does not open: %s\n", pv_last_error());
        return 1;
    }
    int found = only == NULL || strcmp(only, "cpu") == 0;
    if (found) {
        c.be = c.cpu;
        c.cpu_pass = 1;
        run(&c);
    }
    check_main_run m = {&c, seed, run, device_extra};
    found |= check_each_backend(only, 1, check_main_device, &m);
    if (!found)
        ok(0, "backend %s is built into this library", only);
    pv_backend_free(c.cpu);
    return tap_done();
}

/* ---- comparisons ------------------------------------------------------------ */

/* max |got - want| / max(max |want|, floor): a NaN or inf anywhere in either
 * array makes the error infinite, so it never passes a threshold. */
static inline double normalized_error(const float *got, const float *want, size_t n)
{
    double max_diff = 0.0, max_ref = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i]))
            return INFINITY;
        double diff = fabs((double)got[i] - (double)want[i]);
        if (diff > max_diff)
            max_diff = diff;
        if (fabs((double)want[i]) > max_ref)
            max_ref = fabs((double)want[i]);
    }
    return max_diff / max_ref;
}

/* The same against a reference in double. */
static inline double normalized_error_f64(const float *got, const double *want, size_t n)
{
    double max_diff = 0.0, max_ref = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i]))
            return INFINITY;
        double diff = fabs((double)got[i] - want[i]);
        if (diff > max_diff)
            max_diff = diff;
        if (fabs(want[i]) > max_ref)
            max_ref = fabs(want[i]);
    }
    return max_diff / max_ref;
}

/* Rounds f32 values through f16, as a pool or table in f16 holds them. */
static inline void round_to_half(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = pv_half_to_float(pv_float_to_half(x[i]));
}

#endif
