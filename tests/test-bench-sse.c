/* The parts of pensieve-bench's HTTP driver (bench/bench-http.h) that need
 * no server: the event stream parser gives the same events however the
 * bytes are split (byte by byte, at every point, CR LF torn apart), keeps
 * to the SSE rules (comments, other fields, data lines joined, CR-only
 * ends) and refuses an endless line; a streamed answer is timed at its
 * first content, not its role chunk, and takes usage over its chunk
 * count; a request body carries the whole conversation in order; the
 * /metrics reader takes pensieve's counters and nothing else, from any
 * text; generated messages are deterministic words. A preamble (issue 28)
 * is a system message in front of every turn, its words a function of the
 * seed and its index; on SmolLM2's tokenizer (skipped when absent) N words
 * are about N tokens, and two conversations with the same preamble render
 * to the same ids through the end of the system turn, with different ones
 * to ids that part within the first chunk. */
#include "bench/bench-http.h"
#include "real-tokenizer.h"
#include "tap.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the event stream ------------------------------------------------------------- */

/* The events seen, each followed by a 0x1e separator. */
typedef struct seen {
    bh_text all;
    int count, fail_at; /* fail_at > 0: the fail_at-th event returns an error */
} seen;

static pv_status collect(void *user, const char *data, size_t len)
{
    seen *s = user;
    if (++s->count == s->fail_at)
        return pv_error(PV_ERR_STATE, "the collector stops at event %d", s->count);
    if (strlen(data) != len) /* data is NUL-terminated at len */
        return pv_error(PV_ERR_FORMAT, "an event of %zu bytes reads %zu", len, strlen(data));
    char *p = realloc(s->all.p, s->all.n + len + 2);
    if (!p)
        return PV_ERR_OUT_OF_MEMORY;
    memcpy(p + s->all.n, data, len);
    p[s->all.n + len] = 0x1e;
    s->all.n += len + 1;
    p[s->all.n] = '\0';
    s->all.p = p;
    return PV_OK;
}

/* Feeds text in pieces of `piece` bytes (0: whole), or split at `cut`
 * (piece < 0), then ends the stream; the events, or NULL on an error. */
static char *events_of(const char *text, long piece, size_t cut)
{
    bh_sse sse = {0};
    seen s = {0};
    const size_t n = strlen(text);
    pv_status st = PV_OK;
    if (piece < 0) {
        st = bh_sse_feed(&sse, text, cut, collect, &s);
        if (st == PV_OK)
            st = bh_sse_feed(&sse, text + cut, n - cut, collect, &s);
    } else {
        const size_t step = piece ? (size_t)piece : n;
        for (size_t at = 0; st == PV_OK && at < n; at += step)
            st = bh_sse_feed(&sse, text + at, n - at < step ? n - at : step, collect, &s);
    }
    if (st == PV_OK)
        st = bh_sse_end(&sse, collect, &s);
    bh_sse_free(&sse);
    if (st != PV_OK) {
        free(s.all.p);
        return NULL;
    }
    return s.all.p ? s.all.p : calloc(1, 1);
}

/* Whole, byte by byte, in threes, and cut at every point: all as expected. */
static void check_splits(const char *name, const char *text, const char *want)
{
    int good = 1;
    char *got = events_of(text, 0, 0);
    good = got && strcmp(got, want) == 0;
    if (!good)
        tap_diag("%s whole: got [%s] want [%s]", name, got ? got : "(error)", want);
    free(got);
    for (long piece = 1; good && piece <= 3; piece += 2) {
        got = events_of(text, piece, 0);
        good = got && strcmp(got, want) == 0;
        if (!good)
            tap_diag("%s in pieces of %ld: got [%s]", name, piece, got ? got : "(error)");
        free(got);
    }
    for (size_t cut = 0; good && cut <= strlen(text); cut++) {
        got = events_of(text, -1, cut);
        good = got && strcmp(got, want) == 0;
        if (!good)
            tap_diag("%s cut at %zu: got [%s]", name, cut, got ? got : "(error)");
        free(got);
    }
    ok(good, "%s: the same events whole, byte by byte, in threes and cut at every point", name);
}

