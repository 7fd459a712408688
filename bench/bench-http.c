/* pensieve-bench's HTTP driver (bench-http.h): the workload in real time
 * against an OpenAI-compatible server, on one thread with libcurl's multi
 * interface. The loop sends every turn that is due, lets libcurl move the
 * bytes (curl_multi_perform), takes the finished transfers
 * (curl_multi_info_read) and sleeps in curl_multi_poll until the next byte
 * or the next turn due, whichever comes first. Streams are parsed as their
 * bytes arrive, so a turn's first token is timed when it reaches the
 * client. */
#include "config.h"

#include "bench/bench-http.h"
#include "bench/bench-util.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "pensieve-bench";

/* 256 common English words, each one token with its leading space in
 * SmolLM2's (GPT-2 style) vocabulary; 256 so a byte of a draw picks one
 * without bias. */
static const char *const words[256] = {
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on", "are", "with", "as",
    "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what",
    "some", "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how", "said",
    "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about", "many", "then", "them",
    "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has",
    "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my",
    "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now", "find",
    "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after", "back", "little",
    "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our", "under", "name",
    "very", "through", "just", "form", "great", "think", "say", "help", "low", "line", "turn", "cause",
    "much", "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does", "set", "three",
    "want", "air", "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men",
    "change", "went", "light", "kind", "off", "need", "house", "picture", "try", "us", "again", "animal",
    "point", "mother", "world", "near", "build", "self", "earth", "father", "head", "stand", "own", "page",
    "should", "country", "found", "answer", "school", "grow", "study", "still", "learn", "plant", "cover",
    "food", "sun", "four", "between", "state", "keep", "eye", "never", "last", "let", "thought", "city",
    "tree", "cross", "farm", "hard", "start", "might", "story", "saw", "far", "sea", "draw", "left", "late",
    "run", "while", "press", "close", "night", "real", "life", "few", "north", "open", "seem", "together",
    "next", "white", "children", "begin", "got", "walk", "example", "ease", "paper", "group",
};

#define MAX_EVENT ((size_t)16 << 20)  /* an event stream line or event: far past any server's */
#define MAX_TEXT ((size_t)1 << 30)    /* a message or an answer */
#define MAX_METRICS ((size_t)8 << 20) /* a /metrics page (pensieve-serve's is about 10 KiB) */
#define MAX_ERROR_BODY 4096           /* of a non-200 answer, enough for its message */
#define CONTROL_TIMEOUT_MS 10000L     /* the probe, /metrics, a session's DELETE */

/* ---- growing text ------------------------------------------------------------------ */

/* Appends n bytes, keeping the text NUL-terminated; what names the text in
 * the error (past max bytes, or no memory). */
static pv_status text_add(bh_text *t, const char *p, size_t n, size_t max, const char *what)
{
    if (n > max - t->n) /* t->n <= max always holds, so this cannot wrap */
        return pv_error(PV_ERR_FORMAT, "%s past %zu bytes", what, max);
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n + 1) /* max is far below SIZE_MAX / 2: no overflow */
            cap *= 2;
        char *grown = realloc(t->p, cap);
        if (!grown)
            return pv_error(PV_ERR_OUT_OF_MEMORY, "no memory for %s of %zu bytes", what, t->n + n);
        t->p = grown;
        t->cap = cap;
    }
    if (n)
        memcpy(t->p + t->n, p, n);
    t->n += n;
    t->p[t->n] = '\0';
    return PV_OK;
}

static void text_clear(bh_text *t)
{
    t->n = 0;
    if (t->p)
        t->p[0] = '\0';
}

static void text_free(bh_text *t)
{
    free(t->p);
    memset(t, 0, sizeof *t);
}

/* ---- generated messages -------------------------------------------------------------- */

/* n words drawn from state s into *t. */
static pv_status words_from(uint64_t s, int32_t n, bh_text *t)
{
    uint64_t draw = 0;
    text_clear(t);
    PV_TRY(text_add(t, "", 0, MAX_TEXT, "a message"));
    for (int32_t i = 0; i < n; i++) {
        if (i % 8 == 0) /* a draw picks eight words, a byte each */
            draw = wl_splitmix64(&s);
        const char *word = words[draw & 255];
        draw >>= 8;
        if (i)
            PV_TRY(text_add(t, " ", 1, MAX_TEXT, "a message"));
        PV_TRY(text_add(t, word, strlen(word), MAX_TEXT, "a message"));
    }
    return PV_OK;
}

pv_status bh_words(uint64_t seed, int32_t conv, int32_t turn, int32_t n, bh_text *t)
{
    /* A stream per (conversation, turn): wl_mix64 is a bijection, so
     * distinct keys start distinct states. */
    return words_from(wl_mix64(seed) ^ wl_mix64(((uint64_t)(uint32_t)conv << 32) | (uint32_t)turn), n, t);
}

