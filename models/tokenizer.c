/* Byte-level BPE as GPT-2-style models use it:
 *   1. special-token text is cut out (with PV_TOKENIZE_PARSE_SPECIAL);
 *   2. the rest is pre-tokenised: for "smollm", every numeric character is
 *      its own piece, and the runs between are split by the GPT-2 regex;
 *   3. each piece's bytes start as byte tokens, and the lowest-ranked merge
 *      among adjacent pairs is applied until none applies.
 * The split regexes run in PCRE2 (UTF + Unicode properties). Invalid UTF-8
 * is cut out before any regex sees it; each invalid byte is a piece alone. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pensieve/tokenizer.h>

#include "models/byte-level.h"

#include <inttypes.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* White_Space as Unicode (and the Rust regex crate the reference tokenizers
 * use) defines it: \p{Z} plus tab, LF, VT, FF, CR and NEL. PCRE2's own \s
 * leaves out NEL, so spell the class out. */
#define WS "\\t\\n\\x0b\\f\\r\\x{85}\\p{Z}"
static const char gpt2_split[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";
/* One numeric character, or a run of anything else. */
static const char digit_split[] = "\\p{N}|\\P{N}+";

typedef struct hash_entry {
    uint64_t key; /* token: index into the string table + 1; merge: left << 32 | right, + 1 */
    int32_t value, extra;
} hash_entry;

typedef struct hash_table {
    hash_entry *slots;
    uint64_t mask;
} hash_table;

struct pv_tokenizer_impl {
    char **text;          /* vocabulary strings, NUL-terminated */
    uint32_t *text_len;
    char **piece;         /* decoded bytes */
    uint32_t *piece_len;
    int32_t *type;
    hash_table by_text;   /* vocabulary string -> id (key = id + 1) */
    hash_table merges;    /* (left, right) -> rank, merged id */
    int32_t byte_token[256]; /* -1 where the vocabulary lacks the byte */
    int32_t *specials;    /* control and user-defined ids, longest text first */
    uint32_t n_specials;
    uint8_t special_first[256]; /* bytes some special token's text starts with */
    pcre2_code *split;    /* GPT-2 split */
    pcre2_code *digits;   /* NULL unless the pre-tokenizer splits digits */
    char chat_error[512];
};

/* ---- hash tables ------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int table_init(hash_table *t, uint64_t n)
{
    uint64_t size = 16;
    while (size < 2 * n)
        size *= 2;
    t->slots = calloc(size, sizeof *t->slots);
    t->mask = size - 1;
    return t->slots != NULL;
}

static int32_t find_text(const struct pv_tokenizer_impl *im, const char *s, size_t n)
{
    const hash_table *t = &im->by_text;
    for (uint64_t i = hash_bytes(s, n) & t->mask;; i = (i + 1) & t->mask) {
        const hash_entry *e = &t->slots[i];
        if (e->key == 0)
            return -1;
        uint32_t id = (uint32_t)(e->key - 1);
        if (im->text_len[id] == n && memcmp(im->text[id], s, n) == 0)
            return (int32_t)id;
    }
}

/* Insert id under its text unless that text is already there (first wins). */
static void insert_text(struct pv_tokenizer_impl *im, uint32_t id)
{
    hash_table *t = &im->by_text;
    for (uint64_t i = hash_bytes(im->text[id], im->text_len[id]) & t->mask;; i = (i + 1) & t->mask) {
        hash_entry *e = &t->slots[i];
        if (e->key == 0) {
            e->key = (uint64_t)id + 1;
            return;
        }
        uint32_t other = (uint32_t)(e->key - 1);
        if (im->text_len[other] == im->text_len[id] &&
            memcmp(im->text[other], im->text[id], im->text_len[id]) == 0)
            return;
    }
}

static const hash_entry *find_merge(const struct pv_tokenizer_impl *im, int32_t left, int32_t right)
{
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    const hash_table *t = &im->merges;
    for (uint64_t i = hash_u64(key) & t->mask;; i = (i + 1) & t->mask) {
        const hash_entry *e = &t->slots[i];
        if (e->key == 0)
            return NULL;
        if (e->key == key)
            return e;
    }
}

static void insert_merge(struct pv_tokenizer_impl *im, int32_t left, int32_t right, int32_t rank,
                         int32_t merged)
{
    uint64_t key = (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
    hash_table *t = &im->merges;
    for (uint64_t i = hash_u64(key) & t->mask;; i = (i + 1) & t->mask) {
        hash_entry *e = &t->slots[i];
        if (e->key == key)
            return; /* a repeated merge keeps its first (lowest) rank */
        if (e->key == 0) {
            e->key = key;
            e->value = rank;
            e->extra = merged;
            return;
        }
    }
}

/* ---- init -------------------------------------------------------------------- */

/* Decode a vocabulary string of the byte-level alphabet to bytes. A code
 * point outside the alphabet is kept as its UTF-8 (no byte-level vocabulary
 * has one in a normal token, but a file may). */
static uint32_t decode_byte_level(const char *s, size_t n, char *out)
{
    uint32_t len = 0;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = pv_utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (k == 0) {
            out[len++] = s[i++];
            continue;
        }
        int b = pv_byte_level_byte(cp);
        if (b >= 0) {
            out[len++] = (char)b;
        } else {
            memcpy(out + len, s + i, k);
            len += (uint32_t)k;
        }
        i += k;
    }
    return len;
}

static pv_status compile(const char *pattern, pcre2_code **out)
{
    int err;
    PCRE2_SIZE at;
    *out = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                         &at, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return pv_error(PV_ERR_BACKEND, "PCRE2 cannot compile the split regex at %zu: %s",
                        (size_t)at, (const char *)msg);
    }
    /* JIT is an optimisation: matching works the same without it. */
    pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    return PV_OK;
}