static void test_sse(void)
{
    /* pensieve-serve's shape: LF ends, a blank line after each event */
    check_splits("LF stream",
                 "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n: keep-alive\n\ndata: [DONE]\n\n",
                 "{\"a\":1}\x1e{\"b\":2}\x1e[DONE]\x1e");
    /* sse-starlette's (llama-cpp-python): CRLF, ping comments, other
     * fields; an event of two data lines (a CR and its LF torn apart must
     * not end it early) */
    check_splits("CRLF stream",
                 ": ping - 2025-01-01\r\n\r\nevent: message\r\nid: 7\r\nretry: 100\r\n"
                 "data: {\"x\":\"\xc3\xa9\"}\r\n\r\ndata: {\"y\":\r\ndata: 2}\r\n\r\ndata: [DONE]\r\n\r\n",
                 "{\"x\":\"\xc3\xa9\"}\x1e{\"y\":\n2}\x1e[DONE]\x1e");
    /* CR-only ends; data lines joined with LF; "data:" without its space,
     * a data field without a colon (an empty line of data), names that
     * only look like data */
    check_splits("CR stream and the field rules", "data:one\rdata: two\r\rdata\rdata\r\rdataX: no\r data: no\r\r",
                 "one\ntwo\x1e\n\x1e");
    /* a last event without its blank line still counts at the end */
    check_splits("an unterminated last event", "data: a\n\ndata: b", "a\x1e" "b\x1e");
    check_splits("no events", ": only a comment\n\nid: 3\n\n", "");

    /* A stream whose events go to the callback while they are complete: a
     * parser that waited for the end (or lost a line torn in two) differs. */
    bh_sse sse = {0};
    seen s = {0};
    const char *first = "data: {\"n\":1}\n\nda", *second = "ta: {\"n\":2}\n\n";
    pv_status st = bh_sse_feed(&sse, first, strlen(first), collect, &s);
    const int after_first = s.count;
    if (st == PV_OK)
        st = bh_sse_feed(&sse, second, strlen(second), collect, &s);
    ok(st == PV_OK && after_first == 1 && s.count == 2 && strcmp(s.all.p, "{\"n\":1}\x1e{\"n\":2}\x1e") == 0,
       "events are dispatched as their blank line arrives, a line torn across two feeds joined (%d, then %d)",
       after_first, s.count);
    bh_sse_free(&sse);
    free(s.all.p);

    /* the callback's error stops the feed: the third event is not seen */
    s = (seen){.fail_at = 2};
    const char *three = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    st = bh_sse_feed(&sse, three, strlen(three), collect, &s);
    ok(st == PV_ERR_STATE && s.count == 2, "a callback's error stops the feed and is returned (%s)", pv_last_error());
    bh_sse_free(&sse);
    free(s.all.p);

    /* An endless line (a server gone wrong) is refused past 16 MiB, not
     * held without bound; an event of many lines too. */
    const size_t mib = (size_t)1 << 20;
    char *block = malloc(mib);
    int refused_line = 0, refused_event = 0;
    if (block) {
        memset(block, 'x', mib);
        s = (seen){0};
        st = bh_sse_feed(&sse, "data: ", 6, collect, &s);
        for (int k = 0; k < 20 && st == PV_OK; k++)
            st = bh_sse_feed(&sse, block, mib, collect, &s);
        refused_line = st == PV_ERR_FORMAT && s.count == 0;
        bh_sse_free(&sse);
        for (size_t k = 0; k + 1 < mib; k += 1024) /* 1 KiB lines of "data: " and filler */
            block[k + 1023] = '\n', memcpy(block + k, "data: ", 6);
        st = PV_OK;
        for (int k = 0; k < 20 && st == PV_OK; k++)
            st = bh_sse_feed(&sse, block, mib, collect, &s);
        refused_event = st == PV_ERR_FORMAT && s.count == 0;
        bh_sse_free(&sse);
        free(s.all.p);
    }
    ok(refused_line && refused_event, "a line or an event past 16 MiB is refused (%s)", pv_last_error());
    free(block);
}