pv_status bh_system_words(uint64_t seed, int32_t k, int32_t n, bh_text *t)
{
    return words_from(wl_system_prompt_state(seed, k), n, t);
}

/* ---- the event stream ------------------------------------------------------------------ */

/* One line, without its end. */
static pv_status sse_line(bh_sse *s, const char *line, size_t n, bh_sse_fn fn, void *user)
{
    if (n == 0) { /* a blank line dispatches the event, if it has data */
        if (s->data.n == 0)
            return PV_OK;
        s->data.p[--s->data.n] = '\0'; /* the last data line's LF */
        pv_status st = fn(user, s->data.p, s->data.n);
        text_clear(&s->data);
        return st;
    }
    const char *colon = memchr(line, ':', n);
    const size_t name = colon ? (size_t)(colon - line) : n;
    if (name != 4 || memcmp(line, "data", 4) != 0) /* a comment (name 0), event, id, retry */
        return PV_OK;
    const char *v = colon ? colon + 1 : line + n;
    if (v < line + n && *v == ' ')
        v++;
    PV_TRY(text_add(&s->data, v, (size_t)(line + n - v), MAX_EVENT, "an event stream event"));
    return text_add(&s->data, "\n", 1, MAX_EVENT, "an event stream event");
}

pv_status bh_sse_feed(bh_sse *s, const char *p, size_t n, bh_sse_fn fn, void *user)
{
    const char *end = p + n;
    while (p < end) {
        if (s->skip_lf) {
            s->skip_lf = 0;
            if (*p == '\n') {
                p++;
                continue;
            }
        }
        const char *eol = p;
        while (eol < end && *eol != '\n' && *eol != '\r')
            eol++;
        PV_TRY(text_add(&s->line, p, (size_t)(eol - p), MAX_EVENT, "an event stream line"));
        if (eol == end)
            break; /* the line goes on in the next bytes */
        s->skip_lf = *eol == '\r';
        p = eol + 1;
        pv_status st = sse_line(s, s->line.p, s->line.n, fn, user);
        text_clear(&s->line);
        PV_TRY(st);
    }
    return PV_OK;
}

pv_status bh_sse_end(bh_sse *s, bh_sse_fn fn, void *user)
{
    pv_status st = s->line.n ? sse_line(s, s->line.p, s->line.n, fn, user) : PV_OK;
    text_clear(&s->line);
    return st == PV_OK ? sse_line(s, "", 0, fn, user) : st;
}

void bh_sse_free(bh_sse *s)
{
    text_free(&s->line);
    text_free(&s->data);
    s->skip_lf = 0;
}

/* ---- /metrics ---------------------------------------------------------------------------- */

/* A plain decimal integer after a sample's name (and before an optional
 * timestamp); 0 for anything else ("1e3", "NaN", overflow). */
static int parse_u64(const char *p, const char *end, uint64_t *v)
{
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    if (p == end || *p < '0' || *p > '9')
        return 0;
    uint64_t x = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        const unsigned d = (unsigned)(*p - '0');
        if (x > (UINT64_MAX - d) / 10)
            return 0;
        x = x * 10 + d;
    }
    if (p < end && *p != ' ' && *p != '\t' && *p != '\r')
        return 0;
    *v = x;
    return 1;
}

void bh_metrics_parse(const char *text, size_t len, br_counters *out)
{
    static const char *const names[] = {
        "pensieve_engine_turns_total{result=\"done\"}", "pensieve_engine_turns_total{result=\"failed\"}",
        "pensieve_engine_prefill_tokens_total",         "pensieve_engine_recomputed_tokens_total",
        "pensieve_engine_decode_tokens_total",          "pensieve_cache_swap_in_chunks_total",
        "pensieve_cache_swap_out_chunks_total",         "pensieve_cache_dropped_chunks_total",
        "pensieve_engine_suspensions_total",
    };
    enum { N = sizeof names / sizeof *names };
    memset(out, 0, sizeof *out);
    uint64_t *const values[N] = {&out->turns_done,     &out->turns_failed,    &out->prefill_tokens,
                                 &out->recomputed_tokens, &out->decode_tokens, &out->swap_in_chunks,
                                 &out->swap_out_chunks, &out->dropped_chunks,  &out->suspensions};
    unsigned found = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        const size_t n = (size_t)(line_end - p);
        for (int i = 0; i < N; i++) {
            const size_t k = strlen(names[i]);
            if (n > k && memcmp(p, names[i], k) == 0 && (p[k] == ' ' || p[k] == '\t') &&
                parse_u64(p + k, line_end, values[i]))
                found |= 1u << i;
        }
        p = nl ? nl + 1 : end;
    }
    if (found != (1u << N) - 1)
        memset(out, 0, sizeof *out);
    else
        out->known = 1;
}

