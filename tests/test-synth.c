/* Synthetic models of real shapes (models/synth.c). Each shape holds the
 * dimensions its published config.json gives; written with one layer it
 * reads back through the project's GGUF reader and loads with
 * pv_llama_init with them, and a prompt's forward pass gives finite
 * logits; every weight type
 * decodes to finite values spread over about +-1/sqrt(fan_in); the trained
 * vocabulary has the model's size and unique tokens, round-trips text and
 * cuts English into multi-byte tokens; the bytes depend on the options
 * alone, not on the thread count, and a file equals the memory image. The
 * tiny default model keeps its bytes. */
#define _GNU_SOURCE /* memmem */
#include "tap.h"

#include <pensieve/llama.h>
#include <pensieve/tokenizer.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The published dimensions (config.json of meta-llama/Meta-Llama-3-8B,
 * Qwen/Qwen2.5-1.5B-Instruct, HuggingFaceTB/SmolLM2-135M-Instruct), kept
 * here apart from models/synth.c so a slip in either shows. */
static const struct expected_shape {
    const char *name;
    uint32_t layers, embd, heads, kv_heads, ff, ctx, vocab;
    float rope_base, norm_eps;
    int tied;
} expected[] = {
    {"llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, 500000.0f, 1e-5f, 0},
    {"qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 32768, 151936, 1000000.0f, 1e-6f, 1},
    {"smollm2-135m", 30, 576, 9, 3, 1536, 8192, 49152, 100000.0f, 1e-5f, 1},
};

/* Ordinary English of common words, and a few rarer ones. */
static const char english[] =
    "The people who work here are very good at their jobs, and they help us understand the "
    "world. I think that this is one of the most important questions we can ask: what would "
    "you do if you had more time? Many children learn to read before they go to school.";

static uint64_t fnv1a(const uint8_t *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The default config is the tiny model tests all over the tree pin values
 * of: its image must not change by a byte. (The hash is of the image the
 * code wrote before real shapes were added.) */
static void test_tiny_unchanged(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *img = NULL;
    uint64_t size = 0;
    int good = pv_synth_to_memory(&c, &img, &size) == PV_OK;
    uint64_t h = good ? fnv1a(img, size) : 0;
    ok(good && size == 104928 && h == 0xbe5d2a78b5087a31ull,
       "default config: the tiny model, byte for byte (%llu bytes, hash %016llx)",
       (unsigned long long)size, (unsigned long long)h);
    free(img);
}

static void check_tokenizer(const char *label, const pv_gguf *g, uint32_t vocab)
{
    pv_tokenizer tok;
    pv_status st = pv_tokenizer_init(&tok, g);
    if (!ok(st == PV_OK, "%s: tokenizer loads (%s)", label, st == PV_OK ? "ok" : pv_last_error()))
        return;
    ok(tok.n_vocab == vocab && tok.bos_id == 1 && tok.eos_id == 2 && tok.im_start_id == 1 &&
           tok.im_end_id == 2 && tok.has_chat_template,
       "%s: %u tokens, <|im_start|> bos 1, <|im_end|> eos 2, ChatML template", label,
       tok.n_vocab);

    /* Every token's text finds its own id: no two tokens share a text. */
    const pv_gguf_kv *tokens = pv_gguf_find(g, "tokenizer.ggml.tokens");
    uint32_t first_bad = UINT32_MAX;
    char text[256];
    for (uint32_t id = 0; tokens && id < vocab && first_bad == UINT32_MAX; id++) {
        const char *s;
        uint64_t len;
        if (pv_gguf_array_string(tokens, id, &s, &len) != PV_OK || len >= sizeof text) {
            first_bad = id;
            break;
        }
        memcpy(text, s, len);
        text[len] = '\0';
        if (pv_tokenizer_find(&tok, text) != (int32_t)id)
            first_bad = id;
    }
    ok(tokens && first_bad == UINT32_MAX, "%s: every token text is unique (first clash at %d)",
       label, first_bad == UINT32_MAX ? -1 : (int)first_bad);

    size_t len = strlen(english), n_ids = 0, dec_len = 0, multi = 0;
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    char *back = malloc(len + 1);
    int round = ids && back &&
                pv_tokenizer_encode(&tok, english, len, 0, ids, len + 1, &n_ids) == PV_OK &&
                pv_tokenizer_decode(&tok, ids, n_ids, 0, back, len + 1, &dec_len) == PV_OK &&
                dec_len == len && memcmp(back, english, len) == 0;
    for (size_t i = 0; round && i < n_ids; i++) {
        const char *p;
        size_t plen;
        pv_tokenizer_piece(&tok, ids[i], 0, &p, &plen);
        multi += plen > 1;
    }
    /* The training words make most of it whole tokens: 4.2 bytes each. */
    ok(round && n_ids > 0 && (double)len / (double)n_ids >= 3.5 && multi * 10 >= n_ids * 7,
       "%s: English round-trips in %zu tokens (%.1f bytes each, %zu of them multi-byte)",
       label, n_ids, n_ids ? (double)len / (double)n_ids : 0.0, multi);

    /* Any bytes round-trip, broken UTF-8 included. */
    uint64_t state = 7;
    int bytes_ok = ids && back;
    for (int r = 0; bytes_ok && r < 100; r++) {
        char s[64];
        size_t n = (size_t)(r % 64);
        for (size_t i = 0; i < n; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            s[i] = r % 2 ? (char)(state >> 56) : "the people ok\n"[(state >> 33) % 14];
        }
        bytes_ok = pv_tokenizer_encode(&tok, s, n, 0, ids, len + 1, &n_ids) == PV_OK &&
                   pv_tokenizer_decode(&tok, ids, n_ids, 0, back, len + 1, &dec_len) == PV_OK &&
                   dec_len == n && memcmp(back, s, n) == 0;
    }
    ok(bytes_ok, "%s: 100 random byte strings round-trip", label);

    pv_chat_message msgs[] = {{"user", "Hello there"}};
    char prompt[256];
    size_t plen = 0;
    int chat = pv_tokenizer_apply_chat(&tok, msgs, 1, 1, prompt, sizeof prompt, &plen) == PV_OK &&
               ids && pv_tokenizer_encode(&tok, prompt, plen, PV_TOKENIZE_PARSE_SPECIAL, ids,
                                          len + 1, &n_ids) == PV_OK &&
               n_ids > 4 && ids[0] == 1 && ids[n_ids - 3] == 1;
    ok(chat, "%s: a ChatML prompt encodes with <|im_start|> around the turns", label);
    free(ids);
    free(back);
    pv_tokenizer_free(&tok);
}

/* A prompt's forward pass on a loaded real-width model gives finite,
 * varied logits, and the most likely next token changes along the prompt
 * (weights that all lean one way make one token win everywhere). */
static void check_forward(const char *label, const pv_gguf *g, pv_backend *be, pv_llama *m)
{
    enum { MAX_TOKENS = 32 };
    uint32_t vocab = pv_llama_hparams_of(m)->n_vocab;
    pv_tokenizer tok;
    pv_buffer *pool = NULL;
    int32_t ids[MAX_TOKENS], seq[MAX_TOKENS] = {0}, pos[MAX_TOKENS], rows[MAX_TOKENS];
    int32_t table[1] = {0};
    size_t n = 0;
    const char *text = "The people who work here are very good at their jobs.";
    float *logits = malloc((size_t)MAX_TOKENS * vocab * sizeof *logits);
    pv_status st = pv_tokenizer_init(&tok, g);
    int have_tok = st == PV_OK;
    if (st == PV_OK)
        st = pv_tokenizer_encode(&tok, text, strlen(text), 0, ids, MAX_TOKENS, &n);
    if (st == PV_OK)
        st = pv_buffer_init(&pool, be, PV_MEM_DEVICE, pv_llama_slot_bytes(m));
    if (st == PV_OK && logits) {
        for (size_t i = 0; i < n; i++)
            pos[i] = rows[i] = (int32_t)i;
        pv_llama_batch b = {
            .n_tokens = (int32_t)n, .tokens = ids, .token_seq = seq, .token_pos = pos,
            .n_seqs = 1, .max_chunks = 1, .slot_tables = table, .kv_pool = pool, .n_slots = 1,
            .n_logits = (int32_t)n, .logit_rows = rows, .logits = logits,
        };
        st = pv_llama_forward(m, &b);
    }
    int finite = st == PV_OK && logits;
    double sum = 0, sq = 0;
    for (size_t i = 0; finite && i < n * vocab; i++) {
        finite = isfinite(logits[i]);
        sum += logits[i];
        sq += (double)logits[i] * logits[i];
    }
    double mean = finite ? sum / (double)(n * vocab) : 0;
    double sd = finite ? sqrt(sq / (double)(n * vocab) - mean * mean) : 0;
    size_t distinct = 0;
    uint32_t top[MAX_TOKENS];
    for (size_t i = 0; finite && i < n; i++) {
        top[i] = 0;
        for (uint32_t v = 1; v < vocab; v++)
            top[i] = logits[i * vocab + v] > logits[i * vocab + top[i]] ? v : top[i];
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= top[j] == top[i];
        distinct += !seen;
    }
    ok(finite && sd > 1e-3 && distinct * 3 >= n,
       "%s: a %zu-token prompt gives finite logits over %u tokens, sd %.3g, %zu different "
       "top tokens (%s)", label, n, vocab, sd, distinct, st == PV_OK ? "ok" : pv_last_error());
    free(logits);
    pv_buffer_free(pool);
    if (have_tok)
        pv_tokenizer_free(&tok);
}

/* The vocabulary the loaded copies are cut to: Llama-3-8B's full one makes
 * a 720 MB file even with one layer, several seconds here to write and
 * load. The full vocabulary is checked on narrow widths instead. */
#define LOAD_VOCAB 16384

/* Each real shape: its config holds the published dimensions; the full
 * vocabulary (on narrow widths) tokenizes; with one layer at the real
 * widths, through a file, the reader sees those dimensions, pv_llama_init
 * keeps every matrix in Q4_0 and a prompt runs forward. */
static void test_shapes(void)
{
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const struct expected_shape *e = &expected[i];
        pv_synth_config c = {0};
        pv_status st = pv_synth_config_shape(&c, e->name);
        ok(st == PV_OK && c.n_layers == e->layers && c.n_embd == e->embd &&
               c.n_heads == e->heads && c.n_kv_heads == e->kv_heads && c.n_ff == e->ff &&
               c.n_ctx == e->ctx && c.n_vocab == e->vocab && c.rope_base == e->rope_base &&
               c.norm_eps == e->norm_eps && c.tied_embeddings == e->tied &&
               c.weight_type == PV_GGML_Q4_0,
           "shape %s: %u layers, width %u, heads %u/%u, ffn %u, ctx %u, vocab %u, rope %g, "
           "eps %g, %s, Q4_0", e->name, c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.n_ff,
           c.n_ctx, c.n_vocab, (double)c.rope_base, (double)c.norm_eps,
           c.tied_embeddings ? "tied" : "untied");

        pv_synth_config narrow = c;
        narrow.n_layers = 1;
        narrow.n_embd = 64;
        narrow.n_heads = 4;
        narrow.n_kv_heads = 2;
        narrow.n_ff = 128;
        uint8_t *img = NULL;
        uint64_t size = 0;
        pv_gguf g;
        pv_llama_hparams hp;
        st = pv_synth_to_memory(&narrow, &img, &size);
        if (st == PV_OK && (st = pv_gguf_init_memory(&g, img, size)) == PV_OK) {
            st = pv_llama_hparams_read(&g, &hp);
            ok(st == PV_OK && hp.n_vocab == e->vocab, "%s, narrow: %u tokens (%s)", e->name,
               hp.n_vocab, st == PV_OK ? "ok" : pv_last_error());
            check_tokenizer(e->name, &g, e->vocab);
            pv_gguf_free(&g);
        } else {
            ok(0, "%s, narrow: written and parsed (%s)", e->name, pv_last_error());
        }
        free(img);

        c.n_layers = 1;
        c.n_vocab = LOAD_VOCAB;
        c.n_threads = 2;
        char path[] = "/tmp/pv-test-synth-XXXXXX";
        int fd = mkstemp(path);
        st = fd >= 0 ? pv_synth_write(&c, path) : PV_ERR_IO;
        if (st == PV_OK)
            st = pv_gguf_init(&g, path);
        if (!ok(st == PV_OK, "%s, 1 layer, %u tokens: written and mapped (%s)", e->name,
                LOAD_VOCAB, st == PV_OK ? "ok" : pv_last_error())) {
            if (fd >= 0)
                unlink(path);
            continue;
        }
        st = pv_llama_hparams_read(&g, &hp);
        ok(st == PV_OK && hp.n_layers == 1 && hp.n_embd == e->embd && hp.n_heads == e->heads &&
               hp.n_kv_heads == e->kv_heads && hp.n_ff == e->ff && hp.n_ctx_train == e->ctx &&
               hp.n_vocab == LOAD_VOCAB && hp.head_dim == e->embd / e->heads &&
               hp.rope_dim == hp.head_dim && hp.rope_base == e->rope_base &&
               hp.norm_eps == e->norm_eps && hp.tied_embeddings == e->tied,
           "%s read back: width %u, heads %u/%u, head dim %u, ffn %u, ctx %u, rope %g, eps %g, "
           "%s", e->name, hp.n_embd, hp.n_heads, hp.n_kv_heads, hp.head_dim, hp.n_ff,
           hp.n_ctx_train, (double)hp.rope_base, (double)hp.norm_eps,
           hp.tied_embeddings ? "tied" : "untied");
        pv_backend *be = NULL;
        pv_llama *m = NULL;
        pv_llama_options o;
        pv_llama_options_default(&o);
        o.max_batch_tokens = 32;
        o.max_logit_rows = 32;
        st = pv_backend_init(&be, "cpu", 0);
        if (st == PV_OK)
            st = pv_llama_init(&m, be, &g, &o);
        pv_llama_weight_bytes wb = {0};
        if (st == PV_OK)
            pv_llama_weight_bytes_of(m, &wb);
        uint32_t matrices = 8 + !e->tied, q4_0 = 0; /* 7 a layer, embedding, output */
        for (uint64_t t = 0; t < g.n_tensors; t++)
            q4_0 += g.tensors[t].type == PV_GGML_Q4_0;
        ok(st == PV_OK && q4_0 == matrices && wb.n_native == matrices && wb.resident == wb.file,
           "%s: pv_llama_init keeps all %u matrices in Q4_0, %llu bytes (%s)", e->name,
           wb.n_native, (unsigned long long)wb.resident, st == PV_OK ? "ok" : pv_last_error());
        if (m)
            check_forward(e->name, &g, be, m);
        pv_llama_free(m);
        pv_backend_free(be);
        pv_gguf_free(&g);
        close(fd);
        unlink(path);
    }
}

/* Every type (on the tiny model's widths, output.weight apart): each
 * tensor has the asked type and decodes to finite values; matrices spread
 * as uniform weights in +-1/sqrt(fan_in) do (RMS 0.58 of that bound), norms
 * sit near 1. */
static void test_types(void)
{
    static const int32_t types[] = {PV_GGML_Q4_0, PV_GGML_Q4_1, PV_GGML_Q8_0, PV_GGML_F16,
                                    PV_GGML_BF16, PV_GGML_F32, PV_SYNTH_MIXED_TYPES};
    static const uint32_t file_types[] = {2, 3, 7, 1, 32, 0, 3};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        pv_synth_config c;
        pv_synth_config_default(&c);
        c.n_vocab = 512; /* a trained vocabulary: "mixed" too is drawn as blocks */
        c.tied_embeddings = 0;
        c.weight_type = types[k];
        const char *tname = types[k] < 0 ? "mixed" : pv_ggml_type_name((uint32_t)types[k]);
        uint8_t *img;
        uint64_t size;
        pv_gguf g;
        pv_status st = pv_synth_to_memory(&c, &img, &size);
        if (st == PV_OK && (st = pv_gguf_init_memory(&g, img, size)) != PV_OK)
            free(img);
        if (!ok(st == PV_OK, "tiny in %s: written and parsed (%s)", tname,
                st == PV_OK ? "ok" : pv_last_error()))
            continue;
        uint32_t ft = 99;
        int typed = pv_gguf_get_u32(&g, "general.file_type", &ft) == PV_OK && ft == file_types[k];
        int values = 1;
        double min_rms = INFINITY, max_rms = 0.0, worst_max = 0.0, lean = 0.0, count = 0.0;
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const pv_gguf_tensor *t = &g.tensors[i];
            int norm = t->n_dims == 1;
            if (types[k] >= 0)
                typed = typed && t->type == (norm ? PV_GGML_F32 : (uint32_t)types[k]);
            float *x = malloc(t->n_elements * sizeof *x);
            if (!x || pv_gguf_tensor_f32(t, x, t->n_elements) != PV_OK) {
                values = 0;
                free(x);
                continue;
            }
            double bound = norm ? 1.0 : 1.0 / sqrt((double)t->ne[0]), sq = 0.0, max = 0.0;
            for (uint64_t j = 0; j < t->n_elements; j++) {
                double v = norm ? x[j] - 1.0 : x[j];
                values = values && isfinite(x[j]);
                sq += v * v;
                max = fabs(v) > max ? fabs(v) : max;
                lean += norm ? 0.0 : v / bound;
            }
            count += norm ? 0.0 : (double)t->n_elements;
            double rms = sqrt(sq / (double)t->n_elements) / bound;
            if (norm) {
                values = values && max <= 0.1001;
            } else {
                values = values && rms > 0.45 && rms < 0.72 && max / bound <= 1.27;
                min_rms = rms < min_rms ? rms : min_rms;
                max_rms = rms > max_rms ? rms : max_rms;
                worst_max = max / bound > worst_max ? max / bound : worst_max;
            }
            free(x);
        }
        ok(typed, "tiny in %s: matrices %s, norms F32, general.file_type %u", tname,
           tname, ft);
        /* the mean over ~100k weights: 0 with a standard deviation of 0.002 */
        lean /= count;
        ok(values && fabs(lean) < 0.015, "tiny in %s: finite; matrix RMS %.3f-%.3f, max %.3f "
           "and mean %+.4f of 1/sqrt(fan_in), norms 1 +- 0.1", tname, min_rms, max_rms,
           worst_max, lean);
        pv_gguf_free(&g);
        free(img);
    }
}