static int32_t optional_id(const pv_gguf *g, const char *key, uint32_t n_vocab, pv_status *st)
{
    if (!pv_gguf_find(g, key))
        return -1;
    uint32_t v;
    if ((*st = pv_gguf_get_u32(g, key, &v)) != PV_OK)
        return -1;
    if (v >= n_vocab) {
        *st = pv_error(PV_ERR_FORMAT, "%s: %s = %u is outside the vocabulary (%u tokens)",
                       g->path, key, v, n_vocab);
        return -1;
    }
    return (int32_t)v;
}

typedef struct special_order {
    uint32_t len;
    int32_t id;
} special_order;

/* Longest text first, so "<|im_start|>" wins over any special it starts with. */
static int cmp_special(const void *a, const void *b)
{
    const special_order *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static pv_status load_vocab(pv_tokenizer *tok, const pv_gguf *g)
{
    struct pv_tokenizer_impl *im = tok->impl;
    const pv_gguf_kv *tokens = pv_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tokens || tokens->type != PV_GGUF_ARRAY || tokens->array_type != PV_GGUF_STRING)
        return pv_error(PV_ERR_FORMAT, "%s: tokenizer.ggml.tokens is missing or not a string array",
                        g->path);
    if (tokens->array_len == 0 || tokens->array_len > INT32_MAX)
        return pv_error(PV_ERR_FORMAT, "%s: vocabulary of %" PRIu64 " tokens (must be 1..%d)",
                        g->path, tokens->array_len, INT32_MAX);
    uint32_t n = (uint32_t)tokens->array_len;
    tok->n_vocab = n;
    im->text = calloc(n, sizeof *im->text);
    im->text_len = calloc(n, sizeof *im->text_len);
    im->piece = calloc(n, sizeof *im->piece);
    im->piece_len = calloc(n, sizeof *im->piece_len);
    im->type = calloc(n, sizeof *im->type);
    if (!im->text || !im->text_len || !im->piece || !im->piece_len || !im->type ||
        !table_init(&im->by_text, n))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: tables for %u tokens", g->path, n);
    const pv_gguf_kv *types = pv_gguf_find(g, "tokenizer.ggml.token_type");
    if (types && (types->type != PV_GGUF_ARRAY || types->array_len != n))
        return pv_error(PV_ERR_FORMAT, "%s: tokenizer.ggml.token_type must be an array of %u "
                        "integers", g->path, n);
    pv_status st;
    for (uint32_t id = 0; id < n; id++) {
        const char *s;
        uint64_t len;
        if ((st = pv_gguf_array_string(tokens, id, &s, &len)) != PV_OK)
            return st;
        int64_t type = PV_TOKEN_NORMAL;
        if (types && (st = pv_gguf_array_int(types, id, &type)) != PV_OK)
            return st;
        im->type[id] = (int32_t)type;
        im->text[id] = malloc(len + 1);
        im->piece[id] = malloc(len + 1);
        if (!im->text[id] || !im->piece[id])
            return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: token %u", g->path, id);
        memcpy(im->text[id], s, len);
        im->text[id][len] = '\0';
        im->text_len[id] = (uint32_t)len;
        /* Control and user-defined tokens are plain text ("<|im_end|>");
         * the others are in the byte-level alphabet. */
        if (type == PV_TOKEN_NORMAL || type == PV_TOKEN_BYTE) {
            im->piece_len[id] = decode_byte_level(s, len, im->piece[id]);
        } else {
            memcpy(im->piece[id], s, len);
            im->piece_len[id] = (uint32_t)len;
        }
        im->piece[id][im->piece_len[id]] = '\0';
        insert_text(im, id);
        if (type == PV_TOKEN_CONTROL || type == PV_TOKEN_USER_DEFINED)
            im->n_specials++;
    }
    for (unsigned b = 0; b < 256; b++) {
        char buf[4];
        size_t k = pv_utf8_put(pv_byte_level_codepoint((uint8_t)b), buf);
        im->byte_token[b] = find_text(im, buf, k);
    }
    im->specials = malloc((im->n_specials ? im->n_specials : 1) * sizeof *im->specials);
    special_order *order = malloc((im->n_specials ? im->n_specials : 1) * sizeof *order);
    if (!im->specials || !order) {
        free(order);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: %u special tokens", g->path, im->n_specials);
    }
    uint32_t k = 0;
    for (uint32_t id = 0; id < n; id++)
        if ((im->type[id] == PV_TOKEN_CONTROL || im->type[id] == PV_TOKEN_USER_DEFINED) &&
            im->text_len[id] > 0)
            order[k++] = (special_order){im->text_len[id], (int32_t)id};
    qsort(order, k, sizeof *order, cmp_special);
    for (uint32_t i = 0; i < k; i++) {
        im->specials[i] = order[i].id;
        im->special_first[(uint8_t)im->text[order[i].id][0]] = 1;
    }
    im->n_specials = k;
    free(order);
    return PV_OK;
}

