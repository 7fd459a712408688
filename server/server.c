/* pensieve-serve's HTTP side: the daemon, routing, authentication, the
 * session endpoints, /metrics and /health, the request log, and a clean
 * stop. Completions are in server_turn.c. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "server/server_internal.h"

#include <pensieve/state.h>

#include <jansson.h>
#include <nettle/hmac.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void pv_server_config_defaults(pv_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->threads = 4;
    cfg->max_body = 8u << 20;
    cfg->max_state_body = (size_t)1 << 30;
    cfg->model_id = "pensieve";
    cfg->connection_timeout_s = 30;
}

/* ---- small helpers -------------------------------------------------------------- */

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int srv_buf_add(srv_buf *b, const char *s, size_t n)
{
    if (n > SIZE_MAX / 2 - b->n - 1)
        return -1;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p)
            return -1;
        b->s = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

void srv_buf_free(srv_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

/* Length of the valid UTF-8 character at s (n bytes available): 1-4, 0 if
 * it is a valid but incomplete start, -1 if invalid. */
static int utf8_char(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return -1;
    unsigned cp = c & (0x3fu >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n)
            return 0;
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = cp << 6 | (s[i] & 0x3fu);
        /* Reject overlong forms, surrogates and past U+10FFFF as soon as
         * the second byte shows them, so a prefix is never held back. */
        if (i == 1 && ((len == 3 && c == 0xe0 && s[1] < 0xa0) || (len == 3 && c == 0xed && s[1] > 0x9f) ||
                       (len == 4 && c == 0xf0 && s[1] < 0x90) || (len == 4 && c == 0xf4 && s[1] > 0x8f)))
            return -1;
    }
    return cp >= min ? len : -1;
}

int srv_utf8_clean(const char *s, size_t n, int partial, srv_buf *out, size_t *used)
{
    static const char replacement[] = "\xef\xbf\xbd";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of valid bytes not yet copied */
    while (i < n) {
        int len = utf8_char(u + i, n - i);
        if (len > 0) {
            i += (size_t)len;
            continue;
        }
        if (len == 0 && partial)
            break;
        if (srv_buf_add(out, s + run, i - run) || srv_buf_add(out, replacement, 3))
            return -1;
        i++;
        run = i;
    }
    if (srv_buf_add(out, s + run, i - run))
        return -1;
    if (used)
        *used = i;
    return 0;
}

/* ---- responses --------------------------------------------------------------------- */

enum MHD_Result srv_respond(srv_req *r, int status, const char *content_type, char *body, size_t len)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                          : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (r->public_session)
        MHD_add_response_header(resp, "X-Session-Id", r->public_session);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    r->http_status = status;
    r->state = RQ_ANSWERED;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

enum MHD_Result srv_respond_error(srv_req *r, const pv_api_error *err)
{
    char *body = pv_api_error_json(err);
    return srv_respond(r, err->http_status, "application/json", body, body ? strlen(body) : 0);
}

enum MHD_Result srv_respond_json(srv_req *r, int status, json_t *j)
{
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        pv_api_error err;
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory building the response");
        return srv_respond_error(r, &err);
    }
    return srv_respond(r, status, "application/json", body, strlen(body));
}

/* ---- request contexts ---------------------------------------------------------------- */

void srv_req_unref(srv_req *r)
{
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    pv_server *s = r->srv;
    pv_api_request_free(&r->api);
    free(r->tokens);
    free(r->token_ids);
    free(r->session);
    free(r->path);
    if (r->spool_fd >= 0)
        close(r->spool_fd);
    srv_buf_free(&r->body);
    srv_buf_free(&r->text);
    srv_buf_free(&r->out);
    pthread_mutex_destroy(&r->mu);
    free(r);
    pthread_mutex_lock(&s->mu);
    s->open_requests--;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
}