/* ---- a streamed answer ------------------------------------------------------------------ */

void bh_answer_init(bh_answer *a)
{
    *a = (bh_answer){.first_s = -1, .completion = -1};
}

void bh_answer_free(bh_answer *a)
{
    text_free(&a->text);
    bh_answer_init(a);
}

pv_status bh_answer_event(bh_answer *a, double now, const char *data, size_t len)
{
    if (a->done || len == 0)
        return PV_OK;
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        a->done = 1;
        return PV_OK;
    }
    json_error_t jerr;
    json_t *j = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(j)) {
        const char *why = j ? "not an object" : jerr.text;
        pv_error(PV_ERR_FORMAT, "an event that is not a JSON object (%s): %.60s", why, data);
        json_decref(j);
        return PV_ERR_FORMAT;
    }
    json_t *err = json_object_get(j, "error");
    if (err && !a->error[0]) {
        const char *msg = json_string_value(json_is_object(err) ? json_object_get(err, "message") : err);
        snprintf(a->error, sizeof a->error, "%s", msg ? msg : "(no message)");
    }
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"),
                                      "content");
    pv_status st = PV_OK;
    if (json_string_length(content) > 0) { /* the role's chunk has "" */
        if (a->first_s < 0)
            a->first_s = now;
        a->chunks++;
        st = text_add(&a->text, json_string_value(content), json_string_length(content), MAX_TEXT, "an answer");
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        const json_int_t prompt = json_integer_value(json_object_get(usage, "prompt_tokens"));
        const json_int_t cached = json_integer_value(
            json_object_get(json_object_get(usage, "prompt_tokens_details"), "cached_tokens"));
        const json_t *completion = json_object_get(usage, "completion_tokens");
        a->prompt_tokens = prompt > 0 ? (uint64_t)prompt : 0;
        a->cached_tokens = cached > 0 ? (uint64_t)cached : 0;
        if (json_is_integer(completion))
            a->completion = json_integer_value(completion) > 0 ? (int64_t)json_integer_value(completion) : 0;
    }
    json_decref(j);
    return st;
}

/* ---- the run's state ---------------------------------------------------------------------- */

typedef struct run run;

/* One transfer: a turn's streamed completion, or a session's DELETE. */
typedef struct request {
    run *r;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* the POST body: libcurl reads it in place */
    int32_t conv, turn;
    int64_t record;      /* its br_record; -1 for a DELETE */
    double now;          /* when the bytes being parsed arrived */
    long status;         /* the HTTP status, read at the first body bytes */
    bh_sse sse;
    bh_answer answer;
    bh_text error_body; /* a non-200 answer's first bytes, for its message */
    char error[200];    /* why the stream's parser stopped the transfer; "" if it did not */
    char curl_error[CURL_ERROR_SIZE];
} request;

typedef struct conv_state {
    int32_t next;     /* the next turn to send */
    int ended;        /* no more turns: the last one ended, or one failed */
    double due_s;     /* when the next turn is due */
    request *req;     /* in flight, or NULL */
    bh_text *answers; /* [turn] for the turns answered so far */
} conv_state;

struct run {
    const bh_options *o;
    const wl_workload *w;
    br_run *out;
    char *base, *chat_url; /* the URL without a trailing / or /v1; its chat endpoint */
    CURLM *multi;
    conv_state *convs;
    int64_t total;   /* the workload's requests */
    int64_t settled; /* requests ended, and those never sent after a failure */
    int in_flight;   /* transfers in the multi handle */
    double t0;
    double next_due; /* the earliest turn due; INFINITY for none */
    int32_t lo, hi;  /* conversations in arrival order: [lo, hi) have arrived and not all ended */
    int warned;      /* a DELETE's failure was reported */
};

static double since(const run *r)
{
    return bench_now_s() - r->t0;
}

static void request_free(request *q)
{
    curl_easy_cleanup(q->easy);
    curl_slist_free_all(q->headers);
    free(q->body);
    bh_sse_free(&q->sse);
    bh_answer_free(&q->answer);
    text_free(&q->error_body);
    free(q);
}

/* Drops a transfer from the multi handle and frees it. */
static void request_drop(run *r, request *q)
{
    curl_multi_remove_handle(r->multi, q->easy);
    r->in_flight--;
    r->convs[q->conv].req = NULL;
    request_free(q);
}

static void conv_forget(const run *r, conv_state *cs, int32_t i)
{
    for (int32_t k = 0; cs->answers && k < r->w->conv[i].n_turns; k++)
        text_free(&cs->answers[k]);
    free(cs->answers);
    cs->answers = NULL;
}

/* ---- the transfers' callbacks ---------------------------------------------------------------- */

static pv_status on_event(void *user, const char *data, size_t len)
{
    request *q = user;
    return bh_answer_event(&q->answer, q->now, data, len);
}

