/* The OpenAI request parser and error bodies (server/request.h). Every
 * rejection is a 400 whose param is the field's path and whose message
 * names the field, the value received (quoted, cut short, escaped) and what
 * is accepted. Unknown fields are ignored: clients send extras. */
#include "server/request.h"

#include <jansson.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USER_MAX_BYTES 256 /* OpenAI's "user" */
#define SHOW_BYTES 40      /* source bytes of a string value quoted in a message */
/* A quoted string: each source byte at most 4 output bytes (\xNN), the
 * quotes, "...", a " (N bytes)" note and the NUL. */
#define QUOTE_CAP(max) (4 * (max) + 48)
#define SHOW_CAP QUOTE_CAP(SHOW_BYTES)
#define PARAM_CAP 96

#define INVALID "invalid_request_error"

void pv_api_limits_default(pv_api_limits *lim)
{
    lim->max_messages = 4096;
    lim->max_stops = 4;
    lim->max_stop_bytes = 256;
    lim->max_session_id_bytes = 128;
    lim->max_logit_bias = PV_SAMPLING_MAX_BIAS;
}

/* ---- errors ----------------------------------------------------------------- */

__attribute__((format(printf, 6, 0))) static pv_status
api_failv(pv_api_error *err, int http_status, const char *type, const char *param, const char *code,
          const char *fmt, va_list ap)
{
    pv_status st = http_status >= 500 ? PV_ERR_STATE : PV_ERR_INVALID_ARG;
    err->http_status = http_status;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    err->type = type ? type : http_status >= 500 ? "server_error" : INVALID;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    err->code = code;
    /* The project's convention: the last failing pv_ call's message is
     * pv_last_error() on this thread (logs read it). */
    return pv_error(st, "%s", err->message);
}

pv_status pv_api_fail(pv_api_error *err, int http_status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pv_status st = api_failv(err, http_status, type, param, code, fmt, ap);
    va_end(ap);
    return st;
}

/* A 400 invalid_request_error about param. */
__attribute__((format(printf, 3, 4))) static pv_status bad(pv_api_error *err, const char *param,
                                                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pv_status st = api_failv(err, 400, INVALID, param, NULL, fmt, ap);
    va_end(ap);
    return st;
}

static pv_status no_memory(pv_api_error *err, const char *what, size_t bytes)
{
    return pv_api_fail(err, 500, "server_error", NULL, NULL, "out of memory for %s (%zu bytes)", what,
                       bytes);
}

/* The length of the valid UTF-8 sequence at s (n > 0 bytes left), or 0:
 * overlong forms, surrogates and code points past U+10FFFF are invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    size_t len;
    uint32_t c, min;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0) {
        len = 2, c = s[0] & 0x1fu, min = 0x80;
    } else if ((s[0] & 0xf0) == 0xe0) {
        len = 3, c = s[0] & 0x0fu, min = 0x800;
    } else if ((s[0] & 0xf8) == 0xf0) {
        len = 4, c = s[0] & 0x07u, min = 0x10000;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3fu);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    return len;
}

/* s[0..n) for a message: at most max source bytes (cut on a character
 * boundary, then "..." and the length), UTF-8 kept, control bytes and
 * bytes that are not UTF-8 escaped (\xNN), so a message is always
 * printable and valid UTF-8. Quoted, also quotes and backslashes are
 * escaped. buf holds QUOTE_CAP(max). */
