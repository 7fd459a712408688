/* Multi-turn conversation workloads: generated from a dataset's means or
 * replayed from JSONL (bench/workload.h has the distributions). */
#include "bench/workload.h"

#include <jansson.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const wl_dataset_stats wl_stats[] = {
    [WL_SHAREGPT] = {"sharegpt", 5.56, 37.77, 204.58},
    [WL_ULTRACHAT] = {"ultrachat", 3.86, 51.78, 257.81},
};

#define WL_SIGMA 1.0

const wl_dataset_stats *wl_dataset_stats_of(wl_dataset d)
{
    if ((unsigned)d >= sizeof wl_stats / sizeof wl_stats[0])
        return NULL;
    return &wl_stats[d];
}

int wl_dataset_parse(const char *name, wl_dataset *out)
{
    if (!name)
        return -1;
    for (unsigned i = 0; i < sizeof wl_stats / sizeof wl_stats[0]; i++)
        if (strcasecmp(name, wl_stats[i].name) == 0) {
            if (out)
                *out = (wl_dataset)i;
            return 0;
        }
    return -1;
}

void wl_options_default(wl_options *o)
{
    *o = (wl_options){
        .dataset = WL_SHAREGPT,
        .seed = 1,
        .n_conversations = 100,
        .rate = 1.0,
        .think_mean_s = 60.0,
        .time_scale = 1.0,
        .length_scale = 1.0,
        .context_cap = 16384,
        .system_prompts = 4,
    };
}

pv_status wl_options_check(const wl_options *o, int replay)
{
    if (!o)
        return pv_error(PV_ERR_INVALID_ARG, "workload options: NULL");
    if (!wl_dataset_stats_of(o->dataset))
        return pv_error(PV_ERR_INVALID_ARG, "workload dataset = %d: not sharegpt (%d) or ultrachat (%d)",
                        (int)o->dataset, (int)WL_SHAREGPT, (int)WL_ULTRACHAT);
    if (replay ? o->n_conversations < 0 : o->n_conversations < 1)
        return pv_error(PV_ERR_INVALID_ARG, "workload n_conversations = %d: must be >= %d",
                        (int)o->n_conversations, replay ? 0 : 1);
    /* !(x > 0) also refuses NaN. */
    if (!(o->rate > 0) || !isfinite(o->rate))
        return pv_error(PV_ERR_INVALID_ARG, "workload rate = %g: must be > 0 and finite", o->rate);
    if (!(o->think_mean_s >= 0) || !isfinite(o->think_mean_s))
        return pv_error(PV_ERR_INVALID_ARG, "workload think_mean_s = %g: must be >= 0 and finite",
                        o->think_mean_s);
    if (!(o->time_scale > 0) || !isfinite(o->time_scale))
        return pv_error(PV_ERR_INVALID_ARG, "workload time_scale = %g: must be > 0 and finite",
                        o->time_scale);
    if (!(o->length_scale > 0) || !isfinite(o->length_scale))
        return pv_error(PV_ERR_INVALID_ARG, "workload length_scale = %g: must be > 0 and finite",
                        o->length_scale);
    if (o->context_cap < 2)
        return pv_error(PV_ERR_INVALID_ARG,
                        "workload context_cap = %d: must be >= 2 (one input and one output token)",
                        (int)o->context_cap);
    if (o->system_prompt_tokens < 0 || o->system_prompt_tokens > o->context_cap - 2)
        return pv_error(PV_ERR_INVALID_ARG,
                        "workload system_prompt_tokens = %d: must be in [0, context_cap - 2 = %d] (the "
                        "preamble and a turn of one input and one output token)",
                        (int)o->system_prompt_tokens, (int)o->context_cap - 2);
    if (o->system_prompts < 1)
        return pv_error(PV_ERR_INVALID_ARG, "workload system_prompts = %d: must be >= 1",
                        (int)o->system_prompts);
    if (replay && o->system_prompt_tokens > 0)
        return pv_error(PV_ERR_INVALID_ARG,
                        "workload system_prompt_tokens = %d: a replay sends its file's conversations "
                        "as recorded, their own system messages as their preambles",
                        (int)o->system_prompt_tokens);
    return PV_OK;
}