/* libcurl hands over the body as it arrives. The clock is read first, so
 * parsing is not counted in the time to first token. */
static size_t on_stream(char *p, size_t size, size_t nmemb, void *user)
{
    request *q = user;
    const size_t n = size * nmemb;
    q->now = since(q->r);
    if (!q->status)
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &q->status);
    if (q->status != 200) {
        const size_t room = MAX_ERROR_BODY - q->error_body.n;
        return text_add(&q->error_body, p, n < room ? n : room, MAX_ERROR_BODY, "an error answer") == PV_OK ? n : 0;
    }
    if (bh_sse_feed(&q->sse, p, n, on_event, q) != PV_OK) {
        if (!q->error[0])
            snprintf(q->error, sizeof q->error, "%s", pv_last_error());
        return 0; /* libcurl aborts the transfer */
    }
    return n;
}

static size_t on_discard(char *p, size_t size, size_t nmemb, void *user)
{
    (void)p, (void)user;
    return size * nmemb;
}

static size_t on_collect(char *p, size_t size, size_t nmemb, void *user)
{
    return text_add(user, p, size * nmemb, MAX_METRICS, "a /metrics page") == PV_OK ? size * nmemb : 0;
}

/* ---- messages -------------------------------------------------------------------------------- */

/* snprintf may have cut a multi-byte character short: its remains go, so
 * the message stays UTF-8 (reports print it as a JSON string). */
static void trim_utf8(char *s)
{
    size_t n = strlen(s), k = n;
    while (k > 0 && ((unsigned char)s[k - 1] & 0xc0) == 0x80)
        k--;
    if (k == 0 || (unsigned char)s[k - 1] < 0xc0)
        return;
    const unsigned char lead = (unsigned char)s[k - 1];
    const size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : 2;
    if (n - (k - 1) < need)
        s[k - 1] = '\0';
}

/* What a non-200 answer says: OpenAI's error.message, FastAPI's detail, or
 * the body's first bytes (printable ASCII only: it may be anything). */
static void server_message(const bh_text *body, char *out, size_t cap)
{
    json_t *j = body->n ? json_loadb(body->p, body->n, 0, NULL) : NULL;
    json_t *err = json_object_get(j, "error");
    const char *msg = json_string_value(json_is_object(err) ? json_object_get(err, "message") : err);
    json_t *detail = json_object_get(j, "detail");
    char *dumped = !msg && detail ? json_dumps(detail, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (msg || dumped) {
        snprintf(out, cap, "%s", msg ? msg : dumped);
    } else {
        size_t k = 0;
        for (size_t i = 0; i < body->n && k + 1 < cap && k < 120; i++)
            out[k++] = body->p[i] >= 0x20 && body->p[i] < 0x7f ? body->p[i] : ' ';
        out[k] = '\0';
        if (k == 0)
            snprintf(out, cap, "(an empty body)");
    }
    free(dumped);
    json_decref(j);
}

/* ---- sending ------------------------------------------------------------------------------------- */

/* A transfer with the options every one shares. */
static pv_status request_new(run *r, int32_t conv, int32_t turn, long timeout_ms, request **out)
{
    request *q = calloc(1, sizeof *q);
    CURL *e = curl_easy_init();
    if (!q || !e) {
        free(q);
        curl_easy_cleanup(e);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: conversation %d turn %d: no memory for a transfer", prog, conv,
                        turn);
    }
    *q = (request){.r = r, .easy = e, .conv = conv, .turn = turn, .record = -1};
    bh_answer_init(&q->answer);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, q->curl_error);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    *out = q;
    return PV_OK;
}

static void session_id(const run *r, int32_t i, char *out, size_t cap)
{
    snprintf(out, cap, "%s%d", r->o->session_prefix, i);
}

