/* kernels/qmatmul.cl's 16-bit operands of the tensor-core GEMMs (PV_GEMM
 * f16 and bf16, backends/kernel-params.h): pv_qmatmul_widen16 and
 * pv_qmatmul_narrow16, built from the embedded kernel text as the OpenCL
 * backend builds it and run on the first OpenCL device (PoCL here). The
 * CUDA backend compiles the same text with NVRTC, where the GEMMs run; no
 * OpenCL launcher uses these kernels, so this test is where their logic is
 * checked without a GPU. Each output must be, bit for bit, the host's
 * rounding to nearest even of the value: every weight type's rows as
 * models/quant.c dequantises them (from a row offset inside the matrix),
 * and activations with the hard cases (ties of both types, f16's overflow
 * and subnormals, infinities, signed zeros; NaN stays a NaN). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "backends/backend.h"
#include "backends/kernel-params.h"
#include "kernels/kernel-sources.h"
#include "tap.h"

#include <pensieve/gguf.h>
#include <pensieve/half.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PV_HAVE_OPENCL
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#define N_OUT 7
#define N_IN 96 /* three blocks of 32 */
#define ROW0 2  /* the tile starts inside the matrix */
#define N_ROWS 4
#define WG 64

typedef struct cl {
    cl_context context;
    cl_device_id device;
    cl_command_queue queue;
} cl;

/* The host's bf16 of v, round to nearest even (not NaN: past bf16's
 * largest value the carry makes it infinite, as it should). */
static uint16_t host_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t host_round16(float v, int bf16)
{
    return bf16 ? host_bf16(v) : pv_float_to_half(v);
}

static int is_nan16(uint16_t h, int bf16)
{
    return bf16 ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t rng = 0x16b16;

static float uniform(float lo, float hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)(rng >> 40) / (float)(1u << 24);
}

static int cl_open(cl *c)
{
    cl_platform_id platforms[8];
    cl_uint n_platforms = 0;
    if (clGetPlatformIDs(8, platforms, &n_platforms) != CL_SUCCESS || n_platforms == 0)
        return 0;
    for (cl_uint p = 0; p < n_platforms; p++) {
        cl_uint n = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 1, &c->device, &n) != CL_SUCCESS || n == 0)
            continue;
        cl_int err;
        c->context = clCreateContext(NULL, 1, &c->device, NULL, NULL, &err);
        if (err != CL_SUCCESS)
            continue;
        c->queue = clCreateCommandQueue(c->context, c->device, 0, &err);
        if (err == CL_SUCCESS)
            return 1;
        clReleaseContext(c->context);
    }
    return 0;
}

/* The qmatmul program for weight type t, built as the backend builds it
 * (the dialect's text, then the family's; every parameter a -D define). */
