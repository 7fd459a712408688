/* bench-serve: pensieve-serve's HTTP server in process, driven over HTTP
 * by libcurl client threads, beside the same engine without HTTP (turns
 * submitted on the engine's own thread through pv_server_engine_call), in
 * one run on one stack:
 *   1. Throughput at each of --clients concurrent clients, each sending
 *      --requests stateless streamed chat completions back to back (a
 *      prompt of about --prompt-tokens of its own, --gen tokens, greedy,
 *      ignore_eos): requests/s, generated tokens/s, time to first token and
 *      end-to-end latency. Reference: the same prompts from as many
 *      in-process clients, each turn handed to the engine thread when the
 *      client's previous one ends.
 *   2. What the server adds to time to first token: one short prompt,
 *      max_tokens 1, on an idle server, over HTTP and in process in turn.
 *   3. Sessions: the next turn of a conversation with about --history
 *      tokens of history, sent with its session id and, identical, without
 *      (a stateless full prefill).
 * Medians over repetitions; prints tables, or JSON with --json. A program,
 * not a test: make check never runs it. */
#include "apps/setup.h"
#include "bench/bench-util.h"
#include "server/buf.h"
#include "server/server.h"

#include <curl/curl.h>
#include <jansson.h>

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *prog = "bench-serve";

#define MAX_COUNTS 8 /* entries of --clients */
#define MAX_REPS 50  /* --reps, --session-reps */

typedef struct opts {
    app_stack_options stack;
    int clients[MAX_COUNTS], n_clients;
    long requests, reps, prompt_tokens, gen;
    long overhead_reps, overhead_prompt;
    long history, history_turns, session_reps;
    long threads;
    int json;
} opts;

/* ---- small helpers ---------------------------------------------------------------- */

/* The median (q = 0.5) or a nearest-rank quantile of v[0..n), from a
 * sorted copy, so the caller's order (pairs) survives; 0 when n is 0. */
static double quantile(const double *v, int n, double q)
{
    double *c = n > 0 ? malloc((size_t)n * sizeof *c) : NULL;
    if (!c)
        return 0;
    memcpy(c, v, (size_t)n * sizeof *c);
    double r = bench_median(c, n); /* sorts c */
    if (q != 0.5) {
        int k = (int)(q * n + 0.999999) - 1;
        r = c[k < 0 ? 0 : k >= n ? n - 1 : k];
    }
    free(c);
    return r;
}

static double median_of(const double *v, int n)
{
    return quantile(v, n, 0.5);
}

static double p90_of(const double *v, int n)
{
    return quantile(v, n, 0.9);
}

/* Busy CPU seconds of the whole machine (/proc/stat: user, nice, system,
 * irq, softirq) and of this process (all its threads): the difference is
 * what other processes took from the 2 cores while a measurement ran. */
typedef struct cpu_mark {
    double wall, machine, self;
} cpu_mark;

static void cpu_mark_now(cpu_mark *m)
{
    m->wall = bench_now_s();
    m->machine = 0;
    unsigned long long v[7];
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6]) == 7)
            m->machine = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / (double)sysconf(_SC_CLK_TCK);
        fclose(f);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    m->self = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
              1e-6 * (double)ru.ru_stime.tv_usec;
}

/* CPU seconds other processes used between a and b (clamped at 0: the
 * machine's counters tick at 100 Hz, this process's are exact). */
static double others_cpu(const cpu_mark *a, const cpu_mark *b)
{
    double o = (b->machine - a->machine) - (b->self - a->self);
    return o > 0 ? o : 0;
}

/* ---- prompts ---------------------------------------------------------------------- */

/* Ordinary English: prompts and history turns are runs of its words, each
 * from an offset of its own. */
static const char corpus[] =
    "The history of the lighthouse begins with fires lit on hilltops to guide ships home. "
    "Later, towers of stone carried lamps of oil, and lenses of polished glass threw their "
    "light many miles out to sea. Keepers lived beside them, trimming wicks through long "
    "nights and logging every passing vessel. In the twentieth century electricity replaced "
    "the flame, and automation replaced the keepers, yet the towers still stand along rocky "
    "coasts, white and red against the sky. Sailors today rely on satellites, but many still "
    "feel relief when a familiar beam sweeps across the water after a hard passage. "
    "A good kitchen garden starts with the soil: compost worked in each autumn, beds narrow "
    "enough to reach across, and paths that drain after rain. Beans climb the fences, "
    "lettuce grows in the shade of taller plants, and herbs crowd the edges where the sun "
    "lingers longest. Gardeners keep notes on what failed and why, because every season "
    "teaches something about frost, pests and patience. Railways changed how people thought "
    "about distance. A journey that once took a week by coach took a day by train, and "
    "towns set their clocks to a shared time so that timetables could be printed at all. "
    "Stations grew into grand halls of iron and glass, and the sound of a whistle at dusk "
    "became part of ordinary life in villages far from any city. ";

typedef struct bench {
    opts o;
    app_stack st;
    pv_server *srv;
    int port;
} bench;

static long count_tokens(const pv_tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids = malloc((len + 2) * sizeof *ids);
    size_t n = 0;
    pv_status st = ids ? pv_tokenizer_encode(tok, text, len, 0, ids, len + 2, &n) : PV_ERR_OUT_OF_MEMORY;
    free(ids);
    return st == PV_OK ? (long)n : -1;
}

/* "Note SEED:" and the corpus from a word of the seed's own on, until the
 * text is at least n tokens long. */
static char *make_text(const bench *b, int seed, long n)
{
    const size_t len = sizeof corpus - 1; /* it ends with a space: it wraps around cleanly */
    size_t at = (size_t)(strchr(corpus + (size_t)seed * 151 % len, ' ') - corpus);
    char head[32];
    srv_buf s = {0};
    int rc = srv_buf_add(&s, head, (size_t)snprintf(head, sizeof head, "Note %d:", seed));
    long have = 0;
    while (rc == 0 && (have = count_tokens(&b->st.tok, s.s, s.n)) >= 0 && have < n)
        /* Four words (each with the space before it) at a time: an encode
         * per word would be quadratic. */
        for (int words = 0; rc == 0 && words < 4; words += corpus[at] == ' ') {
            rc = srv_buf_add(&s, &corpus[at], 1);
            at = (at + 1) % len;
        }
    if (rc || have < 0) {
        srv_buf_free(&s);
        return NULL;
    }
    return s.s;
}

/* The prompt as the server makes it (server/server_turn.c, tokenize): the
 * chat template with the generation prompt, then tokens with special
 * tokens parsed and BOS where the model wants it. */
static pv_status render(const pv_tokenizer *tok, const pv_chat_message *m, size_t n, int32_t **ids,
                        size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    size_t len;
    pv_status st = pv_tokenizer_apply_chat(tok, m, n, 1, NULL, 0, &len);
    if (st != PV_OK)
        return st;
    char *text = malloc(len + 1);
    int32_t *out = malloc((len + 2) * sizeof *out);
    if (!text || !out) {
        free(text);
        free(out);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: a prompt of %zu bytes", prog, len);
    }
    unsigned flags = PV_TOKENIZE_PARSE_SPECIAL | (tok->add_bos ? PV_TOKENIZE_ADD_BOS : 0);
    if ((st = pv_tokenizer_apply_chat(tok, m, n, 1, text, len + 1, &len)) == PV_OK)
        st = pv_tokenizer_encode(tok, text, len, flags, out, len + 2, n_ids);
    free(text);
    if (st != PV_OK)
        free(out);
    else
        *ids = out;
    return st;
}

