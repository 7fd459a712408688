/* GGUF reader, writer and dequantisation: hand-built blocks against values
 * worked out from the format description, quantise/dequantise error bounds,
 * the synthetic model's metadata and tensors, v2/v3 and alignment variants,
 * clear errors for bad input, 100k keys and tensors opened in linear time
 * with repeats refused, truncation at every header byte and random
 * byte flips (never a crash), and the real SmolLM2 file against values read
 * by the independent `gguf` Python package (skipped when absent). */
#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include "tap.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_state = 12345;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static float rnd_float(void)
{
    return (float)rnd() / (float)(1u << 31) - 1.0f;
}

/* ---- hand-built blocks ------------------------------------------------------ */

static void test_known_blocks(void)
{
    float out[32];
    /* Q8_0: d = 2.0 (f16 0x4000), q[5] = -3, q[31] = 127 */
    uint8_t q8[34] = {0x00, 0x40};
    q8[2 + 5] = (uint8_t)-3;
    q8[2 + 31] = 127;
    ok(pv_ggml_dequantize_f32(PV_GGML_Q8_0, q8, sizeof q8, out, 32) == PV_OK &&
           out[5] == -6.0f && out[31] == 254.0f && out[0] == 0.0f,
       "Q8_0 block: d=2, q=-3 -> -6, q=127 -> 254");
    /* Q4_0: d = 0.5 (0x3800); qs[0] = 0x1f: low nibble 15 -> (15-8)*0.5 = 3.5
     * at x[0], high nibble 1 -> (1-8)*0.5 = -3.5 at x[16] */
    uint8_t q40[18] = {0x00, 0x38, 0x1f};
    ok(pv_ggml_dequantize_f32(PV_GGML_Q4_0, q40, sizeof q40, out, 32) == PV_OK &&
           out[0] == 3.5f && out[16] == -3.5f && out[1] == -4.0f,
       "Q4_0 block: nibbles 15 / 1 / 0 -> 3.5 / -3.5 / -4");
    /* Q4_1: d = 0.25 (0x3400), m = -1 (0xbc00); qs[0] = 0x3a: 10 -> 1.5 at
     * x[0], 3 -> -0.25 at x[16] */
    uint8_t q41[20] = {0x00, 0x34, 0x00, 0xbc, 0x3a};
    ok(pv_ggml_dequantize_f32(PV_GGML_Q4_1, q41, sizeof q41, out, 32) == PV_OK &&
           out[0] == 1.5f && out[16] == -0.25f && out[1] == -1.0f,
       "Q4_1 block: nibbles 10 / 3 / 0 -> 1.5 / -0.25 / -1");
    uint8_t bf[4] = {0xc0, 0x3f, 0x20, 0xc1}; /* 0x3fc0 = 1.5, 0xc120 = -10 */
    ok(pv_ggml_dequantize_f32(PV_GGML_BF16, bf, sizeof bf, out, 2) == PV_OK && out[0] == 1.5f &&
           out[1] == -10.0f, "BF16: 0x3fc0 -> 1.5, 0xc120 -> -10");
    uint8_t f16[4] = {0x00, 0x3c, 0x00, 0xc5}; /* 1.0, -5.0 */
    ok(pv_ggml_dequantize_f32(PV_GGML_F16, f16, sizeof f16, out, 2) == PV_OK && out[0] == 1.0f &&
           out[1] == -5.0f, "F16: 0x3c00 -> 1, 0xc500 -> -5");
    pv_half h[32];
    ok(pv_ggml_dequantize_f16(PV_GGML_Q4_1, q41, sizeof q41, h, 32) == PV_OK &&
           pv_half_to_float(h[0]) == 1.5f && pv_half_to_float(h[16]) == -0.25f,
       "Q4_1 to f16 gives the same values");
    ok(pv_ggml_dequantize_f32(PV_GGML_Q4_1, q41, 19, out, 32) == PV_ERR_INVALID_ARG,
       "a block one byte short is refused: %s", pv_last_error());
    ok(pv_ggml_dequantize_f32(PV_GGML_Q8_0, q8, sizeof q8, out, 16) == PV_ERR_INVALID_ARG,
       "half a block is refused: %s", pv_last_error());
    uint8_t q6k[210] = {0};
    ok(pv_ggml_dequantize_f32(PV_GGML_Q6_K, q6k, sizeof q6k, out, 256) == PV_ERR_UNSUPPORTED,
       "Q6_K is named unsupported: %s", pv_last_error());
    uint32_t be, bb;
    ok(pv_ggml_type_block(PV_GGML_Q8_1, &be, &bb) == PV_OK && be == 32 && bb == 40 &&
           pv_ggml_type_block(PV_GGML_Q6_K, &be, &bb) == PV_OK && be == 256 && bb == 210 &&
           pv_ggml_type_block(99, &be, &bb) == PV_ERR_UNSUPPORTED,
       "block sizes: Q8_1 32/40, Q6_K 256/210, type 99 unknown");
}