static srv_req *req_new(pv_server *s, struct MHD_Connection *conn)
{
    srv_req *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->srv = s;
    r->conn = conn;
    r->refs = 1;
    r->spool_fd = -1;
    r->t_start = srv_now();
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_lock(&s->mu);
    s->open_requests++;
    pthread_mutex_unlock(&s->mu);
    return r;
}

/* ---- authentication ------------------------------------------------------------------ */

/* Compares without an early exit, so timing tells nothing of a key. */
static int same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

/* 0 when authorized (r->key_index set), else an error response is due. */
static int authorize(srv_req *r, pv_api_error *err)
{
    pv_server *s = r->srv;
    if (s->cfg.n_api_keys == 0)
        return 0;
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) {
        pv_api_fail(err, 401, "invalid_request_error", NULL, "missing_api_key",
                    "You didn't provide an API key: send it as 'Authorization: Bearer KEY'.");
        return -1;
    }
    const char *key = h + 7;
    int found = -1;
    for (size_t i = 0; i < s->cfg.n_api_keys; i++)
        if (same_secret(key, s->keys[i]) && found < 0)
            found = (int)i;
    if (found < 0) {
        pv_api_fail(err, 401, "invalid_request_error", NULL, "invalid_api_key", "Incorrect API key provided.");
        return -1;
    }
    r->key_index = (unsigned)found;
    return 0;
}

/* ---- /health, /metrics, /v1/models --------------------------------------------------- */

typedef struct snapshot_call {
    pv_server *srv;
    pv_metrics_snapshot snap;
} snapshot_call;

static pv_status take_snapshot(pv_engine *e, void *arg)
{
    snapshot_call *c = arg;
    pv_status st = pv_engine_stats_get(e, &c->snap.engine);
    if (st == PV_OK)
        st = pv_cache_stats_get(pv_engine_cache(e), &c->snap.cache);
    /* Requests waiting for their session's turn in progress are queued
     * too, from a client's point of view. */
    for (const srv_req *r = c->srv->parked; r; r = r->next_parked)
        c->snap.engine.waiting++;
    return st;
}

static enum MHD_Result serve_metrics(srv_req *r)
{
    snapshot_call c;
    memset(&c, 0, sizeof c);
    c.srv = r->srv;
    char *text = NULL;
    size_t len = 0;
    pv_status st = pv_engine_loop_call(r->srv->loop, take_snapshot, &c);
    if (st == PV_OK)
        st = pv_metrics_render(r->srv->metrics, &c.snap, &text, &len);
    if (st != PV_OK) {
        pv_api_error err;
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "metrics: %s", pv_last_error());
        return srv_respond_error(r, &err);
    }
    return srv_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

static enum MHD_Result serve_models(srv_req *r)
{
    json_t *model = json_pack("{s:s, s:s, s:I, s:s}", "id", r->srv->model_id, "object", "model", "created",
                              (json_int_t)0, "owned_by", "pensieve");
    return srv_respond_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model));
}

/* ---- /v1/sessions/{id} ------------------------------------------------------------------ */

/* A line of the server's own in the request log. */
__attribute__((format(printf, 2, 3))) static void srv_log_line(pv_server *s, const char *fmt, ...)
{
    if (!s->cfg.log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->cfg.log, fmt, ap);
    va_end(ap);
    fputc('\n', s->cfg.log);
}

typedef struct session_call {
    const char *engine_id;
    int remove;
    size_t tokens;
    pv_session_view view;
    int have_view;
    uint32_t n_layers;
    json_t *chunks; /* [{"index", "device", "host", "dropped"}] */
} session_call;

