/* pensieve-bench's HTTP driver (bench/bench-http.h) against a fake
 * OpenAI-compatible server on a thread of this test, which checks every
 * request it gets and logs when: each turn carries the whole conversation
 * (the earlier messages and the answers as it sent them), turns are sent
 * no earlier than their arrival and no earlier than the previous answer's
 * end plus the think time, sessions are named and deleted once, answers
 * dribbled a few bytes at a time read the same, and usage, /metrics and
 * each way a request can fail (an HTTP 500, an error event, a stream
 * without [DONE], no answer before the timeout) end up in the records.
 * Shared preambles (issue 28): every request of a conversation with one
 * starts with it as a system message, the same text wherever a
 * conversation drew the same preamble, another for another. */
#include "bench/bench-http.h"
#include "bench/bench-util.h"
#include "tap.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONV 8
#define MAX_TURNS 4
#define MAX_CONNS 32
#define MAX_LOG 64

/* How the fake answers a conversation. */
typedef enum behave { NORMAL, DRIBBLE, NO_USAGE, HTTP_500_AT_TURN_1, ERROR_EVENT, NO_DONE, SILENT } behave;

typedef struct logged {
    int conv, turn;
    double arrived, ended; /* the request read; the answer about to be written */
    int well_formed;       /* the whole conversation, in order, and the request's fields as they should be */
    int session;           /* X-Session-Id named the conversation (1), was absent (0) or wrong (-1) */
} logged;

typedef struct fake {
    int listener, port, stop_pipe[2];
    pthread_t thread;
    const wl_workload *w;
    bh_options o;
    behave how[MAX_CONV];
    char answers[MAX_CONV][MAX_TURNS][64]; /* what the fake answered */
    logged log[MAX_LOG];
    int n_log, unknown; /* requests it could not place */
    int deletes[MAX_CONV];
    double deleted_at[MAX_CONV];
    int done_answers; /* completions answered with [DONE]: the "turns done" of its /metrics */
    char system[MAX_CONV][4096]; /* the system message each conversation's first turn began with, "" none */
} fake;

typedef struct conn {
    int fd;
    char buf[1 << 16];
    size_t n;
} conn;

/* ---- the fake server ---------------------------------------------------------------- */

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        p += k;
        n -= (size_t)k;
    }
}

/* A response with Content-Length, or (close_after) one that the closed
 * connection ends. */
static void respond(int fd, int status, const char *type, const char *body, int close_after)
{
    char head[256];
    int n = close_after
                ? snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Type: %s\r\nConnection: close\r\n\r\n",
                           status, type)
                : snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                           status, type, strlen(body));
    send_all(fd, head, (size_t)n);
    send_all(fd, body, strlen(body));
}

static int eq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* The conversation whose first message this is (the driver's own words or
 * the replayed text), -1 if none. */
static int conv_of(const fake *f, const char *first)
{
    for (int i = 0; i < f->w->n; i++) {
        const wl_turn *t = &f->w->conv[i].turns[0];
        bh_text words = {0};
        const int same = t->text ? eq(t->text, first)
                                 : bh_words(f->o.seed, i, 0, t->input_tokens, &words) == PV_OK && eq(words.p, first);
        free(words.p);
        if (same)
            return i;
    }
    return -1;
}

/* 1 when a request's messages begin with a system message. */
static int has_system(json_t *messages)
{
    return eq(json_string_value(json_object_get(json_array_get(messages, 0), "role")), "system");
}

/* The messages are the conversation so far: its preamble when it has one
 * (as the first turn sent it), user k as drawn (or replayed), then what
 * the fake answered k, ..., then the new message. */
static int history_matches(const fake *f, int i, int turn, json_t *messages)
{
    const size_t sys = (size_t)has_system(messages);
    const char *system = json_string_value(json_object_get(json_array_get(messages, 0), "content"));
    int good = json_array_size(messages) == sys + (size_t)(2 * turn + 1) &&
               (int)sys == (f->w->conv[i].system_tokens > 0) && (!sys || eq(system, f->system[i]));
    for (int k = 0; good && k <= turn; k++) {
        const wl_turn *t = &f->w->conv[i].turns[k];
        bh_text words = {0};
        json_t *u = json_array_get(messages, sys + (size_t)(2 * k)),
               *a = json_array_get(messages, sys + (size_t)(2 * k + 1));
        const char *want = t->text;
        if (!want && bh_words(f->o.seed, i, k, t->input_tokens, &words) == PV_OK)
            want = words.p;
        good = eq(json_string_value(json_object_get(u, "role")), "user") &&
               eq(json_string_value(json_object_get(u, "content")), want) &&
               (k == turn || (eq(json_string_value(json_object_get(a, "role")), "assistant") &&
                              eq(json_string_value(json_object_get(a, "content")), f->answers[i][k])));
        free(words.p);
    }
    return good;
}