/* ---- quantise / dequantise round trips -------------------------------------------- */

static void test_round_trips(void)
{
    enum { N = 32 * 64 };
    static float x[N], y[N];
    static uint8_t buf[N * 4];
    for (int i = 0; i < N; i++)
        x[i] = rnd_float() * (i % 64 == 0 ? 4.0f : 1.0f);
    static const uint32_t types[] = {PV_GGML_F32, PV_GGML_F16, PV_GGML_BF16,
                                     PV_GGML_Q8_0, PV_GGML_Q4_0, PV_GGML_Q4_1};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t type = types[t];
        uint64_t bytes;
        pv_ggml_row_bytes(type, N, &bytes);
        int good = pv_ggml_quantize(type, x, N, buf, bytes) == PV_OK &&
                   pv_ggml_dequantize_f32(type, buf, bytes, y, N) == PV_OK;
        /* Bound per block: half a quantisation step (+ the f16 rounding of
         * the scale and minimum). */
        double worst = 0.0;
        for (int b = 0; good && b < N / 32; b++) {
            float lo = x[b * 32], hi = x[b * 32], amax = 0.0f;
            for (int j = 0; j < 32; j++) {
                lo = fminf(lo, x[b * 32 + j]);
                hi = fmaxf(hi, x[b * 32 + j]);
                amax = fmaxf(amax, fabsf(x[b * 32 + j]));
            }
            for (int j = 0; j < 32; j++) {
                int i = b * 32 + j;
                double bound;
                switch (type) {
                case PV_GGML_F32: bound = 0.0; break;
                case PV_GGML_F16: bound = fabsf(x[i]) * 4.9e-4 + 6e-8; break;
                case PV_GGML_BF16: bound = fabsf(x[i]) * 3.9e-3; break;
                case PV_GGML_Q8_0: bound = amax / 127.0 * 0.5 + amax * 2e-3; break;
                case PV_GGML_Q4_0: bound = amax / 8.0 * 0.5 + amax * 2e-3 * 8; break;
                default: bound = (hi - lo) / 15.0 * 0.5 + (fabsf(lo) + fabsf(hi)) * 2e-3; break;
                }
                double err = fabs((double)y[i] - x[i]);
                if (err > bound)
                    good = 0;
                if (err > worst)
                    worst = err;
            }
        }
        ok(good, "%s quantise -> dequantise within half a step (worst error %.3g)",
           pv_ggml_type_name(type), worst);
        pv_half h[N];
        int same = pv_ggml_dequantize_f16(type, buf, bytes, h, N) == PV_OK;
        for (int i = 0; same && i < N; i++)
            same = h[i] == pv_float_to_half(y[i]);
        ok(same, "%s to f16 equals f16(its f32 decode)", pv_ggml_type_name(type));
    }
}

/* ---- the synthetic model -------------------------------------------------------- */

static const pv_gguf_tensor *tensor(const pv_gguf *g, const char *name)
{
    return pv_gguf_find_tensor(g, name);
}