static pv_status session_op(pv_engine *e, void *arg)
{
    session_call *c = arg;
    if (c->remove)
        return pv_engine_end_session(e, c->engine_id);
    pv_status st = pv_engine_session_tokens(e, c->engine_id, &c->tokens);
    if (st != PV_OK)
        return st;
    pv_cache *cache = pv_engine_cache(e);
    /* A session whose KV was freed (stateless mode) has no cache view. */
    if (pv_cache_session_restore(cache, c->engine_id, &c->view) != PV_OK)
        return PV_OK;
    c->have_view = 1;
    if (!(c->chunks = json_array()))
        return pv_error(PV_ERR_OUT_OF_MEMORY, "session view");
    for (uint32_t ch = 0; ch < c->view.n_chunks; ch++) {
        json_int_t per_tier[3] = {0, 0, 0};
        for (uint32_t l = 0; l < c->n_layers; l++) {
            pv_tier tier;
            if (pv_cache_peek(cache, c->engine_id, ch, l, &tier, NULL, NULL) == PV_OK && tier >= 0 &&
                tier < 3)
                per_tier[tier]++;
        }
        json_array_append_new(c->chunks, json_pack("{s:i, s:I, s:I, s:I, s:b}", "index", (int)ch, "device",
                                                   per_tier[PV_TIER_DEVICE], "host", per_tier[PV_TIER_HOST],
                                                   "dropped", per_tier[PV_TIER_DROPPED], "shared",
                                                   ch < c->view.shared_chunks));
    }
    return PV_OK;
}

/* The engine's name for a client's session: namespaced by API key, so one
 * key's ids never reach another's KV. */
char *srv_engine_session_id(const pv_server *s, unsigned key_index, const char *id)
{
    const char *ns = s->key_ns ? s->key_ns[key_index] : "0";
    size_t n = strlen(ns) + strlen(id) + 2;
    char *e = malloc(n);
    if (e)
        snprintf(e, n, "%s:%s", ns, id);
    return e;
}

static enum MHD_Result serve_session(srv_req *r, const char *id, int remove)
{
    pv_api_error err;
    if (!srv_session_id_ok(id)) {
        pv_api_fail(&err, 400, "invalid_request_error", "session_id", NULL,
                    "A session id is 1 to 128 bytes of UTF-8 without control characters.");
        return srv_respond_error(r, &err);
    }
    session_call c;
    memset(&c, 0, sizeof c);
    c.remove = remove;
    c.n_layers = r->srv->cfg.n_layers;
    char *engine_id = srv_engine_session_id(r->srv, r->key_index, id);
    if (!engine_id) {
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(r, &err);
    }
    c.engine_id = engine_id;
    pv_status st = pv_engine_loop_call(r->srv->loop, session_op, &c);
    /* A deleted conversation must not come back after a restart. */
    if (st == PV_OK && remove && r->srv->cfg.state_dir && pv_state_dir_forget(r->srv->cfg.state_dir, engine_id) != PV_OK)
        srv_log_line(r->srv, "state: %s", pv_last_error());
    free(engine_id);
    if (st == PV_ERR_NOT_FOUND) {
        json_decref(c.chunks);
        pv_api_fail(&err, 404, "not_found_error", "session_id", "session_not_found",
                    "No session '%.128s' (it never existed, was deleted, or timed out).", id);
        return srv_respond_error(r, &err);
    }
    if (st == PV_ERR_BUSY) {
        json_decref(c.chunks);
        pv_api_fail(&err, 409, "invalid_request_error", "session_id", "session_busy",
                    "Session '%.128s' has a request in progress; try again when it ends.", id);
        return srv_respond_error(r, &err);
    }
    if (st != PV_OK) {
        json_decref(c.chunks);
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "session: %s", pv_last_error());
        return srv_respond_error(r, &err);
    }
    if (remove)
        return srv_respond_json(r, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "session.deleted",
                                              "deleted", 1));
    json_t *j = json_pack("{s:s, s:s, s:I}", "id", id, "object", "session", "tokens", (json_int_t)c.tokens);
    if (j && c.have_view) {
        json_object_set_new(j, "turns", json_integer(c.view.turns));
        json_object_set_new(j, "chunk_tokens_saved", json_integer(c.view.committed_tokens));
        json_object_set_new(j, "records", json_pack("{s:I, s:I, s:I}", "device",
                                                    (json_int_t)c.view.records[PV_TIER_DEVICE], "host",
                                                    (json_int_t)c.view.records[PV_TIER_HOST], "dropped",
                                                    (json_int_t)c.view.records[PV_TIER_DROPPED]));
        json_object_set_new(j, "bytes", json_pack("{s:I, s:I}", "device",
                                                  (json_int_t)c.view.held_bytes[PV_TIER_DEVICE], "host",
                                                  (json_int_t)c.view.held_bytes[PV_TIER_HOST]));
        /* Shared chunks are held once for the sessions of this key that
         * start the same way; "bytes" counts the session's own only. */
        json_object_set_new(j, "shared_chunks", json_integer(c.view.shared_chunks));
        json_object_set_new(j, "chunks", c.chunks);
    } else {
        json_decref(c.chunks);
    }
    return srv_respond_json(r, 200, j);
}