/* A streamed, greedy chat completion that ignores end tokens, usage in
 * its last chunk. */
static char *chat_body(const bench *b, const pv_chat_message *m, size_t n, long max_tokens)
{
    json_t *msgs = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", m[i].role, "content", m[i].content));
    json_t *j = json_pack("{s:s, s:o, s:I, s:f, s:b, s:b, s:{s:b}}", "model", b->st.model_id, "messages", msgs,
                          "max_tokens", (json_int_t)max_tokens, "temperature", 0.0, "ignore_eos", 1, "stream", 1,
                          "stream_options", "include_usage", 1);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

/* One stateless request's body and, for the in-process runs, its tokens. */
typedef struct prompt {
    char *body;
    int32_t *ids;
    size_t n_ids;
} prompt;

static int make_prompt(const bench *b, int seed, long tokens, long max_tokens, prompt *p)
{
    memset(p, 0, sizeof *p);
    /* The template's own tokens (default system turn, role markers) count
     * toward the target: measure them with an empty user text. */
    pv_chat_message m = {"user", ""};
    int32_t *ids;
    size_t base;
    if (render(&b->st.tok, &m, 1, &ids, &base) != PV_OK)
        return -1;
    free(ids);
    char *text = make_text(b, seed, tokens > (long)base + 4 ? tokens - (long)base : 4);
    if (!text)
        return -1;
    m.content = text;
    int rc = render(&b->st.tok, &m, 1, &p->ids, &p->n_ids) == PV_OK && (p->body = chat_body(b, &m, 1, max_tokens))
                 ? 0
                 : -1;
    free(text);
    return rc;
}

static void prompt_free(prompt *p)
{
    free(p->body);
    free(p->ids);
    memset(p, 0, sizeof *p);
}

/* ---- HTTP clients ---------------------------------------------------------------------- */

/* One request's times (bench_now_s) and what its stream said. */
typedef struct exchange {
    double t_sent;          /* the request about to be sent on an open connection */
    double t_first_byte;    /* the first response bytes delivered (headers excluded) */
    double t_first_content; /* the first event with a non-empty delta.content */
    double t_end;           /* curl_easy_perform returned: the response is complete */
    long status;
    long prompt_tokens, completion_tokens, cached_tokens;
    int saw_usage, saw_done;
    char error[256];
    srv_buf raw;     /* bytes received and not yet parsed */
    srv_buf content; /* delta.content, concatenated */
} exchange;

static void exchange_free(exchange *x)
{
    srv_buf_free(&x->raw);
    srv_buf_free(&x->content);
}

static void on_event(exchange *x, const char *data, size_t len, double now)
{
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        x->saw_done = 1;
        return;
    }
    json_t *j = json_loadb(data, len, 0, NULL);
    json_t *err = json_object_get(j, "error");
    if (err) {
        const char *msg = json_string_value(json_object_get(err, "message"));
        snprintf(x->error, sizeof x->error, "error event: %s", msg ? msg : "(no message)");
    }
    json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    const char *text = json_string_value(json_object_get(delta, "content"));
    if (text && *text) {
        if (x->t_first_content == 0)
            x->t_first_content = now;
        srv_buf_add(&x->content, text, strlen(text));
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        x->saw_usage = 1;
        x->prompt_tokens = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        x->completion_tokens = (long)json_integer_value(json_object_get(u, "completion_tokens"));
        x->cached_tokens = (long)json_integer_value(
            json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    }
    json_decref(j);
}

/* The clock is read before anything else, so parsing is not counted. */
static size_t on_data(char *p, size_t size, size_t nmemb, void *user)
{
    exchange *x = user;
    double now = bench_now_s();
    size_t len = size * nmemb;
    if (x->t_first_byte == 0)
        x->t_first_byte = now;
    if (srv_buf_add(&x->raw, p, len))
        return 0;
    size_t start = 0;
    for (char *end; (end = strstr(x->raw.s + start, "\n\n")) != NULL;) {
        const char *ev = x->raw.s + start;
        size_t n = (size_t)(end - ev);
        start = (size_t)(end - x->raw.s) + 2;
        if (n >= 6 && memcmp(ev, "data: ", 6) == 0)
            on_event(x, ev + 6, n - 6, now);
    }
    memmove(x->raw.s, x->raw.s + start, x->raw.n - start + 1);
    x->raw.n -= start;
    return len;
}

/* libcurl calls this once the connection is ready, right before it
 * sends the request: the client's clock starts here. (Stamping the debug
 * callback's HEADER_OUT instead reads late whenever the sending thread is
 * preempted by the server threads its request wakes, which on 2 cores is
 * often.) */
static int on_prereq(void *user, char *primary_ip, char *local_ip, int primary_port, int local_port)
{
    ((exchange *)user)->t_sent = bench_now_s();
    return CURL_PREREQFUNC_OK;
}

/* A client keeps one connection open across its requests, as an OpenAI
 * client's connection pool does. */
typedef struct client {
    CURL *curl;
    int port;
} client;

static int request(client *c, const char *path, const char *body, const char *session, exchange *x)
{
    memset(x, 0, sizeof *x);
    char url[128], sh[200];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", c->port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    /* No Expect: 100-continue round trip before larger bodies. */
    h = curl_slist_append(h, "Expect:");
    if (session) {
        snprintf(sh, sizeof sh, "X-Session-Id: %s", session);
        h = curl_slist_append(h, sh);
    }
    CURL *k = c->curl;
    curl_easy_setopt(k, CURLOPT_URL, url);
    curl_easy_setopt(k, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(k, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(k, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    } else {
        curl_easy_setopt(k, CURLOPT_HTTPGET, 1L);
    }
    curl_easy_setopt(k, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(k, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(k, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(k, CURLOPT_PREREQDATA, x);
    x->t_sent = bench_now_s(); /* on_prereq sets it again, later */
    CURLcode rc = curl_easy_perform(k);
    x->t_end = bench_now_s();
    curl_easy_getinfo(k, CURLINFO_RESPONSE_CODE, &x->status);
    curl_slist_free_all(h);
    if (rc != CURLE_OK) {
        snprintf(x->error, sizeof x->error, "%s %s: %s", body ? "POST" : "GET", path, curl_easy_strerror(rc));
        return -1;
    }
    if (x->status != 200) {
        json_t *j = json_loadb(x->raw.s ? x->raw.s : "", x->raw.n, 0, NULL);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        snprintf(x->error, sizeof x->error, "%s %s: HTTP %ld: %s", body ? "POST" : "GET", path, x->status,
                 msg ? msg : "(no error message)");
        json_decref(j);
        return -1;
    }
    if (body && !x->error[0] && (!x->saw_done || !x->saw_usage || x->t_first_content == 0))
        snprintf(x->error, sizeof x->error, "POST %s: the stream lacked %s", path,
                 x->t_first_content == 0 ? "a content event" : !x->saw_usage ? "its usage chunk" : "[DONE]");
    return x->error[0] ? -1 : 0;
}

static int client_open(client *c, int port, char *error, size_t cap)
{
    c->port = port;
    if (!(c->curl = curl_easy_init())) {
        snprintf(error, cap, "curl_easy_init failed");
        return -1;
    }
    curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT, 900L);
    /* Connect now, so no timed request pays for it. */
    exchange x;
    int rc = request(c, "/health", NULL, NULL, &x);
    if (rc) {
        snprintf(error, cap, "%s", x.error);
        curl_easy_cleanup(c->curl);
        c->curl = NULL;
    }
    exchange_free(&x);
    return rc;
}

static void client_close(client *c)
{
    if (c->curl)
        curl_easy_cleanup(c->curl);
    c->curl = NULL;
}

/* ---- turns on the engine thread ----------------------------------------------------------- */

/* Turns handed to the engine thread, and the slots of those that ended
 * since the driving thread last looked. */
typedef struct ref_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *ended;
    int n_ended;
} ref_pool;

typedef struct ref_turn {
    const int32_t *ids;
    size_t n_ids;
    long gen;
    int slot;
    double t_submit, t_first, t_done;
    long generated;
    pv_status status;
    pv_turn_result res;
    ref_pool *pool;
} ref_turn;

typedef struct ref_call {
    ref_turn **turns;
    int n, ran;
} ref_call;

static void ref_ended(ref_turn *t)
{
    pthread_mutex_lock(&t->pool->mu);
    t->pool->ended[t->pool->n_ended++] = t->slot;
    pthread_cond_signal(&t->pool->cv);
    pthread_mutex_unlock(&t->pool->mu);
}

static void ref_on_token(void *user, int32_t token, const char *text, size_t len)
{
    ref_turn *t = user;
    if (t->generated++ == 0)
        t->t_first = bench_now_s();
}

static void ref_on_done(void *user, pv_status st, const pv_turn_result *r)
{
    ref_turn *t = user;
    t->t_done = bench_now_s();
    t->status = st;
    t->res = *r;
    ref_ended(t);
}

/* Runs on the engine thread: each turn as the server submits a stateless
 * request's (token ids of the whole conversation, no session). A turn
 * the engine refuses ends here. */
static pv_status ref_submit(pv_engine *e, void *arg)
{
    ref_call *c = arg;
    pv_status first = PV_OK;
    c->ran = 1;
    for (int i = 0; i < c->n; i++) {
        ref_turn *t = c->turns[i];
        pv_turn turn = {.tokens = t->ids, .n_tokens = t->n_ids, .whole_conversation = 1};
        pv_sampling_defaults(&turn.sampling);
        turn.sampling.max_tokens = (int32_t)t->gen;
        turn.sampling.ignore_eos = 1;
        pv_turn_callbacks cb = {ref_on_token, ref_on_done, t};
        pv_status st = pv_engine_submit(e, NULL, &turn, &cb, NULL);
        if (st != PV_OK) {
            t->status = st;
            ref_ended(t);
            first = first == PV_OK ? st : first;
        }
    }
    return first;
}

/* Hands n turns to the engine thread at once; each turn's clock starts
 * just before the call. */
static pv_status ref_submit_turns(bench *b, ref_turn **turns, int n)
{
    ref_call c = {turns, n, 0};
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++) {
        turns[i]->t_submit = t0;
        turns[i]->t_first = turns[i]->t_done = 0;
        turns[i]->generated = 0;
        turns[i]->status = PV_OK;
    }
    pv_status st = pv_server_engine_call(b->srv, ref_submit, &c);
    for (int i = 0; !c.ran && i < n; i++) {
        turns[i]->status = st;
        ref_ended(turns[i]);
    }
    return st;
}

/* Waits for turns to end; returns how many, their slots in out. */
static int ref_take(ref_pool *p, int *out)
{
    pthread_mutex_lock(&p->mu);
    while (p->n_ended == 0)
        pthread_cond_wait(&p->cv, &p->mu);
    int n = p->n_ended;
    memcpy(out, p->ended, (size_t)n * sizeof *out);
    p->n_ended = 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

static int ref_pool_init(ref_pool *p, int cap)
{
    memset(p, 0, sizeof *p);
    if (!(p->ended = calloc((size_t)cap, sizeof *p->ended)))
        return -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return 0;
}

static void ref_pool_free(ref_pool *p)
{
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->ended);
}

static pv_status ref_check(const ref_turn *t)
{
    if (t->status != PV_OK)
        return t->status;
    if (t->generated != t->gen)
        return pv_error(PV_ERR_STATE, "an in-process turn generated %ld tokens of %ld", t->generated, t->gen);
    return PV_OK;
}

/* One turn, start to end. */
static pv_status ref_run_one(bench *b, ref_turn *t)
{
    ref_pool pool;
    int slot;
    if (ref_pool_init(&pool, 1) != 0)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: a turn pool", prog);
    t->slot = 0;
    t->pool = &pool;
    ref_submit_turns(b, &t, 1);
    ref_take(&pool, &slot);
    ref_pool_free(&pool);
    return ref_check(t);
}

static pv_status get_stats(pv_engine *e, void *arg)
{
    return pv_engine_stats_get(e, arg);
}

/* ---- 1. throughput ------------------------------------------------------------------------- */

typedef struct load_client {
    client c;
    int port;
    const prompt *prompts; /* this client's, n of them */
    long n, gen;
    double *ttft, *e2e; /* ms, n each */
    long tokens, prompt_tokens;
    int errors;
    char error[256];
    struct gate *start;
} load_client;

/* The clients start together once all are connected. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready, open;
} gate;

static void gate_enter(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->ready++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->ready < n)
        pthread_cond_wait(&g->cv, &g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void *load_main(void *arg)
{
    load_client *lc = arg;
    int unconnected = client_open(&lc->c, lc->port, lc->error, sizeof lc->error);
    gate_enter(lc->start);
    for (long i = 0; !unconnected && i < lc->n; i++) {
        exchange x;
        if (request(&lc->c, "/v1/chat/completions", lc->prompts[i].body, NULL, &x) != 0 ||
            x.completion_tokens != lc->gen) {
            if (!lc->errors++)
                snprintf(lc->error, sizeof lc->error, "%s", x.error[0] ? x.error : "a short answer");
            lc->ttft[i] = lc->e2e[i] = -1;
        } else {
            lc->ttft[i] = 1e3 * (x.t_first_content - x.t_sent);
            lc->e2e[i] = 1e3 * (x.t_end - x.t_sent);
            lc->tokens += x.completion_tokens;
            lc->prompt_tokens += x.prompt_tokens;
        }
        exchange_free(&x);
    }
    if (unconnected)
        lc->errors = (int)lc->n;
    client_close(&lc->c);
    return NULL;
}

typedef struct side_stats {
    double rps[MAX_REPS], tps[MAX_REPS];
    double *ttft, *e2e; /* ms, pooled over repetitions */
    int n_lat;
} side_stats;

typedef struct tp_result {
    int clients;
    long requests; /* per repetition, all clients together */
    double prompt_mean;
    side_stats http, eng;
    int errors;
    double other_cpu, wall; /* other processes' CPU seconds over the runs' seconds */
} tp_result;

static int side_alloc(side_stats *s, long n)
{
    s->ttft = calloc((size_t)n, sizeof *s->ttft);
    s->e2e = calloc((size_t)n, sizeof *s->e2e);
    return s->ttft && s->e2e ? 0 : -1;
}

static int http_load(bench *b, const prompt *prompts, int clients, tp_result *r, int rep)
{
    long per = b->o.requests;
    load_client *lc = calloc((size_t)clients, sizeof *lc);
    pthread_t *th = calloc((size_t)clients, sizeof *th);
    double *lat = calloc((size_t)(2 * clients * per), sizeof *lat);
    if (!lc || !th || !lat) {
        free(lc);
        free(th);
        free(lat);
        fprintf(stderr, "%s: out of memory for %d clients\n", prog, clients);
        return -1;
    }
    gate start = {.ready = 0};
    pthread_mutex_init(&start.mu, NULL);
    pthread_cond_init(&start.cv, NULL);
    int made = 0;
    for (; made < clients; made++) {
        lc[made] = (load_client){.port = b->port, .prompts = prompts + (size_t)made * per, .n = per,
                                 .gen = b->o.gen, .ttft = lat + 2 * made * per, .e2e = lat + (2 * made + 1) * per,
                                 .start = &start};
        if (pthread_create(&th[made], NULL, load_main, &lc[made]) != 0)
            break;
    }
    if (made < clients) {
        fprintf(stderr, "%s: --clients %d: only %d client threads could start\n", prog, clients, made);
        for (int i = made; i < clients; i++)
            lc[i].errors = (int)per;
    }
    gate_open(&start, made);
    double t0 = bench_now_s();
    for (int i = 0; i < made; i++)
        pthread_join(th[i], NULL);
    double wall = bench_now_s() - t0;
    pthread_cond_destroy(&start.cv);
    pthread_mutex_destroy(&start.mu);
    long tokens = 0, ptoks = 0;
    for (int i = 0; i < clients; i++) {
        tokens += lc[i].tokens;
        ptoks += lc[i].prompt_tokens;
        if (lc[i].errors) {
            if (!r->errors)
                fprintf(stderr, "%s: %d clients, client %d: %s\n", prog, clients, i, lc[i].error);
            r->errors += lc[i].errors;
        }
        for (long k = 0; k < per && i < made; k++) {
            if (lc[i].ttft[k] < 0)
                continue;
            r->http.ttft[r->http.n_lat] = lc[i].ttft[k];
            r->http.e2e[r->http.n_lat++] = lc[i].e2e[k];
        }
    }
    r->http.rps[rep] = (double)(clients * per) / wall;
    r->http.tps[rep] = (double)tokens / wall;
    r->prompt_mean = (double)ptoks / (double)(clients * per);
    free(lc);
    free(th);
    free(lat);
    return r->errors ? -1 : 0;
}

/* The reference: the same prompts from the same number of clients, each
 * client's next turn handed to the engine thread as soon as its previous
 * one ends (a closed loop, as the HTTP clients run). */
static int engine_load(bench *b, const prompt *prompts, int clients, tp_result *r, int rep)
{
    long per = b->o.requests;
    ref_turn *t = calloc((size_t)clients, sizeof *t);
    ref_turn **batch = calloc((size_t)clients, sizeof *batch);
    int *got = calloc((size_t)clients, sizeof *got);
    long *next = calloc((size_t)clients, sizeof *next);
    ref_pool pool;
    if (!t || !batch || !got || !next || ref_pool_init(&pool, clients) != 0) {
        free(t);
        free(batch);
        free(got);
        free(next);
        fprintf(stderr, "%s: out of memory for %d in-process clients\n", prog, clients);
        return -1;
    }
    for (int i = 0; i < clients; i++) {
        const prompt *p = &prompts[(size_t)i * per];
        t[i] = (ref_turn){.ids = p->ids, .n_ids = p->n_ids, .gen = b->o.gen, .slot = i, .pool = &pool};
        batch[i] = &t[i];
        next[i] = 1;
    }
    double t0 = bench_now_s();
    pv_status st = ref_submit_turns(b, batch, clients);
    long tokens = 0;
    for (int live = clients; live > 0;) {
        int n = ref_take(&pool, got), nb = 0;
        live -= n;
        for (int k = 0; k < n; k++) {
            ref_turn *x = &t[got[k]];
            pv_status ts = ref_check(x);
            if (ts != PV_OK) {
                st = st == PV_OK ? ts : st;
                continue;
            }
            tokens += x->generated;
            r->eng.ttft[r->eng.n_lat] = 1e3 * (x->t_first - x->t_submit);
            r->eng.e2e[r->eng.n_lat++] = 1e3 * (x->t_done - x->t_submit);
            if (st == PV_OK && next[x->slot] < per) {
                const prompt *p = &prompts[(size_t)x->slot * per + next[x->slot]++];
                x->ids = p->ids;
                x->n_ids = p->n_ids;
                batch[nb++] = x;
            }
        }
        if (nb) {
            live += nb;
            pv_status ss = ref_submit_turns(b, batch, nb);
            st = st == PV_OK ? ss : st;
        }
    }
    double wall = bench_now_s() - t0;
    ref_pool_free(&pool);
    free(t);
    free(batch);
    free(got);
    free(next);
    if (st != PV_OK) {
        fprintf(stderr, "%s: in-process run with %d clients: %s: %s\n", prog, clients, pv_status_str(st),
                pv_last_error());
        return -1;
    }
    r->eng.rps[rep] = (double)(clients * per) / wall;
    r->eng.tps[rep] = (double)tokens / wall;
    return 0;
}

static int throughput(bench *b, tp_result *res)
{
    const opts *o = &b->o;
    int max_c = 0;
    for (int i = 0; i < o->n_clients; i++)
        max_c = o->clients[i] > max_c ? o->clients[i] : max_c;
    size_t n_prompts = (size_t)max_c * (size_t)o->requests;
    prompt *prompts = calloc(n_prompts, sizeof *prompts);
    if (!prompts)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n_prompts && rc == 0; i++)
        if (make_prompt(b, (int)i, o->prompt_tokens, o->gen, &prompts[i]) != 0) {
            fprintf(stderr, "%s: building prompt %zu: %s\n", prog, i, pv_last_error());
            rc = -1;
        }
    for (int c = 0; c < o->n_clients && rc == 0; c++) {
        long n = o->reps * o->clients[c] * o->requests;
        res[c].clients = o->clients[c];
        res[c].requests = o->clients[c] * o->requests;
        if (side_alloc(&res[c].http, n) || side_alloc(&res[c].eng, n))
            rc = -1;
    }
    /* Repetitions outermost, HTTP and in-process in turn (which goes first
     * alternates), so a busy minute falls on both sides of a comparison. */
    for (long rep = 0; rep < o->reps && rc == 0; rep++)
        for (int c = 0; c < o->n_clients && rc == 0; c++) {
            if (!o->json)
                fprintf(stderr, "%s: throughput, %d clients, repetition %ld of %ld\n", prog, o->clients[c],
                        rep + 1, o->reps);
            cpu_mark m0, m1;
            cpu_mark_now(&m0);
            for (int side = 0; side < 2 && rc == 0; side++)
                if ((side == 0) == (rep % 2 == 0) ? http_load(b, prompts, o->clients[c], &res[c], (int)rep)
                                                  : engine_load(b, prompts, o->clients[c], &res[c], (int)rep))
                    rc = -1;
            cpu_mark_now(&m1);
            res[c].other_cpu += others_cpu(&m0, &m1);
            res[c].wall += m1.wall - m0.wall;
        }
    for (size_t i = 0; i < n_prompts; i++)
        prompt_free(&prompts[i]);
    free(prompts);
    return rc;
}

/* ---- 2. the server's share of time to first token ------------------------------------------- */

/* Per repetition, ms. "Less forward" subtracts the engine's own time in
 * the forward pass and sampling over the turn (pv_engine_stats.forward_s,
 * read before and after it): what remains is everything around the model,
 * without the pass's jitter, which is larger than what is measured. */
enum {
    OV_HTTP,        /* request about to be sent -> first delta.content event */
    OV_HTTP_NET,    /* the same less forward */
    OV_FIRST_BYTE,  /* request about to be sent -> first response bytes (the role event) */
    OV_ENG,         /* before pv_server_engine_call -> on_token */
    OV_ENG_NET,     /* the same less forward */
    OV_ENG_INSIDE,  /* the engine's own submit -> first token (pv_turn_result.ttft_ms) */
    OV_DIFF,        /* OV_HTTP - OV_ENG of the same repetition */
    OV_DIFF_NET,    /* OV_HTTP_NET - OV_ENG_NET */
    OV_N
};

static const char *const ov_names[OV_N] = {"http_ms", "http_less_forward_ms", "http_first_byte_ms", "engine_call_ms",
                                           "engine_call_less_forward_ms", "engine_internal_ms", "paired_diff_ms",
                                           "paired_diff_less_forward_ms"};

typedef struct overhead_result {
    int reps;
    long prompt_tokens;
    double *v[OV_N];
    double other_cores; /* other processes' CPU use meanwhile, in cores */
} overhead_result;

static int overhead(bench *b, overhead_result *r)
{
    const int warm = 3;
    int reps = (int)b->o.overhead_reps;
    r->reps = reps;
    for (int i = 0; i < OV_N; i++)
        if (!(r->v[i] = calloc((size_t)reps, sizeof *r->v[i])))
            return -1;
    prompt p;
    client c = {0};
    char error[256];
    if (make_prompt(b, 100000, b->o.overhead_prompt, 1, &p) != 0) {
        fprintf(stderr, "%s: building the short prompt: %s\n", prog, pv_last_error());
        return -1;
    }
    r->prompt_tokens = (long)p.n_ids;
    int rc = client_open(&c, b->port, error, sizeof error);
    if (rc)
        fprintf(stderr, "%s: connecting: %s\n", prog, error);
    for (int k = -warm; k < reps && rc == 0; k++) {
        double http = 0, fb = 0, fwd[2] = {0, 0};
        ref_turn t = {.ids = p.ids, .n_ids = p.n_ids, .gen = 1};
        /* Which side goes first alternates, so drift in the machine's
         * load does not favour either. */
        for (int side = 0; side < 2 && rc == 0; side++) {
            int over_http = (side == 0) == (k % 2 == 0);
            pv_engine_stats s0, s1;
            pv_server_engine_call(b->srv, get_stats, &s0);
            if (over_http) {
                exchange x;
                if (request(&c, "/v1/chat/completions", p.body, NULL, &x) != 0) {
                    fprintf(stderr, "%s: short request: %s\n", prog, x.error);
                    rc = -1;
                } else if (x.prompt_tokens != (long)p.n_ids) {
                    fprintf(stderr, "%s: the server made %ld prompt tokens of the %zu rendered here\n", prog,
                            x.prompt_tokens, p.n_ids);
                    rc = -1;
                }
                http = 1e3 * (x.t_first_content - x.t_sent);
                fb = 1e3 * (x.t_first_byte - x.t_sent);
                exchange_free(&x);
            } else {
                pv_status st = ref_run_one(b, &t);
                if (st != PV_OK) {
                    fprintf(stderr, "%s: in-process short turn: %s: %s\n", prog, pv_status_str(st), pv_last_error());
                    rc = -1;
                }
            }
            pv_server_engine_call(b->srv, get_stats, &s1);
            fwd[over_http] = 1e3 * (s1.forward_s - s0.forward_s);
            /* Idle again: the last response's sending is over. */
            usleep(5000);
        }
        if (k >= 0 && rc == 0) {
            double eng = 1e3 * (t.t_first - t.t_submit);
            r->v[OV_HTTP][k] = http;
            r->v[OV_HTTP_NET][k] = http - fwd[1];
            r->v[OV_FIRST_BYTE][k] = fb;
            r->v[OV_ENG][k] = eng;
            r->v[OV_ENG_NET][k] = eng - fwd[0];
            r->v[OV_ENG_INSIDE][k] = t.res.ttft_ms;
            r->v[OV_DIFF][k] = http - eng;
            r->v[OV_DIFF_NET][k] = (http - fwd[1]) - (eng - fwd[0]);
        }
    }
    client_close(&c);
    prompt_free(&p);
    return rc;
}

/* ---- 3. sessions -------------------------------------------------------------------------- */

typedef struct conversation {
    const bench *b;
    char session[64];
    char *texts[64]; /* user and assistant contents, alternating */
    int n_texts;
    long history; /* tokens the session holds after its last turn */
    char error[256];
} conversation;

/* Builds a session turn by turn over HTTP: long user texts (the same in
 * every conversation) and the model's answers. */
static void *build_main(void *arg)
{
    conversation *cv = arg;
    const bench *b = cv->b;
    const opts *o = &b->o;
    client c = {0};
    if (client_open(&c, b->port, cv->error, sizeof cv->error) != 0)
        return NULL;
    /* Per turn: the user text, the answer, and about 10 tokens of role
     * markers; the default system turn about 30 once. */
    long user = (o->history - 30) / o->history_turns - o->gen - 10;
    user = user < 8 ? 8 : user;
    for (int t = 0; t < o->history_turns && !cv->error[0]; t++) {
        char *text = make_text(b, 5000 + t, user);
        pv_chat_message m[64];
        int n = cv->n_texts;
        for (int i = 0; i < n; i++)
            m[i] = (pv_chat_message){i % 2 ? "assistant" : "user", cv->texts[i]};
        m[n] = (pv_chat_message){"user", text ? text : ""};
        char *body = text ? chat_body(b, m, (size_t)n + 1, o->gen) : NULL;
        exchange x;
        memset(&x, 0, sizeof x);
        if (!body)
            snprintf(cv->error, sizeof cv->error, "out of memory for turn %d", t + 1);
        else if (request(&c, "/v1/chat/completions", body, cv->session, &x) != 0)
            snprintf(cv->error, sizeof cv->error, "turn %d: %.200s", t + 1, x.error);
        else {
            cv->texts[cv->n_texts++] = text;
            cv->texts[cv->n_texts++] = strdup(x.content.s ? x.content.s : "");
            text = NULL;
            cv->history = x.prompt_tokens + x.completion_tokens;
        }
        free(text);
        free(body);
        exchange_free(&x);
    }
    client_close(&c);
    return NULL;
}

typedef struct session_result {
    int reps;
    long history, prompt_tokens, cached;
    double *sess, *stl, *ratio; /* ms, ms, stl / sess; reps each */
    pv_engine_stats delta;      /* the engine's counters over the last session turn */
    double other_cores;
} session_result;

static const char next_question[] = "Which of these points matters most? Answer in one sentence.";

static int sessions(bench *b, session_result *r)
{
    const opts *o = &b->o;
    int reps = (int)o->session_reps;
    r->reps = reps;
    r->sess = calloc((size_t)reps, sizeof *r->sess);
    r->stl = calloc((size_t)reps, sizeof *r->stl);
    r->ratio = calloc((size_t)reps, sizeof *r->ratio);
    conversation *cv = calloc((size_t)reps, sizeof *cv);
    pthread_t *th = calloc((size_t)reps, sizeof *th);
    if (!r->sess || !r->stl || !r->ratio || !cv || !th) {
        free(cv);
        free(th);
        return -1;
    }
    /* One session per repetition, built alike and together (their
     * answers decode as one batch): each measured turn is a genuine next
     * turn of a conversation of its own. */
    int made = 0, rc = 0;
    for (; made < reps; made++) {
        cv[made].b = b;
        snprintf(cv[made].session, sizeof cv[made].session, "bench-serve-%d", made);
        if (pthread_create(&th[made], NULL, build_main, &cv[made]) != 0)
            break;
    }
    for (int i = 0; i < made; i++)
        pthread_join(th[i], NULL);
    if (made < reps) {
        fprintf(stderr, "%s: --session-reps %d: only %d threads could start\n", prog, reps, made);
        rc = -1;
    }
    for (int i = 0; i < made && rc == 0; i++)
        if (cv[i].error[0]) {
            fprintf(stderr, "%s: building session %s: %s\n", prog, cv[i].session, cv[i].error);
            rc = -1;
        }
    client c = {0};
    char error[256];
    if (rc == 0 && (rc = client_open(&c, b->port, error, sizeof error)) != 0)
        fprintf(stderr, "%s: connecting: %s\n", prog, error);
    for (int k = 0; k < reps && rc == 0; k++) {
        pv_chat_message m[65];
        int n = cv[k].n_texts;
        for (int i = 0; i < n; i++)
            m[i] = (pv_chat_message){i % 2 ? "assistant" : "user", cv[k].texts[i]};
        m[n] = (pv_chat_message){"user", next_question};
        char *body = chat_body(b, m, (size_t)n + 1, 1);
        if (!body) {
            rc = -1;
            break;
        }
        r->history = cv[k].history;
        for (int side = 0; side < 2 && rc == 0; side++) {
            int with_session = (side == 0) == (k % 2 == 0);
            pv_engine_stats s0, s1;
            exchange x;
            pv_server_engine_call(b->srv, get_stats, &s0);
            if (request(&c, "/v1/chat/completions", body, with_session ? cv[k].session : NULL, &x) != 0) {
                fprintf(stderr, "%s: %s turn: %s\n", prog, with_session ? "session" : "stateless", x.error);
                rc = -1;
            }
            pv_server_engine_call(b->srv, get_stats, &s1);
            double ms = 1e3 * (x.t_first_content - x.t_sent);
            if (with_session) {
                r->sess[k] = ms;
                r->cached = x.cached_tokens;
                r->prompt_tokens = x.prompt_tokens;
                r->delta = (pv_engine_stats){
                    .prefill_tokens = s1.prefill_tokens - s0.prefill_tokens,
                    .recomputed_tokens = s1.recomputed_tokens - s0.recomputed_tokens,
                    .reused_device_tokens = s1.reused_device_tokens - s0.reused_device_tokens,
                    .reused_host_tokens = s1.reused_host_tokens - s0.reused_host_tokens,
                };
            } else {
                r->stl[k] = ms;
            }
            exchange_free(&x);
            usleep(5000);
        }
        if (rc == 0)
            r->ratio[k] = r->stl[k] / r->sess[k];
        free(body);
    }
    client_close(&c);
    for (int i = 0; i < reps; i++)
        for (int t = 0; t < cv[i].n_texts; t++)
            free(cv[i].texts[t]);
    free(cv);
    free(th);
    return rc;
}

/* ---- reports ------------------------------------------------------------------------------ */

static void print_tables(const bench *b, const bench_cpu *cpu, const tp_result *tp, const overhead_result *ov,
                         const session_result *ss)
{
    const opts *o = &b->o;
    bench_cpu_print(cpu);
    printf("model %s, %s backend, %s mode; %d OpenMP threads, %ld HTTP threads; \"others\": the CPU other "
           "processes used meanwhile, in cores\n\n",
           b->st.model_name, o->stack.backend, pv_engine_mode_name(o->stack.mode), bench_max_threads(), o->threads);

    printf("1. throughput: each client sends %ld stateless streamed requests back to back (prompt ~%ld tokens, "
           "%ld generated, greedy, ignore_eos); medians of %ld repetitions, HTTP and in process in turn\n",
           o->requests, o->prompt_tokens, o->gen, o->reps);
    printf("%7s %6s | %8s %8s | %8s %8s %6s | %15s %15s | %17s %17s | %6s\n", "clients", "prompt", "req/s",
           "req/s", "tok/s", "tok/s", "http/", "TTFT ms (p90)", "TTFT ms (p90)", "e2e ms (p90)", "e2e ms (p90)",
           "others");
    printf("%7s %6s | %8s %8s | %8s %8s %6s | %15s %15s | %17s %17s | %6s\n", "", "tokens", "http", "engine",
           "http", "engine", "engine", "http", "engine", "http", "engine", "cores");
    for (int c = 0; c < o->n_clients; c++) {
        const tp_result *r = &tp[c];
        double hr = median_of(r->http.rps, (int)o->reps), er = median_of(r->eng.rps, (int)o->reps);
        double ht = median_of(r->http.tps, (int)o->reps), et = median_of(r->eng.tps, (int)o->reps);
        char cell[4][32];
        const double *lat[4] = {r->http.ttft, r->eng.ttft, r->http.e2e, r->eng.e2e};
        int nl[4] = {r->http.n_lat, r->eng.n_lat, r->http.n_lat, r->eng.n_lat};
        for (int i = 0; i < 4; i++)
            snprintf(cell[i], sizeof cell[i], "%.1f (%.1f)", median_of(lat[i], nl[i]), p90_of(lat[i], nl[i]));
        printf("%7d %6.1f | %8.2f %8.2f | %8.1f %8.1f %6.3f | %15s %15s | %17s %17s | %6.2f\n", r->clients,
               r->prompt_mean, hr, er, ht, et, ht / et, cell[0], cell[1], cell[2], cell[3], r->other_cpu / r->wall);
    }

    printf("\n2. time to first token on an idle server: a %ld-token prompt, max_tokens 1, %d alternating "
           "repetitions; \"less forward\" subtracts the engine's forward pass and sampling over the turn\n",
           ov->prompt_tokens, ov->reps);
    static const char *const labels[OV_N] = {
        "HTTP: request sent -> first delta.content event",
        "  less forward",
        "HTTP: request sent -> first response byte (role event)",
        "in process: pv_server_engine_call -> on_token",
        "  less forward",
        "in process: the engine's own submit -> first token",
        "paired difference, HTTP - in process",
        "  less forward",
    };
    printf("%-58s %10s %10s\n", "", "median ms", "p90 ms");
    for (int i = 0; i < OV_N; i++)
        printf("%-58s %10.3f %10.3f\n", labels[i], median_of(ov->v[i], ov->reps), p90_of(ov->v[i], ov->reps));
    printf("server overhead (target < 1 ms): difference of medians %.3f ms, less forward %.3f ms; median of paired "
           "differences %.3f ms, less forward %.3f ms; other processes %.2f cores\n",
           median_of(ov->v[OV_HTTP], ov->reps) - median_of(ov->v[OV_ENG], ov->reps),
           median_of(ov->v[OV_HTTP_NET], ov->reps) - median_of(ov->v[OV_ENG_NET], ov->reps),
           median_of(ov->v[OV_DIFF], ov->reps), median_of(ov->v[OV_DIFF_NET], ov->reps), ov->other_cores);

    printf("\n3. sessions: the next turn after %ld tokens of history (%ld history turns), %d repetitions, each "
           "on a session of its own, session and stateless in turn\n",
           ss->history, o->history_turns, ss->reps);
    double sm = median_of(ss->sess, ss->reps), tm = median_of(ss->stl, ss->reps);
    printf("%-44s %14s %10s\n", "", "TTFT ms median", "p90");
    printf("%-44s %14.1f %10.1f\n", "with X-Session-Id (history kept)", sm, p90_of(ss->sess, ss->reps));
    printf("%-44s %14.1f %10.1f\n", "without (stateless: full prefill)", tm, p90_of(ss->stl, ss->reps));
    printf("speedup: ratio of medians %.2fx, median of paired ratios %.2fx (target >= 3x); other processes %.2f "
           "cores\n",
           tm / sm, median_of(ss->ratio, ss->reps), ss->other_cores);
    printf("session turn: %ld prompt tokens, usage cached_tokens %ld; engine: %llu reused from device, %llu from "
           "host, %llu recomputed, %llu prefilled\n",
           ss->prompt_tokens, ss->cached, (unsigned long long)ss->delta.reused_device_tokens,
           (unsigned long long)ss->delta.reused_host_tokens, (unsigned long long)ss->delta.recomputed_tokens,
           (unsigned long long)ss->delta.prefill_tokens);
}

static json_t *lat_json(const double *v, int n)
{
    return json_pack("{s:f, s:f}", "median", median_of(v, n), "p90", p90_of(v, n));
}

static void print_json(const bench *b, const bench_cpu *cpu, const tp_result *tp, const overhead_result *ov,
                       const session_result *ss)
{
    const opts *o = &b->o;
    json_t *rows = json_array();
    for (int c = 0; c < o->n_clients; c++) {
        const tp_result *r = &tp[c];
        double ht = median_of(r->http.tps, (int)o->reps), et = median_of(r->eng.tps, (int)o->reps);
        json_array_append_new(
            rows, json_pack("{s:i, s:I, s:f, s:{s:f, s:f, s:o, s:o}, s:{s:f, s:f, s:o, s:o}, s:f, s:f}", "clients",
                            r->clients, "requests", (json_int_t)r->requests, "prompt_tokens_mean", r->prompt_mean,
                            "http", "requests_per_s", median_of(r->http.rps, (int)o->reps), "tokens_per_s", ht,
                            "ttft_ms", lat_json(r->http.ttft, r->http.n_lat), "e2e_ms",
                            lat_json(r->http.e2e, r->http.n_lat), "engine", "requests_per_s",
                            median_of(r->eng.rps, (int)o->reps), "tokens_per_s", et, "ttft_ms",
                            lat_json(r->eng.ttft, r->eng.n_lat), "e2e_ms", lat_json(r->eng.e2e, r->eng.n_lat),
                            "http_over_engine_tokens", ht / et, "other_cores", r->other_cpu / r->wall));
    }
    json_t *ovj = json_pack("{s:i, s:I, s:f, s:f, s:f}", "reps", ov->reps, "prompt_tokens",
                            (json_int_t)ov->prompt_tokens, "overhead_ms",
                            median_of(ov->v[OV_HTTP], ov->reps) - median_of(ov->v[OV_ENG], ov->reps),
                            "overhead_less_forward_ms",
                            median_of(ov->v[OV_HTTP_NET], ov->reps) - median_of(ov->v[OV_ENG_NET], ov->reps),
                            "other_cores", ov->other_cores);
    for (int i = 0; ovj && i < OV_N; i++)
        json_object_set_new(ovj, ov_names[i], lat_json(ov->v[i], ov->reps));
    json_t *ssj = json_pack(
        "{s:i, s:I, s:I, s:I, s:I, s:o, s:o, s:f, s:f, s:f, s:{s:I, s:I, s:I, s:I}}", "reps", ss->reps,
        "history_tokens", (json_int_t)ss->history, "history_turns", (json_int_t)o->history_turns, "prompt_tokens",
        (json_int_t)ss->prompt_tokens, "cached_tokens", (json_int_t)ss->cached, "session_ttft_ms",
        lat_json(ss->sess, ss->reps), "stateless_ttft_ms", lat_json(ss->stl, ss->reps), "speedup",
        median_of(ss->stl, ss->reps) / median_of(ss->sess, ss->reps), "paired_speedup", median_of(ss->ratio, ss->reps),
        "other_cores", ss->other_cores, "engine", "reused_device", (json_int_t)ss->delta.reused_device_tokens,
        "reused_host", (json_int_t)ss->delta.reused_host_tokens, "recomputed", (json_int_t)ss->delta.recomputed_tokens,
        "prefilled", (json_int_t)ss->delta.prefill_tokens);
    json_t *j = json_pack(
        "{s:s, s:i, s:f, s:s, s:s, s:s, s:i, s:I, s:{s:I, s:I, s:I, s:I, s:o}, s:o, s:o}", "cpu", cpu->model, "cores",
        cpu->cores, "nominal_fma_gflops", cpu->peak_gflops, "model", b->st.model_name, "backend", o->stack.backend,
        "mode", pv_engine_mode_name(o->stack.mode), "omp_threads", bench_max_threads(), "http_threads",
        (json_int_t)o->threads, "throughput", "requests_per_client", (json_int_t)o->requests, "reps",
        (json_int_t)o->reps, "prompt_tokens", (json_int_t)o->prompt_tokens, "gen", (json_int_t)o->gen, "rows", rows,
        "ttft_overhead", ovj, "session", ssj);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
    printf("%s\n", s ? s : "{}");
    free(s);
    json_decref(j);
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bench-serve [options]\n"
            "  --model PATH            GGUF file (default: the one scripts/get-model installs)\n"
            "  --synthetic             the tiny synthetic test model (a smoke run)\n"
            "  --backend NAME          cpu, opencl or cuda (default cpu)\n"
            "  --mode MODE             pensieve, gpu-only or stateless (default pensieve)\n"
            "  --device-mem SIZE       device tier budget, e.g. 512M\n"
            "  --host-mem SIZE         host tier budget\n"
            "  --threads N             HTTP threads (default 4, as pensieve-serve)\n"
            "  --clients LIST          concurrent clients, comma-separated (default 1,8,32)\n"
            "  --requests N            requests per client per repetition (default 3)\n"
            "  --reps N                throughput repetitions (default 3)\n"
            "  --prompt-tokens N       throughput prompt length (default 100)\n"
            "  --gen N                 tokens per answer (default 32)\n"
            "  --overhead-reps N       short-prompt repetitions (default 40)\n"
            "  --overhead-prompt N     short prompt length (default 20)\n"
            "  --history N             session history tokens (default 1000)\n"
            "  --history-turns N       turns that build it (default 4)\n"
            "  --session-reps N        sessions measured (default 5)\n"
            "  --quick                 small values of all of the above (seconds with --synthetic)\n"
            "  --json                  JSON instead of tables\n"
            "  -h, --help              this text\n");
}

