/* The kernel dialect. Every kernel in kernels/<family>.cl is written once
 * against these macros and builds two ways:
 *   - OpenCL C: the OpenCL backend compiles, at run time, this header's text
 *     followed by a family's text (both embedded in the library; the
 *     family's #include of this header is blanked when embedding);
 *   - CUDA C: the CUDA backend hands the same two texts to NVRTC at run
 *     time (backends/cuda/cuda_nvrtc.c), one program per family and
 *     define set. NVRTC has no system or toolkit headers to include, so
 *     this part uses none.
 *
 * Launch geometry, the same in both dialects: a kernel runs as a grid of
 * work-groups (CUDA blocks) of exactly PV_WG work-items (threads) along
 * dimension 0; the grid has up to two dimensions of groups. OpenCL: global
 * size = {groups0 * PV_WG, groups1}, local size = {PV_WG, 1}. CUDA:
 * gridDim = {groups0, groups1}, blockDim = PV_WG. Each kernel's comment
 * gives its groups.
 *
 * Defines (tunable or per variant, listed with their candidate values in
 * backends/kernel-params.h; -D on the build options of both backends):
 *   PV_WG            work-group size, a power of two (default 64)
 *   PV_ITEM_ELEMS    elements per work-item in copy and element-wise kernels
 *                    (default 8)
 *   PV_MAX_HEAD_DIM  largest head_dim the attention kernel serves (256)
 *   PV_STORE_F16     0: the storage dtype (KV pool, staging) is f32;
 *                    1: it is f16. Kernels that depend on it carry the
 *                    suffix _f32 / _f16 (PV_STORE_NAME). This part of the
 *                    header is re-read on every include, so a family could
 *                    be included once per value.
 *
 * Loops with a constant trip count carry #pragma unroll (clang's OpenCL C
 * and NVRTC both honour it): unrolled, they leave the work-item loop that
 * CPU implementations (PoCL) vectorise innermost, which made the slot
 * gather 2.4x and f16 decode attention 1.9x faster there.
 *
 * PV_RESTRICT marks a pointer whose memory no other argument reaches.
 *
 * Offsets and element counts are 64-bit (pv_long); index arrays are int.
 * pv_precise is double where the device has it (float otherwise); the plain
 * names cos, sin and pow serve it in both dialects. */
#ifndef PV_KERNELS_DIALECT_H
#define PV_KERNELS_DIALECT_H

#ifndef PV_WG
#define PV_WG 64
#endif
#ifndef PV_ITEM_ELEMS
#define PV_ITEM_ELEMS 8
#endif
#ifndef PV_MAX_HEAD_DIM
#define PV_MAX_HEAD_DIM 256
#endif

#define PV_CAT_(a, b) a##b
#define PV_CAT(a, b) PV_CAT_(a, b)

#if defined(__OPENCL_VERSION__)

typedef long pv_long;
typedef uint pv_u32;
typedef ushort pv_u16;
typedef half pv_half; /* storage only: loads and stores go through vload_half/vstore_half */

#define PV_KERNEL kernel void
#define PV_FUNC static inline
#define PV_GLOBAL global
#define PV_RESTRICT restrict
#define PV_LOCAL local
#define PV_LOCAL_ARRAY(type, name, n) local type name[n]
#define PV_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
/* Also orders the group's global memory: what one work-item wrote there
 * the others read after it. */
#define PV_BARRIER_GLOBAL() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
#define PV_LOCAL_ID() ((int)get_local_id(0))
#define PV_GROUP_ID(d) ((pv_long)get_group_id(d))

#define PV_LOAD_HALF(p, i) vload_half((size_t)(i), (p))
/* The IEEE half in the low 16 bits of u (loaded earlier), as a float. */
PV_FUNC float pv_half_bits(pv_u32 u)
{
    const pv_u16 h = (pv_u16)u;
    return vload_half(0, (const private half *)&h);
}
#define PV_STORE_HALF(x, p, i) vstore_half((x), (size_t)(i), (p))
#define PV_AS_FLOAT(u) as_float(u)
#define PV_AS_U32(f) as_uint(f)

#define PV_EXP(x) exp(x)
#define PV_SQRT(x) sqrt(x)
#define PV_POW(x, y) pow((x), (y))
#define PV_COS(x) cos(x)
#define PV_SIN(x) sin(x)
#define PV_FMAX(x, y) fmax((x), (y))
#define PV_FMIN(x, y) fmin((x), (y))
#define PV_FABS(x) fabs(x)
#define PV_FMA(a, b, c) fma((a), (b), (c))
#define PV_RINT(x) rint(x) /* to nearest, ties to even */
#define PV_INF INFINITY