/* ---- routing ---------------------------------------------------------------------------- */

/* A session's state file: larger than any API body, so a limit of its own. */
static int is_state_put(const srv_req *r)
{
    return strcmp(r->method, "PUT") == 0 && strncmp(r->path, "/v1/session-states/", 19) == 0;
}

static size_t body_limit(const srv_req *r)
{
    return is_state_put(r) ? r->srv->cfg.max_state_body : r->srv->cfg.max_body;
}

static enum MHD_Result route(srv_req *r)
{
    pv_api_error err;
    const char *path = r->path, *m = r->method;
    int get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0, del = strcmp(m, "DELETE") == 0,
        put = strcmp(m, "PUT") == 0;
    if (strcmp(path, "/health") == 0 && get)
        return srv_respond_json(r, 200, json_pack("{s:s}", "status", "ok"));
    if (strcmp(path, "/metrics") == 0 && get)
        return serve_metrics(r);
    if (strcmp(path, "/v1/chat/completions") == 0 && post)
        return srv_turn_start(r, PV_API_CHAT);
    if (strcmp(path, "/v1/completions") == 0 && post)
        return srv_turn_start(r, PV_API_COMPLETION);
    if (strcmp(path, "/v1/models") == 0 && get)
        return serve_models(r);
    if (strncmp(path, "/v1/sessions/", 13) == 0 && (get || del))
        return serve_session(r, path + 13, del);
    if (strncmp(path, "/v1/session-states/", 19) == 0 && (get || put))
        return srv_serve_session_state(r, path + 19, put);
    int known = strcmp(path, "/health") == 0 || strcmp(path, "/metrics") == 0 ||
                strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0 ||
                strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/sessions/", 13) == 0 ||
                strncmp(path, "/v1/session-states/", 19) == 0;
    if (known)
        pv_api_fail(&err, 405, "invalid_request_error", NULL, "method_not_allowed",
                    "Method %s is not allowed on %.200s.", m, path);
    else
        pv_api_fail(&err, 404, "invalid_request_error", NULL, "unknown_url", "Unknown request URL: %s %.200s.",
                    m, path);
    return srv_respond_error(r, &err);
}

/* ---- checks at the headers ------------------------------------------------------------------ */

/* Up to 64 bytes of a client's value, printable ASCII only, for messages. */
static void printable(const char *v, char out[72])
{
    size_t i = 0;
    for (; i < 64 && v[i]; i++)
        out[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : '?';
    out[i] = '\0';
}

/* A loopback server answers only requests addressed to it by name: a page
 * that rebinds its own DNS name to 127.0.0.1 still sends that name. */
static int host_allowed(const pv_server *s, struct MHD_Connection *conn, char shown[72])
{
    const char *h = s->loopback ? MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST) : NULL;
    if (!h)
        return 1; /* not on loopback, or no Host: browsers always send one */
    printable(h, shown);
    size_t len = strlen(h);
    if (len == 0 || len > 255)
        return 0;
    /* The name without ":port" and one trailing dot. */
    size_t n = len;
    const char *colon = h[0] == '[' ? NULL : strrchr(h, ':');
    if (colon) {
        for (const char *d = colon + 1; *d; d++)
            if (*d < '0' || *d > '9')
                return 0;
        n = (size_t)(colon - h);
    }
    if (n && h[n - 1] == '.')
        n--;
    if (n == 9 && strncasecmp(h, "localhost", 9) == 0)
        return 1;
    if (n == strlen(s->host) && strncasecmp(h, s->host, n) == 0)
        return 1;
    for (size_t i = 0; i < s->cfg.n_allowed_hosts; i++)
        if (n == strlen(s->allowed_hosts[i]) && strncasecmp(h, s->allowed_hosts[i], n) == 0)
            return 1;
    return 0;
}