/* Answers a completion as the conversation's behaviour says; 1: close the
 * connection after it. */
static int chat(fake *f, int fd, const char *session, const char *body)
{
    json_t *j = json_loads(body, 0, NULL);
    json_t *messages = json_object_get(j, "messages");
    const size_t sys = (size_t)has_system(messages);
    const int i = conv_of(f, json_string_value(json_object_get(json_array_get(messages, sys), "content")));
    const int turn = (int)(json_array_size(messages) - sys) / 2;
    if (i < 0 || turn >= f->w->conv[i].n_turns || f->n_log == MAX_LOG) {
        f->unknown++;
        respond(fd, 400, "application/json", "{\"error\":{\"message\":\"who is this?\"}}", 0);
        json_decref(j);
        return 0;
    }
    logged *l = &f->log[f->n_log++];
    char want_session[64];
    snprintf(want_session, sizeof want_session, "%s%d", f->o.session_prefix ? f->o.session_prefix : "", i);
    *l = (logged){.conv = i, .turn = turn, .arrived = bench_now_s(),
                  .session = !session ? 0 : strcmp(session, want_session) == 0 ? 1 : -1};
    const int max_tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
    if (turn == 0 && sys) /* later turns must repeat it */
        snprintf(f->system[i], sizeof f->system[i], "%s",
                 json_string_value(json_object_get(json_array_get(messages, 0), "content")));
    l->well_formed = history_matches(f, i, turn, messages) &&
                     max_tokens == f->w->conv[i].turns[turn].output_tokens &&
                     json_is_true(json_object_get(j, "stream")) && json_is_true(json_object_get(j, "ignore_eos")) &&
                     json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage")) &&
                     eq(json_string_value(json_object_get(j, "model")), f->o.model);
    json_decref(j);
    const behave how = f->how[i];
    if (how == SILENT) /* never answered: the driver's timeout ends it */
        return 0;
    if (how == HTTP_500_AT_TURN_1 && turn == 1) {
        l->ended = bench_now_s();
        respond(fd, 500, "application/json",
                "{\"error\":{\"message\":\"boom at turn 1\",\"type\":\"server_error\"}}", 0);
        return 0;
    }
    /* the answer: a role chunk with "", then max_tokens pieces "c<i>t<turn>",
     * " é", "+", "+", ..., in as many chunks, but for the last two in one
     * where usage gives the count (as pensieve-serve holds back a token
     * that ends inside a UTF-8 character) */
    char *answer = f->answers[i][turn];
    answer[0] = '\0';
    char stream[8192];
    size_t n = (size_t)snprintf(
        stream, sizeof stream,
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
    const size_t role_chunk = n;
    const int chunks = how == ERROR_EVENT || how == NO_DONE ? 1 : how == NO_USAGE ? max_tokens : max_tokens - 1;
    for (int k = 0; k < chunks && n < sizeof stream - 512; k++) {
        char piece[32];
        if (k == 0)
            snprintf(piece, sizeof piece, "c%dt%d", i, turn);
        else
            snprintf(piece, sizeof piece, "%s%s", k == 1 ? " \xc3\xa9" : "+",
                     k == chunks - 1 && how != NO_USAGE ? "+" : "");
        if (strlen(answer) + strlen(piece) < sizeof f->answers[i][turn])
            strcat(answer, piece);
        n += (size_t)snprintf(stream + n, sizeof stream - n,
                              ": a comment\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"}}]}\n\n",
                              piece);
    }
    if (how == ERROR_EVENT)
        n += (size_t)snprintf(stream + n, sizeof stream - n, "data: {\"error\":{\"message\":\"cancelled\"}}\n\n");
    if (how != NO_USAGE && how != NO_DONE && how != ERROR_EVENT)
        n += (size_t)snprintf(stream + n, sizeof stream - n,
                              "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                              "\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\r\n\r\n",
                              100 + 10 * turn, max_tokens, 7 * turn);
    if (how != NO_DONE)
        n += (size_t)snprintf(stream + n, sizeof stream - n, "data: [DONE]\n\n");
    l->ended = bench_now_s();
    if (how == DRIBBLE) { /* the role chunk, 30 ms, then 5 bytes at a time: events torn anywhere */
        char head[160];
        const int h = snprintf(head, sizeof head,
                               "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %zu\r\n\r\n", n);
        send_all(fd, head, (size_t)h);
        send_all(fd, stream, role_chunk);
        usleep(30000);
        for (size_t at = role_chunk; at < n; at += 5) {
            send_all(fd, stream + at, n - at < 5 ? n - at : 5);
            usleep(200);
        }
    } else {
        respond(fd, 200, "text/event-stream", stream, how == NO_DONE);
    }
    f->done_answers += how != NO_DONE && how != ERROR_EVENT;
    return how == NO_DONE;
}