static pv_status load_merges(pv_tokenizer *tok, const pv_gguf *g)
{
    struct pv_tokenizer_impl *im = tok->impl;
    const pv_gguf_kv *merges = pv_gguf_find(g, "tokenizer.ggml.merges");
    if (!merges || merges->type != PV_GGUF_ARRAY || merges->array_type != PV_GGUF_STRING)
        return pv_error(PV_ERR_FORMAT, "%s: tokenizer.ggml.merges is missing or not a string array",
                        g->path);
    if (merges->array_len > INT32_MAX || !table_init(&im->merges, merges->array_len))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: table for %" PRIu64 " merges", g->path,
                        merges->array_len);
    char *joined = NULL;
    pv_status st = PV_OK;
    for (uint64_t r = 0; r < merges->array_len && st == PV_OK; r++) {
        const char *s;
        uint64_t len;
        if ((st = pv_gguf_array_string(merges, r, &s, &len)) != PV_OK)
            break;
        const char *sp = memchr(s, ' ', len);
        if (!sp || sp == s || sp == s + len - 1) {
            st = pv_error(PV_ERR_FORMAT, "%s: merge %" PRIu64 " '%s' is not 'left right'",
                          g->path, r, pv_printable(s, len));
            break;
        }
        size_t left_len = (size_t)(sp - s), right_len = len - left_len - 1;
        int32_t left = find_text(im, s, left_len);
        int32_t right = find_text(im, sp + 1, right_len);
        char *p = realloc(joined, left_len + right_len + 1);
        if (!p) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "%s: merge %" PRIu64, g->path, r);
            break;
        }
        joined = p;
        memcpy(joined, s, left_len);
        memcpy(joined + left_len, sp + 1, right_len);
        int32_t merged = find_text(im, joined, left_len + right_len);
        if (left < 0 || right < 0 || merged < 0) {
            st = pv_error(PV_ERR_FORMAT, "%s: merge %" PRIu64 " '%s' names a token that is not "
                          "in the vocabulary", g->path, r, pv_printable(s, len));
            break;
        }
        insert_merge(im, left, right, (int32_t)r, merged);
    }
    free(joined);
    return st;
}