static const char *escape(const char *str, size_t n, size_t max, int quoted, char *buf)
{
    const unsigned char *s = (const unsigned char *)str;
    const size_t cap = QUOTE_CAP(max);
    const char *q = quoted ? "\"" : "";
    size_t o = 0, i = 0;
    o += (size_t)snprintf(buf, cap, "%s", q);
    while (i < n) {
        size_t k = utf8_len(s + i, n - i);
        if (i + (k ? k : 1) > max)
            break;
        if (k > 1) {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        unsigned char c = s[i++];
        if (quoted && (c == '"' || c == '\\')) {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (k == 1 && c >= 0x20 && c != 0x7f) {
            buf[o++] = (char)c;
        } else {
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        }
    }
    if (i < n)
        snprintf(buf + o, cap - o, "...%s (%zu bytes)", q, n);
    else
        snprintf(buf + o, cap - o, "%s", q);
    return buf;
}

/* A short rendering of a JSON value for a message. */
static const char *show(const json_t *v, char buf[SHOW_CAP])
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return escape(json_string_value(v), json_string_length(v), SHOW_BYTES, 1, buf);
    case JSON_INTEGER:
        snprintf(buf, SHOW_CAP, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case JSON_REAL: {
        /* The shortest form that reads back as the same double, marked as
         * a real (16.0, not 16: it is refused where integers are not). */
        double x = json_real_value(v);
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, SHOW_CAP, "%.*g", prec, x);
            if (strtod(buf, NULL) == x)
                break;
        }
        if (!strpbrk(buf, ".e"))
            strcat(buf, ".0");
        return buf;
    }
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    case JSON_ARRAY:
        snprintf(buf, SHOW_CAP, "an array of %zu element%s", json_array_size(v),
                 json_array_size(v) == 1 ? "" : "s");
        return buf;
    case JSON_OBJECT: return "an object";
    }
    return "a value";
}

/* "'param' must be <what>, got <value>". */
static pv_status expect(pv_api_error *err, const char *param, const char *what, const json_t *v)
{
    char buf[SHOW_CAP];
    return bad(err, param, "'%s' must be %s, got %s", param, what, show(v, buf));
}

static pv_status unsupported(pv_api_error *err, const char *param, const char *accepted,
                             const json_t *v)
{
    char buf[SHOW_CAP];
    return bad(err, param, "'%s' is %s: not supported (only %s is accepted)", param, show(v, buf),
               accepted);
}

/* Copies s[0..n) into a NUL-terminated string. */
static pv_status dup(const char *s, size_t n, char **out, pv_api_error *err)
{
    char *p = malloc(n + 1);
    if (!p)
        return no_memory(err, "a string", n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    *out = p;
    return PV_OK;
}

/* Replaces every byte that is not part of valid UTF-8 by '?', so jansson
 * takes the text (a message cut by vsnprintf may end mid-character). */
static void utf8_clean(const char *in, char *out, size_t cap)
{
    size_t n = strnlen(in, cap - 1), i = 0;
    while (i < n) {
        size_t k = utf8_len((const unsigned char *)in + i, n - i);
        if (k == 0) {
            out[i++] = '?';
        } else {
            memcpy(out + i, in + i, k);
            i += k;
        }
    }
    out[n] = '\0';
}

static json_t *string_or_null(const char *s)
{
    if (!s || !*s)
        return json_null();
    char clean[128];
    utf8_clean(s, clean, sizeof clean);
    return json_string(clean);
}

char *pv_api_error_json(const pv_api_error *err)
{
    char clean[sizeof err->message];
    utf8_clean(err->message, clean, sizeof clean);
    json_t *body = json_object(), *inner = json_object();
    char *text = NULL;
    if (body && inner && json_object_set_new(inner, "message", json_string(clean)) == 0 &&
        json_object_set_new(inner, "type", string_or_null(err->type ? err->type : INVALID)) == 0 &&
        json_object_set_new(inner, "param", string_or_null(err->param)) == 0 &&
        json_object_set_new(inner, "code", string_or_null(err->code)) == 0 &&
        json_object_set(body, "error", inner) == 0)
        text = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(inner);
    json_decref(body);
    return text;
}

/* ---- typed fields ----------------------------------------------------------- */

/* Each reader leaves *out alone when the field is absent or null. */

static pv_status opt_bool(const json_t *o, const char *key, int *out, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_boolean(v))
        return expect(err, key, "a boolean or null", v);
    *out = json_is_true(v);
    return PV_OK;
}

static pv_status opt_int(const json_t *o, const char *key, json_int_t lo, json_int_t hi,
                         const char *what, json_int_t *out, int *set, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return expect(err, key, what, v);
    *out = json_integer_value(v);
    *set = 1;
    return PV_OK;
}

static pv_status opt_number(const json_t *o, const char *key, double lo, double hi,
                            const char *what, float *out, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return expect(err, key, what, v);
    *out = (float)json_number_value(v);
    return PV_OK;
}

/* A string of at most max bytes (and at least one when nonempty); with
 * plain, without control bytes (< 0x20, 0x7f). */