static void test_synth(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *img;
    uint64_t size;
    pv_status st = pv_synth_to_memory(&c, &img, &size);
    if (!ok(st == PV_OK, "synthetic model written (%llu bytes)",
            st == PV_OK ? (unsigned long long)size : 0ull))
        return;
    pv_gguf g;
    st = pv_gguf_init_memory(&g, img, size);
    if (!ok(st == PV_OK, "synthetic model parses%s%s", st ? ": " : "", st ? pv_last_error() : "")) {
        free(img);
        return;
    }
    ok(g.version == 3 && g.alignment == 32 && g.data_offset % 32 == 0,
       "version 3, default alignment 32, data at %llu", (unsigned long long)g.data_offset);
    uint32_t u = 0;
    float f = 0;
    int b = -1;
    const char *s;
    uint64_t len;
    ok(pv_gguf_get_u32(&g, "llama.block_count", &u) == PV_OK && u == 2, "llama.block_count = 2");
    ok(pv_gguf_get_f32(&g, "llama.rope.freq_base", &f) == PV_OK && f == 10000.0f,
       "llama.rope.freq_base = 10000");
    ok(pv_gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &b) == PV_OK && b == 0,
       "add_bos_token = false");
    ok(pv_gguf_get_string(&g, "general.architecture", &s, &len) == PV_OK && len == 5 &&
           memcmp(s, "llama", 5) == 0, "general.architecture = llama");
    pv_gguf_type et = PV_GGUF_UINT8;
    uint64_t count = 0;
    const pv_gguf_kv *toks = pv_gguf_find(&g, "tokenizer.ggml.tokens");
    pv_gguf_get_array(&g, "tokenizer.ggml.tokens", &et, &count);
    ok(et == PV_GGUF_STRING && count == 3 + 256 + 34 && toks &&
           pv_gguf_array_string(toks, 1, &s, &len) == PV_OK && len == 12 &&
           memcmp(s, "<|im_start|>", 12) == 0,
       "tokens: string array of %llu, [1] = <|im_start|>", (unsigned long long)count);
    int64_t type = 0;
    const pv_gguf_kv *types = pv_gguf_find(&g, "tokenizer.ggml.token_type");
    ok(types && pv_gguf_array_int(types, 2, &type) == PV_OK && type == 3 &&
           pv_gguf_array_int(types, 3, &type) == PV_OK && type == 1,
       "token_type: [2] control, [3] normal");
    ok(pv_gguf_array_string(toks, count, &s, &len) == PV_ERR_INVALID_ARG,
       "array index past the end refused: %s", pv_last_error());
    ok(pv_gguf_get_u32(&g, "no.such.key", &u) == PV_ERR_NOT_FOUND &&
           strstr(pv_last_error(), "no.such.key") != NULL,
       "missing key is NOT_FOUND naming it: %s", pv_last_error());
    ok(pv_gguf_get_u32(&g, "general.architecture", &u) == PV_ERR_FORMAT,
       "a string read as u32 is FORMAT: %s", pv_last_error());
    ok(pv_gguf_get_f32(&g, "llama.block_count", &f) == PV_ERR_FORMAT,
       "an integer read as float is FORMAT: %s", pv_last_error());

    pv_llama_hparams hp;
    ok(pv_llama_hparams_read(&g, &hp) == PV_OK && hp.n_layers == 2 && hp.n_embd == 64 &&
           hp.n_heads == 4 && hp.n_kv_heads == 2 && hp.head_dim == 16 && hp.n_ff == 128 &&
           hp.n_vocab == 293 && hp.tied_embeddings && hp.rope_dim == 16 &&
           fabsf(hp.norm_eps - 1e-5f) < 1e-12f,
       "hyperparameters: 2 layers, 64 wide, 4/2 heads, ffn 128, vocab 293, tied");

    struct { const char *name; uint32_t type; uint64_t ne0, ne1; } expect[] = {
        {"token_embd.weight", PV_GGML_Q8_0, 64, 293},
        {"blk.0.attn_norm.weight", PV_GGML_F32, 64, 1},
        {"blk.0.attn_q.weight", PV_GGML_Q4_1, 64, 64},
        {"blk.0.attn_k.weight", PV_GGML_Q4_0, 64, 32},
        {"blk.0.attn_v.weight", PV_GGML_F16, 64, 32},
        {"blk.0.attn_output.weight", PV_GGML_Q8_0, 64, 64},
        {"blk.0.ffn_down.weight", PV_GGML_BF16, 128, 64},
        {"blk.1.ffn_down.weight", PV_GGML_F16, 128, 64},
        {"blk.1.ffn_up.weight", PV_GGML_Q4_0, 64, 128},
        {"output_norm.weight", PV_GGML_F32, 64, 1},
    };
    int shapes = 1;
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        const pv_gguf_tensor *t = tensor(&g, expect[i].name);
        shapes = shapes && t && t->type == expect[i].type && t->ne[0] == expect[i].ne0 &&
                 t->ne[1] == expect[i].ne1 && t->offset % g.alignment == 0;
    }
    ok(shapes, "tensor types and shapes as documented, offsets aligned");
    const pv_gguf_tensor *missing;
    ok(pv_gguf_get_tensor(&g, "output.weight", &missing) == PV_ERR_NOT_FOUND &&
           strstr(pv_last_error(), "output.weight"), "absent tensor named: %s", pv_last_error());

    /* Every tensor decodes; rows decode like the whole; f16 like f32. */
    int all = 1;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const pv_gguf_tensor *t = &g.tensors[i];
        float *full = malloc(t->n_elements * sizeof *full);
        pv_half *half = malloc(t->n_elements * sizeof *half);
        uint64_t rows = t->n_elements / t->ne[0];
        float *part = malloc(t->ne[0] * 2 * sizeof *part);
        int fine = full && half && part && pv_gguf_tensor_f32(t, full, t->n_elements) == PV_OK &&
                   pv_gguf_tensor_f16(t, half, t->n_elements) == PV_OK;
        for (uint64_t k = 0; fine && k < t->n_elements; k++)
            fine = isfinite(full[k]) && half[k] == pv_float_to_half(full[k]);
        if (fine && rows >= 2) {
            fine = pv_gguf_tensor_rows_f32(t, rows - 2, 2, part) == PV_OK &&
                   memcmp(part, full + (rows - 2) * t->ne[0], 2 * t->ne[0] * sizeof *part) == 0;
            fine = fine && pv_gguf_tensor_rows_f32(t, rows - 1, 2, part) == PV_ERR_INVALID_ARG;
        }
        if (!fine)
            tap_diag("tensor %s: %s", t->name, pv_last_error());
        all = all && fine;
        free(full);
        free(half);
        free(part);
    }
    ok(all, "all %llu tensors decode to finite f32 and f16; row ranges match, overruns refused",
       (unsigned long long)g.n_tensors);
    float one[64];
    ok(pv_gguf_tensor_f32(tensor(&g, "output_norm.weight"), one, 63) == PV_ERR_INVALID_ARG,
       "wrong destination size refused: %s", pv_last_error());

    /* The same config gives the same bytes; another seed gives others. */
    uint8_t *again;
    uint64_t again_size;
    c.seed = 42;
    int same = pv_synth_to_memory(&c, &again, &again_size) == PV_OK && again_size == size &&
               memcmp(again, img, size) == 0;
    free(again);
    c.seed = 43;
    int differs = pv_synth_to_memory(&c, &again, &again_size) == PV_OK &&
                  memcmp(again, img, size) != 0;
    free(again);
    ok(same && differs, "synthetic model is deterministic in its seed");

    /* Through a real file and mmap. */
    char path[] = "/tmp/pv-test-gguf-XXXXXX";
    int fd = mkstemp(path);
    pv_synth_config_default(&c);
    pv_gguf fg;
    int file_ok = fd >= 0 && pv_synth_write(&c, path) == PV_OK && pv_gguf_init(&fg, path) == PV_OK;
    if (file_ok) {
        file_ok = fg.size == size && fg.n_tensors == g.n_tensors && fg.n_kv == g.n_kv &&
                  memcmp(fg.tensors[3].data, g.tensors[3].data, g.tensors[3].n_bytes) == 0;
        pv_gguf_free(&fg);
    }
    ok(file_ok, "written file maps and matches the memory image");
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }
    pv_gguf_free(&g);
    free(img);
}