/* ---- random numbers: splitmix64 ------------------------------------------- */

typedef struct wl_rng {
    uint64_t s;
} wl_rng;

uint64_t wl_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

uint64_t wl_splitmix64(uint64_t *state)
{
    *state += WL_GAMMA;
    return wl_mix64(*state);
}

static uint64_t wl_next(wl_rng *r)
{
    return wl_splitmix64(&r->s);
}

enum { WL_STREAM_ARRIVALS, WL_STREAM_LENGTHS, WL_STREAM_THINK, WL_STREAMS };

/* The stream `tag` of conversation i: distinct (i, tag) give distinct
 * starting states, since WL_GAMMA is odd and wl_mix64 is a bijection. */
static wl_rng wl_stream(uint64_t seed, int64_t i, int tag)
{
    uint64_t k = (uint64_t)i * WL_STREAMS + (uint64_t)tag + 1;
    return (wl_rng){wl_mix64(seed + WL_GAMMA * k)};
}

/* Conversation i's preamble choice. The arrivals use index 0's stream
 * only, so the arrival streams of indices 1.. are free: index i + 1's is
 * distinct from every other stream, and adding it moved none of them
 * (the workloads of before issue 28 are unchanged). */
static wl_rng wl_system_stream(uint64_t seed, int64_t i)
{
    return wl_stream(seed, i + 1, WL_STREAM_ARRIVALS);
}

/* Preamble k's contents: its index offsets a key of their own, hashed and
 * mixed with the seed (bijections both: distinct k, distinct states). */
#define WL_SYSTEM_KEY UINT64_C(0x73797374656D0000) /* "system" */

uint64_t wl_system_prompt_state(uint64_t seed, int32_t k)
{
    return wl_mix64(seed ^ wl_mix64(WL_SYSTEM_KEY + (uint64_t)(uint32_t)k));
}

int32_t wl_token_id(uint64_t draw, uint32_t n_vocab)
{
    return (int32_t)(n_vocab / 4 + draw % (n_vocab / 2));
}

void wl_system_prompt_ids(uint64_t seed, int32_t k, int32_t n, uint32_t n_vocab, int32_t *ids)
{
    uint64_t s = wl_system_prompt_state(seed, k);
    for (int32_t i = 0; i < n; i++)
        ids[i] = wl_token_id(wl_splitmix64(&s), n_vocab);
}

/* Uniform in (0, 1): never 0, so log() stays finite. */
static double wl_uniform(wl_rng *r)
{
    return ((double)(wl_next(r) >> 11) + 0.5) * 0x1.0p-53;
}

static double wl_exponential(wl_rng *r, double mean)
{
    return -mean * log(wl_uniform(r));
}

/* Box-Muller; the second normal of each pair is dropped, so every draw
 * uses exactly two uniforms and the streams stay simple to reason about. */