static pv_status opt_string(const json_t *o, const char *key, size_t max, int nonempty, int plain,
                            const char *what, char **out, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_string(v))
        return expect(err, key, what, v);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n > max || (nonempty && n == 0))
        return expect(err, key, what, v);
    for (size_t i = 0; plain && i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return expect(err, key, what, v);
    return dup(s, n, out, err);
}

/* Features this server lacks: accepted only in their "off" forms. */

static pv_status null_only(const json_t *o, const char *key, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    return !v || json_is_null(v) ? PV_OK : unsupported(err, key, "null", v);
}

static pv_status null_or_false(const json_t *o, const char *key, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return PV_OK;
    if (!json_is_boolean(v))
        return expect(err, key, "a boolean or null", v);
    return unsupported(err, key, "false or null", v);
}

static pv_status null_or_zero(const json_t *o, const char *key, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_number(v))
        return expect(err, key, "a number or null", v);
    return json_number_value(v) == 0 ? PV_OK : unsupported(err, key, "0 or null", v);
}

static pv_status null_or_empty_array(const json_t *o, const char *key, pv_api_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_array(v))
        return expect(err, key, "an array or null", v);
    return json_array_size(v) == 0 ? PV_OK : unsupported(err, key, "an empty array or null", v);
}

/* ---- chat messages ---------------------------------------------------------- */

/* The text of a content array: every part {"type": "text", "text": s},
 * checked and measured first, then copied in order into one string. */
static pv_status content_parts(const json_t *parts, size_t m, char **out, pv_api_error *err)
{
    char param[PARAM_CAP];
    size_t n = json_array_size(parts), total = 0;
    if (n == 0) {
        snprintf(param, sizeof param, "messages[%zu].content", m);
        return expect(err, param, "a string or a non-empty array of text parts", parts);
    }
    for (size_t j = 0; j < n; j++) {
        const json_t *part = json_array_get(parts, j);
        if (!json_is_object(part)) {
            snprintf(param, sizeof param, "messages[%zu].content[%zu]", m, j);
            return expect(err, param, "an object {\"type\": \"text\", \"text\": ...}", part);
        }
        const json_t *type = json_object_get(part, "type");
        snprintf(param, sizeof param, "messages[%zu].content[%zu].type", m, j);
        if (!type)
            return bad(err, param, "'%s' is required (\"text\")", param);
        if (!json_is_string(type))
            return expect(err, param, "the string \"text\"", type);
        if (strcmp(json_string_value(type), "text") != 0)
            return unsupported(err, param, "\"text\"", type);
        const json_t *text = json_object_get(part, "text");
        snprintf(param, sizeof param, "messages[%zu].content[%zu].text", m, j);
        if (!text)
            return bad(err, param, "'%s' is required (a string)", param);
        if (!json_is_string(text))
            return expect(err, param, "a string", text);
        /* Parts are parts of the body, so the sum cannot wrap; checked anyway. */
        if (json_string_length(text) > SIZE_MAX - 1 - total)
            return no_memory(err, "a message", SIZE_MAX);
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s)
        return no_memory(err, "a message", total + 1);
    size_t at = 0;
    for (size_t j = 0; j < n; j++) {
        const json_t *text = json_object_get(json_array_get(parts, j), "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = '\0';
    *out = s;
    return PV_OK;
}

static pv_status message(const json_t *msg, size_t m, pv_chat_message *out, pv_api_error *err)
{
    char param[PARAM_CAP], buf[SHOW_CAP];
    snprintf(param, sizeof param, "messages[%zu]", m);
    if (!json_is_object(msg))
        return expect(err, param, "an object with 'role' and 'content'", msg);

    snprintf(param, sizeof param, "messages[%zu].role", m);
    const json_t *role = json_object_get(msg, "role");
    if (!role)
        return bad(err, param, "'%s' is required", param);
    if (!json_is_string(role))
        return expect(err, param, "a string", role);
    const char *r = json_string_value(role);
    if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)
        out->role = "system";
    else if (strcmp(r, "user") == 0)
        out->role = "user";
    else if (strcmp(r, "assistant") == 0)
        out->role = "assistant";
    else
        return bad(err, param,
                   "'%s' is %s: supported roles are 'system', 'user', 'assistant' and "
                   "'developer' (tool and function messages are not supported)",
                   param, show(role, buf));

    /* An assistant turn that called tools: this server has no tools. */
    static const char *const calls[] = {"tool_calls", "function_call"};
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
        const json_t *v = json_object_get(msg, calls[k]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0)) {
            snprintf(param, sizeof param, "messages[%zu].%s", m, calls[k]);
            return bad(err, param, "'%s' is %s: tool calls are not supported", param,
                       show(v, buf));
        }
    }
    const json_t *name = json_object_get(msg, "name");
    if (name && !json_is_null(name) && !json_is_string(name)) {
        snprintf(param, sizeof param, "messages[%zu].name", m);
        return expect(err, param, "a string or null", name);
    }

    snprintf(param, sizeof param, "messages[%zu].content", m);
    const json_t *content = json_object_get(msg, "content");
    if (!content)
        return bad(err, param, "'%s' is required (a string or an array of text parts)", param);
    char *text = NULL;
    pv_status st;
    if (json_is_string(content))
        st = dup(json_string_value(content), json_string_length(content), &text, err);
    else if (json_is_array(content))
        st = content_parts(content, m, &text, err);
    else
        return expect(err, param, "a string or an array of text parts", content);
    out->content = text;
    return st;
}

