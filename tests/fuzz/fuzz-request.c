/* libFuzzer target: the OpenAI request parser (server/request.h) on
 * arbitrary bodies.
 *
 * Input: byte 0 selects the mode, the rest is the body.
 *   bit 0  0: chat completions (messages), 1: completions (prompt)
 *   bit 1  small limits (2 messages, 2 stops of 4 bytes, 8-byte session
 *          ids, 3 logit_bias entries), so the limit checks are reached by
 *          short inputs
 * The properties: a parsed request holds only what the limits and the
 * header allow (roles, owned strings, stops and the logit bias pointed to
 * by sampling, sampling and bias entries in range, no token twice); a
 * refused one is a 400 with a param that is NUL
 * terminated, leaves the request zeroed, and its error body is JSON that
 * jansson reads back with the same message. */
#include "server/request.h"

#include <jansson.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what, const uint8_t *body, size_t len)
{
    fprintf(stderr, "fuzz-request: %s (body of %zu bytes: %.*s)\n", what, len,
            (int)(len > 200 ? 200 : len), (const char *)body);
    abort();
}

/* A string the request owns: NUL terminated at its reported length. */
static int plain(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

static void check_ok(const pv_api_request *r, pv_api_kind kind, const pv_api_limits *lim,
                     const uint8_t *body, size_t len)
{
    if (r->kind != kind)
        fail("wrong kind", body, len);
    if (kind == PV_API_CHAT) {
        if (r->n_messages == 0 || r->n_messages > lim->max_messages || !r->messages || r->prompt)
            fail("chat without messages, or over the limit", body, len);
        for (size_t i = 0; i < r->n_messages; i++) {
            const char *role = r->messages[i].role;
            if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
                strcmp(role, "assistant") != 0)
                fail("a role outside system/user/assistant", body, len);
            if (!r->messages[i].content)
                fail("a message without content", body, len);
            (void)strlen(r->messages[i].content);
        }
    } else if (!r->prompt || strlen(r->prompt) != r->prompt_len || r->messages) {
        fail("completion prompt missing or of the wrong length", body, len);
    }
    if (r->n_stops > lim->max_stops || r->sampling.n_stop != r->n_stops ||
        (r->n_stops && r->sampling.stop != (const char *const *)r->stops) ||
        (!r->n_stops && (r->stops || r->sampling.stop)))
        fail("stops inconsistent with sampling", body, len);
    for (size_t i = 0; i < r->n_stops; i++) {
        size_t n = strlen(r->stops[i]);
        if (n == 0 || n > lim->max_stop_bytes)
            fail("a stop string out of bounds", body, len);
    }
    const pv_sampling *s = &r->sampling;
    if (!(s->temperature >= 0 && s->temperature <= 2) || !(s->top_p > 0 && s->top_p <= 1) ||
        s->max_tokens < 0 || (s->max_tokens > 0) != (r->max_tokens_set != 0))
        fail("sampling out of range", body, len);
    if ((r->session_id && !plain(r->session_id, lim->max_session_id_bytes)) ||
        (r->prompt_cache_key && !plain(r->prompt_cache_key, lim->max_session_id_bytes)))
        fail("a session id out of bounds or with control bytes", body, len);
    if (r->user && strlen(r->user) > 256)
        fail("user too long", body, len);
    if (r->include_usage && !r->stream)
        fail("include_usage without stream", body, len);
    if (s->n_bias > lim->max_logit_bias || s->bias_tokens != r->bias_tokens ||
        s->bias_values != r->bias_values || (s->n_bias == 0) != (r->bias_tokens == NULL))
        fail("logit bias inconsistent with sampling, or over the limit", body, len);
    for (size_t k = 0; k < s->n_bias; k++) {
        if (s->bias_tokens[k] < 0 || !(s->bias_values[k] >= -100.0f && s->bias_values[k] <= 100.0f))
            fail("a logit bias entry out of range", body, len);
        for (size_t j = 0; j < k; j++)
            if (s->bias_tokens[j] == s->bias_tokens[k])
                fail("a logit bias token twice", body, len);
    }
}

static void check_error(const pv_api_request *r, const pv_api_error *err, const uint8_t *body,
                        size_t len)
{
    static const pv_api_request zero;
    if (memcmp(r, &zero, sizeof zero) != 0)
        fail("a refused request is not zeroed", body, len);
    if (err->http_status != 400 || !err->type || strcmp(err->type, "invalid_request_error") != 0 ||
        err->code != NULL)
        fail("a refusal that is not a 400 invalid_request_error", body, len);
    if (memchr(err->param, '\0', sizeof err->param) == NULL ||
        memchr(err->message, '\0', sizeof err->message) == NULL || err->message[0] == '\0')
        fail("param or message not terminated, or no message", body, len);
    char *text = pv_api_error_json(err);
    if (!text)
        fail("pv_api_error_json failed", body, len);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    const json_t *e = json_object_get(j, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const json_t *param = json_object_get(e, "param");
    if (!msg || strcmp(msg, err->message) != 0 || json_object_size(e) != 4 ||
        (err->param[0] ? !json_is_string(param) : !json_is_null(param)))
        fail("the error JSON does not read back", body, len);
    json_decref(j);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    pv_api_kind kind = (data[0] & 1) ? PV_API_COMPLETION : PV_API_CHAT;
    pv_api_limits lim;
    pv_api_limits_default(&lim);
    if (data[0] & 2) {
        lim.max_messages = 2;
        lim.max_stops = 2;
        lim.max_stop_bytes = 4;
        lim.max_session_id_bytes = 8;
        lim.max_logit_bias = 3;
    }
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    /* A copy of exactly len bytes, so ASan sees any read past the body. */
    char *copy = malloc(len ? len : 1);
    if (!copy)
        return 0;
    memcpy(copy, body, len);
    pv_api_request req;
    pv_api_error err;
    memset(&req, 0x5a, sizeof req);
    memset(&err, 0x5a, sizeof err);
    if (pv_api_parse(kind, copy, len, &lim, &req, &err) == PV_OK)
        check_ok(&req, kind, &lim, body, len);
    else
        check_error(&req, &err, body, len);
    pv_api_request_free(&req);
    free(copy);
    return 0;
}