/* ---- a streamed answer ------------------------------------------------------------ */

static pv_status feed_event(bh_answer *a, double now, const char *data)
{
    return bh_answer_event(a, now, data, strlen(data));
}

static void test_answer(void)
{
    bh_answer a;
    bh_answer_init(&a);
    /* times 1, 2, 3, ...: the first content is the third event */
    const char *events[] = {
        "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}",
        "{\"choices\":[{\"index\":0,\"delta\":{}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\", w\\u00f6rld\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"length\"}]}",
        ("{\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":5,\"total_tokens\":45,"
         "\"prompt_tokens_details\":{\"cached_tokens\":31}}}"),
        "[DONE]",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after the end\"}}]}",
    };
    pv_status st = PV_OK;
    for (int k = 0; k < (int)(sizeof events / sizeof *events) && st == PV_OK; k++)
        st = feed_event(&a, 1 + k, events[k]);
    ok(st == PV_OK && a.first_s == 3, "the first token is timed at the first non-empty content (%g), not the role "
       "chunk", a.first_s);
    ok(a.text.p && strcmp(a.text.p, "Hello, w\xc3\xb6rld!") == 0 && a.chunks == 3,
       "contents are joined as received, %lld chunks counted, nothing after [DONE] (%s)", (long long)a.chunks,
       a.text.p ? a.text.p : "(none)");
    ok(a.done && a.completion == 5 && a.prompt_tokens == 40 && a.cached_tokens == 31 && !a.error[0],
       "usage: completion %lld, prompt %llu, cached %llu", (long long)a.completion,
       (unsigned long long)a.prompt_tokens, (unsigned long long)a.cached_tokens);
    bh_answer_free(&a);

    /* llama-cpp-python's shape: no usage; the chunk count stands */
    st = feed_event(&a, 1, "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}");
    if (st == PV_OK)
        st = feed_event(&a, 2, "{\"choices\":[{\"delta\":{\"content\":\"b\"}}]}");
    ok(st == PV_OK && a.completion == -1 && a.chunks == 2 && a.prompt_tokens == 0 && !a.done,
       "without usage: completion unknown, 2 chunks");
    bh_answer_free(&a);

    st = feed_event(&a, 1, "{\"error\":{\"message\":\"The request was cancelled\",\"type\":\"server_error\"}}");
    ok(st == PV_OK && strcmp(a.error, "The request was cancelled") == 0, "an error object's message is kept (%s)",
       a.error);
    bh_answer_free(&a);
    st = feed_event(&a, 1, "{\"choices\":[{\"delta\":{\"content\":\"a\"}}");
    ok(st == PV_ERR_FORMAT, "an event that is not JSON is an error (%s)", pv_last_error());
    st = feed_event(&a, 1, "[1, 2]");
    ok(st == PV_ERR_FORMAT, "JSON that is not an object is an error (%s)", pv_last_error());
    bh_answer_free(&a);
}

/* ---- the request body ------------------------------------------------------------- */

/* 1 when the body's messages are want's n (role, content) pairs in order. */
static int messages_are(const char *body, const char *want[][2], size_t n)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *m = json_object_get(j, "messages");
    int good = json_array_size(m) == n;
    for (size_t k = 0; good && k < n; k++) {
        json_t *e = json_array_get(m, k);
        const char *role = json_string_value(json_object_get(e, "role")),
                   *content = json_string_value(json_object_get(e, "content"));
        good = role && content && want[k][1] && strcmp(role, want[k][0]) == 0 && strcmp(content, want[k][1]) == 0;
        if (!good)
            tap_diag("message %zu: %s", k, body);
    }
    json_decref(j);
    return good;
}