static pv_status load_pre_tokenizer(pv_tokenizer *tok, const pv_gguf *g)
{
    struct pv_tokenizer_impl *im = tok->impl;
    /* Without tokenizer.ggml.pre, GPT-2's own split applies. */
    const char *model, *pre = "gpt2";
    uint64_t model_len, pre_len = 4;
    pv_status st = pv_gguf_get_string(g, "tokenizer.ggml.model", &model, &model_len);
    if (st != PV_OK)
        return st;
    if (model_len != 4 || memcmp(model, "gpt2", 4) != 0)
        return pv_error(PV_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported "
                        "(only 'gpt2', byte-level BPE)", g->path,
                        pv_printable(model, model_len));
    if (pv_gguf_find(g, "tokenizer.ggml.pre") &&
        (st = pv_gguf_get_string(g, "tokenizer.ggml.pre", &pre, &pre_len)) != PV_OK)
        return st;
#define PRE_IS(name) (pre_len == sizeof(name) - 1 && memcmp(pre, name, pre_len) == 0)
    int split_digits;
    if (PRE_IS("smollm"))
        split_digits = 1;
    else if (PRE_IS("gpt2"))
        split_digits = 0;
    else
        return pv_error(PV_ERR_UNSUPPORTED, "%s: pre-tokenizer '%s' is not supported "
                        "(known: smollm, gpt2)", g->path,
                        pv_printable(pre, pre_len));
#undef PRE_IS
    if ((st = compile(gpt2_split, &im->split)) != PV_OK)
        return st;
    if (split_digits && (st = compile(digit_split, &im->digits)) != PV_OK)
        return st;
    return PV_OK;
}

pv_status pv_tokenizer_init(pv_tokenizer *tok, const pv_gguf *g)
{
    if (!tok || !g)
        return pv_error(PV_ERR_INVALID_ARG, "pv_tokenizer_init: NULL %s", tok ? "gguf" : "tokenizer");
    memset(tok, 0, sizeof *tok);
    tok->impl = calloc(1, sizeof *tok->impl);
    if (!tok->impl)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "tokenizer state");
    pv_status st = load_pre_tokenizer(tok, g);
    if (st == PV_OK)
        st = load_vocab(tok, g);
    if (st == PV_OK)
        st = load_merges(tok, g);
    if (st == PV_OK) {
        tok->bos_id = optional_id(g, "tokenizer.ggml.bos_token_id", tok->n_vocab, &st);
        if (st == PV_OK)
            tok->eos_id = optional_id(g, "tokenizer.ggml.eos_token_id", tok->n_vocab, &st);
        if (st == PV_OK)
            tok->unk_id = optional_id(g, "tokenizer.ggml.unknown_token_id", tok->n_vocab, &st);
        if (st == PV_OK)
            tok->pad_id = optional_id(g, "tokenizer.ggml.padding_token_id", tok->n_vocab, &st);
    }
    if (st == PV_OK && pv_gguf_find(g, "tokenizer.ggml.add_bos_token"))
        st = pv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &tok->add_bos);
    if (st != PV_OK) {
        pv_tokenizer_free(tok);
        return st;
    }
    tok->im_start_id = pv_tokenizer_find(tok, "<|im_start|>");
    tok->im_end_id = pv_tokenizer_find(tok, "<|im_end|>");
    const char *tmpl;
    uint64_t tmpl_len;
    if (pv_gguf_find(g, "tokenizer.chat_template") == NULL) {
        snprintf(tok->impl->chat_error, sizeof tok->impl->chat_error,
                 "%s: no tokenizer.chat_template", g->path);
    } else if (pv_gguf_get_string(g, "tokenizer.chat_template", &tmpl, &tmpl_len) != PV_OK ||
               pv_chat_template_init(&tok->chat, tmpl, (size_t)tmpl_len) != PV_OK) {
        snprintf(tok->impl->chat_error, sizeof tok->impl->chat_error, "%s: %s", g->path,
                 pv_last_error());
    } else {
        tok->has_chat_template = 1;
    }
    pv_clear_error();
    return PV_OK;
}