/* The same options give the same bytes with 1, 3 or 8 threads and through
 * a file; another seed changes the weights but not the vocabulary. */
static void test_determinism(void)
{
    pv_synth_config c;
    pv_synth_config_shape(&c, "smollm2-135m");
    c.n_layers = 1;
    c.weight_type = PV_SYNTH_MIXED_TYPES; /* every block writer, pieces of several sizes */
    uint8_t *ref = NULL, *img = NULL;
    uint64_t ref_size = 0, size = 0;
    c.n_threads = 1;
    pv_status st = pv_synth_to_memory(&c, &ref, &ref_size);
    if (!ok(st == PV_OK, "smollm2-135m, 1 layer, mixed, 1 thread (%s)",
            st == PV_OK ? "ok" : pv_last_error()))
        return;
    static const uint32_t threads[] = {1, 3, 8};
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        c.n_threads = threads[i];
        int same = pv_synth_to_memory(&c, &img, &size) == PV_OK && size == ref_size &&
                   memcmp(img, ref, size) == 0;
        ok(same, "%u threads: the same %llu bytes%s", threads[i], (unsigned long long)ref_size,
           i == 0 ? " again" : "");
        free(img);
    }
    char path[] = "/tmp/pv-test-synth-XXXXXX";
    int fd = mkstemp(path);
    c.n_threads = 2;
    int same_file = fd >= 0 && pv_synth_write(&c, path) == PV_OK;
    if (same_file) {
        img = malloc(ref_size + 1);
        FILE *f = fopen(path, "rb");
        same_file = img && f && fread(img, 1, ref_size + 1, f) == ref_size &&
                    memcmp(img, ref, ref_size) == 0;
        if (f)
            fclose(f);
        free(img);
    }
    ok(same_file, "the file pv_synth_write streams equals the memory image");
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }

    /* Random bytes never repeat a 64-byte run: a stream reused for another
     * piece of a tensor would. The embedding here spans several pieces. */
    pv_gguf g;
    int fresh = 0;
    uint64_t embd_bytes = 0;
    if (pv_gguf_init_memory(&g, ref, ref_size) == PV_OK) {
        const pv_gguf_tensor *embd = pv_gguf_find_tensor(&g, "token_embd.weight");
        embd_bytes = embd ? embd->n_bytes : 0;
        fresh = embd_bytes > (16u << 20) &&
                !memmem((const uint8_t *)embd->data + 1, embd_bytes - 1, embd->data, 64);
        pv_gguf_free(&g);
    }
    ok(fresh, "the embedding's first 64 bytes occur nowhere else in its %llu bytes",
       (unsigned long long)embd_bytes);

    c.seed = 43;
    int differs = 0;
    if (pv_synth_to_memory(&c, &img, &size) == PV_OK && size == ref_size &&
        pv_gguf_init_memory(&g, img, size) == PV_OK) {
        uint64_t head = g.data_offset, changed = 0;
        for (uint64_t i = 0; i < g.n_tensors; i++) {
            const uint8_t *other = ref + head + g.tensors[i].offset;
            changed += memcmp(g.tensors[i].data, other, g.tensors[i].n_bytes) != 0;
        }
        differs = memcmp(img, ref, head) == 0 && changed == g.n_tensors;
        pv_gguf_free(&g);
    }
    free(img);
    ok(differs, "seed 43: every tensor differs, metadata and vocabulary do not");
    free(ref);
}