static json_t *chat_message(const char *role, const char *text, size_t len)
{
    json_t *m = json_object();
    if (json_object_set_new(m, "role", json_string(role)) ||
        json_object_set_new(m, "content", json_stringn(text, len))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

pv_status bh_chat_body(const bh_options *o, const wl_conversation *c, int32_t conv, int32_t turn,
                       const bh_text *answers, char **out)
{
    *out = NULL;
    json_t *body = json_pack("{s:s, s:i, s:b, s:{s:b}, s:i}", "model", o->model, "max_tokens",
                             (int)c->turns[turn].output_tokens, "stream", 1, "stream_options", "include_usage", 1,
                             "temperature", 0);
    json_t *messages = json_array();
    /* json_object_set_new takes the value, also when it fails */
    int bad = json_object_set_new(body, "messages", messages) ||
              (o->ignore_eos && json_object_set_new(body, "ignore_eos", json_true()));
    if (!bad && o->n_ban_tokens > 0) {
        json_t *bias = json_object();
        bad = json_object_set_new(body, "logit_bias", bias);
        for (int k = 0; !bad && k < o->n_ban_tokens; k++) {
            char id[16];
            snprintf(id, sizeof id, "%" PRId32, o->ban_tokens[k]);
            bad = json_object_set_new(bias, id, json_integer(-100));
        }
    }
    bh_text drawn = {0};
    pv_status st = PV_OK;
    if (!bad && c->system_text)
        bad = json_array_append_new(messages, chat_message("system", c->system_text, strlen(c->system_text)));
    else if (!bad && c->system_tokens > 0 &&
             (st = bh_system_words(o->seed, c->system_prompt, c->system_tokens, &drawn)) == PV_OK)
        bad = json_array_append_new(messages, chat_message("system", drawn.p, drawn.n));
    for (int32_t k = 0; !bad && st == PV_OK && k <= turn; k++) {
        const char *text = c->turns[k].text;
        size_t len = text ? strlen(text) : 0;
        if (!text && (st = bh_words(o->seed, conv, k, c->turns[k].input_tokens, &drawn)) == PV_OK) {
            text = drawn.p;
            len = drawn.n;
        }
        bad = st == PV_OK && json_array_append_new(messages, chat_message("user", text, len));
        if (!bad && st == PV_OK && k < turn)
            bad = json_array_append_new(messages, chat_message("assistant", answers[k].p ? answers[k].p : "",
                                                               answers[k].n));
    }
    if (!bad && st == PV_OK)
        *out = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    text_free(&drawn);
    if (st == PV_OK && !*out)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "%s: conversation %d turn %d: cannot build the request body (no "
                      "memory, or text that is not UTF-8)", prog, conv, turn);
    return st;
}

static pv_status add_transfer(run *r, request *q)
{
    const CURLMcode mc = curl_multi_add_handle(r->multi, q->easy);
    if (mc != CURLM_OK) {
        request_free(q);
        return pv_error(PV_ERR_IO, "%s: libcurl refused a transfer: %s", prog, curl_multi_strerror(mc));
    }
    r->in_flight++;
    return PV_OK;
}

/* Sends conversation i's next turn. */
static pv_status start_turn(run *r, int32_t i)
{
    conv_state *cs = &r->convs[i];
    const wl_conversation *c = &r->w->conv[i];
    const int32_t turn = cs->next;
    if (!cs->answers && !(cs->answers = calloc((size_t)c->n_turns, sizeof *cs->answers)))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: conversation %d: no memory for %d answers", prog, i, c->n_turns);
    const double timeout = r->o->request_timeout_s;
    request *q;
    PV_TRY(request_new(r, i, turn, timeout > 0 ? (long)ceil(timeout * 1000) : 0, &q));
    pv_status st = bh_chat_body(r->o, c, i, turn, cs->answers, &q->body);
    q->headers = curl_slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *h = q->headers ? curl_slist_append(q->headers, "Expect:") : NULL; /* no 100-continue wait */
    if (h && r->o->sessions) {
        char id[128], header[160];
        session_id(r, i, id, sizeof id);
        snprintf(header, sizeof header, "X-Session-Id: %s", id);
        h = curl_slist_append(h, header);
    }
    if (st == PV_OK && !h)
        st = pv_error(PV_ERR_OUT_OF_MEMORY, "%s: conversation %d turn %d: no memory for headers", prog, i, turn);
    if (st != PV_OK) {
        request_free(q);
        return st;
    }
    CURL *e = q->easy;
    curl_easy_setopt(e, CURLOPT_URL, r->chat_url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, q->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(q->body));
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    const wl_turn *t = &c->turns[turn];
    q->record = r->out->n_records;
    r->out->records[q->record] = (br_record){.submit_s = since(r), .first_s = -1,
                                             .input_tokens = t->input_tokens + (turn == 0 ? c->system_tokens : 0),
                                             .target_tokens = t->output_tokens};
    PV_TRY(add_transfer(r, q));
    r->out->n_records++;
    cs->next++;
    cs->req = q;
    return PV_OK;
}

/* DELETE /v1/sessions/{id}: the server frees the conversation's KV. */
static pv_status start_delete(run *r, int32_t i)
{
    request *q;
    PV_TRY(request_new(r, i, -1, CONTROL_TIMEOUT_MS, &q));
    char id[128];
    session_id(r, i, id, sizeof id);
    char *escaped = curl_easy_escape(q->easy, id, 0);
    const size_t cap = escaped ? strlen(r->base) + strlen(escaped) + sizeof "/v1/sessions/" : 0;
    char *url = cap ? malloc(cap) : NULL;
    if (!url) {
        curl_free(escaped);
        request_free(q);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: conversation %d: no memory for its session's URL", prog, i);
    }
    snprintf(url, cap, "%s/v1/sessions/%s", r->base, escaped);
    curl_easy_setopt(q->easy, CURLOPT_URL, url); /* libcurl keeps a copy */
    curl_easy_setopt(q->easy, CURLOPT_CUSTOMREQUEST, "DELETE");
    curl_easy_setopt(q->easy, CURLOPT_WRITEFUNCTION, on_discard);
    curl_free(escaped);
    free(url);
    PV_TRY(add_transfer(r, q));
    r->convs[i].req = q;
    return PV_OK;
}

/* Conversation i sends no more turns: its history goes, its session too. */
static pv_status conv_end(run *r, int32_t i)
{
    conv_state *cs = &r->convs[i];
    cs->ended = 1;
    conv_forget(r, cs, i);
    return r->o->sessions ? start_delete(r, i) : PV_OK;
}

/* Sends every turn that is due and finds when the next one is; only the
 * conversations that have arrived and not ended are looked at. */
static pv_status start_due(run *r)
{
    const double now = since(r);
    while (r->hi < r->w->n && r->w->conv[r->hi].arrival_s <= now)
        r->hi++;
    while (r->lo < r->hi && r->convs[r->lo].ended)
        r->lo++;
    r->next_due = r->hi < r->w->n ? r->w->conv[r->hi].arrival_s : INFINITY;
    for (int32_t i = r->lo; i < r->hi; i++) {
        conv_state *cs = &r->convs[i];
        if (cs->ended || cs->req)
            continue;
        if (cs->due_s <= now)
            PV_TRY(start_turn(r, i));
        else
            r->next_due = fmin(r->next_due, cs->due_s);
    }
    return PV_OK;
}

/* ---- finishing ----------------------------------------------------------------------------------- */

/* A session's DELETE ended: servers without sessions answer 404 or 405;
 * anything else is worth one warning (the server may keep the KV). */
static void delete_done(run *r, request *q, CURLcode rc)
{
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (r->warned || (rc == CURLE_OK && (status / 100 == 2 || status == 404 || status == 405)))
        return;
    r->warned = 1;
    char id[128], why[CURL_ERROR_SIZE + 32];
    session_id(r, q->conv, id, sizeof id);
    if (rc == CURLE_OK)
        snprintf(why, sizeof why, "HTTP %ld", status);
    else
        snprintf(why, sizeof why, "%s", q->curl_error[0] ? q->curl_error : curl_easy_strerror(rc));
    fprintf(stderr, "%s: warning: DELETE %s/v1/sessions/%s: %s (sessions may stay on the server)\n", prog, r->base,
            id, why);
}

/* Why a turn's transfer failed, or "" when it did not. */
static void turn_failure(request *q, CURLcode rc, char *why, size_t cap)
{
    why[0] = '\0';
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        snprintf(why, cap, "no complete answer within %g s", q->r->o->request_timeout_s);
    } else if (rc != CURLE_OK && q->error[0]) {
        snprintf(why, cap, "%s", q->error);
    } else if (rc != CURLE_OK) {
        snprintf(why, cap, "%.200s", q->curl_error[0] ? q->curl_error : curl_easy_strerror(rc));
    } else if (status != 200) {
        char msg[160];
        server_message(&q->error_body, msg, sizeof msg);
        snprintf(why, cap, "HTTP %ld: %s", status, msg);
    } else if (bh_sse_end(&q->sse, on_event, q) != PV_OK) {
        snprintf(why, cap, "%s", pv_last_error());
    } else if (q->answer.error[0]) {
        snprintf(why, cap, "an error event: %s", q->answer.error);
    } else if (!q->answer.done) {
        const char *type = NULL;
        curl_easy_getinfo(q->easy, CURLINFO_CONTENT_TYPE, &type);
        snprintf(why, cap, "the stream ended without data: [DONE] (Content-Type %s)", type ? type : "none");
    }
}