/* One whole request in c->buf: answers it and drops it from the buffer;
 * 0 while it is not all there, -1 to close the connection. */
static int serve_one(fake *f, conn *c)
{
    c->buf[c->n] = '\0';
    const char *end = strstr(c->buf, "\r\n\r\n");
    if (!end)
        return c->n >= sizeof c->buf - 1 ? -1 : 0;
    const size_t head = (size_t)(end - c->buf) + 4;
    char headers[8192], session[160] = "", body[1 << 15];
    snprintf(headers, sizeof headers, "%.*s", (int)head, c->buf);
    size_t length = 0;
    for (char *save = NULL, *line = strtok_r(headers, "\r\n", &save); line; line = strtok_r(NULL, "\r\n", &save)) {
        if (strncasecmp(line, "Content-Length:", 15) == 0)
            length = (size_t)strtoul(line + 15, NULL, 10);
        if (strncasecmp(line, "X-Session-Id: ", 14) == 0)
            snprintf(session, sizeof session, "%s", line + 14);
    }
    if (head + length > c->n)
        return c->n >= sizeof c->buf - 1 ? -1 : 0;
    snprintf(body, sizeof body, "%.*s", (int)length, c->buf + head);
    int close_after = 0;
    if (strncmp(c->buf, "POST /v1/chat/completions ", 26) == 0) {
        close_after = chat(f, c->fd, session[0] ? session : NULL, body);
    } else if (strncmp(c->buf, "GET /metrics ", 13) == 0) {
        char page[1024];
        snprintf(page, sizeof page,
                 "# TYPE pensieve_engine_turns_total counter\npensieve_engine_turns_total{result=\"done\"} %d\n"
                 "pensieve_engine_turns_total{result=\"failed\"} 0\npensieve_engine_prefill_tokens_total %d\n"
                 "pensieve_engine_recomputed_tokens_total 0\npensieve_engine_decode_tokens_total 0\n"
                 "pensieve_cache_swap_in_chunks_total 0\npensieve_cache_swap_out_chunks_total 0\n"
                 "pensieve_cache_dropped_chunks_total 0\npensieve_engine_suspensions_total 0\n",
                 f->done_answers + 1000, 10 * f->done_answers);
        respond(c->fd, 200, "text/plain", page, 0);
    } else if (strncmp(c->buf, "DELETE /v1/sessions/", 20) == 0) {
        const size_t prefix = f->o.session_prefix ? strlen(f->o.session_prefix) : 0;
        const int i = atoi(c->buf + 20 + prefix);
        if (i >= 0 && i < MAX_CONV) {
            f->deletes[i]++;
            f->deleted_at[i] = bench_now_s();
        }
        respond(c->fd, i % 2 ? 404 : 200, "application/json", "{}", 0); /* 404: a server without sessions */
    } else { /* GET /v1/models and the rest: a server without them */
        respond(c->fd, 404, "application/json", "{\"error\":{\"message\":\"no such path\"}}", 0);
    }
    memmove(c->buf, c->buf + head + length, c->n - head - length);
    c->n -= head + length;
    return close_after ? -1 : 1;
}

/* Single-threaded like the driver: poll over the listener and every open
 * connection, until the stop pipe is written. */
