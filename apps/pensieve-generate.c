/* pensieve-generate: one completion from a GGUF Llama model, greedy or
 * sampled, on any built backend. With --chat the prompt is one user turn in
 * the model's chat template and the assistant's answer is printed. Timings
 * go to stderr: prefill and decode tokens per second. */
#include <pensieve/llama.h>
#include <pensieve/tokenizer.h>

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


typedef struct options {
    const char *model, *prompt, *backend;
    int chat, n_predict, ctx;
    int print_ids; /* print token ids instead of text */
    int top1;      /* print the argmax after every prompt position, then stop */
    uint64_t seed;
    float temperature, top_p;
    pv_dtype kv_dtype;
    pv_llama_weights weights;
    int verbose;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pensieve-generate --prompt TEXT [options]\n"
            "  --model PATH        GGUF file (default: the one scripts/get-model installs)\n"
            "  --prompt TEXT       the prompt\n"
            "  --chat              wrap the prompt as one user turn in the chat template\n"
            "  --backend NAME      cpu, opencl or cuda (default cpu)\n"
            "  -n, --n-predict N   tokens to generate (default 64)\n"
            "  --ctx N             context length (default 2048)\n"
            "  --seed S            sampling seed (default 1)\n"
            "  --temperature T     0 = greedy (default 0)\n"
            "  --top-p P           nucleus mass when sampling (default 0.95)\n"
            "  --kv f32|f16        KV pool type (default f32)\n"
            "  --weights native|f32  weights as in the file (default) or widened to f32\n"
            "  -v, --verbose       print the weights' resident and file bytes\n"
            "  --ids               print the prompt's and the generated token ids, not text\n"
            "  --top1              print the most likely next token after every prompt\n"
            "                      position (teacher forcing) and stop; -n does not apply\n");
}

/* strtol and strtod take "" as 0 and skip leading spaces: a value must
 * start with its number and be nothing else. */
static int starts_number(const char *s)
{
    return *s && !isspace((unsigned char)*s);
}

