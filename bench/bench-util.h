/* Timing helpers shared by the benchmark programs, and the machine's own
 * references that their percentages are stated against (issue 8, item 17):
 * STREAM-style read, copy and triad bandwidth on all cores, and the cores'
 * nominal FMA rate. Each program measures them in the same run as its
 * kernels, since the machine's load changes from minute to minute. */
#ifndef PV_BENCH_UTIL_H
#define PV_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Monotonic wall-clock time in seconds. */
static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of v[0..n), n > 0; sorts v. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- memory bandwidth: STREAM-style kernels with OpenMP ---------------------- */

/* Best (the machine's reach, STREAM's convention) and median over the
 * repetitions, GB/s (1e9 bytes/s). Bytes count as STREAM counts them: read
 * 1 x array, copy 2 x (read + write), triad 3 x (two reads, one write); the
 * write-allocate reads a cache makes for stores are not counted. */
typedef struct bench_rate {
    double best, median;
} bench_rate;

typedef struct bench_stream {
    size_t array_bytes; /* each of the three arrays */
    int threads;        /* OpenMP threads of the all-core kernels */
    int reps;
    bench_rate read, copy, triad; /* all threads */
    bench_rate read_1t;           /* one thread, for comparison */
} bench_stream;

/* Arrays of 4 x the last-level cache, at least 256 MiB and at most 1 GiB,
 * so no pass is served from cache. */
static inline size_t bench_stream_array_bytes(void)
{
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0)
        llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    size_t bytes = llc > 0 ? 4 * (size_t)llc : 0;
    if (bytes < ((size_t)256 << 20))
        bytes = (size_t)256 << 20;
    if (bytes > ((size_t)1 << 30))
        bytes = (size_t)1 << 30;
    return bytes;
}

/* Memory for a streamed array: on a 2 MiB boundary with transparent huge
 * pages asked for, as the CPU backend does for weights
 * (pv_buffer_advise_streamed), so the reference streams the way the
 * kernels it is compared with do.
 * Freed with free(); NULL when out of memory. */
static inline void *bench_alloc_streamed(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

static inline int bench_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* 64 independent partial sums per thread: one accumulator would make the
 * read wait on the latency of its adds instead of on memory. */
#define BENCH_READ_LANES 64

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The read with 32-byte loads into eight accumulators: the strongest
 * reference where the kernels it is compared with use AVX2 (the portable
 * loop, built for SSE2, read 26.5 GB/s where this read 29-30 and the F32
 * qmatmul 28-30). n is a multiple of BENCH_READ_LANES. */
__attribute__((target("avx2"))) static inline float bench_read_pass_avx2(const float *a, size_t n, int threads)
{
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        __m256 s[8];
        for (int k = 0; k < 8; k++)
            s[k] = _mm256_setzero_ps();
#pragma omp for schedule(static)
        for (size_t b = 0; b < n / BENCH_READ_LANES; b++)
            for (int k = 0; k < 8; k++)
                s[k] = _mm256_add_ps(s[k], _mm256_loadu_ps(a + b * BENCH_READ_LANES + 8 * k));
        float lanes[8];
        _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])),
                                              _mm256_add_ps(_mm256_add_ps(s[4], s[5]), _mm256_add_ps(s[6], s[7]))));
        for (int k = 0; k < 8; k++)
            total += lanes[k];
    }
    (void)threads;
    return total;
}
#endif

static inline float bench_read_pass(const float *a, size_t n, int threads)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2"))
        return bench_read_pass_avx2(a, n, threads);
#endif
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        float acc[BENCH_READ_LANES] = {0};
#pragma omp for schedule(static)
        for (size_t b = 0; b < n / BENCH_READ_LANES; b++) {
#pragma omp simd
            for (size_t j = 0; j < BENCH_READ_LANES; j++)
                acc[j] += a[b * BENCH_READ_LANES + j];
        }
        for (size_t j = 0; j < BENCH_READ_LANES; j++)
            total += acc[j];
    }
    (void)threads;
    return total;
}

static inline void bench_rate_of(bench_rate *r, double *seconds, int reps, double bytes)
{
    double best = seconds[0];
    for (int i = 1; i < reps; i++)
        best = seconds[i] < best ? seconds[i] : best;
    r->best = bytes / best / 1e9;
    qsort(seconds, (size_t)reps, sizeof *seconds, bench_cmp_double);
    r->median = bytes / (reps % 2 ? seconds[reps / 2] : 0.5 * (seconds[reps / 2 - 1] + seconds[reps / 2])) / 1e9;
}

