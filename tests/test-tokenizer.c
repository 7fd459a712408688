/* Tokenizer and chat template: BPE on the synthetic vocabulary against
 * merges worked by hand, the SmolLM2 pre-tokenizer rules (digits alone,
 * GPT-2 split), special tokens, byte-exact round trips of random and
 * invalid UTF-8, output capacity, ChatML rendering and refusal of other
 * templates; BPE against its definition (merge the lowest-ranked pair
 * everywhere, repeat) on a vocabulary with shuffled merge ranks, and the
 * time of a 1 MiB word (quadratic merging took minutes); on the real model
 * (skipped when absent), ids recorded from the Hugging Face reference
 * (scripts/compare-tokenizer.py) and the same 1 MiB timing. */
#include <pensieve/gguf.h>
#include <pensieve/tokenizer.h>

#include "real-tokenizer.h"
#include "tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t rng_state = 777;

static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Encode text and compare with the ids of the given vocabulary strings. */
static int encodes_as(const pv_tokenizer *tok, const char *text, unsigned flags,
                      const char *const *want, size_t n_want)
{
    size_t len = strlen(text), n;
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    int good = ids && pv_tokenizer_encode(tok, text, len, flags, ids, len + 1, &n) == PV_OK &&
               n == n_want;
    for (size_t i = 0; good && i < n; i++)
        good = ids[i] == pv_tokenizer_find(tok, want[i]) && ids[i] >= 0;
    if (!good && ids) {
        tap_diag("'%s' gave %zu ids:", text, n);
        for (size_t i = 0; i < n && i < 32; i++) {
            const char *p;
            size_t pl;
            pv_tokenizer_piece(tok, ids[i], PV_DECODE_SPECIAL, &p, &pl);
            tap_diag("  %d '%.*s'", ids[i], (int)pl, p);
        }
    }
    free(ids);
    return good;
}