static void test_variants(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    c.version = 2;
    c.alignment = 64;
    c.tied_embeddings = 0;
    c.n_layers = 1;
    uint8_t *img;
    uint64_t size;
    pv_gguf g;
    pv_llama_hparams hp;
    int good = pv_synth_to_memory(&c, &img, &size) == PV_OK &&
               pv_gguf_init_memory(&g, img, size) == PV_OK;
    if (good) {
        good = g.version == 2 && g.alignment == 64 && g.data_offset % 64 == 0 &&
               pv_llama_hparams_read(&g, &hp) == PV_OK && !hp.tied_embeddings;
        for (uint64_t i = 0; good && i < g.n_tensors; i++)
            good = g.tensors[i].offset % 64 == 0;
        pv_gguf_free(&g);
        free(img);
    }
    ok(good, "GGUF v2 with general.alignment 64 and a separate output.weight");
    c.alignment = 48;
    ok(pv_synth_to_memory(&c, &img, &size) == PV_ERR_INVALID_ARG,
       "alignment 48 refused by the writer: %s", pv_last_error());
    pv_synth_config_default(&c);
    c.n_embd = 40;
    ok(pv_synth_to_memory(&c, &img, &size) == PV_ERR_INVALID_ARG,
       "width 40 refused (not a multiple of 32): %s", pv_last_error());
}