static double wl_normal(wl_rng *r)
{
    double u1 = wl_uniform(r), u2 = wl_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* Rounds to the nearest integer and clamps to [1, INT32_MAX] before the
 * conversion, which would be undefined past the range. */
static int32_t wl_tokens(double x)
{
    if (!(x >= 1.0))
        return 1;
    if (x >= (double)INT32_MAX)
        return INT32_MAX;
    return (int32_t)lround(x);
}

static int32_t wl_lognormal_tokens(wl_rng *r, double mean)
{
    double mu = log(mean) - 0.5 * WL_SIGMA * WL_SIGMA;
    return wl_tokens(exp(mu + WL_SIGMA * wl_normal(r)));
}

/* 1 + Geometric(1/mean), failures before the first success: mean `mean`. */
static int64_t wl_turn_count(wl_rng *r, double mean)
{
    double u = wl_uniform(r);
    if (mean <= 1.0)
        return 1;
    double g = floor(log(u) / log1p(-1.0 / mean));
    return g >= (double)INT32_MAX - 1 ? INT32_MAX : 1 + (int64_t)g;
}

/* ---- the context cap ----------------------------------------------------- */

/* Shortens a first turn that alone is past the cap (see workload.h). */
static void wl_fit_first(wl_turn *t, int32_t cap)
{
    if ((int64_t)t->input_tokens + t->output_tokens <= cap)
        return;
    int32_t out_keep = t->output_tokens < cap / 2 ? t->output_tokens : cap / 2;
    if (t->input_tokens > cap - out_keep)
        t->input_tokens = cap - out_keep;
    if (t->output_tokens > cap - t->input_tokens)
        t->output_tokens = cap - t->input_tokens;
}

/* How many of turns[0..n) fit under the cap (at least 1, the first turn
 * shortened when needed). */
static int32_t wl_apply_cap(wl_turn *turns, int32_t n, int32_t cap)
{
    if (n < 1)
        return n;
    wl_fit_first(&turns[0], cap);
    int64_t ctx = (int64_t)turns[0].input_tokens + turns[0].output_tokens;
    int32_t k = 1;
    for (; k < n; k++) {
        int64_t next = ctx + turns[k].input_tokens + turns[k].output_tokens;
        if (next > cap)
            break;
        ctx = next;
    }
    return k;
}

/* Think times of a conversation's turns: one draw per turn after the
 * first, from the conversation's own stream. */
static void wl_draw_thinks(const wl_options *o, int64_t i, wl_turn *turns, int32_t n)
{
    wl_rng r = wl_stream(o->seed, i, WL_STREAM_THINK);
    turns[0].think_s = 0.0;
    for (int32_t k = 1; k < n; k++)
        turns[k].think_s = wl_exponential(&r, o->think_mean_s) * o->time_scale;
}

/* Arrivals of conv[0..n): the gaps are summed unscaled and the sum scaled,
 * so a run at another time_scale has exactly the scaled times. */
static void wl_draw_arrivals(const wl_options *o, wl_conversation *conv, int32_t n)
{
    wl_rng r = wl_stream(o->seed, 0, WL_STREAM_ARRIVALS);
    double t = 0.0;
    for (int32_t i = 0; i < n; i++) {
        t += wl_exponential(&r, 1.0 / o->rate);
        conv[i].arrival_s = t * o->time_scale;
    }
}

void wl_free(wl_workload *w)
{
    if (!w)
        return;
    for (int32_t i = 0; i < w->n && w->conv; i++) {
        wl_conversation *c = &w->conv[i];
        for (int32_t k = 0; k < c->n_turns && c->turns; k++)
            free(c->turns[k].text);
        free(c->turns);
        free(c->system_text);
    }
    free(w->conv);
    w->conv = NULL;
    w->n = 0;
}

pv_status wl_generate(const wl_options *o, wl_workload *out)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "wl_generate: NULL workload");
    *out = (wl_workload){0};
    pv_status st = wl_options_check(o, 0);
    if (st != PV_OK)
        return st;
    const wl_dataset_stats *ds = wl_dataset_stats_of(o->dataset);
    double in_mean = ds->input_tokens * o->length_scale;
    double out_mean = ds->output_tokens * o->length_scale;
    /* What the preamble leaves; every turn holds at least 2 tokens, so no
     * more than cap/2 fit. */
    const int32_t cap = o->context_cap - o->system_prompt_tokens;
    int64_t max_turns = cap / 2;

    wl_workload w = {calloc((size_t)o->n_conversations, sizeof *w.conv), 0};
    if (!w.conv)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "workload: %d conversations of %zu bytes",
                        (int)o->n_conversations, sizeof *w.conv);
    for (int32_t i = 0; i < o->n_conversations; i++) {
        wl_rng r = wl_stream(o->seed, i, WL_STREAM_LENGTHS);
        int64_t want = wl_turn_count(&r, ds->turns);
        int32_t n = (int32_t)(want < max_turns ? want : max_turns);
        wl_turn *turns = calloc((size_t)n, sizeof *turns);
        if (!turns) {
            wl_free(&w);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "workload: %d turns of %zu bytes", (int)n,
                            sizeof *turns);
        }
        w.conv[i].turns = turns;
        w.n = i + 1;
        for (int32_t k = 0; k < n; k++) {
            turns[k].input_tokens = wl_lognormal_tokens(&r, in_mean);
            turns[k].output_tokens = wl_lognormal_tokens(&r, out_mean);
        }
        w.conv[i].n_turns = wl_apply_cap(turns, n, cap);
        wl_draw_thinks(o, i, turns, w.conv[i].n_turns);
        if (o->system_prompt_tokens > 0) {
            wl_rng sr = wl_system_stream(o->seed, i);
            w.conv[i].system_tokens = o->system_prompt_tokens;
            w.conv[i].system_prompt = (int32_t)(wl_next(&sr) % (uint64_t)o->system_prompts);
        }
    }
    wl_draw_arrivals(o, w.conv, w.n);
    *out = w;
    return PV_OK;
}