static pv_status chat_fields(const json_t *root, const pv_api_limits *lim, pv_api_request *req,
                             pv_api_error *err)
{
    const json_t *msgs = json_object_get(root, "messages");
    if (!msgs)
        return bad(err, "messages", "'messages' is required: a non-empty array of messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return expect(err, "messages", "a non-empty array", msgs);
    size_t n = json_array_size(msgs);
    if (n > lim->max_messages)
        return bad(err, "messages", "'messages' holds %zu messages: at most %zu are accepted", n,
                   lim->max_messages);
    req->messages = calloc(n, sizeof *req->messages);
    if (!req->messages)
        return no_memory(err, "the messages", n * sizeof *req->messages);
    req->n_messages = n;
    for (size_t m = 0; m < n; m++) {
        pv_status st = message(json_array_get(msgs, m), m, &req->messages[m], err);
        if (st != PV_OK)
            return st;
    }
    return null_or_false(root, "logprobs", err);
}

/* ---- completion prompt ------------------------------------------------------ */

static pv_status completion_fields(const json_t *root, pv_api_request *req, pv_api_error *err)
{
    const json_t *p = json_object_get(root, "prompt");
    if (!p)
        return bad(err, "prompt", "'prompt' is required: a string or an array of one string");
    if (json_is_array(p)) {
        size_t n = json_array_size(p);
        const json_t *first = json_array_get(p, 0);
        if (n > 0 && (json_is_integer(first) || json_is_array(first)))
            return bad(err, "prompt",
                       "'prompt' is an array of token ids: token-id prompts are not supported "
                       "(send the text)");
        if (n != 1)
            return bad(err, "prompt",
                       "'prompt' is an array of %zu prompts: exactly one prompt per request is "
                       "supported",
                       n);
        if (!json_is_string(first))
            return expect(err, "prompt[0]", "a string", first);
        p = first;
    } else if (!json_is_string(p)) {
        return expect(err, "prompt", "a string or an array of one string", p);
    }
    pv_status st = dup(json_string_value(p), json_string_length(p), &req->prompt, err);
    if (st != PV_OK)
        return st;
    req->prompt_len = json_string_length(p);

    int echo = 0;
    st = opt_bool(root, "echo", &echo, err);
    if (st == PV_OK && echo)
        st = unsupported(err, "echo", "false or null", json_object_get(root, "echo"));
    if (st == PV_OK)
        st = null_only(root, "suffix", err);
    json_int_t best_of = 1;
    int best_of_set = 0;
    if (st == PV_OK)
        st = opt_int(root, "best_of", INT64_MIN, INT64_MAX, "an integer or null", &best_of,
                     &best_of_set, err);
    if (st == PV_OK && best_of != 1)
        st = unsupported(err, "best_of", "1 or null", json_object_get(root, "best_of"));
    if (st == PV_OK)
        st = null_only(root, "logprobs", err);
    return st;
}

/* ---- fields of both kinds --------------------------------------------------- */

static pv_status stop_string(const json_t *v, const char *param, const pv_api_limits *lim,
                             char **out, pv_api_error *err)
{
    char what[96];
    snprintf(what, sizeof what, "a string of 1 to %zu bytes", lim->max_stop_bytes);
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        json_string_length(v) > lim->max_stop_bytes)
        return expect(err, param, what, v);
    return dup(json_string_value(v), json_string_length(v), out, err);
}