/* Find tensor `name`'s info in an image and return the offset of its type
 * field (after the name, n_dims and dims). */
static uint64_t type_field(const uint8_t *img, uint64_t size, const char *name, uint32_t n_dims)
{
    size_t n = strlen(name);
    for (uint64_t i = 8; i + n + 4 < size; i++)
        if (memcmp(img + i, name, n) == 0 && img[i - 8] == n)
            return i + n + 4 + 8ull * n_dims;
    return 0;
}

static void test_errors(void)
{
    pv_gguf g;
    ok(pv_gguf_init(&g, "/nonexistent/model.gguf") == PV_ERR_IO &&
           strstr(pv_last_error(), "/nonexistent/model.gguf"), "missing file: %s", pv_last_error());
    ok(pv_gguf_init(&g, "/tmp") == PV_ERR_IO && strstr(pv_last_error(), "is a directory"),
       "a directory: %s", pv_last_error());
    static const uint8_t junk[32] = "GGML not a gguf file at all....";
    ok(pv_gguf_init_memory(&g, junk, sizeof junk) == PV_ERR_FORMAT, "no magic: %s",
       pv_last_error());
    uint8_t v1[24] = {'G', 'G', 'U', 'F', 1};
    ok(pv_gguf_init_memory(&g, v1, sizeof v1) == PV_ERR_UNSUPPORTED, "version 1: %s",
       pv_last_error());
    uint8_t be[24] = {'G', 'G', 'U', 'F', 0, 0, 0, 3};
    ok(pv_gguf_init_memory(&g, be, sizeof be) == PV_ERR_UNSUPPORTED, "big-endian file: %s",
       pv_last_error());
    uint8_t huge[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    ok(pv_gguf_init_memory(&g, huge, sizeof huge) == PV_ERR_FORMAT,
       "absurd tensor count refused before allocating: %s", pv_last_error());

    /* A writer-made file with one F32 tensor of 256 values, retyped. */
    pv_gguf_writer w;
    float vals[256];
    for (int i = 0; i < 256; i++)
        vals[i] = (float)i;
    uint64_t ne[1] = {256};
    uint8_t *img;
    uint64_t size;
    if (pv_gguf_writer_init(&w, 3, 0) != PV_OK ||
        pv_gguf_writer_add_tensor(&w, "probe.weight", PV_GGML_F32, 1, ne, vals) != PV_OK ||
        pv_gguf_writer_to_memory(&w, &img, &size) != PV_OK) {
        ok(0, "writer builds the probe file: %s", pv_last_error());
        pv_gguf_writer_free(&w);
        return;
    }
    pv_gguf_writer_free(&w);
    uint64_t at = type_field(img, size, "probe.weight", 1);
    img[at] = PV_GGML_Q6_K;
    const pv_gguf_tensor *t;
    float out[256];
    int opened = pv_gguf_init_memory(&g, img, size) == PV_OK;
    ok(opened && pv_gguf_get_tensor(&g, "probe.weight", &t) == PV_OK &&
           pv_gguf_tensor_f32(t, out, 256) == PV_ERR_UNSUPPORTED &&
           strstr(pv_last_error(), "probe.weight") && strstr(pv_last_error(), "Q6_K"),
       "a Q6_K tensor opens, and decoding it names tensor and type: %s", pv_last_error());
    if (opened)
        pv_gguf_free(&g);
    img[at] = 99;
    ok(pv_gguf_init_memory(&g, img, size) == PV_ERR_FORMAT &&
           strstr(pv_last_error(), "probe.weight") && strstr(pv_last_error(), "offset"),
       "unknown type 99 names tensor and offset: %s", pv_last_error());
    img[at] = PV_GGML_F32;
    img[at + 4] = 8; /* data offset 8: not aligned */
    ok(pv_gguf_init_memory(&g, img, size) == PV_ERR_FORMAT && strstr(pv_last_error(), "alignment"),
       "misaligned offset: %s", pv_last_error());
    img[at + 4] = 0;
    img[at + 5] = 0x10; /* data offset 4096: past the end */
    ok(pv_gguf_init_memory(&g, img, size) == PV_ERR_FORMAT &&
           strstr(pv_last_error(), "past the end"), "out-of-range offset: %s", pv_last_error());
    img[at + 5] = 0;
    ok(pv_gguf_init_memory(&g, img, size) == PV_OK, "restored probe file parses again");
    pv_gguf_free(&g);
    free(img);
}

/* CPU seconds, so that other jobs on a shared machine do not count. */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A file of n keys and n one-value tensors; with `dup`, the last key and
 * the last tensor repeat the first ones' names. */
static pv_status many_names(uint32_t n, int dup_key, int dup_tensor, uint8_t **img, uint64_t *size)
{
    pv_gguf_writer w;
    pv_status st = pv_gguf_writer_init(&w, 3, 0);
    char name[32];
    const float one = 1.0f;
    const uint64_t ne[1] = {1};
    for (uint32_t i = 0; i < n && st == PV_OK; i++) {
        snprintf(name, sizeof name, "many.key.%u", dup_key && i == n - 1 ? 0 : i);
        st = pv_gguf_writer_add_u32(&w, name, i);
    }
    for (uint32_t i = 0; i < n && st == PV_OK; i++) {
        snprintf(name, sizeof name, "many.tensor.%u", dup_tensor && i == n - 1 ? 0 : i);
        st = pv_gguf_writer_add_tensor(&w, name, PV_GGML_F32, 1, ne, &one);
    }
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, img, size);
    pv_gguf_writer_free(&w);
    return st;
}