/* ---- replay ---------------------------------------------------------------- */

typedef struct wl_reader {
    const char *path;
    long line;
    int32_t (*count)(void *ctx, const char *text);
    void *ctx;
} wl_reader;

/* A message's text: a string, or an array's text parts joined with "\n".
 * NULL with *bad set for content of another type; NULL with *bad clear
 * when out of memory. */
static char *wl_content_text(const json_t *content, int *bad)
{
    *bad = 0;
    if (json_is_string(content))
        return strdup(json_string_value(content));
    if (!json_is_array(content)) {
        *bad = 1;
        return NULL;
    }
    size_t len = 0, i;
    const json_t *part;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (type && strcmp(type, "text") == 0 && json_is_string(text))
            len += json_string_length(text) + 1; /* the text and a "\n" or the NUL */
    }
    char *s = malloc(len ? len : 1), *p = s;
    if (!s)
        return NULL;
    json_array_foreach(content, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (type && strcmp(type, "text") == 0 && json_is_string(text)) {
            if (p != s)
                *p++ = '\n';
            size_t n = json_string_length(text);
            memcpy(p, json_string_value(text), n);
            p += n;
        }
    }
    *p = '\0';
    return s;
}

static pv_status wl_count(const wl_reader *rd, size_t msg, const char *text, int32_t *out)
{
    if (!rd->count) {
        size_t q = strlen(text) / 4 + (strlen(text) % 4 != 0);
        *out = q >= (size_t)INT32_MAX ? INT32_MAX : (q ? (int32_t)q : 1);
        return PV_OK;
    }
    int32_t n = rd->count(rd->ctx, text);
    if (n < 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s:%ld: message %zu: the token count is %d, below 0",
                        rd->path, rd->line, msg, (int)n);
    *out = n ? n : 1;
    return PV_OK;
}

/* Appends a system message's text to *acc, after a "\n" when *acc holds
 * one already; text is taken (freed here on failure). */
static pv_status wl_join_system(const wl_reader *rd, size_t msg, char **acc, char *text)
{
    if (!*acc) {
        *acc = text;
        return PV_OK;
    }
    const size_t have = strlen(*acc), add = strlen(text);
    char *joined = realloc(*acc, have + 1 + add + 1);
    if (!joined) {
        free(text);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s:%ld: message %zu: %zu bytes of system text", rd->path, rd->line,
                        msg, have + 1 + add + 1);
    }
    joined[have] = '\n';
    memcpy(joined + have + 1, text, add + 1);
    free(text);
    *acc = joined;
    return PV_OK;
}

/* One line's conversation: its system text, its turns before the cap and
 * think times. */