static pv_status stops(const json_t *root, const pv_api_limits *lim, pv_api_request *req,
                       pv_api_error *err)
{
    const json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_string(v) && !json_is_array(v)) {
        char what[96];
        snprintf(what, sizeof what, "a string, an array of at most %zu strings, or null",
                 lim->max_stops);
        return expect(err, "stop", what, v);
    }
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > lim->max_stops)
        return bad(err, "stop", "'stop' holds %zu strings: at most %zu are accepted", n,
                   lim->max_stops);
    if (n == 0)
        return PV_OK;
    req->stops = calloc(n, sizeof *req->stops);
    if (!req->stops)
        return no_memory(err, "the stop strings", n * sizeof *req->stops);
    req->n_stops = n;
    if (json_is_string(v))
        return stop_string(v, "stop", lim, &req->stops[0], err);
    for (size_t i = 0; i < n; i++) {
        char param[PARAM_CAP];
        snprintf(param, sizeof param, "stop[%zu]", i);
        pv_status st = stop_string(json_array_get(v, i), param, lim, &req->stops[i], err);
        if (st != PV_OK)
            return st;
    }
    return PV_OK;
}

/* A logit_bias key as a token id: decimal digits only (no sign, spaces,
 * fraction or exponent), no leading zero but in "0" itself, at most
 * INT32_MAX. Byte by byte: strtol would take " 5", "+5" and "05". */
static int token_id_key(const char *key, int32_t *out)
{
    const size_t n = strlen(key);
    if (n == 0 || n > 10 || (key[0] == '0' && n > 1))
        return 0;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (key[i] < '0' || key[i] > '9')
            return 0;
        x = x * 10 + (key[i] - '0');
    }
    if (x > INT32_MAX)
        return 0;
    *out = (int32_t)x;
    return 1;
}

static pv_status logit_bias(const json_t *root, const pv_api_limits *lim, pv_api_request *req,
                            pv_api_error *err)
{
    const json_t *v = json_object_get(root, "logit_bias");
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_object(v))
        return expect(err, "logit_bias",
                      "an object mapping token ids to numbers in [-100, 100], or null", v);
    /* More than the engine takes would be refused at submit. */
    size_t n = json_object_size(v), max = lim->max_logit_bias;
    if (max > PV_SAMPLING_MAX_BIAS)
        max = PV_SAMPLING_MAX_BIAS;
    if (n > max)
        return bad(err, "logit_bias", "'logit_bias' holds %zu entries: at most %zu are accepted", n,
                   max);
    if (n == 0)
        return PV_OK;
    req->bias_tokens = malloc(n * sizeof *req->bias_tokens);
    req->bias_values = malloc(n * sizeof *req->bias_values);
    if (!req->bias_tokens || !req->bias_values)
        return no_memory(err, "the logit bias", n * (sizeof(int32_t) + sizeof(float)));
    const char *key;
    json_t *value;
    size_t k = 0;
    json_object_foreach((json_t *)v, key, value) {
        char kbuf[SHOW_CAP], vbuf[SHOW_CAP];
        int32_t token;
        if (!token_id_key(key, &token))
            return bad(err, "logit_bias",
                       "'logit_bias' key %s is not a token id: keys are token ids in decimal "
                       "(digits only: no sign, spaces, fraction, exponent or leading zeros), "
                       "at most 2147483647",
                       escape(key, strlen(key), SHOW_BYTES, 1, kbuf));
        const double x = json_is_number(value) ? json_number_value(value) : NAN;
        if (!(x >= -PV_SAMPLING_BIAS_RANGE && x <= PV_SAMPLING_BIAS_RANGE))
            return bad(err, "logit_bias",
                       "'logit_bias' value for token %d must be a number in [-100, 100], got %s",
                       token, show(value, vbuf));
        req->bias_tokens[k] = token;
        req->bias_values[k] = (float)x;
        k++;
    }
    req->sampling.bias_tokens = req->bias_tokens;
    req->sampling.bias_values = req->bias_values;
    req->sampling.n_bias = k;
    return PV_OK;
}