/* 100k keys and 100k tensors: comparing every pair of names for duplicates
 * took 11.7 s for the keys alone; hashed, opening takes milliseconds. The
 * bound leaves room for sanitizer builds. */
static void test_many_names(void)
{
    enum { N = 100000 };
    const double bound = 1.0;
    uint8_t *img;
    uint64_t size;
    pv_gguf g;
    if (!ok(many_names(N, 0, 0, &img, &size) == PV_OK, "file of %d keys and %d tensors", N, N))
        return;
    double t = cpu_seconds();
    pv_status st = pv_gguf_init_memory(&g, img, size);
    t = cpu_seconds() - t;
    ok(st == PV_OK && t < bound, "it opens in %.3f s of CPU (bound %.1f s)%s%s", t, bound,
       st ? ": " : "", st ? pv_last_error() : "");
    if (st == PV_OK) {
        uint32_t v[3] = {1, 1, 1};
        const pv_gguf_tensor *t0 = pv_gguf_find_tensor(&g, "many.tensor.0");
        const pv_gguf_tensor *t1 = pv_gguf_find_tensor(&g, "many.tensor.99999");
        ok(pv_gguf_get_u32(&g, "many.key.0", &v[0]) == PV_OK &&
               pv_gguf_get_u32(&g, "many.key.54321", &v[1]) == PV_OK &&
               pv_gguf_get_u32(&g, "many.key.99999", &v[2]) == PV_OK && v[0] == 0 &&
               v[1] == 54321 && v[2] == 99999 && !pv_gguf_find(&g, "many.key.100000") &&
               !pv_gguf_find(&g, "many.key") && t0 == &g.tensors[0] &&
               t1 == &g.tensors[N - 1] && !pv_gguf_find_tensor(&g, "many.tensor.100000"),
           "keys and tensors are found by name, absent names are not");
        pv_gguf_free(&g);
    }
    free(img);
    if (many_names(N, 1, 0, &img, &size) == PV_OK) {
        t = cpu_seconds();
        st = pv_gguf_init_memory(&g, img, size);
        t = cpu_seconds() - t;
        ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), "'many.key.0'") &&
               strstr(pv_last_error(), "appears twice") && t < bound,
           "a repeated key at the end is refused in %.3f s: %s", t, pv_last_error());
        free(img);
    }
    if (many_names(N, 0, 1, &img, &size) == PV_OK) {
        t = cpu_seconds();
        st = pv_gguf_init_memory(&g, img, size);
        t = cpu_seconds() - t;
        ok(st == PV_ERR_FORMAT && strstr(pv_last_error(), "'many.tensor.0'") &&
               strstr(pv_last_error(), "appears twice") && t < bound,
           "a repeated tensor name at the end is refused in %.3f s: %s", t, pv_last_error());
        free(img);
    }
}