static int parse_clients(const char *s, opts *o)
{
    o->n_clients = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || o->n_clients == MAX_COUNTS || (*end && *end != ',') ||
            (*end == ',' && !end[1])) {
            fprintf(stderr, "%s: --clients '%s' is not a list of at most %d integers in [1, 256] separated by "
                    "commas\n", prog, s, MAX_COUNTS);
            return -1;
        }
        o->clients[o->n_clients++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (o->n_clients == 0) {
        fprintf(stderr, "%s: --clients '%s' names no client count\n", prog, s);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, opts *o)
{
    enum { O_MODEL = 256, O_SYNTH, O_BACKEND, O_MODE, O_DEV, O_HOST, O_CLIENTS, O_QUICK, O_JSON, O_INT };
    /* The integer options, in the order of their getopt values from O_INT. */
    const struct {
        long *v;
        long lo, hi;
    } ints[] = {
        {&o->threads, 1, 1024},          {&o->requests, 1, 1000},      {&o->reps, 1, MAX_REPS},
        {&o->prompt_tokens, 1, 100000},  {&o->gen, 1, 100000},         {&o->overhead_reps, 1, 100000},
        {&o->overhead_prompt, 1, 100000}, {&o->history, 1, 1000000},   {&o->history_turns, 1, 31},
        {&o->session_reps, 1, MAX_REPS},
    };
    static const struct option lo[] = {
        {"model", required_argument, 0, O_MODEL},
        {"synthetic", no_argument, 0, O_SYNTH},
        {"backend", required_argument, 0, O_BACKEND},
        {"mode", required_argument, 0, O_MODE},
        {"device-mem", required_argument, 0, O_DEV},
        {"host-mem", required_argument, 0, O_HOST},
        {"clients", required_argument, 0, O_CLIENTS},
        {"quick", no_argument, 0, O_QUICK},
        {"json", no_argument, 0, O_JSON},
        {"help", no_argument, 0, 'h'},
        {"threads", required_argument, 0, O_INT},
        {"requests", required_argument, 0, O_INT + 1},
        {"reps", required_argument, 0, O_INT + 2},
        {"prompt-tokens", required_argument, 0, O_INT + 3},
        {"gen", required_argument, 0, O_INT + 4},
        {"overhead-reps", required_argument, 0, O_INT + 5},
        {"overhead-prompt", required_argument, 0, O_INT + 6},
        {"history", required_argument, 0, O_INT + 7},
        {"history-turns", required_argument, 0, O_INT + 8},
        {"session-reps", required_argument, 0, O_INT + 9},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->stack.backend = "cpu";
    o->stack.mode = PV_MODE_PENSIEVE;
    o->stack.kv_dtype = PV_F32;
    o->clients[0] = 1, o->clients[1] = 8, o->clients[2] = 32, o->n_clients = 3;
    o->requests = 3, o->reps = 3, o->prompt_tokens = 100, o->gen = 32;
    o->overhead_reps = 40, o->overhead_prompt = 20;
    o->history = 1000, o->history_turns = 4, o->session_reps = 5;
    o->threads = 4;
    /* --quick sets the defaults; options given beside it still win. */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--quick") == 0) {
            o->clients[0] = 1, o->clients[1] = 4, o->n_clients = 2;
            o->requests = 2, o->reps = 1, o->prompt_tokens = 40, o->gen = 8;
            o->overhead_reps = 6, o->history = 200, o->history_turns = 2, o->session_reps = 2;
        }
    int c, li;
    while ((c = getopt_long(argc, argv, "h", lo, &li)) != -1) {
        if (c >= O_INT) {
            char opt[32];
            snprintf(opt, sizeof opt, "--%s", lo[li].name);
            if (app_opt_long(prog, opt, optarg, ints[c - O_INT].lo, ints[c - O_INT].hi, ints[c - O_INT].v))
                return -1;
            continue;
        }
        switch (c) {
        case O_MODEL: o->stack.model = optarg; break;
        case O_SYNTH: o->stack.synthetic = 1; break;
        case O_BACKEND: o->stack.backend = optarg; break;
        case O_MODE:
            if (pv_engine_mode_parse(optarg, &o->stack.mode) != PV_OK) {
                fprintf(stderr, "%s: --mode '%s' is not pensieve, gpu-only or stateless\n", prog, optarg);
                return -1;
            }
            break;
        case O_DEV:
            if (app_opt_size(prog, "--device-mem", optarg, &o->stack.device_bytes)) return -1;
            break;
        case O_HOST:
            if (app_opt_size(prog, "--host-mem", optarg, &o->stack.host_bytes)) return -1;
            break;
        case O_CLIENTS:
            if (parse_clients(optarg, o)) return -1;
            break;
        case O_QUICK: break;
        case O_JSON: o->json = 1; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind != argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return -1;
    }
    if (o->stack.synthetic && o->stack.model) {
        fprintf(stderr, "%s: --model and --synthetic exclude each other\n", prog);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    if (parse_args(argc, argv, &b.o))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "%s: libcurl does not initialise\n", prog);
        return 1;
    }
    int rc = 1;
    tp_result *tp = calloc(MAX_COUNTS, sizeof *tp);
    overhead_result ov = {0};
    session_result ss = {0};
    if (!tp || app_stack_init(&b.st, &b.o.stack, prog) != 0)
        goto out;
    const pv_llama_hparams *hp = pv_llama_hparams_of(b.st.model);
    pv_server_config sc;
    pv_server_config_defaults(&sc);
    sc.port = 0;
    sc.threads = (unsigned)b.o.threads;
    sc.model_id = b.st.model_id;
    sc.n_ctx = hp->n_ctx_train;
    sc.n_vocab = hp->n_vocab;
    sc.n_layers = hp->n_layers;
    pv_status s = pv_server_start(&b.srv, b.st.engine, &b.st.tok, &sc);
    if (s != PV_OK) {
        fprintf(stderr, "%s: server: %s: %s\n", prog, pv_status_str(s), pv_last_error());
        goto out;
    }
    b.port = pv_server_port(b.srv);
    bench_cpu cpu;
    bench_cpu_detect(&cpu);
    if (!b.o.json)
        fprintf(stderr, "%s: %s on http://127.0.0.1:%d\n", prog, b.st.model_name, b.port);
    /* A warm-up on both paths: the first turns fault the weights in. */
    prompt warm;
    if (make_prompt(&b, 999999, b.o.prompt_tokens, b.o.gen, &warm) == 0) {
        client c = {0};
        char error[256];
        exchange x;
        memset(&x, 0, sizeof x);
        ref_turn t = {.ids = warm.ids, .n_ids = warm.n_ids, .gen = b.o.gen};
        int bad = client_open(&c, b.port, error, sizeof error) != 0 ||
                  request(&c, "/v1/chat/completions", warm.body, NULL, &x) != 0 || ref_run_one(&b, &t) != PV_OK;
        if (bad)
            fprintf(stderr, "%s: warm-up: %s\n", prog, x.error[0] ? x.error : error[0] ? error : pv_last_error());
        exchange_free(&x);
        client_close(&c);
        prompt_free(&warm);
        if (bad)
            goto out;
    }
    if (throughput(&b, tp) != 0)
        goto out;
    if (!b.o.json)
        fprintf(stderr, "%s: time to first token, %ld repetitions\n", prog, b.o.overhead_reps);
    cpu_mark m0, m1;
    cpu_mark_now(&m0);
    if (overhead(&b, &ov) != 0)
        goto out;
    cpu_mark_now(&m1);
    ov.other_cores = others_cpu(&m0, &m1) / (m1.wall - m0.wall);
    if (!b.o.json)
        fprintf(stderr, "%s: sessions: building %ld conversations\n", prog, b.o.session_reps);
    cpu_mark_now(&m0);
    if (sessions(&b, &ss) != 0)
        goto out;
    cpu_mark_now(&m1);
    ss.other_cores = others_cpu(&m0, &m1) / (m1.wall - m0.wall);
    if (b.o.json)
        print_json(&b, &cpu, tp, &ov, &ss);
    else
        print_tables(&b, &cpu, tp, &ov, &ss);
    rc = 0;
out:
    pv_server_stop(b.srv, 5.0);
    app_stack_free(&b.st);
    for (int c = 0; tp && c < MAX_COUNTS; c++) {
        free(tp[c].http.ttft);
        free(tp[c].http.e2e);
        free(tp[c].eng.ttft);
        free(tp[c].eng.e2e);
    }
    free(tp);
    for (int i = 0; i < OV_N; i++)
        free(ov.v[i]);
    free(ss.sess);
    free(ss.stl);
    free(ss.ratio);
    curl_global_cleanup();
    return rc;
}
