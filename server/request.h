/* The OpenAI request bodies pensieve-serve accepts, parsed and validated
 * (jansson) into plain structs, and the OpenAI-style errors it answers bad
 * input with. Pure functions of the bytes: no model, no engine, so the
 * parser is a fuzz target of its own (tests/fuzz/fuzz-request.c). Checks
 * that need the model (a prompt past the context) are the server's. */
#ifndef PV_SERVER_REQUEST_H
#define PV_SERVER_REQUEST_H

#include <pensieve/engine.h>
#include <pensieve/status.h>
#include <pensieve/tokenizer.h>

#include <stddef.h>
#include <stdint.h>

/* An error as OpenAI reports it: {"error": {"message", "type", "param",
 * "code"}} with an HTTP status. */
typedef struct pv_api_error {
    int http_status;   /* 400, 401, 404, 405, 409, 413, 500, 503 */
    char message[512];
    const char *type;  /* "invalid_request_error", "authentication_error",
                        * "not_found_error", "server_error", ... (static) */
    char param[64];    /* the offending field ("messages[2].role"); "" = null */
    const char *code;  /* static, e.g. "context_length_exceeded"; NULL = null */
} pv_api_error;

/* Fills err and returns PV_ERR_INVALID_ARG (any status but 5xx) or
 * PV_ERR_STATE (5xx), so callers can `return pv_api_fail(...)`. param and
 * code may be NULL. */
pv_status pv_api_fail(pv_api_error *err, int http_status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The error as a JSON body (malloc'd, NUL-terminated); NULL if out of memory. */
char *pv_api_error_json(const pv_api_error *err);

typedef enum pv_api_kind {
    PV_API_CHAT = 0,        /* POST /v1/chat/completions */
    PV_API_COMPLETION = 1   /* POST /v1/completions */
} pv_api_kind;

typedef struct pv_api_request {
    pv_api_kind kind;
    char *model;                 /* NULL when absent */
    /* chat: roles are "system", "user" or "assistant" ("developer" is read
     * as "system"); content a string or an array of {"type":"text","text"}
     * parts, concatenated. Owned strings. */
    pv_chat_message *messages;
    size_t n_messages;
    /* completion: the prompt as text (a string, or an array of one string). */
    char *prompt;
    size_t prompt_len;
    pv_sampling sampling;        /* stop strings point into `stops`, the
                                  * logit bias into bias_tokens/bias_values */
    char **stops;
    size_t n_stops;
    /* logit_bias: {"<token id>": bias}, keys plain decimal ids at most
     * INT32_MAX, values in [-100, 100]; in the body's order, none twice.
     * Owned. Whether an id is in the model's vocabulary is the server's
     * check. */
    int32_t *bias_tokens;
    float *bias_values;
    int max_tokens_set;          /* max_tokens / max_completion_tokens given */
    int seed_set;                /* seed given (else the server draws one) */
    int stream;
    int include_usage;           /* stream_options.include_usage */
    int return_token_ids;        /* answer with the generated ids too (an
                                  * extension, as vLLM's; for exact checks) */
    char *prompt_cache_key;      /* OpenAI's field; NULL when absent */
    char *session_id;            /* our field; NULL when absent */
    char *user;                  /* OpenAI's "user"; NULL when absent */
} pv_api_request;

/* Limits on what one request may hold (every count and length bounded). */
typedef struct pv_api_limits {
    size_t max_messages;         /* default 4096 */
    size_t max_stops;            /* default 4 (OpenAI's limit) */
    size_t max_stop_bytes;       /* default 256 per stop string */
    size_t max_session_id_bytes; /* default 128 */
    size_t max_logit_bias;       /* logit_bias entries; default and at most
                                  * PV_SAMPLING_MAX_BIAS (1024) */
} pv_api_limits;

void pv_api_limits_default(pv_api_limits *lim);

/* Parses and validates one body. On failure fills err (4xx, param naming the
 * field) and leaves *req empty (safe to free). The body need not be
 * NUL-terminated; it may hold any bytes. lim NULL: the defaults. */
pv_status pv_api_parse(pv_api_kind kind, const char *body, size_t len, const pv_api_limits *lim,
                       pv_api_request *req, pv_api_error *err);
void pv_api_request_free(pv_api_request *req); /* NULL: no-op; zeroes *req */

#endif