void pv_tokenizer_free(pv_tokenizer *tok)
{
    if (!tok)
        return;
    struct pv_tokenizer_impl *im = tok->impl;
    if (im) {
        for (uint32_t i = 0; i < tok->n_vocab; i++) {
            if (im->text)
                free(im->text[i]);
            if (im->piece)
                free(im->piece[i]);
        }
        free(im->text);
        free(im->text_len);
        free(im->piece);
        free(im->piece_len);
        free(im->type);
        free(im->by_text.slots);
        free(im->merges.slots);
        free(im->specials);
        pcre2_code_free(im->split);
        pcre2_code_free(im->digits);
        free(im);
    }
    pv_chat_template_free(&tok->chat);
    memset(tok, 0, sizeof *tok);
}

/* ---- encode ----------------------------------------------------------------- */

/* A candidate merge of two adjacent symbols, valid while both still hold
 * the ids it was made for. Symbols are nodes of a list over the piece's
 * byte positions, so `left` also orders candidates left to right. */
typedef struct pair_entry {
    int32_t rank;
    uint32_t left;
    int32_t left_id, right_id;
} pair_entry;

typedef struct pair_list {
    pair_entry *v;
    size_t n, cap;
} pair_list;

typedef struct encoder {
    const struct pv_tokenizer_impl *im;
    int32_t *ids;
    size_t cap, n;
    /* scratch for one piece, sized for the whole text: symbol ids (-1 once
     * merged into the symbol on its left) and list links */
    int32_t *sym;
    uint32_t *next, *prev;
    pair_list heap;               /* min-heap by (rank, left) */
    pair_list pending;            /* pairs made by the merges of the current rank */
    pcre2_match_data *split_md;
    pcre2_match_data *digit_md;
} encoder;

static pv_status push(encoder *e, int32_t id)
{
    if (e->n >= e->cap)
        return pv_error(PV_ERR_INVALID_ARG, "encode: output holds %zu ids, more are needed "
                        "(len + 1 always suffices)", e->cap);
    e->ids[e->n++] = id;
    return PV_OK;
}

static pv_status list_add(pair_list *l, pair_entry p)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        pair_entry *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "encode: %zu merge candidates", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return PV_OK;
}

static int pair_less(const pair_entry *a, const pair_entry *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static pv_status heap_push(pair_list *h, pair_entry p)
{
    pv_status st = list_add(h, p);
    if (st != PV_OK)
        return st;
    for (size_t i = h->n - 1; i > 0;) {
        size_t up = (i - 1) / 2;
        if (!pair_less(&h->v[i], &h->v[up]))
            break;
        pair_entry t = h->v[i];
        h->v[i] = h->v[up];
        h->v[up] = t;
        i = up;
    }
    return PV_OK;
}

static void sift_down(pair_list *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && pair_less(&h->v[l], &h->v[m]))
            m = l;
        if (r < h->n && pair_less(&h->v[r], &h->v[m]))
            m = r;
        if (m == i)
            return;
        pair_entry t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
}

static pair_entry heap_pop(pair_list *h)
{
    pair_entry top = h->v[0];
    h->v[0] = h->v[--h->n];
    sift_down(h, 0);
    return top;
}