#define ENC(tok, text, flags, ...)                                                            \
    encodes_as(tok, text, flags, (const char *const[]){__VA_ARGS__},                         \
               sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

/* Ġ (U+0120) stands for a space in byte-level token strings; Ċ for '\n'. */
#define SP "\xc4\xa0"
#define NL "\xc4\x8a"

static void test_synth_bpe(const pv_tokenizer *tok)
{
    ok(tok->n_vocab == 293 && tok->bos_id == 1 && tok->eos_id == 2 && tok->unk_id == 0 &&
           tok->im_start_id == 1 && tok->im_end_id == 2 && !tok->add_bos,
       "synthetic vocabulary: 293 tokens, bos 1, eos/<|im_end|> 2, unk 0, add_bos false");
    /* h e l l o: "h e" (rank 1) -> he, "l l" -> ll, "ll o" -> llo, "he llo" */
    ok(ENC(tok, "hello", 0, "hello"), "'hello' merges to one token");
    /* Ġ w o r l d: "Ġ w" (13) then "o r" (17) then "Ġw or" -> Ġwor, l, d */
    ok(ENC(tok, "hello world", 0, "hello", SP "wor", "l", "d"),
       "' world' -> 'Ġwor' 'l' 'd' (merge ranks decide)");
    ok(ENC(tok, "the", 0, "t", "he") && ENC(tok, " the", 0, SP "the"),
       "'the' -> t he; ' the' -> Ġthe (rank 4 over Ġt + he)");
    /* The vocabulary has a "1 2" merge; digit splitting must never use it. */
    ok(ENC(tok, "12", 0, "1", "2") && ENC(tok, "x 12", 0, "x", SP, "1", "2"),
       "digits stand alone: '12' -> 1 2, ' 12' -> Ġ 1 2 (the '1 2' merge is unused)");
    ok(ENC(tok, "caf\xc3\xa9", 0, "c", "a", "f", "\xc3\x83\xc2\xa9"),
       "UTF-8 'é' (c3 a9) merges as byte-level 'Ã©'");
    /* The last space of a run goes with the next word, so the "Ġ Ġ" merge
     * cannot join the two spaces; at the end of the text the run is one piece. */
    ok(ENC(tok, "a  the", 0, "a", SP, SP "the") && ENC(tok, "a   ", 0, "a", SP SP, SP),
       "whitespace: 'a  the' -> a Ġ Ġthe; trailing '   ' -> ĠĠ Ġ");
    ok(ENC(tok, "x\n\ny", 0, "x", NL, NL, "y"), "'\\n\\n' before a word splits into two pieces");
    ok(ENC(tok, "<|im_start|>user", PV_TOKENIZE_PARSE_SPECIAL, "<|im_start|>", "u", "s", "er"),
       "special text parsed with PV_TOKENIZE_PARSE_SPECIAL");
    ok(ENC(tok, "<|im_end|>", 0, "<", "|", "i", "m", "_", "en", "d", "|", ">"),
       "special text is plain text without the flag");
    ok(ENC(tok, "hi", PV_TOKENIZE_ADD_BOS, "<|im_start|>", "h", "i"), "PV_TOKENIZE_ADD_BOS");
    int32_t ids[4];
    size_t n = 99;
    ok(pv_tokenizer_encode(tok, "", 0, 0, ids, 1, &n) == PV_OK && n == 0, "empty text gives no ids");
    ok(pv_tokenizer_encode(tok, "a b c d e", 9, 0, ids, 4, &n) == PV_ERR_INVALID_ARG,
       "too small an output is refused: %s", pv_last_error());
    char out[64];
    size_t len;
    int32_t chat[] = {1, pv_tokenizer_find(tok, "hello"), 2, 5000};
    ok(pv_tokenizer_decode(tok, chat, 3, 0, out, sizeof out, &len) == PV_OK && len == 5 &&
           strcmp(out, "hello") == 0, "decode hides control tokens");
    ok(pv_tokenizer_decode(tok, chat, 3, PV_DECODE_SPECIAL, out, sizeof out, &len) == PV_OK &&
           strcmp(out, "<|im_start|>hello<|im_end|>") == 0, "PV_DECODE_SPECIAL shows them");
    ok(pv_tokenizer_decode(tok, chat, 4, 0, out, sizeof out, &len) == PV_ERR_INVALID_ARG &&
           strstr(pv_last_error(), "5000"), "id out of range: %s", pv_last_error());
    ok(pv_tokenizer_decode(tok, chat, 3, 0, NULL, 0, &len) == PV_OK && len == 5 &&
           pv_tokenizer_decode(tok, chat, 3, 0, out, 5, &len) == PV_ERR_INVALID_ARG,
       "decode size query, and no room for the NUL refused");
    ok(pv_tokenizer_is_end(tok, 2) && !pv_tokenizer_is_end(tok, 1) &&
           pv_tokenizer_type(tok, 2) == PV_TOKEN_CONTROL && pv_tokenizer_type(tok, -1) == 0,
       "<|im_end|> ends generation; token types");
}

/* Random bytes (invalid UTF-8 included) and random code points: encode,
 * then decode, gives the input back byte for byte. */
static void test_round_trip(const pv_tokenizer *tok)
{
    enum { MAX = 300 };
    char text[MAX * 4], back[MAX * 4 + 1];
    int32_t ids[MAX * 4 + 1];
    int good = 1;
    for (int round = 0; round < 400 && good; round++) {
        size_t len = 0, target = rnd() % MAX;
        while (len < target) {
            uint32_t kind = rnd() % 6;
            if (kind == 0) { /* any byte */
                text[len++] = (char)(rnd() % 256);
            } else if (kind == 1) { /* ASCII words, spaces, digits */
                static const char pool[] = "hello world the 12 in on  \n\t'sX?!";
                text[len++] = pool[rnd() % (sizeof pool - 1)];
            } else { /* a code point, encoded */
                uint32_t ranges[][2] = {{0x80, 0x7ff}, {0x800, 0xd7ff}, {0xe000, 0xffff},
                                        {0x10000, 0x10ffff}};
                uint32_t *r = ranges[rnd() % 4];
                uint32_t cp = r[0] + rnd() % (r[1] - r[0] + 1);
                if (cp < 0x800) {
                    text[len++] = (char)(0xc0 | (cp >> 6));
                } else if (cp < 0x10000) {
                    text[len++] = (char)(0xe0 | (cp >> 12));
                    text[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                } else {
                    text[len++] = (char)(0xf0 | (cp >> 18));
                    text[len++] = (char)(0x80 | ((cp >> 12) & 0x3f));
                    text[len++] = (char)(0x80 | ((cp >> 6) & 0x3f));
                }
                text[len++] = (char)(0x80 | (cp & 0x3f));
            }
        }
        size_t n, back_len;
        good = pv_tokenizer_encode(tok, text, len, 0, ids, len + 1, &n) == PV_OK && n <= len &&
               pv_tokenizer_decode(tok, ids, n, 0, back, sizeof back, &back_len) == PV_OK &&
               back_len == len && memcmp(back, text, len) == 0;
        if (!good)
            tap_diag("round %d (%zu bytes) failed: %s", round, len, pv_last_error());
    }
    ok(good, "400 random texts (invalid UTF-8 included) encode and decode back byte for byte");
    static const char broken[] = "\xff\xfe\xc3(\xe2\x82\xf0\x9f\x99 ok \xed\xa0\x80 \xc0\xaf end\x80";
    size_t n, back_len;
    ok(pv_tokenizer_encode(tok, broken, sizeof broken - 1, 0, ids, sizeof broken, &n) == PV_OK &&
           pv_tokenizer_decode(tok, ids, n, 0, back, sizeof back, &back_len) == PV_OK &&
           back_len == sizeof broken - 1 && memcmp(back, broken, back_len) == 0,
       "truncated sequences, surrogates and overlong forms survive a round trip");
}

static void test_chat(const pv_tokenizer *tok)
{
    ok(tok->has_chat_template && tok->chat.default_system &&
           strcmp(tok->chat.default_system, "You are a tiny synthetic test model.") == 0,
       "synthetic ChatML template recognised, with its default system text");
    pv_chat_message user[] = {{"user", "Hi there"}};
    char out[512];
    size_t len;
    ok(pv_tokenizer_apply_chat(tok, user, 1, 1, out, sizeof out, &len) == PV_OK &&
           strcmp(out, "<|im_start|>system\nYou are a tiny synthetic test model.<|im_end|>\n"
                       "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n") == 0 &&
           len == strlen(out),
       "one user turn: default system turn, user turn, generation prompt");
    pv_chat_message conv[] = {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}};
    size_t plain_len = 0;
    ok(pv_tokenizer_apply_chat(tok, conv, 3, 0, out, sizeof out, &plain_len) == PV_OK &&
           strcmp(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n4<|im_end|>\n") == 0,
       "a system turn replaces the default; no generation prompt when not asked");
    pv_status st = pv_tokenizer_apply_chat(tok, conv, 3, 1, NULL, 0, &len);
    ok(st == PV_OK && len == plain_len + strlen("<|im_start|>assistant\n"),
       "size query gives the rendered length (%zu)", len);
    ok(pv_tokenizer_apply_chat(tok, conv, 3, 1, out, 20, &len) == PV_ERR_INVALID_ARG,
       "too small an output refused: %s", pv_last_error());
    pv_chat_message bad[] = {{"user", NULL}};
    ok(pv_tokenizer_apply_chat(tok, bad, 1, 1, out, sizeof out, &len) == PV_ERR_INVALID_ARG,
       "NULL content refused: %s", pv_last_error());
    size_t n;
    int32_t ids[128];
    ok(pv_tokenizer_apply_chat(tok, user, 1, 1, out, sizeof out, &len) == PV_OK &&
           pv_tokenizer_encode(tok, out, len, PV_TOKENIZE_PARSE_SPECIAL, ids, 128, &n) == PV_OK &&
           ids[0] == tok->im_start_id && ids[n - 1] == pv_tokenizer_find(tok, NL),
       "rendered chat encodes with <|im_start|> first");

    /* Other spellings of the same ChatML form are accepted. */
    static const char spaced[] =
        "{%- for message in messages -%}\n"
        "  {{- \"<|im_start|>\" + message.role + \"\\n\" + message.content + \"<|im_end|>\\n\" -}}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}\n"
        "  {{- '<|im_start|>assistant\\n' }}\n"
        "{%- endif %}\n";
    pv_chat_template t;
    int good = pv_chat_template_init(&t, spaced, strlen(spaced)) == PV_OK;
    ok(good && t.default_system == NULL &&
           pv_chat_template_apply(&t, user, 1, 1, out, sizeof out, &len) == PV_OK &&
           strcmp(out, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n") == 0,
       "whitespace-controlled ChatML without a default system turn: %s",
       good ? "ok" : pv_last_error());
    if (good)
        pv_chat_template_free(&t);

    static const struct { const char *what, *src; } unsupported[] = {
        {"Llama-2 [INST] template",
         "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
         "message['content'] + ' [/INST]' }}{% else %}{{ message['content'] }}{% endif %}{% endfor %}"},
        {"Zephyr-style tags",
         "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
         "eos_token }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"},
        {"ChatML without the generation prompt",
         "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
         "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"},
        {"an unclosed tag", "{% for message in messages %}{{ 'x' "},
        {"a filter", "{% for message in messages %}{{ message['content'] | trim }}{% endfor %}"},
        {"an empty template", ""},
    };
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
        st = pv_chat_template_init(&t, unsupported[i].src, strlen(unsupported[i].src));
        ok(st == PV_ERR_UNSUPPORTED, "%s is UNSUPPORTED: %s", unsupported[i].what, pv_last_error());
        if (st == PV_OK)
            pv_chat_template_free(&t);
    }
}

/* Mutated templates (bytes flipped, dropped, duplicated) are recognised or
 * refused as UNSUPPORTED, never crash; a recognised one renders. */
static void test_template_fuzz(void)
{
    static const char base[] =
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nDefault.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + "
        "message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    size_t n = sizeof base - 1;
    int recognised = 0, refused = 0, other = 0;
    pv_chat_message user[] = {{"user", "hi"}};
    for (int round = 0; round < 3000; round++) {
        char *t = malloc(n + 8);
        size_t len = n;
        memcpy(t, base, n);
        for (int k = 0, edits = 1 + (int)(rnd() % 3); k < edits; k++) {
            size_t at = rnd() % len;
            uint32_t op = rnd() % 3;
            if (op == 0) {
                t[at] = (char)(rnd() % 256);
            } else if (op == 1 && len > 1) {
                memmove(t + at, t + at + 1, len - at - 1);
                len--;
            } else if (len < n + 8) {
                memmove(t + at + 1, t + at, len - at);
                len++;
            }
        }
        pv_chat_template ct;
        pv_status st = pv_chat_template_init(&ct, t, len);
        if (st == PV_OK) {
            char out[256];
            size_t out_len;
            recognised++;
            other += pv_chat_template_apply(&ct, user, 1, 1, out, sizeof out, &out_len) != PV_OK;
            pv_chat_template_free(&ct);
        } else if (st == PV_ERR_UNSUPPORTED) {
            refused++;
        } else {
            other++;
        }
        free(t);
    }
    ok(other == 0 && refused > 0, "3000 mutated templates: %d recognised and rendered, %d "
       "UNSUPPORTED, %d other outcomes", recognised, refused, other);
}

/* A tokenizer from a file holding only the given model and pre keys. */
static pv_status init_from_keys(const char *model, const char *pre)
{
    pv_gguf_writer w;
    uint8_t *img = NULL;
    uint64_t size;
    pv_gguf g;
    pv_tokenizer tok;
    pv_status st = pv_gguf_writer_init(&w, 3, 0);
    if (st == PV_OK)
        st = pv_gguf_writer_add_string(&w, "tokenizer.ggml.model", model);
    if (st == PV_OK && pre)
        st = pv_gguf_writer_add_string(&w, "tokenizer.ggml.pre", pre);
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, &img, &size);
    pv_gguf_writer_free(&w);
    if (st == PV_OK && (st = pv_gguf_init_memory(&g, img, size)) == PV_OK) {
        if ((st = pv_tokenizer_init(&tok, &g)) == PV_OK)
            pv_tokenizer_free(&tok);
        pv_gguf_free(&g);
    }
    free(img);
    return st;
}

static void test_unsupported(void)
{
    ok(init_from_keys("llama", "default") == PV_ERR_UNSUPPORTED &&
           strstr(pv_last_error(), "'llama'"), "SentencePiece ('llama') model: %s", pv_last_error());
    ok(init_from_keys("gpt2", "qwen2") == PV_ERR_UNSUPPORTED && strstr(pv_last_error(), "'qwen2'"),
       "unknown pre-tokenizer: %s", pv_last_error());
    ok(init_from_keys("gp\x1bt2\n", NULL) == PV_ERR_UNSUPPORTED &&
           strstr(pv_last_error(), "'gp\\x1bt2\\n'"),
       "control bytes in the model name are shown escaped: %s", pv_last_error());
    ok(init_from_keys("gpt2", NULL) == PV_ERR_FORMAT &&
           strstr(pv_last_error(), "tokenizer.ggml.tokens"),
       "no vocabulary: %s", pv_last_error());
}

/* CPU seconds, so that other jobs on a shared machine do not count. */
static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A megabyte of random letters is one pre-token. Rescanning it for the best
 * pair after each merge took 86-145 s on SmolLM2 (quadratic); the heap
 * takes about 0.5 s. The bound leaves room for sanitizer builds. */
#define LONG_WORD_BYTES (1u << 20)
#define LONG_WORD_MAX_S 5.0

static int encode_long_word(const pv_tokenizer *tok, const char *what)
{
    char *text = malloc(LONG_WORD_BYTES);
    int32_t *ids = malloc((LONG_WORD_BYTES + 1) * sizeof *ids);
    size_t n = 0;
    double t = 0;
    pv_status st = PV_ERR_OUT_OF_MEMORY;
    if (text && ids) {
        for (size_t i = 0; i < LONG_WORD_BYTES; i++)
            text[i] = (char)('a' + rnd() % 26);
        t = cpu_seconds();
        st = pv_tokenizer_encode(tok, text, LONG_WORD_BYTES, 0, ids, LONG_WORD_BYTES + 1, &n);
        t = cpu_seconds() - t;
    }
    free(text);
    free(ids);
    return ok(st == PV_OK && t < LONG_WORD_MAX_S, "%s: 1 MiB of random letters (one word) "
              "encodes to %zu ids in %.3f s of CPU (bound %.0f s)", what, n, t, LONG_WORD_MAX_S);
}

/* A vocabulary of letters, all 676 letter pairs and 1500 random triples,
 * with the merges in random rank order: often a triple's merge ranks before
 * the merge of the pair inside it, which a well-formed table never does. */
enum { MM_PAIRS = 26 * 26, MM_TRIPLES = 1500, MM_VOCAB = 26 + MM_PAIRS + MM_TRIPLES };

typedef struct mm_merge {
    int32_t left, right, rank, merged;
} mm_merge;

typedef struct many_merges {
    char tokens[MM_VOCAB][4];
    char merges[MM_PAIRS + MM_TRIPLES][6]; /* "left right", by rank */
    mm_merge by_pair[MM_PAIRS + MM_TRIPLES]; /* sorted by (left, right) */
    int n_tokens, n_merges;
} many_merges;

static int mm_find(const many_merges *m, const char *s)
{
    for (int i = 0; i < m->n_tokens; i++)
        if (strcmp(m->tokens[i], s) == 0)
            return i;
    return -1;
}

static int cmp_pair(const void *a, const void *b)
{
    const mm_merge *x = a, *y = b;
    if (x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return x->right < y->right ? -1 : x->right > y->right;
}

static void mm_build(many_merges *m)
{
    m->n_tokens = m->n_merges = 0;
    for (int a = 0; a < 26; a++) /* letter ids are 0..25 */
        snprintf(m->tokens[m->n_tokens++], 4, "%c", 'a' + a);
    for (int a = 0; a < 26; a++)
        for (int b = 0; b < 26; b++) {
            snprintf(m->tokens[m->n_tokens++], 4, "%c%c", 'a' + a, 'a' + b);
            snprintf(m->merges[m->n_merges++], 6, "%c %c", 'a' + a, 'a' + b);
        }
    while (m->n_tokens < MM_VOCAB) {
        char t[4] = {(char)('a' + rnd() % 26), (char)('a' + rnd() % 26), (char)('a' + rnd() % 26), 0};
        if (mm_find(m, t) >= 0)
            continue;
        memcpy(m->tokens[m->n_tokens++], t, 4);
        if (rnd() % 2)
            snprintf(m->merges[m->n_merges++], 6, "%c%c %c", t[0], t[1], t[2]);
        else
            snprintf(m->merges[m->n_merges++], 6, "%c %c%c", t[0], t[1], t[2]);
    }
    for (int i = m->n_merges - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint32_t)(i + 1));
        char t[6];
        memcpy(t, m->merges[i], 6);
        memcpy(m->merges[i], m->merges[j], 6);
        memcpy(m->merges[j], t, 6);
    }
    for (int r = 0; r < m->n_merges; r++) {
        char left[6], joined[6];
        const char *sp = strchr(m->merges[r], ' ');
        snprintf(left, sizeof left, "%.*s", (int)(sp - m->merges[r]), m->merges[r]);
        snprintf(joined, sizeof joined, "%s%s", left, sp + 1);
        m->by_pair[r] = (mm_merge){mm_find(m, left), mm_find(m, sp + 1), r, mm_find(m, joined)};
    }
    qsort(m->by_pair, (size_t)m->n_merges, sizeof m->by_pair[0], cmp_pair);
}