/* Truncate at every byte of the header and metadata (and a stride through
 * the data), flip random bytes: errors are FORMAT/UNSUPPORTED with a
 * message; whatever opens is decoded without crashing. */
static void test_fuzz(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    c.n_layers = 1;
    uint8_t *img;
    uint64_t size;
    pv_gguf g;
    if (pv_synth_to_memory(&c, &img, &size) != PV_OK || pv_gguf_init_memory(&g, img, size) != PV_OK) {
        ok(0, "fuzz base image");
        return;
    }
    uint64_t header_end = g.data_offset;
    pv_gguf_free(&g);
    int clean = 1;
    uint64_t tried = 0;
    for (uint64_t cut = 0; cut < size; cut += cut < header_end ? 1 : 97) {
        /* a copy of exactly `cut` bytes, so ASan sees any read past it */
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, img, cut);
        pv_status st = pv_gguf_init_memory(&g, part, cut);
        tried++;
        if (st == PV_OK) {
            clean = 0;
            tap_diag("truncated at %llu bytes of %llu but parsed", (unsigned long long)cut,
                     (unsigned long long)size);
            pv_gguf_free(&g);
        } else if (st != PV_ERR_FORMAT || strstr(pv_last_error(), "offset") == NULL) {
            clean = 0;
            tap_diag("truncated at %llu: status %s, message '%s'", (unsigned long long)cut,
                     pv_status_str(st), pv_last_error());
        }
        free(part);
    }
    ok(clean, "%llu truncations: each a FORMAT error naming an offset", (unsigned long long)tried);

    uint8_t *copy = malloc(size);
    int opened = 0, failed = 0, bad_status = 0;
    for (int round = 0; round < 3000; round++) {
        memcpy(copy, img, size);
        int flips = 1 + (int)(rnd() % 4);
        for (int k = 0; k < flips; k++) {
            /* mostly the header, where structure lives */
            uint64_t at = rnd() % 4 ? rnd() % header_end : rnd() % size;
            copy[at] ^= (uint8_t)(1u << (rnd() % 8));
        }
        pv_status st = pv_gguf_init_memory(&g, copy, size);
        if (st != PV_OK) {
            failed++;
            bad_status += st != PV_ERR_FORMAT && st != PV_ERR_UNSUPPORTED;
            continue;
        }
        opened++;
        pv_llama_hparams hp;
        pv_llama_hparams_read(&g, &hp);
        pv_tokenizer tok;
        if (pv_tokenizer_init(&tok, &g) == PV_OK) {
            int32_t ids[64];
            size_t n;
            pv_tokenizer_encode(&tok, "hello 12 world", 14, PV_TOKENIZE_PARSE_SPECIAL, ids, 64, &n);
            pv_tokenizer_free(&tok);
        }
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const pv_gguf_tensor *t = &g.tensors[i];
            if (t->n_elements > (1u << 20))
                continue;
            float *out = malloc(t->n_elements * sizeof *out);
            if (out)
                pv_gguf_tensor_f32(t, out, t->n_elements);
            free(out);
        }
        pv_gguf_free(&g);
    }
    free(copy);
    ok(bad_status == 0, "3000 corrupted images: %d rejected (FORMAT/UNSUPPORTED), %d opened and "
       "decoded without a crash", failed, opened);
    free(img);
}

