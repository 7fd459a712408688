/* Quantized matrix products (pv_qmatmul) per weight type, shape and batch:
 * weight bytes streamed per second against the memory's reference measured
 * in the same run (decode is bound by it): the machine's all-core STREAM
 * read on the CPU backend, the device's own copy (bench-device.h) on a
 * device backend; and GFLOP/s
 * against the cores' nominal FMA rate (batched decode and prefill are bound
 * by that).
 *
 * Each timed pass calls the op on enough copies of the matrix to fill 4x
 * the last-level cache, one after another, so every call reads its weights
 * from memory as a decode step does (the model's 96 MB never fit the cache),
 * not from the cache a repeated call would leave them in. With --hot, two
 * copies only: the weights come from cache, and the table shows what the
 * kernels compute when memory does not hold them back.
 *
 * Usage: bench-qmatmul [--backend cpu|opencl|cuda] [--types q4_1,q8_0,...]
 *                      [--shapes 576x576,1536x576,...] [--tokens 1,4,16,64]
 *                      [--gemm f32,f16,bf16,tf32] [--act16 0,1] [--rows 2,4,8] [--lanes 1,8]
 *                      [--reps 5] [--hot] [--json]
 * A shape is n_out x n_in. The defaults are SmolLM2-135M's projections
 * (attention 576x576 and 192x576, FFN 1536x576 and 576x1536, output
 * 49152x576). --gemm runs the whole table once per PV_GEMM mode
 * (backends/kernel-params.h: the precision of the GEMMs that batches too
 * large for the fused kernels take), set as pensieve-tune sets it; without
 * it the backend keeps its own. --act16 does the same for PV_ACT16 (the
 * decode-sized products of the block types from x rounded to 16 bits) and
 * --rows for PV_QMV_ROWS (the rows of W a work-group of the one-token
 * kernels takes) and --lanes for PV_QMV_LANES (the row lanes of a
 * work-group of every decode-sized kernel), the lists crossed. */
#include "config.h"

#include "backends/kernel-params.h"
#include "bench/bench-device.h"
#include "bench/bench-util.h"

#include <pensieve/backend.h>
#include <pensieve/half.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_ITEMS 16
#define MAX_REPS 31

typedef struct options {
    const char *backend;
    pv_wtype types[MAX_ITEMS];
    int n_types;
    int64_t shapes[MAX_ITEMS][2]; /* n_out, n_in */
    int n_shapes;
    int64_t tokens[MAX_ITEMS];
    int n_tokens;
    int gemm[PV_GEMM_MODES];
    int n_gemm; /* 0: the backend's own mode */
    int act16[2];
    int n_act16; /* 0: the backend's own */
    int rows[3];
    int n_rows; /* 0: the backend's own */
    int lanes[2];
    int n_lanes; /* 0: the backend's own */
    int reps;
    int hot; /* two copies only: the weights come from cache */
    int json;
} options;