static void *serve(void *arg)
{
    fake *f = arg;
    conn *conns = calloc(MAX_CONNS, sizeof *conns);
    if (!conns)
        return NULL;
    for (int k = 0; k < MAX_CONNS; k++)
        conns[k].fd = -1;
    for (;;) {
        struct pollfd p[MAX_CONNS + 2] = {{.fd = f->listener, .events = POLLIN},
                                          {.fd = f->stop_pipe[0], .events = POLLIN}};
        for (int k = 0; k < MAX_CONNS; k++)
            p[k + 2] = (struct pollfd){.fd = conns[k].fd, .events = POLLIN};
        if (poll(p, MAX_CONNS + 2, 1000) < 0 || p[1].revents)
            break;
        if (p[0].revents & POLLIN) {
            const int fd = accept(f->listener, NULL, NULL);
            int k = 0;
            while (k < MAX_CONNS && conns[k].fd >= 0)
                k++;
            if (k < MAX_CONNS)
                conns[k].fd = fd, conns[k].n = 0;
            else if (fd >= 0)
                close(fd);
        }
        for (int k = 0; k < MAX_CONNS; k++) {
            conn *c = &conns[k];
            if (c->fd < 0 || !(p[k + 2].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            const ssize_t got = recv(c->fd, c->buf + c->n, sizeof c->buf - 1 - c->n, 0);
            int state = got > 0 ? 1 : -1;
            if (got > 0)
                c->n += (size_t)got;
            while (state == 1)
                state = serve_one(f, c);
            if (state < 0) {
                close(c->fd);
                c->fd = -1;
            }
        }
    }
    for (int k = 0; k < MAX_CONNS; k++)
        if (conns[k].fd >= 0)
            close(conns[k].fd);
    free(conns);
    return NULL;
}

static int fake_start(fake *f)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    f->listener = socket(AF_INET, SOCK_STREAM, 0);
    if (f->listener < 0 || bind(f->listener, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->listener, 64) != 0 ||
        getsockname(f->listener, (struct sockaddr *)&a, &len) != 0 || pipe(f->stop_pipe) != 0)
        return -1;
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->thread, NULL, serve, f) == 0 ? 0 : -1;
}

static void fake_stop(fake *f)
{
    if (write(f->stop_pipe[1], "x", 1) == 1)
        pthread_join(f->thread, NULL);
    close(f->stop_pipe[0]);
    close(f->stop_pipe[1]);
    close(f->listener);
}

/* ---- workloads and runs ------------------------------------------------------------------- */

/* n conversations of n_turns turns, arriving every `gap` s, thinking
 * think * (1 + k) s before turn k; conversation i's messages are 2 + i
 * words and turn k's answer 3 + k tokens, so a record tells its
 * conversation and turn. */
static void workload(wl_workload *w, wl_conversation *convs, wl_turn (*turns)[MAX_TURNS], int n, int n_turns,
                     double gap, double think)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < n_turns; k++)
            turns[i][k] = (wl_turn){.input_tokens = 2 + i, .output_tokens = 3 + k, .think_s = k ? think * (1 + k) : 0};
        convs[i] = (wl_conversation){.arrival_s = gap * (i + 1), .n_turns = n_turns, .turns = turns[i]};
    }
    *w = (wl_workload){.conv = convs, .n = n};
}

/* Runs w against a fresh fake answering conversation i as how[i]. */
static pv_status run(fake *f, const wl_workload *w, const behave *how, int sessions, double timeout, br_run *out,
                     double *t_before)
{
    memset(f, 0, sizeof *f);
    f->w = w;
    memcpy(f->how, how, (size_t)w->n * sizeof *how);
    f->o = (bh_options){.model = "fake-model", .sessions = sessions, .session_prefix = sessions ? "t-" : NULL,
                        .ignore_eos = 1, .request_timeout_s = timeout, .seed = 11, .label = "test"};
    if (fake_start(f) != 0)
        return pv_error(PV_ERR_IO, "the fake server did not start");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/", f->port); /* /v1 and the slash are dropped */
    f->o.url = url;
    *t_before = bench_now_s();
    pv_status st = bh_run(&f->o, w, out);
    fake_stop(f);
    return st;
}

static const logged *find(const fake *f, int conv, int turn)
{
    for (int k = 0; k < f->n_log; k++)
        if (f->log[k].conv == conv && f->log[k].turn == turn)
            return &f->log[k];
    return NULL;
}

/* ---- the tests ------------------------------------------------------------------------------ */