/* Add `more` to the heap: one by one when they are few, else appended and
 * the whole heap rebuilt in linear time (a long run of one repeated pair,
 * like a megabyte of spaces, makes half a million at once). */
static pv_status heap_add_all(pair_list *h, const pair_list *more)
{
    pv_status st = PV_OK;
    if (more->n < h->n / 8 + 16) {
        for (size_t i = 0; i < more->n && st == PV_OK; i++)
            st = heap_push(h, more->v[i]);
        return st;
    }
    for (size_t i = 0; i < more->n && st == PV_OK; i++)
        st = list_add(h, more->v[i]);
    for (size_t i = h->n / 2; i-- > 0;)
        sift_down(h, i);
    return st;
}

/* Queue the pair starting at node `left` (which has a right neighbour) in
 * `pending` if the merge table has it. */
static pv_status add_pair(encoder *e, uint32_t left)
{
    int32_t a = e->sym[left], b = e->sym[e->next[left]];
    const hash_entry *m = find_merge(e->im, a, b);
    return m ? list_add(&e->pending, (pair_entry){m->value, left, a, b}) : PV_OK;
}

/* BPE over one pre-token: start from byte tokens, apply the lowest-ranked
 * merge (all its non-overlapping occurrences, left to right) until none
 * applies. A byte the vocabulary has no token for is dropped, as the
 * reference tokenizers do (SmolLM2 lacks 21 bytes that valid UTF-8 text
 * rarely or never holds: 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1,
 * 0xf1, 0xf2, 0xf5-0xff).
 *
 * Rescanning the piece for the best pair after every merge is quadratic in
 * a long word, so candidates sit in a heap keyed by (rank, position) over a
 * linked list of symbols: O(n log n). The pairs a rank's merges create wait
 * in `pending` until every occurrence of that rank is merged, so that even a
 * merge table that ranks a longer token's merge before its parts' (a
 * well-formed one never does) is applied in the same order as by passes. */
static pv_status bpe_piece(encoder *e, const uint8_t *s, size_t n)
{
    int32_t *sym = e->sym;
    uint32_t count = 0;
    for (size_t i = 0; i < n; i++)
        if (e->im->byte_token[s[i]] >= 0)
            sym[count++] = e->im->byte_token[s[i]];
    const uint32_t end = count, none = UINT32_MAX;
    pv_status st = PV_OK;
    e->heap.n = e->pending.n = 0;
    for (uint32_t i = 0; i < count; i++) {
        e->next[i] = i + 1;
        e->prev[i] = i ? i - 1 : none;
    }
    for (uint32_t i = 0; i + 1 < count && st == PV_OK; i++)
        st = add_pair(e, i);
    if (st == PV_OK)
        st = heap_add_all(&e->heap, &e->pending);
    e->pending.n = 0;
    while (st == PV_OK && e->heap.n > 0) {
        pair_entry p = heap_pop(&e->heap);
        uint32_t left = p.left, right = e->next[left];
        /* Stale when either side has merged since the pair was queued. */
        if (sym[left] == p.left_id && right != end && sym[right] == p.right_id) {
            sym[left] = find_merge(e->im, p.left_id, p.right_id)->extra;
            sym[right] = -1;
            e->next[left] = e->next[right];
            if (e->next[right] != end)
                e->prev[e->next[right]] = left;
            if (e->prev[left] != none)
                st = add_pair(e, e->prev[left]);
            if (st == PV_OK && e->next[left] != end)
                st = add_pair(e, left);
        }
        if (st == PV_OK && (e->heap.n == 0 || e->heap.v[0].rank != p.rank)) {
            st = heap_add_all(&e->heap, &e->pending);
            e->pending.n = 0;
        }
    }
    for (uint32_t i = 0; i < count && st == PV_OK; i = e->next[i])
        st = push(e, sym[i]);
    return st;
}

