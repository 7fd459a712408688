/* Synthetic Llama models, so tests and benchmarks need no download: the
 * tiny test model, and the shapes of real models (widths, heads, vocabulary
 * size, RoPE base, context) with random weights of a chosen GGUF type and a
 * byte-level BPE vocabulary trained here on common English words. See
 * include/pensieve/gguf.h for the two ways weights are drawn, and
 * docs/models.md for where the shapes come from. */
#include <pensieve/gguf.h>

#include "models/byte-level.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The real shapes, from each model's config.json (docs/models.md). */
typedef struct synth_shape {
    const char *name, *title;
    uint32_t n_layers, n_embd, n_heads, n_kv_heads, n_ff, n_ctx, n_vocab;
    float rope_base, norm_eps;
    int tied_embeddings;
} synth_shape;

static const synth_shape shapes[] = {
    {"llama3-8b", "pensieve synthetic Llama-3-8B shape", 32, 4096, 32, 8, 14336, 8192, 128256,
     500000.0f, 1e-5f, 0},
    {"qwen2.5-1.5b", "pensieve synthetic Qwen2.5-1.5B shape", 28, 1536, 12, 2, 8960, 32768,
     151936, 1000000.0f, 1e-6f, 1},
    {"smollm2-135m", "pensieve synthetic SmolLM2-135M shape", 30, 576, 9, 3, 1536, 8192, 49152,
     100000.0f, 1e-5f, 1},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

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
    c->weight_type = PV_SYNTH_MIXED_TYPES;
}

const char *pv_synth_shape_name(size_t i)
{
    return i == 0 ? "tiny" : i <= N_SHAPES ? shapes[i - 1].name : NULL;
}

pv_status pv_synth_config_shape(pv_synth_config *c, const char *shape)
{
    if (!c || !shape)
        return pv_error(PV_ERR_INVALID_ARG, "pv_synth_config_shape: NULL %s",
                        c ? "shape" : "config");
    pv_synth_config_default(c);
    if (strcmp(shape, "tiny") == 0)
        return PV_OK;
    for (size_t i = 0; i < N_SHAPES; i++) {
        const synth_shape *s = &shapes[i];
        if (strcmp(shape, s->name) != 0)
            continue;
        c->n_layers = s->n_layers;
        c->n_embd = s->n_embd;
        c->n_heads = s->n_heads;
        c->n_kv_heads = s->n_kv_heads;
        c->n_ff = s->n_ff;
        c->n_ctx = s->n_ctx;
        c->n_vocab = s->n_vocab;
        c->rope_base = s->rope_base;
        c->norm_eps = s->norm_eps;
        c->tied_embeddings = s->tied_embeddings;
        c->weight_type = PV_GGML_Q4_0;
        c->name = s->title;
        return PV_OK;
    }
    char known[256] = "tiny";
    for (size_t i = 0; i < N_SHAPES; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), ", %s", shapes[i].name);
    return pv_error(PV_ERR_NOT_FOUND, "synthetic model shape '%s' is not known (known: %s)",
                    shape, known);
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t next_random(uint64_t *state)
{
    /* splitmix64: small, seedable, good enough for test weights */
    return mix64(*state += 0x9e3779b97f4a7c15ull);
}

static double uniform01(uint64_t *state)
{
    return (double)(next_random(state) >> 11) / 9007199254740992.0; /* [0, 1) */
}

static void fill(float *x, uint64_t n, float center, float range, uint64_t *state)
{
    for (uint64_t i = 0; i < n; i++)
        x[i] = center + range * (float)(2.0 * uniform01(state) - 1.0);
}

/* ---- vocabulary ---------------------------------------------------------------- */

typedef struct synth_vocab {
    char **tokens;     /* n: specials as text, the rest in the byte-level alphabet */
    int32_t *types;
    uint32_t n;
    char **merges;     /* n_merges "left right" in rank order */
    uint32_t n_merges;
} synth_vocab;