static cl_program build(cl *c, pv_wtype t)
{
    pv_kernel_params p;
    pv_kernel_params_default(PV_KERNEL_QMATMUL, &p);
    p.value[PV_KPARAM_WG] = WG;
    p.value[PV_KPARAM_WTYPE] = (int)t;
    char defines[256], options[320];
    pv_kernel_params_defines(&p, defines, sizeof defines);
    snprintf(options, sizeof options, "-cl-std=CL1.2 %s", defines);
    const char *sources[2] = {pv_kernel_source_dialect, pv_kernel_source_qmatmul};
    cl_int err;
    cl_program program = clCreateProgramWithSource(c->context, 2, sources, NULL, &err);
    if (err != CL_SUCCESS)
        return NULL;
    if (clBuildProgram(program, 1, &c->device, options, NULL, NULL) != CL_SUCCESS) {
        char log[2048] = "";
        clGetProgramBuildInfo(program, c->device, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        tap_diag("%s: %.1500s", options, log);
        clReleaseProgram(program);
        return NULL;
    }
    return program;
}

/* Releases what a check created (NULL: not created). */
static void release(cl_program program, cl_kernel k, cl_mem in, cl_mem out)
{
    if (out)
        clReleaseMemObject(out);
    if (in)
        clReleaseMemObject(in);
    if (k)
        clReleaseKernel(k);
    if (program)
        clReleaseProgram(program);
}

/* Runs k, its arguments set, over groups {g0, g1}; reads n 16-bit outputs
 * from out into got. */
static int run(cl *c, cl_kernel k, size_t g0, size_t g1, cl_mem out, size_t n, uint16_t *got)
{
    const size_t global[2] = {g0 * WG, g1}, local[2] = {WG, 1};
    return clEnqueueNDRangeKernel(c->queue, k, 2, NULL, global, local, 0, NULL, NULL) == CL_SUCCESS &&
           clEnqueueReadBuffer(c->queue, out, CL_TRUE, 0, n * sizeof *got, got, 0, NULL, NULL) == CL_SUCCESS;
}

/* pv_qmatmul_widen16 for rows ROW0.. of an N_OUT x N_IN matrix of type t,
 * to f16 and to bf16, against the host's rounding of the dequantised rows. */
static void check_widen16(cl *c, pv_wtype t)
{
    uint32_t block = 1, block_bytes = 4;
    pv_wtype_block(t, &block, &block_bytes);
    const size_t n = (size_t)N_OUT * N_IN, bytes = n / block * block_bytes;
    float *src = malloc(n * sizeof *src), *deq = malloc(n * sizeof *deq);
    unsigned char *img = malloc(bytes);
    uint16_t got[N_ROWS * N_IN];
    for (size_t i = 0; i < n; i++)
        src[i] = uniform(-3.0f, 2.0f);
    int good = src && deq && img && pv_ggml_quantize((uint32_t)t, src, n, img, bytes) == PV_OK &&
               pv_ggml_dequantize_f32((uint32_t)t, img, bytes, deq, n) == PV_OK;
    cl_program program = good ? build(c, t) : NULL;
    cl_int err = CL_SUCCESS;
    cl_kernel k = program ? clCreateKernel(program, "pv_qmatmul_widen16", &err) : NULL;
    cl_mem w = k ? clCreateBuffer(c->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, img, &err) : NULL;
    cl_mem out = w ? clCreateBuffer(c->context, CL_MEM_WRITE_ONLY, sizeof got, NULL, &err) : NULL;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int same = 0, first_bad = -1;
        if (out) {
            cl_long w_off = 0, row0 = ROW0;
            cl_int n_in = N_IN, as_bf16 = bf16;
            memset(got, 0, sizeof got);
            int ran = clSetKernelArg(k, 0, sizeof w, &w) == CL_SUCCESS &&
                      clSetKernelArg(k, 1, sizeof w_off, &w_off) == CL_SUCCESS &&
                      clSetKernelArg(k, 2, sizeof n_in, &n_in) == CL_SUCCESS &&
                      clSetKernelArg(k, 3, sizeof row0, &row0) == CL_SUCCESS &&
                      clSetKernelArg(k, 4, sizeof as_bf16, &as_bf16) == CL_SUCCESS &&
                      clSetKernelArg(k, 5, sizeof out, &out) == CL_SUCCESS &&
                      run(c, k, (N_IN + WG - 1) / WG, N_ROWS, out, N_ROWS * N_IN, got);
            for (int i = 0; ran && i < N_ROWS * N_IN; i++) {
                if (got[i] == host_round16(deq[ROW0 * N_IN + i], bf16))
                    same++;
                else if (first_bad < 0)
                    first_bad = i;
            }
        }
        ok(same == N_ROWS * N_IN, "%s rows %d..%d widened to %s: %d of %d values are the host's rounding%s",
           pv_wtype_name(t), ROW0, ROW0 + N_ROWS - 1, bf16 ? "bf16" : "f16", same, N_ROWS * N_IN,
           out ? "" : " (no program or buffers)");
        if (first_bad >= 0)
            tap_diag("first different: element %d: %.9g -> 0x%04x, host 0x%04x", first_bad,
                     (double)deq[ROW0 * N_IN + first_bad], got[first_bad],
                     host_round16(deq[ROW0 * N_IN + first_bad], bf16));
    }
    release(program, k, w, out);
    free(src);
    free(deq);
    free(img);
}

