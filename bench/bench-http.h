/* pensieve-bench's HTTP driver: runs a workload in real time against any
 * OpenAI-compatible server (pensieve-serve, llama.cpp's server, vLLM, ...)
 * with libcurl's multi interface on the calling thread, one easy handle per
 * request in flight. Bench-internal, hence the bh_ prefix.
 *
 * A conversation's first turn is sent at its arrival_s (from the run's
 * start), each next one think_s after the previous answer ended; a
 * conversation has one request in flight at most, and conversations
 * overlap without limit. Each turn is a streamed POST
 * {url}/v1/chat/completions carrying the whole conversation so far (every
 * earlier user message and the answer as received, then the new message),
 * as OpenAI clients send it, so servers that keep no state work too;
 * pensieve-serve, given a session id, prefills only what it lacks.
 *
 * Generated turns' messages are input_tokens words drawn from 256 common
 * English words (each one token with its leading space in a GPT-2 style
 * vocabulary), deterministic per seed, conversation and turn; replayed
 * turns send their text. A conversation with a preamble sends it first in
 * every request, as a system message: a replayed conversation's system
 * text, else system_tokens such words, deterministic per seed and
 * preamble (bh_system_words). The server counts the real prompt.
 *
 * A request fails on an HTTP status other than 200, an error object in the
 * stream, a stream that ends without "data: [DONE]", a transport error or
 * the timeout; its conversation then ends there: the turns after it are
 * neither sent nor recorded, so a report tells by n_records being fewer
 * than the workload's requests (and first_error says why). */
#ifndef PV_BENCH_HTTP_H
#define PV_BENCH_HTTP_H

#include "bench/bench-run.h"
#include "bench/workload.h"

#include <pensieve/status.h>

#include <stddef.h>
#include <stdint.h>

typedef struct bh_options {
    const char *url;   /* server base URL, e.g. http://127.0.0.1:8080 (a trailing / or /v1 is dropped) */
    const char *model; /* the request's "model" field */
    int sessions;      /* 1: send X-Session-Id: <session_prefix><conversation index>, and DELETE
                          /v1/sessions/{id} when a conversation ends (404/405 ignored: servers
                          without sessions) */
    const char *session_prefix; /* distinct per run so runs against one server never share sessions */
    int ignore_eos;             /* send "ignore_eos": true so answers have the drawn length */
    const int32_t *ban_tokens;  /* sent as "logit_bias": {"id": -100}: the same, for servers */
    int n_ban_tokens;           /* without ignore_eos (ban their end-of-turn tokens) */
    double request_timeout_s;   /* per request; 0 none */
    uint64_t seed;              /* the generated texts' words */
    const char *label;          /* for br_progress */
} bh_options;

/* Runs w against the server at o->url. *out is zeroed first, then holds a
 * record per request sent, in order of submission (br_run_free releases
 * it, also after a failure), and the counters: pensieve-serve's /metrics
 * after the run minus before (known = 0 for a server without them). Failed
 * requests are records, not a failed status: the status is not PV_OK only
 * for bad options, a server that cannot be reached at all (probed first
 * with GET /v1/models; any HTTP answer will do), or a run that cannot go
 * on (out of memory, libcurl failing). */
pv_status bh_run(const bh_options *o, const wl_workload *w, br_run *out);

/* ---- the parts, exposed for tests/test-bench-sse.c and test-bench-http-fake.c ---- */

/* A growing NUL-terminated text. */
typedef struct bh_text {
    char *p;
    size_t n, cap;
} bh_text;

/* An incremental text/event-stream parser (the WHATWG rules: lines end in
 * CRLF, LF or CR; "data" fields' values are joined with LF; a blank line
 * dispatches the event; comments and other fields are skipped). Bytes go
 * in as they arrive, split anywhere. Zero-initialise it. */
typedef struct bh_sse {
    bh_text line, data; /* the line not yet ended; the event's data so far */
    int skip_lf;        /* the last line ended with a CR: an LF next belongs to it */
} bh_sse;

/* Called with each event's data (NUL-terminated, len bytes); a status
 * other than PV_OK stops the feed and is returned by it. */
typedef pv_status (*bh_sse_fn)(void *user, const char *data, size_t len);

/* Parses n more bytes, calling fn for each event they complete. A line or
 * an event past 16 MiB is PV_ERR_FORMAT. */
pv_status bh_sse_feed(bh_sse *s, const char *p, size_t n, bh_sse_fn fn, void *user);
/* The stream ended: an event without its blank line is dispatched (servers
 * that close right after the last event). */
pv_status bh_sse_end(bh_sse *s, bh_sse_fn fn, void *user);
void bh_sse_free(bh_sse *s); /* and zeroes it */

/* What a streamed chat completion said so far. */
typedef struct bh_answer {
    double first_s;     /* the `now` of the first event with non-empty delta content; < 0 until then */
    bh_text text;       /* the contents, joined */
    int64_t chunks;     /* events with content: the tokens, when no usage comes */
    int64_t completion; /* usage.completion_tokens; -1 until a usage chunk has it */
    uint64_t prompt_tokens, cached_tokens; /* from the usage chunk; 0 without one */
    int done;           /* data: [DONE] came (later events are ignored) */
    char error[200];    /* the first error object's message; "" if none */
} bh_answer;

void bh_answer_init(bh_answer *a);
void bh_answer_free(bh_answer *a); /* and initialises it again */
/* One event's data, which arrived at `now`: PV_ERR_FORMAT for data that is
 * neither [DONE] nor a JSON object; an error object is not a failed status
 * (it goes to a->error). */
pv_status bh_answer_event(bh_answer *a, double now, const char *data, size_t len);

/* The POST body of turn `turn` of conversation c (index conv, for the
 * generated words): its preamble as a system message (when it has one:
 * the replayed system_text, else the drawn words),
 * every earlier user message with answers[k] after it,
 * then the new message, max_tokens the turn's output_tokens, streamed with
 * usage, greedy. *out is malloc'd JSON. */
pv_status bh_chat_body(const bh_options *o, const wl_conversation *c, int32_t conv, int32_t turn,
                       const bh_text *answers, char **out);

/* Reads pensieve-serve's counters from Prometheus text (len bytes, need
 * not be NUL-terminated): *out gets the counters' values and known = 1
 * when every one of them is there as a plain integer, else known = 0. */
void bh_metrics_parse(const char *text, size_t len, br_counters *out);

/* The generated message of a conversation's turn: n words, separated by
 * spaces, into *t (replacing what it held). */
pv_status bh_words(uint64_t seed, int32_t conv, int32_t turn, int32_t n, bh_text *t);

/* Preamble k of the workload drawn with seed, as n words the same way,
 * from wl_system_prompt_state(seed, k): the same text in every
 * conversation that drew k. */
pv_status bh_system_words(uint64_t seed, int32_t k, int32_t n, bh_text *t);

#endif