static void vocab_free(synth_vocab *v)
{
    for (uint32_t i = 0; v->tokens && i < v->n; i++)
        free(v->tokens[i]);
    for (uint32_t i = 0; v->merges && i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

/* Room for n tokens and m merges, all NULL. */
static pv_status vocab_alloc(synth_vocab *v, uint32_t n, uint32_t m)
{
    memset(v, 0, sizeof *v);
    v->tokens = calloc(n, sizeof *v->tokens);
    v->types = calloc(n, sizeof *v->types);
    v->merges = calloc(m ? m : 1, sizeof *v->merges);
    if (!v->tokens || !v->types || !v->merges) {
        vocab_free(v);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary of %u tokens, %u merges", n, m);
    }
    v->n = n;
    v->n_merges = m;
    return PV_OK;
}

static pv_status vocab_check(synth_vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (!v->tokens[i]) {
            vocab_free(v);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary token %u", i);
        }
    for (uint32_t i = 0; i < v->n_merges; i++)
        if (!v->merges[i]) {
            vocab_free(v);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary merge %u", i);
        }
    return PV_OK;
}

/* Specials, then the 256 byte tokens in byte-level alphabet order
 * (printable bytes first, as GPT-2 vocabularies list them). */
static void add_specials_and_bytes(synth_vocab *v)
{
    uint32_t id = 0;
    for (; id < N_SPECIAL; id++) {
        v->tokens[id] = strdup(special_tokens[id]);
        v->types[id] = 3; /* control */
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
            v->tokens[id] = strdup(buf);
            v->types[id++] = 1; /* normal */
        }
    }
}

/* The tiny vocabulary: specials, bytes, then one token per merge. */
static pv_status tiny_vocab(synth_vocab *v)
{
    pv_status st = vocab_alloc(v, N_SPECIAL + 256 + (uint32_t)N_MERGES, (uint32_t)N_MERGES);
    if (st != PV_OK)
        return st;
    add_specials_and_bytes(v);
    uint32_t id = N_SPECIAL + 256;
    for (size_t m = 0; m < N_MERGES; m++) {
        const char *sp = strchr(synth_merges[m], ' ');
        size_t left = (size_t)(sp - synth_merges[m]);
        char *tok = malloc(strlen(synth_merges[m]));
        if (tok) {
            memcpy(tok, synth_merges[m], left);
            strcpy(tok + left, sp + 1);
        }
        v->tokens[id] = tok;
        v->types[id++] = 1;
        v->merges[m] = strdup(synth_merges[m]);
    }
    return vocab_check(v);
}

/* ---- a trained vocabulary of any size -------------------------------------------- */

/* The training text: common English words, most frequent first (a word's
 * weight falls as 1/(rank + 20)); each is seen after a space, alone, and
 * capitalised, as the GPT-2 split cuts running text. */
static const char english_words[] =
    "the of and to a in is that it for you was with on as are be this have not by at "
    "from or but he his they we an all can had will one there what which their she her "
    "if would about has more so were been do when them up out who some its said my no "
    "time other into than then only could like also him new these two may first use any "
    "me just now how our people your over well make after way most because many very "
    "even those did get through much where should back good made work each know year "
    "think see before same while used here down still between own life take world day "
    "last long great little such both under might never come another right three old "
    "must again part being place since help us thing found around however few home "
    "school small every without want number during give often always house country point "
    "against next end large state family water hand high today system order important "
    "city until let power free open name question although head government children side "
    "later case group problem fact company program public business information service "
    "change different night example story second money possible early read move week "
    "month area hard mean start less real study game best light idea answer form word "
    "line turn show social kind member yes enough almost far stop learn already local "
    "young body political report others whether market quite level child food able "
    "future reason human office door health person art war history party result morning "
    "minute team face set close teacher stand field eye air data model user code file "
    "value error function return request response memory token server client network "
    "process language computer software test build run support version simple list type "
    "string table image text message page content access control design develop include "
    "provide create allow consider continue follow begin seem become leave feel bring "
    "happen write sit lose pay meet believe keep hold understand watch remember love buy "
    "wait serve die send expect stay fall cut reach kill remain suggest raise pass sell "
    "require decide pull explain hope carry break receive agree hit produce eat cover "
    "catch draw choose grow speak thought went came told asked called looked wanted "
    "seemed felt became left gave took knew saw heard brought began kept held turned "
    "moved lived believed happened wrote stood lost paid met ran sat making taking "
    "getting going coming looking working using having doing saying trying thinking "
    "talking playing reading writing running learning building following including "
    "things years days times hands words parts places weeks states names questions "
    "results models users values errors requests tokens files systems groups problems "
    "ideas short big low bad better worse sure clear strong full special whole easy true "
    "false certain general common recent similar various likely available particular "
    "personal natural physical national international economic environmental financial "
    "medical dark white black red blue green happy ready quickly really sometimes "
    "usually probably actually finally simply especially exactly recently certainly "
    "clearly nearly together perhaps please thank thanks hello sorry okay why monday "
    "tuesday friday sunday january march june july september december evening four five "
    "six seven eight nine ten hundred thousand million third half zero numbers percent "
    "dollars hours minutes seconds assistant describe summarize step steps below above "
    "examples therefore unless among within toward across behind beyond"
    ;

/* Pieces of ordinary text other than words, at a fixed weight. */
static const char *const extra_pieces[] = {
    "'s", "'t", "'re", "'ve", "'ll", "'m", "'d", "\n\n", "  ", "    ", "        ", "...",
    " (", "),", ").", " \"", "\",", "://", " {", " }", " =", " ==", " ->", " //",
};
#define EXTRA_WEIGHT 20000

/* The random merges that fill the vocabulary to its size use this seed, not
 * the weights' one: every model of one vocabulary size tokenizes alike. */
#define FILLER_SEED 0x70656e7369657665ull
#define FILLER_MAX_BYTES 16
#define MAX_VOCAB (1u << 20)

/* Token bytes by id, and id by bytes (open addressing, -1 = empty). */
typedef struct token_table {
    uint8_t *pool;
    uint64_t pool_len, pool_cap;
    uint64_t *off;
    uint32_t *len;
    uint32_t n, cap;
    int32_t *slots;
    uint64_t mask;
} token_table;

static uint64_t hash_bytes(const uint8_t *s, uint32_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static int table_init(token_table *t, uint32_t cap)
{
    memset(t, 0, sizeof *t);
    uint64_t size = 16;
    while (size < 2ull * cap)
        size *= 2;
    t->slots = malloc(size * sizeof *t->slots);
    t->off = malloc(cap * sizeof *t->off);
    t->len = malloc(cap * sizeof *t->len);
    t->pool_cap = 16ull * cap;
    t->pool = malloc(t->pool_cap);
    if (!t->slots || !t->off || !t->len || !t->pool)
        return 0;
    memset(t->slots, 0xff, size * sizeof *t->slots);
    t->mask = size - 1;
    t->cap = cap;
    return 1;
}

static void table_free(token_table *t)
{
    free(t->pool);
    free(t->off);
    free(t->len);
    free(t->slots);
}

/* The id of these bytes, inserting them as the next id when absent and
 * `insert` is set; -1 when absent (or out of room or memory). */
static int32_t table_id(token_table *t, const uint8_t *s, uint32_t n, int insert)
{
    uint64_t i = hash_bytes(s, n) & t->mask;
    for (; t->slots[i] >= 0; i = (i + 1) & t->mask) {
        int32_t id = t->slots[i];
        if (t->len[id] == n && memcmp(t->pool + t->off[id], s, n) == 0)
            return id;
    }
    if (!insert || t->n == t->cap)
        return -1;
    if (t->pool_len + n > t->pool_cap) {
        uint64_t cap = 2 * t->pool_cap + n;
        uint8_t *p = realloc(t->pool, cap);
        if (!p)
            return -1;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->off[t->n] = t->pool_len;
    t->len[t->n] = n;
    t->pool_len += n;
    t->slots[i] = (int32_t)t->n;
    return (int32_t)t->n++;
}

/* Pair counts (key a << 32 | b, stored + 1 so 0 is empty) and a max-heap
 * of (count, key) entries, stale ones skipped when popped. */
typedef struct trainer {
    uint64_t *keys;
    int64_t *counts;
    uint64_t mask, used;
    struct heap_item { int64_t count; uint64_t key; } *heap;
    size_t heap_n, heap_cap;
    int oom;
} trainer;

static int64_t *pair_count(trainer *t, uint64_t key)
{
    if (2 * (t->used + 1) > t->mask + 1) {
        uint64_t size = 2 * (t->mask + 1);
        uint64_t *keys = calloc(size, sizeof *keys);
        int64_t *counts = calloc(size, sizeof *counts);
        if (!keys || !counts) {
            free(keys);
            free(counts);
            t->oom = 1;
            return NULL;
        }
        for (uint64_t i = 0; i <= t->mask; i++) {
            if (!t->keys[i])
                continue;
            uint64_t j = mix64(t->keys[i]) & (size - 1);
            while (keys[j])
                j = (j + 1) & (size - 1);
            keys[j] = t->keys[i];
            counts[j] = t->counts[i];
        }
        free(t->keys);
        free(t->counts);
        t->keys = keys;
        t->counts = counts;
        t->mask = size - 1;
    }
    uint64_t i = mix64(key + 1) & t->mask;
    while (t->keys[i] && t->keys[i] != key + 1)
        i = (i + 1) & t->mask;
    if (!t->keys[i]) {
        t->keys[i] = key + 1;
        t->used++;
    }
    return &t->counts[i];
}

/* Heap order: the larger count first, then the smaller key (left id, then
 * right id), so training never depends on table order. */
static int heap_before(const struct heap_item *x, const struct heap_item *y)
{
    return x->count > y->count || (x->count == y->count && x->key < y->key);
}

static void heap_push(trainer *t, int64_t count, uint64_t key)
{
    if (t->heap_n == t->heap_cap) {
        size_t cap = t->heap_cap ? 2 * t->heap_cap : 4096;
        struct heap_item *h = realloc(t->heap, cap * sizeof *h);
        if (!h) {
            t->oom = 1;
            return;
        }
        t->heap = h;
        t->heap_cap = cap;
    }
    size_t i = t->heap_n++;
    t->heap[i] = (struct heap_item){count, key};
    while (i > 0 && heap_before(&t->heap[i], &t->heap[(i - 1) / 2])) {
        struct heap_item tmp = t->heap[i];
        t->heap[i] = t->heap[(i - 1) / 2];
        t->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

static struct heap_item heap_pop(trainer *t)
{
    struct heap_item top = t->heap[0];
    t->heap[0] = t->heap[--t->heap_n];
    for (size_t i = 0;;) {
        size_t best = i, l = 2 * i + 1, r = l + 1;
        if (l < t->heap_n && heap_before(&t->heap[l], &t->heap[best]))
            best = l;
        if (r < t->heap_n && heap_before(&t->heap[r], &t->heap[best]))
            best = r;
        if (best == i)
            break;
        struct heap_item tmp = t->heap[i];
        t->heap[i] = t->heap[best];
        t->heap[best] = tmp;
        i = best;
    }
    return top;
}

static void bump(trainer *t, int32_t a, int32_t b, int64_t delta)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    int64_t *c = pair_count(t, key);
    if (!c)
        return;
    *c += delta;
    if (*c > 0)
        heap_push(t, *c, key);
}

/* Training pieces: their symbols (token ids) live in one array. */
typedef struct piece_set {
    int32_t *sym;
    uint32_t n_sym, cap_sym;
    struct piece { uint32_t first, len; int64_t weight; } *v;
    uint32_t n, cap;
} piece_set;

static int add_piece(piece_set *ps, const char *text, size_t len, int64_t weight,
                     const uint32_t byte_id[256])
{
    if (ps->n == ps->cap || ps->n_sym + len > ps->cap_sym) {
        ps->cap = ps->cap ? 2 * ps->cap : 1024;
        ps->cap_sym = 2 * (ps->cap_sym + (uint32_t)len);
        void *v = realloc(ps->v, ps->cap * sizeof *ps->v);
        if (v)
            ps->v = v;
        void *s = realloc(ps->sym, ps->cap_sym * sizeof *ps->sym);
        if (s)
            ps->sym = s;
        if (!v || !s)
            return 0;
    }
    ps->v[ps->n++] = (struct piece){ps->n_sym, (uint32_t)len, weight};
    for (size_t i = 0; i < len; i++)
        ps->sym[ps->n_sym++] = (int32_t)byte_id[(uint8_t)text[i]];
    return 1;
}

static int training_pieces(piece_set *ps, const uint32_t byte_id[256])
{
    memset(ps, 0, sizeof *ps);
    int fine = 1;
    const char *w = english_words;
    for (int64_t rank = 0; fine && *w; rank++) {
        size_t len = strcspn(w, " ");
        int64_t weight = 1000000 / (rank + 20);
        char buf[40];
        if (len + 1 < sizeof buf) {
            buf[0] = ' ';
            memcpy(buf + 1, w, len);
            fine = add_piece(ps, buf, len + 1, weight, byte_id) &&
                   add_piece(ps, buf + 1, len, weight / 8, byte_id);
            buf[1] = (char)(buf[1] >= 'a' && buf[1] <= 'z' ? buf[1] - 'a' + 'A' : buf[1]);
            fine = fine && add_piece(ps, buf, len + 1, weight / 8, byte_id) &&
                   add_piece(ps, buf + 1, len, weight / 16, byte_id);
        }
        w += len;
        w += *w == ' ';
    }
    for (size_t i = 0; fine && i < sizeof extra_pieces / sizeof extra_pieces[0]; i++)
        fine = add_piece(ps, extra_pieces[i], strlen(extra_pieces[i]), EXTRA_WEIGHT, byte_id);
    return fine;
}

/* Merge pairs (left id, right id) in rank order. */
typedef struct merge_list {
    uint64_t *v;
    uint32_t n, cap;
} merge_list;

static int add_merge(merge_list *m, int32_t a, int32_t b)
{
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? 2 * m->cap : 4096;
        uint64_t *v = realloc(m->v, cap * sizeof *v);
        if (!v)
            return 0;
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    return 1;
}

/* Joins tokens a and b into the table (new id unless those bytes are a
 * token already); -1 when out of room. */
static int32_t join(token_table *t, int32_t a, int32_t b, int insert)
{
    uint8_t buf[512];
    uint32_t la = t->len[a], lb = t->len[b];
    if (la + lb > sizeof buf)
        return -1;
    memcpy(buf, t->pool + t->off[a], la);
    memcpy(buf + la, t->pool + t->off[b], lb);
    return table_id(t, buf, la + lb, insert);
}

/* Byte-pair encoding as GPT-2 trained it: repeatedly merge the most
 * frequent adjacent pair of the training pieces into a token, until every
 * piece is one token or the vocabulary is full. */
static pv_status train(token_table *tt, merge_list *ml, uint32_t n_vocab,
                       const uint32_t byte_id[256])
{
    piece_set ps;
    trainer t = {0};
    pv_status st = PV_OK;
    t.mask = 4095;
    t.keys = calloc(t.mask + 1, sizeof *t.keys);
    t.counts = calloc(t.mask + 1, sizeof *t.counts);
    if (!training_pieces(&ps, byte_id) || !t.keys || !t.counts)
        t.oom = 1;
    for (uint32_t p = 0; !t.oom && p < ps.n; p++)
        for (uint32_t i = 1; i < ps.v[p].len; i++)
            bump(&t, ps.sym[ps.v[p].first + i - 1], ps.sym[ps.v[p].first + i], ps.v[p].weight);
    while (!t.oom && tt->n < n_vocab && t.heap_n > 0) {
        struct heap_item top = heap_pop(&t);
        int64_t *now = pair_count(&t, top.key);
        if (!now || *now != top.count)
            continue; /* stale */
        int32_t a = (int32_t)(top.key >> 32), b = (int32_t)(uint32_t)top.key;
        int32_t fresh = (int32_t)tt->n;
        int32_t merged = join(tt, a, b, 1);
        if (merged < 0) {
            t.oom = 1;
            break;
        }
        /* A pair merged before can meet again only next to a token that
         * another merge rebuilt: its merge is not listed twice. */
        int listed = 0;
        for (uint32_t m = 0; merged < fresh && m < ml->n; m++)
            listed |= ml->v[m] == top.key;
        if (!listed && !add_merge(ml, a, b)) {
            t.oom = 1;
            break;
        }
        for (uint32_t p = 0; p < ps.n; p++) {
            int32_t *s = ps.sym + ps.v[p].first;
            int64_t w = ps.v[p].weight;
            uint32_t len = ps.v[p].len, o = 0;
            for (uint32_t i = 0; i < len;) {
                if (i + 1 < len && s[i] == a && s[i + 1] == b) {
                    if (o > 0) {
                        bump(&t, s[o - 1], a, -w);
                        bump(&t, s[o - 1], merged, w);
                    }
                    if (i + 2 < len) {
                        bump(&t, b, s[i + 2], -w);
                        bump(&t, merged, s[i + 2], w);
                    }
                    s[o++] = merged;
                    i += 2;
                } else {
                    s[o++] = s[i++];
                }
            }
            ps.v[p].len = o;
        }
        if ((now = pair_count(&t, top.key)))
            *now = 0;
    }
    if (t.oom)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "training a BPE vocabulary of %u tokens", n_vocab);
    free(t.keys);
    free(t.counts);
    free(t.heap);
    free(ps.sym);
    free(ps.v);
    return st;
}

/* Byte-level text of a token's bytes (every code point is below U+0800, so
 * at most 2 bytes each). */
static char *byte_level_text(const token_table *t, int32_t id)
{
    char *out = malloc(2 * (size_t)t->len[id] + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (uint32_t i = 0; i < t->len[id]; i++)
        n += pv_utf8_put(pv_byte_level_codepoint(t->pool[t->off[id] + i]), out + n);
    out[n] = '\0';
    return out;
}

static char *merge_text(const token_table *t, uint64_t pair)
{
    char *left = byte_level_text(t, (int32_t)(pair >> 32));
    char *right = byte_level_text(t, (int32_t)(uint32_t)pair);
    char *out = left && right ? malloc(strlen(left) + strlen(right) + 2) : NULL;
    if (out)
        sprintf(out, "%s %s", left, right);
    free(left);
    free(right);
    return out;
}

/* Whether token id is letters, after one leading space if `space`. */
static int is_word(const token_table *t, int32_t id, int space)
{
    const uint8_t *s = t->pool + t->off[id];
    uint32_t n = t->len[id], i = space && n > 1 && s[0] == ' ';
    for (; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

/* Fill the vocabulary to n_vocab with random merges of two word tokens (the
 * left one may start with a space), at most FILLER_MAX_BYTES long: tokens a
 * piece of the GPT-2 split (" ?\p{L}+") can reach. They rank after the
 * trained merges, so text splits as trained and then joins a little
 * further. */
static pv_status fill_up(token_table *tt, merge_list *ml, uint32_t n_vocab)
{
    int32_t *left = malloc(tt->n * sizeof *left), *right = malloc(tt->n * sizeof *right);
    uint32_t n_left = 0, n_right = 0;
    pv_status st = PV_OK;
    if (!left || !right)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "vocabulary filler of %u parts", tt->n);
    for (uint32_t id = N_SPECIAL; st == PV_OK && id < tt->n; id++) {
        if (is_word(tt, (int32_t)id, 1))
            left[n_left++] = (int32_t)id;
        if (is_word(tt, (int32_t)id, 0))
            right[n_right++] = (int32_t)id;
    }
    uint64_t rng = FILLER_SEED, tries = 0, max_tries = 64ull * n_vocab;
    while (st == PV_OK && tt->n < n_vocab) {
        if (++tries > max_tries) {
            st = pv_error(PV_ERR_INVALID_ARG, "synthetic vocabulary: only %u distinct tokens "
                          "after %" PRIu64 " random merges, %u asked", tt->n, max_tries, n_vocab);
            break;
        }
        int32_t a = left[next_random(&rng) % n_left], b = right[next_random(&rng) % n_right];
        if (tt->len[a] + tt->len[b] > FILLER_MAX_BYTES || join(tt, a, b, 0) >= 0)
            continue;
        if (join(tt, a, b, 1) < 0 || !add_merge(ml, a, b))
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary token %u", tt->n);
    }
    free(left);
    free(right);
    return st;
}

/* Exactly n_vocab tokens: specials, the 256 bytes, trained merges, then
 * random ones. */
static pv_status trained_vocab(synth_vocab *v, uint32_t n_vocab)
{
    token_table tt;
    merge_list ml = {0};
    pv_status st = PV_OK;
    if (!table_init(&tt, n_vocab)) {
        table_free(&tt);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic vocabulary of %u tokens", n_vocab);
    }
    uint32_t byte_id[256];
    for (uint32_t i = 0; i < N_SPECIAL; i++)
        table_id(&tt, (const uint8_t *)special_tokens[i], (uint32_t)strlen(special_tokens[i]), 1);
    /* byte tokens in the order add_specials_and_bytes gives them ids */
    for (uint32_t cp = 0; cp < 0x100 + 256; cp++) {
        int b = pv_byte_level_byte(cp);
        if (b >= 0)
            byte_id[b] = (uint32_t)table_id(&tt, (const uint8_t[]){(uint8_t)b}, 1, 1);
    }
    st = train(&tt, &ml, n_vocab, byte_id);
    if (st == PV_OK)
        st = fill_up(&tt, &ml, n_vocab);
    if (st == PV_OK)
        st = vocab_alloc(v, n_vocab, ml.n);
    if (st == PV_OK) {
        add_specials_and_bytes(v);
        for (uint32_t id = N_SPECIAL + 256; id < n_vocab; id++) {
            v->tokens[id] = byte_level_text(&tt, (int32_t)id);
            v->types[id] = 1;
        }
        for (uint32_t m = 0; m < ml.n; m++)
            v->merges[m] = merge_text(&tt, ml.v[m]);
        st = vocab_check(v);
    }
    table_free(&tt);
    free(ml.v);
    return st;
}

/* ---- config, metadata and the tensor list ----------------------------------------- */

static int single_type_known(int32_t type)
{
    return type == PV_GGML_F32 || type == PV_GGML_F16 || type == PV_GGML_BF16 ||
           type == PV_GGML_Q8_0 || type == PV_GGML_Q4_0 || type == PV_GGML_Q4_1;
}

/* Bounds that keep every size product well inside 64 bits (a tensor at
 * most 2^40 elements, a file under 2^62 bytes). */
#define MAX_LAYERS 65536
#define MAX_WIDTH (1u << 20)

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
    if (c->n_layers > MAX_LAYERS || c->n_embd > MAX_WIDTH || c->n_ff > MAX_WIDTH)
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: %u layers (at most %u), width %u "
                        "and FFN size %u (at most %u)", c->n_layers, MAX_LAYERS, c->n_embd,
                        c->n_ff, MAX_WIDTH);
    if (c->n_vocab != 0 && (c->n_vocab < N_SPECIAL + 256 || c->n_vocab > MAX_VOCAB))
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: vocabulary of %u tokens, must be "
                        "%u (specials and bytes) to %u", c->n_vocab, N_SPECIAL + 256, MAX_VOCAB);
    if (c->weight_type != PV_SYNTH_MIXED_TYPES && !single_type_known(c->weight_type))
        return pv_error(PV_ERR_INVALID_ARG, "synthetic model: weight type %d (%s) is not one of "
                        "F32, F16, BF16, Q8_0, Q4_0, Q4_1", c->weight_type,
                        pv_ggml_type_name((uint32_t)c->weight_type));
    return PV_OK;
}

/* general.file_type, llama.cpp's name for the file's main type. */
static uint32_t file_type(int32_t weight_type)
{
    switch (weight_type) {
    case PV_GGML_F32: return 0;
    case PV_GGML_F16: return 1;
    case PV_GGML_Q4_0: return 2;
    case PV_GGML_Q8_0: return 7;
    case PV_GGML_BF16: return 32;
    default: return 3; /* "mostly Q4_1": Q4_1 itself, and the mix (as SmolLM2's) */
    }
}

static pv_status add_metadata(pv_gguf_writer *w, const pv_synth_config *c, const synth_vocab *v)
{
    pv_status st = PV_OK;
#define ADD(call) do { if (st == PV_OK) st = (call); } while (0)
    ADD(pv_gguf_writer_add_string(w, "general.architecture", "llama"));
    ADD(pv_gguf_writer_add_string(w, "general.type", "model"));
    ADD(pv_gguf_writer_add_string(w, "general.name", c->name ? c->name : "pensieve synthetic llama"));
    ADD(pv_gguf_writer_add_u32(w, "llama.block_count", c->n_layers));
    ADD(pv_gguf_writer_add_u32(w, "llama.context_length", c->n_ctx));
    ADD(pv_gguf_writer_add_u32(w, "llama.embedding_length", c->n_embd));
    ADD(pv_gguf_writer_add_u32(w, "llama.feed_forward_length", c->n_ff));
    ADD(pv_gguf_writer_add_u32(w, "llama.attention.head_count", c->n_heads));
    ADD(pv_gguf_writer_add_u32(w, "llama.attention.head_count_kv", c->n_kv_heads));
    ADD(pv_gguf_writer_add_f32(w, "llama.rope.freq_base", c->rope_base));
    ADD(pv_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps));
    ADD(pv_gguf_writer_add_u32(w, "general.file_type", file_type(c->weight_type)));
    ADD(pv_gguf_writer_add_u32(w, "llama.vocab_size", v->n));
    ADD(pv_gguf_writer_add_u32(w, "llama.rope.dimension_count", c->n_embd / c->n_heads));
    ADD(pv_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", 0));
    ADD(pv_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", 0));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.ggml.model", "gpt2"));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.ggml.pre", "smollm"));
    ADD(pv_gguf_writer_add_strings(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens,
                                   v->n));
    ADD(pv_gguf_writer_add_i32s(w, "tokenizer.ggml.token_type", v->types, v->n));
    ADD(pv_gguf_writer_add_strings(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                   v->n_merges));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0));
    ADD(pv_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 2));
    ADD(pv_gguf_writer_add_string(w, "tokenizer.chat_template", synth_chat_template));
    ADD(pv_gguf_writer_add_u32(w, "general.quantization_version", 2));