/* pv_qmatmul_narrow16 over activations from an offset, with the hard cases
 * of both roundings among random values. */
static void check_narrow16(cl *c)
{
    static const uint32_t hard[] = {
        0x00000000u, 0x80000000u,              /* signed zeros */
        0x3f808000u, 0x3f818000u, 0x3f808001u, /* bf16: a tie to even down, a tie up, just past a tie */
        0x3f801000u, 0x3f803000u,              /* f16: ties to even, down and up */
        0x477fe000u, 0x477ff000u, 0x47800000u, /* f16: 65504, the first value that rounds to inf, 65536 */
        0x33000000u, 0x33000001u, 0x387fc000u, /* f16: half the smallest subnormal, past it, a subnormal */
        0x7f800000u, 0xff800000u,              /* infinities */
        0x7f7fffffu,                           /* f32's largest: inf in both */
        0x7fc00000u, 0x7f800001u,              /* NaNs: quiet, and one whose payload is all below bf16's bits */
    };
    enum { N_HARD = sizeof hard / sizeof hard[0], N = 300, OFF = 5 };
    float x[OFF + N];
    for (int i = 0; i < OFF + N; i++)
        x[i] = i >= OFF && i - OFF < N_HARD ? from_bits(hard[i - OFF]) : uniform(-40.0f, 40.0f);
    cl_program program = build(c, PV_W_F16);
    cl_int err = CL_SUCCESS;
    cl_kernel k = program ? clCreateKernel(program, "pv_qmatmul_narrow16", &err) : NULL;
    cl_mem in = k ? clCreateBuffer(c->context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof x, x, &err) : NULL;
    uint16_t got[N];
    cl_mem out = in ? clCreateBuffer(c->context, CL_MEM_WRITE_ONLY, sizeof got, NULL, &err) : NULL;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        int same = 0, first_bad = -1;
        if (out) {
            cl_long x_off = OFF, n = N;
            cl_int as_bf16 = bf16;
            memset(got, 0, sizeof got);
            int ran = clSetKernelArg(k, 0, sizeof in, &in) == CL_SUCCESS &&
                      clSetKernelArg(k, 1, sizeof x_off, &x_off) == CL_SUCCESS &&
                      clSetKernelArg(k, 2, sizeof n, &n) == CL_SUCCESS &&
                      clSetKernelArg(k, 3, sizeof as_bf16, &as_bf16) == CL_SUCCESS &&
                      clSetKernelArg(k, 4, sizeof out, &out) == CL_SUCCESS &&
                      run(c, k, (N + WG - 1) / WG, 1, out, N, got);
            for (int i = 0; ran && i < N; i++) {
                const float v = x[OFF + i];
                if (isnan(v) ? is_nan16(got[i], bf16) : got[i] == host_round16(v, bf16))
                    same++;
                else if (first_bad < 0)
                    first_bad = i;
            }
        }
        ok(same == N, "activations narrowed to %s: %d of %d are the host's rounding (ties, overflow, subnormals, "
                      "infinities, NaN)%s",
           bf16 ? "bf16" : "f16", same, N, out ? "" : " (no program or buffers)");
        if (first_bad >= 0) {
            uint32_t bits;
            memcpy(&bits, &x[OFF + first_bad], sizeof bits);
            tap_diag("first different: element %d: 0x%08x -> 0x%04x", first_bad, bits, got[first_bad]);
        }
    }
    release(program, k, in, out);
}
#endif

int main(void)
{
#ifndef PV_HAVE_OPENCL
    return tap_skip_all("the OpenCL backend is not built");
#else
    cl c;
    if (!cl_open(&c))
        return tap_skip_all("no OpenCL device");
    static const pv_wtype types[] = {PV_W_F32, PV_W_F16, PV_W_BF16, PV_W_Q8_0, PV_W_Q4_0, PV_W_Q4_1};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        check_widen16(&c, types[i]);
    check_narrow16(&c);
    clReleaseCommandQueue(c.queue);
    clReleaseContext(c.context);
    return tap_done();
#endif
}
