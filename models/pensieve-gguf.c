/* pensieve-gguf: inspect GGUF files with the project's own reader, or write
 * synthetic models.
 *   pensieve-gguf info FILE      metadata, tensor types (counts), hyperparameters
 *   pensieve-gguf tensors FILE   one line per tensor: name, type, shape, offset
 *   pensieve-gguf synth FILE [--shape S] [--type T] [--seed N] [--layers N]
 *                [--threads N]   write a synthetic model: the tiny test
 *                                model by default, or a real model's shape
 *                                (llama3-8b, qwen2.5-1.5b, smollm2-135m)
 *                                with random weights of one type (q4_0,
 *                                q4_1, q8_0, f16, bf16, f32; "mixed" is the
 *                                tiny model's mix); --layers shrinks the
 *                                depth, keeping the widths
 *   pensieve-gguf tokenize FILE  encode stdin lines, each hex-encoded text
 *                                (any bytes), one line of token ids each
 *                                (special-token text is not parsed)
 *   pensieve-gguf tokenize-special FILE   the same, parsing special tokens
 *   pensieve-gguf chat FILE      render stdin lines "role<TAB>hex content
 *                                <TAB>role<TAB>..." with the chat template
 *                                and a generation prompt; prints hex
 *   pensieve-gguf bench FILE [--json]  median times of parsing, dequantising
 *                                every tensor, tokenizer init and encoding */
#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

static void print_value(const pv_gguf_kv *kv)
{
    switch (kv->type) {
    case PV_GGUF_STRING: {
        /* long strings (the chat template) are cut; newlines shown as \n */
        uint64_t n = kv->str_len > 72 ? 72 : kv->str_len;
        putchar('"');
        for (uint64_t i = 0; i < n; i++)
            kv->str[i] == '\n' ? (void)fputs("\\n", stdout) : (void)putchar(kv->str[i]);
        printf("\"%s", kv->str_len > n ? "..." : "");
        break;
    }
    case PV_GGUF_ARRAY:
        printf("[%s x %" PRIu64 "]", pv_gguf_type_name(kv->array_type), kv->array_len);
        break;
    case PV_GGUF_FLOAT32:
    case PV_GGUF_FLOAT64:
        printf("%g", kv->v.f64);
        break;
    case PV_GGUF_BOOL:
        printf("%s", kv->v.u64 ? "true" : "false");
        break;
    case PV_GGUF_INT8: case PV_GGUF_INT16: case PV_GGUF_INT32: case PV_GGUF_INT64:
        printf("%" PRId64, kv->v.i64);
        break;
    default:
        printf("%" PRIu64, kv->v.u64);
        break;
    }
}

static int info(const pv_gguf *g)
{
    printf("file: %s\nversion: %u\nalignment: %u\ndata offset: %" PRIu64 "\nsize: %" PRIu64
           " bytes\n\nmetadata (%" PRIu64 " keys):\n", g->path, g->version, g->alignment,
           g->data_offset, g->size, g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        printf("  %-42s %-8s ", g->kv[i].key, pv_gguf_type_name(g->kv[i].type));
        print_value(&g->kv[i]);
        putchar('\n');
    }
    printf("\ntensors: %" PRIu64 "\n", g->n_tensors);
    uint64_t count[64] = {0}, bytes[64] = {0}, elems[64] = {0};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        uint32_t t = g->tensors[i].type < 64 ? g->tensors[i].type : 63;
        count[t]++;
        bytes[t] += g->tensors[i].n_bytes;
        elems[t] += g->tensors[i].n_elements;
    }
    printf("  %-6s %8s %12s %14s  %s\n", "type", "tensors", "elements", "bytes", "dequantised");
    for (uint32_t t = 0; t < 64; t++)
        if (count[t])
            printf("  %-6s %8" PRIu64 " %12" PRIu64 " %14" PRIu64 "  %s\n", pv_ggml_type_name(t),
                   count[t], elems[t], bytes[t], pv_ggml_type_dequantizable(t) ? "yes" : "no");
    pv_llama_hparams hp;
    if (pv_llama_hparams_read(g, &hp) == PV_OK)
        printf("\nllama: vocab %u, ctx %u, embd %u, layers %u, heads %u, kv heads %u, ffn %u, "
               "head dim %u, rope dim %u, rope base %g, norm eps %g, %s embeddings\n",
               hp.n_vocab, hp.n_ctx_train, hp.n_embd, hp.n_layers, hp.n_heads, hp.n_kv_heads,
               hp.n_ff, hp.head_dim, hp.rope_dim, (double)hp.rope_base, (double)hp.norm_eps,
               hp.tied_embeddings ? "tied" : "separate output");
    else
        printf("\nllama: %s\n", pv_last_error());
    pv_tokenizer tok;
    if (pv_tokenizer_init(&tok, g) == PV_OK) {
        printf("tokenizer: %u tokens, bos %d, eos %d, unk %d, pad %d, <|im_start|> %d, "
               "<|im_end|> %d, add_bos %d, chat template %s\n", tok.n_vocab, tok.bos_id,
               tok.eos_id, tok.unk_id, tok.pad_id, tok.im_start_id, tok.im_end_id, tok.add_bos,
               tok.has_chat_template ? "ChatML" : "not recognised");
        pv_tokenizer_free(&tok);
    } else {
        printf("tokenizer: %s\n", pv_last_error());
    }
    return 0;
}