#undef ADD
    return st;
}

typedef struct synth_tensor {
    char name[40];
    uint32_t type;
    uint64_t ne0, ne1; /* ne1 = 1: a vector */
    int is_norm;       /* values around 1, not around 0 */
} synth_tensor;

/* Every tensor in file order: token_embd, the blocks, output_norm, output. */
static pv_status list_tensors(const pv_synth_config *c, uint32_t n_vocab, synth_tensor **out,
                              uint32_t *n_out)
{
    uint32_t n = 2 + 9 * c->n_layers + (c->tied_embeddings ? 0 : 1);
    synth_tensor *t = calloc(n, sizeof *t);
    if (!t)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model: list of %u tensors", n);
    const int mixed = c->weight_type == PV_SYNTH_MIXED_TYPES;
    const uint32_t wt = (uint32_t)c->weight_type;
    const uint32_t kv_dim = c->n_kv_heads * (c->n_embd / c->n_heads);
    uint32_t k = 0;
    t[k++] = (synth_tensor){"token_embd.weight", mixed ? PV_GGML_Q8_0 : wt, c->n_embd, n_vocab, 0};
    for (uint32_t l = 0; l < c->n_layers; l++) {
        const struct { const char *suffix; uint32_t mixed_type; uint64_t ne0, ne1; int norm; } b[] = {
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
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++, k++) {
            snprintf(t[k].name, sizeof t[k].name, "blk.%u.%s", l, b[i].suffix);
            t[k].type = mixed ? b[i].mixed_type : b[i].norm ? PV_GGML_F32 : wt;
            t[k].ne0 = b[i].ne0;
            t[k].ne1 = b[i].ne1;
            t[k].is_norm = b[i].norm;
        }
    }
    t[k++] = (synth_tensor){"output_norm.weight", PV_GGML_F32, c->n_embd, 1, 1};
    if (!c->tied_embeddings)
        t[k++] = (synth_tensor){"output.weight", mixed ? PV_GGML_F16 : wt, c->n_embd, n_vocab, 0};
    *out = t;
    *n_out = n;
    return PV_OK;
}