/* The endpoints whose body is JSON. */
static int takes_json(const srv_req *r)
{
    return strcmp(r->method, "POST") == 0 &&
           (strcmp(r->path, "/v1/chat/completions") == 0 || strcmp(r->path, "/v1/completions") == 0);
}

/* "application/json", any case, with or without parameters. A web page
 * can send text/plain or a form across sites without asking; it cannot
 * send application/json without a CORS preflight, which is never granted. */
static int is_json_type(const char *v)
{
    if (!v)
        return 0;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strncasecmp(v, "application/json", 16) != 0)
        return 0;
    v += 16;
    return *v == '\0' || *v == ';' || *v == ' ' || *v == '\t';
}

/* Everything that can be decided before a byte of the body is read, so a
 * refused body is never buffered: 0 to go on, else an error is due. */
static int check_headers(srv_req *r, pv_api_error *err)
{
    pv_server *s = r->srv;
    char shown[72];
    if (r->url_has_nul) {
        pv_api_fail(err, 400, "invalid_request_error", NULL, "invalid_url",
                    "The URL holds an encoded NUL byte (%%00), which no path or id may contain.");
        return -1;
    }
    if (!host_allowed(s, r->conn, shown)) {
        pv_api_fail(err, 403, "invalid_request_error", NULL, "host_not_allowed",
                    "Host '%s' is not this server's name; a server on a loopback address answers to %s and "
                    "localhost only (start it with --allowed-host NAME to add a name).",
                    shown, s->host);
        return -1;
    }
    /* Health and metrics are for operators and load balancers, open as in
     * vLLM and llama.cpp's server; the API needs the key. */
    if (strncmp(r->path, "/v1/", 4) == 0 && authorize(r, err) != 0)
        return -1;
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno == 0 && end != cl && n > body_limit(r)) {
            pv_api_fail(err, 413, "invalid_request_error", NULL, "request_too_large",
                        "The request body of %llu bytes exceeds the server's limit of %zu bytes (%s).", n,
                        body_limit(r), is_state_put(r) ? "--max-state-body" : "--max-body");
            return -1;
        }
    }
    if (takes_json(r) &&
        !is_json_type(MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE))) {
        const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        printable(ct ? ct : "none", shown);
        pv_api_fail(err, 415, "invalid_request_error", NULL, "unsupported_media_type",
                    "The body must be JSON, sent with 'Content-Type: application/json' (got '%s').", shown);
        return -1;
    }
    return 0;
}

/* A request with a body to come: Content-Length above 0, or chunked. */
static int expects_body(struct MHD_Connection *conn)
{
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    return (cl && strspn(cl, "0 \t") != strlen(cl)) ||
           MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL;
}

/* "%00" anywhere in the URL as sent: libmicrohttpd decodes it into a NUL
 * that C strings would cut at (DELETE /v1/sessions/abc%00def is not a
 * request about "abc"). */
static int raw_url_has_nul(const char *uri)
{
    for (const char *p = strchr(uri, '%'); p; p = strchr(p + 1, '%'))
        if (p[1] == '0' && p[2] == '0')
            return 1;
    return 0;
}