static void test_body(void)
{
    wl_turn turns[3] = {{.input_tokens = 4, .output_tokens = 9}, {.input_tokens = 2, .output_tokens = 7},
                        {.input_tokens = 3, .output_tokens = 5, .text = "replayed \xe2\x9c\x93 text"}};
    const wl_conversation c = {.arrival_s = 0, .n_turns = 3, .turns = turns};
    bh_text answers[2] = {{.p = "first answer", .n = 12}, {.p = "second", .n = 6}};
    bh_options o = {.url = "http://127.0.0.1:1", .model = "m", .ignore_eos = 1, .seed = 5};
    char *body = NULL;
    pv_status st = bh_chat_body(&o, &c, 4, 2, answers, &body);
    json_t *j = st == PV_OK ? json_loads(body, 0, NULL) : NULL;
    bh_text w0 = {0}, w1 = {0};
    int good = bh_words(5, 4, 0, 4, &w0) == PV_OK && bh_words(5, 4, 1, 2, &w1) == PV_OK;
    const char *want[5][2] = {{"user", w0.p}, {"assistant", "first answer"}, {"user", w1.p},
                              {"assistant", "second"}, {"user", "replayed \xe2\x9c\x93 text"}};
    ok(good && messages_are(body, want, 5),
       "turn 3's body carries the two earlier turns and their answers in order, then its message");
    json_t *so = json_object_get(j, "stream_options");
    ok(json_integer_value(json_object_get(j, "max_tokens")) == 5 && json_is_true(json_object_get(j, "stream")) &&
           json_is_true(json_object_get(so, "include_usage")) && json_is_true(json_object_get(j, "ignore_eos")) &&
           strcmp(json_string_value(json_object_get(j, "model")), "m") == 0,
       "max_tokens, stream, include_usage, ignore_eos and model are set (%.200s)", body ? body : "(none)");
    json_decref(j);
    free(body);
    o.ignore_eos = 0;
    st = bh_chat_body(&o, &c, 4, 0, NULL, &body);
    j = st == PV_OK ? json_loads(body, 0, NULL) : NULL;
    ok(json_array_size(json_object_get(j, "messages")) == 1 && !json_object_get(j, "ignore_eos") &&
           !json_object_get(j, "logit_bias"),
       "a first turn has one message; no ignore_eos or logit_bias unless asked");
    json_decref(j);
    free(body);
    const int32_t ban[2] = {0, 2};
    o.ban_tokens = ban;
    o.n_ban_tokens = 2;
    st = bh_chat_body(&o, &c, 4, 0, NULL, &body);
    j = st == PV_OK ? json_loads(body, 0, NULL) : NULL;
    json_t *bias = json_object_get(j, "logit_bias");
    ok(json_object_size(bias) == 2 && json_integer_value(json_object_get(bias, "0")) == -100 &&
           json_integer_value(json_object_get(bias, "2")) == -100,
       "banned tokens go as logit_bias -100 by id (%.200s)", body ? body : "(none)");
    json_decref(j);
    free(body);

    /* with a preamble: a system message first, then the turns as before */
    wl_conversation pc = c;
    pc.system_tokens = 6;
    pc.system_prompt = 2;
    bh_text sys = {0};
    o.n_ban_tokens = 0;
    st = bh_chat_body(&o, &pc, 4, 1, answers, &body);
    good = st == PV_OK && bh_system_words(5, 2, 6, &sys) == PV_OK;
    const char *want_sys[4][2] = {{"system", sys.p}, {"user", w0.p}, {"assistant", "first answer"}, {"user", w1.p}};
    ok(good && messages_are(body, want_sys, 4),
       "with a preamble, turn 2's body starts with it as a system message of its words (%.200s)",
       body ? body : "(none)");
    free(body);

    /* a replayed conversation's system text goes as it is, not drawn words */
    pc.system_text = "replayed system \xe2\x9c\x93";
    st = bh_chat_body(&o, &pc, 4, 1, answers, &body);
    want_sys[0][1] = pc.system_text;
    ok(st == PV_OK && messages_are(body, want_sys, 4),
       "a replayed system text is turn 2's first message, as it is (%.200s)", body ? body : "(none)");
    free(body);
    free(sys.p);
    free(w0.p);
    free(w1.p);
}