/* The writer holding the metadata and every tensor: with their values drawn
 * as floats (the tiny model), or as infos only (their bytes are written
 * afterwards by write_blocks). */
static pv_status build(const pv_synth_config *c, pv_gguf_writer *w, synth_tensor **tensors,
                       uint32_t *n_tensors, int with_values)
{
    pv_status st = check_config(c);
    if (st != PV_OK)
        return st;
    synth_vocab v;
    if ((st = c->n_vocab ? trained_vocab(&v, c->n_vocab) : tiny_vocab(&v)) != PV_OK)
        return st;
    st = add_metadata(w, c, &v);
    if (st == PV_OK)
        st = list_tensors(c, v.n, tensors, n_tensors);
    vocab_free(&v);
    if (st != PV_OK)
        return st;
    uint64_t rng = c->seed;
    float *x = NULL;
    for (uint32_t i = 0; st == PV_OK && i < *n_tensors; i++) {
        const synth_tensor *t = &(*tensors)[i];
        uint64_t ne[2] = {t->ne0, t->ne1}, n = t->ne0 * t->ne1;
        uint32_t n_dims = t->ne1 == 1 ? 1 : 2;
        if (!with_values) {
            st = pv_gguf_writer_add_tensor_info(w, t->name, t->type, n_dims, ne);
            continue;
        }
        if (!(x = malloc(n * sizeof *x))) {
            st = pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic tensor '%s' of %" PRIu64 " floats",
                          t->name, n);
            break;
        }
        if (t->is_norm)
            fill(x, n, 1.0f, 0.1f, &rng);
        else
            fill(x, n, 0.0f, 1.0f / sqrtf((float)t->ne0), &rng);
        st = pv_gguf_writer_add_tensor(w, t->name, t->type, n_dims, ne, x);
        free(x);
    }
    if (st != PV_OK) {
        free(*tensors);
        *tensors = NULL;
    }
    return st;
}

