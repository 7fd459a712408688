/* The synthetic test model: a tiny random Llama with SmolLM2's metadata
 * keys, a byte-level BPE vocabulary and a ChatML template, so tests need no
 * download. Weights are uniform in +-1/sqrt(fan_in) from a seeded
 * generator: the same config always gives the same bytes. */
#include <pensieve/gguf.h>

#include "models/byte-level.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ChatML specials at the ids SmolLM2 uses (unk 0, bos 1, eos 2). */
static const char *const special_tokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
#define N_SPECIAL 3

/* Merges in rank order, as byte-level strings ("\xc4\xa0" is 'Ġ', a space).
 * They cover common English pairs, a two-byte UTF-8 letter (é, bytes c3 a9, is "Ã©") and a
 * digit pair that the digit-splitting pre-tokenizer must never let apply. */
static const char *const synth_merges[] = {
    "\xc4\xa0 t", "h e", "\xc4\xa0 a", "i n", "\xc4\xa0t he", "e r", "o n", "\xc4\xa0 \xc4\xa0",
    "r e", "\xc4\xa0 s", "a t", "e n", "\xc4\xa0 o", "\xc4\xa0 w", "l l", "\xc4\xa0 h",
    "i s", "o r", "\xc4\xa0 c", "a n", "\xc4\xa0\xc4\xa0 \xc4\xa0\xc4\xa0", "\xc3\x83 \xc2\xa9",
    "1 2", "\xc4\xa0 i", "\xc4\xa0i s", "e s", "o u", "\xc4\xa0 m", "\xc4\xa0h e", "l o",
    "ll o", "he llo", "\xc4\xa0w or", "w or",
};
#define N_MERGES (sizeof synth_merges / sizeof synth_merges[0])

static const char synth_chat_template[] =
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny synthetic test model.<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

void pv_synth_config_default(pv_synth_config *c)
{
    memset(c, 0, sizeof *c);
    c->n_layers = 2;
    c->n_embd = 64;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->n_ff = 128;
    c->n_ctx = 256;
    c->rope_base = 10000.0f;
    c->norm_eps = 1e-5f;
    c->seed = 42;
    c->tied_embeddings = 1;
    c->version = 3;
    c->alignment = 0;
}

static uint64_t next_random(uint64_t *state)
{
    /* splitmix64: small, seedable, good enough for test weights */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(float *x, uint64_t n, float center, float range, uint64_t *state)
{
    for (uint64_t i = 0; i < n; i++) {
        double u = (double)(next_random(state) >> 11) / 9007199254740992.0; /* [0, 1) */
        x[i] = center + range * (float)(2.0 * u - 1.0);
    }
}

/* Vocabulary: specials, then the 256 byte tokens in byte-level alphabet
 * order (printable bytes first, as GPT-2 vocabularies list them), then one
 * token per merge. */
static pv_status build_vocab(char ***tokens_out, int32_t **types_out, uint32_t *n_out)
{
    uint32_t n = N_SPECIAL + 256 + (uint32_t)N_MERGES;
    char **tokens = calloc(n, sizeof *tokens);
    int32_t *types = calloc(n, sizeof *types);
    if (!tokens || !types) {
        free(tokens);
        free(types);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary of %u tokens", n);
    }
    uint32_t id = 0;
    for (; id < N_SPECIAL; id++) {
        tokens[id] = strdup(special_tokens[id]);
        types[id] = 3; /* control */
    }
    uint32_t cps[256];
    for (unsigned b = 0; b < 256; b++)
        cps[b] = pv_byte_level_codepoint((uint8_t)b);
    /* order the 256 byte tokens by code point */
    for (uint32_t cp = 0; cp < 0x100 + 256; cp++) {
        for (unsigned b = 0; b < 256; b++) {
            if (cps[b] != cp)
                continue;
            char buf[5] = {0};
            pv_utf8_put(cp, buf);
            tokens[id] = strdup(buf);
            types[id++] = 1; /* normal */
        }
    }
    for (size_t m = 0; m < N_MERGES; m++) {
        const char *sp = strchr(synth_merges[m], ' ');
        size_t left = (size_t)(sp - synth_merges[m]);
        char *tok = malloc(strlen(synth_merges[m]));
        if (tok) {
            memcpy(tok, synth_merges[m], left);
            strcpy(tok + left, sp + 1);
        }
        tokens[id] = tok;
        types[id++] = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (!tokens[i]) {
            for (uint32_t j = 0; j < n; j++)
                free(tokens[j]);
            free(tokens);
            free(types);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary token %u", i);
        }
    }
    *tokens_out = tokens;
    *types_out = types;
    *n_out = n;
    return PV_OK;
}

static pv_status check_config(const pv_synth_config *c)
{
    if (c->n_layers == 0 || c->n_heads == 0 || c->n_kv_heads == 0 || c->n_ctx == 0)
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: layers %u, heads %u, kv heads %u, "
                        "context %u must all be positive", c->n_layers, c->n_heads, c->n_kv_heads,
                        c->n_ctx);
    if (c->n_embd == 0 || c->n_embd % 32 != 0 || c->n_ff == 0 || c->n_ff % 32 != 0)
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: width %u and FFN size %u must be "
                        "positive multiples of 32 (the quantised block size)", c->n_embd, c->n_ff);
    if (c->n_embd % c->n_heads != 0 || c->n_heads % c->n_kv_heads != 0 ||
        (c->n_embd / c->n_heads) % 2 != 0)
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: %u heads must divide width %u into "
                        "even head sizes, and %u kv heads must divide the heads",
                        c->n_heads, c->n_embd, c->n_kv_heads);
    return PV_OK;
}

