/* The 16-bit activation rounding of the CPU backend's integer kernels: the
 * AVX2 quantizer must give the portable one's bits exactly (a token's
 * outputs must not depend on which ran), and the portable one must match
 * its definition: d = max |x| / 32767 per block of 32, q = round-to-even(x / d),
 * s = d * sum q; a block whose d would be below FLT_MIN (1 / d overflows)
 * and the blocks past n_in are zero. */
#include "config.h"

#include "backends/cpu/cpu-qmatmul.h"
#include "tap.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 88172645463325252ull;

static uint32_t next_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* Blocks of several kinds: plain random, all zero, one huge value among
 * small ones, values that land exactly half-way between two codes (ties
 * round to even), negative maxima, tiny and subnormal values. */
static void fill(float *x, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++) {
        float *xb = x + b * 32;
        const int kind = (int)(b % 7);
        for (int j = 0; j < 32; j++) {
            const float u = (float)(next_u32() >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
            switch (kind) {
            case 0: xb[j] = u * 3.0f; break;
            case 1: xb[j] = 0.0f; break;
            case 2: xb[j] = j == 5 ? 1e6f : u * 1e-3f; break;
            case 3: xb[j] = j == 0 ? -32767.0f : (float)(int)(u * 1000.0f) + 0.5f; break;
            case 4: xb[j] = -fabsf(u) * 7.0f; break;
            case 5: xb[j] = u * 1e-30f; break;
            default: xb[j] = u * 1e-39f; break; /* d would be subnormal: 1 / d overflows */
            }
        }
    }
}

static int same_bits(const pv_cpu_xq16 *a, const pv_cpu_xq16 *b, int64_t T)
{
    const uint64_t blocks = (uint64_t)T * (uint64_t)a->stride;
    return a->stride == b->stride && memcmp(a->q, b->q, blocks * 32 * sizeof(int16_t)) == 0 &&
           memcmp(a->d, b->d, blocks * sizeof(float)) == 0 && memcmp(a->s, b->s, blocks * sizeof(float)) == 0;
}

/* The portable quantizer against the definition, element by element. */
static int matches_definition(const float *x, int64_t T, int64_t n_in, const pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < xq->stride; b++) {
            const int64_t i = t * xq->stride + b;
            if (b >= n_blocks) {
                for (int j = 0; j < 32; j++)
                    if (xq->q[i * 32 + j] != 0)
                        return 0;
                if (xq->d[i] != 0.0f || xq->s[i] != 0.0f)
                    return 0;
                continue;
            }
            const float *xb = x + t * n_in + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            const float d = amax / 32767.0f >= FLT_MIN ? amax / 32767.0f : 0.0f;
            if (xq->d[i] != d)
                return 0;
            long sum = 0;
            for (int j = 0; j < 32; j++) {
                const float want = d > 0.0f ? nearbyintf(xb[j] * (1.0f / d)) : 0.0f;
                if ((float)xq->q[i * 32 + j] != want)
                    return 0;
                sum += xq->q[i * 32 + j];
            }
            if (xq->s[i] != d * (float)sum)
                return 0;
        }
    return 1;
}

int main(void)
{
    static const int64_t shapes[][2] = {{1, 32}, {1, 576}, {3, 1536}, {7, 64}, {16, 288}, {2, 8192}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n_shapes; s++) {
        const int64_t T = shapes[s][0], n_in = shapes[s][1];
        float *x = malloc((size_t)(T * n_in) * sizeof *x);
        const uint64_t bytes = pv_cpu_xq16_bytes(T, n_in);
        void *m1 = malloc(bytes), *m2 = malloc(bytes);
        if (!ok(x && m1 && m2, "buffers for %lld x %lld", (long long)T, (long long)n_in)) {
            free(x);
            free(m1);
            free(m2);
            continue;
        }
        fill(x, T * n_in);
        memset(m1, 0x5a, bytes); /* padding must be written, not left */
        memset(m2, 0xa5, bytes);
        pv_cpu_xq16 portable, avx2;
        pv_cpu_xq16_view(&portable, m1, T, n_in);
        pv_cpu_xq16_view(&avx2, m2, T, n_in);
        pv_cpu_quantize_x(x, T, n_in, &portable);
        pv_cpu_quantize_x_avx2(x, T, n_in, &avx2);
        ok(matches_definition(x, T, n_in, &portable), "portable quantizer follows the definition, %lld x %lld",
           (long long)T, (long long)n_in);
        ok(same_bits(&portable, &avx2, T), "AVX2 quantizer gives the portable bits, %lld x %lld", (long long)T,
           (long long)n_in);
        free(x);
        free(m1);
        free(m2);
    }
    return tap_done();
}