/* ---- /metrics ------------------------------------------------------------------------ */

static const char metrics_text[] =
    "# HELP pensieve_engine_turns_total Turns finished, by result.\n"
    "# TYPE pensieve_engine_turns_total counter\n"
    "pensieve_engine_turns_total{result=\"done\"} 13\n"
    "pensieve_engine_turns_total{result=\"failed\"} 1\n"
    "pensieve_engine_prefill_tokens_total 867\n"
    "pensieve_engine_prefill_tokens_total_bis 5\n"
    "pensieve_engine_recomputed_tokens_total 12\r\n"
    "pensieve_engine_decode_tokens_total 277 1700000000000\n"
    "pensieve_engine_reused_tokens_total{tier=\"device\"} 99\n"
    "pensieve_engine_suspensions_total 2\n"
    "pensieve_engine_forward_seconds_total 0.25\n"
    "pensieve_cache_swap_in_chunks_total 3\n"
    "pensieve_cache_swap_in_bytes_total 4096\n"
    "pensieve_cache_swap_out_chunks_total 4\n"
    "pensieve_cache_dropped_chunks_total 18446744073709551615\n";

/* Parses text from an exact-size copy (no terminator after it: a read past
 * its end shows under AddressSanitizer). */
static br_counters parse_copy(const char *text, size_t len)
{
    char *copy = malloc(len ? len : 1);
    br_counters c = {0};
    if (copy) {
        memcpy(copy, text, len);
        bh_metrics_parse(copy, len, &c);
    }
    free(copy);
    return c;
}

static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void test_metrics(void)
{
    const size_t n = strlen(metrics_text);
    br_counters c = parse_copy(metrics_text, n);
    ok(c.known && c.turns_done == 13 && c.turns_failed == 1 && c.prefill_tokens == 867 && c.recomputed_tokens == 12 &&
           c.decode_tokens == 277 && c.swap_in_chunks == 3 && c.swap_out_chunks == 4 &&
           c.dropped_chunks == UINT64_MAX && c.suspensions == 2,
       "pensieve's counters are read (a CR, a timestamp, the largest value; similar names are not taken)");
    /* Every truncation parses, and is known exactly when the last
     * counter keeps a digit (the reader cannot tell a cut number). */
    const size_t digits = (size_t)(strstr(metrics_text, "_dropped_chunks_total ") - metrics_text) +
                          strlen("_dropped_chunks_total ");
    int cut_ok = 1;
    for (size_t len = 0; len <= n; len++) {
        const int known = parse_copy(metrics_text, len).known;
        if (known != (len > digits)) {
            tap_diag("cut at %zu of %zu: known %d", len, n, known);
            cut_ok = 0;
        }
    }
    ok(cut_ok, "every truncation parses; known only with each counter's line there, from its first digit on");
    const char *odd[] = {
        "", /* the line gone */
        "pensieve_engine_suspensions_total 1e3\n",
        "pensieve_engine_suspensions_total 18446744073709551616\n",
        "pensieve_engine_suspensions_total -1\n",
        "pensieve_engine_suspensions_total\n",
        "pensieve_engine_suspensions_total NaN\n",
        "pensieve_engine_suspensions_total 12.5\n",
    };
    int refused = 1;
    for (size_t k = 0; k < sizeof odd / sizeof *odd; k++) {
        char text[2048];
        /* the good page with the suspensions line replaced */
        const char *at = strstr(metrics_text, "pensieve_engine_suspensions_total 2\n");
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - metrics_text), metrics_text, odd[k],
                 at + strlen("pensieve_engine_suspensions_total 2\n"));
        if (parse_copy(text, strlen(text)).known) {
            tap_diag("taken: %s", odd[k]);
            refused = 0;
        }
    }
    ok(refused, "a counter missing, or a value that is not a plain integer in range, makes the page unknown");
    uint64_t rng = 7;
    int survived = 1;
    char noise[512];
    for (int round = 0; round < 2000; round++) { /* random bytes, and the page with random bytes changed */
        const size_t len = (size_t)(next_random(&rng) % sizeof noise);
        if (round % 2) {
            memcpy(noise, metrics_text, len < n ? len : n);
            for (int k = 0; k < 4; k++)
                noise[next_random(&rng) % (len ? len : 1)] = (char)next_random(&rng);
        } else {
            for (size_t k = 0; k < len; k++)
                noise[k] = (char)next_random(&rng);
        }
        c = parse_copy(noise, len);
        survived = survived && (c.known == 0 || c.known == 1);
    }
    ok(survived, "random bytes and damaged pages parse without harm");
}