static pv_status add_metadata(pv_gguf_writer *w, const pv_synth_config *c, char **tokens,
                              const int32_t *types, uint32_t n_vocab)
{
    pv_status st = PV_OK;
#define ADD(call) do { if (st == PV_OK) st = (call); } while (0)
    ADD(pv_gguf_writer_add_string(w, "general.architecture", "llama"));
    ADD(pv_gguf_writer_add_string(w, "general.type", "model"));
    ADD(pv_gguf_writer_add_string(w, "general.name", "pensieve synthetic llama"));
    ADD(pv_gguf_writer_add_u32(w, "llama.block_count", c->n_layers));
    ADD(pv_gguf_writer_add_u32(w, "llama.context_length", c->n_ctx));
    ADD(pv_gguf_writer_add_u32(w, "llama.embedding_length", c->n_embd));
    ADD(pv_gguf_writer_add_u32(w, "llama.feed_forward_length", c->n_ff));
    ADD(pv_gguf_writer_add_u32(w, "llama.attention.head_count", c->n_heads));
    ADD(pv_gguf_writer_add_u32(w, "llama.attention.head_count_kv", c->n_kv_heads));
    ADD(pv_gguf_writer_add_f32(w, "llama.rope.freq_base", c->rope_base));
    ADD(pv_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps));
    ADD(pv_gguf_writer_add_u32(w, "general.file_type", 3)); /* "mostly Q4_1", as SmolLM2's */
    ADD(pv_gguf_writer_add_u32(w, "llama.vocab_size", n_vocab));
    ADD(pv_gguf_writer_add_u32(w, "llama.rope.dimension_count", c->n_embd / c->n_heads));
    ADD(pv_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0));
    ADD(pv_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2"));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.ggml.pre", "smollm"));
    ADD(pv_gguf_writer_add_strings(w, "tokenizer.ggml.tokens", (const char *const *)tokens,
                                   n_vocab));
    ADD(pv_gguf_writer_add_i32s(w, "tokenizer.ggml.token_type", types, n_vocab));
    ADD(pv_gguf_writer_add_strings(w, "tokenizer.ggml.merges", synth_merges, N_MERGES));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 2));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.chat_template", synth_chat_template));
    ADD(pv_gguf_writer_add_u32(w, "general.quantization_version", 2));
#undef ADD
    return st;
}