/* Measures read, copy and triad on all threads and read on one thread, reps
 * passes each (at most 32) after one warm-up pass. Returns 0, or -1 if the
 * arrays cannot be allocated. */
static inline int bench_stream_measure(bench_stream *st, int reps)
{
    memset(st, 0, sizeof *st);
    st->array_bytes = bench_stream_array_bytes();
    st->threads = bench_max_threads();
    st->reps = reps < 1 ? 1 : reps > 32 ? 32 : reps;
    size_t n = st->array_bytes / sizeof(float);
    n -= n % BENCH_READ_LANES;
    float *a = bench_alloc_streamed(n * sizeof *a), *b = bench_alloc_streamed(n * sizeof *b);
    float *c = bench_alloc_streamed(n * sizeof *c);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return -1;
    }
    int threads = st->threads;
    /* First touch by the threads that will read each part. */
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (size_t i = 0; i < n; i++) {
        a[i] = 1.0f;
        b[i] = 2.0f;
        c[i] = 0.5f;
    }
    double t_read[32], t_copy[32], t_triad[32], t_read1[32];
    const float s = 3.0f;
    volatile float sink = 0;
    for (int r = -1; r < st->reps; r++) { /* r = -1 warms up */
        double t0 = bench_now_s();
        sink += bench_read_pass(b, n, threads);
        double t1 = bench_now_s();
#pragma omp parallel for simd schedule(static) num_threads(threads)
        for (size_t i = 0; i < n; i++)
            c[i] = a[i];
        double t2 = bench_now_s();
#pragma omp parallel for simd schedule(static) num_threads(threads)
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] + s * c[i];
        double t3 = bench_now_s();
        sink += bench_read_pass(c, n, 1);
        double t4 = bench_now_s();
        if (r >= 0) {
            t_read[r] = t1 - t0;
            t_copy[r] = t2 - t1;
            t_triad[r] = t3 - t2;
            t_read1[r] = t4 - t3;
        }
    }
    (void)sink;
    double bytes = (double)(n * sizeof(float));
    bench_rate_of(&st->read, t_read, st->reps, bytes);
    bench_rate_of(&st->copy, t_copy, st->reps, 2 * bytes);
    bench_rate_of(&st->triad, t_triad, st->reps, 3 * bytes);
    bench_rate_of(&st->read_1t, t_read1, st->reps, bytes);
    free(a);
    free(b);
    free(c);
    return 0;
}

/* Keeps the higher of two measurements of each rate: on a shared machine
 * the reference is what the memory reached, and a program that measures
 * before and after its kernels brackets the load they ran under. */
static inline void bench_stream_merge(bench_stream *st, const bench_stream *other)
{
    bench_rate *mine[4] = {&st->read, &st->copy, &st->triad, &st->read_1t};
    const bench_rate *theirs[4] = {&other->read, &other->copy, &other->triad, &other->read_1t};
    for (int i = 0; i < 4; i++) {
        mine[i]->best = theirs[i]->best > mine[i]->best ? theirs[i]->best : mine[i]->best;
        mine[i]->median = theirs[i]->median > mine[i]->median ? theirs[i]->median : mine[i]->median;
    }
    st->reps += other->reps;
}

static inline void bench_stream_print(const bench_stream *st)
{
    printf("memory (STREAM-style, %d threads, 3 arrays of %zu MiB, best / median, %d passes): read %.1f / %.1f GB/s, "
           "copy %.1f / %.1f, triad %.1f / %.1f; one thread reads %.1f / %.1f\n",
           st->threads, st->array_bytes >> 20, st->reps, st->read.best, st->read.median, st->copy.best,
           st->copy.median, st->triad.best, st->triad.median, st->read_1t.best, st->read_1t.median);
}

static inline void bench_stream_json(const bench_stream *st)
{
    printf("{\"threads\": %d, \"array_bytes\": %zu, \"reps\": %d, "
           "\"read_gbps\": %.3f, \"read_median_gbps\": %.3f, \"copy_gbps\": %.3f, \"copy_median_gbps\": %.3f, "
           "\"triad_gbps\": %.3f, \"triad_median_gbps\": %.3f, \"read_1thread_gbps\": %.3f, "
           "\"read_1thread_median_gbps\": %.3f}",
           st->threads, st->array_bytes, st->reps, st->read.best, st->read.median, st->copy.best, st->copy.median,
           st->triad.best, st->triad.median, st->read_1t.best, st->read_1t.median);
}

