/* pensieve-serve end to end, in process: the server over the synthetic
 * model, driven by libcurl. Completions plain and streamed, sessions
 * (cached prompt tokens, the stateless answer, divergence, DELETE), every
 * kind of bad input answered with its 4xx while the server keeps serving,
 * 32 concurrent clients over 8 sessions, and a client that leaves
 * mid-stream (its turn is cancelled, no slot stays held). */
#include "server/server.h"

#include "delay-backend.h"
#include "engine-util.h"

#include <curl/curl.h>
#include <jansson.h>

#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#define N_CTX 2048

typedef struct http_resp {
    long status;
    char *body;
    size_t n;
    size_t abort_after; /* stream: stop reading after this many bytes (0: never) */
} http_resp;

static size_t on_body(char *p, size_t size, size_t n, void *user)
{
    http_resp *r = user;
    size_t len = size * n;
    char *b = realloc(r->body, r->n + len + 1);
    if (!b)
        return 0;
    memcpy(b + r->n, p, len);
    r->body = b;
    r->n += len;
    b[r->n] = '\0';
    if (r->abort_after && r->n >= r->abort_after)
        return 0; /* the client hangs up */
    return len;
}

/* One request; headers is a NULL-terminated list (may be NULL). */
static int http(int port, const char *method, const char *path, const char *body, size_t body_len,
                const char *const *headers, http_resp *out)
{
    memset(out, 0, sizeof *out);
    CURL *c = curl_easy_init();
    if (!c)
        return -1;
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    for (size_t i = 0; headers && headers[i]; i++)
        h = curl_slist_append(h, headers[i]);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)body_len);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return rc == CURLE_OK || rc == CURLE_WRITE_ERROR ? 0 : -1;
}

static void resp_free(http_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* A header list that starts with the JSON content type the API needs. */
static struct curl_slist *json_headers(const char *extra)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    return extra ? curl_slist_append(h, extra) : h;
}

static long post(int port, const char *path, const char *body, const char *const *headers, http_resp *out)
{
    if (http(port, "POST", path, body, strlen(body), headers, out) != 0)
        return -1;
    return out->status;
}

/* ---- answers ---------------------------------------------------------------------- */

typedef struct answer {
    long status;
    char content[4096];
    int32_t ids[512];
    int n_ids;
    long prompt, completion, cached;
    char finish[16];
    char error_code[64], error_param[64];
} answer;