typedef struct result {
    int gemm;  /* -1: the backend's own */
    int act16; /* -1: the backend's own */
    int rows;  /* -1: the backend's own */
    int lanes; /* -1: the backend's own */
    pv_wtype type;
    int64_t n_out, n_in, n_tokens;
    double weight_bytes, us_per_call, gbps, gflops;
} result;

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static float uniform(uint64_t *state)
{
    return (float)(next_random(state) >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* One row of n_in weights of type t with values in about [-1, 1]: random
 * codes under sane scales, so no NaN or subnormal slows a kernel down. */
static void fill_row(pv_wtype t, uint8_t *row, int64_t n_in, uint64_t *state)
{
    uint32_t elems = 1, bytes = 4;
    pv_wtype_block(t, &elems, &bytes);
    for (int64_t i = 0; i < n_in / elems; i++) {
        uint8_t *b = row + (size_t)i * bytes;
        if (t == PV_W_F32) {
            float v = uniform(state);
            memcpy(b, &v, 4);
        } else if (t == PV_W_F16) {
            pv_half h = pv_float_to_half(uniform(state));
            memcpy(b, &h, 2);
        } else if (t == PV_W_BF16) {
            float v = uniform(state);
            uint32_t bits;
            memcpy(&bits, &v, 4);
            uint16_t top = (uint16_t)(bits >> 16);
            memcpy(b, &top, 2);
        } else {
            for (uint32_t k = 0; k < bytes; k++)
                b[k] = (uint8_t)next_random(state);
            pv_half d = pv_float_to_half(t == PV_W_Q8_0 ? 1.0f / 128 : 1.0f / 8);
            pv_half m = pv_float_to_half(-1.0f);
            memcpy(b, &d, 2);
            if (t == PV_W_Q4_1)
                memcpy(b + 2, &m, 2);
        }
    }
}

/* Bytes of an n_out x n_in matrix of type t, or 0 if n_in is not whole
 * blocks. */
static uint64_t matrix_bytes(pv_wtype t, int64_t n_out, int64_t n_in)
{
    uint32_t elems = 1, bytes = 4;
    if (!pv_wtype_block(t, &elems, &bytes) || n_in % elems != 0)
        return 0;
    return (uint64_t)n_out * ((uint64_t)n_in / elems * bytes);
}

/* A result's PV_GEMM mode, "own" when the backend kept its own. */
static const char *gemm_label(int gemm)
{
    return gemm < 0 ? "own" : pv_gemm_mode_name(gemm);
}

static pv_status bench_one(pv_backend *be, const options *opt, pv_wtype t, int64_t n_out, int64_t n_in,
                           result *res)
{
    const uint64_t mat_bytes = matrix_bytes(t, n_out, n_in);
    if (mat_bytes == 0)
        return pv_error(PV_ERR_INVALID_ARG, "bench-qmatmul: n_in %lld is not whole blocks of %s", (long long)n_in,
                        pv_wtype_name(t));
    const uint64_t target = opt->hot ? 0 : bench_stream_array_bytes();
    uint64_t copies = (target + mat_bytes - 1) / mat_bytes;
    copies = copies < 2 ? 2 : copies;
    int64_t max_t = 1;
    for (int i = 0; i < opt->n_tokens; i++)
        max_t = opt->tokens[i] > max_t ? opt->tokens[i] : max_t;

    pv_buffer *w = NULL, *x = NULL, *y = NULL;
    uint8_t *host = malloc((size_t)mat_bytes);
    float *xh = malloc((size_t)(max_t * n_in) * sizeof *xh);
    pv_status st = host && xh ? PV_OK : pv_error(PV_ERR_OUT_OF_MEMORY, "bench-qmatmul: host copies");
    if (st == PV_OK)
        st = pv_buffer_init(&w, be, PV_MEM_DEVICE, mat_bytes * copies);
    if (st == PV_OK)
        st = pv_buffer_advise_streamed(w); /* as the model's weights are */
    if (st == PV_OK)
        st = pv_buffer_init(&x, be, PV_MEM_DEVICE, (uint64_t)(max_t * n_in) * sizeof(float));
    if (st == PV_OK)
        st = pv_buffer_init(&y, be, PV_MEM_DEVICE, (uint64_t)(max_t * n_out) * sizeof(float));
    uint64_t state = 0x9e3779b97f4a7c15ull;
    if (st == PV_OK) {
        const uint64_t row_bytes = mat_bytes / (uint64_t)n_out;
        for (int64_t r = 0; r < n_out; r++)
            fill_row(t, host + (uint64_t)r * row_bytes, n_in, &state);
        for (uint64_t c = 0; c < copies && st == PV_OK; c++)
            st = pv_weights_write(w, c * mat_bytes, t, n_out, n_in, host);
        for (int64_t i = 0; i < max_t * n_in; i++)
            xh[i] = uniform(&state);
        if (st == PV_OK)
            st = pv_buffer_write(x, 0, xh, (uint64_t)(max_t * n_in) * sizeof(float));
    }
    const uint64_t elems_per_copy = (uint64_t)n_out * (uint64_t)n_in;
    for (int i = 0; i < opt->n_tokens && st == PV_OK; i++) {
        const int64_t T = opt->tokens[i];
        double times[MAX_REPS];
        for (int r = -1; r < opt->reps && st == PV_OK; r++) { /* r = -1 warms up */
            double t0 = bench_now_s();
            for (uint64_t c = 0; c < copies && st == PV_OK; c++) {
                pv_qmatmul_args a = {.w_type = t, .n_tokens = T, .n_in = n_in, .n_out = n_out,
                                     .w = w, .w_off = c * elems_per_copy, .x = x, .y = y};
                st = pv_qmatmul(be, &a);
            }
            if (st == PV_OK)
                st = pv_backend_finish(be);
            if (r >= 0)
                times[r] = (bench_now_s() - t0) / (double)copies;
        }
        if (st != PV_OK)
            break;
        result *o = &res[i];
        o->type = t;
        o->n_out = n_out;
        o->n_in = n_in;
        o->n_tokens = T;
        o->weight_bytes = (double)mat_bytes;
        const double s = bench_median(times, opt->reps);
        o->us_per_call = s * 1e6;
        o->gbps = (double)mat_bytes / s / 1e9;
        o->gflops = 2.0 * (double)T * (double)n_out * (double)n_in / s / 1e9;
    }
    pv_buffer_free(w);
    pv_buffer_free(x);
    pv_buffer_free(y);
    free(host);
    free(xh);
    return st;
}

static int parse_list(const char *s, int64_t *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0 || v > (1 << 20))
            return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

static int parse_shapes(const char *s, options *o)
{
    o->n_shapes = 0;
    while (*s && o->n_shapes < MAX_ITEMS) {
        char *end;
        long long n_out = strtoll(s, &end, 10);
        if (end == s || *end != 'x' || n_out <= 0 || n_out > (1 << 24))
            return -1;
        const char *p = end + 1;
        long long n_in = strtoll(p, &end, 10);
        if (end == p || n_in <= 0 || n_in > (1 << 20) || (*end && *end != ','))
            return -1;
        o->shapes[o->n_shapes][0] = n_out;
        o->shapes[o->n_shapes][1] = n_in;
        o->n_shapes++;
        s = *end ? end + 1 : end;
    }
    return *s ? -1 : 0;
}

static int parse_types(const char *s, options *o)
{
    static const pv_wtype all[] = {PV_W_F32, PV_W_F16, PV_W_BF16, PV_W_Q8_0, PV_W_Q4_0, PV_W_Q4_1};
    o->n_types = 0;
    while (*s && o->n_types < MAX_ITEMS) {
        size_t len = strcspn(s, ",");
        int found = 0;
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (strlen(pv_wtype_name(all[i])) == len && strncasecmp(pv_wtype_name(all[i]), s, len) == 0) {
                o->types[o->n_types++] = all[i];
                found = 1;
            }
        if (!found)
            return -1;
        s += len + (s[len] == ',');
    }
    return *s ? -1 : 0;
}

static int parse_gemm(const char *s, options *o)
{
    o->n_gemm = 0;
    while (*s && o->n_gemm < PV_GEMM_MODES) {
        size_t len = strcspn(s, ",");
        int found = -1;
        for (int m = 0; m < PV_GEMM_MODES; m++)
            if (strlen(pv_gemm_mode_name(m)) == len && strncmp(pv_gemm_mode_name(m), s, len) == 0)
                found = m;
        if (found < 0)
            return -1;
        o->gemm[o->n_gemm++] = found;
        s += len + (s[len] == ',');
    }
    return *s ? -1 : 0;
}

/* A comma-separated list of single digits from `allowed`, at most max of
 * them, into out; the count, or -1 for anything else. */
static int parse_digits(const char *s, const char *allowed, int *out, int max)
{
    int n = 0;
    while (s[0] && strchr(allowed, s[0]) && (s[1] == ',' || !s[1]) && n < max) {
        out[n++] = s[0] - '0';
        s += s[1] ? 2 : 1;
    }
    return *s || !n ? -1 : n;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--backend cpu|opencl|cuda] [--types f32,f16,bf16,q8_0,q4_0,q4_1]\n"
            "          [--shapes N_OUTxN_IN,...] [--tokens 1,4,16,64] [--gemm f32,f16,bf16,tf32]\n"
            "          [--act16 0,1] [--rows 2,4,8] [--lanes 1,8] [--reps N] [--hot] [--json]\n",
            argv0);
    return 2;
}