/* ---- random blocks, written by threads ---------------------------------------------- */

/* Tensors are cut into pieces of at most this many bytes: each piece has
 * its own random stream (from the seed, the tensor and the piece), so the
 * bytes do not depend on which thread writes it. */
#define PIECE_BYTES (8u << 20)

typedef struct piece_job {
    uint32_t tensor;
    uint64_t index;     /* of the piece within its tensor */
    uint64_t n;         /* elements */
    uint64_t file_off;
} piece_job;

/* Where the bytes go: an image in memory, or a file written with pwrite. */
typedef struct synth_sink {
    uint8_t *mem;
    int fd;
    const char *path;
} synth_sink;

static pv_status sink_put(const synth_sink *s, uint64_t off, const uint8_t *p, uint64_t n)
{
    if (s->mem) {
        memcpy(s->mem + off, p, n);
        return PV_OK;
    }
    while (n > 0) {
        ssize_t k = pwrite(s->fd, p, n < (1u << 30) ? (size_t)n : (1u << 30), (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return pv_error(PV_ERR_IO, "%s: writing %" PRIu64 " bytes at offset %" PRIu64 ": %s",
                            s->path, n, off, k < 0 ? strerror(errno) : "nothing written");
        p += k;
        off += (uint64_t)k;
        n -= (uint64_t)k;
    }
    return PV_OK;
}

static void put_f16(uint8_t *p, float f)
{
    pv_half h = pv_float_to_half(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* n random bytes (a multiple of 8), little-endian whatever the host. */
static void put_random(uint8_t *p, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i += 8) {
        uint64_t r = next_random(rng);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(p + i, &r, 8);
#else
        for (int j = 0; j < 8; j++)
            p[i + j] = (uint8_t)(r >> (8 * j));
#endif
    }
}

/* n elements of tensor t as random blocks of its type. Quantised blocks get
 * uniform random codes under a scale drawn in [0.75, 1.25] x the one that
 * spans +-range, range = 1/sqrt(fan_in); float types get uniform values
 * (norms 1 +- 0.1). Q4_0's codes -8..7 lean negative (mean -0.5): its scale
 * takes a random sign, as the reference quantiser's does, or every matrix
 * would share one direction and the model would predict one token always. */
static void fill_piece(const synth_tensor *t, uint64_t rng, uint64_t n, uint8_t *out)
{
    const float range = t->is_norm ? 0.1f : 1.0f / sqrtf((float)t->ne0);
    uint32_t be, bb;
    pv_ggml_type_block(t->type, &be, &bb);
    if (be == 32) {
        for (uint64_t i = 0; i < n / 32; i++, out += bb) {
            uint64_t r = next_random(&rng);
            float s = range * (float)(0.75 + 0.5 * ((double)(r >> 11) / 9007199254740992.0));
            if (t->type == PV_GGML_Q8_0) {
                put_f16(out, s / 127.0f);                 /* d * [-128, 127] */
                put_random(out + 2, 32, &rng);
            } else if (t->type == PV_GGML_Q4_0) {
                put_f16(out, (r & 1 ? -s : s) / 8.0f);    /* d * ([0, 15] - 8) */
                put_random(out + 2, 16, &rng);
            } else {
                put_f16(out, 2.0f * s / 15.0f);           /* d * [0, 15] + m */
                put_f16(out + 2, -s);
                put_random(out + 4, 16, &rng);
            }
        }
        return;
    }
    float x[256];
    for (uint64_t i = 0; i < n; i += 256) {
        uint64_t k = n - i < 256 ? n - i : 256;
        fill(x, k, t->is_norm ? 1.0f : 0.0f, range, &rng);
        pv_ggml_quantize(t->type, x, k, out + i * bb, k * bb);
    }
}

typedef struct block_run {
    const synth_tensor *tensors;
    piece_job *jobs;
    uint64_t n_jobs;
    uint64_t seed;
    const synth_sink *sink;
    pthread_mutex_t lock;  /* guards the fields below */
    uint64_t next;         /* the next job to take */
    pv_status status;      /* the first failure, its message in `message` */
    char message[1024];
} block_run;

static void run_failed(block_run *r, pv_status st)
{
    pthread_mutex_lock(&r->lock);
    if (r->status == PV_OK) {
        r->status = st;
        snprintf(r->message, sizeof r->message, "%s", pv_last_error());
    }
    pthread_mutex_unlock(&r->lock);
}

static void *block_worker(void *arg)
{
    block_run *r = arg;
    uint8_t *buf = malloc(PIECE_BYTES);
    if (!buf)
        run_failed(r, pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model: a %u-byte piece buffer",
                               PIECE_BYTES));
    for (;;) {
        pthread_mutex_lock(&r->lock);
        uint64_t j = r->status == PV_OK ? r->next++ : r->n_jobs;
        pthread_mutex_unlock(&r->lock);
        if (j >= r->n_jobs)
            break;
        const piece_job *job = &r->jobs[j];
        const synth_tensor *t = &r->tensors[job->tensor];
        uint64_t rng = mix64(r->seed ^ mix64(((uint64_t)job->tensor << 40 | job->index) + 1));
        uint64_t bytes;
        pv_ggml_row_bytes(t->type, job->n, &bytes);
        fill_piece(t, rng, job->n, buf);
        pv_status st = sink_put(r->sink, job->file_off, buf, bytes);
        if (st != PV_OK)
            run_failed(r, st);
    }
    free(buf);
    return NULL;
}

/* The pieces of every tensor, in file order. */
static pv_status list_pieces(const synth_tensor *t, uint32_t n_tensors, uint64_t head_size,
                             const uint64_t *offsets, piece_job **out, uint64_t *n_out)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < n_tensors; i++) {
        uint32_t be, bb;
        pv_ggml_type_block(t[i].type, &be, &bb);
        uint64_t per = PIECE_BYTES / bb * be;
        n += (t[i].ne0 * t[i].ne1 + per - 1) / per;
    }
    piece_job *jobs = malloc(n * sizeof *jobs);
    if (!jobs)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model: list of %" PRIu64 " pieces", n);
    uint64_t k = 0;
    for (uint32_t i = 0; i < n_tensors; i++) {
        uint32_t be, bb;
        pv_ggml_type_block(t[i].type, &be, &bb);
        uint64_t per = PIECE_BYTES / bb * be, total = t[i].ne0 * t[i].ne1;
        for (uint64_t first = 0, index = 0; first < total; first += per, index++)
            jobs[k++] = (piece_job){i, index, total - first < per ? total - first : per,
                                    head_size + offsets[i] + first / be * bb};
    }
    *out = jobs;
    *n_out = n;
    return PV_OK;
}

