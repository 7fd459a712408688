/* pensieve-serve's HTTP server: the OpenAI API (chat completions,
 * completions, models) over one engine, with sessions whose KV is kept
 * between turns, /metrics, /health and /v1/sessions/{id}.
 *
 * Threads: libmicrohttpd's pool threads parse, tokenize and hand turns to
 * the engine's loop thread (pv_engine_loop_post); they never block on the
 * engine. A connection waiting for tokens is suspended and resumed by the
 * engine thread as tokens arrive. */
#ifndef PV_SERVER_SERVER_H
#define PV_SERVER_SERVER_H

#include <pensieve/engine.h>
#include <pensieve/status.h>
#include <pensieve/tokenizer.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct pv_server_config {
    const char *host;          /* address to listen on (default 127.0.0.1) */
    uint16_t port;             /* 0: an ephemeral port (pv_server_port says which) */
    unsigned threads;          /* HTTP threads (default 4) */
    size_t max_body;           /* request bodies above this get 413 (default 8 MiB) */
    size_t max_state_body;     /* PUT /v1/session-states bodies (default 1 GiB) */
    size_t max_sessions;       /* named sessions at most; 0 = no limit */
    const char *const *api_keys; /* Bearer keys; none: no authentication */
    size_t n_api_keys;
    /* Keys the namespace of each API key's sessions: the namespace is an
     * HMAC of the key under this secret, so session ids in the engine, in
     * state file names and in logs say nothing about the keys. Borrowed,
     * PV_STATE_SECRET_BYTES bytes (the state directory's, so namespaces
     * outlive a restart); NULL: a random one for this process. */
    const uint8_t *namespace_secret;
    /* On a loopback address, requests whose Host header names another host
     * are refused (a web page reached through DNS rebinding would send its
     * own name): the bind address and localhost pass, and these. */
    const char *const *allowed_hosts;
    size_t n_allowed_hosts;
    /* Seconds a connection may stay silent while it sends a request or
     * between requests (default 30); a turn in progress is not counted. */
    unsigned connection_timeout_s;
    const char *model_id;      /* the id /v1/models lists (default "pensieve") */
    uint32_t n_ctx;            /* the model's context, for max_tokens checks */
    uint32_t n_vocab;          /* the model's vocabulary, for logit_bias token ids
                                * (0: the tokenizer's) */
    uint32_t n_layers;         /* the model's layers, for session views */
    FILE *log;                 /* one line per request; NULL = none */
    /* Sessions saved across restarts (include/pensieve/state.h), borrowed:
     * the server runs its background saver on the engine's loop, removes a
     * DELETEd session's file, and saves every session when it stops.
     * Restore it before starting the server. NULL: none. */
    struct pv_state_dir *state_dir;
} pv_server_config;

void pv_server_config_defaults(pv_server_config *cfg);

typedef struct pv_server pv_server;

/* Starts the engine's loop thread and the HTTP daemon. The engine and
 * tokenizer are borrowed and must outlive the server. */
pv_status pv_server_start(pv_server **out, pv_engine *engine, const pv_tokenizer *tok,
                          const pv_server_config *cfg);

uint16_t pv_server_port(const pv_server *s);

/* Runs fn on the engine thread (for tests: pv_engine_check, stats). */
pv_status pv_server_engine_call(pv_server *s, pv_status (*fn)(pv_engine *e, void *arg), void *arg);

/* Graceful stop: refuses new connections, cancels the turns in flight
 * (a waiting client gets 503; a stream ends with an error event), waits up
 * to grace_s for open responses to be sent, saves every session to the
 * state directory if there is one, then stops the threads and frees the
 * server. The engine is the caller's again. NULL: no-op. */
void pv_server_stop(pv_server *s, double grace_s);

#endif