/* ---- the cores' nominal f32 FMA rate -------------------------------------------- */

/* cores x FMA pipes x f32 lanes x 2 flops x clock, from /proc/cpuinfo. The
 * clock is "cpu MHz" (in a VM, the nominal clock: turbo is not counted, and
 * AVX-512 may run slower), and every x86 core of the last decade is taken to
 * have 2 FMA pipes (some Xeon Silver/Bronze have one). Lanes: 16 with
 * AVX-512 on Intel; 8 with AVX2 and FMA, and on AMD, whose Zen 2-4 pipes
 * are 256 bits wide even when they take AVX-512. peak_gflops is 0 where
 * any of this is unknown (no /proc/cpuinfo, not x86, no FMA). */
typedef struct bench_cpu {
    char model[128];
    int cores;
    double ghz;
    int fma_pipes, lanes;
    double peak_gflops;
} bench_cpu;

static inline void bench_cpu_detect(bench_cpu *cpu)
{
    memset(cpu, 0, sizeof *cpu);
    snprintf(cpu->model, sizeof cpu->model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[4096];
    int processors = 0, siblings = 0, per_socket = 0, intel = 0, amd = 0, avx512 = 0, avx2 = 0, fma = 0;
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        const char *value = colon + 1 + (colon[1] == ' ');
        if (strncmp(line, "processor", 9) == 0) {
            processors++;
        } else if (processors > 1) {
            continue; /* the first CPU describes them all */
        } else if (strncmp(line, "model name", 10) == 0) {
            snprintf(cpu->model, sizeof cpu->model, "%.*s", (int)strcspn(value, "\n"), value);
        } else if (strncmp(line, "vendor_id", 9) == 0) {
            intel = strstr(value, "GenuineIntel") != NULL;
            amd = strstr(value, "AuthenticAMD") != NULL;
        } else if (strncmp(line, "cpu MHz", 7) == 0) {
            cpu->ghz = atof(value) / 1000.0;
        } else if (strncmp(line, "siblings", 8) == 0) {
            siblings = atoi(value);
        } else if (strncmp(line, "cpu cores", 9) == 0) {
            per_socket = atoi(value);
        } else if (strncmp(line, "flags", 5) == 0) {
            avx512 = strstr(value, " avx512f") != NULL;
            avx2 = strstr(value, " avx2") != NULL;
            fma = strstr(value, " fma") != NULL;
        }
    }
    fclose(f);
    /* With SMT, siblings / cores hardware threads share one core's pipes. */
    int smt = siblings > 0 && per_socket > 0 && siblings >= per_socket ? siblings / per_socket : 1;
    cpu->cores = processors / smt;
    if (!(intel || amd) || !fma || !avx2 || cpu->ghz <= 0)
        return;
    cpu->fma_pipes = 2;
    cpu->lanes = avx512 && intel ? 16 : 8;
    cpu->peak_gflops = cpu->cores * cpu->fma_pipes * cpu->lanes * 2.0 * cpu->ghz;
}

static inline void bench_cpu_print(const bench_cpu *cpu)
{
    if (cpu->peak_gflops > 0)
        printf("cpu: %s, %d cores; nominal f32 FMA peak %d cores x %d FMA pipes x %d lanes x 2 flop x %.2f GHz "
               "= %.1f GFLOP/s\n",
               cpu->model, cpu->cores, cpu->cores, cpu->fma_pipes, cpu->lanes, cpu->ghz, cpu->peak_gflops);
    else
        printf("cpu: %s, %d cores; nominal FMA peak unknown\n", cpu->model, cpu->cores);
}

static inline void bench_cpu_json(const bench_cpu *cpu)
{
    printf("{\"model\": \"%s\", \"cores\": %d, \"ghz\": %.3f, \"fma_pipes\": %d, \"lanes\": %d, "
           "\"nominal_fma_gflops\": %.2f}",
           cpu->model, cpu->cores, cpu->ghz, cpu->fma_pipes, cpu->lanes, cpu->peak_gflops);
}

#endif