/* Every tensor's bytes into the sink, by n_threads threads (the caller's
 * one among them). */
static pv_status write_blocks(const pv_synth_config *c, const synth_tensor *tensors,
                              uint32_t n_tensors, uint64_t head_size, const uint64_t *offsets,
                              const synth_sink *sink)
{
    block_run r = {.tensors = tensors, .seed = c->seed, .sink = sink};
    pv_status st = list_pieces(tensors, n_tensors, head_size, offsets, &r.jobs, &r.n_jobs);
    if (st != PV_OK)
        return st;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t n_threads = c->n_threads ? c->n_threads : cpus > 0 ? (uint64_t)cpus : 1;
    if (n_threads > r.n_jobs)
        n_threads = r.n_jobs ? r.n_jobs : 1;
    pthread_t *threads = calloc(n_threads, sizeof *threads);
    if (!threads || pthread_mutex_init(&r.lock, NULL) != 0) {
        free(threads);
        free(r.jobs);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model: %" PRIu64 " writer threads",
                        n_threads);
    }
    /* A thread that cannot start leaves its share to the others. */
    uint64_t started = 0;
    for (uint64_t i = 1; i < n_threads; i++)
        if (pthread_create(&threads[started], NULL, block_worker, &r) == 0)
            started++;
    block_worker(&r);
    for (uint64_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&r.lock);
    free(threads);
    free(r.jobs);
    if (r.status != PV_OK)
        return pv_error(r.status, "%s", r.message);
    return PV_OK;
}