static pv_status wl_parse_conversation(const wl_reader *rd, const json_t *root, const wl_options *o,
                                       wl_conversation *c)
{
    const json_t *msgs = json_object_get(root, "messages");
    if (!json_is_array(msgs))
        return pv_error(PV_ERR_FORMAT, "%s:%ld: no \"messages\" array", rd->path, rd->line);
    size_t n_msgs = json_array_size(msgs);
    if (n_msgs > (size_t)INT32_MAX)
        return pv_error(PV_ERR_FORMAT, "%s:%ld: %zu messages, more than %d", rd->path, rd->line,
                        n_msgs, (int)INT32_MAX);
    /* n_msgs bounds the turns; calloc checks the product. */
    wl_turn *turns = calloc(n_msgs ? n_msgs : 1, sizeof *turns);
    if (!turns)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s:%ld: %zu turns", rd->path, rd->line, n_msgs);
    c->turns = turns;
    c->n_turns = 0;
    const wl_dataset_stats *ds = wl_dataset_stats_of(o->dataset);
    int32_t mean_out = wl_tokens(ds->output_tokens * o->length_scale);
    int answered = 0;
    size_t first_system = 0; /* names the system text in a count's refusal */
    for (size_t m = 0; m < n_msgs; m++) {
        const json_t *msg = json_array_get(msgs, m);
        const char *role = json_string_value(json_object_get(msg, "role"));
        if (!role)
            return pv_error(PV_ERR_FORMAT, "%s:%ld: message %zu has no \"role\" string", rd->path,
                            rd->line, m);
        /* "developer" is OpenAI's newer name for "system" (pensieve-serve reads it so) */
        int user = strcmp(role, "user") == 0, assistant = strcmp(role, "assistant") == 0,
            system = strcmp(role, "system") == 0 || strcmp(role, "developer") == 0;
        if (!user && !assistant && !system) {
            if (strcmp(role, "tool") == 0)
                continue;
            return pv_error(PV_ERR_FORMAT, "%s:%ld: message %zu has the unknown role \"%s\"",
                            rd->path, rd->line, m, role);
        }
        int bad;
        const json_t *content = json_object_get(msg, "content");
        char *text = content ? wl_content_text(content, &bad) : NULL;
        if (!text) {
            if (!content || bad)
                return pv_error(PV_ERR_FORMAT,
                                "%s:%ld: message %zu has no \"content\" string or array of parts",
                                rd->path, rd->line, m);
            return pv_error(PV_ERR_OUT_OF_MEMORY, "%s:%ld: message %zu's text", rd->path,
                            rd->line, m);
        }
        if (system) {
            if (!c->system_text)
                first_system = m;
            pv_status st = wl_join_system(rd, m, &c->system_text, text);
            if (st != PV_OK)
                return st;
            continue;
        }
        int32_t tokens = 0;
        pv_status st = wl_count(rd, m, text, &tokens);
        if (st != PV_OK) {
            free(text);
            return st;
        }
        if (user) {
            wl_turn *t = &turns[c->n_turns++];
            t->input_tokens = tokens;
            t->output_tokens = mean_out;
            t->text = text;
            answered = 0;
            continue;
        }
        free(text);
        if (c->n_turns == 0)
            continue; /* an assistant message before any user message has no request */
        wl_turn *t = &turns[c->n_turns - 1];
        /* Consecutive answers add up; the first replaces the mean. */
        int64_t sum = (answered ? (int64_t)t->output_tokens : 0) + tokens;
        t->output_tokens = sum > INT32_MAX ? INT32_MAX : (int32_t)sum;
        answered = 1;
    }
    if (c->n_turns == 0)
        return pv_error(PV_ERR_FORMAT, "%s:%ld: no user message", rd->path, rd->line);
    if (c->system_text) {
        pv_status st = wl_count(rd, first_system, c->system_text, &c->system_tokens);
        if (st != PV_OK)
            return st;
        /* As a generated preamble: it must leave a turn of 2 tokens. */
        if (c->system_tokens > o->context_cap - 2)
            return pv_error(PV_ERR_FORMAT,
                            "%s:%ld: the system messages' %d tokens leave no room for a turn under the "
                            "context cap of %d tokens",
                            rd->path, rd->line, (int)c->system_tokens, (int)o->context_cap);
    }
    int32_t keep = wl_apply_cap(turns, c->n_turns, o->context_cap - c->system_tokens);
    for (int32_t k = keep; k < c->n_turns; k++) {
        free(turns[k].text);
        turns[k].text = NULL;
    }
    c->n_turns = keep;
    return PV_OK;
}

static int wl_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i]))
            return 0;
    return 1;
}