/* ---- the real model -------------------------------------------------------------- */

static int close_to(float got, double want)
{
    return fabs((double)got - want) <= 1e-6 * fmax(1.0, fabs(want));
}

static void test_real_model(void)
{
    char path[4096];
    if (pv_default_model_path(path, sizeof path) != PV_OK || access(path, R_OK) != 0) {
        tap_skip("real model absent (%s): run scripts/get-model", path);
        return;
    }
    pv_gguf g;
    pv_status st = pv_gguf_init(&g, path);
    if (!ok(st == PV_OK, "SmolLM2 GGUF parses%s%s", st ? ": " : "", st ? pv_last_error() : ""))
        return;
    uint64_t per_type[64] = {0};
    for (uint64_t i = 0; i < g.n_tensors; i++)
        per_type[g.tensors[i].type < 64 ? g.tensors[i].type : 63]++;
    ok(g.version == 3 && g.n_tensors == 272 && per_type[PV_GGML_F32] == 61 &&
           per_type[PV_GGML_Q4_1] == 210 && per_type[PV_GGML_Q8_0] == 1,
       "272 tensors: 61 F32, 210 Q4_1, 1 Q8_0 (nothing else)");
    pv_llama_hparams hp;
    ok(pv_llama_hparams_read(&g, &hp) == PV_OK && hp.n_layers == 30 && hp.n_embd == 576 &&
           hp.n_heads == 9 && hp.n_kv_heads == 3 && hp.n_ff == 1536 && hp.n_vocab == 49152 &&
           hp.tied_embeddings && hp.rope_base == 100000.0f && hp.head_dim == 64,
       "hyperparameters: 30 layers, 576, 9/3 heads, ffn 1536, vocab 49152, rope 1e5, tied");

    /* Values from the `gguf` Python package's dequantize() on the same file
     * (see docs/models.md): first four of a row, and the row's sum. */
    static const struct {
        const char *name;
        uint64_t row;
        double v[4], row_sum;
    } want[] = {
        {"token_embd.weight", 0, {-0.10654449462890625, 0.032978057861328125,
                                  0.048198699951171875, -0.022830963134765625}, -2.25410938},
        {"token_embd.weight", 49151, {0.011505126953125, 0.0057525634765625, 0.0977935791015625,
                                      -0.0977935791015625}, -0.466220856},
        {"blk.0.attn_q.weight", 0, {-0.0963134765625, 0.1573486328125, -0.0963134765625,
                                    -0.73046875}, 1.00726318},
        {"blk.29.ffn_down.weight", 575, {-0.22918701171875, -0.03912353515625, -0.276702880859375,
                                         0.2459716796875}, -5.22994995},
        {"output_norm.weight", 0, {1.7578125, 1.8203125, 1.78125, 1.6015625}, 1038.33203},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const pv_gguf_tensor *t = pv_gguf_find_tensor(&g, want[i].name);
        float row[1536];
        int good = t && t->ne[0] <= 1536 && pv_gguf_tensor_rows_f32(t, want[i].row, 1, row) == PV_OK;
        double sum = 0.0;
        for (uint64_t k = 0; good && k < t->ne[0]; k++)
            sum += row[k];
        good = good && close_to(row[0], want[i].v[0]) && close_to(row[1], want[i].v[1]) &&
               close_to(row[2], want[i].v[2]) && close_to(row[3], want[i].v[3]) &&
               fabs(sum - want[i].row_sum) < 1e-5 * fmax(1.0, fabs(want[i].row_sum));
        ok(good, "%s row %llu (%s) matches the gguf package: %g %g ... sum %.9g", want[i].name,
           (unsigned long long)want[i].row, t ? pv_ggml_type_name(t->type) : "?", row[0], row[1], sum);
    }
    pv_gguf_free(&g);
}

int main(void)
{
    test_known_blocks();
    test_round_trips();
    test_synth();
    test_variants();
    test_errors();
    test_many_names();
    test_fuzz();
    test_real_model();
    return tap_done();
}