static void test_conversations(void)
{
    static fake f;
    wl_conversation convs[5];
    wl_turn turns[5][MAX_TURNS];
    wl_workload w;
    workload(&w, convs, turns, 5, 3, 0.03, 0.02);
    turns[4][1].text = "replayed, with \xe2\x9c\x93 and \"quotes\"";
    const behave how[5] = {NORMAL, DRIBBLE, NO_USAGE, NORMAL, NORMAL};
    br_run r;
    double t0;
    pv_status st = run(&f, &w, how, 1, 10, &r, &t0);
    ok(st == PV_OK && r.n_records == 15 && !r.first_error[0] && f.n_log == 15 && f.unknown == 0,
       "15 turns sent and answered (%s; %lld records, %d requests logged, first error '%s')",
       st == PV_OK ? "ok" : pv_last_error(), (long long)r.n_records, f.n_log, r.first_error);
    int formed = f.n_log == 15, timely = f.n_log == 15, named = f.n_log == 15;
    for (int k = 0; k < f.n_log; k++) {
        const logged *l = &f.log[k], *prev = l->turn ? find(&f, l->conv, l->turn - 1) : NULL;
        const double due = l->turn ? (prev ? prev->ended : 1e300) + turns[l->conv][l->turn].think_s
                                   : t0 + convs[l->conv].arrival_s;
        formed = formed && l->well_formed;
        named = named && l->session == 1;
        if (l->arrived < due) {
            tap_diag("conversation %d turn %d arrived %.4f s before it was due", l->conv, l->turn, due - l->arrived);
            timely = 0;
        }
    }
    ok(formed, "every request carries the whole conversation in order, its answers as sent (a replayed text too), "
       "and max_tokens, stream, include_usage, ignore_eos, model");
    ok(timely, "no turn is sent before its arrival, or before the previous answer's end plus its think time");
    int deleted = named;
    for (int i = 0; i < 5; i++) {
        const logged *last = find(&f, i, 2);
        deleted = deleted && f.deletes[i] == 1 && last && f.deleted_at[i] >= last->ended;
    }
    ok(deleted, "each request names its conversation's session, deleted once after its last turn (404 or not)");
    int lengths = r.n_records == 15, timing = r.n_records == 15, usage = 1, late_first = 1;
    int64_t no_usage_prompt = 0;
    for (int64_t k = 0; k < r.n_records; k++) {
        const br_record *x = &r.records[k];
        lengths = lengths && !x->failed && x->generated == x->target_tokens;
        timing = timing && x->submit_s >= 0 && x->first_s >= x->submit_s && x->end_s >= x->first_s &&
                 (k == 0 || x->submit_s >= r.records[k - 1].submit_s);
        if (x->input_tokens == 3) /* conversation 1's: its first content comes 30 ms after the role chunk */
            late_first = late_first && x->first_s - x->submit_s >= 0.03;
        /* the fake's usage says prompt 100 + 10 turn, cached 7 turn, and
         * nothing for conversation 2 */
        const int turn = x->target_tokens - 3;
        if (x->prompt_tokens == 0)
            no_usage_prompt++;
        else
            usage = usage && x->prompt_tokens == (uint64_t)(100 + 10 * turn) &&
                    x->cached_tokens == (uint64_t)(7 * turn);
    }
    ok(lengths, "every answer has its length: usage's completion_tokens, or the chunks counted without usage");
    ok(late_first, "the first token is timed at the first content, not at the role chunk 30 ms before it");
    ok(timing && usage && no_usage_prompt == 3,
       "records are in order of submission with submit <= first token <= end; usage's prompt and cached tokens "
       "taken (none for the conversation without usage)");
    ok(r.counters.known && r.counters.turns_done == 15 && r.counters.prefill_tokens == 150,
       "/metrics before and after: turns done %llu, prefill %llu", (unsigned long long)r.counters.turns_done,
       (unsigned long long)r.counters.prefill_tokens);
    br_run_free(&r);

    /* without sessions: no header, no DELETE */
    st = run(&f, &w, how, 0, 10, &r, &t0);
    int anonymous = st == PV_OK && r.n_records == 15 && f.n_log == 15;
    for (int k = 0; k < f.n_log; k++)
        anonymous = anonymous && f.log[k].session == 0 && f.log[k].well_formed;
    for (int i = 0; i < 5; i++)
        anonymous = anonymous && f.deletes[i] == 0;
    ok(anonymous, "without sessions no request names one and none is deleted");
    br_run_free(&r);
}

/* Six conversations, the first five with preambles 0, 1, 2, 0, 1 of 40
 * words, the last without: each request carries its conversation's
 * preamble first, the same text wherever the preamble is the same. */
