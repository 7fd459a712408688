/* ggml tensor types: block sizes, dequantisation to f32/f16, and the
 * quantisers the synthetic-model writer needs. Block layouts follow the
 * public GGUF/ggml format description:
 *   Q8_0: f16 d | i8 q[32]          x = d * q
 *   Q4_0: f16 d | u8 qs[16]         x[j] = d * ((qs[j] & 15) - 8),
 *                                   x[j + 16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1: f16 d | f16 m | u8 qs[16] x[j] = d * (qs[j] & 15) + m,
 *                                   x[j + 16] = d * (qs[j] >> 4) + m
 *   BF16: the top 16 bits of an f32. */
#include <pensieve/gguf.h>

#include <math.h>
#include <string.h>

#define QK 32 /* elements per block of the 32-wide types */

typedef struct type_info {
    uint32_t id;
    const char *name;
    uint32_t block_elems;
    uint32_t block_bytes;
} type_info;

/* Every type id a GGUF file may carry, so any file can be bound-checked even
 * where its tensors cannot be decoded. */
static const type_info type_table[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
};

static const type_info *find_type(uint32_t type)
{
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (type_table[i].id == type)
            return &type_table[i];
    return NULL;
}

const char *pv_ggml_type_name(uint32_t type)
{
    const type_info *info = find_type(type);
    return info ? info->name : "unknown";
}

pv_status pv_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
    const type_info *info = find_type(type);
    /* Set on failure too (to 0): the compiler then sees them set on every
     * path its callers take. */
    if (block_elems)
        *block_elems = info ? info->block_elems : 0;
    if (block_bytes)
        *block_bytes = info ? info->block_bytes : 0;
    if (!info)
        return pv_error(PV_ERR_UNSUPPORTED, "ggml type %u is not a known tensor type", type);
    return PV_OK;
}

int pv_ggml_type_dequantizable(uint32_t type)
{
    switch (type) {
    case PV_GGML_F32:
    case PV_GGML_F16:
    case PV_GGML_BF16:
    case PV_GGML_Q8_0:
    case PV_GGML_Q4_0:
    case PV_GGML_Q4_1:
        return 1;
    default:
        return 0;
    }
}

pv_status pv_ggml_row_bytes(uint32_t type, uint64_t n, uint64_t *bytes)
{
    uint32_t be, bb;
    pv_status st = pv_ggml_type_block(type, &be, &bb);
    if (st != PV_OK)
        return st;
    if (n % be != 0)
        return pv_error(PV_ERR_INVALID_ARG,
                        "%llu elements of %s: not a multiple of its block size %u",
                        (unsigned long long)n, pv_ggml_type_name(type), be);
    *bytes = n / be * bb;
    return PV_OK;
}

static float read_f16(const uint8_t *p)
{
    return pv_half_to_float((pv_half)(p[0] | (p[1] << 8)));
}

static void write_f16(uint8_t *p, float f)
{
    pv_half h = pv_float_to_half(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static float bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) /* nan: keep it a quiet nan */
        return (uint16_t)((bits >> 16) | 0x40u);
    /* round to nearest even on the dropped 16 bits */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* Checks shared by the decoders: n is whole blocks and src holds them. */
static pv_status check_span(uint32_t type, uint64_t src_bytes, uint64_t n)
{
    if (!pv_ggml_type_dequantizable(type))
        return pv_error(PV_ERR_UNSUPPORTED, "cannot dequantise tensor type %s (%u)",
                        pv_ggml_type_name(type), type);
    uint64_t need;
    pv_status st = pv_ggml_row_bytes(type, n, &need);
    if (st != PV_OK)
        return st;
    if (need > src_bytes)
        return pv_error(PV_ERR_INVALID_ARG,
                        "%llu %s elements need %llu source bytes, only %llu given",
                        (unsigned long long)n, pv_ggml_type_name(type),
                        (unsigned long long)need, (unsigned long long)src_bytes);
    return PV_OK;
}

/* Decode one block of a 32-wide type into out[32]. */
static void dequantize_block(uint32_t type, const uint8_t *b, float *out)
{
    switch (type) {
    case PV_GGML_Q8_0: {
        float d = read_f16(b);
        const int8_t *q = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++)
            out[j] = d * (float)q[j];
        break;
    }
    case PV_GGML_Q4_0: {
        float d = read_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            out[j] = d * (float)((qs[j] & 0x0f) - 8);
            out[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
        }
        break;
    }
    case PV_GGML_Q4_1: {
        float d = read_f16(b);
        float m = read_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < QK / 2; j++) {
            out[j] = d * (float)(qs[j] & 0x0f) + m;
            out[j + QK / 2] = d * (float)(qs[j] >> 4) + m;
        }
        break;
    }
    default:
        break;
    }
}