/* Called with each request line before the URL is decoded: the request's
 * context starts here, so its checks see the URL as sent. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    srv_req *r = req_new(cls, conn);
    if (r)
        r->url_has_nul = raw_url_has_nul(uri);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    srv_req *r = *con_cls;
    if (!r)
        return MHD_NO; /* out of memory in on_uri */
    if (!r->started) {
        r->started = 1;
        snprintf(r->method, sizeof r->method, "%s", method);
        r->http11 = strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
        if (!(r->path = strdup(url)))
            return MHD_NO;
        pv_api_error err;
        /* Answered now, libmicrohttpd reads no body and closes. */
        if (check_headers(r, &err) != 0)
            return srv_respond_error(r, &err);
        if (expects_body(conn)) {
            pthread_mutex_lock(&r->mu);
            r->receiving = 1;
            pthread_mutex_unlock(&r->mu);
            srv_watch(r);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        /* Past the limit without a Content-Length that said so (chunked):
         * nothing can be answered mid-body, so the connection closes. */
        if ((is_state_put(r) ? r->spooled : r->body.n) + n > body_limit(r)) {
            srv_log_line(r->srv, "%s %.200s: body past %zu bytes (chunked): connection closed", r->method, r->path,
                         body_limit(r));
            return MHD_NO;
        }
        if (is_state_put(r)) {
            pv_api_error err;
            if (srv_spool_add(r, upload_data, n, &err) != 0) {
                srv_log_line(r->srv, "%s %.200s: %s", r->method, r->path, err.message);
                return MHD_NO;
            }
        } else if (srv_buf_add(&r->body, upload_data, n)) {
            return MHD_NO;
        }
        pthread_mutex_lock(&r->mu);
        r->received += n;
        pthread_mutex_unlock(&r->mu);
        return MHD_YES;
    }
    pthread_mutex_lock(&r->mu);
    r->receiving = 0;
    pthread_mutex_unlock(&r->mu);
    if (r->state == RQ_SUBMITTING)
        return srv_turn_resume(r);
    if (r->state != RQ_BODY)
        return MHD_YES;
    return route(r);
}

/* ---- the end of a request: log, metrics, cancellation ------------------------------------- */

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    pv_server *s = cls;
    srv_req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    srv_unwatch(r);
    srv_turn_connection_closed(r);
    pthread_mutex_lock(&r->mu);
    int status = r->http_status;
    uint32_t prompt = (uint32_t)r->n_tokens, generated = r->generated;
    uint32_t cached = r->done ? r->result.reused_device + r->result.reused_host : 0;
    pthread_mutex_unlock(&r->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && status == 200)
        status = 499; /* the client went away first (nginx's convention) */
    double ms = (srv_now() - r->t_start) * 1e3;
    pv_metrics_request_done(s->metrics, status ? status : 499, prompt, cached, generated);
    if (s->cfg.log)
        fprintf(s->cfg.log, "%s %s %d prompt=%u cached=%u generated=%u %.1f ms\n", r->method, r->path,
                status ? status : 499, prompt, cached, generated, ms);
    srv_req_unref(r);
}

/* libmicrohttpd's own messages (a client gone mid-response, ...) go to
 * the request log, not to whatever stderr the embedding program has. */
__attribute__((format(printf, 2, 0))) static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    pv_server *s = cls;
    if (!s->cfg.log)
        return;
    fputs("http: ", s->cfg.log);
    vfprintf(s->cfg.log, fmt, ap);
}

/* ---- start and stop --------------------------------------------------------------------------- */

/* Each key's namespace: the first 64 bits of HMAC-SHA256(secret, key), in
 * hex. Stable for a secret kept with the state, whatever the order of the
 * keys; without the secret, a name says nothing about its key. */
