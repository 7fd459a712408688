/* Completions: a request's messages (or prompt) tokenized on the HTTP
 * thread, handed to the engine thread as a whole conversation (so a
 * session prefills only what its stored history lacks), and answered as
 * one JSON body or as server-sent events while tokens arrive.
 *
 * Hand-offs: the HTTP thread suspends its connection while it waits for
 * the engine; the engine thread's callbacks buffer text under the
 * request's mutex and resume the connection when there is news for it. */
#define _GNU_SOURCE /* POLLRDHUP: the end of a peer's input, told apart from data */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "server/server_internal.h"

#include <jansson.h>

#include <inttypes.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the engine thread's side -------------------------------------------------------------- */

/* Resumes the connection if it waits (called with r->mu held; the
 * resume itself happens after unlocking, see wake_finish). */
static int wake_begin(srv_req *r)
{
    if (!r->suspended || r->gone)
        return 0;
    r->suspended = 0;
    return 1;
}

/* A connection is only freed by MHD while it runs, never while
 * suspended, so whoever cleared `suspended` may resume it unlocked. */
static void wake_finish(srv_req *r, int wake)
{
    if (wake)
        MHD_resume_connection(r->conn);
}

static void on_token(void *user, int32_t token, const char *text, size_t len)
{
    srv_req *r = user;
    double now = srv_now();
    pthread_mutex_lock(&r->mu);
    if (!r->gone && srv_buf_add(&r->text, text, len) != 0)
        r->gone = 1; /* out of memory: nothing more reaches the client */
    if (token >= 0 && r->api.return_token_ids && !r->gone) {
        if (r->n_token_ids == r->cap_token_ids) {
            size_t cap = r->cap_token_ids ? 2 * r->cap_token_ids : 64;
            int32_t *p = realloc(r->token_ids, cap * sizeof *p);
            if (p) {
                r->token_ids = p;
                r->cap_token_ids = cap;
            }
        }
        if (r->n_token_ids < r->cap_token_ids)
            r->token_ids[r->n_token_ids++] = token;
        else
            r->gone = 1;
    }
    if (token >= 0) {
        r->generated++;
        if (r->t_first == 0)
            pv_metrics_observe(r->srv->metrics, PV_HIST_TTFT, now - r->t_start);
        else
            pv_metrics_observe(r->srv->metrics, PV_HIST_ITL, now - r->t_last);
        if (r->t_first == 0)
            r->t_first = now;
        r->t_last = now;
    }
    int wake = r->api.stream && wake_begin(r);
    pthread_mutex_unlock(&r->mu);
    wake_finish(r, wake);
}

static int try_submit(pv_engine *e, srv_req *r, int unparked);

/* A turn on session `id` ended: the oldest request parked for it runs
 * (those whose clients left meanwhile end here). */
static void unpark(pv_engine *e, pv_server *s, const char *id)
{
    for (srv_req **p = &s->parked; *p;) {
        if (strcmp((*p)->session, id) != 0) {
            p = &(*p)->next_parked;
            continue;
        }
        srv_req *next = *p;
        *p = next->next_parked;
        next->next_parked = NULL;
        if (try_submit(e, next, 1))
            return;
    }
}

typedef struct unpark_call {
    pv_server *srv;
    char id[];
} unpark_call;

static pv_status unpark_later(pv_engine *e, void *arg)
{
    unpark_call *c = arg;
    unpark(e, c->srv, c->id);
    free(c);
    return PV_OK;
}