pv_status pv_ggml_dequantize_f32(uint32_t type, const void *src, uint64_t src_bytes,
                                 float *dst, uint64_t n)
{
    if (!src || !dst)
        return pv_error(PV_ERR_INVALID_ARG, "dequantise: NULL %s", src ? "dst" : "src");
    pv_status st = check_span(type, src_bytes, n);
    if (st != PV_OK)
        return st;
    const uint8_t *s = src;
    switch (type) {
    case PV_GGML_F32:
        memcpy(dst, s, n * sizeof(float));
        break;
    case PV_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = read_f16(s + 2 * i);
        break;
    case PV_GGML_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = bf16_to_float((uint16_t)(s[2 * i] | (s[2 * i + 1] << 8)));
        break;
    default: {
        uint32_t bb;
        pv_ggml_type_block(type, NULL, &bb);
        for (uint64_t blk = 0; blk < n / QK; blk++)
            dequantize_block(type, s + blk * bb, dst + blk * QK);
        break;
    }
    }
    return PV_OK;
}

pv_status pv_ggml_dequantize_f16(uint32_t type, const void *src, uint64_t src_bytes,
                                 pv_half *dst, uint64_t n)
{
    if (!src || !dst)
        return pv_error(PV_ERR_INVALID_ARG, "dequantise: NULL %s", src ? "dst" : "src");
    pv_status st = check_span(type, src_bytes, n);
    if (st != PV_OK)
        return st;
    const uint8_t *s = src;
    if (type == PV_GGML_F16) {
        for (uint64_t i = 0; i < n; i++)
            dst[i] = (pv_half)(s[2 * i] | (s[2 * i + 1] << 8));
        return PV_OK;
    }
    /* Everything else goes through f32: element-wise for F32/BF16, one
     * block at a time for the quantised types. */
    if (type == PV_GGML_F32 || type == PV_GGML_BF16) {
        float f;
        for (uint64_t i = 0; i < n; i++) {
            if (type == PV_GGML_F32)
                memcpy(&f, s + 4 * i, sizeof f);
            else
                f = bf16_to_float((uint16_t)(s[2 * i] | (s[2 * i + 1] << 8)));
            dst[i] = pv_float_to_half(f);
        }
        return PV_OK;
    }
    uint32_t bb;
    pv_ggml_type_block(type, NULL, &bb);
    float tmp[QK];
    for (uint64_t blk = 0; blk < n / QK; blk++) {
        dequantize_block(type, s + blk * bb, tmp);
        for (int j = 0; j < QK; j++)
            dst[blk * QK + j] = pv_float_to_half(tmp[j]);
    }
    return PV_OK;
}

static uint8_t clamp_nibble(int q)
{
    return (uint8_t)(q < 0 ? 0 : q > 15 ? 15 : q);
}

static void quantize_block(uint32_t type, const float *x, uint8_t *b)
{
    switch (type) {
    case PV_GGML_Q8_0: {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        write_f16(b, d);
        for (int j = 0; j < QK; j++)
            b[2 + j] = (uint8_t)(int8_t)lroundf(x[j] * id);
        break;
    }
    case PV_GGML_Q4_0: {
        /* The value of largest magnitude maps to -8 so its sign is exact. */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        write_f16(b, d);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t lo = clamp_nibble((int)lroundf(x[j] * id) + 8);
            uint8_t hi = clamp_nibble((int)lroundf(x[j + QK / 2] * id) + 8);
            b[2 + j] = (uint8_t)(lo | (hi << 4));
        }
        break;
    }
    case PV_GGML_Q4_1: {
        float min = x[0], max = x[0];
        for (int j = 1; j < QK; j++) {
            min = fminf(min, x[j]);
            max = fmaxf(max, x[j]);
        }
        float d = (max - min) / 15.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        write_f16(b, d);
        write_f16(b + 2, min);
        for (int j = 0; j < QK / 2; j++) {
            uint8_t lo = clamp_nibble((int)lroundf((x[j] - min) * id));
            uint8_t hi = clamp_nibble((int)lroundf((x[j + QK / 2] - min) * id));
            b[4 + j] = (uint8_t)(lo | (hi << 4));
        }
        break;
    }
    default:
        break;
    }
}

pv_status pv_ggml_quantize(uint32_t type, const float *src, uint64_t n,
                           void *dst, uint64_t dst_bytes)
{
    if (!src || !dst)
        return pv_error(PV_ERR_INVALID_ARG, "quantise: NULL %s", src ? "dst" : "src");
    pv_status st = check_span(type, dst_bytes, n);
    if (st != PV_OK)
        return st;
    uint8_t *d = dst;
    switch (type) {
    case PV_GGML_F32:
        memcpy(d, src, n * sizeof(float));
        break;
    case PV_GGML_F16:
        for (uint64_t i = 0; i < n; i++)
            write_f16(d + 2 * i, src[i]);
        break;
    case PV_GGML_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = float_to_bf16(src[i]);
            d[2 * i] = (uint8_t)(h & 0xff);
            d[2 * i + 1] = (uint8_t)(h >> 8);
        }
        break;
    default: {
        uint32_t bb;
        pv_ggml_type_block(type, NULL, &bb);
        for (uint64_t blk = 0; blk < n / QK; blk++)
            quantize_block(type, src + blk * QK, d + blk * bb);
        break;
    }
    }
    return PV_OK;
}