/* c + the dot product of a's four signed bytes with b's (CUDA's dp4a). */
PV_FUNC int pv_dp4a(pv_u32 a, pv_u32 b, int c)
{
    const int4 p = convert_int4(as_char4(a)) * convert_int4(as_char4(b));
    return c + (p.x + p.y) + (p.z + p.w);
}
#define PV_DP4A(a, b, c) pv_dp4a((a), (b), (c))

/* Precise enough for RoPE angles at positions in the thousands: double
 * where the device has it. */
#if defined(cl_khr_fp64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
typedef double pv_precise;
#else
typedef float pv_precise;
#endif

#elif defined(__CUDACC__)

typedef long long pv_long;
typedef unsigned int pv_u32;
typedef unsigned short pv_u16;
/* Storage only, as in OpenCL: the bits of an IEEE half, converted by the
 * two PTX instructions cuda_fp16.h would use (NVRTC does not ship that
 * header). */
typedef unsigned short pv_half;

/* extern "C": the backend looks kernels up by their plain names. */
#define PV_KERNEL extern "C" __global__ void
/* Not static: C++ warns about unused static functions, and most programs
 * leave some of these helpers unused. */
#define PV_FUNC __device__ __forceinline__
#define PV_GLOBAL
#define PV_RESTRICT __restrict__
#define PV_LOCAL
#define PV_LOCAL_ARRAY(type, name, n) __shared__ type name[n]
#define PV_BARRIER() __syncthreads()
#define PV_BARRIER_GLOBAL() __syncthreads() /* orders global memory too */
#define PV_LOCAL_ID() ((int)threadIdx.x)
#define PV_GROUP_ID(d) ((pv_long)((d) == 0 ? blockIdx.x : (d) == 1 ? blockIdx.y : blockIdx.z))