static void test_preambles(void)
{
    static fake f;
    enum { N = 6 };
    wl_conversation convs[N];
    wl_turn turns[N][MAX_TURNS];
    wl_workload w;
    workload(&w, convs, turns, N, 2, 0.01, 0.01);
    for (int i = 0; i < N - 1; i++) {
        convs[i].system_tokens = 40;
        convs[i].system_prompt = i % 3;
    }
    const behave how[N] = {NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL};
    br_run r;
    double t0;
    pv_status st = run(&f, &w, how, 1, 10, &r, &t0);
    int formed = st == PV_OK && f.n_log == 2 * N && f.unknown == 0;
    for (int k = 0; formed && k < f.n_log; k++)
        formed = f.log[k].well_formed;
    ok(formed, "every request carries its conversation's preamble as the first message, every turn the same (%s)",
       st == PV_OK ? "ok" : pv_last_error());
    int same = formed, differ = formed, sized = formed;
    for (int i = 0; formed && i < N - 1; i++) {
        bh_text want = {0};
        sized = sized && bh_system_words(f.o.seed, i % 3, 40, &want) == PV_OK && strcmp(f.system[i], want.p) == 0;
        free(want.p);
        for (int j = i + 1; j < N - 1; j++) {
            const int eq_text = strcmp(f.system[i], f.system[j]) == 0;
            if (i % 3 == j % 3)
                same = same && eq_text;
            else
                differ = differ && !eq_text;
        }
    }
    ok(same && sized, "conversations that drew the same preamble sent its 40 words (\"%.40s...\")", f.system[0]);
    ok(differ && !f.system[N - 1][0], "different preambles sent different words; the conversation without one none");
    /* conversation i's messages are 2 + i words, 27 in all; a first turn's
     * answer is 3 tokens */
    int64_t first = 0, later = 0;
    for (int64_t k = 0; k < r.n_records; k++)
        *(r.records[k].target_tokens == 3 ? &first : &later) += r.records[k].input_tokens;
    ok(r.n_records == 2 * N && first == 27 + 5 * 40 && later == 27,
       "a first turn's input counts its preamble: first turns %lld tokens, later %lld", (long long)first,
       (long long)later);
    br_run_free(&r);
}

/* One conversation of two turns answered as how: the records and the first
 * error. */
static void test_failure(behave how, int want_records, const char *want_error, double timeout)
{
    static fake f;
    wl_conversation convs[1];
    wl_turn turns[1][MAX_TURNS];
    wl_workload w;
    workload(&w, convs, turns, 1, 2, 0, 0);
    br_run r;
    double t0;
    pv_status st = run(&f, &w, &how, 1, timeout, &r, &t0);
    const int last = (int)r.n_records - 1;
    ok(st == PV_OK && r.n_records == want_records && last >= 0 && r.records[last].failed &&
           (last == 0 || !r.records[0].failed) && strstr(r.first_error, want_error) && f.deletes[0] == 1,
       "%s ends the conversation: %lld records, the last failed, its session deleted; first error '%s'",
       want_error, (long long)r.n_records, r.first_error);
    br_run_free(&r);
}

static void test_refusals(void)
{
    wl_conversation convs[1];
    wl_turn turns[1][MAX_TURNS];
    wl_workload w;
    workload(&w, convs, turns, 1, 1, 0, 0);
    br_run r;
    bh_options o = {.url = "ftp://127.0.0.1/", .model = "m"};
    ok(bh_run(&o, &w, &r) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "ftp://127.0.0.1/") && r.n_records == 0,
       "a URL that is not http(s) is refused naming it (%s)", pv_last_error());
    o = (bh_options){.url = "http://127.0.0.1:1", .model = "m", .sessions = 1, .session_prefix = "a b"};
    ok(bh_run(&o, &w, &r) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "'a b'"),
       "a session prefix that would not make a header is refused (%s)", pv_last_error());
    o.session_prefix = "x-";
    const double before = bench_now_s();
    ok(bh_run(&o, &w, &r) == PV_ERR_IO && strstr(pv_last_error(), "http://127.0.0.1:1") && bench_now_s() - before < 9,
       "a server that cannot be reached fails at once, naming the URL (%s)", pv_last_error());
    br_run_free(&r);
}

int main(void)
{
    alarm(120); /* a driver that never ends its run fails the test instead of hanging it */
    test_conversations();
    test_preambles();
    test_failure(HTTP_500_AT_TURN_1, 2, "conversation 0 turn 1: HTTP 500: boom at turn 1", 10);
    test_failure(ERROR_EVENT, 1, "conversation 0 turn 0: an error event: cancelled", 10);
    test_failure(NO_DONE, 1, "conversation 0 turn 0: the stream ended without data: [DONE]", 10);
    test_failure(SILENT, 1, "conversation 0 turn 0: no complete answer within 0.3 s", 0.3);
    test_refusals();
    return tap_done();
}