void srv_turn_release_parked(pv_server *s)
{
    while (s->parked) {
        srv_req *r = s->parked;
        s->parked = r->next_parked;
        pthread_mutex_lock(&r->mu);
        r->submit_failed = 1;
        pv_api_fail(&r->submit_error, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        int wake = wake_begin(r);
        pthread_mutex_unlock(&r->mu);
        wake_finish(r, wake);
        srv_req_unref(r);
    }
}

static void on_done(void *user, pv_status status, const pv_turn_result *result)
{
    srv_req *r = user;
    /* A request parked behind this one runs after this iteration (not
     * from inside the engine's callback). */
    if (r->session && r->srv->parked) {
        size_t n = strlen(r->session) + 1;
        unpark_call *c = malloc(sizeof *c + n);
        if (c) {
            c->srv = r->srv;
            memcpy(c->id, r->session, n);
            if (pv_engine_loop_post(r->srv->loop, unpark_later, c) != PV_OK)
                free(c);
        }
    }
    pv_metrics_observe(r->srv->metrics, PV_HIST_E2E, srv_now() - r->t_start);
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    r->done_status = status;
    if (status != PV_OK)
        snprintf(r->done_message, sizeof r->done_message, "%s", pv_last_error());
    r->result = *result;
    int wake = wake_begin(r);
    pthread_mutex_unlock(&r->mu);
    wake_finish(r, wake);
    srv_req_unref(r);
}

typedef struct count_call {
    size_t n;
} count_call;

static void count_session(void *user, const char *session)
{
    ((count_call *)user)->n++;
}

static void submit_failed(srv_req *r, int http, const char *type, const char *code, const char *message)
{
    pthread_mutex_lock(&r->mu);
    r->submit_failed = 1;
    pv_api_fail(&r->submit_error, http, type, NULL, code, "%s", message);
    int wake = wake_begin(r);
    pthread_mutex_unlock(&r->mu);
    wake_finish(r, wake);
}

static void park(pv_server *s, srv_req *r, int first)
{
    srv_req **p = &s->parked;
    while (!first && *p)
        p = &(*p)->next_parked;
    r->next_parked = *p;
    *p = r;
}

static int has_parked(const pv_server *s, const char *id)
{
    for (const srv_req *q = s->parked; q; q = q->next_parked)
        if (strcmp(q->session, id) == 0)
            return 1;
    return 0;
}

/* On the engine thread: the turn joins the engine's queue, or waits for
 * its session's turn in progress (requests on one session run in the
 * order they came). Returns 1 when the request is queued or parked, 0 when
 * it ended here. */
static int try_submit(pv_engine *e, srv_req *r, int unparked)
{
    pv_server *s = r->srv;
    pthread_mutex_lock(&r->mu);
    int gone = r->gone, left = r->client_left;
    pthread_mutex_unlock(&r->mu);
    if (gone) {
        srv_req_unref(r);
        return 0;
    }
    if (left) {
        /* Answered only so the connection resumes and closes. */
        submit_failed(r, 499, "invalid_request_error", "client_closed_request", "The client closed the request.");
        srv_req_unref(r);
        return 0;
    }
    if (r->session && !unparked && has_parked(s, r->session)) {
        park(s, r, 0);
        return 1;
    }
    size_t have;
    if (r->session && s->cfg.max_sessions && pv_engine_session_tokens(e, r->session, &have) == PV_ERR_NOT_FOUND) {
        count_call c = {0};
        pv_engine_foreach_session(e, count_session, &c);
        if (c.n >= s->cfg.max_sessions) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "The server holds its limit of %zu sessions (--max-sessions): end one with "
                     "DELETE /v1/sessions/{id}, or wait for idle ones to time out.",
                     s->cfg.max_sessions);
            submit_failed(r, 429, "rate_limit_error", "too_many_sessions", msg);
            srv_req_unref(r);
            return 0;
        }
    }
    pv_turn turn = {.tokens = r->tokens, .n_tokens = r->n_tokens, .sampling = r->api.sampling,
                    .whole_conversation = 1};
    pv_turn_callbacks cb = {.on_token = on_token, .on_done = on_done, .user = r};
    uint64_t id = 0;
    pv_status st = pv_engine_submit(e, r->session, &turn, &cb, &id);
    if (st == PV_OK) {
        pthread_mutex_lock(&r->mu);
        r->submitted = 1;
        r->request_id = id;
        int wake = r->api.stream && wake_begin(r);
        pthread_mutex_unlock(&r->mu);
        wake_finish(r, wake);
        return 1;
    }
    if (st == PV_ERR_BUSY) {
        park(s, r, unparked);
        return 1;
    }
    /* Only the engine's limits are context_length_exceeded; any other
     * refusal of the turn is a plain invalid request (code null, as the
     * parser's), never mislabelled as too long. */
    if (st == PV_ERR_CAPACITY)
        submit_failed(r, 400, "invalid_request_error", "context_length_exceeded", pv_last_error());
    else if (st == PV_ERR_INVALID_ARG)
        submit_failed(r, 400, "invalid_request_error", NULL, pv_last_error());
    else
        submit_failed(r, 500, "server_error", NULL, pv_last_error());
    srv_req_unref(r);
    return 0;
}

