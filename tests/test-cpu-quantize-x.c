/* The 16-bit activation rounding of the CPU backend's integer kernels: the
 * AVX2 quantizer must give the portable one's bits exactly (a token's
 * outputs must not depend on which ran), and the portable one must match
 * its definition (cpu-qmatmul.h): per block of 32, d1 = max |x| / 127,
 * hi = round-to-even(x / d1), lo = round-to-even(fma(-d1, hi, x) * 256 / d1)
 * within [-127, 127], q16 = 256 hi + lo, d = d1 / 256, s = d * sum q16; a block whose
 * d1 would be below 256 FLT_MIN (256 / d1 overflows) is zero. The rounded
 * value d (256 hi + lo) must also be within d / 2 of x (d at half-way ties
 * of lo's clamp): the two bytes hold 16 bits, not 8. */
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
            case 3: xb[j] = j == 0 ? -127.0f : (float)(int)(u * 100.0f) + 0.5f; break;
            case 4: xb[j] = -fabsf(u) * 7.0f; break;
            case 5: xb[j] = u * 1e-30f; break;
            default: xb[j] = u * 1e-39f; break; /* d would be subnormal: 1 / d overflows */
            }
        }
    }
}

static int same_bits(const pv_cpu_xq16 *a, const pv_cpu_xq16 *b, int64_t T)
{
    const uint64_t blocks = (uint64_t)T * (uint64_t)a->n_blocks;
    return a->n_blocks == b->n_blocks && memcmp(a->q, b->q, blocks * 64) == 0 &&
           memcmp(a->q16, b->q16, blocks * 32 * sizeof(int16_t)) == 0 &&
           memcmp(a->d, b->d, blocks * sizeof(float)) == 0 && memcmp(a->s, b->s, blocks * sizeof(float)) == 0;
}

/* The portable quantizer against the definition, element by element. */
static int matches_definition(const float *x, int64_t T, int64_t n_in, const pv_cpu_xq16 *xq)
{
    const int64_t n_blocks = n_in / 32;
    if (xq->n_blocks != n_blocks)
        return 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t b = 0; b < n_blocks; b++) {
            const int64_t i = t * n_blocks + b;
            const float *xb = x + t * n_in + b * 32;
            const int8_t *hi = xq->q + i * 64, *lo = hi + 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            const float d1 = amax / 127.0f >= 256.0f * FLT_MIN ? amax / 127.0f : 0.0f;
            if (xq->d[i] != d1 / 256.0f)
                return 0;
            long sum = 0;
            for (int j = 0; j < 32; j++) {
                const float want_hi = d1 > 0.0f ? nearbyintf(xb[j] * (1.0f / d1)) : 0.0f;
                const float rest = fmaf(-d1, want_hi, xb[j]);
                const float want_lo =
                    d1 > 0.0f ? fminf(fmaxf(nearbyintf(rest * (256.0f / d1)), -127.0f), 127.0f) : 0.0f;
                if ((float)hi[j] != want_hi || (float)lo[j] != want_lo || xq->q16[i * 32 + j] != 256 * hi[j] + lo[j])
                    return 0;
                const double value = (double)xq->d[i] * (256.0 * hi[j] + lo[j]);
                if (d1 > 0.0f && fabs(value - xb[j]) > (double)xq->d[i] * 1.0001)
                    return 0;
                sum += 256 * hi[j] + lo[j];
            }
            if (xq->s[i] != xq->d[i] * (float)sum)
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
        memset(m1, 0x5a, bytes); /* every byte must be written, none left */
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