static const mm_merge *mm_lookup(const many_merges *m, int32_t left, int32_t right)
{
    mm_merge key = {left, right, 0, 0};
    return bsearch(&key, m->by_pair, (size_t)m->n_merges, sizeof key, cmp_pair);
}

/* The definition, slowly: find the lowest-ranked adjacent pair, merge all
 * its non-overlapping occurrences left to right, repeat. */
static size_t mm_reference(const many_merges *m, const char *text, size_t len, int32_t *ids)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        ids[n++] = text[i] - 'a';
    for (;;) {
        int32_t best = INT32_MAX;
        for (size_t i = 0; i + 1 < n; i++) {
            const mm_merge *p = mm_lookup(m, ids[i], ids[i + 1]);
            if (p && p->rank < best)
                best = p->rank;
        }
        if (best == INT32_MAX)
            return n;
        size_t out = 0;
        for (size_t i = 0; i < n;) {
            const mm_merge *p = i + 1 < n ? mm_lookup(m, ids[i], ids[i + 1]) : NULL;
            if (p && p->rank == best) {
                ids[out++] = p->merged;
                i += 2;
            } else {
                ids[out++] = ids[i++];
            }
        }
        n = out;
    }
}

static void test_many_merges(void)
{
    static many_merges m;
    mm_build(&m);
    const char *tokens[MM_VOCAB], *merges[MM_PAIRS + MM_TRIPLES];
    for (int i = 0; i < m.n_tokens; i++)
        tokens[i] = m.tokens[i];
    for (int i = 0; i < m.n_merges; i++)
        merges[i] = m.merges[i];
    pv_gguf_writer w;
    uint8_t *img = NULL;
    uint64_t size;
    pv_gguf g;
    pv_tokenizer tok;
    pv_status st = pv_gguf_writer_init(&w, 3, 0);
    if (st == PV_OK)
        st = pv_gguf_writer_add_string(&w, "tokenizer.ggml.model", "gpt2");
    if (st == PV_OK)
        st = pv_gguf_writer_add_strings(&w, "tokenizer.ggml.tokens", tokens, (uint64_t)m.n_tokens);
    if (st == PV_OK)
        st = pv_gguf_writer_add_strings(&w, "tokenizer.ggml.merges", merges, (uint64_t)m.n_merges);
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, &img, &size);
    pv_gguf_writer_free(&w);
    if (st == PV_OK && (st = pv_gguf_init_memory(&g, img, size)) == PV_OK) {
        st = pv_tokenizer_init(&tok, &g);
        pv_gguf_free(&g);
    }
    free(img);
    if (!ok(st == PV_OK, "vocabulary of %d letter tokens and %d shuffled merges%s%s", m.n_tokens,
            m.n_merges, st ? ": " : "", st ? pv_last_error() : ""))
        return;
    enum { LEN = 40 };
    char text[LEN];
    int32_t got[LEN + 1], want[LEN];
    int same = 1, round;
    for (round = 0; round < 2000 && same; round++) {
        size_t len = 1 + rnd() % LEN, n;
        uint32_t letters = 2 + rnd() % 25; /* few letters repeat pairs more */
        for (size_t i = 0; i < len; i++)
            text[i] = (char)('a' + rnd() % letters);
        size_t n_want = mm_reference(&m, text, len, want);
        same = pv_tokenizer_encode(&tok, text, len, 0, got, len + 1, &n) == PV_OK && n == n_want &&
               memcmp(got, want, n * sizeof *got) == 0;
        if (!same)
            tap_diag("'%.*s': %zu ids, the definition gives %zu", (int)len, text, n, n_want);
    }
    ok(same, "%d random words: the ids of the merge-by-rank definition", round);
    encode_long_word(&tok, "shuffled merges");
    static const char dummy[1];
    size_t n;
    ok(pv_tokenizer_encode(&tok, dummy, (size_t)PV_TOKENIZE_MAX_BYTES + 1, 0, NULL, 0, &n) ==
           PV_ERR_INVALID_ARG && strstr(pv_last_error(), "67108865") &&
           strstr(pv_last_error(), "67108864"),
       "a text over PV_TOKENIZE_MAX_BYTES is refused: %s", pv_last_error());
    pv_tokenizer_free(&tok);
}