static int tensors(const pv_gguf *g)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const pv_gguf_tensor *t = &g->tensors[i];
        printf("%-32s %-5s [", t->name, pv_ggml_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++)
            printf("%s%" PRIu64, d ? ", " : "", t->ne[d]);
        printf("] offset %" PRIu64 " bytes %" PRIu64 "\n", t->offset, t->n_bytes);
    }
    return 0;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode hex pairs in place; returns the byte count. */
static size_t unhex(char *s, size_t n)
{
    size_t out = 0;
    for (size_t i = 0; i + 1 < n; i += 2) {
        int hi = hex_value(s[i]), lo = hex_value(s[i + 1]);
        if (hi < 0 || lo < 0)
            break;
        s[out++] = (char)(hi << 4 | lo);
    }
    return out;
}

static int chat(const pv_gguf *g)
{
    pv_tokenizer tok;
    if (pv_tokenizer_init(&tok, g) != PV_OK) {
        fprintf(stderr, "%s\n", pv_last_error());
        return 1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int rc = 0;
    while (rc == 0 && (got = getline(&line, &line_cap, stdin)) >= 0) {
        pv_chat_message msgs[64];
        size_t n = 0;
        line[strcspn(line, "\n")] = '\0';
        char *rest = line;
        while (rest && *rest && n < 64) {
            char *role = strsep(&rest, "\t");
            char *content = rest ? strsep(&rest, "\t") : role + strlen(role);
            content[unhex(content, strlen(content))] = '\0';
            msgs[n++] = (pv_chat_message){role, content};
        }
        size_t len;
        char *out = NULL;
        if (pv_tokenizer_apply_chat(&tok, msgs, n, 1, NULL, 0, &len) != PV_OK ||
            !(out = malloc(len + 1)) ||
            pv_tokenizer_apply_chat(&tok, msgs, n, 1, out, len + 1, &len) != PV_OK) {
            fprintf(stderr, "%s\n", pv_last_error());
            rc = 1;
        } else {
            for (size_t i = 0; i < len; i++)
                printf("%02x", (unsigned char)out[i]);
            putchar('\n');
        }
        free(out);
    }
    free(line);
    pv_tokenizer_free(&tok);
    return rc;
}

static int tokenize(const pv_gguf *g, unsigned flags)
{
    pv_tokenizer tok;
    if (pv_tokenizer_init(&tok, g) != PV_OK) {
        fprintf(stderr, "%s\n", pv_last_error());
        return 1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int rc = 0;
    while (rc == 0 && (got = getline(&line, &line_cap, stdin)) >= 0) {
        size_t n = unhex(line, (size_t)got);
        int32_t *ids = malloc((n + 1) * sizeof *ids);
        size_t n_ids;
        if (!ids || pv_tokenizer_encode(&tok, line, n, flags, ids, n + 1, &n_ids) != PV_OK) {
            fprintf(stderr, "%s\n", ids ? pv_last_error() : "out of memory");
            rc = 1;
        } else {
            for (size_t i = 0; i < n_ids; i++)
                printf("%s%d", i ? " " : "", ids[i]);
            putchar('\n');
        }
        free(ids);
    }
    free(line);
    pv_tokenizer_free(&tok);
    return rc;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Decode every tensor to f32 or f16 once; returns the element count. */
static uint64_t decode_all(const pv_gguf *g, int to_f16)
{
    uint64_t elems = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const pv_gguf_tensor *t = &g->tensors[i];
        void *out = malloc(t->n_elements * (to_f16 ? 2 : 4));
        if (!out)
            continue;
        if ((to_f16 ? pv_gguf_tensor_f16(t, out, t->n_elements)
                    : pv_gguf_tensor_f32(t, out, t->n_elements)) == PV_OK)
            elems += t->n_elements;
        free(out);
    }
    return elems;
}

static int bench(const char *path, int json)
{
    enum { RUNS = 7, STEPS = 5 };
    static const char *const names[STEPS] = {"open and parse", "dequantise all to f32",
                                             "dequantise all to f16", "tokenizer init",
                                             "encode 1 MiB"};
    static const char sample[] =
        "Hello, world! It's 2024: caf\xc3\xa9, \xe4\xbd\xa0\xe5\xa5\xbd, \xf0\x9f\x99\x82. "
        "The quick brown fox jumps over the lazy dog; numbers 3.14159 and 1,000,000.\n";
    size_t text_len = 0, cap = 1u << 20;
    char *text = malloc(cap);
    int32_t *ids = malloc((cap + 1) * sizeof *ids);
    if (!text || !ids) {
        free(text);
        free(ids);
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    while (text_len + sizeof sample - 1 <= cap) {
        memcpy(text + text_len, sample, sizeof sample - 1);
        text_len += sizeof sample - 1;
    }
    double t[STEPS][RUNS];
    uint64_t elems = 0;
    size_t n_ids = 0;
    int rc = 0;
    for (int r = 0; r < RUNS && rc == 0; r++) {
        pv_gguf g;
        pv_tokenizer tok;
        double a = seconds();
        if (pv_gguf_init(&g, path) != PV_OK) {
            fprintf(stderr, "%s\n", pv_last_error());
            rc = 1;
            break;
        }
        t[0][r] = seconds() - a;
        a = seconds();
        elems = decode_all(&g, 0);
        t[1][r] = seconds() - a;
        a = seconds();
        decode_all(&g, 1);
        t[2][r] = seconds() - a;
        a = seconds();
        if (pv_tokenizer_init(&tok, &g) != PV_OK) {
            fprintf(stderr, "%s\n", pv_last_error());
            pv_gguf_free(&g);
            rc = 1;
            break;
        }
        t[3][r] = seconds() - a;
        a = seconds();
        pv_tokenizer_encode(&tok, text, text_len, 0, ids, cap + 1, &n_ids);
        t[4][r] = seconds() - a;
        pv_tokenizer_free(&tok);
        pv_gguf_free(&g);
    }
    free(text);
    free(ids);
    if (rc)
        return rc;
    double median[STEPS];
    for (int k = 0; k < STEPS; k++) {
        qsort(t[k], RUNS, sizeof t[k][0], cmp_double);
        median[k] = t[k][RUNS / 2];
    }
    if (json) {
        printf("{\"file\": \"%s\", \"runs\": %d, \"elements\": %" PRIu64
               ", \"encode_bytes\": %zu, \"encode_tokens\": %zu, \"median_s\": {", path, RUNS,
               elems, text_len, n_ids);
        for (int k = 0; k < STEPS; k++)
            printf("%s\"%s\": %.6f", k ? ", " : "", names[k], median[k]);
        printf("}}\n");
        return 0;
    }
    printf("%-24s %12s  (median of %d runs)\n", "step", "ms", RUNS);
    for (int k = 0; k < STEPS; k++)
        printf("%-24s %12.1f\n", names[k], median[k] * 1e3);
    printf("%" PRIu64 " tensor elements; f32 decode writes %.2f GB/s; encode %.1f MB/s, "
           "%zu tokens (%.2f M tokens/s)\n", elems, (double)elems * 4 / median[1] / 1e9,
           (double)text_len / median[4] / 1e6, n_ids, (double)n_ids / median[4] / 1e6);
    return 0;
}

/* GGUF type of a --type argument ("q4_0", "F16", ...; "mixed"), or -2. */
static int32_t parse_type(const char *name)
{
    static const int32_t types[] = {PV_GGML_F32, PV_GGML_F16, PV_GGML_BF16, PV_GGML_Q8_0,
                                    PV_GGML_Q4_0, PV_GGML_Q4_1};
    if (strcasecmp(name, "mixed") == 0)
        return PV_SYNTH_MIXED_TYPES;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcasecmp(name, pv_ggml_type_name((uint32_t)types[i])) == 0)
            return types[i];
    return -2;
}

static int parse_count(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v > max)
        return 0;
    *out = v;
    return 1;
}

static int synth(int argc, char **argv)
{
    const char *path = argv[2], *shape = "tiny";
    /* the shape first: the other options change it */
    for (int i = 3; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "--shape") == 0)
            shape = argv[i + 1];
    pv_synth_config c;
    if (pv_synth_config_shape(&c, shape) != PV_OK) {
        fprintf(stderr, "%s\n", pv_last_error());
        return 2;
    }
    for (int i = 3; i < argc; i += 2) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t v = 0;
        int good = val != NULL;
        if (good && strcmp(opt, "--shape") == 0)
            continue;
        if (good && strcmp(opt, "--type") == 0)
            good = (c.weight_type = parse_type(val)) != -2;
        else if (good && strcmp(opt, "--seed") == 0)
            good = parse_count(val, UINT64_MAX, &c.seed);
        else if (good && strcmp(opt, "--layers") == 0)
            good = parse_count(val, UINT32_MAX, &v) && v > 0 && (c.n_layers = (uint32_t)v);
        else if (good && strcmp(opt, "--threads") == 0)
            good = parse_count(val, 1024, &v) && v > 0 && (c.n_threads = (uint32_t)v);
        else
            good = 0;
        if (!good) {
            fprintf(stderr, "synth: bad option '%s%s%s' (--shape NAME, --type q4_0|q4_1|q8_0|"
                    "f16|bf16|f32|mixed, --seed N, --layers N, --threads N)\n", opt,
                    val ? " " : "", val ? val : "");
            return 2;
        }
    }
    double t0 = seconds();
    if (pv_synth_write(&c, path) != PV_OK) {
        fprintf(stderr, "%s\n", pv_last_error());
        return 1;
    }
    double dt = seconds() - t0;
    struct stat sb;
    uint64_t bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    printf("%s: %s shape, %u layers, %s weights, seed %" PRIu64 ": %" PRIu64 " bytes in %.2f s "
           "(%.2f GB/s)\n", path, shape, c.n_layers,
           c.weight_type == PV_SYNTH_MIXED_TYPES ? "mixed" : pv_ggml_type_name((uint32_t)c.weight_type),
           c.seed, bytes, dt, dt > 0 ? (double)bytes / dt / 1e9 : 0.0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "synth") == 0)
        return synth(argc, argv);
    static const char *const commands[] = {"info", "tensors", "tokenize",
                                           "tokenize-special", "chat", "bench"};
    int known = 0;
    for (size_t i = 0; argc == 3 && i < sizeof commands / sizeof commands[0]; i++)
        known |= strcmp(argv[1], commands[i]) == 0;
    if (argc == 4 && strcmp(argv[1], "bench") == 0 && strcmp(argv[3], "--json") == 0)
        return bench(argv[2], 1);
    if (known && strcmp(argv[1], "bench") == 0)
        return bench(argv[2], 0);
    if (!known) {
        char shapes[256] = "";
        for (size_t i = 0; pv_synth_shape_name(i); i++)
            snprintf(shapes + strlen(shapes), sizeof shapes - strlen(shapes), "%s%s", i ? "|" : "",
                     pv_synth_shape_name(i));
        fprintf(stderr, "usage: %s info|tensors|tokenize|tokenize-special|chat FILE\n"
                "       %s bench FILE [--json]\n"
                "       %s synth FILE [--shape %s]\n"
                "             [--type q4_0|q4_1|q8_0|f16|bf16|f32|mixed] [--seed N] [--layers N]"
                " [--threads N]\n", argv[0], argv[0], argv[0], shapes);
        return 2;
    }
    pv_gguf g;
    if (pv_gguf_init(&g, argv[2]) != PV_OK) {
        fprintf(stderr, "%s\n", pv_last_error());
        return 1;
    }
    int rc;
    if (strcmp(argv[1], "info") == 0)
        rc = info(&g);
    else if (strcmp(argv[1], "tensors") == 0)
        rc = tensors(&g);
    else if (strcmp(argv[1], "chat") == 0)
        rc = chat(&g);
    else
        rc = tokenize(&g, strcmp(argv[1], "tokenize") == 0 ? 0 : PV_TOKENIZE_PARSE_SPECIAL);
    pv_gguf_free(&g);
    return rc;
}