static int parse_int(const char *s, const char *what, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!starts_number(s) || errno || *end || v < lo || v > hi) {
        fprintf(stderr, "pensieve-generate: %s '%s' is not an integer in [%ld, %ld]\n", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, const char *what, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!starts_number(s) || errno || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "pensieve-generate: %s '%s' is not a number in [%g, %g]\n", what, s, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    enum { OPT_MODEL = 256, OPT_PROMPT, OPT_CHAT, OPT_BACKEND, OPT_CTX, OPT_SEED, OPT_TEMP,
           OPT_TOPP, OPT_KV, OPT_IDS, OPT_TOP1, OPT_WEIGHTS };
    static const struct option longopts[] = {
        {"model", required_argument, 0, OPT_MODEL},   {"prompt", required_argument, 0, OPT_PROMPT},
        {"chat", no_argument, 0, OPT_CHAT},           {"backend", required_argument, 0, OPT_BACKEND},
        {"n-predict", required_argument, 0, 'n'},     {"ctx", required_argument, 0, OPT_CTX},
        {"seed", required_argument, 0, OPT_SEED},     {"temperature", required_argument, 0, OPT_TEMP},
        {"top-p", required_argument, 0, OPT_TOPP},    {"kv", required_argument, 0, OPT_KV},
        {"weights", required_argument, 0, OPT_WEIGHTS}, {"verbose", no_argument, 0, 'v'},
        {"ids", no_argument, 0, OPT_IDS},             {"top1", no_argument, 0, OPT_TOP1},
        {"help", no_argument, 0, 'h'},                {0, 0, 0, 0},
    };
    *o = (options){.backend = "cpu", .n_predict = 64, .ctx = 2048, .seed = 1,
                   .temperature = 0.0f, .top_p = 0.95f, .kv_dtype = PV_F32};
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "n:hv", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: o->model = optarg; break;
        case OPT_PROMPT: o->prompt = optarg; break;
        case OPT_CHAT: o->chat = 1; break;
        case OPT_IDS: o->print_ids = 1; break;
        case OPT_TOP1: o->top1 = 1; break;
        case OPT_BACKEND: o->backend = optarg; break;
        case 'n':
            if (parse_int(optarg, "-n", 0, 1 << 20, &v)) return -1;
            o->n_predict = (int)v;
            break;
        case OPT_CTX:
            if (parse_int(optarg, "--ctx", 1, 1 << 20, &v)) return -1;
            o->ctx = (int)v;
            break;
        case OPT_SEED:
            if (parse_int(optarg, "--seed", 0, INT32_MAX, &v)) return -1;
            o->seed = (uint64_t)v;
            break;
        case OPT_TEMP:
            if (parse_float(optarg, "--temperature", 0.0, 100.0, &o->temperature)) return -1;
            break;
        case OPT_TOPP:
            if (parse_float(optarg, "--top-p", 1e-6, 1.0, &o->top_p)) return -1;
            break;
        case OPT_WEIGHTS:
            if (strcmp(optarg, "native") == 0) o->weights = PV_LLAMA_WEIGHTS_NATIVE;
            else if (strcmp(optarg, "f32") == 0) o->weights = PV_LLAMA_WEIGHTS_F32;
            else {
                fprintf(stderr, "pensieve-generate: --weights '%s' is neither native nor f32\n", optarg);
                return -1;
            }
            break;
        case 'v': o->verbose = 1; break;
        case OPT_KV:
            if (strcmp(optarg, "f32") == 0) o->kv_dtype = PV_F32;
            else if (strcmp(optarg, "f16") == 0) o->kv_dtype = PV_F16;
            else {
                fprintf(stderr, "pensieve-generate: --kv '%s' is neither f32 nor f16\n", optarg);
                return -1;
            }
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc || !o->prompt) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The uniform draw handed to the sampler, so every backend picks alike. */
static float next_uniform(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (float)((*state >> 40) * (1.0 / 16777216.0));
}

typedef struct generator {
    pv_backend *be;
    pv_llama *model;
    pv_tokenizer tok;
    pv_buffer *pool;
    int32_t *tables; /* [n_layers][1][max_chunks]: slot = layer * max_chunks + chunk */
    int32_t max_chunks;
    int64_t n_slots;
} generator;

static void generator_free(generator *g)
{
    free(g->tables);
    pv_buffer_free(g->pool);
    pv_llama_free(g->model);
    pv_tokenizer_free(&g->tok);
    pv_backend_free(g->be);
}

static pv_status generator_init(generator *g, const options *o, const char *path)
{
    memset(g, 0, sizeof *g);
    pv_gguf file;
    pv_status st = pv_gguf_init(&file, path);
    if (st != PV_OK)
        return st;
    pv_llama_options lo;
    pv_llama_options_default(&lo);
    lo.kv_dtype = o->kv_dtype;
    lo.weights = o->weights;
    if ((st = pv_tokenizer_init(&g->tok, &file)) == PV_OK &&
        (st = pv_backend_init(&g->be, o->backend, 0)) == PV_OK)
        st = pv_llama_init(&g->model, g->be, &file, &lo);
    pv_gguf_free(&file);
    if (st != PV_OK)
        return st;
    const pv_llama_hparams *hp = pv_llama_hparams_of(g->model);
    if (o->verbose) {
        pv_llama_weight_bytes wb;
        pv_llama_weight_bytes_of(g->model, &wb);
        fprintf(stderr,
                "weights: %s, %.1f MB resident for %.1f MB of GGUF tensors (%.2fx); %u tensors in their "
                "type, %u widened to f32\n",
                pv_llama_weights_name(lo.weights), wb.resident / 1e6, wb.file / 1e6,
                wb.file ? (double)wb.resident / (double)wb.file : 0.0, wb.n_native, wb.n_widened);
    }
    g->max_chunks = (o->ctx + lo.chunk_tokens - 1) / lo.chunk_tokens;
    g->n_slots = (int64_t)hp->n_layers * g->max_chunks;
    if ((st = pv_buffer_init(&g->pool, g->be, PV_MEM_DEVICE,
                             (uint64_t)g->n_slots * pv_llama_slot_bytes(g->model))) != PV_OK)
        return st;
    g->tables = malloc(sizeof(int32_t) * (size_t)g->n_slots);
    if (!g->tables)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-generate: slot tables");
    for (int64_t i = 0; i < g->n_slots; i++)
        g->tables[i] = (int32_t)i;
    return PV_OK;
}

/* Run tokens[from, to) at their positions; the last one's logits land in the
 * model's logits buffer. */
static pv_status run_span(generator *g, const int32_t *tokens, int from, int to)
{
    const int32_t max_batch = pv_llama_options_of(g->model)->max_batch_tokens;
    int32_t *seq = calloc((size_t)max_batch, sizeof *seq), *pos = malloc(sizeof *pos * (size_t)max_batch);
    if (!seq || !pos) {
        free(seq);
        free(pos);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pensieve-generate: batch arrays");
    }
    pv_status st = PV_OK;
    for (int start = from; start < to && st == PV_OK; start += max_batch) {
        int n = to - start < max_batch ? to - start : max_batch;
        for (int i = 0; i < n; i++)
            pos[i] = start + i;
        int32_t last = n - 1;
        pv_llama_batch b = {
            .n_tokens = n, .tokens = tokens + start, .token_seq = seq, .token_pos = pos,
            .n_seqs = 1, .max_chunks = g->max_chunks, .slot_tables = g->tables, .kv_pool = g->pool,
            .n_slots = g->n_slots, .n_logits = start + n == to ? 1 : 0, .logit_rows = &last,
        };
        st = pv_llama_forward(g->model, &b);
    }
    free(seq);
    free(pos);
    return st;
}

static pv_status pick_token(generator *g, const options *o, uint64_t *rng, int32_t *id)
{
    const pv_llama_hparams *hp = pv_llama_hparams_of(g->model);
    if (o->temperature <= 0.0f) {
        pv_argmax_args a = {.rows = 1, .cols = hp->n_vocab, .x = pv_llama_logits_buffer(g->model), .out = id};
        return pv_argmax(g->be, &a);
    }
    float u = next_uniform(rng);
    pv_sample_args s = {.rows = 1, .cols = hp->n_vocab, .temperature = o->temperature,
                        .top_p = o->top_p, .logits = pv_llama_logits_buffer(g->model), .u = &u,
                        .out = id};
    return pv_sample_top_p(g->be, &s);
}

static void print_ids(const char *label, const int32_t *ids, size_t n)
{
    printf("%s:", label);
    for (size_t i = 0; i < n; i++)
        printf(" %d", ids[i]);
    printf("\n");
}

/* Teacher-forced pass over the prompt: the argmax after every position. */
static pv_status prompt_top1(generator *g, const int32_t *tokens, int n, int32_t *top1)
{
    const pv_llama_options *lo = pv_llama_options_of(g->model);
    const int span = lo->max_batch_tokens < lo->max_logit_rows ? lo->max_batch_tokens : lo->max_logit_rows;
    int32_t seq[span], pos[span], rows[span];
    pv_status st = PV_OK;
    for (int start = 0; start < n && st == PV_OK; start += span) {
        int len = n - start < span ? n - start : span;
        for (int i = 0; i < len; i++) {
            seq[i] = 0;
            pos[i] = start + i;
            rows[i] = i;
        }
        pv_llama_batch b = {
            .n_tokens = len, .tokens = tokens + start, .token_seq = seq, .token_pos = pos,
            .n_seqs = 1, .max_chunks = g->max_chunks, .slot_tables = g->tables, .kv_pool = g->pool,
            .n_slots = g->n_slots, .n_logits = len, .logit_rows = rows,
        };
        pv_argmax_args a = {.rows = len, .cols = pv_llama_hparams_of(g->model)->n_vocab,
                            .x = pv_llama_logits_buffer(g->model), .out = top1 + start};
        if ((st = pv_llama_forward(g->model, &b)) == PV_OK)
            st = pv_argmax(g->be, &a);
    }
    return st;
}

static int fail(const char *what, pv_status st)
{
    fflush(stdout); /* whatever was printed comes first, on its own line */
    fprintf(stderr, "pensieve-generate: %s: %s: %s\n", what, pv_status_str(st), pv_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    options o;
    if (parse_args(argc, argv, &o))
        return 2;
    char default_path[4096];
    const char *path = o.model;
    if (!path) {
        pv_status st = pv_default_model_path(default_path, sizeof default_path);
        if (st != PV_OK)
            return fail("default model path", st);
        path = default_path;
    }
    generator g;
    pv_status st = generator_init(&g, &o, path);
    if (st != PV_OK) {
        generator_free(&g);
        return fail("setup", st);
    }

    /* The text the model sees: the raw prompt, or a one-turn chat. */
    char *text = NULL;
    size_t text_len = strlen(o.prompt);
    unsigned flags = 0;
    if (o.chat) {
        pv_chat_message msg = {.role = "user", .content = o.prompt};
        if ((st = pv_tokenizer_apply_chat(&g.tok, &msg, 1, 1, NULL, 0, &text_len)) == PV_OK &&
            !(text = malloc(text_len + 1)))
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "chat text");
        if (st == PV_OK)
            st = pv_tokenizer_apply_chat(&g.tok, &msg, 1, 1, text, text_len + 1, &text_len);
        flags = PV_TOKENIZE_PARSE_SPECIAL;
    } else if (g.tok.add_bos) {
        flags = PV_TOKENIZE_ADD_BOS;
    }
    /* --top1 only reads the prompt: -n does not apply. */
    const int n_predict = o.top1 ? 0 : o.n_predict;
    int32_t *tokens = NULL;
    size_t n_prompt = 0;
    if (st == PV_OK && !(tokens = malloc(sizeof *tokens * (text_len + 1 + (size_t)n_predict))))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "token array");
    if (st == PV_OK)
        st = pv_tokenizer_encode(&g.tok, text ? text : o.prompt, text_len, flags, tokens,
                                 text_len + 1, &n_prompt);
    free(text);
    if (st == PV_OK && (n_prompt == 0 || n_prompt + (size_t)n_predict > (size_t)o.ctx))
        st = pv_error(PV_ERR_INVALID_ARG, "prompt of %zu tokens + %d to generate must be in [1, --ctx %d]",
                      n_prompt, n_predict, o.ctx);
    if (st != PV_OK) {
        free(tokens);
        generator_free(&g);
        return fail("prompt", st);
    }

    if (o.print_ids || o.top1)
        print_ids("prompt", tokens, n_prompt);
    if (o.top1) {
        int32_t *top1 = malloc(sizeof *top1 * n_prompt);
        st = top1 ? prompt_top1(&g, tokens, (int)n_prompt, top1)
                  : pv_error(PV_ERR_OUT_OF_MEMORY, "top1 array");
        if (st == PV_OK)
            print_ids("top1", top1, n_prompt);
        free(top1);
        free(tokens);
        generator_free(&g);
        return st == PV_OK ? 0 : fail("top1", st);
    }

    uint64_t rng = o.seed * 0x9e3779b97f4a7c15ull + 1;
    /* Each timed span ends with pv_backend_finish: OpenCL and CUDA queue the
     * work and return, and the wait would otherwise fall into pick_token,
     * outside the clock (OpenCL on PoCL then "decoded" 40x faster than it
     * did). */
    double t0 = now_s();
    st = run_span(&g, tokens, 0, (int)n_prompt);
    if (st == PV_OK)
        st = pv_backend_finish(g.be);
    double t_prefill = now_s() - t0, t_decode = 0;
    if (st != PV_OK) { /* no rates: nothing was computed */
        free(tokens);
        generator_free(&g);
        return fail("prefill", st);
    }
    int n = (int)n_prompt, generated = 0, decoded = 0;
    while (st == PV_OK && generated < n_predict) {
        int32_t id;
        if ((st = pick_token(&g, &o, &rng, &id)) != PV_OK || pv_tokenizer_is_end(&g.tok, id))
            break;
        const char *piece;
        size_t piece_len;
        if ((st = pv_tokenizer_piece(&g.tok, id, 0, &piece, &piece_len)) != PV_OK)
            break;
        if (!o.print_ids) {
            fwrite(piece, 1, piece_len, stdout);
            fflush(stdout);
        }
        tokens[n] = id;
        generated++;
        if (generated == n_predict)
            break;
        double t1 = now_s();
        if ((st = run_span(&g, tokens, n, n + 1)) != PV_OK || (st = pv_backend_finish(g.be)) != PV_OK)
            break;
        t_decode += now_s() - t1;
        decoded++;
        n++;
    }
    if (o.print_ids)
        print_ids("generated", tokens + n_prompt, (size_t)generated);
    else
        printf("\n");
    /* The answer and its newline reach stdout before anything on stderr, so
     * the two never share a line when both go to one terminal or file. */
    fflush(stdout);
    int rc = 0;
    if (st != PV_OK)
        rc = fail("generation", st);
    /* Decode rate over the decode steps that ran: each token after the first
     * needs one, and the first comes from the prefill. */
    fprintf(stderr, "prompt %zu tokens: %.1f tokens/s; generated %d tokens", n_prompt,
            n_prompt / t_prefill, generated);
    if (decoded > 0)
        fprintf(stderr, ": %.1f tokens/s", decoded / t_decode);
    fprintf(stderr, " (%s)\n", o.backend);
    free(tokens);
    generator_free(&g);
    return rc;
}