pv_status wl_load_jsonl(const char *path, const wl_options *o,
                        int32_t (*count)(void *ctx, const char *text), void *ctx, wl_workload *out)
{
    if (!out)
        return pv_error(PV_ERR_INVALID_ARG, "wl_load_jsonl: NULL workload");
    *out = (wl_workload){0};
    if (!path)
        return pv_error(PV_ERR_INVALID_ARG, "wl_load_jsonl: NULL path");
    pv_status st = wl_options_check(o, 1);
    if (st != PV_OK)
        return st;
    FILE *f = fopen(path, "r");
    if (!f)
        return pv_error(PV_ERR_IO, "%s: cannot open: %s", path, strerror(errno));

    wl_reader rd = {path, 0, count, ctx};
    wl_workload w = {0};
    int32_t cap = 0;
    char *line = NULL;
    size_t line_size = 0;
    ssize_t len;
    errno = 0;
    while ((o->n_conversations == 0 || w.n < o->n_conversations) &&
           (len = getline(&line, &line_size, f)) >= 0) {
        rd.line++;
        if (wl_blank(line, (size_t)len))
            continue;
        json_error_t jerr;
        json_t *root = json_loadb(line, (size_t)len, 0, &jerr);
        if (!root) {
            st = pv_error(PV_ERR_FORMAT, "%s:%ld: not JSON: %s (column %d)", path, rd.line,
                          jerr.text, jerr.column);
            goto fail;
        }
        if (w.n == cap) {
            /* Doubling, refused before the count overflows int32. */
            int32_t grow = cap ? (cap > INT32_MAX / 2 ? INT32_MAX : cap * 2) : 64;
            if (grow == cap) {
                json_decref(root);
                st = pv_error(PV_ERR_FORMAT, "%s:%ld: more than %d conversations", path, rd.line,
                              (int)INT32_MAX);
                goto fail;
            }
            wl_conversation *g = realloc(w.conv, (size_t)grow * sizeof *g);
            if (!g) {
                json_decref(root);
                st = pv_error(PV_ERR_OUT_OF_MEMORY, "%s:%ld: %d conversations", path, rd.line,
                              (int)grow);
                goto fail;
            }
            w.conv = g;
            cap = grow;
        }
        w.conv[w.n] = (wl_conversation){0};
        w.n++; /* counted now so wl_free releases a half-read one */
        st = wl_parse_conversation(&rd, root, o, &w.conv[w.n - 1]);
        json_decref(root);
        if (st != PV_OK)
            goto fail;
        wl_draw_thinks(o, w.n - 1, w.conv[w.n - 1].turns, w.conv[w.n - 1].n_turns);
        errno = 0;
    }
    if (ferror(f)) {
        st = pv_error(PV_ERR_IO, "%s:%ld: read error: %s", path, rd.line + 1,
                      strerror(errno ? errno : EIO));
        goto fail;
    }
    if (w.n == 0) {
        st = pv_error(PV_ERR_FORMAT, "%s: no conversation in %ld lines", path, rd.line);
        goto fail;
    }
    free(line);
    fclose(f);
    wl_draw_arrivals(o, w.conv, w.n);
    *out = w;
    return PV_OK;
fail:
    free(line);
    fclose(f);
    wl_free(&w);
    return st;
}

void wl_summarise(const wl_workload *w, wl_summary *s)
{
    *s = (wl_summary){0};
    if (!w || !w->conv || w->n <= 0)
        return;
    double in = 0, outs = 0, think = 0;
    int64_t thinks = 0;
    for (int32_t i = 0; i < w->n; i++) {
        const wl_conversation *c = &w->conv[i];
        s->requests += c->n_turns;
        for (int32_t k = 0; k < c->n_turns; k++) {
            in += c->turns[k].input_tokens;
            outs += c->turns[k].output_tokens;
            if (k > 0) {
                think += c->turns[k].think_s;
                thinks++;
            }
        }
        if (c->arrival_s > s->last_arrival_s)
            s->last_arrival_s = c->arrival_s;
    }
    s->conversations = w->n;
    s->mean_turns = (double)s->requests / (double)w->n;
    s->mean_input = s->requests ? in / (double)s->requests : 0;
    s->mean_output = s->requests ? outs / (double)s->requests : 0;
    s->mean_gap_s = s->last_arrival_s / (double)w->n;
    s->mean_think_s = thinks ? think / (double)thinks : 0;
}