static pv_status submit_turn(pv_engine *e, void *arg)
{
    try_submit(e, arg, 0);
    return PV_OK;
}

typedef struct cancel_call {
    uint64_t request_id;
} cancel_call;

static pv_status cancel_turn(pv_engine *e, void *arg)
{
    cancel_call *c = arg;
    /* The turn may have ended meanwhile: nothing to cancel then. */
    pv_engine_cancel(e, c->request_id);
    free(c);
    return PV_OK;
}

void srv_turn_connection_closed(srv_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->gone = 1;
    int cancel = r->submitted && !r->done;
    uint64_t id = r->request_id;
    pthread_mutex_unlock(&r->mu);
    if (!cancel)
        return;
    cancel_call *c = malloc(sizeof *c);
    if (!c)
        return; /* the turn runs to its end; its slots are freed then */
    c->request_id = id;
    if (pv_engine_loop_post(r->srv->loop, cancel_turn, c) != PV_OK)
        free(c);
}

/* ---- the watcher ---------------------------------------------------------------------------------- */

void srv_watch(srv_req *r)
{
    pv_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    if (!r->watched) {
        r->watched = 1;
        r->stall_mark = SIZE_MAX;
        r->next_watched = s->watched;
        s->watched = r;
    }
    pthread_mutex_unlock(&s->mu);
}