/* ---- the two outputs ---------------------------------------------------------------- */

/* Whether c is drawn as floats (the tiny model, whose bytes tests pin). */
static int drawn_as_floats(const pv_synth_config *c)
{
    return c->n_vocab == 0 && c->weight_type == PV_SYNTH_MIXED_TYPES;
}

/* The random-block model into a memory image or a file: the head first
 * (its size tells the file's), then the tensors. */
static pv_status write_model(const pv_synth_config *c, const char *path, uint8_t **out,
                             uint64_t *size)
{
    pv_gguf_writer w;
    synth_tensor *tensors = NULL;
    uint32_t n_tensors = 0;
    uint8_t *head = NULL;
    uint64_t head_size = 0, file_size = 0, *offsets = NULL;
    synth_sink sink = {.fd = -1, .path = path ? path : "<memory>"};
    pv_status st = pv_gguf_writer_init(&w, c->version, c->alignment);
    if (st == PV_OK)
        st = build(c, &w, &tensors, &n_tensors, 0);
    if (st == PV_OK && !(offsets = malloc(n_tensors * sizeof *offsets)))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model: %u tensor offsets", n_tensors);
    if (st == PV_OK)
        st = pv_gguf_writer_head(&w, &head, &head_size, offsets, &file_size);
    pv_gguf_writer_free(&w);
    if (st == PV_OK && !path && !(sink.mem = file_size <= SIZE_MAX ? calloc(file_size, 1) : NULL))
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "synthetic model image of %" PRIu64 " bytes",
                      file_size);
    if (st == PV_OK && path && (sink.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
        st = pv_error(PV_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (st == PV_OK)
        st = sink_put(&sink, 0, head, head_size);
    if (st == PV_OK)
        st = write_blocks(c, tensors, n_tensors, head_size, offsets, &sink);
    if (sink.fd >= 0) {
        /* a partial model is no model: remove it (only a plain file) */
        struct stat sb;
        int regular = fstat(sink.fd, &sb) == 0 && S_ISREG(sb.st_mode);
        if (close(sink.fd) != 0 && st == PV_OK)
            st = pv_error(PV_ERR_IO, "%s: close: %s", path, strerror(errno));
        if (st != PV_OK && regular)
            unlink(path);
    }
    free(head);
    free(offsets);
    free(tensors);
    if (st == PV_OK && !path) {
        *out = sink.mem;
        *size = file_size;
    } else {
        free(sink.mem);
    }
    return st;
}

pv_status pv_synth_to_memory(const pv_synth_config *c, uint8_t **out, uint64_t *size)
{
    if (!c || !out || !size)
        return pv_error(PV_ERR_INVALID_ARG, "pv_synth_to_memory: NULL argument");
    if (!drawn_as_floats(c))
        return write_model(c, NULL, out, size);
    pv_gguf_writer w;
    synth_tensor *tensors = NULL;
    uint32_t n_tensors;
    pv_status st = pv_gguf_writer_init(&w, c->version, c->alignment);
    if (st == PV_OK)
        st = build(c, &w, &tensors, &n_tensors, 1);
    if (st == PV_OK)
        st = pv_gguf_writer_to_memory(&w, out, size);
    pv_gguf_writer_free(&w);
    free(tensors);
    return st;
}

pv_status pv_synth_write(const pv_synth_config *c, const char *path)
{
    if (!c || !path)
        return pv_error(PV_ERR_INVALID_ARG, "pv_synth_write: NULL %s", c ? "path" : "config");
    if (!drawn_as_floats(c))
        return write_model(c, path, NULL, NULL);
    pv_gguf_writer w;
    synth_tensor *tensors = NULL;
    uint32_t n_tensors;
    pv_status st = pv_gguf_writer_init(&w, c->version, c->alignment);
    if (st == PV_OK)
        st = build(c, &w, &tensors, &n_tensors, 1);
    if (st == PV_OK)
        st = pv_gguf_writer_write(&w, path);
    pv_gguf_writer_free(&w);
    free(tensors);
    return st;
}