PV_FUNC float pv_half_to_float(pv_half h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

PV_FUNC pv_half pv_float_to_half(float f) /* round to nearest even */
{
    pv_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

#define PV_LOAD_HALF(p, i) pv_half_to_float((p)[i])
PV_FUNC float pv_half_bits(pv_u32 u)
{
    return pv_half_to_float((pv_half)u);
}
#define PV_STORE_HALF(x, p, i) ((p)[i] = pv_float_to_half(x))
#define PV_AS_FLOAT(u) __uint_as_float(u)
#define PV_AS_U32(f) __float_as_uint(f)

#define PV_EXP(x) expf(x)
#define PV_SQRT(x) sqrtf(x)
#define PV_POW(x, y) powf((x), (y))
#define PV_COS(x) cosf(x)
#define PV_SIN(x) sinf(x)
#define PV_FMAX(x, y) fmaxf((x), (y))
#define PV_FMIN(x, y) fminf((x), (y))
#define PV_FABS(x) fabsf(x)
#define PV_FMA(a, b, c) fmaf((a), (b), (c))
#define PV_RINT(x) rintf(x) /* to nearest, ties to even */
#define PV_INF __uint_as_float(0x7f800000u)
/* One instruction from compute capability 6.1. */
#define PV_DP4A(a, b, c) __dp4a((int)(a), (int)(b), (c))

typedef double pv_precise;

#else
#error "kernels/dialect.h: compile as OpenCL C or CUDA C"
#endif

/* Work-group reductions over PV_WG values; every work-item of the group must
 * call them (they contain barriers) and gets the result. scratch holds PV_WG
 * entries and is free again on return. The tree order is fixed, so results
 * are deterministic. */
PV_FUNC float pv_group_sum(PV_LOCAL float *scratch, float v)
{
    const int lid = PV_LOCAL_ID();
    scratch[lid] = v;
    PV_BARRIER();
    for (int stride = PV_WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            scratch[lid] += scratch[lid + stride];
        PV_BARRIER();
    }
    const float total = scratch[0];
    PV_BARRIER();
    return total;
}

PV_FUNC float pv_group_max(PV_LOCAL float *scratch, float v)
{
    const int lid = PV_LOCAL_ID();
    scratch[lid] = v;
    PV_BARRIER();
    for (int stride = PV_WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride)
            scratch[lid] = PV_FMAX(scratch[lid], scratch[lid + stride]);
        PV_BARRIER();
    }
    const float best = scratch[0];
    PV_BARRIER();
    return best;
}

/* Smallest (take_max = 0) or largest (take_max = 1) int over the group. */
PV_FUNC int pv_group_min_max_int(PV_LOCAL int *scratch, int v, int take_max)
{
    const int lid = PV_LOCAL_ID();
    scratch[lid] = v;
    PV_BARRIER();
    for (int stride = PV_WG / 2; stride > 0; stride >>= 1) {
        if (lid < stride) {
            const int other = scratch[lid + stride];
            if (take_max ? other > scratch[lid] : other < scratch[lid])
                scratch[lid] = other;
        }
        PV_BARRIER();
    }
    const int result = scratch[0];
    PV_BARRIER();
    return result;
}

/* 16-byte loads of 8 values at p (aligned to its load's size) in two
 * steps, so that a kernel can issue the loads of several rows before it
 * waits for any: pv_fetch8_* loads the raw words (the 8 halves in 4, one
 * 16-byte load; 8 floats in two), pv_widen8_* makes floats of them. OpenCL:
 * vload forms, which GPUs issue as vector loads; CUDA: uint4 / float4
 * through a cast. */
PV_FUNC void pv_fetch8_half(const PV_GLOBAL pv_half *p, pv_u32 *w)
{
#if defined(__OPENCL_VERSION__)
    const uint4 raw = vload4(0, (const PV_GLOBAL pv_u32 *)p);
#else
    const uint4 raw = *(const uint4 *)p;
#endif
    w[0] = raw.x; w[1] = raw.y; w[2] = raw.z; w[3] = raw.w;
}
PV_FUNC void pv_widen8_half(const pv_u32 *w, float *v)
{
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = pv_half_bits(w[k] & 0xffffu);
        v[2 * k + 1] = pv_half_bits(w[k] >> 16);
    }
}
PV_FUNC void pv_fetch8_float(const PV_GLOBAL float *p, pv_u32 *w)
{
#if defined(__OPENCL_VERSION__)
    const uint8 raw = vload8(0, (const PV_GLOBAL pv_u32 *)p);
    w[0] = raw.s0; w[1] = raw.s1; w[2] = raw.s2; w[3] = raw.s3;
    w[4] = raw.s4; w[5] = raw.s5; w[6] = raw.s6; w[7] = raw.s7;
#else
    const uint4 a = ((const uint4 *)p)[0], b = ((const uint4 *)p)[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
#endif
}
PV_FUNC void pv_widen8_float(const pv_u32 *w, float *v)
{
    #pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = PV_AS_FLOAT(w[k]);
}

/* Sums across teams: the group's work-items form teams of `team` adjacent
 * ones (a power of two, at most 32 and PV_WG), and v[j] (j < n) becomes
 * the sum of v[j] over the caller's team, the same bits in every member.
 * Every work-item of the group must call it with the same n and team.
 * CUDA: warp shuffles (a team lies within a warp), scratch unused; OpenCL
 * 1.2: through scratch, PV_WG * n floats, free again on return (barriers).
 * Call with constant n and team so the loops unroll and v stays in
 * registers. */
PV_FUNC void pv_team_sums(PV_LOCAL float *scratch, float *v, int n, int team)
{
#if defined(__OPENCL_VERSION__)
    const int lid = PV_LOCAL_ID(), first = lid & ~(team - 1);
    #pragma unroll
    for (int j = 0; j < n; j++)
        scratch[lid * n + j] = v[j];
    PV_BARRIER();
    #pragma unroll
    for (int j = 0; j < n; j++) {
        float s = 0.0f;
        for (int k = 0; k < team; k++)
            s += scratch[(first + k) * n + j];
        v[j] = s;
    }
    PV_BARRIER();
#else
    (void)scratch;
    const unsigned int lanes = PV_WG < 32 ? (1u << PV_WG) - 1u : 0xffffffffu;
    #pragma unroll
    for (int j = 0; j < n; j++) {
        #pragma unroll
        for (int step = team / 2; step > 0; step >>= 1)
            v[j] += __shfl_xor_sync(lanes, v[j], step);
    }
#endif
}

/* RoPE, shared by recompute's pv_rope and gather's pv_rope_kv_write so
 * both turn a pair the same way: pair i (< head_dim / 2) of a head at
 * position pos turns by pos * base^(-2i/head_dim), in pv_precise; the pair
 * is (2i, 2i+1), or (i, i + head_dim/2) with neox. *first and *second get
 * its elements' indices, *c and *s the angle's cosine and sine. */
PV_FUNC void pv_rope_pair(int pos, int i, int head_dim, float base, int neox, int *first, int *second,
                          pv_precise *c, pv_precise *s)
{
    const pv_precise angle = (pv_precise)pos * pow((pv_precise)base, (pv_precise)(-2 * i) / (pv_precise)head_dim);
    *c = cos(angle);
    *s = sin(angle);
    *first = neox ? i : 2 * i;
    *second = neox ? i + head_dim / 2 : 2 * i + 1;
}

/* One block of 32 activations rounded to 16 bits (qmatmul's PV_ACT16, the
 * format kernels/qmatmul.cl describes): q gets its 8 pairs of words (hi
 * bytes, then lo bytes, of 4 elements each), s its (d, S) pair. Shared by
 * qmatmul's pv_qmatmul_round16 and recompute's pv_add_rmsnorm16 so that
 * both round a block to the same bits. */
PV_FUNC void pv_round16_block(const PV_GLOBAL float *xb, PV_GLOBAL pv_u32 *q, PV_GLOBAL float *s)
{
    float amax = 0.0f;
    int nan = 0;
    for (int j = 0; j < 32; j++) {
        amax = PV_FABS(xb[j]) > amax ? PV_FABS(xb[j]) : amax;
        nan |= !(xb[j] == xb[j]);
    }
    /* below 256 FLT_MIN, 256 / d1 would overflow: such a block counts as zero */
    const float d1 = amax / 127.0f >= 256.0f * 1.17549435e-38f ? amax / 127.0f : 0.0f;
    const float inv = d1 > 0.0f ? 1.0f / d1 : 0.0f;
    int sum = 0;
    for (int w = 0; w < 8; w++) {
        pv_u32 hi_word = 0, lo_word = 0;
        #pragma unroll
        for (int k = 0; k < 4; k++) {
            const float v = xb[4 * w + k];
            /* |v| inv rounds to at most 127 and the remainder to at most 128
             * steps of d1 / 256; the clamps define a non-finite v's bytes */
            const float hf = PV_FMIN(PV_FMAX(PV_RINT(v * inv), -127.0f), 127.0f);
            const float lf = PV_FMIN(PV_FMAX(PV_RINT(PV_FMA(-d1, hf, v) * (inv * 256.0f)), -127.0f), 127.0f);
            const int h = (int)hf, l = (int)lf;
            hi_word |= ((pv_u32)h & 0xffu) << (8 * k);
            lo_word |= ((pv_u32)l & 0xffu) << (8 * k);
            sum += 256 * h + l;
        }
        q[2 * w] = hi_word;
        q[2 * w + 1] = lo_word;
    }
    s[0] = nan ? PV_AS_FLOAT(0x7fc00000u) : d1 / 256.0f;
    s[1] = (float)sum;
}

#endif /* PV_KERNELS_DIALECT_H */

/* Storage dtype of the current variant: re-read on every include. */
#undef PV_STORE_T
#undef PV_STORE_WORD
#undef PV_STORE_LOAD
#undef PV_STORE_WORDS8
#undef PV_STORE_FETCH8
#undef PV_STORE_WIDEN8
#undef PV_STORE_SAVE
#undef PV_STORE_NAME
#if defined(PV_STORE_F16) && PV_STORE_F16
#define PV_STORE_T pv_half
#define PV_STORE_WORD pv_u16 /* bit-exact copies */
#define PV_STORE_LOAD(p, i) PV_LOAD_HALF(p, i)
#define PV_STORE_WORDS8 4
#define PV_STORE_FETCH8(p, w) pv_fetch8_half(p, w)
#define PV_STORE_WIDEN8(w, v) pv_widen8_half(w, v)
#define PV_STORE_SAVE(x, p, i) PV_STORE_HALF(x, p, i)
#define PV_STORE_NAME(base) PV_CAT(base, _f16)
#else
#define PV_STORE_T float
#define PV_STORE_WORD pv_u32
#define PV_STORE_LOAD(p, i) ((p)[i])
#define PV_STORE_WORDS8 8
#define PV_STORE_FETCH8(p, w) pv_fetch8_float(p, w)
#define PV_STORE_WIDEN8(w, v) pv_widen8_float(w, v)
#define PV_STORE_SAVE(x, p, i) ((p)[i] = (x))
#define PV_STORE_NAME(base) PV_CAT(base, _f32)
#endif