/* Split valid UTF-8 text with `re`; unmatched stretches are pieces too. */
static pv_status split_with(encoder *e, const pcre2_code *re, pcre2_match_data *md,
                            const uint8_t *s, size_t n,
                            pv_status (*piece)(encoder *, const uint8_t *, size_t))
{
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(re, s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            return piece(e, s + pos, n - pos);
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pv_error(PV_ERR_BACKEND, "encode: PCRE2 match failed at byte %zu: %s", pos,
                            (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        pv_status st;
        if (start > pos && (st = piece(e, s + pos, start - pos)) != PV_OK)
            return st;
        if (end == start) { /* the patterns never match empty; guard anyway */
            size_t step = 1;
            while (start + step < n && (s[start + step] & 0xc0) == 0x80)
                step++;
            if ((st = piece(e, s + start, step)) != PV_OK)
                return st;
            pos = start + step;
            continue;
        }
        if ((st = piece(e, s + start, end - start)) != PV_OK)
            return st;
        pos = end;
    }
    return PV_OK;
}

static pv_status gpt2_piece(encoder *e, const uint8_t *s, size_t n)
{
    return split_with(e, e->im->split, e->split_md, s, n, bpe_piece);
}

/* Pre-tokenise plain text (no specials): valid UTF-8 runs go through the
 * regexes, each invalid byte is a piece of its own. */
static pv_status encode_plain(encoder *e, const uint8_t *s, size_t n)
{
    size_t pos = 0;
    while (pos < n) {
        size_t run = pos;
        uint32_t cp;
        size_t k;
        while (run < n && (k = pv_utf8_next(s + run, n - run, &cp)) > 0)
            run += k;
        pv_status st;
        if (run > pos) {
            if (e->im->digits)
                st = split_with(e, e->im->digits, e->digit_md, s + pos, run - pos, gpt2_piece);
            else
                st = gpt2_piece(e, s + pos, run - pos);
            if (st != PV_OK)
                return st;
        }
        if (run < n && (st = bpe_piece(e, s + run, 1)) != PV_OK)
            return st;
        pos = run < n ? run + 1 : run;
    }
    return PV_OK;
}

pv_status pv_tokenizer_encode(const pv_tokenizer *tok, const char *text, size_t len,
                              unsigned flags, int32_t *ids, size_t cap, size_t *n_ids)
{
    if (!tok || !tok->impl || (!text && len) || !n_ids || (!ids && cap))
        return pv_error(PV_ERR_INVALID_ARG, "pv_tokenizer_encode: NULL argument");
    *n_ids = 0;
    if (len > PV_TOKENIZE_MAX_BYTES)
        return pv_error(PV_ERR_INVALID_ARG, "encode: text of %zu bytes is over the limit of %u "
                        "bytes per call", len, PV_TOKENIZE_MAX_BYTES);
    const struct pv_tokenizer_impl *im = tok->impl;
    encoder e = {.im = im, .ids = ids, .cap = cap};
    pv_status st = PV_OK;
    if (flags & PV_TOKENIZE_ADD_BOS) {
        if (tok->bos_id < 0)
            return pv_error(PV_ERR_INVALID_ARG, "encode: PV_TOKENIZE_ADD_BOS but the model names "
                            "no bos token");
        if ((st = push(&e, tok->bos_id)) != PV_OK)
            return st;
    }
    size_t scratch = len ? len : 1;
    e.sym = malloc(scratch * sizeof *e.sym);
    e.next = malloc(scratch * sizeof *e.next);
    e.prev = malloc(scratch * sizeof *e.prev);
    e.split_md = pcre2_match_data_create_from_pattern(im->split, NULL);
    e.digit_md = im->digits ? pcre2_match_data_create_from_pattern(im->digits, NULL) : NULL;
    if (!e.sym || !e.next || !e.prev || !e.split_md || (im->digits && !e.digit_md)) {
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "encode: scratch for %zu bytes", len);
        goto done;
    }
    const uint8_t *s = (const uint8_t *)text;
    size_t plain = 0; /* start of the text not yet encoded */
    for (size_t pos = 0; pos < len && (flags & PV_TOKENIZE_PARSE_SPECIAL);) {
        int32_t hit = -1;
        for (uint32_t k = 0; im->special_first[s[pos]] && k < im->n_specials; k++) {
            int32_t id = im->specials[k];
            if (im->text_len[id] <= len - pos && memcmp(s + pos, im->text[id], im->text_len[id]) == 0) {
                hit = id;
                break;
            }
        }
        if (hit < 0) {
            pos++;
            continue;
        }
        if ((st = encode_plain(&e, s + plain, pos - plain)) != PV_OK ||
            (st = push(&e, hit)) != PV_OK)
            goto done;
        pos += im->text_len[hit];
        plain = pos;
    }
    st = encode_plain(&e, s + plain, len - plain);
done:
    free(e.sym);
    free(e.next);
    free(e.prev);
    free(e.heap.v);
    free(e.pending.v);
    pcre2_match_data_free(e.split_md);
    pcre2_match_data_free(e.digit_md);
    if (st == PV_OK)
        *n_ids = e.n;
    return st;
}

/* ---- decode and lookups ------------------------------------------------------- */

pv_status pv_tokenizer_piece(const pv_tokenizer *tok, int32_t id, unsigned flags,
                             const char **bytes, size_t *len)
{
    if (!tok || !tok->impl || !bytes || !len)
        return pv_error(PV_ERR_INVALID_ARG, "pv_tokenizer_piece: NULL argument");
    if (id < 0 || (uint32_t)id >= tok->n_vocab)
        return pv_error(PV_ERR_INVALID_ARG, "token id %d is outside the vocabulary (%u tokens)",
                        id, tok->n_vocab);
    const struct pv_tokenizer_impl *im = tok->impl;
    int type = im->type[id];
    int hidden = (type == PV_TOKEN_CONTROL || type == PV_TOKEN_UNKNOWN || type == PV_TOKEN_UNUSED) &&
                 !(flags & PV_DECODE_SPECIAL);
    *bytes = im->piece[id];
    *len = hidden ? 0 : im->piece_len[id];
    return PV_OK;
}

pv_status pv_tokenizer_decode(const pv_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              unsigned flags, char *out, size_t cap, size_t *len)
{
    if (!tok || !len || (!ids && n_ids) || (!out && cap))
        return pv_error(PV_ERR_INVALID_ARG, "pv_tokenizer_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        const char *b;
        size_t n;
        if (pv_tokenizer_piece(tok, ids[i], flags, &b, &n) != PV_OK)
            return pv_error(PV_ERR_INVALID_ARG, "decode: ids[%zu] = %d is outside the vocabulary "
                            "(%u tokens)", i, ids[i], tok->n_vocab);
        if (total + n < cap)
            memcpy(out + total, b, n);
        total += n;
    }
    *len = total;
    if (!out && cap == 0)
        return PV_OK;
    if (total + 1 > cap)
        return pv_error(PV_ERR_INVALID_ARG, "decode: output holds %zu bytes, %zu are needed "
                        "(with the NUL)", cap, total + 1);
    out[total] = '\0';
    return PV_OK;
}

int32_t pv_tokenizer_find(const pv_tokenizer *tok, const char *text)
{
    if (!tok || !tok->impl || !text)
        return -1;
    return find_text(tok->impl, text, strlen(text));
}

int pv_tokenizer_type(const pv_tokenizer *tok, int32_t id)
{
    if (!tok || !tok->impl || id < 0 || (uint32_t)id >= tok->n_vocab)
        return 0;
    return tok->impl->type[id];
}

int pv_tokenizer_is_end(const pv_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && (id == tok->eos_id || id == tok->im_end_id);
}

pv_status pv_tokenizer_apply_chat(const pv_tokenizer *tok, const pv_chat_message *msgs,
                                  size_t n_msgs, int add_generation_prompt,
                                  char *out, size_t cap, size_t *len)
{
    if (!tok || !tok->impl)
        return pv_error(PV_ERR_INVALID_ARG, "pv_tokenizer_apply_chat: NULL tokenizer");
    if (!tok->has_chat_template)
        return pv_error(PV_ERR_UNSUPPORTED, "%s", tok->impl->chat_error);
    return pv_chat_template_apply(&tok->chat, msgs, n_msgs, add_generation_prompt, out, cap, len);
}