/* A transfer ended: the turn's record, then the conversation's next turn
 * (or its end). */
static pv_status finish(run *r, request *q, CURLcode rc)
{
    const int32_t i = q->conv;
    conv_state *cs = &r->convs[i];
    if (q->record < 0) {
        delete_done(r, q, rc);
        request_drop(r, q);
        return PV_OK;
    }
    const wl_conversation *c = &r->w->conv[i];
    br_record *rec = &r->out->records[q->record];
    rec->end_s = since(r);
    char why[224];
    turn_failure(q, rc, why, sizeof why);
    pv_status st = PV_OK;
    r->settled++;
    const bh_answer *a = &q->answer; /* what came, also of a failed turn */
    const int64_t generated = a->completion >= 0 ? a->completion : a->chunks;
    rec->generated = generated > INT32_MAX ? INT32_MAX : (int32_t)generated;
    rec->first_s = a->first_s;
    rec->prompt_tokens = a->prompt_tokens;
    rec->cached_tokens = a->cached_tokens;
    if (why[0]) {
        rec->failed = 1;
        if (!r->out->first_error[0]) {
            snprintf(r->out->first_error, sizeof r->out->first_error, "conversation %d turn %d: %s", i, q->turn, why);
            trim_utf8(r->out->first_error);
        }
        r->settled += c->n_turns - cs->next; /* never sent */
        request_drop(r, q);
        st = conv_end(r, i);
    } else {
        cs->answers[q->turn] = q->answer.text; /* the next turn sends it back */
        q->answer.text = (bh_text){0};
        request_drop(r, q);
        if (cs->next < c->n_turns) {
            cs->due_s = rec->end_s + c->turns[cs->next].think_s;
            r->next_due = fmin(r->next_due, cs->due_s);
        } else {
            st = conv_end(r, i);
        }
    }
    if (r->settled < r->total) /* the last update comes once the run is over */
        br_progress(r->o->label, r->settled, r->total, rec->end_s);
    return st;
}