void srv_unwatch(srv_req *r)
{
    pv_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    if (r->watched) {
        srv_req **p = &s->watched;
        while (*p != r)
            p = &(*p)->next_watched;
        *p = r->next_watched;
        r->watched = 0;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The interim answer that asks a client whether it is still there. */
static const char still_there[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* Called with srv->mu held: the connection stays until srv_unwatch.
 * A hang-up is real when the socket reports one (POLLHUP/POLLERR: the
 * client reset it). An end of input alone (POLLRDHUP) only says the client
 * sends nothing more, and some clients shut their sending side after the
 * request and wait for the answer. So, once, while nothing else has been
 * written to the connection, the watcher writes an interim "100 Continue",
 * which every HTTP/1.1 client must accept unasked (RFC 9110, 15.2): a
 * client that closed answers it with a reset; one that half-closed reads
 * past it and goes on waiting. */
static void check_hangup(srv_req *r)
{
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info)
        return;
    struct pollfd pfd = {.fd = info->connect_fd, .events = POLLRDHUP};
    if (poll(&pfd, 1, 0) < 0)
        return;
    pthread_mutex_lock(&r->mu);
    int receiving = r->receiving;
    size_t received = r->received;
    pthread_mutex_unlock(&r->mu);
    if (receiving) {
        /* A client whose input ended mid-body can never finish it, and
         * libmicrohttpd's epoll mode may not read that end until the
         * connection times out: close it. Only when a second look finds
         * no new bytes, so a body whose last bytes came with the end is
         * taken first. */
        if (!(pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            r->stall_mark = SIZE_MAX;
        else if (r->stall_mark != received)
            r->stall_mark = received;
        else if (shutdown(info->connect_fd, SHUT_RDWR) == 0)
            r->hangup_seen = 1;
        return;
    }
    if (!(pfd.revents & (POLLHUP | POLLERR))) {
        if (!(pfd.revents & POLLRDHUP) || r->probed)
            return;
        r->probed = 1;
        pthread_mutex_lock(&r->mu);
        /* Suspended before any answer: no other thread writes to it. */
        int asked = r->suspended && r->state == RQ_SUBMITTING && r->http11 &&
                    send(info->connect_fd, still_there, sizeof still_there - 1, MSG_NOSIGNAL | MSG_DONTWAIT) > 0;
        pthread_mutex_unlock(&r->mu);
        /* A near client's reset is often back already; else the next look
         * sees it. */
        if (!asked || poll(&pfd, 1, 0) < 0 || !(pfd.revents & (POLLHUP | POLLERR)))
            return;
    }
    r->hangup_seen = 1;
    pthread_mutex_lock(&r->mu);
    r->client_left = 1;
    int cancel = r->submitted && !r->done;
    uint64_t id = r->request_id;
    pthread_mutex_unlock(&r->mu);
    cancel_call *c = cancel ? malloc(sizeof *c) : NULL;
    if (c) {
        c->request_id = id;
        if (pv_engine_loop_post(r->srv->loop, cancel_turn, c) != PV_OK)
            free(c);
    }
}

void *srv_watcher_main(void *arg)
{
    pv_server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        for (srv_req *r = s->watched; r; r = r->next_watched)
            if (!r->hangup_seen)
                check_hangup(r);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->idle, &s->mu, &until);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- the HTTP thread's side: starting a turn -------------------------------------------------- */

int srv_session_id_ok(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == 0x7f)
            return 0;
    srv_buf clean = {0};
    size_t used = 0;
    int ok = srv_utf8_clean(id, n, 0, &clean, &used) == 0 && clean.n == n;
    srv_buf_free(&clean);
    return ok;
}

/* The prompt as the model sees it: the chat template over the messages
 * (with the generation prompt), or the raw prompt, beginning-of-sequence
 * token included where the model wants one. The engine renders a whole
 * conversation the same way. */
static int tokenize(srv_req *r, pv_api_error *err)
{
    const pv_tokenizer *tok = r->srv->tok;
    char *owned = NULL;
    const char *text;
    size_t len;
    if (r->api.kind == PV_API_CHAT) {
        if (!tok->has_chat_template) {
            pv_api_fail(err, 400, "invalid_request_error", "messages", NULL,
                        "This model has no chat template the server understands; use /v1/completions.");
            return -1;
        }
        if (pv_tokenizer_apply_chat(tok, r->api.messages, r->api.n_messages, 1, NULL, 0, &len) != PV_OK ||
            !(owned = malloc(len + 1)) ||
            pv_tokenizer_apply_chat(tok, r->api.messages, r->api.n_messages, 1, owned, len + 1, &len) != PV_OK) {
            free(owned);
            pv_api_fail(err, 400, "invalid_request_error", "messages", NULL, "The messages cannot be rendered: %s",
                        pv_last_error());
            return -1;
        }
        text = owned;
    } else {
        text = r->api.prompt;
        len = r->api.prompt_len;
    }
    unsigned flags = PV_TOKENIZE_PARSE_SPECIAL | (tok->add_bos ? PV_TOKENIZE_ADD_BOS : 0);
    int rc = 0;
    if (!(r->tokens = malloc((len + 2) * sizeof *r->tokens))) {
        pv_api_fail(err, 500, "server_error", NULL, NULL, "out of memory for %zu prompt bytes", len);
        rc = -1;
    } else if (pv_tokenizer_encode(tok, text, len, flags, r->tokens, len + 2, &r->n_tokens) != PV_OK) {
        pv_api_fail(err, 400, "invalid_request_error", r->api.kind == PV_API_CHAT ? "messages" : "prompt", NULL,
                    "The prompt cannot be tokenized: %s", pv_last_error());
        rc = -1;
    } else if (r->n_tokens == 0) {
        pv_api_fail(err, 400, "invalid_request_error", "prompt", NULL, "The prompt is empty.");
        rc = -1;
    }
    free(owned);
    return rc;
}

static int check_context(srv_req *r, pv_api_error *err)
{
    uint32_t n_ctx = r->srv->cfg.n_ctx;
    const char *what = r->api.kind == PV_API_CHAT ? "messages" : "prompt";
    if (n_ctx && r->n_tokens + 1 > n_ctx) {
        pv_api_fail(err, 400, "invalid_request_error", what, "context_length_exceeded",
                    "This model's maximum context length is %u tokens. However, your %s resulted in %zu "
                    "tokens, leaving no room to generate.",
                    n_ctx, what, r->n_tokens);
        return -1;
    }
    if (n_ctx && r->api.max_tokens_set && r->n_tokens + (uint64_t)r->api.sampling.max_tokens > n_ctx) {
        pv_api_fail(err, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                    "This model's maximum context length is %u tokens. However, you requested %" PRIu64
                    " tokens (%zu in the %s, %d in the completion).",
                    n_ctx, r->n_tokens + (uint64_t)r->api.sampling.max_tokens, r->n_tokens, what,
                    r->api.sampling.max_tokens);
        return -1;
    }
    return 0;
}

/* logit_bias token ids against the model's vocabulary (the parser knows no
 * model), and a list that would leave nothing to generate. */
static int check_logit_bias(const srv_req *r, pv_api_error *err)
{
    const pv_sampling *s = &r->api.sampling;
    const uint32_t n_vocab = r->srv->cfg.n_vocab;
    size_t banned = 0;
    for (size_t k = 0; k < s->n_bias; k++) {
        if ((uint32_t)s->bias_tokens[k] >= n_vocab) {
            pv_api_fail(err, 400, "invalid_request_error", "logit_bias", NULL,
                        "Invalid key in 'logit_bias': %d. Maximum value is %u (the model's vocabulary has %u "
                        "tokens).",
                        s->bias_tokens[k], n_vocab - 1, n_vocab);
            return -1;
        }
        banned += s->bias_values[k] <= PV_LOGIT_BIAS_BAN;
    }
    if (s->n_bias && banned == n_vocab) {
        pv_api_fail(err, 400, "invalid_request_error", "logit_bias", NULL,
                    "'logit_bias' bans all %u tokens of the model's vocabulary (-100): none is left to generate.",
                    n_vocab);
        return -1;
    }
    return 0;
}

enum MHD_Result srv_turn_start(srv_req *r, pv_api_kind kind)
{
    pv_server *s = r->srv;
    pv_api_error err;
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    uint64_t serial = s->next_id++;
    pthread_mutex_unlock(&s->mu);
    if (stopping) {
        pv_api_fail(&err, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        return srv_respond_error(r, &err);
    }
    pv_api_limits lim;
    pv_api_limits_default(&lim);
    if (pv_api_parse(kind, r->body.s ? r->body.s : "", r->body.n, &lim, &r->api, &err) != PV_OK)
        return srv_respond_error(r, &err);
    srv_buf_free(&r->body);
    /* The session: the X-Session-Id header, else our session_id field,
     * else OpenAI's prompt_cache_key. */
    const char *hdr = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Session-Id");
    if (hdr && !srv_session_id_ok(hdr)) {
        pv_api_fail(&err, 400, "invalid_request_error", "X-Session-Id", NULL,
                    "X-Session-Id must be 1 to 128 bytes of UTF-8 without control characters.");
        return srv_respond_error(r, &err);
    }
    r->public_session = hdr ? hdr : r->api.session_id ? r->api.session_id : r->api.prompt_cache_key;
    if (r->public_session) {
        if (!(r->session = srv_engine_session_id(r->srv, r->key_index, r->public_session))) {
            pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
            return srv_respond_error(r, &err);
        }
    }
    if (check_logit_bias(r, &err) != 0 || tokenize(r, &err) != 0 || check_context(r, &err) != 0)
        return srv_respond_error(r, &err);
    if (!r->api.seed_set)
        r->api.sampling.seed = serial * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
    snprintf(r->id, sizeof r->id, "%s%016" PRIx64, kind == PV_API_CHAT ? "chatcmpl-" : "cmpl-", serial);
    r->created = (long long)time(NULL);

    /* Posted under the lock, so the engine thread cannot resume the
     * connection before it is suspended. */
    pthread_mutex_lock(&r->mu);
    r->refs++;
    r->state = RQ_SUBMITTING;
    if (pv_engine_loop_post(s->loop, submit_turn, r) != PV_OK) {
        r->refs--;
        pthread_mutex_unlock(&r->mu);
        pv_api_fail(&err, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        return srv_respond_error(r, &err);
    }
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
    srv_watch(r);
    return MHD_YES;
}

/* ---- answers ---------------------------------------------------------------------------------- */

static json_t *usage_json(const srv_req *r)
{
    json_int_t prompt = (json_int_t)r->n_tokens, gen = (json_int_t)r->result.generated;
    json_int_t cached = (json_int_t)r->result.reused_device + (json_int_t)r->result.reused_host;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", prompt, "completion_tokens", gen,
                     "total_tokens", prompt + gen, "prompt_tokens_details", "cached_tokens", cached);
}

static const char *finish_name(const srv_req *r)
{
    return r->result.finish == PV_FINISH_LENGTH ? "length" : "stop";
}

/* The turn ended other than by stop or length: the error to report. */
static int turn_error(const srv_req *r, pv_api_error *err)
{
    if (r->done_status != PV_OK) {
        pv_api_fail(err, 500, "server_error", NULL, NULL, "The engine failed this request: %s", r->done_message);
        return 1;
    }
    if (r->result.finish == PV_FINISH_CANCELLED) {
        pv_api_fail(err, 503, "server_error", NULL, "shutting_down",
                    "The request was cancelled: the server is shutting down.");
        return 1;
    }
    return 0;
}

static json_t *chunk_base(const srv_req *r)
{
    int chat = r->api.kind == PV_API_CHAT;
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object", chat ? "chat.completion.chunk" : "text_completion",
                     "created", (json_int_t)r->created, "model", r->srv->model_id);
}

/* One choice of a stream chunk: text (may be NULL) and finish (NULL:
 * still running). */
static json_t *stream_choice(const srv_req *r, const char *text, size_t len, const char *finish, int role)
{
    json_t *c;
    if (r->api.kind == PV_API_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text)
            json_object_set_new(delta, "content", json_stringn(text, len));
        c = json_pack("{s:i, s:o, s:n}", "index", 0, "delta", delta, "logprobs");
    } else {
        c = json_pack("{s:i, s:s%, s:n}", "index", 0, "text", text ? text : "", text ? len : 0, "logprobs");
    }
    if (c)
        json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    return c;
}

static int add_event(srv_buf *out, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return -1;
    int rc = srv_buf_add(out, "data: ", 6) || srv_buf_add(out, s, strlen(s)) || srv_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

static int add_chunk(srv_req *r, json_t *choice)
{
    json_t *j = chunk_base(r);
    if (!j || !choice) {
        json_decref(j);
        json_decref(choice);
        return -1;
    }
    json_object_set_new(j, "choices", json_pack("[o]", choice));
    if (r->api.include_usage)
        json_object_set_new(j, "usage", json_null());
    return add_event(&r->out, j);
}

/* Formats what the engine produced since the last call into r->out.
 * Returns 1 when r->out got bytes, 0 when there is nothing yet (the
 * connection was suspended), -1 on failure. */
static int stream_fill(srv_req *r)
{
    srv_buf clean = {0};
    size_t used = 0;
    pthread_mutex_lock(&r->mu);
    int done = r->done;
    if (srv_utf8_clean(r->text.s + r->text_sent, r->text.n - r->text_sent, !done, &clean, &used) != 0) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    r->text_sent += used;
    if (clean.n == 0 && !done && r->sent_role) {
        r->suspended = 1;
        MHD_suspend_connection(r->conn);
        pthread_mutex_unlock(&r->mu);
        srv_buf_free(&clean);
        return 0;
    }
    pthread_mutex_unlock(&r->mu);
    int rc = 0;
    if (!r->sent_role) {
        r->sent_role = 1;
        if (r->api.kind == PV_API_CHAT)
            rc = add_chunk(r, stream_choice(r, "", 0, NULL, 1));
    }
    if (rc == 0 && clean.n)
        rc = add_chunk(r, stream_choice(r, clean.s, clean.n, NULL, 0));
    srv_buf_free(&clean);
    if (rc == 0 && done) {
        pv_api_error err;
        if (turn_error(r, &err)) {
            char *body = pv_api_error_json(&err);
            rc = !body || srv_buf_add(&r->out, "data: ", 6) || srv_buf_add(&r->out, body, strlen(body)) ||
                 srv_buf_add(&r->out, "\n\n", 2);
            free(body);
        } else {
            rc = add_chunk(r, stream_choice(r, NULL, 0, finish_name(r), 0));
            if (rc == 0 && r->api.include_usage) {
                json_t *j = chunk_base(r);
                if (j) {
                    json_object_set_new(j, "choices", json_array());
                    json_object_set_new(j, "usage", usage_json(r));
                }
                rc = add_event(&r->out, j);
            }
        }
        if (rc == 0)
            rc = srv_buf_add(&r->out, "data: [DONE]\n\n", 14);
        r->sent_end = 1;
    }
    return rc ? -1 : 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    srv_req *r = cls;
    for (;;) {
        if (r->out_pos < r->out.n) {
            size_t n = r->out.n - r->out_pos < max ? r->out.n - r->out_pos : max;
            memcpy(buf, r->out.s + r->out_pos, n);
            r->out_pos += n;
            return (ssize_t)n;
        }
        r->out.n = r->out_pos = 0;
        if (r->sent_end)
            return MHD_CONTENT_READER_END_OF_STREAM;
        int rc = stream_fill(r);
        if (rc < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rc == 0)
            return 0;
    }
}

static enum MHD_Result start_stream(srv_req *r)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, r, NULL);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (r->public_session)
        MHD_add_response_header(resp, "X-Session-Id", r->public_session);
    r->http_status = 200;
    r->state = RQ_STREAMING;
    enum MHD_Result ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result answer(srv_req *r)
{
    pv_api_error err;
    if (turn_error(r, &err))
        return srv_respond_error(r, &err);
    srv_buf content = {0};
    if (srv_utf8_clean(r->text.s ? r->text.s : "", r->text.n, 0, &content, NULL) != 0) {
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
        return srv_respond_error(r, &err);
    }
    json_t *choice;
    if (r->api.kind == PV_API_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:s%}, s:s, s:n}", "index", 0, "message", "role", "assistant",
                           "content", content.s ? content.s : "", content.n, "finish_reason", finish_name(r),
                           "logprobs");
    else
        choice = json_pack("{s:i, s:s%, s:s, s:n}", "index", 0, "text", content.s ? content.s : "", content.n,
                           "finish_reason", finish_name(r), "logprobs");
    srv_buf_free(&content);
    if (choice && r->api.return_token_ids) {
        json_t *ids = json_array();
        for (size_t i = 0; i < r->n_token_ids; i++)
            json_array_append_new(ids, json_integer(r->token_ids[i]));
        json_object_set_new(choice, "token_ids", ids);
    }
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", r->id, "object",
                          r->api.kind == PV_API_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)r->created, "model", r->srv->model_id, "choices", choice, "usage",
                          usage_json(r));
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        pv_api_fail(&err, 500, "server_error", NULL, NULL, "out of memory building the response");
        return srv_respond_error(r, &err);
    }
    return srv_respond(r, 200, "application/json", body, strlen(body));
}

enum MHD_Result srv_turn_resume(srv_req *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->submit_failed) {
        pv_api_error err = r->submit_error;
        pthread_mutex_unlock(&r->mu);
        return srv_respond_error(r, &err);
    }
    if (r->submitted && r->api.stream) {
        pthread_mutex_unlock(&r->mu);
        return start_stream(r);
    }
    if (r->done) {
        pthread_mutex_unlock(&r->mu);
        return answer(r);
    }
    /* Nothing for this connection yet. */
    r->suspended = 1;
    MHD_suspend_connection(r->conn);
    pthread_mutex_unlock(&r->mu);
    return MHD_YES;
}