/* ---- generated messages ------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_words(void)
{
    bh_text a = {0}, b = {0};
    int same = bh_words(9, 3, 2, 50, &a) == PV_OK && bh_words(9, 3, 2, 50, &b) == PV_OK && strcmp(a.p, b.p) == 0;
    ok(same, "the same seed, conversation and turn give the same message");
    int differ = 1;
    const int keys[3][3] = {{10, 3, 2}, {9, 4, 2}, {9, 3, 3}};
    for (int k = 0; k < 3; k++)
        differ = differ && bh_words((uint64_t)keys[k][0], keys[k][1], keys[k][2], 50, &b) == PV_OK &&
                 strcmp(a.p, b.p) != 0;
    ok(differ, "another seed, conversation or turn gives another");
    int shaped = bh_words(1, 0, 0, 1, &a) == PV_OK && a.n > 0 && !strchr(a.p, ' ');
    const int n = 20000;
    shaped = shaped && bh_words(1, 0, 0, n, &a) == PV_OK;
    int spaces = 0;
    for (size_t k = 0; shaped && k < a.n; k++) {
        spaces += a.p[k] == ' ';
        shaped = (a.p[k] >= 'a' && a.p[k] <= 'z') || (a.p[k] == ' ' && k > 0 && k + 1 < a.n && a.p[k + 1] != ' ');
    }
    ok(shaped && spaces == n - 1, "n words of lower-case letters, one space between (%d spaces for %d words)",
       spaces, n);
    /* every one of the 256 words turns up in 20,000 draws (a draw that
     * used fewer bits would reach half of them) */
    char **list = malloc((size_t)n * sizeof *list);
    int distinct = 0;
    if (shaped && list) {
        int k = 0;
        for (char *save = NULL, *w = strtok_r(a.p, " ", &save); w && k < n; w = strtok_r(NULL, " ", &save))
            list[k++] = w;
        qsort(list, (size_t)k, sizeof *list, cmp_str);
        for (int i = 0; i < k; i++)
            distinct += i == 0 || strcmp(list[i], list[i - 1]) != 0;
    }
    ok(distinct == 256, "all 256 words are drawn (%d distinct)", distinct);
    free(list);
    free(a.p);
    free(b.p);
}

/* ---- preambles ------------------------------------------------------------------------- */

static int words_in(const char *s)
{
    int n = *s != '\0';
    for (; *s; s++)
        n += *s == ' ';
    return n;
}

static void test_system_words(void)
{
    bh_text a = {0}, b = {0}, m = {0};
    int same = bh_system_words(9, 2, 50, &a) == PV_OK && bh_system_words(9, 2, 50, &b) == PV_OK &&
               strcmp(a.p, b.p) == 0 && words_in(a.p) == 50;
    ok(same, "a preamble is the same 50 words for the same seed and index");
    int differ = bh_system_words(9, 3, 50, &b) == PV_OK && strcmp(a.p, b.p) != 0 &&
                 bh_system_words(10, 2, 50, &b) == PV_OK && strcmp(a.p, b.p) != 0 &&
                 bh_words(9, 0, 2, 50, &m) == PV_OK && strcmp(a.p, m.p) != 0;
    ok(differ, "another index or seed gives another; it is no conversation's message");
    free(a.p);
    free(b.p);
    free(m.p);
}