static pv_status key_namespaces(pv_server *s)
{
    uint8_t secret[PV_STATE_SECRET_BYTES];
    if (s->cfg.namespace_secret)
        memcpy(secret, s->cfg.namespace_secret, sizeof secret);
    else if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret)
        return pv_error(PV_ERR_IO, "pv_server_start: getrandom: %s", strerror(errno));
    for (size_t i = 0; i < s->cfg.n_api_keys; i++) {
        struct hmac_sha256_ctx ctx;
        uint8_t mac[SHA256_DIGEST_SIZE];
        hmac_sha256_set_key(&ctx, sizeof secret, secret);
        hmac_sha256_update(&ctx, strlen(s->keys[i]), (const uint8_t *)s->keys[i]);
        hmac_sha256_digest(&ctx, sizeof mac, mac);
        for (int b = 0; b < 8; b++)
            snprintf(s->key_ns[i] + 2 * b, 3, "%02x", mac[b]);
    }
    memset(secret, 0, sizeof secret);
    return PV_OK;
}

static void free_server(pv_server *s)
{
    if (s->keys)
        for (size_t i = 0; i < s->cfg.n_api_keys; i++)
            free(s->keys[i]);
    free(s->keys);
    free(s->key_ns);
    if (s->allowed_hosts)
        for (size_t i = 0; i < s->cfg.n_allowed_hosts; i++)
            free(s->allowed_hosts[i]);
    free(s->allowed_hosts);
    pthread_mutex_destroy(&s->import_mu);
    free(s->host);
    free(s->model_id);
    pv_metrics_free(s->metrics);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

pv_status pv_server_start(pv_server **out, pv_engine *engine, const pv_tokenizer *tok,
                          const pv_server_config *cfg)
{
    if (!out || !engine || !tok || !cfg)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_start: NULL argument");
    *out = NULL;
    if (cfg->threads == 0 || cfg->threads > 1024)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_start: %u threads (1 to 1024)", cfg->threads);
    if (cfg->max_body == 0)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_start: max_body is 0");
    if (cfg->connection_timeout_s == 0 || cfg->connection_timeout_s > 86400)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_start: connection timeout of %u s (1 to 86400)",
                        cfg->connection_timeout_s);
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons(cfg->port);
    if (inet_pton(AF_INET, cfg->host ? cfg->host : "127.0.0.1", &addr.sin_addr) != 1)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_start: host \"%.64s\" is not an IPv4 address",
                        cfg->host);
    pv_server *s = calloc(1, sizeof *s);
    if (!s)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_server_start: %zu bytes", sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->import_mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->cfg = *cfg;
    if (!s->cfg.n_vocab)
        s->cfg.n_vocab = tok->n_vocab;
    s->loopback = (ntohl(addr.sin_addr.s_addr) >> 24) == 127;
    s->engine = engine;
    s->tok = tok;
    s->next_id = (uint64_t)time(NULL) << 20;
    pv_status st = pv_metrics_init(&s->metrics);
    if (st != PV_OK) {
        free_server(s);
        return st;
    }
    s->host = strdup(cfg->host ? cfg->host : "127.0.0.1");
    s->model_id = strdup(cfg->model_id ? cfg->model_id : "pensieve");
    s->keys = cfg->n_api_keys ? calloc(cfg->n_api_keys, sizeof *s->keys) : NULL;
    s->key_ns = cfg->n_api_keys ? calloc(cfg->n_api_keys, sizeof *s->key_ns) : NULL;
    s->allowed_hosts = cfg->n_allowed_hosts ? calloc(cfg->n_allowed_hosts, sizeof *s->allowed_hosts) : NULL;
    int oom = !s->host || !s->model_id || (cfg->n_api_keys && (!s->keys || !s->key_ns)) ||
              (cfg->n_allowed_hosts && !s->allowed_hosts);
    for (size_t i = 0; i < cfg->n_allowed_hosts && !oom; i++)
        oom = !(s->allowed_hosts[i] = strdup(cfg->allowed_hosts[i]));
    for (size_t i = 0; i < cfg->n_api_keys && !oom; i++)
        oom = !(s->keys[i] = strdup(cfg->api_keys[i]));
    if (oom) {
        free_server(s);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_server_start: configuration copies");
    }
    if (cfg->n_api_keys && (st = key_namespaces(s)) != PV_OK) {
        free_server(s);
        return st;
    }
    s->cfg.host = s->host;
    s->cfg.model_id = s->model_id;
    s->cfg.api_keys = (const char *const *)s->keys;
    s->cfg.allowed_hosts = (const char *const *)s->allowed_hosts;
    s->cfg.namespace_secret = NULL; /* borrowed: used above only */
    if ((st = pv_engine_loop_start(&s->loop, engine)) != PV_OK) {
        free_server(s);
        return st;
    }
    /* MHD_USE_ITC: MHD_quiesce_daemon (pv_server_stop) needs it with internal
     * threads; without it the threads race over the listen socket and MHD
     * aborts ("Failed to remove listen FD from epoll set"). */
    s->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                                  MHD_USE_ITC | MHD_USE_ERROR_LOG,
                              0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)cfg->threads,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)cfg->connection_timeout_s,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
    if (!s->mhd) {
        pv_engine_loop_stop(s->loop);
        free_server(s);
        return pv_error(PV_ERR_IO, "pv_server_start: cannot listen on %.64s:%u (in use, or not allowed)",
                        cfg->host ? cfg->host : "127.0.0.1", (unsigned)cfg->port);
    }
    if (pthread_create(&s->watcher, NULL, srv_watcher_main, s) != 0) {
        MHD_stop_daemon(s->mhd);
        pv_engine_loop_stop(s->loop);
        free_server(s);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_server_start: cannot start the hang-up watcher thread");
    }
    s->watcher_running = 1;
    if (cfg->state_dir) {
        pv_state_dir_use_loop(cfg->state_dir, s->loop);
        if (pv_state_dir_saves_idle(cfg->state_dir) && (st = pv_state_dir_start(cfg->state_dir)) != PV_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pv_last_error());
            s->cfg.state_dir = NULL; /* nothing to save: nothing ran */
            pv_server_stop(s, 0);
            return pv_error(st, "%s", msg);
        }
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : cfg->port;
    *out = s;
    return PV_OK;
}