static pv_status stream_fields(const json_t *root, pv_api_request *req, pv_api_error *err)
{
    pv_status st = opt_bool(root, "stream", &req->stream, err);
    const json_t *so = json_object_get(root, "stream_options");
    if (st != PV_OK || !so || json_is_null(so))
        return st;
    if (!json_is_object(so))
        return expect(err, "stream_options", "an object or null", so);
    if (!req->stream)
        return bad(err, "stream_options",
                   "'stream_options' is only allowed when 'stream' is true (it is false)");
    const json_t *iu = json_object_get(so, "include_usage");
    if (iu && !json_is_null(iu)) {
        if (!json_is_boolean(iu))
            return expect(err, "stream_options.include_usage", "a boolean or null", iu);
        req->include_usage = json_is_true(iu);
    }
    return PV_OK;
}

static pv_status response_format(const json_t *root, pv_api_error *err)
{
    const json_t *v = json_object_get(root, "response_format");
    if (!v || json_is_null(v))
        return PV_OK;
    if (!json_is_object(v))
        return expect(err, "response_format", "an object {\"type\": \"text\"} or null", v);
    const json_t *type = json_object_get(v, "type");
    if (!type)
        return bad(err, "response_format.type", "'response_format.type' is required (\"text\")");
    if (!json_is_string(type))
        return expect(err, "response_format.type", "the string \"text\"", type);
    if (strcmp(json_string_value(type), "text") != 0)
        return unsupported(err, "response_format.type", "\"text\"", type);
    return PV_OK;
}

static pv_status sampling_fields(const json_t *root, pv_api_request *req, pv_api_error *err)
{
    pv_sampling *s = &req->sampling;
    json_int_t max_tokens = 0, max_completion = 0, seed = 0, n = 1;
    int mt_set = 0, mct_set = 0, n_set = 0;
    float top_p = 1.0f;
    pv_status st = opt_int(root, "max_tokens", 1, INT32_MAX, "an integer in [1, 2147483647] or null",
                           &max_tokens, &mt_set, err);
    if (st == PV_OK)
        st = opt_int(root, "max_completion_tokens", 1, INT32_MAX,
                     "an integer in [1, 2147483647] or null", &max_completion, &mct_set, err);
    if (st == PV_OK)
        st = opt_number(root, "temperature", 0, 2, "a number in [0, 2] or null", &s->temperature,
                        err);
    if (st == PV_OK)
        st = opt_number(root, "top_p", 0, 1, "a number in [0, 1] or null", &top_p, err);
    if (st == PV_OK)
        st = opt_int(root, "seed", INT64_MIN, INT64_MAX, "an integer or null", &seed,
                     &req->seed_set, err);
    if (st == PV_OK)
        st = opt_int(root, "n", INT64_MIN, INT64_MAX, "1 or null (only n = 1 is supported)", &n,
                     &n_set, err);
    if (st == PV_OK && n != 1)
        st = bad(err, "n", "'n' is %" JSON_INTEGER_FORMAT ": only n = 1 is supported", n);
    if (st == PV_OK)
        st = opt_bool(root, "ignore_eos", &s->ignore_eos, err);
    if (st == PV_OK)
        st = opt_bool(root, "return_token_ids", &req->return_token_ids, err);
    if (st != PV_OK)
        return st;
    if (mt_set || mct_set) {
        /* max_completion_tokens is OpenAI's newer name: it wins. */
        s->max_tokens = (int32_t)(mct_set ? max_completion : max_tokens);
        req->max_tokens_set = 1;
    }
    if (top_p == 0) {
        /* No mass at all: only the most likely token, i.e. greedy. */
        s->temperature = 0;
        top_p = 1;
    }
    s->top_p = top_p;
    s->seed = (uint64_t)seed;
    return PV_OK;
}