/* The ids of msgs rendered with the chat template and its generation
 * prompt, as a server runs a request (malloc'd, *n of them). */
static int32_t *render(const pv_tokenizer *tok, const pv_chat_message *msgs, size_t n_msgs, int gen, size_t *n)
{
    size_t len = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    if (pv_tokenizer_apply_chat(tok, msgs, n_msgs, gen, NULL, 0, &len) == PV_OK && (text = malloc(len + 1)) &&
        pv_tokenizer_apply_chat(tok, msgs, n_msgs, gen, text, len + 1, &len) == PV_OK &&
        (ids = malloc((len + 1) * sizeof *ids)) &&
        pv_tokenizer_encode(tok, text, len, PV_TOKENIZE_PARSE_SPECIAL | (tok->add_bos ? PV_TOKENIZE_ADD_BOS : 0),
                            ids, len + 1, n) != PV_OK) {
        free(ids);
        ids = NULL;
    }
    free(text);
    return ids;
}

static size_t first_difference(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* On SmolLM2's tokenizer: a preamble of 1,000 words is about 1,000
 * tokens, and reaches the model as the same ids in every conversation that
 * drew it, whatever follows. */
static void test_system_tokens(void)
{
    pv_tokenizer tok;
    if (real_tokenizer_load(&tok) != 1)
        return;
    enum { N = 1000 };
    bh_text p0 = {0}, p1 = {0}, u1 = {0}, u2 = {0};
    int32_t *alone = NULL, *sys = NULL, *a = NULL, *b = NULL, *c = NULL;
    size_t n_alone = 0, n_sys = 0, na = 0, nb = 0, nc = 0;
    if (bh_system_words(1, 0, N, &p0) == PV_OK && bh_system_words(1, 1, N, &p1) == PV_OK &&
        bh_words(1, 0, 0, 20, &u1) == PV_OK && bh_words(1, 1, 0, 20, &u2) == PV_OK &&
        (alone = malloc((p0.n + 1) * sizeof *alone)) &&
        pv_tokenizer_encode(&tok, p0.p, p0.n, 0, alone, p0.n + 1, &n_alone) == PV_OK) {
        const pv_chat_message only[] = {{"system", p0.p}}, ma[] = {{"system", p0.p}, {"user", u1.p}},
                              mb[] = {{"system", p0.p}, {"user", u2.p}}, mc[] = {{"system", p1.p}, {"user", u1.p}};
        sys = render(&tok, only, 1, 0, &n_sys);
        a = render(&tok, ma, 2, 1, &na);
        b = render(&tok, mb, 2, 1, &nb);
        c = render(&tok, mc, 2, 1, &nc);
    }
    ok(alone && n_alone >= N && n_alone <= N + N / 50, "a preamble of %d words is %zu SmolLM2 tokens", N, n_alone);
    const size_t ab = a && b ? first_difference(a, na, b, nb) : 0, ac = a && c ? first_difference(a, na, c, nc) : 0;
    ok(sys && a && b && n_sys > n_alone && ab >= n_sys,
       "two conversations with the same preamble: the same %zu ids through its system turn (%zu in common)", n_sys,
       ab);
    ok(sys && a && c && ac < 32, "different preambles part after %zu ids, within the first 32-token chunk", ac);
    free(alone);
    free(sys);
    free(a);
    free(b);
    free(c);
    free(p0.p);
    free(p1.p);
    free(u1.p);
    free(u2.p);
    pv_tokenizer_free(&tok);
}

int main(void)
{
    test_sse();
    test_answer();
    test_body();
    test_metrics();
    test_words();
    test_system_words();
    test_system_tokens();
    return tap_done();
}