uint16_t pv_server_port(const pv_server *s)
{
    return s ? s->port : 0;
}

pv_status pv_server_engine_call(pv_server *s, pv_status (*fn)(pv_engine *e, void *arg), void *arg)
{
    if (!s)
        return pv_error(PV_ERR_INVALID_ARG, "pv_server_engine_call: server is NULL");
    return pv_engine_loop_call(s->loop, fn, arg);
}

static pv_status cancel_everything(pv_engine *e, void *arg)
{
    srv_turn_release_parked(arg);
    pv_engine_cancel_all(e);
    return PV_OK;
}

void pv_server_stop(pv_server *s, double grace_s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_mutex_unlock(&s->mu);
    /* No new connections; turns in flight end (their responses close). */
    MHD_socket listen = MHD_quiesce_daemon(s->mhd);
    if (listen != MHD_INVALID_SOCKET)
        close(listen);
    pv_engine_loop_call(s->loop, cancel_everything, s);
    double until = srv_now() + grace_s;
    pthread_mutex_lock(&s->mu);
    while (s->open_requests > 0 && srv_now() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->idle, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    /* The watcher reads connections: it stops before they go. */
    pthread_mutex_lock(&s->mu);
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    if (s->watcher_running)
        pthread_join(s->watcher, NULL);
    MHD_stop_daemon(s->mhd);
    if (s->cfg.state_dir) {
        /* Every turn has ended: the sessions are saved whole, device tier too. */
        pv_state_dir_stop(s->cfg.state_dir);
        pv_state_save_report rep;
        if (pv_state_dir_save_all(s->cfg.state_dir, &rep) != PV_OK)
            srv_log_line(s, "state: saving at shutdown: %s", pv_last_error());
        else
            srv_log_line(s, "state: saved %u sessions (%u current, %u failed), %.1f MB in %.2f s", rep.sessions,
                         rep.current, rep.failed, rep.bytes_written / 1e6, rep.seconds);
        pv_state_dir_use_loop(s->cfg.state_dir, NULL);
    }
    pv_engine_loop_stop(s->loop);
    free_server(s);
}