static void test_real_model(void)
{
    pv_tokenizer tok;
    if (real_tokenizer_load(&tok) != 1)
        return;
    pv_status st;
    ok(tok.n_vocab == 49152 && tok.bos_id == 1 && tok.eos_id == 2 && tok.im_start_id == 1 &&
           tok.im_end_id == 2 && tok.has_chat_template && tok.chat.default_system &&
           strncmp(tok.chat.default_system, "You are a helpful AI assistant named SmolLM", 43) == 0,
       "49152 tokens, <|im_start|> 1, <|im_end|> 2, ChatML with SmolLM's default system turn");
    /* Ids from Hugging Face tokenizers on the same vocabulary and merges. */
    static const char text[] = "Hello, world! It's 2024: caf\xc3\xa9, \xe4\xbd\xa0\xe5\xa5\xbd, "
                               "\xf0\x9f\x99\x82.";
    static const int32_t want[] = {19556, 28, 905, 17, 657, 506, 216, 34, 32, 34, 36,
                                   42, 37366, 28, 216, 18645, 250, 48392, 138, 28, 47526, 30};
    int32_t ids[256];
    size_t n = 0;
    st = pv_tokenizer_encode(&tok, text, strlen(text), 0, ids, 256, &n);
    ok(st == PV_OK && n == sizeof want / sizeof want[0] && memcmp(ids, want, sizeof want) == 0,
       "multilingual text with emoji: ids identical to the reference (%zu ids)", n);
    pv_chat_message user[] = {{"user", "Hi there"}};
    char chat[512];
    size_t len;
    static const int32_t chat_tail[] = {1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198};
    size_t k = sizeof chat_tail / sizeof chat_tail[0];
    ok(pv_tokenizer_apply_chat(&tok, user, 1, 1, chat, sizeof chat, &len) == PV_OK &&
           pv_tokenizer_encode(&tok, chat, len, PV_TOKENIZE_PARSE_SPECIAL, ids, 256, &n) == PV_OK &&
           n > k && memcmp(ids + n - k, chat_tail, sizeof chat_tail) == 0 && ids[0] == 1,
       "chat prompt ends in the reference ids of the user turn and generation prompt");
    /* Broken UTF-8 on the real vocabulary: no crash, and what the
     * vocabulary covers decodes back. */
    char junk[512], back[1024];
    int good = 1;
    for (int round = 0; round < 200 && good; round++) {
        size_t jl = rnd() % sizeof junk;
        for (size_t i = 0; i < jl; i++)
            junk[i] = (char)(rnd() % 256);
        int32_t many[513];
        good = pv_tokenizer_encode(&tok, junk, jl, PV_TOKENIZE_PARSE_SPECIAL, many, jl + 1, &n) ==
                   PV_OK &&
               pv_tokenizer_decode(&tok, many, n, PV_DECODE_SPECIAL, back, sizeof back, &len) ==
                   PV_OK && len <= jl;
    }
    ok(good, "200 random byte strings encode and decode on the real vocabulary");
    encode_long_word(&tok, "SmolLM2");
    pv_tokenizer_free(&tok);
}

int main(void)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *img;
    uint64_t size;
    pv_gguf g;
    pv_tokenizer tok;
    if (pv_synth_to_memory(&c, &img, &size) != PV_OK || pv_gguf_init_memory(&g, img, size) != PV_OK ||
        pv_tokenizer_init(&tok, &g) != PV_OK) {
        ok(0, "synthetic model and tokenizer: %s", pv_last_error());
        return tap_done();
    }
    pv_gguf_free(&g);
    free(img);
    test_synth_bpe(&tok);
    test_round_trip(&tok);
    test_chat(&tok);
    test_template_fuzz();
    pv_tokenizer_free(&tok);
    test_unsupported();
    test_many_merges();
    test_real_model();
    return tap_done();
}