static void test_errors(void)
{
    pv_synth_config c;
    ok(pv_synth_config_shape(&c, "llama3-80b") == PV_ERR_NOT_FOUND &&
           strstr(pv_last_error(), "llama3-80b") && strstr(pv_last_error(), "qwen2.5-1.5b"),
       "unknown shape refused, known ones listed: %s", pv_last_error());
    uint8_t *img;
    uint64_t size;
    pv_synth_config_shape(&c, "tiny");
    c.n_vocab = 258;
    ok(pv_synth_to_memory(&c, &img, &size) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "258"),
       "258 tokens refused (3 specials + 256 bytes): %s", pv_last_error());
    pv_synth_config_shape(&c, "tiny");
    c.weight_type = PV_GGML_Q5_0;
    ok(pv_synth_to_memory(&c, &img, &size) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "Q5_0"),
       "Q5_0 weights refused: %s", pv_last_error());
    pv_synth_config_shape(&c, "smollm2-135m");
    c.n_layers = 1;
    const char *path = "/nonexistent-pv-dir/model.gguf";
    ok(pv_synth_write(&c, path) == PV_ERR_IO && strstr(pv_last_error(), path),
       "unwritable path refused, named: %s", pv_last_error());
    size_t n = 0;
    while (pv_synth_shape_name(n))
        n++;
    ok(n == 1 + sizeof expected / sizeof expected[0] && strcmp(pv_synth_shape_name(0), "tiny") == 0,
       "%zu shapes listed, tiny first", n);
}

int main(void)
{
    test_tiny_unchanged();
    test_shapes();
    test_types();
    test_determinism();
    test_errors();
    return tap_done();
}