/* One random tensor: `fan_in` sets the range, norms sit around 1. */
static pv_status add_random(pv_gguf_writer *w, const char *name, uint32_t type, uint64_t ne0,
                            uint64_t ne1, int is_norm, uint64_t *rng)
{
    uint64_t n = ne0 * ne1;
    float *x = malloc(n * sizeof *x);
    if (!x)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic tensor '%s' of %" PRIu64 " floats", name, n);
    if (is_norm)
        fill(x, n, 1.0f, 0.1f, rng);
    else
        fill(x, n, 0.0f, 1.0f / sqrtf((float)ne0), rng);
    uint64_t ne[2] = {ne0, ne1};
    pv_status st = pv_gguf_writer_add_tensor(w, name, type, ne1 == 1 ? 1 : 2, ne, x);
    free(x);
    return st;
}

static pv_status add_tensors(pv_gguf_writer *w, const pv_synth_config *c, uint32_t n_vocab)
{
    uint64_t rng = c->seed;
    uint32_t kv_dim = c->n_kv_heads * (c->n_embd / c->n_heads);
    pv_status st = add_random(w, "token_embd.weight", PV_GGML_Q8_0, c->n_embd, n_vocab, 0, &rng);
    for (uint32_t l = 0; st == PV_OK && l < c->n_layers; l++) {
        const struct { const char *suffix; uint32_t type; uint64_t ne0, ne1; int norm; } t[] = {
            {"attn_norm.weight", PV_GGML_F32, c->n_embd, 1, 1},
            {"attn_q.weight", PV_GGML_Q4_1, c->n_embd, c->n_embd, 0},
            {"attn_k.weight", PV_GGML_Q4_0, c->n_embd, kv_dim, 0},
            {"attn_v.weight", PV_GGML_F16, c->n_embd, kv_dim, 0},
            {"attn_output.weight", PV_GGML_Q8_0, c->n_embd, c->n_embd, 0},
            {"ffn_norm.weight", PV_GGML_F32, c->n_embd, 1, 1},
            {"ffn_gate.weight", PV_GGML_Q4_1, c->n_embd, c->n_ff, 0},
            {"ffn_up.weight", PV_GGML_Q4_0, c->n_embd, c->n_ff, 0},
            {"ffn_down.weight", l == 0 ? PV_GGML_BF16 : PV_GGML_F16, c->n_ff, c->n_embd, 0},
        };
        for (size_t i = 0; st == PV_OK && i < sizeof t / sizeof t[0]; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, t[i].suffix);
            st = add_random(w, name, t[i].type, t[i].ne0, t[i].ne1, t[i].norm, &rng);
        }
    }
    if (st == PV_OK)
        st = add_random(w, "output_norm.weight", PV_GGML_F32, c->n_embd, 1, 1, &rng);
    if (st == PV_OK && !c->tied_embeddings)
        st = add_random(w, "output.weight", PV_GGML_F16, c->n_embd, n_vocab, 0, &rng);
    return st;
}

/* Fill an initialised writer with the whole model. */
static pv_status build(const pv_synth_config *c, pv_gguf_writer *w)
{
    pv_status st = check_config(c);
    if (st != PV_OK)
        return st;
    char **tokens;
    int32_t *types;
    uint32_t n_vocab;
    if ((st = build_vocab(&tokens, &types, &n_vocab)) != PV_OK)
        return st;
    st = add_metadata(w, c, tokens, types, n_vocab);
    if (st == PV_OK)
        st = add_tensors(w, c, n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++)
        free(tokens[i]);
    free(tokens);
    free(types);
    return st;
}

pv_status pv_synth_to_memory(const pv_synth_config *c, uint8_t **out, uint64_t *size)
{
    if (!c || !out || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_synth_to_memory: NULL argument");
    pv_gguf_writer w;
    pv_status st = pv_gguf_writer_init(&w, c->version, c->alignment);
    if (st == PV_OK)
        st = build(c, &w);
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, out, size);
    pv_gguf_writer_free(&w);
    return st;
}

pv_status pv_synth_write(const pv_synth_config *c, const char *path)
{
    if (!c || !path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_synth_write: NULL %s", c ? "path" : "config");
    pv_gguf_writer w;
    pv_status st = pv_gguf_writer_init(&w, c->version, c->alignment);
    if (st == PV_OK)
        st = build(c, &w);
    if (st == PV_OK)
        st = pv_gguf_writer_write(&w, path);
    pv_gguf_writer_free(&w);
    return st;
}