static pv_status common_fields(const json_t *root, const pv_api_limits *lim, pv_api_request *req,
                               pv_api_error *err)
{
    char what[128];
    pv_status st = opt_string(root, "model", SIZE_MAX, 0, 0, "a string or null", &req->model, err);
    if (st == PV_OK)
        st = sampling_fields(root, req, err);
    if (st == PV_OK)
        st = stops(root, lim, req, err);
    if (st == PV_OK)
        st = stream_fields(root, req, err);
    if (st == PV_OK)
        st = null_only(root, "top_logprobs", err);
    if (st == PV_OK)
        st = null_or_empty_array(root, "tools", err);
    if (st == PV_OK)
        st = null_or_empty_array(root, "functions", err);
    if (st == PV_OK)
        st = response_format(root, err);
    if (st == PV_OK)
        st = null_or_zero(root, "presence_penalty", err);
    if (st == PV_OK)
        st = null_or_zero(root, "frequency_penalty", err);
    if (st == PV_OK)
        st = logit_bias(root, lim, req, err);
    snprintf(what, sizeof what, "a string of 1 to %zu bytes without control characters, or null",
             lim->max_session_id_bytes);
    if (st == PV_OK)
        st = opt_string(root, "prompt_cache_key", lim->max_session_id_bytes, 1, 1, what,
                        &req->prompt_cache_key, err);
    if (st == PV_OK)
        st = opt_string(root, "session_id", lim->max_session_id_bytes, 1, 1, what,
                        &req->session_id, err);
    if (st == PV_OK)
        st = opt_string(root, "user", USER_MAX_BYTES, 0, 0,
                        "a string of at most 256 bytes or null", &req->user, err);
    if (st == PV_OK && req->stops) {
        req->sampling.stop = (const char *const *)req->stops;
        req->sampling.n_stop = req->n_stops;
    }
    return st;
}

/* ---- entry points ----------------------------------------------------------- */

pv_status pv_api_parse(pv_api_kind kind, const char *body, size_t len, const pv_api_limits *lim,
                       pv_api_request *req, pv_api_error *err)
{
    pv_api_limits defaults;
    memset(req, 0, sizeof *req);
    if (!lim) {
        pv_api_limits_default(&defaults);
        lim = &defaults;
    }
    if (kind != PV_API_CHAT && kind != PV_API_COMPLETION)
        return pv_api_fail(err, 500, "server_error", NULL, NULL, "unknown request kind %d", (int)kind);

    /* jansson's defaults refuse invalid UTF-8, \u0000 and trailing bytes,
     * and bound nesting depth; duplicate keys are refused too, since which
     * copy a client meant is anyone's guess. */
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* jansson's text may hold bytes of the bad input: escaped. */
        char buf[QUOTE_CAP(JSON_ERROR_TEXT_LENGTH)];
        return bad(err, NULL, "the body is not valid JSON: %s (line %d, column %d, byte %d)",
                   escape(je.text, strnlen(je.text, sizeof je.text), sizeof je.text, 0, buf),
                   je.line, je.column, je.position);
    }
    pv_status st;
    if (!json_is_object(root)) {
        char buf[SHOW_CAP];
        st = bad(err, NULL, "the body must be a JSON object, got %s", show(root, buf));
    } else {
        req->kind = kind;
        pv_sampling_defaults(&req->sampling);
        /* OpenAI's defaults: temperature 1, top_p 1, no token limit. */
        req->sampling.temperature = 1.0f;
        req->sampling.top_p = 1.0f;
        req->sampling.max_tokens = 0;
        st = kind == PV_API_CHAT ? chat_fields(root, lim, req, err)
                                 : completion_fields(root, req, err);
        if (st == PV_OK)
            st = common_fields(root, lim, req, err);
    }
    json_decref(root);
    if (st != PV_OK)
        pv_api_request_free(req);
    return st;
}

void pv_api_request_free(pv_api_request *req)
{
    if (!req)
        return;
    for (size_t i = 0; req->messages && i < req->n_messages; i++)
        free((char *)req->messages[i].content);
    free(req->messages);
    for (size_t i = 0; req->stops && i < req->n_stops; i++)
        free(req->stops[i]);
    free(req->stops);
    free(req->bias_tokens);
    free(req->bias_values);
    free(req->model);
    free(req->prompt);
    free(req->prompt_cache_key);
    free(req->session_id);
    free(req->user);
    memset(req, 0, sizeof *req);
}