/* ---- the run --------------------------------------------------------------------------------------- */

/* The workload in real time, until every turn and DELETE has ended, or a
 * stop signal (in-flight requests are dropped). */
static pv_status run_loop(run *r)
{
    r->t0 = bench_now_s();
    r->next_due = 0;
    for (;;) {
        if (br_stopping()) {
            r->out->interrupted = 1;
            return PV_OK;
        }
        if (since(r) >= r->next_due)
            PV_TRY(start_due(r));
        int running, queued;
        CURLMcode mc = curl_multi_perform(r->multi, &running);
        for (CURLMsg *m; mc == CURLM_OK && (m = curl_multi_info_read(r->multi, &queued)) != NULL;) {
            if (m->msg != CURLMSG_DONE)
                continue;
            char *q;
            curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &q);
            PV_TRY(finish(r, (request *)q, m->data.result));
        }
        if (mc == CURLM_OK && r->settled == r->total && r->in_flight == 0)
            return PV_OK;
        const double wait = r->next_due - since(r);
        if (mc == CURLM_OK && wait > 0) /* else a turn is due (think time 0): no sleep */
            mc = curl_multi_poll(r->multi, NULL, 0, wait > 1 ? 1000 : (int)ceil(wait * 1000), NULL);
        if (mc != CURLM_OK)
            return pv_error(PV_ERR_IO, "%s: libcurl: %s", prog, curl_multi_strerror(mc));
    }
}

/* GET base + path with the short timeout: the HTTP status, and the body
 * into *body (NULL: dropped). */
static CURLcode get(const run *r, const char *path, long *status, bh_text *body, char *error)
{
    *status = 0;
    error[0] = '\0';
    const size_t cap = strlen(r->base) + strlen(path) + 1;
    char *url = malloc(cap);
    CURL *e = url ? curl_easy_init() : NULL;
    if (!e) {
        free(url);
        return CURLE_OUT_OF_MEMORY;
    }
    snprintf(url, cap, "%s%s", r->base, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, CONTROL_TIMEOUT_MS / 2);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, CONTROL_TIMEOUT_MS);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, body ? on_collect : on_discard);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
    const CURLcode rc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(e);
    free(url);
    return rc;
}

/* pensieve-serve's counters now; known = 0 for a server without them. */
static void scrape(const run *r, br_counters *c)
{
    bh_text body = {0};
    char error[CURL_ERROR_SIZE];
    long status;
    memset(c, 0, sizeof *c);
    if (get(r, "/metrics", &status, &body, error) == CURLE_OK && status == 200 && body.p)
        bh_metrics_parse(body.p, body.n, c);
    text_free(&body);
}

/* after - before, known only when both were and no counter went back (a
 * server restarted in between). */
static br_counters counters_delta(const br_counters *a, const br_counters *b)
{
    br_counters d = {0};
    const uint64_t *x[] = {&a->turns_done, &a->turns_failed, &a->prefill_tokens, &a->recomputed_tokens,
                           &a->decode_tokens, &a->swap_in_chunks, &a->swap_out_chunks, &a->dropped_chunks,
                           &a->suspensions};
    const uint64_t *y[] = {&b->turns_done, &b->turns_failed, &b->prefill_tokens, &b->recomputed_tokens,
                           &b->decode_tokens, &b->swap_in_chunks, &b->swap_out_chunks, &b->dropped_chunks,
                           &b->suspensions};
    uint64_t *z[] = {&d.turns_done, &d.turns_failed, &d.prefill_tokens, &d.recomputed_tokens, &d.decode_tokens,
                     &d.swap_in_chunks, &d.swap_out_chunks, &d.dropped_chunks, &d.suspensions};
    if (!a->known || !b->known)
        return d;
    for (size_t k = 0; k < sizeof z / sizeof *z; k++) {
        if (*y[k] < *x[k])
            return (br_counters){0};
        *z[k] = *y[k] - *x[k];
    }
    d.known = 1;
    return d;
}