static void read_answer(const http_resp *r, answer *a)
{
    memset(a, 0, sizeof *a);
    a->status = r->status;
    json_t *j = json_loadb(r->body ? r->body : "", r->n, JSON_ALLOW_NUL, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    const char *text = msg ? json_string_value(json_object_get(msg, "content"))
                           : json_string_value(json_object_get(ch, "text"));
    snprintf(a->content, sizeof a->content, "%s", text ? text : "");
    const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
    snprintf(a->finish, sizeof a->finish, "%s", fin ? fin : "");
    json_t *ids = json_object_get(ch, "token_ids");
    for (size_t i = 0; i < json_array_size(ids) && a->n_ids < 512; i++)
        a->ids[a->n_ids++] = (int32_t)json_integer_value(json_array_get(ids, i));
    json_t *u = json_object_get(j, "usage");
    a->prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
    a->completion = (long)json_integer_value(json_object_get(u, "completion_tokens"));
    a->cached = (long)json_integer_value(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
    json_t *err = json_object_get(j, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *param = json_string_value(json_object_get(err, "param"));
    snprintf(a->error_code, sizeof a->error_code, "%s", code ? code : "");
    snprintf(a->error_param, sizeof a->error_param, "%s", param ? param : "");
    json_decref(j);
}

/* A chat request body: messages alternate user/assistant from the list. */
static char *chat_body(const char *const *turns, int n_turns, int max_tokens, const char *extra)
{
    json_t *msgs = json_array();
    for (int i = 0; i < n_turns; i++)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", i % 2 ? "assistant" : "user", "content",
                                              turns[i]));
    json_t *j = json_pack("{s:s, s:o, s:i, s:f, s:b, s:b}", "model", "synthetic", "messages", msgs,
                          "max_tokens", max_tokens, "temperature", 0.0, "return_token_ids", 1, "ignore_eos", 1);
    if (extra) {
        json_t *x = json_loads(extra, 0, NULL);
        json_object_update(j, x);
        json_decref(x);
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

static long chat(int port, const char *const *turns, int n_turns, int max_tokens, const char *extra,
                 const char *const *headers, answer *a)
{
    char *body = chat_body(turns, n_turns, max_tokens, extra);
    http_resp r;
    post(port, "/v1/chat/completions", body, headers, &r);
    read_answer(&r, a);
    resp_free(&r);
    free(body);
    return a->status;
}

static int same_ids(const answer *a, const answer *b)
{
    return a->n_ids > 0 && a->n_ids == b->n_ids && memcmp(a->ids, b->ids, (size_t)a->n_ids * sizeof a->ids[0]) == 0;
}

/* The content of an event stream, and whether it ended properly. */
static void read_stream(const char *body, char *content, size_t cap, int *events, int *done, int *usage_chunk,
                        char *finish, size_t fcap)
{
    content[0] = finish[0] = '\0';
    *events = *done = *usage_chunk = 0;
    size_t len = 0;
    for (const char *p = body ? strstr(body, "data: ") : NULL; p; p = strstr(p + 1, "data: ")) {
        const char *end = strstr(p, "\n\n");
        if (!end)
            break;
        if (strncmp(p + 6, "[DONE]", 6) == 0) {
            *done = 1;
            break;
        }
        json_t *j = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
        (*events)++;
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        if (!ch && json_is_object(json_object_get(j, "usage")))
            *usage_chunk = 1;
        json_t *delta = json_object_get(ch, "delta");
        const char *t = delta ? json_string_value(json_object_get(delta, "content"))
                              : json_string_value(json_object_get(ch, "text"));
        if (t) {
            size_t n = strlen(t);
            if (len + n < cap) {
                memcpy(content + len, t, n + 1);
                len += n;
            }
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f)
            snprintf(finish, fcap, "%s", f);
        json_decref(j);
    }
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the server ----------------------------------------------------------------------- */

typedef struct rig {
    eu_model m;
    pv_engine *e;
    pv_server *srv;
    int port;
} rig;

/* A server's settings; zero fields take the defaults (the server's; a 4
 * MiB device tier; the CPU backend without delays). */
typedef struct rig_opts {
    uint32_t n_layers;
    const char *const *keys;
    size_t n_keys, max_body;
    unsigned timeout_s;
    size_t device_kib;
    /* Each attention call sleeps this long (the delay backend): turns that
     * last without costing CPU, whatever the machine's speed or load. */
    double attention_delay_s;
} rig_opts;

static int rig_start(rig *g, const rig_opts *o)
{
    memset(g, 0, sizeof *g);
    pv_backend *be = NULL;
    const pv_delay_options delay = {.attention_delay_s = o->attention_delay_s};
    if (o->attention_delay_s > 0 && pv_delay_backend_init(&be, &delay) != PV_OK)
        return -1;
    if (eu_model_init_on(&g->m, be, "cpu", o->n_layers, N_CTX, PV_F32, 16) != PV_OK)
        return -1;
    pv_cache_config cc;
    pv_cache_config_defaults(&cc);
    cc.device_bytes = (o->device_kib ? o->device_kib : 4096) << 10;
    cc.host_bytes = 4u << 20;
    pv_engine_config ec;
    pv_engine_config_defaults(&ec);
    if (pv_engine_init(&g->e, g->m.be, g->m.model, &g->m.tok, &cc, &ec) != PV_OK)
        return -1;
    pv_server_config sc;
    pv_server_config_defaults(&sc);
    sc.port = 0;
    sc.api_keys = o->keys;
    sc.n_api_keys = o->n_keys;
    sc.model_id = "synthetic";
    sc.n_ctx = N_CTX;
    sc.n_layers = o->n_layers;
    if (o->max_body)
        sc.max_body = o->max_body;
    if (o->timeout_s)
        sc.connection_timeout_s = o->timeout_s;
    if (pv_server_start(&g->srv, g->e, &g->m.tok, &sc) != PV_OK)
        return -1;
    g->port = pv_server_port(g->srv);
    return 0;
}

static void rig_stop(rig *g)
{
    pv_server_stop(g->srv, 5.0);
    pv_engine_free(g->e);
    eu_model_free(&g->m);
}

static pv_status engine_check(pv_engine *e, void *arg)
{
    return pv_engine_check(e);
}

typedef struct stats_call {
    pv_engine_stats es;
    pv_cache_stats cs;
} stats_call;

static pv_status get_stats(pv_engine *e, void *arg)
{
    stats_call *c = arg;
    pv_engine_stats_get(e, &c->es);
    return pv_cache_stats_get(pv_engine_cache(e), &c->cs);
}

static int healthy(int port)
{
    http_resp r;
    int ok_ = http(port, "GET", "/health", NULL, 0, NULL, &r) == 0 && r.status == 200;
    resp_free(&r);
    return ok_;
}

/* ---- tests ----------------------------------------------------------------------------- */

static void test_completions(rig *g)
{
    static const char *const hello[] = {"hello there"};
    answer a, b;
    chat(g->port, hello, 1, 8, NULL, NULL, &a);
    ok(a.status == 200 && a.completion == 8 && a.n_ids == 8 &&
           strcmp(a.finish, "length") == 0 && a.prompt > 0,
       "chat completion: 200, 8 tokens, finish length, prompt %ld tokens", a.prompt);
    chat(g->port, hello, 1, 8, NULL, NULL, &b);
    ok(same_ids(&a, &b), "greedy answers repeat token for token");

    char *body = chat_body(hello, 1, 8, "{\"stream\": true, \"stream_options\": {\"include_usage\": true}}");
    http_resp r;
    post(g->port, "/v1/chat/completions", body, NULL, &r);
    free(body);
    char content[4096], finish[16];
    int events, done, usage;
    read_stream(r.body, content, sizeof content, &events, &done, &usage, finish, sizeof finish);
    ok(r.status == 200 && done && usage && strcmp(content, a.content) == 0 && strcmp(finish, "length") == 0,
       "streamed chat: %d events end with usage and [DONE]; content equals the plain answer", events);
    resp_free(&r);

    const char *cbody = "{\"model\":\"synthetic\",\"prompt\":\"once upon a time\",\"max_tokens\":6,"
                        "\"temperature\":0,\"ignore_eos\":true}";
    answer c;
    post(g->port, "/v1/completions", cbody, NULL, &r);
    read_answer(&r, &c);
    resp_free(&r);
    ok(c.status == 200 && c.completion == 6 && c.content[0], "completion of a raw prompt: 6 tokens");
    char sbody[256];
    snprintf(sbody, sizeof sbody, "%.*s,\"stream\":true}", (int)strlen(cbody) - 1, cbody);
    post(g->port, "/v1/completions", sbody, NULL, &r);
    read_stream(r.body, content, sizeof content, &events, &done, &usage, finish, sizeof finish);
    ok(r.status == 200 && done && strcmp(content, c.content) == 0, "streamed completion equals the plain one");
    resp_free(&r);

    http(g->port, "GET", "/v1/models", NULL, 0, NULL, &r);
    ok(r.status == 200 && r.body && strstr(r.body, "\"synthetic\""), "/v1/models lists the model");
    resp_free(&r);
}

static void test_sessions(rig *g)
{
    static const char *const t1[] = {"tell me about tiers"};
    answer a1, a2, s2, fresh;
    const char *h1[] = {"X-Session-Id: conv-1", NULL};
    chat(g->port, t1, 1, 12, NULL, h1, &a1);
    ok(a1.status == 200 && a1.cached == 0, "session turn 1: nothing cached yet");
    const char *t2[] = {t1[0], a1.content, "and what about recomputation"};
    chat(g->port, t2, 3, 12, NULL, h1, &a2);
    chat(g->port, t2, 3, 12, NULL, NULL, &s2);
    ok(a2.status == 200 && a2.cached >= a1.prompt, "session turn 2 reports %ld cached prompt tokens (turn 1's prompt was %ld)",
       a2.cached, a1.prompt);
    ok(s2.cached == 0 && same_ids(&a2, &s2), "turn 2's tokens equal the stateless answer (%d tokens)", a2.n_ids);

    /* prompt_cache_key and session_id reach the same kind of session */
    answer k1, k2;
    chat(g->port, t1, 1, 12, "{\"prompt_cache_key\": \"conv-2\"}", NULL, &k1);
    const char *t2k[] = {t1[0], k1.content, "and what about recomputation"};
    chat(g->port, t2k, 3, 12, "{\"prompt_cache_key\": \"conv-2\"}", NULL, &k2);
    ok(k2.cached >= k1.prompt && same_ids(&k2, &s2), "prompt_cache_key: cached %ld, same answer", k2.cached);

    /* An edited first turn diverges: the session keeps only the common
     * prefix and answers as a fresh conversation would. */
    const char *edited[] = {"tell me about caches", a1.content, "and what about recomputation"};
    answer d;
    chat(g->port, edited, 3, 12, NULL, h1, &d);
    chat(g->port, edited, 3, 12, NULL, NULL, &fresh);
    ok(d.status == 200 && same_ids(&d, &fresh), "an edited earlier turn gives the fresh conversation's tokens");
    ok(d.cached > 0 && d.cached < a1.prompt, "it reuses only the common prefix (%ld of %ld tokens)", d.cached,
       d.prompt);
    http_resp r;
    http(g->port, "GET", "/v1/sessions/conv-1", NULL, 0, NULL, &r);
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    long tokens = (long)json_integer_value(json_object_get(j, "tokens"));
    ok(r.status == 200 && tokens == d.prompt + d.completion && json_array_size(json_object_get(j, "chunks")) > 0,
       "GET /v1/sessions/conv-1: %ld tokens (prompt + answer of the edited turn), its chunks' tiers", tokens);
    json_decref(j);
    resp_free(&r);

    /* The same messages again on the session: only the new part runs */
    const char *t3[] = {edited[0], edited[1], edited[2], d.content, "one more"};
    answer e3, f3;
    chat(g->port, t3, 5, 8, NULL, h1, &e3);
    chat(g->port, t3, 5, 8, NULL, NULL, &f3);
    ok(e3.cached >= d.prompt && same_ids(&e3, &f3), "the diverged session goes on: cached %ld, stateless answer",
       e3.cached);

    http(g->port, "DELETE", "/v1/sessions/conv-1", NULL, 0, NULL, &r);
    ok(r.status == 200, "DELETE /v1/sessions/conv-1: 200");
    resp_free(&r);
    http(g->port, "GET", "/v1/sessions/conv-1", NULL, 0, NULL, &r);
    ok(r.status == 404, "then GET: 404");
    resp_free(&r);
    http(g->port, "DELETE", "/v1/sessions/conv-1", NULL, 0, NULL, &r);
    ok(r.status == 404, "and DELETE again: 404");
    resp_free(&r);
}

typedef struct bad_case {
    const char *what, *path, *body;
    long status;
    const char *param; /* expected error param, NULL: not checked */
    const char *says;  /* in the error's message, NULL: not checked */
} bad_case;

/* A request answered with c's status and an OpenAI error body (message,
 * type, param, code) naming c's param and saying c's words, the server
 * healthy after it. */
static void refused(rig *g, const bad_case *c)
{
    http_resp r;
    post(g->port, c->path, c->body, NULL, &r);
    answer a;
    read_answer(&r, &a);
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    json_t *err = json_object_get(j, "error");
    const char *message = json_string_value(json_object_get(err, "message"));
    int shaped = message && json_is_string(json_object_get(err, "type")) && json_object_get(err, "param") &&
                 json_object_get(err, "code");
    ok(r.status == c->status && shaped && (!c->param || strcmp(a.error_param, c->param) == 0) &&
           (!c->says || strstr(message, c->says)) && healthy(g->port),
       "%s: %ld (want %ld), OpenAI error body, param '%s'; /health still 200%s%s", c->what, r.status, c->status,
       a.error_param, c->says ? ": " : "", c->says && message ? message : "");
    json_decref(j);
    resp_free(&r);
}

/* A request too long for the server's context or for the engine's device
 * pool (PV_ERR_CAPACITY from pv_engine_submit): context_length_exceeded
 * either way, with the message saying which. */
static void too_long(int port, const char *what, const char *body, const char *says)
{
    http_resp r;
    post(port, "/v1/chat/completions", body, NULL, &r);
    answer a;
    read_answer(&r, &a);
    ok(r.status == 400 && strcmp(a.error_code, "context_length_exceeded") == 0 && r.body && strstr(r.body, says),
       "%s: %ld, code '%s' (want 400, context_length_exceeded): %.300s", what, r.status, a.error_code,
       r.body ? r.body : "");
    resp_free(&r);
}

static void test_bad_input(rig *g)
{
    char *long_prompt = malloc(3 * N_CTX * 4 + 128);
    char *p = long_prompt + sprintf(long_prompt, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (int i = 0; i < 3 * N_CTX; i++)
        p += sprintf(p, "%c ", 'a' + i % 26);
    sprintf(p, "\"}]}");
    char big[70000];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    memcpy(big, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 55);
    const bad_case cases[] = {
        {"malformed JSON", "/v1/chat/completions", "{\"model\": \"m\", \"messages\": [", 400, NULL, NULL},
        {"a body over --max-body", "/v1/chat/completions", big, 413, NULL, NULL},
        {"temperature of the wrong type", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", 400, "temperature", NULL},
        {"an unknown role", "/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
         "messages[0].role", NULL},
        {"empty messages", "/v1/chat/completions", "{\"messages\":[]}", 400, "messages", NULL},
        {"max_tokens 0", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "max_tokens", NULL},
        {"max_tokens past the context", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":100000}", 400, "max_tokens", NULL},
        {"temperature out of range", "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", 400, "temperature", NULL},
        {"a prompt past the context", "/v1/chat/completions", long_prompt, 400, "messages", NULL},
        {"invalid UTF-8", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}",
         400, NULL, NULL},
        {"n = 2", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n", NULL},
        {"a completion without a prompt", "/v1/completions", "{\"model\":\"m\"}", 400, "prompt", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(g, &cases[i]);
    too_long(g->port, "a prompt past the context", long_prompt, "maximum context length");
    free(long_prompt);
    http_resp r;
    http(g->port, "DELETE", "/v1/sessions/nobody", NULL, 0, NULL, &r);
    ok(r.status == 404 && healthy(g->port), "DELETE of an unknown session: 404");
    resp_free(&r);
    http(g->port, "GET", "/v1/sessions/bad%ff%01id", NULL, 0, NULL, &r);
    ok(r.status == 400 && healthy(g->port), "a session id of invalid UTF-8 in the path: 400 (got %ld)", r.status);
    resp_free(&r);
    http(g->port, "GET", "/v1/nothing-here", NULL, 0, NULL, &r);
    ok(r.status == 404, "an unknown path: 404");
    resp_free(&r);
    http(g->port, "GET", "/v1/chat/completions", NULL, 0, NULL, &r);
    ok(r.status == 405, "GET on a POST endpoint: 405");
    resp_free(&r);
}

/* A device pool of 256 KiB holds 32 chunks of 16 tokens in each of the 2
 * layers, less than the context: a turn within the context (the server
 * passes it on) but past the pool is refused by the engine, and the answer
 * is context_length_exceeded, as for a prompt past the context. */
static void test_device_pool(void)
{
    rig g;
    if (!ok(rig_start(&g, &(rig_opts){.n_layers = 2, .device_kib = 256}) == 0, "a server with a 256 KiB device pool")) {
        tap_diag("%s", pv_last_error());
        return;
    }
    too_long(g.port, "max_tokens past the device pool",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1000}",
             "the device pool cannot hold this turn");
    /* a request without a session is named as such, not by the engine's internal id */
    too_long(g.port, "max_tokens past the device pool, named for a client",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1000}",
             "pv_engine_submit: a turn without a session: the device pool");
    rig_stop(&g);
}

/* logit_bias on both endpoints: a ban changes the greedy answer's first
 * token and the banned token never comes; +100 makes every token one;
 * every malformed list is a 400 naming the problem. */
static void test_logit_bias(rig *g)
{
    static const char *const hello[] = {"hello there"};
    const uint32_t V = g->m.tok.n_vocab;
    answer plain, banned, forced;
    chat(g->port, hello, 1, 8, NULL, NULL, &plain);
    char extra[128];
    snprintf(extra, sizeof extra, "{\"logit_bias\": {\"%d\": -100}}", plain.ids[0]);
    chat(g->port, hello, 1, 8, extra, NULL, &banned);
    int seen = 0;
    for (int i = 0; i < banned.n_ids; i++)
        seen += banned.ids[i] == plain.ids[0];
    ok(plain.status == 200 && plain.n_ids == 8 && banned.status == 200 && banned.n_ids == 8 &&
           banned.ids[0] != plain.ids[0] && seen == 0,
       "chat: logit_bias -100 on token %d, the unbiased answer's first, gives another first token (%d) and never "
       "token %d",
       plain.ids[0], banned.ids[0], plain.ids[0]);
    const int32_t force = plain.ids[0] == 7 ? 8 : 7;
    snprintf(extra, sizeof extra, "{\"logit_bias\": {\"%d\": 100, \"%d\": -3.5}}", force, plain.ids[1]);
    chat(g->port, hello, 1, 8, extra, NULL, &forced);
    seen = 0;
    for (int i = 0; i < forced.n_ids; i++)
        seen += forced.ids[i] == force;
    ok(forced.status == 200 && forced.n_ids == 8 && seen == 8, "chat: logit_bias +100 on token %d: %d of 8 tokens are it",
       force, seen);
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"once upon a time\",\"max_tokens\":5,\"temperature\":1,\"seed\":3,"
             "\"ignore_eos\":true,\"return_token_ids\":true,\"logit_bias\":{\"%d\":100}}",
             force);
    http_resp r;
    post(g->port, "/v1/completions", body, NULL, &r);
    answer c;
    read_answer(&r, &c);
    resp_free(&r);
    seen = 0;
    for (int i = 0; i < c.n_ids; i++)
        seen += c.ids[i] == force;
    ok(c.status == 200 && c.n_ids == 5 && seen == 5, "completion, sampled: logit_bias +100 on token %d: %d of 5 tokens",
       force, seen);

    /* The malformed: each a 400 with param logit_bias. */
    static char past_vocab[160], many[16 * 1100], every[16 * 1100];
    snprintf(past_vocab, sizeof past_vocab, "{\"prompt\":\"x\",\"logit_bias\":{\"3\":1,\"%u\":-100}}", V);
    char *at = many + sprintf(many, "{\"prompt\":\"x\",\"logit_bias\":{");
    for (int k = 0; k <= PV_SAMPLING_MAX_BIAS; k++)
        at += sprintf(at, "%s\"%d\":1", k ? "," : "", k);
    strcpy(at, "}}");
    at = every + sprintf(every, "{\"prompt\":\"x\",\"logit_bias\":{");
    for (uint32_t k = 0; k < V; k++)
        at += sprintf(at, "%s\"%u\":-100", k ? "," : "", k);
    strcpy(at, "}}");
    char vocab_says[96], every_says[96];
    snprintf(vocab_says, sizeof vocab_says, "Invalid key in 'logit_bias': %u. Maximum value is %u", V, V - 1);
    snprintf(every_says, sizeof every_says, "bans all %u tokens", V);
#define BIAS_CHAT(x) "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":" x "}"
    const bad_case cases[] = {
        {"logit_bias not an object", "/v1/chat/completions", BIAS_CHAT("[[5,-100]]"), 400, "logit_bias",
         "an object mapping token ids"},
        {"logit_bias key \"-1\"", "/v1/chat/completions", BIAS_CHAT("{\"-1\":1}"), 400, "logit_bias",
         "key \"-1\" is not a token id"},
        {"logit_bias key \"01\"", "/v1/chat/completions", BIAS_CHAT("{\"01\":1}"), 400, "logit_bias",
         "key \"01\" is not a token id"},
        {"logit_bias key \"1e3\"", "/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"1e3\":1}}", 400,
         "logit_bias", "key \"1e3\" is not a token id"},
        {"logit_bias key \" 5\"", "/v1/chat/completions", BIAS_CHAT("{\" 5\":1}"), 400, "logit_bias",
         "key \" 5\" is not a token id"},
        {"logit_bias key past the vocabulary", "/v1/completions", past_vocab, 400, "logit_bias", vocab_says},
        {"logit_bias value 101", "/v1/chat/completions", BIAS_CHAT("{\"5\":101}"), 400, "logit_bias",
         "value for token 5 must be a number in [-100, 100], got 101"},
        {"logit_bias value \"x\"", "/v1/chat/completions", BIAS_CHAT("{\"5\":\"x\"}"), 400, "logit_bias",
         "got \"x\""},
        {"logit_bias of 1025 entries", "/v1/completions", many, 400, "logit_bias",
         "holds 1025 entries: at most 1024 are accepted"},
        {"logit_bias banning every token", "/v1/completions", every, 400, "logit_bias", every_says},
    };
#undef BIAS_CHAT
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        refused(g, &cases[i]);
}

static void test_api_keys(void)
{
    static const char *const keys[] = {"key-alice", "key-bob"};
    rig g;
    if (rig_start(&g, &(rig_opts){.n_layers = 2, .keys = keys, .n_keys = 2}) != 0) {
        ok(0, "server with API keys: %s", pv_last_error());
        return;
    }
    static const char *const hi[] = {"hi"};
    answer a;
    ok(chat(g.port, hi, 1, 4, NULL, NULL, &a) == 401, "no API key: 401");
    const char *wrong[] = {"Authorization: Bearer key-mallory", NULL};
    ok(chat(g.port, hi, 1, 4, NULL, wrong, &a) == 401 && strcmp(a.error_code, "invalid_api_key") == 0,
       "a wrong API key: 401 invalid_api_key");
    const char *alice[] = {"Authorization: Bearer key-alice", "X-Session-Id: shared-name", NULL};
    const char *bob[] = {"Authorization: Bearer key-bob", NULL};
    ok(chat(g.port, hi, 1, 4, NULL, alice, &a) == 200, "alice's key: 200");
    http_resp r;
    http(g.port, "GET", "/v1/sessions/shared-name", NULL, 0, bob, &r);
    ok(r.status == 404, "bob cannot see alice's session of the same name (404)");
    resp_free(&r);
    http(g.port, "GET", "/v1/sessions/shared-name", NULL, 0, alice, &r);
    ok(r.status == 200, "alice can (200)");
    resp_free(&r);
    ok(healthy(g.port), "/health needs no key");
    rig_stop(&g);
}

/* ---- concurrency ---------------------------------------------------------------------- */

typedef struct client {
    int port, index;
    answer got, want;
    int stream;
    long status;
} client;

static void *run_client(void *arg)
{
    client *c = arg;
    char first[64], header[64];
    snprintf(first, sizeof first, "question %d about chunk %d", c->index % 8, c->index);
    snprintf(header, sizeof header, "X-Session-Id: crowd-%d", c->index % 8);
    const char *turns[] = {first};
    const char *h[] = {header, NULL};
    c->status = chat(c->port, turns, 1, 6 + c->index % 5, NULL, h, &c->got);
    return NULL;
}

static void test_concurrency(rig *g)
{
    enum { N = 32 };
    client cl[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        memset(&cl[i], 0, sizeof cl[i]);
        cl[i].port = g->port;
        cl[i].index = i;
        pthread_create(&t[i], NULL, run_client, &cl[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    int good = 0;
    for (int i = 0; i < N; i++) {
        char first[64];
        snprintf(first, sizeof first, "question %d about chunk %d", i % 8, i);
        const char *turns[] = {first};
        chat(g->port, turns, 1, 6 + i % 5, NULL, NULL, &cl[i].want);
        if (cl[i].status == 200 && cl[i].got.completion == 6 + i % 5 && same_ids(&cl[i].got, &cl[i].want))
            good++;
        else
            tap_diag("client %d: status %ld, %ld tokens", i, cl[i].status, cl[i].got.completion);
    }
    ok(good == N, "32 concurrent clients over 8 sessions: %d complete answers equal to the stateless ones", good);
    ok(pv_server_engine_call(g->srv, engine_check, NULL) == PV_OK, "engine and cache invariants hold: %s",
       pv_last_error());
}

static void test_disconnect(rig *g)
{
    stats_call before, after;
    pv_server_engine_call(g->srv, get_stats, &before);
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"go on\"}],"
                       "\"max_tokens\":1500,\"ignore_eos\":true,\"stream\":true}";
    const char *h[] = {"X-Session-Id: leaver", NULL};
    http_resp r;
    memset(&r, 0, sizeof r);
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", g->port);
    struct curl_slist *hl = json_headers(h[0]);
    r.abort_after = 600; /* a few events, then hang up */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    ok(rc == CURLE_WRITE_ERROR && r.n >= 600, "the client hung up mid-stream after %zu bytes", r.n);
    resp_free(&r);
    /* The server notices at its next write; the cancellation runs between
     * iterations. */
    int settled = 0;
    for (int i = 0; i < 500 && !settled; i++) {
        pv_server_engine_call(g->srv, get_stats, &after);
        settled = after.es.running == 0 && after.es.waiting == 0 &&
                  after.es.turns_cancelled == before.es.turns_cancelled + 1;
        if (!settled)
            usleep(10000);
    }
    ok(settled, "its turn was cancelled (%llu cancelled), nothing runs or waits",
       (unsigned long long)after.es.turns_cancelled);
    ok(after.es.decode_tokens - before.es.decode_tokens < 1500, "it stopped early: %llu of 1500 tokens decoded",
       (unsigned long long)(after.es.decode_tokens - before.es.decode_tokens));
    http(g->port, "GET", "/v1/sessions/leaver", NULL, 0, NULL, &r);
    json_t *j = json_loads(r.body ? r.body : "", 0, NULL);
    long tokens = (long)json_integer_value(json_object_get(j, "tokens"));
    ok(r.status == 200 && tokens > 0 && tokens < 1500, "its session keeps what ran (%ld tokens)", tokens);
    json_decref(j);
    resp_free(&r);
    ok(pv_server_engine_call(g->srv, engine_check, NULL) == PV_OK, "invariants hold after the cancellation: %s",
       pv_last_error());
    http(g->port, "GET", "/metrics", NULL, 0, NULL, &r);
    ok(r.status == 200 && r.body && strstr(r.body, "pensieve_requests_running 0") &&
           strstr(r.body, "pensieve_time_to_first_token_seconds_bucket"),
       "/metrics: nothing running; latency histograms present");
    resp_free(&r);
    /* A stateless stream that is abandoned frees every slot it had. */
    pv_server_engine_call(g->srv, get_stats, &before);
    c = curl_easy_init();
    memset(&r, 0, sizeof r);
    r.abort_after = 600;
    hl = json_headers(NULL);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_perform(c);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    resp_free(&r);
    settled = 0;
    for (int i = 0; i < 500 && !settled; i++) {
        pv_server_engine_call(g->srv, get_stats, &after);
        settled = after.es.running == 0 && after.es.turns_cancelled == before.es.turns_cancelled + 1;
        if (!settled)
            usleep(10000);
    }
    ok(settled && after.cs.used_bytes[PV_TIER_DEVICE] <= before.cs.used_bytes[PV_TIER_DEVICE] &&
           after.es.sessions == before.es.sessions,
       "an abandoned stateless stream frees its slots (device %llu -> %llu bytes) and its session",
       (unsigned long long)before.cs.used_bytes[PV_TIER_DEVICE],
       (unsigned long long)after.cs.used_bytes[PV_TIER_DEVICE]);
}

typedef struct long_client {
    int port, stream;
    int max_tokens;      /* 0: 1900 */
    const char *session; /* X-Session-Id, or NULL */
    http_resp r;
    volatile size_t *progress;
} long_client;

static size_t on_long_body(char *p, size_t size, size_t n, void *user)
{
    long_client *c = user;
    size_t len = on_body(p, size, n, &c->r);
    *c->progress = c->r.n;
    return len;
}

static void *run_long_client(void *arg)
{
    long_client *c = arg;
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"go on\"}],"
             "\"max_tokens\":%d,\"ignore_eos\":true,\"stream\":%s}",
             c->max_tokens ? c->max_tokens : 1900, c->stream ? "true" : "false");
    CURL *h = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", c->port);
    char header[96];
    snprintf(header, sizeof header, "X-Session-Id: %s", c->session ? c->session : "");
    struct curl_slist *hl = json_headers(c->session ? header : NULL);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_long_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->r.status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hl);
    return NULL;
}

/* A plain request that waits behind its session's turn in progress, and
 * whose client gives up meanwhile: nothing is written to a waiting
 * connection, so only the hang-up watcher can tell; the request must
 * never run. */
static void test_abandoned_wait(void)
{
    /* The first turn surely outlasts the second's client and the
     * watcher's look: 300 tokens of 2 layers whose attention sleeps 2 ms
     * (1.2 s, whatever the machine). */
    rig rg, *g = &rg;
    if (rig_start(g, &(rig_opts){.n_layers = 2, .attention_delay_s = 0.002}) != 0) {
        ok(0, "server for the abandoned-wait test: %s", pv_last_error());
        return;
    }
    stats_call before, after;
    pv_server_engine_call(g->srv, get_stats, &before);
    volatile size_t progress = 0;
    long_client first = {.port = g->port, .stream = 1, .max_tokens = 300, .session = "queue",
                         .progress = &progress};
    pthread_t t;
    double t0 = wall_s();
    pthread_create(&t, NULL, run_long_client, &first);
    for (int i = 0; i < 1000 && progress < 300; i++)
        usleep(2000);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", g->port);
    CURL *c = curl_easy_init();
    http_resp r;
    memset(&r, 0, sizeof r);
    struct curl_slist *hl = json_headers("X-Session-Id: queue");
    const char *plain = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"later\"}],"
                        "\"max_tokens\":50,\"ignore_eos\":true}";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, plain);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 100L);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    curl_slist_free_all(hl);
    resp_free(&r);
    pthread_join(t, NULL);
    double first_s = wall_s() - t0;
    int settled = 0;
    for (int i = 0; i < 300 && !settled; i++) {
        pv_server_engine_call(g->srv, get_stats, &after);
        settled = after.es.running == 0 && after.es.waiting == 0;
        if (!settled)
            usleep(10000);
    }
    uint64_t turns = (after.es.turns_done + after.es.turns_cancelled + after.es.turns_failed) -
                     (before.es.turns_done + before.es.turns_cancelled + before.es.turns_failed);
    ok(rc == CURLE_OPERATION_TIMEDOUT && first.r.status == 200 && settled && turns == 1,
       "a waiting request whose client left never runs: %llu turn(s) for the session, the first answer "
       "complete (%.2f s, %zu bytes)",
       (unsigned long long)turns, first_s, first.r.n);
    resp_free(&first.r);
    rig_stop(g);
}

/* The connection timeout is for silent clients: a plain request whose
 * turn runs longer than it (nothing is written until the end) must be
 * answered whole. */
static void test_turn_outlasts_timeout(void)
{
    rig g;
    /* 250 tokens of 2 layers whose attention sleeps 5 ms: 2.5 s. */
    if (rig_start(&g, &(rig_opts){.n_layers = 2, .timeout_s = 1, .attention_delay_s = 0.005}) != 0) {
        ok(0, "server with a 1 s connection timeout: %s", pv_last_error());
        return;
    }
    volatile size_t ignored = 0;
    long_client plain = {.port = g.port, .stream = 0, .max_tokens = 250, .progress = &ignored};
    double t0 = wall_s();
    run_long_client(&plain);
    double s = wall_s() - t0;
    answer a;
    read_answer(&plain.r, &a);
    ok(a.status == 200 && a.completion == 250 && s > 2.0,
       "a plain turn of %.2f s outlasts a 1 s connection timeout: %ld, %ld tokens", s, a.status, a.completion);
    resp_free(&plain.r);
    rig_stop(&g);
}

/* SIGINT/SIGTERM's path: a stop with a stream and a plain request in
 * flight ends both promptly, each with its proper ending. */
static void test_shutdown(void)
{
    rig g;
    if (rig_start(&g, &(rig_opts){.n_layers = 2}) != 0) {
        ok(0, "server for the shutdown test: %s", pv_last_error());
        return;
    }
    volatile size_t progress = 0, ignored = 0;
    long_client streaming = {.port = g.port, .stream = 1, .progress = &progress};
    long_client plain = {.port = g.port, .stream = 0, .progress = &ignored};
    pthread_t ts, tp;
    pthread_create(&ts, NULL, run_long_client, &streaming);
    pthread_create(&tp, NULL, run_long_client, &plain);
    for (int i = 0; i < 1000 && progress < 400; i++)
        usleep(5000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pv_server_stop(g.srv, 5.0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(ts, NULL);
    pthread_join(tp, NULL);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ok(s < 2.0, "the stop took %.3f s with two turns in flight", s);
    ok(streaming.r.status == 200 && streaming.r.body && strstr(streaming.r.body, "shutting_down") &&
           strstr(streaming.r.body, "data: [DONE]"),
       "the stream ends with an error event and [DONE]");
    ok(plain.r.status == 503, "the plain request gets 503 (got %ld)", plain.r.status);
    resp_free(&streaming.r);
    resp_free(&plain.r);
    pv_engine_free(g.e);
    eu_model_free(&g.m);
}

int main(void)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return tap_skip_all("libcurl does not initialise");
    rig g;
    if (rig_start(&g, &(rig_opts){.n_layers = 2, .max_body = 64 * 1024}) != 0) {
        fprintf(stderr, "server: %s\n", pv_last_error());
        return 1;
    }
    test_completions(&g);
    test_sessions(&g);
    test_bad_input(&g);
    test_logit_bias(&g);
    test_concurrency(&g);
    test_disconnect(&g);
    rig_stop(&g);
    test_device_pool();
    test_abandoned_wait();
    test_turn_outlasts_timeout();
    test_api_keys();
    test_shutdown();
    curl_global_cleanup();
    return tap_done();
}