int main(int argc, char **argv)
{
    options opt = {.backend = "cpu", .reps = 5};
    parse_types("q4_1,q8_0,q4_0,f16,bf16,f32", &opt);
    parse_shapes("576x576,192x576,1536x576,576x1536,49152x576", &opt);
    opt.n_tokens = parse_list("1,4,16,64", opt.tokens, MAX_ITEMS);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (strcmp(arg, "--json") == 0) {
            opt.json = 1;
            continue;
        }
        if (strcmp(arg, "--hot") == 0) {
            opt.hot = 1;
            continue;
        }
        if (!value)
            return usage(argv[0]);
        if (strcmp(arg, "--backend") == 0)
            opt.backend = value;
        else if (strcmp(arg, "--types") == 0)
            ok = parse_types(value, &opt) == 0 && opt.n_types > 0;
        else if (strcmp(arg, "--shapes") == 0)
            ok = parse_shapes(value, &opt) == 0 && opt.n_shapes > 0;
        else if (strcmp(arg, "--tokens") == 0)
            ok = (opt.n_tokens = parse_list(value, opt.tokens, MAX_ITEMS)) > 0;
        else if (strcmp(arg, "--gemm") == 0)
            ok = parse_gemm(value, &opt) == 0 && opt.n_gemm > 0;
        else if (strcmp(arg, "--act16") == 0)
            ok = (opt.n_act16 = parse_digits(value, "01", opt.act16, 2)) > 0;
        else if (strcmp(arg, "--rows") == 0)
            ok = (opt.n_rows = parse_digits(value, "248", opt.rows, 3)) > 0;
        else if (strcmp(arg, "--lanes") == 0)
            ok = (opt.n_lanes = parse_digits(value, "18", opt.lanes, 2)) > 0;
        else if (strcmp(arg, "--reps") == 0)
            ok = (opt.reps = atoi(value)) >= 1 && opt.reps <= MAX_REPS;
        else
            ok = 0;
        if (!ok)
            return usage(argv[0]);
        i++;
    }

    pv_backend *be = NULL;
    pv_status st = pv_backend_init(&be, opt.backend, 0);
    if (st != PV_OK) {
        fprintf(stderr, "bench-qmatmul: %s\n", pv_last_error());
        return 1;
    }
    bench_cpu cpu;
    bench_cpu_detect(&cpu);
    bench_stream mem;
    if (bench_stream_measure(&mem, 10) != 0) {
        fprintf(stderr, "bench-qmatmul: cannot allocate the STREAM arrays\n");
        pv_backend_free(be);
        return 1;
    }
    const int on_device = strcmp(opt.backend, "cpu") != 0;
    bench_device_copy dev;
    if (on_device && (st = bench_device_copy_measure(be, 10, &dev)) != PV_OK) {
        fprintf(stderr, "bench-qmatmul: device copy: %s\n", pv_last_error());
        pv_backend_free(be);
        return 1;
    }
    const int max_results = 2 * 3 * 2 * PV_GEMM_MODES * MAX_ITEMS * MAX_ITEMS * MAX_ITEMS;
    result *res = calloc((size_t)max_results, sizeof *res);
    int n_res = 0;
    const int n_gemm = opt.n_gemm ? opt.n_gemm : 1, n_act16 = opt.n_act16 ? opt.n_act16 : 1;
    const int n_rows = opt.n_rows ? opt.n_rows : 1, n_lanes = opt.n_lanes ? opt.n_lanes : 1;
    for (int mi = 0; mi < n_gemm * n_act16 * n_rows * n_lanes && st == PV_OK && res; mi++) {
        const int gemm = opt.n_gemm ? opt.gemm[mi % n_gemm] : -1;
        const int act16 = opt.n_act16 ? opt.act16[mi / n_gemm % n_act16] : -1;
        const int rows = opt.n_rows ? opt.rows[mi / (n_gemm * n_act16) % n_rows] : -1;
        const int lanes = opt.n_lanes ? opt.lanes[mi / (n_gemm * n_act16 * n_rows)] : -1;
        char set[32];
        snprintf(set, sizeof set, "PV_GEMM=%d", gemm);
        if (gemm >= 0 && (st = pv_backend_kernel_set(be, "qmatmul", set)) != PV_OK)
            break;
        snprintf(set, sizeof set, "PV_ACT16=%d", act16);
        if (act16 >= 0 && (st = pv_backend_kernel_set(be, "qmatmul", set)) != PV_OK)
            break;
        snprintf(set, sizeof set, "PV_QMV_ROWS=%d", rows);
        if (rows >= 0 && (st = pv_backend_kernel_set(be, "qmatmul", set)) != PV_OK)
            break;
        snprintf(set, sizeof set, "PV_QMV_LANES=%d", lanes);
        if (lanes >= 0 && (st = pv_backend_kernel_set(be, "qmatmul", set)) != PV_OK)
            break;
        for (int ti = 0; ti < opt.n_types && st == PV_OK; ti++) {
            if (!pv_backend_supports_weights(be, PV_OP_QMATMUL, opt.types[ti]))
                continue;
            for (int si = 0; si < opt.n_shapes && st == PV_OK; si++) {
                st = bench_one(be, &opt, opt.types[ti], opt.shapes[si][0], opt.shapes[si][1], res + n_res);
                for (int k = 0; k < opt.n_tokens; k++) {
                    res[n_res + k].gemm = gemm;
                    res[n_res + k].act16 = act16;
                    res[n_res + k].rows = rows;
                    res[n_res + k].lanes = lanes;
                }
                n_res += opt.n_tokens;
            }
        }
    }
    bench_stream after;
    if (st == PV_OK && res && bench_stream_measure(&after, 10) == 0)
        bench_stream_merge(&mem, &after);
    bench_device_copy dev_after;
    if (st == PV_OK && res && on_device && (st = bench_device_copy_measure(be, 10, &dev_after)) == PV_OK)
        bench_device_copy_merge(&dev, &dev_after);
    if (!res || st != PV_OK) {
        fprintf(stderr, "bench-qmatmul: %s\n", res ? pv_last_error() : "out of memory");
        free(res);
        pv_backend_free(be);
        return 1;
    }

    const double read = on_device ? dev.copy.best : mem.read.best, peak = cpu.peak_gflops;
    const char *ref_key = on_device ? "of_device_copy" : "of_stream_read";
    if (opt.json) {
        printf("{\"backend\": \"%s\", \"device\": \"%s\", \"hot\": %s, \"cpu\": ", opt.backend, be->info.name,
               opt.hot ? "true" : "false");
        bench_cpu_json(&cpu);
        printf(", \"stream\": ");
        bench_stream_json(&mem);
        if (on_device) {
            printf(", \"device_copy\": ");
            bench_device_copy_json(&dev);
        }
        printf(", \"results\": [");
        for (int i = 0; i < n_res; i++)
            printf("%s\n  {\"gemm\": \"%s\", \"act16\": %d, \"rows\": %d, \"lanes\": %d, \"type\": \"%s\", "
                   "\"n_out\": %lld, \"n_in\": %lld, "
                   "\"tokens\": %lld, \"weight_bytes\": %.0f, \"us_per_call\": %.3f, \"weight_gbps\": %.3f, "
                   "\"%s\": %.4f, \"gflops\": %.3f}",
                   i ? "," : "", gemm_label(res[i].gemm), res[i].act16, res[i].rows, res[i].lanes,
                   pv_wtype_name(res[i].type), (long long)res[i].n_out, (long long)res[i].n_in,
                   (long long)res[i].n_tokens, res[i].weight_bytes, res[i].us_per_call, res[i].gbps, ref_key,
                   read > 0 ? res[i].gbps / read : 0.0, res[i].gflops);
        printf("\n]}\n");
    } else {
        printf("qmatmul on %s (%s)\n", opt.backend, be->info.name);
        bench_cpu_print(&cpu);
        bench_stream_print(&mem);
        if (on_device)
            bench_device_copy_print(&dev);
        printf("weight GB/s is compared with %s\n", on_device ? "the device copy" : "the STREAM read");
        printf(opt.hot ? "--hot: weights from cache (two copies); median of %d passes\n\n"
                       : "weights are read from memory on every call (copies filling 4x the last-level cache); "
                         "median of %d passes\n\n",
               opt.reps);
        printf("%-7s %-5s %-4s %-5s %-5s %13s %6s %10s %10s %9s %10s %8s\n", "gemm", "act16", "rows", "lanes", "type",
               "n_out x n_in",
               "tokens",
               "us/call",
               "weight GB/s", "of ref", "GFLOP/s", "of peak");
        for (int i = 0; i < n_res; i++) {
            char shape[40];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)res[i].n_out, (long long)res[i].n_in);
            char rows[8], lanes[8];
            snprintf(rows, sizeof rows, "%d", res[i].rows);
            snprintf(lanes, sizeof lanes, "%d", res[i].lanes);
            printf("%-7s %-5s %-4s %-5s %-5s %13s %6lld %10.1f %10.2f %8.0f%% %10.1f", gemm_label(res[i].gemm),
                   res[i].act16 < 0 ? "own" : res[i].act16 ? "1" : "0", res[i].rows < 0 ? "own" : rows,
                   res[i].lanes < 0 ? "own" : lanes,
                   pv_wtype_name(res[i].type), shape,
                   (long long)res[i].n_tokens, res[i].us_per_call, res[i].gbps,
                   read > 0 ? 100.0 * res[i].gbps / read : 0.0, res[i].gflops);
            if (peak > 0)
                printf(" %7.0f%%", 100.0 * res[i].gflops / peak);
            printf("\n");
        }
    }
    free(res);
    pv_backend_free(be);
    return 0;
}