static pv_status check_options(const bh_options *o, const wl_workload *w)
{
    if (!o || !w || !o->url || !o->model || !o->model[0])
        return pv_error(PV_ERR_INVALID_ARG, "%s: the HTTP driver needs a URL, a model name and a workload", prog);
    if (strncmp(o->url, "http://", 7) != 0 && strncmp(o->url, "https://", 8) != 0)
        return pv_error(PV_ERR_INVALID_ARG, "%s: URL '%s' is not http:// or https://", prog, o->url);
    if (!(o->request_timeout_s >= 0 && o->request_timeout_s <= 1e6))
        return pv_error(PV_ERR_INVALID_ARG, "%s: request timeout %g s is not in [0, 1e6]", prog,
                        o->request_timeout_s);
    if (o->sessions) {
        /* ids of 1 to 128 bytes (pensieve-serve's rule), and nothing that
         * would break the header line */
        const char *p = o->session_prefix;
        int printable = p && strlen(p) <= 100;
        for (size_t k = 0; printable && p[k]; k++)
            printable = p[k] > 0x20 && p[k] < 0x7f;
        if (!printable)
            return pv_error(PV_ERR_INVALID_ARG, "%s: session prefix '%s' is not at most 100 printable ASCII "
                            "characters without spaces", prog, p ? p : "(null)");
    }
    for (int32_t i = 0; i < w->n; i++)
        if (w->conv[i].n_turns < 1 || !w->conv[i].turns)
            return pv_error(PV_ERR_INVALID_ARG, "%s: conversation %d has no turns", prog, i);
    return PV_OK;
}

/* The base URL without trailing slashes and /v1, as users often write it. */
static char *base_url(const char *url)
{
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        n--;
    if (n >= 3 && memcmp(url + n - 3, "/v1", 3) == 0)
        n -= 3;
    char *base = malloc(n + 1);
    if (base)
        snprintf(base, n + 1, "%.*s", (int)n, url);
    return base;
}

/* Everything but the probe and the scrapes, once the server answered. */
static pv_status run_workload(run *r)
{
    const wl_workload *w = r->w;
    for (int32_t i = 0; i < w->n; i++)
        r->total += w->conv[i].n_turns;
    const size_t chat_cap = strlen(r->base) + sizeof "/v1/chat/completions";
    r->chat_url = malloc(chat_cap);
    r->convs = calloc(w->n > 0 ? (size_t)w->n : 1, sizeof *r->convs);
    r->out->records = (uint64_t)r->total < SIZE_MAX / sizeof(br_record)
                          ? calloc(r->total > 0 ? (size_t)r->total : 1, sizeof(br_record))
                          : NULL;
    r->multi = curl_multi_init();
    if (!r->chat_url || !r->convs || !r->out->records || !r->multi)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory for a run of %lld requests", prog, (long long)r->total);
    snprintf(r->chat_url, chat_cap, "%s/v1/chat/completions", r->base);
    for (int32_t i = 0; i < w->n; i++)
        r->convs[i].due_s = w->conv[i].arrival_s;
    /* a connection kept open per conversation, as each client would */
    curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, (long)(w->n > 0 ? w->n : 1));
    return run_loop(r);
}

pv_status bh_run(const bh_options *o, const wl_workload *w, br_run *out)
{
    memset(out, 0, sizeof *out);
    PV_TRY(check_options(o, w));
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return pv_error(PV_ERR_IO, "%s: libcurl did not initialise", prog);
    run r = {.o = o, .w = w, .out = out, .base = base_url(o->url)};
    if (!r.base) {
        curl_global_cleanup();
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory for the URL", prog);
    }
    /* Any HTTP answer means a server is there; no answer at all is no use. */
    char error[CURL_ERROR_SIZE];
    long status;
    const CURLcode rc = get(&r, "/v1/models", &status, NULL, error);
    pv_status st = rc == CURLE_OK ? PV_OK
                                  : pv_error(PV_ERR_IO, "%s: cannot reach %s: %s", prog, o->url,
                                             error[0] ? error : curl_easy_strerror(rc));
    br_counters before, after;
    if (st == PV_OK) {
        scrape(&r, &before);
        st = run_workload(&r);
    }
    if (st == PV_OK && !out->interrupted) {
        scrape(&r, &after);
        out->counters = counters_delta(&before, &after);
        br_progress(o->label, r.total, r.total, since(&r));
    }
    for (int32_t i = 0; r.convs && i < w->n; i++) {
        if (r.convs[i].req)
            request_drop(&r, r.convs[i].req);
        conv_forget(&r, &r.convs[i], i);
    }
    curl_multi_cleanup(r.multi);
    free(r.convs);
    free(r.chat_url);
    free(r.base);
    curl_global_cleanup();
    return st;
}
